"""`replay.store_state`: a snapshot's configuration read back into a new store's arguments."""

from __future__ import annotations

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, SampleToInsertRatio, TrajectorySpec
from replay.rate_limiter import MinSize
from replay.store_state import RESTORE_KEYWORDS, restore_arguments, snapshot

SPEC = TrajectorySpec({"pos": ((), "int64"), "r": ((), "float32")})


class Picky(MinSize):
    """A user's subclass: a checkpoint records its class name and settings, not its code."""


def state_of(limiter) -> dict:
    mm = MemoryManager()
    store = ReplayStore(
        SPEC, capacity_steps=30, num_shards=3, selector=Prioritized(0.7), rate_limiter=limiter,
        memory=mm, max_times_sampled=2, seed=4, chunk_steps=5, timeout=7.5,
    )
    try:
        with store.writer() as w:
            w.extend({"pos": np.arange(6, dtype=np.int64), "r": np.zeros(6, np.float32)})
            w.end_episode()
        with snapshot(store.storage, store.table, store.selector, store.rate_limiter, 2) as state:
            config, rng = dict(state["config"]), state["table"]["rng"]
        return {"config": config, "table": {"rng": rng}}
    finally:
        store.close()
        mm.close()


def test_the_config_gives_the_arguments_it_was_made_with():
    limiter = SampleToInsertRatio(2.0, min_size=3, error_buffer=50)
    state = state_of(limiter)
    rng = state["table"]["rng"]
    args, kwargs = restore_arguments(state, {}, None)
    assert args == (SPEC, 30, 3)
    assert kwargs["max_times_sampled"] == 2 and kwargs["chunk_steps"] == 5 and kwargs["timeout"] == 7.5
    assert kwargs["selector"] == Prioritized(0.7)
    assert type(kwargs["rate_limiter"]) is SampleToInsertRatio
    assert kwargs["rate_limiter"].to_config() == limiter.to_config()
    assert state["table"]["rng"] == rng is not None  # no seed: the checkpoint's stream goes on
    assert set(kwargs) == {"max_times_sampled", "chunk_steps", "timeout", "selector", "rate_limiter"}


def test_changes_override_and_a_seed_drops_the_generator_state():
    state = state_of(MinSize(1))
    _, kwargs = restore_arguments(state, {"timeout": None, "max_times_sampled": 0, "seed": 9}, None)
    assert kwargs["timeout"] is None and kwargs["max_times_sampled"] == 0 and kwargs["seed"] == 9
    assert kwargs["chunk_steps"] == 5
    assert state["table"]["rng"] is None
    assert set(RESTORE_KEYWORDS) >= {"timeout", "max_times_sampled", "seed", "chunk_steps"}


def test_a_subclass_limiter_must_be_given():
    state = state_of(Picky(2))
    with pytest.raises(ValueError, match="Picky"):
        restore_arguments(state, {}, None)
    _, kwargs = restore_arguments(state, {}, Picky(2))
    assert type(kwargs["rate_limiter"]) is Picky

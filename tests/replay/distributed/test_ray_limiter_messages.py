"""A Ray shard's refused insert says why in the rate limiter's own words, as the local store does.

A shard admits a shipment while its inserts are below its allowance (`replay.distributed.routing`); the
allowance comes with the global counts it was computed from (`ShardAllowance`), and a refusal's message
gives the limiter's `explain_insert_block` one step past that headroom: for a subclass with a rule of its
own (``Cap``: at most ``cap`` steps ever) its class, method, counts and settings, not the base rule's
"inserting is ahead of sampling"; for the base rule its ratio clause.
"""

from __future__ import annotations

import contextlib
import re
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

import _limiters  # noqa: E402
from _limiters import Cap  # noqa: E402

from replay import ReplayStore, SampleToInsertRatio, TrajectorySpec, Uniform  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402
from replay.distributed.routing import ShardAllowance  # noqa: E402
from replay.distributed.shard import ShardActor  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(_limiters)  # the shards get Cap by value

SPEC = TrajectorySpec({"id": ((), "int64")})
REFUSED_S = 0.3  # nothing samples, so a refused shipment stays refused: a short wait tells it


def refusal(store, steps: int, shard: int | None) -> str:
    """The ``TimeoutError`` message of the first episode of ``steps`` steps the store refuses."""
    for k in range(100):
        w = store.writer(timeout=REFUSED_S) if shard is None else store.writer(timeout=REFUSED_S, shard=shard)
        w.extend({"id": np.arange(k * steps, (k + 1) * steps, dtype=np.int64)})
        try:
            w.end_episode()
            w.close()
        except TimeoutError as exc:
            with contextlib.suppress(TimeoutError):
                w.close()
            return str(exc)
    raise AssertionError("no episode was refused")


def test_a_shards_refusal_of_a_subclass_is_explained_by_its_own_rule_as_in_the_local_store(cluster):
    cap = Cap(5)
    own = cap.explain_insert_block((5, 0, 0))  # the step past the cap, whatever counts the allowance had
    assert own.startswith("the rate limiter's own rule refuses: Cap.can_insert is False for one more step at "
                          "inserts=5, samples=0, deletes=0 (size 5)")
    assert "record_settings() {'cap': 5}" in own
    with ReplayStore(SPEC, 1000, num_shards=2, rate_limiter=Cap(5), seed=0) as local:
        local_msg = refusal(local, 3, None)  # 3 + 3 steps admitted (a call while one step is), then refused
        assert local.counters()["inserts"] == 6
    # the local store explains the same rule at its own counts (6 in: it admits a call while one step is)
    assert local_msg.startswith("insert waited") and local_msg.count(cap.explain_insert_block((6, 0, 0))) == 1
    with RayReplayStore(SPEC, 1000, num_shards=2, rate_limiter=Cap(5), seed=0) as store:
        msg = refusal(store, 3, 0)  # shard 0: its share of the cap's headroom, then one shipment past it
        assert msg.startswith("shard 0: insert waited"), msg
        assert msg.count(own) == 1, msg  # the limiter's own words, from the one home the local store uses
        held = re.search(r"this shard holds (\d+) inserted steps and its allowance is (\d+): its share, "
                         r"over 2 shards, of the (\d+) steps the rate limiter admits at the store's counts "
                         r"when the client set it \(inserts=(\d+), samples=0, deletes=0\), past which ", msg)
        assert held is not None, msg
        stats = store.stats()
        assert int(held[1]) == stats["shard_steps"][0] == stats["inserts"] >= int(held[2])
        assert int(held[3]) + int(held[4]) == 5  # the headroom at the counts it came from: the cap
        for base_words in ("ahead of sampling", "max_diff", "until the store samples"):
            assert base_words not in msg, msg
        assert msg.endswith("; nothing of this shipment was stored"), msg


def test_a_shards_refusal_of_the_base_rule_explains_its_ratio_at_the_step_past_the_headroom(cluster):
    # in this process: the allowance pushed with counts (10, 4, 0); samples_per_insert 1, max_diff 12:
    # n - 4 <= 12 admits up to n = 16 inserts, a headroom of 6 over 2 shards; this one's share 3
    limiter = SampleToInsertRatio(1.0, min_size=2, error_buffer=(-10.0, 12.0))
    assert limiter.insert_headroom((10, 4, 0)) == 6
    config = {
        "spec": SPEC.to_config(), "capacity": 100, "num_shards": 2, "selector": Uniform().to_config(),
        "rate_limiter": limiter.to_config(), "insert_headroom": limiter.insert_headroom((0, 0, 0)),
        "insert_counts": (0, 0, 0), "limiter": limiter, "max_times_sampled": 0, "chunk_steps": 100,
        "tier": "host", "timeout": 10.0, "staging_slots": 1, "seed": 5,
    }
    shard = ShardActor(1, config, None)
    try:
        shard.set_allow(ShardAllowance(3.0, (10, 4, 0)))
        assert shard.insert(1, {"id": np.arange(4, dtype=np.int64)}, True, 1.0) == (4, False)  # 0 < 3: in
        with pytest.raises(TimeoutError, match=r"^shard 1: insert waited ") as err:
            shard.insert(2, {"id": np.arange(1, dtype=np.int64)}, True, 0.05)
        msg = str(err.value)
        assert ("this shard holds 4 inserted steps and its allowance is 3: its share, over 2 shards, of the "
                "6 steps the rate limiter admits at the store's counts when the client set it (inserts=10, "
                "samples=4, deletes=0), past which ") in msg, msg
        want = limiter.explain_insert_block((16, 4, 0))
        assert want.startswith("inserting is ahead of sampling: 16 steps inserted for 4 sampled")
        assert msg.endswith(want + "; nothing of this shipment was stored"), msg
        assert shard.store.counters()["inserts"] == 4
    finally:
        shard.close()

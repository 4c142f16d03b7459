"""`replay.torchrl.transitions` never passes on `Batch.to_tensordict`'s window-start marker as episode
starts: a td whose init entry is True at every window's first real step is refused (naming the key and the
remedy); with ``init_key=None`` the rows are exact (checked by hand from the stored values), a stored
``is_init`` comes out as stored, and a bare str for ``fields`` is refused as `TorchRLWriter` refuses one
for ``final_fields``."""

from __future__ import annotations

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from replay import ReplayStore, TrajectorySpec
from replay.torchrl import TorchRLWriter, field_names, transitions

pytest.importorskip("tensordict")

FIELDS = {"observation": ((3,), "float32"), "action": ((), "int64"), "reward": ((), "float32")}
SPEC = TrajectorySpec(FIELDS)
EPISODES, LENGTH = 4, 10


def make_store(mm: MemoryManager, spec: TrajectorySpec = SPEC) -> ReplayStore:
    """Episode e's step t has observation e*100+t (three times), action t; its final step e*100+LENGTH."""
    store = ReplayStore(spec, capacity_steps=256, num_shards=1, memory=mm, seed=3)
    w = store.writer()
    for ep in range(EPISODES):
        for t in range(LENGTH):
            step = {"observation": np.full(3, ep * 100 + t, np.float32), "action": np.int64(t),
                    "reward": np.float32(t)}
            if "is_init" in spec:
                step["is_init"] = np.bool_(t == 0)
            w.append(step)
        w.end_episode(final={"observation": np.full(3, ep * 100 + LENGTH, np.float32)})
    w.close()
    return store


def test_the_default_window_start_marker_is_refused():
    with MemoryManager() as mm:
        store = make_store(mm)
        with store.sample(64, 2) as batch:
            td = batch.to_tensordict()
            with pytest.raises(ValueError, match=r"'is_init'.*init_key=None"):
                transitions(td)
            marked = batch.to_tensordict(init_key="start")  # a marker under another key
            with pytest.raises(ValueError, match=r"'start'.*init_key=None"):
                transitions(marked, init_key="start")
            assert len(transitions(marked, init_key=None)) >= 0  # the caller's word: no check
        store.close()


def test_transitions_without_the_marker_are_the_stored_pairs():
    with MemoryManager() as mm:
        store = make_store(mm)
        for _ in range(5):
            with store.sample(64, 2) as batch:
                windows = batch.to_tensordict(init_key=None)
                mask = windows.get("mask")
                out = transitions(windows)
                assert "is_init" not in out.keys()
                assert len(out) == int(mask.all(-1).sum())
                obs = out.get("observation")[:, 0].long()
                nxt = out.get(("next", "observation"))[:, 0].long()
                assert bool(((obs % 100) < LENGTH).all())  # never a final step
                assert nxt.tolist() == (obs + 1).tolist()  # the next step of the same episode
                assert out.get("action").tolist() == (obs % 100).tolist()
        store.close()


def test_a_stored_is_init_comes_out_as_stored():
    spec = TrajectorySpec({**FIELDS, "is_init": ((), "bool")})
    with MemoryManager() as mm:
        store = make_store(mm, spec)
        seen = set()
        for _ in range(5):
            with store.sample(64, 2) as batch:
                out = transitions(batch.to_tensordict(init_key=None))  # the stored field, untouched
                starts = (out.get("observation")[:, 0].long() % 100) == 0
                assert out.get("is_init").reshape(-1).tolist() == starts.tolist()
                seen.update(starts.tolist())
        assert seen == {True, False}
        store.close()


def test_a_bare_str_of_fields_is_refused_as_for_the_writer():
    with MemoryManager() as mm:
        store = make_store(mm)
        with store.sample(8, 2) as batch:
            windows = batch.to_tensordict(init_key=None)
            with pytest.raises(ValueError, match=r"^fields='observation': give a sequence of field names"):
                transitions(windows, fields="observation")
            assert len(transitions(windows, fields=["observation"])) == len(transitions(windows))
        with pytest.raises(ValueError, match=r"^final_fields='observation': give a sequence of field names"):
            TorchRLWriter(store, final_fields="observation")
        assert field_names(("a", "b"), "x") == ("a", "b")
        with pytest.raises(ValueError, match=r"^x=\('a', 1\)"):
            field_names(("a", 1), "x")
        store.close()

"""`TrajectoryWriter.extend` checks a call whose field names it has seen by comparing each column with the
known signature (type, dtype, per-step shape, common length): under hypothesis, any mix of good and bad
calls after a known signature raises exactly what the spec's checks raise, stores nothing of a bad call,
and stores the good ones as appends would."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager
from replay import ReplayStore, TrajectorySpec

SPEC = TrajectorySpec({"obs": ((2,), "float32"), "action": ((), "int64"), "done": ((), "bool")})


def good(start: int, n: int) -> dict[str, object]:
    pos = np.arange(start, start + n)
    return {
        "obs": (pos[:, None] * 2 + np.arange(2)).astype(np.float32),
        "action": pos.astype(np.int64),
        "done": pos % 2 == 0,
    }


def spoil(cols: dict[str, object], how: int) -> dict[str, object]:
    """One bad column (or set of names) of eight kinds."""
    bad = dict(cols)
    n = len(cols["action"])
    if how == 0:
        bad["action"] = np.array(3, np.int64)  # a 0-d array
    elif how == 1:
        bad["obs"] = bad["obs"].astype(np.float64)  # wrong dtype
    elif how == 2:
        bad["obs"] = np.zeros((n, 3), np.float32)  # wrong per-step shape
    elif how == 3:
        bad["obs"] = np.zeros((1 if n > 1 else 2, 2), np.float32)  # another length (one row would broadcast)
    elif how == 4:
        bad["action"] = torch.zeros(n, dtype=torch.int32)  # a tensor of the wrong dtype
    elif how == 5:
        bad["action"] = list(range(n))  # not an array
    elif how == 6:
        bad["extra"] = np.zeros(n, np.float32)  # an unknown field
    else:
        del bad["done"]  # a missing field
    return bad


def spec_error(steps) -> type[BaseException]:
    with pytest.raises((TypeError, ValueError)) as info:
        SPEC.validate_steps(steps)
    return info.type


@settings(max_examples=60, deadline=None)
@given(
    calls=st.lists(st.tuples(st.integers(1, 7), st.integers(-1, 7), st.booleans()), min_size=1, max_size=25),
    chunk=st.integers(2, 9),
)
def test_bad_calls_after_a_known_signature_raise_as_the_spec_and_store_nothing(calls, chunk):
    with MemoryManager() as mm:
        fast = ReplayStore(SPEC, capacity_steps=40, num_shards=1, memory=mm, chunk_steps=chunk, timeout=5.0)
        ref = ReplayStore(SPEC, capacity_steps=40, num_shards=1, memory=mm, chunk_steps=chunk, timeout=5.0)
        wf, wr = fast.writer(), ref.writer()
        wf.extend(good(0, 1))  # the signature is known from here on
        wr.append({k: v[0] for k, v in good(0, 1).items()})
        start = 1
        for n, how, end in calls:
            cols = good(start, n)
            if how >= 0:
                bad = spoil(cols, how)
                pending = wf.pending
                with pytest.raises(spec_error(bad)):
                    wf.extend(bad)
                assert wf.pending == pending
                continue
            wf.extend(cols)
            for i in range(n):
                wr.append({k: v[i] for k, v in cols.items()})
            start += n
            if end:
                wf.end_episode()
                wr.end_episode()
        wf.end_episode()
        wr.end_episode()
        got = [(e.start, e.length, tuple(e.data[k].tobytes() for k in SPEC)) for e in fast.episodes()]
        want = [(e.start, e.length, tuple(e.data[k].tobytes() for k in SPEC)) for e in ref.episodes()]
        assert got == want
        fast.close()
        ref.close()

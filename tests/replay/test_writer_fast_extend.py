"""TrajectoryWriter.extend's path for column signatures it has checked before: the same store
contents as the spec's checked path (appends), bad input still rejected after a good call with
nothing stored, chunk boundaries and the ring's wrap unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager
from replay import ReplayStore, TrajectorySpec

SPEC = TrajectorySpec(
    {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "bool")}
)


def cols(start: int, n: int) -> dict[str, np.ndarray]:
    pos = np.arange(start, start + n)
    return {
        "obs": (pos[:, None] * 4 + np.arange(4)).astype(np.float32),
        "action": pos.astype(np.int64),
        "reward": (pos * 0.5).astype(np.float32),
        "done": pos % 3 == 0,
    }


def twin_stores(mm: MemoryManager, chunk: int) -> tuple[ReplayStore, ReplayStore]:
    """Two empty stores of 23 steps (episodes of the tests span the ring's wrap), ``chunk`` steps a chunk."""
    a, b = (ReplayStore(SPEC, capacity_steps=23, num_shards=1, memory=mm, chunk_steps=chunk, timeout=5.0)
            for _ in range(2))
    return a, b


def contents(store: ReplayStore) -> list[tuple]:
    return [(e.start, e.length, e.open, tuple(e.data[k].tobytes() for k in SPEC)) for e in store.episodes()]


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 11), min_size=1, max_size=12),
    chunk=st.integers(1, 8),
    ends=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_repeated_signature_equals_appends(lengths, chunk, ends):
    """Capacity 23 with up to 132 steps: episodes span the ring's wrap and chunk boundaries."""
    with MemoryManager() as mm:
        a, b = twin_stores(mm, chunk)
        wa, wb = a.writer(), b.writer()
        start = 0
        for n, end in zip(lengths, ends, strict=False):
            c = cols(start, n)
            wa.extend(c)
            for i in range(n):
                wb.append({k: v[i] for k, v in c.items()})
            start += n
            assert wa.pending == wb.pending
            if end:
                wa.end_episode()
                wb.end_episode()
        assert contents(a) == contents(b)
        assert len(a) == len(b)
        assert wa.steps_written == wb.steps_written
        a.close()
        b.close()


def test_field_order_of_the_call_does_not_matter(mm):
    store = ReplayStore(SPEC, capacity_steps=64, num_shards=1, memory=mm, timeout=5.0)
    w = store.writer()
    c = cols(0, 5)
    w.extend(c)
    w.extend(dict(reversed(list(cols(5, 5).items()))))  # a second signature: same fields, other order
    w.extend(cols(10, 5))
    w.extend(dict(reversed(list(cols(15, 5).items()))))
    w.end_episode()
    (ep,) = store.episodes()
    want = cols(0, 20)
    for k in SPEC:
        np.testing.assert_array_equal(ep.data[k], want[k])
    store.close()


@pytest.mark.parametrize(
    ("field", "value", "exc", "text"),
    [
        ("obs", np.zeros((5, 4), np.float64), TypeError, "float64"),
        ("obs", np.zeros((5, 3), np.float32), ValueError, "(5, 3)"),
        ("action", np.zeros(4, np.int64), ValueError, "steps"),
        ("action", torch.zeros(5, dtype=torch.int32), TypeError, "torch.int32"),
        ("action", np.int64(3), TypeError, "action"),
        ("reward", [0.0] * 5, TypeError, "list"),
    ],
)
def test_bad_columns_after_a_good_call_raise_and_store_nothing(mm, field, value, exc, text):
    store = ReplayStore(SPEC, capacity_steps=64, num_shards=1, memory=mm, timeout=5.0)
    w = store.writer()
    w.extend(cols(0, 5))
    w.extend(cols(5, 5))  # the signature is now known
    bad = cols(10, 5)
    bad[field] = value
    with pytest.raises(exc, match=field if exc is TypeError and field != "action" else None) as info:
        w.extend(bad)
    assert text in str(info.value)
    assert w.pending == 10
    with pytest.raises(ValueError, match="unknown field"):
        w.extend({**cols(10, 5), "extra": np.zeros(5, np.float32)})
    with pytest.raises(ValueError, match="missing field"):
        w.extend({k: v for k, v in cols(10, 5).items() if k != "done"})
    assert w.pending == 10
    w.end_episode()
    (ep,) = store.episodes()
    np.testing.assert_array_equal(ep.data["action"], np.arange(10))
    store.close()


def test_caller_arrays_are_copied_at_extend(mm):
    store = ReplayStore(SPEC, capacity_steps=64, num_shards=1, memory=mm, timeout=5.0)
    w = store.writer()
    w.extend(cols(0, 3))
    c = cols(3, 3)
    w.extend(c)
    c["action"][:] = -1  # mutating the caller's arrays after extend changes nothing stored
    c["obs"][:] = -1
    w.end_episode()
    (ep,) = store.episodes()
    np.testing.assert_array_equal(ep.data["action"], np.arange(6))
    np.testing.assert_array_equal(ep.data["obs"], cols(0, 6)["obs"])
    store.close()


def test_non_contiguous_columns(mm):
    store = ReplayStore(SPEC, capacity_steps=64, num_shards=1, memory=mm, timeout=5.0)
    w = store.writer()
    w.extend(cols(0, 4))
    big = cols(4, 8)
    strided = {k: v[::2] for k, v in big.items()}
    w.extend(strided)
    w.extend(strided)
    w.end_episode()
    (ep,) = store.episodes()
    np.testing.assert_array_equal(
        ep.data["action"], np.r_[np.arange(4), np.arange(4, 12, 2), np.arange(4, 12, 2)]
    )
    store.close()


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 11), min_size=1, max_size=10),
    chunk=st.integers(1, 8),
    kinds=st.lists(st.sampled_from(["add", "extend", "flush", "strided"]), min_size=10, max_size=10),
)
def test_add_episode_equals_extend_then_end_episode(lengths, chunk, kinds):
    """In place (nothing staged, T <= chunk_steps, contiguous columns) or not (an open episode from an
    extend, a flush, strided columns, T > chunk_steps), across the ring's wrap: the same contents."""
    with MemoryManager() as mm:
        a, b = twin_stores(mm, chunk)
        wa, wb = a.writer(), b.writer()
        start = 0
        for n, kind in zip(lengths, kinds, strict=False):
            c = cols(start, n)
            if kind in ("extend", "flush"):  # an episode already open (staged, or committed by a flush)
                for w in (wa, wb):
                    w.extend(cols(1000 + start, 2))
                    if kind == "flush":
                        w.flush()
            if kind == "strided":
                c = {k: np.repeat(v, 2, axis=0)[::2] for k, v in c.items()}
            wa.add_episode(c)
            wb.extend(c)
            wb.end_episode()
            start += n
            assert wa.pending == wb.pending == 0
        assert contents(a) == contents(b)
        counts = [(len(s), w.steps_written, w.episodes_written) for s, w in ((a, wa), (b, wb))]
        assert counts[0] == counts[1]
        a.close()
        b.close()


def test_add_episode_reads_the_columns_in_place_and_rejects_bad_ones(mm):
    store = ReplayStore(SPEC, capacity_steps=50, num_shards=1, memory=mm, timeout=5.0)
    w = store.writer()
    c = cols(0, 5)
    w.add_episode(c)
    c["action"][:] = -1  # the caller's arrays are theirs again once add_episode returns
    assert store.episodes()[0].data["action"].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="obs"):
        w.add_episode({**cols(5, 3), "obs": np.zeros((3, 5), np.float32)})
    with pytest.raises(ValueError):
        w.add_episode({k: v for k, v in cols(5, 3).items() if k != "done"})
    assert len(store) == 5 and w.pending == 0 and w.episodes_written == 1
    with pytest.raises(TypeError, match="reward"):  # float64 rewards: extend's checks, nothing stored
        w.add_episode({**cols(5, 3), "reward": np.arange(3.0)})
    assert len(store) == 5 and w.pending == 0
    w.add_episode(cols(5, 3))
    assert len(store) == 8
    store.close()

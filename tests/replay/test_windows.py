"""Windows: exact bounds and contents on hand-made rings (wrap-around, cursor inside an episode)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replay.windows as windows_module
from replay.windows import gather_fields, gather_windows, reference_gather, window_bounds, window_mask

C = 10  # ring capacity


def ring_after(positions_written: int) -> np.ndarray:
    """A ring of C slots after writing positions 0..positions_written-1; each step's value is its position."""
    ring = np.full(C, -1, dtype=np.int64)
    for p in range(positions_written):
        ring[p % C] = p
    return ring


def windows(anchor, ep_start, ep_end, floor, length, pad, ring):
    anchor = np.array(anchor)
    first, n, dst = window_bounds(anchor, np.array(ep_start), np.array(ep_end), floor, length, pad)
    out = np.empty((len(anchor), length), dtype=ring.dtype)
    gather_windows(ring, first % C, n, dst, out)
    return out, window_mask(n, dst, length)


def test_tail_windows_stop_at_the_episode_end():
    ring = ring_after(10)  # episodes [0, 4) and [4, 10)
    out, mask = windows([1, 4, 8], [0, 4, 4], [4, 10, 10], 0, 4, "tail", ring)
    assert out.tolist() == [[1, 2, 3, 0], [4, 5, 6, 7], [8, 9, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]


def test_head_windows_end_at_the_anchor_and_stop_at_the_episode_start():
    ring = ring_after(10)
    out, mask = windows([1, 4, 9], [0, 4, 4], [4, 10, 10], 0, 4, "head", ring)
    assert out.tolist() == [[0, 0, 0, 1], [0, 0, 0, 4], [6, 7, 8, 9]]
    assert mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 1], [1, 1, 1, 1]]
    # the first row: real steps 0 and 1 at the end, padding (zeros) first
    first, n, dst = window_bounds(np.array([1]), np.array([0]), np.array([4]), 0, 4, "head")
    assert (first[0], n[0], dst[0]) == (0, 2, 2)


def test_windows_across_the_ring_end_after_wrap_around():
    ring = ring_after(14)  # slots hold positions 10..13 in 0..3 and 4..9 in 4..9; floor = 4
    # episode [7, 13): slots 7, 8, 9, 0, 1, 2
    out, mask = windows([7, 8, 12], [7, 7, 7], [13, 13, 13], 4, 5, "tail", ring)
    assert out.tolist() == [[7, 8, 9, 10, 11], [8, 9, 10, 11, 12], [12, 0, 0, 0, 0]]
    assert mask.sum(1).tolist() == [5, 5, 1]
    out, _ = windows([11], [7], [13], 4, 5, "head", ring)
    assert out.tolist() == [[7, 8, 9, 10, 11]]


def test_head_windows_stop_at_the_oldest_stored_step_of_an_overwritten_episode():
    ring = ring_after(16)  # floor = 6: an episode that began at 2 lost positions 2..5
    out, mask = windows([8], [2], [12], 6, 5, "head", ring)
    assert out.tolist() == [[0, 0, 6, 7, 8]] and mask.tolist() == [[0, 0, 1, 1, 1]]


def test_windows_stop_at_the_write_cursor_inside_an_open_episode():
    ring = ring_after(13)
    # after 13 writes slots 0..2 hold positions 10..12 and slots 3..9 hold 3..9. An open episode began
    # at 8 and its committed end is the cursor, 13: a tail window from 11 must stop at 12 and never read
    # slot 3 (position 3, the oldest step of the ring, from another episode).
    out, mask = windows([11, 12], [8, 8], [13, 13], 3, 4, "tail", ring)
    assert out.tolist() == [[11, 12, 0, 0], [12, 0, 0, 0]]
    assert mask.sum(1).tolist() == [2, 1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="length"):
        window_bounds(np.array([0]), np.array([0]), np.array([1]), 0, 0, "tail")
    with pytest.raises(ValueError, match="pad"):
        window_bounds(np.array([0]), np.array([0]), np.array([1]), 0, 2, "middle")
    with pytest.raises(ValueError, match="do not match"):
        gather_windows(
            np.zeros((4, 2), np.float32),
            np.zeros(1, np.int64),
            np.ones(1, np.int64),
            np.zeros(1, np.int64),
            np.zeros((1, 2, 3), np.float32),
        )


@settings(max_examples=80, deadline=None)
@given(
    capacity=st.integers(1, 30),
    data=st.data(),
    shape=st.sampled_from([(), (3,), (2, 3)]),
    dtype=st.sampled_from([np.uint8, np.float32, np.int64, np.bool_]),
    length=st.integers(1, 12),
)
def test_gather_equals_the_step_by_step_reference(capacity, data, shape, dtype, length):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    src = (rng.integers(0, 100, size=(capacity, *shape)) % (2 if dtype is np.bool_ else 100)).astype(dtype)
    b = data.draw(st.integers(1, 8))
    first = rng.integers(0, capacity, b)
    n = rng.integers(1, min(length, capacity) + 1, b)
    dst = np.array([rng.integers(0, length - k + 1) for k in n])
    out = np.full((b, length, *shape), 7, dtype=dtype)  # garbage: padding must be zeroed
    gather_windows(src, first, n, dst, out)
    assert np.array_equal(out, reference_gather(src, first, n, dst, length))


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_bounds_never_cross_the_episode_and_hold_the_anchor(data):
    length = data.draw(st.integers(1, 20))
    ep_start = data.draw(st.integers(0, 50))
    ep_end = ep_start + data.draw(st.integers(1, 40))
    anchor = data.draw(st.integers(ep_start, ep_end - 1))
    floor = data.draw(st.integers(0, anchor))
    for pad in ("tail", "head"):
        first, n, dst = (
            x[0]
            for x in window_bounds(
                np.array([anchor]), np.array([ep_start]), np.array([ep_end]), floor, length, pad
            )
        )
        assert 1 <= n <= length and 0 <= dst <= length - n
        assert max(ep_start, floor if pad == "head" else ep_start) <= first and first + n <= ep_end
        assert first <= anchor < first + n
        if pad == "tail":
            assert first == anchor and dst == 0 and n == min(length, ep_end - anchor)
        else:
            assert first + n - 1 == anchor and dst + n == length
            assert n == min(length, anchor - max(ep_start, floor) + 1)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("row", [(1,), (100,), (3, 64, 64)])
def test_streamed_and_threaded_gathers_equal_the_reference(stream, row, monkeypatch):
    monkeypatch.setattr(windows_module, "_CHUNK_BYTES", 256)  # several chunks of windows even for small rows
    rng = np.random.default_rng(sum(row))
    capacity, length, b = 50, 16, 24
    src = rng.integers(0, 256, (capacity, *row), dtype=np.uint8)
    first = rng.integers(0, capacity, b)  # some windows wrap around the ring's end
    n = rng.integers(1, length + 1, b)
    dst = np.array([rng.integers(0, length - k + 1) for k in n])
    want = reference_gather(src, first, n, dst, length)
    out = np.full((b, length, *row), 7, dtype=np.uint8)
    gather_windows(src, first, n, dst, out, stream=stream)
    assert np.array_equal(out, want)
    # several fields, the rows out of order, several threads (chunks of windows)
    src2 = rng.standard_normal((capacity, 5)).astype(np.float32)
    srcs = (src.reshape(-1).view(np.uint8), src2.reshape(-1).view(np.uint8))
    outs = (np.full((b, length, *row), 7, dtype=np.uint8), np.full((b, length, 5), 7, dtype=np.float32))
    rows = rng.permutation(b)
    mask = np.zeros(b * length, dtype=bool)
    row_bytes = np.array([src[0].nbytes, src2[0].nbytes], dtype=np.int64)
    flat = tuple(o.reshape(-1).view(np.uint8) for o in outs)
    args = (first, n, dst, rows, length, mask)
    gather_fields(srcs, flat, row_bytes, capacity, *args, stream=stream, threads=2)
    assert np.array_equal(outs[0][rows], want)
    assert np.array_equal(outs[1][rows], reference_gather(src2, first, n, dst, length))
    assert np.array_equal(mask.reshape(b, length)[rows], window_mask(n, dst, length))


@pytest.mark.parametrize("tier", ["shared", "host"])
def test_frame_stacks_are_head_windows_of_five_each_frame_stored_once(tier):
    """Stacking (docs/architecture.md#windows): ``sample(B, 5, "head")`` holds frames t-3 .. t+1, so
    ``[:, :4]`` is the stack of s_t and ``[:, 1:]`` that of s_{t+1}; the episode's start is zero-padded
    and masked. Frames of 2x3 bytes whose every byte is the step's position (mod 256)."""
    from graphrl.memory import MemoryManager
    from replay import ReplayStore, TrajectorySpec
    from replay.keys import decode_keys

    spec = TrajectorySpec({"obs": ((2, 3), "uint8"), "action": ((), "int64")})
    with MemoryManager() as mm:
        store = ReplayStore(spec, 40, 1, memory=mm, seed=0, timeout=5, tier=tier)
        assert store.storage.shards[0].columns["obs"].nbytes == 40 * 6  # one frame a step
        w = store.writer()
        for lo, n in ((0, 7), (7, 9)):  # episodes [0, 7) and [7, 16)
            pos = np.arange(lo, lo + n)
            w.extend({"obs": np.broadcast_to(pos[:, None, None], (n, 2, 3)).astype(np.uint8), "action": pos})
            w.end_episode()
        batch = store.sample(64, 5, pad="head")
        anchor = decode_keys(batch.keys.numpy())[1]
        start = np.where(anchor >= 7, 7, 0)
        frames = batch["obs"].numpy()[:, :, 0, 0].astype(np.int64)
        for b in range(64):
            want = [p if p >= start[b] else 0 for p in range(anchor[b] - 4, anchor[b] + 1)]
            assert frames[b].tolist() == want
            assert batch.mask[b].tolist() == [p >= start[b] for p in range(anchor[b] - 4, anchor[b] + 1)]
        batch.release()
        store.close()

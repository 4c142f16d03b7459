"""A batch's shared chunks (`replay.chunk_decode`): windows that share steps decode each shared chunk once
and copy it (`share_jobs`, `copy_shared`), giving byte for byte the frames written, padding zeroed, for
every codec and chunk size, as a decode of one window a call does; a copy of a chunk that failed to decode
fails with it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager
from replay import ReplayStore, TrajectorySpec
from replay.chunk_decode import ChunkDecode, copy_shared, share_jobs

SHAPE = (24, 20)
ROW = SHAPE[0] * SHAPE[1]


def frames(n: int) -> np.ndarray:
    """uint8 [n, 24, 20]: a fixed background, a moving 3x3 sprite, the position's bytes in a corner."""
    out = np.repeat(np.arange(ROW, dtype=np.uint8).reshape(1, *SHAPE) // 7, n, axis=0)
    t = np.arange(n)
    for dy in range(3):
        for dx in range(3):
            out[t, (t // 2 + dy) % SHAPE[0], (t + dx) % SHAPE[1]] = 250
    out[:, 0, 0], out[:, 0, 1] = t % 256, t // 256
    return out


def expected(data: np.ndarray, first: np.ndarray, n: np.ndarray, dst: np.ndarray, length: int) -> np.ndarray:
    out = np.zeros((first.size, length, *SHAPE), np.uint8)
    for i in range(first.size):
        out[i, dst[i] : dst[i] + n[i]] = data[first[i] : first[i] + n[i]]
    return out


@pytest.mark.parametrize("codec,chunk", [("lz4", 1), ("lz4", 4), ("zstd", 1), ("zstd", 2), ("lz4dict", 4)])
def test_shared_decodes_give_the_frames_written(codec, chunk):
    capacity, written = 64, 150  # past wrap-around: live positions [86, 150), the open chunk in the tail
    data = frames(written)
    spec = TrajectorySpec({"obs": (SHAPE, "uint8", codec, 1.0, chunk), "pos": ((), "int64")})
    rng = np.random.default_rng(chunk)
    with MemoryManager() as mm:
        store = ReplayStore(spec, capacity, 1, memory=mm, seed=0, tier="host", timeout=2.0)
        with store.writer(chunk_steps=32) as w:
            w.extend({"obs": data, "pos": np.arange(written)})
        storage = store.storage
        floor, length = written - capacity, 12
        # windows that overlap (equal ones too), partial and whole chunks, padding before and after
        first = np.concatenate(([floor, floor, floor + 3, written - length],
                                rng.integers(floor, written - length + 1, 28)))
        n = np.minimum(length - rng.integers(0, 3, first.size), written - first)
        dst = rng.integers(0, length - n + 1)
        want = expected(data, first, n, dst, length)
        b = first.size
        rows, shard = np.arange(b), np.zeros(b, np.int64)
        decode = ChunkDecode(storage)
        obs = np.full((b, length, *SHAPE), 0xAB, np.uint8)  # every byte must be written
        pos = np.zeros(b * length, np.int64)
        decode.run(rows, shard, first, n, dst, (obs.reshape(-1), pos.view(np.uint8)), length)
        np.testing.assert_array_equal(obs, want)
        decode.close()
        alone = np.full((b, length, *SHAPE), 0xAB, np.uint8)  # one window a call: nothing shared
        decode = ChunkDecode(storage)
        for i in range(b):
            sel = np.array([i])
            decode.run(sel, shard[sel], first[sel], n[sel], dst[sel], (alone.reshape(-1), pos.view(np.uint8)),
                       length)
        np.testing.assert_array_equal(alone, want)
        decode.close()
        store.close()


def test_share_jobs_keeps_one_decode_a_whole_chunk_and_copies_the_rest():
    # jobs: arena offset, length, output offset, first row, rows, window, chunk index, checksum (chunk of 4)
    jobs = np.array([
        [100, 30, 0, 2, 2, 0, 7, 1],    # chunk 7, rows 2..3: partial, kept (no whole job yet)
        [200, 40, 8, 0, 4, 0, 8, 2],    # chunk 8 whole: kept, the source of chunk 8
        [100, 30, 24, 0, 4, 1, 7, 1],   # chunk 7 whole: kept, the source of chunk 7 from now on
        [200, 40, 40, 0, 4, 1, 8, 2],   # chunk 8 whole again: a copy of kept job 1
        [100, 30, 56, 1, 3, 2, 7, 1],   # chunk 7 rows 1..3: a copy of kept job 2, from its row 1
        [300, 40, 68, 0, 4, 2, 8, 2],   # chunk 8 at another offset (another record): kept
    ], dtype=np.int64)
    copies = np.zeros((6, 5), np.int64)
    kept, nc = share_jobs(jobs, 6, 4, copies)
    assert (kept, nc) == (4, 2)
    assert jobs[:4, 2].tolist() == [0, 8, 24, 68]
    assert copies[:2].tolist() == [[1, 40, 0, 4, 1], [2, 56, 1, 3, 2]]
    out = np.arange(80, dtype=np.uint8)  # rows of 1 byte: copies read the kept jobs' decoded rows
    jobs[1, 5] = -1 - jobs[1, 5]  # kept job 1 failed: its copy fails too, zeroed, its window marked
    assert copy_shared(jobs, copies, nc, 1, out) == 1
    assert copies[0, 4] == -2 and (out[40:44] == 0).all()
    assert out[56:59].tolist() == [25, 26, 27] and copies[1, 4] == 2


@settings(max_examples=60, deadline=None)
@given(windows=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 12)), min_size=1, max_size=8))
def test_share_jobs_copies_every_repeated_chunk_and_nothing_else(windows):
    """Chunks of one step (every job whole): the copies are exactly the jobs of a chunk an earlier job
    holds; windows that share no chunk leave the jobs as they were."""
    rows = [(k, w) for w, (first, n) in enumerate(windows) for k in range(first, first + n)]
    jobs = np.zeros((len(rows), 8), np.int64)
    for j, (k, w) in enumerate(rows):
        jobs[j] = [10 * k, 5, j, 0, 1, w, k, 99]
    before = jobs.copy()
    copies = np.zeros((len(rows), 5), np.int64)
    kept, nc = share_jobs(jobs, len(rows), 1, copies)
    unique = len({k for k, _ in rows})
    assert (kept, nc) == (unique, len(rows) - unique)
    assert sorted(jobs[:kept, 6].tolist()) == sorted({k for k, _ in rows})
    for c in range(nc):  # each copy's source decodes the same chunk
        assert jobs[copies[c, 0], 6] == rows[int(copies[c, 1])][0]
    if nc == 0:
        np.testing.assert_array_equal(jobs, before)

"""A compressed field's arena as a ring: an arena of the ring's raw bytes (``arena_ratio <= 1``) holds
incompressible steps commit after commit, old chunks evicted, and reads back exactly; a chunk may end
exactly at the arena's end or at the oldest live chunk, and a full arena refuses the next chunk
(`replay.chunk_codec.place_chunks`)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryBudgetError, MemoryManager
from replay import FieldSpec, ReplayStore, TrajectorySpec
from replay.chunk_codec import ChunkRing

ROW = (16,)


@settings(max_examples=12, deadline=None)
@given(
    codec=st.sampled_from(["lz4", "zstd", "lz4dict"]),
    chunk=st.sampled_from([1, 2, 4, 8]),
    slots=st.integers(2, 5),
    ratio=st.sampled_from([1.0, 0.99, 0.9, 0.8, 0.75, 0.5, 1 / 3]),
    ops=st.lists(st.integers(1, 40), min_size=1, max_size=25),
    seed=st.integers(0, 2**31 - 1),
)
def test_an_arena_of_the_raw_ring_never_refuses_incompressible_commits(codec, chunk, slots, ratio, ops, seed):
    """The store's arena size (`replay.shard.ShardStorage.create`: capacity * row bytes / ratio)."""
    capacity = chunk * slots
    row_bytes = int(np.prod(ROW))
    arena = max(1, int(capacity * row_bytes / ratio))
    rng = np.random.default_rng(seed)
    with MemoryManager() as memory:
        ring = ChunkRing.create(memory, "obs", ROW, np.uint8, codec, capacity, chunk, arena_bytes=arena)
        data = rng.integers(0, 256, (sum(min(n, capacity) for n in ops), *ROW), dtype=np.uint8)
        pos = 0
        for n in ops:
            n = min(n, capacity)
            ring.write(data[pos : pos + n], pos)  # never MemoryBudgetError
            pos += n
            live = np.arange(max(0, pos - capacity), pos)
            out = np.empty((live.size, *ROW), np.uint8)
            ring.read(live, out)
            np.testing.assert_array_equal(out, data[live])
        other = ChunkRing.create(memory, "obs", ROW, np.uint8, codec, capacity, chunk, arena_bytes=arena)
        other.load_state(ring.state())  # a full arena restores into one of the same size
        live = np.arange(max(0, pos - capacity), pos)
        out = np.empty((live.size, *ROW), np.uint8)
        other.read(live, out)
        np.testing.assert_array_equal(out, data[live])


def test_a_full_arena_refuses_the_next_chunk_and_keeps_the_live_ones(mm):
    """Four raw chunks fill an arena of four exactly (the head wraps onto the oldest chunk); a fifth,
    with no chunk evicted (capacity 8), is refused and nothing live is overwritten."""
    noise = np.random.default_rng(1).integers(0, 256, (5, 64), dtype=np.uint8)
    ring = ChunkRing.create(mm, "obs", (64,), np.uint8, "lz4", capacity=8, chunk=1, arena_bytes=4 * 64)
    for p in range(4):
        ring.write(noise[p : p + 1], p)
    before = (ring.meta.copy(), ring.table.copy(), ring.arena.copy())
    msg = r"field 'obs': a compressed chunk of 64 bytes does not fit in the arena of 256 bytes beside 256"
    with pytest.raises(MemoryBudgetError, match=msg):
        ring.write(noise[4:5], 4)
    np.testing.assert_array_equal(ring.meta, before[0])
    np.testing.assert_array_equal(ring.table, before[1])
    np.testing.assert_array_equal(ring.arena, before[2])
    out = np.empty((4, 64), np.uint8)
    ring.read(np.arange(4), out)
    np.testing.assert_array_equal(out, noise[:4])


@pytest.mark.parametrize(("codec", "chunk", "ratio"), [("lz4", 1, 1.0), ("lz4", 8, 1.0), ("zstd", 8, 0.8),
                                                        ("lz4dict", 8, 0.99)])
def test_a_store_at_arena_ratio_one_or_below_runs_as_a_ring_and_restores(tmp_path, codec, chunk, ratio):
    """The break-it repro: at ratio 1 the commit reaching ``capacity`` raised, at 0.8 the one after it."""
    rng = np.random.default_rng(0)
    obs = FieldSpec("obs", (64,), "uint8", codec=codec, chunk=chunk, arena_ratio=ratio)
    store = ReplayStore(TrajectorySpec({"obs": obs, "a": ((), "int64")}), capacity_steps=32, seed=0)
    try:
        frames = rng.integers(0, 256, (80, 64), dtype=np.uint8)
        with store.writer() as w:
            for e in range(10):
                w.add_episode({"obs": frames[8 * e : 8 * e + 8], "a": np.arange(8 * e, 8 * e + 8)})
        eps = list(store.episodes())
        got = {int(a): o for ep in eps for a, o in zip(ep.data["a"], ep.data["obs"], strict=True)}
        assert sorted(got) == list(range(48, 80))
        assert all((got[a] == frames[a]).all() for a in got)
        store.checkpoint(tmp_path)
    finally:
        store.close()
    restored = ReplayStore.restore(tmp_path)
    try:
        eps = list(restored.episodes())
        a = np.concatenate([ep.data["a"] for ep in eps])
        assert sorted(a.tolist()) == list(range(48, 80))
        assert all((ep.data["obs"] == frames[ep.data["a"]]).all() for ep in eps)
    finally:
        restored.close()

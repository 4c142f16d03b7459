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
from replay.chunk_codec import ChunkRing, arena_size
from replay.chunk_encode import ChunkEncode

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
    """The store's arena size (`replay.chunk_codec.arena_size`, as `ShardStorage.create` makes it)."""
    capacity = chunk * slots
    row_bytes = int(np.prod(ROW))
    arena = arena_size(capacity, row_bytes, chunk, ratio)
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


def _model_place(live: list[tuple[int, int]], size: int, sizes: list[int]) -> list[int] | None:
    """Offsets of new chunks by byte extents alone (no head/tail offsets compared): at the end of the newest
    live chunk if it fits before the arena's end and overlaps no live chunk, else at 0 if that overlaps
    none; None when one fits neither way. ``live``: (offset, bytes) oldest first."""
    live, offs = list(live), []
    for n in sizes:
        head = live[-1][0] + live[-1][1] if live else 0
        for off in (head, 0):
            if off + n <= size and not any(off < o + m and o < off + n for o, m in live):
                break
        else:
            return None
        offs.append(off)
        live.append((off, n))
    return offs


@settings(max_examples=25, deadline=None)
@given(
    codec=st.sampled_from(["lz4", "zstd", "lz4dict"]),
    chunk=st.sampled_from([1, 2, 4]),
    slots=st.integers(2, 5),
    arena_rows=st.integers(1, 24),
    ops=st.lists(st.tuples(st.integers(1, 20), st.booleans(), st.booleans()), min_size=1, max_size=25),
    seed=st.integers(0, 2**31 - 1),
)
def test_full_and_empty_arenas_match_a_byte_extent_model_through_evictions_and_restores(
    codec, chunk, slots, arena_rows, ops, seed
):
    """Each commit is accepted or refused as the extent model says, at its offsets (a full arena taken
    for empty would overwrite live bytes; an empty one taken for full would refuse), and a checkpoint
    restored mid-run (full ones included) goes on as the model's chunks laid out from 0."""
    capacity, arena = chunk * slots, arena_rows * ROW[0]  # often a whole number of raw chunks: full
    rng = np.random.default_rng(seed)
    enc = ChunkEncode(codec)
    with MemoryManager() as memory:
        def make() -> ChunkRing:
            return ChunkRing.create(memory, "obs", ROW, np.uint8, codec, capacity, chunk, arena_bytes=arena)

        ring = make()
        data, live = np.zeros((0, *ROW), np.uint8), []  # live: (chunk index, offset, bytes)
        for n, noisy, restore in ops:
            n, pos = min(n, capacity), len(data)
            rows = rng.integers(0, 256 if noisy else 2, (n, *ROW), dtype=np.uint8)
            grown = np.concatenate([data, rows])
            oldest = max(0, len(grown) - capacity) // chunk
            new = range(max(pos // chunk, oldest), len(grown) // chunk)
            sizes = [int(enc.encode(grown[k * chunk : (k + 1) * chunk], chunk, k)[1][0]) for k in new]
            kept = [c for c in live if c[0] >= oldest]
            offs = _model_place([c[1:] for c in kept], arena, sizes)
            before = ring.arena.copy()
            try:
                ring.write(rows, pos)
            except MemoryBudgetError:
                assert offs is None and (ring.arena == before).all()
                continue
            assert offs is not None
            live, data = kept + list(zip(new, offs, sizes, strict=True)), grown
            assert [tuple(ring.table[k % slots, :3]) for k, _, _ in live] == live
            if restore:
                other = make()
                other.load_state(ring.state())
                ring.free()
                ring = other
                starts = np.cumsum([0] + [s for _, _, s in live])
                live = [(k, int(at), s) for (k, _, s), at in zip(live, starts, strict=False)]
            at = np.arange(max(0, len(data) - capacity), len(data))
            out = np.empty((at.size, *ROW), np.uint8)
            ring.read(at, out)
            np.testing.assert_array_equal(out, data[at])

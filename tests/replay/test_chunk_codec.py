"""ChunkRing: compressed chunks of steps read back exactly as a raw ring would, across writes, skipped
positions, arena reuse and checkpoint state round trips (a spawned reader: test_codec_processes.py)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryBudgetError, MemoryManager
from replay.chunk_codec import ChunkRing, make_codec
from replay.chunk_encode import chunk_checksum

SHAPE = (3, 5)


def frames(start: int, n: int) -> np.ndarray:
    """Rows that compress (a repeated background) yet differ by position."""
    out = np.zeros((n, *SHAPE), dtype=np.uint8)
    pos = np.arange(start, start + n)
    out[:, 0, 0] = pos % 251
    out[:, 1, :] = (pos // 251 % 251)[:, None]
    return out


class Reference:
    """A raw ring of positions, the behaviour a ChunkRing must match."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows: dict[int, np.ndarray] = {}
        self.next = 0

    def write(self, rows: np.ndarray, position: int) -> None:
        for i, r in enumerate(rows):
            self.rows[position + i] = r
        self.next = position + len(rows)

    def live(self) -> np.ndarray:
        floor = max(0, self.next - self.capacity)
        return np.array([p for p in range(floor, self.next) if p in self.rows], dtype=np.int64)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_codec_names_and_errors(codec):
    c = make_codec(codec)  # the module docstring's settings: LZ4 acceleration 1, Zstd level 1
    assert (c.codec_id, c.acceleration if codec == "lz4" else c.level) == (codec, 1)
    with pytest.raises(ValueError, match="codec must be one of .*'snappy'"):
        make_codec("snappy")


def test_create_rejects_bad_sizes(mm):
    with pytest.raises(ValueError, match="capacity=24, chunk=16"):
        ChunkRing.create(mm, "obs", SHAPE, np.uint8, "lz4", capacity=24, chunk=16, arena_bytes=1000)
    with pytest.raises(ValueError, match="arena_bytes must be >= 1, got 0"):
        ChunkRing.create(mm, "obs", SHAPE, np.uint8, "lz4", capacity=32, chunk=16, arena_bytes=0)


@settings(max_examples=15, deadline=None)
@given(
    codec=st.sampled_from(["lz4", "zstd", "lz4dict"]),
    chunk=st.sampled_from([1, 4, 8]),
    slots=st.integers(2, 6),
    ops=st.lists(st.tuples(st.integers(1, 30), st.integers(0, 3)), min_size=1, max_size=20),
    seed=st.integers(0, 2**31 - 1),
)
def test_reads_match_a_raw_ring(codec, chunk, slots, ops, seed):
    """Any sequence of writes (some skipping positions, as a dead writer's hole) reads back as a raw ring;
    the arena's bytes are reused as chunks fall below the floor; state() round trips into a new ring."""
    capacity = chunk * slots
    memory = MemoryManager()
    try:
        ring = ChunkRing.create(memory, "obs", SHAPE, np.uint8, codec, capacity, chunk, arena_bytes=4096)
        ref = Reference(capacity)
        rng = np.random.default_rng(seed)
        pos = 0
        for n, skip in ops:
            n = min(n, capacity)
            pos += skip if skip == 3 else 0  # a hole now and then
            rows = frames(pos, n)
            ring.write(rows, pos)
            ref.write(rows, pos)
            pos += n
            live = ref.live()
            if live.size:
                ask = rng.choice(live, size=min(7, live.size))
                out = np.empty((ask.size, *SHAPE), np.uint8)
                ring.read(ask, out)
                np.testing.assert_array_equal(out, np.stack([ref.rows[int(p)] for p in ask]))
        other = ChunkRing.create(memory, "obs", SHAPE, np.uint8, codec, capacity, chunk, arena_bytes=4096)
        other.load_state(ring.state())
        live = ref.live()
        if live.size:
            out = np.empty((live.size, *SHAPE), np.uint8)
            other.read(live, out)
            np.testing.assert_array_equal(out, np.stack([ref.rows[int(p)] for p in live]))
        # the restored ring goes on: its next writes read back too
        rows = frames(pos, chunk + 1)
        other.write(rows, pos)
        got = np.empty_like(rows)
        other.read(np.arange(pos, pos + chunk + 1), got)
        np.testing.assert_array_equal(got, rows)
    finally:
        memory.close()


def test_arena_overflow_raises_and_writes_nothing(mm):
    ring = ChunkRing.create(mm, "obs", (64,), np.uint8, "lz4", capacity=64, chunk=4, arena_bytes=300)
    noise = np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)  # does not compress
    ring.write(noise[:4], 0)
    before = (ring.meta.copy(), ring.table.copy(), ring.arena.copy())
    with pytest.raises(MemoryBudgetError, match=r"field 'obs': a compressed chunk of \d+ bytes does not fit"):
        ring.write(noise[4:12], 4)
    np.testing.assert_array_equal(ring.meta, before[0])
    np.testing.assert_array_equal(ring.table, before[1])
    out = np.empty((4, 64), np.uint8)
    ring.read(np.arange(4), out)
    np.testing.assert_array_equal(out, noise[:4])


def test_read_refuses_positions_not_held(mm):
    ring = ChunkRing.create(mm, "obs", SHAPE, np.uint8, "lz4", capacity=16, chunk=4, arena_bytes=4096)
    ring.write(frames(0, 20), 0)
    with pytest.raises(ValueError, match=r"positions must be in \[4, 20\)"):
        ring.read(np.array([3]), np.empty((1, *SHAPE), np.uint8))


@pytest.mark.parametrize("codec", ["zstd", "lz4dict"])
def test_corrupt_checkpoint_chunk_is_named(mm, codec):
    ring = ChunkRing.create(mm, "obs", SHAPE, np.uint8, codec, capacity=16, chunk=4, arena_bytes=4096)
    ring.write(frames(0, 10), 0)
    state = ring.state()
    state["blob"] = state["blob"].copy()
    n = int(state["chunks"][0, 1])
    state["blob"][:n] = 7
    other = ChunkRing.create(mm, "obs", SHAPE, np.uint8, codec, capacity=16, chunk=4, arena_bytes=4096)
    with pytest.raises(ValueError, match=r"'obs': the checkpoint's chunk 0 \(record 0 of 2\) fails its"):
        other.load_state(state)
    if n < ring.chunk_bytes:  # compressed (lz4dict's 15-byte rows do not compress: stored raw)
        state["chunks"] = state["chunks"].copy()  # garbage whose checksum holds: the decode refuses it
        state["chunks"][0, 2] = chunk_checksum(state["blob"], 0, n, 0)
        with pytest.raises(ValueError, match="field 'obs': chunk 0 of the checkpoint does not decompress"):
            other.load_state(state)
    assert codec == "lz4dict" or n < ring.chunk_bytes
    assert (other.table[:, 0] == -1).all() and other.next_position == 0  # nothing stored


@pytest.mark.parametrize("shape", [(3, 5), (1, 3, 5), (4, 15)])
def test_a_checkpoint_tail_of_another_shape_is_refused_storing_nothing(mm, shape):
    # a tail of one row was broadcast over the open chunk's rows, no error; one of (4, 15) raised numpy's
    # broadcast error after the arena and table were stored
    ring = ChunkRing.create(mm, "obs", SHAPE, np.uint8, "lz4", capacity=16, chunk=4, arena_bytes=4096)
    ring.write(frames(0, 10), 0)
    state = ring.state()
    state["tail"] = np.ones(shape, np.uint8)
    other = ChunkRing.create(mm, "obs", SHAPE, np.uint8, "lz4", capacity=16, chunk=4, arena_bytes=4096)
    other.tail[...] = 9
    msg = rf"field 'obs': the checkpoint's tail has shape {re.escape(str(shape))}, expected \(4, 3, 5\)"
    with pytest.raises(ValueError, match=msg):
        other.load_state(state)
    assert (other.table[:, 0] == -1).all() and other.next_position == 0 and (other.tail == 9).all()
    assert not other.arena.any()


@pytest.mark.parametrize("codec", ["lz4", "lz4dict"])
def test_a_skip_past_a_whole_chunk_keeps_the_rows_written_before_it(mm, codec):
    # found by hypothesis: 6 rows, then 3 rows at position 9 fill chunk 0 (positions 0..7) from the tail
    # alone; the rows of the write were once copied into it as well
    ring = ChunkRing.create(mm, "obs", SHAPE, np.uint8, codec, capacity=16, chunk=8, arena_bytes=4096)
    ring.write(frames(0, 6), 0)
    ring.write(frames(9, 3), 9)
    out = np.empty((9, *SHAPE), np.uint8)
    ring.read(np.r_[0:6, 9:12], out)
    np.testing.assert_array_equal(out, np.concatenate([frames(0, 6), frames(9, 3)]))


def test_a_restore_checks_each_chunk_once_and_a_checked_state_cannot_be_made_bad(
    mm, tmp_path, monkeypatch
):
    """`replay.checkpoint.load` checks the checksums (a `ChunkState`); the ring's load_state decodes, and
    checks them again only for a plain dict (the fault-injection tests: test_breakit_codec_local.py)."""
    import replay.chunk_state as state_module
    from replay import ReplayStore, TrajectorySpec

    spec = TrajectorySpec({"obs": (SHAPE, "uint8", "lz4", 0.5, 2), "a": ((), "int32")})
    store = ReplayStore(spec, 64, 2, seed=1)
    with store.writer() as w:
        w.add_episode({"obs": frames(0, 21), "a": np.arange(21, dtype=np.int32)})
    store.checkpoint(tmp_path)
    store.close()
    calls, real = [], state_module.verify_chunks
    monkeypatch.setattr(state_module, "verify_chunks", lambda *a: calls.append(len(a[1])) or real(*a))
    restored = ReplayStore.restore(tmp_path)
    try:
        assert len(calls) == 2 and sum(calls) == 10  # one check of each shard's chunks (it was two)
        (ep,) = restored.episodes()
        assert np.array_equal(ep.data["obs"], frames(0, 21))
    finally:
        restored.close()
    state = ChunkRing.create(mm, "obs", SHAPE, np.uint8, "lz4", capacity=16, chunk=4, arena_bytes=4096)
    state.write(frames(0, 10), 0)
    good = state.state()
    bad = dict(good, blob=good["blob"].copy())
    bad["blob"][0] ^= 1
    with pytest.raises(ValueError, match=r"^chunk 0 \(record 0 of 2\) fails its checksum"):
        state_module.ChunkState.of(bad)
    checked = state_module.ChunkState.of(good)
    assert checked.next_position == 10
    for name in ("chunks", "blob", "tail"):  # nothing changes it after its check
        with pytest.raises(ValueError, match="read-only"):
            getattr(checked, name)[0] ^= 1
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(checked, name, bad[name])
    assert (good["blob"] == checked.blob).all() and good["blob"].flags.writeable  # the given arrays unchanged


@settings(max_examples=60, deadline=None)
@given(
    codec=st.sampled_from(["lz4", "zstd", "lz4dict"]),
    chunk=st.one_of(st.none(), st.integers(1, 12)),
    capacity=st.integers(1, 200),
    num_shards=st.integers(1, 4),
)
def test_the_store_check_and_the_shards_apply_one_chunk_rule(codec, chunk, capacity, num_shards):
    """`replay._checks.check_codec_capacity` refuses exactly the shares that `chunk_steps_for` (what the
    shards call) refuses, with the chunk `field_chunk` gives."""
    from replay._checks import check_codec_capacity
    from replay.chunk_codec import CHUNK_STEPS, chunk_fits, chunk_steps_for, field_chunk
    from replay.spec import TrajectorySpec

    c = CHUNK_STEPS[codec] if chunk is None else chunk
    assert field_chunk(codec, chunk) == c
    share = capacity // num_shards
    fits = share % c == 0 and share >= 2 * c  # the rule, by hand
    assert chunk_fits(share, c) == fits
    spec = TrajectorySpec({"obs": ((4, 4), "uint8", codec, 1.0, chunk)})
    if fits:
        assert chunk_steps_for(share, chunk, "obs", codec) == c
        check_codec_capacity(spec, capacity, num_shards)
    else:
        with pytest.raises(ValueError, match=rf"field 'obs': chunk={c} "):
            chunk_steps_for(share, chunk, "obs", codec)
        with pytest.raises(ValueError, match=rf"field 'obs': chunk={c} needs each shard's capacity"):
            check_codec_capacity(spec, capacity, num_shards)

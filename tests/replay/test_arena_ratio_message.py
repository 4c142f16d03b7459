"""A full arena's message states the largest ``arena_ratio`` (in hundredths) that would have held what it
refused (`replay.chunk_arena.arena_ratio_for`, from `arena_size`): a ring at that ratio takes the same
writes, or loads the same checkpoint, and one at the next hundredth up does not, where that is exact."""

from __future__ import annotations

import re

import numpy as np
import pytest

from graphrl.memory import MemoryBudgetError, MemoryManager
from replay.chunk_arena import arena_ratio_for, arena_size
from replay.chunk_codec import ChunkRing
from replay.chunk_encode import ChunkEncode

ROW = 64  # bytes a step; chunk=1: a chunk is one step, R = 64 raw bytes


def stated(exc: pytest.ExceptionInfo) -> float:
    """The arena_ratio the message says fits."""
    (ratio,) = re.findall(r"an arena_ratio of ([0-9.]+) or less", str(exc.value))
    return float(ratio)


@pytest.fixture
def memory():
    with MemoryManager() as mm:
        yield mm


def ring(memory: MemoryManager, capacity: int, arena_bytes: int) -> ChunkRing:
    return ChunkRing.create(memory, "obs", (ROW,), np.uint8, "lz4", capacity, 1, arena_bytes=arena_bytes)


def test_arena_ratio_for_is_the_largest_hundredth_whose_arena_holds_the_bytes() -> None:
    for capacity, chunk, want in ((2, 1, 192), (2, 1, 191), (64, 4, 300 * 17), (64, 4, 64 * 64 + 256),
                                  (128, 4, 128 * 64 * 3), (16, 2, 10)):
        r = arena_ratio_for(capacity, 64, chunk, want)
        assert r == round(r, 2) and r >= 0.01
        assert arena_size(capacity, 64, chunk, r) >= want
        assert arena_size(capacity, 64, chunk, r + 0.01) < want
    assert arena_ratio_for(2, 64, 1, 192) == 1.0  # (slots + 1) raw chunks: ratio 1 exactly


def test_a_refused_commit_names_the_ratio_that_takes_it_and_the_next_hundredth_refuses() -> None:
    """Two small chunks of 63 bytes together put a raw chunk (64 bytes) at offset 63 of a two-slot ring;
    the next raw chunk then fits after it only in an arena of 63 + 64 + 64 = 191 bytes or more, which
    arena_ratio 1 gives (192) and 1.01 does not (190): the message at arena_ratio 1.5 says 1."""
    enc = ChunkEncode("lz4")
    noise = np.random.default_rng(0).integers(0, 256, (3, ROW), dtype=np.uint8)
    small = {}
    for k in range(ROW):  # k noise bytes then zeros: chunks of every size from about 15 bytes up
        row = np.zeros((1, ROW), np.uint8)
        row[0, :k] = noise[0, :k]
        small.setdefault(int(enc.encode(row, 1, 0)[1][0]), row)
    a = next(s for s in small if 63 - s in small)
    rows = np.concatenate([small[a], small[63 - a], noise[1:3]])  # the last two stored raw, 64 bytes each
    with MemoryManager() as memory:
        full = ring(memory, 2, arena_size(2, ROW, 1, 1.5))
        for p in range(3):
            full.write(rows[p : p + 1], p)
        with pytest.raises(MemoryBudgetError, match=r"a compressed chunk of 64 bytes does not fit") as info:
            full.write(rows[3:4], 3)
        fits = stated(info)
        assert fits == 1.0
        ok = ring(memory, 2, arena_size(2, ROW, 1, fits))
        for p in range(4):
            ok.write(rows[p : p + 1], p)
        out = np.empty((2, ROW), np.uint8)
        ok.read(np.arange(2, 4), out)
        np.testing.assert_array_equal(out, rows[2:4])
        tight = ring(memory, 2, arena_size(2, ROW, 1, fits + 0.01))
        for p in range(3):
            tight.write(rows[p : p + 1], p)
        with pytest.raises(MemoryBudgetError, match=r"an arena_ratio of 1 or less never refuses chunks"):
            tight.write(rows[3:4], 3)


def test_the_stated_ratio_takes_any_commit_of_chunks_no_larger() -> None:
    """Half-noise steps (chunks of about 48 of 64 bytes) overflow an arena at arena_ratio 4; at the stated
    ratio, commits of 1 .. 16 such steps, each chunk no larger than the refused one, all fit and read back
    (`arena_size`'s bound: (slots + 1) chunks of that size)."""
    rng = np.random.default_rng(1)

    def steps(n: int) -> np.ndarray:
        x = rng.integers(0, 256, (n, ROW), dtype=np.uint8)
        x[:, ROW // 2 :] = 0
        return x

    with MemoryManager() as memory:
        first = ring(memory, 16, arena_size(16, ROW, 1, 4.0))
        data, pos = steps(64), 0
        with pytest.raises(MemoryBudgetError) as info:
            for n in (3, 5, 2, 7, 1, 4, 6, 8, 3, 9, 5, 11):
                first.write(data[pos : pos + n], pos)
                pos += n
        asked = int(re.search(r"a compressed chunk of (\d+) bytes", str(info.value)).group(1))
        fits = stated(info)
        assert fits == arena_ratio_for(16, ROW, 1, 17 * asked) and 1.0 <= fits < 4.0
        assert f"never refuses chunks of up to {asked} bytes" in str(info.value)
        ok = ring(memory, 16, arena_size(16, ROW, 1, fits))
        more = steps(1200)
        sizes = ChunkEncode("lz4").encode(np.ascontiguousarray(more), 1, 0)[1]
        more = more[sizes <= asked]  # chunks no larger than the refused one, in any order of sizes
        pos = 0
        for n in rng.integers(1, 17, 300):
            if pos + n > len(more):
                break
            ok.write(more[pos : pos + n], pos)  # never MemoryBudgetError
            pos += int(n)
        live = np.arange(pos - 16, pos)
        out = np.empty((16, ROW), np.uint8)
        ok.read(live, out)
        np.testing.assert_array_equal(out, more[live])


def test_a_checkpoint_too_big_names_the_ratio_that_loads_it_exactly(memory) -> None:
    """load_state needs the checkpoint's bytes in the arena: the stated ratio's arena loads it, the next
    hundredth's refuses, with the message of a checkpoint (not of one chunk)."""
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, (8, ROW), dtype=np.uint8)
    data[:, 40:] = 0
    src = ring(memory, 8, arena_size(8, ROW, 1, 1.0))
    src.write(data, 0)
    state = src.state()
    total = int(state["chunks"][:, 1].sum())
    small = ring(memory, 8, arena_size(8, ROW, 1, 4.0))
    lead = (rf"the checkpoint's 8 live chunks take {total} bytes, more than the arena of \d+ bytes; lower "
            rf"the field's arena_ratio \(now 4:")
    with pytest.raises(MemoryBudgetError, match=lead):
        small.load_state(state)
    with pytest.raises(MemoryBudgetError) as info:
        small.load_state(state)
    fits = stated(info)
    assert fits == arena_ratio_for(8, ROW, 1, total) and "or less holds them" in str(info.value)
    ok = ring(memory, 8, arena_size(8, ROW, 1, fits))
    ok.load_state(state)
    out = np.empty((8, ROW), np.uint8)
    ok.read(np.arange(8), out)
    np.testing.assert_array_equal(out, data)
    with pytest.raises(MemoryBudgetError, match="the checkpoint's 8 live chunks"):
        ring(memory, 8, arena_size(8, ROW, 1, fits + 0.01)).load_state(state)

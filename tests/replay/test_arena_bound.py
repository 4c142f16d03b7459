"""A codec field's arena (`replay.chunk_codec.arena_size`) never refuses a chunk when every chunk takes at
most ``chunk * row_bytes / max(1, arena_ratio)`` bytes: so ``arena_ratio <= 1`` never fills, whatever the
sizes of the chunks (the circular log skips bytes at the arena's end: one chunk's room covers them)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from replay import FieldSpec, ReplayStore, TrajectorySpec
from replay.chunk_codec import arena_ratio_of, arena_size, place_chunks


@settings(max_examples=300, deadline=None)
@given(
    slots=st.integers(2, 9),
    raw=st.integers(1, 300),
    ratio=st.sampled_from([1.0, 0.9, 0.5, 1.5, 2.0, 4.0, 7.3]),
    data=st.data(),
)
def test_place_chunks_never_refuses_chunks_within_the_bound(slots, raw, ratio, data):
    """Any sequence of writes of 1 .. slots chunks, each of 1 .. m bytes, with the floor right behind the
    write (the most live chunks a write leaves): every chunk placed, live chunks never overlap."""
    capacity, chunk = slots, 1  # row_bytes = raw: a chunk of one step
    size = arena_size(capacity, raw, chunk, ratio)
    m = raw if ratio <= 1 else math.floor(raw / ratio)
    assume(m >= 1)  # a chunk of at least one byte fits the bound (raw >= ratio)
    table = np.full((slots, 4), -1, np.int64)
    head, first = 0, 0
    for k in data.draw(st.lists(st.integers(1, slots), min_size=1, max_size=40), label="writes"):
        sizes = np.array(data.draw(st.lists(st.integers(1, m), min_size=k, max_size=k)), np.int64)
        oldest = max(0, first + k - slots)
        offs = np.zeros(k, np.int64)
        got = place_chunks(table, head, size, oldest, first, sizes, offs)
        assert got >= 0, (size, sizes.tolist(), table.tolist(), head)
        for i in range(k):
            table[(first + i) % slots, :3] = (first + i, offs[i], sizes[i])
        head, first = got, first + k
        live = sorted(
            (int(table[c % slots, 1]), int(table[c % slots, 2])) for c in range(max(0, first - slots), first)
        )
        for (a, n), (b, _) in zip(live, live[1:], strict=False):
            assert a + n <= b  # no live chunk overwritten
        assert all(0 <= a and a + n <= size for a, n in live)


@settings(max_examples=12, deadline=None)
@given(
    codec=st.sampled_from(["lz4", "zstd", "lz4dict"]),
    lengths=st.lists(st.integers(1, 16), min_size=1, max_size=120),
    density=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=120),
    seed=st.integers(0, 2**31 - 1),
)
def test_a_store_at_arena_ratio_1_never_refuses(codec, lengths, density, seed):
    """The reproducer's pattern: episodes of 1 .. 16 steps whose bytes compress anywhere from all to not at
    all, so chunks of every size, into a store whose codec field has arena_ratio=1."""
    spec = TrajectorySpec({"x": FieldSpec("x", (64,), "uint8", codec=codec, arena_ratio=1.0, chunk=4)})
    rng = np.random.default_rng(seed)
    with ReplayStore(spec, capacity_steps=128, num_shards=1, seed=0) as store:
        with store.writer() as w:
            for i, n in enumerate(lengths):
                p = density[i % len(density)]
                x = (rng.integers(0, 256, (n, 64)) * (rng.random((n, 64)) < p)).astype(np.uint8)
                w.extend({"x": x})
                w.end_episode()  # never MemoryBudgetError
        assert len(store) == min(128, sum(lengths))


def test_arena_size_and_its_ratio() -> None:
    assert arena_size(128, 64, 4, 1.0) == 128 * 64 + 4 * 64
    assert arena_size(128, 64, 4, 0.5) == 2 * 128 * 64 + 4 * 64
    assert arena_size(128, 64, 4, 4.0) == 128 * 16 + 4 * 16
    for ratio in (0.5, 0.8, 1.0, 1.5, 4.0, 8.0):
        assert f"{arena_ratio_of(128, 192, 4, arena_size(128, 192, 4, ratio)):.3g}" == f"{ratio:.3g}"

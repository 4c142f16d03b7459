"""samplers.full_graph_bytes: the planner's bounds and their inverses agree with the exact rules they bound.

`slot_bound` is never below `slot_cost` of the packed arena it stands for; `piece_entries` is the largest
entry count whose lone row `slot_bound` admits; `cache_rows_within` never lets `working_set_bytes` pass the
budget and is at most one aligned block short of the exact largest count.
"""

from __future__ import annotations

import numpy as np

from samplers.full_graph_bytes import (
    ALIGN,
    arena_offsets,
    cache_rows_within,
    piece_entries,
    slot_bound,
    slot_cost,
    working_set_bytes,
)


def test_slot_bound_covers_slot_cost():
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 5000, 2000)
    entries = rng.integers(0, 50_000, 2000)
    sources = rng.integers(0, 5000, 2000)
    for row_bytes in (4, 12, 256, 1028):
        exact = slot_cost(arena_offsets(rows, entries, row_bytes)[4], sources, row_bytes)
        bound = slot_bound(rows, entries, sources, row_bytes)
        assert (bound >= exact).all()
        assert (bound - exact <= 8 + 6 * ALIGN).all()  # the overhead is all it adds


def test_piece_entries_is_the_largest_admitted():
    for row_bytes in (4, 64, 256):
        for cap in (400, 1000, 4096, 10_000, 123_457):
            m = piece_entries(cap, row_bytes)
            if m >= 1:
                assert slot_bound(1, m, m, row_bytes) <= cap
            assert slot_bound(1, m + 1, m + 1, row_bytes) > cap


def test_cache_rows_within_fits_the_budget():
    rng = np.random.default_rng(1)
    for _ in range(500):
        row_bytes = int(rng.choice([4, 12, 64, 256]))
        arena = int(rng.integers(0, 1 << 16)) * ALIGN
        stream = int(rng.integers(0, 4000))
        budget = working_set_bytes(arena, 0, stream, row_bytes) + int(rng.integers(0, 1 << 20))
        c = cache_rows_within(budget, arena, stream, row_bytes)
        best = max(c, 0)
        while working_set_bytes(arena, best + 1, stream, row_bytes) <= budget:
            best += 1
        if c >= 0:
            assert working_set_bytes(arena, c, stream, row_bytes) <= budget
        assert best - c <= -(-ALIGN // row_bytes)  # short of the exact count by the alignment at most

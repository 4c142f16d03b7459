"""The host path's cut (`greedy_bounds`) against the exact working-set layout it bounds."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samplers.full_graph_bytes import ALIGN, arena_offsets, csr_offsets
from samplers.full_graph_host import SLACK, greedy_bounds, working_set_layout


@settings(max_examples=40, deadline=None)
@given(degrees=st.lists(st.integers(0, 40), min_size=1, max_size=60), width=st.integers(1, 32),
       index_bytes=st.sampled_from([4, 8]), cap=st.integers(300, 4000))
def test_greedy_partitions_fit_the_exact_layout_and_are_maximal(degrees, width, index_bytes, cap):
    indptr = np.concatenate(([0], np.cumsum(degrees))).astype(np.int64)
    row_bytes, edge_bytes = 4 * width, index_bytes + 4
    bounds, bad = greedy_bounds(indptr, np.int64(edge_bytes), np.int64(8 + row_bytes), np.int64(cap))

    def cost(r0, r1):  # the cut's own bound, written out: 8 (r + 1) + (s + 4) e + r d b + SLACK
        return 8 * (r1 - r0 + 1) + edge_bytes * int(indptr[r1] - indptr[r0]) + (r1 - r0) * row_bytes + SLACK

    if bad >= 0:  # that row alone does not fit, every row before it does
        assert bounds.shape[0] == 0 and cost(bad, bad + 1) > cap
        assert all(cost(r, r + 1) <= cap for r in range(bad))
        return
    assert bounds[0] == 0 and bounds[-1] == len(degrees) and (np.diff(bounds) > 0).all()
    for r0, r1 in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        assert cost(r0, r1) <= cap
        total = working_set_layout(r1 - r0, int(indptr[r1] - indptr[r0]), index_bytes, row_bytes)[3]
        assert total <= cost(r0, r1)  # the exact layout fits what the cut counted
        if r1 < len(degrees):
            assert cost(r0, r1 + 1) > cap  # maximal: the next row would not fit


def test_layout_offsets_are_aligned_and_disjoint():
    o_ind, o_w, o_out, total = working_set_layout(3, 10, 4, 40)
    assert (o_ind, o_w, o_out, total) == (64, 128, 192, 312)  # 32 B of row pointer, 40 of indices, 40 weights
    assert working_set_layout(0, 0, 8, 16)[3] == 64  # an empty partition's row pointer entry, aligned
    assert arena_offsets(3, 10, 40) == (0, 64, 128, 192, 320)  # the staged arena: its end aligned


@pytest.mark.parametrize("rows, entries, row_bytes", [(0, 0, 16), (1, 1, 4), (3, 10, 40), (7, 33, 12),
                                                      (64, 1000, 256), (5, 0, 8)])
def test_the_host_working_set_and_the_staged_arena_share_one_layout(rows, entries, row_bytes):
    """Both paths pack a partition's CSR and output rows by `csr_offsets`: the same offsets at int32
    columns; the arena's size is the working set's end, aligned (arenas sit back to back)."""
    o_ind, o_w, o_out, total = working_set_layout(rows, entries, 4, row_bytes)
    arena = arena_offsets(rows, entries, row_bytes)
    assert arena[:4] == (0, o_ind, o_w, o_out)
    assert arena[4] == -(-total // ALIGN) * ALIGN
    assert working_set_layout(rows, entries, 8, row_bytes) == csr_offsets(rows, entries, 8, row_bytes)[1:]

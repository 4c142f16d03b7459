"""The chunk bounds (`samplers.kernels.cpu.plan.chunk_bounds`, the rule of the planning pass and of a layer
planned ahead): the rows where each multiple of the chunk size is first reached, as ``numpy.searchsorted``
the output offsets finds them, by hand and by hypothesis."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from samplers.kernels.cpu.plan import chunk_bounds, plan
from samplers.kernels.cpu.workspace import Workspace


def _searchsorted_bounds(out_indptr: np.ndarray, nnz: int, chunk: int) -> np.ndarray:
    d_count = out_indptr.shape[0] - 1
    if nnz <= chunk:
        return np.array([0, d_count])
    cuts = np.searchsorted(out_indptr, np.arange(chunk, nnz, chunk), side="left")
    return np.unique(np.concatenate(([0], cuts, [d_count])))


def _plan_all_edges(degrees: list[int], chunk: int):
    """Plan fanout -1 over rows with these in-degrees: the output counts are the degrees."""
    indptr = np.concatenate(([0], np.cumsum(degrees))).astype(np.int64)
    dst = np.arange(len(degrees), dtype=np.int64)
    out_indptr, _, _, nnz, bounds = plan(indptr, dst, -1, False, None, Workspace(len(degrees)), 0,
                                         chunk_edges=chunk)
    return out_indptr, nnz, bounds


def test_bounds_by_hand():
    # offsets 0 3 3 7 8 12 with chunks of 4: 4 is first reached at row 3, 8 at row 4; the total 12 is no cut
    out_indptr, nnz, bounds = _plan_all_edges([3, 0, 4, 1, 4], 4)
    assert out_indptr.tolist() == [0, 3, 3, 7, 8, 12] and nnz == 12
    assert bounds.tolist() == [0, 3, 4, 5]
    assert _plan_all_edges([9, 0, 0], 4)[2].tolist() == [0, 1, 3]  # one row passes 4 and 8
    assert _plan_all_edges([2, 2, 0], 4)[2].tolist() == [0, 3]  # a total of one chunk: one chunk
    assert _plan_all_edges([], 4)[2].tolist() == [0, 0]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=40), st.integers(1, 20))
def test_bounds_equal_searchsorted(degrees, chunk):
    out_indptr, nnz, bounds = _plan_all_edges(degrees, chunk)
    assert nnz == sum(degrees)
    assert out_indptr.tolist() == np.concatenate(([0], np.cumsum(degrees))).astype(int).tolist()
    assert bounds.tolist() == _searchsorted_bounds(out_indptr, nnz, chunk).tolist()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=40), st.integers(1, 20))
def test_bounds_from_summed_offsets_equal_searchsorted(degrees, chunk):
    # a layer planned ahead (by the relabelling before it) finds its bounds from the offsets alone, by the
    # same rule (`chunk_bounds`, the planning pass's too): checked against numpy's searchsorted directly
    out_indptr = np.concatenate(([0], np.cumsum(degrees))).astype(np.int64)
    nnz = int(out_indptr[-1])
    assert chunk_bounds(out_indptr, np.int64(chunk)).tolist() == _searchsorted_bounds(out_indptr, nnz,
                                                                                      chunk).tolist()

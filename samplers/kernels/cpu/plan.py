"""Pass 1 of a layer: each destination row's start, degree (minus excluded or ineligible edges) and
output count, and the prefix sum that turns counts into output offsets.

`plan` runs it over a layer (in chunks of rows on the helper threads when the layer is large; on one
thread the counts and offsets come out of one pass, `plan_rows_summed`); `chunk_bounds` cuts every layer's
rows into the chunks that passes 2 and 3 run, from its offsets; the row loops
prefetch the row pointer of the row 16 ahead and are compiled once per combination of weight counts and
exclusions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba as nb
import numpy as np

from graphrl.kernels import prefetch
from samplers.kernels.cpu.eligible import count_eligible, excl_range
from samplers.kernels.cpu.threads import parallel_chunks
from samplers.kernels.cpu.workspace import Workspace, exclusion_arrays

if TYPE_CHECKING:
    from samplers.kernels.cpu.masks import Masks

__all__ = ["chunk_bounds", "out_count", "plan", "plan_new_rows", "plan_rows", "plan_rows_masked",
           "plan_rows_summed"]

_PLAN_CHUNK_ROWS = 1 << 15  # destinations per chunk of the planning pass
_PREFETCH_AHEAD = 16  # prefetch distance of the planning loops
_NO_WEIGHTS = np.empty(0, dtype=np.float32)
_NO_COUNT = np.empty(0, dtype=np.int64)


@nb.njit(inline="always", cache=True)
def out_count(fanout, replace, deg):
    """A row's output count: every eligible edge for fanout -1 or (without replacement) deg <= fanout,
    else ``fanout`` (0 when deg = 0). Without branches (selects): in a loop over rows of random degrees a
    branch here is mispredicted about as often as taken."""
    take_all = (fanout < 0) | ((deg <= fanout) & (not replace))
    c = deg if take_all else fanout
    return c if deg > 0 else 0


@nb.njit(inline="always", cache=True)
def _plan_row(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, has_count, has_excl,
              row_start, row_deg, row_exlo, row_exhi, row_end, hi, i):
    """Row i of `plan_rows` (the row 16 ahead prefetched); returns its output count. Inlined with
    ``has_count`` and ``has_excl`` constant, so that each combination compiles to its own loop."""
    if i + _PREFETCH_AHEAD < hi:  # the stores per row keep the core from running ahead
        prefetch(indptr, dst[i + _PREFETCH_AHEAD])
        if has_count:
            prefetch(node_count, dst[i + _PREFETCH_AHEAD])
    v = dst[i]
    s = indptr[v]
    e = indptr[v + 1]
    deg = node_count[v] if has_count else e - s
    a = 0
    b = 0
    if has_excl and (excl_rows[v >> 6] >> np.uint64(v & 63)) & np.uint64(1):
        a = np.searchsorted(excl, s)
        b = np.searchsorted(excl, e)
        if has_count:
            for x in range(a, b):
                deg -= weights[excl[x]] > 0
        else:
            deg -= b - a
    row_exlo[i] = a
    row_exhi[i] = b
    row_start[i] = s
    if has_count:
        row_end[i] = e
    row_deg[i] = deg
    return out_count(fanout, replace, deg)


@nb.njit(inline="always", cache=True)
def _plan_loop(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, has_count, has_excl,
               row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, lo, hi, summed):
    """`_plan_row` over rows [lo, hi) into ``out_indptr[i + 1]``: the counts, or (``summed``) the offsets
    counted from 0 at row lo, in the same pass; returns the total when ``summed`` (else 0)."""
    for i in range(lo, min(lo + _PREFETCH_AHEAD, hi)):
        prefetch(indptr, dst[i])
        if has_count:
            prefetch(node_count, dst[i])
    total = 0
    for i in range(lo, hi):
        c = _plan_row(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, has_count,
                      has_excl, row_start, row_deg, row_exlo, row_exhi, row_end, hi, i)
        if summed:
            total += c
            out_indptr[i + 1] = total
        else:
            out_indptr[i + 1] = c
    return total


@nb.njit(inline="always", cache=True)
def _plan_any(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, has_count, row_start,
              row_deg, row_exlo, row_exhi, row_end, out_indptr, lo, hi, summed):
    """`_plan_loop` compiled once per combination of ``has_count`` and exclusions (constant inside)."""
    has_excl = excl.shape[0] > 0
    if has_count:
        if has_excl:
            return _plan_loop(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, True, True,
                              row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, lo, hi,
                              summed)
        return _plan_loop(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, True, False,
                          row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, lo, hi,
                          summed)
    if has_excl:
        return _plan_loop(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, False, True,
                          row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, lo, hi,
                          summed)
    return _plan_loop(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, False, False,
                      row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, lo, hi,
                      summed)


_NO_ROW_BITS = np.empty(0, dtype=np.uint64)  # no row holds an excluded position


@nb.njit(nogil=True, cache=True)
def plan_rows(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, has_count, row_start,
              row_deg, row_exlo, row_exhi, row_end, out_indptr, lo, hi):
    """Pass 1 over rows [lo, hi): start, effective degree and output count of every destination.

    ``excl_rows`` is a bitmap of the nodes whose rows hold excluded positions: only those rows pay
    for the binary searches that find their range ``excl[row_exlo[i]:row_exhi[i]]``. With ``has_count``
    (weights without times) a row's degree is the node's count of positive weights ``node_count[v]``
    minus its excluded positive-weight positions, and its end goes to ``row_end``: the pass then reads
    no weights (but those of excluded positions)."""
    _plan_any(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, has_count, row_start,
              row_deg, row_exlo, row_exhi, row_end, out_indptr, lo, hi, False)


@nb.njit(nogil=True, cache=True)
def chunk_bounds(out_indptr, chunk_edges):
    """The row bounds of a layer's chunks of about ``chunk_edges`` sampled edges, the one rule of the
    planning pass (`plan`) and of a layer planned ahead (`plan_new_rows`).

    Parameters
    ----------
    out_indptr : numpy.ndarray, int64, shape [D + 1]
        Output offsets, out_indptr[0] = 0, non-decreasing.
    chunk_edges : numpy.int64
        Edges a chunk aims at (> 0).

    Returns
    -------
    numpy.ndarray, int64, shape [k + 1]
        0, then for each multiple m of ``chunk_edges`` below the total the first row i with
        out_indptr[i] >= m (repeats dropped), then D: k chunks, one ([0, D]) when the total is at most
        ``chunk_edges``. Each bound is found by a binary search (k of them, not a pass over the rows).
    """
    d_count = out_indptr.shape[0] - 1
    total = out_indptr[d_count]
    bounds = np.empty(min(d_count, total // chunk_edges + 1) + 2, dtype=np.int64)
    bounds[0] = 0
    k = 1
    m = chunk_edges
    while m < total:
        i = np.searchsorted(out_indptr, m)  # the first row whose offset reaches m
        if i > bounds[k - 1]:
            bounds[k] = i
            k += 1
        m = (out_indptr[i] // chunk_edges + 1) * chunk_edges  # the next multiple above that row's offset
    if bounds[k - 1] < d_count or k == 1:
        bounds[k] = d_count
        k += 1
    return bounds[:k]


@nb.njit(nogil=True, cache=True)
def plan_rows_summed(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, has_count,
                     row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, chunk_edges):
    """`plan_rows` over every row, its offsets summed in the same pass (no second pass over the counts),
    then `chunk_bounds`: returns (total, bounds)."""
    out_indptr[0] = 0
    total = _plan_any(indptr, dst, fanout, replace, excl, excl_rows, weights, node_count, has_count,
                      row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, 0, dst.shape[0], True)
    return total, chunk_bounds(out_indptr, chunk_edges)


@nb.njit(nogil=True, cache=True)
def _prefix_sum(out_indptr, chunk_edges):
    """Turn per-row counts in out_indptr[1:] into offsets; return the total and `chunk_bounds`."""
    out_indptr[0] = 0
    total = 0
    for i in range(1, out_indptr.shape[0]):
        total += out_indptr[i]
        out_indptr[i] = total
    return total, chunk_bounds(out_indptr, chunk_edges)


@nb.njit(nogil=True, cache=True)
def plan_new_rows(nodes, lo, hi, indptr, node_count, has_count, fanout, replace, rows, offs):
    """Plan rows [lo, hi) of a layer whose destinations ``nodes`` are being appended (a relabelling's new
    sources, `samplers.kernels.cpu.relabel.relabel_src_planned`), without exclusions, as `plan_rows` does:
    each row's start, degree and output count, the offsets summed on from offs[lo].

    Parameters
    ----------
    nodes : numpy.ndarray, int64, shape [>= hi]
        The next layer's destinations (rows [lo, hi) read), in [0, N) (unchecked).
    lo, hi : int
        The rows to plan (none when hi <= lo).
    indptr : numpy.ndarray, int64, shape [N + 1]
    node_count : numpy.ndarray, int64, shape [N]
        With ``has_count`` (weighted rows) each node's positive-weight count, the rows' degrees; else
        unread (may be empty).
    has_count : bool
    fanout : numpy.int64
        k >= 0, or -1 for every edge.
    replace : bool
    rows : numpy.ndarray, int64, shape [5, >= hi]
        `samplers.kernels.cpu.workspace.Workspace.rows`' layout (starts, degrees, excluded ranges, ends);
        columns [lo, hi) written.
    offs : numpy.ndarray, int64, shape [>= hi + 1]
        Output offsets: offs[lo] already the offset of row lo; offs[lo + 1:hi + 1] written.

    Raises nothing: a kernel trusts its inputs (ids out of range read out of bounds; the public boundary,
    `samplers.kernels.cpu.layer.sample_block`'s caller, validates them).
    """
    if hi <= lo:
        return
    start = offs[lo]
    # The summing loop of `plan_rows_summed` over the piece (faster than counts and a second pass), its
    # offsets from 0, then moved on by the piece's start; the taking layer finds its chunk bounds.
    _plan_any(indptr, nodes, fanout, replace, _NO_COUNT, _NO_ROW_BITS, _NO_WEIGHTS, node_count, has_count,
              rows[0], rows[1], rows[2], rows[3], rows[4], offs, lo, hi, True)
    offs[lo] = start
    if start:
        for i in range(lo + 1, hi + 1):  # rows of this piece, in cache
            offs[i] += start


@nb.njit(nogil=True, cache=True)
def plan_rows_masked(indptr, dst, fanout, replace, excl, excl_rows, weights, has_w, times, row_time, has_t,
                     row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, lo, hi):
    """Pass 1 of masked rows [lo, hi) with edge times: start, end, eligible count (read from the row's
    weights and times) and output count of every row."""
    for i in range(lo, min(lo + _PREFETCH_AHEAD, hi)):
        prefetch(indptr, dst[i])
    for i in range(lo, hi):
        if i + _PREFETCH_AHEAD < hi:
            prefetch(indptr, dst[i + _PREFETCH_AHEAD])
        v = dst[i]
        s = indptr[v]
        e = indptr[v + 1]
        a, b = excl_range(excl, excl_rows, v, s, e)
        row_exlo[i] = a
        row_exhi[i] = b
        row_start[i] = s
        row_end[i] = e
        t_row = row_time[i] if has_t else 0
        count = count_eligible(weights, has_w, times, has_t, t_row, excl, a, b, s, e)
        row_deg[i] = count
        out_indptr[i + 1] = out_count(fanout, replace, count)


def plan(indptr, dst, fanout, replace, excluded, workspace: Workspace, helpers: int,
         masks: Masks | None = None, row_time: np.ndarray | None = None, *, chunk_edges: int):
    """Pass 1 of a layer over the destinations ``dst`` (int64 [D]): each row's start, degree and output
    count, the output offsets, and the chunks of rows that passes 2 and 3 run.

    ``indptr`` (int64 [N+1]), ``fanout``, ``replace``, ``excluded`` and ``masks``/``row_time`` are as in
    `samplers.kernels.cpu.sample_block`; ``helpers`` threads beside the caller plan a large layer;
    ``chunk_edges`` is the sampled edges a chunk aims at (`samplers.kernels.cpu.CHUNK_EDGES`).

    Returns
    -------
    out_indptr : int64 [D+1], output offsets; rows : the workspace's int64 [5 or 4, D] row scratch
    (`Workspace.rows`: starts, degrees, excluded ranges, ends); excl : int64, the excluded CSC
    positions; nnz : int, sampled edges; bounds : int64 [k+1], row bounds of k chunks (0, then for each
    multiple m of ``chunk_edges`` below nnz the first row whose offset reaches m, then D; repeats dropped).
    """
    d_count = dst.shape[0]
    rows = workspace.rows(d_count)
    row_start, row_deg, row_exlo, row_exhi, row_end = rows
    out_indptr = np.empty(d_count + 1, dtype=np.int64)
    excl, excl_rows = exclusion_arrays(indptr, excluded)
    if masks is None or masks.has_count:
        weights, count = (_NO_WEIGHTS, _NO_COUNT) if masks is None else (masks.weights, masks.node_count)
        if masks is None:
            rows = rows[:4]
        fn = plan_rows
        args = (indptr, dst, np.int64(fanout), bool(replace), excl, excl_rows, weights, count,
                masks is not None, row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr)
    else:
        fn = plan_rows_masked
        args = (indptr, dst, np.int64(fanout), bool(replace), excl, excl_rows, masks.weights,
                masks.has_weights, masks.times, row_time, masks.has_times, row_start, row_deg, row_exlo,
                row_exhi, row_end, out_indptr)
    if d_count > _PLAN_CHUNK_ROWS and helpers > 0:
        bounds = np.arange(0, d_count + _PLAN_CHUNK_ROWS, _PLAN_CHUNK_ROWS).clip(max=d_count)
        parallel_chunks(lambda i: fn(*args, bounds[i], bounds[i + 1]), bounds.shape[0] - 1, helpers)
    elif fn is plan_rows:  # one pass: the counts, offsets and chunk bounds
        nnz, bounds = plan_rows_summed(*args, np.int64(chunk_edges))
        return out_indptr, rows, excl, nnz, bounds
    else:
        fn(*args, 0, d_count)
    nnz, bounds = _prefix_sum(out_indptr, chunk_edges)
    return out_indptr, rows, excl, nnz, bounds

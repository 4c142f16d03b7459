"""Weighted rows without edge times on the GPU (the reference's "weighted rows"), a thread per row:
successive sampling. Short rows (at most SHORT_ROW_MAX positions, without replacement, SHORT_SHARE * k
above their eligible count) draw over running sums of the weights not chosen yet, kept in a per-thread
array (`samplers.kernels.weighted_short`, the CPU's code); other rows by rejection over the per-row
float64 prefix sums (``row_prefix`` computes them once per graph), at most REJECT_LIMIT rejected
attempts per output, then an exact draw from what remains.
Only multiplications, additions, subtractions and comparisons, in the CPU's order: the same numbers."""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda

from samplers.kernels import weighted_short
from samplers.kernels.cuda import rng
from samplers.kernels.cuda.rng import draw, row_state, unit
from samplers.kernels.cuda.rows import is_excluded, row_span, sort_range
from samplers.kernels.reference import REJECT_LIMIT, SHORT_ROW_MAX

__all__ = ["REJECT_LIMIT", "eligible_weighted", "row_prefix", "sample_rows_weighted", "weighted_row"]


@cuda.jit(device=True)
def _taken(chosen, o, j, p):  # pragma: no cover - device
    for q in range(o, o + j):
        if chosen[q] == p:
            return True
    return False


@cuda.jit(device=True)
def _lowest_bit_index(x):  # pragma: no cover - device
    """Index of the lowest set bit of a non-zero uint64: the population count below it."""
    return cuda.popc((x & (~x + np.uint64(1))) - np.uint64(1))


_short = weighted_short.compile_for(cuda.jit(device=True), rng, _lowest_bit_index,
                                    cuda.jit(device=True)(weighted_short.subtract_count))
_short_row, _is_short = _short.short_row, _short.is_short


@cuda.jit(device=True)
def eligible_weighted(weights, positive, excl, a, b, row):  # pragma: no cover - device
    """A weighted row's eligible count: its positive weights (``positive[row]``) minus its excluded
    positions excl[a:b] of positive weight; no other weight is read."""
    d = positive[row]
    for q in range(a, b):
        if weights[excl[q]] > 0:
            d -= 1
    return d


@cuda.jit(device=True)
def weighted_row(indptr, indices, edge_ids, has_eids, weights, prefix, positive, row, node, o, c, replace,
                 key, excl, n_excl, src, eids, sums):  # pragma: no cover - device
    """One weighted row's c > 0 outputs into src[o:o + c] and eids[o:o + c]: row ``row`` of ``indptr``
    (and of ``positive``), drawn with the stream of node ``node`` (the two differ in a concatenated CSC:
    `...cuda.typed`); ``sums`` is a per-thread float64 array of SHORT_ROW_MAX entries."""
    s, e, a, b = row_span(indptr, excl, n_excl, row)
    d_e = eligible_weighted(weights, positive, excl, a, b, row)  # as the plan counted them
    if not replace and d_e == c:  # every eligible position, in order
        j = o
        for p in range(s, e):
            if weights[p] > 0 and not is_excluded(excl, a, b, p):
                eids[j] = p
                j += 1
    elif _is_short(replace, s, e, c, d_e):
        _short_row(weights, prefix, excl, a, b, s, e, row_state(key, node), c, sums, eids, o)
    else:
        state0 = row_state(key, node)
        total = prefix[e - 1]
        t = np.int64(0)
        for j in range(c):
            p = np.int64(-1)
            for _attempt in range(REJECT_LIMIT):
                t += 1
                x = unit(draw(state0, t)) * total
                lo = s
                hi = e
                while lo < hi:  # the smallest position with prefix > x
                    mid = (lo + hi) >> 1
                    if prefix[mid] > x:
                        hi = mid
                    else:
                        lo = mid + 1
                q = lo
                if q == e:  # rounding left no prefix above x: the row's last positive weight
                    q = e - 1
                    while q > s and not weights[q] > 0:
                        q -= 1
                if not is_excluded(excl, a, b, q) and (replace or not _taken(eids, o, j, q)):
                    p = q
                    break
            if p < 0:  # exact draw from the eligible positions not chosen yet
                t += 1
                rest = 0.0
                for q in range(s, e):
                    if weights[q] > 0 and not is_excluded(excl, a, b, q) \
                            and (replace or not _taken(eids, o, j, q)):
                        rest += np.float64(weights[q])
                x = unit(draw(state0, t)) * rest
                acc = 0.0
                for q in range(s, e):
                    if weights[q] > 0 and not is_excluded(excl, a, b, q) \
                            and (replace or not _taken(eids, o, j, q)):
                        acc += np.float64(weights[q])
                        p = q
                        if acc > x:
                            break
            eids[o + j] = p
        if not replace:
            sort_range(eids, o, o + c)
    for j in range(o, o + c):
        p = eids[j]
        src[j] = indices[p]
        eids[j] = edge_ids[p] if has_eids else p


@cuda.jit
def sample_rows_weighted(indptr, indices, edge_ids, has_eids, weights, prefix, positive, dst, out_indptr,
                         fanout, replace, key, excl, src, eids):  # pragma: no cover - device
    """Weighted rows without edge times, 0 <= fanout, one thread per row (the reference's "weighted
    rows"): successive sampling by rejection over the row's prefix sums ``prefix``, at most REJECT_LIMIT
    rejected attempts per output, then an exact draw from what remains. The chosen CSC positions are
    kept in ``eids[o:o + c]`` until the row is done, then replaced by sources and edge ids."""
    sums = cuda.local.array(SHORT_ROW_MAX, numba.float64)  # a short row's running sums
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    while i < dst.shape[0]:
        o = out_indptr[i]
        c = out_indptr[i + 1] - o
        if c > 0:
            weighted_row(indptr, indices, edge_ids, has_eids, weights, prefix, positive, dst[i], dst[i], o, c,
                         replace, key, excl, n_excl, src, eids, sums)
        i += stride


@cuda.jit
def row_prefix(indptr, weights, prefix, positive):  # pragma: no cover - device
    """Per-row inclusive float64 prefix sums of the weights and positive counts, one thread per row,
    summed in position order (as `samplers.kernels.reference.weight_prefix`: the same numbers)."""
    v = cuda.grid(1)
    stride = cuda.gridsize(1)
    while v < indptr.shape[0] - 1:
        total = 0.0
        count = np.int64(0)
        for p in range(indptr[v], indptr[v + 1]):
            w = weights[p]
            total += np.float64(w)
            prefix[p] = total
            if w > 0:
                count += 1
        positive[v] = count
        v += stride

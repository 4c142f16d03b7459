"""Weighted rows without edge times on the GPU (the reference's "weighted rows"), a thread per row:
successive sampling by rejection over the per-row float64 prefix sums (``row_prefix`` computes them
once per graph), at most REJECT_LIMIT rejected attempts per output, then an exact draw from what
remains. Only multiplications, additions and comparisons: the same numbers as the CPU's."""

from __future__ import annotations

import numpy as np
from numba import cuda

from samplers.kernels.cuda.rng import draw, row_state, unit
from samplers.kernels.cuda.rows import is_excluded, row_span, sort_range
from samplers.kernels.reference import REJECT_LIMIT

__all__ = ["REJECT_LIMIT", "row_prefix", "sample_rows_weighted"]


@cuda.jit(device=True)
def _taken(chosen, o, j, p):  # pragma: no cover - device
    for q in range(o, o + j):
        if chosen[q] == p:
            return True
    return False


@cuda.jit
def sample_rows_weighted(indptr, indices, edge_ids, has_eids, weights, prefix, positive, dst, out_indptr,
                         fanout, replace, key, excl, src, eids):  # pragma: no cover - device
    """Weighted rows without edge times, 0 <= fanout, one thread per row (the reference's "weighted
    rows"): successive sampling by rejection over the row's prefix sums ``prefix``, at most REJECT_LIMIT
    rejected attempts per output, then an exact draw from what remains. The chosen CSC positions are
    kept in ``eids[o:o + c]`` until the row is done, then replaced by sources and edge ids."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    while i < dst.shape[0]:
        o = out_indptr[i]
        c = out_indptr[i + 1] - o
        if c > 0:
            v = dst[i]
            s, e, a, b = row_span(indptr, excl, n_excl, v)
            d_e = positive[v]  # eligible positions, as the plan counted them (no pass over the row)
            for q in range(a, b):
                if weights[excl[q]] > 0:
                    d_e -= 1
            if not replace and d_e == c:  # every eligible position, in order
                j = o
                for p in range(s, e):
                    if weights[p] > 0 and not is_excluded(excl, a, b, p):
                        eids[j] = p
                        j += 1
            else:
                state0 = row_state(key, v)
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

"""Pass 1 on the GPU: each destination row's start, degree and output count.

``plan_rows`` (uniform) and ``plan_rows_weighted`` (weighted rows from the positive counts) run a thread
per row and write counts only. ``plan_uniform`` (a thread per row) and ``plan_masked`` (a warp per row,
the eligible count by a warp reduction) also keep each row's start, degree and excluded range for the
choosing kernels. Each plans the first ``nrow[0]`` rows of a destination array that may be an upper
bound (a row count that stays on the device, a chain's); the rest count 0.
"""

from __future__ import annotations

import numba
from numba import cuda

from samplers.kernels.cuda.launch import WARP
from samplers.kernels.cuda.rows import is_eligible, output_count, row_span
from samplers.kernels.cuda.weighted import eligible_weighted

__all__ = ["plan_masked", "plan_rows", "plan_rows_weighted", "plan_uniform"]


@cuda.jit
def plan_uniform(indptr, dst, nrow, fanout, replace, excl, row_start, row_deg, row_exlo, row_exhi,
                 counts):  # pragma: no cover - device
    """Uniform rows for the warp-per-row choice (`...cuda.uniform.choose_uniform`): each of the first
    ``nrow[0]`` rows' span, degree and output count (the rest of ``dst``, an upper bound, count 0)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    n = nrow[0]
    while i < dst.shape[0]:
        if i >= n:
            row_start[i] = 0
            row_deg[i] = 0
            row_exlo[i] = 0
            row_exhi[i] = 0
            counts[i] = 0
            i += stride
            continue
        s, e, a, b = row_span(indptr, excl, n_excl, dst[i])
        d = e - s - (b - a)
        row_start[i] = s
        row_deg[i] = d
        row_exlo[i] = a
        row_exhi[i] = b
        counts[i] = output_count(d, fanout, replace)
        i += stride


@cuda.jit
def plan_masked(indptr, dst, nrow, fanout, replace, weights, has_w, times, row_time, has_t, excl, row_start,
                row_raw, row_deg, row_exlo, row_exhi, counts):  # pragma: no cover - device
    """Masked rows (weights and/or times): each of the first ``nrow[0]`` rows' eligible count by a warp
    reduction (0 for the rest of ``dst``, an upper bound)."""
    part = cuda.shared.array(WARP, numba.int64)
    lane = cuda.threadIdx.x
    row = cuda.blockIdx.x
    n_excl = excl.shape[0]
    n = nrow[0]
    while row < dst.shape[0]:
        if row >= n:
            if lane == 0:
                counts[row] = 0
            row += cuda.gridDim.x
            continue
        s, e, a, b = row_span(indptr, excl, n_excl, dst[row])
        t_row = row_time[row] if has_t else row_time[0]
        c = 0
        p = s + lane
        while p < e:
            if is_eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):
                c += 1
            p += WARP
        part[lane] = c
        cuda.syncthreads()
        if lane == 0:
            total = 0
            for q in range(WARP):
                total += part[q]
            row_start[row] = s
            row_raw[row] = e - s
            row_deg[row] = total
            row_exlo[row] = a
            row_exhi[row] = b
            counts[row] = output_count(total, fanout, replace)
        cuda.syncthreads()
        row += cuda.gridDim.x


@cuda.jit
def plan_rows(indptr, dst, nrow, fanout, replace, excl, counts):  # pragma: no cover - device
    """Output count of each of the first ``nrow[0]`` rows (uniform rules, excluded positions removed;
    0 for the rest of ``dst``, an upper bound): one thread per row."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    n = nrow[0]
    while i < dst.shape[0]:
        if i < n:
            s, e, a, b = row_span(indptr, excl, n_excl, dst[i])
            counts[i] = output_count(e - s - (b - a), fanout, replace)
        else:
            counts[i] = 0
        i += stride


@cuda.jit
def plan_rows_weighted(positive, weights, indptr, dst, nrow, fanout, replace, excl,
                       counts):  # pragma: no cover - device
    """Output count of each of the first ``nrow[0]`` weighted rows (0 for the rest of ``dst``, an upper
    bound): d_e = the row's positive weights (``positive``) minus its excluded positions of positive
    weight; no other weight is read."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    n = nrow[0]
    while i < dst.shape[0]:
        if i < n:
            v = dst[i]
            d = positive[v]
            if n_excl:  # only then is indptr read
                _, _, a, b = row_span(indptr, excl, n_excl, v)
                d = eligible_weighted(weights, positive, excl, a, b, v)
            counts[i] = output_count(d, fanout, replace)
        else:
            counts[i] = 0
        i += stride

"""Masked rows on the GPU (edge times, with or without weights; weighted rows of fanout -1), a warp
per row: every eligible position; without replacement the k smallest exponential keys in k rounds of a
warp-wide arg-min above the previous pick (keys are recomputed, so no per-edge scratch); with
replacement the inversion of float64 prefix sums that lane 0 adds in position order, a window of 32
in shared memory at a time (no per-edge scratch either: a chain sizes nothing by the rows' degrees).

GPU ``log`` may differ from the C library's in the last bit, so a key that ties to the last bit can
rarely order differently on a real GPU than on the CPU (under the simulator they are identical).

References
----------
Efraimidis and Spirakis (IPL 2006), A-ES exponential keys, as in GraphBolt's GPU sampler.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import cuda

from samplers.kernels.cuda.launch import WARP
from samplers.kernels.cuda.rng import draw, row_state, unit, unit_open
from samplers.kernels.cuda.rows import NO_INDEX, is_eligible, key_less, sort_range

__all__ = ["choose_masked"]


@cuda.jit
def choose_masked(dst, row_start, row_raw, row_deg, row_exlo, row_exhi, out_indptr, fanout, replace, key,
                  weights, has_w, times, row_time, has_t, excl, pos):  # pragma: no cover - device
    """Masked rows: every eligible position, A-ES keys (k warp-wide arg-mins), or prefix-sum inversion.
    A row whose outputs run past ``pos``'s end (a chain's capacity, fanout -1: an overflow, read back
    with the chain's sizes) writes position 0 up to that end, for the gather."""
    bkey = cuda.shared.array(WARP, numba.float64)
    bpos = cuda.shared.array(WARP, numba.int64)
    lane = cuda.threadIdx.x
    row = cuda.blockIdx.x
    draws = replace and fanout >= 0
    while row < dst.shape[0]:
        o = out_indptr[row]
        c = out_indptr[row + 1] - o
        s = row_start[row]
        d = row_raw[row]
        e = s + d
        a = row_exlo[row]
        b = row_exhi[row]
        t_row = row_time[row] if has_t else row_time[0]
        if c > 0 and o + c > pos.shape[0]:
            j = o + lane
            while j < pos.shape[0]:
                pos[j] = 0
                j += WARP
        elif c > 0:
            if not draws and c == row_deg[row]:
                if lane == 0:  # every eligible edge, in order
                    w = o
                    for p in range(s, e):
                        if is_eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):
                            pos[w] = p
                            w += 1
            elif not draws:
                # A-ES: the c smallest (key, position) pairs, one warp-wide arg-min per pick
                state0 = row_state(key, dst[row])
                prev_k = -1.0
                prev_p = np.int64(-1)
                for r in range(c):
                    best_k = math.inf
                    best_p = NO_INDEX
                    p = s + lane
                    while p < e:
                        if is_eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):
                            wp = np.float64(weights[p]) if has_w else 1.0
                            u = unit_open(draw(state0, p - s + 1))
                            k = -math.log(u) / wp
                            if key_less(prev_k, prev_p, k, p) and key_less(k, p, best_k, best_p):
                                best_k = k
                                best_p = p
                        p += WARP
                    bkey[lane] = best_k
                    bpos[lane] = best_p
                    cuda.syncthreads()
                    if lane == 0:
                        for q in range(1, WARP):
                            if key_less(bkey[q], bpos[q], bkey[0], bpos[0]):
                                bkey[0] = bkey[q]
                                bpos[0] = bpos[q]
                        pos[o + r] = bpos[0]
                    cuda.syncthreads()
                    prev_k = bkey[0]
                    prev_p = bpos[0]
                    cuda.syncthreads()
                if lane == 0:
                    sort_range(pos, o, o + c)
            else:
                # inverse CDF over the row's running sums in position order (the CPU's additions), without
                # per-edge scratch: lane 0 sums the row once for the total, then again 32 positions at a
                # time into shared memory, where each lane finds its draws that fall in that window
                if lane == 0:
                    total = 0.0
                    last = s
                    for p in range(s, e):
                        if is_eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):
                            total += np.float64(weights[p]) if has_w else 1.0
                            last = p
                    bkey[0] = total
                    bpos[0] = last
                cuda.syncthreads()
                total = bkey[0]
                last = bpos[0]
                cuda.syncthreads()
                state0 = row_state(key, dst[row])
                run = 0.0  # lane 0's running sum
                below = 0.0  # the running sum before this window
                base = np.int64(0)
                while base < d:
                    width = d - base if d - base < WARP else WARP
                    if lane == 0:
                        for q in range(width):
                            p = s + base + q
                            if is_eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):
                                run += np.float64(weights[p]) if has_w else 1.0
                            bkey[q] = run
                    cuda.syncthreads()
                    top = bkey[width - 1]
                    j = lane
                    while j < c:
                        x = unit(draw(state0, j + 1)) * total
                        if below <= x and x < top:  # the first running sum > x lies in this window
                            lo = np.int64(0)
                            z = width
                            while lo < z:
                                mid = (lo + z) >> 1
                                if bkey[mid] > x:
                                    z = mid
                                else:
                                    lo = mid + 1
                            pos[o + j] = s + base + lo
                        j += WARP
                    below = top
                    cuda.syncthreads()
                    base += WARP
                j = lane
                while j < c:  # past every running sum (x rounded up to the total): the last eligible edge
                    if not unit(draw(state0, j + 1)) * total < total:
                        pos[o + j] = last
                    j += WARP
                cuda.syncthreads()
        row += cuda.gridDim.x

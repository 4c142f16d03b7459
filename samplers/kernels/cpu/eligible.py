"""Which CSC positions of a masked row may be drawn (weights > 0, not excluded, time <= the row's).

Each per-row loop of masked rows lives in its own (not inlined) function: inlined into the row loop
together with the binary searches of the exclusion range, LLVM compiles the position loop far slower.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["count_eligible", "eligible", "excl_range", "take_eligible"]


@nb.njit(inline="always", cache=True)
def eligible(weights, has_w, times, has_t, t_row, p):
    ok = True
    if has_w:
        ok = weights[p] > 0
    if has_t:
        ok = ok and times[p] <= t_row
    return ok


@nb.njit(nogil=True, cache=True)
def excl_range(excl, excl_rows, v, s, e):
    """The range [a, b) of ``excl`` inside the CSC positions [s, e) of row v (0, 0 without any)."""
    if excl.shape[0] > 0 and (excl_rows[v >> 6] >> np.uint64(v & 63)) & np.uint64(1):
        return np.searchsorted(excl, s), np.searchsorted(excl, e)
    return 0, 0


@nb.njit(nogil=True, cache=True)
def count_eligible(weights, has_w, times, has_t, t_row, excl, q, b, s, e):
    count = 0
    for p in range(s, e):
        ok = eligible(weights, has_w, times, has_t, t_row, p)
        if q < b and excl[q] == p:
            ok = False
            q += 1
        count += ok
    return count


@nb.njit(nogil=True, cache=True)
def take_eligible(weights, has_w, times, has_t, t_row, excl, q, b, s, e, pos, o):
    """Write every eligible position of [s, e) to pos[o:], in order."""
    w = o
    for p in range(s, e):
        ok = eligible(weights, has_w, times, has_t, t_row, p)
        if q < b and excl[q] == p:
            ok = False
            q += 1
        if ok:
            pos[w] = p
            w += 1

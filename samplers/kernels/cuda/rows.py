"""Device functions on one destination row: its CSC span and excluded range, which positions may be
drawn, virtual -> CSC positions, its output count (docs/architecture.md#sampling-rules)."""

from __future__ import annotations

import numpy as np
from numba import cuda

__all__ = ["NO_INDEX", "is_eligible", "is_excluded", "key_less", "lower_bound", "output_count", "row_span",
           "sort_range", "upper_bound", "virtual_to_real"]

NO_INDEX = np.int64(np.iinfo(np.int64).max)


@cuda.jit(device=True)
def output_count(deg, fanout, replace):  # pragma: no cover - device
    if fanout < 0 or (not replace and deg <= fanout):
        return deg
    if deg == 0:
        return np.int64(0)
    return fanout


@cuda.jit(device=True)
def key_less(ka, pa, kb, pb):  # pragma: no cover - device
    return ka < kb or (ka == kb and pa < pb)


@cuda.jit(device=True)
def sort_range(arr, lo, hi):  # pragma: no cover - device
    """Insertion sort of arr[lo:hi] (short rows: one lane)."""
    for i in range(lo + 1, hi):
        x = arr[i]
        q = i
        while q > lo and arr[q - 1] > x:
            arr[q] = arr[q - 1]
            q -= 1
        arr[q] = x


@cuda.jit(device=True)
def lower_bound(arr, lo, hi, x):  # pragma: no cover - device
    """First index in [lo, hi) of the sorted arr whose value is >= x (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if arr[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cuda.jit(device=True)
def upper_bound(arr, lo, hi, x):  # pragma: no cover - device
    """First index in [lo, hi) of the sorted arr whose value is > x (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if arr[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cuda.jit(device=True)
def row_span(indptr, excl, n_excl, v):  # pragma: no cover - device
    """Row v's CSC range [s, e) and the range [a, b) of its positions in the sorted excluded array."""
    s = indptr[v]
    e = indptr[v + 1]
    a = np.int64(0)
    b = np.int64(0)
    if n_excl:
        a = lower_bound(excl, 0, n_excl, s)
        b = lower_bound(excl, a, n_excl, e)
    return s, e, a, b


@cuda.jit(device=True)
def is_excluded(excl, a, b, p):  # pragma: no cover - device
    """Whether CSC position p is among the row's excluded positions excl[a:b]."""
    if a == b:
        return False
    q = lower_bound(excl, a, b, p)
    return q < b and excl[q] == p


@cuda.jit(device=True)
def is_eligible(weights, has_w, times, has_t, t_row, excl, a, b, p):  # pragma: no cover - device
    """Whether CSC position p may be drawn in a masked row: positive weight (with weights), time <= the
    row's time (with times), and not among the row's excluded positions excl[a:b]."""
    if has_w and not weights[p] > 0:
        return False
    if has_t and not times[p] <= t_row:
        return False
    return not is_excluded(excl, a, b, p)


@cuda.jit(device=True)
def virtual_to_real(excl, a, b, s, p):  # pragma: no cover - device
    """Virtual position p (over the row's non-excluded positions) -> CSC position:
    s + p + #{q in [a, b) : excl[q] - s - (q - a) <= p} (that sequence is non-decreasing in q)."""
    lo = a
    hi = b
    while lo < hi:
        mid = (lo + hi) >> 1
        if excl[mid] - s - (mid - a) <= p:
            lo = mid + 1
        else:
            hi = mid
    return s + p + (lo - a)

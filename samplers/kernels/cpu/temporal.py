"""Rows with edge times (the reference's "temporal rows", with or without weights): a position is
eligible iff its weight is > 0, it is not excluded and its time is <= the row's time.

Without replacement a row takes the k eligible positions with the smallest exponential keys
``-log(u) / w`` (A-ES): rows of at most 64 eligible edges compute every key and rank them branch-free;
longer rows keep the k smallest in a heap and skip the logarithm of any position whose key provably
cannot enter it. With replacement a row inverts float64 prefix sums of its eligible weights. The
choosing pass prefetches the weights and times of the row 8 ahead (docs/architecture.md#sampling-rules).

References
----------
Efraimidis and Spirakis, "Weighted random sampling with a reservoir" (IPL 2006), A-ES, as GraphBolt
uses it for temporal sampling.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from graphrl.kernels import prefetch
from samplers.kernels.cpu.bits import BITMAP_MAX, emit_in_order
from samplers.kernels.cpu.eligible import eligible, take_eligible
from samplers.kernels.cpu.rng import GOLDEN, draw, mix, row_state, unit, unit_open

__all__ = ["choose_rows_temporal"]
_SKIP_SLACK = 1.0 - 2.0 ** -40  # safety factor of the log-free rejection test (see _aes_row)


@nb.njit(inline="always", cache=True)
def _heap_less(ka, pa, kb, pb):
    return ka < kb or (ka == kb and pa < pb)


@nb.njit(inline="always", cache=True)
def _heap_sift_down(hkey, hpos, n):
    """Restore the max-heap (largest (key, pos) at 0) after replacing its root."""
    i = 0
    while True:
        a = 2 * i + 1
        if a >= n:
            return
        b = a + 1
        big = a
        if b < n and _heap_less(hkey[a], hpos[a], hkey[b], hpos[b]):
            big = b
        if _heap_less(hkey[i], hpos[i], hkey[big], hpos[big]):
            hkey[i], hkey[big] = hkey[big], hkey[i]
            hpos[i], hpos[big] = hpos[big], hpos[i]
            i = big
        else:
            return


@nb.njit(nogil=True, cache=True)
def _aes_segment(weights, has_w, times, has_t, t_row, ps, pe, s, state0, c, hkey, hpos, n, top):
    """Offer the eligible positions [ps, pe) (no excluded one among them) to the heap; return (n, top).

    Once the heap is full, a position whose key cannot beat the heap's top is rejected without the
    logarithm: ``-log(u) >= 1 - u``, so ``(1 - u) * SLACK >= top * w`` implies ``key >= top`` (the
    slack of 2^-40 covers every rounding of both sides), and a key equal to the top loses the tie to
    the earlier position. That skips the log for all but about c ln(d / c) positions and never changes
    the result."""
    for p in range(ps, pe):
        if not eligible(weights, has_w, times, has_t, t_row, p):
            continue
        r = draw(state0, p - s + 1)
        u = unit_open(r)
        wp = np.float64(weights[p]) if has_w else 1.0
        if n == c and (1.0 - u) * _SKIP_SLACK >= top * wp:
            continue
        k = -math.log(u) / wp
        if n < c:  # sift up
            j = n
            hkey[j] = k
            hpos[j] = p
            while j > 0:
                par = (j - 1) >> 1
                if _heap_less(hkey[par], hpos[par], hkey[j], hpos[j]):
                    hkey[j], hkey[par] = hkey[par], hkey[j]
                    hpos[j], hpos[par] = hpos[par], hpos[j]
                    j = par
                else:
                    break
            n += 1
            if n == c:
                top = hkey[0]
        elif _heap_less(k, p, hkey[0], hpos[0]):
            hkey[0] = k
            hpos[0] = p
            _heap_sift_down(hkey, hpos, c)
            top = hkey[0]
    return n, top


_AES_SMALL = 64  # rows with at most this many eligible edges select by rank counting instead of a heap


@nb.njit(nogil=True, cache=True)
def _keys_segment(weights, has_w, times, has_t, t_row, ps, pe, s, state0, kk, pp, n):
    """Exponential keys of the eligible positions [ps, pe) appended at kk[n:], pp[n:]; return n."""
    for p in range(ps, pe):
        if eligible(weights, has_w, times, has_t, t_row, p):
            r = draw(state0, p - s + 1)
            u = unit_open(r)
            wp = np.float64(weights[p]) if has_w else 1.0
            kk[n] = -math.log(u) / wp
            pp[n] = p
            n += 1
    return n


@nb.njit(nogil=True, cache=True)
def _aes_small(weights, has_w, times, has_t, t_row, excl, q, b, s, e, state0, c, kk, pp, pos, o):
    """A-ES for a row of at most _AES_SMALL eligible edges: every key, then each one's rank among them
    by (key, position), counted branch-free (no heap and its data-dependent branches); ranks below c
    are taken, in position order (no sort)."""
    n = 0
    ps = s
    for x in range(q, b + 1):  # segments between excluded positions
        pe = excl[x] if x < b else e
        n = _keys_segment(weights, has_w, times, has_t, t_row, ps, pe, s, state0, kk, pp, n)
        ps = pe + 1
    w = o
    for i in range(n):
        ki = kk[i]
        rank = 0
        for j in range(n):
            kj = kk[j]
            rank += (kj < ki) | ((kj == ki) & (j < i))
        if rank < c:
            pos[w] = pp[i]
            w += 1


@nb.njit(nogil=True, cache=True)
def _aes_row(weights, has_w, times, has_t, t_row, excl, q, b, s, e, state0, c, hkey, hpos, bitmap, pos, o):
    """The c eligible positions of [s, e) with the smallest exponential keys, sorted, into pos[o:o + c].

    Keys are those of the reference (float64 ``-log(u) / w``); a max-heap keeps the c smallest (key,
    position) pairs. The row is offered segment by segment between its excluded positions ``excl[q:b]``
    (no exclusion test inside the position loop). The chosen positions are emitted in order through a
    bitmap of the row (rows up to 4096 edges) or by insertion sort."""
    n = 0
    top = np.inf
    ps = s
    for x in range(q, b + 1):
        pe = excl[x] if x < b else e
        n, top = _aes_segment(weights, has_w, times, has_t, t_row, ps, pe, s, state0, c, hkey, hpos, n, top)
        ps = pe + 1
    emit_in_order(hpos, c, s, e - s, bitmap, pos, o)


@nb.njit(nogil=True, cache=True)
def _prefix_row(weights, has_w, times, has_t, t_row, excl, q, b, s, e, state0, c, prefix, pos, o):
    """c draws with replacement by inverting float64 prefix sums of the eligible weights of [s, e)."""
    d = e - s
    total = 0.0
    last = s
    for p in range(s, e):
        ok = eligible(weights, has_w, times, has_t, t_row, p)
        if q < b and excl[q] == p:
            ok = False
            q += 1
        if ok:
            total += np.float64(weights[p]) if has_w else 1.0
            last = p
        prefix[p - s] = total
    state = state0
    for j in range(c):
        state += GOLDEN
        x = unit(mix(state)) * total
        a = 0
        z = d
        while a < z:
            mid = (a + z) >> 1
            if prefix[mid] > x:
                z = mid
            else:
                a = mid + 1
        pos[o + j] = s + a if a < d else last


_MASKED_AHEAD = 8  # rows ahead whose first weights/times the choosing pass of masked rows prefetches


@nb.njit(inline="always", cache=True)
def _prefetch_row(weights, has_w, times, has_t, s):
    if has_w and s < weights.shape[0]:
        prefetch(weights, s)
    if has_t and s < times.shape[0]:
        prefetch(times, s)


@nb.njit(nogil=True, cache=True)
def choose_rows_temporal(dst, row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, draws, key, excl,
                         weights, has_w, times, row_time, has_t, pos, lo, hi):
    """Pass 2 of rows with edge times [lo, hi) (the reference's "temporal rows"; also weighted rows that
    take every eligible edge): A-ES keys without replacement, prefix-sum inversion with replacement;
    ``draws``: with replacement and fanout >= 0."""
    hkey = np.empty(16, dtype=np.float64)
    hpos = np.empty(16, dtype=np.int64)
    bitmap = np.zeros(BITMAP_MAX // 64, dtype=np.uint64)  # all 0 between rows
    small_key = np.empty(_AES_SMALL, dtype=np.float64)
    small_pos = np.empty(_AES_SMALL, dtype=np.int64)
    prefix = np.empty(64, dtype=np.float64)
    for i in range(lo, min(lo + _MASKED_AHEAD, hi)):
        _prefetch_row(weights, has_w, times, has_t, row_start[i])
    for i in range(lo, hi):
        if i + _MASKED_AHEAD < hi:  # rows are scattered: start fetching a later row's weights and times
            _prefetch_row(weights, has_w, times, has_t, row_start[i + _MASKED_AHEAD])
        o = out_indptr[i]
        c = out_indptr[i + 1] - o
        if c == 0:
            continue
        s = row_start[i]
        e = row_end[i]
        b = row_exhi[i]
        q = row_exlo[i]
        t_row = row_time[i] if has_t else 0
        if not draws and c == row_deg[i]:  # every eligible position, in order
            take_eligible(weights, has_w, times, has_t, t_row, excl, q, b, s, e, pos, o)
            continue
        state0 = row_state(key, dst[i])
        if not draws:
            if row_deg[i] <= _AES_SMALL:
                _aes_small(weights, has_w, times, has_t, t_row, excl, q, b, s, e, state0, c, small_key,
                           small_pos, pos, o)
                continue
            if hkey.shape[0] < c:
                hkey = np.empty(2 * c, dtype=np.float64)
                hpos = np.empty(2 * c, dtype=np.int64)
            _aes_row(weights, has_w, times, has_t, t_row, excl, q, b, s, e, state0, c, hkey, hpos, bitmap,
                     pos, o)
        else:
            if prefix.shape[0] < e - s:
                prefix = np.empty(2 * (e - s), dtype=np.float64)
            _prefix_row(weights, has_w, times, has_t, t_row, excl, q, b, s, e, state0, c, prefix, pos, o)

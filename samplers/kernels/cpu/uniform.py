"""Passes 2 and 3 of uniform rows: choose CSC positions by arithmetic alone, then gather their edges.

Choosing touches no graph memory: take-all when degree <= fanout; Floyd's algorithm with a 64-bit mask
when degree <= 64, with a bitmap of the chosen slots up to degree 4096, with a scan of the chosen slots
(or a small hash set for large fanouts) above; when the fanout exceeds half the degree, Floyd draws the
positions left out instead. Rows with excluded edges choose virtual positions over the non-excluded
ones and map them back (docs/architecture.md#sampling-rules).

References
----------
Bentley and Floyd, "Programming pearls: a sample of brilliance" (CACM 1987), Floyd's algorithm.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels import prefetch
from samplers.kernels.cpu.bits import BITMAP_MAX, SCAN_MAX, lowest_bit_index
from samplers.kernels.cpu.rng import GOLDEN, bounded, mix, row_state

__all__ = ["NO_PAIRS", "gather_edges", "sample_rows"]

NO_PAIRS = np.empty(0, dtype=np.int32)  # `gather_edges`' ``pairs`` when ``has_pairs`` is False
_GATHER_AHEAD = 48  # prefetch distance of the gathering loop


@nb.njit(inline="always", cache=True)
def _floyd_mask(state, deg, m):
    """Floyd's m-subset of 0..deg-1 (deg <= 64) as a bit mask; branch-free."""
    mask = np.uint64(0)
    for j in range(deg - m, deg):
        state += GOLDEN
        t = np.uint64(bounded(mix(state), np.uint64(j + 1)))
        hit = (mask >> t) & np.uint64(1)
        mask |= np.uint64(1) << (t + (np.uint64(j) - t) * hit)  # t if not yet taken, else j
    return mask


@nb.njit(nogil=True, cache=True)
def _floyd_sorted(state, deg, m, out, o):
    """Floyd's m-subset of 0..deg-1 written sorted into out[o:o + m]: a scan of the chosen slots with
    insertion for small m, a hash set for large m."""
    if m <= SCAN_MAX:
        for n in range(m):
            j = deg - m + n
            state += GOLDEN
            t = bounded(mix(state), np.uint64(j + 1))
            taken = False
            for q in range(o, o + n):
                taken |= out[q] == t
            x = j if taken else t
            q = o + n
            while q > o and out[q - 1] > x:  # insertion into the sorted prefix out[o:o + n]
                out[q] = out[q - 1]
                q -= 1
            out[q] = x
        return
    cap = 16
    while cap < 2 * m:
        cap *= 2
    table = np.full(cap, -1, dtype=np.int64)
    slot_mask = cap - 1
    for n in range(m):
        j = deg - m + n
        state += GOLDEN
        t = bounded(mix(state), np.uint64(j + 1))
        h = (t * 0x9E3779B1) & slot_mask
        found = False
        while table[h] >= 0:
            if table[h] == t:
                found = True
                break
            h = (h + 1) & slot_mask
        x = j if found else t
        if found:  # j itself is new (every earlier choice is < j): find its free slot
            h = (x * 0x9E3779B1) & slot_mask
            while table[h] >= 0:
                h = (h + 1) & slot_mask
        table[h] = x
        out[o + n] = x
    out[o:o + m].sort()


@nb.njit(nogil=True, cache=True)
def _choose_rows(dst, row_start, row_deg, row_exlo, row_exhi, out_indptr, fanout, replace, key, excl, pos,
                 lo, hi):
    """Pass 2 over rows [lo, hi): choose CSC positions by arithmetic alone (reads no graph memory)."""
    has_excl = excl.shape[0] > 0
    draws = replace and fanout >= 0
    bitmap = np.zeros(BITMAP_MAX // 64, dtype=np.uint64)  # chosen slots of a row; all 0 between rows
    one = np.uint64(1)
    for i in range(lo, hi):
        o = out_indptr[i]
        c = out_indptr[i + 1] - o
        if c == 0:
            continue
        deg = row_deg[i]
        s = row_start[i]
        excl_row = has_excl and row_exhi[i] > row_exlo[i]
        shift = 0 if excl_row else s  # rows with excluded edges choose virtual positions, mapped below
        if c == deg and not draws:
            for j in range(c):
                pos[o + j] = shift + j
        else:
            state = row_state(key, dst[i])
            if draws:
                n = np.uint64(deg)
                for j in range(c):
                    state += GOLDEN
                    pos[o + j] = shift + bounded(mix(state), n)
            else:
                m = c if 2 * c <= deg else deg - c  # Floyd draws what is taken, or what is left out
                if deg <= 64:
                    mask = _floyd_mask(state, deg, m)
                    if m != c:
                        full = ~np.uint64(0) if deg == 64 else (one << np.uint64(deg)) - one
                        mask = ~mask & full
                    w = o
                    while mask:
                        pos[w] = shift + lowest_bit_index(mask)
                        w += 1
                        mask &= mask - one
                elif deg <= BITMAP_MAX:
                    # Floyd with a bitmap of chosen slots; emitting the set bits word by word sorts them.
                    for j in range(deg - m, deg):
                        state += GOLDEN
                        t = bounded(mix(state), np.uint64(j + 1))
                        hit = (bitmap[t >> 6] >> np.uint64(t & 63)) & one
                        t += (j - t) * np.int64(hit)  # t if not yet taken, else j
                        bitmap[t >> 6] |= one << np.uint64(t & 63)
                    words = (deg + 63) >> 6
                    w = o
                    for q in range(words):
                        x = bitmap[q]
                        bitmap[q] = 0
                        if m != c:
                            x = ~x
                            if q == words - 1 and deg & 63:
                                x &= (one << np.uint64(deg & 63)) - one
                        while x:
                            pos[w] = shift + (q << 6) + lowest_bit_index(x)
                            w += 1
                            x &= x - one
                elif m == c:
                    _floyd_sorted(state, deg, m, pos, o)
                    for j in range(o, o + c):
                        pos[j] += shift
                else:
                    left_out = np.empty(m + 1, dtype=np.int64)
                    _floyd_sorted(state, deg, m, left_out, 0)
                    left_out[m] = deg  # sentinel
                    q = 0
                    w = o
                    for p in range(deg):
                        if left_out[q] == p:
                            q += 1
                        else:
                            pos[w] = shift + p
                            w += 1
        if excl_row:
            # Virtual position p over the row's non-excluded positions -> real position:
            # p + #{j : x_j - j <= p}, x_j the row's excluded relative positions (non-decreasing in j).
            x_lo = row_exlo[i]
            x_hi = row_exhi[i]
            q = x_lo
            for j in range(o, o + c):
                p = pos[j]
                if draws:
                    q = x_lo
                while q < x_hi and excl[q] - s - (q - x_lo) <= p:
                    q += 1
                pos[j] = s + p + (q - x_lo)


@nb.njit(nogil=True, cache=True)
def gather_edges(indices, edge_ids, has_eids, pairs, has_pairs, pos_eid, src, lo, hi):
    """Pass 3 over edges [lo, hi): sources and edge ids (in place of the positions) of chosen edges,
    prefetching the edges 48 ahead. With ``has_pairs`` both come from ``pairs`` (int32 [2E],
    `samplers._csc.edge_pairs`: one cache line per edge), else from ``indices`` and ``edge_ids``
    (identity without ``has_eids``). Every CPU mode gathers here."""
    if has_pairs:
        for j in range(lo, hi):
            if j + _GATHER_AHEAD < hi:
                prefetch(pairs, 2 * pos_eid[j + _GATHER_AHEAD])
            p = 2 * pos_eid[j]
            src[j] = pairs[p]
            pos_eid[j] = pairs[p + 1]
    elif has_eids:
        for j in range(lo, hi):
            if j + _GATHER_AHEAD < hi:
                q = pos_eid[j + _GATHER_AHEAD]
                prefetch(indices, q)
                prefetch(edge_ids, q)
            p = pos_eid[j]
            src[j] = indices[p]
            pos_eid[j] = edge_ids[p]
    else:
        for j in range(lo, hi):
            if j + _GATHER_AHEAD < hi:
                prefetch(indices, pos_eid[j + _GATHER_AHEAD])
            src[j] = indices[pos_eid[j]]


@nb.njit(nogil=True, cache=True)
def sample_rows(indices, edge_ids, has_eids, pairs, has_pairs, dst, row_start, row_deg, row_exlo, row_exhi,
                out_indptr, fanout, replace, key, excl, eids, src, lo, hi):
    """Passes 2 and 3 for the rows [lo, hi) (one chunk of work)."""
    _choose_rows(dst, row_start, row_deg, row_exlo, row_exhi, out_indptr, fanout, replace, key, excl, eids,
                 lo, hi)
    gather_edges(indices, edge_ids, has_eids, pairs, has_pairs, eids, src, out_indptr[lo], out_indptr[hi])

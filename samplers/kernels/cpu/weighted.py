"""Weighted rows without edge times (the reference's "weighted rows"): successive sampling over per-row
float64 prefix sums ``P`` computed once per sampler (`cpu.prefix.weight_prefix`).

Rows of at most SHORT_ROW_MAX (64) positions without replacement whose k exceeds a third of their
eligible count draw each output from running sums of the weights not chosen yet
(`samplers.kernels.weighted_short`, shared with the GPU; on the CPU the sums start as a copy of the
row's slice of ``P`` and sit beside its weights widened to float64, in SHORT_SCRATCH entries): one draw
and one whole-vector pass (subtract, count: `samplers.kernels.cpu.short_sums`) per output, however much
of the row k takes, two such rows at a time (`short_pair`: each row's outputs wait on one another, the
two rows' do not). Other rows draw by rejection: an output is the first position whose prefix sum
exceeds a uniform fraction of the row's total, accepted unless excluded or chosen already, with an
exact fallback draw after REJECT_LIMIT rejections (docs/architecture.md#sampling-rules); a row costs
about k draws and searches, not the O(d) logarithms of exponential keys. The search counts the prefix
sums <= x (whole-vector counts, `samplers.kernels.cpu.short_sums.count_le`): over the row up to 64
edges, over one half of it picked by ``P[s + 63]`` up to 128, else inside a window around the
equal-weights guess (32 entries up to _NARROW_MAX edges, 64 above; `_search`); rows without excluded
edges up to 4096 edges accept or reject without a branch (chosen positions in a register or a
bitmap). The choosing pass prefetches what the row 8 ahead reads first (`_prefetch_weighted_row`).

References
----------
Efraimidis and Spirakis, "Weighted random sampling with a reservoir" (IPL 2006): the distribution.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels import prefetch
from samplers.kernels import weighted_short
from samplers.kernels.cpu import rng, short_sums
from samplers.kernels.cpu.bits import BITMAP_MAX, SCAN_MAX, emit_bitmap, lowest_bit_index, trailing_zeros
from samplers.kernels.cpu.eligible import take_eligible
from samplers.kernels.cpu.rng import draw, row_state, unit
from samplers.kernels.cpu.short_sums import count_le, count_le64, subtract_count
from samplers.kernels.reference import REJECT_LIMIT, SHORT_ROW_MAX

__all__ = ["REJECT_LIMIT", "SHORT_ROW_MAX", "SHORT_SCRATCH", "choose_rows_weighted", "short_pair",
           "short_row"]

SHORT_SCRATCH = 2 * SHORT_ROW_MAX  # float64 scratch of a short row: its running sums, then its weights

_NO_EXCL = np.empty(0, dtype=np.int64)
_NO_BITS = np.empty(0, dtype=np.uint64)
# Inlined into one another (`short_pair` interleaves two rows' steps only when `step` is inlined), inside
# the two entry points below, which run without NRT as `samplers.kernels.cpu.labor`'s row helpers: inlined
# into a function with NRT, the helpers' arrays would be reference-counted at every step.
_short = weighted_short.compile_for(nb.njit(nogil=True, _nrt=False, inline="always"), rng, trailing_zeros,
                                    subtract_count, {"start_row": short_sums.start_row,
                                                     "chosen_weight": short_sums.chosen_weight},
                                    {"fill_row": short_sums.fill_row, "SHORT_ROW_MAX": SHORT_ROW_MAX})
_short_row, _short_pair, _is_short = _short.short_row, _short.short_pair, _short.is_short


@nb.njit(nogil=True, cache=True, _nrt=False)
def short_row(weights, prefix, excl, q, b, s, e, state0, c, acc, pos, o):
    """`samplers.kernels.weighted_short.short_row` on the CPU (``acc``: SHORT_SCRATCH float64 entries)."""
    _short_row(weights, prefix, excl, q, b, s, e, state0, c, acc, pos, o)


@nb.njit(nogil=True, cache=True, _nrt=False)
def short_pair(weights, prefix, excl, q, b, s, e, state0, c, acc, pos, o, q2, b2, s2, e2, state2, c2, acc2,
               o2):
    """`samplers.kernels.weighted_short.short_pair` on the CPU (``acc``, ``acc2``: SHORT_SCRATCH entries)."""
    _short_pair(weights, prefix, excl, q, b, s, e, state0, c, acc, pos, o, q2, b2, s2, e2, state2, c2, acc2,
                o2)


_COUNT_MAX = 128  # rows up to this degree find a draw's position by counting (vectorised), not searching
_COUNT_WINDOW = 64  # longer rows count inside a window of this many prefix sums once it is found
_NARROW_MAX = 512  # ... of half as many in rows up to this degree (their guess strays less)
_MEMBER_MASK, _MEMBER_BITMAP, _MEMBER_SORTED = 0, 1, 2  # how a row without replacement tests "chosen"


@nb.njit(inline="always", cache=True)
def _count_le(prefix, lo, hi, x):
    """lo + the number of prefix[lo:hi] <= x: for non-decreasing prefix sums, the smallest p in [lo, hi)
    with prefix[p] > x (hi if none). A branch-free loop that LLVM vectorises; its index is unsigned (with
    a signed one numba's negative-index wrap-around makes LLVM emit gathers)."""
    c = 0
    for q in range(np.uint64(lo), np.uint64(hi)):
        c += prefix[q] <= x
    return lo + c


@nb.njit(inline="always", cache=True)
def _search(prefix, s, e, x, unit):
    """The smallest p in [s, e) with prefix[p] > x (e if none), for x = unit * prefix[e - 1].

    Rows up to _COUNT_MAX edges count the prefix sums <= x (a binary search pays a dependent load and a
    mispredicted branch per level): all of them up to 64 edges, else the first or the last 64, picked
    without a branch by whether prefix[s + 63] <= x. Longer rows count inside the window of
    _COUNT_WINDOW entries (half as many up to _NARROW_MAX edges: fewer cache lines per draw) centred
    where x would fall if the weights were equal (s + unit * d), when the answer is inside it (for
    weights of similar size it nearly always is); else they bisect the row down to such a window and
    count in it. Any search gives the same position (the sums are non-decreasing), so this choice is
    free of the specification."""
    d = e - s
    if d <= _COUNT_MAX:
        if s + _COUNT_MAX > prefix.shape[0]:  # the whole-vector counts below would read past the end
            return _count_le(prefix, s, e, x)
        if d <= 64:
            return s + count_le(prefix, s, d, x)
        # the first 64 are all <= x exactly when the 64th is: then count in the last 64 (all of those
        # before them are <= x too), else in the first 64, chosen without a branch
        lo = e - 64 if prefix[np.uint64(s + 63)] <= x else s
        return lo + count_le64(prefix, lo, x)
    win = _COUNT_WINDOW >> (d <= _NARROW_MAX)
    lo = min(max(s + np.int64(unit * d) - (win >> 1), s), e - win)
    hi = lo + win
    if (lo == s or prefix[np.uint64(lo - 1)] <= x) and (hi == e or prefix[np.uint64(hi - 1)] > x):
        return lo + count_le(prefix, lo, win, x)
    lo = s
    n = d
    while n > win:
        half = n >> 1
        if prefix[np.uint64(lo + half - 1)] <= x:
            lo += half
        n -= half
    if lo + win > prefix.shape[0]:
        return _count_le(prefix, lo, lo + n, x)
    return lo + count_le(prefix, lo, n, x)


@nb.njit(inline="always", cache=True)
def _in_sorted(arr, a, b, p):
    """Whether p is in the sorted arr[a:b]."""
    lo = a
    hi = b
    while lo < hi:
        mid = (lo + hi) >> 1
        if arr[mid] < p:
            lo = mid + 1
        else:
            hi = mid
    return lo < b and arr[lo] == p


@nb.njit(inline="always", cache=True)
def _is_chosen(kind, mask, bits, pos, o, n, s, p):
    """Whether CSC position p of the row starting at s is chosen already (see `_reject_general`)."""
    rel = p - s
    if kind == _MEMBER_MASK:
        return (mask >> np.uint64(rel)) & np.uint64(1) != 0
    if kind == _MEMBER_BITMAP:
        return (bits[rel >> 6] >> np.uint64(rel & 63)) & np.uint64(1) != 0
    for j in range(o, o + n):
        if pos[j] == p:
            return True
    return False


@nb.njit(nogil=True, cache=True, _nrt=False)
def _fallback_draw(weights, excl, q, b, s, e, r, replace, kind, mask, bits, pos, o, n, chosen):
    """The exact draw of one output from the remaining eligible positions of [s, e) (not excluded, weight
    > 0, and not chosen unless ``replace``): their float64 weight sum R in position order, then the first
    of them whose running sum exceeds ``unit(r) * R`` (the last of them if none). O(d): two passes over
    the row (with _MEMBER_SORTED, ``chosen`` holds the chosen positions sorted: the caller sorts them)."""
    sorted_kind = kind == _MEMBER_SORTED and not replace
    remaining = 0.0
    acc = 0.0
    last = s
    x = 0.0
    for sweep in range(2):  # 0: the sum R; 1: the walk
        xq = q
        cq = 0
        for p in range(s, e):
            if xq < b and excl[xq] == p:
                xq += 1
                continue
            if sorted_kind:
                if cq < n and chosen[cq] == p:
                    cq += 1
                    continue
            elif not replace and _is_chosen(kind, mask, bits, pos, o, n, s, p):
                continue
            wp = np.float64(weights[p])
            if wp > 0:
                if sweep == 0:
                    remaining += wp
                else:
                    acc += wp
                    last = p
                    if acc > x:
                        return p
        x = unit(r) * remaining
    return last


@nb.njit(nogil=True, cache=True, _nrt=False)
def _last_positive(weights, s, e):
    p = e - 1
    while p > s and not weights[p] > 0:
        p -= 1
    return p


@nb.njit(nogil=True, cache=True, _nrt=False)
def _draw_row(weights, prefix, s, e, state0, c, pos, o):
    """With replacement, no excluded position in the row: every attempt is accepted, so output j is the
    position of draw j + 1 (the inversion of the row's prefix sums)."""
    total = prefix[e - 1]
    t = np.uint64(0)
    for j in range(c):
        t += np.uint64(1)
        frac = unit(draw(state0, t))
        p = _search(prefix, s, e, frac * total, frac)
        pos[o + j] = p if p < e else _last_positive(weights, s, e)


@nb.njit(nogil=True, cache=True, _nrt=False)
def _reject_fast(weights, prefix, s, e, state0, c, bits, pos, o):
    """Without replacement, a row of at most BITMAP_MAX edges and no excluded position: "chosen already"
    is a bit of a register (rows up to 64 edges) or of ``bits`` (all 0 on entry and on return), emitted
    in order at the end; a draw accepts or rejects without a branch (the next attempt's draw and search
    do not wait for its outcome), and the REJECT_LIMIT-th rejection in a row makes the next draw the
    output's exact fallback draw (which never returns a chosen position)."""
    d = e - s
    in_register = d <= 64
    total = prefix[e - 1]
    one = np.uint64(1)
    mask = np.uint64(0)
    t = np.uint64(0)
    n = 0
    rejects = 0
    while n < c:
        t += one
        r = draw(state0, t)
        if rejects == REJECT_LIMIT:  # rare
            kind = _MEMBER_MASK if in_register else _MEMBER_BITMAP
            p = _fallback_draw(weights, _NO_EXCL, 0, 0, s, e, r, False, kind, mask, bits, pos, o, n, _NO_EXCL)
        else:
            frac = unit(r)
            p = _search(prefix, s, e, frac * total, frac)
            if p == e:
                p = _last_positive(weights, s, e)
        rel = p - s
        bit = one << np.uint64(rel & 63)
        word = mask if in_register else bits[rel >> 6]
        hit = np.int64((word & bit) != 0)
        if in_register:
            mask = word | bit
        else:
            bits[rel >> 6] = word | bit
        n += 1 - hit
        rejects = (rejects + 1) * hit
    if not in_register:
        emit_bitmap(bits, d, s, pos, o)
        return
    w = o
    while mask:
        pos[w] = s + lowest_bit_index(mask)
        w += 1
        mask &= mask - one


@nb.njit(nogil=True, cache=True)
def _reject_general(weights, prefix, excl, q, b, s, e, state0, c, replace, bitmap, pos, o):
    """`_reject_row` for rows with excluded positions (``excl[q:b]``, found by binary search), or without
    replacement above 4096 edges: "chosen already" is a bit of a register mask (up to 64 edges), of
    ``bitmap`` (up to 4096) or of a fresh bitmap (above, when c > 64); above 4096 edges with c <= 64 the
    chosen positions are scanned in pos and sorted at the end."""
    total = prefix[e - 1]
    has_x = b > q
    d = e - s
    one = np.uint64(1)
    kind = _MEMBER_MASK
    bits = bitmap
    if d > 64:
        kind = _MEMBER_BITMAP
        if d > BITMAP_MAX:
            if c <= SCAN_MAX:
                kind = _MEMBER_SORTED
            else:
                bits = np.zeros((d + 63) >> 6, dtype=np.uint64)
    mask = np.uint64(0)
    t = np.uint64(0)
    n = 0
    rejects = 0
    while n < c:
        t += one
        r = draw(state0, t)
        if rejects == REJECT_LIMIT:  # this draw is the output's exact fallback draw
            chosen = np.sort(pos[o:o + n]) if kind == _MEMBER_SORTED and not replace else _NO_EXCL
            p = _fallback_draw(weights, excl, q, b, s, e, r, replace, kind, mask, bits, pos, o, n, chosen)
        else:
            frac = unit(r)
            p = _search(prefix, s, e, frac * total, frac)
            if p == e:
                p = _last_positive(weights, s, e)
            if (has_x and _in_sorted(excl, q, b, p)) or (
                    not replace and _is_chosen(kind, mask, bits, pos, o, n, s, p)):
                rejects += 1
                continue
        rejects = 0
        if replace or kind == _MEMBER_SORTED:
            pos[o + n] = p
        elif kind == _MEMBER_MASK:
            mask |= one << np.uint64(p - s)
        else:
            rel = p - s
            bits[rel >> 6] |= one << np.uint64(rel & 63)
        n += 1
    if replace:
        return
    if kind == _MEMBER_SORTED:
        pos[o:o + c].sort()
        return
    w = o
    if kind == _MEMBER_MASK:
        while mask:
            pos[w] = s + lowest_bit_index(mask)
            w += 1
            mask &= mask - one
        return
    emit_bitmap(bits, d, s, pos, w)


@nb.njit(nogil=True, cache=True, _nrt=False)
def _reject_row(weights, prefix, s, e, state0, c, replace, bitmap, pos, o):
    """c outputs of a weighted row [s, e) without excluded positions, up to BITMAP_MAX edges unless
    ``replace``, by rejection over its prefix sums, into pos[o:o + c] (the reference's "weighted rows";
    c > 0, and c < the row's eligible count unless ``replace``). Other rows: `_reject_general`.

    With replacement, outputs go to pos in draw order (`_draw_row`); without, `_reject_fast` with the
    workspace's ``bitmap``."""
    if replace:
        _draw_row(weights, prefix, s, e, state0, c, pos, o)
    else:
        _reject_fast(weights, prefix, s, e, state0, c, bitmap, pos, o)


@nb.njit(nogil=True, cache=True, _nrt=False)
def _take_positive(weights, s, c, pos, o):
    """Write the c positions >= s of positive weight, in order, to pos[o:o + c] (a row without excluded
    positions that takes every eligible one; c > 0): branch-free but for the stop after the c-th."""
    w = o
    end = o + c
    p = s
    while True:
        pos[w] = p
        w += weights[p] > 0
        if w == end:
            return
        p += 1


_WEIGHTED_AHEAD = 8  # rows ahead whose prefix sums the choosing pass of weighted rows prefetches
_WEIGHTED_LINES = 16  # rows of up to this many cache lines of prefix sums are prefetched whole


@nb.njit(nogil=True, cache=True, _nrt=False)
def _prefetch_weighted_row(weights, prefix, row_start, row_end, row_deg, out_indptr, draws, i):
    """Start fetching what choosing weighted row i reads: its weights when it takes every eligible edge
    (and has weight-0 positions); its weights too when it is short (`short_row`); its prefix sums up to
    the last entry its 8-lane reads reach when they span at most _WEIGHTED_LINES cache lines, else its
    last prefix sum (the total that every draw scales). A longer row's draw positions are left to the
    out-of-order core (its draws do not wait on one another): fetching them here as well made the whole
    pass slower."""
    c = out_indptr[i + 1] - out_indptr[i]
    if c == 0:
        return
    s = row_start[i]
    e = row_end[i]
    if not draws and c == row_deg[i]:
        if c < e - s:  # a row with weight-0 or excluded positions reads its weights
            prefetch(weights, s)
            prefetch(weights, e - 1)
        return
    d = e - s
    if _is_short(draws, s, e, c, row_deg[i]):  # `short_row` reads the weights too
        for p in range(s, e, 16):
            prefetch(weights, p)
        prefetch(weights, e - 1)
    if d <= 8 * _WEIGHTED_LINES:
        for p in range(s, e, 8):
            prefetch(prefix, p)
    prefetch(prefix, s + ((d + 7) & ~7) - 1 if d <= 64 else e - 1)  # the 8-lane reads' last entry


@nb.njit(nogil=True, cache=True)
def choose_rows_weighted(dst, row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, draws, key, excl,
                         weights, times, prefix, pos, lo, hi):
    """Pass 2 of weighted rows without times [lo, hi): rejection over the prefix sums ``prefix`` (the
    reference's "weighted rows"); ``draws``: with replacement and fanout >= 0."""
    bitmap = np.zeros(BITMAP_MAX // 64, dtype=np.uint64)  # all 0 between rows
    acc = np.zeros(SHORT_SCRATCH, dtype=np.float64)  # a short row's running sums and weights
    acc2 = np.zeros(SHORT_SCRATCH, dtype=np.float64)  # those of a second short row (`short_pair`)
    held = -1  # a short row waiting for a second one, to run the two with `short_pair`
    for i in range(lo, min(lo + _WEIGHTED_AHEAD, hi)):
        _prefetch_weighted_row(weights, prefix, row_start, row_end, row_deg, out_indptr, draws, i)
    for i in range(lo, hi):
        if i + _WEIGHTED_AHEAD < hi:
            _prefetch_weighted_row(weights, prefix, row_start, row_end, row_deg, out_indptr, draws,
                                   i + _WEIGHTED_AHEAD)
        o = out_indptr[i]
        c = out_indptr[i + 1] - o
        if c == 0:
            continue
        if not draws and c == row_deg[i]:  # every eligible position, in order
            s = row_start[i]
            if c == row_end[i] - s:  # every position is eligible: no weight to read
                for j in range(c):
                    pos[o + j] = s + j
            elif row_exlo[i] == row_exhi[i]:
                _take_positive(weights, s, c, pos, o)
            else:
                take_eligible(weights, True, times, False, 0, excl, row_exlo[i], row_exhi[i], s,
                              row_end[i], pos, o)
            continue
        state0 = row_state(key, dst[i])
        if _is_short(draws, row_start[i], row_end[i], c, row_deg[i]):
            if held < 0:
                held = i
                continue
            h = held
            held = -1
            short_pair(weights, prefix, excl, row_exlo[h], row_exhi[h], row_start[h], row_end[h],
                       row_state(key, dst[h]), out_indptr[h + 1] - out_indptr[h], acc, pos, out_indptr[h],
                       row_exlo[i], row_exhi[i], row_start[i], row_end[i], state0, c, acc2, o)
        elif row_exlo[i] == row_exhi[i] and (draws or row_end[i] - row_start[i] <= BITMAP_MAX):
            _reject_row(weights, prefix, row_start[i], row_end[i], state0, c, draws, bitmap, pos, o)
        else:
            _reject_general(weights, prefix, excl, row_exlo[i], row_exhi[i], row_start[i], row_end[i], state0,
                            c, draws, bitmap, pos, o)
    if held >= 0:
        h = held
        short_row(weights, prefix, excl, row_exlo[h], row_exhi[h], row_start[h], row_end[h],
                  row_state(key, dst[h]), out_indptr[h + 1] - out_indptr[h], acc, pos, out_indptr[h])

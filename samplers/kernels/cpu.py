"""Numba CPU kernels for neighbour sampling: arrays in, arrays out, plus the threads that run them.

They follow the specification in `samplers.kernels.reference` exactly (same RNG stream, same choice of
positions, same output order), so the tests can demand equality with the reference.

Layout of one layer, in flat passes (DESIGN §3; each pass is a tight loop whose iterations are
independent, so the core keeps many cache misses in flight):

1. ``_plan_rows``: read each destination's start and degree (minus excluded edges) and size its
   output (prefetching the row pointer 16 rows ahead: 25-50 % faster); a prefix sum gives the
   output offsets.
2. ``_choose_rows``: choose positions by arithmetic alone, touching no graph memory: take-all when
   degree <= fanout, Floyd's algorithm with a 64-bit mask when degree <= 64, with a bitmap of the
   chosen slots up to degree 4096 (emitting set bits word by word sorts them), with a scan of the
   chosen slots (or a small hash set for large fanouts) above; when the fanout exceeds half the
   degree, Floyd draws the positions left out instead. Positions go into the edge-id output array.
3. ``_gather_edges``: read the chosen edges' sources and edge ids.
4. ``_relabel_dst`` / ``_relabel_src``: global -> local ids through a dense int32 map of size N and a
   branch-free first-occurrence loop. The map is never cleared after a layer: entries below the
   workspace's ``base`` are stale, and ``base`` advances past the ids of each layer (the map is
   cleared once when ``base`` would overflow int32, every ~2^31 local ids). So no reset pass. The
   map entry 16 ids ahead is prefetched: the loop's store to the map otherwise keeps the core from
   overlapping enough of its random reads (30 % faster measured).

Masked rows (edge weights and/or edge times, the "masked" rules of the reference) have their own
planning pass (it counts each row's eligible edges, or, for a sampler's weights without times, takes
each node's positive-weight count ``nz`` computed once) and choosing pass.

Weighted rows without times (the reference's "weighted rows") draw by rejection over per-row float64
prefix sums ``P`` computed once per sampler (`weight_prefix`, parallel over chunks of rows): an output
is the first position whose prefix sum exceeds a uniform fraction of the row's total, accepted unless
excluded or chosen already, with an exact fallback draw after REJECT_LIMIT rejections. A row costs about
k draws and searches instead of the O(d) logarithms of exponential keys (Gowalla [15, 10, 5]: the
choosing pass of the outer layer 2.3x faster; rows of more than 64 edges 5x). What made it fast here:
the search counts the prefix sums <= x in a vectorised loop for rows up to 128 edges (a binary search
took 35-50 ns, a count of 50 entries 9-12 ns; an unsigned loop index, else numba's negative-index
wrap-around made LLVM emit gathers, 2.5-4x slower), and inside a 64-entry window around the
equal-weights guess above; the common rows (no excluded edge, up to 4096 edges) accept or reject
without a branch (chosen positions in a register mask or a bitmap: a mispredicted branch per rejection
cost as much as the search). The choosing pass prefetches the prefix sums of the row 4 ahead.

Temporal rows (times, with or without weights): the choosing pass prefetches the weights of the row 8
ahead; rows of at most 64 eligible edges compute every exponential key and take the k smallest by a
branch-free rank count; longer rows keep the k smallest in a heap and skip the logarithm of any position
whose key provably cannot enter it; draws with replacement invert float64 prefix sums. The uniform path
above is untouched by them.

Threads. Passes 2 and 3 run per chunk of rows (about `CHUNK_EDGES` sampled edges each); relabelling
is sequential (a parallel first-occurrence pass makes two threads write the same cache lines, which
costs more than it saves on two cores, DESIGN §3) and is pipelined with them: the calling thread
relabels chunk r as soon as chunk r is sampled and samples chunks itself when it would otherwise
wait. Helper threads (`graphrl.kernels.parallel_for`'s team) claim chunks dynamically and the caller
never waits for a chunk that no helper has claimed. We do not use ``numba.prange``: on this shared
2-core machine, when other processes keep the cores busy, every OpenMP fork-join waits for a
descheduled worker and a batch took 5x *longer* with 2 threads than with 1 (measured: 110 ms vs
22 ms); with dynamic claiming a busy machine costs at most the speed-up, never more.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numba as nb
import numpy as np

from graphrl.kernels import Chunks as _Task
from graphrl.kernels import engaged as _engaged
from graphrl.kernels import parallel_for
from graphrl.kernels import prefetch as _prefetch
from samplers.kernels.reference import GOLDEN as _GOLDEN_INT
from samplers.kernels.reference import REJECT_LIMIT as _REJECT_LIMIT_INT
from samplers.kernels.reference import layer_key

__all__ = ["layer_key", "sample_layer", "relabel", "relabel_pairs", "sample_block", "Workspace", "Exclusion",
           "Masks", "weight_prefix", "time_keys", "from_time_keys", "CHUNK_EDGES"]

_GOLDEN = np.uint64(_GOLDEN_INT)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_LO32 = np.uint64(0xFFFFFFFF)
_NO_EXCL = np.empty(0, dtype=np.int64)
_NO_WEIGHTS = np.empty(0, dtype=np.float32)
_NO_TIMES = np.empty(0, dtype=np.int64)
_NO_PREFIX = np.empty(0, dtype=np.float64)
_NO_BITS = np.empty(0, dtype=np.uint64)
_TWO_M53 = 2.0 ** -53
_BITMAP_MAX = 4096  # Floyd on rows of degree 65..4096 keeps the chosen slots in a bitmap
_SCAN_MAX = 64  # above 4096, Floyd scans the chosen slots up to this fanout, hashes above
_INT32_MAX = np.iinfo(np.int32).max
CHUNK_EDGES = 1 << 15  # sampled edges per chunk of work (one to a few hundred microseconds)
_PLAN_CHUNK_ROWS = 1 << 15  # destinations per chunk of the planning pass
_PREFETCH_AHEAD = 16  # prefetch distance of the planning and relabelling loops
_GATHER_AHEAD = 48  # prefetch distance of the gathering loop


def _debruijn_table() -> np.ndarray:
    table = np.zeros(64, dtype=np.int64)
    for i in range(64):
        table[((_DEBRUIJN64_INT << i) & ((1 << 64) - 1)) >> 58] = i
    return table


_DEBRUIJN64_INT = 0x03F79D71B4CB0A89
_DEBRUIJN64 = np.uint64(_DEBRUIJN64_INT)
_DEBRUIJN_TABLE = _debruijn_table()


@nb.njit(inline="always", cache=True)
def _lowest_bit_index(x):
    """Index of the lowest set bit of a non-zero uint64 (de Bruijn multiplication, no branch)."""
    return _DEBRUIJN_TABLE[((x & (~x + np.uint64(1))) * _DEBRUIJN64) >> np.uint64(58)]


@nb.njit(nogil=True, cache=True)
def _emit_bitmap(bits, d, s, pos, w):
    """Write the positions s + i of the set bits i < d of ``bits`` in increasing order into pos[w:], and
    clear ``bits`` (a row's chosen set, kept as a bitmap)."""
    one = np.uint64(1)
    for word in range((d + 63) >> 6):
        x = bits[word]
        bits[word] = 0
        while x:
            pos[w] = s + (word << 6) + _lowest_bit_index(x)
            w += 1
            x &= x - one


@nb.njit(inline="always", cache=True)
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@nb.njit(inline="always", cache=True)
def _bounded(r, n):
    """floor(r * n / 2^64) for uint64 r, n: the high word of the 128-bit product."""
    a = r >> np.uint64(32)
    b = r & _LO32
    if n <= _LO32:  # exact in 64-bit arithmetic when n < 2^32 (every realistic degree)
        return np.int64((a * n + ((b * n) >> np.uint64(32))) >> np.uint64(32))
    c = n >> np.uint64(32)
    d = n & _LO32
    bd = b * d
    ad = a * d
    bc = b * c
    mid = (bd >> np.uint64(32)) + (ad & _LO32) + (bc & _LO32)
    return np.int64(a * c + (ad >> np.uint64(32)) + (bc >> np.uint64(32)) + (mid >> np.uint64(32)))


@nb.njit(nogil=True, cache=True)
def _plan_rows(indptr, dst, fanout, replace, excl, excl_rows, row_start, row_deg, row_exlo, row_exhi,
               out_indptr, lo, hi):
    """Pass 1 over rows [lo, hi): start, effective degree and output count of every destination.

    ``excl_rows`` is a bitmap of the nodes whose rows hold excluded positions: only those rows pay
    for the binary searches that find their range ``excl[row_exlo[i]:row_exhi[i]]``."""
    has_excl = excl.shape[0] > 0
    for i in range(lo, min(lo + _PREFETCH_AHEAD, hi)):
        _prefetch(indptr, dst[i])
    for i in range(lo, hi):
        if i + _PREFETCH_AHEAD < hi:  # the five stores per row keep the core from running ahead
            _prefetch(indptr, dst[i + _PREFETCH_AHEAD])
        v = dst[i]
        s = indptr[v]
        e = indptr[v + 1]
        deg = e - s
        a = 0
        b = 0
        if has_excl and (excl_rows[v >> 6] >> np.uint64(v & 63)) & np.uint64(1):
            a = np.searchsorted(excl, s)
            b = np.searchsorted(excl, e)
            deg -= b - a
        row_exlo[i] = a
        row_exhi[i] = b
        row_start[i] = s
        row_deg[i] = deg
        if fanout < 0 or (not replace and deg <= fanout):
            c = deg
        elif deg == 0:
            c = 0
        else:
            c = fanout
        out_indptr[i + 1] = c


@nb.njit(nogil=True, cache=True)
def _prefix_sum(out_indptr):
    """Turn per-row counts in out_indptr[1:] into offsets; return the total."""
    out_indptr[0] = 0
    total = 0
    for i in range(1, out_indptr.shape[0]):
        total += out_indptr[i]
        out_indptr[i] = total
    return total


@nb.njit(inline="always", cache=True)
def _floyd_mask(state, deg, m):
    """Floyd's m-subset of 0..deg-1 (deg <= 64) as a bit mask; branch-free."""
    mask = np.uint64(0)
    for j in range(deg - m, deg):
        state += _GOLDEN
        t = np.uint64(_bounded(_mix(state), np.uint64(j + 1)))
        hit = (mask >> t) & np.uint64(1)
        mask |= np.uint64(1) << (t + (np.uint64(j) - t) * hit)  # t if not yet taken, else j
    return mask


@nb.njit(nogil=True, cache=True)
def _floyd_sorted(state, deg, m, out, o):
    """Floyd's m-subset of 0..deg-1 written sorted into out[o:o + m]: a scan of the chosen slots with
    insertion for small m, a hash set for large m."""
    if m <= _SCAN_MAX:
        for n in range(m):
            j = deg - m + n
            state += _GOLDEN
            t = _bounded(_mix(state), np.uint64(j + 1))
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
        state += _GOLDEN
        t = _bounded(_mix(state), np.uint64(j + 1))
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
    bitmap = np.zeros(_BITMAP_MAX // 64, dtype=np.uint64)  # chosen slots of a row; all 0 between rows
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
            state = _mix(key ^ (np.uint64(dst[i]) * _GOLDEN))
            if draws:
                n = np.uint64(deg)
                for j in range(c):
                    state += _GOLDEN
                    pos[o + j] = shift + _bounded(_mix(state), n)
            else:
                m = c if 2 * c <= deg else deg - c  # Floyd draws what is taken, or what is left out
                if deg <= 64:
                    mask = _floyd_mask(state, deg, m)
                    if m != c:
                        full = ~np.uint64(0) if deg == 64 else (one << np.uint64(deg)) - one
                        mask = ~mask & full
                    w = o
                    while mask:
                        pos[w] = shift + _lowest_bit_index(mask)
                        w += 1
                        mask &= mask - one
                elif deg <= _BITMAP_MAX:
                    # Floyd with a bitmap of chosen slots; emitting the set bits word by word sorts them.
                    for j in range(deg - m, deg):
                        state += _GOLDEN
                        t = _bounded(_mix(state), np.uint64(j + 1))
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
                            pos[w] = shift + (q << 6) + _lowest_bit_index(x)
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
def _gather_edges(indices, edge_ids, has_eids, pos_eid, src, lo, hi):
    """Pass 3 over edges [lo, hi): sources and edge ids (in place of the positions) of chosen edges.

    Prefetching 48 edges ahead measured 0-19 % faster (most on long rows), never slower."""
    if has_eids:
        for j in range(lo, hi):
            if j + _GATHER_AHEAD < hi:
                q = pos_eid[j + _GATHER_AHEAD]
                _prefetch(indices, q)
                _prefetch(edge_ids, q)
            p = pos_eid[j]
            src[j] = indices[p]
            pos_eid[j] = edge_ids[p]
    else:
        for j in range(lo, hi):
            if j + _GATHER_AHEAD < hi:
                _prefetch(indices, pos_eid[j + _GATHER_AHEAD])
            src[j] = indices[pos_eid[j]]


@nb.njit(nogil=True, cache=True)
def _sample_rows(indices, edge_ids, has_eids, dst, row_start, row_deg, row_exlo, row_exhi, out_indptr, fanout,
                 replace, key, excl, eids, src, lo, hi):
    """Passes 2 and 3 for the rows [lo, hi) (one chunk of work)."""
    _choose_rows(dst, row_start, row_deg, row_exlo, row_exhi, out_indptr, fanout, replace, key, excl, eids,
                 lo, hi)
    _gather_edges(indices, edge_ids, has_eids, eids, src, out_indptr[lo], out_indptr[hi])


# ------------------------------------------------------------------------------------ masked rows
# Rows sampled under weights and/or edge times (the "masked" rules of `samplers.kernels.reference`).
# A position is eligible iff its weight is > 0, it is not excluded and its time is <= the row's time.
# Planning counts the eligible positions of each row (one read of its weights/times); choosing draws
# exponential keys (without replacement) or inverts the prefix sums (with replacement). Each per-row
# loop lives in its own (not inlined) function: inlined into the row loop together with the binary
# searches of the exclusion range, LLVM compiled the position loop 25-70x slower (measured).

_SKIP_SLACK = 1.0 - 2.0 ** -40  # safety factor of the log-free rejection test (see _aes_row)


@nb.njit(inline="always", cache=True)
def _eligible(weights, has_w, times, has_t, t_row, p):
    ok = True
    if has_w:
        ok = weights[p] > 0
    if has_t:
        ok = ok and times[p] <= t_row
    return ok


@nb.njit(nogil=True, cache=True)
def _excl_range(excl, excl_rows, v, s, e):
    """The range [a, b) of ``excl`` inside the CSC positions [s, e) of row v (0, 0 without any)."""
    if excl.shape[0] > 0 and (excl_rows[v >> 6] >> np.uint64(v & 63)) & np.uint64(1):
        return np.searchsorted(excl, s), np.searchsorted(excl, e)
    return 0, 0


@nb.njit(nogil=True, cache=True)
def _count_eligible(weights, has_w, times, has_t, t_row, excl, q, b, s, e):
    count = 0
    for p in range(s, e):
        ok = _eligible(weights, has_w, times, has_t, t_row, p)
        if q < b and excl[q] == p:
            ok = False
            q += 1
        count += ok
    return count


@nb.njit(nogil=True, cache=True)
def _take_eligible(weights, has_w, times, has_t, t_row, excl, q, b, s, e, pos, o):
    """Write every eligible position of [s, e) to pos[o:], in order."""
    w = o
    for p in range(s, e):
        ok = _eligible(weights, has_w, times, has_t, t_row, p)
        if q < b and excl[q] == p:
            ok = False
            q += 1
        if ok:
            pos[w] = p
            w += 1


@nb.njit(nogil=True, cache=True)
def _plan_rows_masked(indptr, dst, fanout, replace, excl, excl_rows, weights, has_w, times, row_time, has_t,
                      node_count, has_count, row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, lo,
                      hi):
    """Pass 1 of masked rows [lo, hi): start, end, eligible count and output count of every row.

    With ``has_count`` (weights without times), a row's eligible count is the node's precomputed count
    of positive weights minus its excluded positive-weight positions: this pass then reads no weights
    (counting them cost 20x the uniform planning pass and ~20 % of a weighted sample, measured)."""
    for i in range(lo, min(lo + _PREFETCH_AHEAD, hi)):
        _prefetch(indptr, dst[i])
    for i in range(lo, hi):
        if i + _PREFETCH_AHEAD < hi:
            _prefetch(indptr, dst[i + _PREFETCH_AHEAD])
            if has_count:
                _prefetch(node_count, dst[i + _PREFETCH_AHEAD])
        v = dst[i]
        s = indptr[v]
        e = indptr[v + 1]
        a, b = _excl_range(excl, excl_rows, v, s, e)
        row_exlo[i] = a
        row_exhi[i] = b
        row_start[i] = s
        row_end[i] = e
        t_row = row_time[i] if has_t else 0
        if has_count:
            count = node_count[v]
            for x in range(a, b):
                count -= weights[excl[x]] > 0
        else:
            count = _count_eligible(weights, has_w, times, has_t, t_row, excl, a, b, s, e)
        row_deg[i] = count
        if fanout < 0 or (not replace and count <= fanout):
            c = count
        elif count == 0:
            c = 0
        else:
            c = fanout
        out_indptr[i + 1] = c


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
        if not _eligible(weights, has_w, times, has_t, t_row, p):
            continue
        r = _mix(state0 + np.uint64(p - s + 1) * _GOLDEN)
        u = (np.float64(r >> np.uint64(11)) + 1.0) * _TWO_M53
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
        if _eligible(weights, has_w, times, has_t, t_row, p):
            r = _mix(state0 + np.uint64(p - s + 1) * _GOLDEN)
            u = (np.float64(r >> np.uint64(11)) + 1.0) * _TWO_M53
            wp = np.float64(weights[p]) if has_w else 1.0
            kk[n] = -math.log(u) / wp
            pp[n] = p
            n += 1
    return n


@nb.njit(nogil=True, cache=True)
def _aes_small(weights, has_w, times, has_t, t_row, excl, q, b, s, e, state0, c, kk, pp, pos, o):
    """A-ES for a row of at most _AES_SMALL eligible edges: every key, then each one's rank among them
    by (key, position), counted branch-free; ranks below c are taken, in position order (no sort).
    The heap's data-dependent branches cost ~40 ns per insertion in mispredictions (measured)."""
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
    (exclusion tests inside the position loop made it 4x slower, measured). The chosen positions are
    emitted in order through a bitmap of the row (rows up to 4096 edges; numba's sort of a 15-element
    slice took ~0.9 us) or by insertion sort."""
    n = 0
    top = np.inf
    ps = s
    for x in range(q, b + 1):
        pe = excl[x] if x < b else e
        n, top = _aes_segment(weights, has_w, times, has_t, t_row, ps, pe, s, state0, c, hkey, hpos, n, top)
        ps = pe + 1
    _emit_in_order(hpos, c, s, e - s, bitmap, pos, o)


@nb.njit(nogil=True, cache=True)
def _emit_in_order(chosen, c, s, d, bitmap, pos, o):
    """Write the c chosen CSC positions of a row [s, s + d) to pos[o:o + c] in increasing order: through
    a bitmap of the row (rows up to 4096 edges; numba's sort of a 15-element slice took ~0.9 us), or by
    insertion sort."""
    one = np.uint64(1)
    if d <= _BITMAP_MAX:
        for j in range(c):
            t = chosen[j] - s
            bitmap[t >> 6] |= one << np.uint64(t & 63)
        w = o
        for word in range((d + 63) >> 6):
            x = bitmap[word]
            bitmap[word] = 0
            while x:
                pos[w] = s + (word << 6) + _lowest_bit_index(x)
                w += 1
                x &= x - one
    else:
        for j in range(c):
            x = chosen[j]
            k = o + j
            while k > o and pos[k - 1] > x:
                pos[k] = pos[k - 1]
                k -= 1
            pos[k] = x


@nb.njit(nogil=True, cache=True)
def _prefix_row(weights, has_w, times, has_t, t_row, excl, q, b, s, e, state0, c, prefix, pos, o):
    """c draws with replacement by inverting float64 prefix sums of the eligible weights of [s, e)."""
    d = e - s
    total = 0.0
    last = s
    for p in range(s, e):
        ok = _eligible(weights, has_w, times, has_t, t_row, p)
        if q < b and excl[q] == p:
            ok = False
            q += 1
        if ok:
            total += np.float64(weights[p]) if has_w else 1.0
            last = p
        prefix[p - s] = total
    state = state0
    for j in range(c):
        state += _GOLDEN
        x = (np.float64(_mix(state) >> np.uint64(11)) * _TWO_M53) * total
        a = 0
        z = d
        while a < z:
            mid = (a + z) >> 1
            if prefix[mid] > x:
                z = mid
            else:
                a = mid + 1
        pos[o + j] = s + a if a < d else last


# ----------------------------------------------------------------------------------- weighted rows
# Weighted rows without edge times (the "weighted rows" rule of `samplers.kernels.reference`): successive
# sampling by rejection over the per-row prefix sums P, computed once per sampler (`weight_prefix`). A
# row costs O(k log d) in the common case instead of the O(d) keys of A-ES.

_REJECT_LIMIT = _REJECT_LIMIT_INT  # rejected attempts per output before the exact fallback draw


@nb.njit(nogil=True, cache=True)
def _prefix_rows(indptr, weights, prefix, positive, lo, hi):
    """P and nz of the nodes [lo, hi): float64 inclusive prefix sums of each row's weights (restarting at
    every row, summed in position order) and each row's count of positive weights."""
    for v in range(lo, hi):
        total = 0.0
        count = 0
        for p in range(indptr[v], indptr[v + 1]):
            wp = np.float64(weights[p])
            total += wp
            prefix[p] = total
            count += wp > 0
        positive[v] = count


@nb.njit(nogil=True, cache=True)
def _prefix_listed_rows(indptr, weights, rows, prefix, positive):
    """`_prefix_rows` for the listed nodes only (a one-off call: only their entries are written)."""
    for i in range(rows.shape[0]):
        v = rows[i]
        _prefix_rows(indptr, weights, prefix, positive, v, v + 1)


_COUNT_MAX = 128  # rows up to this degree find a draw's position by counting (vectorised), not searching
_COUNT_WINDOW = 64  # longer rows count inside a window of this many prefix sums once it is found
_MEMBER_MASK, _MEMBER_BITMAP, _MEMBER_SORTED = 0, 1, 2  # how a row without replacement tests "chosen"


@nb.njit(inline="always", cache=True)
def _count_le(prefix, lo, hi, x):
    """lo + the number of prefix[lo:hi] <= x: for non-decreasing prefix sums, the smallest p in [lo, hi)
    with prefix[p] > x (hi if none). A branch-free loop that LLVM vectorises; its unsigned index matters:
    with a signed one numba's negative-index wrap-around made LLVM emit gathers, 2.5-4x slower."""
    c = 0
    for q in range(np.uint64(lo), np.uint64(hi)):
        c += prefix[q] <= x
    return lo + c


@nb.njit(inline="always", cache=True)
def _search(prefix, s, e, x, unit):
    """The smallest p in [s, e) with prefix[p] > x (e if none), for x = unit * prefix[e - 1].

    Rows up to _COUNT_MAX edges count the prefix sums <= x (9-20 ns for 16-128 edges, where a binary
    search took 35-50 ns: every level a dependent load and a mispredicted branch). Longer rows count
    inside the window of _COUNT_WINDOW entries centred where x would fall if the weights were equal (s +
    unit * d), when the answer is inside it (for weights of similar size it nearly always is); else they
    bisect the row down to such a window and count in it. Any search gives the same position (the sums
    are non-decreasing), so this choice is free of the specification."""
    d = e - s
    if d <= _COUNT_MAX:
        return _count_le(prefix, s, e, x)
    lo = min(max(s + np.int64(unit * d) - (_COUNT_WINDOW >> 1), s), e - _COUNT_WINDOW)
    hi = lo + _COUNT_WINDOW
    if (lo == s or prefix[np.uint64(lo - 1)] <= x) and (hi == e or prefix[np.uint64(hi - 1)] > x):
        return _count_le(prefix, lo, hi, x)
    lo = s
    n = d
    while n > _COUNT_WINDOW:
        half = n >> 1
        if prefix[np.uint64(lo + half - 1)] <= x:
            lo += half
        n -= half
    return _count_le(prefix, lo, lo + n, x)


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
    """Whether CSC position p of the row starting at s is chosen already (see `_reject_row`)."""
    rel = p - s
    if kind == _MEMBER_MASK:
        return (mask >> np.uint64(rel)) & np.uint64(1) != 0
    if kind == _MEMBER_BITMAP:
        return (bits[rel >> 6] >> np.uint64(rel & 63)) & np.uint64(1) != 0
    for j in range(o, o + n):
        if pos[j] == p:
            return True
    return False


@nb.njit(nogil=True, cache=True)
def _fallback_draw(weights, excl, q, b, s, e, r, replace, kind, mask, bits, pos, o, n):
    """The exact draw of one output from the remaining eligible positions of [s, e) (not excluded, weight
    > 0, and not chosen unless ``replace``): their float64 weight sum R in position order, then the first
    of them whose running sum exceeds ``unit(r) * R`` (the last of them if none). O(d): two passes over
    the row (chosen positions kept unsorted in pos are sorted into a copy first)."""
    sorted_kind = kind == _MEMBER_SORTED and not replace
    chosen = np.sort(pos[o:o + n]) if sorted_kind else _NO_EXCL
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
        x = (np.float64(r >> np.uint64(11)) * _TWO_M53) * remaining
    return last


@nb.njit(nogil=True, cache=True)
def _last_positive(weights, s, e):
    p = e - 1
    while p > s and not weights[p] > 0:
        p -= 1
    return p


@nb.njit(nogil=True, cache=True)
def _draw_row(weights, prefix, s, e, state0, c, pos, o):
    """With replacement, no excluded position in the row: every attempt is accepted, so output j is the
    position of draw j + 1 (the inversion of the row's prefix sums)."""
    total = prefix[e - 1]
    t = np.uint64(0)
    for j in range(c):
        t += np.uint64(1)
        unit = np.float64(_mix(state0 + t * _GOLDEN) >> np.uint64(11)) * _TWO_M53
        p = _search(prefix, s, e, unit * total, unit)
        pos[o + j] = p if p < e else _last_positive(weights, s, e)


@nb.njit(nogil=True, cache=True)
def _reject_small(weights, prefix, s, e, state0, c, pos, o):
    """Without replacement, a row of at most 64 edges and no excluded position: chosen positions are the
    bits of one register, a draw's position is a vectorised count over the row's prefix sums. The common
    case, kept free of the general path's branches (1.5x faster than `_reject_general` there)."""
    d = e - s
    total = prefix[e - 1]
    one = np.uint64(1)
    mask = np.uint64(0)
    t = np.uint64(0)
    n = 0
    rejects = 0
    while n < c:
        t += one
        r = _mix(state0 + t * _GOLDEN)
        if rejects == _REJECT_LIMIT:  # this draw is the output's exact fallback draw (rare)
            p = _fallback_draw(weights, _NO_EXCL, 0, 0, s, e, r, False, _MEMBER_MASK, mask, _NO_BITS, pos, o,
                               n)
            mask |= one << np.uint64(p - s)
            rejects = 0
            n += 1
            continue
        x = (np.float64(r >> np.uint64(11)) * _TWO_M53) * total
        rel = 0
        for q in range(np.uint64(s), np.uint64(e)):
            rel += prefix[q] <= x
        if rel == d:  # rounding left no position: the last positive weight (never happens in practice)
            rel = _last_positive(weights, s, e) - s
        # accept or reject without a branch (a mispredicted one per rejection cost more than the count):
        # the next attempt's draw and count do not wait for this outcome
        bit = one << np.uint64(rel)
        hit = np.int64((mask & bit) != 0)
        mask |= bit
        n += 1 - hit
        rejects = (rejects + 1) * hit
    w = o
    while mask:
        pos[w] = s + _lowest_bit_index(mask)
        w += 1
        mask &= mask - one


@nb.njit(nogil=True, cache=True)
def _reject_bitmap(weights, prefix, s, e, state0, c, bits, pos, o):
    """`_reject_small` for rows of 65..4096 edges: chosen positions are the bits of ``bits`` (all 0 on
    entry and on return), emitted word by word in order."""
    d = e - s
    total = prefix[e - 1]
    one = np.uint64(1)
    t = np.uint64(0)
    n = 0
    rejects = 0
    while n < c:
        t += one
        r = _mix(state0 + t * _GOLDEN)
        if rejects == _REJECT_LIMIT:  # this draw is the output's exact fallback draw (rare)
            rel = _fallback_draw(weights, _NO_EXCL, 0, 0, s, e, r, False, _MEMBER_BITMAP, np.uint64(0), bits,
                                 pos, o, n) - s
            bits[rel >> 6] |= one << np.uint64(rel & 63)
            rejects = 0
            n += 1
            continue
        unit = np.float64(r >> np.uint64(11)) * _TWO_M53
        p = _search(prefix, s, e, unit * total, unit)
        if p == e:
            p = _last_positive(weights, s, e)
        rel = p - s
        bit = one << np.uint64(rel & 63)
        word = bits[rel >> 6]
        hit = np.int64((word & bit) != 0)
        bits[rel >> 6] = word | bit
        n += 1 - hit
        rejects = (rejects + 1) * hit
    _emit_bitmap(bits, d, s, pos, o)


@nb.njit(nogil=True, cache=True)
def _reject_general(weights, prefix, excl, q, b, s, e, state0, c, replace, bitmap, pos, o):
    """`_reject_row` for rows with excluded positions, or without replacement above 4096 edges."""
    total = prefix[e - 1]
    has_x = b > q
    d = e - s
    one = np.uint64(1)
    kind = _MEMBER_MASK
    bits = bitmap
    if d > 64:
        kind = _MEMBER_BITMAP
        if d > _BITMAP_MAX:
            if c <= _SCAN_MAX:
                kind = _MEMBER_SORTED
            else:
                bits = np.zeros((d + 63) >> 6, dtype=np.uint64)
    mask = np.uint64(0)
    t = np.uint64(0)
    n = 0
    rejects = 0
    while n < c:
        t += one
        r = _mix(state0 + t * _GOLDEN)
        if rejects == _REJECT_LIMIT:  # this draw is the output's exact fallback draw
            p = _fallback_draw(weights, excl, q, b, s, e, r, replace, kind, mask, bits, pos, o, n)
        else:
            unit = np.float64(r >> np.uint64(11)) * _TWO_M53
            p = _search(prefix, s, e, unit * total, unit)
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
            pos[w] = s + _lowest_bit_index(mask)
            w += 1
            mask &= mask - one
        return
    _emit_bitmap(bits, d, s, pos, w)


@nb.njit(nogil=True, cache=True)
def _reject_row(weights, prefix, excl, q, b, s, e, state0, c, replace, bitmap, pos, o):
    """c outputs of a weighted row [s, e) by rejection over its prefix sums, into pos[o:o + c] (the
    reference's "weighted rows"; c > 0, and c < the row's eligible count unless ``replace``).

    With replacement, outputs go to pos in draw order. Without, "chosen already" is a bit of a register
    mask (rows up to 64 edges) or of a bitmap of the row (the workspace's ``bitmap`` up to 4096 edges, a
    fresh one above when c > 64), and the set bits are emitted in order at the end; rows above 4096
    edges with c <= 64 scan the chosen positions in pos and sort them at the end. Excluded positions
    (``excl[q:b]``) are found by binary search."""
    if b == q:
        if replace:
            _draw_row(weights, prefix, s, e, state0, c, pos, o)
            return
        if e - s <= 64:
            _reject_small(weights, prefix, s, e, state0, c, pos, o)
            return
        if e - s <= _BITMAP_MAX:
            _reject_bitmap(weights, prefix, s, e, state0, c, bitmap, pos, o)
            return
    _reject_general(weights, prefix, excl, q, b, s, e, state0, c, replace, bitmap, pos, o)


_MASKED_AHEAD = 8  # rows ahead whose first weights/times the choosing pass of masked rows prefetches


@nb.njit(inline="always", cache=True)
def _prefetch_row(weights, has_w, times, has_t, s):
    if has_w and s < weights.shape[0]:
        _prefetch(weights, s)
    if has_t and s < times.shape[0]:
        _prefetch(times, s)


_WEIGHTED_AHEAD = 4  # rows ahead whose prefix sums the choosing pass of weighted rows prefetches
_WEIGHTED_LINES = 16  # rows of up to this many cache lines of prefix sums are prefetched whole


@nb.njit(inline="always", cache=True)
def _prefetch_weighted_row(weights, prefix, dst, key, row_start, row_end, row_deg, out_indptr, draws, i):
    """Start fetching what choosing weighted row i reads: its weights when it takes every eligible edge;
    else all of its prefix sums when they span at most _WEIGHTED_LINES cache lines, and otherwise the
    entries where its first c draws would land if its weights were equal (where `_search` starts)."""
    c = out_indptr[i + 1] - out_indptr[i]
    if c == 0:
        return
    s = row_start[i]
    e = row_end[i]
    if not draws and c == row_deg[i]:
        if c < e - s:  # a row with weight-0 or excluded positions reads its weights
            _prefetch(weights, s)
        return
    d = e - s
    if d <= 8 * _WEIGHTED_LINES:
        for p in range(s, e, 8):
            _prefetch(prefix, p)
        _prefetch(prefix, e - 1)
        return
    _prefetch(prefix, e - 1)
    state0 = _mix(key ^ (np.uint64(dst[i]) * _GOLDEN))
    t = np.uint64(0)
    for _ in range(c):
        t += np.uint64(1)
        unit = np.float64(_mix(state0 + t * _GOLDEN) >> np.uint64(11)) * _TWO_M53
        _prefetch(prefix, s + np.int64(unit * d))


@nb.njit(nogil=True, cache=True)
def _choose_rows_masked(dst, row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, fanout, replace,
                        key, excl, weights, has_w, times, row_time, has_t, prefix, has_prefix, pos, lo, hi):
    """Pass 2 of masked rows [lo, hi): choose CSC positions (weighted rows with ``has_prefix``: rejection
    over the prefix sums; temporal rows: A-ES keys, or prefix-sum inversion)."""
    draws = replace and fanout >= 0
    if has_prefix:
        bitmap = np.zeros(_BITMAP_MAX // 64, dtype=np.uint64)  # all 0 between rows
        for i in range(lo, min(lo + _WEIGHTED_AHEAD, hi)):
            _prefetch_weighted_row(weights, prefix, dst, key, row_start, row_end, row_deg, out_indptr, draws,
                                   i)
        for i in range(lo, hi):
            if i + _WEIGHTED_AHEAD < hi:
                _prefetch_weighted_row(weights, prefix, dst, key, row_start, row_end, row_deg, out_indptr,
                                       draws, i + _WEIGHTED_AHEAD)
            o = out_indptr[i]
            c = out_indptr[i + 1] - o
            if c == 0:
                continue
            if not draws and c == row_deg[i]:  # every eligible position, in order
                s = row_start[i]
                if c == row_end[i] - s:  # every position is eligible: no weight to read
                    for j in range(c):
                        pos[o + j] = s + j
                else:
                    _take_eligible(weights, True, times, False, 0, excl, row_exlo[i], row_exhi[i], s,
                                   row_end[i], pos, o)
                continue
            state0 = _mix(key ^ (np.uint64(dst[i]) * _GOLDEN))
            _reject_row(weights, prefix, excl, row_exlo[i], row_exhi[i], row_start[i], row_end[i], state0, c,
                        draws, bitmap, pos, o)
        return
    hkey = np.empty(16, dtype=np.float64)
    hpos = np.empty(16, dtype=np.int64)
    bitmap = np.zeros(_BITMAP_MAX // 64, dtype=np.uint64)  # all 0 between rows
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
            _take_eligible(weights, has_w, times, has_t, t_row, excl, q, b, s, e, pos, o)
            continue
        state0 = _mix(key ^ (np.uint64(dst[i]) * _GOLDEN))
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


@nb.njit(nogil=True, cache=True)
def _sample_rows_masked(indices, edge_ids, has_eids, dst, row_start, row_deg, row_exlo, row_exhi, row_end,
                        out_indptr, fanout, replace, key, excl, weights, has_w, times, row_time, has_t,
                        prefix, has_prefix, eids, src, lo, hi):
    """Passes 2 and 3 of masked rows [lo, hi) (one chunk of work)."""
    _choose_rows_masked(dst, row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, fanout, replace,
                        key, excl, weights, has_w, times, row_time, has_t, prefix, has_prefix, eids, lo, hi)
    _gather_edges(indices, edge_ids, has_eids, eids, src, out_indptr[lo], out_indptr[hi])


@nb.njit(inline="always", cache=True)
def _pair_slot(tab_node, tab_time, mask, v, t):
    """Slot of (v, t) in the open-addressing table: its own, or the empty one where it belongs."""
    h = np.int64(_mix((np.uint64(v) * _GOLDEN) ^ np.uint64(t))) & mask
    while tab_node[h] >= 0 and not (tab_node[h] == v and tab_time[h] == t):
        h = (h + 1) & mask
    return h


@nb.njit(nogil=True, cache=True)
def _relabel_pairs(dst, dst_tkey, src, edge_tkey, src_nodes, src_tkey, local):
    """Local ids keyed on (node, time key) through an open-addressing table; return the source count.

    Time keys are int64 (float64 times by their bit pattern, see `time_keys`). Destinations keep their
    positions (a repeated pair maps to its first one); sampled source j is the pair (src[j],
    edge_tkey[j]) (the time of the row it was sampled for); new pairs are appended in first-occurrence
    order."""
    d_count = dst.shape[0]
    nnz = src.shape[0]
    cap = 16
    while cap < 2 * (d_count + nnz):
        cap *= 2
    mask = cap - 1
    tab_node = np.full(cap, -1, dtype=np.int64)
    tab_time = np.empty(cap, dtype=np.int64)
    tab_id = np.empty(cap, dtype=np.int64)
    for i in range(d_count):
        v = np.int64(dst[i])
        t = dst_tkey[i]
        src_nodes[i] = v
        src_tkey[i] = t
        h = _pair_slot(tab_node, tab_time, mask, v, t)
        if tab_node[h] < 0:
            tab_node[h] = v
            tab_time[h] = t
            tab_id[h] = i
    n = d_count
    for j in range(nnz):
        v = np.int64(src[j])
        t = edge_tkey[j]
        h = _pair_slot(tab_node, tab_time, mask, v, t)
        if tab_node[h] < 0:
            tab_node[h] = v
            tab_time[h] = t
            tab_id[h] = n
            src_nodes[n] = v
            src_tkey[n] = t
            n += 1
        local[j] = tab_id[h]
    return n


def relabel_pairs(dst: np.ndarray, dst_tkey: np.ndarray, src: np.ndarray,
                  edge_tkey: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Map sampled sources to local ids keyed on (node, time key) (as `reference.relabel_temporal`, with
    each source's time key given instead of its row).

    Parameters
    ----------
    dst : int64 [D]; dst_tkey : int64 [D] (`time_keys` of the rows' times); src : int32/int64 [nnz];
    edge_tkey : int64 [nnz], the time key of each sampled source

    Returns
    -------
    src_nodes : int64 [S]; src_tkey : int64 [S]; local : int64 [nnz]
    """
    d_count, nnz = dst.shape[0], src.shape[0]
    src_nodes = np.empty(d_count + nnz, dtype=np.int64)
    src_tkey = np.empty(d_count + nnz, dtype=np.int64)
    local = np.empty(nnz, dtype=np.int64)
    as64 = np.ascontiguousarray
    n = _relabel_pairs(as64(dst, dtype=np.int64), as64(dst_tkey, dtype=np.int64), src,
                       as64(edge_tkey, dtype=np.int64), src_nodes, src_tkey, local)
    return src_nodes[:n], src_tkey[:n], local


@nb.njit(nogil=True, cache=True)
def _relabel_dst(dst, node_map, base, src_nodes):
    """Local ids of the destinations: their positions (the first one for duplicates)."""
    d_count = dst.shape[0]
    for i in range(min(_PREFETCH_AHEAD, d_count)):
        _prefetch(node_map, dst[i])
    for i in range(d_count):
        if i + _PREFETCH_AHEAD < d_count:
            _prefetch(node_map, dst[i + _PREFETCH_AHEAD])
        v = dst[i]
        m = node_map[v]
        node_map[v] = base + i if m < base else m
        src_nodes[i] = v
    return d_count


@nb.njit(nogil=True, cache=True)
def _relabel_src(src, node_map, base, n, src_nodes, local, lo, hi):
    """Local ids of the sampled sources src[lo:hi]; new nodes are appended at src_nodes[n:]; return n.

    The map entry of the source 16 places ahead is prefetched: the store to the map in every iteration
    keeps the core from overlapping enough of these random reads (30 % faster measured)."""
    ahead = min(lo + _PREFETCH_AHEAD, hi)
    for j in range(lo, ahead):
        _prefetch(node_map, src[j])
    for j in range(lo, hi):
        if j + _PREFETCH_AHEAD < hi:
            _prefetch(node_map, src[j + _PREFETCH_AHEAD])
        v = src[j]
        m = node_map[v]
        new = m < base
        m = base + n if new else m
        node_map[v] = m
        src_nodes[n] = v  # unconditional: overwritten next time unless v is new
        n += new
        local[j] = m - base
    return n


def _parallel_for(fn: Callable[[int], None], num_chunks: int, helpers: int) -> None:
    """`graphrl.kernels.parallel_for` with ``helpers`` threads besides the caller."""
    parallel_for(fn, num_chunks, helpers + 1)


class Workspace:
    """Reusable memory of one sampler (one `sample` at a time; not shared between threads).

    Attributes
    ----------
    node_map : numpy.ndarray, int32, shape [N]
        Dense global -> local id map. An entry ``m`` is valid for the current layer iff
        ``m >= base``; the local id is then ``m - base``.
    base : int
        Smallest valid map entry; advanced past every layer's ids, so nothing needs resetting.

    Per-destination and per-edge intermediates grow geometrically and are reused across calls, so a
    steady-state `sample` call allocates only its outputs.
    """

    def __init__(self, num_nodes: int, index_dtype=np.int64) -> None:
        self.node_map = np.full(num_nodes, -1, dtype=np.int32)
        self.base = 0
        self._index_dtype = np.dtype(index_dtype)
        self._rows = np.empty((5, 0), dtype=np.int64)
        self._src = np.empty(0, dtype=self._index_dtype)

    def rows(self, n: int) -> np.ndarray:
        """Int64 scratch [5, n]: row starts, effective degrees, excluded-position ranges [lo, hi), row
        ends (the last used by masked rows only)."""
        if self._rows.shape[1] < n:
            self._rows = np.empty((5, max(n, 2 * self._rows.shape[1])), dtype=np.int64)
        return self._rows[:, :n]

    def src(self, n: int) -> np.ndarray:
        """A scratch array of length n for sampled sources, in the graph's index dtype."""
        if self._src.shape[0] < n:
            self._src = np.empty(max(n, 2 * self._src.shape[0]), dtype=self._index_dtype)
        return self._src[:n]

    def reserve(self, ids: int) -> int:
        """Return the base for a layer that may create up to ``ids`` local ids (clears on overflow)."""
        if ids > _INT32_MAX:
            raise ValueError(f"a layer with {ids:,} destinations + sampled edges exceeds the int32 local "
                             f"id range; sample fewer seeds per batch")
        if self.base + ids > _INT32_MAX:
            self.node_map.fill(-1)
            self.base = 0
        return self.base


class Exclusion:
    """Excluded CSC positions prepared once per `sample` call for the kernels of every layer.

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [N + 1]
        The graph's row pointer.
    positions : numpy.ndarray, int64, shape [X]
        Sorted, distinct CSC positions that are never drawn.

    Attributes
    ----------
    positions : numpy.ndarray, int64, shape [X]
    row_bitmap : numpy.ndarray, uint64, shape [ceil(N / 64)]
        Bit v is set iff row v holds an excluded position; rows without one skip all exclusion work.
    """

    def __init__(self, indptr: np.ndarray, positions: np.ndarray) -> None:
        self.positions = np.ascontiguousarray(positions, dtype=np.int64)
        num_nodes = indptr.shape[0] - 1
        self.row_bitmap = np.zeros((num_nodes + 63) // 64, dtype=np.uint64)
        rows = np.searchsorted(indptr, self.positions, side="right") - 1
        bits = np.left_shift(np.uint64(1), (rows & 63).astype(np.uint64))
        np.bitwise_or.at(self.row_bitmap, rows >> 6, bits)


_NO_EXCLUSION_BITMAP = np.zeros(0, dtype=np.uint64)


def _exclusion_arrays(indptr, excluded) -> tuple[np.ndarray, np.ndarray]:
    if excluded is None:
        return _NO_EXCL, _NO_EXCLUSION_BITMAP
    if not isinstance(excluded, Exclusion):
        excluded = Exclusion(indptr, excluded)
    return excluded.positions, excluded.row_bitmap


def weight_prefix(indptr: np.ndarray, weights: np.ndarray, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Per-row prefix sums ``P`` and positive counts ``nz`` of the weights (as `reference.weight_prefix`).

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [N + 1]
    weights : numpy.ndarray, float32, shape [E]
        CSC order, finite and >= 0 (trusted).
    threads : int
        Threads that may work on it, the caller included (chunks of rows of about equal edge counts).

    Returns
    -------
    prefix : numpy.ndarray, float64, shape [E]
        Inclusive prefix sums of the weights widened to float64, in position order, restarting at every
        row (the same additions as the reference, so equal bit for bit).
    positive : numpy.ndarray, int64, shape [N]
        Each row's count of positive weights.
    """
    num = indptr.shape[0] - 1
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    prefix = np.empty(weights.shape[0], dtype=np.float64)
    positive = np.empty(num, dtype=np.int64)
    chunks = max(1, min(64, weights.shape[0] // (1 << 18)))
    bounds = np.searchsorted(indptr, np.linspace(0, weights.shape[0], chunks + 1)[1:-1]).astype(np.int64)
    bounds = np.unique(np.concatenate(([0], bounds.clip(0, num), [num])))
    _parallel_for(lambda i: _prefix_rows(indptr, weights, prefix, positive, bounds[i], bounds[i + 1]),
                  bounds.shape[0] - 1, max(int(threads) - 1, 0))
    return prefix, positive


class Masks:
    """Edge weights and/or edge times in CSC order: rows are then sampled by the masked rules.

    Parameters
    ----------
    weights : numpy.ndarray or None, float32, shape [E]
        Finite, non-negative weight of the edge at each CSC position (trusted).
    times : numpy.ndarray or None, int64 or float64, shape [E]
        Time of the edge at each CSC position; a row of time t draws only edges of time <= t.
    indptr : numpy.ndarray or None, int64, shape [N + 1]
        The graph's row pointer. Weighted rows without times need the per-row prefix sums ``P`` and
        positive counts ``nz`` of the weights (`weight_prefix`; the reference's "weighted rows"): given
        ``indptr``, they are computed here for every node (8 bytes per edge and 8 per node, one parallel
        pass over the weights), or only for the nodes ``rows`` when given (a one-off call).
    threads : int
        Threads that may compute ``P`` and ``nz`` (the caller included).
    rows : numpy.ndarray or None, int64, shape [D]
        Compute ``P`` and ``nz`` for these nodes only; the other entries stay undefined, so the masks then
        serve only rows of these nodes.
    prefix, positive : numpy.ndarray or None, float64 [E] and int64 [N]
        ``P`` and ``nz`` computed beforehand (`weight_prefix`), instead of ``indptr``.

    Attributes
    ----------
    prefix : numpy.ndarray, float64, shape [E] (empty without weights or with times)
        ``P``: inclusive prefix sums of the weights in float64, restarting at every row.
    node_count : numpy.ndarray, int64, shape [N] (empty without weights or with times)
        ``nz``: each node's count of positive-weight in-edges, so that planning a layer reads no weights.
    has_prefix : bool
        Weighted rows without times: sampled by rejection over ``prefix``.

    Raises
    ------
    ValueError
        Weights without times and neither ``indptr`` nor ``prefix`` and ``positive``.
    """

    def __init__(self, weights: np.ndarray | None = None, times: np.ndarray | None = None,
                 indptr: np.ndarray | None = None, *, threads: int = 1, rows: np.ndarray | None = None,
                 prefix: np.ndarray | None = None, positive: np.ndarray | None = None) -> None:
        self.weights = _NO_WEIGHTS if weights is None else np.ascontiguousarray(weights, dtype=np.float32)
        self.has_weights = weights is not None
        self.times = _NO_TIMES if times is None else np.ascontiguousarray(times)
        self.has_times = times is not None
        self.node_count = _NO_EXCL
        self.prefix = _NO_PREFIX
        self.has_prefix = weights is not None and times is None
        if self.has_prefix:
            if prefix is not None and positive is not None:
                self.prefix = np.ascontiguousarray(prefix, dtype=np.float64)
                self.node_count = np.ascontiguousarray(positive, dtype=np.int64)
            elif indptr is None:
                raise ValueError("weights without edge times need indptr (or prefix and positive, see "
                                 "weight_prefix) for their per-row prefix sums")
            elif rows is None:
                self.prefix, self.node_count = weight_prefix(indptr, self.weights, threads)
            else:
                self.prefix = np.empty(self.weights.shape[0], dtype=np.float64)
                self.node_count = np.empty(indptr.shape[0] - 1, dtype=np.int64)
                _prefix_listed_rows(indptr, self.weights, np.ascontiguousarray(rows, dtype=np.int64),
                                    self.prefix, self.node_count)
        self.has_count = self.has_prefix

    def row_times(self, dst_times: np.ndarray | None) -> np.ndarray:
        """The destination rows' times in the edge times' dtype (an empty array without times)."""
        if not self.has_times:
            return self.times[:0]
        if dst_times is None:
            raise ValueError("masks with edge times need the destination rows' times")
        return np.ascontiguousarray(dst_times, dtype=self.times.dtype)


def time_keys(times: np.ndarray) -> np.ndarray:
    """int64 keys of times for (node, time) relabelling: integers as they are, float64 by bit pattern
    (with -0.0 folded into 0.0, so equal times get equal keys)."""
    if times.dtype == np.float64:
        return (times + 0.0).view(np.int64)
    return times.astype(np.int64, copy=False)


def from_time_keys(keys: np.ndarray, dtype) -> np.ndarray:
    """The times (int64 or float64 ``dtype``) of int64 keys made by `time_keys`."""
    return keys.view(np.float64) if np.dtype(dtype) == np.float64 else keys.astype(dtype, copy=False)


def _plan(indptr, dst, fanout, replace, excluded, workspace: Workspace, helpers: int,
          masks: Masks | None = None, row_time: np.ndarray | None = None):
    d_count = dst.shape[0]
    rows = workspace.rows(d_count)
    row_start, row_deg, row_exlo, row_exhi, row_end = rows
    out_indptr = np.empty(d_count + 1, dtype=np.int64)
    excl, excl_rows = _exclusion_arrays(indptr, excluded)
    if masks is None:
        rows = rows[:4]
        fn = _plan_rows
        args = (indptr, dst, np.int64(fanout), bool(replace), excl, excl_rows, row_start, row_deg, row_exlo,
                row_exhi, out_indptr)
    else:
        fn = _plan_rows_masked
        args = (indptr, dst, np.int64(fanout), bool(replace), excl, excl_rows, masks.weights,
                masks.has_weights, masks.times, row_time, masks.has_times, masks.node_count, masks.has_count,
                row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr)
    if d_count > _PLAN_CHUNK_ROWS and helpers > 0:
        bounds = np.arange(0, d_count + _PLAN_CHUNK_ROWS, _PLAN_CHUNK_ROWS).clip(max=d_count)
        _parallel_for(lambda i: fn(*args, bounds[i], bounds[i + 1]), bounds.shape[0] - 1, helpers)
    else:
        fn(*args, 0, d_count)
    nnz = _prefix_sum(out_indptr)
    return out_indptr, rows, excl, nnz


def _chunk_bounds(out_indptr: np.ndarray, nnz: int) -> np.ndarray:
    """Row boundaries of chunks of about CHUNK_EDGES sampled edges (first 0, last D)."""
    d_count = out_indptr.shape[0] - 1
    if nnz <= CHUNK_EDGES:
        return np.array([0, d_count], dtype=np.int64)
    cuts = np.searchsorted(out_indptr, np.arange(CHUNK_EDGES, nnz, CHUNK_EDGES), side="left")
    return np.unique(np.concatenate(([0], cuts, [d_count]))).astype(np.int64)


def _chunk_fn(indices, edge_ids, dst, rows, out_indptr, fanout, replace, key, excl, eids, src,
              masks: Masks | None, row_time) -> Callable[[int, int], None]:
    """The kernel call that samples (chooses and gathers) the rows [lo, hi)."""
    has_eids = edge_ids is not None
    head = (indices, edge_ids if has_eids else _NO_EXCL, has_eids, dst, *rows, out_indptr, np.int64(fanout),
            bool(replace), np.uint64(key), excl)
    if masks is None:
        args = (*head, eids, src)
        return lambda lo, hi: _sample_rows(*args, lo, hi)
    args = (*head, masks.weights, masks.has_weights, masks.times, row_time, masks.has_times, masks.prefix,
            masks.has_prefix, eids, src)
    return lambda lo, hi: _sample_rows_masked(*args, lo, hi)


def sample_block(indptr: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray | None, dst: np.ndarray,
                 fanout: int, replace: bool, key: int, excluded: Exclusion | np.ndarray | None,
                 workspace: Workspace, threads: int = 1, masks: Masks | None = None,
                 dst_times: np.ndarray | None = None,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Sample one layer and relabel it: the arrays of one block.

    Equal to `samplers.kernels.reference.sample_layer` followed by `~samplers.kernels.reference.relabel`
    (`~samplers.kernels.reference.relabel_temporal` with edge times).

    Parameters
    ----------
    indptr : int64 [N + 1]; indices : int32/int64 [E]; edge_ids : int64 [E] or None (identity)
        The graph in CSC form.
    dst : int64 [D]
        Destination nodes, trusted to be in range.
    fanout : int
        k >= 0, or -1 for every in-edge.
    replace : bool
    key : int
        ``layer_key(seed, call, layer)``.
    excluded : Exclusion, or int64 [X], or None
        Sorted distinct CSC positions never drawn (an `Exclusion` saves preparing them per layer).
    workspace : Workspace
        The sampler's scratch (node map, intermediates).
    threads : int
        Threads that may work on this layer, the caller included (1: the caller alone).
    masks : Masks or None
        Edge weights and/or times: rows follow the masked rules.
    dst_times : [D] or None
        The rows' times (required when ``masks`` has times).

    Returns
    -------
    out_indptr : int64 [D + 1]; src_nodes : int64 [S]; local : int64 [nnz]; eids : int64 [nnz];
    src_times : [S] in the edge times' dtype, or None without times
        Fresh arrays (``src_nodes`` is a view of a fresh array of D + nnz entries).
    """
    helpers = max(int(threads) - 1, 0)
    row_time = None if masks is None else masks.row_times(dst_times)
    out_indptr, rows, excl, nnz = _plan(indptr, dst, fanout, replace, excluded, workspace, helpers, masks,
                                        row_time)
    d_count = dst.shape[0]
    eids = np.empty(nnz, dtype=np.int64)
    src = workspace.src(nnz)
    src_nodes = np.empty(d_count + nnz, dtype=np.int64)
    local = np.empty(nnz, dtype=np.int64)
    if nnz:
        bounds = _chunk_bounds(out_indptr, nnz)
        fn = _chunk_fn(indices, edge_ids, dst, rows, out_indptr, fanout, replace, key, excl, eids, src, masks,
                       row_time)
    if masks is not None and masks.has_times:
        if nnz:
            _parallel_for(lambda i: fn(bounds[i], bounds[i + 1]), bounds.shape[0] - 1, helpers)
        tkeys = np.empty(d_count + nnz, dtype=np.int64)
        dst_tkey = time_keys(row_time)
        edge_tkey = np.repeat(dst_tkey, np.diff(out_indptr))  # a source takes the time of its row
        n = _relabel_pairs(dst, dst_tkey, src, edge_tkey, src_nodes, tkeys, local)
        return out_indptr, src_nodes[:n], local, eids, from_time_keys(tkeys[:n], row_time.dtype)
    base = workspace.reserve(d_count + nnz)
    node_map = workspace.node_map
    # Entries this layer writes lie in [base, base + d_count + nnz). If anything raises part way (a
    # helper's error, KeyboardInterrupt between chunks), advance past that whole range so the next call
    # cannot read half-written entries as valid.
    workspace.base = base + d_count + nnz
    n = _relabel_dst(dst, node_map, base, src_nodes)
    if nnz:
        task = _Task(lambda i: fn(bounds[i], bounds[i + 1]), bounds.shape[0] - 1)
        with _engaged(task, helpers):
            # Relabel chunk r as soon as it is sampled; sample chunks here rather than wait.
            for r in range(task.num_chunks):
                while not task.done[r]:
                    i = task.claim()
                    if i < 0:
                        task.wait(r)
                        break
                    task.run(i)
                if task.error is not None:
                    break
                n = _relabel_src(src, node_map, base, n, src_nodes, local, out_indptr[bounds[r]],
                                 out_indptr[bounds[r + 1]])
            task.finish()
    workspace.base = base + n
    return out_indptr, src_nodes[:n], local, eids, None


def sample_layer(indptr: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray | None, dst: np.ndarray,
                 fanout: int, replace: bool, key: int, excluded: np.ndarray | None = None,
                 threads: int = 1, weights: np.ndarray | None = None, edge_times: np.ndarray | None = None,
                 dst_times: np.ndarray | None = None, *, prefix: np.ndarray | None = None,
                 positive: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample the in-edges of each destination, without relabelling (as `reference.sample_layer`).

    Parameters
    ----------
    indptr : int64 [N + 1]; indices : int32/int64 [E]; edge_ids : int64 [E] or None (identity)
    dst : int64 [D], trusted in range
    fanout : int, k >= 0 or -1
    replace : bool
    key : int, ``layer_key(seed, call, layer)``
    excluded : int64 [X] or None, sorted distinct CSC positions never drawn
    threads : int, threads that may work on it (the caller included)
    weights : float32 [E] or None; edge_times : int64/float64 [E] or None; dst_times : [D] or None
        As in `reference.sample_layer` (CSC order).
    prefix : float64 [E] or None; positive : int64 [N] or None
        Weights without times: ``weight_prefix(indptr, weights)``, computed once by a caller that samples
        the same weights many times. Without them, they are computed for the rows of ``dst`` alone (the
        O(sum of their degrees) pass that the precomputed arrays save).

    Returns
    -------
    out_indptr : int64 [D + 1]; src : int64 [nnz] global sources; eids : int64 [nnz] edge ids
    """
    helpers = max(int(threads) - 1, 0)
    masks = None
    if weights is not None or edge_times is not None:
        masks = Masks(weights, edge_times, indptr, rows=dst, prefix=prefix, positive=positive)
    row_time = None if masks is None else masks.row_times(dst_times)
    workspace = Workspace(0, indices.dtype)
    out_indptr, rows, excl, nnz = _plan(indptr, dst, fanout, replace, excluded, workspace, helpers, masks,
                                        row_time)
    eids = np.empty(nnz, dtype=np.int64)
    src = np.empty(nnz, dtype=indices.dtype)
    if nnz:
        bounds = _chunk_bounds(out_indptr, nnz)
        fn = _chunk_fn(indices, edge_ids, dst, rows, out_indptr, fanout, replace, key, excl, eids, src, masks,
                       row_time)
        _parallel_for(lambda i: fn(bounds[i], bounds[i + 1]), bounds.shape[0] - 1, helpers)
    return out_indptr, src.astype(np.int64), eids


def relabel(dst: np.ndarray, src: np.ndarray, node_map: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map sampled global sources to local ids (as `reference.relabel`).

    Parameters
    ----------
    dst : int64 [D]; src : int32/int64 [nnz]; node_map : int32 [N], all -1 (left all -1 on return)

    Returns
    -------
    src_nodes : int64 [S]; local : int64 [nnz]
    """
    src_nodes = np.empty(dst.shape[0] + src.shape[0], dtype=np.int64)
    local = np.empty(src.shape[0], dtype=np.int64)
    n = _relabel_dst(dst, node_map, 0, src_nodes)
    n = _relabel_src(src, node_map, 0, n, src_nodes, local, 0, src.shape[0])
    src_nodes = src_nodes[:n]
    node_map[src_nodes] = -1
    return src_nodes, local

"""Plain-Python reference of the neighbour-sampling kernels: slow, obvious, and bit-identical to cpu.py.

The tests compare the numba kernels against these functions on small graphs. Both follow the same
specification, so their outputs must be *equal*, not merely alike:

RNG. ``splitmix64`` (Steele, Lea and Flood, OOPSLA 2014) on unsigned 64-bit integers. A layer's key is
``layer_key(seed, call, layer)``; the stream of row ``v`` starts at ``state = mix(key ^ (v * GOLDEN))``
and each draw does ``state += GOLDEN; r = mix(state)``. A draw in [0, n) is ``(r * n) >> 64`` (the high
word of the 128-bit product: Lemire's multiply-shift, "Fast Random Integer Generation in an Interval",
ACM TOMACS 2019, without the rejection step; its bias is below n / 2^64). It costs two multiplies
where ``r % n`` costs a 64-bit division, the single most expensive step of a draw.

Choice of positions for a destination of in-degree d and fanout k (positions are 0..d-1 within the row):
- ``k == -1`` or (``not replace`` and ``d <= k``): every position, in order.
- ``d == 0``: nothing.
- without replacement, ``d > k``: Robert Floyd's algorithm (Bentley and Floyd, CACM 1987) draws a
  uniform m-subset of 0..d-1: for ``j`` in ``d-m .. d-1``: ``t = draw(j + 1)``; add ``t`` unless
  already in the subset, else add ``j``. When ``2k <= d`` the subset (m = k) is what is taken; when
  ``2k > d`` the subset (m = d - k) is what is *left out* and the other k positions are taken (fewer
  draws: 5 instead of 15 for k = 15, d = 20). Either way the k taken positions are emitted in
  increasing order.
- with replacement: k draws ``draw(d)``, emitted in draw order.

Excluded edges. ``excluded`` is a sorted array of distinct CSC positions that must never be drawn (the
target edges of a link-prediction batch). They are removed from the candidates *before* drawing (unlike
DGL 2.1's ``sample_neighbors(exclude_edges=...)``, which draws first and drops them after): if x of a
row's d positions are excluded, the row has d' = d - x *virtual* positions 0..d'-1, the choice above
runs with d' in place of d (same RNG stream), and virtual position i maps to the i-th (0-based)
non-excluded position of the row, in increasing order.
Equivalently, with the row's excluded relative positions x_0 < x_1 < ... < x_{m-1},
``real(i) = i + #{j : x_j - j <= i}``. A row without excluded positions is sampled exactly as if
``excluded`` were empty.

Relabelling: ``src_nodes`` = the destination nodes as given (duplicates kept) followed by every
sampled source not among them, in order of first occurrence in the flat sampled array; each sampled
source's local id is the position of its first occurrence in ``src_nodes``.

Masked rows: weights, edge times, or both. When the sampler has edge weights or edge times, every row
is sampled by the *masked* rules below instead (exclusion included). Relative position p (0..d-1, d
the raw in-degree) is *eligible* iff its weight is > 0 (weight 1 for every edge without weights), it
is not excluded, and (with times) its edge time is <= the row's time. Let d_e be the number of
eligible positions.
- ``k == -1``, or (``not replace`` and ``d_e <= k``): every eligible position, in order; no draws.
- ``d_e == 0``: nothing.
- otherwise, weighted rows *without* edge times follow "Weighted rows" below; rows with edge times
  (weighted or not) follow "Temporal rows".

Weighted rows (weights, no edge times): successive sampling by rejection over per-row prefix sums.
``P`` (float64 [E]) holds the inclusive prefix sums of the CSC-ordered weights, restarting at every
row: ``P[s] = 0.0 + w[s]``, ``P[p] = P[p - 1] + w[p]`` for s < p < e (float64 additions in position
order, w the float32 weight widened to float64; excluded and weight-0 positions are summed like any
other);
``nz`` (int64 [N]) counts each row's positive weights, so d_e = nz[v] minus the row's excluded
positions of positive weight (the sampler computes both once; they do not depend on the batch). With
``T = P[e - 1]`` the row's total, outputs are drawn one after another, k of them; draw t = 1, 2, ... of
the row's stream is ``r = mix(state0 + t * GOLDEN)``, ``state0 = mix(key ^ (v * GOLDEN))`` as above
(one counter t for the whole row, never reset between outputs). For one output:
- up to ``REJECT_LIMIT`` = 8 *attempts*: the next draw gives ``x = ((r >> 11) * 2^-53) * T`` and the
  position p = the smallest one of the row with ``P[p] > x`` (the row's last position of positive
  weight if rounding leaves none); it is accepted iff it is eligible and (``replace`` or not chosen
  already for this row), else rejected. A weight-0 position is never found (its P equals the
  previous one), so only excluded and already-chosen positions are rejected.
- after REJECT_LIMIT rejected attempts, the output is drawn *exactly from what remains*: ``R`` = the
  float64 sum, in position order, of the weights of the eligible positions not yet chosen (every
  eligible position with ``replace``); the next draw gives ``x = ((r >> 11) * 2^-53) * R``; walking
  those positions in order and accumulating their weights, the output is the first with ``acc > x``
  (the last of them if rounding leaves none).
Without replacement the k chosen positions are emitted in increasing order; with replacement in draw
order. Why this is exact: an attempt picks p with probability w_p / T (up to the 2^-53 grid of x), so
an accepted attempt, conditioned on acceptance, picks p with probability w_p / (sum of the remaining
eligible weights); so does the fallback; so each output is drawn proportional to the weights of the
eligible positions not yet chosen: successive weighted sampling without replacement, which is the
distribution of the k smallest exponential keys ``-log(u) / w`` (Efraimidis and Spirakis, "Weighted
random sampling with a reservoir", IPL 2006, algorithm A-ES; the temporal rows' method). With
replacement and no excluded position every attempt is accepted: each draw is the inversion of the
row's prefix sums, as for temporal rows. The cost of a row is O(k log d) in the common case, not
O(d): high-degree rows of power-law graphs no longer read all their weights. A rejection is likely
only when the chosen or excluded positions hold most of the row's weight (k close to d_e, or one edge
of overwhelming weight); the fallback bounds the attempts per output, at O(d) per fallback (so O(k d)
for a row whose heaviest edges are chosen first and hold nearly all its weight).

Temporal rows (edge times, with or without weights), for ``d_e > k`` or with replacement:
- without replacement: exponential keys (Efraimidis and Spirakis 2006, algorithm A-ES as GraphBolt
  uses it). Position p takes the (p+1)-th draw ``r`` of the row's stream whether or not it is eligible
  (so the draw of a position is ``mix(state0 + (p + 1) * GOLDEN)``, computable independently by a GPU
  thread); an eligible one gets ``u = ((r >> 11) + 1) * 2^-53`` in (0, 1] and ``key = -log(u) / w`` in
  float64 (``math.log``). The k eligible positions with the smallest ``(key, p)`` are taken and
  emitted in increasing order. With equal weights this is a uniform k-subset.
- with replacement: float64 prefix sums ``c_p`` of the eligible weights (ineligible positions add 0)
  summed in position order; draw j (the j-th of the row's stream, j = 1..k) gives
  ``x = ((r >> 11) * 2^-53) * c_{d-1}``; it picks the smallest p with ``c_p > x`` (the last eligible
  position if rounding leaves none). Emitted in draw order. A position of weight 0 is never drawn.

Temporal relabelling: with times, every destination row carries a time (the seeds' times for the last
layer; inner layers inherit the time of the row that reached them), a sampled source takes the time
of the row it was sampled for, and relabelling keys on the (node, time) pair instead of the node: the
same node reached at two different times is two source nodes (two rows of the next layer).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
REJECT_LIMIT = 8  # rejected attempts per output of a weighted row before its exact fallback draw


def mix(z: int) -> int:
    """splitmix64's finaliser on a Python int taken mod 2^64."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def layer_key(seed: int, call: int, layer: int) -> int:
    """The 64-bit key of one layer of one ``sample`` call; shared with cpu.py."""
    return mix(mix(mix(seed & MASK64) ^ (call & MASK64)) ^ (layer & MASK64))


class _RowRNG:
    def __init__(self, key: int, node: int) -> None:
        self.state = mix(key ^ ((node * GOLDEN) & MASK64))

    def draw(self, n: int) -> int:
        self.state = (self.state + GOLDEN) & MASK64
        return (mix(self.state) * n) >> 64


_TWO_M53 = 2.0 ** -53


def _unit_open(r: int) -> float:
    """(0, 1] from a 64-bit draw: the top 53 bits, plus one, times 2^-53."""
    return ((r >> 11) + 1) * _TWO_M53


def _unit_closed_open(r: int) -> float:
    """[0, 1) from a 64-bit draw: the top 53 bits times 2^-53."""
    return (r >> 11) * _TWO_M53


def _choose_masked(eligible: list[bool], w: list[float], k: int, replace: bool, key: int,
                   node: int) -> list[int]:
    """Relative positions chosen in a temporal row ("Temporal rows" in the module docstring)."""
    d = len(eligible)
    cand = [p for p in range(d) if eligible[p]]
    if not cand:
        return []
    if k == -1 or (not replace and len(cand) <= k):
        return cand
    state0 = mix(key ^ ((node * GOLDEN) & MASK64))
    if not replace:
        keys = []
        for p in cand:
            r = mix((state0 + (p + 1) * GOLDEN) & MASK64)
            keys.append((-math.log(_unit_open(r)) / w[p], p))
        keys.sort()
        return sorted(p for _, p in keys[:k])
    prefix = []
    total = 0.0
    for p in range(d):
        if eligible[p]:
            total += w[p]
        prefix.append(total)
    last = cand[-1]
    out = []
    state = state0
    for _ in range(k):
        state = (state + GOLDEN) & MASK64
        x = _unit_closed_open(mix(state)) * total
        lo, hi = 0, d  # first p with prefix[p] > x
        while lo < hi:
            mid = (lo + hi) // 2
            if prefix[mid] > x:
                hi = mid
            else:
                lo = mid + 1
        out.append(lo if lo < d else last)
    return out


def weight_prefix(indptr: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The per-row prefix sums ``P`` and positive counts ``nz`` of weighted rows (module docstring).

    Returns
    -------
    prefix : float64 [E]
        Inclusive prefix sums of the float32 weights widened to float64, restarting at every row.
    positive : int64 [N]
        Number of positive weights of each row.
    """
    num = indptr.shape[0] - 1
    prefix = np.zeros(weights.shape[0], dtype=np.float64)
    positive = np.zeros(num, dtype=np.int64)
    for v in range(num):
        total = 0.0
        for p in range(int(indptr[v]), int(indptr[v + 1])):
            total += float(weights[p])
            prefix[p] = total
            positive[v] += float(weights[p]) > 0
    return prefix, positive


def _choose_weighted(eligible: list[bool], w: list[float], prefix: list[float], k: int, replace: bool,
                     key: int, node: int) -> list[int]:
    """Relative positions chosen in a weighted row without edge times: successive sampling by rejection
    over the row's prefix sums ``prefix`` (the row's slice of ``P``), see the module docstring."""
    d = len(eligible)
    cand = [p for p in range(d) if eligible[p]]
    if not cand:
        return []
    if k == -1 or (not replace and len(cand) <= k):
        return cand
    state0 = mix(key ^ ((node * GOLDEN) & MASK64))
    total = prefix[-1]
    last_positive = max(p for p in range(d) if w[p] > 0)
    t = 0
    out: list[int] = []
    taken: set[int] = set()
    for _ in range(k):
        for _attempt in range(REJECT_LIMIT):
            t += 1
            x = _unit_closed_open(mix((state0 + t * GOLDEN) & MASK64)) * total
            p = bisect.bisect_right(prefix, x)  # the smallest p with prefix[p] > x
            if p == d:
                p = last_positive
            if eligible[p] and (replace or p not in taken):
                break
        else:  # REJECT_LIMIT rejections: draw exactly from the remaining eligible positions
            t += 1
            rest = [q for q in cand if replace or q not in taken]
            remaining = 0.0
            for q in rest:
                remaining += w[q]
            x = _unit_closed_open(mix((state0 + t * GOLDEN) & MASK64)) * remaining
            acc = 0.0
            p = rest[-1]
            for q in rest:
                acc += w[q]
                if acc > x:
                    p = q
                    break
        out.append(p)
        taken.add(p)
    return out if replace else sorted(out)


def _choose(d: int, k: int, replace: bool, rng: _RowRNG) -> list[int]:
    if d == 0:
        return []
    if k == -1 or (not replace and d <= k):
        return list(range(d))
    if replace:
        return [rng.draw(d) for _ in range(k)]
    m = k if 2 * k <= d else d - k
    subset: set[int] = set()
    for j in range(d - m, d):
        t = rng.draw(j + 1)
        subset.add(j if t in subset else t)
    if m == k:
        return sorted(subset)
    return [p for p in range(d) if p not in subset]


def sample_layer(indptr: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray | None, dst: np.ndarray,
                 fanout: int, replace: bool, key: int, excluded: np.ndarray | None = None,
                 weights: np.ndarray | None = None, edge_times: np.ndarray | None = None,
                 dst_times: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample the in-edges of each destination, skipping the ``excluded`` CSC positions.

    Parameters
    ----------
    indptr : int64 [N + 1]; indices : int32/int64 [E]; edge_ids : int64 [E] or None (identity)
        The graph in CSC form.
    dst : int64 [D]
        Destination nodes (trusted to be in range).
    fanout : int
        k >= 0, or -1 for every in-edge.
    replace : bool
        Draw with replacement.
    key : int
        ``layer_key(seed, call, layer)``.
    excluded : int64 [X] or None
        Sorted, distinct CSC positions that are never drawn (see the module docstring).
    weights : float32 [E] or None
        Edge weights in CSC order (masked rules when given; without ``edge_times``, the "weighted rows"
        rule, with each row's prefix sums computed as `weight_prefix` does).
    edge_times : int64 or float64 [E] or None
        Edge times in CSC order (masked rules when given; needs ``dst_times``).
    dst_times : [D] or None
        Time of each destination row, same dtype as ``edge_times``.

    Returns
    -------
    out_indptr : int64 [D + 1]; src : int64 [nnz] (global source ids); eids : int64 [nnz]
    """
    out_indptr = [0]
    src: list[int] = []
    eids: list[int] = []
    gone = set() if excluded is None else {int(p) for p in excluded.tolist()}
    masked = weights is not None or edge_times is not None
    for row, v in enumerate(dst.tolist()):
        start, end = int(indptr[v]), int(indptr[v + 1])
        if masked:
            w = [1.0 if weights is None else float(weights[p]) for p in range(start, end)]
            ok = [w[p - start] > 0 and p not in gone
                  and (edge_times is None or edge_times[p] <= dst_times[row]) for p in range(start, end)]
            allowed = list(range(start, end))
            if edge_times is None:  # weighted rows: rejection over the row's prefix sums
                prefix = []
                total = 0.0
                for x in w:
                    total += x
                    prefix.append(total)
                chosen = _choose_weighted(ok, w, prefix, fanout, replace, key, v)
            else:
                chosen = _choose_masked(ok, w, fanout, replace, key, v)
        else:
            allowed = [p for p in range(start, end) if p not in gone]
            chosen = _choose(len(allowed), fanout, replace, _RowRNG(key, v))
        for i in chosen:
            pos = allowed[i]
            src.append(int(indices[pos]))
            eids.append(int(edge_ids[pos]) if edge_ids is not None else pos)
        out_indptr.append(len(src))
    return (np.asarray(out_indptr, dtype=np.int64), np.asarray(src, dtype=np.int64),
            np.asarray(eids, dtype=np.int64))


def relabel(dst: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map sampled global sources to local ids.

    Returns
    -------
    src_nodes : int64 [S]
        ``dst`` followed by the new sources in first-occurrence order.
    local : int64 [nnz]
        Local id of each entry of ``src``.
    """
    first: dict[int, int] = {}
    nodes = dst.tolist()
    for i, v in enumerate(nodes):
        first.setdefault(v, i)
    local = []
    for v in src.tolist():
        if v not in first:
            first[v] = len(nodes)
            nodes.append(v)
        local.append(first[v])
    return np.asarray(nodes, dtype=np.int64), np.asarray(local, dtype=np.int64)


def relabel_temporal(dst: np.ndarray, dst_times: np.ndarray, out_indptr: np.ndarray, src: np.ndarray,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Map sampled sources to local ids keyed on (node, time); a source takes its row's time.

    Returns
    -------
    src_nodes : int64 [S]; src_times : [S] (dtype of ``dst_times``); local : int64 [nnz]
    """
    first: dict[tuple, int] = {}
    nodes = dst.tolist()
    times = dst_times.tolist()
    for i, key in enumerate(zip(nodes, times, strict=True)):
        first.setdefault(key, i)
    row_of = np.repeat(np.arange(dst.shape[0]), np.diff(out_indptr))
    local = []
    for v, row in zip(src.tolist(), row_of.tolist(), strict=True):
        key = (v, times[row])
        if key not in first:
            first[key] = len(nodes)
            nodes.append(v)
            times.append(times[row])
        local.append(first[key])
    return (np.asarray(nodes, dtype=np.int64), np.asarray(times, dtype=dst_times.dtype),
            np.asarray(local, dtype=np.int64))

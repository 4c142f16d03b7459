"""Plain-Python reference of the neighbour-sampling kernels: slow, obvious, and the specification.

The numba CPU kernels (`samplers.kernels.cpu`) and GPU kernels (`samplers.kernels.cuda`) follow the
same rules, so the tests demand that their outputs *equal* these functions' on small graphs. The rules
are stated in full in docs/architecture.md#sampling-rules; in brief:

- RNG: splitmix64 on uint64; row ``v`` of a layer with key ``layer_key(seed, call, layer)`` starts at
  ``state = mix(key ^ (v * GOLDEN))``, each draw does ``state += GOLDEN; r = mix(state)``, a draw in
  [0, n) is ``(r * n) >> 64`` (the numba kernels compile `samplers.kernels.rng`).
- Uniform rows: every position when ``k == -1`` or (without replacement) ``d <= k``; else Floyd's
  algorithm draws an m-subset (the k taken, or the d - k left out when ``2k > d``), emitted in
  increasing order; with replacement k draws in draw order.
- Excluded positions (link prediction) are removed before drawing: the row is sampled over its
  non-excluded positions with the same stream.
- Weighted rows (weights, no edge times): successive sampling. Rows of at most `SHORT_ROW_MAX`
  positions without replacement with ``SHORT_SHARE * k`` above their eligible count draw each output
  from running sums of the weights not chosen yet (no rejection); other rows by rejection over the
  per-row float64 prefix sums ``P`` (`weight_prefix`), with an exact fallback draw after
  `REJECT_LIMIT` rejections.
- Temporal rows (edge times): only edges of time <= the row's time are eligible; without replacement
  the k smallest exponential keys ``-log(u) / w`` (A-ES), with replacement prefix-sum inversion.
- Relabelling: the destinations as given, then each new source in first-occurrence order; with times
  keyed on the (node, time) pair, a source taking the time of the row that drew it.

>>> out_indptr, src, eids = sample_layer(indptr, indices, None, dst, 10, False, layer_key(0, 0, 0))
>>> src_nodes, local = relabel(dst, src)

References
----------
Steele, Lea and Flood (OOPSLA 2014), splitmix64; Lemire (ACM TOMACS 2019), multiply-shift ranges;
Bentley and Floyd (CACM 1987), Floyd's algorithm; Efraimidis and Spirakis (IPL 2006), A-ES.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
REJECT_LIMIT = 8  # rejected attempts per output of a weighted row before its exact fallback draw
SHORT_ROW_MAX = 64  # weighted rows of at most this many positions draw without replacement by running sums
SHORT_SHARE = 3  # ... when SHORT_SHARE * k exceeds their eligible count
REBASE_FRACTION = 0.0625  # a short row's running sums are summed afresh below this share of the last sum


def mix(z: int) -> int:
    """splitmix64's finaliser on a Python int taken mod 2^64."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def layer_key(seed: int, call: int, layer: int) -> int:
    """The 64-bit key of one layer of one ``sample`` call; shared with the numba kernels."""
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
    """Relative positions chosen in a temporal row ("Temporal rows", docs/architecture.md#sampling-rules)."""
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
    """The per-row prefix sums ``P`` and positive counts ``nz`` of weighted rows (the sampling rules).

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


def _running_sums(available: list[bool], w: list[float]) -> list[float]:
    """A short row's running sums: for each position, the float64 sum in position order of the weights of
    the available positions up to it (the others add nothing)."""
    out = []
    total = 0.0
    for p, ok in enumerate(available):
        if ok:
            total += w[p]
        out.append(total)
    return out


def _choose_short(eligible: list[bool], w: list[float], k: int, state0: int) -> list[int]:
    """Relative positions chosen without replacement in a short weighted row (k < its eligible count):
    successive sampling over running sums (the sampling rules)."""
    d = len(eligible)
    available = list(eligible)
    acc = _running_sums(available, w)
    base = acc[-1]
    out = []
    for t in range(1, k + 1):
        if acc[-1] < base * REBASE_FRACTION:  # sum afresh: the subtractions' rounding stays small
            acc = _running_sums(available, w)
            base = acc[-1]
        x = _unit_closed_open(mix((state0 + t * GOLDEN) & MASK64)) * acc[-1]
        p = sum(1 for a in acc if a <= x)  # a count (the sums need not be monotone after rounding)
        while p < d and not available[p]:
            p += 1
        if p == d:  # rounding left no available position at or after the count: the last available
            p = max(q for q in range(d) if available[q])
        available[p] = False
        out.append(p)
        for q in range(p, d):
            acc[q] -= w[p]
    return sorted(out)


def _choose_weighted(eligible: list[bool], w: list[float], prefix: list[float], k: int, replace: bool,
                     key: int, node: int) -> list[int]:
    """Relative positions chosen in a weighted row without edge times: successive sampling, over running
    sums (rows of at most SHORT_ROW_MAX positions without replacement, SHORT_SHARE * k > their eligible
    count) or by rejection over the row's prefix sums ``prefix`` (the row's slice of ``P``), see the
    sampling rules."""
    d = len(eligible)
    cand = [p for p in range(d) if eligible[p]]
    if not cand:
        return []
    if k == -1 or (not replace and len(cand) <= k):
        return cand
    state0 = mix(key ^ ((node * GOLDEN) & MASK64))
    if not replace and d <= SHORT_ROW_MAX and SHORT_SHARE * k > len(cand):
        return _choose_short(eligible, w, k, state0)
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
        Sorted, distinct CSC positions that are never drawn (see the sampling rules).
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

"""LABOR's per-row arithmetic, written once and compiled for the CPU and the GPU kernels.

As `samplers.kernels.rng`, the functions below are plain Python that `compile_for` compiles with a
target's decorator (``numba.njit(inline="always")`` for `samplers.kernels.cpu.labor`,
``numba.cuda.jit(device=True)`` for `samplers.kernels.cuda.labor`), so both devices run the same
arithmetic in the same order and keep the same edges.

A row is destination t with CSC positions [s, e); its excluded positions are ``excl[a:b]`` (sorted);
an edge is *eligible* when it is not excluded and, with weights, its weight is > 0. Source u of an
eligible edge has the variate ``r_u = variate(vkey, u)`` in [0, 1), one per (layer key, source id), so
every row of the layer sees the same ``r_u``. The edge is kept iff ``r_u < c_t * f``, where ``f`` is the
edge's factor: ``pi_u`` with importance sampling, else its weight ``A`` (weighted) or 1.

References
----------
Balin and Catalyurek, "Layer-Neighbor Sampling -- Defusing Neighborhood Explosion in GNNs" (NeurIPS
2023, arXiv:2210.13339): Eq. (15)/(22) for ``c_t``, Eq. (18) for ``pi``; DGL's ``CSRLaborPick``.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np

# plain Python here; compile_for swaps in the target's compiled ones
from samplers.kernels.rng import compile_functions, draw, row_state, unit

__all__ = ["EPS", "MAX_ITERATIONS", "MAX_SOLVE_STEPS", "NO_OWNER", "compile_for", "converged", "iterations"]

EPS = 1e-4  # relative tolerance of the fixed points (DGL's eps)
MAX_SOLVE_STEPS = 100  # DGL's fixed-point steps of one row's c_t before `solve_c` brackets the rest
BRACKET_STEPS = 2100  # doublings (halvings) of c in `solve_c`'s bracket: past float64's range
SOLVE_TOL = 1e-9  # relative width at which `solve_c`'s bisection stops (well inside EPS)
MAX_ITERATIONS = 1000  # cap on the importance-sampling iterations of a layer (``converged``)
NO_OWNER = np.int64(np.iinfo(np.int64).max)  # owner[u] of a source no edge has claimed


def clip1(x):
    """min(x, 1.0) (written out: numba.cuda's ``min`` overload does not compile here)."""
    return x if x < 1.0 else 1.0


def converged(prev, expected, it):
    """Whether importance sampling's fixed point stops after iteration ``it`` (0-based): the expected
    source count ``expected`` (the rows' contributions summed exactly, rounded once) no longer shrinks
    by a relative `EPS` from ``prev`` (the previous one; at first the rows' candidate edges), or ``it``
    reached `MAX_ITERATIONS`. The one rule of both devices' loops (the CPU's and the GPU's host loop
    call it, the GPU's ``labor_decide`` runs it compiled)."""
    return prev <= 0 or expected / prev >= 1 - EPS or it >= MAX_ITERATIONS


def iterations(importance_sampling: int, has_w: bool, max_updates: int = -1) -> int:
    """The iterations a layer's importance-sampling loop runs at most, counted as pi's updates plus, with
    weights (``has_w``), iteration 0, which solves c_t over the weights without updating pi (so LABOR-i
    updates pi i times, weighted or not). The updates are ``importance_sampling`` (LABOR-i, i >= 0), or,
    until convergence (i < 0), ``max_updates``; -1 where that is -1 (no cap: the loop stops at
    `converged`, at most `MAX_ITERATIONS`). The one rule of the CPU's loop, the GPU's host loop
    (``max_updates`` -1) and the GPU's chained layer (``samplers.kernels.cuda.labor.LABOR_ROUNDS``
    updates). Host code, not compiled by `compile_for`.

    Examples: ``iterations(2, False) == 2``, ``iterations(2, True) == 3``, ``iterations(-1, True) == -1``,
    ``iterations(-1, True, 16) == 17``, ``iterations(0, True) == 1`` (c_t over the weights, pi never).
    """
    updates = importance_sampling if importance_sampling >= 0 else max_updates
    return updates + int(has_w) if updates >= 0 else -1


def variate(vkey, u):
    """r_u in [0, 1): the first draw of source u's stream under the layer's variate key."""
    return unit(draw(row_state(vkey, u), 1))


def pi_index(indices, slots, p0, s, j):
    """Where ``pi`` holds the importance of the row's edge j (CSC position, row start s): ``p0 + j - s``,
    pi per candidate edge, ``p0`` the row's first (the CPU's; ``indices`` and ``slots`` unused). A target
    may pass its own to `compile_for` (the GPU's: per unique source of the layer, through ``slots``)."""
    return p0 + j - s


def factor(weights, has_w, pi, has_pi, q):
    """The edge's factor f at CSC position j = q - pi0 offsets: pi[q] with importance sampling, else
    the weight (weighted) or 1. ``q`` indexes ``pi`` when ``has_pi``, else ``weights``."""
    if has_pi:
        return pi[q]
    if has_w:
        return np.float64(weights[q])
    return 1.0


def skipped(weights, has_w, excl, q, b, j):
    """(skip, q'): whether the row's position j is not eligible (excluded, or weight <= 0 with weights),
    and the index of the first excluded position > j in ``excl[q:b]`` (``excl[q]`` is the first one >= j
    on entry). Every row loop's head: ``q = a``, then per j in [s, e): ``skip, q = skipped(..., q, b, j)``
    and ``continue`` on skip."""
    excluded = q < b and excl[q] == j
    if excluded:
        q += 1
    return excluded or (has_w and not weights[j] > 0), q


def edge_at(indices, slots, weights, has_w, pi, has_pi, p0, excl, q, b, s, j):
    """(skip, q', w, f): `skipped`'s pair, then position j's weight (1.0 without weights) and `factor`
    (``pi[pi_index(indices, slots, p0, s, j)]`` with importance sampling; w and f 0.0 where skipped):
    the head of the loops that weigh the row's eligible edges (``q = a``, then per j in [s, e):
    ``skip, q, w, f = edge_at(..., q, b, s, j)``)."""
    skip, q = skipped(weights, has_w, excl, q, b, j)
    if skip:
        return skip, q, 0.0, 0.0
    w = np.float64(weights[j]) if has_w else 1.0
    return skip, q, w, factor(weights, has_w, pi, has_pi, pi_index(indices, slots, p0, s, j) if has_pi else j)


def row_sums(weights, has_w, excl, a, b, s, e):
    """(d, ds, sq): eligible edges, their weight sum (d without weights), sum of squared weights."""
    d = 0
    ds = 0.0
    sq = 0.0
    q = a
    for j in range(s, e):
        skip, q = skipped(weights, has_w, excl, q, b, j)
        if skip:
            continue
        d += 1
        if has_w:
            w = np.float64(weights[j])
            ds += w
            sq += w * w  # exact: a float32 squared fits a float64
    if not has_w:
        ds = np.float64(d)
    return d, ds, sq


def first_c(fanout, d, ds):
    """The starting c_t: k / ds (DGL's), inf for fanout -1 (every eligible edge kept), 0 for d = 0."""
    if d == 0:
        return 0.0
    if fanout < 0:
        return np.inf
    return np.float64(fanout) / ds


def start_c(fanout, weights, has_w, excl, a, b, s, e):
    """The row's starting c_t (`first_c` of its `row_sums`)."""
    d, ds, _ = row_sums(weights, has_w, excl, a, b, s, e)
    return first_c(fanout, d, ds)


def row_var(c, indices, slots, weights, has_w, pi, has_pi, p0, excl, a, b, s, e):
    """var_1 of Eq. 22 at c_t = c: the sum of ``w^2 / min(1, c f)`` over the row's eligible edges (pi at
    `pi_index`)."""
    var1 = 0.0
    q = a
    for j in range(s, e):
        skip, q, w, f = edge_at(indices, slots, weights, has_w, pi, has_pi, p0, excl, q, b, s, j)
        if skip:
            continue
        var1 += w * w / clip1(c * f)
    return var1


def agrees(var1, target):
    """Whether var_1 and the target agree to a relative `EPS` (DGL's stopping test)."""
    low, high = (var1, target) if var1 < target else (target, var1)
    return low / high >= 1.0 - EPS


def solve_c(c, fanout, indices, slots, weights, has_w, pi, has_pi, p0, excl, a, b, s, e):
    """c_t such that the row's estimator has the variance of k draws (Eq. 22): where DGL's fixed point
    ``c *= var_1 / var_target`` from ``c`` stops (var_1 and the target agree to `EPS`, no cap on its
    steps); edge j's pi is at `pi_index` (``indices``, ``slots``, ``p0``).

    The iteration is monotone (``c var_1(c)`` does not decrease in c; var_1 does not increase) and stops
    at its first step inside the band where var_1 is within `EPS` of the target. Its first
    `MAX_SOLVE_STEPS` steps run as DGL's; a row still outside the band then (it creeps towards the band,
    e.g. a weighted row with d <= k, whose target ``sum A^2`` only keeping every edge meets, can take
    thousands of steps) finds the band's edge on its side, var_1 = target / (1 - EPS) when c rises
    (target * (1 - EPS) when it falls), by doubling (halving) c until var_1 crosses it and bisecting to a
    relative `SOLVE_TOL`, and takes DGL's last step from there. DGL's own stopping point lies within a
    relative ~EPS of that edge (its steps there change c by a factor within 1 / (1 - EPS)), so the
    kept probabilities differ from DGL's uncapped iteration by a relative ~EPS."""
    d, ds, sq = row_sums(weights, has_w, excl, a, b, s, e)
    if d == 0 or fanout < 0:
        return first_c(fanout, d, ds)
    k = np.int64(fanout) if fanout < d else np.int64(d)
    target = ds * ds / np.float64(k)
    if has_w:
        target = target - ds * ds / np.float64(d) + sq
    for _ in range(MAX_SOLVE_STEPS):
        var1 = row_var(c, indices, slots, weights, has_w, pi, has_pi, p0, excl, a, b, s, e)
        c = c * (var1 / target)
        if agrees(var1, target):
            return c
    var1 = row_var(c, indices, slots, weights, has_w, pi, has_pi, p0, excl, a, b, s, e)
    if agrees(var1, target):
        return c * (var1 / target)
    rising = var1 > target
    edge = target / (1.0 - EPS) if rising else target * (1.0 - EPS)
    lo = c  # invariant: var_1(lo) > edge >= var_1(hi)
    hi = c
    for _ in range(BRACKET_STEPS):
        if rising:
            lo = hi
            hi = hi * 2.0
            if not row_var(hi, indices, slots, weights, has_w, pi, has_pi, p0, excl, a, b, s, e) > edge:
                break
        else:
            hi = lo
            lo = lo * 0.5
            if row_var(lo, indices, slots, weights, has_w, pi, has_pi, p0, excl, a, b, s, e) > edge:
                break
    while hi - lo > SOLVE_TOL * hi:
        mid = 0.5 * (lo + hi)
        if row_var(mid, indices, slots, weights, has_w, pi, has_pi, p0, excl, a, b, s, e) > edge:
            lo = mid
        else:
            hi = mid
    c = hi if rising else lo
    return c * (row_var(c, indices, slots, weights, has_w, pi, has_pi, p0, excl, a, b, s, e) / target)


def count_kept(indices, slots, weights, has_w, pi, has_pi, p0, excl, a, b, s, e, c, vkey):
    """Edges of the row kept at c_t = c (pi at `pi_index`)."""
    n = 0
    q = a
    for j in range(s, e):
        skip, q, _, f = edge_at(indices, slots, weights, has_w, pi, has_pi, p0, excl, q, b, s, j)
        if skip:
            continue
        if variate(vkey, indices[j]) < c * f:
            n += 1
    return n


def take_kept(indices, slots, weights, has_w, pi, has_pi, p0, excl, a, b, s, e, c, vkey, pos, ew, want_w, o,
              n):
    """Write the n kept CSC positions of the row to pos[o:o + n] (in CSC order) and, with ``want_w``,
    their edge weights ``w / p`` scaled so that the row's mean is 1 (DGL's ``edge_weights``; pi at
    `pi_index`)."""
    w_at = o
    norm = 0.0
    q = a
    for j in range(s, e):
        skip, q, w, f = edge_at(indices, slots, weights, has_w, pi, has_pi, p0, excl, q, b, s, j)
        if skip:
            continue
        p = c * f
        if variate(vkey, indices[j]) < p:
            pos[w_at] = j
            if want_w:
                x = w / clip1(p)
                ew[w_at] = x
                norm += x
            w_at += 1
    if want_w and n > 0:
        scale = np.float64(n) / norm
        for x in range(o, o + n):
            ew[x] = ew[x] * scale


def raise_hop(hop, owner, u, ct, f):
    """hop[u] = max(hop[u], ct), owner[u] = min(owner[u], f): one thread's update (the GPU passes an
    atomic version to `compile_for`, its rows running concurrently)."""
    if ct > hop[u]:
        hop[u] = ct
    if f < owner[u]:
        owner[u] = f


def hop_max_row(indices, weights, has_w, use_w, excl, a, b, s, e, off, ct, hop, owner):
    """Raise hop[u] to the row's c_t (times A with ``use_w``) and owner[u] to at most the edge's index
    ``off + j - s`` over the row's eligible edges (t, u)."""
    q = a
    for j in range(s, e):
        skip, q = skipped(weights, has_w, excl, q, b, j)
        if skip:
            continue
        raise_hop(hop, owner, indices[j], ct * np.float64(weights[j]) if use_w else ct, off + j - s)


def next_pi(pi, hop, first):
    """A source's pi after an iteration whose max c_t over its edges is ``hop``: ``hop`` at the first
    iteration, else ``pi * hop`` (Eq. 18's product over the layers' iterations)."""
    return hop if first else pi * hop


def hop_apply_row(indices, weights, has_w, excl, a, b, s, e, off, hop, owner, pi, first):
    """pi (or pi *= ) hop[u] on the row's eligible edges (pi[off + j - s] for edge j); returns the sum of
    min(1, pi_u) over the sources whose first edge (``owner``) is in this row."""
    total = 0.0
    q = a
    for j in range(s, e):
        skip, q = skipped(weights, has_w, excl, q, b, j)
        if skip:
            continue
        u = indices[j]
        f = off + j - s
        pi[f] = next_pi(pi[f], hop[u], first)
        if owner[u] == f:
            total += clip1(pi[f])
    return total


def hop_reset_row(indices, s, e, hop, owner):
    """hop[u] = 0 and owner[u] = NO_OWNER for every source u of the row (eligible or not)."""
    for j in range(s, e):
        u = indices[j]
        hop[u] = 0.0
        owner[u] = NO_OWNER


FUNCTIONS = (clip1, converged, variate, pi_index, factor, skipped, edge_at, row_sums, first_c, start_c,
             row_var, agrees, solve_c, count_kept, take_kept, raise_hop, hop_max_row, next_pi, hop_apply_row,
             hop_reset_row)


def compile_for(jit: Callable[[Callable], Callable], rng: types.SimpleNamespace,
                raise_hop: Callable | None = None, pi_index: Callable | None = None) -> types.SimpleNamespace:
    """Every function of `FUNCTIONS` compiled by ``jit``, calling ``rng``'s compiled stream (the
    namespace `samplers.kernels.rng.compile_for` returns for the same target) and, when given, the
    target's compiled ``raise_hop`` and ``pi_index`` in place of this module's."""
    scope = dict(globals(), row_state=rng.row_state, draw=rng.draw, unit=rng.unit)
    own = {"raise_hop": raise_hop, "pi_index": pi_index}
    own = {name: fn for name, fn in own.items() if fn is not None}
    scope.update(own)
    functions = tuple(fn for fn in FUNCTIONS if fn.__name__ not in own)
    rows = compile_functions(functions, jit, scope)
    for name, fn in own.items():
        setattr(rows, name, fn)
    return rows

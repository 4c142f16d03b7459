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

from samplers.kernels.rng import draw, row_state, unit  # plain Python; compile_for swaps in compiled ones

__all__ = ["EPS", "MAX_SOLVE_STEPS", "compile_for"]

EPS = 1e-4  # relative tolerance of the fixed points (DGL's eps)
MAX_SOLVE_STEPS = 100  # cap on the fixed-point steps of one row's c_t


def lower_bound(arr, lo, hi, x):
    """First index in [lo, hi) of sorted ``arr`` whose value is >= x (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if arr[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def clip1(x):
    """min(x, 1.0) (written out: numba.cuda's ``min`` overload does not compile here)."""
    return x if x < 1.0 else 1.0


def variate(vkey, u):
    """r_u in [0, 1): the first draw of source u's stream under the layer's variate key."""
    return unit(draw(row_state(vkey, u), 1))


def factor(weights, has_w, pi, has_pi, q):
    """The edge's factor f at CSC position j = q - pi0 offsets: pi[q] with importance sampling, else
    the weight (weighted) or 1. ``q`` indexes ``pi`` when ``has_pi``, else ``weights``."""
    if has_pi:
        return pi[q]
    if has_w:
        return np.float64(weights[q])
    return 1.0


def row_sums(weights, has_w, excl, a, b, s, e):
    """(d, ds, sq): eligible edges, their weight sum (d without weights), sum of squared weights."""
    d = 0
    ds = 0.0
    sq = 0.0
    q = a
    for j in range(s, e):
        if q < b and excl[q] == j:
            q += 1
            continue
        if has_w:
            w = np.float64(weights[j])
            if w > 0:
                d += 1
                ds += w
                sq += w * w  # exact: a float32 squared fits a float64
        else:
            d += 1
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


def solve_c(c, fanout, weights, has_w, pi, has_pi, p0, excl, a, b, s, e):
    """c_t such that the row's estimator has the variance of k draws (Eq. 22), by DGL's fixed point
    ``c *= var_1 / var_target`` from ``c``; ``pi[p0 + j - s]`` is edge j's pi."""
    d, ds, sq = row_sums(weights, has_w, excl, a, b, s, e)
    if d == 0 or fanout < 0:
        return first_c(fanout, d, ds)
    k = np.int64(fanout) if fanout < d else np.int64(d)
    target = ds * ds / np.float64(k)
    if has_w:
        target = target - ds * ds / np.float64(d) + sq
    for _ in range(MAX_SOLVE_STEPS):
        var1 = 0.0
        q = a
        for j in range(s, e):
            if q < b and excl[q] == j:
                q += 1
                continue
            w = 1.0
            if has_w:
                w = np.float64(weights[j])
                if w <= 0:
                    continue
            f = factor(weights, has_w, pi, has_pi, p0 + j - s if has_pi else j)
            var1 += w * w / clip1(c * f)
        c = c * (var1 / target)
        low, high = (var1, target) if var1 < target else (target, var1)
        if low / high >= 1.0 - EPS:
            break
    return c


def count_kept(indices, weights, has_w, pi, has_pi, p0, excl, a, b, s, e, c, vkey):
    """Edges of the row kept at c_t = c."""
    n = 0
    q = a
    for j in range(s, e):
        if q < b and excl[q] == j:
            q += 1
            continue
        if has_w and not weights[j] > 0:
            continue
        f = factor(weights, has_w, pi, has_pi, p0 + j - s if has_pi else j)
        if variate(vkey, indices[j]) < c * f:
            n += 1
    return n


def take_kept(indices, weights, has_w, pi, has_pi, p0, excl, a, b, s, e, c, vkey, pos, ew, want_w, o, n):
    """Write the n kept CSC positions of the row to pos[o:o + n] (in CSC order) and, with ``want_w``,
    their edge weights ``w / p`` scaled so that the row's mean is 1 (DGL's ``edge_weights``)."""
    w_at = o
    norm = 0.0
    q = a
    for j in range(s, e):
        if q < b and excl[q] == j:
            q += 1
            continue
        w = 1.0
        if has_w:
            w = np.float64(weights[j])
            if not w > 0:
                continue
        f = factor(weights, has_w, pi, has_pi, p0 + j - s if has_pi else j)
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


FUNCTIONS = (clip1, lower_bound, variate, factor, row_sums, first_c, solve_c, count_kept, take_kept)


def compile_for(jit: Callable[[Callable], Callable], rng: types.SimpleNamespace) -> types.SimpleNamespace:
    """Every function of `FUNCTIONS` compiled by ``jit``, calling ``rng``'s compiled stream (the
    namespace `samplers.kernels.rng.compile_for` returns for the same target)."""
    scope = dict(globals())
    scope.update(row_state=rng.row_state, draw=rng.draw, unit=rng.unit)
    compiled = {}
    for fn in FUNCTIONS:
        copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__qualname__, copy.__doc__, copy.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
        compiled[fn.__name__] = scope[fn.__name__] = jit(copy)
    return types.SimpleNamespace(**compiled)

"""LABOR's c_t (`samplers.kernels.labor_rows.solve_c`, as plain Python: the source both devices compile): it
stops where DGL's fixed point ``c *= var_1 / var_target`` stops when run without a cap (computed here in
numpy), for rows that take hundreds or thousands of steps (weighted rows with d <= k, skewed rows with d > k,
both directions, with pi) and bit for bit for rows that stop within `MAX_SOLVE_STEPS`; the sampler (compiled
kernels) keeps each edge with that probability (chi-square) and a destination keeps as many edges in
expectation as DGL's ``LaborSampler``."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
from scipy.stats import chi2

from graphrl.graph import CSCGraph
from samplers import LaborSampler
from samplers.kernels.labor_rows import EPS, MAX_SOLVE_STEPS, solve_c

NO_INT = np.zeros(1, dtype=np.int64)
NO_PI = np.zeros(1, dtype=np.float64)
NO_W = np.zeros(1, dtype=np.float32)
RTOL = 4 * EPS  # DGL stops within a factor 1 / (1 - EPS) of the band's edge, and takes one more step


def dgl_fixed_point(w: np.ndarray | None, f: np.ndarray, k: int, c: float,
                    cap: int | None = None) -> tuple[float, int]:
    """(c_t, steps) of DGL's ``compute_importance_sampling_probabilities`` for one row, in float64, run until
    var_1 and the target agree to EPS with no cap (``cap``: at most that many steps, the old kernel's):
    ``w`` the eligible edges' weights (None: unweighted), ``f`` their factors (pi, or the weights). Sums run
    in edge order, as the kernel's."""
    d = len(f)
    ws = [1.0] * d if w is None else [float(x) for x in w]
    ds = 0.0
    sq = 0.0
    for x in ws:
        ds += x
        sq += x * x
    if w is None:
        ds = float(d)
    k = min(k, d)
    target = ds * ds / k
    if w is not None:
        target = target - ds * ds / d + sq
    steps = 0
    while True:
        var1 = 0.0
        for x, fx in zip(ws, f, strict=True):
            var1 += x * x / min(1.0, c * float(fx))
        c *= var1 / target
        steps += 1
        if min(var1, target) / max(var1, target) >= 1 - EPS or steps == cap:
            return c, steps


def ours(w: np.ndarray | None, f: np.ndarray | None, k: int, c: float) -> float:
    """`solve_c` on one row of eligible edges (weights ``w`` or None, pi ``f`` or None)."""
    d = len(w) if w is not None else len(f)
    has_w, has_pi = w is not None, f is not None
    weights = w.astype(np.float32) if has_w else NO_W
    pi = f.astype(np.float64) if has_pi else NO_PI
    indices = np.arange(d, dtype=np.int64)
    return solve_c(c, k, indices, NO_INT, weights, has_w, pi, has_pi, 0, NO_INT, 0, 0, 0, d)


def repro_weights(d: int, seed: int = 0) -> np.ndarray:
    """Exponential weights + 0.05 (float32), as the reviewer's reproducer's."""
    return (np.random.default_rng(seed).exponential(1.0, d).astype(np.float32) + np.float32(0.05))


def skewed(d: int) -> np.ndarray:
    """One heavy weight and d - 1 light ones: the target is just above sum A^2, c creeps both ways."""
    w = np.full(d, 0.02, dtype=np.float32)
    w[d // 2] = 1.0
    return w


def one_light(pi: np.ndarray) -> np.ndarray:
    """``pi`` with its tenth entry 20 times smaller: the last edge below min(1, c pi) = 1 holds c back."""
    pi = pi.copy()
    pi[9] /= 20
    return pi


SLOW_ROWS = {  # name: (weights, pi, fanout), rows DGL's iteration needs more than MAX_SOLVE_STEPS for
    "weighted d=3 k=10": (repro_weights(3), None, 10),
    "weighted d=10 k=10": (repro_weights(10), None, 10),
    "weighted d=k=8 skewed": (skewed(8), None, 8),
    "weighted d=11 k=10 skewed": (skewed(11), None, 10),
    "unweighted d=30 k=40 pi": (None, one_light(np.random.default_rng(3).uniform(0.3, 1.0, 30)), 40),
    "weighted d=12 k=12 pi": (repro_weights(12, 1), np.random.default_rng(2).uniform(0.05, 1.0, 12), 12),
}


@pytest.mark.parametrize("start", ["k/ds", "high"])
@pytest.mark.parametrize("name", list(SLOW_ROWS))
def test_slow_rows_reach_dgls_uncapped_fixed_point(name, start):
    w, pi, k = SLOW_ROWS[name]
    f = pi if pi is not None else w.astype(np.float64)
    ds = float(w.astype(np.float64).sum()) if w is not None else float(len(f))
    c0 = k / ds if start == "k/ds" else 1e3 / float(np.min(f))  # from above: every edge kept at first
    want, steps = dgl_fixed_point(w, f, k, c0)
    got = ours(w, pi, k, c0)
    if start == "k/ds":
        assert steps > MAX_SOLVE_STEPS, (name, steps)  # the rows the old cap cut short
    p_want = np.minimum(1.0, want * f)
    p_got = np.minimum(1.0, got * f)
    np.testing.assert_allclose(p_got, p_want, rtol=RTOL, atol=0)
    np.testing.assert_allclose(got, want, rtol=RTOL)


def test_falling_skewed_row_creeps_too():
    """From above (c_t of a previous importance-sampling round), the skewed d > k row's c falls for hundreds
    of steps in DGL's iteration: the bracket runs its halving side."""
    w = skewed(11)
    f = w.astype(np.float64)
    want, steps = dgl_fixed_point(w, f, 10, 1e3 / float(f.min()))
    assert steps > MAX_SOLVE_STEPS
    np.testing.assert_allclose(ours(w, None, 10, 1e3 / float(f.min())), want, rtol=RTOL)


def test_rows_within_the_step_cap_stay_bit_for_bit():
    """Rows DGL's iteration settles within MAX_SOLVE_STEPS run exactly its steps: the same c, bit for bit."""
    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(200):
        d = int(rng.integers(1, 40))
        k = int(rng.integers(1, 25))
        w = rng.uniform(0.1, 2.0, d).astype(np.float32) if rng.random() < 0.7 else None
        pi = rng.uniform(0.05, 3.0, d) if rng.random() < 0.5 else None
        if w is None and pi is None:
            continue
        f = pi if pi is not None else w.astype(np.float64)
        ds = float(sum(float(x) for x in w)) if w is not None else float(d)
        want, steps = dgl_fixed_point(w, f, k, k / ds)
        if steps <= MAX_SOLVE_STEPS:
            assert ours(w, pi, k, k / ds) == want, (d, k, steps)
            checked += 1
    assert checked > 100


def star_rows(degrees: list[int], seed: int) -> tuple[CSCGraph, torch.Tensor, list[np.ndarray]]:
    """Destinations 0..R-1, destination i with ``degrees[i]`` in-edges from sources of its own, exponential
    weights + 0.05; returns the graph, the weights (float32, by edge id = input order) and each row's edge
    ids."""
    rows = len(degrees)
    dst = np.repeat(np.arange(rows), degrees)
    src = rows + np.arange(dst.size)
    w = np.random.default_rng(seed).exponential(1.0, dst.size).astype(np.float32) + np.float32(0.05)
    starts = np.concatenate([[0], np.cumsum(degrees)])
    eids = [np.arange(starts[i], starts[i + 1]) for i in range(rows)]
    return CSCGraph.from_edges(src, dst, rows + dst.size), torch.from_numpy(w), eids


def exact_probabilities(w: np.ndarray, eids: list[np.ndarray], k: int, cap: int | None = None) -> np.ndarray:
    """Each edge's keep probability min(1, c_t A) at DGL's uncapped fixed point (weighted LABOR-0; ``cap``:
    after at most that many steps)."""
    p = np.zeros(w.size)
    for e in eids:
        a = w[e]
        c, _ = dgl_fixed_point(a, a.astype(np.float64), k, k / float(sum(float(x) for x in a)), cap)
        p[e] = np.minimum(1.0, c * a.astype(np.float64))
    return p


def test_weighted_labor0_keeps_each_edge_with_its_fixed_point_probability():
    degrees, k, trials = [3, 10, 10, 25, 6], 10, 1500
    g, w, eids = star_rows(degrees, seed=0)
    p = exact_probabilities(w.numpy(), eids, k)
    sampler = LaborSampler(g, [k], weights=w, seed=3)
    seeds = torch.arange(len(degrees))
    kept = np.zeros(w.numel(), dtype=np.int64)
    for _ in range(trials):
        kept += np.bincount(sampler.sample(seeds)[0].edge_ids.numpy(), minlength=w.numel())

    def chi2_sf(p: np.ndarray) -> float:
        sure = p >= 1.0
        assert np.all(kept[sure] == trials)
        x, q = kept[~sure], p[~sure]
        return float(chi2.sf(np.sum((x - trials * q) ** 2 / (trials * q * (1 - q))), df=q.size))

    assert chi2_sf(p) > 1e-3
    # the old kernel's answer (the fixed point cut at MAX_SOLVE_STEPS) fails the same test
    capped = exact_probabilities(w.numpy(), eids, k, cap=MAX_SOLVE_STEPS)
    assert np.any(capped < 1.0) and not np.allclose(capped, p, rtol=0.01)
    sure = capped >= 1.0
    x, q = kept[~sure], capped[~sure]
    assert float(chi2.sf(np.sum((x - trials * q) ** 2 / (trials * q * (1 - q))), df=q.size)) < 1e-6


def test_weighted_labor0_keeps_as_many_edges_per_destination_as_dgl():
    from graphrl.dglshim import dgl_available, import_dgl

    if not dgl_available():
        pytest.skip("DGL not installed (install the 'dgl' extra)")
    dgl = import_dgl()
    degrees, k, trials = [2, 3, 5, 8, 10, 10, 14, 30], 10, 400
    g, w, eids = star_rows(degrees, seed=1)
    dst = np.repeat(np.arange(len(degrees)), degrees)
    src = len(degrees) + np.arange(dst.size)
    dg = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=g.num_nodes)
    dg.edata["w"] = w
    seeds = torch.arange(len(degrees))
    dgl_sampler = dgl.dataloading.LaborSampler([k], prob="w")
    sampler = LaborSampler(g, [k], weights=w, seed=4)
    counts = np.zeros((2, trials, len(degrees)))
    for t in range(trials):
        ours_block = sampler.sample(seeds)[0]
        counts[0, t] = np.diff(ours_block.indptr.numpy())
        block = dgl_sampler.sample_blocks(dg, seeds)[2][0]
        counts[1, t] = np.bincount(block.edges()[1].numpy(), minlength=len(degrees))
    p = exact_probabilities(w.numpy(), eids, k)
    expected = np.array([p[e].sum() for e in eids])
    var = np.array([(p[e] * (1 - p[e])).sum() for e in eids])
    live = var > 0
    mean = counts.mean(axis=1)
    for m in mean:  # each against the exact expectation
        stat = float(np.sum((m - expected)[live] ** 2 / (var[live] / trials)))
        assert chi2.sf(stat, df=int(live.sum())) > 1e-3, (m, expected)
    stat = float(np.sum((mean[0] - mean[1])[live] ** 2 / (2 * var[live] / trials)))
    assert chi2.sf(stat, df=int(live.sum())) > 1e-3, (mean, expected)


SIM_SCRIPT = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # uint64 wrap-around in the simulated RNG
    import numpy as np
    import torch
    from numba import config
    assert config.ENABLE_CUDASIM
    from graphrl.graph import CSCGraph
    from samplers import LaborSampler
    degrees = [3, 10, 8, 11, 25]  # d <= k creeping rows, and d > k
    dst = np.repeat(np.arange(5), degrees)
    src = np.concatenate([5 + np.arange(dst.size - 8), [5, 6, 7, 8, 9, 10, 11, 12]])  # a few shared sources
    w = np.random.default_rng(0).exponential(1.0, dst.size).astype(np.float32) + np.float32(0.05)
    w[13:21] = 0.02
    w[17] = 1.0  # row 2 skewed
    g, tw = CSCGraph.from_edges(src, dst, 5 + dst.size), torch.from_numpy(w)
    seeds = torch.arange(5)
    for imp in (0, 1):
        make = lambda **kw: LaborSampler(g, [10], seed=imp, weights=tw, importance_sampling=imp, **kw)
        a, b = make().sample(seeds), make(device="cuda").sample(seeds)
        for x, y in zip(a, b, strict=True):
            for f in ("src_nodes", "indptr", "indices", "edge_ids", "edge_weights"):
                assert torch.equal(getattr(x, f).cpu(), getattr(y, f).cpu()), (imp, f)
    print("OK")
    """
)


@pytest.mark.slow
@pytest.mark.simulated(SIM_SCRIPT)
def test_cpu_and_cuda_simulator_solve_creeping_rows_alike(simulated_part):
    """The bracketing solve runs compiled on the GPU as on the CPU: the same blocks and edge weights."""
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output

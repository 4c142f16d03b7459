"""Weighted neighbour sampling: argument checks, the counting rules, equality of the numba kernels with the
reference (bit for bit, prefix sums included), and chi-square tests that draws follow the weights, also
where rejection over the prefix sums falls back to its exact draw and where short rows' running sums are
summed afresh (heavy chosen or excluded edges)."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare
from test_neighbor import blocks_equal, edge_endpoints, reference_blocks

from graphrl.graph import CSCGraph
from samplers.kernels import cpu
from samplers.kernels import reference as ref
from samplers.neighbor import NeighborSampler


def check_weighted_blocks(graph, blocks, seeds, fanouts, weights, replace=False, excluded=()):
    """Block contract plus the weighted counting rules (weights indexed by edge id)."""
    src_of, dst_of = edge_endpoints(graph)
    weights = np.asarray(weights, dtype=np.float32)
    excluded = set(int(e) for e in excluded)
    ok = weights > 0
    ok[list(excluded)] = False
    avail_per_node = np.bincount(dst_of[ok], minlength=graph.num_nodes)
    assert torch.equal(blocks[-1].dst_nodes, torch.as_tensor(seeds, dtype=torch.int64))
    for i, (b, k) in enumerate(zip(blocks, fanouts, strict=True)):
        d = b.num_dst_nodes
        assert torch.equal(b.src_nodes[:d], b.dst_nodes)
        if i + 1 < len(blocks):
            assert torch.equal(b.dst_nodes, blocks[i + 1].src_nodes)
        eids = b.edge_ids.numpy()
        assert ok[eids].all(), "an edge of weight 0 (or an excluded edge) was drawn"
        assert np.array_equal(b.src_nodes.numpy()[b.indices.numpy()], src_of[eids])
        assert np.array_equal(b.dst_nodes.numpy()[b.edge_dst().numpy()], dst_of[eids])
        avail = avail_per_node[b.dst_nodes.numpy()]
        if k == -1:
            want = avail
        elif replace:
            want = np.where(avail > 0, k, 0)
        else:
            want = np.minimum(avail, k)
        assert np.array_equal(b.in_degrees().numpy(), want)
        if not replace:
            for v in range(d):
                row = eids[int(b.indptr[v]):int(b.indptr[v + 1])]
                assert len(set(row.tolist())) == row.size


@pytest.fixture
def small_graph() -> CSCGraph:
    """Node 0 has in-edges from 1, 2, 3, 4 (eids 0..3); node 1 from 0, 2 (eids 4, 5); node 2 from 3
    (eid 6)."""
    return CSCGraph.from_edges([1, 2, 3, 4, 0, 2, 3], [0, 0, 0, 0, 1, 1, 2], 5)


# --------------------------------------------------------------------------------------- arguments
def test_bad_weights_raise_value_error_naming_weights(small_graph):
    for bad in (float("nan"), float("inf"), -float("inf"), -0.5):
        w = torch.ones(7)
        w[3] = bad
        with pytest.raises(ValueError, match=r"weights: 1 of 7 weights are negative, NaN or infinite"):
            NeighborSampler(small_graph, [2], weights=w)
    with pytest.raises(ValueError, match=r"weights must have shape \[7\]"):
        NeighborSampler(small_graph, [2], weights=torch.ones(6))
    with pytest.raises(ValueError, match=r"weights must have shape \[7\]"):
        NeighborSampler(small_graph, [2], weights=torch.ones(7, 1))
    with pytest.raises(ValueError, match="weights=True needs a graph with edge weights"):
        NeighborSampler(small_graph, [2], weights=True)
    with pytest.raises(TypeError, match="weights must be a numeric"):
        NeighborSampler(small_graph, [2], weights=np.array(["a"] * 7))
    # finite float64 weights that float32 (the kernels' weight type) turns into inf or 0: before this
    # check a 1e39 weight made every draw take the row's last edge, and 1e-50 rows drew nothing
    for bad in (1e39, 1e-50):
        w = torch.ones(7, dtype=torch.float64)
        w[3] = bad
        msg = "weights: 1 of 7 weights do not fit float32.*first " + re.escape(str(bad))
        with pytest.raises(ValueError, match=msg):
            NeighborSampler(small_graph, [2], weights=w)
    w = torch.ones(7, dtype=torch.float64)
    w[3] = 3e38  # fits
    assert NeighborSampler(small_graph, [2], weights=w, seed=0).weighted


def test_weights_true_uses_the_graph_weights_and_tensors_are_indexed_by_edge_id():
    # edges given out of destination order, so edge ids differ from CSC positions
    src, dst = [1, 2, 3, 0, 4], [0, 1, 0, 1, 0]
    w = [0.0, 1.0, 2.0, 0.0, 0.0]  # node 0: only edge 2 (from 3) has weight; node 1: only edge 1 (from 2)
    graph = CSCGraph.from_edges(src, dst, 5, weights=w)
    assert graph.edge_ids.tolist() != list(range(5))
    for weights in (True, torch.tensor(w), np.array(w, dtype=np.float64)):
        for replace, k in ((False, 2), (False, -1), (True, 3)):
            sampler = NeighborSampler(graph, [k], replace=replace, weights=weights, seed=0)
            b = sampler.sample(torch.tensor([0, 1]))[0]
            per_row = 3 if replace else 1
            assert b.edge_ids.tolist() == [2] * per_row + [1] * per_row
            assert b.src_nodes.tolist() == [0, 1, 3, 2]


def test_counting_rules_and_zero_weight_rows(small_graph):
    w = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.0, 0.0, 2.0])  # node 0: edges 1, 3 positive; node 1: none
    for fanout in (0, 1, 2, 3, -1):
        b = NeighborSampler(small_graph, [fanout], weights=w, seed=1).sample(torch.tensor([0, 1, 2, 4]))[0]
        want0 = {0: 0, 1: 1, 2: 2, 3: 2, -1: 2}[fanout]
        assert b.in_degrees().tolist() == [want0, 0, min(1, fanout) if fanout >= 0 else 1, 0]
        assert set(b.edge_ids.tolist()) <= {1, 3, 6}
        if fanout in (2, 3, -1):
            assert b.edge_ids[:2].tolist() == [1, 3]  # fewer positive edges than k: exactly those, in order
    b = NeighborSampler(small_graph, [5], replace=True, weights=w, seed=1).sample(torch.tensor([0, 1, 2]))[0]
    assert b.in_degrees().tolist() == [5, 0, 5]
    assert set(b.edge_ids[:5].tolist()) <= {1, 3} and b.edge_ids[5:].tolist() == [6] * 5
    zero = NeighborSampler(small_graph, [3, 3], weights=torch.zeros(7), seed=0).sample(torch.tensor([0, 1]))
    assert all(blk.num_edges == 0 for blk in zero)


def test_rows_with_at_most_k_positive_edges_take_exactly_those_in_order():
    # rows of 12 edges: zeros first, last, in runs; k = 7 >= every row's positive count
    pattern = np.array([[0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2], [3, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0]])
    rows, degree = pattern.shape
    graph = CSCGraph.from_edges(rows + np.tile(np.arange(degree), rows), np.repeat(np.arange(rows), degree),
                                rows + degree)
    w = torch.from_numpy(pattern.ravel().astype(np.float32))  # edge id = row * degree + position
    sampler = NeighborSampler(graph, [7], weights=w, seed=2)
    for excluded in (None, torch.tensor([1, 5, 36, 39, 46])):
        b = sampler.sample(torch.arange(rows), exclude_eids=excluded)[0]
        keep = pattern.ravel() > 0
        if excluded is not None:
            keep[excluded.numpy()] = False
        assert b.edge_ids.tolist() == np.flatnonzero(keep).tolist()


def test_weighted_exclusion_removes_edges_before_drawing(small_graph):
    w = torch.tensor([1.0, 1.0, 1.0, 5.0, 1.0, 1.0, 1.0])
    for replace in (False, True):
        sampler = NeighborSampler(small_graph, [2], replace=replace, weights=w, seed=3)
        b = sampler.sample(torch.tensor([0]), exclude_eids=torch.tensor([3, 0]))[0]
        assert b.num_edges == 2 and set(b.edge_ids.tolist()) <= {1, 2}


# ------------------------------------------------------------------------ kernels against the reference
@st.composite
def weighted_cases(draw):
    n = draw(st.integers(1, 40))
    e = draw(st.integers(0, 300))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dst = np.minimum(rng.geometric(draw(st.sampled_from([0.05, 0.3, 0.9])), e) - 1, n - 1)
    graph = CSCGraph.from_edges(rng.integers(0, n, e), dst, n)
    kind = draw(st.sampled_from(["uniform", "skewed", "ints", "tiny"]))
    w = {"uniform": lambda: rng.random(e), "skewed": lambda: rng.pareto(0.7, e),
         "ints": lambda: rng.integers(0, 3, e).astype(np.float64),
         "tiny": lambda: rng.random(e) * 1e-30}[kind]()
    w[rng.random(e) < draw(st.sampled_from([0.0, 0.3, 0.9]))] = 0.0
    seeds = rng.integers(0, n, draw(st.integers(0, 12)))
    fanouts = draw(st.lists(st.sampled_from([-1, 0, 1, 2, 5, 20, 70]), min_size=1, max_size=3))
    replace = draw(st.booleans())
    excluded = rng.integers(0, e, draw(st.integers(0, e))) if e and draw(st.booleans()) else None
    return graph, w, seeds, fanouts, replace, excluded, seed % 1000


@settings(max_examples=100, deadline=None)
@given(weighted_cases())
def test_weighted_cpu_kernels_equal_the_reference(case):
    graph, w, seeds, fanouts, replace, excluded, seed = case
    sampler = NeighborSampler(graph, fanouts, replace=replace, weights=torch.from_numpy(w), seed=seed)
    for call in range(2):
        ex = None if excluded is None else torch.from_numpy(excluded)
        blocks = sampler.sample(torch.from_numpy(seeds), exclude_eids=ex)
        want = reference_blocks(graph, seeds, fanouts, replace, seed, call, excluded, weights=w)
        assert blocks_equal(blocks, want)
        check_weighted_blocks(graph, blocks, seeds, fanouts, w, replace,
                              () if excluded is None else excluded.tolist())


def test_weighted_kernels_equal_the_reference_on_long_rows():
    # rows of 3000 in-edges (heap of 100 keys, prefix sums over 3000) with zero and huge weights
    rows, degree = 6, 3000
    dst = np.repeat(np.arange(rows), degree)
    src = rows + np.tile(np.arange(degree), rows)
    graph = CSCGraph.from_edges(src, dst, rows + degree)
    rng = np.random.default_rng(5)
    w = rng.pareto(1.0, dst.size) * (rng.random(dst.size) < 0.7)
    w[::97] = 1e30
    for replace, k in ((False, 100), (False, 2999), (True, 100)):
        blocks = NeighborSampler(graph, [k], replace=replace, weights=torch.from_numpy(w), seed=8).sample(
            torch.arange(rows))
        assert blocks_equal(blocks, reference_blocks(graph, np.arange(rows), [k], replace, 8, 0, weights=w))
        check_weighted_blocks(graph, blocks, np.arange(rows), [k], w, replace)



@pytest.mark.parametrize("degree", [65, 100, 128, 129, 300, 512, 513, 1500])
@pytest.mark.parametrize("skew", [False, True])
def test_every_search_of_the_prefix_sums_equals_the_reference(degree, skew):
    # rows of 65-128 edges count in one half, longer ones in a window around the equal-weights guess
    # (narrower up to 512 edges) or bisect to it when the guess misses: skewed weights make it miss
    rows = 8
    dst = np.repeat(np.arange(rows), degree)
    src = rows + np.tile(np.arange(degree), rows)
    graph = CSCGraph.from_edges(src, dst, rows + degree)
    rng = np.random.default_rng(degree)
    w = rng.pareto(0.7, dst.size) if skew else rng.random(dst.size)
    w[rng.random(dst.size) < 0.1] = 0.0
    for replace, k in ((True, 40), (False, 20)):
        blocks = NeighborSampler(graph, [k], replace=replace, weights=torch.from_numpy(w), seed=3).sample(
            torch.arange(rows))
        assert blocks_equal(blocks, reference_blocks(graph, np.arange(rows), [k], replace, 3, 0, weights=w))


# ------------------------------------------------------------------------------ draws follow weights
def _star(rows: int, weights: np.ndarray) -> tuple[CSCGraph, torch.Tensor]:
    """``rows`` destinations 0..rows-1, each with len(weights) in-edges weighted ``weights``."""
    degree = weights.size
    dst = np.repeat(np.arange(rows), degree)
    src = rows + np.tile(np.arange(degree), rows)
    return CSCGraph.from_edges(src, dst, rows + degree), torch.from_numpy(np.tile(weights, rows))


WEIGHTS = np.array([1.0, 2.0, 0.0, 4.0, 0.5, 8.0, 3.0, 0.0, 1.5])


def test_with_replacement_frequencies_are_proportional_to_weights():
    rows, k = 2000, 10
    graph, w = _star(rows, WEIGHTS)
    b = NeighborSampler(graph, [k], replace=True, weights=w, seed=11).sample(torch.arange(rows))[0]
    counts = np.bincount(b.edge_ids.numpy() % WEIGHTS.size, minlength=WEIGHTS.size)
    assert counts[WEIGHTS == 0].sum() == 0
    pos = WEIGHTS > 0
    expected = WEIGHTS[pos] / WEIGHTS.sum() * rows * k
    assert chisquare(counts[pos], expected).pvalue > 1e-4


def test_without_replacement_single_draw_is_proportional_to_weights():
    rows = 20_000
    graph, w = _star(rows, WEIGHTS)
    b = NeighborSampler(graph, [1], weights=w, seed=12).sample(torch.arange(rows))[0]
    counts = np.bincount(b.edge_ids.numpy() % WEIGHTS.size, minlength=WEIGHTS.size)
    pos = WEIGHTS > 0
    assert counts[~pos].sum() == 0
    assert chisquare(counts[pos], WEIGHTS[pos] / WEIGHTS.sum() * rows).pvalue > 1e-4


def test_without_replacement_pairs_follow_successive_weighted_draws():
    # A-ES draws a k-subset with the law of k successive weighted draws without replacement:
    # P({i, j}) = w_i / W * w_j / (W - w_i) + w_j / W * w_i / (W - w_j)
    wts = np.array([1.0, 2.0, 3.0, 6.0])
    rows = 20_000
    graph, w = _star(rows, wts)
    b = NeighborSampler(graph, [2], weights=w, seed=13).sample(torch.arange(rows))[0]
    pairs = b.edge_ids.numpy().reshape(rows, 2) % wts.size
    observed = {p: 0 for p in itertools.combinations(range(4), 2)}
    for p in map(tuple, pairs.tolist()):
        observed[p] += 1
    total = wts.sum()
    expected = [rows * wts[i] * wts[j] / total * (1 / (total - wts[i]) + 1 / (total - wts[j]))
                for i, j in observed]
    assert chisquare(list(observed.values()), expected).pvalue > 1e-4


def test_equal_weights_give_uniform_subsets():
    rows = 20_000
    graph, w = _star(rows, np.full(5, 0.25))
    b = NeighborSampler(graph, [2], weights=w, seed=14).sample(torch.arange(rows))[0]
    pairs = b.edge_ids.numpy().reshape(rows, 2) % 5
    counts = np.unique(pairs[:, 0] * 5 + pairs[:, 1], return_counts=True)[1]
    assert counts.size == 10 and chisquare(counts).pvalue > 1e-4


# ------------------------------------------------------- weighted rows: rejection over prefix sums
def _successive_subset_probs(wts: np.ndarray, k: int) -> dict[tuple[int, ...], float]:
    """Exact probability of every k-subset under k successive weighted draws without replacement."""
    probs: dict[tuple[int, ...], float] = {}
    for seq in itertools.permutations(range(wts.size), k):
        p, left = 1.0, float(wts.sum())
        for i in seq:
            p *= wts[i] / left
            left -= wts[i]
        key = tuple(sorted(seq))
        probs[key] = probs.get(key, 0.0) + p
    return probs


def test_weight_prefix_equals_the_reference():
    rng = np.random.default_rng(3)
    n, e = 300, 5000
    dst = np.sort(np.minimum(rng.geometric(0.01, e) - 1, n - 1))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    w = (rng.pareto(0.8, e) * (rng.random(e) < 0.8)).astype(np.float32)
    w[::7] = 1e-30
    want_p, want_nz = ref.weight_prefix(indptr, w)
    for threads in (1, 2):
        got_p, got_nz = cpu.weight_prefix(indptr, w, threads)
        assert np.array_equal(got_p.view(np.int64), want_p.view(np.int64))  # bit for bit
        assert np.array_equal(got_nz, want_nz)


def test_heavy_edge_rows_follow_successive_sampling():
    # One weight of 1e6 among small ones, k = d_e - 1 (a short row: running sums): the heavy edge is drawn
    # first, after which the running sums are summed afresh over the light edges (the subtraction alone
    # would leave rounding noise of 1e6's size). The left-out edge must follow successive-sampling
    # probabilities. (Long rows with heavy edges, where rejection falls back, are the tests below.)
    wts = np.array([1.0, 1e6, 2.0, 0.0, 3.0, 4.0])
    pos = np.flatnonzero(wts > 0)
    k = pos.size - 1
    rows = 20_000
    graph, w = _star(rows, wts)
    b = NeighborSampler(graph, [k], weights=w, seed=21).sample(torch.arange(rows))[0]
    chosen = b.edge_ids.numpy().reshape(rows, k) % wts.size
    left_out = [int(next(iter(set(pos.tolist()) - set(r)))) for r in chosen.tolist()]
    observed = np.bincount(left_out, minlength=wts.size)
    probs = _successive_subset_probs(wts[pos], k)  # subsets of indices into pos
    expected = np.zeros(wts.size)
    for subset, p in probs.items():
        expected[pos[sorted(set(range(pos.size)) - set(subset))[0]]] += p * rows
    assert observed[1] <= 2 and observed[3] == 0  # the heavy edge is (almost) never left out
    light = [0, 2, 4, 5]
    exp_light = expected[light] / expected[light].sum() * observed[light].sum()
    assert chisquare(observed[light], exp_light).pvalue > 1e-4, (observed, expected)
    # the kernel equals the reference on such rows (the fallback included)
    small = NeighborSampler(graph, [k], weights=w, seed=21).sample(torch.arange(200))
    assert blocks_equal(small, reference_blocks(graph, np.arange(200), [k], False, 21, weights=w.numpy()))


def test_excluded_heavy_edges_fall_back_exactly():
    # The excluded edge holds nearly all of each row's weight: with replacement attempts keep landing on
    # it, so outputs come from the fallback over the eligible edges, each draw proportional to the weights;
    # without replacement (a short row) the running sums leave it out, and pairs follow successive draws
    # over the eligible edges.
    wts = np.array([1.0, 1e6, 2.0, 3.0, 4.0])
    rows = 8000
    graph, w = _star(rows, wts)
    heavy = torch.arange(rows) * wts.size + 1  # edge ids of the heavy edges (the star's ids follow rows)
    assert torch.equal(graph.csc_edge_ids()[heavy], heavy)
    b = NeighborSampler(graph, [6], replace=True, weights=w, seed=22).sample(torch.arange(rows),
                                                                           exclude_eids=heavy)[0]
    counts = np.bincount(b.edge_ids.numpy() % wts.size, minlength=wts.size)
    light = [0, 2, 3, 4]
    assert counts[1] == 0
    assert chisquare(counts[light], wts[light] / wts[light].sum() * rows * 6).pvalue > 1e-4
    b = NeighborSampler(graph, [2], weights=w, seed=23).sample(torch.arange(rows), exclude_eids=heavy)[0]
    pairs = b.edge_ids.numpy().reshape(rows, 2) % wts.size
    assert not (pairs == 1).any()
    probs = _successive_subset_probs(wts[light], 2)
    observed = {s: 0 for s in probs}
    for i, j in pairs.tolist():
        observed[(light.index(i), light.index(j))] += 1
    assert chisquare(list(observed.values()), [rows * probs[s] for s in observed]).pvalue > 1e-4


@pytest.mark.parametrize("degree", [40, 300, 5000])  # the kernel's paths: a register mask, a bitmap, a scan
def test_weighted_rows_with_exclusions_and_fallbacks_equal_the_reference(degree):
    rows = 4
    dst = np.repeat(np.arange(rows), degree)
    src = rows + np.tile(np.arange(degree), rows)
    graph = CSCGraph.from_edges(src, dst, rows + degree)
    rng = np.random.default_rng(degree)
    w = rng.random(dst.size) * (rng.random(dst.size) < 0.8)
    w[::degree // 4] = 1e6  # a few heavy edges per row: chosen first, then attempts land on them again
    heavy = np.flatnonzero(w == 1e6)
    excluded = np.concatenate([heavy[::2], rng.integers(0, dst.size, degree // 10)])
    for replace, k in ((False, 5), (False, 30), (False, 100), (True, 40)):
        if k >= degree:
            continue
        sampler = NeighborSampler(graph, [k], replace=replace, weights=torch.from_numpy(w), seed=degree)
        for ex in (None, excluded):
            ex_t = None if ex is None else torch.from_numpy(ex)
            blocks = sampler.sample(torch.arange(rows), exclude_eids=ex_t)
            want = reference_blocks(graph, np.arange(rows), [k], replace, degree, sampler._calls - 1, ex,
                                    weights=w)
            assert blocks_equal(blocks, want), (replace, k, ex is not None)
            check_weighted_blocks(graph, blocks, np.arange(rows), [k], w, replace,
                                  () if ex is None else ex.tolist())


def test_sample_layer_computes_prefix_sums_for_its_rows():
    # cpu.sample_layer (HeteroNeighborSampler's call) without precomputed P / nz computes them for its rows
    # (duplicates included); with them given, the same result
    rng = np.random.default_rng(9)
    n, e = 30, 600
    graph = CSCGraph.from_edges(rng.integers(0, n, e), np.minimum(rng.geometric(0.08, e) - 1, n - 1), n)
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
    w = (rng.random(e) * (rng.random(e) < 0.7)).astype(np.float32)
    dst = np.array([0, 3, 3, 1, 29, 0, 7], dtype=np.int64)
    excluded = np.unique(rng.integers(0, e, 60))
    key = ref.layer_key(5, 0, 0)
    prefix, positive = cpu.weight_prefix(indptr, w)
    for replace, k in ((False, 3), (False, 12), (True, 4), (False, -1)):
        want = ref.sample_layer(indptr, indices, None, dst, k, replace, key, excluded, w)
        for kw in ({}, {"prefix": prefix, "positive": positive}):
            got = cpu.sample_layer(indptr, indices, None, dst, k, replace, key, excluded, 1, w, **kw)
            assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), (replace, k, kw.keys())


@st.composite
def skewed_rows(draw):
    """Star rows with a few huge weights, fanouts near the eligible count and excluded heavy edges: the
    cases where rejection hits its limit."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    degree = draw(st.sampled_from([3, 9, 17, 64, 65, 130]))
    rows = draw(st.integers(1, 4))
    w = rng.random(rows * degree) * (rng.random(rows * degree) < draw(st.sampled_from([0.5, 0.9, 1.0])))
    w[rng.random(w.size) < 0.1] = draw(st.sampled_from([1e6, 1e30]))
    k = max(0, degree - draw(st.integers(0, 3)))
    excluded = np.flatnonzero(w >= 1e6)[:: draw(st.integers(1, 3))] if draw(st.booleans()) else None
    return degree, rows, w, k, draw(st.booleans()), excluded, seed % 1000


@settings(max_examples=40, deadline=None)
@given(skewed_rows())
def test_skewed_rows_equal_the_reference(case):
    degree, rows, w, k, replace, excluded, seed = case
    dst = np.repeat(np.arange(rows), degree)
    graph = CSCGraph.from_edges(rows + np.tile(np.arange(degree), rows), dst, rows + degree)
    sampler = NeighborSampler(graph, [k], replace=replace, weights=torch.from_numpy(w), seed=seed)
    ex = None if excluded is None else torch.from_numpy(excluded)
    blocks = sampler.sample(torch.arange(rows), exclude_eids=ex)
    assert blocks_equal(blocks, reference_blocks(graph, np.arange(rows), [k], replace, seed, 0, excluded,
                                                 weights=w))
    check_weighted_blocks(graph, blocks, np.arange(rows), [k], w, replace,
                          () if excluded is None else excluded.tolist())

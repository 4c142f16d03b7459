"""samplers.full_graph_plan: plans that multiply exactly (a numpy executor against scipy), fit their slots
and cache, are deterministic, and a dedup cache that pays on Gowalla's user-item graph."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.datasets import load_gowalla
from graphrl.kernels.ordering import rcm_order
from graphrl.kernels.spmm import normalized_adjacency
from graphrl.memory import MemoryBudgetError
from samplers.full_graph_bytes import arena_offsets
from samplers.full_graph_plan import PlanCache, locality_order, plan_propagation


def sym_p(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """D^-1/2 (A + I) D^-1/2 of edges src -> dst as CSR arrays by destination (FullGraph's P)."""
    a = sp.csr_matrix((np.ones(len(src)), (dst, src)), shape=(n, n))
    a.sum_duplicates()
    indptr, indices = a.indptr.astype(np.int64), a.indices.astype(np.int32)
    values = a.data.astype(np.float32)
    deg_in = np.asarray(a.sum(1)).ravel() + 1
    deg_out = np.asarray(a.sum(0)).ravel() + 1
    nnz = indices.shape[0] + n
    out = (np.empty(n + 1, np.int64), np.empty(nnz, np.int32), np.empty(nnz, np.float32))
    normalized_adjacency(indptr, indices, values, True, deg_in ** -0.5, deg_out ** -0.5, out=out)
    return out


def run_plan(plan, h: np.ndarray, n: int) -> np.ndarray:
    """What the staged executor does, in numpy: the cache, then each partition's slot, local CSR, output."""
    c = len(plan.cache)
    buf = np.zeros((c + 2 * plan.max_stream, h.shape[1]), h.dtype)
    buf[:c] = h[plan.cache]
    out = np.zeros((n, h.shape[1]), h.dtype)
    for part in plan.parts:
        lo = c + part.slot * plan.max_stream
        buf[lo:lo + part.stream.shape[0]] = h[part.stream]
        local = sp.csr_matrix((part.weights.astype(h.dtype), part.cols, part.indptr),
                              shape=(part.rows.shape[0], buf.shape[0]))
        rows_out = local @ buf
        add = part.add if part.add is not None else np.zeros(part.rows.shape[0], bool)
        out[part.rows[~add]] = rows_out[~add]
        np.add.at(out, part.rows[add], rows_out[add])
    return out


def check_fits(plan, budget: int, slot_bytes: int | None) -> None:
    """Every partition within its slot (arena and streamed rows), the working set within the budget."""
    rb = plan.row_bytes
    assert plan.src_bytes + 2 * plan.arena_bytes == plan.device_bytes <= budget
    assert len(plan.cache) * rb <= budget - 2 * plan.arena_bytes
    for part in plan.parts:
        r, e, s = part.rows.shape[0], part.cols.shape[0], part.stream.shape[0]
        assert arena_offsets(r, e, rb)[4] <= plan.arena_bytes and s <= plan.max_stream
        if slot_bytes is not None:
            assert arena_offsets(r, e, rb)[4] + s * rb <= slot_bytes
        assert np.unique(part.stream).shape[0] == s and not np.isin(part.stream, plan.cache).any()
        assert part.cols.max(initial=-1) < len(plan.cache) + 2 * plan.max_stream


def h2d(plan) -> int:
    return plan.moved_bytes() - sum(p.rows.shape[0] for p in plan.parts) * plan.row_bytes


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), m=st.integers(0, 400), width=st.integers(1, 8), budget=st.integers(1200, 60000),
       slot=st.one_of(st.none(), st.integers(600, 20000)), seed=st.integers(0, 2**16), dedup=st.booleans(),
       parts=st.one_of(st.none(), st.integers(1, 6)))
def test_plans_multiply_exactly_and_fit(n, m, width, budget, slot, seed, dedup, parts):
    rng = np.random.default_rng(seed)
    src = (rng.pareto(1.0, m) * 2).astype(np.int64) % n  # a few hubs
    p = sym_p(src, rng.integers(0, n, m), n)
    ref = sp.csr_matrix((p[2], p[1], p[0]), shape=(n, n))
    h = rng.standard_normal((n, width))
    order = locality_order(p[0], p[1], n)
    try:
        plan = plan_propagation(*p, order, width, 8, budget, dedup, slot_bytes=slot, partitions=parts)
    except MemoryBudgetError:  # one entry does not fit a slot, or the asked partitions do not fit
        return
    check_fits(plan, budget, slot if parts is None else None)
    np.testing.assert_allclose(run_plan(plan, h, n), ref @ h, rtol=1e-6, atol=1e-9)
    if not dedup:
        assert len(plan.cache) == 0
    elif parts is None:
        plain = plan_propagation(*p, order, width, 8, budget, False, slot_bytes=slot)
        assert plan.vertex_bytes() <= plain.vertex_bytes() and plan.moved_bytes() <= plain.moved_bytes()


@pytest.mark.parametrize("dedup", [False, True])
def test_a_split_row_in_a_matrix_that_fits_one_slot_by_its_size(dedup):
    """2 nodes, 9 entries (repeated edges) in row 1, d = 4 float64, 1500 B: row 1 is split into pieces
    while the whole matrix looked small enough for one slot; row 0 must stay in the plan."""
    rng = np.random.default_rng(0)
    p = (np.array([0, 1, 10]), np.array([0, 1, 0, 1, 1, 1, 0, 0, 1, 1], np.int32),  # repeated entries
         rng.random(10).astype(np.float32))
    h = rng.standard_normal((2, 4))
    plan = plan_propagation(*p, locality_order(p[0], p[1], 2), 4, 8, 1500, dedup)
    assert plan.split_rows.tolist() == [1]
    check_fits(plan, 1500, None)
    np.testing.assert_allclose(run_plan(plan, h, 2), sp.csr_matrix((p[2], p[1], p[0]), shape=(2, 2)) @ h,
                               rtol=1e-6, atol=1e-9)


def test_plans_are_deterministic():
    rng = np.random.default_rng(0)
    n = 3000
    p = sym_p((rng.pareto(1.0, 30000) * 5).astype(np.int64) % n, rng.integers(0, n, 30000), n)
    order = locality_order(p[0], p[1], n)
    assert np.array_equal(order, locality_order(p[0], p[1], n))
    a, b = (plan_propagation(*p, order, 16, 4, 200_000, True) for _ in range(2))
    assert a.num_partitions == b.num_partitions > 2 and len(a.cache) > 0
    assert np.array_equal(a.cache, b.cache) and np.array_equal(a.split_rows, b.split_rows)
    for x, y in zip(a.parts, b.parts, strict=True):
        for f in ("rows", "indptr", "cols", "weights", "stream"):
            assert np.array_equal(getattr(x, f), getattr(y, f))
        assert (x.slot, x.cache_reads) == (y.slot, y.cache_reads)


def assert_same_plan(a, b) -> None:
    assert a.num_partitions == b.num_partitions
    assert np.array_equal(a.cache, b.cache) and np.array_equal(a.split_rows, b.split_rows)
    for f in ("max_stream", "max_rows", "arena_bytes", "device_bytes", "row_bytes"):
        assert getattr(a, f) == getattr(b, f)
    for x, y in zip(a.parts, b.parts, strict=True):
        for f in ("rows", "indptr", "cols", "weights", "stream"):
            assert np.array_equal(getattr(x, f), getattr(y, f)) and getattr(x, f).dtype == getattr(y, f).dtype
        assert (x.slot, x.cache_reads) == (y.slot, y.cache_reads)
        assert (x.add is None) == (y.add is None) and (x.add is None or np.array_equal(x.add, y.add))


@pytest.mark.parametrize(("width", "budget", "slot", "hub_rows"),
                         [(16, 200_000, None, False), (4, 400_000, 20_000, False), (64, 90_000, None, False),
                          (1, 1 << 30, None, False), (16, 200_000, None, True), (8, 60_000, 12_000, True)])
def test_plans_do_not_depend_on_threads_or_a_shared_cache(width, budget, slot, hub_rows):
    """The same plan, bitwise, on 1 or 3 threads with pieces of work as small as 16 entries (chunks of
    rows merged in order), with one PlanCache shared over widths or none; multiplies exactly. With
    ``hub_rows`` some destinations read hundreds of sources (rows split over partitions)."""
    rng = np.random.default_rng(3)
    n = 3000
    hubs, spread = (rng.pareto(1.0, 30000) * 5).astype(np.int64) % n, rng.integers(0, n, 30000)
    p = sym_p(spread, hubs, n) if hub_rows else sym_p(hubs, spread, n)
    order = locality_order(p[0], p[1], n)
    shared = PlanCache(threads=3, min_chunk=16)
    plan_propagation(*p, order, 7, 4, budget, True, cache=shared)  # an earlier width fills the cache
    caches = (None, PlanCache(threads=1), PlanCache(threads=3, min_chunk=16), shared)
    plans = [plan_propagation(*p, order, width, 4, budget, dedup, slot_bytes=slot, cache=c)
             for dedup in (True, False) for c in caches]
    for q in plans[1:4]:
        assert_same_plan(plans[0], q)
    for q in plans[5:]:
        assert_same_plan(plans[4], q)
    h = rng.standard_normal((n, 3))
    ref = sp.csr_matrix((p[2], p[1], p[0]), shape=(n, n)) @ h
    assert (plans[0].num_partitions > 2) == (budget < 1 << 30)
    assert (plans[0].split_rows.shape[0] > 0) == hub_rows
    for plan in (plans[0], plans[4]):
        check_fits(plan, budget, slot)
        np.testing.assert_allclose(run_plan(plan, h, n), ref, rtol=1e-6, atol=1e-9)
    fixed = [plan_propagation(*p, order, width, 4, 1 << 30, True, partitions=5, cache=c)
             for c in (None, PlanCache(threads=2, min_chunk=16))]
    assert_same_plan(*fixed)


def test_a_plan_cache_serves_one_matrix():
    rng = np.random.default_rng(0)
    p = sym_p(rng.integers(0, 50, 200), rng.integers(0, 50, 200), 50)
    order = locality_order(p[0], p[1], 50)
    cache = PlanCache()
    plan_propagation(*p, order, 4, 4, 1 << 20, True, cache=cache)
    with pytest.raises(ValueError, match="PlanCache"):
        plan_propagation(p[0], p[1].copy(), p[2], order, 4, 4, 1 << 20, True, cache=cache)
    with pytest.raises(ValueError, match="threads"):
        PlanCache(threads=0)


def test_rcm_order_is_a_permutation_with_a_small_bandwidth():
    """A path graph numbered at random: RCM recovers an order of bandwidth 1 (as scipy's does)."""
    n = 500
    perm = np.random.default_rng(1).permutation(n)
    a = sp.csr_matrix((np.ones(n - 1), (perm[:-1], perm[1:])), shape=(n, n))
    order = rcm_order(a.indptr.astype(np.int64), a.indices, n)
    assert np.array_equal(np.sort(order), np.arange(n))
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    rows, cols = a.nonzero()
    assert np.abs(pos[rows] - pos[cols]).max() == 1
    assert rcm_order(np.zeros(1, np.int64), np.zeros(0, np.int32), 0).shape == (0,)


def test_dedup_moves_at_most_three_quarters_on_gowalla(data_root):
    """Gowalla's user-item graph (LightGCN's symmetric P), d = 64 float32, 1 MiB slots in a 16 MiB device
    budget: dedup moves at most 0.75x the host-to-device bytes of dedup=False (same order and budget)."""
    try:
        graph = load_gowalla(data_root).graph
    except FileNotFoundError as err:
        pytest.skip(f"needs the Gowalla data folder (GRAPHRL_DATA/gowalla): {err}")
    n = graph.num_nodes
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
    deg = np.diff(indptr).astype(np.float64) + 1
    p = (np.empty(n + 1, np.int64), np.empty(indices.shape[0] + n, indices.dtype),
         np.empty(indices.shape[0] + n, np.float32))
    normalized_adjacency(indptr, indices, None, True, deg ** -0.5, deg ** -0.5, out=p)
    order = locality_order(p[0], p[1], n)
    plans = {dd: plan_propagation(*p, order, 64, 4, 16 << 20, dd, slot_bytes=1 << 20) for dd in (False, True)}
    for plan in plans.values():
        check_fits(plan, 16 << 20, 1 << 20)
    assert h2d(plans[True]) <= 0.75 * h2d(plans[False]), (h2d(plans[True]), h2d(plans[False]))
    h = np.random.default_rng(0).standard_normal((n, 2)).astype(np.float32)
    ref = sp.csr_matrix((p[2], p[1], p[0]), shape=(n, n)) @ h
    np.testing.assert_allclose(run_plan(plans[True], h, n), ref, rtol=1e-5, atol=1e-6)

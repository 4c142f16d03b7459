"""FullGraph: partitioned propagation against scipy, gradients, partition counts, budgets and errors."""

from __future__ import annotations

import gc

import numba
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from graphrl.datasets import load_planetoid, synthetic_graph
from graphrl.graph import CSCGraph
from graphrl.memory import MemoryBudgetError, MemoryManager
from samplers import FullGraph
from samplers.full_graph import OWNER, OWNER_ADJ, OWNER_VERTEX


def adjacency(graph: CSCGraph) -> sp.csr_matrix:
    """A[v, u] = number (or weight) of edges u -> v, float64, from the CSC arrays."""
    n = graph.num_nodes
    values = np.ones(graph.num_edges) if graph.weights is None else graph.weights.numpy().astype(np.float64)
    return sp.csr_matrix((values, graph.indices.numpy(), graph.indptr.numpy()), shape=(n, n))


def reference(graph: CSCGraph, normalization: str = "sym", self_loops: bool = True) -> sp.csr_matrix:
    """diag(s_dst) (A + I) diag(s_src) with degrees counted on A + I (in-degree rows, out-degree columns)."""
    a = adjacency(graph)
    if self_loops:
        a = a + sp.eye(graph.num_nodes)
    d_in = np.asarray(a.sum(1)).ravel()
    d_out = np.asarray(a.sum(0)).ravel()

    def power(d, p):
        with np.errstate(divide="ignore"):
            out = np.where(d > 0, d ** p, 0.0)
        return out

    p_dst, p_src = {"sym": (-0.5, -0.5), "left": (-1, 0), "right": (0, -1), "none": (0, 0)}[normalization]
    return (sp.diags(power(d_in, p_dst) if p_dst else np.ones_like(d_in)) @ a
            @ sp.diags(power(d_out, p_src) if p_src else np.ones_like(d_out))).tocsr()


def partition_bytes_for(fg: FullGraph, parts: int, width: int, transpose: bool = False,
                        dtype: torch.dtype = torch.float32) -> int:
    """Smallest partition_bytes that gives at most ``parts`` partitions (binary search, monotone)."""
    lo, hi = 1, 1 << 40
    while lo < hi:
        mid = (lo + hi) // 2
        fg.partition_bytes = mid
        try:
            count = fg.num_partitions(width, dtype, transpose=transpose)
        except MemoryBudgetError:
            count = None
        if count is not None and count <= parts:
            hi = mid
        else:
            lo = mid + 1
    fg.partition_bytes = lo
    return lo


@pytest.fixture(scope="module")
def cora(data_root):
    return load_planetoid("cora", data_root)


@pytest.fixture(scope="module")
def random_graph():
    # directed, with parallel edges and self-loops already present: P != P^T
    return synthetic_graph(3000, 30000, "powerlaw", seed=3)


@pytest.fixture
def mm():
    with MemoryManager(device="cpu") as manager:
        yield manager


def test_symmetric_graph_is_detected(cora, random_graph, mm):
    assert FullGraph(cora.graph, memory=mm).symmetric
    assert not FullGraph(random_graph, memory=mm).symmetric


@pytest.mark.parametrize("parts", [1, 2, 7])
@pytest.mark.parametrize("which", ["cora", "random"])
def test_propagate_and_backward_equal_scipy(parts, which, request, mm):
    graph = request.getfixturevalue("cora").graph if which == "cora" else request.getfixturevalue(
        "random_graph")
    fg = FullGraph(graph, memory=mm)
    width = 16
    partition_bytes_for(fg, parts, width)
    assert fg.num_partitions(width) == parts
    ref = reference(graph)
    gen = torch.Generator().manual_seed(parts)
    h = torch.randn(graph.num_nodes, width, generator=gen, requires_grad=True)
    out = fg.propagate(h)
    assert fg.last_partitions == parts
    np.testing.assert_allclose(out.detach().numpy(), ref @ h.detach().double().numpy(), rtol=1e-5, atol=1e-6)
    grad = torch.randn(graph.num_nodes, width, generator=gen)
    out.backward(grad)
    np.testing.assert_allclose(h.grad.numpy(), ref.T @ grad.double().numpy(), rtol=1e-5, atol=1e-6)


def test_backward_is_partitioned_too(random_graph, mm):
    fg = FullGraph(random_graph, memory=mm)
    partition_bytes_for(fg, 5, 8, transpose=True)
    assert fg.num_partitions(8, transpose=True) == 5
    h = torch.randn(random_graph.num_nodes, 8, requires_grad=True)
    fg.propagate(h).sum().backward()
    assert fg.last_partitions == 5  # the last propagation was the transposed one
    expected = reference(random_graph).T @ np.ones((random_graph.num_nodes, 8))
    np.testing.assert_allclose(h.grad.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_results_do_not_depend_on_partitions_or_threads(random_graph, mm):
    fg = FullGraph(random_graph, memory=mm, partition_bytes=None)
    h = torch.randn(random_graph.num_nodes, 40, generator=torch.Generator().manual_seed(0))
    one = fg.propagate(h)
    partition_bytes_for(fg, 7, 40)
    seven = fg.propagate(h)
    assert fg.last_partitions == 7
    assert torch.equal(one, seven)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single = fg.propagate(h)
    finally:
        numba.set_num_threads(before)
    assert torch.equal(one, single)


@pytest.mark.parametrize("normalization", ["sym", "left", "right", "none"])
@pytest.mark.parametrize("self_loops", [True, False])
def test_normalizations(normalization, self_loops, random_graph, mm):
    fg = FullGraph(random_graph, normalization=normalization, add_self_loops=self_loops, memory=mm)
    h = torch.randn(random_graph.num_nodes, 3, dtype=torch.float64)
    ref = reference(random_graph, normalization, self_loops) @ h.numpy()
    np.testing.assert_allclose(fg.propagate(h).numpy(), ref, rtol=1e-5, atol=1e-6)
    assert fg.num_entries == random_graph.num_edges + (random_graph.num_nodes if self_loops else 0)


def test_weighted_graph(mm):
    graph = CSCGraph.from_edges([0, 1, 2, 2], [1, 2, 0, 1], 3, weights=[0.5, 2.0, 1.0, 3.0])
    fg = FullGraph(graph, memory=mm)
    h = torch.randn(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    # float32 normalised entries: ~1e-7 relative error each, so an output near zero (cancellation) needs atol
    np.testing.assert_allclose(fg.propagate(h).numpy(), reference(graph) @ h.numpy(), rtol=1e-6, atol=1e-6)


def test_gradcheck_float64_tiny_graph(mm):
    graph = CSCGraph.from_edges([0, 1, 1, 2, 3, 4, 4, 5, 0], [1, 0, 2, 3, 2, 5, 0, 4, 0], 6)
    for parts in (1, 3):
        fg = FullGraph(graph, memory=mm)
        partition_bytes_for(fg, parts, 3, dtype=torch.float64)
        assert fg.num_partitions(3, torch.float64) == parts
        h = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(fg.propagate, (h,))
        assert torch.autograd.gradgradcheck(fg.propagate, (h,))


def test_partition_count_follows_partition_bytes_and_width(cora, mm):
    fg = FullGraph(cora.graph, memory=mm, partition_bytes=None)
    n, nnz = cora.num_nodes, fg.num_entries
    whole = 8 * (n + 1) + 8 * nnz + n * 16 * 4 + 192  # indptr, int32 indices + float32 weights, output
    fg.partition_bytes = whole
    assert fg.num_partitions(16) == 1
    assert fg.num_partitions(16, torch.float64) == 2  # wider items, more partitions
    fg.partition_bytes = whole - 1
    assert fg.num_partitions(16) == 2
    counts = []
    for budget in ("64KiB", "256KiB", "1MiB"):
        fg.partition_bytes = budget  # strings too, through parse_size
        counts.append([fg.num_partitions(w) for w in (4, 16, 64)])
    for row in counts:
        assert row == sorted(row)  # wider features: more partitions
    assert counts[0][1] > counts[1][1] >= counts[2][1]  # bigger partitions: fewer of them
    bounds = fg.partitions(16)
    assert bounds[0] == 0 and bounds[-1] == n and np.all(np.diff(bounds) > 0)


def test_device_budget_bounds_the_peak(cora):
    budget = 96 * 1024
    with MemoryManager(budgets={"device": budget}, device="cpu") as mm:
        fg = FullGraph(cora.graph, memory=mm, partition_bytes="1GiB")  # the device budget is the limit
        h = torch.randn(cora.num_nodes, 64, requires_grad=True)
        out = fg.propagate(h)
        assert fg.last_partitions > 1
        out.backward(torch.ones_like(out))
        stats = mm.stats()
        assert 0 < stats["device"][OWNER]["peak"] <= budget
        np.testing.assert_allclose(out.detach().numpy(), reference(cora.graph) @ h.detach().double().numpy(),
                                   rtol=1e-5, atol=1e-6)
        # vertex data and the adjacency live on the host tier
        assert stats["host"][OWNER_ADJ]["bytes"] > 0
        assert stats["host"][OWNER_VERTEX]["peak"] >= cora.num_nodes * 64 * 4
        fg.release()
        assert mm.stats()["device"][OWNER]["bytes"] == 0
        del out, h
        gc.collect()
        assert mm.stats()["host"][OWNER_VERTEX]["bytes"] == 0
        fg.close()
        assert mm.stats()["host"][OWNER_ADJ]["bytes"] == 0


def test_one_partition_that_cannot_fit_says_what_would(cora, mm):
    fg = FullGraph(cora.graph, memory=mm, partition_bytes=1024)
    h = torch.randn(cora.num_nodes, 64)
    with pytest.raises(MemoryBudgetError) as info:
        fg.propagate(h)
    err = info.value
    max_deg = int(np.diff(cora.graph.indptr.numpy()).max()) + 1  # + its self-loop
    need = 16 + 192 + (8 + 64 * 4) + 8 * max_deg
    assert err.asked == need and err.free == mm.free_bytes("device")  # the tier's; the cap is in the note
    assert "one partition cannot fit" in str(err) and f"at least {need} bytes" in str(err)
    assert "needs more than the 1024 bytes allowed (partition_bytes=1024" in str(err)
    fg.partition_bytes = need  # what the message asked for works
    np.testing.assert_allclose(fg.propagate(h).numpy(), reference(cora.graph) @ h.double().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_device_tier_without_room_for_the_working_set(cora):
    with MemoryManager(budgets={"device": 4096}, device="cpu") as mm:
        blocker = mm.allocate(4096, torch.uint8, "device", owner="someone.else")
        fg = FullGraph(cora.graph, memory=mm)
        with pytest.raises(MemoryBudgetError, match="one partition cannot fit"):
            fg.propagate(torch.randn(cora.num_nodes, 8))
        blocker.free()
        out = fg.propagate(torch.randn(cora.num_nodes, 8))  # room again
        assert out.shape == (cora.num_nodes, 8)
        assert mm.stats()["device"][OWNER]["peak"] <= 4096


def test_bad_arguments(cora, mm):
    with pytest.raises(TypeError, match="CSCGraph"):
        FullGraph("cora")
    with pytest.raises(ValueError, match="normalization"):
        FullGraph(cora.graph, normalization="both", memory=mm)
    with pytest.raises(ValueError, match="partition_bytes"):
        FullGraph(cora.graph, partition_bytes=0, memory=mm)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        FullGraph(cora.graph, device="meta", memory=mm)
    with pytest.raises(ValueError, match="cache_share"):
        FullGraph(cora.graph, dedup=True, cache_share=1.0, memory=mm)
    with pytest.raises(ValueError, match="reorder"):
        FullGraph(cora.graph, dedup=True, reorder="metis", memory=mm)
    with pytest.raises(ValueError, match="partitions"):
        FullGraph(cora.graph, dedup=True, partitions=0, memory=mm)
    with pytest.raises(ValueError, match="partitions applies to the staged path"):
        FullGraph(cora.graph, partitions=2, memory=mm)
    with pytest.raises(TypeError, match="dedup"):
        FullGraph(cora.graph, dedup="yes", memory=mm)
    for bad in ("x", None, True):
        with pytest.raises(TypeError, match=r"cache_share must be a float in \[0, 1\), got"):
            FullGraph(cora.graph, dedup=True, cache_share=bad, memory=mm)
    with pytest.raises(TypeError, match="add_self_loops must be True or False, got 'no'"):
        FullGraph(cora.graph, add_self_loops="no", memory=mm)
    fg = FullGraph(cora.graph, memory=mm)
    with pytest.raises(ValueError, match="num_nodes=2708"):
        fg.propagate(torch.randn(10, 4))
    with pytest.raises(TypeError, match="float32 or float64"):
        fg.propagate(torch.ones(cora.num_nodes, 4, dtype=torch.int64))
    fg.close()
    fg.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        fg.propagate(torch.randn(cora.num_nodes, 4))


def test_empty_and_zero_width(mm):
    graph = CSCGraph.from_edges([0], [1], 3)
    fg = FullGraph(graph, memory=mm)
    assert fg.propagate(torch.randn(3, 0)).shape == (3, 0)
    fg2 = FullGraph(graph, add_self_loops=False, memory=mm)  # node 2 has no edge at all: zero row
    out = fg2.propagate(torch.ones(3, 2))
    assert torch.equal(out[2], torch.zeros(2)) and torch.equal(out[0], torch.zeros(2))


def test_many_chunks_on_two_threads_equal_scipy(random_graph, monkeypatch):
    """Chunks of a partition run on several threads; each must stage its own rows before reading them."""
    import graphrl.kernels.spmm as kernels

    monkeypatch.setattr(kernels, "CHUNK_WORK", 2048)  # hundreds of chunks per partition
    assert kernels.chunk_bounds(np.arange(0, 3 * 10**4, 10, dtype=np.int64), 0, 2999, 16).shape[0] > 100
    ref = reference(random_graph)
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        for parts in (1, 3):
            with MemoryManager(device="cpu") as mm:  # a fresh workspace: no stale entries to hide a race
                fg = FullGraph(random_graph, memory=mm)
                partition_bytes_for(fg, parts, 16)
                h = torch.randn(random_graph.num_nodes, 16, requires_grad=True)
                out = fg.propagate(h)
                np.testing.assert_allclose(out.detach().numpy(), ref @ h.detach().double().numpy(),
                                           rtol=1e-5, atol=1e-6)
                out.backward(torch.ones_like(out))
                np.testing.assert_allclose(h.grad.numpy(), ref.T @ np.ones(h.shape), rtol=1e-5, atol=1e-6)
    finally:
        numba.set_num_threads(before)


def test_an_unparsable_partition_bytes_is_named(cora, mm):
    with pytest.raises(ValueError, match="partition_bytes: .*'abc'"):
        FullGraph(cora.graph, memory=mm, partition_bytes="abc")

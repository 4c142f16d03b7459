"""LightGCN on blocks against the dense formula; the SpMM kernel against torch; the sampled estimator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from graphrl.nn import LightGCN, block_propagate, csr_spmm
from graphrl.nn.spmm import csr_spmm_torch
from samplers import NeighborSampler

# 3 users (nodes 0-2), 4 items (nodes 3-6); user 2 has a single item, item 6 a single user.
USERS = [0, 0, 0, 1, 1, 2, 1]
ITEMS = [0, 1, 2, 1, 3, 0, 2]


def tiny_graph() -> CSCGraph:
    return CSCGraph.bipartite(USERS, ITEMS, 3, 4)


def dense_norm_adj(graph: CSCGraph) -> torch.Tensor:
    """``D_in^-1/2 A D_out^-1/2`` with A[v, u] = 1 for every edge u -> v, built from the edge list by hand."""
    n = graph.num_nodes
    a = torch.zeros(n, n, dtype=torch.float64)
    for u, i in zip(USERS, ITEMS, strict=True):
        a[i + 3, u] += 1
        a[u, i + 3] += 1
    d_in = a.sum(1).clamp(min=1)
    d_out = a.sum(0).clamp(min=1)
    return d_in.rsqrt()[:, None] * a * d_out.rsqrt()[None, :]


def dense_lightgcn(emb: torch.Tensor, adj: torch.Tensor, layers: int) -> torch.Tensor:
    h, total = emb, emb.clone()
    for _ in range(layers):
        h = adj @ h
        total = total + h
    return total / (layers + 1)


def test_norm_adj_matches_the_lightgcn_formula_by_hand():
    adj = dense_norm_adj(tiny_graph())
    # user 0 has items 0, 1, 2 (nodes 3, 4, 5); item 0 (node 3) has users 0 and 2: weight 1/sqrt(3 * 2).
    assert adj[0, 3].item() == pytest.approx(1 / np.sqrt(6))
    assert adj[3, 0].item() == pytest.approx(1 / np.sqrt(6))
    # user 2 has one item (node 3, degree 2): 1/sqrt(1 * 2); item 3 (node 6) has one user (1, degree 3).
    assert adj[2, 3].item() == pytest.approx(1 / np.sqrt(2))
    assert adj[6, 1].item() == pytest.approx(1 / np.sqrt(3))
    assert adj[0, 1].item() == 0.0


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_blocks_with_all_neighbours_equal_dense_lightgcn(layers):
    graph = tiny_graph()
    model = LightGCN.from_graph(graph, num_layers=layers, embedding_dim=5, seed=0).double()
    dense = dense_lightgcn(model.embedding.weight.detach(), dense_norm_adj(graph), layers)
    sampler = NeighborSampler(graph, [-1] * layers, seed=0)
    for seeds in ([0, 4, 6], [2], list(range(7)), [5, 1]):
        out = model(sampler.sample(torch.tensor(seeds)))
        torch.testing.assert_close(out.detach(), dense[seeds], rtol=0, atol=1e-12)


def test_forward_returns_layer0_and_checks_block_count():
    graph = tiny_graph()
    model = LightGCN.from_graph(graph, num_layers=2, embedding_dim=4, seed=1)
    blocks = NeighborSampler(graph, [-1, -1], seed=0).sample(torch.tensor([3, 0]))
    out, emb0 = model(blocks, return_embeddings=True)
    assert out.shape == emb0.shape == (2, 4) and out.dtype == torch.float32
    assert torch.equal(emb0, model.embedding.weight[[3, 0]])
    with pytest.raises(ValueError, match="blocks"):
        model(blocks[1:])


def test_layerwise_inference_equals_dense_propagation():
    graph = tiny_graph()
    model = LightGCN.from_graph(graph, num_layers=3, embedding_dim=6, seed=2).double()
    dense = dense_lightgcn(model.embedding.weight.detach(), dense_norm_adj(graph), 3)
    for batch_size in (1, 3, 100):
        torch.testing.assert_close(model.inference(graph, batch_size=batch_size), dense, rtol=0, atol=1e-12)


def test_layerwise_inference_on_a_larger_graph_float32():
    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 300, 3000), rng.integers(0, 200, 3000)
    pairs = np.unique(users * 200 + items)
    graph = CSCGraph.bipartite(pairs // 200, pairs % 200, 300, 200)
    model = LightGCN.from_graph(graph, num_layers=2, embedding_dim=8, seed=0)
    n = graph.num_nodes
    dst = np.repeat(np.arange(n), graph.in_degrees().numpy())
    src = graph.indices.numpy().astype(np.int64)
    a = torch.zeros(n, n, dtype=torch.float64)
    a[dst, src] = 1.0
    adj = a.sum(1).clamp(min=1).rsqrt()[:, None] * a * a.sum(0).clamp(min=1).rsqrt()[None, :]
    dense = dense_lightgcn(model.embedding.weight.detach().double(), adj, 2).float()
    torch.testing.assert_close(model.inference(graph, batch_size=97), dense, rtol=1e-5, atol=1e-6)


def test_sampled_propagation_is_unbiased():
    # Node 0 (user 0) has 3 items; with fanout 1 each draw sees one of them, scaled by d/k = 3.
    graph = tiny_graph()
    h = torch.randn(graph.num_nodes, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    model = LightGCN.from_graph(graph, num_layers=1, embedding_dim=2)
    exact = (dense_norm_adj(graph) @ h)[[0, 1]]
    sampler = NeighborSampler(graph, [1], seed=3)
    draws = []
    for _ in range(2000):
        (block,) = sampler.sample(torch.tensor([0, 1]))
        draws.append(block_propagate(block, h[block.src_nodes], model.deg_in, model.deg_out))
    draws = torch.stack(draws)
    se = draws.std(0) / np.sqrt(draws.shape[0])
    assert ((draws.mean(0) - exact).abs() <= 5 * se + 1e-12).all()
    assert (draws.std(0) > 0).all()  # really sampled


@pytest.mark.parametrize("spmm", [csr_spmm, csr_spmm_torch], ids=["numba", "torch"])
def test_csr_spmm_forward_and_gradient(spmm):
    gen = torch.Generator().manual_seed(0)
    indptr = torch.tensor([0, 2, 2, 5, 6])
    indices = torch.tensor([1, 4, 0, 0, 3, 4])  # a repeated column in row 2
    weights = torch.rand(6, dtype=torch.float64, generator=gen)
    h = torch.randn(5, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    dense = torch.zeros(4, 5, dtype=torch.float64)
    rows = torch.repeat_interleave(torch.arange(4), indptr.diff())
    dense.index_put_((rows, indices), weights, accumulate=True)
    torch.testing.assert_close(spmm(indptr, indices, weights, h), dense @ h)
    assert torch.autograd.gradcheck(lambda x: spmm(indptr, indices, weights, x), (h,))
    out = spmm(indptr, indices, weights.float(), h.detach().float())
    assert out.dtype == torch.float32 and out[1].abs().sum() == 0  # empty row


def test_training_gradient_reaches_sampled_neighbours():
    graph = tiny_graph()
    model = LightGCN.from_graph(graph, num_layers=2, embedding_dim=3, seed=0)
    blocks = NeighborSampler(graph, [-1, -1], seed=0).sample(torch.tensor([2]))
    model(blocks).sum().backward()
    touched = set(torch.nonzero(model.embedding.weight.grad.abs().sum(1)).squeeze(1).tolist())
    # user 2 -> item 0 (node 3) -> users 0 and 2: two hops reach nodes 0, 2, 3.
    assert touched == {0, 2, 3}


def test_model_arguments_are_checked():
    deg = torch.ones(4)
    with pytest.raises(ValueError, match="num_layers"):
        LightGCN(4, 0, deg, deg)
    with pytest.raises(ValueError, match="deg_in"):
        LightGCN(4, 1, torch.ones(3), deg)
    model = LightGCN.from_graph(tiny_graph(), num_layers=1, embedding_dim=2)
    with pytest.raises(ValueError, match="nodes"):
        model.inference(CSCGraph.from_edges([0], [1], 2))
    a = LightGCN.from_graph(tiny_graph(), 1, 4, seed=5).embedding.weight
    b = LightGCN.from_graph(tiny_graph(), 1, 4, seed=5).embedding.weight
    assert torch.equal(a, b)


def test_csr_spmm_parallel_and_serial_kernels_agree_bitwise():
    from graphrl import threads
    from graphrl.kernels import spmm

    gen = torch.Generator().manual_seed(1)
    rows, cols, nnz, d = 3000, 2000, 40000, 16  # nnz * d above the serial threshold
    assert nnz * d >= threads.SERIAL_WORK
    counts = torch.bincount(torch.randint(0, rows, (nnz,), generator=gen), minlength=rows)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).numpy()
    indices = torch.randint(0, cols, (nnz,), generator=gen).numpy()
    weights = torch.rand(nnz, generator=gen).numpy().astype(np.float32)
    h = torch.randn(cols, d, generator=gen).numpy()
    g = torch.randn(rows, d, generator=gen).numpy()
    a, b = np.empty((rows, d), np.float32), np.empty((rows, d), np.float32)
    spmm.csr_spmm_parallel(indptr, indices, weights, h, a)
    spmm.csr_spmm_serial(indptr, indices, weights, h, b)
    assert np.array_equal(a, b)
    ga, gb = np.empty((cols, d), np.float32), np.empty((cols, d), np.float32)
    spmm.csr_spmm_t_parallel(indptr, indices, weights, g, ga, 2)
    spmm.csr_spmm_t_serial(indptr, indices, weights, g, gb, 1)
    assert np.array_equal(ga, gb)
    # any thread count, int32 row pointers (scipy's) and float64 give the serial kernels' bits
    for n in (1, 2, 3, 5, None):
        for ip, dt in ((indptr, np.float32), (indptr.astype(np.int32), np.float64)):
            hd, gd, wd = h.astype(dt), g.astype(dt), weights.astype(dt)
            a, b = np.full((rows, d), np.nan, dt), np.empty((rows, d), dt)
            spmm.csr_spmm_parallel(ip, indices, wd, hd, a, n)
            spmm.csr_spmm_serial(ip, indices, wd, hd, b)
            assert np.array_equal(a, b)
            ga, gb = np.full((cols, d), np.nan, dt), np.empty((cols, d), dt)
            spmm.csr_spmm_t_parallel(ip, indices, wd, gd, ga, n)
            spmm.csr_spmm_t_serial(ip, indices, wd, gd, gb, 1)
            assert np.array_equal(ga, gb)
    assert not np.array_equal(a[:, 0], a[:, 1])  # not a constant that any kernel would give
    dense = torch.zeros(rows, cols, dtype=torch.float64)
    row_of = torch.repeat_interleave(torch.arange(rows), torch.from_numpy(np.diff(indptr)))
    dense.index_put_((row_of, torch.from_numpy(indices)), torch.from_numpy(weights).double(), accumulate=True)
    ht = torch.from_numpy(h).requires_grad_()
    out = csr_spmm(torch.from_numpy(indptr), torch.from_numpy(indices), torch.from_numpy(weights), ht)
    torch.testing.assert_close(out.double(), dense @ torch.from_numpy(h).double(), rtol=1e-5, atol=1e-5)
    out.backward(torch.from_numpy(g))
    torch.testing.assert_close(ht.grad.double(), dense.T @ torch.from_numpy(g).double(), rtol=1e-5, atol=1e-5)

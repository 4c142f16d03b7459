"""Full-graph models on the staged FullGraph: host_linear, GraphSAGE-mean, keep/recompute, accuracy, CLI."""

from __future__ import annotations

import logging

import numba
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from graphrl.datasets import load_planetoid, synthetic_graph
from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager
from graphrl.nn.gcn import GCN
from graphrl.nn.host_linear import host_linear
from graphrl.nn.recompute import intermediate_plan
from graphrl.nn.sage import SAGEConv
from graphrl.train.node_classification import row_normalize, run_node_classification, train_full_graph
from samplers.full_graph import FullGraph

# device="cuda" runs the real CUDA path where torch finds CUDA (marked gpu) and the staged fallback through a
# host-memory device tier where it does not: one case for each, so that `pytest -m gpu` selects the first
CUDA_OR_FALLBACK = pytest.mark.parametrize("path", [
    pytest.param("gpu", marks=pytest.mark.gpu),
    pytest.param("no-cuda", marks=pytest.mark.skipif(torch.cuda.is_available(),
                                                     reason="the no-CUDA fallback; the gpu case runs here")),
])


@pytest.fixture
def one_thread():
    before = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    yield
    torch.set_num_threads(before[0])
    numba.set_num_threads(before[1])


@pytest.fixture
def mm():
    with MemoryManager(device="cpu") as manager:
        yield manager


@pytest.mark.parametrize("sparse", [False, True])
def test_host_linear_equals_addmm_with_gradients(sparse):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(23, 5, generator=gen, dtype=torch.float64)
    if sparse:
        x = x * (torch.rand(23, 5, generator=gen, dtype=torch.float64) < 0.3)
    w = torch.randn(5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True)
    g = torch.randn(23, 4, dtype=torch.float64, generator=gen)
    xin = x.to_sparse() if sparse else x.clone().requires_grad_()
    out = host_linear(xin, w, b, chunk_rows=7)  # 4 chunks, the last one short
    out.backward(g)
    torch.testing.assert_close(out, x @ w.detach() + b.detach())
    torch.testing.assert_close(w.grad, x.t() @ g)
    torch.testing.assert_close(b.grad, g.sum(0))
    if not sparse:
        torch.testing.assert_close(xin.grad, g @ w.detach().t())
    with pytest.raises(ValueError, match="chunk_rows"):
        host_linear(x, w, b, chunk_rows=0)
    with pytest.raises(ValueError, match=r"shape \[N, 5\]"):
        host_linear(torch.randn(3, 4), w)


def test_sage_conv_equals_the_mean_formula_with_gradients(mm):
    graph = synthetic_graph(300, 2000, "powerlaw", seed=1)
    n = graph.num_nodes
    a = sp.csr_matrix((np.ones(graph.num_edges), graph.indices.numpy(), graph.indptr.numpy()), shape=(n, n))
    deg = np.asarray(a.sum(1)).ravel()
    mean = torch.from_numpy((sp.diags(np.where(deg > 0, 1.0 / np.maximum(deg, 1), 0.0)) @ a).toarray())
    gen = torch.Generator().manual_seed(0)
    for dims in ((6, 3), (3, 6)):  # aggregate after / before the neighbour weight
        conv = SAGEConv(*dims, generator=gen).double()
        with torch.no_grad():
            conv.bias.uniform_(-1, 1, generator=gen)
        fg = FullGraph(graph, normalization="left", add_self_loops=False, memory=mm, dedup=True, partitions=4)
        x = torch.randn(n, dims[0], dtype=torch.float64, generator=gen, requires_grad=True)
        out = conv(fg, x)
        expect = x @ conv.weight_self + mean @ x @ conv.weight_neigh + conv.bias
        # FullGraph holds its weights (1 / in-degree) in float32: float32 rounding of the mean
        torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-6)
        g = torch.randn_like(out)
        got = torch.autograd.grad(out, [x, conv.weight_neigh], g)
        want = torch.autograd.grad(expect, [x, conv.weight_neigh], g)
        for a_, b_ in zip(got, want, strict=True):
            torch.testing.assert_close(a_, b_, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="normalization='left'"):
        SAGEConv(3, 2)(FullGraph(graph, memory=mm), torch.randn(n, 3))


def test_recompute_gives_the_same_gradients_and_is_reported(mm):
    graph = synthetic_graph(500, 4000, "powerlaw", seed=2)
    fg = FullGraph(graph, memory=mm, dedup=True, partitions=3)
    x = torch.randn(graph.num_nodes, 12, generator=torch.Generator().manual_seed(3))
    grads, forwards = {}, {}
    for mode in ("keep", "recompute"):
        model = GCN(12, 16, out_dim=4, layers=3, dropout=0.5, seed=7, recompute=mode)
        model.train()
        fg.traffic(reset=True)
        model(fg, x).square().sum().backward()
        grads[mode] = [p.grad.clone() for p in model.parameters()]
        t = fg.traffic()
        assert t["intermediate"] == [mode] * 3
        forwards[mode] = sum(c["direction"] == "forward" for c in t["per_call"])
    for a_, b_ in zip(grads["keep"], grads["recompute"], strict=True):
        torch.testing.assert_close(a_, b_, rtol=1e-5, atol=1e-6)
    # layers 1 and 2 propagate again in the backward; layer 3 (16 -> 4) multiplies before propagating
    # and saves only its input, so torch's checkpoint has nothing to recompute there
    assert forwards == {"keep": 3, "recompute": 5}
    with pytest.raises(ValueError, match="recompute"):
        GCN(4, out_dim=2, recompute="sometimes")


def test_auto_recompute_follows_the_vertex_tier_budget():
    graph = synthetic_graph(1000, 5000, "powerlaw", seed=0)
    with MemoryManager(budgets={"pinned": "1MiB"}, device="cpu") as small:  # the staged path's vertex tier
        fg = FullGraph(graph, memory=small, dedup=True)
        free = small.free_bytes(fg.vertex_tier)
        widths = [64, 64, 8]  # each 64-wide layer keeps 2 x 1000 x 64 x 4 = 512 000 bytes
        choices = intermediate_plan(fg, widths)
        room, expect = free // 2, []
        for w in widths:
            need = 2 * 1000 * w * 4
            expect.append("keep" if need <= room else "recompute")
            room -= need if need <= room else 0
        assert choices == expect and "recompute" in choices and fg.traffic()["intermediate"] == choices


def test_staged_training_equals_the_host_path(data_root, one_thread, mm):
    """The staged dedup path trains to the same logits as the zero-copy host path (same float sums)."""
    ds = load_planetoid("cora", data_root)
    features = row_normalize(ds.features).to_sparse()
    logits = []
    for kwargs in ({}, {"dedup": True, "partitions": 6}):
        fg = FullGraph(ds.graph, memory=mm, **kwargs)
        model = GCN(ds.num_features, 16, out_dim=ds.num_classes, seed=0)
        train_full_graph(model, fg, features, ds.labels, ds.train_mask, epochs=15)
        model.eval()
        with torch.no_grad():
            logits.append(model(fg, features))
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@CUDA_OR_FALLBACK
@pytest.mark.parametrize(("dataset", "paper"), [("cora", 0.815), ("citeseer", 0.703)])
def test_staged_dedup_accuracy_in_the_papers_band(dataset, paper, data_root, one_thread, path):
    """2 seeds through the partitioned dedup path (10 seeds: docs/notes, benchmarks)."""
    report = run_node_classification(dataset, seeds=2, root=data_root, device="cuda", dedup=True,
                                     device_budget="128KiB")
    assert report.partitions >= 8 and report.device_peak_bytes <= 128 * 1024
    assert abs(report.mean - paper) <= 0.015, report.test_accs
    t = report.traffic
    assert t["dedup_hit_bytes"] > 0 and t["staged"] and t["dedup"] is True
    assert t["host_to_device_bytes"] == t["vertex_host_to_device_bytes"] + t["structure_host_to_device_bytes"]


def test_graphsage_learns_cora(data_root, one_thread):
    report = run_node_classification("cora", seeds=1, epochs=100, model="sage", root=data_root, dedup=True,
                                     device_budget="256KiB")
    assert report.mean > 0.75 and report.partitions > 1
    with pytest.raises(ValueError, match="model must be one of"):
        run_node_classification("cora", model="gat", root=data_root)


@CUDA_OR_FALLBACK
def test_cli_demo_node_classification_device_cuda(data_root, path):
    from click.testing import CliRunner

    from graphrl.cli import main

    args = ["demo", "--task", "node-classification", "--dataset", "cora", "--seeds", "1", "--epochs", "30",
            "--device", "cuda", "--device-budget", "128KiB", "--data-root", str(data_root)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "host-to-device" in result.output and "dedup" in result.output
    moved = int(result.output.split("host-to-device ")[1].split(" bytes")[0].replace(",", ""))
    assert moved > 0


def test_directed_graph_sage_uses_in_neighbours(mm):
    graph = CSCGraph.from_edges([0, 1], [2, 2], 3)  # 0 -> 2, 1 -> 2
    fg = FullGraph(graph, normalization="left", add_self_loops=False, memory=mm, dedup=False, partitions=2)
    out = fg.propagate(torch.tensor([[1.0], [3.0], [10.0]]))
    assert out.flatten().tolist() == [0.0, 0.0, 2.0]  # the mean of rows 0 and 1, nothing for 0 and 1


def test_device_cuda_without_cuda_says_so_once(data_root, caplog):
    """The trainer's warning is the only one about the missing GPU from the trainer and FullGraph (it
    was said twice: the trainer's, then FullGraph(device='cuda')'s); the staged dedup path still runs."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the no-CUDA fallback is what is tested here")
    with caplog.at_level(logging.WARNING):
        report = run_node_classification("cora", seeds=1, epochs=2, root=data_root, device="cuda",
                                         device_budget="256KiB")
    said = [r for r in caplog.records if r.name.startswith(("graphrl.train", "samplers"))
            and "CUDA" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    t = report.traffic
    assert t["staged"] and t["dedup"] is True and t["dedup_hit_bytes"] > 0 and report.partitions > 1

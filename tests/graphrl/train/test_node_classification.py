"""GCN over FullGraph: the layer against the dense formula, Cora accuracy in the paper's band, the CLI."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from graphrl.datasets import load_planetoid
from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager
from graphrl.nn import GCN, GraphConv
from graphrl.train import accuracy, row_normalize, run_node_classification, train_full_graph
from samplers import FullGraph


@pytest.fixture
def one_thread():
    """Cora is too small to gain from threads, and a busy 2-core machine stalls every fork-join."""
    torch_before, numba_before = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    yield
    torch.set_num_threads(torch_before)
    numba.set_num_threads(numba_before)


def tiny() -> CSCGraph:
    src = [0, 1, 1, 2, 2, 3, 3, 4]
    dst = [1, 0, 2, 1, 3, 2, 4, 3]
    return CSCGraph.from_edges(src, dst, 5)


def dense_p(graph: CSCGraph) -> torch.Tensor:
    n = graph.num_nodes
    a = torch.eye(n, dtype=torch.float64)
    dst = torch.repeat_interleave(torch.arange(n), graph.in_degrees())
    ones = torch.ones(graph.num_edges, dtype=torch.float64)
    a.index_put_((dst, graph.indices.long()), ones, accumulate=True)
    d = a.sum(1)
    return d.rsqrt()[:, None] * a * d.rsqrt()[None, :]


@pytest.mark.parametrize("dims", [(6, 3), (3, 6)])  # weight before / after propagating
def test_graph_conv_equals_dense_formula(dims):
    graph = tiny()
    conv = GraphConv(*dims, generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        conv.bias.uniform_(-1, 1)
    x = torch.randn(5, dims[0], dtype=torch.float64)
    with FullGraph(graph) as fg:
        out = conv(fg, x)
        torch.testing.assert_close(out, dense_p(graph) @ x @ conv.weight + conv.bias)
        x_sparse = x.clone()
        x_sparse[x_sparse < 0] = 0
        torch.testing.assert_close(conv(fg, x_sparse.to_sparse()), conv(fg, x_sparse))


@pytest.mark.parametrize("dims", [(6, 3), (3, 6)])
def test_gcn_gradients(dims):
    graph = tiny()
    model = GCN(dims[0], dims[1], out_dim=2, layers=2, dropout=0.0, seed=0).double()
    with FullGraph(graph) as fg:
        x = torch.randn(5, dims[0], dtype=torch.float64, generator=torch.Generator().manual_seed(1),
                        requires_grad=True)
        params = tuple(model.parameters())
        assert torch.autograd.gradcheck(lambda x: model(fg, x), (x,))
        out = model(fg, x).square().sum()
        grads = torch.autograd.grad(out, params)
        p_dense = dense_p(graph)
        w1, b1, w2, b2 = (p.detach().clone().requires_grad_() for p in params)
        ref = (p_dense @ torch.relu(p_dense @ x @ w1 + b1) @ w2 + b2).square().sum()
        for g, r in zip(grads, torch.autograd.grad(ref, (w1, b1, w2, b2)), strict=True):
            # FullGraph holds its normalised entries in float32 (dense_p computes them in float64): the
            # gradients agree to float32's precision, 1.2e-7 relative once in CI with the default 1e-7
            torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)


def test_glorot_init_and_seeded_dropout_are_reproducible():
    a, b = GCN(100, 16, out_dim=7, seed=3), GCN(100, 16, out_dim=7, seed=3)
    bound = (6 / (100 + 16)) ** 0.5
    assert torch.equal(a.convs[0].weight, b.convs[0].weight)
    assert a.convs[0].weight.abs().max() <= bound and a.convs[0].weight.std() > bound / 3
    assert torch.count_nonzero(a.convs[0].bias) == 0
    graph = tiny()
    x = torch.rand(5, 100)
    with FullGraph(graph) as fg:
        a.train(), b.train()
        torch.testing.assert_close(a(fg, x), b(fg, x))  # same seed, same dropout masks
        assert not torch.equal(a(fg, x), a(fg, x))  # fresh masks every call
        a.eval()
        assert torch.equal(a(fg, x), a(fg, x))


def test_model_and_trainer_arguments_are_checked():
    with pytest.raises(ValueError, match="layers"):
        GCN(4, 8, out_dim=2, layers=0)
    with pytest.raises(ValueError, match="dropout"):
        GCN(4, 8, out_dim=2, dropout=1.0)
    graph = tiny()
    model = GCN(4, 8, out_dim=2)
    x, y = torch.rand(5, 4), torch.tensor([0, 1, 0, 1, -1])
    mask = torch.tensor([True, True, True, False, False])
    with FullGraph(graph) as fg:
        with pytest.raises(ValueError, match="features"):
            train_full_graph(model, fg, torch.rand(4, 4), y, mask)
        with pytest.raises(ValueError, match="train_mask"):
            train_full_graph(model, fg, x, y, mask.long())
        with pytest.raises(ValueError, match="without a label"):
            train_full_graph(model, fg, x, y, torch.ones(5, dtype=torch.bool))
        with pytest.raises(ValueError, match="early_stopping needs val_mask"):
            train_full_graph(model, fg, x, y, mask, early_stopping=10)
        with pytest.raises(ValueError, match="decay"):
            train_full_graph(model, fg, x, y, mask, decay="last")
        result = train_full_graph(model, fg, x, y, mask, epochs=3, val_mask=~mask & (y >= 0))
        assert result.epochs == 3 and len(result.losses) == 3 and result.test_acc is None


def test_weight_decay_reaches_the_first_layer_only():
    graph = tiny()
    x, y = torch.rand(5, 4), torch.tensor([0, 1, 0, 1, 0])
    mask = torch.ones(5, dtype=torch.bool)
    model = GCN(4, 8, out_dim=2, dropout=0.0, seed=0)
    model_no_decay = GCN(4, 8, out_dim=2, dropout=0.0, seed=0)
    with FullGraph(graph) as fg:
        # one step: the second layer's gradient does not yet depend on the first layer's update
        train_full_graph(model, fg, x, y, mask, epochs=1, lr=0.1, weight_decay=1.0)
        train_full_graph(model_no_decay, fg, x, y, mask, epochs=1, lr=0.1, weight_decay=0.0)
    assert not torch.allclose(model.convs[0].weight, model_no_decay.convs[0].weight)
    torch.testing.assert_close(model.convs[1].weight, model_no_decay.convs[1].weight, rtol=0, atol=0)


def test_cora_accuracy_in_the_papers_band(data_root, one_thread):
    """Kipf and Welling report 81.5 % on Cora; 2 seeds of 200 epochs must average above 79.5 %."""
    ds = load_planetoid("cora", data_root)
    features = row_normalize(ds.features).to_sparse()
    accs = []
    with MemoryManager(budgets={"device": "256KiB"}, device="cpu") as mm, \
            FullGraph(ds.graph, memory=mm) as fg:
        assert fg.num_partitions(16) > 1  # partitioned, so the accuracy covers the partitioned path
        for seed in range(2):
            model = GCN(ds.num_features, 16, out_dim=ds.num_classes, seed=seed)
            result = train_full_graph(model, fg, features, ds.labels, ds.train_mask, epochs=200,
                                      test_mask=ds.test_mask)
            accs.append(result.test_acc)
            assert result.losses[-1] < result.losses[0] / 3
            assert result.train_acc > 0.95
        assert mm.stats()["device"]["samplers.full_graph"]["peak"] <= 256 * 1024
    assert np.mean(accs) > 0.795, accs
    assert accuracy(torch.eye(3), torch.tensor([0, 1, 1]), torch.ones(3, dtype=torch.bool)) == 2 / 3


def test_run_node_classification_reports_every_seed(data_root, one_thread):
    seen = []
    report = run_node_classification("citeseer", seeds=2, epochs=20, root=data_root,
                                     on_seed=lambda seed, r: seen.append(seed))
    assert seen == [0, 1] and len(report.test_accs) == 2
    assert report.num_classes == 6 and report.partitions == 1 and report.device_peak_bytes > 0
    assert 0.4 < report.mean < 0.8 and report.std >= 0


def test_cli_demo_node_classification(data_root):
    from click.testing import CliRunner

    from graphrl.cli import main

    args = ["demo", "--task", "node-classification", "--dataset", "cora", "--seeds", "2", "--epochs", "40",
            "--device-budget", "128KiB", "--data-root", str(data_root)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "seed 0: test accuracy" in out and "seed 1: test accuracy" in out
    assert "cora test accuracy over 2 seed(s): " in out and "(paper 81.5 %)" in out
    peak = int(out.split("device-tier peak ")[1].split(" bytes")[0].replace(",", ""))
    assert 0 < peak <= 128 * 1024
    bad = CliRunner().invoke(main, ["demo", "--task", "node-classification", "--dataset", "gowalla"])
    assert bad.exit_code == 2 and "cora or citeseer" in bad.output
    bad = CliRunner().invoke(main, ["demo", "--task", "recommend", "--dataset", "citeseer"])
    assert bad.exit_code == 2 and "gowalla or synthetic" in bad.output

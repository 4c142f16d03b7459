"""Full-graph recommender training: losses by hand, exact propagation, early stopping restores the best."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graphrl.datasets import synthetic_bipartite
from graphrl.datasets.validation import holdout_validation
from graphrl.graph import CSCGraph
from graphrl.nn.lightgcn import LightGCN
from graphrl.nn.sym_adjacency import SymNormAdjacency
from graphrl.train.metrics import csr_from_pairs, evaluate_ranking, merge_csr
from graphrl.train.rec_losses import bpr_pair_loss, full_softmax_loss, sampled_softmax_loss
from graphrl.train.recommend import RecommendConfig, train_recommender


def _np_norm(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_sampled_softmax_equals_numpy():
    g = torch.Generator().manual_seed(0)
    u, p, n = (torch.randn(s, 5, generator=g, dtype=torch.float64) for s in (4, 4, 7))
    un, pn, nn_ = _np_norm(u.numpy()), _np_norm(p.numpy()), _np_norm(n.numpy())
    logits = np.concatenate([(un * pn).sum(1, keepdims=True), un @ nn_.T], 1) / 0.2
    expect = np.mean(np.log(np.exp(logits).sum(1)) - logits[:, 0])
    assert sampled_softmax_loss(u, p, n, temperature=0.2).item() == pytest.approx(expect, rel=1e-10)
    with pytest.raises(ValueError, match="temperature"):
        sampled_softmax_loss(u, p, n, temperature=0.0)


def test_full_softmax_equals_numpy_and_bpr_by_hand():
    g = torch.Generator().manual_seed(1)
    u, items = torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(6, 4, generator=g,
                                                                               dtype=torch.float64)
    rows, cols = torch.tensor([0, 0, 2, 1]), torch.tensor([1, 5, 0, 3])
    s = _np_norm(u.numpy()) @ _np_norm(items.numpy()).T / 0.5
    logp = s - np.log(np.exp(s).sum(1, keepdims=True))
    expect = -np.mean(logp[rows.numpy(), cols.numpy()])
    assert full_softmax_loss(u, items, rows, cols, temperature=0.5).item() == pytest.approx(expect, rel=1e-10)
    a, b, c = torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 5.0]])
    assert bpr_pair_loss(a, b, c).item() == pytest.approx(math.log1p(math.exp(-2.0)), rel=1e-6)


def test_sym_adjacency_matches_dense_and_its_gradient_is_the_transpose():
    # an asymmetric directed graph: the backward must use A^T, not A
    src, dst = np.array([0, 0, 1, 2, 3, 3, 1]), np.array([1, 2, 2, 0, 0, 1, 3])
    graph = CSCGraph.from_edges(src, dst, 4)
    adj = SymNormAdjacency.from_graph(graph)
    a = np.zeros((4, 4))
    a[dst, src] = 1.0
    d_in, d_out = a.sum(1), a.sum(0)
    dense = np.diag(1 / np.sqrt(d_in)) @ a @ np.diag(1 / np.sqrt(d_out))
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(4, 3, dtype=torch.float64, requires_grad=True, generator=gen)
    out = adj(h)
    # the operator stores float32 entries: ~6e-8 relative error each, so an absolute floor for sums near 0
    np.testing.assert_allclose(out.detach().numpy(), dense @ h.detach().numpy(), rtol=1e-6, atol=1e-6)
    g = torch.randn(4, 3, dtype=torch.float64, generator=gen)
    out.backward(g)
    np.testing.assert_allclose(h.grad.numpy(), dense.T @ g.numpy(), rtol=1e-6, atol=1e-6)
    assert not adj.symmetric
    with pytest.raises(ValueError, match="shape"):
        adj(torch.zeros(3, 3))


def test_full_graph_propagate_equals_layerwise_inference():
    ds = synthetic_bipartite(60, 80, 900, seed=3)
    model = LightGCN.from_graph(ds.graph, num_layers=3, embedding_dim=8, seed=0)
    adj = SymNormAdjacency.from_graph(ds.graph)
    assert adj.symmetric
    torch.testing.assert_close(model.propagate(adj).detach(), model.inference(ds.graph), rtol=1e-5, atol=1e-6)


def test_merge_csr_and_test_masking_of_train_and_validation_items():
    train = csr_from_pairs(np.array([0, 1]), np.array([0, 2]), 2)
    val = csr_from_pairs(np.array([0]), np.array([1]), 2)
    test = csr_from_pairs(np.array([0, 1]), np.array([3, 3]), 2)
    indptr, items = merge_csr(train, val)
    assert indptr.tolist() == [0, 2, 3] and items.tolist() == [0, 1, 2]
    # user 0 scores items 0 > 1 > 2 > 3: with train and validation masked, item 3 ranks second (after 2)
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0], [4.0, 3.0, 2.0, 1.0]])
    res = evaluate_ranking(lambda u: scores[u], (indptr, items), test, k=1)
    # k=1: user 0 ranks item 2 first (miss), user 1 ranks item 0 first (miss)
    assert res.recall == 0.0
    res = evaluate_ranking(lambda u: scores[u], (indptr, items), test, k=2)
    # user 0: [2, 3] -> hit at rank 2; user 1: [0, 1] -> miss
    assert res.recall == pytest.approx(0.5)
    assert res.ndcg == pytest.approx((1 / math.log2(3)) / 2)
    with pytest.raises(ValueError, match="same users"):
        merge_csr(train, csr_from_pairs(np.array([0]), np.array([1]), 3))


@pytest.fixture(scope="module")
def small_split():
    return holdout_validation(synthetic_bipartite(300, 400, 9000, seed=0), fraction=0.1, seed=0)


def test_training_learns_and_reports_a_consistent_curve(small_split):
    cfg = RecommendConfig(loss="full-softmax", batch_size=64, lr=2e-2, epochs=4, minutes=None, eval_every=1,
                          embedding_dim=16, patience=10)
    report = train_recommender(small_split, cfg)
    assert [round(e["epoch"]) for e in report.curve] == [1, 2, 3, 4]
    assert report.stopped_by == "epochs"
    best = max(report.curve, key=lambda e: e["val_recall"])
    assert report.best_epoch == best["epoch"] and report.best_val.recall == best["val_recall"]
    # well above the popularity-level ranking of an untrained model
    assert report.best_test.recall > 0.05


def test_early_stopping_restores_the_best_weights_after_a_forced_worse_epoch(small_split):
    snapshots = {}

    def sabotage(entry, model):
        if len(snapshots) == 0:  # after the first evaluation: remember, then wreck the weights
            snapshots["best"] = model.embedding.weight.detach().clone()
            # a random table of its own seed (not the global stream, which earlier tests move) at 100x the
            # trained scale: the next 2 epochs at lr 1e-2 (Adam: <= 0.24 a coordinate) leave it random
            noise = 10 * torch.randn(model.embedding.weight.shape, generator=torch.Generator().manual_seed(5))
            with torch.no_grad():
                model.embedding.weight.copy_(noise)
            snapshots["done"] = True

    cfg = RecommendConfig(loss="softmax", batch_size=512, num_negatives=64, lr=1e-2, epochs=50, minutes=None,
                          eval_every=2, embedding_dim=16, patience=1, lr_patience=5)
    report = train_recommender(small_split, cfg, on_eval=sabotage)
    assert report.stopped_by == "patience" and len(report.curve) == 2
    assert report.curve[1]["val_recall"] < report.curve[0]["val_recall"]
    assert report.best_epoch == report.curve[0]["epoch"]
    torch.testing.assert_close(report.model.embedding.weight.detach(), snapshots["best"], rtol=0, atol=0)
    assert report.final_test.recall < report.best_test.recall


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="loss"):
        RecommendConfig(loss="hinge")
    with pytest.raises(ValueError, match="lr_decay"):
        RecommendConfig(lr_decay=0.0)
    with pytest.raises(ValueError, match="batch_size"):
        RecommendConfig(batch_size=0)

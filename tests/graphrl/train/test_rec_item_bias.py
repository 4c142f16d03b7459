"""The item bias: in the three losses against materialised formulas, in the ranking table, in training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.train.rec_losses import bpr_pair_loss, full_softmax_loss, sampled_softmax_loss


def _materialised(user, items, bias, rows, cols, temperature):
    user, items = F.normalize(user, dim=1), F.normalize(items, dim=1)
    logits = user @ items.t() / temperature + bias
    return (torch.logsumexp(logits, dim=1)[rows] - logits[rows, cols]).mean()


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 10), i=st.integers(2, 25), chunk=st.integers(1, 11), pairs=st.integers(1, 30),
       temperature=st.sampled_from([0.05, 0.1, 1.0]), seed=st.integers(0, 2**16))
def test_full_softmax_with_item_bias_equals_the_materialised_one(b, i, chunk, pairs, temperature, seed):
    g = torch.Generator().manual_seed(seed)
    user = torch.randn(b, 5, generator=g, dtype=torch.float64, requires_grad=True)
    items = torch.randn(i, 5, generator=g, dtype=torch.float64, requires_grad=True)
    bias = (3 * torch.randn(i, generator=g, dtype=torch.float64)).requires_grad_()
    rows = torch.randint(0, b, (pairs,), generator=g)
    cols = torch.randint(0, i, (pairs,), generator=g)
    want = _materialised(user, items, bias, rows, cols, temperature)
    got = full_softmax_loss(user, items, rows, cols, temperature, chunk_rows=chunk, item_bias=bias)
    assert got.item() == pytest.approx(want.item(), rel=1e-10, abs=1e-12)
    for a, e in zip(torch.autograd.grad(got * 2.0, [user, items, bias]),
                    torch.autograd.grad(want * 2.0, [user, items, bias]), strict=True):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-8, atol=1e-12)


def test_full_softmax_bias_gradcheck_and_shape_error():
    g = torch.Generator().manual_seed(5)
    user = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    items = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    rows, cols = torch.tensor([0, 1, 1, 3]), torch.tensor([6, 0, 2, 2])
    assert torch.autograd.gradcheck(
        lambda u, v, c: full_softmax_loss(u, v, rows, cols, 0.5, chunk_rows=3, item_bias=c),
        (user, items, bias))
    with pytest.raises(ValueError, match=r"item_bias must be \[I=7\], got \(6,\)"):
        full_softmax_loss(user, items, rows, cols, 0.5, item_bias=bias[:6])


def test_sampled_softmax_and_bpr_add_the_bias_to_each_score():
    g = np.random.default_rng(2)
    u, p, n = g.normal(size=(3, 4)), g.normal(size=(3, 4)), g.normal(size=(5, 4))
    bp, bn = g.normal(size=3), g.normal(size=5)
    un = u / np.linalg.norm(u, axis=1, keepdims=True)
    pn = p / np.linalg.norm(p, axis=1, keepdims=True)
    nn_ = n / np.linalg.norm(n, axis=1, keepdims=True)
    s_pos = (un * pn).sum(1) / 0.2 + bp
    s_neg = un @ nn_.T / 0.2 + bn
    logits = np.concatenate([s_pos[:, None], s_neg], axis=1)
    want = np.mean(np.log(np.exp(logits).sum(1)) - s_pos)
    t = torch.from_numpy
    got = sampled_softmax_loss(t(u), t(p), t(n), 0.2, pos_bias=t(bp), neg_bias=t(bn))
    assert got.item() == pytest.approx(want, rel=1e-12)
    # BPR: one negative per pair, dot products
    n3, bn3 = n[:3], bn[:3]
    want_bpr = np.mean(np.log1p(np.exp((u * n3).sum(1) + bn3 - (u * p).sum(1) - bp)))
    assert bpr_pair_loss(t(u), t(p), t(n3), t(bp), t(bn3)).item() == pytest.approx(want_bpr, rel=1e-12)
    with pytest.raises(ValueError, match="pos_bias and neg_bias must be given together"):
        sampled_softmax_loss(t(u), t(p), t(n), 0.2, pos_bias=t(bp))
    with pytest.raises(ValueError, match=r"neg_bias \[K=5\], got \(3,\)"):
        sampled_softmax_loss(t(u), t(p), t(n), 0.2, pos_bias=t(bp), neg_bias=t(bn3))
    with pytest.raises(ValueError, match=r"must be \[B=3\]"):
        bpr_pair_loss(t(u), t(p), t(n3), t(bp[:2]), t(bn3))


@pytest.fixture(scope="module")
def tiny_split():
    from graphrl.datasets import synthetic_bipartite
    from graphrl.datasets.validation import holdout_validation

    return holdout_validation(synthetic_bipartite(120, 90, 2500, seed=3), fraction=0.1, seed=0)


def test_score_table_with_bias_gives_the_loss_logit(tiny_split):
    from graphrl.nn.lightgcn import LightGCN
    from graphrl.nn.sym_adjacency import SymNormAdjacency
    from graphrl.train.recommend import score_table

    ds = tiny_split.dataset
    model = LightGCN.from_graph(ds.graph, num_layers=2, embedding_dim=6, seed=1, node_bias=True)
    with torch.no_grad():
        model.bias.copy_(torch.linspace(-2, 2, model.num_nodes))
    adj = SymNormAdjacency.from_graph(ds.graph)
    users, items_t = score_table(model, adj, ds.num_users, cosine=True, temperature=0.25)
    assert users.shape == (ds.num_users, 7) and items_t.shape == (7, ds.num_items)
    z = F.normalize(model.propagate(adj).detach(), dim=1)
    want = z[:ds.num_users] @ z[ds.num_users:].t() / 0.25 + model.bias[ds.num_users:].detach()
    np.testing.assert_allclose((users @ items_t).numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    users, items_t = score_table(model, adj, ds.num_users, cosine=False, temperature=0.25)
    z = model.propagate(adj).detach()
    want = z[:ds.num_users] @ z[ds.num_users:].t() + model.bias[ds.num_users:].detach()
    np.testing.assert_allclose((users @ items_t).numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loss", ["full-softmax", "softmax", "bpr"])
def test_training_starts_the_bias_at_centred_log_degree_and_learns_it(tiny_split, loss):
    from graphrl.train.recommend import RecommendConfig, train_recommender

    ds = tiny_split.dataset
    deg = np.bincount(ds.user_item_csr("train")[1], minlength=ds.num_items)
    start = np.log1p(deg) - np.log1p(deg).mean()
    frozen = RecommendConfig(loss=loss, batch_size=40, lr=1e-12, epochs=1, minutes=None, eval_every=1,
                             embedding_dim=8, item_bias=True, num_negatives=16)
    report = train_recommender(tiny_split, frozen)
    bias = report.model.bias.detach().numpy()
    np.testing.assert_allclose(bias[ds.num_users:], start, atol=1e-6)
    np.testing.assert_array_equal(bias[:ds.num_users], 0.0)
    trained = train_recommender(tiny_split, RecommendConfig(
        loss=loss, batch_size=40, lr=1e-2, epochs=3, minutes=None, eval_every=1, embedding_dim=8,
        item_bias=True, num_negatives=16, patience=10))
    moved = trained.model.bias.detach().numpy()[ds.num_users:] - start
    assert np.abs(moved).max() > 1e-3          # the bias is trained (and restored with the best weights)
    assert "bias" in trained.model.state_dict()


def test_full_softmax_refuses_a_second_backward_and_bad_indices():
    g = torch.Generator().manual_seed(9)
    user = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    items = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    rows, cols = torch.tensor([0, 1, 3]), torch.tensor([5, 0, 2])
    loss = full_softmax_loss(user, items, rows, cols, 0.5)
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(loss, [user], create_graph=True)
    with pytest.raises(ValueError, match=r"cols must lie in \[0, 6\), got values in \[-1, 5\]"):
        full_softmax_loss(user, items, rows, torch.tensor([5, -1, 2]), 0.5)
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 4\), got values in \[0, 9\]"):
        full_softmax_loss(user, items, torch.tensor([0, 9, 1]), cols, 0.5)
    with pytest.raises(ValueError, match="rows and cols must be int64"):
        full_softmax_loss(user, items, rows.float(), cols, 0.5)
    # an integral float chunk size is taken as the int
    assert full_softmax_loss(user, items, rows, cols, 0.5, chunk_rows=2.0).item() == pytest.approx(
        full_softmax_loss(user, items, rows, cols, 0.5, chunk_rows=2).item(), rel=1e-12)


def test_score_table_and_trainer_check_their_arguments_before_work(tiny_split):
    from graphrl.nn.lightgcn import LightGCN
    from graphrl.nn.sym_adjacency import SymNormAdjacency
    from graphrl.train.recommend import RecommendConfig, score_table, train_recommender

    ds = tiny_split.dataset
    model = LightGCN.from_graph(ds.graph, num_layers=1, embedding_dim=4, seed=0, node_bias=True)
    adj = SymNormAdjacency.from_graph(ds.graph)
    with pytest.raises(ValueError, match="temperature must be > 0, got 0"):
        score_table(model, adj, ds.num_users, cosine=True, temperature=0)
    with pytest.raises(ValueError, match=r"num_users must lie in \[1, 210\), got -5"):
        score_table(model, adj, -5, cosine=True)
    with pytest.raises(ValueError, match=r"k must lie in \[1, num_items=90\], got 91"):
        train_recommender(tiny_split, RecommendConfig(k=91, epochs=1, minutes=None, embedding_dim=4))
    want = r"init='spectral' needs embedding_dim < min\(num_users, num_items\) = 90, got 90"
    with pytest.raises(ValueError, match=want):
        train_recommender(tiny_split, RecommendConfig(init="spectral", embedding_dim=90, epochs=1,
                                                      minutes=None))

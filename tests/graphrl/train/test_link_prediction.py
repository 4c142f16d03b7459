"""BPR loss by hand, the training loop's stopping rules, and a short run that must learn."""

from __future__ import annotations

import math

import pytest
import torch

from graphrl.datasets import synthetic_bipartite
from graphrl.nn import LightGCN
from graphrl.train import (
    LinkPredictionConfig,
    bpr_loss,
    evaluate_model,
    l2_penalty,
    run_link_prediction,
    train_bpr,
)
from samplers import LinkSampler, NeighborSampler


@pytest.fixture(scope="module")
def small():
    return synthetic_bipartite(600, 800, 24000, seed=0)


def test_bpr_loss_by_hand():
    pos = torch.tensor([2.0, 0.0])
    neg = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    # softplus(neg - pos): log(1 + e^-1), log(1 + e^1), log 2, log 2
    expect = (math.log1p(math.exp(-1)) + math.log1p(math.e) + 2 * math.log(2)) / 4
    assert bpr_loss(pos, neg).item() == pytest.approx(expect, rel=1e-6)


def test_l2_penalty_by_hand():
    a = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    b = torch.tensor([[[3.0, 0.0]], [[0.0, 0.0]]])
    assert l2_penalty(a, b, batch_size=2).item() == pytest.approx((1 + 4 + 1 + 9) / 2 / 2)


def link_sampler(ds, batch_size=512, seed=0):
    return LinkSampler(NeighborSampler(ds.graph, [5, 5], seed=seed), ds.train_users,
                       ds.train_items + ds.num_users, batch_size=batch_size, seed=seed)


def test_stopping_rules(small):
    model = LightGCN.from_graph(small.graph, num_layers=2, embedding_dim=8, seed=0)
    link = link_sampler(small)
    stats = train_bpr(model, link, epochs=0.5)
    assert stats.stopped_by == "epochs" and stats.steps == math.ceil(0.5 * len(link))
    assert stats.sampled_edges > 0 and stats.sampled_edges_per_s > 0 and len(stats.losses) == stats.steps
    stats = train_bpr(model, link, minutes=1e-6, epochs=10)
    assert stats.stopped_by == "minutes" and stats.steps == 1
    with pytest.raises(ValueError, match="epochs, minutes"):
        train_bpr(model, link)
    with pytest.raises(ValueError, match="epochs"):
        train_bpr(model, link, epochs=0)


def test_short_training_lowers_loss_and_beats_an_untrained_model(small):
    untrained = LightGCN.from_graph(small.graph, num_layers=2, embedding_dim=64, seed=0)
    base = evaluate_model(untrained, small.graph, small.num_users, small.user_item_csr("train"),
                          small.user_item_csr("test"))
    config = LinkPredictionConfig(fanouts=(5, 5), batch_size=512, lr=0.01, epochs=3, minutes=None, seed=0)
    report = run_link_prediction(small, config)
    losses = report.train.losses
    assert report.train.epochs == pytest.approx(3.0)
    first, last = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert first > 0.68  # log 2 at the start: scores near 0
    assert last < first - 0.1
    # Random ranking gives recall@20 ~ 20 / 800 = 0.025; the untrained model is near it.
    assert base.recall < 0.06
    assert report.test.recall > 0.15 and report.test.recall > 4 * base.recall
    assert report.test.ndcg > 3 * base.ndcg
    # The synthetic set is drawn from item popularity alone, so popularity is close to the best possible.
    assert report.test.recall > 0.7 * report.popularity.recall
    assert report.test.num_users == report.popularity.num_users == 600


def test_same_seed_same_training(small):
    config = LinkPredictionConfig(fanouts=(3, 3), batch_size=1024, epochs=0.3, minutes=None, seed=4,
                                  exclude="reverse")
    a = run_link_prediction(small, config)
    b = run_link_prediction(small, config)
    assert a.train.losses == b.train.losses
    assert torch.equal(a.model.embedding.weight, b.model.embedding.weight)

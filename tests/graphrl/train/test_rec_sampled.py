"""Sampled-block training of the recommender: equal to exact propagation when the fanouts take every
neighbour, and deterministic for a seed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from graphrl.datasets import synthetic_bipartite
from graphrl.train.rec_step import RecommenderSteps
from graphrl.train.recommend import RecommendConfig

BASE = RecommendConfig(loss="full-softmax", batch_size=32, lr=2e-2, embedding_dim=8, item_bias=True,
                       init="spectral", temperature=0.12, minutes=None, seed=3)


@pytest.fixture(scope="module")
def data():
    return synthetic_bipartite(120, 90, 1500, seed=1)


@pytest.mark.parametrize("loss", ["full-softmax", "softmax", "bpr"])
def test_sampled_with_every_neighbour_equals_exact(data, loss):
    cfg = dataclasses.replace(BASE, loss=loss, num_negatives=16)
    exact = RecommenderSteps(data, cfg)
    sampled = RecommenderSteps(data, dataclasses.replace(cfg, propagation="sampled", fanouts=(-1, -1, -1)))
    torch.testing.assert_close(sampled.model.embedding.weight, exact.model.embedding.weight, rtol=0, atol=0)
    for _ in range(3):  # the same batches and negatives: one batch-order generator for both
        l_exact, l_sampled = exact.step(2e-2), sampled.step(2e-2)
        assert l_sampled == pytest.approx(l_exact, rel=1e-5)
        for name, p in exact.model.named_parameters():
            q = dict(sampled.model.named_parameters())[name]
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(sampled.model.embedding.weight, exact.model.embedding.weight, rtol=1e-4,
                               atol=1e-5)
    assert sampled.sampled_edges > 0 and exact.sampled_edges == 0


def test_sampled_steps_are_deterministic_for_a_seed(data):
    cfg = dataclasses.replace(BASE, propagation="sampled", fanouts=(3, 2, 2))
    runs = [RecommenderSteps(data, cfg) for _ in range(2)]
    other = RecommenderSteps(data, dataclasses.replace(cfg, seed=4))
    for _ in range(3):
        losses = [r.step(2e-2) for r in (*runs, other)]
        assert losses[0] == losses[1]
    torch.testing.assert_close(runs[0].model.embedding.weight, runs[1].model.embedding.weight, rtol=0, atol=0)
    assert runs[0].sampled_edges == runs[1].sampled_edges
    # a fanout below the degrees draws fewer edges than the graph holds, and another seed other blocks
    assert runs[0].sampled_edges < 3 * 3 * data.graph.num_edges
    assert not torch.equal(other.model.embedding.weight, runs[0].model.embedding.weight)


def test_sampled_config_checks_the_fanouts():
    with pytest.raises(ValueError, match="fanouts"):
        RecommendConfig(propagation="sampled", fanouts=(10, 10))
    with pytest.raises(ValueError, match="fanouts"):
        RecommendConfig(propagation="sampled", fanouts=(10, 0, 10))
    with pytest.raises(ValueError, match="propagation"):
        RecommendConfig(propagation="blocks")

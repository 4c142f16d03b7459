"""The sampled recommender on LABOR blocks (RecommendConfig(sampler="labor")): the exact step when every
in-edge is kept, deterministic for a seed, other blocks than neighbour sampling's, and the option's checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from click.testing import CliRunner

from graphrl.cli import main
from graphrl.datasets import synthetic_bipartite
from graphrl.train.rec_step import RecommenderSteps
from graphrl.train.recommend import RecommendConfig
from samplers import LaborSampler, NeighborSampler

BASE = RecommendConfig(loss="softmax", num_negatives=16, batch_size=32, lr=2e-2, embedding_dim=8,
                       item_bias=True, temperature=0.12, minutes=None, seed=3, propagation="sampled",
                       sampler="labor")


@pytest.fixture(scope="module")
def data():
    return synthetic_bipartite(120, 90, 1500, seed=1)


def test_labor_keeping_every_edge_is_the_exact_step(data):
    exact = RecommenderSteps(data, dataclasses.replace(BASE, propagation="exact"))
    labor = RecommenderSteps(data, dataclasses.replace(BASE, fanouts=(-1, -1, -1)))
    assert isinstance(labor.sampler, LaborSampler)
    for _ in range(2):
        assert labor.step(2e-2) == pytest.approx(exact.step(2e-2), rel=1e-5)
        for name, p in exact.model.named_parameters():
            torch.testing.assert_close(dict(labor.model.named_parameters())[name].grad, p.grad, rtol=1e-4,
                                       atol=1e-6)


def test_labor_steps_are_seeded_and_differ_from_neighbour_sampling(data):
    cfg = dataclasses.replace(BASE, fanouts=(3, 2, 2))
    runs = [RecommenderSteps(data, cfg) for _ in range(2)]
    neighbor = RecommenderSteps(data, dataclasses.replace(cfg, sampler="neighbor"))
    assert isinstance(neighbor.sampler, NeighborSampler)
    for _ in range(3):
        losses = [r.step(2e-2) for r in (*runs, neighbor)]
        assert losses[0] == losses[1]
    torch.testing.assert_close(runs[0].model.embedding.weight, runs[1].model.embedding.weight, rtol=0, atol=0)
    assert runs[0].sampled_edges == runs[1].sampled_edges
    assert not torch.equal(neighbor.model.embedding.weight, runs[0].model.embedding.weight)


def test_sampler_option_is_checked():
    with pytest.raises(ValueError, match="sampler must be one of"):
        RecommendConfig(sampler="layer")
    result = CliRunner().invoke(main, ["train", "recommend", "--sampler", "layer"])
    assert result.exit_code == 2 and "--sampler" in result.output

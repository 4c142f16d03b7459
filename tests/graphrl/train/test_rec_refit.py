"""The refit after model selection: all training interactions, the selected step count, the same rates."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graphrl.datasets import synthetic_bipartite
from graphrl.datasets.validation import holdout_validation
from graphrl.train.rec_step import RecommenderSteps
from graphrl.train.recommend import RecommendConfig, score_table, train_recommender

CFG = RecommendConfig(loss="full-softmax", batch_size=64, lr=2e-2, epochs=6, minutes=None, eval_every=1,
                      embedding_dim=16, patience=3, schedule="cosine", item_bias=True, init="spectral")


@pytest.fixture(scope="module")
def data():
    source = synthetic_bipartite(300, 400, 9000, seed=0)
    return source, holdout_validation(source, fraction=0.1, seed=0)


def _numpy_recall_ndcg(scores: np.ndarray, train_pairs, test_pairs, k: int):
    """Recall@k and NDCG@k over the users with a test item, by plain numpy (training items masked)."""
    scores = scores.copy()
    tu, ti = train_pairs
    scores[tu, ti] = -np.inf
    recalls, ndcgs = [], []
    for u in np.unique(test_pairs[0]):
        truth = set(test_pairs[1][test_pairs[0] == u].tolist())
        top = np.argsort(-scores[u], kind="stable")[:k]
        hits = np.array([int(i) in truth for i in top], dtype=float)
        recalls.append(hits.sum() / len(truth))
        ideal = (1.0 / np.log2(np.arange(2, min(len(truth), k) + 2))).sum()
        ndcgs.append((hits / np.log2(np.arange(2, k + 2))).sum() / ideal)
    return float(np.mean(recalls)), float(np.mean(ndcgs))


def test_refit_trains_on_every_training_interaction_to_the_selected_step(data):
    source, split = data
    report = train_recommender(split, CFG, refit=True)
    assert 0 < report.best_step <= report.steps
    assert report.best_step == next(e["step"] for e in report.curve if e["epoch"] == report.best_epoch)
    # the refit's graph is the source's: the validation interactions are edges again
    refit = report.refit_model
    assert refit is not None and refit.num_nodes == source.num_users + source.num_items
    src_edges = source.graph.num_edges
    assert split.val_users.numel() > 0
    assert refit.deg_in.sum().item() == src_edges == 2 * source.train_users.numel()
    assert split.dataset.graph.num_edges == src_edges - 2 * split.val_users.numel()
    # the same weights as stepping a fresh run on the source with the selection run's learning rates
    again = RecommenderSteps(source, CFG)
    max_steps = math.ceil(CFG.epochs * again.per_epoch)
    lrs = [_cosine(CFG, s / max_steps) for s in range(report.best_step)]
    for lr in lrs:
        again.step(lr)
    torch.testing.assert_close(again.model.embedding.weight, refit.embedding.weight, rtol=0, atol=0)
    # its test figures rank every item, all training interactions (validation included) masked
    users, items_t = score_table(refit, again.adj, source.num_users, cosine=True, temperature=CFG.temperature)
    scores = (users @ items_t).numpy()
    recall, ndcg = _numpy_recall_ndcg(scores, (source.train_users.numpy(), source.train_items.numpy()),
                                      (source.test_users.numpy(), source.test_items.numpy()), CFG.k)
    assert report.refit_test.recall == pytest.approx(recall, abs=1e-6)
    assert report.refit_test.ndcg == pytest.approx(ndcg, abs=1e-6)
    assert report.refit_seconds > 0


def _cosine(cfg, progress):
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def test_refit_is_refused_without_a_source_or_with_the_plateau_schedule(data):
    _, split = data
    with pytest.raises(ValueError, match="schedule='plateau'"):
        train_recommender(split, RecommendConfig(**{**CFG.__dict__, "schedule": "plateau"}), refit=True)
    bare = type(split)(dataset=split.dataset, val_users=split.val_users, val_items=split.val_items,
                       train_index=split.train_index, val_index=split.val_index)
    with pytest.raises(ValueError, match="source None"):
        train_recommender(bare, CFG, refit=True)


def test_without_refit_the_report_has_none_and_the_split_keeps_its_source(data):
    source, split = data
    assert split.source is source
    cfg = RecommendConfig(**{**CFG.__dict__, "epochs": 1})
    report = train_recommender(split, cfg)
    assert report.refit_test is None and report.refit_model is None and report.refit_seconds == 0.0

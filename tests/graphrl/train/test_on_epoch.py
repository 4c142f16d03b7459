"""The trainers' ``on_epoch`` observers: called once per epoch with the values, and training unchanged."""

from __future__ import annotations

import pytest
import torch

from graphrl.datasets import synthetic_bipartite
from graphrl.train import LinkPredictionConfig, run_link_prediction, run_node_classification


def test_run_link_prediction_on_epoch_sees_each_epoch_and_changes_nothing():
    ds = synthetic_bipartite(300, 400, 6000, seed=0)
    config = LinkPredictionConfig(fanouts=(4, 4), batch_size=512, embedding_dim=16, minutes=None, epochs=2,
                                  prefetch=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same float sums in both runs
    try:
        plain = run_link_prediction(ds, config)
        seen = []
        observed = run_link_prediction(ds, config, on_epoch=lambda e, r: seen.append((e, r.recall, r.ndcg)))
    finally:
        torch.set_num_threads(threads)
    assert [e for e, _, _ in seen] == [1, 2]
    assert observed.train.losses == pytest.approx(plain.train.losses, rel=1e-5)
    assert seen[-1][1:] == pytest.approx((observed.test.recall, observed.test.ndcg))
    assert observed.test.recall == pytest.approx(plain.test.recall, abs=1e-6)


def test_run_node_classification_on_epoch_values_end_at_the_result():
    try:
        plain = run_node_classification("cora", epochs=5)
    except FileNotFoundError as err:
        pytest.skip(f"Cora data missing: {err}")
    seen = {}
    observed = run_node_classification("cora", epochs=5, seeds=1,
                                       on_epoch=lambda s, e, v: seen.setdefault(s, []).append((e, v)))
    assert list(seen) == [0] and [e for e, _ in seen[0]] == [1, 2, 3, 4, 5]
    last = seen[0][-1][1]
    assert set(last) == {"loss", "train_acc", "val_acc", "test_acc"}
    assert last["test_acc"] == observed.results[0].test_acc == plain.results[0].test_acc
    assert [v["loss"] for _, v in seen[0]] == observed.results[0].losses == plain.results[0].losses

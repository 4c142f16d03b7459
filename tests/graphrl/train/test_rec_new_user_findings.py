"""A new user's findings on ``graphrl train recommend`` / `train_recommender`, each fixed and pinned here.

Every test states the documented (or plainly expected) behaviour; each failed before its fix. Tiny data
only: each test trains for a handful of full-graph steps.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from graphrl.cli import main
from graphrl.datasets import load_gowalla, synthetic_bipartite
from graphrl.datasets.validation import holdout_validation
from graphrl.train import rec_step
from graphrl.train.recommend import RecommendConfig, train_recommender


def _write_gowalla(root, train_lines, test_lines):
    folder = root / "gowalla"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text("\n".join(" ".join(map(str, line)) for line in train_lines) + "\n")
    (folder / "test.txt").write_text("\n".join(" ".join(map(str, line)) for line in test_lines) + "\n")
    return root


def _tiny_gowalla(root, num_users, num_items, per_user=6, seed=0):
    """Every user: ``per_user`` distinct items, the last two of them in test."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for u in range(num_users):
        items = rng.choice(num_items, size=per_user, replace=False).tolist()
        train.append([u, *items[:-2]])
        test.append([u, *items[-2:]])
    return _write_gowalla(root, train, test)


def _cli(*args):
    return CliRunner().invoke(main, ["train", "recommend", "--no-progress", *map(str, args)])


def test_same_seed_twice_gives_the_same_curve_with_the_cli_defaults():
    split = holdout_validation(synthetic_bipartite(120, 150, 2500, seed=0), fraction=0.2, seed=0)
    # the CLI's defaults (spectral init, cosine, 60 minutes), scaled down
    cfg = RecommendConfig(loss="full-softmax", batch_size=32, epochs=2, minutes=60.0, eval_every=0.01,
                          embedding_dim=8, init="spectral", schedule="cosine", item_bias=True,
                          temperature=0.12)
    a = train_recommender(split, cfg)
    b = train_recommender(split, cfg)
    assert a.curve[0]["step"] == 1  # the premise: the first step's learning rate is recorded
    assert [e["lr"] for e in a.curve] == [e["lr"] for e in b.curve]
    assert [e["loss"] for e in a.curve] == [e["loss"] for e in b.curve]


def test_an_empty_validation_split_is_refused():
    source = synthetic_bipartite(60, 80, 400, seed=0)
    cfg = RecommendConfig(loss="full-softmax", batch_size=16, epochs=3, minutes=None, eval_every=1,
                          embedding_dim=8, schedule="cosine")
    with pytest.raises(ValueError, match="validation"):
        split = holdout_validation(source, fraction=1e-4, seed=0)
        assert split.val_users.numel() == 0  # the premise: nothing was held out
        train_recommender(split, cfg, refit=True)


def test_a_repeated_training_pair_is_never_both_train_and_validation(tmp_path):
    rng = np.random.default_rng(0)
    train, test = [], []
    for u in range(30):
        items = rng.choice(40, size=8, replace=False).tolist()
        train.append([u, *items[:6], *items[:3]])  # repeated check-ins, as in raw Gowalla
        test.append([u, *items[6:]])
    _write_gowalla(tmp_path, train, test)
    ds = load_gowalla(tmp_path)
    with pytest.raises(ValueError, match=r"repeats 90 training .* e\.g\. user 0, item \d+: "):
        holdout_validation(ds, fraction=0.3, seed=0)
    result = _cli("--data-root", tmp_path, "--dim", 4, "--epochs", 1)
    assert result.exit_code == 1 and "deduplicate" in result.output, result.output


def test_curve_loss_is_the_mean_since_the_previous_evaluation(monkeypatch):
    split = holdout_validation(synthetic_bipartite(100, 120, 2000, seed=1), fraction=0.2, seed=0)
    cfg = RecommendConfig(loss="bpr", batch_size=400, epochs=1.5, minutes=None, eval_every=1.0,
                          embedding_dim=8, schedule="cosine")
    losses = []
    step = rec_step.RecommenderSteps.step

    def spy(self, lr):
        losses.append(step(self, lr))
        return losses[-1]

    monkeypatch.setattr(rec_step.RecommenderSteps, "step", spy)
    report = train_recommender(split, cfg)
    steps = [e["step"] for e in report.curve]
    assert len(steps) == 2 and steps[1] % steps[0], steps  # the premise: the last one is off the grid
    for prev, entry in zip([0, *steps[:-1]], report.curve, strict=True):
        assert entry["loss"] == pytest.approx(float(np.mean(losses[prev:entry["step"]])), rel=1e-12)


def test_fractional_epochs_are_a_maximum():
    split = holdout_validation(synthetic_bipartite(60, 80, 900, seed=0), fraction=0.2, seed=0)
    cfg = RecommendConfig(loss="full-softmax", batch_size=2048, epochs=2.5, minutes=None, eval_every=1,
                          embedding_dim=8, schedule="cosine")
    report = train_recommender(split, cfg)
    assert report.epochs <= cfg.epochs


def test_cli_with_fewer_items_than_k_trains_or_names_an_option(tmp_path):
    _tiny_gowalla(tmp_path, num_users=30, num_items=12)
    result = _cli("--data-root", tmp_path, "--dim", 4, "--epochs", 1, "--eval-every", 1)
    error = result.output.strip().splitlines()[-1]
    assert result.exit_code == 0 or "--" in error, error


def test_cli_spectral_dim_error_names_the_dim_option(tmp_path):
    _tiny_gowalla(tmp_path, num_users=30, num_items=40)
    result = _cli("--data-root", tmp_path, "--dim", 64, "--epochs", 1)
    assert result.exit_code == 2
    assert "--dim" in result.output, result.output


def test_cli_unusable_out_is_refused_before_training(tmp_path):
    _tiny_gowalla(tmp_path, num_users=30, num_items=40)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    result = _cli("--data-root", tmp_path, "--dim", 4, "--epochs", 1, "--out", blocker / "run")
    assert "stopped by" not in result.output  # refused before any training
    assert result.exit_code == 2 and "--out" in result.output, result.output

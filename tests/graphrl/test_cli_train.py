"""``graphrl train recommend``: registered under the main command, options validated before any work."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from graphrl.cli import main


def test_train_recommend_is_registered_and_documents_its_options():
    result = CliRunner().invoke(main, ["train", "recommend", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--val-fraction", "--eval-every", "--patience", "--lr-patience", "--loss", "--out"):
        assert option in result.output


@pytest.mark.parametrize("args, name", [
    (["--val-fraction", "1.5"], "--val-fraction"),
    (["--loss", "hinge"], "--loss"),
    (["--lr-decay", "0"], "--lr-decay"),
    (["--batch-size", "0"], "--batch-size"),
    (["--propagation", "sampled", "--fanouts", "10,x,10"], "--fanouts"),
    (["--propagation", "blocks"], "--propagation"),
    (["--propagation", "sampled", "--fanouts", "0,0,0"], "--fanouts"),  # before Gowalla is loaded
    (["--propagation", "sampled", "--fanouts", "10,10"], "--fanouts"),
    (["--fanouts", "0,0,0"], "--fanouts"),  # exact propagation: a sampler option would be ignored
    (["--sampler", "labor"], "--sampler"),
])
def test_train_recommend_rejects_bad_options(args, name, tmp_path):
    result = CliRunner().invoke(main, ["train", "recommend", "--data-root", str(tmp_path), *args])
    assert result.exit_code == 2 and name in result.output, result.output


def test_train_recommend_names_the_missing_data_folder(tmp_path):
    result = CliRunner().invoke(main, ["train", "recommend", "--data-root", str(tmp_path)])
    assert result.exit_code == 1 and str(tmp_path) in result.output


def test_train_recommend_defaults_are_the_documented_recipe(tmp_path):
    import json
    import re

    rng = __import__("numpy").random.default_rng(0)
    folder = tmp_path / "gowalla"
    folder.mkdir()
    train, test = [], []
    for u in range(40):
        items = rng.choice(30, size=8, replace=False)
        train.append(" ".join(map(str, [u, *items[:6]])))
        test.append(" ".join(map(str, [u, *items[6:]])))
    (folder / "train.txt").write_text("\n".join(train) + "\n")
    (folder / "test.txt").write_text("\n".join(test) + "\n")
    result = CliRunner().invoke(main, ["train", "recommend", "--data-root", str(tmp_path), "--epochs", "2",
                                       "--dim", "8", "--no-progress"])
    assert result.exit_code == 0, result.output
    config = json.loads(re.search(r"^config: (\{.*\})$", result.output, re.M).group(1))
    assert (config["loss"], config["init"], config["item_bias"], config["schedule"]) == (
        "full-softmax", "spectral", True, "cosine")
    assert (config["eval_every"], config["patience"], config["temperature"]) == (4.0, 10, 0.12)
    assert "fraction 0.2)" in result.output  # the validation split's share
    help_text = CliRunner().invoke(main, ["train", "recommend", "--help"]).output
    assert re.search(r"--epochs FLOAT[^[]*\[default: 40\.0;", help_text)
    assert re.search(r"^best epoch 2\.00: validation recall@20 0\.\d{4}; test recall@20 0\.\d{4}",
                     result.output, re.M)
    # the refit on all training interactions is the default: to the selected step (2 epochs of 40 users
    # at 2048 users a step: 1 step each)
    assert re.search(r"^refit on all training interactions to step 2 \(epoch 2\.00\).*test recall@20 "
                     r"0\.\d{4}", result.output, re.M), result.output


def test_a_second_run_into_the_same_out_folder_leaves_no_stale_refit(tmp_path):
    import json

    rng = __import__("numpy").random.default_rng(1)
    folder = tmp_path / "gowalla"
    folder.mkdir()
    rows = [(u, rng.choice(30, size=8, replace=False)) for u in range(40)]
    (folder / "train.txt").write_text("".join(" ".join(map(str, [u, *i[:6]])) + "\n" for u, i in rows))
    (folder / "test.txt").write_text("".join(" ".join(map(str, [u, *i[6:]])) + "\n" for u, i in rows))
    out = tmp_path / "run"
    args = ["train", "recommend", "--data-root", str(tmp_path), "--epochs", "2", "--dim", "8",
            "--no-progress", "--out", str(out)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert (out / "refit.pt").is_file() and json.loads((out / "curve.json").read_text())["refit_test"]
    second = CliRunner().invoke(main, [*args, "--no-refit"])
    assert second.exit_code == 0, second.output
    assert not (out / "refit.pt").exists() and f"removed {out / 'refit.pt'}" in second.output
    assert json.loads((out / "curve.json").read_text())["refit_test"] is None
    assert (out / "best.pt").is_file()

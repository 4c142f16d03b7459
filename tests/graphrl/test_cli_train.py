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
])
def test_train_recommend_rejects_bad_options(args, name):
    result = CliRunner().invoke(main, ["train", "recommend", *args])
    assert result.exit_code == 2 and name in result.output


def test_train_recommend_names_the_missing_data_folder(tmp_path):
    result = CliRunner().invoke(main, ["train", "recommend", "--data-root", str(tmp_path)])
    assert result.exit_code == 1 and str(tmp_path) in result.output

"""examples/gowalla_chebycf.py's command line: bad settings are click usage errors naming the option, refused
before Gowalla is loaded (the data root here is empty), and an unwritable --out before the tuning."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gowalla_chebycf.py"


@pytest.fixture(scope="module")
def example(load_script):
    return load_script(EXAMPLE)


@pytest.mark.parametrize(("args", "flag"), [
    (["--flatness", "-1"], "--flatness"), (["--flatness", "0"], "--flatness"),
    (["--tune", "--orders", "a"], "--orders"), (["--tune", "--orders", "0,8"], "--orders"),
    (["--tune", "--betas", "0.3,x"], "--betas"), (["--tune", "--flatnesses", "1,-2"], "--flatnesses"),
    (["--tune", "--ideal-ks", "-1"], "--ideal-ks"), (["--tune", "--ideal-weights", ""], "--ideal-weights"),
    (["--tune", "--out", "/proc/no/grid.json"], "--out")])
def test_bad_settings_are_usage_errors_before_loading(example, tmp_path, args, flag):
    result = CliRunner().invoke(example.main, ["--data-root", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert flag in result.output

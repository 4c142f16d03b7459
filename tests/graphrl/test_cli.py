"""The ``graphrl`` command through click's CliRunner: info fields, a tiny demo, the missing-data path."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from graphrl import __version__
from graphrl.cli import main

TINY = ["--synthetic-size", "300,400,6000", "--epochs", "1", "--batch-size", "512", "--fanouts", "4,4",
        "--dim", "16", "--task", "recommend"]


def run(args, env=None):
    result = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    return result


def test_info_lists_versions_threads_and_accelerators():
    result = run(["info"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"graphrl {__version__}" in out
    for field in ("torch ", "numba ", "numpy ", "torch threads: ", "numba threads: ", "CUDA available: ",
                  "numba.cuda available: ", "DGL available: "):
        assert re.search(rf"^{re.escape(field)}\S", out, re.M), f"missing {field!r} in:\n{out}"
    assert re.search(r"^torch threads: \d+", out, re.M)
    assert re.search(r"^DGL available: (yes \([\d.]+\)|no)", out, re.M)


def test_demo_on_synthetic_prints_the_metric_lines():
    result = run(["demo", "--dataset", "synthetic", *TINY])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "not found" not in out
    assert re.search(r"^data: synthetic: 300 users, 400 items", out, re.M)
    assert re.search(r"^test recall@20: 0\.\d{4}  NDCG@20: 0\.\d{4}", out, re.M)
    assert re.search(r"^popularity baseline recall@20: 0\.\d{4}  NDCG@20: 0\.\d{4}", out, re.M)
    assert re.search(r"^sampler throughput: [\d,]+ sampled edges/s", out, re.M)
    assert "stopped by epochs" in out


def test_demo_without_data_says_so_once_and_uses_synthetic(tmp_path):
    missing = tmp_path / "nowhere"
    result = run(["demo", "--data-root", str(missing), *TINY])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.count("not found") == 1
    assert f"Gowalla data not found at {missing / 'gowalla'}" in out
    assert "using synthetic_bipartite(300, 400, 6000)" in out
    assert re.search(r"^test recall@20: ", out, re.M)


def test_demo_reads_graphrl_data_when_no_root_is_given(tmp_path):
    result = run(["demo", *TINY], env={"GRAPHRL_DATA": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert f"Gowalla data not found at {tmp_path / 'gowalla'}" in result.output


@pytest.mark.parametrize("args, name", [
    (["--fanouts", "10,x"], "--fanouts"),
    (["--fanouts", "10,0"], "--fanouts"),
    (["--synthetic-size", "1,2"], "--synthetic-size"),
    (["--batch-size", "0"], "--batch-size"),
    (["--dataset", "cora"], "--dataset"),
])
def test_demo_rejects_bad_options(args, name):
    result = run(["demo", "--task", "recommend", "--dataset", "synthetic", "--epochs", "1", *args])
    assert result.exit_code == 2
    assert name in result.output


def test_demo_explicit_gowalla_fails_with_the_path_instead_of_substituting(tmp_path):
    result = CliRunner().invoke(main, ["demo", "--dataset", "gowalla", *TINY],
                                env={"GRAPHRL_DATA": str(tmp_path)})
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: Gowalla data not found at {tmp_path / 'gowalla'}")
    assert "--dataset synthetic" in lines[0] and "using synthetic" not in result.output


def test_demo_default_dataset_falls_back_with_one_line_naming_the_path(tmp_path):
    result = run(["demo", *TINY], env={"GRAPHRL_DATA": str(tmp_path)})
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.output.splitlines() if "not found" in x]
    assert line.startswith(f"Gowalla data not found at {tmp_path / 'gowalla'}")
    assert "using synthetic_bipartite(300, 400, 6000) instead (--dataset gowalla makes this an error)" in line
    assert re.search(r"^data: synthetic: 300 users", result.output, re.M)

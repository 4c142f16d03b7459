"""The ``graphrl`` command through click's CliRunner: info fields, a tiny demo, the missing-data path."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from graphrl import __version__
from graphrl.cli import main

TINY = ["--synthetic-size", "300,400,6000", "--epochs", "1", "--batch-size", "512", "--fanouts", "4,4",
        "--dim", "16", "--task", "recommend", "--propagation", "sampled-bpr"]
EXACT = ["--synthetic-size", "300,400,6000", "--epochs", "2", "--dim", "16", "--task", "recommend"]


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
    # the memory line writes sizes as graphrl.memory.sizes.format_size does: '5.5 KiB (5608 bytes)'
    memory = re.search(r"^memory: (.*)$", out, re.M).group(1)
    sizes = re.findall(r"([\d.]+) KiB \((\d+) bytes\)", memory)
    assert sizes, memory
    assert all(f"{int(n) / 1024:.1f}" == human for human, n in sizes), memory


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
    (["--fanouts", "5,5"], "--fanouts"),  # sampled propagation: one per layer, refused before the data
    (["--synthetic-size", "1,2"], "--synthetic-size"),
    (["--batch-size", "0"], "--batch-size"),
    (["--dataset", "cora"], "--dataset"),
])
def test_demo_rejects_bad_options(args, name):
    result = run(["demo", "--task", "recommend", "--dataset", "synthetic", "--epochs", "1", "--propagation",
                  "sampled", *args])
    assert result.exit_code == 2
    assert name in result.output


@pytest.mark.parametrize("budget", ["lots", "-5MiB", "12 parsecs"])
def test_a_bad_device_budget_is_refused_before_any_task_runs(budget):
    # --task all runs recommend first: the budget (a node-classification option) is checked at parse time
    result = run(["demo", "--dataset", "synthetic", "--device-budget", budget])
    assert result.exit_code == 2 and "Invalid value for '--device-budget'" in result.output
    assert f"cannot parse size {budget!r}" in result.output
    assert "== recommend ==" not in result.output


@pytest.mark.parametrize("flag, value", [("--fanouts", "5,5"), ("--batch-size", "64"), ("--exclude", "self")])
def test_demo_exact_rejects_the_sampled_path_options(flag, value):
    result = run(["demo", "--dataset", "synthetic", *EXACT, "--propagation", "exact", flag, value])
    assert result.exit_code == 2
    assert f"{flag} applies to --propagation sampled-bpr, not exact" in result.output


def test_demo_sampled_trains_the_recipe_on_blocks_deterministically():
    # the demo shows the engine: sampled blocks are its default
    assert next(p for p in main.commands["demo"].params if p.name == "propagation").default == "sampled"
    args = ["demo", "--dataset", "synthetic", *EXACT, "--propagation", "sampled", "--fanouts", "5,5,5"]
    outs = [run(args) for _ in range(2)]
    assert all(r.exit_code == 0 for r in outs), outs[0].output
    out = outs[0].output
    assert "sampled blocks (NeighborSampler, fanouts [5, 5, 5], full-degree estimator)" in out
    # the kernels compile before the budget's clock starts (tests/graphrl/test_demo_compile.py: all of them)
    compiling = re.search(r"^compiling kernels \(cached after the first run\): \d+\.\d s$", out, re.M)
    assert compiling and compiling.start() < out.index("trained "), out
    assert re.search(r"^sampler throughput: [\d,]+ sampled edges/s \([\d,]+ edges in", out, re.M)
    recall = re.search(r"^test recall@20: (0\.\d{4})  NDCG@20: 0\.\d{4}.*$", out, re.M)
    assert float(recall.group(1)) > 2 * 20 / 400
    # the same seed: the same batches, blocks and weights, so the same figures
    assert recall.group(0) in outs[1].output
    assert run(["demo", "--dataset", "synthetic", *EXACT, "--propagation", "sampled", "--batch-size",
                "64"]).exit_code == 2


def test_demo_exact_trains_the_recipe_well_above_a_random_ranking():
    result = run(["demo", "--dataset", "synthetic", *EXACT, "--propagation", "exact"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "exact propagation; softmax over all 400 items" in out and "spectral start" in out
    assert re.search(r"trained [\d.]+ s \(\d+ CPU s\): \d+ steps, 2\.00 epochs, stopped by epochs", out, re.M)
    recall = float(re.search(r"^test recall@20: (0\.\d{4})  NDCG@20: 0\.\d{4}", out, re.M).group(1))
    assert re.search(r"^popularity baseline recall@20: 0\.\d{4}", out, re.M)
    assert recall > 2 * 20 / 400   # a random ranking's expected recall@20 is about 20 / 400


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

"""graphrl.bench and ``graphrl bench``: benchmarks run as subprocesses into a folder; --from-json re-plots.

The real benchmarks are not run here (they take minutes); a stand-in ``sampler.py`` checks the plumbing.
"""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from graphrl import bench
from graphrl.cli import main

FAKE = '''
import json, os, sys
out = sys.argv[sys.argv.index("--output") + 1]
rows = [{"case": "uniform 1k/10k [2] b8", "metric": "sampled_edges_per_s", "ours": 2e6,
         "baseline": "dgl 2.1.0", "baseline_value": 1e6, "ratio": 2.0, "argv": sys.argv[1:-2],
         "python": sys.executable}]
json.dump({"benchmark": "sampler", "machine": {"cpus": os.cpu_count()}, "rows": rows}, open(out, "w"))
print("table printed here")
'''


@pytest.fixture
def fake_benchmarks(tmp_path):
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "sampler.py").write_text(FAKE)
    (folder / "replay.py").write_text("import sys; print('boom'); sys.exit(3)\n")
    return folder


def test_quick_args_name_every_benchmark_and_the_folder_exists():
    assert set(bench.QUICK_ARGS) == set(bench.BENCHMARKS)
    folder = bench.benchmarks_dir()
    for name in bench.BENCHMARKS:
        assert (folder / f"{name}.py").is_file()


def test_run_benchmarks_runs_each_in_this_python_and_records_the_run(fake_benchmarks, tmp_path):
    lines = []
    record = bench.run_benchmarks(["sampler", "replay"], tmp_path / "out", folder=fake_benchmarks,
                                  extra_args={"sampler": ["--batches", "2"], "replay": []}, echo=lines.append)
    out = tmp_path / "out"
    result = json.loads((out / "sampler.json").read_text())
    assert result["rows"][0]["argv"] == ["--batches", "2"]
    assert result["rows"][0]["python"] == sys.executable
    assert "table printed here" in (out / "sampler.log").read_text()
    assert record["benchmarks"]["sampler"]["returncode"] == 0
    assert record["benchmarks"]["replay"]["returncode"] == 3
    assert any("replay: FAILED (exit 3" in line for line in lines)
    saved = json.loads((out / "bench.json").read_text())
    assert saved["machine"]["cpus"] >= 1 and len(saved["machine"]["load_average_1min"]) == 2
    results, rec = bench.load_results(out)
    assert list(results) == ["sampler"] and rec["seconds"] == record["seconds"]


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmarks \\['gpu'\\]"):
        bench.run_benchmarks(["gpu"], tmp_path)
    with pytest.raises(FileNotFoundError, match=f"no benchmarks in {tmp_path}"):
        bench.benchmarks_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no benchmark results"):
        bench.load_results(tmp_path)


def test_cli_bench_runs_and_plots(fake_benchmarks, tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the plot extra: pip install 'graphrl[plot]'")
    out, png = tmp_path / "out", tmp_path / "png"
    result = CliRunner().invoke(main, ["bench", "--only", "sampler", "--out", str(out), "--plot", str(png),
                                       "--benchmarks", str(fake_benchmarks)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "bench: 1 of 1 benchmarks ran" in result.output
    assert (png / "bench_sampler.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_bench_from_json_replots_without_running(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the plot extra: pip install 'graphrl[plot]'")
    src = tmp_path / "results"
    src.mkdir()
    rows = [{"case": "0.2M x 128 f32, 50k rows", "metric": "gather_GB_per_s", "ours": 6.0,
             "baseline": "torch index_select", "baseline_value": 2.5, "ratio": 2.4,
             "copy_ceiling_GB_per_s": 8.0, "index_select_out_GB_per_s": 4.0}]
    result = {"benchmark": "features", "machine": {"cpus": 2}, "rows": rows}
    (src / "features.json").write_text(json.dumps(result))
    (src / "notes.json").write_text("[1, 2]")  # not a benchmark result: ignored
    result = CliRunner().invoke(main, ["bench", "--from-json", str(src), "--plot", str(tmp_path / "png")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "benchmarks ran" not in result.output
    assert [p.name for p in (tmp_path / "png").iterdir()] == ["bench_features.png"]
    result = CliRunner().invoke(main, ["bench", "--from-json", str(src)])
    assert result.exit_code == 2 and "--from-json only plots: give --plot DIR too" in result.output


def test_cli_bench_plot_without_matplotlib_says_which_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    result = CliRunner().invoke(main, ["bench", "--from-json", str(tmp_path), "--plot", str(tmp_path / "p")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: plotting needs matplotlib: pip install 'graphrl[plot]' (or bash scripts/setup.sh test,plot)"]

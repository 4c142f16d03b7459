"""graphrl.plots and graphrl.curves: figures of hand-made benchmark rows and curves are real PNGs."""

from __future__ import annotations

import json

import pytest

from graphrl.curves import DemoCurves

pytest.importorskip("matplotlib", reason="plots need the plot extra: pip install 'graphrl[plot]'")

from matplotlib.image import imread  # noqa: E402

from graphrl import plots  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
MACHINE = {"cpus": 2, "platform": "Linux x86_64", "load_average_1min": [3.5, 6.25], "date": "2026-12-01"}

SAMPLER = {"benchmark": "sampler", "machine": {"cpus": 2}, "rows": [
    {"case": "uniform 200k/4M [15,10,5] b1024", "metric": "sampled_edges_per_s", "ours": 4.1e7,
     "baseline": "dgl 2.1.0", "baseline_value": 2.4e7, "ratio": 1.7,
     "baseline_pyg": "pyg 2.6.1 (torch-sparse)", "baseline_pyg_value": 1.0e7, "ratio_pyg": 4.1},
    {"case": "uniform 200k/4M [15,10,5] b1024 weighted", "metric": "sampled_edges_per_s", "ours": 2.0e7,
     "baseline": "dgl 2.1.0", "baseline_value": 1.0e7, "ratio": 2.0,
     "baseline_pyg": "pyg 2.6.1 (torch-sparse)", "baseline_pyg_value": None, "ratio_pyg": None}]}
REPLAY = {"benchmark": "replay", "machine": {"cpus": 2}, "rows": [
    {"case": "small (29 B/step) insert vs copy", "metric": "steps_per_s", "ours": 1e7,
     "baseline": "numpy copyto", "baseline_value": 3e7, "ratio": 0.33, "ours_gb_per_s": 0.29,
     "baseline_gb_per_s": 0.87},
    {"case": "small (29 B/step) sample B=256 L=64 vs copy", "metric": "windows_per_s", "ours": 4e4,
     "baseline": "numpy copyto (ceiling)", "baseline_value": 9e4, "ratio": 0.44, "ours_gb_per_s": 0.5,
     "baseline_gb_per_s": 1.1},
    {"case": "small (29 B/step) sample B=256 L=64 vs TorchRL", "metric": "windows_per_s", "ours": 4e4,
     "baseline": "torchrl SliceSampler (cache_values)", "baseline_value": 2e3, "ratio": 20.0,
     "ours_gb_per_s": 0.5, "baseline_gb_per_s": 0.025},
    {"case": "small (29 B/step) sample B=256 transitions vs cpprb", "metric": "samples_per_s", "ours": 1e6,
     "baseline": "cpprb ReplayBuffer.sample", "baseline_value": 5e5, "ratio": 2.0},
    {"case": "image (12301 B/step) sample B=256 L=64 vs copy", "metric": "windows_per_s", "ours": 800.0,
     "baseline": "numpy copyto (ceiling)", "baseline_value": 1000.0, "ratio": 0.8, "ours_gb_per_s": 8.0,
     "baseline_gb_per_s": 10.0}]}
FEATURES = {"benchmark": "features", "machine": {"cpus": 2}, "rows": [
    {"case": "0.2M x 128 f32, 50k rows", "metric": "gather_GB_per_s (median of rounds)", "ours": 6.0,
     "baseline": "torch 2.13.0 index_select (fresh tensor)", "baseline_value": 2.5, "ratio": 2.4,
     "copy_ceiling_GB_per_s": 8.0, "index_select_out_GB_per_s": 4.0}]}
FULL_GRAPH = {"benchmark": "full_graph", "machine": {"cpus": 2}, "rows": [
    {"case": "uniform 20,000/400,000 d128 ours", "metric": "epoch_seconds", "ours": 0.20,
     "baseline": "dgl 2.1.0 GraphConv", "baseline_value": 0.30, "ratio": 1.5, "device_budget_bytes": None,
     "partitions": {"128": 1}},
    {"case": "uniform 20,000/400,000 d128 ours-budget", "metric": "epoch_seconds", "ours": 0.26,
     "baseline": "dgl 2.1.0 GraphConv", "baseline_value": 0.30, "ratio": 1.15,
     "device_budget_bytes": 3 * 2**20, "partitions": {"128": 4, "16": 1}},
    {"case": "uniform 20,000/400,000 d128 staged-1/4", "metric": "epoch_seconds", "ours": 0.31,  # a count
     "baseline": "dgl 2.1.0 GraphConv", "baseline_value": 0.30, "ratio": 0.97,
     "device_budget_bytes": 2**20, "partitions": 65}]}
RESULTS = {"sampler": SAMPLER, "replay": REPLAY, "features": FEATURES, "full_graph": FULL_GRAPH}


def check_png(path, width=640, height=360, min_ink=0.01):
    """A PNG of the given size whose non-white share is at least ``min_ink`` (not blank)."""
    assert path.read_bytes()[:8] == PNG, f"{path} is not a PNG"
    img = imread(path)
    assert img.shape[:2] == (height, width), img.shape
    ink = (img[..., :3].min(axis=2) < 0.95).mean()
    assert ink >= min_ink, f"{path}: only {ink:.1%} non-white pixels"
    assert path.stat().st_size < 60_000, f"{path}: {path.stat().st_size} bytes"
    return ink


def test_machine_caption_names_cpus_platform_load_and_date():
    text = plots.machine_caption(MACHINE)
    assert text == "2 CPUs, Linux x86_64, no GPU, 1-min load 3.5 to 6.2, 2026-12-01"
    assert "CPUs" in plots.machine_caption() and "20" in plots.machine_caption()  # this machine, today


def test_plot_benchmarks_writes_one_png_per_benchmark(tmp_path):
    paths = plots.plot_benchmarks(RESULTS, tmp_path, machine=MACHINE)
    assert sorted(p.name for p in paths) == ["bench_features.png", "bench_full_graph.png", "bench_replay.png",
                                             "bench_sampler.png"]
    for path in paths:
        check_png(path)


def test_plot_benchmarks_skips_unknown_and_empty_results(tmp_path):
    results = {"memory": {"rows": [{"case": "x"}]}, "sampler": dict(SAMPLER, rows=[])}
    assert plots.plot_benchmarks(results, tmp_path) == []


def test_bars_ink_more_than_empty_axes(tmp_path):
    ink = check_png(plots.plot_full_graph(FULL_GRAPH, tmp_path / "f.png", "caption"))
    empty = check_png(plots.plot_full_graph(dict(FULL_GRAPH, rows=[]), tmp_path / "e.png", "caption"),
                      min_ink=0.0)  # title, caption and empty axes only
    assert ink > empty + 0.02, (ink, empty)


def test_plot_curves_from_collected_values(tmp_path):
    curves = DemoCurves()
    Result = type("Result", (), {})
    for epoch, (recall, ndcg) in enumerate([(0.05, 0.04), (0.09, 0.07), (0.12, 0.1)], start=1):
        r = Result()
        r.k, r.recall, r.ndcg = 20, recall, ndcg
        curves.recommend_epoch(epoch, r, "synthetic")
    pop = Result()
    pop.k, pop.recall, pop.ndcg = 20, 0.03, 0.02
    curves.recommend_final(3.0, r, pop, "synthetic")  # the final result at epoch 3 is not added twice
    assert curves.curves["recommend"]["epoch"] == [1.0, 2.0, 3.0]
    for seed in (0, 1):
        for epoch in range(1, 21):
            curves.node_classification_epoch(seed, epoch, {"loss": 1.0 / epoch, "train_acc": 0.5 + epoch / 50,
                                                           "val_acc": 0.4 + epoch / 60 + seed / 100,
                                                           "test_acc": 0.4 + epoch / 60 - seed / 100})
    curves.node_classification_final("Cora", 81.5)
    nc = curves.curves["node-classification"]
    assert nc["seeds"] == 2 and nc["epoch"] == list(range(1, 21))
    assert nc["test_acc"][-1] == pytest.approx(0.4 + 20 / 60 - 0.005)  # mean of seeds 0 and 1
    curves.rl_report([10.0, 20.0, 30.0, 40.0], window=2, env="CartPole-v1", target=195.0)
    assert curves.curves["rl"]["steps"] == [10.0, 30.0, 60.0, 100.0]
    assert curves.curves["rl"]["moving_average"] == [10.0, 15.0, 25.0, 35.0]
    saved = json.loads(curves.save_json(tmp_path / "demo_curves.json").read_text())
    assert saved == curves.curves
    paths = plots.plot_curves(saved, tmp_path, machine=MACHINE)
    assert sorted(p.name for p in paths) == ["demo_node-classification.png", "demo_recommend.png",
                                             "demo_rl.png"]
    for path in paths:
        check_png(path)


def test_require_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"graphrl\[plot\]"):
        plots.require_matplotlib()


@pytest.mark.parametrize("propagation", [
    ["--propagation", "sampled", "--fanouts", "4,4,4"], ["--propagation", "exact"]],
    ids=["sampled", "exact"])
def test_demo_plot_writes_the_curves_the_run_reported(tmp_path, propagation):
    import re

    from click.testing import CliRunner

    from graphrl.cli import main

    args = ["demo", "--task", "recommend", "--dataset", "synthetic", "--synthetic-size", "300,400,6000",
            "--epochs", "2", "--dim", "16", *propagation, "--plot", str(tmp_path)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    curve = json.loads((tmp_path / "demo_curves.json").read_text())["recommend"]
    assert curve["epoch"] == [1.0, 2.0] and curve["dataset"] == "synthetic"
    recall, ndcg = re.search(r"^test recall@20: (\S+)  NDCG@20: (\S+)", result.output, re.M).groups()
    assert f"{curve['recall'][-1]:.4f}" == recall and f"{curve['ndcg'][-1]:.4f}" == ndcg
    pop = re.search(r"^popularity baseline recall@20: (\S+)", result.output, re.M).group(1)
    assert f"{curve['popularity_recall']:.4f}" == pop
    check_png(tmp_path / "demo_recommend.png")
    assert f"wrote {tmp_path / 'demo_recommend.png'}" in result.output


def test_demo_plot_node_classification_curve_ends_at_the_reported_accuracy(tmp_path):
    from click.testing import CliRunner

    from graphrl.cli import main

    args = ["demo", "--task", "node-classification", "--epochs", "5", "--seeds", "2", "--plot", str(tmp_path)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    if "not found" in result.output or "No such file" in result.output:
        pytest.skip(f"Cora data missing: {result.output.strip()}")
    assert result.exit_code == 0, result.output
    curve = json.loads((tmp_path / "demo_curves.json").read_text())["node-classification"]
    assert curve["epoch"] == [1, 2, 3, 4, 5] and curve["seeds"] == 2
    mean = float(result.output.split("test accuracy over 2 seed(s): ")[1].split(" +-")[0])
    assert f"{100 * curve['test_acc'][-1]:.1f}" == f"{mean:.1f}"
    check_png(tmp_path / "demo_node-classification.png")


def test_demo_logdir_without_tensorboard_says_so(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from graphrl.cli import main

    monkeypatch.setitem(__import__("sys").modules, "torch.utils.tensorboard", None)
    result = CliRunner().invoke(main, ["demo", "--task", "recommend", "--logdir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: --logdir needs tensorboard: pip install tensorboard"


def test_write_tensorboard_writes_scalars(tmp_path):
    pytest.importorskip("tensorboard", reason="--logdir needs tensorboard (not an extra of the project)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from graphrl.curves import write_tensorboard

    curves = {"recommend": {"k": 20, "epoch": [1.0, 1.5], "recall": [0.1, 0.2], "ndcg": [0.05, 0.1]},
              "rl": {"steps": [10.0, 30.0], "return": [10.0, 20.0], "moving_average": [10.0, 15.0]},
              "node-classification": {"epoch": [1, 2], "test_acc": [0.5, 0.6]}}
    write_tensorboard(curves, tmp_path)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, round(e.value, 3)) for e in acc.Scalars("recommend/recall@20")] == [(1, 0.1), (2, 0.2)]
    assert [e.step for e in acc.Scalars("rl/episode_return")] == [10, 30]
    assert [round(e.value, 3) for e in acc.Scalars("node_classification/test_acc")] == [0.5, 0.6]


def test_save_json_merge_keeps_other_tasks(tmp_path):
    path = tmp_path / "demo_curves.json"
    first = DemoCurves()
    first.rl_report([10.0, 20.0], window=2, env="CartPole-v1")
    first.save_json(path)
    second = DemoCurves()
    second.node_classification_epoch(0, 1, {"loss": 1.0, "train_acc": 0.5, "val_acc": 0.4, "test_acc": 0.4})
    second.node_classification_final("Cora")
    assert set(json.loads(second.save_json(path, merge=True).read_text())) == {"rl", "node-classification"}
    assert set(json.loads(second.save_json(path).read_text())) == {"node-classification"}


def test_stamped_curve_caption_names_machine_and_load(tmp_path):
    curves = DemoCurves()
    curves.rl_report([10.0, 20.0], window=2, env="CartPole-v1")
    curves.stamp("rl", 1.5)
    curves.stamp("recommend", 1.5)  # no such curve: nothing happens
    record = curves.curves["rl"]["machine"]
    assert record["load_average_1min"][0] == 1.5 and record["cpus"] >= 1 and "recommend" not in curves.curves
    text = plots.machine_caption(record)
    assert text.startswith(f"{record['cpus']} CPUs, {record['platform']}") and "1-min load" in text
    assert text.endswith(record["date"])
    check_png(plots.plot_curves(curves.curves, tmp_path)[0])

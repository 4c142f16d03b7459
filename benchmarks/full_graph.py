"""Full-graph GCN epochs: our `FullGraph` + `GCN` against DGL's ``GraphConv``, with and without a budget.

The graph is `graphrl.datasets.synthetic_graph` (uniform by default; 1M nodes / 20M edges at
``--scale 1``, 50k / 1M at the default ``--scale 0.05``), with 128 random float32 features and random
labels over 16 classes. Both systems run the same 2-layer GCN (128 -> 128 -> 16, ReLU, no dropout, the
symmetric normalisation with self-loops: ours ``FullGraph(normalization="sym")``, DGL
``GraphConv(norm="both")`` on ``dgl.add_self_loop(g)``, which is the same matrix). One epoch is a
forward pass over all nodes, the cross-entropy of all nodes, and the backward pass (no optimizer
step). Both layers put the weight product where DGL does (before propagating when that narrows the
features), so both propagate at the same widths.

Cases, each also in a fresh process of its own (so that memory measurements do not see each other):

- ``ours``: no budget (one partition per propagation);
- ``ours-budget``: the memory manager's device budget set to one quarter of the device-tier peak the
  ``ours`` run reported, so the propagations split into partitions (targets: it completes, and its
  epoch time is within 2x of ``ours``);
- ``dgl``: DGL 2.1's ``GraphConv`` full graph (target: ours no budget at most DGL's time);
- ``staged``: `FullGraph`'s staged (HongTu) path without a budget, every host-device transfer
  counted (``fg.traffic()``); ``staged-1/4``, ``staged-1/8``: its device budget at 1/4 and 1/8 of
  ``staged``'s device-tier peak, with the dedup cache, and ``staged-1/4-nodedup``,
  ``staged-1/8-nodedup`` without it. These run in the interleaved process only (each with its own
  memory manager, whose device-tier peak they report); the traffic column is the host-to-device bytes
  of one epoch (vertex rows and partition structure) and the dedup hit bytes.

Peak memory, two ways:

- device tier (ours only): ``mm.stats()["device"]["samplers.full_graph"]["peak"]``, the largest
  partition working set, which the budget bounds. Without CUDA the device tier is host memory;
- process RSS (both): the kernel's peak resident set (``VmHWM`` in ``/proc/self/status``) during the
  timed epochs, reset before them by writing 5 to ``/proc/self/clear_refs``; reported as the rise
  over the RSS at the reset (graph, features and model already resident), i.e. the transient memory
  of an epoch. Workers run with ``MALLOC_MMAP_THRESHOLD_=131072`` so that glibc returns freed large
  blocks to the OS at once (its adaptive threshold would otherwise keep them mapped and hide peaks).
  tracemalloc does not see torch's or DGL's allocations, and torch's profiler sees torch tensors
  only, hence RSS.

Epoch times come from a separate run that holds all cases in one process and times one epoch of
each in turn for ``--epochs`` rounds (after ``--warmup``), so that load from other processes falls on
all cases alike (separate runs minutes apart differ on a shared machine); the best round of each
case is reported (the least disturbed), and the median too. ``ours-budget`` there
uses ``partition_bytes`` = the budget, which gives the same partitions as the budgeted manager. Run
``python benchmarks/full_graph.py --help``; results go to ``benchmarks/results/full_graph.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
import numba
import numpy as np
import torch
import torch.nn.functional as F
from _report import machine, write_result

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "full_graph.json"
CASES = ("ours", "ours-budget", "dgl")
STAGED = ("staged", "staged-1/4", "staged-1/4-nodedup", "staged-1/8", "staged-1/8-nodedup")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _make_data(num_nodes: int, num_edges: int, in_degree: str, features: int, classes: int, seed: int):
    from graphrl.datasets import synthetic_graph

    graph = synthetic_graph(num_nodes, num_edges, in_degree, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, features, generator=gen)
    y = torch.randint(0, classes, (num_nodes,), generator=gen)
    return graph, x, y


def _dgl_graph(dgl, graph):
    """Our CSC graph as a DGL graph (same edges) with one self-loop added per node, formats built."""
    dst = torch.repeat_interleave(torch.arange(graph.num_nodes, dtype=torch.int64), graph.in_degrees())
    g = dgl.graph((graph.indices.to(torch.int64), dst), num_nodes=graph.num_nodes)
    g = dgl.add_self_loop(g)
    g.create_formats_()
    return g


class _DGLGCN(torch.nn.Module):
    def __init__(self, dgl_nn, dims: list[int]) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(dgl_nn.GraphConv(a, b, norm="both", allow_zero_in_degree=True)
                                         for a, b in zip(dims[:-1], dims[1:], strict=True))

    def forward(self, g, x):
        h = x
        for i, conv in enumerate(self.convs):
            h = conv(g, h)
            if i + 1 < len(self.convs):
                h = torch.relu(h)
        return h


def _epochs(step, warmup: int, epochs: int) -> tuple[list[float], dict]:
    for _ in range(warmup):
        step()
    rss0 = _status_kib("VmRSS")
    reset = _reset_peak_rss()
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    hwm = _status_kib("VmHWM")
    return times, {"rss_before_kib": rss0, "peak_rss_kib": hwm,
                   "epoch_rss_rise_bytes": (hwm - rss0) * 1024 if reset else None}


def worker(case: str, cfg: dict) -> dict:
    """Run one case in this process and return its measurements (called by the child process)."""
    threads = cfg["threads"]
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    t0 = time.perf_counter()
    graph, x, y = _make_data(cfg["num_nodes"], cfg["num_edges"], cfg["in_degree"], cfg["features"],
                             cfg["classes"], cfg["seed"])
    dims = [cfg["features"]] + [cfg["hidden"]] * (cfg["layers"] - 1) + [cfg["classes"]]
    out: dict = {"case": case, "setup_seconds": None}
    if case == "dgl":
        from graphrl.dglshim import import_dgl

        dgl = import_dgl()
        dgl.utils.set_num_threads(threads)
        import dgl.nn.pytorch as dgl_nn

        g = _dgl_graph(dgl, graph)
        del graph
        torch.manual_seed(cfg["seed"])
        model = _DGLGCN(dgl_nn, dims)

        def step():
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(g, x), y).backward()

        out["setup_seconds"] = time.perf_counter() - t0
        times, mem = _epochs(step, cfg["warmup"], cfg["epochs"])
        out["system"] = f"dgl {dgl.__version__}"
    else:
        from graphrl.memory import MemoryManager
        from graphrl.nn import GCN
        from samplers import FullGraph

        budget = cfg.get("device_budget")
        mm = MemoryManager(budgets={"device": budget} if budget else None, device="cpu")
        fg = FullGraph(graph, memory=mm, partition_bytes=None)
        model = GCN(dims[0], cfg["hidden"], out_dim=dims[-1], layers=cfg["layers"], dropout=0.0,
                    seed=cfg["seed"])

        def step():
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(fg, x), y).backward()

        out["setup_seconds"] = time.perf_counter() - t0
        times, mem = _epochs(step, cfg["warmup"], cfg["epochs"])
        stats = mm.stats()
        out["system"] = "graphrl FullGraph"
        out["device_peak_bytes"] = stats["device"].get("samplers.full_graph", {}).get("peak", 0)
        out["device_budget_bytes"] = budget
        out["partitions"] = {str(w): fg.num_partitions(w) for w in sorted(set(dims[1:]))}
        out["symmetric"] = fg.symmetric
    out["epoch_seconds_best"] = min(times)
    out["epoch_seconds_median"] = statistics.median(times)
    out["epoch_seconds"] = times
    out.update(mem)
    return out


def _staged(graph, cases: list[str], step_for, warm) -> tuple[dict, dict]:
    """Steps and (after their run) traffic readers of the staged cases, budgets from ``staged``'s peak."""
    from graphrl.memory import MemoryManager
    from samplers import FullGraph

    steps, graphs, budgets = {}, {}, {}
    base_mm = MemoryManager(device="cpu")
    base = FullGraph(graph, memory=base_mm, partition_bytes=None, dedup=False)
    warm(step_for(base))
    peak = base_mm.stats()["device"]["samplers.full_graph"]["peak"]
    for case in cases:
        if case == "staged":
            fg = base
        else:
            frac = 0.25 if case.startswith("staged-1/4") else 0.125
            budgets[case] = max(int(peak * frac), 1)
            mm = MemoryManager(budgets={"device": budgets[case]}, device="cpu")
            fg = FullGraph(graph, memory=mm, partition_bytes=None, dedup=not case.endswith("nodedup"))
        steps[case], graphs[case] = step_for(fg), (fg, budgets.get(case))
    return steps, graphs


def _staged_info(fg, budget: int | None, rounds: int) -> dict:
    t = fg.traffic()
    stats = fg.memory.stats()["device"].get("samplers.full_graph", {})
    return {"h2d_bytes_per_epoch": t["host_to_device_bytes"] / rounds,
            "vertex_h2d_bytes_per_epoch": t["vertex_host_to_device_bytes"] / rounds,
            "d2h_bytes_per_epoch": t["device_to_host_bytes"] / rounds,
            "dedup_hit_bytes_per_epoch": t["dedup_hit_bytes"] / rounds, "partitions": t["partitions"],
            "device_peak_bytes": stats.get("peak", 0), "device_budget_bytes": budget}


def interleaved(cfg: dict, cases: list[str]) -> dict:
    """Epoch times of every case in one process, one epoch of each in turn, ``cfg["epochs"]`` rounds.

    Load from other processes then falls on all cases alike. ``ours-budget`` uses its own `FullGraph`
    with ``partition_bytes`` = the budget, which gives the partitions the budgeted manager gives.
    Returns ``{"times": {case: [seconds]}, "staged": {case: traffic and device peak per epoch}}``.
    """
    from graphrl.dglshim import import_dgl
    from graphrl.nn import GCN
    from samplers import FullGraph

    threads = cfg["threads"]
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    graph, x, y = _make_data(cfg["num_nodes"], cfg["num_edges"], cfg["in_degree"], cfg["features"],
                             cfg["classes"], cfg["seed"])
    dims = [cfg["features"]] + [cfg["hidden"]] * (cfg["layers"] - 1) + [cfg["classes"]]
    steps = {}
    model = GCN(dims[0], cfg["hidden"], out_dim=dims[-1], layers=cfg["layers"], dropout=0.0, seed=cfg["seed"])

    def ours_step(fg):
        def step():
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(fg, x), y).backward()
        return step

    if "ours" in cases:
        steps["ours"] = ours_step(FullGraph(graph, partition_bytes=None))
    if "ours-budget" in cases:
        steps["ours-budget"] = ours_step(FullGraph(graph, partition_bytes=cfg["device_budget"]))
    if "dgl" in cases:
        dgl = import_dgl()
        dgl.utils.set_num_threads(threads)
        import dgl.nn.pytorch as dgl_nn

        g = _dgl_graph(dgl, graph)
        torch.manual_seed(cfg["seed"])
        dgl_model = _DGLGCN(dgl_nn, dims)

        def dgl_step():
            dgl_model.zero_grad(set_to_none=True)
            F.cross_entropy(dgl_model(g, x), y).backward()

        steps["dgl"] = dgl_step
    staged = [c for c in cases if c in STAGED]
    graphs: dict = {}
    if staged:
        more, graphs = _staged(graph, staged, ours_step, lambda step: step())
        steps.update(more)
    for _ in range(cfg["warmup"]):
        for step in steps.values():
            step()
    for fg, _ in graphs.values():
        fg.traffic(reset=True)
    times: dict[str, list[float]] = {case: [] for case in steps}
    for _ in range(cfg["epochs"]):
        for case, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[case].append(time.perf_counter() - t0)
    return {"times": {c: times[c] for c in cases},
            "staged": {c: _staged_info(fg, b, cfg["epochs"]) for c, (fg, b) in graphs.items()}}


def _run_case(case: str, cfg: dict) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", PYTHONPATH=str(REPO))
    cmd = [sys.executable, __file__, "--worker", case, "--config", json.dumps(cfg)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise click.ClickException(f"case {case} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_against_dgl(seed: int = 0) -> float:
    """Max |ours - DGL| of one GraphConv forward on a small directed power-law graph (same weights)."""
    from graphrl.dglshim import import_dgl
    from graphrl.nn import GraphConv
    from samplers import FullGraph

    dgl = import_dgl()
    import dgl.nn.pytorch as dgl_nn

    graph, x, _ = _make_data(5000, 60000, "powerlaw", 32, 8, seed)
    ours = GraphConv(32, 8)
    theirs = dgl_nn.GraphConv(32, 8, norm="both")
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
        theirs.bias.copy_(ours.bias)
    fg = FullGraph(graph)
    with torch.no_grad():
        a = ours(fg, x)
        b = theirs(_dgl_graph(dgl, graph), x)
    fg.close()
    return float((a - b).abs().max())


def _fmt_mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


@click.command()
@click.option("--scale", type=click.FloatRange(min=0, min_open=True), default=0.05, show_default=True,
              help="Fraction of 1M nodes / 20M edges (1: the full-size graph).")
@click.option("--in-degree", type=click.Choice(["uniform", "powerlaw"]), default="uniform", show_default=True)
@click.option("--features", default=128, show_default=True)
@click.option("--hidden", default=128, show_default=True)
@click.option("--classes", default=16, show_default=True)
@click.option("--layers", default=2, show_default=True)
@click.option("--epochs", default=5, show_default=True,
              help="Timed rounds of the interleaved run (one epoch of each case per round).")
@click.option("--memory-epochs", default=2, show_default=True,
              help="Timed epochs of each case's own process (memory measurements).")
@click.option("--warmup", default=1, show_default=True, help="Untimed epochs first (JIT, allocations).")
@click.option("--cases", default=",".join(CASES + STAGED), show_default=True, help="Comma-separated subset.")
@click.option("--budget-fraction", default=0.25, show_default=True,
              help="ours-budget's device budget as a fraction of ours' device-tier peak.")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="Threads for both systems (torch, numba, DGL's OpenMP); default: every core.")
@click.option("--seed", default=0, show_default=True)
@click.option("--output", default=str(RESULTS), show_default=True, type=click.Path(dir_okay=False))
@click.option("--worker", "worker_case", default=None, hidden=True)
@click.option("--config", default=None, hidden=True)
def main(scale: float, in_degree: str, features: int, hidden: int, classes: int, layers: int, epochs: int,
         memory_epochs: int, warmup: int, cases: str, budget_fraction: float, threads: int | None, seed: int,
         output: str, worker_case: str | None, config: str | None) -> None:
    """Epoch time and peak memory of our full-graph GCN vs DGL's GraphConv, unbudgeted and budgeted."""
    if worker_case is not None:  # child process: one case, result as the last line of stdout
        cfg = json.loads(config)
        if worker_case.startswith("interleaved:"):
            click.echo(json.dumps(interleaved(cfg, worker_case.split(":", 1)[1].split(","))))
        else:
            click.echo(json.dumps(worker(worker_case, cfg)))
        return
    names = [c.strip() for c in cases.split(",") if c.strip()]
    unknown = set(names) - set(CASES) - set(STAGED)
    if unknown:
        raise click.BadParameter(f"unknown cases {sorted(unknown)}", param_hint="--cases")
    threads = threads or os.cpu_count() or 1
    cfg = {"num_nodes": int(1_000_000 * scale), "num_edges": int(20_000_000 * scale),
           "in_degree": in_degree, "features": features, "hidden": hidden, "classes": classes,
           "layers": layers, "epochs": memory_epochs, "warmup": warmup, "threads": threads, "seed": seed}
    label = f"{in_degree} {cfg['num_nodes']:,}/{cfg['num_edges']:,} d{features}"
    load_start = os.getloadavg()[0]
    diff = None
    if "dgl" in names:
        diff = check_against_dgl(seed)
        click.echo(f"check: one GraphConv forward, ours vs DGL, max abs difference {diff:.2e}", err=True)
    # 1. each case in its own process: memory (device-tier peak, RSS)
    results: dict[str, dict] = {}
    budget = None
    for case in [c for c in names if c in CASES]:
        case_cfg = dict(cfg)
        if case == "ours-budget":
            if "ours" not in results:
                results["ours"] = _run_case("ours", cfg)
            budget = max(int(results["ours"]["device_peak_bytes"] * budget_fraction), 1)
            case_cfg["device_budget"] = budget
        if case not in results:
            click.echo(f"memory run: {case} on {label} ...", err=True)
            results[case] = _run_case(case, case_cfg)
    # 2. one process, the cases' epochs in turn: times under the same load
    click.echo(f"timing run: {', '.join(names)} interleaved, {epochs} rounds ...", err=True)
    run = _run_case("interleaved:" + ",".join(names), dict(cfg, epochs=epochs, device_budget=budget))
    timing = run["times"]
    best = {case: min(t) for case, t in timing.items()}
    median = {case: statistics.median(t) for case, t in timing.items()}
    for case in names:
        results.setdefault(case, {"system": "graphrl FullGraph (staged)", "epoch_rss_rise_bytes": None,
                                  "peak_rss_kib": None, "partitions": {}})
        results[case].update(run["staged"].get(case, {}))
        results[case]["interleaved_epoch_seconds"] = timing[case]

    rows = []
    click.echo(f"\n{label}, GCN {features}->{hidden}->{classes}, {threads} threads; epoch = forward + "
               f"backward; times: best of {epochs} interleaved rounds (median)")
    click.echo(f"{'case':<19} {'epoch s':>8} {'median s':>9} {'vs dgl':>7} {'vs ours':>8} "
               f"{'device peak MiB':>16} {'budget MiB':>11} {'partitions':>11} {'RSS rise MiB':>13} "
               f"{'peak RSS MiB':>13} {'h2d MiB/ep':>11} {'dedup hit MiB/ep':>17}")
    dgl_res = results.get("dgl")
    for case in names:
        r = results[case]
        vs_dgl = best[case] / best["dgl"] if "dgl" in best else None
        vs_ours = best[case] / best["ours"] if "ours" in best and case != "dgl" else None
        parts = r.get("partitions", {})
        parts = (",".join(f"{w}:{p}" for w, p in parts.items()) or "-") if isinstance(parts, dict) \
            else str(parts)
        t_dgl = "-" if vs_dgl is None else f"{vs_dgl:.2f}"
        t_ours = "-" if vs_ours is None else f"{vs_ours:.2f}"
        click.echo(f"{case:<19} {best[case]:>8.3f} {median[case]:>9.3f} {t_dgl:>7} {t_ours:>8} "
                   f"{_fmt_mb(r.get('device_peak_bytes')):>16} {_fmt_mb(r.get('device_budget_bytes')):>11} "
                   f"{parts:>11} {_fmt_mb(r.get('epoch_rss_rise_bytes')):>13} "
                   f"{_fmt_mb(r['peak_rss_kib'] and r['peak_rss_kib'] * 1024):>13} "
                   f"{_fmt_mb(r.get('h2d_bytes_per_epoch')):>11} "
                   f"{_fmt_mb(r.get('dedup_hit_bytes_per_epoch')):>17}")
        if case == "dgl":
            continue
        rows.append({
            "case": f"{label} {case}", "metric": "epoch_seconds", "ours": best[case],
            "baseline": dgl_res["system"] if dgl_res else None,
            "baseline_value": best.get("dgl"),
            "ratio": best["dgl"] / best[case] if "dgl" in best else None,
            "ours_median": median[case], "baseline_median": median.get("dgl"),
            "time_vs_unbudgeted": vs_ours,
            "device_peak_bytes": r["device_peak_bytes"], "device_budget_bytes": r["device_budget_bytes"],
            "partitions": r["partitions"], "h2d_bytes_per_epoch": r.get("h2d_bytes_per_epoch"),
            "vertex_h2d_bytes_per_epoch": r.get("vertex_h2d_bytes_per_epoch"),
            "dedup_hit_bytes_per_epoch": r.get("dedup_hit_bytes_per_epoch"),
            "epoch_rss_rise_bytes": r["epoch_rss_rise_bytes"],
            "peak_rss_bytes": r["peak_rss_kib"] and r["peak_rss_kib"] * 1024,
            "baseline_epoch_rss_rise_bytes": dgl_res["epoch_rss_rise_bytes"] if dgl_res else None,
            "baseline_peak_rss_bytes": dgl_res["peak_rss_kib"] * 1024 if dgl_res else None})
    click.echo("JSON ratio = DGL time / ours (> 1: ours faster). RSS rise = peak RSS during a case's own "
               "timed epochs minus its RSS before them; device peak = the manager's device tier (host memory "
               "here)")
    # other processes share the cores: the 1-minute load average at the start and (machine()) the end
    info = machine(numpy=np.__version__, threads=threads, load_average_1min_start=load_start)
    config = dict(cfg, timed_rounds=epochs, memory_epochs=memory_epochs)
    write_result("full_graph", rows, info, output, config=config, check_max_abs_diff_vs_dgl=diff,
                 cases=results)


if __name__ == "__main__":
    main()

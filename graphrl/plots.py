"""Figures of benchmark results and demo learning curves, as small PNG files (matplotlib).

Main names: `plot_benchmarks` (one PNG per benchmark JSON of ``benchmarks/``: sampler, replay,
features, full_graph), `plot_curves` (the demo's learning curves: recall@20 / NDCG@20 per epoch,
CartPole return over environment steps, GCN accuracy per epoch), `machine_caption` (the line every
figure carries: CPUs, platform, load, date) and `require_matplotlib`.

Usage::

    from graphrl.plots import plot_benchmarks
    paths = plot_benchmarks({"sampler": json.load(open("sampler.json"))}, "out/", caption)

matplotlib is the optional extra ``plot`` (``pip install 'graphrl[plot]'``); without it every function
raises ImportError with one line naming the extra. Figures are drawn on `matplotlib.figure.Figure`
objects (no pyplot, no global backend state) and saved at a modest size and dpi (a few tens of KB).
The input rows follow the benchmarks' JSON format (``../shared/CONVENTIONS.md``, "Benchmarks"):
``case``, ``metric``, ``ours``, ``baseline``, ``baseline_value``, ``ratio`` and each benchmark's own
fields.
"""

from __future__ import annotations

import os
import platform
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "BENCHMARK_PLOTS",
    "CURVE_PLOTS",
    "machine_caption",
    "plot_benchmarks",
    "plot_curves",
    "plot_features",
    "plot_full_graph",
    "plot_node_classification",
    "plot_recommend",
    "plot_replay",
    "plot_rl",
    "plot_sampler",
    "require_matplotlib",
]

SIZE = (6.4, 3.6)  # inches; at DPI 100: 640 x 360 pixels
DPI = 100
COLORS = {"ours": "#1f77b4", "dgl": "#ff7f0e", "pyg": "#2ca02c", "torchrl": "#d62728", "copy": "#7f7f7f",
          "index_select": "#ff7f0e", "index_select_out": "#e7ba52", "other": "#9467bd"}


def require_matplotlib():
    """Return `matplotlib.figure.Figure`.

    Raises
    ------
    ImportError
        matplotlib is not installed; the message names the ``plot`` extra.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'graphrl[plot]' "
                          "(or bash scripts/setup.sh test,plot)") from None
    return Figure


def machine_caption(machine: Mapping | None = None, date: str | None = None) -> str:
    """The caption line of a figure: CPUs, platform, GPU, the 1-minute load and the date (UTC).

    Parameters
    ----------
    machine : mapping or None
        A benchmark's ``machine`` record or `graphrl.bench.machine_record`'s; missing fields are read
        from this machine (``os.cpu_count()``, ``platform.platform()``).
    date : str or None
        Default: ``machine["date"]``, else today (UTC).
    """
    m = dict(machine or {})
    cpus = m.get("cpus") or os.cpu_count()
    plat = m.get("platform") or f"{platform.system()} {platform.machine()}"
    load = m.get("load_average_1min")
    if isinstance(load, (list, tuple)) and len(load) >= 2:
        load_text = f", 1-min load {min(load):.1f} to {max(load):.1f}"
    else:
        load = load[0] if isinstance(load, (list, tuple)) and load else load
        load_text = f", 1-min load {load:.1f}" if isinstance(load, (int, float)) else ""
    cuda = m.get("cuda")
    device = f", CUDA {cuda}" if cuda else ", no GPU"
    date = date or m.get("date") or time.strftime("%Y-%m-%d", time.gmtime())
    return f"{cpus} CPUs, {plat}{device}{load_text}, {date}"


def _figure(title: str, caption: str, ncols: int = 1, width: float | None = None):
    Figure = require_matplotlib()
    fig = Figure(figsize=(width or SIZE[0], SIZE[1]), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    fig.suptitle(title, fontsize=10)
    fig.supxlabel(caption, fontsize=7, color="#555555")
    return fig, list(axes)


def _save(fig, path: str | os.PathLike) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, format="png")
    return out


def _bars(ax, groups: Sequence[str], series: Mapping[str, Sequence[float | None]], ylabel: str,
          colors: Mapping[str, str] | None = None, fmt: str = "{:.3g}", log: bool = False) -> None:
    """Grouped bars: one group per label of ``groups``, one bar per series (None: no bar); ``log``: log y."""
    names = [n for n, v in series.items() if any(x is not None for x in v)]
    width = 0.8 / max(len(names), 1)
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(groups))]
        vals = series[name]
        pts = [(x, v) for x, v in zip(xs, vals, strict=True) if v is not None]
        if not pts:
            continue
        color = (colors or {}).get(name) or COLORS.get(name.split()[0].lower(), COLORS["other"])
        bars = ax.bar([p[0] for p in pts], [p[1] for p in pts], width * 0.95, label=name, color=color)
        ax.bar_label(bars, labels=[fmt.format(p[1]) for p in pts], fontsize=6, padding=1)
    ax.set_xticks(range(len(groups)), groups, fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    if log:
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi * 3)  # room for the bar labels and the legend
    else:
        ax.margins(y=0.15)
    if names:
        ax.legend(fontsize=7, frameon=False)


def plot_sampler(result: Mapping, path: str | os.PathLike, caption: str) -> Path:
    """Sampled edges/s (millions) of ours, DGL and PyG (where it ran), per graph and mode."""
    rows = result["rows"]
    groups = ["\n".join(textwrap.wrap(r["case"], 18, break_long_words=False)) for r in rows]
    dgl = next((r["baseline"] for r in rows if r.get("baseline")), "dgl")
    series = {"ours": [r["ours"] / 1e6 for r in rows],
              dgl: [r["baseline_value"] / 1e6 if r.get("baseline_value") else None for r in rows]}
    pyg = next((r["baseline_pyg"] for r in rows if r.get("baseline_pyg_value")), None)
    if pyg:
        series[pyg.split(" (")[0]] = [r["baseline_pyg_value"] / 1e6 if r.get("baseline_pyg_value") else None
                                      for r in rows]
    fig, (ax,) = _figure("Neighbour sampling: sampled edges/s, ours vs DGL" + (" and PyG" if pyg else ""),
                         caption, width=max(SIZE[0], 1.3 * len(rows) + 1))
    _bars(ax, groups, series, "M sampled edges/s", fmt="{:.1f}")
    return _save(fig, path)


def _layout_of(case: str) -> str:
    return case.split(" (")[0]


def plot_replay(result: Mapping, path: str | os.PathLike, caption: str) -> Path:
    """Replay GB/s of inserts and window samples: ours vs TorchRL and the copy ceiling, per layout."""
    rows = [r for r in result["rows"] if "ours_gb_per_s" in r]
    layouts = list(dict.fromkeys(_layout_of(r["case"]) for r in rows))
    fig, axes = _figure("Replay: GB/s of inserted and sampled steps, ours vs TorchRL and copy", caption,
                        ncols=max(len(layouts), 1))
    for ax, layout in zip(axes, layouts, strict=False):
        mine = [r for r in rows if _layout_of(r["case"]) == layout]
        ops = list(dict.fromkeys(r["case"].split(") ", 1)[1].rsplit(" vs ", 1)[0] for r in mine))
        series: dict[str, list[float | None]] = {"ours": [None] * len(ops)}
        for r in mine:
            i = ops.index(r["case"].split(") ", 1)[1].rsplit(" vs ", 1)[0])
            series["ours"][i] = r["ours_gb_per_s"]
            base = r["baseline"]
            name = "copy (ceiling)" if "copy" in base else "TorchRL" if "torchrl" in base.lower() else base
            series.setdefault(name, [None] * len(ops))[i] = r["baseline_gb_per_s"]
        step = mine[0]["case"].split("(")[1].split(")")[0] if "(" in mine[0]["case"] else ""
        _bars(ax, [o.replace(" B=", "\nB=") for o in ops], series, "GB/s (log scale)",
              colors={"copy (ceiling)": COLORS["copy"], "TorchRL": COLORS["torchrl"]}, fmt="{:.3g}", log=True)
        ax.set_title(f"{layout} ({step})", fontsize=8)
    return _save(fig, path)


def plot_features(result: Mapping, path: str | os.PathLike, caption: str) -> Path:
    """Feature-gather GB/s: ours vs ``index_select`` (fresh and ``out=``) and the copy ceiling."""
    rows = result["rows"]
    series = {"ours": [r["ours"] for r in rows],
              "index_select": [r["baseline_value"] for r in rows],
              "index_select(out=)": [r.get("index_select_out_GB_per_s") for r in rows],
              "copy (ceiling)": [r.get("copy_ceiling_GB_per_s") for r in rows]}
    fig, (ax,) = _figure("Feature gather: GB/s of gathered rows (median of rounds)", caption)
    _bars(ax, [r["case"].replace(", ", "\n") for r in rows], series, "GB/s",
          colors={"copy (ceiling)": COLORS["copy"], "index_select(out=)": COLORS["index_select_out"]},
          fmt="{:.2f}")
    return _save(fig, path)


def _max_partitions(parts: Mapping | int | None) -> int:
    """A row's partitions: a count (the staged rows) or a count per feature width (the others)."""
    if isinstance(parts, Mapping):
        return max(parts.values(), default=1)
    return int(parts) if parts else 1


def plot_full_graph(result: Mapping, path: str | os.PathLike, caption: str) -> Path:
    """Full-graph GCN epoch time (s): ours unbudgeted and under a device budget vs DGL's GraphConv."""
    rows = result["rows"]
    groups, ours, base = [], [], []
    for r in rows:
        label = r["case"].rsplit(" ", 1)[-1]
        if r.get("device_budget_bytes"):
            parts = _max_partitions(r.get("partitions"))
            label += f"\nbudget {r['device_budget_bytes'] / 2**20:.1f} MiB\n{parts} partitions"
        else:
            label += "\nno budget"
        groups.append(label)
        ours.append(r["ours"])
        base.append(r.get("baseline_value"))
    dgl = next((r["baseline"] for r in rows if r.get("baseline")), "dgl")
    graph = rows[0]["case"].rsplit(" ", 1)[0] if rows else ""
    fig, (ax,) = _figure(f"Full-graph GCN epoch (forward + backward), {graph}: ours vs DGL", caption)
    _bars(ax, groups, {"ours": ours, dgl: base}, "seconds per epoch (lower is better)", fmt="{:.3f}")
    return _save(fig, path)


BENCHMARK_PLOTS = {"sampler": plot_sampler, "replay": plot_replay, "features": plot_features,
                   "full_graph": plot_full_graph}


def plot_benchmarks(results: Mapping[str, Mapping], out_dir: str | os.PathLike,
                    machine: Mapping | None = None, date: str | None = None) -> list[Path]:
    """Write ``bench_<name>.png`` into ``out_dir`` for each known benchmark in ``results``.

    Parameters
    ----------
    results : mapping
        Benchmark name -> its JSON result (``{"benchmark", "machine", "rows"}``); unknown names and
        results without rows are skipped.
    machine, date
        For the caption (`machine_caption`); each result's own ``machine`` fills what is missing.

    Returns
    -------
    list of Path
        The files written.
    """
    require_matplotlib()
    paths = []
    for name, result in results.items():
        fn = BENCHMARK_PLOTS.get(name)
        if fn is None or not result.get("rows"):
            continue
        caption = machine_caption({**result.get("machine", {}), **(machine or {})}, date)
        paths.append(fn(result, Path(out_dir) / f"bench_{name}.png", caption))
    return paths


def plot_recommend(curve: Mapping, path: str | os.PathLike, caption: str) -> Path:
    """Test recall@K and NDCG@K per epoch of the recommend task (and the popularity baseline)."""
    fig, (ax,) = _figure(f"LightGCN on {curve.get('dataset', 'recommend')}: test ranking per epoch", caption)
    k = curve.get("k", 20)
    ax.plot(curve["epoch"], curve["recall"], "o-", label=f"recall@{k}", color=COLORS["ours"])
    ax.plot(curve["epoch"], curve["ndcg"], "s-", label=f"NDCG@{k}", color=COLORS["dgl"])
    for key, style in (("popularity_recall", ":"), ("popularity_ndcg", "--")):
        if curve.get(key) is not None:
            ax.axhline(curve[key], ls=style, color="#7f7f7f", lw=1,
                       label=f"popularity {key.split('_')[1]}@{k}".replace("ndcg", "NDCG"))
    ax.set_xlabel("epoch", fontsize=8)
    ax.set_xticks(sorted(set(curve["epoch"])))
    ax.set_ylabel("score", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False)
    return _save(fig, path)


def plot_rl(curve: Mapping, path: str | os.PathLike, caption: str) -> Path:
    """CartPole episode returns and their moving average over environment steps."""
    fig, (ax,) = _figure(f"DQN on {curve.get('env', 'CartPole-v1')}: episode return over env steps", caption)
    ax.plot(curve["steps"], curve["return"], ".", ms=2, color="#aec7e8", label="episode return")
    ax.plot(curve["steps"], curve["moving_average"], "-", color=COLORS["ours"],
            label=f"moving average ({curve.get('window', 100)} episodes)")
    if curve.get("target") is not None:
        ax.axhline(curve["target"], ls="--", color="#7f7f7f", lw=1, label=f"target {curve['target']:g}")
    ax.set_xlabel("environment steps (finished episodes)", fontsize=8)
    ax.set_ylabel("return", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False)
    return _save(fig, path)


def plot_node_classification(curve: Mapping, path: str | os.PathLike, caption: str) -> Path:
    """GCN train / validation / test accuracy per epoch (mean over seeds)."""
    seeds = curve.get("seeds", 1)
    fig, (ax,) = _figure(f"GCN on {curve.get('dataset', 'cora')}: accuracy per epoch "
                         f"(mean of {seeds} seed{'s' if seeds != 1 else ''})", caption)
    for key, color in (("train_acc", COLORS["pyg"]), ("val_acc", COLORS["dgl"]),
                       ("test_acc", COLORS["ours"])):
        if curve.get(key):
            ax.plot(curve["epoch"], [100 * a for a in curve[key]], "-", color=color, label=key.split("_")[0])
    if curve.get("paper") is not None:
        ax.axhline(curve["paper"], ls="--", color="#7f7f7f", lw=1, label=f"paper test {curve['paper']:g} %")
    ax.set_xlabel("epoch", fontsize=8)
    ax.set_ylabel("accuracy (%)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False)
    return _save(fig, path)


CURVE_PLOTS = {"recommend": plot_recommend, "rl": plot_rl, "node-classification": plot_node_classification}


def plot_curves(curves: Mapping[str, Mapping], out_dir: str | os.PathLike,
                machine: Mapping | None = None, date: str | None = None) -> list[Path]:
    """Write ``demo_<task>.png`` into ``out_dir`` for each task of ``curves`` (see the ``plot_*`` above).

    Parameters
    ----------
    curves : mapping
        Task name (``recommend``, ``rl``, ``node-classification``) -> its curve, as the CLI's
        ``demo --plot`` collects them (``demo_curves.json``); a curve's ``machine`` record (if any)
        fills the caption where ``machine`` does not.

    Returns
    -------
    list of Path
    """
    require_matplotlib()
    return [CURVE_PLOTS[task](curve, Path(out_dir) / f"demo_{task}.png",
                              machine_caption({**curve.get("machine", {}), **(machine or {})}, date))
            for task, curve in curves.items() if task in CURVE_PLOTS]

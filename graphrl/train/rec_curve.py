"""The learning curve of a `train_recommender` run: JSON always, a PNG when matplotlib is present.

Usage::

    report = train_recommender(split, config)
    save_training_curve(report, "runs/gowalla", machine=machine_record())  # -> curve.json, curve.png

The JSON holds the config, the per-evaluation curve (validation recall/NDCG@K, loss, lr, epoch,
training seconds), the best epoch, the best and final test results, the refit's test result (when the
run refitted) and the machine record. Without
matplotlib the PNG is skipped and the returned paths say so (one log line, the documented path).

A run stopped by a signal has no report: `interrupted_curve_record` builds the same record from the
evaluations so far (test results ``None``, ``stopped_by`` the signal's name) and `save_curve_record`
writes any record.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

from graphrl.atomic_write import write_whole
from graphrl.plots import machine_caption, require_matplotlib

__all__ = ["curve_record", "interrupted_curve_record", "plot_training_curve", "save_curve_record",
           "save_training_curve"]

log = logging.getLogger(__name__)


def curve_record(report, machine: dict | None = None, extra: dict | None = None) -> dict:
    """The JSON-ready record of a `RecommendReport` (everything but the model)."""
    return {"config": report.config, "curve": report.curve, "best_epoch": report.best_epoch,
            "best_val": asdict(report.best_val) if report.best_val else None,
            "best_test": asdict(report.best_test), "final_test": asdict(report.final_test),
            "epochs": report.epochs, "steps": report.steps, "train_seconds": report.train_seconds,
            "eval_seconds": report.eval_seconds, "train_cpu_seconds": report.train_cpu_seconds,
            "stopped_by": report.stopped_by, "best_step": report.best_step,
            "refit_test": asdict(report.refit_test) if report.refit_test else None,
            "refit_seconds": report.refit_seconds, "refit_cpu_seconds": report.refit_cpu_seconds,
            "machine": machine or {}, **(extra or {})}


def interrupted_curve_record(config: dict, curve: list[dict], stopped_by: str, machine: dict | None = None,
                             extra: dict | None = None) -> dict:
    """The `curve_record` of a run stopped before its report: the evaluations so far, no test result.

    Parameters
    ----------
    config : dict
        The run's `RecommendConfig` as a dict.
    curve : list of dict
        The curve entries so far (``RecommendReport.curve``'s format, as ``on_eval`` receives them).
    stopped_by : str
        What stopped it, e.g. ``"SIGINT"``.
    machine, extra : dict or None
        As in `curve_record`.

    Returns
    -------
    dict
        ``best_epoch`` and ``best_val`` from the best entry (``None`` without one); ``best_test``,
        ``final_test`` and ``refit_test`` ``None``.
    """
    best = max(curve, key=lambda e: e["val_recall"], default=None)
    last = curve[-1] if curve else {}
    return {"config": config, "curve": curve, "best_epoch": best["epoch"] if best else None,
            "best_val": ({"recall": best["val_recall"], "ndcg": best["val_ndcg"], "k": config.get("k"),
                          "num_users": None} if best else None),
            "best_test": None, "final_test": None, "epochs": last.get("epoch", 0.0),
            "steps": last.get("step", 0), "train_seconds": last.get("train_seconds", 0.0),
            "eval_seconds": None, "train_cpu_seconds": last.get("train_cpu_seconds", 0.0),
            "stopped_by": stopped_by, "best_step": best["step"] if best else 0, "refit_test": None,
            "refit_seconds": 0.0, "refit_cpu_seconds": 0.0, "machine": machine or {}, **(extra or {})}


def plot_training_curve(record: dict, path: str | os.PathLike) -> Path:
    """Validation recall@K / NDCG@K per evaluation, the best epoch marked, test results in the title.

    Raises
    ------
    ImportError
        matplotlib is missing (`graphrl.plots.require_matplotlib`).
    """
    figure_cls = require_matplotlib()
    fig = figure_cls(figsize=(6.4, 3.6), dpi=100, layout="constrained")
    ax = fig.subplots()
    k = record["config"].get("k", 20)
    ep = [e["epoch"] for e in record["curve"]]
    ax.plot(ep, [e["val_recall"] for e in record["curve"]], "o-", ms=3, label=f"validation recall@{k}")
    ax.plot(ep, [e["val_ndcg"] for e in record["curve"]], "s-", ms=3, label=f"validation NDCG@{k}")
    ax.axvline(record["best_epoch"], ls=":", color="#7f7f7f", lw=1, label="best (restored)")
    bt = record["best_test"]
    if bt:
        title = (f"LightGCN ({record['config'].get('loss')}): test recall@{k} {bt['recall']:.4f}, "
                 f"NDCG@{k} {bt['ndcg']:.4f} at epoch {record['best_epoch']:.1f}")
    else:  # a run stopped before its test evaluation
        title = (f"LightGCN ({record['config'].get('loss')}): stopped by {record.get('stopped_by')}, "
                 f"best at epoch {record['best_epoch']:.1f} (no test evaluation)")
    rt = record.get("refit_test")
    if rt:
        title += f"\nrefit on all training interactions to that epoch: {rt['recall']:.4f} / {rt['ndcg']:.4f}"
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("epoch", fontsize=8)
    ax.set_ylabel("score", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False)
    fig.supxlabel(machine_caption(record.get("machine")), fontsize=7, color="#555555")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, format="png")
    return out


def save_training_curve(report, out_dir: str | os.PathLike, machine: dict | None = None,
                        extra: dict | None = None, name: str = "curve") -> list[Path]:
    """Write ``<out_dir>/<name>.json`` and, with matplotlib, ``<out_dir>/<name>.png``; return the paths."""
    return save_curve_record(curve_record(report, machine, extra), out_dir, name)


def save_curve_record(record: dict, out_dir: str | os.PathLike, name: str = "curve") -> list[Path]:
    """Write ``record`` as ``<out_dir>/<name>.json`` (whole or not at all) and, with matplotlib, its PNG.

    Returns
    -------
    list of Path
        The JSON, then the PNG when matplotlib is present.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json"]
    write_whole(paths[0], lambda tmp: tmp.write_text(json.dumps(record, indent=1) + "\n"))
    try:
        paths.append(plot_training_curve(record, out / f"{name}.png"))
    except ImportError as err:
        log.warning("no PNG of the learning curve: %s", err)
    return paths

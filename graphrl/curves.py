"""The demo's learning curves: collect the values the tasks report, save them as JSON and TensorBoard.

Main names: `DemoCurves` (one curve per demo task, filled from the tasks' callbacks and reports:
`recommend_epoch` / `recommend_final`, `node_classification_epoch`, `rl_report`), `save_json` and
`write_tensorboard` (scalars through ``torch.utils.tensorboard.SummaryWriter``).

Usage::

    curves = DemoCurves()
    run_link_prediction(ds, config, on_epoch=curves.recommend_epoch)
    curves.save_json("out/demo_curves.json")
    graphrl.plots.plot_curves(curves.curves, "out/")

A curve is a dict of lists (plus a few labels), the format `graphrl.plots.plot_curves` reads.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from graphrl.atomic_write import write_whole
from graphrl.bench import machine_record

__all__ = ["DemoCurves", "write_tensorboard"]


class DemoCurves:
    """Per-task learning curves of one ``graphrl demo`` run (``self.curves``: task -> curve dict)."""

    def __init__(self) -> None:
        self.curves: dict[str, dict] = {}
        self._nc: dict[int, dict[int, dict]] = {}  # seed -> epoch -> values

    def recommend_epoch(self, epoch: float, result, dataset: str = "") -> None:
        """Record the test ranking ``result`` (`RankingResult`) after ``epoch`` epochs of recommend."""
        c = self.curves.setdefault("recommend", {"dataset": dataset, "k": result.k, "epoch": [], "recall": [],
                                                 "ndcg": []})
        if dataset:
            c["dataset"] = dataset
        if c["epoch"] and math.isclose(c["epoch"][-1], epoch):
            return  # the final evaluation of a run that stopped at an epoch's end: already recorded
        c["epoch"].append(float(epoch))
        c["recall"].append(float(result.recall))
        c["ndcg"].append(float(result.ndcg))

    def recommend_final(self, epochs: float, test, popularity, dataset: str) -> None:
        """Add the report's final test result (at ``epochs``, maybe mid-epoch) and the popularity line."""
        self.recommend_epoch(epochs, test, dataset)
        c = self.curves["recommend"]
        c["popularity_recall"], c["popularity_ndcg"] = float(popularity.recall), float(popularity.ndcg)

    def node_classification_epoch(self, seed: int, epoch: int, values: dict) -> None:
        """Record one epoch of one seed (`train_full_graph`'s ``on_epoch`` values)."""
        self._nc.setdefault(seed, {})[epoch] = values

    def node_classification_final(self, dataset: str, paper: float | None = None) -> None:
        """Average the recorded seeds epoch by epoch into the ``node-classification`` curve."""
        if not self._nc:
            return
        epochs = sorted(set.intersection(*(set(v) for v in self._nc.values())))
        curve: dict = {"dataset": dataset, "seeds": len(self._nc), "paper": paper, "epoch": epochs}
        for key in ("train_acc", "val_acc", "test_acc", "loss"):
            vals = [[s[e].get(key) for s in self._nc.values()] for e in epochs]
            if all(x is not None for v in vals for x in v):
                curve[key] = [sum(v) / len(v) for v in vals]
        self.curves["node-classification"] = curve

    def rl_report(self, returns: list[float], window: int, env: str, target: float | None = None) -> None:
        """Episode returns over environment steps, with their moving average over ``window`` episodes.

        CartPole pays 1 per step, so an episode's return is its length and the running sum of returns
        is the number of environment steps of the finished episodes.
        """
        steps, total, avg = [], 0.0, []
        for i, r in enumerate(returns):
            total += r
            steps.append(total)
            part = returns[max(0, i + 1 - window):i + 1]
            avg.append(sum(part) / len(part))
        self.curves["rl"] = {"env": env, "window": window, "target": target, "steps": steps,
                             "return": [float(r) for r in returns], "moving_average": avg}

    def stamp(self, task: str, load_before: float) -> None:
        """Record the machine (CPUs, platform, date, the 1-minute load before and after) on a curve."""
        if task in self.curves:
            record = machine_record()
            record["load_average_1min"] = [load_before, record["load_average_1min"]]
            self.curves[task]["machine"] = record

    def save_json(self, path: str | os.PathLike, merge: bool = False) -> Path:
        """Write ``self.curves`` as JSON (folders created); return the path.

        ``merge``: keep the other tasks' curves of an existing file (a run of one task replaces that
        task's curve only). Written through a temporary file: a full disk or a signal leaves the file
        as it was.
        """
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        curves = dict(self.curves)
        if merge and out.is_file():
            try:
                curves = {**json.loads(out.read_text()), **curves}
            except (OSError, json.JSONDecodeError):
                pass  # not a curves file: replaced
        text = json.dumps(curves, indent=1) + "\n"  # whole or not at all: the other tasks' curves live here
        return write_whole(out, lambda tmp: tmp.write_text(text))


def write_tensorboard(curves: dict[str, dict], logdir: str | os.PathLike) -> Path:
    """Write every curve as TensorBoard scalars under ``logdir`` (one tag per task and value).

    Steps: the epoch for recommend (a final mid-epoch point at the next whole epoch) and
    node-classification, the environment steps for rl.

    Raises
    ------
    ImportError
        tensorboard is not installed (``torch.utils.tensorboard`` needs it); the message says so.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError("--logdir needs tensorboard: pip install tensorboard") from None
    with SummaryWriter(log_dir=str(logdir)) as writer:
        rec = curves.get("recommend")
        if rec:
            for e, r, n in zip(rec["epoch"], rec["recall"], rec["ndcg"], strict=True):
                writer.add_scalar(f"recommend/recall@{rec['k']}", r, math.ceil(e))
                writer.add_scalar(f"recommend/ndcg@{rec['k']}", n, math.ceil(e))
        nc = curves.get("node-classification")
        if nc:
            for key in ("train_acc", "val_acc", "test_acc", "loss"):
                for e, v in zip(nc["epoch"], nc.get(key, []), strict=False):
                    writer.add_scalar(f"node_classification/{key}", v, e)
        rl = curves.get("rl")
        if rl:
            for s, r, a in zip(rl["steps"], rl["return"], rl["moving_average"], strict=True):
                writer.add_scalar("rl/episode_return", r, int(s))
                writer.add_scalar("rl/moving_average_return", a, int(s))
    return Path(logdir)

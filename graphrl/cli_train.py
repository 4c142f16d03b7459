"""The ``graphrl train`` commands: real training runs (``graphrl train recommend``), as opposed to demos.

``graphrl train recommend`` trains LightGCN on Gowalla with full-graph propagation, a validation split
carved from the training interactions, evaluation every N epochs, a cosine or plateau learning-rate
schedule, early stopping and the best model restored; it writes the learning curve (JSON, PNG with
matplotlib) and the best weights to ``--out``. With ``--refit`` (the default) a fresh model is then trained
on all training interactions to the validation-selected step and tested too (``refit.pt``). Its defaults
are the recipe of docs/performance.md (softmax over all items at temperature 0.12, item bias, spectral
start, a 20 % validation split, 40 epochs), not `RecommendConfig`'s defaults (plain initialisation, no
bias, the plateau schedule). Example::

    graphrl train recommend --out runs/gowalla

``--out`` is checked before any work (`graphrl.cli_checks.writable_folder`). SIGINT or SIGTERM
(`graphrl.interrupts`) after an evaluation saves the best weights so far (``best.pt``) and the curve so
far (``curve.json``, ``stopped_by`` the signal's name), prints one line saying so and where, and exits
with 130 or 143; a signal while the final results are written lets them be written whole first. An
earlier run's files in ``--out`` are removed before a run's are written, and ``curve.json`` is written
last, so a save stopped part way (a second signal, a full disk) never pairs two runs' files.

This module prints (through click); library code only logs.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import click

from graphrl.atomic_write import write_whole
from graphrl.cli_checks import writable_folder
from graphrl.cli_options import int_list
from graphrl.interrupts import Interrupted

__all__ = ["RECIPE_TEMPERATURE", "train"]

RECIPE_TEMPERATURE = 0.12  # the softmax temperature the 20 % validation split chose (docs/performance.md)


@click.group()
def train() -> None:
    """Training runs with validation, early stopping and saved learning curves."""


@train.command("recommend")
@click.option("--data-root", type=click.Path(file_okay=False), default=None,
              help="Folder holding gowalla/ (default: $GRAPHRL_DATA).")
@click.option("--loss", type=click.Choice(["softmax", "full-softmax", "bpr"]), default="full-softmax",
              show_default=True,
              help="softmax: sampled softmax (cosine / temperature) against --negatives shared uniform "
                   "negatives; full-softmax: softmax over all items, --batch-size users per step; bpr: "
                   "BPR, one uniform negative per pair.")
@click.option("--negatives", type=click.IntRange(min=1), default=1024, show_default=True,
              help="softmax: negatives per batch.")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=RECIPE_TEMPERATURE,
              show_default=True)
@click.option("--layers", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--dim", "embedding_dim", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Users per step (full-softmax) or (user, item) pairs per step (softmax, bpr).")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=2e-2, show_default=True)
@click.option("--reg", type=click.FloatRange(min=0), default=1e-4, show_default=True,
              help="L2 weight on the batch's layer-0 embeddings (LightGCN's decay).")
@click.option("--epochs", type=click.FloatRange(min=0, min_open=True), default=40.0, show_default=True,
              help="Most epochs; the cosine schedule anneals over them (or over --minutes, whichever is "
                   "used up first).")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Training-time budget (evaluations not counted; the refit's time comes on top).")
@click.option("--eval-every", type=click.FloatRange(min=0, min_open=True), default=4.0, show_default=True,
              help="Epochs between validation evaluations.")
@click.option("--patience", type=click.IntRange(min=1), default=10, show_default=True,
              help="Evaluations without a new best validation recall before stopping.")
@click.option("--lr-patience", type=click.IntRange(min=1), default=2, show_default=True,
              help="Evaluations without a new best before the learning rate decays.")
@click.option("--lr-decay", type=click.FloatRange(min=0, max=1, min_open=True), default=0.5,
              show_default=True)
@click.option("--val-fraction", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
              default=0.2, show_default=True,
              help="Share of each user's training interactions held out for validation (like the test "
                   "split's per-user share; --refit trains the final model on them too).")
@click.option("--k", type=click.IntRange(min=1), default=20, show_default=True,
              help="K of recall@K / NDCG@K (model selection uses validation recall@K).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--init", "init", type=click.Choice(["normal", "spectral"]), default="spectral",
              show_default=True,
              help="Layer-0 embeddings: N(0, 0.1^2), or the normalised training matrix's top singular "
                   "vectors.")
@click.option("--schedule", type=click.Choice(["plateau", "cosine"]), default="cosine", show_default=True,
              help="plateau: decay by --lr-decay after --lr-patience evaluations without a new best; cosine: "
                   "a half cosine from --lr to 1e-4 over the epoch or minute budget.")
@click.option("--item-bias/--no-item-bias", default=True, show_default=True,
              help="Learn a popularity score per item, added to every user's score (started at the centred "
                   "log(1 + training degree)).")
@click.option("--propagation", type=click.Choice(["exact", "sampled"]), default="exact", show_default=True,
              help="Training steps propagate exactly over the whole graph, or over blocks from our "
                   "NeighborSampler (--fanouts; the full-degree estimator); evaluation is exact either way.")
@click.option("--fanouts", default="10,10,10", show_default=True,
              help="--propagation sampled: in-edges per node and layer, outermost first, one per layer "
                   "(-1: all).")
@click.option("--sampler", type=click.Choice(["neighbor", "labor"]), default="neighbor", show_default=True,
              help="--propagation sampled: NeighborSampler blocks, or LaborSampler (LABOR-0) blocks, "
                   "--fanouts edges per node in expectation.")
@click.option("--refit/--no-refit", default=True, show_default=True,
              help="After early stopping, train a fresh model on all training interactions (the validation "
                   "ones too) for the validation-selected number of steps at the same learning rates, and "
                   "report its test figures (cosine schedule only).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads for torch, numba and graphrl's kernels (graphrl.threads.configure; default: "
                   "$GRAPHRL_THREADS, else the cores this process may use).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write curve.json, curve.png (with matplotlib), best.pt and refit.pt here (created before "
                   "training; an earlier run's files are replaced, its refit.pt removed when this run has "
                   "none).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="tqdm bar.")
def recommend(data_root, loss, negatives, temperature, layers, embedding_dim, batch_size, lr, reg, epochs,
              minutes, eval_every, patience, lr_patience, lr_decay, val_fraction, k, seed, init, schedule,
              item_bias, propagation, fanouts, sampler, refit, threads, out_dir, progress) -> None:
    """LightGCN on Gowalla: full-graph propagation, validation split, early stopping, best model kept."""
    if out_dir is not None:  # refused now, not after an hour of training (nor after importing torch)
        writable_folder(out_dir, "--out", RUN_FILES)
    fan = tuple(int_list(fanouts, "--fanouts"))
    from graphrl.bench import machine_record
    from graphrl.datasets import load_gowalla
    from graphrl.datasets.validation import holdout_validation
    from graphrl.threads import configure
    from graphrl.train.rec_curve import save_training_curve
    from graphrl.train.recommend import RecommendConfig, train_recommender

    ctx = click.get_current_context()
    if propagation == "exact":  # refused rather than silently ignored
        for name, flag in (("fanouts", "--fanouts"), ("sampler", "--sampler")):
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
                raise click.BadParameter("applies to --propagation sampled only", param_hint=flag)
    else:  # checked before Gowalla is loaded
        try:
            RecommendConfig(propagation=propagation, num_layers=layers, fanouts=fan)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--fanouts") from None

    if threads is not None:
        configure(threads)  # torch, numba and graphrl's kernels: one count (graphrl.threads)
    t_start = time.perf_counter()
    machine0 = machine_record()
    try:
        ds = load_gowalla(data_root)
    except FileNotFoundError as err:
        raise click.ClickException(str(err)) from None
    if k > ds.num_items:
        raise click.BadParameter(f"{k} is more than the {ds.num_items} items", param_hint="--k")
    if init == "spectral" and embedding_dim >= min(ds.num_users, ds.num_items):
        raise click.BadParameter(f"{embedding_dim} with --init spectral must be < min(users, items) = "
                                 f"{min(ds.num_users, ds.num_items)} (or use --init normal)",
                                 param_hint="--dim")
    if refit and schedule != "cosine":
        click.echo("no refit: it replays the cosine schedule's learning rates (--schedule plateau given)")
    try:
        split = holdout_validation(ds, fraction=val_fraction, seed=seed)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"data: {ds.name}: {ds.num_users:,} users, {ds.num_items:,} items; train "
               f"{split.dataset.num_train:,} / validation {split.val_users.numel():,} (carved from train, "
               f"fraction {val_fraction:g}) / test {ds.num_test:,}")
    try:
        config = RecommendConfig(loss=loss, num_negatives=negatives, temperature=temperature,
                                 num_layers=layers, embedding_dim=embedding_dim, batch_size=batch_size, lr=lr,
                                 reg=reg, epochs=epochs, minutes=minutes, eval_every=eval_every,
                                 patience=patience,
                                 lr_patience=lr_patience, lr_decay=lr_decay, seed=seed, init=init,
                                 schedule=schedule, item_bias=item_bias, k=k, propagation=propagation,
                                 fanouts=fan, sampler=sampler)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    click.echo(f"config: {json.dumps(config.__dict__)}")

    curve: list[dict] = []  # what an interrupted run keeps: the evaluations so far and the best weights
    best: dict = {}  # "state": the best weights so far, "epoch": theirs

    def on_eval(entry: dict, model) -> None:
        if entry["best"]:
            state = copy.deepcopy(model.state_dict())
            best.update(state=state, epoch=entry["epoch"])  # one call: a signal sees both or neither
        curve.append(dict(entry))
        mark = " *" if entry["best"] else ""
        click.echo(f"epoch {entry['epoch']:7.2f}  train {entry['train_seconds']:7.1f} s  "
                   f"lr {entry['lr']:.2g}  loss {entry['loss']:.4f}  "
                   f"val recall@{config.k} {entry['val_recall']:.4f}  "
                   f"NDCG@{config.k} {entry['val_ndcg']:.4f}{mark}")

    try:
        report = train_recommender(split, config, progress=progress, on_eval=on_eval,
                                   refit=refit and schedule == "cosine")
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    except Interrupted as err:
        _save_interrupted(err, out_dir, config, curve, best, machine0, t_start, val_fraction)
        raise click.exceptions.Exit(err.exit_code) from None
    k = config.k
    click.echo(f"stopped by {report.stopped_by} after {report.epochs:.2f} epochs ({report.steps:,} steps): "
               f"training {report.train_seconds:.1f} s ({report.train_cpu_seconds:.0f} CPU s), "
               f"evaluation {report.eval_seconds:.1f} s, "
               f"total {time.perf_counter() - t_start:.1f} s")
    if report.sampled_edges:
        click.echo(f"sampler: {report.sampled_edges:,} edges in {report.sample_seconds:.1f} s "
                   f"({100 * report.sample_seconds / report.train_seconds:.1f} % of the training time)")
    click.echo(f"best epoch {report.best_epoch:.2f}: validation recall@{k} {report.best_val.recall:.4f}; "
               f"test recall@{k} {report.best_test.recall:.4f}  NDCG@{k} {report.best_test.ndcg:.4f}")
    click.echo(f"final weights: test recall@{k} {report.final_test.recall:.4f}  "
               f"NDCG@{k} {report.final_test.ndcg:.4f}")
    if report.refit_test is not None:
        click.echo(f"refit on all training interactions to step {report.best_step:,} (epoch "
                   f"{report.best_epoch:.2f}): training {report.refit_seconds:.1f} s "
                   f"({report.refit_cpu_seconds:.0f} CPU s); test recall@{k} {report.refit_test.recall:.4f}  "
                   f"NDCG@{k} {report.refit_test.ndcg:.4f}")
    if out_dir is not None:
        def write() -> list[Path]:
            states = {"best.pt": report.model.state_dict()}
            if report.refit_model is not None:
                states["refit.pt"] = report.refit_model.state_dict()
            return _save_run(out_dir, states, lambda: save_training_curve(
                report, out_dir, machine=_machine(machine0),
                extra={"wall_seconds": time.perf_counter() - t_start, "val_fraction": val_fraction}))

        try:
            saved = write()
        except Interrupted as err:  # the results are in memory: write them whole (a second signal stops it)
            saved = write()
            click.echo(f"interrupted by {err.name} while saving: saved "
                       f"{', '.join(p.name for p in saved)} to {out_dir}")
            raise click.exceptions.Exit(err.exit_code) from None
        for p in saved:
            click.echo(f"wrote {p}")


def _machine(machine0: dict) -> dict:
    """`machine_record` now, with the 1-minute load at the start and now."""
    from graphrl.bench import machine_record

    machine = machine_record()
    machine["load_average_1min"] = [machine0["load_average_1min"], machine["load_average_1min"]]
    return machine


RUN_FILES = ("curve.json", "curve.png", "best.pt", "refit.pt")  # what a run writes into --out


def _save_run(out_dir: str, states: dict[str, dict], write_curve) -> list[Path]:
    """Write a run's weights (``states``: file name -> state dict), then its curve (``write_curve()``,
    returning its paths), into ``out_dir``; return the paths written.

    An earlier run's files go first and the curve, which names the run, comes last: whenever this stops
    (a signal, a full disk), the folder holds files of one run only, each whole.
    """
    out = Path(out_dir)
    if "refit.pt" not in states and (out / "refit.pt").exists():  # it would read as this run's refit
        click.echo(f"removed {out / 'refit.pt'} (an earlier run's; this run has no refit)")
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    saved = [_save_state(state, out / name) for name, state in states.items()]
    return [*write_curve(), *saved]


def _save_state(state: dict, path: Path) -> Path:
    """``torch.save`` through a temporary file: ``path`` holds a whole state or nothing new."""
    import torch

    return write_whole(path, lambda tmp: torch.save(state, tmp))


def _save_interrupted(err: Interrupted, out_dir: str | None, config, curve: list[dict], best: dict,
                      machine0: dict, t_start: float, val_fraction: float) -> None:
    """Save what an interrupted ``train recommend`` has (best weights, the curve so far) and say where."""
    from graphrl.train.rec_curve import interrupted_curve_record, save_curve_record

    if not curve or "state" not in best:
        old = [] if out_dir is None else sorted(n for n in RUN_FILES if (Path(out_dir) / n).exists())
        left = f" ({', '.join(old)} in {out_dir} are an earlier run's, left as they were)" if old else ""
        click.echo(f"interrupted by {err.name} before the first evaluation: nothing to save{left}")
        return
    at = f"interrupted by {err.name} at epoch {curve[-1]['epoch']:.2f} (the last evaluation)"
    if out_dir is None:
        click.echo(f"{at}: nothing saved (no --out)")
        return
    record = interrupted_curve_record(config.__dict__, curve, err.name, machine=_machine(machine0),
                                      extra={"wall_seconds": time.perf_counter() - t_start,
                                             "val_fraction": val_fraction})
    _save_run(out_dir, {"best.pt": best["state"]}, lambda: save_curve_record(record, out_dir))
    click.echo(f"{at}: saved best.pt (epoch {best['epoch']:.2f}) and curve.json to {out_dir}")

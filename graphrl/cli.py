"""The ``graphrl`` command: ``demo`` runs the demo tasks (recommender, node classification, RL) and can
plot their learning curves; ``bench`` runs the benchmarks at a quick size and plots them; ``info``; ``gc``
removes shared memory left by killed graphrl processes.

Two rules hold for every command. An output folder (``--out``, ``--plot``, ``--logdir``) is checked
before any work (`graphrl.cli_checks.writable_folder`). Every command runs inside
`graphrl.interrupts.interrupts`: SIGINT and SIGTERM raise `Interrupted`; a command with work worth keeping
(``train recommend``, ``demo``, ``bench``) saves it and prints one line saying what and where, and the
``graphrl`` group turns the exception into exit status 130 (SIGINT) or 143 (SIGTERM).

This module prints (through click); library code only logs.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import time
from pathlib import Path

import click

import graphrl
from graphrl.cli_checks import writable_folder
from graphrl.cli_partition import partition
from graphrl.cli_train import train
from graphrl.interrupts import Interrupted, interrupts
from graphrl.memory import parse_size


def _check_size(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A byte size option (``"256KiB"``), checked when the command line is parsed, before any task runs."""
    if value is not None:
        try:
            parse_size(value)
        except (ValueError, TypeError) as err:
            raise click.BadParameter(str(err), ctx=ctx, param=param) from None
    return value


__all__ = ["main"]

DEFAULT_SYNTHETIC = "29858,40981,1027370"  # Gowalla's users, items and train+test interactions


def _int_list(name: str, text: str, count: int | None = None) -> list[int]:
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers such as '10,10', got {text!r}",
                                 param_hint=name) from None
    if not values or (count is not None and len(values) != count):
        want = f"{count} " if count else ""
        raise click.BadParameter(f"expected {want}comma-separated integers, got {text!r}", param_hint=name)
    return values


def _data_path(data_root: str | None) -> str:
    if data_root is not None:
        return str(Path(data_root) / "gowalla")
    env = os.environ.get("GRAPHRL_DATA")
    return str(Path(env) / "gowalla") if env else "$GRAPHRL_DATA/gowalla (GRAPHRL_DATA is not set)"


class InterruptibleGroup(click.Group):
    """The ``graphrl`` group: runs its command inside `interrupts`; SIGINT/SIGTERM exit 130/143.

    A command with work to keep catches `Interrupted`, saves, prints its line and raises
    ``click.exceptions.Exit(err.exit_code)``; for the others this prints one line naming the signal.
    """

    def invoke(self, ctx: click.Context):
        with interrupts():
            try:
                return super().invoke(ctx)
            except KeyboardInterrupt as err:  # an Interrupted, or Ctrl-C outside the main thread
                err = err if isinstance(err, Interrupted) else Interrupted(signal.SIGINT)
                click.echo(f"interrupted by {err.name}", err=True)
                ctx.exit(err.exit_code)


@click.group(cls=InterruptibleGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(graphrl.__version__, prog_name="graphrl")
@click.pass_context
def main(ctx: click.Context) -> None:
    """graphrl: GNN training fed by our own neighbour sampler, and trajectory replay for RL."""
    if ctx.invoked_subcommand not in (None, "gc"):  # gc stays light: it computes nothing
        _thread_policy()


def _thread_policy() -> None:
    """Apply `graphrl.threads.configure` (``$GRAPHRL_THREADS``, else the cores) before a command's work;
    a bad ``GRAPHRL_THREADS`` is a usage error naming it. (``train recommend --threads`` sets it again.)"""
    from graphrl.threads import configure

    try:
        configure()
    except ValueError as err:
        raise click.UsageError(str(err)) from None


# demo tasks and their default --minutes (None: not timed); --task all runs them in this order
DEMO_TASKS = {"recommend": 1.5, "node-classification": None, "rl": 1.75}
# the recommend demo's fanouts with --propagation sampled (3 layers, outermost first)
RECIPE_FANOUTS = "10,10,10"


@main.command()
@click.option("--task", type=click.Choice([*DEMO_TASKS, "all"]), default="all", show_default=True,
              help="recommend: LightGCN on Gowalla with our samplers; node-classification: full-graph GCN "
                   "on Cora/CiteSeer under a device budget (Kipf and Welling's setting); rl: actor processes "
                   "on CartPole-v1, our replay store, a transformer DQN learner; all: each in turn (with "
                   "defaults, under 5 minutes on 2 cores).")
@click.option("--dataset", type=click.Choice(["gowalla", "synthetic", "cora", "citeseer"]), default=None,
              help="recommend: gowalla or a synthetic power-law set (default: gowalla, falling back to "
                   "synthetic with one line naming the path if its files are missing; an explicit "
                   "--dataset gowalla fails instead); node-classification: cora (default) or citeseer.")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Wall-clock budget of each timed task: recommend's training (default 1.5; loading, JIT "
                   "and evaluation add about half a minute), rl's whole run (default 1.75).")
@click.option("--epochs", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Also stop after this many epochs.")
@click.option("--propagation", type=click.Choice(["sampled", "exact", "sampled-bpr"]), default="sampled",
              show_default=True,
              help="recommend: the recipe (softmax over all items with an item bias, spectral start) on "
                   "blocks from our NeighborSampler (sampled; --fanouts applies, default 10,10,10), or with "
                   "LightGCN's exact propagation (exact); sampled-bpr: BPR on NeighborSampler + LinkSampler "
                   "blocks (--batch-size, --fanouts and --exclude apply).")
@click.option("--batch-size", type=click.IntRange(min=1), default=8192, show_default=True,
              help="Positive (user, item) pairs per step.")
@click.option("--fanouts", default="10,10", show_default=True,
              help="Neighbours per layer, outermost first (one model layer each; -1 = all).")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.02, show_default=True,
              help="Adam learning rate.")
@click.option("--dim", "embedding_dim", type=click.IntRange(min=1), default=64, show_default=True,
              help="Embedding size.")
@click.option("--exclude", type=click.Choice(["none", "self", "reverse"]), default="none", show_default=True,
              help="Remove each batch's target edges (and reverses) from its sampled blocks.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--data-root", type=click.Path(file_okay=False), default=None,
              help="Folder holding gowalla/ (default: $GRAPHRL_DATA).")
@click.option("--synthetic-size", default=DEFAULT_SYNTHETIC, show_default=True,
              help="Users,items,interactions of the synthetic data set.")
@click.option("--seeds", type=click.IntRange(min=1), default=10, show_default=True,
              help="node-classification: runs with seeds --seed, --seed + 1, ...; prints mean +- std.")
@click.option("--device-budget", default=None, callback=_check_size,
              help="node-classification: the memory manager's device-tier budget, e.g. '256KiB'.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="node-classification: cuda puts the weights on the GPU and streams host-resident vertex "
                   "data through FullGraph's staged path (without CUDA: the same path on host memory).")
@click.option("--dedup/--no-dedup", default=None,
              help="node-classification: FullGraph's device cache of rows several partitions read (default: "
                   "on with --device cuda; either flag on the CPU selects the staged path).")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Write the learning curves (demo_<task>.png, and demo_curves.json, where other tasks' "
                   "curves are kept) into this folder; needs the plot extra. recommend then evaluates "
                   "after every epoch (outside its budget).")
@click.option("--logdir", type=click.Path(file_okay=False), default=None,
              help="Also write the curves as TensorBoard scalars here (needs tensorboard).")
@click.pass_context
def demo(ctx: click.Context, task: str, dataset: str | None, minutes: float | None, epochs: float | None,
         propagation: str, batch_size: int, fanouts: str, lr: float, embedding_dim: int, exclude: str,
         seed: int,
         data_root: str | None, synthetic_size: str, seeds: int, device_budget: str | None, device: str,
         dedup: bool | None, plot_dir: str | None, logdir: str | None) -> None:
    """Run the demo tasks: by default all of them in turn, within 5 minutes on 2 cores.

    recommend: LightGCN on Gowalla (the recipe, a softmax over all items, on blocks from our sampler by
    default; exact propagation, or BPR on blocks from our samplers); prints recall@20 and NDCG@20 against
    popularity and the paper.
    node-classification: a full-graph GCN on Cora or CiteSeer; prints the test accuracy over
    ``--seeds`` runs against the paper's. rl: actor processes play CartPole-v1 into our replay store and a
    transformer DQN learns from it; prints the moving-average return and the replay throughput. With
    ``--task all``, ``--dataset``, ``--epochs`` and ``--lr`` apply to recommend, and node-classification
    runs with its defaults.
    """
    tasks = list(DEMO_TASKS) if task == "all" else [task]
    plot_files = ("demo_curves.json", *(f"demo_{t}.png" for t in tasks))
    for folder, option, files in ((plot_dir, "--plot", plot_files), (logdir, "--logdir", ())):
        if folder is not None:
            writable_folder(folder, option, files)
    curves = _curve_sink(plot_dir, logdir)
    t_demo = time.perf_counter()
    name = tasks[0]
    try:
        for name in tasks:
            _demo_task(ctx, name, len(tasks), task, dataset, minutes, epochs, propagation, batch_size,
                       fanouts, lr, embedding_dim, exclude, seed, data_root, synthetic_size, seeds,
                       device_budget, device, dedup, curves)
    except Interrupted as err:
        _demo_interrupted(err, name, curves, plot_dir, logdir)
        raise click.exceptions.Exit(err.exit_code) from None
    if len(tasks) > 1:
        click.echo(f"demo total wall time {time.perf_counter() - t_demo:.1f} s")
    if curves is not None:
        _write_curves(curves, plot_dir, logdir)


def _demo_interrupted(err: Interrupted, name: str, curves, plot_dir: str | None, logdir: str | None) -> None:
    """Write the curves an interrupted demo has so far (with ``--plot``/``--logdir``); say what and where."""
    at = f"interrupted by {err.name} during {name}"
    if curves is None:
        click.echo(f"{at}: nothing to save (no --plot or --logdir)")
    elif not curves.curves:
        click.echo(f"{at}: no curve yet, nothing to save")
    else:
        paths = _write_curves(curves, plot_dir, logdir, echo=False)
        names = [p.name for p in paths if plot_dir is not None and p.parent == Path(plot_dir)]
        if logdir is not None:
            names.append("TensorBoard scalars")
        where = " and ".join(str(x) for x in (plot_dir, logdir) if x is not None)
        click.echo(f"{at}: saved {' and '.join(names)} to {where}")


def _demo_task(ctx: click.Context, name: str, count: int, task: str, dataset, minutes, epochs, propagation,
               batch_size, fanouts, lr, embedding_dim, exclude, seed, data_root, synthetic_size, seeds,
               device_budget, device, dedup, curves) -> None:
    """Run ``name``, one of the demo's ``count`` tasks (``task`` is ``--task``), recording its curve."""
    if count > 1:
        click.echo(f"== {name} ==")
    budget = minutes if minutes is not None else DEMO_TASKS[name]
    load_before = os.getloadavg()[0]
    if name == "node-classification":
        if task == "all":
            _demo_node_classification("cora", 200, 0.01, seed, seeds, device_budget, data_root, curves,
                                      device, dedup)
        else:
            default_lr = ctx.get_parameter_source("lr") is click.core.ParameterSource.DEFAULT
            _demo_node_classification(dataset or "cora", 200 if epochs is None else max(1, round(epochs)),
                                      0.01 if default_lr else lr, seed, seeds, device_budget, data_root,
                                      curves, device, dedup)
    elif name == "rl":
        _demo_rl(budget, seed, curves)
    else:
        if propagation != "sampled-bpr":
            for name_, flag in (("batch_size", "--batch-size"), ("fanouts", "--fanouts"),
                                ("exclude", "--exclude")):
                if propagation == "sampled" and name_ == "fanouts":
                    continue
                if ctx.get_parameter_source(name_) is not click.core.ParameterSource.DEFAULT:
                    raise click.UsageError(f"{flag} applies to --propagation sampled-bpr, not {propagation}")
            if ctx.get_parameter_source("fanouts") is click.core.ParameterSource.DEFAULT:
                fanouts = RECIPE_FANOUTS
        _demo_recommend(dataset, budget, epochs, batch_size, fanouts, lr, embedding_dim, exclude, seed,
                        data_root, synthetic_size, curves, propagation)
    if curves is not None:
        curves.stamp(name, load_before)


def _curve_sink(plot_dir: str | None, logdir: str | None):
    """A `DemoCurves` when ``--plot`` or ``--logdir`` asks for curves (their libraries checked first)."""
    if plot_dir is None and logdir is None:
        return None
    from graphrl.curves import DemoCurves

    try:
        if plot_dir is not None:
            from graphrl.plots import require_matplotlib

            require_matplotlib()
        if logdir is not None:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as err:
        if "matplotlib" in str(err):
            raise click.ClickException(str(err)) from None
        raise click.ClickException("--logdir needs tensorboard: pip install tensorboard") from None
    return DemoCurves()


def _write_curves(curves, plot_dir: str | None, logdir: str | None, echo: bool = True) -> list[Path]:
    """Write the demo's curves (JSON and PNGs into ``plot_dir``, scalars into ``logdir``); the paths."""
    paths = []
    if plot_dir is not None:
        from graphrl.plots import plot_curves

        paths.append(curves.save_json(Path(plot_dir) / "demo_curves.json", merge=True))
        paths += plot_curves(curves.curves, plot_dir)
    if logdir is not None:
        from graphrl.curves import write_tensorboard

        paths.append(write_tensorboard(curves.curves, logdir))
    if echo:
        for path in paths:
            click.echo(f"wrote TensorBoard scalars to {path}" if logdir is not None and path == Path(logdir)
                       else f"wrote {path}")
    return paths


def _demo_recommend(dataset: str | None, minutes: float, epochs: float | None, batch_size: int, fanouts: str,
                    lr: float, embedding_dim: int, exclude: str, seed: int, data_root: str | None,
                    synthetic_size: str, curves=None, propagation: str = "sampled") -> None:
    """``demo --task recommend``: LightGCN on Gowalla (or synthetic data), exact or through our samplers."""
    explicit = dataset is not None
    dataset = dataset or "gowalla"
    if dataset not in ("gowalla", "synthetic"):
        raise click.BadParameter(f"{dataset!r} is a node-classification data set; the recommend task takes "
                                 "gowalla or synthetic", param_hint="--dataset")
    from graphrl.datasets import load_gowalla, synthetic_bipartite
    from graphrl.train import LinkPredictionConfig, run_link_prediction

    t_start = time.perf_counter()
    fan = _int_list("--fanouts", fanouts)
    if any(k < -1 or k == 0 for k in fan):
        raise click.BadParameter(f"each fanout must be >= 1 or -1, got {fanouts!r}", param_hint="--fanouts")
    if propagation == "sampled":  # the recipe's layer count: checked before the data is loaded
        from graphrl.train.recommend import RecommendConfig
        try:
            RecommendConfig(propagation="sampled", fanouts=tuple(fan))
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--fanouts") from None
    size = _int_list("--synthetic-size", synthetic_size, count=3)

    ds = None
    if dataset == "gowalla":
        try:
            ds = load_gowalla(data_root)
        except FileNotFoundError as err:
            if explicit:  # asked for by name: never substitute other data
                raise click.ClickException(f"Gowalla data not found at {_data_path(data_root)} ({err}); "
                                           "set GRAPHRL_DATA or --data-root, or pass --dataset synthetic"
                                           ) from None
            click.echo(f"Gowalla data not found at {_data_path(data_root)} ({err}); "
                       f"using synthetic_bipartite{tuple(size)} instead (--dataset gowalla makes this "
                       "an error).")
    if ds is None:
        try:
            ds = synthetic_bipartite(*size, seed=seed)
        except (TypeError, ValueError) as err:
            raise click.BadParameter(str(err), param_hint="--synthetic-size") from None
    click.echo(f"data: {ds.name}: {ds.num_users:,} users, {ds.num_items:,} items, {ds.num_train:,} train / "
               f"{ds.num_test:,} test interactions (loaded in {time.perf_counter() - t_start:.1f} s)")
    if propagation != "sampled-bpr":
        from graphrl.cli_demo_recommend import demo_recommend

        demo_recommend(ds, minutes, epochs, seed, lr=lr, embedding_dim=embedding_dim, curves=curves,
                       propagation=propagation, fanouts=tuple(fan))
        click.echo(f"total wall time {time.perf_counter() - t_start:.1f} s")
        return
    config = LinkPredictionConfig(fanouts=tuple(fan), batch_size=batch_size, embedding_dim=embedding_dim,
                                  lr=lr, minutes=minutes, epochs=epochs, seed=seed,
                                  exclude=None if exclude == "none" else exclude)
    click.echo(f"model: LightGCN, {len(fan)} layers, dim {embedding_dim}; fanouts {fan}, batch {batch_size}, "
               f"lr {lr:g}, target-edge exclusion: {exclude}; budget {minutes:g} min"
               + (f" or {epochs:g} epoch(s)" if epochs else ""))
    try:
        on_epoch = None if curves is None else lambda e, r: curves.recommend_epoch(e, r, ds.name)
        report = run_link_prediction(ds, config, progress=True, on_epoch=on_epoch)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    st = report.train
    last = st.losses[-min(len(st.losses), 50):]
    mean_loss = sum(last) / max(len(last), 1)
    click.echo(f"trained {st.seconds:.1f} s: {st.steps:,} steps, {st.epochs:.2f} epochs, "
               f"stopped by {st.stopped_by}; "
               f"BPR loss {st.losses[0]:.4f} -> {mean_loss:.4f} (mean of last {len(last)})")
    k = report.test.k
    click.echo(f"test recall@{k}: {report.test.recall:.4f}  NDCG@{k}: {report.test.ndcg:.4f}  "
               f"({report.test.num_users:,} users with test items)")
    click.echo(f"popularity baseline recall@{k}: {report.popularity.recall:.4f}  "
               f"NDCG@{k}: {report.popularity.ndcg:.4f}")
    if curves is not None:
        curves.recommend_final(st.epochs, report.test, report.popularity, ds.name)
    click.echo(f"sampler throughput: {st.sampled_edges_per_s:,.0f} sampled edges/s "
               f"({st.sampled_edges:,} edges in {st.sample_seconds:.1f} s of sampling); "
               f"end to end {st.end_to_end_edges_per_s:,.0f} edges/s")
    click.echo(f"memory: {_memory_summary(report.memory)}")
    total = time.perf_counter() - t_start
    click.echo(f"evaluation {report.eval_seconds:.1f} s; total wall time {total:.1f} s")


def _demo_node_classification(dataset: str, epochs: int, lr: float, seed: int, seeds: int,
                              device_budget: str | None, data_root: str | None, curves=None,
                              device: str = "cpu", dedup: bool | None = None) -> None:
    """``demo --task node-classification``: GCN over FullGraph on Cora/CiteSeer, test accuracy per seed."""
    from graphrl.memory import MemoryBudgetError
    from graphrl.threads import limit
    from graphrl.train import run_node_classification

    if dataset not in ("cora", "citeseer"):
        raise click.BadParameter(f"node-classification takes cora or citeseer, got {dataset!r}",
                                 param_hint="--dataset")
    paper = {"cora": 81.5, "citeseer": 70.3}[dataset]
    click.echo(f"task: node classification on {dataset}: GCN, 2 layers, 16 hidden, dropout 0.5, lr {lr:g}, "
               f"weight decay 5e-4 (first layer), {epochs} epochs, {seeds} seed(s); device budget "
               f"{device_budget or 'unlimited'}; device {device}")

    def on_seed(s: int, r) -> None:
        click.echo(f"seed {s}: test accuracy {100 * r.test_acc:.1f} %  (val {100 * r.val_acc:.1f} %, "
                   f"{1000 * r.step_seconds:.1f} ms/step)")

    # One thread: Cora's products take milliseconds, too little to gain from a fork-join, and on a busy
    # machine every fork-join waits for a descheduled thread (figures: docs/performance.md).
    with limit(1):
        try:
            report = run_node_classification(dataset, seeds=seeds, epochs=epochs, lr=lr, root=data_root,
                                             first_seed=seed, device_budget=device_budget, on_seed=on_seed,
                                             device=device, dedup=dedup,
                                             on_epoch=curves and curves.node_classification_epoch)
        except FileNotFoundError as err:
            raise click.ClickException(f"{err}") from None
        except (ValueError, MemoryBudgetError) as err:
            raise click.UsageError(str(err)) from None
        except Interrupted:
            if curves is not None:  # the seeds' epochs so far, for the demo to save
                curves.node_classification_final(dataset, paper)
            raise
    click.echo(f"data: {report.dataset}: {report.num_nodes:,} nodes, {report.num_edges:,} directed edges, "
               f"{report.num_features:,} features; {report.partitions} partition(s) per propagation")
    click.echo(f"{report.dataset} test accuracy over {seeds} seed(s): {100 * report.mean:.1f} +- "
               f"{100 * report.std:.1f} % (paper {paper} %); {report.seconds:.1f} s; device-tier peak "
               f"{report.device_peak_bytes:,} bytes")
    t = report.traffic
    if t.get("staged"):
        click.echo(f"staged path (dedup {'on' if t['dedup'] else 'off'}): host-to-device "
                   f"{t['per_epoch_host_to_device_bytes']:,.0f} bytes/epoch, dedup hits "
                   f"{t['dedup_hit_bytes'] / report.results[-1].epochs:,.0f} bytes/epoch, "
                   f"layers {'/'.join(t['intermediate'])}")
    if curves is not None:
        curves.node_classification_final(report.dataset, paper)


def _demo_rl(minutes: float, seed: int, curves=None) -> None:
    """``demo --task rl``: distributed DQN with a causal transformer Q-network on CartPole-v1."""
    from graphrl.train.rl import RLConfig, moving_average, run_rl

    config = RLConfig(minutes=minutes, seed=seed, target_return=195.0)  # CartPole-v0's "solved"
    click.echo(f"task: RL on {config.env_id}: {config.num_actors} actor processes x {config.envs_per_actor} "
               f"envs, epsilon-greedy {config.eps_start:g} -> {config.eps_end:g}; replay store "
               f"{config.capacity_steps:,} steps in {config.num_shards} shared-memory shards, Prioritized"
               f"({config.priority_exponent:g}), SampleToInsertRatio({config.samples_per_insert:g}); "
               f"learner: double DQN, {config.n_step}-step targets in windows of {config.window}, batch "
               f"{config.batch_size}, causal transformer Q-network (d_model {config.d_model}, "
               f"{config.num_layers} layer(s)); budget {minutes:g} min or a {config.avg_episodes}-episode "
               f"average return of {config.target_return:g}")
    returns: list[float] = []  # kept for the curve of an interrupted run
    try:
        report = run_rl(config, progress=True, on_episode=returns.append)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    except RuntimeError as err:
        raise click.ClickException(str(err)) from None
    except Interrupted:
        if curves is not None and returns:
            curves.rl_report(returns, config.avg_episodes, config.env_id, config.target_return)
        raise
    n = config.avg_episodes
    click.echo(f"rl ran {report.seconds:.1f} s: {report.episodes:,} episodes, {report.env_steps:,} env "
               f"steps, {report.updates:,} updates; stopped by {report.stopped_by}")
    click.echo(f"rl return (moving average of {n} episodes): {report.moving_average:.1f} at the end, "
               f"best {report.best_moving_average:.1f}; first {min(n, report.episodes)} episodes "
               f"{moving_average(report.returns[:n], n):.1f} (a random policy averages ~22)")
    click.echo(f"rl throughput: {report.inserted_steps_per_s:,.0f} steps/s inserted, "
               f"{report.windows_per_s:,.0f} windows/s sampled "
               f"({report.windows_per_s * config.window:,.0f} window steps/s)")
    if curves is not None:
        curves.rl_report(report.returns, n, config.env_id, config.target_return)


def _memory_summary(stats: dict) -> str:
    """One line of `MemoryManager.stats()`: per tier, the bytes in use of each owner and in all."""

    def size(n: int) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if n < 1024 or unit == "GiB":
                return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
            n /= 1024
        return ""  # unreachable

    parts = []
    for tier, owners in stats.items():
        if tier == "pools":  # the pools' counters, not a tier's owners
            continue
        live = {o: u for o, u in owners.items() if u["peak"]}
        if live:
            used = ", ".join(f"{o} {size(u['bytes'])}" for o, u in live.items())
            parts.append(f"{tier}: {used} (in all {size(sum(u['bytes'] for u in live.values()))} in "
                         f"{sum(u['regions'] for u in live.values())} regions)")
    return "; ".join(parts) or "no regions"


@main.command()
@click.option("--only", default=",".join(("sampler", "replay", "features", "full_graph")), show_default=True,
              help="Comma-separated subset of the benchmarks to run.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="benchmarks/results/bench",
              show_default=True, help="Folder for the benchmarks' JSON results and logs.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Write bench_<name>.png figures into this folder (needs the plot extra).")
@click.option("--from-json", "from_json", type=click.Path(file_okay=False, exists=True), default=None,
              help="Do not run: plot the results already in this folder (with --plot).")
@click.option("--benchmarks", "bench_dir", type=click.Path(file_okay=False), default=None,
              help="Folder of the benchmark scripts (default: benchmarks/ of the source tree).")
def bench(only: str, out_dir: str, plot_dir: str | None, from_json: str | None,
          bench_dir: str | None) -> None:
    """Run the benchmarks (sampler, replay, features, full_graph) at a quick size, about 5 minutes on 2 cores.

    Each runs as a subprocess of this Python and writes NAME.json (and NAME.log, its table) into
    ``--out``; ``--plot DIR`` then draws the figures: sampled edges/s vs DGL (and PyG where it runs),
    replay GB/s vs TorchRL and a plain copy, feature-gather GB/s vs index_select and a copy, full-graph
    epoch time vs DGL with and without a device budget. ``--from-json DIR --plot OUT`` re-plots.
    """
    from graphrl import bench as bench_mod

    if from_json is not None and plot_dir is None:
        raise click.UsageError("--from-json only plots: give --plot DIR too")
    names = [n.strip() for n in only.split(",") if n.strip()]
    outs = (bench_mod.FILE_NAME, *(f"{n}{ext}" for n in names for ext in (".json", ".log")))
    for folder, option, files in ((plot_dir, "--plot", tuple(f"bench_{n}.png" for n in names)),
                                  (None if from_json else out_dir, "--out", outs)):
        if folder is not None:
            writable_folder(folder, option, files)
    if plot_dir is not None:
        from graphrl.plots import require_matplotlib

        try:
            require_matplotlib()
        except ImportError as err:
            raise click.ClickException(str(err)) from None
    if from_json is None:
        try:
            record = bench_mod.run_benchmarks(names, out_dir, folder=bench_dir, echo=click.echo)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--only") from None
        except FileNotFoundError as err:
            raise click.ClickException(str(err)) from None
        except Interrupted as err:
            _bench_interrupted(err, out_dir)
            raise click.exceptions.Exit(err.exit_code) from None
        failed = [n for n, r in record["benchmarks"].items() if r["returncode"] != 0]
        click.echo(f"bench: {len(names) - len(failed)} of {len(names)} benchmarks ran in "
                   f"{record['seconds']:.0f} s; results in {out_dir}")
    if plot_dir is None:
        return
    from graphrl.plots import plot_benchmarks

    try:
        results, record = bench_mod.load_results(from_json or out_dir)
    except FileNotFoundError as err:
        raise click.ClickException(str(err)) from None
    for path in plot_benchmarks(results, plot_dir, machine=(record or {}).get("machine")):
        click.echo(f"wrote {path}")
    if from_json is None and failed:
        raise click.ClickException(f"benchmarks failed: {', '.join(failed)} (see their .log in {out_dir})")


def _bench_interrupted(err: Interrupted, out_dir: str) -> None:
    """Say what an interrupted ``bench`` kept (`run_benchmarks` wrote its record) and where."""
    from graphrl.bench import FILE_NAME

    path = Path(out_dir) / FILE_NAME
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        click.echo(f"interrupted by {err.name}: nothing saved")
        return
    running = (record.get("interrupted") or {}).get("benchmark", "?")
    done = [n for n, r in record["benchmarks"].items() if n != running and r["returncode"] == 0]
    click.echo(f"interrupted by {err.name} during {running}: saved {path.name} "
               f"({', '.join(done) + ' done' if done else 'no benchmark finished'}) to {out_dir}")


@main.command()
def info() -> None:
    """Print versions, thread counts and which accelerators and optional libraries are available."""
    import numba
    import numpy
    import torch

    click.echo(f"graphrl {graphrl.__version__}")
    click.echo(f"python {platform.python_version()} ({platform.machine()}, {os.cpu_count()} CPUs)")
    click.echo(f"torch {torch.__version__}")
    click.echo(f"numba {numba.__version__}")
    click.echo(f"numpy {numpy.__version__}")
    click.echo(f"torch threads: {torch.get_num_threads()} (inter-op {torch.get_num_interop_threads()})")
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel numba function has run yet in this process
        layer = f"not yet chosen, config {numba.config.THREADING_LAYER!r}"
    click.echo(f"numba threads: {numba.get_num_threads()} (threading layer: {layer})")
    cuda = torch.cuda.is_available()
    detail = f" ({torch.cuda.device_count()} devices: {torch.cuda.get_device_name(0)})" if cuda else ""
    click.echo(f"CUDA available: {'yes' if cuda else 'no'}{detail}")
    try:
        from numba import cuda as numba_cuda

        nb_cuda = bool(numba_cuda.is_available())
    except ImportError:
        nb_cuda = False
    click.echo(f"numba.cuda available: {'yes' if nb_cuda else 'no'}")
    try:
        from graphrl.dglshim import import_dgl

        dgl = import_dgl()
        click.echo(f"DGL available: yes ({dgl.__version__})")
    except ImportError as err:
        click.echo(f"DGL available: no ({str(err).splitlines()[0] if str(err) else type(err).__name__})")
    env = os.environ.get("GRAPHRL_DATA")
    if env:
        found = "found" if (Path(env) / "gowalla" / "train.txt").is_file() else "missing"
        click.echo(f"data: GRAPHRL_DATA={env} (gowalla {found})")
    else:
        click.echo("data: GRAPHRL_DATA is not set")


@main.command()
@click.option("--dry-run", is_flag=True, help="List the segments that would be removed; remove nothing.")
def gc(dry_run: bool) -> None:
    """Remove the shared-memory segments (/dev/shm) of graphrl processes that are gone (killed by SIGKILL).

    A segment's name records its owner's pid, start time and pid namespace; a segment goes when that
    process no longer runs (or its pid now runs another process). Live owners' segments, other users'
    files and names that are not graphrl's are never touched.
    """
    from graphrl.memory.owners import reclaim

    found = reclaim(dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for seg in found:
        click.echo(f"{verb} {seg.name} ({seg.nbytes} bytes; pid {seg.owner.pid} {seg.reason})")
    click.echo(f"{verb} {len(found)} segments, {sum(seg.nbytes for seg in found)} bytes")


main.add_command(train)
main.add_command(partition)

if __name__ == "__main__":  # pragma: no cover
    main()

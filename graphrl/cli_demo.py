"""``graphrl demo``: the demo tasks (recommender, node classification, RL) in turn, with their curves.

`demo` runs ``--task recommend`` (LightGCN on Gowalla or synthetic data: the recipe on sampled blocks or
exact propagation, `graphrl.cli_demo_recommend`, or BPR on `samplers.LinkSampler` blocks),
``node-classification`` (a full-graph GCN on Cora or CiteSeer under a device budget) and ``rl``
(actor processes, the replay store and a transformer DQN on CartPole-v1), each printing its metric
lines against a baseline and the paper; ``--plot`` and ``--logdir`` write the learning curves
(`graphrl.curves`, `graphrl.plots`). An interrupted demo saves the curves so far and says where.

Registered on the ``graphrl`` group by `graphrl.cli`; this module prints (through click).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from graphrl.cli_checks import writable_folder
from graphrl.cli_options import check_size, int_list
from graphrl.interrupts import Interrupted

__all__ = ["DEMO_TASKS", "demo"]

DEFAULT_SYNTHETIC = "29858,40981,1027370"  # Gowalla's users, items and train+test interactions
# demo tasks and their default --minutes (None: not timed); --task all runs them in this order
DEMO_TASKS = {"recommend": 1.5, "node-classification": None, "rl": 1.75}
# the recommend demo's fanouts with --propagation sampled (3 layers, outermost first)
RECIPE_FANOUTS = "10,10,10"


def _data_path(data_root: str | None) -> str:
    """Where the recommend task looks for Gowalla, for its not-found line (even when nothing is set)."""
    if data_root is not None:
        return str(Path(data_root) / "gowalla")
    env = os.environ.get("GRAPHRL_DATA")
    return str(Path(env) / "gowalla") if env else "$GRAPHRL_DATA/gowalla (GRAPHRL_DATA is not set)"


@click.command()
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
              help="Wall-clock budget of each timed task: recommend's training (default 1.5; loading, "
                   "compiling the kernels, before the clock, and evaluation add to it), rl's whole run "
                   "(default 1.75).")
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
@click.option("--device-budget", default=None, callback=check_size,
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
    fan = int_list(fanouts, "--fanouts")
    if any(k < -1 or k == 0 for k in fan):
        raise click.BadParameter(f"each fanout must be >= 1 or -1, got {fanouts!r}", param_hint="--fanouts")
    if propagation == "sampled":  # the recipe's layer count: checked before the data is loaded
        from graphrl.train.recommend import RecommendConfig
        try:
            RecommendConfig(propagation="sampled", fanouts=tuple(fan))
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--fanouts") from None
    size = int_list(synthetic_size, "--synthetic-size", count=3)

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
    click.echo(f"compiling kernels (cached after the first run): {_compile_rl_kernels(config):.1f} s")
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


def _compile_rl_kernels(config) -> float:
    """Write, sample and reprioritise a tiny store of ``config``'s layout, before `run_rl` starts its clock.

    The replay store's numba kernels compile at their first call (``cache=True``: into numba's cache beside
    the sources, which a fresh clone lacks) in the learner and in every actor process; compiled here, the
    actors spawned later load them from the cache and the budget counts learning. Returns wall seconds.
    """
    import numpy as np

    from graphrl.memory import MemoryManager
    from graphrl.train.rl import trajectory_spec
    from replay import Prioritized, ReplayStore

    t0 = time.perf_counter()
    # one episode, small against the capacity (the priority trees update leaf by leaf, as in the run); the
    # observation width does not change the kernels' types
    steps = 2 * config.window
    with MemoryManager() as memory:
        store = ReplayStore(trajectory_spec(4), capacity_steps=min(64 * steps, config.capacity_steps),
                            num_shards=config.num_shards,
                            selector=Prioritized(exponent=config.priority_exponent), memory=memory,
                            seed=config.seed, timeout=5.0)
        try:
            with store.writer(chunk_steps=config.chunk_steps) as writer:
                for t in range(steps):
                    writer.append({"obs": np.full(4, t, np.float32), "action": t % 2, "reward": 1.0,
                                   "done": t == steps - 1})
                writer.end_episode()
            with store.sample(config.batch_size, window=config.window, pad="tail", timeout=5.0,
                              beta=config.beta_start) as batch:
                store.update_priorities(batch.keys, np.linspace(0.5, 2.0, len(batch.keys)))
        finally:
            store.close()
    return time.perf_counter() - t0


def _memory_summary(stats: dict) -> str:
    """One line of `MemoryManager.stats()`: per tier, the bytes in use of each owner and in all (sizes as
    `graphrl.memory.sizes.format_size` writes them)."""
    from graphrl.memory.sizes import format_size

    parts = []
    for tier, owners in stats.items():
        if tier == "pools":  # the pools' counters, not a tier's owners
            continue
        live = {o: u for o, u in owners.items() if u["peak"]}
        if live:
            used = ", ".join(f"{o} {format_size(u['bytes'])}" for o, u in live.items())
            parts.append(f"{tier}: {used}; in all {format_size(sum(u['bytes'] for u in live.values()))}, "
                         f"{sum(u['regions'] for u in live.values())} regions")
    return " | ".join(parts) or "no regions"

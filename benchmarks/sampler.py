"""Neighbour-sampling throughput: our `NeighborSampler` against DGL's CPU sampler, in one process.

Graphs: a uniform random graph and a power-law in-degree graph of 1M nodes / 20M edges
(`graphrl.datasets.synthetic.synthetic_graph`; the power-law one has hubs of ~2 x 10^5 in-edges), and
the Gowalla training graph (both directions, 70,839 nodes, 1,620,256 edges). Both samplers get the
same graph (same edge ids) and the same batches of random seeds; fanouts [15, 10, 5] and batches of
1024 by default. The metric is sampled edges per second: the edges of all blocks of all batches over
the wall time of sampling them. Each repeat times ours and DGL's back to back on the same batches
and the best repeat of each is reported (the machine may be shared: the best run is the one least
disturbed by other processes).

Modes: ``uniform`` (DGL's ``NeighborSampler(fanouts)``) and ``weighted``: the same random float32 edge
weights (uniform in [0, 1), one edge in ten set to 0) for both, ours through
``NeighborSampler(weights=...)`` (rejection over per-row prefix sums, `samplers.kernels.reference`),
DGL's through ``NeighborSampler(fanouts, prob="w")``, which calls ``sample_neighbors(prob="w")``. PyG's
sampler (the one ``NeighborLoader``
calls) is a third baseline where torch_geometric and torch-sparse or pyg-lib import (``benchmarks/_pyg.py``;
``benchmarks/setup_pyg.sh`` builds them); otherwise one line says PyG is skipped.

Mode ``cost`` (no DGL): what weights cost us, as our weighted sampler's CPU time per sampled edge over
our uniform sampler's (the issue-27 target is at most 2), both on the same batches, interleaved, best
of the repeats, timed by this process's CPU time (``time.process_time``: a loaded machine moves it far
less than wall time); run it with ``--threads 1`` for the cost of one core's work.

Mode ``choose`` (no DGL): our weighted choosing pass alone
(`samplers.kernels.cpu.weighted.choose_rows_weighted`, one thread), replayed over the rows that the weighted
sampler's layers visit on the same batches, by class of row (take every positive edge; short rows; rejection
up to 64, 65-128 and above 128 edges) and all rows in their order: CPU microseconds a batch, best of the
repeats, and an md5 of all chosen positions (equal before and after a change that keeps the draws).

Run ``python benchmarks/sampler.py --help``; results go to ``benchmarks/results/sampler.json``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click
import numba
import numpy as np
import torch
from _dgl import to_dgl
from _pyg import bench_pyg, print_pyg, pyg_status
from _report import best_interleaved_cpu, machine, write_result

from graphrl.datasets import load_gowalla
from graphrl.datasets.synthetic import synthetic_graph
from graphrl.dglshim import import_dgl
from graphrl.graph import CSCGraph
from samplers.kernels.cpu import weight_prefix
from samplers.kernels.cpu.weighted import choose_rows_weighted
from samplers.kernels.reference import SHORT_ROW_MAX, SHORT_SHARE, layer_key
from samplers.neighbor import NeighborSampler
from samplers.protocol import edges_by_id

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "sampler.json"


def time_ours(sampler: NeighborSampler, batches: list[torch.Tensor]) -> tuple[int, float]:
    edges = 0
    start = time.perf_counter()
    for seeds in batches:
        edges += sum(b.num_edges for b in sampler.sample(seeds))
    return edges, time.perf_counter() - start


def time_dgl(dgl_sampler, dgl_graph, batches: list[torch.Tensor]) -> tuple[int, float]:
    edges = 0
    start = time.perf_counter()
    for seeds in batches:
        _, _, blocks = dgl_sampler.sample_blocks(dgl_graph, seeds)
        edges += sum(int(b.num_edges()) for b in blocks)
    return edges, time.perf_counter() - start


def edge_weights(num_edges: int, seed: int) -> torch.Tensor:
    """Benchmark weights by edge id: uniform in [0, 1), one edge in ten 0 (never drawn)."""
    rng = np.random.default_rng(seed + 1)
    w = rng.random(num_edges, dtype=np.float32)
    w[rng.random(num_edges) < 0.1] = 0.0
    return torch.from_numpy(w)


def bench_graph(dgl, name: str, graph: CSCGraph, fanouts: list[int], batch_size: int, num_batches: int,
                warmup: int, repeats: int, seed: int, mode: str = "uniform", dgl_graph=None) -> dict:
    rng = np.random.default_rng(seed)
    batches = [torch.from_numpy(rng.integers(0, graph.num_nodes, batch_size)) for _ in range(num_batches)]
    dgl_graph = to_dgl(dgl, graph) if dgl_graph is None else dgl_graph
    if mode == "weighted":
        weights = edge_weights(graph.num_edges, seed)
        dgl_graph.edata["w"] = weights
        ours = NeighborSampler(graph, fanouts, weights=weights, seed=seed)
        dgl_sampler = dgl.dataloading.NeighborSampler(fanouts, prob="w")
    else:
        ours = NeighborSampler(graph, fanouts, seed=seed)
        dgl_sampler = dgl.dataloading.NeighborSampler(fanouts)
    warm = batches[:warmup]
    time_ours(ours, warm)
    time_dgl(dgl_sampler, dgl_graph, warm)
    best_ours = best_dgl = 0.0
    edges_ours = edges_dgl = 0
    for _ in range(repeats):
        edges_ours, dt = time_ours(ours, batches)
        best_ours = max(best_ours, edges_ours / dt)
        edges_dgl, dt = time_dgl(dgl_sampler, dgl_graph, batches)
        best_dgl = max(best_dgl, edges_dgl / dt)
    fan = ",".join(str(k) for k in fanouts)
    return {
        "case": f"{name} [{fan}] b{batch_size}{' weighted' if mode == 'weighted' else ''}",
        "metric": "sampled_edges_per_s",
        "ours": best_ours,
        "baseline": f"dgl {dgl.__version__}",
        "baseline_value": best_dgl,
        "ratio": best_ours / best_dgl,
        "edges_per_batch_ours": edges_ours / num_batches,
        "edges_per_batch_baseline": edges_dgl / num_batches,
    }


def bench_cost(name: str, graph: CSCGraph, fanouts: list[int], batch_size: int, num_batches: int,
               repeats: int, seed: int) -> dict:
    """Our weighted sampler against our uniform one (mode ``cost``): CPU seconds per sampled edge and
    their ratio, weighted over uniform."""
    rng = np.random.default_rng(seed)
    batches = [torch.from_numpy(rng.integers(0, graph.num_nodes, batch_size)) for _ in range(num_batches)]
    uniform = NeighborSampler(graph, fanouts, seed=seed)
    weighted = NeighborSampler(graph, fanouts, weights=edge_weights(graph.num_edges, seed), seed=seed)
    edges = [time_ours(s, batches)[0] for s in (uniform, weighted)]  # also the untimed first calls
    wall, cpu = best_interleaved_cpu([lambda s=s: time_ours(s, batches) for s in (uniform, weighted)], 1,
                                     repeats)
    per_edge = [t / n for t, n in zip(cpu, edges, strict=True)]
    fan = ",".join(str(k) for k in fanouts)
    return {
        "case": f"{name} [{fan}] b{batch_size} weighted cost",
        "metric": "cpu_s_per_sampled_edge_ratio",
        "ours": per_edge[1] / per_edge[0],
        "baseline": "our uniform sampler",
        "weighted_m_edges_per_cpu_s": 1e-6 / per_edge[1],
        "uniform_m_edges_per_cpu_s": 1e-6 / per_edge[0],
        "weighted_wall_s": wall[1],
        "uniform_wall_s": wall[0],
        "edges_per_batch_weighted": edges[1] / num_batches,
        "edges_per_batch_uniform": edges[0] / num_batches,
    }


CHOOSE_CLASSES = ("every positive edge", "short rows", "rejection <= 64", "rejection 65-128",
                  "rejection > 128")


def bench_choose(name: str, graph: CSCGraph, fanouts: list[int], batch_size: int, num_batches: int,
                 repeats: int, seed: int) -> dict:
    """Our weighted choosing pass alone (mode ``choose``): the destination rows of every layer of the
    weighted sampler's blocks on the benchmark's batches, replayed through `choose_rows_weighted` (no
    exclusions, without replacement) by class of row and all in their order; CPU us a batch."""
    import hashlib

    rng = np.random.default_rng(seed)
    batches = [torch.from_numpy(rng.integers(0, graph.num_nodes, batch_size)) for _ in range(num_batches)]
    weights = edge_weights(graph.num_edges, seed).numpy()
    indptr = graph.indptr.numpy().astype(np.int64)
    prefix, positive = weight_prefix(indptr, weights)
    sampler = NeighborSampler(graph, fanouts, weights=torch.from_numpy(weights), seed=seed)
    layers = [(b.dst_nodes.numpy().astype(np.int64), k) for seeds in batches
              for b, k in zip(sampler.sample(seeds), fanouts, strict=True)]
    none, no_times = np.empty(0, np.int64), np.empty(0, np.int64)

    def args(dst: np.ndarray, k: np.ndarray, layer: int) -> tuple:
        count = np.minimum(k, positive[dst])
        out_indptr = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
        zero = np.zeros(dst.size, np.int64)
        return (dst, indptr[dst], positive[dst], zero, zero, indptr[dst + 1], out_indptr, False,
                np.uint64(layer_key(seed, layer, 0)), none, weights, no_times, prefix,
                np.empty(out_indptr[-1], np.int64), 0, dst.size)

    every = [args(dst, np.full(dst.size, k), i) for i, (dst, k) in enumerate(layers)]
    dst = np.concatenate([a[0] for a in every])
    k = np.concatenate([np.full(a[0].size, kk) for a, (_, kk) in zip(every, layers, strict=True)])
    deg, pos = np.diff(indptr)[dst], positive[dst]
    cls = np.select([pos <= k, (deg <= SHORT_ROW_MAX) & (SHORT_SHARE * k > pos), deg <= 64, deg <= 128],
                    [0, 1, 2, 3], 4)
    runs = {cname: [args(dst[cls == c], k[cls == c], c)] for c, cname in enumerate(CHOOSE_CLASSES)}
    runs["all rows"] = every
    for calls in runs.values():
        for a in calls:
            choose_rows_weighted(*a)
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for run, calls in runs.items():
            start = time.process_time()
            for a in calls:
                choose_rows_weighted(*a)
            best[run] = min(best[run], time.process_time() - start)
    md5 = hashlib.md5(np.concatenate([a[13] for a in every]).tobytes()).hexdigest()
    fan = ",".join(str(k) for k in fanouts)
    return {"case": f"{name} [{fan}] b{batch_size} weighted choose", "metric": "cpu_us_per_batch",
            "ours": best["all rows"] * 1e6 / num_batches, "baseline": None,
            "classes_us_per_batch": {n: best[n] * 1e6 / num_batches for n in CHOOSE_CLASSES},
            "rows_per_class": {n: int((cls == c).sum()) for c, n in enumerate(CHOOSE_CLASSES)},
            "positions_md5": md5}


def _millions(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n:,}"


@click.command()
@click.option("--graphs", default="uniform,powerlaw,gowalla", show_default=True,
              help="Comma-separated subset of uniform, powerlaw, gowalla.")
@click.option("--num-nodes", default=1_000_000, show_default=True, help="Nodes of the synthetic graphs.")
@click.option("--num-edges", default=20_000_000, show_default=True, help="Edges of the synthetic graphs.")
@click.option("--fanouts", default="15,10,5", show_default=True, help="Fanouts, outermost layer first.")
@click.option("--batch-size", default=1024, show_default=True)
@click.option("--batches", "num_batches", default=20, show_default=True, help="Timed batches per repeat.")
@click.option("--warmup", default=3, show_default=True, help="Untimed batches first (JIT, caches).")
@click.option("--repeats", default=3, show_default=True, help="Timed repeats; the best one is reported.")
@click.option("--modes", default="uniform,weighted", show_default=True,
              help="Comma-separated subset of uniform, weighted (edge weights; DGL with prob=), cost (our "
                   "weighted against our uniform sampler in CPU time; no DGL), choose (our weighted choosing "
                   "pass alone by class of row; no DGL).")
@click.option("--seed", default=0, show_default=True)
@click.option("--data", "data_dir", default=None,
              help="Data folder with gowalla/ (default $GRAPHRL_DATA, else ../shared/data).")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="Threads for both samplers (numba and DGL's OpenMP); default: every core.")
@click.option("--output", default=str(RESULTS), show_default=True, type=click.Path(dir_okay=False))
def main(graphs: str, num_nodes: int, num_edges: int, fanouts: str, batch_size: int, num_batches: int,
         warmup: int, repeats: int, modes: str, seed: int, data_dir: str | None, threads: int | None,
         output: str) -> None:
    """Sampled edges/s of our NeighborSampler and DGL's CPU NeighborSampler on the same graphs."""
    os.environ.setdefault("GRAPHRL_DATA", str(REPO.parent / "shared" / "data"))
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    known = {"uniform", "weighted", "cost", "choose"}
    if set(mode_list) - known:
        raise click.BadParameter(f"unknown modes {sorted(set(mode_list) - known)}", param_hint="--modes")
    dgl_modes = [m for m in mode_list if m not in ("cost", "choose")]
    dgl = import_dgl() if dgl_modes else None
    threads = threads or os.cpu_count() or 1
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    if dgl is not None:
        dgl.utils.set_num_threads(threads)
    fans = [int(k) for k in fanouts.split(",")]
    names = [g.strip() for g in graphs.split(",") if g.strip()]
    unknown = set(names) - {"uniform", "powerlaw", "gowalla"}
    if unknown:
        raise click.BadParameter(f"unknown graphs {sorted(unknown)}", param_hint="--graphs")
    rows = []
    costs = []
    chooses = []
    for name in names:
        if name == "gowalla":
            try:
                graph = load_gowalla(data_dir).graph
            except FileNotFoundError as err:
                click.echo(f"skipping gowalla: {err}")
                continue
            label = f"gowalla train {graph.num_nodes:,}/{graph.num_edges:,}"
        else:
            graph = synthetic_graph(num_nodes, num_edges, name, seed=seed)
            label = f"{name} {_millions(num_nodes)}/{_millions(num_edges)}"
        click.echo(f"{label}: max in-degree {int(graph.in_degrees().max()):,}", err=True)
        if "cost" in mode_list:
            costs.append(bench_cost(label, graph, fans, batch_size, num_batches, repeats, seed))
        if "choose" in mode_list:
            chooses.append(bench_choose(label, graph, fans, batch_size, num_batches, repeats, seed))
        if not dgl_modes:
            continue
        dgl_graph = to_dgl(dgl, graph)
        # PyG baseline (benchmarks/_pyg.py): source and destination of every edge id
        coo = tuple(map(torch.from_numpy, edges_by_id(graph))) if pyg_status()[0] else None
        for mode in dgl_modes:
            rows.append(bench_graph(dgl, label, graph, fans, batch_size, num_batches, warmup, repeats, seed,
                                    mode, dgl_graph))
            if coo is not None:
                weights = edge_weights(graph.num_edges, seed) if mode == "weighted" else None
                bench_pyg(rows[-1], coo, graph.num_nodes, fans, batch_size, num_batches, warmup, repeats,
                          seed, mode, weights)
        del graph, dgl_graph, coo
    if dgl is not None:
        click.echo(f"\nthreads: ours {numba.get_num_threads()}, dgl {dgl.utils.get_num_threads()} (OpenMP)")
        click.echo(f"{'case':<53} {'ours (M edges/s)':>17} {'dgl (M edges/s)':>16} {'ratio':>6}")
        for row in rows:
            click.echo(f"{row['case']:<53} {row['ours'] / 1e6:>17.1f} {row['baseline_value'] / 1e6:>16.1f} "
                       f"{row['ratio']:>6.2f}")
        print_pyg(rows)
    if costs:
        click.echo(f"\nweights' cost, {numba.get_num_threads()} thread(s), M edges per CPU second "
                   f"(load {os.getloadavg()[0]:.1f})")
        click.echo(f"{'case':<62} {'uniform':>8} {'weighted':>9} {'ratio':>6}")
        for row in costs:
            click.echo(f"{row['case']:<62} {row['uniform_m_edges_per_cpu_s']:>8.1f} "
                       f"{row['weighted_m_edges_per_cpu_s']:>9.1f} {row['ours']:>6.2f}")
    for row in chooses:
        click.echo(f"\n{row['case']}: CPU us a batch, 1 thread (load {os.getloadavg()[0]:.1f}), "
                   f"positions md5 {row['positions_md5']}")
        for name, us in row["classes_us_per_batch"].items():
            click.echo(f"  {name:<22} {us:>9,.0f}  ({row['rows_per_class'][name]:,} rows)")
        click.echo(f"  {'all rows':<22} {row['ours']:>9,.0f}")
    write_result("sampler", rows + costs + chooses,
                 machine(threads=threads, numba_threads=numba.get_num_threads(),
                         numba_threading_layer=numba.threading_layer()), output)


if __name__ == "__main__":
    main()

"""Loader throughput: batches/s of our `NeighborLoader` with features against DGL's ``DataLoader``.

Both loaders get the same graph (same edge ids), the same training nodes, the same fanouts, batch
size and node features, shuffle every epoch and hand out each batch's blocks together with the
features of its input nodes (DGL: ``NeighborSampler(prefetch_node_feats=["feat"])`` with the
features in ``g.ndata``, read as ``blocks[0].srcdata["feat"]``; ours: ``batch.input_features``,
gathered into reusable staging). The consumer reads one value of the features of every batch, so
both materialise them, and otherwise does nothing: the figure is the loader's own rate. Ours is
timed with ``prefetch=0`` (all in the caller's thread, like DGL with ``num_workers=0``) and with
``prefetch=1`` (a background thread; it pays off when the consumer trains between batches, which
this benchmark leaves out, so it mainly shows the thread's overhead here). Each repeat runs one
epoch of each back to back; the best repeat is reported (the machine may be shared).

Run ``python benchmarks/loader.py --help``; results go to ``benchmarks/results/loader.json``.
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
from _report import machine, write_result

from graphrl.datasets.synthetic import synthetic_graph
from graphrl.dglshim import import_dgl
from samplers.features import FeatureStore
from samplers.loader import NeighborLoader

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "loader.json"


def epoch_ours(loader: NeighborLoader) -> tuple[int, int, float]:
    batches = rows = 0
    start = time.perf_counter()
    for batch in loader:
        rows += int(batch.input_features.shape[0])
        float(batch.input_features[-1, 0])
        batches += 1
    return batches, rows, time.perf_counter() - start


def epoch_dgl(loader) -> tuple[int, int, float]:
    batches = rows = 0
    start = time.perf_counter()
    for _input_nodes, _output_nodes, blocks in loader:
        feat = blocks[0].srcdata["feat"]
        rows += int(feat.shape[0])
        float(feat[-1, 0])
        batches += 1
    return batches, rows, time.perf_counter() - start


@click.command()
@click.option("--graph", "kind", type=click.Choice(["uniform", "powerlaw"]), default="powerlaw",
              show_default=True)
@click.option("--num-nodes", default=200_000, show_default=True)
@click.option("--num-edges", default=4_000_000, show_default=True)
@click.option("--train-fraction", default=0.1, show_default=True, help="Share of nodes used as seeds.")
@click.option("--fanouts", default="10,5", show_default=True, help="Fanouts, outermost layer first.")
@click.option("--batch-size", default=1024, show_default=True)
@click.option("--dim", default=128, show_default=True, help="float32 feature columns.")
@click.option("--repeats", default=3, show_default=True, help="Timed epochs of each; the best is reported.")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="Threads for both (numba, torch, DGL's OpenMP); default: every core.")
@click.option("--seed", default=0, show_default=True)
@click.option("--output", default=str(RESULTS), show_default=True, type=click.Path(dir_okay=False))
def main(kind: str, num_nodes: int, num_edges: int, train_fraction: float, fanouts: str, batch_size: int,
         dim: int, repeats: int, threads: int | None, seed: int, output: str) -> None:
    """Batches/s of NeighborLoader (with features) and DGL's DataLoader with the same settings."""
    dgl = import_dgl()
    threads = threads or os.cpu_count() or 1
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(threads)
    dgl.utils.set_num_threads(threads)
    fans = [int(k) for k in fanouts.split(",")]
    rng = np.random.default_rng(seed)
    graph = synthetic_graph(num_nodes, num_edges, kind, seed=seed)
    x = torch.from_numpy(rng.standard_normal((num_nodes, dim), dtype=np.float32))
    train = torch.from_numpy(np.sort(rng.choice(num_nodes, int(num_nodes * train_fraction), replace=False)))

    feats = FeatureStore(x)
    ours = {p: NeighborLoader(graph, train, fans, batch_size, features=feats, seed=seed, prefetch=p)
            for p in (0, 1)}
    g = to_dgl(dgl, graph)
    g.ndata["feat"] = x
    dgl_loader = dgl.dataloading.DataLoader(
        g, train, dgl.dataloading.NeighborSampler(fans, prefetch_node_feats=["feat"]), batch_size=batch_size,
        shuffle=True, drop_last=False, num_workers=0)
    for loader in ours.values():  # warm-up epochs: JIT, staging pages
        epoch_ours(loader)
    epoch_dgl(dgl_loader)
    best = {"ours0": 0.0, "ours1": 0.0, "dgl": 0.0}
    rows = {}
    for _ in range(repeats):
        for key, run in (("ours0", lambda: epoch_ours(ours[0])), ("ours1", lambda: epoch_ours(ours[1])),
                         ("dgl", lambda: epoch_dgl(dgl_loader))):
            n, r, dt = run()
            best[key] = max(best[key], n / dt)
            rows[key] = r / n
    load = os.getloadavg()[0]
    fan = ",".join(map(str, fans))
    case = f"{kind} {num_nodes / 1e6:g}M/{num_edges / 1e6:g}M [{fan}] b{batch_size} d{dim}"
    result_rows = [
        {"case": f"{case} prefetch={p}", "metric": "batches_per_s", "ours": best[f"ours{p}"],
         "baseline": f"dgl {dgl.__version__} DataLoader (num_workers=0)", "baseline_value": best["dgl"],
         "ratio": best[f"ours{p}"] / best["dgl"], "input_rows_per_batch_ours": rows[f"ours{p}"],
         "input_rows_per_batch_baseline": rows["dgl"]}
        for p in (0, 1)
    ]
    click.echo(f"\nthreads {threads}; 1-min load average {load:.2f} on {os.cpu_count()} CPUs "
               f"(best of {repeats} epochs of {len(ours[0])} batches)")
    click.echo(f"{'case':<52} {'ours batches/s':>14} {'dgl batches/s':>13} {'ratio':>6}")
    for r in result_rows:
        click.echo(f"{r['case']:<52} {r['ours']:>14.1f} {r['baseline_value']:>13.1f} {r['ratio']:>6.2f}")
    write_result("loader", result_rows, machine(threads=threads, load_average_1min=load), output)


if __name__ == "__main__":
    main()

"""Loader staging rule: time per batch of a `NeighborLoader` epoch with features when the consumer drops each
batch (the iterator gives its buffer back *when unused*: the slot returns once no tensor views it) against
the same loop calling ``batch.release()`` at the end of the body (the buffer back at once, what the iterator
did at ``next()`` before the rule changed). Both loaders have the same settings; their epochs alternate
(``--rounds`` of each) so they see the same load. A third row times ``list(loader)`` (every batch kept: the
batches past the pool's slots get buffers of their own) and reports how many it made.

Cases: Cora (real features, 2,708 seeds, [10, 10], batch 64) and Gowalla (64 random float32 columns, the first
10,240 users as seeds, [10, 5], batch 1024), with ``prefetch`` 0 and 1; the data come from GRAPHRL_DATA.
The consumer reads one value of every batch's features. Run ``python benchmarks/loader_staging.py --help``;
results go to ``benchmarks/results/loader_staging.json``.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from pathlib import Path

import click
import torch
from _report import machine, row, write_result

from graphrl.datasets import load_gowalla, load_planetoid
from samplers.loader import NeighborLoader

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "loader_staging.json"


def epoch(loader: NeighborLoader, release: bool) -> tuple[float, float]:
    """Wall and thread-CPU seconds per batch of one epoch."""
    n, total = 0, 0.0
    w0, c0 = time.perf_counter(), time.thread_time()
    for batch in loader:
        total += float(batch.input_features[0, 0])
        n += 1
        if release:
            batch.release()
    return (time.perf_counter() - w0) / n, (time.thread_time() - c0) / n


def kept_epoch(loader: NeighborLoader) -> tuple[float, int]:
    """Seconds per batch of ``list(loader)`` and the buffers of their own it made (live at its end)."""
    w0 = time.perf_counter()
    batches = list(loader)
    dt = (time.perf_counter() - w0) / len(batches)
    made = loader.own_buffers
    del batches
    gc.collect()
    return dt, made


def case_data(name: str) -> tuple:
    if name == "cora":
        ds = load_planetoid("cora")
        return ds.graph, ds.features, torch.arange(ds.graph.num_nodes), [10, 10], 64
    ds = load_gowalla()
    x = torch.randn(ds.graph.num_nodes, 64, generator=torch.Generator().manual_seed(0))
    return ds.graph, x, torch.arange(10240), [10, 5], 1024


@click.command()
@click.option("--cases", default="cora,gowalla", show_default=True)
@click.option("--rounds", default=20, show_default=True, help="Timed epochs of each arm, alternating.")
@click.option("--output", default=str(RESULTS), show_default=True, type=click.Path(dir_okay=False))
def main(cases: str, rounds: int, output: str) -> None:
    """Seconds per batch: batches dropped (given back when unused) against released at once."""
    rows = []
    for name in cases.split(","):
        graph, x, seeds, fanouts, batch_size = case_data(name)
        for prefetch in (0, 1):
            loaders = [NeighborLoader(graph, seeds, fanouts, batch_size, features=x, seed=0,
                                      prefetch=prefetch) for _ in range(2)]
            for loader, release in zip(loaders, (False, True), strict=True):  # warm-up: JIT, pool growth
                epoch(loader, release)
            times: list[list[tuple[float, float]]] = [[], []]
            for r in range(rounds):
                for arm in ((0, 1) if r % 2 == 0 else (1, 0)):
                    times[arm].append(epoch(loaders[arm], release=arm == 1))
            wall = [statistics.median(w for w, _ in t) * 1e6 for t in times]
            cpu = [statistics.median(c for _, c in t) * 1e6 for t in times]
            kept_s, made = kept_epoch(loaders[0])
            label = f"{name} {fanouts} b{batch_size} prefetch={prefetch}"
            rows.append(row(label, "us_per_batch_median", wall[0], "release() at once (old rule)", wall[1],
                            thread_cpu_us=cpu[0], baseline_thread_cpu_us=cpu[1], batches=len(loaders[0]),
                            kept_list_us_per_batch=kept_s * 1e6, kept_list_own_buffers=made))
            for loader in loaders:
                loader.close()
    load = os.getloadavg()[0]
    click.echo(f"\n1-min load average {load:.2f} on {os.cpu_count()} CPUs; medians of {rounds} epochs each")
    click.echo(f"{'case':<36} {'dropped us':>10} {'released us':>11} {'ratio':>6} {'cpu us':>8} "
               f"{'base cpu':>8} {'list() us':>9} {'own':>4}")
    for r in rows:
        click.echo(f"{r['case']:<36} {r['ours']:>10.1f} {r['baseline_value']:>11.1f} {r['ratio']:>6.3f} "
                   f"{r['thread_cpu_us']:>8.1f} {r['baseline_thread_cpu_us']:>8.1f} "
                   f"{r['kept_list_us_per_batch']:>9.1f} {r['kept_list_own_buffers']:>4}")
    write_result("loader_staging", rows, machine(load_average_1min=load), output, rounds=rounds)


if __name__ == "__main__":
    main()

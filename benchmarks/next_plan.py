"""The next layer planned by the relabelling (`samplers.kernels.cpu.sample_block(next_fanout=...)`): what it
takes off the calling thread's serial part, on the CPU sampler.

One process, one tree: ``planned`` is the sampler as it is; ``alone`` is the same sampler with the next
layer's fanout withheld from `samplers.kernels.cpu.sample_block` (every layer runs its own planning pass).
Rounds alternate the two (the order swapped every round), each round timing ``--batches`` batches of random
seeds (the same seeds for both; a sampler each, so that both draw the same blocks). Per batch: the calling
thread's CPU time outside the team's parallel blocks (``serial``: `time.thread_time` less the caller's share
inside `graphrl.kernels.engaged` and `parallel_chunks`, the part the helpers wait for), the calling thread's
CPU, the process CPU, and wall. The table gives each side's median per batch and the median of the paired
per-round differences with its interquartile range. The blocks of both sides are compared once (they must be
equal).

Run ``python benchmarks/next_plan.py --help``; results go to ``benchmarks/results/next_plan.json``.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import click
import numba
import numpy as np
import torch
from _report import machine, write_result

import samplers.kernels.cpu as cpu_kernels
import samplers.kernels.cpu.layer as cpu_layer
import samplers.kernels.cpu.plan as cpu_plan
from graphrl.datasets import load_gowalla
from samplers.neighbor import NeighborSampler

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "next_plan.json"
METRICS = ("serial", "caller", "process", "wall")


class ParallelClock:
    """The calling thread's CPU seconds inside the layer's parallel blocks (wrapped module attributes)."""

    def __init__(self) -> None:
        self.inside = 0.0
        own_engaged, own_chunks = cpu_layer.engaged, cpu_layer.parallel_chunks

        @contextlib.contextmanager
        def engaged(*args, **kwargs):
            t0 = time.thread_time()
            with own_engaged(*args, **kwargs) as team:
                yield team
            self.inside += time.thread_time() - t0

        def parallel_chunks(*args, **kwargs):
            t0 = time.thread_time()
            out = own_chunks(*args, **kwargs)
            self.inside += time.thread_time() - t0
            return out

        cpu_layer.engaged = engaged
        cpu_layer.parallel_chunks = parallel_chunks
        cpu_plan.parallel_chunks = parallel_chunks


def sample_block_alone(own):
    """``own`` (`samplers.kernels.cpu.sample_block`) with ``next_fanout`` withheld."""

    def alone(*args, **kwargs):
        kwargs.pop("next_fanout", None)
        return own(*args, **kwargs)

    return alone


@click.command()
@click.option("--fanouts", default="15,10,5", show_default=True, help="Fanouts, outermost layer first.")
@click.option("--batch-size", default=1024, show_default=True)
@click.option("--batches", default=20, show_default=True, help="Batches per side and round.")
@click.option("--rounds", default=10, show_default=True, help="Rounds (each times both sides).")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--weighted", is_flag=True, help="Random edge weights (weighted rows).")
@click.option("--data", "data_dir", default=None, help="Data folder with gowalla/ (default $GRAPHRL_DATA).")
@click.option("--output", default=str(RESULTS), show_default=True, type=click.Path(dir_okay=False))
def main(fanouts: str, batch_size: int, batches: int, rounds: int, threads: int, weighted: bool,
         data_dir: str | None, output: str) -> None:
    """Time the sampler with and without the next layer planned by the relabelling, interleaved."""
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    graph = load_gowalla(data_dir).graph
    fans = [int(k) for k in fanouts.split(",")]
    weights = None
    if weighted:
        rng = np.random.default_rng(1)
        w = rng.random(graph.num_edges, dtype=np.float32)
        w[rng.random(graph.num_edges) < 0.1] = 0.0
        weights = torch.from_numpy(w)
    clock = ParallelClock()
    planned_fn = cpu_kernels.sample_block
    sides = {"planned": planned_fn, "alone": sample_block_alone(planned_fn)}
    # a sampler per side, called as often as the other: the same calls draw the same blocks
    samplers = {name: NeighborSampler(graph, fans, weights=weights, seed=0) for name in sides}
    rng = np.random.default_rng(0)
    seeds = [torch.from_numpy(rng.integers(0, graph.num_nodes, batch_size)) for _ in range(batches)]
    blocks = {}
    for name, fn in sides.items():  # warm-up (compilation) and the blocks of both sides
        cpu_kernels.sample_block = fn
        blocks[name] = [samplers[name].sample(s) for s in seeds[:2]]
    for a, b in zip(blocks["planned"], blocks["alone"], strict=True):
        for x, y in zip(a, b, strict=True):
            assert all(torch.equal(getattr(x, f), getattr(y, f)) for f in ("src_nodes", "indptr", "indices",
                                                                         "edge_ids")), "blocks differ"
    per = {name: {m: [] for m in METRICS} for name in sides}
    loads = []
    for r in range(rounds):
        loads.append(os.getloadavg()[0])
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            cpu_kernels.sample_block = sides[name]
            clock.inside = 0.0
            t, c, p = time.perf_counter(), time.thread_time(), time.process_time()
            for s in seeds:
                samplers[name].sample(s)
            caller = time.thread_time() - c
            got = {"serial": caller - clock.inside, "caller": caller, "process": time.process_time() - p,
                   "wall": time.perf_counter() - t}
            for m in METRICS:
                per[name][m].append(got[m] / batches * 1e6)
    cpu_kernels.sample_block = planned_fn
    rows = []
    label = f"gowalla {fans} b{batch_size} {threads} thread(s){' weighted' if weighted else ''}"
    click.echo(f"{label}, {rounds} rounds x {batches} batches, load {min(loads):.1f}-{max(loads):.1f}")
    click.echo(f"{'us a batch':<10} {'alone':>9} {'planned':>9} {'paired diff':>12} {'IQR':>18}")
    for m in METRICS:
        a, b = np.array(per["alone"][m]), np.array(per["planned"][m])
        d = b - a
        q1, q3 = np.percentile(d, [25, 75])
        click.echo(f"{m:<10} {np.median(a):>9.0f} {np.median(b):>9.0f} {np.median(d):>12.0f} "
                   f"{q1:>8.0f}..{q3:<8.0f}")
        rows.append({"case": f"{label}: {m}", "metric": f"{m}_us_per_batch", "ours": float(np.median(b)),
                     "baseline": "next_fanout withheld", "baseline_value": float(np.median(a)),
                     "ratio": float(np.median(b) / np.median(a)), "paired_diff_median": float(np.median(d)),
                     "paired_diff_iqr": [float(q1), float(q3)]})
    write_result("next_plan", rows, machine(load_range=[min(loads), max(loads)]), output,
                 config={"fanouts": fans, "batch_size": batch_size, "batches": batches, "rounds": rounds,
                         "threads": threads, "weighted": weighted})


if __name__ == "__main__":
    main()

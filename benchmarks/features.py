"""Feature-gather throughput: `FeatureStore.gather` against ``torch.index_select`` and a plain copy.

A table of R rows of D float32 columns (R = 2M for the reference figures; smaller by default),
batches of B random row ids (100k). Timed, in rounds:

- ours: ``FeatureStore.gather(ids)`` into its reusable staging buffer (the store puts the table on
  huge pages unless ``--no-huge-pages``; every method reads that same table);
- ``torch.index_select(table, 0, ids)`` into a fresh tensor (the baseline);
- ``torch.index_select(..., out=buffer)`` into a preallocated buffer (to show where the baseline's
  time goes: a fresh tensor's pages are faulted in on first write);
- the copy ceiling: a plain contiguous copy of the same number of bytes from a random offset of the
  table into a preallocated buffer, four ways: ``Tensor.copy_`` (torch's threads), ``numpy.copyto``
  (one thread), and `graphrl.kernels.copy` with streaming and with cached stores on the gather's
  threads (2 MiB chunks, `graphrl.kernels.parallel_for`). The ceiling is the fastest of the four
  (by median), and the table names it.

Every round runs every method once, each with fresh ids (and the copies with a fresh offset), in an
order that rotates from round to round, so that no method reads rows another one just brought into
the cache (a server's L3 may hold hundreds of MiB) and a disturbance of the shared machine falls on all
methods alike. The figures are medians over the rounds (GB/s of gathered rows, 10^9 bytes), and the
load average is printed before and after each table; the best round of each method and the median
of the per-round ratios go to the JSON file too. Targets: ours >= 60 % of the copy ceiling
and >= 1.5x ``index_select``.

Run ``python benchmarks/features.py --help``; results go to ``benchmarks/results/features.json``.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import click
import numpy as np
import torch
from _report import machine, write_result

from graphrl import kernels
from samplers.features import FeatureStore

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "features.json"


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _kernel_copy(out_bytes: np.ndarray, table_bytes: np.ndarray, start: int, nbytes: int, threads: int,
                 mode: str) -> None:
    step = 2 << 20
    chunks = -(-nbytes // step)

    def fn(i: int) -> None:
        lo = i * step
        kernels.copy(out_bytes, table_bytes, lo, start + lo, min(step, nbytes - lo), mode)

    kernels.parallel_for(fn, chunks, threads)


COPIES = {"copy_torch": "Tensor.copy_", "copy_numpy": "numpy.copyto (1 thread)",
          "copy_stream": "graphrl.kernels.copy, streaming stores",
          "copy_cached": "graphrl.kernels.copy, cached stores"}


def bench_cols(rows: int, cols: int, batch: int, repeats: int, threads: int, seed: int,
               huge_pages: bool) -> dict:
    rng = np.random.default_rng(seed)
    table = torch.empty(rows, cols)
    for lo in range(0, rows, 1 << 18):  # fill in slices: no temporary of the table's size
        hi = min(rows, lo + (1 << 18))
        table[lo:hi] = torch.from_numpy(rng.standard_normal((hi - lo, cols), dtype=np.float32))
    t0 = time.perf_counter()
    store = FeatureStore(table, threads=threads, huge_pages=huge_pages)  # memory=None: table used in place
    build_s = time.perf_counter() - t0
    row_bytes = cols * 4
    huge = kernels.huge_page_bytes(table.data_ptr(), rows * row_bytes)
    nbytes = batch * row_bytes
    out = torch.empty(batch, cols)
    out.zero_()  # fault its pages in: every method writes into memory that is already mapped
    out_np = out.numpy()
    out_bytes, table_bytes = out_np.reshape(-1).view(np.uint8), table.numpy().reshape(-1).view(np.uint8)
    methods = {
        "ours": lambda ids, start: store.gather(ids),
        "index_select": lambda ids, start: torch.index_select(table, 0, ids),
        "index_select_out": lambda ids, start: torch.index_select(table, 0, ids, out=out),
        "copy_torch": lambda ids, start: out.copy_(table[start:start + batch]),
        "copy_numpy": lambda ids, start: np.copyto(out_np, table_np[start:start + batch]),
        "copy_stream": lambda ids, start: _kernel_copy(out_bytes, table_bytes, start * row_bytes, nbytes,
                                                       threads, "stream"),
        "copy_cached": lambda ids, start: _kernel_copy(out_bytes, table_bytes, start * row_bytes, nbytes,
                                                       threads, "cached"),
    }
    table_np = table.numpy()
    times: dict[str, list[float]] = {k: [] for k in methods}
    check = torch.from_numpy(rng.integers(0, rows, 1000))
    assert torch.equal(store.gather(check), torch.index_select(table, 0, check)), "gather differs"
    for _ in range(2):  # fault in both staging slots (the store hands them out in turn)
        store.gather(torch.from_numpy(rng.integers(0, rows, batch)))
    load_before = os.getloadavg()[0]
    keys = list(methods)
    for rep in range(repeats + 1):  # the first round warms up (JIT, staging pages) and is not counted
        order = keys[rep % len(keys):] + keys[:rep % len(keys)]
        for key in order:
            ids = torch.from_numpy(rng.integers(0, rows, batch))
            start = int(rng.integers(0, rows - batch + 1))
            t = _timed(lambda key=key, ids=ids, start=start: methods[key](ids, start))
            if rep:
                times[key].append(t)
    load_after = os.getloadavg()[0]
    store.close()
    gbs = {k: [nbytes / t / 1e9 for t in v] for k, v in times.items()}
    median = {k: statistics.median(v) for k, v in gbs.items()}
    best = {k: max(v) for k, v in gbs.items()}
    copy_key = max(COPIES, key=lambda k: median[k])
    rounds = range(repeats)
    round_copy = [max(gbs[k][r] for k in COPIES) for r in rounds]  # the best copy of each round
    return {
        "case": f"{rows / 1e6:g}M x {cols} f32, {batch / 1e3:g}k rows",
        "metric": "gather_GB_per_s (median of rounds)",
        "ours": median["ours"],
        "baseline": f"torch {torch.__version__.split('+')[0]} index_select (fresh tensor)",
        "baseline_value": median["index_select"],
        "ratio": median["ours"] / median["index_select"],
        "copy_ceiling_GB_per_s": median[copy_key],
        "copy_ceiling_method": COPIES[copy_key],
        "fraction_of_ceiling": median["ours"] / median[copy_key],
        "index_select_out_GB_per_s": median["index_select_out"],
        "per_round_median": {
            "fraction_of_best_copy": statistics.median(gbs["ours"][r] / round_copy[r] for r in rounds),
            "ratio_to_index_select": statistics.median(gbs["ours"][r] / gbs["index_select"][r]
                                                       for r in rounds),
        },
        "median_GB_per_s": median,
        "best_GB_per_s": best,
        "rounds_GB_per_s": gbs,
        "table_huge_page_bytes": huge,
        "store_build_s": build_s,
        "load_average_1min": [load_before, load_after],
    }


@click.command()
@click.option("--rows", default=500_000, show_default=True, help="Rows of the table (reference: 2000000).")
@click.option("--cols", default="128,512", show_default=True, help="Comma-separated float32 column counts.")
@click.option("--batch", default=100_000, show_default=True, help="Row ids per gather.")
@click.option("--repeats", default=9, show_default=True, help="Timed rounds; medians are reported.")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="Threads of our gather, the kernel copies and torch; default: every core.")
@click.option("--huge-pages/--no-huge-pages", default=True, show_default=True,
              help="FeatureStore(huge_pages=...): the table on 2 MiB pages (every method reads it).")
@click.option("--seed", default=0, show_default=True)
@click.option("--output", default=str(RESULTS), show_default=True, type=click.Path(dir_okay=False))
def main(rows: int, cols: str, batch: int, repeats: int, threads: int | None, huge_pages: bool, seed: int,
         output: str) -> None:
    """Gather GB/s of FeatureStore.gather, torch.index_select and a plain copy of the same bytes."""
    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    if batch > rows:
        raise click.BadParameter(f"batch {batch} exceeds rows {rows}", param_hint="--batch")
    results = []
    for c in (int(x) for x in cols.split(",") if x.strip()):
        click.echo(f"table {rows:,} x {c} float32 ({rows * c * 4 / 2**30:.2f} GiB), load "
                   f"{os.getloadavg()[0]:.2f} ...", err=True)
        results.append(bench_cols(rows, c, batch, repeats, threads, seed, huge_pages))
    load = os.getloadavg()[0]
    click.echo(f"\nthreads {threads}; medians of {repeats} interleaved rounds; 1-min load average "
               f"before/after each table (of {os.cpu_count()} CPUs)")
    click.echo(f"{'case':<30} {'ours GB/s':>9} {'index_select':>12} {'ratio':>6} {'sel(out=)':>9} "
               f"{'copy':>6} {'of copy':>7} {'huge':>5} {'load':>9}  copy method")
    for r in results:
        la = r["load_average_1min"]
        huge = r["table_huge_page_bytes"]
        click.echo(f"{r['case']:<30} {r['ours']:>9.2f} {r['baseline_value']:>12.2f} {r['ratio']:>6.2f} "
                   f"{r['index_select_out_GB_per_s']:>9.2f} {r['copy_ceiling_GB_per_s']:>6.2f} "
                   f"{r['fraction_of_ceiling']:>7.0%} {huge / 2**30:>4.2f}G {la[0]:>4.2f}/{la[1]:<4.2f}  "
                   f"{r['copy_ceiling_method']}")
    write_result("features", results, machine(threads=threads, load_average_1min=load), output,
                 huge_pages=huge_pages, repeats=repeats)


if __name__ == "__main__":
    main()

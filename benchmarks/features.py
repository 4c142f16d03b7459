"""Feature-gather throughput: `FeatureStore.gather` against ``torch.index_select`` and a plain copy.

A table of R rows of D float32 columns (R = 2M in issue 3; smaller by default), batches of B random
row ids (100k). Every timed call gets a fresh batch of ids (and the copy a fresh offset), and the
order of the methods rotates, so that no method reads rows another one just brought into the cache
(this machine's L3 holds 300 MiB). Timed:

- ours: ``FeatureStore.gather(ids)`` into its reusable staging buffer;
- ``torch.index_select(table, 0, ids)`` into a fresh tensor (the baseline of the issue);
- ``torch.index_select(..., out=buffer)`` into a preallocated buffer (to show where the baseline's
  time goes: a fresh tensor's pages are faulted in on first write);
- the copy ceiling: a plain contiguous copy of the same number of bytes from a random offset of the
  table into a preallocated buffer, by ``Tensor.copy_`` and by ``numpy.copyto`` (the faster counts).

The metric is GB/s of gathered rows (10^9 bytes). The best repeat of each is reported (the machine
may be shared: the best run is the least disturbed); medians go to the JSON file too. Targets
(issue 3): ours >= 60 % of the copy ceiling and >= 1.5x ``index_select``.

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

from samplers.features import FeatureStore

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "features.json"


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_cols(rows: int, cols: int, batch: int, repeats: int, threads: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    table = torch.empty(rows, cols)
    for lo in range(0, rows, 1 << 18):  # fill in slices: no temporary of the table's size
        hi = min(rows, lo + (1 << 18))
        table[lo:hi] = torch.from_numpy(rng.standard_normal((hi - lo, cols), dtype=np.float32))
    store = FeatureStore(table, threads=threads)  # memory=None: the table is used in place
    nbytes = batch * cols * 4
    out = torch.empty(batch, cols)
    out_np = out.numpy()
    table_np = table.numpy()
    methods = {
        "ours": lambda ids, start: store.gather(ids),
        "index_select": lambda ids, start: torch.index_select(table, 0, ids),
        "index_select_out": lambda ids, start: torch.index_select(table, 0, ids, out=out),
        "copy_torch": lambda ids, start: out.copy_(table[start:start + batch]),
        "copy_numpy": lambda ids, start: np.copyto(out_np, table_np[start:start + batch]),
    }
    times: dict[str, list[float]] = {k: [] for k in methods}
    check = torch.from_numpy(rng.integers(0, rows, 1000))
    assert torch.equal(store.gather(check), torch.index_select(table, 0, check)), "gather differs"
    for rep in range(repeats + 1):  # the first round warms up (JIT, staging pages) and is not counted
        # every method gets its own fresh ids (and copy offset), in a rotating order: rows that one
        # method just read must not be in the cache (L3 here: 300 MiB) when the next one runs
        keys = list(methods)
        keys = keys[rep % len(keys):] + keys[:rep % len(keys)]
        for key in keys:
            ids = torch.from_numpy(rng.integers(0, rows, batch))
            start = int(rng.integers(0, rows - batch + 1))
            t = _timed(lambda key=key, ids=ids, start=start: methods[key](ids, start))
            if rep:
                times[key].append(t)
    best = {k: nbytes / min(v) / 1e9 for k, v in times.items()}
    median = {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    best["copy"] = max(best.pop("copy_torch"), best.pop("copy_numpy"))
    store.close()
    return {
        "case": f"{rows / 1e6:g}M x {cols} f32, {batch / 1e3:g}k rows",
        "metric": "gather_GB_per_s",
        "ours": best["ours"],
        "baseline": f"torch {torch.__version__.split('+')[0]} index_select (fresh tensor)",
        "baseline_value": best["index_select"],
        "ratio": best["ours"] / best["index_select"],
        "copy_ceiling_GB_per_s": best["copy"],
        "fraction_of_ceiling": best["ours"] / best["copy"],
        "index_select_out_GB_per_s": best["index_select_out"],
        "median_GB_per_s": median,
    }


@click.command()
@click.option("--rows", default=500_000, show_default=True, help="Rows of the table (issue 3: 2000000).")
@click.option("--cols", default="128,512", show_default=True, help="Comma-separated float32 column counts.")
@click.option("--batch", default=100_000, show_default=True, help="Row ids per gather.")
@click.option("--repeats", default=5, show_default=True, help="Timed repeats; the best one is reported.")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="Threads of our gather and of torch; default: every core.")
@click.option("--seed", default=0, show_default=True)
@click.option("--output", default=str(RESULTS), show_default=True, type=click.Path(dir_okay=False))
def main(rows: int, cols: str, batch: int, repeats: int, threads: int | None, seed: int, output: str) -> None:
    """Gather GB/s of FeatureStore.gather, torch.index_select and a plain copy of the same bytes."""
    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    if batch > rows:
        raise click.BadParameter(f"batch {batch} exceeds rows {rows}", param_hint="--batch")
    results = []
    for c in (int(x) for x in cols.split(",") if x.strip()):
        click.echo(f"table {rows:,} x {c} float32 ({rows * c * 4 / 2**30:.2f} GiB) ...", err=True)
        results.append(bench_cols(rows, c, batch, repeats, threads, seed))
    load = os.getloadavg()[0]
    click.echo(f"\nthreads {threads}; 1-min load average {load:.2f} on {os.cpu_count()} CPUs "
               f"(best of {repeats})")
    click.echo(f"{'case':<30} {'ours GB/s':>9} {'index_select':>12} {'ratio':>6} {'sel(out=)':>9} "
               f"{'copy':>6} {'of copy':>7}")
    for r in results:
        click.echo(f"{r['case']:<30} {r['ours']:>9.2f} {r['baseline_value']:>12.2f} {r['ratio']:>6.2f} "
                   f"{r['index_select_out_GB_per_s']:>9.2f} {r['copy_ceiling_GB_per_s']:>6.2f} "
                   f"{r['fraction_of_ceiling']:>7.0%}")
    write_result("features", results, machine(threads=threads, load_average_1min=load), output)


if __name__ == "__main__":
    main()

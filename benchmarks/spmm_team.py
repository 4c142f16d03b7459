"""SpMM on the kernel team against an older build of `graphrl.kernels.spmm` (the `prange` one), interleaved.

Cases: Gowalla's LightGCN propagation ``P`` (symmetric, self loops; d = 64) and Cora's GCN ``P`` (d = 16),
forward ``P @ h`` and transposed ``P^T @ g``, at 1 and 2 threads (``numba.set_num_threads`` for the old build,
``threads=`` for ours). In one process the old and new calls alternate, in reversed order every repeat; each
call is timed alone, so a stalled fork-join shows in the worst calls. Every result is checked bitwise against
the old serial build. Rows: median, p90 and worst call, ours and the old build's.

Run ``git show 8ffa34b:graphrl/kernels/spmm.py > /tmp/old_spmm.py`` (the last `prange` build), then
``GRAPHRL_DATA=../shared/data python benchmarks/spmm_team.py --old /tmp/old_spmm.py [--repeats 40]``;
writes ``benchmarks/results/spmm_team.json``. Figures: docs/performance.md, "SpMM on the kernel team".
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click
import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import machine, row, write_result  # noqa: E402
from gpu_full_graph_check import symmetric_propagation  # noqa: E402

from graphrl.datasets import load_gowalla, load_planetoid  # noqa: E402
from graphrl.kernels import spmm as new  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "spmm_team.json"


def load_old(path: str):
    """The older spmm module from ``path``, under its own name, loaded from a fresh copy of the file: numba's
    cache of an earlier run would name a module that cannot be imported."""
    copy = Path(tempfile.mkdtemp()) / "old_spmm.py"
    shutil.copy(path, copy)
    spec = importlib.util.spec_from_file_location("old_spmm", copy)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_spmm"] = module
    spec.loader.exec_module(module)
    return module


def case_rows(old, name: str, graph, d: int, reps: int) -> list[dict]:
    """The rows of one graph: forward and transposed, 1 and 2 threads (see the module docstring)."""
    (ip, ix, w), _ = symmetric_propagation(graph)
    n = graph.num_nodes
    h = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
    want = {"P @ h": np.empty((n, d), np.float32), "P^T @ g": np.empty((n, d), np.float32)}
    old.csr_spmm_serial(ip, ix, w, h, want["P @ h"])
    old.csr_spmm_t_serial(ip, ix, w, h, want["P^T @ g"], 1)
    out = np.empty((n, d), np.float32)
    rows = []
    for threads in (1, 2):
        numba.set_num_threads(threads)
        fns = {("P @ h", "old"): lambda t: old.csr_spmm_parallel(ip, ix, w, h, out),
               ("P @ h", "new"): lambda t: new.csr_spmm_parallel(ip, ix, w, h, out, t),
               ("P^T @ g", "old"): lambda t: old.csr_spmm_t_parallel(ip, ix, w, h, out, t),
               ("P^T @ g", "new"): lambda t: new.csr_spmm_t_parallel(ip, ix, w, h, out, t)}
        for (kind, who), fn in fns.items():
            fn(threads)
            if not np.array_equal(out, want[kind]):
                raise AssertionError(f"{name} {kind} {who}, {threads} threads: not the serial build's bits")
        times: dict = {k: [] for k in fns}
        for r in range(reps):
            for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                t0 = time.perf_counter()
                fns[k](threads)
                times[k].append((time.perf_counter() - t0) * 1e3)
        load = os.getloadavg()[0]
        for kind in ("P @ h", "P^T @ g"):
            a, b = np.array(times[(kind, "old")]), np.array(times[(kind, "new")])
            p90a, p90b = np.percentile(a, 90), np.percentile(b, 90)
            case = f"{name} {kind} d={d} threads={threads}"
            rows.append(row(case, "median_ms", float(np.median(b)), "prange build", float(np.median(a)),
                            p90_ms=float(p90b), baseline_p90_ms=float(p90a), worst_ms=float(b.max()),
                            baseline_worst_ms=float(a.max()), calls=reps, load_average_1min=load))
            click.echo(f"{case:38s} median {np.median(a):8.3f} / {np.median(b):8.3f} ms   p90 {p90a:8.3f} / "
                       f"{p90b:8.3f}   worst {a.max():8.2f} / {b.max():8.2f}   (old / new, load {load:.1f})")
    return rows


@click.command()
@click.option("--old", "old_path", required=True, help="An older graphrl/kernels/spmm.py (the prange build).")
@click.option("--repeats", default=40, show_default=True, help="Calls per case on Gowalla (x20 on Cora).")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(old_path: str, repeats: int, output: str) -> None:
    old = load_old(old_path)
    rows = case_rows(old, "gowalla", load_gowalla().graph, 64, repeats)
    rows += case_rows(old, "cora", load_planetoid("cora").graph, 16, 20 * repeats)
    write_result("spmm_team", rows, machine(threading_layer=numba.threading_layer()), output)


if __name__ == "__main__":
    main()

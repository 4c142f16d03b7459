"""What benchmarks share: interleaved timing, result rows, the machine record, benchmarks/results/NAME.json.

Timing: `best_interleaved` (and `best_interleaved_cpu`, `interleaved_cpu` with CPU time) runs the arms of a
case in turn, so each sees the same load; `serial` makes a one-thread arm. A row (CONVENTIONS.md format):
`row`, with `cpu_fields` for CPU times. The file: `machine` (with `last_level_cache_bytes`), `write_result`.

Benchmarks run as scripts (``python benchmarks/NAME.py``), so this module is imported as ``_report``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import click
import numba
import torch


def best_interleaved(fns: list[Callable[[], object]], iters: int, repeats: int) -> list[float]:
    """Best mean seconds per call of each function over ``repeats`` runs of ``iters`` calls, the runs
    interleaved so that each function sees the same load (each is called once first, untimed)."""
    return best_interleaved_cpu(fns, iters, repeats)[0]


def best_interleaved_cpu(
    fns: list[Callable[[], object]], iters: int, repeats: int
) -> tuple[list[float], list[float]]:
    """`best_interleaved`'s wall seconds per call, and the best CPU seconds per call of this process
    (``time.process_time``: all its threads) over the same runs, which other processes' load moves far
    less than wall time."""
    wall, cpu = interleaved_cpu(fns, iters, repeats)
    return [min(ts) for ts in wall], [min(ts) for ts in cpu]


def interleaved_cpu(
    fns: list[Callable[[], object]], iters: int, repeats: int
) -> tuple[list[list[float]], list[list[float]]]:
    """Each function's wall and CPU seconds per call of every one of ``repeats`` runs of ``iters`` calls,
    the runs interleaved (each function called once first, untimed): `best_interleaved_cpu`'s samples,
    for a benchmark that reports their medians too."""
    for fn in fns:
        fn()
    wall: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ws, cs in zip(fns, wall, cpu, strict=True):
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(iters):
                fn()
            ws.append((time.perf_counter() - w0) / iters)
            cs.append((time.process_time() - c0) / iters)
    return wall, cpu


def serial(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` with this thread's numba count at 1, so graphrl's kernels run on the caller alone
    (`graphrl.threads.team_size` follows it): the one-thread arm of a case."""

    def run() -> None:
        n = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            fn()
        finally:
            numba.set_num_threads(n)

    return run


def row(case: str, metric: str, ours: float, baseline: str, value: float | None, **extra: object) -> dict:
    """A result row: ``ratio`` = ours / baseline value (None without one); ``extra`` adds fields."""
    return {
        "case": case,
        "metric": metric,
        "ours": ours,
        "baseline": baseline,
        "baseline_value": value,
        "ratio": ours / value if value else None,
        **extra,
    }


def cpu_fields(cpu: list[float]) -> dict:
    """CPU seconds per call of ours and the baseline (``cpu[0]``, ``cpu[1]``: `best_interleaved_cpu`) as
    row fields, with ``cpu_ratio`` = baseline / ours CPU time (higher is better, as ``ratio``)."""
    return {"cpu_us": cpu[0] * 1e6, "baseline_cpu_us": cpu[1] * 1e6, "cpu_ratio": cpu[1] / cpu[0]}


def last_level_cache_bytes(cpu: int = 0, sysfs: str | os.PathLike = "/sys/devices/system/cpu") -> int | None:
    """Bytes of the largest data or unified cache of CPU ``cpu`` (its last level, e.g. an L3 shared by the
    cores), from Linux's ``{sysfs}/cpuN/cache/index*/type`` and ``size`` (``"307200K"``); None where sysfs
    has none (not Linux, or a kernel that hides it). What a benchmark's working set must exceed to read
    memory, not the cache."""
    sizes = []
    for index in Path(sysfs, f"cpu{cpu}", "cache").glob("index*"):
        try:
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction" or not size:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1].upper(), 1)
        sizes.append(int(size.rstrip("KkMmGg")) * unit)
    return max(sizes, default=None)


def machine(**extra) -> dict:
    """The machine fields of a result: CPUs, the last-level cache (`last_level_cache_bytes`), versions,
    CUDA, and the 1-minute load average at call time (other processes share the cores, so every figure is
    read against it); ``extra`` adds fields."""
    return {
        "cpus": os.cpu_count(),
        "last_level_cache_bytes": last_level_cache_bytes(),
        "torch": torch.__version__.split("+")[0],
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "numba": numba.__version__,
        "python": platform.python_version(),
        "load_average_1min": os.getloadavg()[0],
        **extra,
    }


def write_result(benchmark: str, rows: list[dict], machine_info: dict, output: str | os.PathLike,
                 **extra) -> Path:
    """Write ``{"benchmark", "machine", "rows", **extra}`` as JSON to ``output`` (folders created); return
    its path. ``extra`` holds a benchmark's own keys (its configuration, a correctness check, raw cases)."""
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": benchmark, "machine": machine_info, "rows": rows, **extra}
    out.write_text(json.dumps(result, indent=2) + "\n")
    click.echo(f"wrote {out}")
    return out

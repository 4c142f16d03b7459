"""`graphrl bench`: run the repository's benchmarks at a quick size and collect their JSON results.

Main names: `QUICK_ARGS` (each benchmark's command-line options at a size that finishes in about
five minutes for all four together on two cores), `benchmarks_dir`, `run_benchmarks` (each benchmark
``benchmarks/NAME.py`` as a subprocess of the same Python, so each one's baselines run in their own
process as the benchmark designs; results as ``NAME.json`` in an output folder), `load_results` (read
such a folder back) and `machine_record` (what the figures' captions name: CPUs, platform, load, date).

Usage::

    from graphrl.bench import run_benchmarks, load_results
    run_benchmarks(["sampler", "replay"], "out/")
    results = load_results("out/")          # {"sampler": {...}, "replay": {...}}

The benchmarks live in the source tree (``benchmarks/`` next to the packages), not in the installed
package; `benchmarks_dir` finds them or raises FileNotFoundError naming where it looked. Each
benchmark's output (its table) goes to ``NAME.log`` beside its JSON.

Interrupted (SIGINT, or SIGTERM under `graphrl.interrupts`), `run_benchmarks` passes the signal on to
the running benchmark, waits for it (then kills it), removes the shared memory it left, writes the
run's record with the finished benchmarks and ``"interrupted": {"signal", "benchmark"}``, and re-raises.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from graphrl.atomic_write import write_whole

__all__ = ["BENCHMARKS", "QUICK_ARGS", "benchmarks_dir", "load_results", "machine_record", "run_benchmarks"]

BENCHMARKS = ("sampler", "replay", "features", "full_graph")

# Sizes for a run of about five minutes in all on a shared 2-core machine (the benchmarks' own defaults
# are the reference sizes; docs/performance.md quotes those).
QUICK_ARGS: dict[str, list[str]] = {
    "sampler": ["--graphs", "uniform,powerlaw,gowalla", "--num-nodes", "100000", "--num-edges", "2000000",
                "--batches", "6", "--warmup", "2", "--repeats", "2", "--modes", "uniform,weighted"],
    "replay": ["--layouts", "small,image", "--small-steps", "100000", "--image-steps", "5000", "--iters", "5",
               "--repeats", "2"],
    "features": ["--rows", "200000", "--cols", "128,512", "--batch", "50000", "--repeats", "5"],
    "full_graph": ["--scale", "0.01", "--epochs", "3", "--memory-epochs", "1", "--warmup", "1"],
}

FILE_NAME = "bench.json"  # the run's own record beside the benchmarks' results
STOP_SECONDS = 10.0  # how long an interrupted benchmark gets to clean up before it is killed

log = logging.getLogger(__name__)


def benchmarks_dir(path: str | os.PathLike | None = None) -> Path:
    """The folder holding ``sampler.py``, ``replay.py``, ... (default: ``benchmarks/`` of the source tree).

    Raises
    ------
    FileNotFoundError
        The folder or its ``sampler.py`` is missing (an install without the source tree).
    """
    folder = Path(path) if path is not None else Path(__file__).resolve().parents[1] / "benchmarks"
    if not (folder / "sampler.py").is_file():
        raise FileNotFoundError(f"no benchmarks in {folder} (graphrl bench runs the source tree's "
                                "benchmarks/: pip install -e . from a clone, or pass --benchmarks)")
    return folder


def machine_record(**extra) -> dict:
    """CPUs, platform, Python, ``os.getloadavg()[0]`` now and today's date (UTC), plus ``extra``."""
    return {"cpus": os.cpu_count(), "platform": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(), "load_average_1min": os.getloadavg()[0],
            "date": time.strftime("%Y-%m-%d", time.gmtime()), **extra}


def run_benchmarks(names: Iterable[str], out_dir: str | os.PathLike, *,
                   folder: str | os.PathLike | None = None, extra_args: dict[str, list[str]] | None = None,
                   python: str = sys.executable,
                   echo: Callable[[str], None] = lambda line: None) -> dict:
    """Run each benchmark of ``names`` as ``python benchmarks/NAME.py [QUICK_ARGS] --output OUT/NAME.json``.

    Parameters
    ----------
    names : iterable of str
        A subset of `BENCHMARKS`, run in that order.
    out_dir : path
        Receives ``NAME.json``, ``NAME.log`` (the benchmark's stdout and stderr) and `FILE_NAME` (this
        run's record: machine, load before and after, each benchmark's seconds and exit status).
    folder : path or None
        Where the benchmarks are (`benchmarks_dir`).
    extra_args : dict or None
        Name -> options replacing `QUICK_ARGS` for that benchmark.
    python : str
        The interpreter (default: this one, so the same environment runs them).
    echo : callable
        Receives one progress line per benchmark.

    Returns
    -------
    dict
        The run's record, as written to `FILE_NAME`.

    Raises
    ------
    ValueError
        An unknown benchmark name.
    FileNotFoundError
        No benchmarks folder (`benchmarks_dir`).
    KeyboardInterrupt
        Re-raised (`graphrl.interrupts.Interrupted` too) once the running benchmark is stopped and the
        record of the finished ones written, with ``"interrupted": {"signal": "SIGINT", "benchmark":
        name}``.
    """
    names = list(names)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmarks {unknown}; choose from {', '.join(BENCHMARKS)}")
    src = benchmarks_dir(folder)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    record = {"machine": machine_record(), "benchmarks": {}}
    t_all = time.perf_counter()
    for name in names:
        args = (extra_args or {}).get(name, QUICK_ARGS[name])
        cmd = [python, str(src / f"{name}.py"), *args, "--output", str(out / f"{name}.json")]
        echo(f"{name}: {' '.join(Path(c).name if i < 2 else c for i, c in enumerate(cmd))}")
        t0 = time.perf_counter()
        with open(out / f"{name}.log", "w") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
            try:
                rc = proc.wait()
            except KeyboardInterrupt as err:
                _stop(proc, getattr(err, "signum", signal.SIGINT))
                record["benchmarks"][name] = {"seconds": round(time.perf_counter() - t0, 1),
                                              "returncode": proc.returncode, "args": args}
                record["interrupted"] = {"signal": signal.Signals(getattr(err, "signum", signal.SIGINT)).name,
                                         "benchmark": name}
                _write_record(record, out, t_all)
                raise
        seconds = time.perf_counter() - t0
        record["benchmarks"][name] = {"seconds": round(seconds, 1), "returncode": rc, "args": args}
        status = "done" if rc == 0 else f"FAILED (exit {rc}, see {out / (name + '.log')})"
        echo(f"{name}: {status} in {seconds:.0f} s")
    _write_record(record, out, t_all)
    return record


def _write_record(record: dict, out: Path, t_all: float) -> None:
    """Finish the run's record (seconds, load now) and write it to ``out / FILE_NAME``."""
    record["seconds"] = round(time.perf_counter() - t_all, 1)
    record["machine"]["load_average_1min"] = [record["machine"]["load_average_1min"], os.getloadavg()[0]]
    text = json.dumps(record, indent=2) + "\n"  # whole or not at all: a second signal may come meanwhile
    write_whole(out / FILE_NAME, lambda tmp: tmp.write_text(text))


def _stop(proc: subprocess.Popen, signum: int) -> None:
    """Pass ``signum`` on to a benchmark, give it `STOP_SECONDS` to clean up, then kill it; then remove the
    shared-memory segments it (or any other gone graphrl process) left (`graphrl.memory.owners.reclaim`)."""
    from graphrl.memory.owners import reclaim

    if proc.poll() is None:
        proc.send_signal(signum)
        try:
            proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("benchmark pid %d still running %.0f s after %s; killing it", proc.pid, STOP_SECONDS,
                        signal.Signals(signum).name)
            proc.kill()
            proc.wait()
    for seg in reclaim():
        log.info("removed %s left by pid %d", seg.name, seg.owner.pid)


def load_results(folder: str | os.PathLike) -> tuple[dict[str, dict], dict | None]:
    """Read every benchmark result (``*.json`` with a ``benchmark`` key) of ``folder``.

    Returns
    -------
    (dict, dict or None)
        Benchmark name -> its result, and the run's record (`FILE_NAME`) when there is one.

    Raises
    ------
    FileNotFoundError
        ``folder`` holds no benchmark result.
    """
    folder = Path(folder)
    results: dict[str, dict] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name == FILE_NAME:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and "benchmark" in data and "rows" in data:
            results[data["benchmark"]] = data
    if not results:
        raise FileNotFoundError(f"no benchmark results (*.json with 'benchmark' and 'rows') in {folder}")
    record_path = folder / FILE_NAME
    record = json.loads(record_path.read_text()) if record_path.is_file() else None
    return results, record

"""ReplayStore.checkpoint beside a busy writer: no writer (the baseline), a writer thread of the checkpointing
process, a writer process attached by handle, and a pure-Python busy thread (the worst case of a thread).

A writer thread in the learner's process (TorchRL collectors and Reverb clients often run so) keeps the GIL
busy between its commits: each time the checkpoint's thread releases the GIL (a file write, an fsync, a hash
update, zarr's hand-offs to its I/O threads) it may wait up to ``sys.getswitchinterval()`` (5 ms) to get it
back. A writer process shares no GIL with the checkpoint. The writer is an actor's loop: ``append`` of one
step (a dict of the fields) at a time, ``end_episode`` every 50 steps, until the cases end; it releases the
GIL itself now and then (numpy copies, the compiled commit). The busy thread (case ``busy``) runs Python
bytecode without a pause (an environment's step in Python, say): each GIL release of the checkpoint's
thread costs it a whole switch interval, so ``busy`` minus ``none`` is about the releases times 5 ms.

Stores (1 shard, uniform, full to capacity before the first checkpoint):

- frames: ``--frame-steps`` steps of obs uint8 [3, 64, 64], action int64, reward float32, done bool
  (12.3 kB a step: 245 MB at 20,000 steps);
- small: ``--small-steps`` steps of obs float32 [8], action int64, reward float32, done bool.

Each case is ``--repeats`` checkpoints into one root (``--root``, a folder on the disk by default: the
fsyncs are part of a checkpoint; /dev/shm leaves the disk out), the cases interleaved (none, thread,
process, busy, none, ...) over ``--rounds``: rows give the median and the best, ``ratio`` = the case's
median / no writer's median (lower is better; 1 is no slowdown).
Run ``python benchmarks/checkpoint_writer.py --help``; results go to
``benchmarks/results/checkpoint_writer.json``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

# run as a script, this file's folder comes first on sys.path, and benchmarks/replay.py would shadow
# the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import click  # noqa: E402
import numpy as np  # noqa: E402

from graphrl.memory import MemoryManager  # noqa: E402
from replay import ReplayStore, TrajectorySpec, Uniform  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))
from _report import machine, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "checkpoint_writer.json"
EPISODE = 50
OBS = {"frames": ((3, 64, 64), "uint8"), "small": ((8,), "float32")}


def spec(kind: str) -> TrajectorySpec:
    return TrajectorySpec(
        {"obs": OBS[kind], "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "bool")}
    )


def observations(kind: str, n: int, seed: int) -> np.ndarray:
    """``n`` random observations (not zeros: zarr skips writing chunks that equal the fill value)."""
    rng = np.random.default_rng(seed)
    shape, dtype = OBS[kind]
    if dtype == "uint8":
        return rng.integers(1, 255, (n, *shape), dtype=np.uint8)
    return rng.standard_normal((n, *shape)).astype(np.float32)


def fill(store: ReplayStore, kind: str, n: int) -> None:
    """``n`` steps in episodes of `EPISODE` steps."""
    obs = observations(kind, EPISODE, 0)
    with store.writer() as w:
        for i in range(0, n, EPISODE):
            m = min(EPISODE, n - i)
            w.add_episode({"obs": obs[:m], "action": np.arange(i, i + m), "reward": np.ones(m, np.float32),
                           "done": np.arange(m) == m - 1})


def actor(store, kind: str, stop, written: list[int]) -> None:
    """An actor's loop: one step at a time, an episode every `EPISODE` steps, until ``stop``."""
    obs = observations(kind, 64, 1)
    i = 0
    with store.writer() as w:
        while not stop.is_set():
            for t in range(EPISODE):
                w.append({"obs": obs[i % 64], "action": i, "reward": 1.0, "done": t == EPISODE - 1})
                i += 1
            w.end_episode()
    written.append(i)


def busy(stop) -> None:
    """Python bytecode until ``stop``, never releasing the GIL but when the interpreter makes it."""
    x = 0
    while not stop.is_set():
        for _ in range(1000):
            x += 1


def actor_process(handle, kind: str, stop, ready) -> None:  # forked
    store = ReplayStore.attach(handle)
    ready.set()
    actor(store, kind, stop, [])
    store.close()


def run_case(store: ReplayStore, kind: str, case: str, root: str, repeats: int) -> tuple[list[float], int]:
    """``repeats`` checkpoints with the case's writer running; their seconds and the steps it wrote."""
    written: list[int] = []
    if case == "thread":
        stop = threading.Event()
        th = threading.Thread(target=actor, args=(store, kind, stop, written), name="actor")
        th.start()
    elif case == "busy":
        stop = threading.Event()
        th = threading.Thread(target=busy, args=(stop,), name="busy")
        th.start()
    elif case == "process":
        ctx = mp.get_context("fork")
        stop, ready = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=actor_process, args=(store.handle(), kind, stop, ready))
        proc.start()
        if not ready.wait(60):
            raise RuntimeError("the writer process did not start")
    if case != "none":
        time.sleep(0.3)  # the writer at full speed
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        store.checkpoint(root)
        times.append(time.perf_counter() - t0)
    if case in ("thread", "busy"):
        stop.set()
        th.join(60)
    elif case == "process":
        stop.set()
        proc.join(60)
        if proc.exitcode != 0:
            raise RuntimeError(f"the writer process failed (exit status {proc.exitcode})")
    steps = written[0] if written else -1  # a process's count stays there
    return times, steps


@click.command()
@click.option("--frame-steps", default=5000, show_default=True, help="steps of the frames store")
@click.option("--small-steps", default=20000, show_default=True, help="steps of the small-step store")
@click.option("--repeats", default=3, show_default=True, help="checkpoints per case and round")
@click.option("--rounds", default=2, show_default=True, help="rounds of the interleaved cases")
@click.option("--cases", default="none,thread,process,busy", show_default=True,
              help="comma-separated, of none, thread, process, busy (none is the baseline: keep it)")
@click.option("--root", default=None, help="folder for the checkpoint roots (default: a new one in /tmp)")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(
    frame_steps: int, small_steps: int, repeats: int, rounds: int, cases: str, root: str | None, output: str
) -> None:
    if "none" not in cases.split(","):
        raise click.BadParameter(f"{cases!r} lacks none, the baseline", param_hint="--cases")
    load_before = os.getloadavg()[0]
    base = Path(tempfile.mkdtemp(prefix="checkpoint-writer-", dir=root or "/tmp"))
    rows, raw = [], {}
    try:
        for kind, n in (("small", small_steps), ("frames", frame_steps)):
            with MemoryManager() as mm:
                store = ReplayStore(spec(kind), n, 1, selector=Uniform(), memory=mm, seed=0, timeout=600)
                fill(store, kind, n)
                times: dict[str, list[float]] = {c: [] for c in cases.split(",")}
                for _ in range(rounds):
                    for case in times:
                        got, _ = run_case(store, kind, case, str(base / kind), repeats)
                        times[case].extend(got)
                store.close()
            base_med = statistics.median(times["none"])  # the rounds interleave the cases
            for case, ts in times.items():
                med = statistics.median(ts)
                rows.append({"case": f"{kind} {n} steps, writer: {case}", "metric": "checkpoint_s",
                             "ours": med, "best": min(ts), "baseline": "no writer (median)",
                             "baseline_value": base_med, "ratio": med / base_med})
            raw[kind] = times
            shutil.rmtree(base / kind, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    click.echo(f"{'case':44s} {'median s':>9s} {'best s':>8s} {'x no writer':>11s}")
    for r in rows:
        click.echo(f"{r['case']:44s} {r['ours']:9.3f} {r['best']:8.3f} {r['ratio']:11.2f}")
    info = machine(load_average_1min_before=load_before, switch_interval_s=sys.getswitchinterval())
    write_result("checkpoint_writer", rows, info, output, raw_seconds=raw)


if __name__ == "__main__":
    main()

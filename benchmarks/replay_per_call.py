"""Fixed cost of one replay `sample` call on small observations, in microseconds, against cpprb.

A store of ``--steps`` small steps (obs of 4 float32, action int64, reward float32, done bool: 29 bytes a
step, episodes of 64-512 steps: `_replay_workload`'s ``small``; one shard, as in ``benchmarks/replay.py``)
and a cpprb ``ReplayBuffer`` / ``PrioritizedReplayBuffer`` with the same steps. Cases, each timed as
``--calls`` calls per sample and ``--samples`` samples, all cases interleaved sample by sample so that each
sees the same load:

- ``sample(32, 1)``, ``sample(256, 1)``, ``sample(256, 64)`` (+ ``release``), uniform;
- prioritized ``sample(256, 1, beta=0.4)`` + ``update_priorities``;
- cpprb ``sample(32)``, ``sample(256)``, prioritized ``sample(256)`` + ``update_priorities`` (skipped when
  cpprb is not installed: ``pip install cpprb``).

Reported per case: the minimum and median wall time and the minimum and median thread CPU time
(``time.thread_time``; preemption by other processes does not count there) per call. The table names the
1-minute load average before and after. To compare two trees, run this file with ``PYTHONPATH`` set to each
(it uses only the public API). Results: ``benchmarks/results/replay_per_call.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

# run as a script, this file's folder comes first on sys.path and this file would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import click  # noqa: E402
import numpy as np  # noqa: E402

from graphrl.memory import MemoryManager  # noqa: E402
from replay import Prioritized, ReplayStore, Uniform  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))
from _replay_workload import make_episodes, spec_for  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "replay_per_call.json"
SPEC = spec_for("small")


def cases(steps: int, mm: MemoryManager) -> dict[str, Callable[[], object]]:
    eps = make_episodes(SPEC, steps)

    def store(selector):
        st = ReplayStore(SPEC, steps, 1, selector=selector, memory=mm, seed=0, timeout=60)
        with st.writer() as w:
            for ep in eps:
                w.extend(ep)
                w.end_episode()
        return st

    uniform, prio = store(Uniform()), store(Prioritized(0.6))
    p = np.random.default_rng(2).uniform(0.1, 2.0, 256)

    def prio_update() -> None:
        b = prio.sample(256, 1, beta=0.4)
        _ = b.weights  # made on first access; cpprb's sample computes its weights too
        prio.update_priorities(b.keys, p)
        b.release()

    out: dict[str, Callable[[], object]] = {
        "ours sample(32, 1)": lambda: uniform.sample(32, 1).release(),
        "ours sample(256, 1)": lambda: uniform.sample(256, 1).release(),
        "ours sample(256, 64)": lambda: uniform.sample(256, 64).release(),
        "ours prioritized sample(256, 1) + update": prio_update,
    }
    try:
        import cpprb
    except ImportError:
        click.echo("cpprb not installed: its cases are skipped")
        return out
    env = {n: {"shape": f.shape if f.shape else 1, "dtype": f.dtype} for n, f in SPEC.items()}
    rb, rbp = cpprb.ReplayBuffer(steps, env), cpprb.PrioritizedReplayBuffer(steps, env, alpha=0.6)
    for buf in (rb, rbp):
        for ep in eps:
            buf.add(**ep)
            buf.on_episode_end()

    def cpprb_prio() -> None:
        s = rbp.sample(256, beta=0.4)
        rbp.update_priorities(s["indexes"], p)

    out["cpprb sample(32)"] = lambda: rb.sample(32)
    out["cpprb sample(256)"] = lambda: rb.sample(256)
    out["cpprb prioritized sample(256) + update"] = cpprb_prio
    return out


@click.command()
@click.option("--steps", default=200_000, show_default=True, help="Steps stored.")
@click.option("--calls", default=25, show_default=True, help="Calls per timed sample.")
@click.option("--samples", default=40, show_default=True, help="Timed samples per case.")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(steps: int, calls: int, samples: int, output: str) -> None:
    """Per-call cost of the replay store's sample and update, against cpprb."""
    load_before = os.getloadavg()[0]
    with MemoryManager() as mm:
        fns = cases(steps, mm)
        for fn in fns.values():  # warm: compiled kernels, staging pools
            for _ in range(20):
                fn()
        wall: dict[str, list[float]] = {k: [] for k in fns}
        cpu: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(samples):
            for name, fn in fns.items():
                t, c = time.perf_counter(), time.thread_time()
                for _ in range(calls):
                    fn()
                wall[name].append((time.perf_counter() - t) / calls * 1e6)
                cpu[name].append((time.thread_time() - c) / calls * 1e6)
    load = (load_before, os.getloadavg()[0])
    click.echo(f"1-min load average {load[0]:.2f} before, {load[1]:.2f} after, on {os.cpu_count()} CPUs")
    click.echo(f"{'case':<42} {'wall min':>9} {'wall med':>9} {'cpu min':>9} {'cpu med':>9}  (us per call)")
    rows = []
    for name in fns:
        r = {
            "case": name,
            "wall_min_us": min(wall[name]),
            "wall_median_us": float(np.median(wall[name])),
            "cpu_min_us": min(cpu[name]),
            "cpu_median_us": float(np.median(cpu[name])),
        }
        rows.append(r)
        click.echo(
            f"{name:<42} {r['wall_min_us']:>9.1f} {r['wall_median_us']:>9.1f} {r['cpu_min_us']:>9.1f} "
            f"{r['cpu_median_us']:>9.1f}"
        )
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "replay_per_call", "load_average_1min": load, "rows": rows}
    out.write_text(json.dumps(result, indent=2) + "\n")
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()

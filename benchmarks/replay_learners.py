"""Many learners, one replay store: aggregate windows/s and GB/s with 1, 2 and 4 learner processes.

Two step layouts (`_replay_workload`, as ``benchmarks/replay.py``): ``small`` (obs 4 float32 + action,
reward, done: 29 bytes a step) and ``image`` (obs 3x64x64 uint8 + the same: 12301 bytes a step), episodes
of random lengths in [64, 512]. Cases (higher is better):

- local store, N learner processes (``store.learner()`` in forked processes, started together at a
  barrier, each sampling ``sample(B, L)`` for ``--seconds``): aggregate windows/s and GB/s of gathered
  real steps. Baseline: one learner process (``ratio`` = N learners / 1: the scaling). Also the
  owner's in-process ``store.sample`` (no table service round trip), with one learner as its ratio.
- Ray store (``--ray``): the owner's ``sample`` and 1 or 2 learners in Ray tasks (each its own client
  of the shard actors); baseline: the owner client.

Every case is run ``--repeats`` times, cases interleaved round by round; the best round is kept. The
machine is shared: the table and the JSON record the 1-minute load average before and after. Run
``python benchmarks/replay_learners.py --help``; results go to ``benchmarks/results/replay_learners.json``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

# run as a script, this file's folder comes first on sys.path and benchmarks/replay.py would shadow the
# package (the editable install's finder comes after sys.path): import the packages, then _report
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import click  # noqa: E402
import torch  # noqa: E402

from graphrl.memory import MemoryManager  # noqa: E402
from replay import ReplayStore, TrajectorySpec  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))
from _replay_workload import make_episodes, spec_for  # noqa: E402
from _report import machine, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "replay_learners.json"


def fill(store, spec: TrajectorySpec, steps: int, seed: int = 0) -> None:
    """Write `_replay_workload.make_episodes` of ``spec`` (``steps`` steps) into ``store``."""
    with store.writer() as w:
        for ep in make_episodes(spec, steps, seed):
            w.extend(ep)
            w.end_episode()


def sample_loop(sample, seconds: float, batch: int, window: int) -> tuple[int, int, float]:
    """(windows, real steps, seconds) of ``sample(batch, window)`` calls for about ``seconds``."""
    with sample(batch, window=window) as b:  # warm: staging pool made, pages touched
        pass
    windows = steps = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        with sample(batch, window=window) as b:
            steps += int(b.lengths.sum())
        windows += batch
    return windows, steps, time.perf_counter() - t0


def learner_process(learner, barrier, conn, seconds: float, batch: int, window: int) -> None:
    torch.set_num_threads(1)
    learner.sample(batch, window=window).release()  # attach and connect before the clock starts
    barrier.wait()
    conn.send(sample_loop(learner.sample, seconds, batch, window))
    learner.close()


def run_learners(store, n: int, seconds: float, batch: int, window: int) -> tuple[float, float]:
    """Aggregate (windows/s, steps/s) of n forked learner processes started together."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(n)
    learner = store.learner()
    pipes, procs = [], []
    for _ in range(n):
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=learner_process, args=(learner, barrier, theirs, seconds, batch, window))
        p.start()
        pipes.append(ours)
        procs.append(p)
    results = [c.recv() for c in pipes]
    for p in procs:
        p.join()
    wall = max(r[2] for r in results)
    return sum(r[0] for r in results) / wall, sum(r[1] for r in results) / wall


def bench_local(layout: str, steps: int, batch: int, window: int, seconds: float, repeats: int,
                learners: list[int]) -> list[dict]:
    spec = spec_for(layout)
    step_bytes = sum(f.row_bytes for f in spec.values())
    with MemoryManager() as mm:
        store = ReplayStore(spec, steps, num_shards=4, memory=mm, timeout=60)
        fill(store, spec, steps)
        best: dict[str, tuple[float, float]] = {}
        for _ in range(repeats):  # interleaved: every case once per round
            w = sample_loop(store.sample, seconds, batch, window)
            cases = {"owner": (w[0] / w[2], w[1] / w[2])}
            for n in learners:
                cases[f"{n}"] = run_learners(store, n, seconds, batch, window)
            for k, v in cases.items():
                if k not in best or v[0] > best[k][0]:
                    best[k] = v
        store.close()
    one = best["1"]
    rows = []
    for k, (wps, sps) in best.items():
        name = "owner in-process sample" if k == "owner" else f"{k} learner process(es)"
        rows.append({
            "case": f"local {layout} B={batch} L={window}: {name}",
            "metric": "windows_per_s", "ours": wps, "ours_gb_per_s": sps * step_bytes / 1e9,
            "baseline": "1 learner process", "baseline_value": one[0],
            "baseline_gb_per_s": one[1] * step_bytes / 1e9, "ratio": wps / one[0],
        })
    return rows


def bench_ray(layout: str, steps: int, batch: int, window: int, seconds: float, repeats: int) -> list[dict]:
    import ray

    from replay.distributed import RayReplayStore

    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False,
             log_to_driver=False, configure_logging=False)

    @ray.remote(num_cpus=1)
    def task(learner, seconds, batch, window, go):
        learner.sample(batch, window=window).release()
        ray.get(go.wait.remote())
        return sample_loop(learner.sample, seconds, batch, window)

    @ray.remote(num_cpus=0)
    class Go:
        def __init__(self):
            import asyncio
            self.event = asyncio.Event()

        async def set(self):
            self.event.set()

        async def wait(self):
            await self.event.wait()

    spec = spec_for(layout)
    step_bytes = sum(f.row_bytes for f in spec.values())
    store = RayReplayStore(spec, steps, num_shards=2, timeout=60)
    rows = []
    try:
        fill(store, spec, steps)
        best: dict[str, tuple[float, float]] = {}
        for _ in range(repeats):
            w = sample_loop(store.sample, seconds, batch, window)
            cases = {"owner": (w[0] / w[2], w[1] / w[2])}
            for n in (1, 2):
                go = Go.remote()
                refs = [task.remote(store.learner(), seconds, batch, window, go) for _ in range(n)]
                go.set.remote()
                res = ray.get(refs)
                wall = max(r[2] for r in res)
                cases[str(n)] = (sum(r[0] for r in res) / wall, sum(r[1] for r in res) / wall)
            for k, v in cases.items():
                if k not in best or v[0] > best[k][0]:
                    best[k] = v
        base = best["owner"]
        for k, (wps, sps) in best.items():
            name = "owner client" if k == "owner" else f"{k} learner client(s) in Ray tasks"
            rows.append({
                "case": f"ray {layout} B={batch} L={window}: {name}",
                "metric": "windows_per_s", "ours": wps, "ours_gb_per_s": sps * step_bytes / 1e9,
                "baseline": "owner client", "baseline_value": base[0],
                "baseline_gb_per_s": base[1] * step_bytes / 1e9, "ratio": wps / base[0],
            })
    finally:
        store.close()
        ray.shutdown()
    return rows


@click.command()
@click.option("--layouts", default="small,image", show_default=True, help="Comma-separated: small, image.")
@click.option("--small-steps", default=200_000, show_default=True, help="Capacity (steps), small layout.")
@click.option("--image-steps", default=8_000, show_default=True, help="Capacity (steps), image layout.")
@click.option("--small-batch", default="256x64", show_default=True, help="BxL of the small layout.")
@click.option("--image-batch", default="32x32", show_default=True, help="BxL of the image layout.")
@click.option("--learners", default="1,2,4", show_default=True, help="Learner process counts.")
@click.option("--seconds", default=2.0, show_default=True, help="Sampling time of each case and round.")
@click.option("--repeats", default=2, show_default=True)
@click.option("--ray/--no-ray", "with_ray", default=False, show_default=True, help="Also the Ray store.")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(layouts: str, small_steps: int, image_steps: int, small_batch: str, image_batch: str, learners: str,
         seconds: float, repeats: int, with_ray: bool, output: str) -> None:
    """Aggregate sampling throughput of several learner processes on one replay store."""
    counts = sorted({int(x) for x in learners.split(",")} | {1})
    load_before = os.getloadavg()[0]
    rows = []
    chosen = [x.strip() for x in layouts.split(",") if x.strip()]
    for layout in chosen:
        steps = small_steps if layout == "small" else image_steps
        b, length = (int(x) for x in (small_batch if layout == "small" else image_batch).split("x"))
        rows += bench_local(layout, steps, b, length, seconds, repeats, counts)
    if with_ray:
        for layout in chosen:
            steps = min(small_steps, 50_000) if layout == "small" else min(image_steps, 4_000)
            b, length = (int(x) for x in (small_batch if layout == "small" else image_batch).split("x"))
            rows += bench_ray(layout, steps, b, length, seconds, repeats)
    load = (load_before, os.getloadavg()[0])
    click.echo(f"\n1-min load average {load[0]:.2f} before, {load[1]:.2f} after, on {os.cpu_count()} CPUs "
               f"(best of {repeats} interleaved rounds of {seconds} s)")
    click.echo(f"\n{'case':<64} {'windows/s':>10} {'GB/s':>7} {'vs base':>8}")
    for r in rows:
        click.echo(f"{r['case']:<64} {r['ours']:>10.4g} {r['ours_gb_per_s']:>7.3f} {r['ratio']:>8.2f}")
    write_result("replay_learners", rows, machine(load_average_1min=load), output)


if __name__ == "__main__":
    main()

"""The Ray-backed replay store (shards as Ray actors) against the in-process store on the same data.

Step layout ``image`` of benchmarks/replay.py: obs 3x64x64 uint8 plus action int64, reward float32,
done bool (12301 bytes a step); episodes of random lengths in [64, 512]; a local Ray cluster of this
machine (``ray.init(num_cpus=...)``).

Cases (higher is better; ``ratio`` = Ray / in-process, so 1.0 is no overhead and 0.33 is "3x slower"):

- insert, one writer in the driver: steps/s of a fill, episode by episode (``writer.extend`` +
  ``end_episode``), Ray store with 1, 2 and 4 shards vs the in-process store (one shard, one writer).
- insert, 4 writers in Ray tasks (4 processes; the data is made inside each task before the clock
  starts): steps/s over the span from the first start to the last end, 4 shards, against the same
  in-process single-writer figure.
- sample windows (B=256, L=64, uniform, tail padding): windows/s of ``store.sample(256, 64)`` for
  1, 2 and 4 shards vs the in-process store, and 1 shard with ``prefetch=1`` (the next draw in
  flight while a batch is copied and used). The target: 1 shard within 3x (ratio >= 0.33).
  Other processes share the cores and the load moves within a run, so each sample row's in-process
  figure is measured again right after it (``baseline_value``; the first one is ``baseline_at_start``).

Where the sample overhead goes (``profile`` of each Ray row, mean seconds per batch, from
``RayReplayStore.last_profile``; with several calls in flight, the shard figures are the slowest
call's): ``stats_s`` the round trip that reads every shard's mass and counters; ``shard_draw_s`` the
shard's draw (its local selector, `replay.store.ReplayStore.draw_windows`); ``shard_put_s`` its
``ray.put`` of the windows' ring runs (the one copy on the shard side: ring -> object store);
``shard_sample_s`` the whole shard call (draw, put, staleness check); ``transfer_s`` the rest of the
remote call (the RPC and its small reply); ``get_s`` the client's zero-copy ``ray.get`` of the runs;
``copy_s`` the client's copy of the windows into its staging buffer (padding and mask included);
``shard_put_faults`` the minor page faults of the shard processes during their puts (object-store
pages the process had not touched yet: about 4 KiB each).
Two reference rows time ``ray.put`` and ``ray.get`` of one batch's bytes as one array (the object
store alone) and a plain numpy copy of them (the machine's copy bandwidth).

Run ``python benchmarks/distributed.py --help``; results go to ``benchmarks/results/distributed.json``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

# run as a script, this file's folder comes first on sys.path and benchmarks/replay.py would shadow the
# package: import the package first, then find _report at the end of the path
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import click  # noqa: E402
import numpy as np  # noqa: E402

from replay import ReplayStore, TrajectorySpec, Uniform  # noqa: E402

sys.path.append(str(_HERE))
from _report import machine, row, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "distributed.json"
SPEC = TrajectorySpec(
    {"obs": ((3, 64, 64), "uint8"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "bool")}
)


def make_episodes(steps: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Episodes of random lengths in [64, 512] summing to ``steps`` (random bytes: no compression)."""
    rng = np.random.default_rng(seed)
    out, total = [], 0
    while total < steps:
        n = int(min(rng.integers(64, 513), steps - total)) if steps - total >= 64 else steps - total
        done = np.zeros(n, dtype=bool)
        done[-1] = True
        out.append(
            {
                "obs": rng.integers(0, 256, (n, 3, 64, 64), dtype=np.uint8),
                "action": rng.integers(0, 4, n).astype(np.int64),
                "reward": rng.standard_normal(n).astype(np.float32),
                "done": done,
            }
        )
        total += n
    return out


def fill(store, episodes) -> float:
    """Seconds to write ``episodes`` through one writer (every shipment confirmed)."""
    start = time.perf_counter()
    w = store.writer()
    for ep in episodes:
        w.extend(ep)
        w.end_episode()
    if hasattr(w, "wait"):
        w.wait()
    seconds = time.perf_counter() - start
    w.close()
    return seconds


def sample_rate(store, batch: int, window: int, iters: int, repeats: int, warmup: int) -> tuple[float, dict]:
    """Best windows/s over ``repeats`` runs of ``iters`` samples, and the mean profile of the best run.

    ``warmup`` batches first: staging, numba, and Ray's object store, whose allocator hands out fresh
    shared-memory pages (one minor fault per 4 KiB page, in the shard and in the client) for the first
    few batches before it reuses freed ones: ~50k faults per 200 MB batch, 3-4x slower batches.
    """
    for _ in range(warmup):
        store.sample(batch, window).release()
    best, best_profile = 0.0, {}
    for _ in range(repeats):
        prof: dict[str, float] = {}
        start = time.perf_counter()
        for _ in range(iters):
            b = store.sample(batch, window)
            b.release()
            for k, v in getattr(store, "last_profile", {}).items():
                prof[k] = prof.get(k, 0.0) + v / iters
        rate = batch * iters / (time.perf_counter() - start)
        if rate > best:
            best, best_profile = rate, prof
    return best, best_profile


def task_writers(store, tasks: int, steps: int) -> tuple[float, int]:
    """``tasks`` Ray tasks write ``steps`` in all; return (steps/s over the whole span, steps)."""
    import ray

    @ray.remote
    def writer_task(st, share: int, seed: int) -> tuple[float, float, int]:
        episodes = make_episodes(share, seed)  # made before the clock starts
        start = time.time()
        with st.writer() as w:
            for ep in episodes:
                w.extend(ep)
                w.end_episode()
        return start, time.time(), w.steps_written

    task = writer_task.options(num_cpus=0.5)  # all of them at once on a 2-CPU cluster
    ray.get([task.remote(store, 64, t) for t in range(tasks)])  # warm-up: start and import the workers
    out = ray.get([task.remote(store, steps // tasks, 100 + t) for t in range(tasks)])
    span = max(e for _, e, _ in out) - min(s for s, _, _ in out)
    total = sum(n for _, _, n in out)
    return total / span, total


@click.command()
@click.option("--steps", default=12_000, show_default=True, help="Capacity and data (steps of 12301 bytes).")
@click.option("--shards", default="1,2,4", show_default=True, help="Comma-separated shard counts.")
@click.option("--batch", default=256, show_default=True)
@click.option("--window", default=64, show_default=True)
@click.option("--iters", default=5, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--warmup", default=10, show_default=True, help="Batches before timing (object store pages).")
@click.option("--tasks", default=4, show_default=True, help="Writer tasks (processes) in the task case.")
@click.option("--num-cpus", default=2, show_default=True, help="ray.init(num_cpus=...).")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(
    steps: int,
    shards: str,
    batch: int,
    window: int,
    iters: int,
    repeats: int,
    warmup: int,
    tasks: int,
    num_cpus: int,
    output: str,
) -> None:
    """Sampled windows/s and inserted steps/s of the Ray-backed store vs the in-process store."""
    import ray

    from replay.distributed import RayReplayStore  # needs ray

    logging.basicConfig(level=logging.WARNING)
    ray.init(  # a cluster of its own, even where another is running on this machine
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    episodes = make_episodes(steps)
    batch_bytes = batch * window * SPEC.step_bytes
    click.echo(
        f"{steps} steps in {len(episodes)} episodes; batch {batch}x{window} = {batch_bytes / 1e6:.0f} MB"
    )
    rows: list[dict] = []

    # in-process baseline
    local = ReplayStore(SPEC, steps, 1, selector=Uniform(), seed=0, timeout=120, tier="host")
    fill(local, episodes)  # first fill: page faults; the second is the steady state
    local_insert = sum(len(e["obs"]) for e in episodes) / fill(local, episodes)
    local_sample, _ = sample_rate(local, batch, window, iters, repeats, warmup)
    base = "in-process ReplayStore"
    click.echo(f"in-process: insert {local_insert:.3g} steps/s, sample {local_sample:.3g} windows/s")

    # references: the object store and a plain copy of one batch's bytes
    src = np.random.default_rng(0).integers(0, 256, batch_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t = time.perf_counter()
    for _ in range(iters):
        np.copyto(dst, src)
    copy_s = (time.perf_counter() - t) / iters
    ray.get(ray.put(src))
    t = time.perf_counter()
    for _ in range(iters):
        ref = ray.put(src)
    put_s = (time.perf_counter() - t) / iters
    t = time.perf_counter()
    for _ in range(iters):
        got = ray.get(ref)
        np.copyto(dst, got)
    get_copy_s = (time.perf_counter() - t) / iters
    del ref, got
    references = {
        "batch_bytes": batch_bytes,
        "numpy_copy_s": copy_s,
        "ray_put_s": put_s,
        "ray_get_and_copy_s": get_copy_s,
        "copy_gb_per_s": batch_bytes / copy_s / 1e9,
        "ray_put_gb_per_s": batch_bytes / put_s / 1e9,
    }
    click.echo(
        f"one batch's bytes: numpy copy {copy_s * 1e3:.1f} ms, ray.put {put_s * 1e3:.1f} ms, "
        f"ray.get + copy {get_copy_s * 1e3:.1f} ms"
    )

    for s in [int(x) for x in shards.split(",") if x.strip()]:
        store = RayReplayStore(SPEC, steps, s, selector=Uniform(), seed=0, timeout=120)
        fill(store, episodes)
        ins = sum(len(e["obs"]) for e in episodes) / fill(store, episodes)
        rows.append(
            row(f"insert, 1 writer in the driver, ray {s} shard(s)", "steps_per_s", ins, base, local_insert)
        )
        rate, prof = sample_rate(store, batch, window, iters, repeats, warmup)
        beside = sample_rate(local, batch, window, iters, repeats, 2)[0]  # the in-process store, now
        rows.append(
            row(
                f"sample {batch}x{window} uniform, ray {s} shard(s)",
                "windows_per_s",
                rate,
                base,
                beside,
                profile_s=prof,
                gb_per_s=rate / batch * batch_bytes / 1e9,
                baseline_at_start=local_sample,
            )
        )
        click.echo(f"ray {s} shard(s): insert {ins:.3g} steps/s, sample {rate:.3g} windows/s, profile {prof}")
        if s == 1:
            store.prefetch = 1  # the next draw in flight while a batch is used
            rate_p, prof_p = sample_rate(store, batch, window, iters, repeats, warmup)
            store.prefetch = 0
            beside = sample_rate(local, batch, window, iters, repeats, 2)[0]
            rows.append(
                row(
                    f"sample {batch}x{window} uniform, ray 1 shard, prefetch=1",
                    "windows_per_s",
                    rate_p,
                    base,
                    beside,
                    profile_s=prof_p,
                    gb_per_s=rate_p / batch * batch_bytes / 1e9,
                    baseline_at_start=local_sample,
                )
            )
            click.echo(f"ray 1 shard, prefetch=1: sample {rate_p:.3g} windows/s, profile {prof_p}")
        if s == max(int(x) for x in shards.split(",") if x.strip()) and tasks > 0:
            rate_t, n = task_writers(store, tasks, steps)
            rows.append(
                row(
                    f"insert, {tasks} writers in Ray tasks, ray {s} shard(s)",
                    "steps_per_s",
                    rate_t,
                    base,
                    local_insert,
                )
            )
            click.echo(f"{tasks} task writers: {rate_t:.3g} steps/s ({n} steps)")
        store.close()
    local.close()

    click.echo(f"\nload average {os.getloadavg()[0]:.1f} (1 min); other processes share the cores")
    click.echo(f"\n{'case':<52} {'metric':<14} {'ray':>10} {'in-proc':>10} {'ratio':>6}  where (ms/batch)")
    for r in rows:
        where = ""
        p = r.get("profile_s")
        if p:
            where = " ".join(
                f"{k[:-2].removeprefix('shard_')} {p[k] * 1e3:.1f}"
                for k in ("stats_s", "shard_draw_s", "shard_put_s", "transfer_s", "get_s", "copy_s")
                if k in p
            )
        click.echo(
            f"{r['case']:<52} {r['metric']:<14} {r['ours']:>10.3g} {r['baseline_value']:>10.3g} "
            f"{r['ratio']:>6.2f}  {where}"
        )
    for r in rows:
        if r["case"].startswith("sample") and "ray 1 shard" in r["case"]:
            verdict = "met" if r["ratio"] >= 1 / 3 else "NOT met"
            click.echo(
                f"target (1 shard within 3x of in-process): {r['case']}: ratio {r['ratio']:.2f} "
                f"(needs >= 0.33): {verdict}"
            )
    write_result(
        "distributed",
        rows,
        machine(ray=ray.__version__),
        output,
        config={
            "steps": steps,
            "batch": batch,
            "window": window,
            "iters": iters,
            "repeats": repeats,
            "warmup": warmup,
        },
        references=references,
    )
    ray.shutdown()


if __name__ == "__main__":
    main()

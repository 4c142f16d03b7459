"""Replay store throughput against TorchRL, cpprb and a plain copy of the same bytes, in one process.

Two step layouts (docs/architecture.md#replay-composition): ``small`` (obs of 4 float32, action
int64, reward float32, done bool: 29 bytes a step) and ``image`` (obs 3x64x64 uint8 plus the same
scalars: 12301 bytes a step), from `_replay_workload`.
The same episodes (random lengths in [64, 512]) go into every system.

Cases (higher is better; ``ratio`` = ours / baseline):

- insert: steps/s and GB/s of a second fill, episode by episode (warm memory: the steady state,
  overwriting the oldest steps); against cpprb the best of ``--repeats`` fills, the two alternating.
  Ours: ``writer.extend`` + ``end_episode`` (against cpprb ``writer.add_episode``); TorchRL:
  ``ReplayBuffer(LazyTensorStorage).extend``; cpprb: ``ReplayBuffer.add`` + ``on_episode_end``; copy:
  ``numpy.copyto`` of each episode's bytes into a ring (the ceiling).
- sample windows (B=256, L=64): windows/s and GB/s of gathered steps. Ours: ``store.sample(256, 64)``
  (uniform anchors, tail padding, gathered into a reused staging buffer); TorchRL: ``SliceSampler
  (slice_len=64, traj_key="episode", cache_values=True)`` with ``batch_size=256*64`` (the stronger
  setting: trajectory bounds cached); copy: one ``numpy.copyto`` of B*L steps' bytes (the ceiling).
- sample + update priorities (B=256 transitions, prioritized, alpha 0.6, beta 0.4): ours
  ``Prioritized`` with window 1 vs cpprb ``PrioritizedReplayBuffer``; and uniform transitions vs cpprb
  ``ReplayBuffer``. Each also ``, 1 thread``: ours with this thread's numba count at 1, so the copy
  stays on the caller (`graphrl.threads`; a batch of 2 MiB and more is otherwise copied by the thread
  team too, `replay.transition_kernel`), interleaved with the other two.
- per call (``calls_per_s``, with ``us_per_call``): ``sample(32, 1)`` vs cpprb ``sample(32)`` and
  ``sample(B, L)`` vs TorchRL's ``sample()`` (one call each: the fixed cost of a call); and
  ``update_priorities`` alone, B=32 and B, of one batch's keys (float64 numpy priorities, hot caches).
- append: ``writer.append`` of single steps (one episode) vs cpprb ``add`` of single steps.
- random-row read limit (image layout, against cpprb): `copy_limit`, B and 32 rows drawn at random from a
  whole ring (the store's size, or twice the last-level cache where that is larger) into one buffer, fresh
  rows each call from index sets drawn up front that read at least twice the last-level cache a cycle
  (`_report.last_level_cache_bytes`, also in the machine record), by numpy ``take``, a memcpy a row on 1
  and 2 threads and the store's own copy (`replay.copy_helpers.copy_range`); the B-step cases and
  ``sample(32, 1)`` then give ``of_limit`` (the limit's share of ours' time: the table prints ours' time
  over the limit) and ``reachable_ratio`` (the baseline's time over the limit: the most any sample could
  reach against it here), from wall and CPU time.

Large windows copy at full bandwidth only with non-temporal (streaming) stores: the gather uses
them for large batches (`graphrl.kernels.stream_bytes`, see `replay.windows`), where glibc's memcpy
would only above its ``x86_non_temporal_threshold`` (the results record ``GLIBC_TUNABLES``). The
machine is shared: the table and the JSON record the 1-minute load average before and after. The
cases against cpprb also give this process's CPU time per call (all its threads, best run), ours and
cpprb's, and ``cpu_ratio`` = cpprb's / ours: other processes' load moves it far less than wall time.

Baselines that are not installed are skipped (``pip install torchrl==0.14.1 cpprb``; torchrl 0.14.1's
compiled extension does not load with torch 2.13, so its prioritized samplers cannot run; SliceSampler
is pure Python). Every time is the best of ``--repeats`` runs (for the sample-vs-copy case, ours and
the copy alternate run by run).

Run ``python benchmarks/replay.py --help``; results go to ``benchmarks/results/replay.json``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from pathlib import Path

# run as a script, this file's folder comes first on sys.path and this file would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import click  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from graphrl.kernels import copy_bytes, parallel_for  # noqa: E402
from graphrl.memory import MemoryManager  # noqa: E402
from graphrl.threads import team_size  # noqa: E402
from replay import Prioritized, ReplayStore, Uniform  # noqa: E402
from replay.copy_helpers import copy_range  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))
from _replay_workload import make_episodes, spec_for  # noqa: E402
from _report import (  # noqa: E402
    best_interleaved,
    best_interleaved_cpu,
    cpu_fields,
    last_level_cache_bytes,
    machine,
    row,
    serial,
    write_result,
)

RESULTS = Path(__file__).resolve().parent / "results" / "replay.json"


@numba.njit(nogil=True)
def _gather_rows(ring, idx, out, lo, hi):  # pragma: no cover - numba
    """Rows ``idx[lo:hi]`` of ``ring`` (uint8 [N, R]) into rows ``lo:hi`` of ``out`` (uint8 [B, R]), one
    memcpy a row."""
    rb = ring.shape[1]
    src = ring.reshape(-1)
    dst = out.reshape(-1)
    for i in range(lo, hi):
        copy_bytes(dst, i * rb, src, idx[i] * rb, rb)


def copy_limit(
    tag: str, steps: int, step_bytes: int, batch: int, iters: int, repeats: int, llc: int | None
) -> tuple[dict, tuple[float, float]]:
    """The physical limit of a sample of ``batch`` random steps: this machine's random-row read bandwidth
    from memory, not from the cache.

    ``batch`` rows of ``step_bytes`` drawn at random from a whole ring into one reused buffer, fresh rows
    each call: the index sets are drawn up front, one per call, and cycled; there are enough of them that
    the rows one cycle reads are at least twice ``llc`` (the last-level cache's bytes,
    `_report.last_level_cache_bytes`; 512 MiB assumed where it is None, as the row records). The ring has
    the store's ``steps`` rows, or more where that is less than twice ``llc``: the benchmark's stores are
    rings of ``steps`` read in turn (ours, cpprb's), a real store's is far larger than the cache, and rows
    of a ring the cache holds are read from the cache (docs/performance.md, issue 29). numpy memory, so
    huge pages where the kernel gives them. Arms, interleaved,
    best of ``max(9, 3 repeats)`` runs: numpy ``take`` (cpprb's gather), a compiled memcpy a row
    (`graphrl.kernels.copy_bytes`) on 1 thread and, where `graphrl.threads.team_size` gives 2, on 2
    threads (half the rows each, `graphrl.kernels.parallel_for`), and the store's own copy on 1 thread
    (`replay.copy_helpers.copy_range` of the rows' addresses as one field: its prefetches, and streaming
    stores from 1 MiB a batch). Returns the row (ours: the fastest arm's GB/s; baseline: numpy take) and
    ``(wall, cpu)``: the fastest arm's seconds per batch, the least time any sample of fresh rows can take
    here, and the 1-thread arms' least CPU seconds.
    """
    cache = llc if llc is not None else 512 << 20
    ring_rows = max(steps, -(-2 * cache // step_bytes))
    ring = np.ones((ring_rows, step_bytes), dtype=np.uint8)  # written: mapped, not the zero page
    out = np.empty((batch, step_bytes), dtype=np.uint8)
    sets = max(64, -(-2 * cache // (batch * step_bytes)))
    rows = np.random.default_rng(3).integers(0, ring_rows, (sets, batch))
    addrs = ring.ctypes.data + rows * step_bytes  # the same rows by address, for the store's copy
    dst, row_bytes = np.array([out.ctypes.data], dtype=np.int64), np.array([step_bytes], dtype=np.int64)
    turn = [0]

    def idx() -> int:
        turn[0] = (turn[0] + 1) % sets
        return turn[0]

    def take() -> None:
        np.take(ring, rows[idx()], axis=0, out=out)

    def one() -> None:
        _gather_rows(ring, rows[idx()], out, 0, batch)

    def store_copy() -> None:
        copy_range(addrs[idx()], batch, dst, row_bytes, 0, batch)

    half = batch // 2

    def two() -> None:
        i = rows[idx()]
        parallel_for(lambda c: _gather_rows(ring, i, out, c * half, batch if c else half), 2, 2)

    arms = [take, one, store_copy] + ([two] if team_size() >= 2 else [])
    times, cpu = best_interleaved_cpu(arms, iters * 10, max(9, 3 * repeats))  # cheap arms: more runs
    nbytes = batch * step_bytes
    names = ["numpy take 1 thread", "memcpy a row 1 thread", "store copy 1 thread", "memcpy a row 2 threads"]
    us = {f"{n.replace(' ', '_')}_us": t * 1e6 for n, t in zip(names, times, strict=False)}
    us |= {f"{n.replace(' ', '_')}_cpu_us": t * 1e6 for n, t in zip(names, cpu, strict=False)}
    best = int(np.argmin(times))
    limit, limit_cpu = times[best], min(cpu[:3])  # CPU: the 1-thread arms (2 threads add their CPU)
    return row(
        f"{tag} random-row read limit B={batch} ({names[best]})", "gb_per_s", nbytes / limit / 1e9,
        "numpy take (cpprb's gather)", nbytes / times[0] / 1e9, limit_us=limit * 1e6,
        limit_cpu_us=limit_cpu * 1e6, ring_bytes=ring.nbytes, index_sets=sets, llc_bytes=llc,
        read_per_cycle_bytes=sets * nbytes, **us,
    ), (limit, limit_cpu)


def against_limit(r: dict, t: float, t_base: float, limit: tuple[float, float] | None) -> dict:
    """``r`` with ``limit`` (`copy_limit`'s wall and CPU seconds) set against ours (``t``) and the baseline
    (``t_base``): ``of_limit`` = limit / t, the limit's share of our time (1.0: at the limit), and
    ``reachable_ratio`` = t_base / limit, the baseline's time over the limit (the most ours / baseline any
    sample could reach here: 1.5x only where it is >= 1.5); the same from CPU time (``cpu_*``, the 1-thread
    limit; ``r`` has `cpu_fields`). ``r`` unchanged where ``limit`` is None."""
    if limit is not None:
        r.update(limit_us=limit[0] * 1e6, of_limit=limit[0] / t, reachable_ratio=t_base / limit[0],
                 cpu_of_limit=limit[1] * 1e6 / r["cpu_us"],
                 cpu_reachable_ratio=r["baseline_cpu_us"] / (limit[1] * 1e6))
    return r


# ---------------------------------------------------------------------------------------------- systems


def ours_insert(spec, episodes, capacity, mm, selector, tier="shared") -> tuple[float, ReplayStore]:
    """Fill a store twice; time the second fill (a warm ring, overwriting: the steady state)."""
    store = ReplayStore(spec, capacity, 1, selector=selector, memory=mm, seed=0, timeout=60, tier=tier)
    w = store.writer()
    for ep in episodes:
        w.extend(ep)
        w.end_episode()
    start = time.perf_counter()
    for ep in episodes:
        w.extend(ep)
        w.end_episode()
    return time.perf_counter() - start, store


def copy_insert(spec, episodes, capacity) -> float:
    ring = {n: np.ones((capacity, *f.shape), f.dtype) for n, f in spec.items()}  # touched: warm
    pos = 0
    start = time.perf_counter()
    for ep in episodes:
        n = len(ep["obs"])
        for name, arr in ep.items():
            np.copyto(ring[name][pos : pos + n], arr)
        pos += n
    return time.perf_counter() - start


def torchrl_buffer(spec, episodes, capacity, slice_len, batch):
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler

    rb = ReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=SliceSampler(slice_len=slice_len, traj_key="episode", cache_values=True, strict_length=False),
        batch_size=batch * slice_len,
    )
    tds = []
    for i, ep in enumerate(episodes):
        n = len(ep["obs"])
        data = {k: torch.from_numpy(v) for k, v in ep.items()}
        data["episode"] = torch.full((n,), i, dtype=torch.int64)
        tds.append(TensorDict(data, batch_size=[n]))
    for td in tds:  # first fill allocates the storage; time the second
        rb.extend(td)
    start = time.perf_counter()
    for td in tds:
        rb.extend(td)
    return time.perf_counter() - start, rb


def cpprb_buffer(spec, episodes, capacity, prioritized: bool):
    import cpprb

    env_dict = {n: {"shape": f.shape if f.shape else 1, "dtype": f.dtype} for n, f in spec.items()}
    cls = cpprb.PrioritizedReplayBuffer if prioritized else cpprb.ReplayBuffer
    kwargs = {"alpha": 0.6} if prioritized else {}
    rb = cls(capacity, env_dict, **kwargs)
    for ep in episodes:
        rb.add(**ep)
        rb.on_episode_end()
    start = time.perf_counter()
    for ep in episodes:
        rb.add(**ep)
        rb.on_episode_end()
    return time.perf_counter() - start, rb


def bench_layout(
    layout: str, steps: int, batch: int, window: int, iters: int, repeats: int, versions: dict, tier: str,
    cases: str = "all",
) -> list[dict]:
    """Every case for one step layout (``cases="cpprb"``: only the cases against cpprb)."""
    rows: list[dict] = []
    spec = spec_for(layout)
    episodes = make_episodes(spec, steps)
    step_bytes = spec.step_bytes
    total_bytes = steps * step_bytes
    tag = f"{layout} ({step_bytes} B/step, {tier})"
    click.echo(f"-- {tag}: {steps} steps in {len(episodes)} episodes")
    with MemoryManager() as mm:
        # insert
        t_ours, store = ours_insert(spec, episodes, steps, mm, Uniform(), tier)
        t_copy = copy_insert(spec, episodes, steps)
        rows.append(
            row(
                f"{tag} insert vs copy",
                "steps_per_s",
                steps / t_ours,
                "numpy copyto",
                steps / t_copy,
                ours_gb_per_s=total_bytes / t_ours / 1e9,
                baseline_gb_per_s=total_bytes / t_copy / 1e9,
            )
        )
        rb_torchrl = None
        try:
            if cases == "cpprb":
                raise ImportError("skipped")
            t_trl, rb_torchrl = torchrl_buffer(spec, episodes, steps, window, batch)
            import torchrl

            versions["torchrl"] = torchrl.__version__
            rows.append(
                row(
                    f"{tag} insert vs TorchRL",
                    "steps_per_s",
                    steps / t_ours,
                    f"torchrl {torchrl.__version__} LazyTensorStorage.extend",
                    steps / t_trl,
                    ours_gb_per_s=total_bytes / t_ours / 1e9,
                    baseline_gb_per_s=total_bytes / t_trl / 1e9,
                )
            )
        except ImportError:
            click.echo("torchrl not installed or --cases cpprb: skipped")
        rb_cpprb = None
        try:
            _, rb_cpprb = cpprb_buffer(spec, episodes, steps, prioritized=False)
            import cpprb

            versions["cpprb"] = getattr(cpprb, "__version__", "installed")
            w_fill = store.writer()

            def ours_fill() -> None:
                for ep in episodes:
                    w_fill.add_episode(ep)

            def cpprb_fill() -> None:
                for ep in episodes:
                    rb_cpprb.add(**ep)
                    rb_cpprb.on_episode_end()

            # whole episodes into warm rings, ours and cpprb alternating (both see the same load)
            (t_fill, t_cp), cpu = best_interleaved_cpu([ours_fill, cpprb_fill], 1, repeats)
            w_fill.close()
            rows.append(
                row(
                    f"{tag} insert episodes vs cpprb",
                    "steps_per_s",
                    steps / t_fill,
                    "cpprb ReplayBuffer.add",
                    steps / t_cp,
                    ours_gb_per_s=total_bytes / t_fill / 1e9,
                    baseline_gb_per_s=total_bytes / t_cp / 1e9,
                    **cpu_fields(cpu),
                )
            )
        except ImportError:
            click.echo("cpprb not installed: skipped")

        if cases == "all":  # sample windows
            def ours_windows() -> None:
                store.sample(batch, window).release()

            nbytes = batch * window * step_bytes
            src = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
            dst = np.empty_like(src)
            # ours and the copy alternate (the machine may be shared: both see the same load)
            t_s, t_c = best_interleaved([ours_windows, lambda: np.copyto(dst, src)], iters, repeats)
            rows.append(
                row(
                    f"{tag} sample B={batch} L={window} vs copy",
                    "windows_per_s",
                    batch / t_s,
                    "numpy copyto (ceiling)",
                    batch / t_c,
                    ours_gb_per_s=nbytes / t_s / 1e9,
                    baseline_gb_per_s=nbytes / t_c / 1e9,
                )
            )
            if rb_torchrl is not None:
                t_s, t_t = best_interleaved([ours_windows, rb_torchrl.sample], iters, repeats)
                rows.append(
                    row(
                        f"{tag} sample B={batch} L={window} vs TorchRL",
                        "windows_per_s",
                        batch / t_s,
                        "torchrl SliceSampler (cache_values)",
                        batch / t_t,
                        ours_gb_per_s=nbytes / t_s / 1e9,
                        baseline_gb_per_s=nbytes / t_t / 1e9,
                    )
                )
                rows.append(
                    row(
                        f"{tag} per call sample({batch}, {window}) vs TorchRL",
                        "calls_per_s",
                        1 / t_s,
                        "torchrl SliceSampler sample()",
                        1 / t_t,
                        us_per_call=t_s * 1e6,
                        baseline_us_per_call=t_t * 1e6,
                    )
                )
                del rb_torchrl
        store.close()

        # transitions: uniform vs cpprb ReplayBuffer, prioritized vs cpprb PrioritizedReplayBuffer
        # the physical limits of a B-step and a 32-step sample (pixel steps: a memory-bound copy), by size
        limits: dict[int, tuple[float, float]] = {}
        if rb_cpprb is not None and layout == "image":
            llc = last_level_cache_bytes()
            for k in sorted({32, batch}):  # B=32 as sample(32, 1) below: twice the calls a run
                limit_row, limits[k] = copy_limit(tag, steps, step_bytes, k, iters * (2 if k == 32 else 1),
                                                  repeats, llc)
                rows.append(limit_row)

        if rb_cpprb is not None:
            _, store_u = ours_insert(spec, episodes, steps, mm, Uniform(), tier)

            def ours_u() -> None:
                store_u.sample(batch, 1).release()

            trio = [ours_u, serial(ours_u), lambda: rb_cpprb.sample(batch)]
            (t_u, t_u1, t_cu), cpu = best_interleaved_cpu(trio, iters * 10, repeats)
            for name, t, c in ((f"{tag} sample B={batch} transitions vs cpprb", t_u, cpu[0]),
                               (f"{tag} sample B={batch} transitions, 1 thread, vs cpprb", t_u1, cpu[1])):
                rows.append(against_limit(
                    row(name, "samples_per_s", batch / t, "cpprb ReplayBuffer.sample", batch / t_cu,
                        **cpu_fields([c, cpu[2]])), t, t_cu, limits.get(batch),
                ))
            (t_u32, t_c32), cpu = best_interleaved_cpu(
                [lambda: store_u.sample(32, 1).release(), lambda: rb_cpprb.sample(32)], iters * 20, repeats
            )
            rows.append(against_limit(
                row(f"{tag} per call sample(32, 1) vs cpprb", "calls_per_s", 1 / t_u32,
                    "cpprb ReplayBuffer.sample(32)", 1 / t_c32, us_per_call=t_u32 * 1e6,
                    baseline_us_per_call=t_c32 * 1e6, **cpu_fields(cpu)), t_u32, t_c32, limits.get(32),
            ))
            ep0 = episodes[0]
            single = [{k: v[i] for k, v in ep0.items()} for i in range(len(ep0["obs"]))]
            w_u = store_u.writer()

            def ours_append() -> None:
                for step in single:
                    w_u.append(step)
                w_u.end_episode()

            def cpprb_add() -> None:
                for step in single:
                    rb_cpprb.add(**step)
                rb_cpprb.on_episode_end()

            t_a, t_ca = best_interleaved([ours_append, cpprb_add], max(1, iters // 2), repeats)
            rows.append(
                row(
                    f"{tag} append single steps vs cpprb",
                    "steps_per_s",
                    len(single) / t_a,
                    "cpprb ReplayBuffer.add (one step)",
                    len(single) / t_ca,
                )
            )
            w_u.close()
            store_u.close()
            del rb_cpprb
            _, store_p = ours_insert(spec, episodes, steps, mm, Prioritized(0.6), tier)
            _, rb_p = cpprb_buffer(spec, episodes, steps, prioritized=True)
            prios = np.random.default_rng(2).uniform(0.1, 2.0, batch)

            def ours_prio() -> None:
                b = store_p.sample(batch, 1, beta=0.4)
                _ = b.weights  # made on first access; cpprb's sample computes its weights too
                store_p.update_priorities(b.keys, prios)
                b.release()

            def cpprb_prio() -> None:
                s = rb_p.sample(batch, beta=0.4)
                rb_p.update_priorities(s["indexes"], prios)

            trio = [ours_prio, serial(ours_prio), cpprb_prio]
            (t_op, t_op1, t_cp), cpu = best_interleaved_cpu(trio, iters * 10, repeats)
            for name, t, c in ((f"{tag} prioritized sample+update B={batch} vs cpprb", t_op, cpu[0]),
                               (f"{tag} prioritized B={batch}, 1 thread, vs cpprb", t_op1, cpu[1])):
                rows.append(against_limit(
                    row(name, "samples_per_s", batch / t, "cpprb PrioritizedReplayBuffer", batch / t_cp,
                        **cpu_fields([c, cpu[2]])), t, t_cp, limits.get(batch),
                ))
            for k in sorted({32, batch}):  # the update alone, the same keys each call (hot caches)
                b = store_p.sample(k, 1)
                keys, p_k, idx = b.keys, prios[:k] if k <= batch else np.ones(k), rb_p.sample(k)["indexes"]
                (t_ou, t_cu), cpu = best_interleaved_cpu(
                    [lambda keys=keys, p_k=p_k: store_p.update_priorities(keys, p_k),
                     lambda idx=idx, p_k=p_k: rb_p.update_priorities(idx, p_k)],
                    iters * 200, max(repeats, 5),
                )
                b.release()
                rows.append(
                    row(f"{tag} update_priorities B={k} vs cpprb", "calls_per_s", 1 / t_ou,
                        "cpprb PrioritizedReplayBuffer.update_priorities", 1 / t_cu, us_per_call=t_ou * 1e6,
                        baseline_us_per_call=t_cu * 1e6, **cpu_fields(cpu))
                )
            store_p.close()
    return rows


@click.command()
@click.option("--layouts", default="small,image", show_default=True, help="Comma-separated: small, image.")
@click.option("--small-steps", default=500_000, show_default=True, help="Capacity (steps) for small obs.")
@click.option("--image-steps", default=20_000, show_default=True, help="Capacity (steps) for 3x64x64 obs.")
@click.option("--batch", default=256, show_default=True)
@click.option("--window", default=64, show_default=True)
@click.option("--iters", default=10, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--tier", default="shared", show_default=True, type=click.Choice(["shared", "host"]),
              help="The store's memory tier: shared (other processes attach) or host (private, as cpprb's).")
@click.option("--cases", default="all", show_default=True, type=click.Choice(["all", "cpprb"]),
              help="all, or only the cases against cpprb (no TorchRL, no B x L windows).")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(
    layouts: str,
    small_steps: int,
    image_steps: int,
    batch: int,
    window: int,
    iters: int,
    repeats: int,
    tier: str,
    cases: str,
    output: str,
) -> None:
    """Insert and sample throughput of the replay store vs TorchRL, cpprb and a plain copy."""
    logging.getLogger("torchrl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    rows = []
    versions = {}
    load_before = os.getloadavg()[0]
    for layout in [x.strip() for x in layouts.split(",") if x.strip()]:
        steps = small_steps if layout == "small" else image_steps
        rows += bench_layout(layout, steps, batch, window, iters, repeats, versions, tier, cases)
    load = (load_before, os.getloadavg()[0])
    click.echo(
        f"\n1-min load average {load[0]:.2f} before, {load[1]:.2f} after, on {os.cpu_count()} CPUs "
        f"(best of {repeats}); GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES')}"
    )

    header = f"{'case':<62} {'metric':<14} {'ours':>10} {'baseline':>10} {'ratio':>7}"
    click.echo(f"\n{header}  GB/s or us/call, ours/base")
    for r in rows:
        gb = ""
        if "ours_gb_per_s" in r:
            gb = f"{r['ours_gb_per_s']:.2f}/{r['baseline_gb_per_s']:.2f}"
        elif "us_per_call" in r:
            gb = f"{r['us_per_call']:.1f}/{r['baseline_us_per_call']:.1f} us per call"
        if "cpu_ratio" in r:
            gb += f"  CPU {r['cpu_us']:.3g}/{r['baseline_cpu_us']:.3g} us = {r['cpu_ratio']:.2f}"
        if "of_limit" in r:
            gb += (f"  limit {r['limit_us']:.1f} us: ours {1 / r['of_limit']:.2f}x, base "
                   f"{r['reachable_ratio']:.2f}x it (CPU {1 / r['cpu_of_limit']:.2f}x, "
                   f"{r['cpu_reachable_ratio']:.2f}x)")
        elif "limit_us" in r:
            gb += (f"  {r['limit_us']:.1f} us a batch (CPU {r['limit_cpu_us']:.1f} us, 1 thread), "
                   f"{r['ring_bytes'] / 1e6:.0f} MB ring, {r['index_sets']} index sets")
        click.echo(
            f"{r['case']:<62} {r['metric']:<14} {r['ours']:>10.3g} {r['baseline_value']:>10.3g} "
            f"{r['ratio']:>7.2f}  {gb}"
        )
    info = machine(glibc_tunables=os.environ.get("GLIBC_TUNABLES"), load_average_1min=load, **versions)
    write_result("replay", rows, info, output)

if __name__ == "__main__":
    main()

"""Part 4 of ``gpu_check.py``: replay windows gathered on the GPU, byte-equal to the CPU's, then their speed.

``ReplayStore.sample(device="cuda")`` reads windows in place from the registered shard rings with the
numba.cuda kernel into a device batch (GEAR's zero-copy collect). `check_replay_equal`: on a small
store whose rings have wrapped, with open episodes, 3 shards, head and tail padding and uniform and
prioritized draws, every GPU batch must equal, byte for byte, the batch of an identical store (same
data, same seed) sampled on the CPU and copied to the device (fields, mask, keys, probabilities,
weights). `time_replay`: windows/s and GB/s (bytes of the gathered steps) for obs of 3x64x64 uint8
and of 4 float32, B=256, L=64, uniform: the GPU path against the CPU gather into pinned staging then
a non-blocking copy (``sample()`` then ``Batch.to("cuda")``), each batch completed before the next,
and a pinned-host-to-device copy of the same bytes (the PCIe ceiling); and ``by_bytes``, the store's
rule (`replay.sampler.gathers_on_device`: the GPU kernel from ``DEVICE_GATHER_MIN_BYTES`` bytes a batch
on). `choice_target` is the closing table's row: the rule's speed over the faster path's in each case
(never slower: >= 0.9 allowing for noise), and the crossover the two sizes' times give (a line
``fixed + bytes / rate`` a path through each pair of points).

Imported by ``gpu_check.py`` (run as a script).

References
----------
Wang et al., GEAR (ICML 2023): trajectories collected into GPU batches from shared host memory.
"""

from __future__ import annotations

import time

import click
import numpy as np
import torch


def _replay_spec(obs: tuple[int, ...]):
    from replay import TrajectorySpec

    dtype = "uint8" if len(obs) > 1 else "float32"
    return TrajectorySpec({"obs": (obs, dtype), "action": ((), "int64"), "reward": ((), "float32"),
                           "done": ((), "bool")})


def _replay_store(spec, steps: int, shards: int, selector, seed: int, fill: int, open_last: bool):
    """A store of ``steps`` steps filled with ``fill`` steps of episodes of random lengths in [1, 300]
    (deterministic in ``seed``); shared memory when /dev/shm has room, else host memory."""
    from graphrl.memory import MemoryBudgetError, MemoryManager
    from replay import ReplayStore

    mm = MemoryManager()
    try:
        store = ReplayStore(spec, steps, shards, selector=selector, memory=mm, seed=seed, timeout=60.0)
        tier = "shared"
    except MemoryBudgetError:
        store = ReplayStore(spec, steps, shards, selector=selector, memory=mm, seed=seed, timeout=60.0,
                            tier="host")
        tier = "host"
    rng = np.random.default_rng(seed)
    writers = [store.writer() for _ in range(shards)]
    done = 0
    i = 0
    while done < fill:
        n = int(min(rng.integers(1, 301), fill - done))
        ep = {}
        for name, f in spec.items():
            if f.dtype == np.uint8:
                ep[name] = rng.integers(0, 256, (n, *f.shape), dtype=np.uint8)
            elif f.dtype == np.bool_:
                ep[name] = rng.random(n) < 0.5
            elif f.dtype == np.int64:
                ep[name] = rng.integers(-(2**40), 2**40, n)
            else:
                ep[name] = rng.standard_normal((n, *f.shape)).astype(f.dtype)
        w = writers[i % shards]
        w.extend(ep)
        done += n
        i += 1
        if open_last and fill - done < 300 * shards:
            w.flush()  # the last episodes stay open: windows stop at the write cursor
        else:
            w.end_episode()
    return store, mm, tier


def check_replay_equal(steps: int, shards: int, batches: int, seed: int) -> dict:
    """GPU batches against CPU batches (then copied) of an identical store, byte for byte."""
    from replay import Prioritized, Uniform

    spec = _replay_spec((3, 8, 8))
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the simulator's device memory is the CPU
    out = {"steps": steps, "shards": shards, "cases": 0, "equal": 0}
    for selector in (Uniform(), Prioritized(0.6)):
        made = [_replay_store(spec, steps, shards, selector, seed, int(steps * 2.5), True) for _ in range(2)]
        (cpu, mm_c, _), (gpu, mm_g, tier) = made
        for i in range(batches):
            b, length, pad = (64, 16, "tail") if i % 2 == 0 else (33, 50, "head")
            with cpu.sample(b, window=length, pad=pad, beta=0.4) as host:
                want = host.to(dev)
                got = gpu.sample(b, window=length, pad=pad, beta=0.4, device="cuda")
                same = all(torch.equal(want[n].view(torch.uint8), got[n].view(torch.uint8)) for n in spec)
                same &= all(torch.equal(getattr(want, a).cpu(), getattr(got, a).cpu())
                            for a in ("mask", "keys", "probabilities", "weights", "lengths"))
                same &= bool(got["obs"].device.type == dev)
                got.release()
                want.release()
            out["cases"] += 1
            out["equal"] += int(same)
        out["tier"] = tier
        for store, mm in ((cpu, mm_c), (gpu, mm_g)):
            store.close()
            mm.close()
    out["ok"] = out["equal"] == out["cases"]
    click.echo(f"  replay correctness: {out['equal']}/{out['cases']} GPU batches equal to the CPU ones",
               err=True)
    return out


def time_replay(obs: tuple[int, ...], steps: int, batch: int, window: int, repeats: int, seed: int,
                deadline: float) -> list[dict]:
    """windows/s and GB/s: GPU gather, CPU gather + copy, and a pinned-to-device copy of the same bytes."""
    from replay import Uniform

    spec = _replay_spec(obs)
    store, mm, tier = _replay_store(spec, steps, 1, Uniform(), seed, steps, False)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    step_bytes = sum(f.row_bytes for f in spec.values())
    label = f"replay obs {'x'.join(map(str, obs))} {spec['obs'].dtype.name} B{batch} L{window}"

    from replay.sampler import DEVICE_GATHER_MIN_BYTES

    def gpu() -> int:
        store.device_gather_min_bytes = 0  # the GPU kernel, whatever the size
        with store.sample(batch, window=window, device="cuda") as b:
            sync()
            return int(b.lengths.sum())

    def auto() -> int:
        store.device_gather_min_bytes = DEVICE_GATHER_MIN_BYTES  # the rule: by bytes per batch
        with store.sample(batch, window=window, device="cuda") as b:
            sync()
            return int(b.lengths.sum())

    def cpu_then_copy() -> int:
        with store.sample(batch, window=window) as h:
            d = h.to(dev)
            sync()
            d.release()
            return int(h.lengths.sum())

    rows = []
    results = {}
    paths = (("gpu_gather", gpu), ("cpu_gather_then_copy", cpu_then_copy), ("by_bytes", auto))
    for i, (name, fn) in enumerate(paths):
        fn()
        fn()  # warm-up: the kernel's JIT, the rings' registration, the staging pools
        real = 0
        start = time.perf_counter()
        ends = start + max(deadline - start, 0.0) / (len(paths) - i)  # an equal share of the time left
        done = 0
        for _ in range(repeats):
            real += fn()
            done += 1
            if time.perf_counter() > ends:
                break
        dt = time.perf_counter() - start
        results[name] = {"windows_per_s": batch * done / dt,
                         "GBps": batch * window * step_bytes * done / dt / 1e9,
                         "real_step_share": real / (batch * window * done), "batches": done}
    nbytes = batch * window * step_bytes
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst.copy_(src, non_blocking=True)
    sync()
    start = time.perf_counter()
    n = max(1, min(repeats, 50))
    for _ in range(n):
        dst.copy_(src, non_blocking=True)
    sync()
    ceiling = nbytes * n / (time.perf_counter() - start) / 1e9
    base = results["cpu_gather_then_copy"]
    for name, r in results.items():
        rows.append({"case": f"{label} {name} ({tier} rings)", "metric": "windows_per_s",
                     "ours": r["windows_per_s"], "baseline": "cpu_gather_then_copy",
                     "baseline_value": base["windows_per_s"],
                     "ratio": r["windows_per_s"] / base["windows_per_s"], "GBps": r["GBps"],
                     "copy_ceiling_GBps": ceiling, "share_of_ceiling": r["GBps"] / ceiling,
                     "real_step_share": r["real_step_share"], "batches": r["batches"],
                     "batch_bytes": nbytes, "device_gather_min_bytes": DEVICE_GATHER_MIN_BYTES,
                     "path": name, "batches_per_s": r["windows_per_s"] / batch})
        click.echo(f"  {label} {name}: {r['windows_per_s']:,.0f} windows/s, {r['GBps']:.2f} GB/s "
                   f"(pinned->device copy {ceiling:.2f} GB/s)", err=True)
    store.close()
    mm.close()
    return rows


def choice_target(rows: list[dict]) -> dict | None:
    """The closing table's row for the GPU-or-CPU choice (see the module docstring); None without rows."""
    cases: dict[int, dict[str, dict]] = {}  # batch bytes -> path -> row
    for r in rows:
        if r.get("metric") == "windows_per_s" and "batch_bytes" in r:
            cases.setdefault(r["batch_bytes"], {})[r["path"]] = r
    paths = ("gpu_gather", "cpu_gather_then_copy", "by_bytes")
    full = {nb: by for nb, by in cases.items() if set(paths) <= set(by)}
    if not full:
        return None
    worst = min(by["by_bytes"]["ours"] / max(by[p]["ours"] for p in paths[:2]) for by in full.values())
    crossover = "n/a"
    if len(full) >= 2:  # seconds a batch = fixed + bytes * slope, a line for each path through two sizes
        (x1, r1), (x2, r2) = sorted(full.items())[:2]
        line = {}
        for p in paths[:2]:
            t1, t2 = (r[p]["batches_per_s"] ** -1 for r in (r1, r2))
            slope = (t2 - t1) / (x2 - x1)
            line[p] = (t1 - slope * x1, slope)
        (fg, sg), (fc, sc) = line["gpu_gather"], line["cpu_gather_then_copy"]
        if sc > sg:
            crossover = f"{(fg - fc) / (sc - sg):.3g} B"
    setting = next(iter(full.values()))["by_bytes"]["device_gather_min_bytes"]
    return {"figure": "part 4 replay: sample(device='cuda') by bytes a batch, share of the faster path",
            "target": ">= 0.9 (never slower)",
            "value": f"{worst:.2f} (crossover of the fit {crossover}; set {setting} B)",
            "met": worst >= 0.9}


def replay_part(result: dict, check_steps: int, check_batches: int, steps: int, batch: int, window: int,
                repeats: int, seed: int, seconds: float) -> bool:
    """Part 4 into ``result`` (``replay_correctness`` and rows); True when every GPU batch was equal."""
    t0 = time.perf_counter()
    result["replay_correctness"] = check_replay_equal(check_steps, 3, check_batches, seed)
    per_case = max((seconds - (time.perf_counter() - t0)) / 2, 5.0)
    for obs in ((3, 64, 64), (4,)):
        deadline = time.perf_counter() + per_case
        result["rows"] += time_replay(obs, steps, batch, window, repeats, seed, deadline)
    return result["replay_correctness"]["ok"]


def print_replay(result: dict) -> None:
    click.echo(f"\n{'case':<72} {'windows/s':>10} {'GB/s':>7} {'ratio':>6} {'of copy':>8}")
    for row in result["rows"]:
        if row["metric"] == "windows_per_s":
            click.echo(f"{row['case']:<72} {row['ours']:>10,.0f} {row['GBps']:>7.2f} {row['ratio']:>6.2f} "
                       f"{row['share_of_ceiling']:>8.0%}")
    rc = result.get("replay_correctness")
    if rc is not None:
        click.echo(f"replay: {rc['equal']}/{rc['cases']} GPU batches byte-equal to CPU batches")

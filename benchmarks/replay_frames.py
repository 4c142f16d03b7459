"""Stacked Atari frames: the store (each 84x84 frame stored once, stacks assembled at sample time) vs cpprb.

DQN-family learners see the last four 84x84 grey frames. cpprb stores them once with
``stack_compress="obs"`` and ``next_of="obs"`` (its memory-saving mode, the baseline here); the store keeps
one frame a step and assembles stacks as windows: ``sample(B, 5, pad="head")`` gives frames ``t-3 .. t+1``
of each drawn anchor ``t+1``, so ``obs = batch["obs"][:, :4]`` and ``next_obs = batch["obs"][:, 1:]`` are
views (docs/architecture.md#windows; a window that starts an episode is zero-padded and masked where DQN
wrappers repeat the first frame). The same episodes (random lengths in [64, 512] steps, each with the frame
after its last step) go into both, and both hold the same n transitions of an episode of n steps: cpprb
n (s, s') pairs, the store n + 1 steps, the last one the final frame with zero action, reward and done (what
``end_episode(final={"obs": frame})`` stores, `replay.writer.final_step`). ``--steps`` transitions fill both.

Cases (``ratio`` = ours / cpprb, higher is better):

- insert: transitions/s of a second fill, whole episodes (ours ``writer.add_episode`` of the n + 1 steps,
  the same store contents as ``extend`` + ``end_episode(final=...)`` in one copy; cpprb ``add`` of the
  stacks + ``on_episode_end``);
- sample B (32 and 256): (s, s') stacks/s, and the CPU time per call of this process (``cpu_ratio`` = cpprb's
  / ours; other processes' load moves it far less than wall time). ``sample(32, 5)`` of frames is a short
  window batch of 1.1 MB: one compiled draw-and-copy call under the locks (`replay.window_kernel`);
  B=256 (9 MB) takes the lock-free window path. A window anchored at an episode's first step holds no
  transition (``mask[:, 3]`` False, 1 in n + 1: ``ours_valid_fraction``); cpprb's draws all hold one;
- memory per transition and per million transitions: ours the bytes of the store's regions (rings, step
  index, records, control; staging excluded; n + 1 steps an episode), cpprb the resident growth of a fill
  (RSS; ours is given that way too).

The machine is shared: the JSON records the 1-minute load average before and after; every time is the
best of ``--repeats`` runs, ours and cpprb interleaved. Run ``python benchmarks/replay_frames.py --help``;
results go to ``benchmarks/results/replay_frames.json``.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

# run as a script, this file's folder comes first on sys.path, and benchmarks/replay.py would shadow
# the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import click  # noqa: E402
import numpy as np  # noqa: E402

from graphrl.memory import MemoryManager  # noqa: E402
from replay import ReplayStore, TrajectorySpec, Uniform  # noqa: E402
from replay.writer import final_step  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))
from _report import best_interleaved_cpu, cpu_fields, machine, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "replay_frames.json"
FRAME = (84, 84)
STACK = 4
SPEC = TrajectorySpec(
    {"obs": (FRAME, "uint8"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "bool")}
)


def rss() -> int:
    """Resident bytes of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_episodes(steps: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Episodes of random frames (lengths n in [64, 512]) totalling ``steps`` transitions: ``"obs"`` holds
    n + 1 frames (the last one after the last step), the other fields n."""
    rng = np.random.default_rng(seed)
    out, total = [], 0
    while total < steps:
        n = int(min(rng.integers(64, 513), steps - total))
        done = np.zeros(n, dtype=bool)
        done[-1] = True
        out.append({
            "obs": rng.integers(0, 256, (n + 1, *FRAME), dtype=np.uint8),
            "action": rng.integers(0, 18, n).astype(np.int64),
            "reward": rng.standard_normal(n).astype(np.float32),
            "done": done,
        })
        total += n
    return out


def stacks(frames: np.ndarray) -> np.ndarray:
    """uint8 [n + 1, 84, 84, 4]: the stack ending at each of the n + 1 frames (the first repeated at the
    start), cpprb's channel-last layout; stack i + 1 is step i's next observation."""
    padded = np.concatenate([np.repeat(frames[:1], STACK - 1, 0), frames])
    view = np.lib.stride_tricks.sliding_window_view(padded, STACK, axis=0)  # [n + 1, 84, 84, 4]
    return np.ascontiguousarray(view)


def with_final(ep: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The n + 1 steps the store keeps of an episode: its n steps and `final_step` of its last frame."""
    n = len(ep["action"])
    last = final_step(SPEC, {"obs": ep["obs"][n]}, True)
    return {k: np.ascontiguousarray(np.concatenate([ep[k][:n], last[k][None]])) for k in SPEC}


def fill_ours(
    episodes: list[dict], capacity: int, mm: MemoryManager, tier: str
) -> tuple[ReplayStore, float, int]:
    """A store of ``capacity`` transitions (and the episodes' final steps) filled twice; the second fill's
    seconds and the RSS growth of allocation plus first fill."""
    steps = [with_final(ep) for ep in episodes]
    before = rss()
    store = ReplayStore(
        SPEC, capacity + len(episodes), 1, selector=Uniform(), memory=mm, seed=0, timeout=60, tier=tier
    )
    w = store.writer()
    for ep in steps:
        w.add_episode(ep)
    grown = rss() - before
    start = time.perf_counter()
    for ep in steps:
        w.add_episode(ep)
    seconds = time.perf_counter() - start
    w.close()
    return store, seconds, grown


def fill_cpprb(episodes: list[dict], capacity: int) -> tuple[object, float, int]:
    """cpprb with ``stack_compress`` and ``next_of``, filled twice (as `fill_ours`)."""
    import cpprb

    env = {"obs": {"shape": (*FRAME, STACK), "dtype": np.uint8}, "act": {"dtype": np.int64}, "rew": {},
           "done": {}}
    added = []
    for ep in episodes:
        st = stacks(ep["obs"])
        added.append({"obs": st[:-1], "next_obs": st[1:], "act": ep["action"], "rew": ep["reward"],
                      "done": ep["done"].astype(np.float32)})
    before = rss()
    rb = cpprb.ReplayBuffer(capacity, env, next_of="obs", stack_compress="obs")
    for a in added:
        rb.add(**a)
        rb.on_episode_end()
    grown = rss() - before
    start = time.perf_counter()
    for a in added:
        rb.add(**a)
        rb.on_episode_end()
    return rb, time.perf_counter() - start, grown


@click.command()
@click.option("--steps", default=20_000, show_default=True, help="Capacity (transitions) of both buffers.")
@click.option("--iters", default=20, show_default=True)
@click.option("--repeats", default=5, show_default=True)
@click.option("--tier", default="shared", show_default=True, type=click.Choice(["shared", "host"]))
@click.option("--output", default=str(RESULTS), show_default=True)
def main(steps: int, iters: int, repeats: int, tier: str, output: str) -> None:
    """Stacked 84x84 frames: insert, sample and memory of the store vs cpprb's stack_compress/next_of."""
    try:
        import cpprb  # noqa: F401
    except ImportError:
        raise click.ClickException("cpprb is not installed (pip install cpprb)") from None
    load_before = os.getloadavg()[0]
    episodes = make_episodes(steps)
    rows = []
    with MemoryManager() as mm:
        gc.collect()
        rb, t_cp, mem_cp = fill_cpprb(episodes, steps)
        gc.collect()
        store, t_ours, mem_ours = fill_ours(episodes, steps, mm, tier)
        rows.append({"case": f"84x84x{STACK} insert episodes ({tier})", "metric": "transitions_per_s",
                     "ours": steps / t_ours, "baseline": "cpprb add (stack_compress, next_of)",
                     "baseline_value": steps / t_cp, "ratio": t_cp / t_ours})
        for b in (32, 256):
            def ours(b: int = b) -> None:
                batch = store.sample(b, STACK + 1, pad="head")
                obs, next_obs = batch["obs"][:, :STACK], batch["obs"][:, 1:]  # views: (s, s') stacks
                assert obs.shape[1] == next_obs.shape[1] == STACK
                batch.release()

            (t_o, t_c), (c_o, c_c) = best_interleaved_cpu([ours, lambda b=b: rb.sample(b)], iters, repeats)
            valid = 0
            for _ in range(iters):
                with store.sample(b, STACK + 1, pad="head") as batch:
                    valid += int(batch.mask[:, STACK - 1].sum())
            rows.append({"case": f"84x84x{STACK} sample B={b} (s, s') stacks ({tier})",
                         "metric": "samples_per_s",
                         "ours": b / t_o, "baseline": "cpprb sample (stack_compress, next_of)",
                         "baseline_value": b / t_c, "ratio": t_c / t_o,
                         "us_per_call": t_o * 1e6, "baseline_us_per_call": t_c * 1e6,
                         "ours_valid_fraction": valid / (b * iters),
                         **cpu_fields([c_o, c_c])})
        held = sum(r.nbytes for r in mm.regions() if r.owner.startswith(("replay.shard", "replay.control")))
        rows.append({"case": f"84x84x{STACK} bytes per transition ({tier})", "metric": "bytes_per_transition",
                     "ours": held / steps, "baseline": "cpprb stack_compress+next_of (RSS growth)",
                     "baseline_value": mem_cp / steps, "ratio": mem_cp / held,
                     "ours_gb_per_million_transitions": held / steps * 1e6 / 1e9,
                     "baseline_gb_per_million_transitions": mem_cp / steps * 1e6 / 1e9,
                     "ours_rss_bytes_per_transition": mem_ours / steps,
                     "ours_steps_stored": len(store), "transitions": steps, "episodes": len(episodes)})
        store.close()
    load = (load_before, os.getloadavg()[0])
    click.echo(f"{'case':<52} {'metric':<14} {'ours':>10} {'cpprb':>10} {'ratio':>6} "
               f"{'CPU us ours/cpprb':>18} {'CPU ratio':>9}")
    for r in rows:
        cpu = f"{r['cpu_us']:.0f}/{r['baseline_cpu_us']:.0f}" if "cpu_ratio" in r else ""
        cpu_ratio = f"{r['cpu_ratio']:.2f}" if "cpu_ratio" in r else ""
        click.echo(f"{r['case']:<52} {r['metric']:<14} {r['ours']:>10.4g} {r['baseline_value']:>10.4g} "
                   f"{r['ratio']:>6.2f} {cpu:>18} {cpu_ratio:>9}")
    click.echo(f"1-min load average {load[0]:.2f} before, {load[1]:.2f} after, on {os.cpu_count()} CPUs")
    info = machine(cpprb=getattr(sys.modules["cpprb"], "__version__", "installed"), load_average_1min=load)
    write_result("replay_frames", rows, info, output)


if __name__ == "__main__":
    main()

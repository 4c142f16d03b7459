"""The Ray-backed replay store with a compressed frame field against the same Ray store raw.

Atari-like steps (an 84x84 uint8 frame, an int64 action, a float32 reward, a bool done) are written as
episodes (``writer.add_episode``) into two one-shard `replay.distributed.RayReplayStore`s of the same
capacity, one with the frame raw and one with ``FieldSpec(codec=...)``; the learner (this process)
samples both. Frames come from the Arcade Learning Environment when ``ale-py`` imports (put one on
``PYTHONPATH``; `replay_codecs.ale_frames`), else from `replay_codecs.synthetic_frames`; the JSON
says which (``frames``). A compressed field travels compressed (the shard puts the chunks its windows
read; this process decompresses them, `replay.distributed.chunk_transport`).

Rows, ``sample B,L``: batches a second of ``sample(B, window=L)``, compressed over raw, single calls
alternating between the two stores, the fastest of each (`_report.best_interleaved`); each row also
gives the bytes the shard put per batch (``put_bytes``, ``raw_put_bytes``) and the median seconds of
the shard's call (``shard_s``) and of this process's copy and decode (``copy_s``), both stores.

``python benchmarks/distributed_compressed.py --help``; results go to
``benchmarks/results/distributed_compressed.json``.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

# run as a script, this file's folder comes first on sys.path and benchmarks/replay.py would shadow the
# package
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import click  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402

from replay import TrajectorySpec  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402

sys.path.append(str(HERE))
from _report import best_interleaved, machine, write_result  # noqa: E402
from replay_codecs import ale_frames, synthetic_frames  # noqa: E402

RESULTS = HERE / "results" / "distributed_compressed.json"
CASES = ((32, 1), (256, 1), (32, 4), (32, 16))


def spec(codec: str | None, chunk: int | None) -> TrajectorySpec:
    frame = ((84, 84), "uint8") if codec is None else ((84, 84), "uint8", codec, 2.0, chunk)
    return TrajectorySpec({"obs": frame, "action": ((), "int64"), "reward": ((), "float32"),
                           "done": ((), "bool")})


def fill(store: RayReplayStore, frames: np.ndarray, episode: int) -> None:
    """Write ``frames`` as episodes of ``episode`` steps (``add_episode``), then wait for the shards."""
    with store.writer(chunk_steps=episode) as w:
        for s in range(0, len(frames), episode):
            n = len(frames[s : s + episode])
            w.add_episode({"obs": frames[s : s + episode], "action": np.arange(n, dtype=np.int64) % 4,
                           "reward": np.ones(n, np.float32), "done": np.arange(n) == n - 1})


def profile(store: RayReplayStore, b: int, length: int, calls: int) -> dict[str, float]:
    """Median `RayReplayStore.last_profile` figures over ``calls`` samples."""
    seen: dict[str, list[float]] = {}
    for _ in range(calls):
        store.sample(b, window=length).release()
        for k, v in store.last_profile.items():
            seen.setdefault(k, []).append(v)
    return {k: float(np.median(v)) for k, v in seen.items()}


@click.command()
@click.option("--frames", "n_frames", default=6000, show_default=True, help="Frames (steps) written.")
@click.option("--game", default="ms_pacman", show_default=True, help="ALE game (when ale-py imports).")
@click.option("--codec", default="lz4", type=click.Choice(["lz4", "zstd"]), show_default=True)
@click.option("--chunk", default=None, type=int, help="Steps per compressed chunk (FieldSpec.chunk).")
@click.option("--capacity", default=4096, show_default=True, help="Steps of each store (one shard).")
@click.option("--episode", default=400, show_default=True, help="Steps per episode.")
@click.option("--repeats", default=30, show_default=True, help="Timed calls per case and store.")
@click.option("--synthetic", is_flag=True, help="Use the generated frames even when ale-py imports.")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(n_frames: int, game: str, codec: str, chunk: int | None, capacity: int, episode: int, repeats: int,
         synthetic: bool, output: str) -> None:
    """Sampling speed and bytes put of a compressed frame field against raw, on the Ray store."""
    load_before = os.getloadavg()[0]
    frames = None if synthetic else ale_frames(n_frames, game, 0)
    source = f"ale-py {game}" if frames is not None else "synthetic"
    if frames is None:
        frames = synthetic_frames(n_frames, 0)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    rows = []
    try:
        raw = RayReplayStore(spec(None, None), capacity, 1, seed=0, timeout=30.0)
        packed = RayReplayStore(spec(codec, chunk), capacity, 1, seed=0, timeout=30.0)
        for store in (raw, packed):
            fill(store, frames, episode)
        for b, length in CASES:
            fns = [lambda st=st, b=b, n=length: st.sample(b, window=n).release() for st in (raw, packed)]
            t_raw, t_packed = best_interleaved(fns, 1, repeats)
            p_raw, p_packed = (profile(st, b, length, 10) for st in (raw, packed))
            rows.append({
                "case": f"sample B={b} L={length}", "metric": "batches_per_s", "ours": 1 / t_packed,
                "baseline": "raw Ray store", "baseline_value": 1 / t_raw, "ratio": t_raw / t_packed,
                "put_bytes": p_packed.get("shard_put_bytes"), "raw_put_bytes": p_raw.get("shard_put_bytes"),
                "shard_s": p_packed["shard_sample_s"], "raw_shard_s": p_raw["shard_sample_s"],
                "copy_s": p_packed["copy_s"], "raw_copy_s": p_raw["copy_s"],
            })
        raw.close()
        packed.close()
    finally:
        ray.shutdown()
    info = machine(load_before=load_before)
    click.echo(f"frames: {source}, {len(frames)} of 84x84; capacity {capacity}, {codec}, chunk {chunk}")
    click.echo(f"{'case':<20} {'ours/s':>8} {'raw/s':>8} {'ratio':>6} {'put KB':>8} {'raw KB':>8} "
               f"{'shard ms':>9} {'raw':>6} {'copy ms':>8} {'raw':>6}")
    for r in rows:
        kb = [None if v is None else v / 1024 for v in (r["put_bytes"], r["raw_put_bytes"])]
        click.echo(f"{r['case']:<20} {r['ours']:>8.1f} {r['baseline_value']:>8.1f} {r['ratio']:>6.2f} "
                   + " ".join("       -" if v is None else f"{v:>8.1f}" for v in kb)
                   + f" {r['shard_s'] * 1e3:>9.2f} {r['raw_shard_s'] * 1e3:>6.2f} {r['copy_s'] * 1e3:>8.2f}"
                   f" {r['raw_copy_s'] * 1e3:>6.2f}")
    click.echo(f"1-min load average {load_before:.2f} before, {info['load_average_1min']:.2f} after")
    write_result("distributed_compressed", rows, info, output, frames=source, codec=codec, chunk=chunk,
                 capacity=capacity)


if __name__ == "__main__":
    main()

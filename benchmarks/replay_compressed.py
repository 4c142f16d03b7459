"""A replay store with a compressed frame field against the same store raw: steps held and sampling speed.

Atari-like steps (an 84x84 uint8 frame, an int64 action, a float32 reward, a bool done) are written as
episodes into two `replay.ReplayStore`s, one with the frame raw and one with ``FieldSpec(codec=...)``.
Frames come from the Arcade Learning Environment (``ale-py`` with its ROMs, random actions, frame skip
4, area-downsampled to 84x84: `replay_codecs.ale_frames`) when it imports, else from
`replay_codecs.synthetic_frames`; the JSON says which (``frames``). To use an ale-py outside the venv,
put it on ``PYTHONPATH``.

Rows:

- ``steps_held``: steps the compressed store holds in the bytes of the raw store's rings. The compressed
  store is made with ``--times`` x the raw capacity and ``arena_ratio = --times`` (its frame arenas
  take the raw frame rings' bytes), filled past wrap-around; ``ours`` is the measured raw bytes a step
  over compressed bytes a step (live chunks, the raw tail, the chunk table), ``baseline_value`` 1.
- ``sample B,L``: batches a second, ``sample(B, window=L)``, compressed over raw (the same frames,
  capacity and seed), the raw store run in the same process as the baseline, single calls alternating
  between the two, the fastest of each (`rates`); ``cpu_ratio`` the same from this process's CPU time
  (which other processes' load moves far less than wall time), ``cpu_ratio_median`` from the median
  calls' CPU time (the typical call, where the fastest is the one least disturbed).
- ``insert episodes``: steps a second written as whole episodes; ``cpu_ratio`` from CPU time.

``--threads`` runs the whole benchmark under `graphrl.threads.limit` (both stores' batch copies of raw fields
split large batches over that many threads; a codec field decodes on the calling thread); the default is the
thread policy's count. The JSON records the count (``threads``).

``--lz4-level`` sets `replay.chunk_encode.LZ4_LEVEL` and ``LZ4DICT_LEVEL`` for the run (0: LZ4's fast mode;
-1, lz4dict only: the aligned parse, `replay.aligned_lz4`, its default), to compare levels; the JSON records
both (``lz4_level``, ``lz4dict_level``).

``python benchmarks/replay_compressed.py --help``; results go to
``benchmarks/results/replay_compressed.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# run as a script, this file's folder comes first on sys.path, and benchmarks/replay.py would shadow
# the package
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import click  # noqa: E402
import numpy as np  # noqa: E402

import replay.chunk_encode  # noqa: E402
from graphrl.memory import MemoryManager  # noqa: E402
from graphrl.threads import limit, team_size  # noqa: E402
from replay import ReplayStore, TrajectorySpec  # noqa: E402

sys.path.append(str(HERE))
from _report import interleaved_cpu, machine, write_result  # noqa: E402
from replay_codecs import ale_frames, synthetic_frames  # noqa: E402

RESULTS = HERE / "results" / "replay_compressed.json"


def spec(codec: str | None, ratio: float, chunk: int | None = None) -> TrajectorySpec:
    frame = ((84, 84), "uint8") if codec is None else ((84, 84), "uint8", codec, ratio, chunk)
    return TrajectorySpec({"obs": frame, "action": ((), "int64"), "reward": ((), "float32"),
                           "done": ((), "bool")})


def fill(store: ReplayStore, frames: np.ndarray, episode: int) -> tuple[float, float]:
    """Write ``frames`` as episodes of ``episode`` steps; return the wall and CPU seconds it took."""
    t0, c0 = time.perf_counter(), time.process_time()
    with store.writer(chunk_steps=episode) as w:
        for s in range(0, len(frames), episode):
            obs = frames[s : s + episode]
            n = len(obs)
            w.add_episode({"obs": np.ascontiguousarray(obs), "action": np.arange(n, dtype=np.int64) % 4,
                           "reward": np.ones(n, np.float32), "done": np.arange(n) == n - 1})
    return time.perf_counter() - t0, time.process_time() - c0


def held_bytes(store: ReplayStore) -> int:
    """Bytes the live frames of a compressed store take: live chunks, tails, chunk tables."""
    total = 0
    for sh in store.storage.shards:
        ring = sh.chunks["obs"]
        with sh:
            st = ring.state()
        total += st["blob"].size + ring.tail.nbytes + ring.table.nbytes
    return total


def rates(raw: ReplayStore, packed: ReplayStore, b: int, length: int,
          seconds: float) -> tuple[float, float, float, float, float]:
    """``sample(b, window=length)`` calls a second (each batch released) of ``raw`` and ``packed``: one
    over the fastest single call, the calls alternating between the two stores for about ``seconds``
    (`_report.interleaved_cpu`; on a loaded machine the fastest call is the one no other process
    interrupted, the same for both stores); then the same from CPU seconds; last the ratio packed / raw
    of the median calls' CPU rates."""
    fns = [lambda st=st: st.sample(b, window=length).release() for st in (raw, packed)]
    t0 = time.perf_counter()
    for fn in fns * 3:
        fn()
    pair = (time.perf_counter() - t0) / 3
    wall, cpu = interleaved_cpu(fns, 1, max(20, int(seconds / pair)))
    (t_raw, t_packed), (c_raw, c_packed) = (min(ts) for ts in wall), (min(ts) for ts in cpu)
    return 1 / t_raw, 1 / t_packed, 1 / c_raw, 1 / c_packed, float(np.median(cpu[0]) / np.median(cpu[1]))


@click.command()
@click.option("--frames", "n_frames", default=6000, show_default=True, help="Frames (steps) written.")
@click.option("--game", default="ms_pacman", show_default=True, help="ALE game (when ale-py imports).")
@click.option("--codec", default="lz4", type=click.Choice(["lz4", "zstd", "lz4dict"]), show_default=True)
@click.option("--chunk", default=None, type=int, help="Steps per compressed chunk (FieldSpec.chunk).")
@click.option("--capacity", default=1024, show_default=True, help="Raw store's steps (one shard).")
@click.option("--times", default=3.0, show_default=True, help="Compressed store's capacity / raw capacity.")
@click.option("--episode", default=400, show_default=True, help="Steps per episode.")
@click.option("--seconds", default=1.0, show_default=True, help="Seconds per sampling case and store.")
@click.option("--synthetic", is_flag=True, help="Use the generated frames even when ale-py imports.")
@click.option("--lz4-level", default=None, type=int,
              help="LZ4 HC level (0: fast mode; -1, lz4dict: the aligned parse); default the store's.")
@click.option("--threads", default=None, type=click.IntRange(1),
              help="Threads a batch copy or decode may use (default: the thread policy's).")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(n_frames: int, game: str, codec: str, chunk: int | None, capacity: int, times: float, episode: int,
         seconds: float, synthetic: bool, lz4_level: int | None, threads: int | None, output: str) -> None:
    """Steps held in the same bytes and sampling speed of a compressed frame field against raw."""
    if threads is None:
        run(n_frames, game, codec, chunk, capacity, times, episode, seconds, synthetic, lz4_level, output)
        return
    with limit(threads):
        run(n_frames, game, codec, chunk, capacity, times, episode, seconds, synthetic, lz4_level, output)


def run(n_frames: int, game: str, codec: str, chunk: int | None, capacity: int, times: float, episode: int,
        seconds: float, synthetic: bool, lz4_level: int | None, output: str) -> None:
    """`main` under the thread count in force."""
    load_before = __import__("os").getloadavg()[0]
    if lz4_level is not None:
        replay.chunk_encode.LZ4_LEVEL = replay.chunk_encode.LZ4DICT_LEVEL = lz4_level
    frames = None if synthetic else ale_frames(n_frames, game, 0)
    source = f"ale-py {game}" if frames is not None else "synthetic"
    if frames is None:
        frames = synthetic_frames(n_frames, 0)
    big = int(capacity * times)
    rows = []
    with MemoryManager() as mm:
        raw = ReplayStore(spec(None, 1.0), capacity, 1, memory=mm, seed=0, timeout=5.0)
        packed = ReplayStore(spec(codec, times, chunk), big, 1, memory=mm, seed=0, timeout=5.0)
        for store in (raw, packed):  # warm up (compiled paths, first touch of the rings)
            fill(store, frames[:episode], episode)
        (t_raw, c_raw), (t_packed, c_packed) = fill(raw, frames, episode), fill(packed, frames, episode)
        frame_ring = capacity * 84 * 84
        per_step = held_bytes(packed) / len(packed)
        arena = packed.storage.shards[0].chunks["obs"].arena_bytes
        rows.append({"case": f"steps held ({codec}, chunk {packed.storage.shards[0].chunks['obs'].chunk})",
                     "metric": "raw_bytes_per_compressed_byte", "ours": 84 * 84 / per_step,
                     "baseline": "raw ring", "baseline_value": 1.0, "ratio": 84 * 84 / per_step,
                     "held_steps": len(packed), "raw_steps": len(raw), "arena_bytes": arena,
                     "raw_frame_ring_bytes": frame_ring})
        rows.append({"case": "insert episodes", "metric": "steps_per_s", "ours": len(frames) / t_packed,
                     "baseline": "raw", "baseline_value": len(frames) / t_raw, "ratio": t_raw / t_packed,
                     "cpu_ratio": c_raw / c_packed})
        for b, length in ((32, 1), (256, 1), (32, 4), (32, 16), (32, 64)):
            r_raw, r_packed, cr_raw, cr_packed, median = rates(raw, packed, b, length, seconds)
            rows.append({"case": f"sample B={b} L={length}", "metric": "batches_per_s", "ours": r_packed,
                         "baseline": "raw", "baseline_value": r_raw, "ratio": r_packed / r_raw,
                         "cpu_ratio": cr_packed / cr_raw, "cpu_ratio_median": median})
        packed_chunk = packed.storage.shards[0].chunks["obs"].chunk
        raw.close()
        packed.close()
    info = machine(load_before=load_before)
    click.echo(f"frames: {source}, {len(frames)} of 84x84; raw capacity {capacity}, compressed {big} "
               f"({codec}, chunks of {packed_chunk}); threads {team_size()}")
    click.echo(f"{'case':<34} {'metric':<30} {'ours':>10} {'raw':>10} {'ratio':>7} {'cpu':>6} {'cpu med':>7}")
    for r in rows:
        cpu = f"{r['cpu_ratio']:.2f}" if "cpu_ratio" in r else "-"
        med = f"{r['cpu_ratio_median']:.2f}" if "cpu_ratio_median" in r else "-"
        click.echo(f"{r['case']:<34} {r['metric']:<30} {r['ours']:>10.1f} {r['baseline_value']:>10.1f} "
                   f"{r['ratio']:>7.2f} {cpu:>6} {med:>7}")
    click.echo(f"1-min load average {load_before:.2f} before, {info['load_average_1min']:.2f} after")
    write_result("replay_compressed", rows, info, output, frames=source, codec=codec, capacity=capacity,
                 times=times, chunk=packed_chunk, threads=team_size(),
                 lz4_level=replay.chunk_encode.LZ4_LEVEL, lz4dict_level=replay.chunk_encode.LZ4DICT_LEVEL)


if __name__ == "__main__":
    main()

"""Soak: actors, learners, checkpoints and killed actors on one replay store for half an hour (issue 32).

What runs (defaults; every interval is an option, ``python benchmarks/soak.py --help``):

- the owner (this process) makes a `replay.ReplayStore` (prioritized, 2 shards) sized so that nothing
  is evicted (or of ``--capacity`` steps: it fills, then evicts its oldest steps), checkpoints it every
  minute into a temporary folder (default retention) and samples, every 10 s, each process's RSS and
  private (anonymous) memory (psutil), the graphrl segments in ``/dev/shm`` (count and bytes) and the
  counts;
- 4 actor processes (spawned; ``ReplayStore.attach`` + ``store.writer()``) write episodes of 10..200
  steps at ``--rate`` steps/s each. Every step is known: obs float32[8] = (actor, episode, step, five
  values of a formula), action int64 and reward float32 likewise, and episode ``e`` of actor ``a`` has
  the length `length_of` ``(a, e)``. Each actor reports in a shared int64 array the steps whose
  ``end_episode()`` returned and, while a commit is in flight, that episode's length;
- 2 learner processes (``store.learner()``) sample windows (32 x 8), check each window's content and
  update priorities;
- every 5 minutes one actor is SIGKILLed (the oldest) and a fresh one, with a new actor id, replaces it.

The run's clock starts once the first actors and the learners have started (spawned, imported, attached).

At the end everything stops cleanly and the script checks, prints and writes
``benchmarks/results/soak.json`` (CONVENTIONS.md format, plus ``checks`` and the time ``series``):

- committed against stored: per actor, the steps in the store equal the steps it reported committed
  (a killed actor: that, or that plus the episode whose commit was in flight when it died), and
  ``len(store)`` equals the store's insert counter with no deletes (nothing evicted). With ``--capacity``
  (evicting): inserts equal the steps committed (plus in-flight episodes of killed actors that landed),
  ``len(store)`` equals inserts - deletes and the scanned steps, and each actor's stored episodes are
  distinct, none newer than it reported and, for an actor alive at the end, its newest one is there;
- episodes intact: a scan of every stored episode; each is closed, whole (episodes are committed in one
  chunk at ``end_episode``, so a killed actor's open episode was never visible: the store guarantees an
  uncommitted chunk stays private and a commit killed half way becomes a hole no reader sees), its steps
  consecutive and equal to the generator's, and each actor's episodes are 0..n-1, each once (evicting: the
  oldest record of each shard may have lost its first steps to eviction, and older episodes are gone);
- RSS and private-memory slope per process (MiB/min, least squares over the samples after the run's first
  minute and the process's own first minute, or a quarter of the run for runs under 4 minutes) and, once
  the store has evicted (``--capacity``), the steady-state slope over the samples after it was first full;
  the owner's glibc heap (``mallinfo2``: bytes in use and arena size) is sampled with it, to tell a leak
  (in use grows) from allocator fragmentation (arena grows, in use flat);
- graphrl segments in ``/dev/shm`` owned by our processes after exit (must be 0; a killed actor's would
  be reclaimed by ``graphrl gc`` semantics, `graphrl.memory.owners.reclaim`, and counted).

The exit status is 1 when a check fails.
"""

from __future__ import annotations

import ctypes
import itertools
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

# run as a script, this file's folder comes first on sys.path and benchmarks/replay.py would shadow the
# package (the editable install's finder comes after sys.path): import the packages, then _report
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import click  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402

from graphrl.memory import MemoryManager  # noqa: E402
from graphrl.memory.owners import PREFIX, parse_name, reclaim  # noqa: E402
from replay import Prioritized, ReplayStore, TrajectorySpec  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))
from _report import machine, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "soak.json"
SPEC = TrajectorySpec({"obs": ((8,), "float32"), "action": ((), "int64"), "reward": ((), "float32")})
MIN_LEN, MAX_LEN = 10, 200
SEED = 32
COMMITTED, IN_FLIGHT, EPISODES = 0, 1, 2  # an actor's slots in the shared report array
BATCH, WINDOW = 32, 8


# ----------------------------------------------------------------------------------------- the generator
def length_of(actor: int, episode: int) -> int:
    """Length of episode ``episode`` of actor ``actor``: 10..200, fixed by the seed."""
    return int(np.random.default_rng([SEED, actor, episode]).integers(MIN_LEN, MAX_LEN + 1))


def expected(actor: np.ndarray, episode: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
    """The content of steps (actor, episode, t), any shape; every value is an exact float32 integer."""
    a, e, t = (np.asarray(x, dtype=np.int64) for x in (actor, episode, t))
    rest = (a[..., None] * 7919 + e[..., None] * 104729 + t[..., None] * 31 + np.arange(5)) % 65536
    obs = np.concatenate([a[..., None], e[..., None], t[..., None], rest], axis=-1).astype(np.float32)
    return {
        "obs": obs,
        "action": a * 10**12 + e * 1000 + t,
        "reward": (((a * 131 + e * 17 + t) % 1024) / 4.0).astype(np.float32),
    }


def episode_steps(actor: int, episode: int) -> dict[str, np.ndarray]:
    n = length_of(actor, episode)
    return expected(np.full(n, actor), np.full(n, episode), np.arange(n))


# ---------------------------------------------------------------------------------------------- processes
def rest(stop, seconds: float) -> None:
    """Sleep up to ``seconds``, waking early when ``stop`` (a shared int) is set. Not a multiprocessing Event:
    an actor SIGKILLed inside ``Event.wait`` holds the Event's lock for good and every other waiter hangs."""
    end = time.monotonic() + seconds
    while not stop.value and (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def actor_process(handle, actor: int, report, rate: float, stop, ready) -> None:
    """Write episodes at ``rate`` steps/s until ``stop``; report committed steps in ``report[3*actor:]``."""
    store = ReplayStore.attach(handle)
    writer = store.writer()
    ready[actor] = 1
    base = 3 * actor
    start, written, episode = time.monotonic(), 0, 0
    while not stop.value:
        cols = episode_steps(actor, episode)
        n = len(cols["action"])
        writer.extend(cols)
        report[base + IN_FLIGHT] = n  # a kill from here on may or may not leave this episode stored
        writer.end_episode()
        report[base + COMMITTED] += n  # one aligned int64 store: the owner reads old or new, never half
        report[base + EPISODES] = episode + 1
        report[base + IN_FLIGHT] = 0
        episode += 1
        written += n
        rest(stop, start + written / rate - time.monotonic())
    writer.close()
    store.close()


def check_windows(batch) -> int:
    """How many of a batch's windows are not consecutive steps of one episode with the generator's content."""
    mask = batch.mask.numpy()
    obs = batch["obs"].numpy()
    a, e, t = (obs[..., i].astype(np.int64) for i in range(3))
    want = expected(a, e, t)
    same = (obs == want["obs"]).all(-1) & (batch["action"].numpy() == want["action"])
    same &= batch["reward"].numpy() == want["reward"]
    bad = 0
    for b in range(mask.shape[0]):
        m = mask[b]
        ok = m.any() and same[b][m].all()
        ok = ok and (a[b][m] == a[b][m][0]).all() and (e[b][m] == e[b][m][0]).all()
        ok = ok and np.array_equal(t[b][m], np.arange(t[b][m][0], t[b][m][0] + m.sum()))
        bad += not ok
    return bad


def learner_process(learner, index: int, report, stop, interval: float, ready) -> None:
    """Sample, check and reprioritise windows until ``stop``; report batches and bad windows."""
    rng = np.random.default_rng([SEED, 1000 + index])
    ready[len(ready) - 1 - index] = 1
    while not stop.value:
        try:
            batch = learner.sample(BATCH, window=WINDOW, timeout=5.0)
        except TimeoutError:
            continue
        bad = check_windows(batch)
        learner.update_priorities(batch.keys, rng.random(BATCH) + 0.01)
        batch.release()
        report[2 * index] += 1
        report[2 * index + 1] += bad
        rest(stop, interval)
    learner.close()


# ------------------------------------------------------------------------------------------------ samples
def shm_segments(pids: set[int] | None = None) -> tuple[int, int]:
    """(count, allocated bytes) of graphrl's segments in /dev/shm, of ``pids``' processes or all."""
    count = size = 0
    with os.scandir("/dev/shm") as entries:
        for entry in entries:
            if not entry.name.startswith(PREFIX):
                continue
            owner = parse_name(entry.name)
            if pids is not None and (owner is None or owner.pid not in pids):
                continue
            try:
                size += entry.stat(follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                continue
            count += 1
    return count, size


def memory_mib(pid: int) -> tuple[float, float] | None:
    """(RSS, private anonymous) MiB of a process, None when it is gone."""
    try:
        info = psutil.Process(pid).memory_info()
    except psutil.Error:
        return None
    return info.rss / 2**20, (info.rss - info.shared) / 2**20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                     "usmblks", "fsmblks", "uordblks", "fordblks",
                                                     "keepcost")]


def heap_mib() -> tuple[float, float] | None:
    """This process's glibc heap: (MiB in use, MiB the allocator holds), from ``mallinfo2``; None without it.

    In use = ``uordblks + hblkhd`` (allocated chunks and mmapped blocks); held = ``arena + hblkhd`` (the
    main and thread arenas' size and mmapped blocks). A leak grows the first; fragmentation the second alone.
    """
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):  # not glibc >= 2.33
        return None
    fn.restype = _Mallinfo2
    m = fn()
    return (m.uordblks + m.hblkhd) / 2**20, (m.arena + m.hblkhd) / 2**20


def slope(points: list[tuple[float, float]], after: float) -> float | None:
    """Least-squares MiB per minute of (seconds, MiB) points at or after ``after``; None under 3 points."""
    pts = np.array([p for p in points if p[0] >= after], dtype=np.float64)
    if len(pts) < 3 or np.ptp(pts[:, 0]) == 0:
        return None
    return float(np.polyfit(pts[:, 0] / 60.0, pts[:, 1], 1)[0])


# ---------------------------------------------------------------------------------------------- the check
def scan(store, report, actors: int, killed: set[int], evicting: bool = False) -> dict:
    """Every stored episode against the generator and the actors' reports (see the module docstring).

    ``evicting``: the store has deleted steps, so the oldest record of each shard may be an episode's tail
    and an actor's older episodes may be gone; the per-actor step counts are then not compared.
    """
    seen: dict[int, list[int]] = {a: [] for a in range(actors)}
    stored = np.zeros(actors, dtype=np.int64)
    broken: list[str] = []
    episodes = store.episodes()
    clipped = 0
    for i, ep in enumerate(episodes):
        obs = ep.data["obs"]
        a, e, t0 = int(obs[0, 0]), int(obs[0, 1]), int(obs[0, 2])
        if ep.open or ep.continuation or not 0 <= a < actors:
            broken.append(f"shard {ep.shard}: actor {a} episode {e} open={ep.open} cont={ep.continuation}")
            continue
        oldest = i == 0 or episodes[i - 1].shard != ep.shard  # episodes() lists each shard oldest first
        if t0 and not (evicting and oldest):
            broken.append(f"actor {a} episode {e}: starts at step {t0}, not the oldest record of its shard")
            continue
        want = {k: v[t0:] for k, v in episode_steps(a, e).items()}
        if ep.length != len(want["action"]) or not all(np.array_equal(ep.data[k], want[k]) for k in SPEC):
            broken.append(f"actor {a} episode {e}: {ep.length} steps differ from the generator's")
            continue
        clipped += t0 > 0
        seen[a].append(e)
        stored[a] += ep.length
    per_actor, unaccounted = [], 0
    for a in range(actors):
        eps = sorted(seen[a])
        committed, in_flight = int(report[3 * a + COMMITTED]), int(report[3 * a + IN_FLIGHT])
        reported = int(report[3 * a + EPISODES])
        if not evicting and eps != list(range(len(eps))):
            broken.append(f"actor {a}: episodes not 0..n-1 exactly once ({len(eps)} stored)")
        newest = reported + (a in killed and in_flight > 0)  # episodes that may be stored: 0..newest-1
        if evicting and (len(set(eps)) != len(eps) or (eps and eps[-1] >= newest)
                         or (a not in killed and reported and reported - 1 not in eps)):
            broken.append(f"actor {a}: episodes repeated, newer than reported, or its newest missing")
        if evicting:
            ok = a in killed or in_flight == 0
        else:
            allowed = {committed, committed + in_flight} if a in killed else {committed}
            ok = int(stored[a]) in allowed and (a in killed or in_flight == 0)
            unaccounted += 0 if ok else abs(int(stored[a]) - committed)
        per_actor.append({"actor": a, "killed": a in killed, "committed": committed, "in_flight": in_flight,
                          "in_flight_stored": bool(in_flight and reported in eps),
                          "stored": int(stored[a]), "episodes": len(eps), "ok": bool(ok)})
    return {"episodes_scanned": len(episodes), "broken": broken[:20], "broken_count": len(broken),
            "per_actor": per_actor, "unaccounted_steps": unaccounted, "clipped_by_eviction": clipped,
            "stored_steps_scanned": int(stored.sum())}


def inserts_accounted(inserts: int, per_actor: list[dict]) -> tuple[bool, int]:
    """Whether ``inserts`` is the committed steps plus some of the killed actors' in-flight episodes (those
    found stored, and any subset of those not found, which eviction may have removed); and the in-flight
    steps that sum needs (-1 when none fits)."""
    committed = sum(r["committed"] for r in per_actor)
    found = sum(r["in_flight"] for r in per_actor if r["in_flight_stored"])
    unknown = [r["in_flight"] for r in per_actor
               if r["killed"] and r["in_flight"] and not r["in_flight_stored"]]
    for k in range(len(unknown) + 1):
        for subset in itertools.combinations(unknown, k):
            if committed + found + sum(subset) == inserts:
                return True, found + sum(subset)
    return False, -1


# ------------------------------------------------------------------------------------------------ the run
@click.command()
@click.option("--minutes", default=30.0, show_default=True, help="How long the actors write.")
@click.option("--actors", default=4, show_default=True)
@click.option("--learners", default=2, show_default=True)
@click.option("--rate", default=500.0, show_default=True, help="Steps/s each actor writes (a ceiling).")
@click.option("--checkpoint-every", default=60.0, show_default=True, help="Seconds.")
@click.option("--kill-every", default=300.0, show_default=True, help="Seconds between SIGKILLs of an actor.")
@click.option("--sample-every", default=10.0, show_default=True, help="Seconds between samples.")
@click.option("--learner-interval", default=0.02, show_default=True, help="Seconds a learner rests a batch.")
@click.option("--capacity", default=0, show_default=True, type=click.IntRange(min=0),
              help="Store capacity in steps; 0: sized so nothing is evicted. A small one fills early and "
                   "then evicts, so the memory slopes after it is full are steady state.")
@click.option("--malloc-trim", is_flag=True, default=False,
              help="Diagnostic: the owner calls glibc's malloc_trim(0) after each checkpoint and records the "
                   "private memory it returned.")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(minutes: float, actors: int, learners: int, rate: float, checkpoint_every: float, kill_every: float,
         sample_every: float, learner_interval: float, capacity: int, malloc_trim: bool, output: str) -> None:
    seconds = minutes * 60.0
    max_actors = actors + int(seconds // kill_every) + 1
    if capacity and capacity < 8 * MAX_LEN * 2:
        raise click.BadParameter(f"must be 0 or at least {16 * MAX_LEN} steps (8 longest episodes a shard), "
                                 f"got {capacity}", param_hint="--capacity")
    capacity = capacity or int(actors * rate * seconds * 1.25) + 64 * MAX_LEN * max_actors
    ctx = mp.get_context("spawn")
    report = ctx.RawArray("q", 3 * max_actors)
    learned = ctx.RawArray("q", 2 * learners)
    # one flag per process, set once it is spawned, imported and attached (no lock: an actor may be
    # SIGKILLed); the run's clock starts once the first actors and the learners are all ready
    ready = ctx.RawArray("b", max_actors + learners)
    stop_actors, stop_learners = ctx.RawValue("i", 0), ctx.RawValue("i", 0)
    ckpt_root = tempfile.mkdtemp(prefix="graphrl-soak-")
    load_before = os.getloadavg()[0]
    command = "python benchmarks/soak.py " + " ".join(sys.argv[1:])
    click.echo(f"soak: {minutes} min, {actors} actors at {rate:g} steps/s, {learners} learners, "
               f"capacity {capacity:,} steps, checkpoints in {ckpt_root}")

    mm = MemoryManager()
    store = ReplayStore(SPEC, capacity_steps=capacity, num_shards=2, selector=Prioritized(0.6), memory=mm,
                        seed=SEED)
    handle, learner = store.handle(), store.learner()
    pids, killed, live = {os.getpid()}, set(), {}  # live: actor id -> process
    labels = {os.getpid(): "owner"}

    def start_actor(aid: int) -> None:
        p = ctx.Process(target=actor_process, args=(handle, aid, report, rate, stop_actors, ready),
                        daemon=True)
        p.start()
        live[aid] = p
        pids.add(p.pid)
        labels[p.pid] = f"actor{aid}"

    lprocs = []
    for i in range(learners):
        p = ctx.Process(target=learner_process, daemon=True,
                        args=(learner, i, learned, stop_learners, learner_interval, ready))
        p.start()
        lprocs.append(p)
        pids.add(p.pid)
        labels[p.pid] = f"learner{i}"
    next_aid = 0
    for _ in range(actors):
        start_actor(next_aid)
        next_aid += 1

    series, memory, heap, checkpoints, kills = [], {}, [], [], []
    full_at = None  # run time of the first sample after the store first evicted
    c0 = time.monotonic()  # on a busy machine spawning and importing take a while: not part of the run
    while sum(ready) < actors + learners and time.monotonic() - c0 < 600:
        if any(not q.is_alive() for q in [*lprocs, *live.values()]):
            raise click.ClickException("an actor or learner process exited before it was ready")
        time.sleep(0.1)
    click.echo(f"{sum(ready)} processes ready after {time.monotonic() - c0:.1f} s")
    t0 = time.monotonic()
    next_sample, next_ckpt, next_kill = 0.0, checkpoint_every, kill_every
    while (now := time.monotonic() - t0) < seconds:
        if now >= next_kill:
            aid = min(live)  # the oldest actor
            victim = live.pop(aid)
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(30)
            killed.add(aid)
            kills.append({"t_s": round(now, 1), "actor": aid, "pid": victim.pid,
                          "committed_at_kill": int(report[3 * aid + COMMITTED])})
            start_actor(next_aid)
            click.echo(f"[{now:7.1f} s] SIGKILL actor {aid} (pid {victim.pid}), started actor {next_aid}")
            next_aid += 1
            next_kill += kill_every
        if now >= next_ckpt:
            c0 = time.monotonic()
            folder = store.checkpoint(ckpt_root)
            checkpoints.append({"t_s": round(now, 1), "seconds": round(time.monotonic() - c0, 3),
                                "folder": Path(folder).name})
            if malloc_trim:  # diagnostic: how much of the owner's private memory is free heap glibc holds
                before = memory_mib(os.getpid())[1]
                ctypes.CDLL(None).malloc_trim(0)
                checkpoints[-1]["trim_released_mib"] = round(before - memory_mib(os.getpid())[1], 2)
            next_ckpt += checkpoint_every
        if now >= next_sample:
            seg, seg_bytes = shm_segments()
            ours, ours_bytes = shm_segments(pids)
            # stored first: a commit counts its inserts before it lets its shard go, and len() reads each
            # shard under its lock, so the steps read then are all counted in the inserts read after
            stored = len(store)
            counters = store.counters()
            if full_at is None and counters["deletes"]:
                full_at = now
            point = {"t_s": round(now, 1), "committed": int(sum(report[3 * a] for a in range(next_aid))),
                     "stored": stored, **counters,
                     "batches": int(sum(learned[0::2])), "shm_segments": seg, "shm_bytes": seg_bytes,
                     "shm_segments_ours": ours, "shm_bytes_ours": ours_bytes,
                     "checkpoints": len(checkpoints), "kills": len(kills), "rss_mib": {}, "private_mib": {}}
            for p in [psutil.Process()] + [q for q in psutil.Process().children() if q.pid in labels]:
                mem = memory_mib(p.pid)
                if mem is not None:
                    label = labels[p.pid]
                    point["rss_mib"][label], point["private_mib"][label] = round(mem[0], 1), round(mem[1], 1)
                    memory.setdefault(label, []).append((now, mem[0], mem[1]))
            if (h := heap_mib()) is not None:
                point["owner_heap_in_use_mib"], point["owner_heap_held_mib"] = round(h[0], 2), round(h[1], 2)
                heap.append((now, *h))
            series.append(point)
            click.echo(f"[{now:7.1f} s] committed {point['committed']:>10,}  stored {point['stored']:>10,}  "
                       f"batches {point['batches']:>7,}  shm {ours} segments {ours_bytes / 2**20:8.1f} MiB  "
                       f"owner RSS {point['rss_mib'].get('owner', 0):7.1f} MiB")
            next_sample += sample_every
        time.sleep(min(0.5, max(0.01, min(next_sample, next_ckpt, next_kill) - now)))
    elapsed = time.monotonic() - t0

    # stop cleanly: the actors finish their episode and close; then the learners; then the owner
    click.echo(f"[{elapsed:7.1f} s] stopping the actors, then the learners")
    stop_actors.value = 1
    clean_exit = True
    for p in live.values():
        p.join(120)
        clean_exit &= p.exitcode == 0
    stop_learners.value = 1
    for p in lprocs:
        p.join(120)
        clean_exit &= p.exitcode == 0
    final = {"stored": len(store), **store.counters()}
    click.echo(f"[{time.monotonic() - t0:7.1f} s] stopped; scanning {final['stored']:,} stored steps")
    c0 = time.monotonic()
    evicting = final["deletes"] > 0
    result = scan(store, report, next_aid, killed, evicting)
    scan_s = time.monotonic() - c0
    committed = sum(r["committed"] for r in result["per_actor"])
    if evicting:
        inserts_ok, in_flight_stored = inserts_accounted(final["inserts"], result["per_actor"])
    else:
        in_flight_stored = sum(r["stored"] - r["committed"] for r in result["per_actor"] if r["ok"])
    learner.close()
    store.close()
    mm.close()
    shutil.rmtree(ckpt_root, ignore_errors=True)
    left_before_gc = shm_segments(pids)
    reclaimed = [r.name for r in reclaim()] if left_before_gc[0] else []  # `graphrl gc` semantics
    left = shm_segments(pids)

    warm = min(60.0, seconds / 4)  # after the run's first minute and the process's own (spawn, imports)
    slopes = {label: {"rss_mib_per_min": slope([(t, r) for t, r, _ in pts], max(warm, pts[0][0] + warm)),
                      "private_mib_per_min": slope([(t, p) for t, _, p in pts], max(warm, pts[0][0] + warm)),
                      "rss_mib_last": round(pts[-1][1], 1), "samples": len(pts)}
              for label, pts in memory.items()}
    def steady_slopes(begin: float) -> dict:
        out = {}
        for label, pts in memory.items():
            start = max(begin, pts[0][0] + warm)
            out[label] = {"rss_mib_per_min": slope([(t, r) for t, r, _ in pts], start),
                          "private_mib_per_min": slope([(t, p) for t, _, p in pts], start),
                          "samples": sum(t >= start for t, _, _ in pts)}
        if heap:
            out["owner_heap"] = {"in_use_mib_per_min": slope([(t, u) for t, u, _ in heap], begin),
                                 "held_mib_per_min": slope([(t, h) for t, _, h in heap], begin),
                                 "samples": sum(t >= begin for t, _, _ in heap)}
        return out

    # Steady state: from the first checkpoint of the full store on. Until the store is full, pages of its
    # rings and tables are first touched; until a checkpoint of the full store, the owner's allocator has
    # not yet served a checkpoint's largest temporaries (they grow with the stored steps).
    steady, steady_from, steady_from_full, steady_late = {}, None, {}, {}
    if full_at is not None:
        steady_from = next((c["t_s"] for c in checkpoints if c["t_s"] >= full_at), full_at)
        steady, steady_from_full = steady_slopes(steady_from), steady_slopes(full_at)
        steady_late = steady_slopes((steady_from + elapsed) / 2)  # its second half: settling, or growing?
    checks = {
        "committed_steps": committed,
        "stored_steps": final["stored"],
        "in_flight_steps_found_stored": in_flight_stored,
        "committed_accounted": (inserts_ok and final["stored"] == result["stored_steps_scanned"]
                                == final["inserts"] - final["deletes"]) if evicting else
        (result["unaccounted_steps"] == 0
         and final["stored"] == result["stored_steps_scanned"] == committed + in_flight_stored
         and final["inserts"] == final["stored"] and final["deletes"] == 0),
        "evicting": evicting,
        "inserts": final["inserts"],
        "deletes": final["deletes"],
        "store_full_at_s": None if full_at is None else round(full_at, 1),
        "steady_from_s": steady_from,
        "episodes_clipped_by_eviction": result["clipped_by_eviction"],
        "episodes_scanned": result["episodes_scanned"],
        "episodes_intact": result["broken_count"] == 0,
        "broken": result["broken"],
        "bad_windows": int(sum(learned[1::2])),
        "batches": int(sum(learned[0::2])),
        "clean_exit": bool(clean_exit),
        "shm_segments_left": left[0],
        "shm_bytes_left": left[1],
        "shm_segments_left_before_gc": left_before_gc[0],
        "reclaimed_by_gc": reclaimed,
        "per_actor": result["per_actor"],
    }
    ok = (checks["committed_accounted"] and checks["episodes_intact"] and checks["bad_windows"] == 0
          and clean_exit and left[0] == 0 and left_before_gc[0] == 0)
    checks["ok"] = bool(ok)

    case = f"{minutes:g} min, {actors} actors x {rate:g} steps/s, {learners} learners"
    rows = [{"case": case, "metric": m, "ours": v, "baseline": None, "baseline_value": None, "ratio": None}
            for m, v in [("steps_committed", committed), ("steps_stored", final["stored"]),
                         ("episodes_intact", result["episodes_scanned"] if checks["episodes_intact"] else 0),
                         ("bad_windows", checks["bad_windows"]), ("batches_sampled", checks["batches"]),
                         ("checkpoints", len(checkpoints)), ("actors_killed", len(kills)),
                         ("shm_segments_left", left[0])]]
    for label, s in sorted(slopes.items()):
        rows.append({"case": f"{case}: {label}", "metric": "rss_mib_per_min", "ours": s["rss_mib_per_min"],
                     "private_mib_per_min": s["private_mib_per_min"], "baseline": None,
                     "baseline_value": None, "ratio": None})
    for label, s in sorted(steady.items()):
        if label != "owner_heap":
            rows.append({"case": f"{case}: {label}, store full", "metric": "steady_rss_mib_per_min",
                         "ours": s["rss_mib_per_min"], "private_mib_per_min": s["private_mib_per_min"],
                         "baseline": None, "baseline_value": None, "ratio": None})
    config = {"minutes": minutes, "actors": actors, "learners": learners, "rate": rate, "evicting": evicting,
              "malloc_trim": malloc_trim, "malloc_env": {k: v for k, v in os.environ.items()
                                                         if k.startswith(("MALLOC_", "GLIBC_TUNABLES"))},
              "checkpoint_every_s": checkpoint_every, "kill_every_s": kill_every,
              "sample_every_s": sample_every,
              "capacity_steps": capacity, "batch": BATCH, "window": WINDOW, "command": command,
              "elapsed_s": round(elapsed, 1), "scan_s": round(scan_s, 2),
              "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
              "load_average_1min_before": load_before}

    click.echo(f"\n{'metric':<40} {'value':>16}")
    longest = max([c["seconds"] for c in checkpoints] or [0.0])
    for m, v in [("steps committed (reported)", committed),
                 ("  + in flight at a kill, stored", in_flight_stored),
                 ("steps in the store", final["stored"]),
                 ("store inserts / deletes", f"{final['inserts']:,} / {final['deletes']:,}"),
                 ("store first full at (s)", "-" if full_at is None else f"{full_at:.0f}"),
                 ("episodes scanned", result["episodes_scanned"]),
                 ("episodes broken", result["broken_count"]),
                 ("batches sampled / bad windows", f"{checks['batches']:,} / {checks['bad_windows']}"),
                 ("checkpoints (longest s)", f"{len(checkpoints)} ({longest:.2f})"),
                 ("actors killed", len(kills)), ("shm segments left (ours)", left[0])]:
        click.echo(f"{m:<40} {v:>16,}" if isinstance(v, int) else f"{m:<40} {v:>16}")
    click.echo(f"\n{'process':<12} {'samples':>8} {'RSS MiB':>9} {'RSS MiB/min':>12} {'private MiB/min':>16}")

    def fmt(x):
        return "-" if x is None else f"{x:+.3f}"
    for label, s in sorted(slopes.items()):
        click.echo(f"{label:<12} {s['samples']:>8} {s['rss_mib_last']:>9.1f} {fmt(s['rss_mib_per_min']):>12} "
                   f"{fmt(s['private_mib_per_min']):>16}")
    if steady:
        click.echo(f"\nsteady state (samples from the first checkpoint of the full store, {steady_from:.0f} "
                   f"s; full at {full_at:.0f} s; the owner's private slope from full "
                   f"{fmt(steady_from_full['owner']['private_mib_per_min'])} MiB/min, over the second half "
                   f"{fmt(steady_late['owner']['private_mib_per_min'])} MiB/min):")
        click.echo(f"{'process':<12} {'samples':>8} {'RSS MiB/min':>12} {'private MiB/min':>16}")
        for label, s in sorted(steady.items()):
            if label == "owner_heap":
                click.echo(f"{'owner heap':<12} {s['samples']:>8} in use "
                           f"{fmt(s['in_use_mib_per_min'])} MiB/min, held {fmt(s['held_mib_per_min'])} "
                           "MiB/min (glibc mallinfo2)")
            else:
                click.echo(f"{label:<12} {s['samples']:>8} {fmt(s['rss_mib_per_min']):>12} "
                           f"{fmt(s['private_mib_per_min']):>16}")
    click.echo(f"\n{'PASS' if ok else 'FAIL'}; 1-min load {load_before:.2f} before, "
               f"{os.getloadavg()[0]:.2f} after, {os.cpu_count()} CPUs")
    write_result("soak", rows, machine(), output, config=config, checks=checks, slopes=slopes, steady=steady,
                 steady_from_full=steady_from_full, steady_second_half=steady_late,
                 kills=kills, checkpoints=checkpoints, series=series)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Actor processes writing through shared memory: many writers lose nothing, rate limits block across
processes, readers never see torn windows, and a writer killed mid-commit leaves no deadlock."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from replay import Fifo, Prioritized, Queue, ReplayStore, TrajectorySpec, Uniform

SPEC = TrajectorySpec(
    {"wid": ((), "int32"), "ep": ((), "int32"), "t": ((), "int32"), "obs": ((4,), "float32")}
)
MAX_LEN = 20


def episode(wid: int, ep: int, length: int) -> dict[str, np.ndarray]:
    t = np.arange(length, dtype=np.int32)
    obs = np.stack([np.full(length, wid), np.full(length, ep), t, wid * 1_000_000 + ep * 100 + t], axis=1)
    return {
        "wid": np.full(length, wid, np.int32),
        "ep": np.full(length, ep, np.int32),
        "t": t,
        "obs": obs.astype(np.float32),
    }


def lengths(wid: int, n: int) -> np.ndarray:
    return np.random.default_rng(1000 + wid).integers(1, MAX_LEN + 1, n)


def checksum(obs: np.ndarray) -> float:
    return float(obs.astype(np.float64).sum())


def writer_process(handle, wid: int, n: int, queue) -> None:  # runs in a spawned (or forked) process
    store = ReplayStore.attach(handle)
    total, check = 0, 0.0
    with store.writer() as w:
        for ep, length in enumerate(lengths(wid, n)):
            cols = episode(wid, ep, int(length))
            if ep % 2:
                w.extend(cols)
            else:
                for i in range(int(length)):
                    w.append({k: v[i] for k, v in cols.items()})
            w.end_episode()
            total += int(length)
            check += checksum(cols["obs"])
    store.close()
    queue.put((wid, total, check))


def check_window(batch, b: int) -> None:
    """Every real step of a window belongs to one episode, in order, with the content it was written with."""
    m = batch.mask[b].numpy()
    wid, ep, t = (batch[k][b].numpy()[m] for k in ("wid", "ep", "t"))
    assert len(set(wid.tolist())) == 1 and len(set(ep.tolist())) == 1, (wid, ep)
    assert np.array_equal(t, np.arange(t[0], t[0] + len(t))), t
    assert np.array_equal(batch["obs"][b].numpy()[m], episode(int(wid[0]), int(ep[0]), MAX_LEN + 1)["obs"][t])


def run_writers(
    store, n_writers: int, n_episodes: int, method: str, sample_window: int, max_batches: int | None = None
) -> dict[int, tuple]:
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=writer_process, args=(store.handle(), wid, n_episodes, queue))
        for wid in range(n_writers)
    ]
    for p in procs:
        p.start()
    results: dict[int, tuple] = {}
    sampled = 0
    while len(results) < n_writers:  # the learner samples (and checks) while the actors write
        if max_batches is not None and sampled >= max_batches:
            wid, total, check = queue.get(timeout=300)  # enough checks: just wait for the writers
            results[wid] = (total, check)
            continue
        try:
            wid, total, check = queue.get_nowait()
            results[wid] = (total, check)
            continue
        except Exception:  # queue.Empty
            pass
        batch = store.sample(32, window=sample_window, timeout=60)
        for b in range(32):
            check_window(batch, b)
        sampled += 1
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sampled > 0
    return results


@pytest.mark.slow
def test_six_spawned_writers_600_episodes_every_step_accounted_for():
    # more writers than cores and shards, half of their episodes appended step by step
    n_writers, n_episodes = 6, 600
    expected = {w: lengths(w, n_episodes) for w in range(n_writers)}
    total = sum(int(v.sum()) for v in expected.values())
    with MemoryManager() as mm:
        store = ReplayStore(
            SPEC, capacity_steps=total + 1000, num_shards=4, selector=Uniform(), memory=mm, seed=0
        )
        results = run_writers(store, n_writers, n_episodes, "spawn", sample_window=8, max_batches=20)
        assert len(store) == total and store.counters()["inserts"] == total
        for wid in range(n_writers):
            assert results[wid][0] == int(expected[wid].sum())
        seen = {w: np.zeros(n_episodes, dtype=int) for w in range(n_writers)}
        sums = np.zeros(n_writers)
        per_shard = []
        for e in store.episodes():
            assert not e.open and not e.continuation  # every episode whole, in one shard
            wid, ep = int(e.data["wid"][0]), int(e.data["ep"][0])
            assert e.length == expected[wid][ep]
            want = episode(wid, ep, e.length)
            assert all(np.array_equal(e.data[k], want[k]) for k in SPEC)
            seen[wid][ep] += 1
            sums[wid] += checksum(e.data["obs"])
            per_shard.append(e.shard)
        assert all((s == 1).all() for s in seen.values())  # each episode exactly once
        assert np.allclose(sums, [results[w][1] for w in range(n_writers)], rtol=0, atol=0)
        loads = np.bincount(per_shard, minlength=4)
        assert loads.min() > 0.2 * loads.sum() / 4  # shards filled evenly (least-loaded assignment)
        store.close()


def test_writers_wrapping_a_small_ring_never_show_torn_windows():
    # four forked writers overwrite a 400-step store ~25 times while the learner samples and checks
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, capacity_steps=400, num_shards=2, memory=mm, seed=1)
        results = run_writers(store, 4, 250, "fork", sample_window=16)
        total = sum(r[0] for r in results.values())
        assert store.counters()["inserts"] == total and len(store) == 400
        counters = store.counters()
        assert counters["deletes"] == total - 400  # every overwritten step left the table once
        store.close()


def queue_writer(handle, n: int) -> None:
    store = ReplayStore.attach(handle)
    with store.writer(timeout=60) as w:
        for i in range(n):
            w.append({"wid": 0, "ep": i, "t": 0, "obs": np.full(4, i, np.float32)})
            w.end_episode()  # one commit per step: blocks whenever the queue is full
    store.close()


def test_queue_blocks_a_writer_process_until_the_learner_samples():
    size, n = 5, 60
    with MemoryManager() as mm:
        store = ReplayStore(
            SPEC,
            capacity_steps=20,
            num_shards=2,
            selector=Fifo(),
            rate_limiter=Queue(size),
            max_times_sampled=1,
            memory=mm,
        )
        proc = mp.get_context("fork").Process(target=queue_writer, args=(store.handle(), n))
        proc.start()
        got = []
        for _ in range(n):
            c = store.counters()
            assert c["inserts"] - c["samples"] <= size  # never more than `size` unsampled steps
            got.append(int(store.sample(1, timeout=60)["ep"][0, 0]))
        proc.join(60)
        assert proc.exitcode == 0 and got == list(range(n))  # exact FIFO order across the processes
        store.close()


def dying_writer(handle) -> None:
    import replay.shard as shard

    def copy_then_die(rings, srcs, row_bytes, capacity, first, count, *rest):
        # mid-commit, holding the shard lock after publishing reserve_pos: one field copied, then death
        rb = int(row_bytes[0])
        n = min(count, capacity - first) * rb
        rings[0][first * rb : first * rb + n] = srcs[0][:n]
        os.kill(os.getpid(), signal.SIGKILL)

    shard.write_steps = copy_then_die  # the Python commit's kernel (replay.commit_kernel), looked up per call
    store = ReplayStore.attach(handle)
    storage = store.storage  # without a writer's sources: the Python steps, which call write_steps
    storage.commit(episode(7, 7, 10), 10, None, True, None, storage.new_writer_id())


def test_a_writer_killed_mid_commit_leaves_a_hole_not_a_deadlock():
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, capacity_steps=40, num_shards=1, memory=mm, timeout=10)
        w = store.writer()
        w.extend(episode(0, 0, 5))
        w.end_episode()
        proc = mp.get_context("fork").Process(target=dying_writer, args=(store.handle(),))
        proc.start()
        proc.join(60)
        assert proc.exitcode == -signal.SIGKILL
        # the writer's compiled commit takes the dead writer's lock, repairs it and commits after the hole
        w.extend(episode(0, 1, 6))
        w.end_episode()
        shard = store.storage.shards[0]
        assert shard.meta[3] == 10  # holes
        eps = store.episodes()
        assert [(e.start, e.length) for e in eps] == [(0, 5), (15, 6)]
        batch = store.sample(200, window=4)
        for b in range(200):
            check_window(batch, b)
        assert set(batch["ep"][:, 0].tolist()) <= {0, 1} and (batch["wid"][batch.mask] == 0).all()
        store.close()


def test_spawned_attach_sees_the_same_bytes():
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, capacity_steps=100, num_shards=2, memory=mm)
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        p = ctx.Process(target=writer_process, args=(store.handle(), 3, 5, queue))
        p.start()
        wid, total, check = queue.get(timeout=120)
        p.join(60)
        assert p.exitcode == 0 and total == int(lengths(3, 5).sum()) == len(store)
        assert sum(checksum(e.data["obs"]) for e in store.episodes()) == check
        store.close()


def test_writer_and_learner_threads_with_priority_updates_stay_consistent():
    import threading

    with MemoryManager() as mm:
        store = ReplayStore(
            SPEC,
            capacity_steps=600,
            num_shards=3,
            selector=Prioritized(0.6),
            memory=mm,
            seed=2,
            chunk_steps=8,
        )
        errors: list[BaseException] = []
        done = threading.Event()

        def write(wid: int) -> None:
            try:
                with store.writer() as w:
                    for ep, length in enumerate(lengths(wid, 150)):
                        w.extend(episode(wid, ep, int(length)))
                        w.end_episode()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def learn() -> None:
            rng = np.random.default_rng(0)
            it = 0
            try:
                while not done.is_set() or it < 20:
                    it += 1
                    batch = store.sample(16, window=12, pad="head", timeout=30)
                    for b in range(16):
                        check_window(batch, b)
                    store.update_priorities(batch.keys, rng.uniform(0, 2, 16))
                    batch.release()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
        learners = [threading.Thread(target=learn) for _ in range(2)]
        for t in writers + learners:
            t.start()
        for t in writers:
            t.join(120)
        done.set()
        for t in learners:
            t.join(120)
        assert not errors, errors
        total = sum(int(lengths(w, 150).sum()) for w in range(4))
        counters = store.counters()
        assert (
            counters["inserts"] == total and counters["deletes"] == total - len(store) and len(store) == 600
        )
        store.close()

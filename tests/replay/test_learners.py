"""Many learner processes, one local store (``store.learner()``): one table, one rate limiter, stale keys
ignored, killed learners leave nothing held, late learners join, checkpoints while learners sample."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import threading

import numpy as np
import pytest
import torch
from scipy import stats

from graphrl.memory import MemoryManager
from replay import MinSize, Prioritized, ReplayStore, SampleToInsertRatio, TrajectorySpec, Uniform
from replay.keys import decode_keys, encode_keys
from replay.learner import StoreLearner
from replay.rate_limiter import RateLimiter
from replay.table import Table

SPEC = TrajectorySpec({"ep": ((), "int32"), "t": ((), "int32"), "obs": ((3,), "float32")})
FORK = mp.get_context("fork")


def episode(ep: int, length: int) -> dict[str, np.ndarray]:
    t = np.arange(length, dtype=np.int32)
    obs = np.stack([np.full(length, ep), t, ep * 1000 + t], axis=1).astype(np.float32)
    return {"ep": np.full(length, ep, np.int32), "t": t, "obs": obs}


def fill(store, lengths, first_ep: int = 0) -> None:
    with store.writer() as w:
        for i, n in enumerate(lengths):
            w.extend(episode(first_ep + i, int(n)))
            w.end_episode()


def check_windows(batch) -> None:
    """Every real step of every window is the step of one episode it was written as, in order."""
    mask = batch.mask.numpy()
    ep, t, obs = batch["ep"].numpy(), batch["t"].numpy(), batch["obs"].numpy()
    for b in range(len(mask)):
        m = mask[b]
        assert len(set(ep[b][m].tolist())) == 1
        assert np.array_equal(t[b][m], np.arange(t[b][m][0], t[b][m][0] + m.sum()))
        assert np.array_equal(obs[b][m], episode(int(ep[b][m][0]), 1000)["obs"][t[b][m]])


def items_of(store) -> list[tuple[int, int]]:
    """(shard, absolute position) of every stored step: the items of a window=1 table."""
    return [(e.shard, e.start + i) for e in store.episodes() for i in range(e.length)]


def drawn(keys) -> list[tuple[int, int]]:
    shard, anchor, _ = decode_keys(np.asarray(keys))
    return list(zip(shard.tolist(), anchor.tolist(), strict=True))


# -- child processes (forked unless named otherwise)
def drawing_learner(learner, keys, prio, barrier, batches, out) -> None:
    """Update the priorities of ``keys``, meet the other learner, then draw ``batches`` batches."""
    if keys is not None:
        out.send(learner.update_priorities(keys, prio))
    barrier.wait()
    got = []
    for _ in range(batches):
        with learner.sample(1000, window=1, timeout=30) as batch:
            got.append(batch.keys.numpy().copy())
    out.send(np.concatenate(got))
    learner.close()


def ratio_learner(learner, target_inserts, out) -> None:
    """Sample while the writer runs; once every insert is in, until the limiter refuses (timeout=0)."""
    steps = batches = 0
    while True:
        done = learner.counters()["inserts"] >= target_inserts
        try:
            batch = learner.sample(8, window=3, timeout=0 if done else 30)
        except TimeoutError:
            if done:
                break
            raise
        check_windows(batch)
        steps += int(batch.lengths.sum())
        batches += 1
        batch.release()
    out.send((steps, batches))


def sample_once(learner, out) -> None:
    with learner.sample(16, window=4, timeout=30) as batch:
        check_windows(batch)
        out.send(batch.keys.numpy().copy())


def hang_in_the_limiter(learner, conn, hold_mutex: bool) -> None:
    """Signal from inside the rate limiter's predicate (the control mutex held); then either hang there
    (``hold_mutex``: killed holding the mutex) or let the wait go on (killed inside the condition wait)."""

    def predicate(self, counts, n=1):
        conn.send("in the limiter")
        if hold_mutex:
            conn.recv()  # never answered: SIGKILL arrives here, the mutex held
        return False

    RateLimiter.can_sample = predicate  # this (forked) process only
    learner.sample(4, window=2, timeout=600)


def learner_in_flight(learner, conn) -> None:
    conn.send("sending")
    learner.sample(4, window=2, timeout=600)  # the owner holds its reply; SIGKILL arrives meanwhile


def looping_learner(learner, conn) -> None:
    """Sample 16 single steps at a time until told to stop; report the steps sampled per phase (a
    batch counts as "after" once the owner said it checkpointed)."""
    counts = {"before": 0, "after": 0}
    phase = "before"
    while True:
        with learner.sample(16, window=1, timeout=30) as batch:
            counts[phase] += int(batch.lengths.sum())
        if counts["before"] == 16 and phase == "before":
            conn.send("started")
        if phase == "after" and counts["after"] == 16:
            conn.send("drew after")
        if conn.poll():
            if conn.recv() == "stop":
                break
            phase = "after"
    conn.send(counts)


def spawned_learner(learner, keys_out) -> None:  # spawn: the learner arrives pickled
    with learner:
        batch = learner.sample(32, window=4, timeout=60)
        applied = learner.update_priorities(batch.keys, np.full(32, 2.5))
        keys_out.put((batch.keys.numpy().copy(), batch["obs"].numpy().copy(), batch.mask.numpy(), applied))


# -- tests
@pytest.mark.parametrize("prioritized", [False, True])
def test_the_union_of_two_learners_draws_is_one_tables(prioritized):
    alpha = 0.8
    with MemoryManager() as mm:
        selector = Prioritized(alpha) if prioritized else Uniform()
        store = ReplayStore(SPEC, 400, num_shards=2, selector=selector, memory=mm, seed=5)
        fill(store, [13, 11, 9, 17, 10, 20])
        items = items_of(store)
        learner = store.learner()
        barrier = FORK.Barrier(2)
        pipes, procs, updates = [], [], []
        for role in (0, 1):
            keys = prio = None
            if prioritized:  # learner 0 sets shard 0's priorities, learner 1 shard 1's
                mine = [(s, p) for s, p in items if s == role]
                prio = np.array([1.0 + p % 7 if role == 0 else 0.25 + p % 3 for _, p in mine])
                keys = encode_keys([s for s, _ in mine], [p for _, p in mine], np.zeros(len(mine)))
                updates.append((mine, prio))
            ours, theirs = FORK.Pipe()
            proc = FORK.Process(target=drawing_learner, args=(learner, keys, prio, barrier, 10, theirs))
            proc.start()
            pipes.append(ours)
            procs.append(proc)
        if prioritized:
            assert [p.recv() for p in pipes] == [len(u[0]) for u in updates]  # every update applied
        union = np.concatenate([p.recv() for p in pipes])
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
        counts = {it: 0 for it in items}
        for it in drawn(union):
            counts[it] += 1
        assert len(counts) == len(items) and len(union) == 20_000
        if prioritized:
            weight = {it: p**alpha for mine, prio in updates for it, p in zip(mine, prio, strict=True)}
        else:
            weight = {it: 1.0 for it in items}
        w = np.array([weight[it] for it in items])
        observed = np.array([counts[it] for it in items])
        assert stats.chisquare(observed, w / w.sum() * observed.sum()).pvalue > 1e-3
        assert store.counters()["samples"] == 20_000  # both learners counted in the one limiter
        store.close()


def test_samples_per_insert_is_global_under_two_learners():
    spi, min_size, buffer = 1.5, 40, 30.0
    limiter = SampleToInsertRatio(spi, min_size, buffer)
    lengths = np.random.default_rng(3).integers(5, 30, 40)
    total = int(lengths.sum())
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 4096, num_shards=3, rate_limiter=limiter, memory=mm, timeout=60)
        learner = store.learner()
        pipes, procs = [], []
        for _ in range(2):
            ours, theirs = FORK.Pipe()
            proc = FORK.Process(target=ratio_learner, args=(learner, total, theirs))
            proc.start()
            pipes.append(ours)
            procs.append(proc)
        writer = threading.Thread(target=fill, args=(store, lengths))
        writer.start()
        writer.join(120)
        results = [p.recv() for p in pipes]
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
        c = store.counters()
        sampled = sum(steps for steps, _ in results)
        assert c["inserts"] == total and c["samples"] == sampled
        # both stopped only when the limiter refused: diff - 1 < min_diff; each admitted call may
        # overshoot by its own steps (8 windows of at most 3), one call per learner
        min_diff = spi * min_size - buffer
        assert total * spi - sampled - 1 < min_diff
        assert sampled <= total * spi - min_diff + 2 * 8 * 3
        store.close()


def test_stale_keys_from_a_learner_are_ignored_after_overwrite():
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 120, num_shards=1, selector=Prioritized(1.0), memory=mm)
        fill(store, [30, 30, 30, 30])
        learner = store.learner()
        ours, theirs = FORK.Pipe()
        proc = FORK.Process(target=sample_once, args=(learner, theirs))
        proc.start()
        keys = ours.recv()
        proc.join(60)
        fill(store, [25], first_ep=10)  # overwrites the oldest 25 steps (episode 0's, and its record)
        shard, anchor, back = decode_keys(keys)
        floor = store.storage.shards[0].floor
        assert floor == 25
        expect = int(((anchor - back) >= floor).sum())
        ours, theirs = FORK.Pipe()
        proc = FORK.Process(target=update_and_report, args=(learner, keys, theirs))
        proc.start()
        assert ours.recv() == expect  # the stale ones ignored, in another learner than the one that drew
        proc.join(60)
        assert proc.exitcode == 0
        store.close()


def update_and_report(learner, keys, out) -> None:
    out.send(learner.update_priorities(keys, np.full(len(keys), 4.0)))


def test_stale_keys_some_live_some_overwritten():
    """The same with keys built to straddle the floor: exactly the live ones apply."""
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 100, num_shards=1, selector=Prioritized(1.0), memory=mm)
        fill(store, [50, 50])
        learner = store.learner()
        keys = encode_keys(np.zeros(20), np.arange(0, 100, 5), np.zeros(20))
        fill(store, [30], first_ep=5)  # the oldest 30 steps are overwritten: floor 30
        ours, theirs = FORK.Pipe()
        proc = FORK.Process(target=update_and_report, args=(learner, keys, theirs))
        proc.start()
        assert ours.recv() == 14  # anchors 30, 35, ..., 95
        proc.join(60)
        assert store.update_priorities(keys, np.ones(20)) == 14
        store.close()


def test_max_times_sampled_counts_across_learners():
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 200, num_shards=2, memory=mm, max_times_sampled=1, timeout=0)
        fill(store, [16, 16, 16, 16])  # 64 items
        learner = store.learner()
        barrier = FORK.Barrier(2)
        pipes, procs = [], []
        for _ in range(2):
            ours, theirs = FORK.Pipe()
            proc = FORK.Process(target=exhaust, args=(learner, barrier, theirs))
            proc.start()
            pipes.append(ours)
            procs.append(proc)
        got = [p.recv() for p in pipes]
        for proc in procs:
            proc.join(60)
        union = drawn(np.concatenate([keys for keys, _ in got]))
        assert sorted(union) == sorted(items_of(store)) and len(union) == 64  # each item once, overall
        assert all(refused for _, refused in got)
        assert store.stats()["live"] == 0 and store.counters()["deletes"] == 64
        store.close()


def exhaust(learner, barrier, out) -> None:
    barrier.wait()
    keys = []
    for _ in range(4):
        keys.append(learner.sample(8, timeout=30).keys.numpy().copy())
    try:  # 2 learners x 4 batches x 8 = every item once: nothing is left to draw
        barrier.wait()
        learner.sample(1, timeout=0)
        refused = False
    except TimeoutError:
        refused = True
    out.send((np.concatenate(keys), refused))


@pytest.mark.parametrize("hold_mutex", [True, False], ids=["holding-the-control-mutex", "in-the-wait"])
def test_a_learner_killed_in_the_limiter_leaves_nothing_held(hold_mutex):
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 400, num_shards=2, rate_limiter=MinSize(50), memory=mm, timeout=60)
        fill(store, [10])  # below min_size: sampling waits
        learner = store.learner()
        ours, theirs = FORK.Pipe()
        doomed = FORK.Process(target=hang_in_the_limiter, args=(learner, theirs, hold_mutex))
        doomed.start()
        assert ours.recv() == "in the limiter"
        if hold_mutex:
            os.kill(doomed.pid, signal.SIGKILL)
        else:
            with store.storage.control.cond:  # free only once the doomed learner is inside its wait
                os.kill(doomed.pid, signal.SIGKILL)
                doomed.join(60)
        doomed.join(60)
        assert doomed.exitcode == -signal.SIGKILL
        waiting_out, waiting_in = FORK.Pipe()
        waiting = FORK.Process(target=sample_once, args=(learner, waiting_in))  # waits for min_size
        waiting.start()
        fill(store, [20, 25], first_ep=1)  # the writer takes the control mutex (recovered if held)
        late_out, late_in = FORK.Pipe()
        late = FORK.Process(target=sample_once, args=(store.learner(), late_in))
        late.start()
        for conn, proc in ((waiting_out, waiting), (late_out, late)):
            assert len(conn.recv()) == 16
            proc.join(60)
            assert proc.exitcode == 0
        check_windows(store.sample(32, window=4))
        assert store.counters()["samples"] > 0
        store.close()


def test_a_learner_killed_with_a_request_in_flight(monkeypatch):
    drawn_event, resume = threading.Event(), threading.Event()
    real = Table.draw
    first = [True]

    def held_draw(self, *args):
        out = real(self, *args)
        if first[0]:
            first[0] = False
            drawn_event.set()
            resume.wait(60)
        return out

    monkeypatch.setattr(Table, "draw", held_draw)  # in this (the owner's) process: the service's draws
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 400, num_shards=2, selector=Prioritized(0.6), memory=mm, timeout=60)
        fill(store, [30, 40, 20])
        learner = store.learner()
        ours, theirs = FORK.Pipe()
        doomed = FORK.Process(target=learner_in_flight, args=(learner, theirs))
        doomed.start()
        assert ours.recv() == "sending"
        assert drawn_event.wait(60)  # the owner drew its windows and holds the reply
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.join(60)
        resume.set()  # the reply goes to a dead socket; the service drops the connection
        assert doomed.exitcode == -signal.SIGKILL
        outs = []
        for lr in (learner, store.learner()):  # the surviving handle and a new learner
            out, inp = FORK.Pipe()
            proc = FORK.Process(target=sample_once, args=(lr, inp))
            proc.start()
            outs.append((out, proc))
        for out, proc in outs:
            keys = out.recv()
            assert store.update_priorities(keys, np.ones(16)) == 16
            proc.join(60)
            assert proc.exitcode == 0
        assert store.counters()["samples"] >= 32
        store.close()


def test_a_late_spawned_learner_attaches_and_samples():
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 400, num_shards=2, selector=Prioritized(1.0), memory=mm, timeout=60)
        fill(store, [25, 35, 15])
        learner = store.learner()
        assert len(pickle.dumps(learner)) < 4096  # a handle, no step data
        first = store.sample(8, window=4)  # the owner samples before the learner joins
        check_windows(first)
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=spawned_learner, args=(learner, queue))
        proc.start()
        keys, obs, mask, applied = queue.get(timeout=120)
        proc.join(60)
        assert proc.exitcode == 0 and applied == 32
        shard, anchor, back = decode_keys(keys)
        by_key = {(e.shard, e.start + i): e.data["obs"][i] for e in store.episodes() for i in range(e.length)}
        for b in range(32):
            first_pos = anchor[b] - back[b]
            got = obs[b][mask[b]]
            want = np.stack([by_key[(int(shard[b]), int(first_pos) + j)] for j in range(len(got))])
            assert np.array_equal(got, want)
        _, mass = store.selector_mass()
        assert mass == pytest.approx(75 - len(set(drawn(keys))) + 2.5 * len(set(drawn(keys))))
        store.close()


def test_checkpoint_while_learners_sample(tmp_path):
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 600, num_shards=3, memory=mm, timeout=60)
        fill(store, [40, 50, 60, 30])
        learner = store.learner()
        pipes, procs = [], []
        for _ in range(2):
            ours, theirs = FORK.Pipe()
            proc = FORK.Process(target=looping_learner, args=(learner, theirs))
            proc.start()
            pipes.append(ours)
            procs.append(proc)
        assert [p.recv() for p in pipes] == ["started", "started"]
        folder = store.checkpoint(tmp_path / "ckpt")  # the learners keep sampling (their draws wait)
        for p in pipes:
            p.send("checkpointed")
        assert [p.recv() for p in pipes] == ["drew after", "drew after"]  # they continued
        for p in pipes:
            p.send("stop")
        counts = [p.recv() for p in pipes]
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
        restored = ReplayStore.restore(folder, memory=mm)
        ck_samples = restored.counters()["samples"]
        ck_times = times_sampled(restored)
        # window=1: every draw is one sampled step; a draw is counted once its batch is gathered, so
        # the checkpoint holds at most one batch per learner drawn but not yet counted
        assert ck_samples <= ck_times <= ck_samples + 2 * 16
        assert ck_samples >= 2 * 16  # each learner had a batch counted before the checkpoint began
        total = sum(c["before"] + c["after"] for c in counts)
        assert times_sampled(store) == store.counters()["samples"] == total  # all counted, none lost
        assert total > ck_times
        fresh = restored.learner()  # the restored store serves learners too
        out, inp = FORK.Pipe()
        proc = FORK.Process(target=sample_once, args=(fresh, inp))
        proc.start()
        assert restored.update_priorities(out.recv(), np.ones(16)) == 16
        proc.join(60)
        restored.close()
        store.close()


def times_sampled(store) -> int:
    with store.table.quiesced():
        state = store.table.state_dict()
    parts = [sh["times_sampled"] for sh in state["shards"]]
    return int(sum((np.concatenate(x) if isinstance(x, list) else np.asarray(x)).sum() for x in parts))


def test_learner_errors_and_close():
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 100, num_shards=2, selector=Prioritized(1.0), memory=mm, timeout=5)
        fill(store, [20])
        learner = store.learner()
        with pytest.raises(ValueError, match="shard 7"):
            learner.update_priorities(encode_keys([7], [0], [0]), [1.0])
        with pytest.raises(ValueError, match="NaN, infinite or negative"):
            learner.update_priorities(encode_keys([0], [0], [0]), [float("nan")])
        with pytest.raises(ValueError, match="window"):
            learner.sample(4, window=0)
        assert len(learner) == 20 and learner.stats()["live"] == 20
        (ep,) = store.episodes()
        assert learner.update_priorities(encode_keys([0, 1], [0, 0], [0, 0]), [2.0, 3.0]) == 1
        assert learner.stats()["priority_mass"] == pytest.approx(19 + (2.0, 3.0)[ep.shard])
        other = store.learner()
        store.close()
        with pytest.raises(ValueError, match="closed"):
            learner.sample(4)
        for call in (len, StoreLearner.counters, StoreLearner.stats):  # no stale count of freed regions
            with pytest.raises(ValueError, match="owner closed"):
                call(learner)
        with pytest.raises((ValueError, FileNotFoundError)):  # never attached: the regions are gone
            other.sample(4)
        with pytest.raises(ValueError, match="closed"):
            store.learner()
        learner.close()
        with pytest.raises(ValueError, match="learner is closed"):
            len(learner)


def wait_then_report(learner, conn) -> None:
    def predicate(self, counts, n=1):
        conn.send("in the limiter")
        return False

    RateLimiter.can_sample = predicate  # this (forked) process only
    try:
        learner.sample(4, timeout=600)
    except ValueError as exc:
        conn.send(str(exc))


def test_a_waiting_learner_wakes_when_the_owner_closes():
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 100, num_shards=2, rate_limiter=MinSize(50), memory=mm)
        fill(store, [10])
        ours, theirs = FORK.Pipe()
        proc = FORK.Process(target=wait_then_report, args=(store.learner(), theirs))
        proc.start()
        assert ours.recv() == "in the limiter"
        with store.storage.control.cond:  # held once the learner waits
            pass
        store.close()
        msg = ours.recv()
        while msg == "in the limiter":  # the predicate runs again as the close wakes the wait
            msg = ours.recv()
        assert "closed" in msg
        proc.join(60)
        assert proc.exitcode == 0


def test_concurrent_first_learner_calls_start_one_service():
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 100, num_shards=2, memory=mm)
        barrier, addresses = threading.Barrier(8), []

        def call() -> None:
            barrier.wait()
            addresses.append(store.learner().handle.address)

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(addresses) == 8 and len(set(addresses)) == 1  # one service, stopped by close
        store.close()
        assert not [t for t in threading.enumerate() if t.name.startswith("replay-table")]


def forked_sampler(learner, conn) -> None:
    batch = learner.sample(64, window=8)  # stages (zeroes) a fresh batch pool in this forked child
    check_windows(batch)
    conn.send(int(batch.batch_size))


def test_a_learner_forked_after_torch_ran_threads_samples():
    """A learner forked from a process whose torch OpenMP team has run: its staging pages are zeroed
    without torch's parallel regions, which wait forever in a forked child (it hung before)."""
    torch.set_num_threads(2)
    torch.zeros(1 << 24, dtype=torch.uint8).fill_(1)  # a parallel region: the parent's OpenMP team starts
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, capacity_steps=4096, num_shards=1, memory=mm, timeout=30.0)
        fill(store, [600, 700])
        parent, child = FORK.Pipe()
        proc = FORK.Process(target=forked_sampler, args=(store.learner(), child))
        proc.start()
        try:
            assert parent.poll(120), "the forked learner hung"
            assert parent.recv() == 64
        finally:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        assert proc.exitcode == 0
        store.close()


def test_a_learners_device_gather_min_bytes_is_checked_as_the_stores():
    """A bad value is refused naming the setting and leaves the one set before; pickling does not carry it."""
    from replay.sampler import DEVICE_GATHER_MIN_BYTES

    store = ReplayStore(SPEC, capacity_steps=64, seed=0)
    learner = store.learner()
    assert learner.device_gather_min_bytes == DEVICE_GATHER_MIN_BYTES
    learner.device_gather_min_bytes = 4096
    for bad in (-1, 1.5, "8", True, None):
        with pytest.raises(ValueError, match=r"device_gather_min_bytes must be an int >= 0, got "):
            learner.device_gather_min_bytes = bad
        with pytest.raises(ValueError, match=r"device_gather_min_bytes must be an int >= 0, got "):
            store.device_gather_min_bytes = bad
    assert learner.device_gather_min_bytes == 4096
    assert pickle.loads(pickle.dumps(learner)).device_gather_min_bytes == DEVICE_GATHER_MIN_BYTES
    learner.close()
    store.close()

"""Break-it cases for the fused short windows and the split copy (issue 29), as a demanding user runs them.

Writer threads and processes commit (and evict: small rings wrap all the time) while learner threads
sample fused windows (`replay.transition_kernel.sample_transitions`' ``window``) and split-copy batches of
transitions (forced on, with the real thread policy at 1 and 2 threads). Every step's fields are a known
function of (actor, episode, step), so a torn, stale, shifted or mixed row is caught; keys are held to the
positions they name across batches, probabilities and importance weights to the table, and the counters
to the sum of what was written and sampled. Then: the rate limiter (blocking, timeouts, exact counts),
``close()`` while samples run, processes killed holding the locks (in the split copy, as the owner while
sampling, mid-commit), a split copy whose draw or copy a signal's exception interrupts, bad arguments,
the TorchRL adapter over open episodes, and checkpoint/restore replaying the fused stream.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from _forked import check_in_fork

import replay.copy_helpers as ch
import replay.transition_kernel as tk
from graphrl import GPUUnavailableError
from graphrl.memory import MemoryBudgetError, MemoryManager
from graphrl.threads import limit
from replay import Prioritized, ReplayStore, TrajectorySpec, Uniform
from replay.batch import importance_weights
from replay.keys import decode_keys
from replay.shard_layout import HOLES, RESERVE_POS, WRITE_POS

W = 1000  # img bytes: ~1 KB a step, so 260 transitions are 256 KiB (the thread policy's serial limit)
SPEC = TrajectorySpec({"v": ((), "int64"), "img": ((W,), "uint8"), "r": ((), "float32"), "d": ((), "bool")})
STEP = SPEC.step_bytes


def ep_len(actor, ep):
    """1 .. 11 steps: single-step episodes, shorter and longer than every window."""
    return 1 + (actor * 7 + ep * 3) % 11


def img(v: np.ndarray) -> np.ndarray:
    return ((v[..., None] * 7 + np.arange(W)) % 251).astype(np.uint8)


def episode(actor: int, ep: int) -> dict[str, np.ndarray]:
    """Episode ``ep`` of ``actor``: v = actor 1e9 + ep 1e4 + step, every other field a function of v."""
    n = ep_len(actor, ep)
    v = actor * 10**9 + ep * 10**4 + np.arange(n, dtype=np.int64)
    return {"v": v, "img": img(v), "r": (v % 1000003).astype(np.float32), "d": np.arange(n) == n - 1}


def write(store, actor: int, episodes: range, chunk_steps: int = 16) -> int:
    with store.writer(chunk_steps=chunk_steps) as w:
        for ep in episodes:
            w.add_episode(episode(actor, ep))
    return sum(ep_len(actor, ep) for ep in episodes)


class Seen:
    """Checks batches against the written functions; ``positions`` maps (shard, position) -> v over every
    batch checked (a position is written once, so a second value is a mixed or stale row)."""

    def __init__(self) -> None:
        self.positions: dict[tuple[int, int], int] = {}
        self.steps = 0

    def check(self, batch, length: int, pad: str, whole_episodes: bool = True) -> None:
        v, mask, n = batch["v"].numpy(), batch.mask.numpy(), batch.lengths.numpy()
        b = v.shape[0]
        assert v.shape == (b, length) and ((n >= 1) & (n <= length)).all()
        shard, anchor, back = decode_keys(batch.keys.numpy())
        j = np.arange(length)
        col = np.zeros(b, np.int64) if pad == "tail" else length - n  # each row's first real column
        np.testing.assert_array_equal(mask, (j >= col[:, None]) & (j < (col + n)[:, None]))
        np.testing.assert_array_equal(back, 0 if pad == "tail" else n - 1)
        v0 = v[np.arange(b), col]
        np.testing.assert_array_equal(v, np.where(mask, v0[:, None] + j - col[:, None], 0))  # consecutive
        actor, ep, step0 = v0 // 10**9, v0 // 10**4 % 10**5, v0 % 10**4
        el = ep_len(actor, ep)
        assert (step0 + n <= el).all(), "a window runs past its episode's end"
        if pad == "tail" and whole_episodes:  # short only at the episode's end
            assert ((n == length) | (step0 + n == el)).all()
        np.testing.assert_array_equal(batch["img"].numpy(), np.where(mask[..., None], img(v), 0))
        np.testing.assert_array_equal(batch["r"].numpy(), np.where(mask, v % 1000003, 0).astype(np.float32))
        np.testing.assert_array_equal(batch["d"].numpy(), mask & (v % 10**4 == (el - 1)[:, None]))
        pos = (anchor - back)[:, None] + j - col[:, None]
        for s, p, x in zip(np.broadcast_to(shard[:, None], v.shape)[mask].tolist(), pos[mask].tolist(),
                           v[mask].tolist(), strict=True):
            assert self.positions.setdefault((s, p), x) == x, f"shard {s} position {p}: two values"
        self.steps += int(n.sum()) if length > 1 else b


def check_probabilities(batch, prioritized: bool, beta: float) -> None:
    prob, w, size = batch.probabilities.numpy(), batch.weights.numpy(), batch.table_size
    if prioritized:
        assert ((prob > 0) & (prob <= 1)).all()
        np.testing.assert_array_equal(w, importance_weights(prob, size, beta).numpy())
    else:
        np.testing.assert_allclose(prob, 1.0 / size, rtol=1e-12)
        assert (w == 1).all()


def force_split(mp_, group_rows: int = 3) -> None:
    """Every transition batch of 64 KiB and more takes the split copy, its helper allowed (an idle
    core reported); the thread count stays the policy's (`graphrl.threads.threads_for`)."""
    mp_.setattr(tk, "SPLIT_BYTES", 32 << 10)
    mp_.setattr(tk, "idle_cores", lambda cores, own=0: cores - 1)
    mp_.setattr(tk, "GROUP_BYTES", group_rows * STEP)


def spy_groups(mp_) -> dict[str, int]:
    """Count the split copy's `copy_batch` calls (the caller's; the helpers copy in compiled code)."""
    calls = {"caller": 0}
    real = tk.copy_batch

    def spy(*args):
        real(*args)
        calls["caller"] += 1

    mp_.setattr(tk, "copy_batch", spy)
    return calls


def write_until(store, actor: int, stop, pause: float = 0.0) -> int:
    """Episodes of ``actor`` until ``stop`` is set, ``pause`` seconds apart (a writer thread leaves the
    interpreter lock to the learners); returns the steps written."""
    total = 0
    with store.writer(chunk_steps=16) as w:
        for ep in range(10**5):
            if stop.is_set():
                break
            w.add_episode(episode(actor, ep))
            total += ep_len(actor, ep)
            if pause:
                time.sleep(pause)
    return total


def writer_process(handle, actor: int, stop, queue) -> None:  # forked
    store = ReplayStore.attach(handle)
    queue.put(write_until(store, actor, stop))
    store.close()


@pytest.mark.parametrize("prioritized,threads", [(False, 1), (False, 2), (True, 2)])
def test_writers_evict_while_learners_sample_fused_windows_and_split_batches(
    monkeypatch, threads, prioritized
):
    """A writer process and a writer thread wrap 3 rings of 48 slots over and over while one learner thread
    samples 40 batches of fused windows (2 .. 8 steps, both paddings) and another 12 split-copy batches of
    ~300 transitions: every row is whole and where its key says, and the counters add up exactly."""
    calls = spy_groups(monkeypatch)
    force_split(monkeypatch)
    with MemoryManager() as mm, limit(threads):
        store = ReplayStore(SPEC, 3 * 48, 3, memory=mm, seed=3, timeout=30.0, staging_slots=8,
                            selector=Prioritized(0.7) if prioritized else Uniform())
        written = write(store, 9, range(12))
        fused = []
        inner = store._sampler._sample_windows
        monkeypatch.setattr(store._sampler, "_sample_windows", lambda *a: fused.append(1) or inner(*a))
        ctx = mp.get_context("fork")
        queue, stop = ctx.Queue(), ctx.Event()
        proc = ctx.Process(target=writer_process, args=(store.handle(), 1, stop, queue))
        proc.start()
        seen, errors, totals = [Seen(), Seen()], [], []

        def learner(i: int) -> None:
            rng = np.random.default_rng(i)
            try:
                for _ in range(40 if i == 0 else 12):
                    if i == 0:
                        b, length = int(rng.integers(1, 33)), int(rng.integers(2, 9))
                        pad = ("head", "tail")[int(rng.integers(2))]
                    else:
                        b, length, pad = int(rng.integers(270, 330)), 1, "tail"
                    with store.sample(b, length, pad=pad, beta=0.5) as batch:
                        seen[i].check(batch, length, pad)
                        check_probabilities(batch, prioritized, 0.5)
                        if prioritized:
                            store.update_priorities(batch.keys, rng.random(b) * 3 + 0.1)
            except BaseException as err:  # reported below
                errors.append(err)

        threads_ = [threading.Thread(target=learner, args=(i,)) for i in range(2)]
        threads_.append(threading.Thread(target=lambda: totals.append(write_until(store, 2, stop, 2e-4))))
        for t in threads_:
            t.start()
        for t in threads_[:2]:
            t.join(60)
        stop.set()
        threads_[2].join(60)
        proc.join(60)
        assert proc.exitcode == 0 and not errors, errors
        during = totals[0] + queue.get(timeout=10)
        written += during
        c = store.counters()
        sampled = seen[0].steps + seen[1].steps
        assert c == {"inserts": written, "samples": sampled, "deletes": written - len(store)}
        assert len(fused) == 40 and during > 2 * 3 * 48  # the fused call each time; the rings wrapped twice
        if threads == 2:  # the split copy (the helper joins when it is scheduled in time)
            assert calls["caller"] == 12
        else:  # one thread: the one call (draw and copy), no group claimed
            assert calls == {"caller": 0}
        store.close()


def filled_store(mm, shards: int = 2, capacity: int = 300, **kwargs) -> ReplayStore:
    store = ReplayStore(SPEC, capacity * shards, shards, memory=mm, seed=1, timeout=5.0, **kwargs)
    write(store, 2, range(100 * shards))
    return store


def test_a_split_copy_interrupted_by_a_signal_leaves_no_helper_writing(monkeypatch):
    """A signal's exception (KeyboardInterrupt, `graphrl.interrupts`) lands in the caller just after it
    published the batch to the helper: the sample raises, its slot and the shard mutexes are released,
    and the helper must not copy a group after that (it would read the rings unlocked and write the
    aborted draw's rows over the next batch, which reuses the slot: all 120 rows of it)."""
    force_split(monkeypatch)
    monkeypatch.setattr(tk, "threads_for", lambda work, chunk_work: 2)
    real = tk.copy_batch
    first = []

    def copy_batch(ctl, bell, plan, keys, dst, group, groups):
        if not first:  # the first sample: published, the helper copying, then the signal
            first.append(1)
            ch._post(ctl, bell, plan, keys, dst, group, groups)
            time.sleep(0.002)
            raise KeyboardInterrupt
        real(ctl, bell, plan, keys, dst, group, groups)

    monkeypatch.setattr(tk, "copy_batch", copy_batch)
    with MemoryManager() as mm:
        store = filled_store(mm, staging_slots=1)  # one slot: the next batch of the shape reuses it
        with pytest.raises(KeyboardInterrupt):
            store.sample(120, 1)
        assert first and store.counters()["samples"] == 0
        seen = Seen()
        with store.sample(120, 1) as batch:
            seen.check(batch, 1, "tail")
            time.sleep(0.05)  # a helper still copying the first batch would write now
            seen.check(batch, 1, "tail")  # the user's batch is still its own keys' steps
        assert store.counters()["samples"] == 120
        store.close()


def test_learner_threads_of_different_batch_shapes_never_see_a_closed_staging_pool(monkeypatch):
    """Learner threads sampling several batch shapes at once (seen in the stress run as a learner's
    ``ValueError: staging pool 'replay.staging' is closed``): here the interleaving is made exact, the
    other thread's four new shapes made while this one is between the pool lookup and its acquire."""
    from graphrl.tensors import StagingPool

    with MemoryManager() as mm:
        store = filled_store(mm)
        store.sample(8, 4).release()  # the shape's pool exists
        real = StagingPool.acquire
        raced = []

        def acquire(pool, *args, **kwargs):
            if not raced:  # another learner thread samples four other shapes right here
                raced.append(1)
                t = threading.Thread(target=lambda: [store.sample(b, 2).release() for b in (1, 2, 3, 5)])
                t.start()
                t.join()
            return real(pool, *args, **kwargs)

        monkeypatch.setattr(StagingPool, "acquire", acquire)
        with store.sample(8, 4) as batch:
            Seen().check(batch, 4, "tail")
        store.close()


def test_bad_arguments_name_the_argument_and_value():
    """B=0, L=0, huge B (over the staging pool's budget: the message names the call's batch first), a CUDA
    device without CUDA; L=9 (past `MAX_WINDOW`) samples on the lock-free path, correctly."""
    with MemoryManager() as mm:
        store = filled_store(mm, shards=3, capacity=40)
        with pytest.raises(ValueError, match=r"batch_size must be in \[1, 2147483647\], got 0"):
            store.sample(0, 4)
        with pytest.raises(ValueError, match=r"window must be in \[1, 65536\], got 0"):
            store.sample(4, 0)
        with pytest.raises(ValueError, match=r"batch_size must be in \[1, 2147483647\], got 2147483648"):
            store.sample(2**31, 2)
        huge = (r"^sample\(batch_size=2147483647, window=2\): a staging pool of 4 batches of 2147483647 x 2 "
                rf"steps \({(2**31 - 1) * 2 * STEP} bytes of fields each\) does not fit")
        with pytest.raises(MemoryBudgetError, match=huge):
            store.sample(2**31 - 1, 2)
        if not torch.cuda.is_available():
            with pytest.raises(GPUUnavailableError, match=r"device='cuda' but CUDA is not available"):
                store.sample(4, 4, device="cuda")
        with store.sample(16, 9, pad="head") as batch:
            Seen().check(batch, 9, "head")
        with store.sample(16, 8, pad="head") as batch:  # and the store samples on
            Seen().check(batch, 8, "head")
        store.close()


def split_draw_then_die(store) -> None:  # forked: takes the split copy's locks, then is killed
    table = store.table
    b = 100
    slot = store._sampler.staging.acquire(b, 1, None, None)
    keys, prob = np.zeros(b, np.int64), np.zeros(b)
    status = tk._sample_locked(table.plan, False, table._repairs, table._words, slot.addresses, 0, keys, prob,
                               slot.mask_flat, 0.4, np.zeros(0, np.float32), 0)[0]
    os._exit(3) if status != tk._COPYING else os.kill(os.getpid(), signal.SIGKILL)


def half_commit_then_die(store, shard: int, reserve: int) -> None:  # forked: killed mid-commit
    sh = store.storage.shards[shard]
    sh.lock.acquire()
    wp = int(sh.meta[WRITE_POS])
    sh.meta[RESERVE_POS] = wp + reserve  # published, then one torn row, then death
    sh.columns["v"][wp % sh.capacity] = -7
    os.kill(os.getpid(), signal.SIGKILL)


def test_processes_killed_holding_the_locks_leave_the_store_working():
    """A process killed between the split copy's draw and its release (every shard mutex held), then a
    writer killed mid-commit: fused windows, split batches and writers go on, the hole never sampled,
    and the counters count only what completed."""
    ctx = mp.get_context("fork")
    with MemoryManager() as mm, pytest.MonkeyPatch.context() as m:
        store = filled_store(mm, capacity=120)
        store.sample(4, 3).release()  # every commit ingested: the draw below takes the one-call path
        c0 = store.counters()
        seen, written = Seen(), 0
        for target, args in ((split_draw_then_die, (store,)), (half_commit_then_die, (store, 1, 4))):
            proc = ctx.Process(target=target, args=args)
            proc.start()
            proc.join(30)
            assert proc.exitcode == -signal.SIGKILL
            for length, pad in ((8, "head"), (5, "tail"), (8, "tail")):
                with store.sample(60, length, pad=pad) as batch:
                    seen.check(batch, length, pad)
            force_split(m)
            with store.sample(300, 1) as batch:
                seen.check(batch, 1, "tail")
            m.undo()
            written += write(store, 4, range(10))
        c = store.counters()
        assert c["samples"] == c0["samples"] + seen.steps and c["inserts"] == c0["inserts"] + written
        assert int(store.storage.shards[1].meta[HOLES]) == 4
        store.close()


def test_the_rate_limiter_blocks_times_out_and_counts_fused_windows_exactly():
    """``SampleToInsertRatio(2)``: three learner threads sample fused windows against one writer until the
    limiter holds them past their timeout (the message quotes it); the counters are exactly the real steps
    of the batches handed out, and the writer, blocked in turn, finishes."""
    from replay import SampleToInsertRatio

    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 2 * 200, 2, memory=mm, seed=1, timeout=10.0,
                            rate_limiter=SampleToInsertRatio(2.0, min_size=20, error_buffer=(-100.0, 200.0)))
        fused = []
        inner = store._sampler._sample_windows
        store._sampler._sample_windows = lambda *a: fused.append(1) or inner(*a)
        seen = [Seen() for _ in range(3)]
        timeouts, errors, written, calls = [], [], [], [0, 0, 0]
        end = time.monotonic() + 30

        def learner(i: int) -> None:
            rng = np.random.default_rng(i)
            while True:
                b, length = int(rng.integers(1, 20)), int(rng.integers(2, 9))
                pad = ("head", "tail")[i % 2]
                calls[i] += 1
                try:
                    with store.sample(b, length, pad=pad, timeout=0.3) as batch:
                        seen[i].check(batch, length, pad)
                except TimeoutError as err:
                    if written or time.monotonic() > end:  # held past its timeout with nothing more to come
                        timeouts.append(str(err))
                        return
                except BaseException as err:  # reported below
                    errors.append(err)
                    return

        threads = [threading.Thread(target=lambda: written.append(write(store, 3, range(150))))]
        threads += [threading.Thread(target=learner, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and len(timeouts) == 3 and written, errors
        assert all("timeout=0.3" in m and "sampling is ahead of inserting" in m for m in timeouts)
        c = store.counters()
        assert c["inserts"] == written[0] and c["samples"] == sum(s.steps for s in seen)
        # held at the limit (2 inserts - samples - 1 < min_diff), overshot by at most one call a learner
        assert 100 <= c["samples"] - 2 * c["inserts"] <= 99 + 3 * 19 * 8
        assert len(fused) == sum(calls)  # every call, timed out or not, on the fused path
        store.close()


def test_close_while_learners_sample_fused_windows_and_split_batches(monkeypatch):
    """``close()`` while threads sample fused windows, split batches and update priorities, and a writer
    writes: every thread ends with the ValueError naming the closed store, none hangs."""
    force_split(monkeypatch)
    monkeypatch.setattr(tk, "threads_for", lambda work, chunk_work: 2)
    with MemoryManager() as mm:
        store = filled_store(mm, shards=3, capacity=100, selector=Prioritized(0.7))
        started = threading.Barrier(5)
        outcomes = []

        def run(call) -> None:
            started.wait()
            try:
                for _ in range(10**6):
                    call()
            except ValueError as err:
                outcomes.append(str(err))

        def updates() -> None:
            with store.sample(8, 3, pad="tail") as b:
                store.update_priorities(b.keys, np.ones(8))

        calls = [lambda: store.sample(16, 4, pad="head").release(), lambda: store.sample(300, 1).release(),
                 updates, lambda: write(store, 5, range(20))]
        threads = [threading.Thread(target=run, args=(c,)) for c in calls]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.2)
        store.close()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert len(outcomes) == 4 and all("closed" in m for m in outcomes), outcomes


def owner_samples_until_killed(queue, split: bool) -> None:  # forked: the owner, killed while it samples
    store = ReplayStore(SPEC, 2 * 60, 2, seed=1, timeout=10.0)
    write(store, 7, range(20))
    if split:
        tk.SPLIT_BYTES, tk.idle_cores = 1 << 10, lambda cores, own=0: cores - 1
    for i in range(10**6):
        store.sample(300, 1).release() if split else store.sample(60, 8, pad="head").release()
        if i == 0:
            queue.put(store.handle())


@pytest.mark.parametrize("split", [False, True])
def test_an_owner_killed_while_sampling_leaves_attached_writers_working(split):
    """The learner owning the store is SIGKILLed while it samples in a loop (nearly all of it inside the
    fused call, or the split copy, with the shard mutexes held): a writer attached by handle recovers
    the mutexes and commits on."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=owner_samples_until_killed, args=(queue, split))
    proc.start()
    # owner_pid=0: a writer not watching the owner (whose death it would report, test_owner_death_actor), so
    # that its commits take the dead owner's mutexes and recover them
    handle = queue.get(timeout=60)  # sampling since its first batch
    store = ReplayStore.attach(dataclasses.replace(handle, owner_pid=0))
    time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    before = store.counters()["inserts"]
    written = write(store, 8, range(50))
    assert store.counters()["inserts"] == before + written
    store.close()


def batches(store, k: int) -> list:
    """``k`` fused window batches of changing shapes, as plain arrays (keys decoded: a restored store's
    incarnation differs)."""
    out = []
    for i in range(k):
        with store.sample(5 + i, 2 + i % 7, pad=("head", "tail")[i % 2], beta=0.6) as b:
            out.append([b[n].numpy().copy() for n in SPEC] + list(decode_keys(b.keys.numpy()))
                       + [b.mask.numpy().copy(), b.probabilities.numpy().copy(), b.weights.numpy().copy(),
                          b.lengths.numpy().copy(), np.array(b.table_size)])
    return out


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_restored_store_draws_the_fused_windows_the_saved_one_would_have(tmp_path, prioritized):
    """Checkpoint after some fused samples: the restored store (no seed) draws the same next windows as the
    original (bytes, mask, positions, probabilities, weights, lengths, use counts); two restores with one
    seed agree between the fused call and the lock-free path."""
    with MemoryManager() as mm:
        selector = Prioritized(0.7) if prioritized else Uniform()
        store = filled_store(mm, shards=3, capacity=30, selector=selector)
        if prioritized:
            with store.sample(30, 3) as b:
                store.update_priorities(b.keys, np.linspace(0.1, 4, 30))
        batches(store, 3)
        store.checkpoint(tmp_path)
        want = batches(store, 10)
        restored = ReplayStore.restore(tmp_path, memory=mm)
        for a, b in zip(want, batches(restored, 10), strict=True):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(store.table.state.times, restored.table.state.times)
        assert store.counters() == restored.counters()
        fused, plain = (ReplayStore.restore(tmp_path, memory=mm, seed=9) for _ in range(2))
        plain._sampler.locked_window = 0
        for a, b in zip(batches(fused, 10), batches(plain, 10), strict=True):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y)
        for s in (store, restored, fused, plain):
            s.close()


def test_torchrl_rollouts_with_open_episodes_sample_the_same_on_the_fused_call():
    """`replay.torchrl.TorchRLWriter` writes batched-env rollouts whose episodes stay open across rollouts
    (windows stop at the commit cursor); ``to_tensordict()`` of the fused call's batches equals the
    lock-free path's (every entry), and ``td["keys"][:, 0]`` updates priorities alike."""
    tensordict = pytest.importorskip("tensordict", reason="needs the torchrl extra (.[torchrl])")
    from replay.torchrl import TorchRLWriter, torchrl_spec

    rng = np.random.default_rng(0)

    def rollout(t0: int):
        g = torch.arange(t0, t0 + 7, dtype=torch.float32)
        obs = torch.stack([torch.stack([e * 1000 + g, g * 0.5], -1) for e in range(3)])  # [3 envs, 7, 2]
        done = torch.from_numpy(rng.random((3, 7, 1)) < 0.25)
        return tensordict.TensorDict(
            {"observation": obs, "action": torch.zeros(3, 7, 1), ("next", "observation"): obs + 1,
             ("next", "reward"): obs[..., :1] * 2, ("next", "done"): done, ("next", "terminated"): done,
             ("next", "truncated"): torch.zeros_like(done)}, [3, 7])

    first = rollout(0)
    with MemoryManager() as mm:
        stores = [ReplayStore(torchrl_spec(first), 3 * 30, 3, memory=mm, seed=4, timeout=5.0,
                              selector=Prioritized(0.6)) for _ in range(2)]
        stores[1]._sampler.locked_window = 0
        fused = []
        inner = stores[0]._sampler._sample_windows
        stores[0]._sampler._sample_windows = lambda *a: fused.append(1) or inner(*a)
        writers = [TorchRLWriter(s) for s in stores]
        for r in range(8):
            td = first if r == 0 else rollout(7 * r)
            for w in writers:
                w.extend(td)
            for length, pad in ((2, "head"), (5, "tail"), (8, "head"), (8, "tail")):
                got, want = (s.sample(9, length, pad=pad, beta=0.5) for s in stores)
                a, b = got.to_tensordict(), want.to_tensordict()
                keys = sorted(a.keys(include_nested=True, leaves_only=True), key=str)
                assert keys == sorted(b.keys(include_nested=True, leaves_only=True), key=str)
                for k in keys:
                    if k != "keys":  # the stores' ids differ
                        assert torch.equal(a[k], b[k]), k
                mask, obs = a["mask"], a["observation"][..., 0]
                assert bool(((obs[:, 1:] - obs[:, :-1])[mask[:, 1:] & mask[:, :-1]] == 1).all())
                assert torch.equal(a["next", "observation"][mask], a["observation"][mask] + 1)
                priorities = torch.rand(9, generator=torch.Generator().manual_seed(r)) + 0.1
                for s, t in zip(stores, (a, b), strict=True):
                    assert s.update_priorities(t["keys"][:, 0], priorities) == 9
                got.release()
                want.release()
        for w in writers:
            w.close()
        assert len(fused) == 32 and stores[0].counters() == stores[1].counters()
        for s in stores:
            s.close()


def shards_free(store, wait: float = 5.0) -> bool:
    """Another thread takes and releases every shard mutex within ``wait`` seconds."""

    def take() -> None:
        for sh in store.storage.shards:
            sh.acquire()
            sh.release()

    t = threading.Thread(target=take, daemon=True)
    t.start()
    t.join(wait)
    return not t.is_alive()


def test_a_signal_during_the_split_draw_leaves_no_shard_mutex_held(monkeypatch):
    """SIGTERM under `graphrl.interrupts` while the learner's main thread samples split batches: the
    handler's `Interrupted` is raised as soon as a compiled call returns, so one arriving during the
    draw (which returns with every shard mutex held for the copy) came out of `sample_transitions`
    before its ``try``: the mutexes stayed held by a live process, and every writer, sampler and
    checkpoint of the store blocked for good. The signal is raised in the main thread as the draw
    returns (its handler runs there, the return value lost), every other sample; in a forked child, so
    that a signal taking its default action ends the child, never pytest."""
    from graphrl.interrupts import Interrupted, interrupts

    spec = TrajectorySpec({"v": ((), "int64")})
    force_split(monkeypatch)
    monkeypatch.setattr(tk, "SPLIT_BYTES", 1)
    monkeypatch.setattr(tk, "threads_for", lambda work, chunk_work: 2)  # split on one core too
    real = tk._draw_held
    held_at_signal: list[int] = []

    def draw_then_signal(*args):
        out = real(*args)
        held_at_signal.append(int(args[-1][0]))  # the job word: the shard mutexes held for the copy
        signal.raise_signal(signal.SIGTERM)  # handled before raise_signal returns: Interrupted here
        return out

    def child() -> None:
        rng = np.random.default_rng(0)
        with MemoryManager() as mm:
            store = ReplayStore(spec, 2 * 4096, 2, memory=mm, seed=1, timeout=5.0,
                                selector=Prioritized(0.6))
            with store.writer() as w:
                w.add_episode({"v": np.arange(8192)})
            with store.sample(4096, 1) as b:
                store.update_priorities(b.keys, rng.random(4096) + 0.1)
            sampled = store.counters()["samples"]
            for _ in range(4):
                store.sample(60_000, 1).release()
                sampled += 60_000
                with interrupts(), pytest.raises(Interrupted) as info:
                    with monkeypatch.context() as m:
                        m.setattr(tk, "_draw_held", draw_then_signal)
                        store.sample(60_000, 1)
                assert info.value.name == "SIGTERM" and signal.SIGTERM not in signal.sigpending()
                assert shards_free(store), "a shard mutex stayed held after the interrupted sample"
                assert store.counters()["samples"] == sampled  # the interrupted draw is not counted
            assert held_at_signal == [1] * 4
            store.close()

    check_in_fork(child)


def parked_on_a_lock(tid: int) -> bool:
    """Thread ``tid`` of this process sleeps in a futex wait (a mutex, or the interpreter lock)."""
    from pathlib import Path

    return Path(f"/proc/{os.getpid()}/task/{tid}/wchan").read_text() == "futex_do_wait"


@pytest.mark.skipif(not os.path.exists("/proc/self/wchan"), reason="needs /proc/<pid>/wchan (Linux)")
def test_a_signal_while_the_fused_sample_waits_for_a_shard_lock_leaves_it_free():
    """Commits are pending, so the fused sample takes the shard locks in Python (`Table._hold_shards`) and
    waits there while a writer holds one; SIGTERM under `graphrl.interrupts` arrives during the wait. The
    sample raises `Interrupted`, and the shard mutex must not stay held by the learner. In a forked child, so
    that a signal landing after the block (at its default action) ends the child, never pytest."""
    from graphrl.interrupts import Interrupted, interrupts

    def child() -> None:  # forked: a signal that came after the block ends the child, never pytest
        with MemoryManager() as mm:
            store = filled_store(mm, capacity=100)
            store.sample(4, 3).release()
            write(store, 5, range(3))  # not yet ingested: the next sample holds the shard locks
            sh = store.storage.shards[1]
            main = threading.get_native_id()  # (main_thread().native_id is the parent's in a fork)
            taken = threading.Event()

            def writer_mid_commit() -> None:  # holds the lock until the learner has slept on it a while
                sh.acquire()
                taken.set()
                parked = 0
                while parked < 20:
                    time.sleep(0.005)
                    parked = parked + 1 if parked_on_a_lock(main) else 0
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                sh.release()

            holder = threading.Thread(target=writer_mid_commit)
            holder.start()
            taken.wait(10)
            with interrupts(), pytest.raises(Interrupted):
                store.sample(16, 4, pad="head")
            holder.join(10)
            assert shards_free(store, 0.5), "the learner holds a shard mutex after its interrupted sample"
            store.close()

    check_in_fork(child)


def test_a_signal_while_the_fused_sample_releases_its_shard_locks_leaves_none_held(monkeypatch):
    """The fused sample's fallback under the Python locks: the exception a signal handler raises as the
    first unlock (shard 2's) returns must not leave shards 0 and 1 locked."""
    with MemoryManager() as mm:
        store = filled_store(mm, shards=3, capacity=60)
        store.sample(4, 3).release()
        write(store, 5, range(3))  # not yet ingested: the next sample holds the shard locks in Python
        lock = store.storage.shards[2].lock
        real = lock.release

        def release_then_signal() -> None:
            real()
            monkeypatch.setattr(lock, "release", real)
            raise KeyboardInterrupt  # what the handler raises at the eval breaker after the C call

        monkeypatch.setattr(lock, "release", release_then_signal)
        with pytest.raises(KeyboardInterrupt):
            store.sample(16, 4, pad="head")
        assert shards_free(store, 0.5), "shards 0 and 1 stay locked by the learner"
        store.close()

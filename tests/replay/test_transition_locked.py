"""The transition sample as one compiled call (`replay.transition_kernel.sample_transitions`, through
`replay.table.Table.draw_transitions`): the shard locks, the ingest check, the draw, the copy and the
rate limiter's sample count in one kernel.

Held against the Python steps it replaces (the shard locks and the ingest in Python, the unlocked
kernel `draw_transitions`, `RateLimiterState.sample`) byte for byte under hypothesis, with writes
between samples so that both the one-call path and its fallback run; the counters exact; a shard lock
whose holder process was killed mid-commit repaired by a sample (the hole logged, no torn row); the
control mutex's dead holder recovered; writer processes and a sampler with exact counts.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading

import numpy as np
import pytest
from _stores import SPEC, steps
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, Uniform
from replay.keys import decode_keys
from replay.shard_layout import HOLES, RESERVE_POS, WRITE_POS
from replay.transition_kernel import DRAWN, STALE, draw_transitions, sample_transitions


def check_rows(batch) -> np.ndarray:
    """Every row is the whole step its ``pos`` names; returns the positions."""
    p = batch["pos"].numpy()[:, 0]
    obs = (p[:, None] * 10 + np.arange(3)).astype(np.float32)
    np.testing.assert_array_equal(batch["obs"].numpy()[:, 0], obs)
    np.testing.assert_array_equal(batch["tag"].numpy()[:, 0], (p % 30000).astype(np.int16))
    np.testing.assert_array_equal(batch["done"].numpy()[:, 0], p % 3 == 0)
    assert batch.mask.numpy().all()
    return p


def fill(store, lengths, start: int) -> int:
    w = store.writer(chunk_steps=4)
    pos = start
    for n in lengths:
        w.extend(steps(pos, n))
        w.end_episode()
        pos += n
    w.close()
    return pos


def python_steps(store, b: int, beta: float):
    """The sample the compiled call replaces: the shard locks and the ingest in Python, the unlocked
    kernel, then `RateLimiterState.sample` (the path before `sample_transitions`)."""
    table = store.table
    st_ = table.state
    copy = store._sampler.copy
    outs = {n: np.zeros((b, *f.shape), f.dtype) for n, f in SPEC.items()}
    flat = tuple(outs[n].reshape(-1).view(np.uint8) for n in SPEC)
    keys, prob, mask = np.empty(b, np.int64), np.empty(b), np.zeros(b, bool)
    weights = np.empty(b, np.float32) if table.prioritized else np.zeros(0, np.float32)
    table._hold_all()
    try:
        live = draw_transitions(
            st_.rng.random(b), st_.ctree, st_.wtree, table.prioritized, st_.size, table.filled, st_.times,
            table.ingested, table.storage.capacity, copy.rings, flat, copy.row_bytes, table.incarnation,
            keys, prob, mask, beta, weights,
        )
    finally:
        table._release_all()
    assert live >= 0.5
    store._limiter.sample(b)
    return outs, keys, prob, weights, int(live + 0.5)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    capacity=st.integers(8, 64),
    shards=st.integers(1, 3),
    prioritized=st.booleans(),
    rounds=st.lists(
        st.tuples(st.integers(1, 40), st.lists(st.integers(1, 12), max_size=4)), min_size=1, max_size=5
    ),
)
def test_the_compiled_call_equals_the_python_steps(seed, capacity, shards, prioritized, rounds):
    """Same seed, same writes: the same batches (bytes, keys, probabilities, weights, N), use counts,
    counters and shard state, whether new commits are pending (fallback) or not (one call)."""
    with MemoryManager() as mm:
        stores = [
            ReplayStore(
                SPEC, capacity * shards, shards, memory=mm, seed=seed, timeout=5.0,
                selector=Prioritized(0.6) if prioritized else Uniform(),
            )
            for _ in range(2)
        ]
        fast, slow = stores
        pos = 0
        for s in stores:
            end = fill(s, [5, 7, 3], 0)
        pos = end
        for b, lengths in rounds:
            for s in stores:
                end = fill(s, lengths, pos)  # pending commits: the next sample ingests them first
            pos = end
            if prioritized:
                for s in stores:
                    s.update_priorities(s.sample(4).keys, np.array([0.5, 2.0, 1.0, 3.0]))
            got = fast.sample(b, 1, beta=0.4)
            outs, keys, prob, weights, n = python_steps(slow, b, 0.4)
            for name in SPEC:
                np.testing.assert_array_equal(got[name].numpy()[:, 0], outs[name])
            np.testing.assert_array_equal(got.keys.numpy(), keys)
            np.testing.assert_array_equal(got.probabilities.numpy(), prob)
            if prioritized:
                np.testing.assert_array_equal(got.weights.numpy(), weights)
            else:
                assert (got.weights.numpy() == 1).all()
            assert got.table_size == n and got.mask.numpy().all()
            check_rows(got)
            got.release()
            again = fast.sample(b, 1, beta=0.4)  # nothing pending now: the one-call path
            outs, keys, prob, weights, n = python_steps(slow, b, 0.4)
            np.testing.assert_array_equal(again.keys.numpy(), keys)
            for name in SPEC:
                np.testing.assert_array_equal(again[name].numpy()[:, 0], outs[name])
            again.release()
        np.testing.assert_array_equal(fast.table.state.times, slow.table.state.times)
        assert fast.counters() == slow.counters()
        for a, b_ in zip(fast.storage.shards, slow.storage.shards, strict=True):
            np.testing.assert_array_equal(a.meta, b_.meta)
        for s in stores:
            s.close()


def test_the_kernel_reports_pending_commits_and_changes_nothing():
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 32, 2, memory=mm, seed=3, timeout=5.0)
        fill(store, [6, 6], 0)
        table = store.table
        before = (table.state.times.copy(), store.counters(), table.state.rng.bit_generator.state)
        b = 4
        slot = store._sampler.staging.acquire(b, 1, None, None)
        keys, prob = np.zeros(b, np.int64), np.zeros(b)
        with table.lock:  # nothing ingested yet: STALE, no lock left held, nothing counted or drawn
            status, live, err, died = sample_transitions(
                table.plan, False, table._repairs, table._words, slot.addresses, 0, keys, prob,
                slot.mask_flat, 0.0, np.zeros(0, np.float32),
            )
        assert (status, live, err, died) == (STALE, 0, 0, 0)
        np.testing.assert_array_equal(table.state.times, before[0])
        assert store.counters() == before[1] and (keys == 0).all()
        assert table.state.rng.bit_generator.state == before[2]  # no uniform drawn
        for sh in store.storage.shards:  # the shard mutexes are free
            sh.acquire()
            sh.release()
        table.ingest_all()
        with table.lock:
            status, live, err, died = sample_transitions(
                table.plan, False, table._repairs, table._words, slot.addresses, 0, keys, prob,
                slot.mask_flat, 0.0, np.zeros(0, np.float32),
            )
        assert (status, live, err, died) == (DRAWN, 12, 0, 0)
        assert store.counters()["samples"] == before[1]["samples"] + b
        assert table.state.times.sum() == before[0].sum() + b
        ref = np.random.Generator(np.random.PCG64())
        ref.bit_generator.state = before[2]
        ref.random(b)  # exactly b uniforms drawn, as Generator.random draws them
        assert table.state.rng.bit_generator.state == ref.bit_generator.state
        slot.buffer.release()
        store.close()


@pytest.mark.parametrize("shards", [1, 3])
def test_counters_are_exact_after_n_samples(shards):
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 50 * shards, shards, memory=mm, seed=5, timeout=5.0)
        pos = fill(store, [9, 4, 11], 0)
        c0 = store.counters()
        sizes = [1, 7, 32, 5, 64]
        total = 0
        for i in range(40):
            b = sizes[i % len(sizes)]
            if i % 3 == 0:  # commits pending at every third sample
                pos = fill(store, [1 + i % 5], pos)
            batch = store.sample(b)
            check_rows(batch)
            batch.release()
            total += b
        c = store.counters()
        assert c["samples"] - c0["samples"] == total
        live = sum(sh.live_steps() for sh in store.storage.shards)
        assert c["inserts"] == pos and c["deletes"] == pos - live
        store.close()


def test_a_sample_wakes_a_writer_blocked_on_the_rate_limiter():
    """The kernel's count broadcasts the control condition: a writer waiting for samples proceeds."""
    from replay import SampleToInsertRatio

    with MemoryManager() as mm:
        store = ReplayStore(
            SPEC, 200, 1, memory=mm, seed=0, timeout=30.0,
            rate_limiter=SampleToInsertRatio(1.0, min_size=4, error_buffer=(-8.0, 8.0)),
        )
        fill(store, [4], 0)
        t = threading.Thread(target=fill, args=(store, [30], 4))  # blocks until samples catch up
        t.start()
        sampled = 0
        # while the writer is not done the sampler is never blocked for good: it is ahead only when the
        # writer is admitted, whose next commit wakes it
        while store.counters()["inserts"] < 34:
            store.sample(2, timeout=30).release()
            sampled += 2
        t.join(30)
        assert not t.is_alive() and store.counters()["inserts"] == 34
        assert sampled >= 34 - 4 - 8 and store.counters()["samples"] == sampled
        store.close()


def die_holding(lock, then=lambda: None) -> None:
    """A thread that locks ``lock``, runs ``then`` and exits holding it (robust mutex: EOWNERDEAD next)."""

    def run() -> None:
        lock.acquire()
        then()

    t = threading.Thread(target=run)
    t.start()
    t.join()


def half_commit_then_die(handle, shard: int, reserve: int) -> None:  # runs in a forked process
    store = ReplayStore.attach(handle)
    sh = store.storage.shards[shard]
    sh.lock.acquire()
    wp = int(sh.meta[WRITE_POS])
    sh.meta[RESERVE_POS] = wp + reserve  # published, then one torn row, then death
    c = wp % sh.capacity
    sh.columns["pos"][c] = -7
    sh.columns["obs"][c] = -7.0
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("shards,victim", [(1, 0), (2, 1)])
def test_a_sample_repairs_a_commit_whose_process_was_killed(caplog, shards, victim):
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 40 * shards, shards, memory=mm, seed=2, timeout=10.0)
        pos = fill(store, [5, 6, 7, 8], 0)
        store.sample(8).release()  # everything ingested: the next sample finds no pending commit
        sh = store.storage.shards[victim]
        wp = int(sh.meta[WRITE_POS])
        proc = mp.get_context("fork").Process(target=half_commit_then_die, args=(store.handle(), victim, 4))
        proc.start()
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL
        assert int(sh.meta[RESERVE_POS]) == wp + 4 and int(sh.meta[WRITE_POS]) == wp
        c0 = store.counters()
        with caplog.at_level(logging.WARNING):
            batch = store.sample(64)
        hole = f"shard {victim}: a writer died mid-commit; 4 steps at positions [{wp}, {wp + 4})"
        assert hole in caplog.text and "recovering it (1)" in caplog.text  # found by the kernel
        assert int(sh.meta[WRITE_POS]) == wp + 4 and int(sh.meta[HOLES]) == 4
        assert (sh.steps[np.arange(wp, wp + 4) % sh.capacity, 0] == -1).all()  # the hole: no items
        p = check_rows(batch)  # no torn row: the half-written slot is never drawn
        assert (p >= 0).all() and (p < pos).all()
        shard, anchor, _ = decode_keys(batch.keys.numpy())
        assert not ((shard == victim) & (anchor >= wp) & (anchor < wp + 4)).any()
        batch.release()
        assert store.counters()["samples"] == c0["samples"] + 64
        pos = fill(store, [3], pos)  # the shard takes commits again, after the hole
        assert int(sh.meta[WRITE_POS]) in (wp + 4, wp + 7)
        store.sample(16).release()
        store.close()


def test_a_dead_holder_without_a_half_commit_and_of_the_control_mutex(caplog):
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 40, 1, memory=mm, seed=4, timeout=10.0)
        fill(store, [10, 10], 0)
        store.sample(4).release()
        c0 = store.counters()
        die_holding(store.storage.shards[0].lock)  # no reserve published: nothing to repair
        die_holding(store.storage.control.mutex)
        with caplog.at_level(logging.WARNING):
            batch = store.sample(16)  # one call: both mutexes recovered, drawn and counted
        assert "recovering it (2)" in caplog.text and "mid-commit" not in caplog.text
        check_rows(batch)
        batch.release()
        assert store.counters()["samples"] == c0["samples"] + 16
        assert int(store.storage.shards[0].meta[HOLES]) == 0
        with store.storage.control.cond:  # consistent again for the Python side
            pass
        store.sample(4).release()
        store.close()


def writer_process(handle, wid: int, n: int, queue) -> None:  # runs in a forked process
    store = ReplayStore.attach(handle)
    total = 0
    with store.writer(chunk_steps=8) as w:
        for ep in range(n):
            length = 1 + (wid * 7 + ep * 3) % 17
            w.extend(steps(wid * 10_000_000 + ep * 100, length))
            w.end_episode()
            total += length
    store.close()
    queue.put((wid, total))


def test_writer_processes_and_a_sampler_keep_exact_counts():
    n_writers, n_episodes, b = 3, 150, 48
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 600, 2, memory=mm, seed=6, timeout=60.0)
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=writer_process, args=(store.handle(), wid, n_episodes, queue))
            for wid in range(n_writers)
        ]
        for p in procs:
            p.start()
        results: dict[int, int] = {}
        sampled = 0
        while len(results) < n_writers:  # sample (and check) while the writers wrap the ring
            while not queue.empty():
                wid, total = queue.get()
                results[wid] = total
            batch = store.sample(b, timeout=60)
            check_rows(batch)
            batch.release()
            sampled += 1
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        total = sum(results.values())
        c = store.counters()
        assert c["inserts"] == total and c["samples"] == sampled * b
        assert c["deletes"] == total - 600 and len(store) == 600
        store.close()


def test_selector_words_refuses_arrays_it_cannot_address():
    from replay.locked_draw import WORDS, selector_words

    rng = np.random.default_rng(0)
    tree = np.zeros((2, 16))
    ok = selector_words(rng, tree, tree, True, 8, np.zeros(2, np.int64), np.zeros((2, 8), np.int64),
                        np.zeros(2, np.int64))
    assert ok.shape == (WORDS,) and ok[2] == tree.ctypes.data
    with pytest.raises(ValueError, match="times must be a C-contiguous int64 array"):
        selector_words(rng, tree, tree, True, 8, np.zeros(2, np.int64), np.zeros((8, 2), np.int64).T,
                       np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="ctree must be a C-contiguous float64 array"):
        selector_words(rng, tree.astype(np.float32), tree, True, 8, np.zeros(2, np.int64),
                       np.zeros((2, 8), np.int64), np.zeros(2, np.int64))

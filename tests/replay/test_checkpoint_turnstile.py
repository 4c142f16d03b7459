"""A checkpoint holds the writers before it takes the shard locks (the turnstile of `replay.control`).

- while a checkpoint waits for a shard lock that someone else holds, a writer committing back to back
  (a thread, or a process attached by handle) completes at most the commit it had been admitted to,
  instead of committing on to the other shards (thousands of episodes in 0.3 s before the turnstile);
- writers go on once the checkpoint has let the store go, and nothing they wrote is lost;
- a process that dies holding the turnstile blocks no writer: the next one recovers it.

The bounds are on counts of commits (each shard's ``COMMITS`` word), whatever the timing; the waits
below only give the writers room to break them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import numpy as np
import pytest
from _stores import SPEC, steps

from replay import ReplayStore, TrajectoryWriter
from replay.shard_layout import COMMITS

IN_FLIGHT = 1  # commits a writer may complete once a checkpoint holds the writers: the one admitted before


def shard_commits(store: ReplayStore, s: int) -> int:
    return int(store.storage.shards[s].meta[COMMITS])


def wait_until(predicate, what: str, limit_s: float = 60.0) -> None:
    end = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.001)


def hold_shard(store: ReplayStore, s: int, held: threading.Event, release: threading.Event):
    """A thread that holds shard ``s``'s lock (as a sampler or a slow writer might) until ``release``."""

    def run():
        with store.storage.shards[s]:
            held.set()
            release.wait(120)

    t = threading.Thread(target=run, name=f"holds-shard-{s}")
    t.start()
    held.wait(60)
    return t


def episodes_on_shard_1(w: TrajectoryWriter, stop) -> int:
    """Commit 7-step episodes until ``stop`` (shard 0 keeps an open episode, so new episodes go to shard 1,
    the one with fewer); return the steps written."""
    i = 0
    with w:
        while not stop.is_set():
            w.add_episode(steps(i, 7))
            i += 7
    return i


def checkpoint_while_shard_0_is_held(store: ReplayStore, writer_started) -> int:
    """Hold shard 0, let a writer commit to shard 1, take the store for a checkpoint (shard 0 first: it
    waits) and let shard 0 go after a while: the writer's commits from the moment the checkpoint holds
    the writers (``QUIESCE`` seen here) to the moment it holds the store."""
    held, release = threading.Event(), threading.Event()
    holder = hold_shard(store, 0, held, release)
    inside: list[int] = []
    try:
        writer_started()
        before = shard_commits(store, 1)
        wait_until(lambda: shard_commits(store, 1) >= before + 50, "the writer's first 50 commits")

        def checkpoint():
            with store.table.quiesced():  # the lock-taking of ReplayStore.checkpoint's snapshot
                inside.append(shard_commits(store, 1))

        ckpt = threading.Thread(target=checkpoint, name="checkpoint")
        ckpt.start()
        wait_until(lambda: store.storage.control.writers_held, "the checkpoint to hold the writers")
        asked = shard_commits(store, 1)
        time.sleep(0.3)  # the checkpoint waits for shard 0 meanwhile; a writer not held would commit on
        assert ckpt.is_alive() and not inside
    finally:
        release.set()
        holder.join(60)
    ckpt.join(60)
    assert not ckpt.is_alive() and not store.storage.control.writers_held
    return inside[0] - asked


def writer_held_back_then_goes_on(store: ReplayStore, start_writer) -> None:
    """A checkpoint waiting for shard 0 lets the shard-1 writer complete at most `IN_FLIGHT` commits, and the
    writer goes on (50 more episodes) once the checkpoint is done."""
    meanwhile = checkpoint_while_shard_0_is_held(store, start_writer)
    assert meanwhile <= IN_FLIGHT, meanwhile
    after = shard_commits(store, 1)
    wait_until(lambda: shard_commits(store, 1) >= after + 50, "the writer to go on after the checkpoint")


def test_a_writer_thread_waits_for_a_checkpoint_that_waits_for_a_lock(mm):
    store = ReplayStore(SPEC, memory=mm, capacity_steps=4096, num_shards=2, timeout=30.0)
    keep_open = store.writer()
    keep_open.begin_continuation(shard=0)  # an open episode on shard 0
    w = store.writer()  # made before shard 0 is held (a new writer may sweep the shards with open episodes)
    stop = threading.Event()
    written: list[int] = []
    writer = threading.Thread(target=lambda: written.append(episodes_on_shard_1(w, stop)), name="writer")
    try:
        writer_held_back_then_goes_on(store, writer.start)
    finally:
        stop.set()
        writer.join(60)
    # every episode the writer committed is in shard 1, whole (capacity 2048 per shard: the newest ones)
    assert written and shard_commits(store, 1) * 7 == written[0]
    eps = store.episodes(1)
    assert all(ep.length == 7 and not ep.open for ep in eps[1:])
    for ep in eps[1:]:
        np.testing.assert_array_equal(ep.data["pos"], np.arange(ep.data["pos"][0], ep.data["pos"][0] + 7))
    store.close()


def _writer_process(handle, stop, ready) -> None:  # an actor attached by handle (forked)
    store = ReplayStore.attach(handle)
    w = store.writer()
    ready.set()
    episodes_on_shard_1(w, stop)
    store.close()


def test_a_writer_process_waits_for_a_checkpoint_that_waits_for_a_lock(mm):
    store = ReplayStore(SPEC, memory=mm, capacity_steps=4096, num_shards=2, timeout=30.0)
    keep_open = store.writer()
    keep_open.begin_continuation(shard=0)
    ctx = mp.get_context("fork")
    stop, ready = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_writer_process, args=(store.handle(), stop, ready))
    proc.start()
    try:
        assert ready.wait(60)  # its writer is made (before shard 0 is held: see above)
        writer_held_back_then_goes_on(store, lambda: None)
    finally:
        stop.set()
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    store.close()


def _hold_writers_and_die(handle) -> None:  # forked: takes the turnstile and exits holding it
    store = ReplayStore.attach(handle)
    store.storage.control.hold_writers()
    os._exit(0)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_dead_holder_of_the_turnstile_blocks_no_writer(mm, compiled):
    store = ReplayStore(SPEC, memory=mm, capacity_steps=256, num_shards=2, timeout=30.0)
    control = store.storage.control
    control.hold_writers()  # compiled here, before the fork
    control.release_writers()
    proc = mp.get_context("fork").Process(target=_hold_writers_and_die, args=(store.handle(),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0 and control.writers_held  # the dead process still "holds" the writers
    w = store.writer()
    if compiled:
        w.add_episode(steps(0, 5))  # the compiled commit finds QUIESCE raised, then waits at the turnstile
    else:
        w.extend(steps(0, 5))
        w.flush()  # staged: the same path
        w.end_episode()  # a 0-step commit: the end-only path checks the turnstile too
    assert not control.writers_held and control.turnstile.owner_died == 1
    assert len(store) == 5
    np.testing.assert_array_equal(np.sort(np.concatenate([e.data["pos"] for e in store.episodes()])),
                                  np.arange(5))
    with store.table.quiesced():  # the turnstile works again
        assert control.writers_held
    assert not control.writers_held
    store.close()


def _hold_writers_until(handle, held, release) -> None:  # forked: holds the turnstile until told, alive
    store = ReplayStore.attach(handle)
    control = store.storage.control
    control.hold_writers()
    held.set()
    release.wait(120)
    control.release_writers()
    store.close()


@pytest.mark.parametrize("commit", ["add_episode", "flush", "end_episode"])
def test_a_writers_timeout_bounds_its_wait_for_a_hung_checkpoint(mm, commit):
    """A live process holds the writers and does not let go (a checkpoint stalled on its filesystem): a
    writer with ``timeout=1`` raises TimeoutError, nothing it had is lost, and once the writers are let
    go it commits again. A watchdog lets them go after 60 s: a wait the timeout does not bound then
    ends in a commit, not the TimeoutError."""
    store = ReplayStore(SPEC, memory=mm, capacity_steps=256, num_shards=2, timeout=30.0)
    control = store.storage.control
    control.hold_writers()  # compiled here, before the fork
    control.release_writers()
    w = store.writer(timeout=1.0)
    if commit == "end_episode":
        w.extend(steps(0, 5))
        w.flush()  # committed; the episode stays open: end_episode commits no steps
    ctx = mp.get_context("fork")
    held, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_writers_until, args=(store.handle(), held, release))
    proc.start()
    watchdog = threading.Timer(60.0, release.set)
    try:
        assert held.wait(60)
        watchdog.start()
        with pytest.raises(TimeoutError, match=r"\(timeout=1.0\): a checkpoint held the writers"):
            if commit == "add_episode":
                w.add_episode(steps(0, 5))  # the compiled commit finds QUIESCE raised, then waits
            elif commit == "flush":
                w.extend(steps(0, 5))
                w.flush()
            else:
                w.end_episode()
        assert control.writers_held and proc.is_alive()
        assert len(store) == (5 if commit == "end_episode" else 0)
        assert w.pending == (0 if commit == "end_episode" else 5)  # staged: nothing lost
    finally:
        watchdog.cancel()
        release.set()
        proc.join(60)
    assert proc.exitcode == 0 and not control.writers_held
    w.end_episode()  # the staged steps, or the end alone, commit now
    w.add_episode(steps(5, 3))
    assert len(store) == 8 and w.pending == 0
    c = control.counters
    assert (int(c[0]), int(c[2]), int(control.assigned.sum()), int(control.open.sum())) == (8, 0, 8, 0)
    eps = store.episodes()
    assert sorted(e.length for e in eps) == [3, 5] and not any(e.open for e in eps)
    np.testing.assert_array_equal(np.sort(np.concatenate([e.data["pos"] for e in eps])), np.arange(8))
    store.close()

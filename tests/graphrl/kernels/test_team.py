"""graphrl.kernels.team: parallel_for runs every chunk once, errors reach the caller, a busy team and fork."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from graphrl import kernels as K


@pytest.mark.parametrize("n", [0, 1, 2, 7, 100])
@pytest.mark.parametrize("threads", [0, 1, 2, 4])
def test_parallel_for_runs_every_index_exactly_once(n, threads):
    counts = np.zeros(n, dtype=np.int64)
    lock = threading.Lock()
    names = set()

    def fn(i):
        with lock:
            counts[i] += 1
            names.add(threading.current_thread().name)

    K.parallel_for(fn, n, threads)
    assert (counts == 1).all()
    if threads <= 1:
        assert names <= {threading.current_thread().name}


def test_parallel_for_uses_helpers():
    seen = set()
    barrier = threading.Event()

    def fn(i):
        seen.add(threading.current_thread().name)
        if i == 0:
            barrier.wait(5.0)  # hold chunk 0 until another thread has run a chunk
        else:
            barrier.set()

    K.parallel_for(fn, 4, 2)
    assert len(seen) == 2


def test_errors_reach_the_caller_after_every_chunk_ran():
    ran = []

    def fail(i):
        ran.append(i)
        if i == 3:
            raise RuntimeError("chunk 3 failed")

    with pytest.raises(RuntimeError, match="chunk 3 failed"):
        K.parallel_for(fail, 8, 2)
    assert sorted(ran) == list(range(8))
    K.parallel_for(lambda i: None, 8, 2)  # the team is usable afterwards


def test_keyboard_interrupt_in_the_caller_propagates():
    main = threading.current_thread()

    def fn(i):
        if threading.current_thread() is main:
            raise KeyboardInterrupt("simulated Ctrl-C")

    with pytest.raises(KeyboardInterrupt):
        K.parallel_for(fn, 16, 1)
    K.parallel_for(lambda i: None, 4, 2)


def test_a_busy_team_runs_the_second_caller_alone():
    inside = threading.Event()
    release = threading.Event()
    other_names = set()

    def slow(i):
        inside.set()
        release.wait(5.0)

    t = threading.Thread(target=K.parallel_for, args=(slow, 2, 2))
    t.start()
    assert inside.wait(5.0)
    K.parallel_for(lambda i: other_names.add(threading.current_thread().name), 6, 2)
    release.set()
    t.join(5.0)
    assert other_names == {threading.current_thread().name}


def test_engaged_chunks_interleave_with_the_callers_work():
    done_order = []
    task = K.Chunks(lambda i: done_order.append(i), 6)
    with K.engaged(task, 1):
        for r in range(task.num_chunks):
            task.help_until(r)
            assert all(task.done[: r + 1]), (r, bytes(task.done))  # chunks 0..r done when it returns
        task.finish()
    assert sorted(done_order) == list(range(6))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_the_team_works_in_a_forked_child():
    import multiprocessing as mp

    K.parallel_for(lambda i: None, 4, 2)  # helper threads exist in the parent
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert q.get(timeout=5) == list(range(8))


def _child(q):
    out = []
    lock = threading.Lock()

    def fn(i):
        with lock:
            out.append(i)

    K.parallel_for(fn, 8, 2)
    q.put(sorted(out))

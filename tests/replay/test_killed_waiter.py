"""A learner process killed while it waits in the rate limiter leaves nothing held: the store's
condition is a futex word (`replay._sync.SharedCondition`), so later broadcasts (the writer's compiled
commit, Python notifications) and waits go on with their timeouts. With glibc's process-shared
``pthread_cond_t`` a dead waiter could make the next broadcast block for good under the control mutex.
The waiter is observed parked on the futex through ``/proc/<pid>/wchan`` (no sleeps)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from replay import MinSize, ReplayStore, TrajectorySpec

SPEC = TrajectorySpec({"x": ((), "int64")})


def learner_waits(learner, ready) -> None:  # forked: blocks on min_size until killed
    learner.counters()
    ready.set()
    learner.sample(1, timeout=120)


def parked(pid: int, tid: int | None = None) -> bool:
    path = Path(f"/proc/{pid}/wchan") if tid is None else Path(f"/proc/{pid}/task/{tid}/wchan")
    return path.read_text() == "futex_do_wait"


def until(cond, what: str) -> None:
    end = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < end, what


@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="needs /proc/<pid>/wchan (Linux)")
@pytest.mark.parametrize("killed", [1, 2])
def test_a_learner_killed_inside_the_wait_leaves_the_store_working(killed):
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 100, 1, rate_limiter=MinSize(10), memory=mm, timeout=5.0)
        ctx = mp.get_context("fork")
        for _ in range(killed):
            ready = ctx.Event()
            proc = ctx.Process(target=learner_waits, args=(store.learner(), ready))
            proc.start()
            assert ready.wait(60)
            until(lambda pid=proc.pid: parked(pid), "the learner never parked in the wait")
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(30)
            assert proc.exitcode == -signal.SIGKILL
        out: dict = {}

        def wait_in_owner() -> None:  # a live waiter beside the dead ones
            with store.sample(4, timeout=60) as b:
                out["waiter"] = sorted(b["x"].numpy().ravel().tolist())

        waiter = threading.Thread(target=wait_in_owner, daemon=True)
        waiter.start()
        until(lambda: waiter.native_id is not None and parked(os.getpid(), waiter.native_id),
              "the owner's sampler never parked")

        def write() -> None:
            with store.writer(timeout=5.0) as w:
                for i in range(10):  # ten commits, ten broadcasts past the dead waiters
                    w.append({"x": i})
                    w.end_episode()
            out["written"] = True

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(60)
        waiter.join(60)
        assert not writer.is_alive() and not waiter.is_alive(), "a broadcast or a wait blocked"
        assert out["written"] and set(out["waiter"]) <= set(range(10))
        assert store.counters() == {"inserts": 10, "samples": 4, "deletes": 0}
        with store.sample(8, timeout=5) as b:
            assert np.isin(b["x"].numpy(), np.arange(10)).all()
        store.close()

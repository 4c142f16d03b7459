"""Issue 32, tried to break as a user would: writers across threads and processes, keys across restores and
closes, checkpoints that cannot be written.

Cases the issue's own tests (tests/replay/test_issue32.py) do not cover: a writer inherited by a forked child
(it continued the parent's open episode and committed the parent's staged steps a second time), a writer
sent to a spawned process, keys after ``close`` and across many restores, a checkpoint into a full disk.
"""

from __future__ import annotations

import errno
import os
import pickle
import threading

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, TrajectorySpec
from replay.checkpoint import latest, verify

SPEC = TrajectorySpec({"pos": ((), "int64")})


@pytest.fixture
def mm():
    manager = MemoryManager()
    yield manager
    manager.close()


def positions(store: ReplayStore) -> list[list[int]]:
    return [ep.data["pos"].tolist() for ep in store.episodes()]


# ------------------------------------------------------------------------------ writers


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_cannot_use_its_parents_writer(mm):
    store = ReplayStore(SPEC, capacity_steps=1024, memory=mm, tier="shared", timeout=5.0)
    w = store.writer(chunk_steps=4)
    for i in range(6):  # one chunk of 4 committed (the episode is open), 2 staged
        w.append({"pos": np.int64(i)})
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(r)
            try:
                w.append({"pos": np.int64(100)})
                w.end_episode()
                msg = "wrote"
            except RuntimeError as err:
                msg = str(err)
            try:
                w.close()
            except RuntimeError as err:
                msg += " | close: " + type(err).__name__
            own = store.writer(chunk_steps=4)  # a writer of its own works
            own.add_episode({"pos": np.arange(200, 203)})
            own.close()
            os.write(wfd, msg.encode())
        finally:
            os._exit(0)
    os.close(wfd)
    msg = b""
    while chunk := os.read(r, 4096):
        msg += chunk
    os.close(r)
    os.waitpid(pid, 0)
    msg = msg.decode()
    assert f"made in process {os.getpid()}" in msg and "a fork of it" in msg, msg
    assert "make a writer in this process (store.writer())" in msg and "close: RuntimeError" in msg
    for i in range(6, 9):
        w.append({"pos": np.int64(i)})
    w.end_episode()
    # every step stored once, none of the child's joined the parent's episode (the child's own commit in
    # between cuts that episode into segments, as any other writer's would)
    segments = positions(store)
    assert sorted(p for seg in segments for p in seg) == [*range(9), 200, 201, 202], segments
    assert [200, 201, 202] in segments
    w.close()
    store.close()


def test_a_writer_cannot_be_pickled_and_says_what_to_send(mm):
    store = ReplayStore(SPEC, capacity_steps=64, memory=mm)
    w = store.writer()
    with pytest.raises(TypeError, match=r"store\.handle\(\).*ReplayStore\.attach\(handle\)\.writer\(\)"):
        pickle.dumps(w)
    w.close()
    store.close()


def test_a_writer_passed_along_a_chain_of_threads_keeps_one_episode(mm):
    """Made in the main thread, used by worker 1 until it ends, then by worker 2 (no release call needed),
    then released by worker 3 while alive and taken by the main thread: one episode, every step once."""
    store = ReplayStore(SPEC, capacity_steps=256, memory=mm, timeout=5.0)
    w = store.writer(chunk_steps=4)
    handed = threading.Event()
    finish = threading.Event()

    def first():
        w.extend({"pos": np.arange(0, 5)})

    def second():
        w.extend({"pos": np.arange(5, 10)})

    def third():
        w.extend({"pos": np.arange(10, 12)})
        w.release_thread()
        handed.set()
        finish.wait(10)  # alive while the main thread writes

    for fn in (first, second):
        t = threading.Thread(target=fn)
        t.start()
        t.join()
    t3 = threading.Thread(target=third)
    t3.start()
    assert handed.wait(10)
    w.extend({"pos": np.arange(12, 14)})
    w.end_episode()
    finish.set()
    t3.join()
    assert positions(store) == [list(range(14))]
    w.close()
    store.close()


def test_a_busy_owner_thread_keeps_the_writer_until_it_ends(mm):
    store = ReplayStore(SPEC, capacity_steps=256, memory=mm, timeout=5.0)
    w = store.writer()
    started, stop = threading.Event(), threading.Event()

    def owner():
        w.append({"pos": np.int64(0)})
        started.set()
        stop.wait(10)

    t = threading.Thread(target=owner, name="owner-thread")
    t.start()
    assert started.wait(10)
    with pytest.raises(RuntimeError, match=r"'owner-thread'.*'MainThread'"):
        w.append({"pos": np.int64(1)})
    with pytest.raises(RuntimeError, match="'owner-thread'"):
        w.close()  # closing would drop the owner's staged step
    assert w.pending == 1
    stop.set()
    t.join()
    w.append({"pos": np.int64(1)})  # the owner has ended: the writer (and its staged step) pass on
    w.end_episode()
    assert positions(store) == [[0, 1]]
    w.close()
    store.close()

"""An actor's writer notices its store's owner process dying: SIGKILL, or SIGTERM with no handler, leave the
shared regions mapped in the actor, where commits used to go on, unread, for good (and a writer blocked on a
`SampleToInsertRatio` timed out blaming the ratio). Now a commit raises ``ValueError`` naming the owner's
pid ("lost the connection to the store's owner", the learner's words, `replay.owner_watch.owner_lost`),
nothing of it stored, and every later call of the writer raises it too. A learner blocked on the limiter says
the same, not (after its timeout) that too few steps are stored.

The owner is a forked child of the test (never reaped before the writer looks: a zombie counts as gone);
the test process attaches by handle and writes.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import threading
import time

import numpy as np
import pytest

from replay import ReplayStore, SampleToInsertRatio, TrajectorySpec
from replay.owner_watch import CHECK_EVERY_S, OwnerWatch, process_identity

SPEC = TrajectorySpec({"obs": ((4,), "float32"), "done": ((), "bool")})


def episode(n: int = 5) -> dict[str, np.ndarray]:
    return {"obs": np.ones((n, 4), np.float32), "done": np.arange(n) == n - 1}


def fork_owner(ratio: bool, learner: bool = False) -> tuple[int, object, int]:
    """Fork an owner that makes a store, sends its handle (``learner``: a learner of it) and then waits to be
    killed; returns (pid, handle or learner, the fd to close at the end)."""
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the owner; ends by a signal (or os._exit if the test went away)
        try:
            os.close(r)
            limiter = SampleToInsertRatio(1.0, 5, 10) if ratio else None
            store = ReplayStore(SPEC, capacity_steps=64, seed=0, rate_limiter=limiter, tier="shared")
            os.write(w, pickle.dumps(store.learner() if learner else store.handle()))
            os.close(w)
            os.read(go_r, 1)  # blocks until killed, or until the test closes its end (it failed first)
        finally:
            os._exit(0)
    os.close(w)
    os.close(go_r)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    return pid, pickle.loads(data), go_w


def write_until_error(writer, limit_s: float = 8.0) -> tuple[Exception, int]:
    """``add_episode`` until it raises (or ``limit_s`` passes: the test then fails); returns the error and
    the episodes written before it."""
    end = time.monotonic() + limit_s
    n = 0
    while time.monotonic() < end:
        try:
            writer.add_episode(episode())
        except (ValueError, TimeoutError) as exc:
            return exc, n
        n += 1
        time.sleep(0.005)
    raise AssertionError(f"the writer wrote {n} episodes for {limit_s} s after its owner died, with no error")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("ratio", [False, True])
def test_an_attached_writer_raises_once_the_owner_process_dies(sig, ratio):
    pid, handle, go = fork_owner(ratio)
    store = None
    try:
        assert handle.owner_pid == pid
        store = ReplayStore.attach(handle)
        writer = store.writer(timeout=30.0)  # longer than the test: only the owner's death may end a wait
        for _ in range(3):
            writer.add_episode(episode())  # before the death: committed (the ratio admits 15 unsampled steps)
        assert store.counters()["inserts"] == 15
        os.kill(pid, sig)
        exc, _ = write_until_error(writer)
        assert isinstance(exc, ValueError), exc
        msg = str(exc)
        assert f"lost the connection to the store's owner (pid {pid})" in msg and "ended" in msg, msg
        if ratio:  # blocked on the ratio (15 inserts, no samples): the wait says the owner, not the ratio
            assert "rate-limiter wait" in msg and "5 steps were not committed" in msg, msg
            assert store.counters()["inserts"] == 15
        assert writer.closed
        lost = f"TrajectoryWriter.append\\(\\): lost the connection .*pid {pid}"
        with pytest.raises(ValueError, match=lost):
            writer.append({"obs": np.zeros(4, np.float32), "done": False})
        writer.close()  # quiet: nothing to end (the open episode's commit fails, logged)
    finally:
        os.close(go)  # an owner still alive (the test failed before the kill) leaves now
        if store is not None:
            store.close()
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == sig


def test_a_learner_waiting_on_the_rate_limiter_says_the_owner_died_not_the_limiter():
    """A learner blocked on the limiter (an empty store: fewer than min_size steps) when the owner dies: a
    ``ValueError`` naming the owner, not (after the timeout) a ``TimeoutError`` blaming min_size."""
    pid, learner, go = fork_owner(ratio=True, learner=True)
    try:
        with pytest.raises(TimeoutError, match="fewer than min_size"):
            learner.sample(4, 1, timeout=0.2)  # the owner alive: the limiter's own words
        threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
        lost = r"sample \(after .* rate-limiter wait\): lost the connection to the store's owner "
        lost += rf"\(pid {pid}\)"
        with pytest.raises(ValueError, match=lost + ": its process has ended"):
            learner.sample(4, 1, timeout=30.0)  # longer than the test: only the owner's death ends it
    finally:
        os.close(go)
        learner.close()
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_live_owner_is_not_reported_gone_and_an_unknown_one_is_not_watched():
    """A live owner (this process's parent) is never gone; pid 0 (a handle of unknown owner) and this process
    itself are not watched; a dead one is found at the next check."""
    live = OwnerWatch(os.getppid())
    assert live.active and not live.gone(fresh=True) and not live.gone()
    live.close()
    assert not OwnerWatch(0).active and not OwnerWatch(0).gone(fresh=True)
    assert not OwnerWatch(os.getpid()).active
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        os._exit(0)
    watch = OwnerWatch(pid)
    try:
        deadline = time.monotonic() + 5.0
        while not watch.gone() and time.monotonic() < deadline:  # a zombie: exited, not yet reaped
            time.sleep(CHECK_EVERY_S / 5)
        assert watch.gone() and watch.known_gone
    finally:
        watch.close()
        os.waitpid(pid, 0)


def test_a_handle_without_an_owner_pid_is_not_watched():
    """``owner_pid=0`` (unknown): the attached writer commits as before, whatever the pid."""
    with ReplayStore(SPEC, capacity_steps=64, seed=0, tier="shared") as owner:
        handle = dataclasses.replace(owner.handle(), owner_pid=0)
        with ReplayStore.attach(handle) as store, store.writer() as w:
            w.add_episode(episode())
        assert len(owner) == 5


def test_the_handle_names_the_owner_by_namespace_and_start_time():
    """The owner's identity rides in the handle; a watch in another PID namespace does not watch (the pid
    names another process there: it must not report a live owner gone), and a pid whose start time is not
    the owner's (the pid reused after the owner ended) is gone at once."""
    with ReplayStore(SPEC, capacity_steps=64, seed=0, tier="shared") as owner:
        handle = owner.handle()
    assert handle.owner_pid == os.getpid() and handle.owner_identity == process_identity()
    namespace, _, started = process_identity(os.getppid()).rpartition("@")
    assert int(namespace) > 0 and int(started) > 0
    same = OwnerWatch(os.getppid(), f"{namespace}@{started}")
    assert same.active and not same.gone(fresh=True)
    same.close()
    other_namespace = OwnerWatch(os.getppid(), f"1@{started}")
    assert not other_namespace.active and not other_namespace.gone(fresh=True)
    reused = OwnerWatch(os.getppid(), f"{namespace}@{int(started) + 1}")
    assert reused.gone(fresh=True) and reused.known_gone
    reused.close()


def test_a_store_attached_in_the_owner_watches_from_a_forked_child():
    """A store attached inside the owner's process (not watched there: it is the owner) and inherited by a
    forked child: the child watches the owner and its writer raises once the owner is killed."""
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    owner_pid = os.fork()
    if owner_pid == 0:  # pragma: no cover - the owner; ends by SIGKILL
        try:
            os.close(r)
            os.close(go_w)
            store = ReplayStore(SPEC, capacity_steps=64, seed=0, tier="shared")
            attached = ReplayStore.attach(store.handle())
            with attached.writer() as first:  # a commit in the owner: its watch decided there (not watching)
                first.add_episode(episode())
            if os.fork() == 0:  # the actor: a child of the owner, with the attached store
                try:
                    writer = attached.writer(timeout=30.0)
                    os.write(w, b"ready\n")
                    exc, n = write_until_error(writer, limit_s=10.0)
                    os.write(w, f"{type(exc).__name__}: {exc}".encode())
                except BaseException as exc:  # noqa: BLE001 - reported to the test
                    os.write(w, f"FAILED {exc!r}".encode())
                finally:
                    os._exit(0)
            os.close(w)
            os.read(go_r, 1)  # blocks until killed
        finally:
            os._exit(0)
    os.close(w)
    os.close(go_r)
    try:
        data = b""
        while not data.endswith(b"ready\n"):
            chunk = os.read(r, 65536)
            assert chunk, data
            data += chunk
        time.sleep(0.2)  # the actor commits while the owner lives
        os.kill(owner_pid, signal.SIGKILL)
        os.waitpid(owner_pid, 0)
        while chunk := os.read(r, 65536):
            data += chunk
    finally:
        os.close(r)
        os.close(go_w)
    report = data.decode().split("ready\n", 1)[1]
    assert report.startswith("ValueError") and f"store's owner (pid {owner_pid})" in report, report

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
from _forked import run_in_fork

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, TrajectorySpec
from replay.checkpoint import latest, verify

SPEC = TrajectorySpec({"pos": ((), "int64")})


def positions(store: ReplayStore) -> list[list[int]]:
    return [ep.data["pos"].tolist() for ep in store.episodes()]


# ------------------------------------------------------------------------------ writers


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_cannot_use_its_parents_writer(mm):
    store = ReplayStore(SPEC, capacity_steps=1024, memory=mm, tier="shared", timeout=5.0)
    w = store.writer(chunk_steps=4)
    for i in range(6):  # one chunk of 4 committed (the episode is open), 2 staged
        w.append({"pos": np.int64(i)})

    def child() -> str:
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
        return msg

    _, msg = run_in_fork(child)
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


def test_a_new_thread_with_a_dead_owners_ident_does_not_own_the_writer_unclaimed(mm):
    """Thread idents are reused (a new thread often gets the stack, and so the ident, of one that ended):
    a thread with the dead owner's ident passed the one-comparison check without claiming the writer, a
    second thread then claimed it from the "dead" owner, and both wrote into one episode with no error."""
    import time
    from pathlib import Path

    store = ReplayStore(SPEC, capacity_steps=256, memory=mm, timeout=5.0)
    w = store.writer(chunk_steps=64)
    first = threading.Thread(target=lambda: w.append({"pos": np.int64(0)}))
    first.start()
    first.join()
    gone = time.monotonic() + 5
    while Path(f"/proc/self/task/{first.native_id}").exists() and time.monotonic() < gone:
        time.sleep(0.01)  # the OS thread has exited: its stack (and ident) can be handed out again
    a_wrote, b_tried = threading.Event(), threading.Event()
    result: dict[str, str] = {}

    def a():
        w.append({"pos": np.int64(1)})
        a_wrote.set()
        b_tried.wait(10)  # alive while B tries

    def b():
        a_wrote.wait(10)
        try:
            w.append({"pos": np.int64(100)})
            w.end_episode()
            result["b"] = "wrote"
        except RuntimeError as err:
            result["b"] = str(err)
        b_tried.set()

    ta = threading.Thread(target=a, name="A")
    ta.start()
    a_wrote.wait(10)
    tb = threading.Thread(target=b, name="B")
    tb.start()
    ta.join()
    tb.join()
    assert "belongs to thread 'A'" in result["b"], (result, ta.ident == first.ident)
    w.end_episode()  # A has ended: this thread takes the writer
    assert positions(store) == [[0, 1]]
    w.close()
    store.close()


# ------------------------------------------------------------------------------ keys


def filled(mm, **kw) -> ReplayStore:
    store = ReplayStore(SPEC, capacity_steps=256, memory=mm, selector=Prioritized(1.0), seed=3, timeout=5.0,
                        **kw)
    with store.writer() as w:
        for e in range(4):
            w.add_episode({"pos": np.arange(e * 10, e * 10 + 10)})
    return store


def test_keys_after_close_and_keys_of_a_restored_store_back_on_its_origin(mm, tmp_path):
    a = filled(mm)
    a.checkpoint(tmp_path)
    r = ReplayStore.restore(tmp_path, memory=mm)
    mass = a.stats()["priority_mass"]
    with pytest.raises(ValueError, match="4 of 4 keys were issued by another replay store"):
        a.update_priorities(r.sample(4).keys, np.full(4, 9.0))  # the origin does not hold r's later data
    assert a.stats()["priority_mass"] == mass
    keys = a.sample(4).keys
    a.close()
    with pytest.raises(ValueError, match=r"update_priorities\(\): this ReplayStore is closed"):
        a.update_priorities(keys, np.ones(4))
    assert r.update_priorities(keys, np.full(4, 2.0)) == 4  # a's keys of checkpointed data apply to r
    r.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_keys_of_a_twin_store_in_another_process_are_refused(mm):
    """A store with the same spec, capacity and seed made in another process (a restarted learner, say):
    its keys, pickled back, name the same windows but are another store's."""
    a = filled(mm)
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(r)
            child_mm = MemoryManager()
            twin = filled(child_mm)
            os.write(wfd, pickle.dumps(twin.sample(8).keys))
        finally:
            os._exit(0)
    os.close(wfd)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    keys = pickle.loads(data)
    mass = a.stats()["priority_mass"]
    with pytest.raises(ValueError, match="8 of 8 keys were issued by another replay store"):
        a.update_priorities(keys, np.full(8, 50.0))
    assert a.stats()["priority_mass"] == mass
    a.close()


def test_a_slice_of_another_stores_keys_is_refused(mm):
    a, d = filled(mm), filled(mm)
    mass = a.stats()["priority_mass"]
    keys = d.sample(8).keys[:4]  # e.g. the windows of a batch a learner kept
    try:
        with pytest.raises(ValueError, match="issued by another replay store"):
            a.update_priorities(keys, np.full(4, 50.0))
    finally:
        changed = a.stats()["priority_mass"] != mass
        a.close()
        d.close()
    assert not changed


def test_a_key_of_data_lost_at_a_restore_never_applies_after_16_restores(mm, tmp_path):
    from replay.keys import decode_keys

    s = filled(mm)
    s.checkpoint(tmp_path / "c0")
    with s.writer() as w:
        w.add_episode({"pos": np.arange(1000, 1010)})  # positions 40..49: never checkpointed
    late = None
    for _ in range(200):
        k = s.sample(1).keys
        if decode_keys(k.numpy())[1][0] >= 40:
            late = k
            break
    assert late is not None
    s.close()
    cur = ReplayStore.restore(tmp_path / "c0", memory=mm)
    assert cur.update_priorities(late, np.ones(1)) == 0  # the previous incarnation's: stale here
    for i in range(1, 16):
        cur.checkpoint(tmp_path / f"c{i}")
        nxt = ReplayStore.restore(tmp_path / f"c{i}", memory=mm)
        cur.close()
        cur = nxt
    with cur.writer() as w:
        w.add_episode({"pos": np.arange(5000, 5010)})  # other data at positions 40..49
    try:
        assert cur.update_priorities(late, np.full(1, 99.0)) == 0
    finally:
        cur.close()


# ------------------------------------------------------------------------------ checkpoints


def test_retention_waits_for_a_restore_reading_the_checkpoint_it_would_delete(mm, tmp_path, monkeypatch):
    """Another process checkpoints every minute while this one restores ``LATEST``: two saves during the
    restore deleted the folder it was reading, and zarr read the missing chunks as zeros (a restored store
    of 40 zero steps, no error). A restore holds the root's lock in shared mode; retention waits."""
    import fcntl

    import replay.store as store_module

    a = ReplayStore(SPEC, capacity_steps=256, memory=mm, timeout=5.0)
    with a.writer() as w:
        w.add_episode({"pos": np.arange(1, 41)})
    a.checkpoint(tmp_path)
    real_load = store_module.ckpt.load
    saver: list[threading.Thread] = []
    saved: list[str] = []

    def save_twice():
        saved.extend([a.checkpoint(tmp_path), a.checkpoint(tmp_path)])

    def load_while_saving(path):
        state = real_load(path)  # verified; its columns are read later (lazily)
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked_out = False
        except BlockingIOError:
            locked_out = True
        finally:
            os.close(fd)  # releases the lock if it was taken
        if locked_out:  # a saver would wait: run one that does
            saver.append(threading.Thread(target=save_twice))
            saver[0].start()
        else:  # nothing keeps a saver out: save twice now, as another process could
            save_twice()
        return state

    monkeypatch.setattr(store_module.ckpt, "load", load_while_saving)
    r = ReplayStore.restore(tmp_path, memory=mm)
    monkeypatch.setattr(store_module.ckpt, "load", real_load)
    for t in saver:
        t.join(30)
    assert positions(r) == [list(range(1, 41))]
    assert [p.rsplit("-", 1)[1] for p in saved] == ["000001", "000002"]
    folder, digest = latest(tmp_path)
    verify(folder, digest)
    r.close()
    a.close()


def test_a_full_disk_while_naming_a_checkpoint_leaves_the_previous_one(mm, tmp_path, monkeypatch):
    import builtins

    import replay.checkpoint as ckpt

    a = ReplayStore(SPEC, capacity_steps=256, memory=mm, timeout=5.0)
    with a.writer() as w:
        w.add_episode({"pos": np.arange(10)})
    first = a.checkpoint(tmp_path)
    with a.writer() as w:
        w.add_episode({"pos": np.arange(10, 20)})

    def full_open(file, *args, **kw):
        if ".tmp-LATEST-" in str(file):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return builtins.open(file, *args, **kw)

    monkeypatch.setattr(ckpt, "open", full_open, raising=False)
    with pytest.raises(OSError) as err:
        a.checkpoint(tmp_path)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC
    assert latest(tmp_path)[0] == tmp_path / os.path.basename(first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "ckpt-000000"]
    assert len(ReplayStore.restore(tmp_path, memory=mm)) == 10
    assert a.checkpoint(tmp_path).endswith("ckpt-000001")  # the next save goes on from the named one
    a.close()


def test_a_checkpoint_into_a_path_under_a_file_is_refused_naming_it(mm, tmp_path):
    a = ReplayStore(SPEC, capacity_steps=64, memory=mm)
    (tmp_path / "f").write_text("x")
    with pytest.raises(OSError) as err:
        a.checkpoint(tmp_path / "f" / "ck")
    assert err.value.errno == errno.ENOTDIR and "f/ck" in str(err.value)
    a.close()

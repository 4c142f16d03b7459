"""A checkpoint's file work runs in a forked process (`replay.forked_work`): the calling thread's GIL releases
are bounded whatever the store holds, and the forked process's failures come back to the caller.

- the calls into C that release the GIL which the checkpointing thread makes (a file write, an fsync, a
  hash update, a wait for zarr's I/O threads: after each it may wait for the GIL behind a busy writer
  thread) are the same (give or take a read of the pipe) for a store of 40 episodes in one chunk per array
  as for one of 2,000 episodes in hundreds of chunks, and at most 40 (before: hundreds, and more per chunk
  and per MiB hashed);
- the forked process killed part way: the caller raises OSError naming it, the store is let go, LATEST
  still names the previous checkpoint, no temporary is left, the next checkpoint is whole;
- an exception in the forked process is raised by the caller with its type and errno (and the child's
  traceback as a note);
- checkpoints taken while a writer thread of the same process appends are each whole (they verify and
  restore with counters equal to contents).

Counting uses a profile hook (``sys.setprofile``) on the calling thread: it sees every call into C from
Python code, not time, so the bound holds on any machine.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from _stores import SPEC, steps

import replay.checkpoint_write as ckpt_write
from replay import ReplayStore
from replay.checkpoint import latest, load, verify

# calls into C that release the GIL (file and process I/O, waits, hashing): by their __name__
RELEASING = {
    "read", "write", "open", "close", "fsync", "fstat", "stat", "lstat", "scandir", "listdir", "mkdir",
    "rename", "replace", "unlink", "rmdir", "waitpid", "fork", "flock", "acquire", "sleep", "update",
    "sha256", "readinto", "flush", "truncate", "getsize", "is_dir", "exists", "kill",
}


def filled(mm, episodes: int, length: int) -> ReplayStore:
    store = ReplayStore(SPEC, capacity_steps=2 * episodes * length, num_shards=2, memory=mm, timeout=30.0)
    with store.writer() as w:
        for e in range(episodes):
            w.add_episode(steps(e * length, length))
    return store


def c_calls_of_checkpoint(store: ReplayStore, root: Path) -> collections.Counter:
    """The calls into C the calling thread makes in one ``store.checkpoint(root)``, by name."""
    calls: collections.Counter = collections.Counter()

    def hook(frame, event, arg):
        if event == "c_call":
            calls[getattr(arg, "__name__", "?")] += 1

    sys.setprofile(hook)
    try:
        store.checkpoint(root)
    finally:
        sys.setprofile(None)
    return calls


def test_the_checkpointing_threads_calls_into_c_do_not_grow_with_the_store(mm, tmp_path, monkeypatch):
    small = filled(mm, 40, 5)  # 200 steps: one chunk per array
    big = filled(mm, 2000, 5)  # 10,000 steps
    monkeypatch.setattr(ckpt_write, "CHUNK_BYTES", 128 * 8)  # 128-row chunks of pos: 40 a column per shard
    for store, root in ((small, tmp_path / "s"), (big, tmp_path / "b")):
        store.checkpoint(root)  # the previous checkpoint to replace, as in use
    few, many = (c_calls_of_checkpoint(s, r) for s, r in ((small, tmp_path / "s"), (big, tmp_path / "b")))
    chunks = sum(1 for p in Path(latest(tmp_path / "b")[0]).rglob("c/*") if p.is_file())
    assert chunks > 150  # the files the forked process wrote
    releasing = [{name: n for name, n in c.items() if name in RELEASING} for c in (few, many)]
    # the same calls, however many episodes and chunks (the pipe's reads: the child's two messages may
    # come in one read or two, whatever the store)
    for name in set(releasing[0]) | set(releasing[1]):
        assert abs(releasing[0].get(name, 0) - releasing[1].get(name, 0)) <= 1, (name, releasing)
    assert max(sum(r.values()) for r in releasing) <= 40, releasing
    for store in (small, big):
        store.close()


def test_the_forked_process_killed_part_way_raises_and_keeps_the_previous_one(mm, tmp_path, monkeypatch):
    store = filled(mm, 20, 5)
    first = store.checkpoint(tmp_path)
    real = ckpt_write.write_array

    def killed(*args, **kwargs):  # in the forked process
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(ckpt_write, "write_array", killed)
    with pytest.raises(OSError, match=r"ended without a result \(killed by signal SIGKILL\)"):
        store.checkpoint(tmp_path)
    monkeypatch.setattr(ckpt_write, "write_array", real)
    assert not store.storage.control.writers_held  # the store was let go
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "ckpt-000000"]
    assert latest(tmp_path)[0] == Path(first)
    with store.writer() as w:  # writers go on
        w.add_episode(steps(100, 5))
    second = store.checkpoint(tmp_path)
    assert second.endswith("ckpt-000001")
    restored = ReplayStore.restore(tmp_path, memory=mm)
    assert len(restored) == len(store) == 105 and restored.counters() == store.counters()
    restored.close()
    store.close()


def test_an_exception_in_the_forked_process_comes_back_with_its_type(mm, tmp_path, monkeypatch):
    store = filled(mm, 4, 5)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "shard0/pos")

    monkeypatch.setattr(ckpt_write, "write_array", refuse)
    with pytest.raises(PermissionError) as err:
        store.checkpoint(tmp_path)
    assert err.value.errno == 13 and err.value.filename == "shard0/pos"
    assert any("forked process" in note for note in err.value.__notes__)
    assert not store.storage.control.writers_held
    assert list(tmp_path.iterdir()) == []  # no temporary left, nothing named
    store.close()


def test_checkpoints_beside_a_writer_thread_are_whole(mm, tmp_path):
    store = ReplayStore(SPEC, capacity_steps=2048, num_shards=2, memory=mm, timeout=30.0)
    stop = threading.Event()

    def actor():
        i = 0
        with store.writer() as w:
            while not stop.is_set():
                for _ in range(7):
                    w.append({k: v[0] for k, v in steps(i, 1).items()})
                    i += 1
                w.end_episode()

    thread = threading.Thread(target=actor, name="actor")
    thread.start()
    try:
        folders = [store.checkpoint(tmp_path / f"r{k}") for k in range(4)]
    finally:
        stop.set()
        thread.join(60)
    for folder in folders:
        verify(folder)
        state = load(folder)  # counts and the episode index checked against the manifest
        for shard in state["shards"]:
            pos = np.concatenate([np.asarray(shard["columns"]["pos"][...])])
            assert len(pos) == sum(len(p) for p in [shard["steps"]])
            assert (np.asarray(shard["columns"]["tag"][...]) == (pos % 30000)).all()  # rows not torn
    store.close()

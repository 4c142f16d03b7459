"""A checkpoint's counters equal the contents it writes, whatever commit is under way when it is taken.

A commit is admitted (shard chosen, sequence numbers taken) under the control mutex, writes its steps
under its shard's mutex and counts them (steps assigned to the shard, inserts, overwritten deletes)
under the control mutex with the shard's still held (`replay.storage`). A checkpoint holds the
writers, then takes every shard mutex and the control mutex: a commit admitted before it and not yet
at its shard must be wholly outside the snapshot, one that wrote its steps wholly inside. Here a
writer thread is stopped at each point where it holds no lock (a patched shard method, in this
process), a checkpoint is taken and restored, and the restored store's counters are compared with its
contents: inserts = steps held (no holes, no overwrites here), deletes 0, each shard's steps assigned
= its write position, the global sequence past every stored step's number.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _stores import SPEC, steps

from replay import ReplayStore
from replay.control import GSEQ
from replay.rate_limiter import DELETES, INSERTS
from replay.shard_layout import HOLES

PREFILL = [(0, 7), (7, 4), (11, 9)]  # (first pos, steps) of the episodes committed before the test's


def assert_counts_match_contents(store: ReplayStore, steps_held: int) -> None:
    control = store.storage.control
    pos = np.sort(np.concatenate([e.data["pos"] for e in store.episodes()]))
    np.testing.assert_array_equal(pos, np.arange(steps_held))
    assert len(store) == steps_held
    assert int(control.counters[INSERTS]) == steps_held and int(control.counters[DELETES]) == 0
    seqs = []
    for s, sh in enumerate(store.storage.shards):
        assert int(sh.meta[HOLES]) == 0
        assert int(control.assigned[s]) == sh.write_pos, (s, control.assigned, sh.write_pos)
        seqs.append(sh.steps[: sh.write_pos, 1])  # positions 0.. are slots 0.. (no wrap here)
    assert int(np.concatenate(seqs).max()) < int(control.ctl[GSEQ])


def stop_the_writer_thread(monkeypatch, store: ReplayStore, method: str, after: bool):
    """Patch ``method`` of every shard so that the thread named "writer" stops at its first call (before
    the real call, or after it when ``after``) until the returned ``go`` is set; ``reached`` is set
    when it stops. Other threads call through."""
    reached, go = threading.Event(), threading.Event()
    for sh in store.storage.shards:
        real = getattr(sh, method)

        def paused(*args, _real=real, **kwargs):
            stop = threading.current_thread().name == "writer" and not reached.is_set()
            if stop and not after:
                reached.set()
                assert go.wait(60)
            out = _real(*args, **kwargs)
            if stop and after:
                reached.set()
                assert go.wait(60)
            return out

        monkeypatch.setattr(sh, method, paused)
    return reached, go


@pytest.mark.parametrize(
    "method, after",
    [("acquire", False), ("release", True)],
    ids=["admitted, before its shard lock", "written, shard lock let go"],
)
def test_a_checkpoint_of_a_commit_stopped_where_it_holds_no_lock(mm, tmp_path, monkeypatch, method, after):
    store = ReplayStore(SPEC, memory=mm, capacity_steps=256, num_shards=2, timeout=30.0)
    w = store.writer()
    for first, n in PREFILL:
        w.add_episode(steps(first, n))
    reached, go = stop_the_writer_thread(monkeypatch, store, method, after)
    storage, errors = store.storage, []

    def commit():  # the Python steps (no sources), so that the patched methods are called
        try:
            storage.commit(steps(20, 5), 5, None, True, 30.0, storage.new_writer_id())
        except BaseException as exc:  # reported below
            errors.append(exc)
            reached.set()

    writer = threading.Thread(target=commit, name="writer")
    writer.start()
    try:
        assert reached.wait(60) and not errors
        store.checkpoint(tmp_path)  # this thread: the writer holds no lock, so it completes
    finally:
        go.set()
        writer.join(60)
    assert not writer.is_alive() and not errors, errors
    monkeypatch.undo()
    assert_counts_match_contents(store, 25)
    restored = ReplayStore.restore(tmp_path)
    try:
        # admitted before the checkpoint and stopped before its shard: not in it at all; stopped after
        # its shard commit: in it with its counts (the counts come before the shard lock is let go)
        assert_counts_match_contents(restored, 20 if method == "acquire" else 25)
    finally:
        restored.close()
    store.close()


def test_a_compiled_commit_and_a_checkpoint_racing_for_its_shard(mm, tmp_path):
    """A compiled commit admitted before the checkpoint held the writers, then waiting for its shard's
    lock with the checkpoint: whichever takes it first, the snapshot holds the commit with its counts
    or neither."""
    store = ReplayStore(SPEC, memory=mm, capacity_steps=128, num_shards=1, timeout=30.0)
    w = store.writer()
    for first, n in PREFILL:
        w.add_episode(steps(first, n))
    w.release_thread()  # the thread "writer" commits with it below
    control, shard = store.storage.control, store.storage.shards[0]
    gseq = int(control.ctl[GSEQ])
    held, release = threading.Event(), threading.Event()

    def hold_shard():
        with shard:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold_shard, name="holds-shard")
    holder.start()
    assert held.wait(60)
    writer = threading.Thread(target=w.add_episode, args=(steps(20, 5),), name="writer")
    checkpoint = threading.Thread(target=store.checkpoint, args=(tmp_path,), name="checkpoint")
    try:
        writer.start()
        while int(control.ctl[GSEQ]) == gseq:  # admitted: it now waits for the shard's lock
            assert writer.is_alive()
            writer.join(0.001)
        checkpoint.start()
        while not control.writers_held:
            assert checkpoint.is_alive()
            checkpoint.join(0.001)
    finally:
        release.set()
        for t in (holder, writer, checkpoint):
            if t.ident is not None:  # started
                t.join(60)
    assert not (writer.is_alive() or checkpoint.is_alive())
    assert_counts_match_contents(store, 25)
    restored = ReplayStore.restore(tmp_path)
    try:
        assert_counts_match_contents(restored, len(restored))
        assert len(restored) in (20, 25)
    finally:
        restored.close()
    store.close()

"""Issue 32: nothing silently wrong under concurrent use.

- one writer used by two threads is refused, naming both threads (the first thread that writes owns
  it; ownership passes by `TrajectoryWriter.release_thread` or when the owner thread has ended);
- keys carry the identity of the store that issued them: another store's keys are refused by name,
  stale keys of this store stay ignored and counted, restored stores and learners accept theirs;
- concurrent ``checkpoint()`` calls on one root are serialised: distinct folders, none deletes
  another's temporary folder, ``LATEST`` always names a complete checkpoint.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from replay import Prioritized, ReplayStore, TrajectorySpec
from replay.checkpoint import latest, verify

SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((4,), "float32")})


def steps(start: int, n: int) -> dict[str, np.ndarray]:
    pos = np.arange(start, start + n, dtype=np.int64)
    return {"pos": pos, "obs": np.repeat(pos[:, None], 4, axis=1).astype(np.float32)}


def make(mm, **kw) -> ReplayStore:
    kw.setdefault("timeout", 10.0)
    kw.setdefault("capacity_steps", 4096)
    return ReplayStore(SPEC, memory=mm, **kw)


def run_threads(targets: list) -> list[BaseException | None]:
    """Run each callable in its own thread (named T0, T1, ...); return each one's exception or None."""
    errors: list[BaseException | None] = [None] * len(targets)

    def wrap(i, fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[i] = e

    threads = [threading.Thread(target=wrap, args=(i, fn), name=f"T{i}") for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


# ------------------------------------------------------------------------------ 1. one writer, two threads


def test_writer_refuses_a_second_thread_naming_both(mm):
    store = make(mm, capacity_steps=1 << 17)
    w = store.writer()
    go = threading.Barrier(2)
    done = threading.Barrier(2)  # both threads stay alive until both have written (or been refused)

    def write(base):
        def fn():
            go.wait()
            try:
                for e in range(200):
                    for i in range(100):
                        w.append({k: v[0] for k, v in steps(base + e * 100 + i, 1).items()})
                    w.end_episode()
            finally:
                done.wait()
        return fn

    errors = run_threads([write(0), write(1_000_000)])
    refused = [e for e in errors if e is not None]
    assert len(refused) == 1, errors
    assert isinstance(refused[0], RuntimeError)
    msg = str(refused[0])
    assert "'T0'" in msg and "'T1'" in msg and "store.writer()" in msg
    # the owner's 20,000 steps are stored exactly, each once; nothing of the refused thread's
    pos = np.sort(np.concatenate([ep.data["pos"] for ep in store.episodes()]))
    owner = 0 if errors[0] is None else 1
    expected = np.arange(owner * 1_000_000, owner * 1_000_000 + 20_000)
    assert len(pos) == 20_000
    np.testing.assert_array_equal(pos, expected)
    store.close()


def test_writer_made_in_main_used_by_one_worker_thread(mm):
    store = make(mm)
    w = store.writer()  # made here, used only by the worker: the first thread that writes owns it

    def work():
        w.extend(steps(0, 50))
        w.end_episode()

    assert run_threads([work]) == [None]
    assert len(store) == 50
    # the worker has ended: the writer passes to the next thread that writes (this one)
    w.extend(steps(50, 5))
    w.end_episode()
    assert len(store) == 55 and w.steps_written == 55
    store.close()


def test_writer_release_thread_hands_it_over(mm):
    store = make(mm)
    w = store.writer()
    w.extend(steps(0, 3))  # this thread owns it now
    w.end_episode()
    errors = run_threads([lambda: w.extend(steps(3, 2))])
    assert isinstance(errors[0], RuntimeError) and "extend" in str(errors[0])
    assert w.pending == 0
    w.release_thread()
    assert run_threads([lambda: (w.extend(steps(3, 2)), w.end_episode())]) == [None]
    assert len(store) == 5
    w.close()
    store.close()


# ------------------------------------------------------------------------------ 2. keys of another store


def filled(mm, **kw) -> ReplayStore:
    store = make(mm, selector=Prioritized(1.0), seed=3, capacity_steps=256, num_shards=2, **kw)
    with store.writer() as w:
        for e in range(8):
            w.extend(steps(e * 10, 10))
            w.end_episode()
    return store


def test_foreign_keys_are_refused_by_name(mm):
    a, d = filled(mm), filled(mm)
    assert a.store_id != d.store_id
    mass = a.stats()["priority_mass"]
    keys = d.sample(8).keys
    with pytest.raises(ValueError) as err:
        a.update_priorities(keys, np.full(8, 50.0))
    msg = str(err.value)
    assert "keys" in msg and "8 of 8" in msg and f"{d.store_id:#018x}" in msg and f"{a.store_id:#018x}" in msg
    assert a.stats()["priority_mass"] == mass  # nothing changed
    # the issuer survives pickling (the tensor a batch hands out, sent to another process)
    with pytest.raises(ValueError, match="8 of 8"):
        a.update_priorities(pickle.loads(pickle.dumps(keys)), np.full(8, 50.0))
    assert a.stats()["priority_mass"] == mass
    # d's own keys apply
    assert d.update_priorities(keys, np.full(8, 50.0)) == 8
    a.close()
    d.close()


def test_stale_keys_of_this_store_stay_ignored_and_counted(mm):
    store = make(mm, selector=Prioritized(1.0), seed=1, capacity_steps=32)
    w = store.writer()
    w.extend(steps(0, 16))
    w.end_episode()
    old = store.sample(16).keys
    w.extend(steps(16, 24))  # overwrites positions 0..7 (capacity 32)
    w.end_episode()
    from replay.keys import decode_keys

    live = int((decode_keys(old.numpy())[1] >= 8).sum())
    assert 0 < live < 16
    assert store.update_priorities(old, np.full(16, 2.0)) == live
    store.close()


def test_keys_before_a_checkpoint_apply_after_restore(mm, tmp_path):
    a = filled(mm)
    keys = a.sample(8).keys
    a.checkpoint(tmp_path)
    r1 = ReplayStore.restore(tmp_path, memory=mm)
    r2 = ReplayStore.restore(tmp_path, memory=mm)
    assert r1.store_id not in (a.store_id, r2.store_id)
    assert r1.update_priorities(keys, np.full(8, 5.0)) == 8  # keys drawn before the save
    assert r1.update_priorities(r1.sample(4).keys, np.full(4, 5.0)) == 4
    with pytest.raises(ValueError, match="4 of 4"):  # two restores of one checkpoint are two stores
        r2.update_priorities(r1.sample(4).keys, np.full(4, 5.0))
    for s in (a, r1, r2):
        s.close()


def test_learner_keys_are_the_owners(mm):
    a, d = filled(mm), filled(mm)
    learner = a.learner()
    try:
        b = learner.sample(8)
        assert a.update_priorities(b.keys, np.full(8, 3.0)) == 8
        assert learner.update_priorities(a.sample(8).keys, np.full(8, 3.0)) == 8
        with pytest.raises(ValueError, match="8 of 8"):
            learner.update_priorities(d.sample(8).keys, np.full(8, 3.0))
        with pytest.raises(ValueError, match="8 of 8"):
            d.update_priorities(b.keys, np.full(8, 3.0))
    finally:
        learner.close()
        a.close()
        d.close()


# ------------------------------------------------------------------------------ 3. concurrent checkpoints


def _write_until(handle, stop) -> None:  # a forked actor process: 7-step episodes until ``stop``
    store = ReplayStore.attach(handle)
    w = store.writer()
    i = 0
    while not stop.is_set():
        w.extend(steps(i, 7))
        w.end_episode()
        i += 7
    w.close()
    store.close()


def writer_running(store: ReplayStore, stop) -> mp.process.BaseProcess:
    """A writer committing back to back into ``store`` from another process (attached by handle), as actors
    do, until ``stop`` (a ``multiprocessing`` event). Not a thread of this process: one that holds the GIL
    between its commits makes every GIL-releasing call of a checkpoint's file work wait for it (about 5 ms
    each, CPython's switch interval), which slowed each checkpoint several times over and is not what these
    tests check."""
    proc = mp.get_context("fork").Process(target=_write_until, args=(store.handle(), stop), name="writer")
    proc.start()
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("threads", [2, 4])
def test_concurrent_checkpoints_are_serialised(mm, tmp_path, threads):
    store = make(mm, capacity_steps=2048, num_shards=2, timeout=30.0)
    stop = mp.get_context("fork").Event()
    wt = writer_running(store, stop)
    seen: list[str] = []
    try:
        rounds = 10  # the bug showed in 2 rounds of 10 (FileNotFoundError) and 19 of 20 (one folder twice)
        for r in range(rounds):
            root = tmp_path / "root"
            go = threading.Barrier(threads)
            got: list[str | None] = [None] * threads

            def call(i, go=go, got=got, root=root):
                go.wait()
                got[i] = store.checkpoint(root)

            errors = run_threads([(lambda i=i: call(i)) for i in range(threads)])
            assert errors == [None] * threads, (r, errors)
            assert len(set(got)) == threads, (r, got)  # every call its own folder
            assert not set(got) & set(seen), (r, got)
            seen.extend(got)
            numbers = sorted(int(Path(g).name.split("-")[1]) for g in got)
            assert numbers == list(range(r * threads, (r + 1) * threads))
            folder, digest = latest(root)
            assert folder.name == f"ckpt-{(r + 1) * threads - 1:06d}"
            verify(folder, digest)  # LATEST names a complete checkpoint
            kept = sorted(p.name for p in root.iterdir() if p.name.startswith("ckpt-"))
            assert kept == sorted(Path(g).name for g in got)[-2:]  # the latest and the previous
            assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
            for name in kept if r == rounds - 1 else ():  # each kept call's folder restores
                restored = ReplayStore.restore(root / name, memory=mm)
                assert len(restored) > 0
                restored.close()
    finally:
        stop.set()
        wt.join(60)
        if wt.is_alive():
            wt.kill()
    assert wt.exitcode == 0  # the writer committed until told to stop
    store.close()


def test_checkpoint_leaves_other_processes_temporary_folders(mm, tmp_path):
    store = make(mm)
    with store.writer() as w:
        w.extend(steps(0, 10))
    live = tmp_path / f".tmp-{os.getppid()}-abcdef01"  # a live process's checkpoint in progress
    live.mkdir(parents=True)
    (live / "part").write_bytes(b"x")
    dead_pid = 2**22 + 12345  # above pid_max's default: no such process
    dead = tmp_path / f".tmp-{dead_pid}-abcdef02"
    dead.mkdir()
    store.checkpoint(tmp_path)
    assert live.is_dir() and (live / "part").read_bytes() == b"x"
    assert not dead.exists()
    assert re.fullmatch(r"ckpt-000000 [0-9a-f]{64}\n", (tmp_path / "LATEST").read_text())
    store.close()

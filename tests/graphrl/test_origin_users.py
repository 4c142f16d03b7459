"""The users of `graphrl.process_origin.ProcessOrigin` in real processes: shared segments, spill arrays and a
manager's exit cleanup are removed by the process that made them only, and a learner's per-process state is
remade in a fork child. Each fork child below also sees its maker's pid (``os.getpid`` patched, as where a
pid is reused): a pid compared with ``os.getpid()`` takes it for the maker, its origin does not. Segments
are checked by name in ``/dev/shm`` and by value; children are joined with a timeout."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from graphrl.memory import MemoryManager, Region

SHM = Path("/dev/shm")
TIMEOUT_S = 120
FORK, SPAWN = mp.get_context("fork"), mp.get_context("spawn")

# Run as ``python -c``: a manager makes a shared region and a spill array, forks (os.fork: the child leaves
# through the interpreter's exit, where the manager's weakref.finalize and multiprocessing Finalize run
# its exit cleanup; multiprocessing's Finalize compares pids, so it runs in this child), and the child,
# seeing the parent's pid, does CHILD_MODE to what it inherited. The parent then reports what is left,
# attaches the segment by name to read it, and closes its manager or just exits (PARENT_END).
_FORKING_OWNER = """
import json, os, sys
import numpy as np
from graphrl.memory import MemoryManager, Region, unlink_shared_segments
spill, child_mode, parent_end = sys.argv[1:4]
mm = MemoryManager(spill_dir=spill)
shared = mm.allocate(1000, "int64", "shared", owner="t")
shared.write(np.arange(1000))
disk = mm.allocate(10, "int64", "disk", owner="t")
disk.write(np.arange(10) * 3)
parent = os.getpid()
child = os.fork()
if child == 0:
    os.getpid = lambda: parent  # a reused pid: the bare-pid rule took this child for the maker
    seen = int(shared.numpy().sum())
    if child_mode == "unlink":
        shared.unlink()
    elif child_mode == "free":
        shared.free()
        disk.free()
    elif child_mode == "close":
        mm.close()
    elif child_mode == "signal":  # what the SIGTERM/SIGHUP handler runs
        unlink_shared_segments(remove_spill=True)
    sys.exit(0 if seen == 499500 else 3)  # the interpreter's exit: atexit runs the exit cleanup here
_, status = os.waitpid(child, 0)
named = os.path.exists("/dev/shm/" + shared.name)
attached = Region.attach(shared.handle()) if named else None
report = {
    "child_exit": os.waitstatus_to_exitcode(status),
    "named": named,
    "attached": attached.numpy().tolist() if attached is not None else None,
    "own": shared.numpy().tolist(),
    "spill": disk.path.exists(),
    "disk": disk.numpy().tolist() if disk.path.exists() else None,
    "name": shared.name,
    "path": str(disk.path),
}
if attached is not None:
    attached.free()
print(json.dumps(report), flush=True)
if parent_end == "close":
    mm.close()
"""


@pytest.mark.parametrize(
    ("child_mode", "parent_end"),
    [("exit", "exit"), ("unlink", "close"), ("free", "close"), ("close", "exit"), ("signal", "close")],
)
def test_a_fork_child_of_the_owner_leaves_its_segments_and_spill_arrays_to_the_owner(
    tmp_path, child_mode, parent_end
):
    """The child exits (and before that unlinks, frees, closes the manager, or runs the signal cleanup)
    without removing what its parent made; the parent still reads both by value, attaches the segment by
    name, and its close or exit removes them (nothing left by name)."""
    out = subprocess.run(
        [sys.executable, "-c", _FORKING_OWNER, str(tmp_path), child_mode, parent_end],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["child_exit"] == 0  # the child saw the parent's values through its inherited mapping
    assert report["named"] and report["spill"], report  # nothing of the parent's was removed by the child
    assert report["attached"] == report["own"] == list(range(1000))
    assert report["disk"] == [3 * i for i in range(10)]
    assert not (SHM / report["name"]).exists()  # the parent's close or exit removed them
    assert not Path(report["path"]).exists() and list(tmp_path.iterdir()) == []
    assert "Traceback" not in out.stderr, out.stderr


def _child_allocates_on_the_inherited_manager(mm, out) -> None:  # a fork child
    freed = mm.allocate(64, "uint8", "shared", owner="child")
    unlinked = mm.allocate(64, "uint8", "shared", owner="child")
    made = [(SHM / r.name).exists() for r in (freed, unlinked)]
    freed.free()
    unlinked.unlink()
    out.send((made, [freed.name, unlinked.name], [(SHM / r.name).exists() for r in (freed, unlinked)]))
    unlinked.free()


def test_a_segment_a_fork_child_creates_is_its_own_to_unlink(mm):
    """A child that allocates on the manager it inherited made those segments: its free and unlink remove
    their names (each segment records its own creator, not its manager's), and the parent's stay."""
    kept = mm.allocate(8, "int64", "shared", owner="parent")
    kept.write(np.arange(8))
    ours, theirs = FORK.Pipe()
    child = FORK.Process(target=_child_allocates_on_the_inherited_manager, args=(mm, theirs))
    child.start()
    assert ours.poll(TIMEOUT_S), "the fork child sent nothing"
    made, names, after = ours.recv()
    child.join(TIMEOUT_S)
    assert child.exitcode == 0
    assert made == [True, True] and after == [False, False]
    assert not any((SHM / name).exists() for name in names)
    assert all(not name.startswith(mm.shm_prefix) for name in names)  # named after the child
    assert (SHM / kept.name).exists() and kept.numpy().tolist() == list(range(8))


def _spawned_attacher(region, handle, out) -> None:  # a spawned process: the region arrives as its handle
    from graphrl.memory import MemoryManager, Region, unlink_shared_segments

    own = MemoryManager()
    attached = [region, Region.attach(handle), own.attach(handle)]
    seen = [a.numpy().tolist() for a in attached]
    attached[1].tensor()[0] = -5  # visible to the owner
    refused = []
    for a in attached:
        try:
            a.unlink()
        except ValueError as err:
            refused.append("only its owner" in str(err))
    unlink_shared_segments(remove_spill=True)
    attached[0].free()
    attached[1].free()
    own.close()  # frees what it attached
    out.put((seen, refused))


def test_a_spawned_attacher_never_unlinks(mm):
    """A spawned process that attaches a segment (a pickled region, a handle, its own manager's attach),
    tries to unlink it, runs the signal cleanup, frees, closes its manager and exits: the name stays and the
    owner reads the attacher's write; the owner's close removes the name."""
    region = mm.allocate(6, "int64", "shared", owner="owner")
    region.write(np.arange(6) * 10)
    queue = SPAWN.Queue()
    child = SPAWN.Process(target=_spawned_attacher, args=(region, region.handle(), queue))
    child.start()
    seen, refused = queue.get(timeout=TIMEOUT_S)
    child.join(TIMEOUT_S)
    assert child.exitcode == 0
    assert seen == [[0, 10, 20, 30, 40, 50]] * 3 and refused == [True, True, True]
    assert (SHM / region.name).exists()
    assert region.numpy().tolist() == [-5, 10, 20, 30, 40, 50]
    again = Region.attach(region.handle())  # still attachable by name
    assert again.numpy().tolist() == [-5, 10, 20, 30, 40, 50]
    again.free()
    name = region.name
    mm.close()
    assert not (SHM / name).exists()


def _forked_learner_samples(learner, parent: int, out) -> None:  # a fork child
    os.getpid = lambda: parent  # a reused pid: the bare-pid rule reused the parent's state (its held lock)
    with learner.sample(16, window=4, timeout=30) as batch:
        out.send(batch.keys.numpy().copy())
    learner.close()


def test_a_fork_child_of_a_learner_in_use_makes_its_own_state(monkeypatch):
    """A learner whose state in the parent is busy (a thread waits in a draw, holding the connection's
    lock) is forked: the child, seeing the parent's pid, connects and samples on its own state (reusing the
    parent's, it waited forever on the copied held lock); the parent's draw then completes."""
    from replay import ReplayStore, TrajectorySpec, Uniform
    from replay.table import Table

    drawing, resume = threading.Event(), threading.Event()
    real, first = Table.draw, [True]

    def held_draw(self, *args):
        got = real(self, *args)
        if first[0]:
            first[0] = False
            drawing.set()
            resume.wait(TIMEOUT_S)
        return got

    monkeypatch.setattr(Table, "draw", held_draw)  # in this (the owner's) process: the service's draws
    spec = TrajectorySpec({"t": ((), "int32"), "obs": ((3,), "float32")})
    with MemoryManager() as memory:
        store = ReplayStore(spec, 200, num_shards=1, selector=Uniform(), memory=memory, timeout=60)
        with store.writer() as writer:
            t = np.arange(50, dtype=np.int32)
            writer.extend({"t": t, "obs": np.stack([t, t, t], axis=1).astype(np.float32)})
            writer.end_episode()
        learner = store.learner()
        parent_batch: list = []
        busy = threading.Thread(target=lambda: parent_batch.append(learner.sample(16, window=4, timeout=60)))
        busy.start()
        try:
            assert drawing.wait(TIMEOUT_S), "the parent's draw never reached the owner"
            ours, theirs = FORK.Pipe()
            child = FORK.Process(target=_forked_learner_samples, args=(learner, os.getpid(), theirs))
            child.start()
            got = ours.recv() if ours.poll(60) else None
            child.join(10)
            if child.exitcode is None:
                child.kill()
                child.join()
        finally:
            resume.set()
            busy.join(TIMEOUT_S)
        assert got is not None, "the fork child hung on the parent's learner state"
        assert child.exitcode == 0
        assert store.update_priorities(got, np.ones(16)) == 16  # the child's keys: the store's own
        batch = parent_batch[0]
        assert batch.keys.shape == (16,) and store.update_priorities(batch.keys, np.ones(16)) == 16
        batch.release()
        learner.close()
        store.close()

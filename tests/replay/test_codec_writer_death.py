"""A writer killed (SIGKILL) in the middle of committing compressed chunks leaves the store consistent: the
commit's positions become a hole, no half-written chunk is ever decoded, the steps committed before it
(some of them in the same chunk as the dead commit's first steps) sample exactly, the counts are right,
and later commits and checkpoints work.

The death is real: a forked writer commits through the Python steps (`replay.shard.ShardStorage.commit`)
and kills itself (SIGKILL, under the shard lock) just before a chosen line of
`replay.chunk_codec.ChunkRing.apply` runs: before the chunks' bytes and slots are stored (the compiled
`store_chunks`, which writes each slot's chunk index last), before the arena head moves, before the raw tail
is written, before the last position is published.
"""

from __future__ import annotations

import inspect
import multiprocessing as mp
import os
import signal
import sys

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from replay import ReplayStore, TrajectorySpec
from replay.chunk_codec import ChunkRing
from replay.shard_layout import HOLES, WRITE_POS

SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((4, 6), "uint8", "lz4", 1.0, 4)})
KILL_BEFORE = [
    "store_chunks(",  # chunks compressed and placed, nothing stored
    "self.meta[_HEAD] =",  # every chunk published, head not moved
    "self.tail[lo - k1 * c",  # the full chunks' positions published, tail not written
    "self.meta[_NEXT] = end",  # all but the last position
]


def steps(start: int, n: int) -> dict[str, np.ndarray]:
    p = np.arange(start, start + n, dtype=np.int64)
    obs = np.zeros((n, 4, 6), np.uint8)
    obs[:, 0, 0] = p % 251
    obs[:, 3, 1:] = 7
    return {"pos": p, "obs": obs}


def line_of(text: str) -> int:
    """The line number in chunk_codec.py of the line of `ChunkRing.apply` containing ``text``."""
    lines, first = inspect.getsourcelines(ChunkRing.apply)
    hits = [first + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def commit_then_die(handle, start: int, n: int, line: int) -> None:  # runs in a forked process
    code = ChunkRing.apply.__code__

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None
        if event == "line" and frame.f_lineno == line:
            os.kill(os.getpid(), signal.SIGKILL)
        return tracer

    storage = ReplayStore.attach(handle).storage  # no sources: the Python steps, which call apply
    sys.settrace(tracer)
    storage.commit(steps(start, n), n, None, True, None, storage.new_writer_id())
    sys.settrace(None)


def check_sampled(store: ReplayStore, window: int) -> set[int]:
    """Sample; every real step's frame is its position's; return the positions seen."""
    seen: set[int] = set()
    with store.sample(64, window) as b:
        m = b.mask.numpy()
        pos = b["pos"].numpy()[m]
        assert (b["obs"].numpy()[m] == steps(0, 64)["obs"][pos]).all()
        assert (b["obs"].numpy()[~m] == 0).all()
        seen.update(pos.tolist())
    return seen


@pytest.mark.parametrize("kill_before", KILL_BEFORE)
def test_a_writer_killed_inside_a_compressed_commit_leaves_the_store_consistent(kill_before):
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 16, 1, memory=mm, seed=0, timeout=10.0)
        with store.writer() as w:
            w.add_episode(steps(0, 6))  # chunk 0 compressed, positions 4 and 5 raw in the tail
        proc = mp.get_context("fork").Process(target=commit_then_die, args=(store.handle(), 6, 8,
                                                                            line_of(kill_before)))
        proc.start()
        proc.join(60)
        assert proc.exitcode == -signal.SIGKILL
        sh = store.storage.shards[0]
        assert len(store) == 6  # the repair (on the next lock) makes positions 6..13 a hole
        assert int(sh.meta[WRITE_POS]) == 14 and int(sh.meta[HOLES]) == 8
        for window in (1, 3):
            assert check_sampled(store, window) == set(range(6))
        ring = sh.chunks["obs"]
        out = np.empty((6, 4, 6), np.uint8)
        with sh:
            ring.read(np.arange(6), out)
        assert (out == steps(0, 6)["obs"]).all()
        with store.writer() as w:  # past the hole and around the ring: floor 26 - 16 = 10
            w.add_episode(steps(14, 12))
        assert len(store) == 12 and int(sh.meta[HOLES]) == 8
        assert check_sampled(store, 1) | check_sampled(store, 4) == set(range(14, 26))
        store.close()

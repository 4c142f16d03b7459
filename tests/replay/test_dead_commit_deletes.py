"""A writer killed inside a commit that overwrote items: the repair counts those items as deleted, so
the rate limiter's size (inserts - deletes) stays the number of items the table can draw, ``len(store)``
leaves the hole out, and a sample of a store left with nothing to draw raises ``TimeoutError`` at its
timeout instead of spinning. Every repairer is held to it: the compiled transition sample, the
compiled commit, the Python shard lock (``len``), the window path. Also the sampler's guard for a
limiter that admits while the table has nothing (counters set by hand) on both sample paths.

The death is real: a forked writer commits through the Python steps
(`replay.shard.ShardStorage.commit`) with its copy kernel replaced by one that copies one field and
kills the process, so the shard's reservation and its ``RESERVE_DELETES`` are what the commit wrote.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from replay import MinSize, ReplayStore, TrajectorySpec
from replay.commit_kernel import count_overwritten
from replay.shard_layout import HOLE_END, HOLES, RESERVE_DELETES, RESERVE_POS, WRITE_POS

SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((3,), "float32")})


def steps(start: int, n: int) -> dict[str, np.ndarray]:
    p = np.arange(start, start + n, dtype=np.int64)
    return {"pos": p, "obs": (p[:, None] * 10 + np.arange(3)).astype(np.float32)}


def commit_then_die(handle, start: int, n: int) -> None:  # runs in a forked process
    import replay.shard as shard

    def copy_then_die(rings, srcs, row_bytes, capacity, first, count, *rest):
        rb = int(row_bytes[0])  # one field's first rows copied, then death under the shard lock
        k = min(count, capacity - first) * rb
        rings[0][first * rb : first * rb + k] = srcs[0][:k]
        os.kill(os.getpid(), signal.SIGKILL)

    shard.write_steps = copy_then_die  # the Python commit's kernel, looked up per call
    storage = ReplayStore.attach(handle).storage  # no sources: the Python steps, which call write_steps
    storage.commit(steps(start, n), n, None, True, None, storage.new_writer_id())


def kill_mid_commit(store: ReplayStore, start: int, n: int) -> None:
    proc = mp.get_context("fork").Process(target=commit_then_die, args=(store.handle(), start, n))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL


def fill(store: ReplayStore, start: int, n: int) -> None:
    with store.writer(chunk_steps=4) as w:
        w.extend(steps(start, n))
        w.end_episode()


def timed_out_sample(store: ReplayStore, window: int) -> TimeoutError:
    """``store.sample(4, window, timeout=0.2)`` in a thread joined with a 60 s bound: the
    ``TimeoutError`` it must raise."""
    out: dict = {}

    def run() -> None:
        try:
            store.sample(4, window, timeout=0.2)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            out["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the sample did not return within 60 s"
    assert isinstance(out.get("error"), TimeoutError), out
    return out["error"]


def repair_by(store: ReplayStore, how: str, written: list[int]):
    """Let one repairer find the dead commit: returns the batch it drew (or None)."""
    if how == "transition sample":  # replay.transition_kernel.sample_transitions
        return store.sample(64, 1)
    if how == "window sample":  # Table.draw under the shard locks taken in Python
        return store.sample(64, 9)
    if how == "short window sample":  # the same compiled call with windows (its ``window``)
        return store.sample(64, 2)
    if how == "len":  # ShardStorage.acquire in Python
        len(store)
        return None
    if how == "compiled commit":  # replay.commit_kernel.commit_chunk: 2 steps after the hole
        fill(store, 1000, 2)
        written[:] = [*written[2:], 1000, 1001]  # they overwrite positions 8 and 9
        return None
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["transition sample", "window sample", "short window sample", "len", "compiled commit"]
)
def test_the_items_a_dead_commit_overwrote_are_counted_deleted(how):
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 16, 1, memory=mm, seed=3, timeout=10.0)
        fill(store, 0, 16)  # full: the next commit overwrites positions 0..
        store.sample(4).release()  # everything ingested
        sh = store.storage.shards[0]
        # 2 of the items it will overwrite were already removed: 6 items, not 8, leave the table
        store.table.state.state[0, [1, 5]] = 0  # not LIVE in the selector ...
        sh.steps[[1, 5], 2] |= 1  # ... and EXHAUSTED in the index, as max_times_sampled leaves them
        store.storage.control.count_deletes(2)  # ... and counted deleted
        c0 = store.counters()
        kill_mid_commit(store, 500, 8)
        assert int(sh.meta[RESERVE_POS]) == 24 and int(sh.meta[WRITE_POS]) == 16
        assert int(sh.meta[RESERVE_DELETES]) == 6 == count_overwritten(sh.steps, 16, 0, 8)
        written = list(range(8, 16))
        batch = repair_by(store, how, written)
        extra = 2 if how == "compiled commit" else 0  # steps committed after the hole (items overwritten)
        assert int(sh.meta[WRITE_POS]) == 24 + extra and int(sh.meta[HOLES]) == 8
        assert int(sh.meta[RESERVE_DELETES]) == 0  # counted once (and a finished commit clears it)
        c = store.counters()
        assert c["deletes"] == c0["deletes"] + 6 + extra and c["inserts"] == c0["inserts"] + extra
        live, _ = store.selector_mass()
        assert live == len(store) == 8 == c["inserts"] - c["deletes"]
        if batch is not None:
            assert set(batch["pos"].numpy()[batch.mask.numpy()].tolist()) <= set(written)
            batch.release()
        b = store.sample(256, 1)
        assert set(b["pos"].numpy()[:, 0].tolist()) <= set(written)  # never the hole, never overwritten
        b.release()
        assert int(sh.meta[HOLE_END]) == 24  # the newest hole ends there
        fill(store, 2000, 16 - extra)  # the ring's floor (40 - 16) reaches the hole's end
        assert len(store) == 16 == store.selector_mass()[0]
        store.close()


def ring_of_8(mm: MemoryManager) -> ReplayStore:
    """One shard of 8 steps, sampled from the first step on (MinSize(1))."""
    return ReplayStore(SPEC, 8, 1, rate_limiter=MinSize(1), memory=mm, seed=3, timeout=10.0)


@pytest.mark.parametrize("window", [1, 3])
def test_a_store_whose_every_item_a_dead_commit_overwrote_times_out_a_sample(window, tmp_path):
    with MemoryManager() as mm:
        store = ring_of_8(mm)
        fill(store, 0, 8)
        store.sample(2).release()
        kill_mid_commit(store, 100, 8)  # a chunk as large as the ring: every item goes
        assert "fewer than min_size=1" in str(timed_out_sample(store, window))
        assert store.counters()["deletes"] == 8 and len(store) == 0
        store.checkpoint(tmp_path)  # the hole travels: the restored store holds no step either
        restored = ReplayStore.restore(tmp_path, memory=mm)
        assert len(restored) == 0 and restored.counters() == store.counters()
        restored.close()
        fill(store, 200, 3)  # inserts end the wait: the store draws again
        b = store.sample(16, window)
        assert set(b["pos"].numpy()[b.mask.numpy()].tolist()) <= {200, 201, 202}
        b.release()
        store.close()


@pytest.mark.parametrize("window", [1, 3])
def test_a_limiter_that_admits_an_empty_table_times_out_a_sample(window):
    with MemoryManager() as mm:
        store = ring_of_8(mm)
        store.storage.control.counters[0] += 5  # 5 inserts counted that no shard holds
        err = timed_out_sample(store, window)
        assert "timeout=0.2" in str(err) and "counts 5 sampleable items but the table held none" in str(err)
        assert store.counters() == {"inserts": 5, "samples": 0, "deletes": 0}  # nothing counted
        store.close()

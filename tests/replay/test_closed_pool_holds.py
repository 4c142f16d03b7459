"""A closed staging pool still honours `graphrl.tensors.StagingBuffer.hold_until`: its region is freed only
once every buffer is back and no announced copy reads a slot, checked without a host wait
(`StagingPool.settle`); `replay.batch_staging.BatchStaging` evicting a pool (more than 4 shapes) never waits
on the host. Fake events stand for CUDA ones (``query`` / ``synchronize``), as in test_batch_hold_until."""

from __future__ import annotations

import pytest
import torch
from _fakes import FakeEvent

from graphrl.memory import MemoryManager
from graphrl.tensors import StagingPool
from replay.batch_staging import BatchStaging
from replay.spec import TrajectorySpec

SPEC = TrajectorySpec({"obs": ((3,), "float32"), "action": ((), "int64")})


def regions(mm: MemoryManager, owner: str) -> int:
    """Live regions of ``owner`` over every tier."""
    stats = mm.stats()
    return sum(stats[tier].get(owner, {}).get("regions", 0) for tier in ("pinned", "host", "device"))


def test_a_hold_after_close_keeps_the_region_until_the_copy_completes():
    with MemoryManager() as mm:
        pool = StagingPool(mm, (4,), "float32", 2, "host", owner="t")
        buf, other = pool.acquire(), pool.acquire()
        pool.close()
        event = FakeEvent()
        buf.hold_until(event)  # a copy of a batch still held from the closed pool
        buf.release()
        other.release()
        assert not pool.region.freed and not pool.settle()  # every slot back, the copy still reading one
        assert regions(mm, "t") == 1
        event.done = True
        assert pool.settle() and pool.region.freed and regions(mm, "t") == 0
        assert event.synchronized == 0  # nothing waited on the host
        assert pool.settle()  # idempotent


def test_a_closed_pool_frees_its_region_when_its_last_buffer_comes_back():
    with MemoryManager() as mm:
        pool = StagingPool(mm, (4,), "float32", 2, "host", owner="t")
        buf = pool.acquire()
        buf.tensor.copy_(torch.arange(4.0))
        pool.close()
        assert not pool.region.freed and regions(mm, "t") == 1
        assert buf.tensor.tolist() == [0.0, 1.0, 2.0, 3.0]  # still valid memory
        buf.release()
        assert pool.region.freed and regions(mm, "t") == 0
        with pytest.raises(ValueError, match="is closed"):
            pool.acquire(0)


def test_close_waits_for_announced_copies_unless_told_not_to():
    with MemoryManager() as mm:
        for wait in (True, False):
            pool = StagingPool(mm, (4,), "float32", 1, "host", owner="t")
            buf = pool.acquire()
            event = FakeEvent()
            buf.hold_until(event)
            buf.release()
            pool.close(wait=wait)
            assert event.synchronized == int(wait) and pool.region.freed == wait
            if not wait:
                event.done = True
                assert pool.settle() and pool.region.freed
            pool.close()  # a second close is harmless


def test_a_view_left_by_release_when_unused_keeps_its_memory_not_the_region():
    with MemoryManager() as mm:
        pool = StagingPool(mm, (4,), "float32", 1, "host", owner="t")
        buf = pool.acquire()
        buf.tensor.copy_(torch.arange(4.0))
        view = buf.tensor[1:]
        pool.close()
        buf.release_when_unused()  # released: no copy can be announced any more
        assert pool.settle() and pool.region.freed and regions(mm, "t") == 0
        assert view.tolist() == [1.0, 2.0, 3.0]  # still valid memory


def test_batch_staging_evicts_a_pool_with_a_pending_copy_without_waiting_and_frees_it_later():
    with MemoryManager() as mm:
        staging = BatchStaging(SPEC, mm, slots=2, timeout=1.0)
        first = staging.acquire(4, 1, None, 1.0)
        event = FakeEvent()
        first.buffer.hold_until(event)  # Batch.to("cuda", non_blocking=True) of a batch of that shape
        first.buffer.release()
        for b in (5, 6, 7, 8):  # the fourth newer shape evicts (closes) the first one's pool
            staging.acquire(b, 1, None, 1.0).buffer.release()
        assert event.synchronized == 0  # no host wait under the staging's lock
        assert regions(mm, "replay.staging") == 5  # the evicted pool's memory: the copy may still read it
        staging.acquire(8, 1, None, 1.0).buffer.release()
        assert regions(mm, "replay.staging") == 5
        event.done = True
        staging.acquire(8, 1, None, 1.0).buffer.release()  # an acquire frees what nothing reads any more
        assert regions(mm, "replay.staging") == 4 and event.synchronized == 0
        staging.close()
        assert regions(mm, "replay.staging") == 0


def test_batch_staging_close_waits_for_an_evicted_pools_copies():
    with MemoryManager() as mm:
        staging = BatchStaging(SPEC, mm, slots=1, timeout=1.0)
        first = staging.acquire(4, 1, None, 1.0)
        event = FakeEvent()
        first.buffer.hold_until(event)
        first.buffer.release()
        for b in (5, 6, 7, 8):
            staging.acquire(b, 1, None, 1.0).buffer.release()
        staging.close()
        assert event.synchronized == 1 and regions(mm, "replay.staging") == 0

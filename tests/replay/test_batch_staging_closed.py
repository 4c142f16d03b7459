"""A closed staging pool as a plain answer (`graphrl.tensors.StagingPool.acquire`'s ``if_open``) and
`replay.batch_staging.BatchStaging.acquire` over it: a pool evicted by a new shape is made again, a
closed staging raises ``ValueError`` naming the pool."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from graphrl.memory import MemoryManager
from graphrl.tensors import StagingPool
from replay.batch_staging import BatchStaging
from replay.spec import TrajectorySpec

SPEC = TrajectorySpec({"obs": ((3,), "float32"), "action": ((), "int64")})


def test_if_open_gives_none_for_a_closed_pool_and_raises_without_it():
    with MemoryManager() as mm:
        pool = StagingPool(mm, 16, "int64", slots=1, tier="host", owner="t.pool")
        buf = pool.acquire(0, True)
        assert buf is not None and buf.tensor.numel() == 16
        buf.release()
        pool.close()
        assert pool.acquire(0, True) is None
        with pytest.raises(ValueError, match=r"^staging pool 't\.pool' is closed"):
            pool.acquire(0)


def test_if_open_gives_none_when_the_pool_closes_during_the_wait():
    with MemoryManager() as mm:
        pool = StagingPool(mm, 16, "int64", slots=1, tier="host", owner="t.pool")
        held = pool.acquire()
        out = []
        t = threading.Thread(target=lambda: out.append(pool.acquire(10.0, True)), daemon=True)
        t.start()
        time.sleep(0.1)  # the acquire waits for the one slot
        pool.close()
        t.join(5.0)
        assert not t.is_alive() and out == [None]
        held.release()


def test_batch_staging_remakes_an_evicted_shape_and_raises_once_closed():
    with MemoryManager() as mm:
        staging = BatchStaging(SPEC, mm, slots=2, timeout=1.0)
        first = staging.acquire(4, 1, None, 1.0)
        first.buffer.release()
        for b in (5, 6, 7, 8):  # four newer shapes evict the first one's pool (closed)
            staging.acquire(b, 1, None, 1.0).buffer.release()
        again = staging.acquire(4, 1, None, 1.0)  # a new pool of the shape, not the closed one
        assert again.buffer.tensor.numel() > 0 and again is not first
        assert torch.equal(again.mask, torch.zeros(4, 1, dtype=torch.bool))
        again.buffer.release()
        staging.close()
        with pytest.raises(ValueError, match=r"staging is closed"):
            staging.acquire(4, 1, None, 1.0)


def test_batch_staging_closed_during_a_wait_raises_naming_the_pool():
    with MemoryManager() as mm:
        staging = BatchStaging(SPEC, mm, slots=1, timeout=10.0)
        held = staging.acquire(4, 1, None, 1.0)
        errors = []

        def wait() -> None:
            try:
                staging.acquire(4, 1, None, 10.0)
            except ValueError as err:
                errors.append(str(err))

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        time.sleep(0.1)  # the second acquire waits for the one slot
        staging.close()
        t.join(5.0)
        assert not t.is_alive() and errors == ["staging pool 'replay.staging' was closed while waiting"]
        held.buffer.release()

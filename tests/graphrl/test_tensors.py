"""Tests of graphrl.tensors: staging pools and their reuse rule, DLPack export, to_device."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest
import torch

from graphrl.memory import MemoryBudgetError, MemoryManager, Tier
from graphrl.tensors import StagingPool, as_tensor, to_device, to_dlpack

CUDA = torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------- dlpack


def test_to_dlpack_is_zero_copy_for_regions_tensors_and_arrays(mm):
    with mm.allocate((3, 4), "float32", "pinned", owner="o") as r:
        r.tensor().zero_()
        t = torch.from_dlpack(to_dlpack(r))
        t[1, 2] = 5.0
        assert r.numpy()[1, 2] == 5.0 and t.data_ptr() == r.data_ptr()
    src = torch.arange(6)
    out = torch.from_dlpack(to_dlpack(src))
    out[0] = 100
    assert src[0].item() == 100
    arr = np.zeros(4, dtype=np.int32)
    torch.from_dlpack(to_dlpack(arr))[3] = 9
    assert arr[3] == 9
    with pytest.raises(TypeError, match="Region, torch.Tensor or numpy.ndarray"):
        to_dlpack([1, 2, 3])


def test_to_dlpack_of_a_freed_region_raises(mm):
    r = mm.allocate(4, "float32", owner="o")
    r.free()
    with pytest.raises(ValueError, match="was freed"):
        to_dlpack(r)


def test_as_tensor_views(mm):
    arr = np.ones(3, dtype=np.float64)
    assert as_tensor(arr).data_ptr() == arr.ctypes.data
    t = torch.ones(2)
    assert as_tensor(t) is t
    with mm.allocate(2, "int8", "shared", owner="o") as r:
        assert as_tensor(r).data_ptr() == r.data_ptr()


# ---------------------------------------------------------------------------------------------- to_device


def test_to_device_on_the_same_device_shares_memory(mm):
    t = torch.arange(10, dtype=torch.float32)
    assert to_device(t, "cpu") is t
    assert to_device(t, torch.device("cpu"), non_blocking=False) is t
    with mm.allocate(5, "float32", "pinned", owner="o") as r:
        moved = to_device(r, "cpu")
        moved.fill_(3.0)
        assert moved.data_ptr() == r.data_ptr() and float(r.numpy().sum()) == 15.0
    arr = np.zeros(2)
    to_device(arr, "cpu")[0] = 1.0
    assert arr[0] == 1.0


@pytest.mark.gpu
def test_to_device_copies_to_the_gpu_and_back(mm):
    with mm.allocate(1000, "float32", "pinned", owner="o") as r:
        r.tensor().copy_(torch.arange(1000, dtype=torch.float32))
        g = to_device(r, "cuda")
        assert g.is_cuda and to_device(g, "cuda") is g
        back = to_device(g, "cpu")
        assert torch.equal(back, r.tensor()) and back.data_ptr() != r.data_ptr()


# ---------------------------------------------------------------------------------------------- staging


def test_staging_pool_allocates_one_region_on_its_tier(mm):
    pool = StagingPool(mm, (4, 8), torch.float32, slots=3, owner="features.staging")
    assert (pool.slots, pool.shape, pool.dtype) == (3, (4, 8), torch.float32)
    assert pool.region.tier is Tier.PINNED and pool.is_pinned is CUDA
    assert mm.stats()["pinned"]["features.staging"] == {"bytes": 3 * 4 * 8 * 4, "peak": 384, "regions": 1}
    pool.close()
    assert mm.stats()["pinned"]["features.staging"]["bytes"] == 0
    pool.close()  # idempotent


def test_staging_round_robin_when_released_in_order(mm):
    with StagingPool(mm, 16, "int64", slots=3, tier="host", owner="o") as pool:
        order, ptrs = [], []
        for step in range(7):
            with pool.acquire() as buf:
                order.append(buf.slot)
                ptrs.append(buf.tensor.data_ptr())
                assert buf.step == step
        assert order == [0, 1, 2, 0, 1, 2, 0]
        assert ptrs[0] == ptrs[3] == ptrs[6] and len(set(ptrs)) == 3  # the same memory, reused


def test_staging_reuse_recent_hands_out_the_slot_released_last(mm):
    with StagingPool(mm, 16, "int64", slots=3, tier="host", owner="o", reuse="recent") as pool:
        order = []
        for _ in range(4):
            with pool.acquire() as buf:
                order.append(buf.slot)
        assert order == [2, 2, 2, 2]  # released before the next acquire: the same (cache-warm) slot
        a, b = pool.acquire(), pool.acquire()
        assert a.slot != b.slot
        a.release()
        c = pool.acquire()
        assert c.slot == a.slot and c.slot != b.slot  # never a held slot
        b.release()
        c.release()
        assert pool.acquire().slot == c.slot
    with pytest.raises(ValueError, match="reuse must be 'round-robin' or 'recent', got 'lifo'"):
        StagingPool(mm, 4, "int64", slots=2, tier="host", reuse="lifo")


def test_a_held_slot_is_never_handed_out_again(mm):
    with StagingPool(mm, 32, "float32", slots=2, owner="o") as pool:
        held = pool.acquire()
        held.tensor.fill_(7.0)
        for _ in range(5):  # many batches go by while `held` is kept
            with pool.acquire() as other:
                assert other.slot != held.slot
                other.tensor.fill_(-1.0)
        assert bool((held.tensor == 7.0).all())  # never overwritten
        held.release()


def test_acquire_times_out_when_every_slot_is_held(mm):
    with StagingPool(mm, 4, "uint8", slots=2, owner="loader.staging", timeout=0.0) as pool:
        a = pool.acquire()
        b = pool.acquire()
        assert pool.available == 0
        with pytest.raises(TimeoutError, match=r"'loader.staging'.*all 2 slots.*release"):
            pool.acquire()
        with pytest.raises(TimeoutError):
            pool.acquire(timeout=0.01)
        a.release()
        c = pool.acquire()
        assert c.slot == a.slot and c.tensor.data_ptr() == pool.region.tensor()[a.slot].data_ptr()
        b.release()
        c.release()
        assert pool.available == 2


def test_released_buffers_refuse_use_and_double_release(mm):
    with StagingPool(mm, 4, "float32", slots=1, tier="host", owner="o") as pool:
        buf = pool.acquire()
        buf.release()
        assert buf.released
        with pytest.raises(ValueError, match="was released"):
            buf.tensor  # noqa: B018
        with pytest.raises(ValueError, match="already released"):
            buf.release()
        assert pool.available == 1


def test_blocked_acquire_gets_the_slot_released_by_another_thread(mm):
    with StagingPool(mm, 4, "float32", slots=1, tier="host", owner="o") as pool:
        first = pool.acquire()
        got: queue.Queue = queue.Queue()
        waiter = threading.Thread(target=lambda: got.put(pool.acquire(timeout=30)))
        waiter.start()
        first.release()
        second = got.get(timeout=30)
        waiter.join()
        assert second.slot == first.slot and second.step == 1
        second.release()


def test_producer_consumer_never_see_a_batch_overwritten(mm):
    """A loader thread fills buffers ahead of a trainer; every batch reads back exactly what was written."""
    steps, slots = 200, 3
    with StagingPool(mm, (64,), "int64", slots=slots, owner="loader") as pool:
        handoff: queue.Queue = queue.Queue()

        def produce() -> None:
            for step in range(steps):
                buf = pool.acquire(timeout=30)
                buf.tensor.fill_(step)
                handoff.put((step, buf))

        producer = threading.Thread(target=produce)
        producer.start()
        in_flight_max = 0
        for expected in range(steps):
            step, buf = handoff.get(timeout=30)
            assert step == expected
            in_flight_max = max(in_flight_max, slots - pool.available)
            t = buf.tensor
            assert int(t.min()) == int(t.max()) == step  # not overwritten by a later batch
            buf.release()
        producer.join()
        assert in_flight_max <= slots


def test_staging_pool_bad_arguments_and_budget(mm):
    with pytest.raises(ValueError, match="slots"):
        StagingPool(mm, 4, "float32", slots=0)
    with pytest.raises(ValueError, match="disk"):
        StagingPool(mm, 4, "float32", tier="disk")
    with pytest.raises(ValueError, match="timeout"):
        StagingPool(mm, 4, "float32", timeout=-1)
    small = MemoryManager({"pinned": 100, "host": 1000})
    with pytest.raises(MemoryBudgetError) as info:
        StagingPool(small, 10, "float32", slots=3, owner="s")  # 120 bytes
    assert (info.value.tier, info.value.asked, info.value.free) == (Tier.PINNED, 120, 100)
    pool = StagingPool(small, 10, "float32", slots=3, owner="s", fallback=("host",))
    assert pool.region.tier is Tier.HOST
    small.close()  # the manager closing first is fine
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.acquire()


def test_close_wakes_a_waiting_acquire(mm):
    pool = StagingPool(mm, 4, "float32", slots=1, tier="host", owner="o")
    held = pool.acquire()
    errors: queue.Queue = queue.Queue()

    def wait() -> None:
        try:
            pool.acquire(timeout=30)
        except ValueError as exc:
            errors.put(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    pool.close()
    waiter.join(30)
    assert not waiter.is_alive()
    assert "closed" in str(errors.get(timeout=1))
    held.release()  # releasing after close is harmless

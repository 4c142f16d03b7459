"""`graphrl.memory.pool.PoolResource`'s doomed blocks: a block trimmed or closed while a view still read it
goes upstream when that view dies, never under the pool's lock, and never left behind.

Deadlock: the dying view's callback runs outside any manager call; the upstream's ``deallocate`` may
collect garbage whose finalizer frees another region of the same manager (into the same pool). Leak:
the view dies while the pool's lock is held (another thread, or this one collecting under it) after the
manager closed, when no later trim comes.
"""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
from _threads import run_joined

from graphrl.memory import MemoryManager, PoolResource, free_quietly
from graphrl.memory.backing import Backing, TensorBacking

JOIN_S = 30.0


class CountingPinned:
    """A pinned-like upstream that counts its releases and, when ``collect``, collects garbage in them."""

    def __init__(self, collect: bool = False) -> None:
        self.collect = collect
        self.released = 0

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        return TensorBacking(torch.empty(shape, dtype=dtype), is_pinned=True)

    def deallocate(self, backing: Backing) -> None:
        self.released += 1
        if self.collect:
            gc.collect()

    def capacity(self) -> int:
        return 1 << 40


class _Cycle:
    """An object in a reference cycle: only the garbage collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_doomed_release_whose_upstream_collects_a_finalizer_freeing_into_the_pool_does_not_deadlock():
    upstream = CountingPinned(collect=True)
    pool = PoolResource(upstream, tier="pinned")
    mm = MemoryManager(budgets={"pinned": 1 << 20}, resources={"pinned": pool})
    gc.disable()
    try:
        a = mm.allocate((64,), torch.int64, "pinned", owner="a")
        view = a.tensor()[1:]
        a.free()
        assert mm.trim("pinned") == 0  # a's block is still viewed: doomed, not released
        assert pool.stats().held_bytes == 512
        b = mm.allocate((32,), torch.int64, "pinned", owner="b")
        cycle = _Cycle()
        weakref.finalize(cycle, free_quietly, b)
        del cycle, b
        holder = [view]
        del view

        # the view dies -> a's block upstream -> the upstream collects -> b's finalizer frees into the pool
        run_joined(holder.clear, JOIN_S)
    finally:
        gc.enable()
    assert upstream.released == 1  # a's block; b's block idles in the pool
    assert mm.usage()["pinned"]["used"] == 0
    assert (pool.stats().held_bytes, pool.stats().idle_bytes) == (256, 256)
    mm.close()
    assert upstream.released == 2 and pool.stats().held_bytes == 0


def test_a_view_dying_while_the_lock_is_held_after_close_is_released_when_the_lock_is_let_go():
    upstream = CountingPinned()
    pool = PoolResource(upstream, tier="pinned")
    mm = MemoryManager(budgets={"pinned": 1 << 20}, resources={"pinned": pool})
    a = mm.allocate((64,), torch.int64, "pinned", owner="x")
    b = mm.allocate((64,), torch.int64, "pinned", owner="x")
    va, vb = a.tensor()[1:], b.tensor()[1:]
    a.free()
    b.free()
    mm.close()
    assert (upstream.released, pool.stats().held_bytes) == (0, 1024)  # both viewed: doomed
    del va
    assert (upstream.released, pool.stats().held_bytes) == (1, 512)  # the callback released it at once
    holding, dropped = threading.Event(), threading.Event()

    def hold() -> None:  # another thread inside the pool (stands for any call under its lock)
        with pool._lock:
            holding.set()
            dropped.wait(JOIN_S)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert holding.wait(JOIN_S)
    del vb  # the last view dies: the callback finds the lock taken and must not wait
    assert upstream.released == 1
    dropped.set()
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert (upstream.released, pool.stats().held_bytes) == (2, 0)  # the holder released it, no trim ran


def test_a_trimmed_viewed_block_goes_upstream_when_its_last_view_dies_without_limit_or_trim():
    upstream = CountingPinned()
    pool = PoolResource(upstream, tier="pinned")  # no limit, no max_idle: only the view's death releases
    a = pool.allocate((64,), torch.int64, 512, "a")
    view = a.tensor()[1:]
    pool.deallocate(a)
    assert pool.trim() == 0 and pool.stats().held_bytes == 512  # viewed: doomed
    pool._lock.acquire()
    del view
    assert upstream.released == 0
    pool._lock.release()  # the holder lets go: the doomed block goes upstream now
    assert (upstream.released, pool.stats().held_bytes, pool.stats().idle_bytes) == (1, 0, 0)


def test_a_full_pool_names_the_views_that_hold_its_blocks_and_gives_no_max_waste_advice_without_waste():
    pool = PoolResource(CountingPinned(), tier="pinned", limit=1024)
    a = pool.allocate((64,), torch.int64, 512, "a")
    view = a.tensor()[1:]
    pool.deallocate(a)
    with pytest.raises(MemoryError) as err:
        pool.allocate((128,), torch.int64, 1024, "b")
    message = str(err.value)
    assert ": 512 B of them belong to freed regions that tensors taken from them still view" in message
    assert "max_waste" not in message
    del view  # the view dies: its block goes upstream and the request fits
    assert pool.stats().held_bytes == 0
    pool.deallocate(pool.allocate((128,), torch.int64, 1024, "b"))
    wasteful = PoolResource(CountingPinned(), tier="pinned", limit=1024, max_waste=0.5)
    kept = wasteful.allocate((128,), torch.int64, 1024, "kept")
    with pytest.raises(MemoryError, match="lower max_waste"):
        wasteful.allocate((8,), torch.int64, 64, "more")
    wasteful.deallocate(kept)

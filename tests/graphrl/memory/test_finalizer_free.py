"""Regions freed by finalizers (``weakref.finalize(tensor, free_quietly, region)``): never a deadlock.

A finalizer runs wherever garbage is collected, including inside the manager's (or its pool's) critical
section on the same thread; the hooks below collect a cycle holding a region's tensor exactly there.
Each such call runs on a thread joined with a timeout: a deadlock fails the test instead of hanging it.
"""

from __future__ import annotations

import gc
import random
import threading
import weakref
from collections.abc import Callable

import pytest
import torch
from _threads import no_automatic_gc, run_joined

from graphrl.memory import MemoryManager, PoolResource, Region, Tier, free_quietly
from graphrl.memory.backing import Backing
from graphrl.memory.resources import HostResource, PinnedResource

JOIN_S = 60.0


def _in_a_cycle(region: Region) -> list[weakref.finalize]:
    """Hand ``region`` out as a tensor freed by its finalizer, held only by unreachable garbage (a cycle)."""
    tensor = region.tensor()
    fin = weakref.finalize(tensor, free_quietly, region)
    cycle: list[object] = [tensor]
    cycle.append(cycle)
    return [fin]


class _CollectsOnCapacity(HostResource):
    """A host resource whose ``capacity()`` (asked under the manager's lock) collects garbage."""

    def __init__(self) -> None:
        self.collected = 0

    def capacity(self) -> int:
        self.collected += gc.collect()
        return 1 << 30


class _CollectsOnFree(PinnedResource):
    """A pool's upstream whose ``deallocate`` (called under the pool's lock by ``trim``) collects garbage."""

    def __init__(self) -> None:
        super().__init__(cuda=False)
        self.collected = 0

    def deallocate(self, backing: Backing) -> None:
        super().deallocate(backing)
        self.collected += gc.collect()


def _owner_bytes(mm: MemoryManager, tier: str, owner: str) -> tuple[int, int]:
    usage = mm.stats()[tier][owner]
    return usage["bytes"], usage["regions"]


def test_a_finalizer_inside_the_managers_lock_frees_when_the_lock_is_released(managed):
    hook = _CollectsOnCapacity()
    mm = managed(budgets={"host": 1 << 20}, resources={"shared": hook})
    with no_automatic_gc():
        region = mm.allocate((250,), torch.float32, "host", owner="kept")
        (fin,) = _in_a_cycle(region)
        assert _owner_bytes(mm, "host", "kept") == (1000, 1)
        # the shared tier's first use asks its capacity with the lock held: the cycle is collected there
        assert run_joined(lambda: mm.budget("shared")) == 1 << 30
    assert hook.collected > 0 and not fin.alive and region.freed
    assert _owner_bytes(mm, "host", "kept") == (0, 0)  # given back when budget() released the lock
    assert mm.free_bytes("host") == 1 << 20 and mm.regions() == []
    with pytest.raises(ValueError, match="double free"):
        region.free()  # an explicit free stays strict
    mm.close()


def test_close_after_a_finalizer_freed_a_region_under_the_lock_leaves_nothing_counted(managed):
    mm = managed(budgets={"host": 1 << 20}, resources={"shared": _CollectsOnCapacity()})
    with no_automatic_gc():
        region = mm.allocate((8, 8), torch.int64, "host", owner="kept")
        _in_a_cycle(region)
        run_joined(mm.usage)  # usage() measures the shared tier under the lock: the free waits for it
    run_joined(mm.close)
    assert region.freed and _owner_bytes(mm, "host", "kept") == (0, 0)


def test_a_finalizer_inside_the_pools_lock_does_not_deadlock(managed):
    upstream = _CollectsOnFree()
    mm = managed(budgets={"pinned": 1 << 20}, resources={"pinned": PoolResource(upstream, tier="pinned")})
    with no_automatic_gc():
        idle = mm.allocate((64,), torch.uint8, "pinned", owner="idle")
        kept = mm.allocate((1024,), torch.uint8, "pinned", owner="kept")
        idle.free()  # its block waits in the pool; trim() gives it upstream with the pool's lock held
        _in_a_cycle(kept)
        assert run_joined(lambda: mm.trim("pinned")) == 64
    assert upstream.collected > 0 and kept.freed
    assert _owner_bytes(mm, "pinned", "kept") == (0, 0)
    pools = mm.stats()["pools"]["pinned"]
    assert pools["held_bytes"] == 1024 and pools["idle_bytes"] == 1024  # kept's block, back in the pool
    reused = mm.allocate((1024,), torch.uint8, "pinned", owner="again")
    assert mm.stats()["pools"]["pinned"]["pool_hits"] == 1
    reused.free()
    mm.close()


def test_an_explicit_free_and_a_finalizer_free_the_region_once(managed):
    mm = managed(budgets={"host": 4096})
    region = mm.allocate((100,), torch.float64, "host", owner="x")
    tensor = region.tensor()
    fin = weakref.finalize(tensor, free_quietly, region)
    region.free()
    del tensor  # the finalizer runs now, on a freed region: nothing to do, no error
    assert not fin.alive
    assert mm.free_bytes("host") == 4096 and _owner_bytes(mm, "host", "x") == (0, 0)

    # the other order: the finalizer first, then an explicit free, which raises (a double free)
    region = mm.allocate((100,), torch.float64, "host", owner="x")
    tensor = region.tensor()
    weakref.finalize(tensor, free_quietly, region)
    del tensor
    assert region.freed
    with pytest.raises(ValueError, match="double free"):
        region.free()
    free_quietly(region)  # and quietly again: nothing
    assert mm.free_bytes("host") == 4096 and _owner_bytes(mm, "host", "x") == (0, 0)
    mm.close()


def test_threads_allocating_freeing_and_dropping_tensors_leave_exact_accounts(managed):
    mm = managed(budgets={"host": 1 << 24, "pinned": 1 << 24})
    rounds, errors = 150, []
    start = threading.Barrier(9)

    def allocator(k: int) -> None:
        rng = random.Random(k)
        start.wait()
        for _ in range(rounds):
            tier = rng.choice(("host", "pinned"))
            region = mm.allocate((rng.randint(1, 512),), torch.float32, tier, owner=f"alloc{k}")
            region.tensor().fill_(k)
            region.free()

    def dropper(k: int) -> None:
        rng = random.Random(100 + k)
        start.wait()
        kept: list[object] = []
        for i in range(rounds):
            tier = rng.choice(("host", "pinned"))
            region = mm.allocate((rng.randint(1, 512),), torch.float32, tier, owner=f"drop{k}")
            tensor = region.tensor()
            weakref.finalize(tensor, free_quietly, region)
            if i % 3 == 0:  # in a cycle: collected by whichever thread's allocation runs the GC
                cycle: list[object] = [tensor]
                cycle.append(cycle)
            elif i % 3 == 1:
                kept.append(tensor)  # dropped in a batch below
            del tensor
            if len(kept) > 4:
                kept.clear()
        kept.clear()

    def collector() -> None:
        start.wait()
        for _ in range(rounds):
            gc.collect(0)

    def guarded(fn: Callable[[int], None], k: int) -> Callable[[], None]:
        def run() -> None:
            try:
                fn(k)
            except BaseException as err:  # noqa: BLE001 - reported on the test's thread
                errors.append(err)
        return run

    threads = [threading.Thread(target=guarded(allocator, k), daemon=True) for k in range(4)]
    threads += [threading.Thread(target=guarded(dropper, k), daemon=True) for k in range(4)]
    threads.append(threading.Thread(target=guarded(lambda _: collector(), 0), daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S * 4)
    assert not any(t.is_alive() for t in threads), "deadlock: a thread did not finish"
    assert errors == []
    gc.collect()  # the last cycles
    stats = mm.stats()
    for tier in Tier:
        for owner, usage in stats[tier.value].items():
            assert (usage["bytes"], usage["regions"]) == (0, 0), (tier, owner, usage)
    usage = mm.usage()
    assert usage["host"]["used"] == 0 and usage["pinned"]["used"] == 0
    assert mm.regions() == []
    pools = stats["pools"]["pinned"]
    assert pools["held_bytes"] == pools["idle_bytes"]  # every pinned block back in the pool
    mm.close()

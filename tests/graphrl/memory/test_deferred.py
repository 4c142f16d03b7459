"""`graphrl.memory.deferred.DeferringLock` and the manager's frees from finalizers that must wait for it.

The lock alone: a deferred call runs at once when nothing is in its way, else exactly once at the end
of the section in its way (the holder's release, the outermost busy section), never blocking the
thread that defers. The manager: a finalizer fired (by ``gc.collect`` in a resource hook) inside a
resource call, under the manager's lock, under a pool's lock or on another thread never deadlocks, never
frees twice, and gives the bytes back by the end of the section in its way, so the accounts are exact
after every call (threads; hypothesis over allocate / drop / collect sequences).
"""

from __future__ import annotations

import gc
import logging
import random
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from _memory_resources import SlowCapacity
from _threads import no_automatic_gc, run_joined
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager, PoolResource, Region, Tier, free_quietly
from graphrl.memory.backing import Backing
from graphrl.memory.deferred import DeferringLock
from graphrl.memory.resources import HostResource, PinnedResource, SharedResource

JOIN_S = 60.0


def _in_a_cycle(region: Region) -> weakref.finalize:
    """Hand ``region`` out as a tensor freed by its finalizer, held only by unreachable garbage (a cycle)."""
    tensor = region.tensor()
    fin = weakref.finalize(tensor, free_quietly, region)
    cycle: list[object] = [tensor]
    cycle.append(cycle)
    return fin


def _bytes(mm: MemoryManager, tier: str, owner: str) -> tuple[int, int]:
    usage = mm.stats()[tier].get(owner, {"bytes": 0, "regions": 0})
    return usage["bytes"], usage["regions"]


# -- the lock alone


def test_a_call_deferred_with_nothing_in_its_way_runs_at_once():
    lock, log = DeferringLock(), []
    lock.defer(log.append, 1)
    assert log == [1] and lock.queued == 0


def test_a_call_deferred_under_the_lock_on_the_same_thread_runs_at_its_release():
    lock, log = DeferringLock(), []

    def under_the_lock() -> None:
        with lock:
            lock.defer(log.append, "freed")  # a plain Lock would deadlock if this ran now
            log.append("inside")
            assert lock.queued == 1
        log.append("after")

    run_joined(under_the_lock)
    assert log == ["inside", "freed", "after"] and lock.queued == 0


def test_a_call_deferred_in_nested_busy_sections_runs_at_the_outermost_end():
    lock, log = DeferringLock(), []

    def nested() -> None:
        with lock.busy:
            with lock.busy:
                lock.defer(log.append, "freed")
            log.append("outer")
            with lock:  # the lock's release inside a busy section leaves the call to the busy section
                pass
            log.append("still outer")
        log.append("after")

    run_joined(nested)
    assert log == ["outer", "still outer", "freed", "after"]


def _held_on_another_thread(lock: DeferringLock) -> tuple[threading.Thread, threading.Event]:
    """A daemon thread that holds ``lock`` (``with lock``) until the returned event is set (or JOIN_S has
    passed); returns once the thread holds it."""
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            holding.set()
            release.wait(JOIN_S)

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    assert holding.wait(JOIN_S)
    return thread, release


def test_another_threads_call_never_blocks_and_the_holder_runs_it_at_release():
    lock = DeferringLock()
    ran_on: list[int] = []
    thread, release = _held_on_another_thread(lock)
    run_joined(lambda: lock.defer(lambda: ran_on.append(threading.get_ident())))  # returns: never blocks
    assert ran_on == [] and lock.queued == 1
    release.set()
    thread.join(JOIN_S)
    assert ran_on == [thread.ident] and lock.queued == 0  # the holder ran it, at its release


def test_a_deferred_call_that_takes_the_lock_and_defers_again_runs_each_once():
    lock, log = DeferringLock(), []

    def free(k: int) -> None:
        with lock:  # the running thread is busy: this release starts no second run
            log.append(k)
            if k < 3:
                lock.defer(free, k + 1)  # queued (the lock is held), taken by the same run

    def start() -> None:
        with lock:
            lock.defer(free, 0)

    run_joined(start)
    assert log == [0, 1, 2, 3] and lock.queued == 0


def test_a_failing_deferred_call_is_logged_and_the_others_still_run(caplog):
    lock, log = DeferringLock(), []

    def fails() -> None:
        raise OSError("unmap failed")

    with caplog.at_level(logging.WARNING, logger="graphrl.memory.deferred"):
        with lock:
            lock.defer(log.append, 1)
            lock.defer(fails)
            lock.defer(log.append, 2)
            assert log == []
    assert log == [1, 2]
    assert "unmap failed" in caplog.text


def test_drain_runs_what_waits_even_while_another_thread_holds_the_lock():
    lock, log = DeferringLock(), []
    thread, release = _held_on_another_thread(lock)
    lock.defer(log.append, "waited")
    assert log == []
    run_joined(lock.drain)
    assert log == ["waited"] and lock.queued == 0
    release.set()
    thread.join(JOIN_S)
    assert log == ["waited"]  # not again at the holder's release


def test_many_threads_deferring_under_and_outside_the_lock_run_every_call_exactly_once():
    lock = DeferringLock()
    ran: list[int] = []
    threads_n, per_thread = 8, 2000
    start = threading.Barrier(threads_n)

    def work(k: int) -> None:
        rng = random.Random(k)
        start.wait()
        for i in range(per_thread):
            call_id = k * per_thread + i
            where = rng.randrange(3)
            if where == 0:
                with lock:
                    lock.defer(ran.append, call_id)
            elif where == 1:
                with lock.busy:
                    lock.defer(ran.append, call_id)
            else:
                lock.defer(ran.append, call_id)

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "deadlock"
    # nothing waits once every section has ended: no lost call, and none ran twice
    assert lock.queued == 0
    assert sorted(ran) == list(range(threads_n * per_thread))


# -- the manager: resources whose hooks collect garbage where a finalizer must not free at once


@dataclass
class Collector:
    """Collects garbage where a hook calls it, while ``armed``; counts the collections it made."""

    armed: bool = True
    fired: int = 0
    inside: list[Callable[[], None]] = field(default_factory=list)  # checks to run right after

    def __call__(self) -> None:
        if self.armed:
            gc.collect()
            self.fired += 1
            for check in self.inside:
                check()


class CollectingHost(HostResource):
    """A host resource that collects garbage inside ``allocate`` and records every ``deallocate``."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.allocated: list[Backing] = []  # appends are atomic across threads
        self.freed: list[tuple[Backing, int]] = []  # backing (kept alive: ids stay unique), thread

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        self.collector()
        backing = super().allocate(shape, dtype, nbytes, name)
        self.allocated.append(backing)
        return backing

    def deallocate(self, backing: Backing) -> None:
        super().deallocate(backing)
        self.freed.append((backing, threading.get_ident()))


class CollectingPinned(PinnedResource):
    """A pool's upstream (no CUDA) that collects garbage in ``allocate`` and ``deallocate``; the pool
    calls ``deallocate`` with its lock held (trim, set_limit, an allocation over its limit)."""

    def __init__(self, collector: Collector) -> None:
        super().__init__(cuda=False)
        self.collector = collector

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        self.collector()
        return super().allocate(shape, dtype, nbytes, name)

    def deallocate(self, backing: Backing) -> None:
        super().deallocate(backing)
        self.collector()


class CollectingShared(SharedResource):
    """A shared resource that collects garbage in ``allocate`` (its deallocate takes a cleanup's lock)."""

    def __init__(self, collector: Collector) -> None:
        super().__init__()
        self.collector = collector

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        self.collector()
        return super().allocate(shape, dtype, nbytes, name)


def test_a_finalizer_fired_inside_allocate_frees_when_the_resource_call_returns(managed):
    collector = Collector(armed=False)
    host = CollectingHost(collector)
    mm = managed(budgets={"host": 1 << 20}, resources={"host": host}, reclaim=False)
    seen_inside: list[tuple[bool, tuple[int, int]]] = []
    with no_automatic_gc():
        victim = mm.allocate((250,), torch.float32, "host", owner="victim")
        fin = _in_a_cycle(victim)
        # inside the resource call: freed (marked), its bytes still counted (the free waits)
        collector.inside.append(lambda: seen_inside.append((victim.freed, _bytes(mm, "host", "victim"))))
        collector.armed = True
        other = run_joined(lambda: mm.allocate((10,), torch.int64, "host", owner="other"))
    assert len(host.freed) == 1  # freed upstream before allocate returned (no manager call since)
    assert collector.fired == 1 and not fin.alive
    assert seen_inside == [(True, (1000, 1))]
    assert _bytes(mm, "host", "victim") == (0, 0)  # given back before allocate returned
    assert mm.usage()["host"]["used"] == 80 and mm.regions() == [other]
    assert host.freed[0][0] is host.allocated[0]
    other.free()
    mm.close()


def test_a_finalizer_fired_under_the_pools_lock_inside_allocate_does_not_deadlock(managed):
    collector = Collector(armed=False)
    upstream = CollectingPinned(collector)
    mm = managed(budgets={"pinned": 2048}, resources={"pinned": PoolResource(upstream, tier="pinned")},
                 reclaim=False)
    with no_automatic_gc():
        mm.allocate((1024,), torch.uint8, "pinned", owner="idle").free()  # an idle 1024-byte block
        kept = mm.allocate((512,), torch.uint8, "pinned", owner="kept")
        _in_a_cycle(kept)
        collector.armed = True
        # 768 new bytes: 1024 idle + 512 live + 768 > 2048, so the pool releases the idle block with
        # its lock held; the upstream collects there, and kept's free needs that lock
        new = run_joined(lambda: mm.allocate((768,), torch.uint8, "pinned", owner="new"))
    assert collector.fired >= 1 and kept.freed
    assert _bytes(mm, "pinned", "kept") == (0, 0) and _bytes(mm, "pinned", "new") == (768, 1)
    pools = mm.stats()["pools"]["pinned"]
    assert (pools["held_bytes"], pools["idle_bytes"]) == (512 + 768, 512)  # kept's block back, idle
    new.free()
    mm.close()


def test_a_finalizer_fired_inside_trim_is_given_back_when_trim_returns(managed):
    collector = Collector(armed=False)
    pool = PoolResource(CollectingPinned(collector), tier="pinned")
    mm = managed(budgets={"pinned": 1 << 20}, resources={"pinned": pool}, reclaim=False)
    with no_automatic_gc():
        mm.allocate((64,), torch.uint8, "pinned", owner="idle").free()
        kept = mm.allocate((1024,), torch.uint8, "pinned", owner="kept")
        _in_a_cycle(kept)
        collector.armed = True  # trim gives the idle block upstream under the pool's lock: collected there
        assert run_joined(lambda: mm.trim("pinned")) == 64
    # before any other manager call: kept's block is back in the pool, idle
    assert collector.fired == 1 and (pool.stats().held_bytes, pool.stats().idle_bytes) == (1024, 1024)
    assert _bytes(mm, "pinned", "kept") == (0, 0)
    mm.close()


def test_a_finalizer_fired_inside_a_free_under_the_pools_lock_is_given_back_when_the_free_returns(managed):
    collector = Collector(armed=False)
    # max_idle=0: every free hands its block upstream at once, with the pool's lock held
    pool = PoolResource(CollectingPinned(collector), tier="pinned", max_idle=0)
    mm = managed(budgets={"pinned": 1 << 20}, resources={"pinned": pool}, reclaim=False)
    with no_automatic_gc():
        freed = mm.allocate((256,), torch.uint8, "pinned", owner="freed")
        kept = mm.allocate((512,), torch.uint8, "pinned", owner="kept")
        _in_a_cycle(kept)
        collector.armed = True
        run_joined(freed.free)  # collected under the pool's lock; kept's free takes that lock
    assert collector.fired >= 1 and kept.freed
    assert (pool.stats().held_bytes, pool.stats().idle_bytes) == (0, 0)  # both blocks upstream already
    assert _bytes(mm, "pinned", "kept") == (0, 0) and mm.usage()["pinned"]["used"] == 0
    mm.close()


def test_a_finalizer_fired_under_the_managers_and_the_pools_lock_frees_at_the_lock_release(managed):
    collector = Collector(armed=False)
    upstream = CollectingPinned(collector)
    mm = managed(budgets={"pinned": 4096}, resources={"pinned": PoolResource(upstream, tier="pinned")},
                 reclaim=False)
    with no_automatic_gc():
        mm.allocate((1024,), torch.uint8, "pinned", owner="idle").free()
        kept = mm.allocate((512,), torch.uint8, "pinned", owner="kept")
        _in_a_cycle(kept)
        collector.armed = True
        # register() lowers the pool's limit to 4096 - 3072 under the manager's lock; the pool drops
        # its idle block under its own: the collection runs with both held
        buffer = np.zeros(3072, dtype=np.uint8)
        registered = run_joined(lambda: mm.register(buffer, "pinned", owner="user"))
    assert collector.fired >= 1 and kept.freed
    assert _bytes(mm, "pinned", "kept") == (0, 0) and _bytes(mm, "pinned", "user") == (3072, 1)
    assert mm.usage()["pinned"]["used"] == 3072
    registered.free()
    mm.close()


def test_a_finalizer_on_another_thread_never_waits_for_the_lock_and_its_holder_frees(managed):
    slow = SlowCapacity(JOIN_S)  # its capacity() is asked with the manager's lock held
    holding, release = slow.holding, slow.release

    host = CollectingHost(Collector(armed=False))
    mm = managed(budgets={"host": 1 << 20}, resources={"host": host, "shared": slow},
                 reclaim=False)
    region = mm.allocate((64,), torch.float64, "host", owner="x")
    tensor = region.tensor()
    weakref.finalize(tensor, free_quietly, region)
    holder = threading.Thread(target=lambda: mm.budget("shared"), daemon=True)
    holder.start()
    assert holding.wait(JOIN_S)

    def drop() -> None:
        nonlocal tensor
        del tensor  # the finalizer runs here, finds the lock held: queued, no wait

    run_joined(drop)
    assert region.freed and host.freed == []
    release.set()
    holder.join(JOIN_S)
    assert not holder.is_alive()
    assert [thread for _, thread in host.freed] == [holder.ident]  # freed by the holder, at its release
    assert _bytes(mm, "host", "x") == (0, 0)
    mm.close()


def test_threads_allocating_and_dropping_free_every_region_exactly_once(managed):
    collector = Collector(armed=False)
    host = CollectingHost(collector)
    mm = managed(budgets={"host": 1 << 24, "pinned": 1 << 24}, reclaim=False,
                 resources={"host": host, "pinned": PoolResource(CollectingPinned(collector), tier="pinned")})
    rounds, workers, errors = 120, 6, []
    start = threading.Barrier(workers + 2)
    stop = threading.Event()
    pinned_allocations: list[int] = []  # per worker

    def worker(k: int) -> None:
        rng = random.Random(k)
        start.wait()
        kept: list[object] = []
        pinned = 0
        for i in range(rounds):
            tier = rng.choice(("host", "pinned"))
            region = mm.allocate((rng.randint(1, 256),), torch.float32, tier, owner=f"w{k}")
            pinned += tier == "pinned"
            how = rng.randrange(4)
            if how == 0:
                region.free()
                continue
            tensor = region.tensor()
            weakref.finalize(tensor, free_quietly, region)
            if how == 1:
                cycle: list[object] = [tensor]
                cycle.append(cycle)
            elif how == 2:
                kept.append(tensor)
            del tensor
            if len(kept) > 3:
                kept.clear()
            if i % 17 == 0:
                mm.trim()
        kept.clear()
        pinned_allocations.append(pinned)

    def collector_thread() -> None:
        start.wait()
        while not stop.is_set():
            gc.collect(0)

    def reader() -> None:  # holds the lock often: finalizers on other threads queue for it
        start.wait()
        probe = torch.zeros(4)
        while not stop.is_set():
            mm.tier_of(probe)
            mm.stats()

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - reported on the test's thread
                errors.append(err)
        return run

    threads = [threading.Thread(target=guarded(lambda k=k: worker(k)), daemon=True) for k in range(workers)]
    helpers = [threading.Thread(target=guarded(f), daemon=True) for f in (collector_thread, reader)]
    for t in threads + helpers:
        t.start()
    for t in threads:
        t.join(JOIN_S * 4)
    stop.set()
    for t in helpers:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads + helpers), "deadlock: a thread did not finish"
    assert errors == []
    gc.collect()  # the last cycles: freed at once (nothing is in the way now)
    host_allocations = workers * rounds - sum(pinned_allocations)
    assert len(host.allocated) == host_allocations
    freed = [b for b, _ in host.freed]
    assert len({id(b) for b in freed}) == len(freed)  # no backing freed twice
    assert {id(b) for b in freed} == {id(b) for b in host.allocated}  # and none lost
    stats = mm.stats()
    for tier in Tier:
        for owner, usage in stats[tier.value].items():
            assert (usage["bytes"], usage["regions"]) == (0, 0), (tier, owner, usage)
    assert mm.usage()["pinned"]["used"] == 0 and mm.regions() == []
    pools = stats["pools"]["pinned"]
    assert pools["held_bytes"] == pools["idle_bytes"]  # every pinned block back in the pool
    assert pools["pool_hits"] + pools["pool_misses"] == sum(pinned_allocations)
    mm.close()


# -- hypothesis: sequences of allocate / drop / collect, the accounts checked after every step

TIERS = ("host", "pinned", "shared")
step = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from(TIERS), st.integers(1, 48),
              st.sampled_from(("region", "tensor", "cycle")), st.booleans()),
    st.tuples(st.just("drop"), st.integers(0, 1 << 16)),
    st.tuples(st.just("gc")),
    st.tuples(st.just("trim"), st.booleans()),
)


@dataclass
class Held:
    tier: str
    owner: str
    nbytes: int
    how: str
    ref: object  # the region, its tensor, or the cycle holding its tensor


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=24))
def test_accounts_are_exact_after_every_step_of_any_sequence(managed, steps):
    collector = Collector(armed=False)
    host, pool = CollectingHost(collector), PoolResource(CollectingPinned(collector), tier="pinned")
    mm = managed(
        budgets={"host": 1 << 20, "pinned": 1 << 20, "shared": 1 << 20}, reclaim=False,
        resources={"host": host, "shared": CollectingShared(collector), "pinned": pool},
    )
    live: list[Held] = []  # counted, held by the test
    garbage: list[Held] = []  # counted until a collection frees them
    gc.freeze()  # collections look at this example's objects only (fast); not at torch's
    try:
        with no_automatic_gc():
            for n, op in enumerate(steps):
                fired = collector.fired
                if op[0] == "alloc":
                    _, tier, size, how, collect_inside = op
                    collector.armed = collect_inside
                    region = mm.allocate((size,), torch.int64, tier, owner=f"o{n % 2}")
                    collector.armed = False
                    ref: object = region
                    if how != "region":
                        tensor = region.tensor()
                        weakref.finalize(tensor, free_quietly, region)
                        ref = [tensor]
                        if how == "cycle":
                            ref.append(ref)
                        del tensor
                    live.append(Held(tier, f"o{n % 2}", size * 8, how, ref))
                    del ref, region
                elif op[0] == "drop" and live:
                    _drop(live.pop(op[1] % len(live)), garbage)
                elif op[0] == "gc":
                    gc.collect()
                    garbage.clear()
                elif op[0] == "trim":
                    collector.armed = op[1]
                    mm.trim()
                    collector.armed = False
                if collector.fired != fired:
                    garbage.clear()  # collected inside a resource call: given back by its end
                _check(mm, host, pool, live + garbage)
            while live:
                _drop(live.pop(), garbage)
            gc.collect()
            _check(mm, host, pool, [])
    finally:
        gc.unfreeze()
        mm.close()


def _drop(held: Held, garbage: list[Held]) -> None:
    """Free a region, drop a tensor (its finalizer runs here) or a cycle (garbage until collected)."""
    if held.how == "region":
        held.ref.free()
    elif held.how == "cycle":
        garbage.append(held)
    held.ref = None


def _check(mm: MemoryManager, host: CollectingHost, pool: PoolResource, counted: list[Held]) -> None:
    # first what the resources hold, asked without a manager call (which could give frees back first)
    pinned = pool.stats()
    assert pinned.held_bytes - pinned.idle_bytes == sum(h.nbytes for h in counted if h.tier == "pinned")
    assert len(host.allocated) - len(host.freed) == sum(h.tier == "host" for h in counted)
    stats, usage = mm.stats(), mm.usage()
    for tier in TIERS:
        expect: dict[str, tuple[int, int]] = {}
        for h in counted:
            if h.tier == tier:
                b, r = expect.get(h.owner, (0, 0))
                expect[h.owner] = (b + h.nbytes, r + 1)
        got = {o: (u["bytes"], u["regions"]) for o, u in stats[tier].items() if u["regions"] or u["bytes"]}
        assert got == expect, tier
        assert usage[tier]["used"] == sum(b for b, _ in expect.values())
    pools = stats["pools"]["pinned"]
    assert pools["held_bytes"] - pools["idle_bytes"] == sum(h.nbytes for h in counted if h.tier == "pinned")
    assert len(mm.regions()) == len(counted)


@pytest.mark.parametrize("order", ["free_then_finalizer", "finalizer_then_close"])
def test_close_leaves_nothing_counted_whichever_frees_first(managed, order):
    mm = managed(budgets={"host": 1 << 16}, reclaim=False)
    region = mm.allocate((32,), torch.float32, "host", owner="x")
    tensor = region.tensor()
    weakref.finalize(tensor, free_quietly, region)
    if order == "free_then_finalizer":
        mm.close()  # frees the region; the finalizer later finds it freed
        del tensor
    else:
        del tensor
        mm.close()
    assert region.freed and _bytes(mm, "host", "x") == (0, 0) and mm.usage()["host"]["used"] == 0


def test_a_free_that_finishes_after_close_trimmed_the_pool_still_gives_its_block_upstream(managed):
    entered, finish = threading.Event(), threading.Event()

    class SlowPool(PoolResource):
        def deallocate(self, backing: Backing) -> None:  # a free on another thread, caught mid-way
            entered.set()
            finish.wait(JOIN_S)
            super().deallocate(backing)

    pool = SlowPool(PinnedResource(cuda=False), tier="pinned")
    mm = managed(budgets={"pinned": 1 << 20}, resources={"pinned": pool}, reclaim=False)
    region = mm.allocate((4096,), torch.uint8, "pinned", owner="x")
    freeing = threading.Thread(target=region.free, daemon=True)
    freeing.start()
    assert entered.wait(JOIN_S)
    run_joined(mm.close)  # finds the region freed (claimed) and the pool empty of idle blocks
    finish.set()
    freeing.join(JOIN_S)
    assert not freeing.is_alive()
    stats = pool.stats()
    assert (stats.held_bytes, stats.idle_bytes, stats.unregistrations) == (0, 0, 1)  # not kept registered
    assert _bytes(mm, "pinned", "x") == (0, 0)

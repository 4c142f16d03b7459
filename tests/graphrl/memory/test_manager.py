"""graphrl.memory.manager: exact budgets, fallback order, statistics, bad input, register, allocator
faults and concurrent allocation."""

from __future__ import annotations

import os
import pickle
import random
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphrl.memory import HostResource, MemoryBudgetError, MemoryManager, Region, Tier

SHM = Path("/dev/shm")
CUDA = torch.cuda.is_available()


def test_budgets_reject_unknown_tiers_and_bad_sizes():
    with pytest.raises(ValueError, match="unknown tier 'gpu'.*device, pinned, shared, host, disk"):
        MemoryManager(budgets={"gpu": 10})
    with pytest.raises(ValueError, match=r"budgets\['host'\].*'lots'"):
        MemoryManager(budgets={"host": "lots"})
    with pytest.raises(TypeError, match=r"budgets\['pinned'\]"):
        MemoryManager(budgets={Tier.PINNED: 1.5})


def test_budgets_parse_and_absent_tiers_get_the_machines_capacity(tmp_path, managed):
    manager = managed({"device": "1KiB", Tier.PINNED: 2048, "HOST": "1kB"}, spill_dir=tmp_path)
    assert manager.budget("device") == 1024
    assert manager.budget(Tier.PINNED) == 2048
    assert manager.budget("host") == 1000
    shm = os.statvfs(SHM)
    assert manager.budget("shared") == shm.f_blocks * shm.f_frsize
    assert 0 < manager.budget("disk") <= os.statvfs(tmp_path).f_blocks * os.statvfs(tmp_path).f_frsize
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert managed().budget("host") == ram
    assert managed().budget("disk") == 0  # no spill_dir
    manager.close()


def test_budget_is_exact_and_freed_bytes_return(managed):
    manager = managed({"host": 1000})
    full = manager.allocate(1000, "uint8", "host", owner="a")  # exactly the budget fits
    assert manager.free_bytes("host") == 0
    with pytest.raises(MemoryBudgetError):
        manager.allocate(1, "uint8", "host", owner="a")
    empty = manager.allocate(0, "float64", "host", owner="a")  # zero bytes always fit
    full.free()
    assert manager.free_bytes("host") == 1000
    again = manager.allocate((25, 5), "int64", "host", owner="b")  # 1000 bytes again
    assert again.nbytes == 1000 and manager.free_bytes("host") == 0
    empty.free()
    manager.close()


def test_budget_error_names_tier_owner_asked_and_free(managed):
    manager = managed({"pinned": 4096, "host": 100})
    hold = manager.allocate(1000, "uint8", "pinned", owner="x")
    with pytest.raises(MemoryBudgetError) as info:
        manager.allocate((1000,), torch.float32, "pinned", owner="samplers.features", fallback=("host",))
    err = info.value
    assert isinstance(err, MemoryError)
    assert (err.tier, err.owner, err.asked, err.free, err.budget) == (Tier.PINNED, "samplers.features", 4000,
                                                                      3096, 4096)
    assert err.attempts == ((Tier.PINNED, 3096), (Tier.HOST, 100))
    msg = str(err)
    for part in ("'pinned'", "'samplers.features'", "4000 bytes", "3096 bytes", "'host' (100 B free)"):
        assert part in msg, (part, msg)
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.tier, clone.owner, clone.asked, clone.free, clone.attempts) == (
        err.tier, err.owner, err.asked, err.free, err.attempts)
    hold.free()
    manager.close()


def test_fallback_follows_the_given_order(managed, shm_names):
    manager = managed({"device": 100, "pinned": 300, "shared": 1000, "host": 1000})
    a = manager.allocate(200, "uint8", "device", owner="o", fallback=("pinned", "host", "shared"))
    assert a.tier is Tier.PINNED
    b = manager.allocate(200, "uint8", "device", owner="o", fallback=("pinned", "host", "shared"))
    assert b.tier is Tier.HOST  # pinned has 100 left: skipped; host before shared as asked
    c = manager.allocate(900, "uint8", "device", owner="o", fallback=["pinned", "host", "shared"])
    assert c.tier is Tier.SHARED
    d = manager.allocate(50, "uint8", "device", owner="o", fallback="host")
    assert d.tier is Tier.DEVICE  # the preferred tier first when it has room
    with pytest.raises(MemoryBudgetError) as info:
        manager.allocate(850, "uint8", "device", owner="o", fallback=("pinned", "host", "shared"))
    assert [t for t, _ in info.value.attempts] == [Tier.DEVICE, Tier.PINNED, Tier.HOST, Tier.SHARED]
    assert [f for _, f in info.value.attempts] == [50, 100, 800, 100]
    manager.close()
    assert shm_names(manager.shm_prefix) == []


def test_larger_than_every_tier_fails_cleanly(tmp_path, managed):
    manager = managed(spill_dir=tmp_path)  # no budgets: the machine's capacity
    huge = 2**60
    with pytest.raises(MemoryBudgetError) as info:
        manager.allocate(huge, "uint8", "device", owner="big", fallback=("pinned", "shared", "host", "disk"))
    assert info.value.asked == huge
    assert [t for t, _ in info.value.attempts] == list(Tier)
    assert manager.stats()["host"] == {"big": {"bytes": 0, "peak": 0, "regions": 0}} or \
        manager.stats()["host"] == {}
    assert list(tmp_path.iterdir()) == []
    manager.close()


def test_stats_per_tier_and_owner_keep_owners_after_free(managed):
    manager = managed()
    a = manager.allocate((10, 10), "float32", "host", owner="graph")
    b = manager.allocate(100, "int64", "host", owner="graph")
    c = manager.allocate(8, "uint8", "pinned", owner="replay")
    stats = manager.stats()
    assert set(stats) == {"device", "pinned", "shared", "host", "disk", "pools"}
    assert set(stats["pools"]) == {"pinned", "device"} and stats["pools"]["pinned"]["registrations"] == 1
    assert stats["host"] == {"graph": {"bytes": 1200, "peak": 1200, "regions": 2}}
    assert stats["pinned"] == {"replay": {"bytes": 8, "peak": 8, "regions": 1}}
    assert stats["device"] == {} and stats["disk"] == {}
    a.free()
    b.free()
    c.free()
    d = manager.allocate(50, "uint8", "host", owner="graph")
    assert manager.stats()["host"] == {"graph": {"bytes": 50, "peak": 1200, "regions": 1}}
    assert manager.stats()["pinned"] == {"replay": {"bytes": 0, "peak": 8, "regions": 0}}
    usage = manager.usage()["host"]
    assert (usage["used"], usage["peak"], usage["regions"]) == (50, 1200, 1)
    assert usage["free"] == usage["budget"] - 50
    assert manager.regions() == [d] and manager.regions("replay") == []
    manager.close()
    assert manager.stats()["host"]["graph"]["bytes"] == 0


def test_bad_shapes_tiers_dtypes_and_owners(mm):
    with pytest.raises(ValueError, match=r"negative size -3"):
        mm.allocate((4, -3), "float32", owner="o")
    with pytest.raises(ValueError, match="negative"):
        mm.allocate(-1, "float32", owner="o")
    with pytest.raises(ValueError, match="unknown tier 'gpu'"):
        mm.allocate(4, "float32", "gpu", owner="o")
    with pytest.raises(ValueError, match="unknown tier 'nvme'"):
        mm.allocate(4, "float32", "host", owner="o", fallback=("nvme",))
    for bad in ("float128", "notadtype", object, None, np.dtype(">f4"), torch.qint8):
        with pytest.raises(TypeError):
            mm.allocate(4, bad, owner="o")
    with pytest.raises(TypeError):
        mm.allocate((2.5,), "float32", owner="o")
    with pytest.raises(ValueError, match="owner must be a non-empty string .* got ''"):
        mm.allocate(4, "float32", owner="")
    with pytest.raises(TypeError, match="owner"):
        mm.allocate(4, "float32", owner=7)
    with pytest.raises(TypeError):
        mm.allocate(4, "float32")  # owner is required
    assert mm.usage()["host"]["used"] == 0


def test_disk_needs_spill_dir(mm):
    with pytest.raises(ValueError, match="spill_dir"):
        mm.allocate(4, "float32", "disk", owner="o")
    with pytest.raises(ValueError, match="spill_dir"):
        mm.allocate(4, "float32", "host", owner="o", fallback=("disk",))


def test_register_views_an_existing_buffer(mm, managed):
    arr = np.arange(12, dtype=np.int64).reshape(3, 4)
    r = mm.register(arr, "pinned", owner="features")
    assert r.tier is Tier.PINNED and r.shape == (3, 4) and r.nbytes == 96
    assert r.is_pinned is CUDA
    arr[2, 3] = 100
    assert r.tensor()[2, 3].item() == 100  # no copy
    assert mm.stats()["pinned"]["features"] == {"bytes": 96, "peak": 96, "regions": 1}
    r.free()
    assert mm.stats()["pinned"]["features"]["bytes"] == 0
    t = torch.ones(5)
    with mm.register(t, "host", owner="o") as rt:
        assert rt.tensor().data_ptr() == t.data_ptr()
    with pytest.raises(ValueError, match="contiguous"):
        mm.register(arr[:, ::2], owner="o")
    with pytest.raises(ValueError, match="'pinned' or 'host'"):
        mm.register(arr, "shared", owner="o")
    with pytest.raises(TypeError):
        mm.register([1, 2, 3], owner="o")
    small = managed({"pinned": 10})
    with pytest.raises(MemoryBudgetError):
        small.register(arr, owner="o")
    small.close()


class _ExhaustedHost(HostResource):
    def allocate(self, shape, dtype, nbytes, name):
        raise MemoryError("host allocator exhausted")


def test_allocator_failure_falls_back_and_releases_the_reservation(managed):
    manager = managed(resources={"host": _ExhaustedHost()})
    r = manager.allocate(64, "uint8", "host", owner="o", fallback=("pinned",))
    assert r.tier is Tier.PINNED
    assert manager.usage()["host"]["used"] == 0
    with pytest.raises(MemoryBudgetError, match="allocator failed: host allocator exhausted") as info:
        manager.allocate(64, "uint8", "host", owner="o")
    assert isinstance(info.value.__cause__, MemoryError)
    assert manager.usage()["host"]["used"] == 0 and manager.usage()["host"]["regions"] == 0
    manager.close()


def test_budget_holds_exactly_under_concurrent_allocate_and_free(managed):
    budget = 64 * 1024
    manager = managed({"host": budget})
    lock = threading.Lock()
    state = {"live": 0, "max_live": 0, "over": 0, "refused": 0, "granted": 0}
    n_threads, steps = 8, 300
    barrier = threading.Barrier(n_threads + 1)
    done = threading.Event()
    seen = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        held: list[Region] = []
        barrier.wait()
        for _ in range(steps):
            if held and rng.random() < 0.45:
                region = held.pop(rng.randrange(len(held)))
                with lock:
                    state["live"] -= region.nbytes  # before the free: the count never exceeds the manager's
                region.free()
                continue
            size = rng.randrange(1, 8192)
            try:
                region = manager.allocate(size, "uint8", "host", owner=f"t{seed % 3}")
            except MemoryBudgetError:
                with lock:
                    state["refused"] += 1
                continue
            with lock:  # after the allocation: likewise
                state["granted"] += 1
                state["live"] += size
                state["max_live"] = max(state["max_live"], state["live"])
                state["over"] += state["live"] > budget
            held.append(region)
        for region in held:
            with lock:
                state["live"] -= region.nbytes
            region.free()

    def checker() -> None:
        barrier.wait()
        while not done.is_set():
            seen.append(manager.usage()["host"]["used"])

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
        watch = threading.Thread(target=checker)
        for t in [*threads, watch]:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watch.join()
    finally:
        sys.setswitchinterval(old)
    assert state["over"] == 0 and max(seen) <= budget
    assert state["refused"] > 0 and state["max_live"] > budget // 2  # the budget was actually contended
    usage = manager.usage()["host"]
    assert usage["used"] == 0 and usage["regions"] == 0 and usage["peak"] <= budget
    stats = manager.stats()["host"]
    assert set(stats) == {"t0", "t1", "t2"}
    assert all(s["bytes"] == 0 and s["regions"] == 0 and 0 < s["peak"] <= budget for s in stats.values())
    manager.close()


_TIER_NAMES = st.sampled_from(["device", "pinned", "shared", "host"])


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 600), _TIER_NAMES, st.lists(_TIER_NAMES, max_size=3),
                  st.sampled_from(["a", "b", "c"])),
        st.tuples(st.just("free"), st.integers(0, 1000)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_random_allocate_free_keeps_stats_equal_to_live_regions(ops, managed, shm_names):
    budgets = {"device": 500, "pinned": 700, "shared": 300, "host": 1000}
    manager = managed(budgets)
    live: list[Region] = []
    peaks: dict[tuple[str, str], int] = {}
    try:
        for op in ops:
            if op[0] == "free":
                if live:
                    live.pop(op[1] % len(live)).free()
            else:
                _, size, tier, fallback, owner = op
                order = list(dict.fromkeys([tier, *fallback]))
                used = {t: sum(r.nbytes for r in live if r.tier.value == t) for t in budgets}
                fits = [t for t in order if used[t] + size <= budgets[t]]
                try:
                    region = manager.allocate(size, "uint8", tier, owner=owner, fallback=fallback)
                except MemoryBudgetError as err:
                    assert fits == []
                    expected = [(t, budgets[t] - used[t]) for t in order]
                    assert [(t.value, f) for t, f in err.attempts] == expected
                else:
                    assert region.tier.value == fits[0]  # the first tier in order with room
                    live.append(region)
            stats = manager.stats()
            usage = manager.usage()
            for t, budget in budgets.items():
                mine = [r for r in live if r.tier.value == t]
                assert usage[t]["used"] == sum(r.nbytes for r in mine) <= budget
                assert usage[t]["regions"] == len(mine)
                for owner, s in stats[t].items():
                    owned = [r for r in mine if r.owner == owner]
                    peaks[(t, owner)] = max(peaks.get((t, owner), 0), s["bytes"])
                    assert s["bytes"] == sum(r.nbytes for r in owned)
                    assert s["regions"] == len(owned)
                    assert s["peak"] == peaks[(t, owner)]
    finally:
        manager.close()
    assert shm_names(manager.shm_prefix) == []

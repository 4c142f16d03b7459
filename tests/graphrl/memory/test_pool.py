"""graphrl.memory.pool: freed pinned and device blocks reused, registrations counted, the budget kept,
blocks released on trim and close, tier_of, and pool=False."""

from __future__ import annotations

import mmap
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphrl.memory import (
    MemoryBudgetError,
    MemoryManager,
    PinnedResource,
    PoolResource,
    PoolStats,
    Tier,
    cudart,
)
from graphrl.memory.backing import TensorBacking

MiB = 2**20


class Counting:
    """A host-memory upstream resource that counts its calls (a stand-in for registrations)."""

    def __init__(self, exhausted_above: int | None = None) -> None:
        self.allocated = 0
        self.deallocated = 0
        self.held = 0
        self.exhausted_above = exhausted_above

    def allocate(self, shape, dtype, nbytes, name):
        if self.exhausted_above is not None and self.held + nbytes > self.exhausted_above:
            raise MemoryError("no more page-locked memory")
        self.allocated += 1
        self.held += nbytes
        return TensorBacking(torch.empty(shape, dtype=dtype), is_pinned=False)

    def deallocate(self, backing):
        self.deallocated += 1
        self.held -= backing.data.numel() * backing.data.element_size()

    def capacity(self):
        return 2**40


def pools(manager: MemoryManager, tier: str = "pinned") -> dict[str, int]:
    return manager.stats()["pools"][tier]


def test_same_bytes_are_served_from_the_pool_whatever_the_shape_and_dtype(managed):
    mm = managed()
    r = mm.allocate((256, 64), "float32", "pinned", owner="x")
    r.tensor().fill_(7.0)
    ptr = r.data_ptr()
    r.free()
    assert pools(mm) == {"registrations": 1, "unregistrations": 0, "pool_hits": 0, "pool_misses": 1,
                         "held_bytes": 65536, "idle_bytes": 65536}
    again = mm.allocate((256, 64), "float32", "pinned", owner="x")
    assert again.data_ptr() == ptr and again.tensor().shape == (256, 64)
    again.free()
    other = mm.allocate((128, 8, 8), torch.int64, "pinned", owner="y")  # same bytes, other shape and dtype
    t = other.tensor()
    assert t.shape == (128, 8, 8) and t.dtype == torch.int64 and other.data_ptr() == ptr
    t.fill_(-3)
    assert int(other.numpy().sum()) == -3 * 128 * 64
    s = pools(mm)
    assert (s["registrations"], s["pool_hits"], s["pool_misses"], s["idle_bytes"]) == (1, 2, 1, 0)
    assert mm.stats()["pinned"]["y"] == {"bytes": 65536, "peak": 65536, "regions": 1}
    assert mm.free_bytes("pinned") == mm.budget("pinned") - 65536
    other.free()
    smaller = mm.allocate(1000, "uint8", "pinned", owner="x")  # exact sizes only by default: a new block
    assert pools(mm)["registrations"] == 2 and pools(mm)["idle_bytes"] == 65536
    smaller.free()
    mm.close()
    assert pools(mm)["unregistrations"] == 1  # t still views its block: released when t dies
    del t
    assert pools(mm)["unregistrations"] == 2 and pools(mm)["held_bytes"] == 0


def test_a_block_is_reused_only_after_the_views_of_its_region_are_gone(managed):
    mm = managed()
    r = mm.allocate(1024, "int32", "pinned", owner="x")
    early = r.tensor()[100:200]  # a view taken before the free stays the region's data
    early.fill_(5)
    r.free()
    r2 = mm.allocate(1024, "int32", "pinned", owner="x")
    assert pools(mm)["registrations"] == 2 and pools(mm)["pool_hits"] == 0
    r2.tensor().fill_(9)
    assert int(early.sum()) == 5 * 100
    del early
    r2.free()
    r3 = mm.allocate((32, 32), "float32", "pinned", owner="x")
    assert pools(mm)["pool_hits"] == 1 and pools(mm)["registrations"] == 2
    r3.free()
    mm.close()


def test_the_pool_releases_idle_blocks_to_keep_the_budget(managed):
    mm = managed({"pinned": 10 * MiB})
    a = mm.allocate(6 * MiB, "uint8", "pinned", owner="x")
    a.free()
    assert pools(mm)["held_bytes"] == 6 * MiB and mm.free_bytes("pinned") == 10 * MiB  # idle is reclaimable
    b = mm.allocate(8 * MiB, "uint8", "pinned", owner="x")
    s = pools(mm)
    assert (s["unregistrations"], s["registrations"], s["held_bytes"], s["idle_bytes"]) == (1, 2, 8 * MiB, 0)
    with pytest.raises(MemoryBudgetError):
        mm.allocate(3 * MiB, "uint8", "pinned", owner="x")
    c = mm.allocate(2 * MiB, "uint8", "pinned", owner="x")
    assert pools(mm)["held_bytes"] == 10 * MiB
    b.free()
    c.free()
    assert mm.trim("pinned") == 10 * MiB and pools(mm)["held_bytes"] == 0
    assert mm.trim() == 0
    mm.close()


def test_registered_buffers_count_and_squeeze_the_pool(managed):
    mm = managed({"pinned": 10 * MiB})
    mm.allocate(6 * MiB, "uint8", "pinned", owner="x").free()
    buf = np.zeros(8 * MiB, dtype=np.uint8)
    reg = mm.register(buf, "pinned", owner="user")  # pooled and registered bytes stay within the budget
    s = pools(mm)
    assert (s["registrations"], s["unregistrations"], s["held_bytes"]) == (2, 1, 0)
    assert mm.tier_of(torch.from_numpy(buf)[5:]) is Tier.PINNED
    r = mm.allocate(2 * MiB, "uint8", "pinned", owner="x")
    assert pools(mm)["held_bytes"] == 2 * MiB
    reg.free()
    r.free()
    assert pools(mm)["unregistrations"] == 2  # the registered buffer's
    mm.close()
    s = pools(mm)
    assert s["unregistrations"] == s["registrations"] == 3 and s["held_bytes"] == 0


def test_close_unregisters_every_block_once(monkeypatch, managed):
    calls: list[tuple] = []
    monkeypatch.setattr(cudart, "host_register", lambda ptr, n: calls.append(("register", ptr, n)))
    monkeypatch.setattr(cudart, "host_unregister", lambda ptr: calls.append(("unregister", ptr)))
    mm = managed({"pinned": MiB}, resources={"pinned": PinnedResource(cuda=True)})
    live = [mm.allocate((3, 5), "float32", "pinned", owner="o") for _ in range(3)]
    assert all(r.is_pinned and r.data_ptr() % mmap.PAGESIZE == 0 for r in live)
    live[0].free()
    live[1].free()
    assert [c[0] for c in calls] == ["register"] * 3  # freeing unregisters nothing
    again = mm.allocate(60, "uint8", "pinned", owner="o")
    assert again.is_pinned and len(calls) == 3 and pools(mm)["pool_hits"] == 1
    with mm.allocate(0, "float32", "pinned", owner="o") as empty:  # nothing to register for 0 bytes
        assert empty.is_pinned
    mm.close()
    registered = {c[1] for c in calls if c[0] == "register"}
    unregistered = [c[1] for c in calls if c[0] == "unregister"]
    assert sorted(unregistered) == sorted(registered) and len(unregistered) == 3
    s = pools(mm)
    assert s == {"registrations": 3, "unregistrations": 3, "pool_hits": 1, "pool_misses": 3, "held_bytes": 0,
                 "idle_bytes": 0}
    assert mm.stats()["pinned"]["o"]["bytes"] == 0  # statistics stay readable


def test_custom_resources_are_wrapped_and_pool_false_allocates_every_time(managed):
    up = Counting()
    pooled = managed(resources={"pinned": up})
    for _ in range(4):
        pooled.allocate((10, 10), "float64", "pinned", owner="o").free()
    assert (up.allocated, up.deallocated) == (1, 0)
    pooled.close()
    assert (up.allocated, up.deallocated) == (1, 1)

    up = Counting()
    plain = managed(resources={"pinned": up}, pool=False)
    for _ in range(4):
        plain.allocate((10, 10), "float64", "pinned", owner="o").free()
    assert (up.allocated, up.deallocated) == (4, 4)
    assert pools(plain) == {"registrations": 4, "unregistrations": 4, "pool_hits": 0, "pool_misses": 4,
                            "held_bytes": 0, "idle_bytes": 0}
    r = plain.allocate(8, "uint8", "device", owner="o")  # device tier unpooled too
    assert pools(plain, "device")["held_bytes"] == 8
    r.free()
    plain.close()


def test_the_device_tier_is_pooled(managed):
    mm = managed({"device": 4096}, device="cpu")
    r = mm.allocate((32, 32), "float32", "device", owner="d")
    assert r.device == "cpu" and mm.tier_of(r.tensor()) is Tier.DEVICE
    r.free()
    r2 = mm.allocate((1024,), "float32", "device", owner="d")
    s = pools(mm, "device")
    assert (s["registrations"], s["pool_hits"], s["held_bytes"]) == (1, 1, 4096)
    r2.free()
    mm.close()
    assert pools(mm, "device")["unregistrations"] == 1


def test_tier_of_finds_the_region_holding_a_tensor(managed):
    mm = managed(device="cpu")
    tiers = ("device", "pinned", "shared", "host")
    regions = {t: mm.allocate((100, 10), "float32", t, owner="o") for t in tiers}
    for tier, r in regions.items():
        t = r.tensor()
        assert mm.tier_of(t) is Tier(tier)
        assert mm.tier_of(t[50:, 3:]) is Tier(tier)  # a view inside the region
        assert mm.tier_of(t[99, 9:]) is Tier(tier)  # its last element
    foreign = torch.zeros(100)
    assert mm.tier_of(foreign) is None and mm.tier_of(foreign[:0]) is None
    arr = np.ones(64)
    reg = mm.register(arr, "host", owner="o")
    assert mm.tier_of(torch.from_numpy(arr)) is Tier.HOST
    reg.free()
    assert mm.tier_of(torch.from_numpy(arr)) is None
    view = regions["pinned"].tensor()[10:]
    regions["pinned"].free()
    assert mm.tier_of(view) is None
    with pytest.raises(TypeError, match="torch.Tensor"):
        mm.tier_of(np.zeros(3))  # type: ignore[arg-type]
    host_view = regions["host"].tensor()
    mm.close()
    assert mm.tier_of(host_view) is None


def test_pool_resource_options():
    with pytest.raises(ValueError, match="'pinned' or 'device'"):
        PoolResource(Counting(), tier="host")
    with pytest.raises(ValueError, match="max_waste"):
        PoolResource(Counting(), tier="pinned", max_waste=1.0)
    with pytest.raises(TypeError, match="MemoryResource"):
        PoolResource(object(), tier="pinned")  # type: ignore[arg-type]
    up = Counting()
    pool = PoolResource(up, tier="pinned", max_waste=0.25, max_idle=1500)
    big = pool.allocate((1000,), torch.uint8, 1000, "a")
    pool.deallocate(big)
    small = pool.allocate((200,), torch.int32, 800, "b")  # 20% of the block unused: reused
    assert small.tensor().shape == (200,) and pool.stats().pool_hits == 1
    pool.deallocate(small)
    tiny = pool.allocate((700,), torch.uint8, 700, "c")  # 30% unused: a new block
    assert pool.stats().registrations == 2
    pool.deallocate(tiny)  # 1700 idle > max_idle: the oldest goes
    assert pool.stats() == PoolStats(registrations=2, unregistrations=1, pool_hits=1, pool_misses=2,
                                     held_bytes=700, idle_bytes=700)
    assert pool.trim() == 700 and up.held == 0 and up.deallocated == 2


def test_an_exhausted_upstream_is_retried_after_releasing_idle_blocks(managed):
    up = Counting(exhausted_above=3000)
    mm = managed(resources={"pinned": up})
    mm.allocate(2000, "uint8", "pinned", owner="o").free()
    r = mm.allocate(2500, "uint8", "pinned", owner="o", fallback=("host",))
    assert r.tier is Tier.PINNED and up.deallocated == 1 and pools(mm)["held_bytes"] == 2500
    r2 = mm.allocate(1000, "uint8", "pinned", owner="o", fallback=("host",))  # upstream full: host
    assert r2.tier is Tier.HOST and pools(mm)["held_bytes"] == 2500
    mm.close()


def test_threads_allocating_and_freeing_keep_the_budget(managed):
    budget = 64 * 1024
    mm = managed({"pinned": budget})
    errors: list[BaseException] = []
    over = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        mine = []
        try:
            for _ in range(300):
                if mine and rng.random() < 0.5:
                    r, value = mine.pop(int(rng.integers(len(mine))))
                    assert bool((r.tensor() == value).all())
                    r.free()
                else:
                    size = int(rng.choice([1024, 2048, 4096, 3000]))
                    try:
                        r = mm.allocate(size, "uint8", "pinned", owner=f"t{seed}")
                    except MemoryBudgetError:
                        continue
                    value = int(rng.integers(256))
                    r.tensor().fill_(value)
                    mine.append((r, value))
                held = pools(mm)["held_bytes"]
                if held > budget:
                    over.append(held)
            for r, value in mine:
                assert bool((r.tensor() == value).all())
                r.free()
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and over == []
    s = pools(mm)
    assert s["held_bytes"] == s["idle_bytes"] <= budget and s["pool_hits"] > 0
    assert mm.usage()["pinned"]["used"] == 0
    mm.close()


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.sampled_from([0, 64, 96, 128, 256, 300, 512, 640, 1000]),
                  st.sampled_from(["pinned", "device"])),
        st.tuples(st.just("free"), st.integers(0, 1000)),
        st.tuples(st.just("register"), st.sampled_from([64, 200])),
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_random_sequences_keep_held_bytes_within_budget_and_regions_independent(ops, managed):
    budgets = {"pinned": 1200, "device": 1000}
    mm = managed(budgets, device="cpu")
    live: list[tuple] = []  # (region, value)
    stamp = 0
    try:
        for op in ops:
            if op[0] == "free":
                if live:
                    live.pop(op[1] % len(live))[0].free()
            elif op[0] == "register":
                arr = np.empty(op[1], dtype=np.uint8)
                used = sum(r.nbytes for r, _ in live if r.tier is Tier.PINNED)
                try:
                    region = mm.register(arr, "pinned", owner="reg")
                except MemoryBudgetError:
                    assert used + op[1] > budgets["pinned"]
                else:
                    stamp += 1
                    region.tensor().fill_(stamp % 256)
                    live.append((region, stamp % 256))
            else:
                _, size, tier = op
                used = sum(r.nbytes for r, _ in live if r.tier.value == tier)
                try:
                    region = mm.allocate(size, "uint8", tier, owner="o")
                except MemoryBudgetError:
                    assert used + size > budgets[tier]  # the pool serves whatever the budget admits
                else:
                    assert used + size <= budgets[tier] and region.tier.value == tier
                    stamp += 1
                    region.tensor().fill_(stamp % 256)
                    live.append((region, stamp % 256))
            stats = mm.stats()
            for tier, budget in budgets.items():
                mine = [r for r, _ in live if r.tier.value == tier]
                registered = sum(r.nbytes for r in mine if r.owner == "reg")
                pool = stats["pools"][tier]
                assert pool["held_bytes"] + registered <= budget
                assert pool["held_bytes"] - pool["idle_bytes"] == sum(r.nbytes for r in mine) - registered
                assert sum(u["bytes"] for u in stats[tier].values()) == sum(r.nbytes for r in mine)
                assert mm.free_bytes(tier) == budget - sum(r.nbytes for r in mine)
            for region, value in live:  # no region's memory is another's
                assert bool((region.tensor() == value).all())
                if region.nbytes:
                    assert mm.tier_of(region.tensor()) is region.tier
    finally:
        mm.close()
    for tier in budgets:
        s = mm.stats()["pools"][tier]
        assert s["held_bytes"] == 0 and s["unregistrations"] == s["registrations"]


class _SlowPinned(PinnedResource):
    """A pinned upstream whose allocate blocks until released (to order close() against it)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.go = threading.Event()

    def allocate(self, *args):
        self.entered.set()
        assert self.go.wait(10)
        return super().allocate(*args)


def test_close_during_allocation_returns_every_pooled_block():
    """An allocation in flight while close() runs frees its region after close() released the pools:
    its block goes upstream too (it used to stay on the idle list, registered for good)."""
    up = _SlowPinned()
    mm = MemoryManager(resources={"pinned": up})  # wrapped in a PoolResource (docs)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            mm.allocate(1024, "uint8", "pinned", owner="x")
        except ValueError as err:
            errors.append(err)

    th = threading.Thread(target=worker)
    th.start()
    assert up.entered.wait(10)
    mm.close()
    up.go.set()
    th.join(10)
    assert errors and "closed" in str(errors[0])
    pools = mm.stats()["pools"]["pinned"]
    assert pools["held_bytes"] == 0, pools
    assert pools["registrations"] == pools["unregistrations"], pools


def test_tier_of_finds_enclosing_region_past_a_registered_subrange():
    """A buffer registered inside a region nests: tier_of answers the innermost region holding the byte
    (it used to stop at the registered span and answer None past its end)."""
    with MemoryManager() as mm:
        region = mm.allocate(1000, "uint8", "host", owner="a")
        t = region.tensor()
        mm.register(t[10:20], "pinned", owner="b")
        assert mm.tier_of(t[:5]) is Tier.HOST and mm.tier_of(t[12:]) is Tier.PINNED
        assert mm.tier_of(t[500:]) is Tier.HOST

"""Tests of graphrl.memory: budgets, fallback, statistics, zero-copy views, shared memory, disk spill."""

from __future__ import annotations

import gc
import logging
import mmap
import multiprocessing as mp
import os
import pickle
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphrl.memory import (
    HostResource,
    MemoryBudgetError,
    MemoryManager,
    PinnedResource,
    Region,
    RegionHandle,
    Tier,
    cudart,
    parse_size,
)

SHM = Path("/dev/shm")
CUDA = torch.cuda.is_available()
MEMORY_TIERS = ["device", "pinned", "shared", "host"]
_PREFIXES: list[str] = []  # every manager made here; checked for leaks at the end of the module


def shm_names(prefix: str) -> list[str]:
    return sorted(p.name for p in SHM.glob(prefix + "*"))


@pytest.fixture
def mm():
    manager = MemoryManager()
    _PREFIXES.append(manager.shm_prefix)
    yield manager
    manager.close()
    assert shm_names(manager.shm_prefix) == []


@pytest.fixture(scope="module", autouse=True)
def no_shm_left_by_this_module():
    yield
    gc.collect()  # managers a failed test left open clean up when collected
    leaked = [name for prefix in _PREFIXES for name in shm_names(prefix)]
    assert leaked == [], f"shared memory left in /dev/shm: {leaked}"


def managed(*args, **kwargs) -> MemoryManager:
    manager = MemoryManager(*args, **kwargs)
    _PREFIXES.append(manager.shm_prefix)
    return manager


# ---------------------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("1.5KiB", 1536),
        (" 2 kb ", 2000),
        ("100", 100),
        ("7B", 7),
        ("0.5B", 0),
        ("3 tib", 3 * 2**40),
        (4096, 4096),
        (np.int64(3), 3),
    ],
)
def test_parse_size_accepts_iec_and_si_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["8 GiBs", "lots", "", "-1GiB", "1e9", "8G", "1.2.3MB"])
def test_parse_size_rejects_bad_strings_naming_them(text):
    with pytest.raises(ValueError, match="cannot parse size") as info:
        parse_size(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("value", [1.5, True, None, [1]])
def test_parse_size_rejects_other_types(value):
    with pytest.raises(TypeError):
        parse_size(value)


def test_parse_size_rejects_negative_ints():
    with pytest.raises(ValueError, match="-5"):
        parse_size(-5)


def test_budgets_reject_unknown_tiers_and_bad_sizes():
    with pytest.raises(ValueError, match="unknown tier 'gpu'.*device, pinned, shared, host, disk"):
        MemoryManager(budgets={"gpu": 10})
    with pytest.raises(ValueError, match=r"budgets\['host'\].*'lots'"):
        MemoryManager(budgets={"host": "lots"})
    with pytest.raises(TypeError, match=r"budgets\['pinned'\]"):
        MemoryManager(budgets={Tier.PINNED: 1.5})


def test_budgets_parse_and_absent_tiers_get_the_machines_capacity(tmp_path):
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


def test_tier_parse():
    assert [t.value for t in Tier] == ["device", "pinned", "shared", "host", "disk"]
    assert Tier.parse("Pinned") is Tier.PINNED
    assert Tier.parse(Tier.DISK) is Tier.DISK
    with pytest.raises(TypeError):
        Tier.parse(3)


# ---------------------------------------------------------------------------------------------- budgets


def test_budget_is_exact_and_freed_bytes_return():
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


def test_budget_error_names_tier_owner_asked_and_free():
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


def test_fallback_follows_the_given_order():
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


def test_larger_than_every_tier_fails_cleanly(tmp_path):
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


def test_stats_per_tier_and_owner_keep_owners_after_free():
    manager = managed()
    a = manager.allocate((10, 10), "float32", "host", owner="graph")
    b = manager.allocate(100, "int64", "host", owner="graph")
    c = manager.allocate(8, "uint8", "pinned", owner="replay")
    stats = manager.stats()
    assert set(stats) == {"device", "pinned", "shared", "host", "disk"}
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


# ---------------------------------------------------------------------------------------------- bad input


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
    with pytest.raises(TypeError, match="owner"):
        mm.allocate(4, "float32", owner="")
    with pytest.raises(TypeError):
        mm.allocate(4, "float32")  # owner is required
    assert mm.usage()["host"]["used"] == 0


@pytest.mark.parametrize(
    "dtype", [torch.float32, np.float32, np.dtype("float32"), "float32", "torch.float32", "f4"]
)
def test_dtype_spellings_agree(mm, dtype):
    with mm.allocate(3, dtype, owner="o") as r:
        assert r.dtype == torch.float32 and r.nbytes == 12 and r.numpy().dtype == np.float32


def test_disk_needs_spill_dir(mm):
    with pytest.raises(ValueError, match="spill_dir"):
        mm.allocate(4, "float32", "disk", owner="o")
    with pytest.raises(ValueError, match="spill_dir"):
        mm.allocate(4, "float32", "host", owner="o", fallback=("disk",))


# ---------------------------------------------------------------------------------------------- zero copy


@pytest.mark.parametrize("tier", MEMORY_TIERS)
def test_views_are_zero_copy(mm, tier):
    with mm.allocate((4, 5), "float32", tier, owner="o") as r:
        t = r.tensor()
        assert t.shape == (4, 5) and t.dtype == torch.float32 and r.shape == (4, 5)
        if t.device.type != "cpu":
            pytest.skip("numpy views need host memory")
        t.copy_(torch.arange(20, dtype=torch.float32).view(4, 5))
        a = r.numpy()
        assert a[3, 4] == 19.0
        a[0, 0] = -1.0
        assert r.tensor()[0, 0].item() == -1.0
        via_dlpack = torch.from_dlpack(r)
        via_dlpack[1, 1] = 42.0
        assert t[1, 1].item() == 42.0 and np.from_dlpack(r)[1, 1] == 42.0
        assert via_dlpack.data_ptr() == t.data_ptr() == r.data_ptr() == a.ctypes.data
        r.write(np.full((5,), 2.0))  # broadcast to (4, 5)
        assert float(t.sum()) == 40.0
        with pytest.raises(ValueError, match="cannot write"):
            r.write(np.zeros((3, 3)))


@pytest.mark.parametrize("tier", MEMORY_TIERS)
def test_double_free_and_use_after_free_raise(mm, tier):
    r = mm.allocate((64,), "int32", tier, owner="o")
    early = r.tensor()
    early.fill_(5)
    r.free()
    assert r.freed
    with pytest.raises(ValueError, match="already freed"):
        r.free()
    for use in (r.tensor, r.numpy, lambda: r.write(1), r.__dlpack__, r.data_ptr):
        with pytest.raises(ValueError, match="was freed"):
            use()
    assert int(early.sum()) == 5 * 64  # a view from before the free stays readable memory
    assert mm.usage()[tier]["used"] == 0
    if tier == "shared":
        assert shm_names(mm.shm_prefix) == []


def test_context_manager_frees_even_after_explicit_free(mm):
    with mm.allocate(8, "uint8", "pinned", owner="o") as r:
        assert mm.usage()["pinned"]["used"] == 8
    assert r.freed and mm.usage()["pinned"]["used"] == 0
    with mm.allocate(8, "uint8", owner="o") as r2:
        r2.free()  # leaving the block does not free twice
    with pytest.raises(RuntimeError), mm.allocate(8, "uint8", "shared", owner="o") as r3:
        raise RuntimeError("boom")
    assert r3.freed and shm_names(mm.shm_prefix) == []


@pytest.mark.skipif(CUDA, reason="checks the no-GPU path")
def test_without_cuda_device_and_pinned_resolve_to_host(mm, caplog):
    with caplog.at_level(logging.WARNING, logger="graphrl.memory"):
        d1 = mm.allocate(4, "float32", "device", owner="o")
        d2 = mm.allocate(4, "float32", "device", owner="o")
    assert d1.tier is Tier.DEVICE and d1.device == "cpu" and not d1.is_pinned
    assert d1.tensor().device.type == "cpu"
    warnings = [rec for rec in caplog.records if "device tier resolves to host" in rec.getMessage()]
    assert len(warnings) == 1  # once per manager
    p = mm.allocate(4, "float32", "pinned", owner="o")
    assert p.tier is Tier.PINNED and p.is_pinned is False and p.tensor().is_pinned() is False
    assert mm.usage()["device"]["used"] == 32 and mm.usage()["pinned"]["used"] == 16
    for r in (d1, d2, p):
        r.free()


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_with_cuda_device_and_pinned_are_real(mm):
    d = mm.allocate(4, "float32", "device", owner="o")
    assert d.device.startswith("cuda") and d.tensor().is_cuda
    with pytest.raises(ValueError, match="cannot view memory on cuda"):
        d.numpy()
    p = mm.allocate(4, "float32", "pinned", owner="o")
    assert p.is_pinned and p.tensor().is_pinned()
    arr = np.zeros(1024, np.float32)
    reg = mm.register(arr, "pinned", owner="o")
    assert reg.is_pinned
    reg.free()


def test_pinned_cuda_path_registers_exact_page_aligned_memory(monkeypatch):
    """The CUDA wiring of the pinned tier, with cudaHostRegister replaced by a recorder."""
    calls = []
    monkeypatch.setattr(cudart, "host_register", lambda ptr, n: calls.append(("register", ptr, n)))
    monkeypatch.setattr(cudart, "host_unregister", lambda ptr: calls.append(("unregister", ptr)))
    manager = managed({"pinned": 1000}, resources={"pinned": PinnedResource(cuda=True)})
    r = manager.allocate((3, 5), "float32", "pinned", owner="o")
    ptr = r.data_ptr()
    assert r.is_pinned and ptr % mmap.PAGESIZE == 0 and calls == [("register", ptr, 60)]
    r.tensor().fill_(2.0)
    assert float(r.numpy().sum()) == 30.0
    r.free()
    assert calls[-1] == ("unregister", ptr)
    with manager.allocate(0, "float32", "pinned", owner="o") as empty:
        assert empty.is_pinned
    assert len(calls) == 2  # nothing to register for zero bytes
    arr = np.zeros(8, dtype=np.int64)
    reg = manager.register(arr, "pinned", owner="o")
    assert reg.is_pinned and calls[-1] == ("register", arr.ctypes.data, 64)
    reg.free()
    assert calls[-1] == ("unregister", arr.ctypes.data)

    def exhausted(ptr, n):
        raise MemoryError("cudaHostRegister could not page-lock")

    monkeypatch.setattr(cudart, "host_register", exhausted)
    r2 = manager.allocate(8, "uint8", "pinned", owner="o", fallback=("host",))
    assert r2.tier is Tier.HOST and manager.usage()["pinned"]["used"] == 0
    manager.close()


def test_register_views_an_existing_buffer(mm):
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


# ---------------------------------------------------------------------------------------------- shared


def test_shared_regions_are_owner_only_even_with_umask_zero(mm):
    old = os.umask(0)
    try:
        r = mm.allocate((16,), "float64", "shared", owner="replay")
    finally:
        os.umask(old)
    assert r.name.startswith(mm.shm_prefix) and r.name.startswith(f"graphrl_{os.getpid()}_")
    st_ = os.stat(SHM / r.name)
    assert st_.st_mode & 0o777 == 0o600
    assert st_.st_uid == os.getuid()
    assert st_.st_size >= r.nbytes
    r.free()
    assert not (SHM / r.name).exists()


def test_shared_attach_by_handle_name_and_pickle(mm):
    r = mm.allocate((3, 4), "int16", "shared", owner="replay")
    r.tensor().copy_(torch.arange(12, dtype=torch.int16).view(3, 4))
    h = r.handle()
    assert h == RegionHandle(r.name, (3, 4), "int16", "replay")
    assert pickle.loads(pickle.dumps(h)) == h
    a = Region.attach(h)
    b = Region.attach(r.name, (3, 4), torch.int16)
    c = pickle.loads(pickle.dumps(r))  # pickling a shared region sends its handle
    d = mm.attach(h)
    for other in (a, b, c, d):
        assert not other.owns and other.tier is Tier.SHARED
        assert other.numpy().tolist() == r.numpy().tolist()
    a.tensor()[0, 0] = 99
    assert r.tensor()[0, 0].item() == 99 and c.numpy()[0, 0] == 99
    assert mm.usage()["shared"]["used"] == 24  # attaching counts against no budget
    a.free()
    with pytest.raises(ValueError, match="already freed"):
        a.free()
    assert (SHM / r.name).exists()  # an attached region never unlinks
    with pytest.raises(ValueError, match="fewer than"):
        Region.attach(r.name, (100, 4), "int16")
    with pytest.raises(ValueError, match="needs shape and dtype"):
        Region.attach(r.name)
    r.free()
    assert b.numpy()[0, 0] == 99  # still mapped here after the owner unlinked
    with pytest.raises(FileNotFoundError, match=r.name):
        Region.attach(h)
    b.free()
    c.free()
    with pytest.raises(TypeError, match="private"):
        pickle.dumps(mm.allocate(4, "uint8", "host", owner="o"))
    with pytest.raises(ValueError, match="only shared"):
        mm.allocate(4, "uint8", "host", owner="o").handle()
    mm.close()
    assert d.freed  # closing the manager unmaps what it attached


def test_unlink_removes_the_name_and_keeps_the_region(mm):
    r = mm.allocate((2, 5), "int32", "shared", owner="graph")
    r.tensor().copy_(torch.arange(10, dtype=torch.int32).view(2, 5))
    a = mm.attach(r.handle())  # attached before the unlink: stays mapped
    stats, usage = mm.stats(), mm.usage()
    r.unlink()
    assert not (SHM / r.name).exists() and shm_names(mm.shm_prefix) == []
    assert mm.stats() == stats and mm.usage() == usage  # the bytes stay in use until free
    r.unlink()  # idempotent
    with pytest.raises(FileNotFoundError, match="unlink"):
        Region.attach(r.handle())
    with pytest.raises(FileNotFoundError, match=r.name):
        pickle.loads(pickle.dumps(r))
    a.tensor()[1, 4] = -1  # both mappings still work and still share their bytes
    r.tensor()[0, 0] = 42
    assert r.numpy()[1, 4] == -1 and a.numpy()[0, 0] == 42
    with pytest.raises(ValueError, match="only its owner"):
        a.unlink()
    r.free()  # no error on the missing name; the bytes go back
    assert mm.usage()["shared"]["used"] == 0
    assert a.numpy()[1, 4] == -1
    with pytest.raises(ValueError, match="freed"):
        r.unlink()
    with pytest.raises(ValueError, match="only shared"):
        mm.allocate(4, "uint8", "host", owner="o").unlink()
    kept = mm.allocate(4, "uint8", "shared", owner="o")
    kept.unlink()
    mm.close()  # close frees an unlinked region without complaint
    assert kept.freed and a.freed


def test_unlinked_region_leaves_nothing_when_the_owner_is_killed(tmp_path):
    code = (
        "import os, signal; from graphrl.memory import MemoryManager\n"
        "mm = MemoryManager()\n"
        "r = mm.allocate(64, 'uint8', 'shared', owner='x'); r.unlink(); r.tensor()[:] = 1\n"
        "print(mm.shm_prefix, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == -9, out.stderr
    assert shm_names(out.stdout.strip()) == []


def _child_attaches(handle, spill_dir, queue):  # runs in a spawned process
    from graphrl.memory import MemoryManager, Region

    region = Region.attach(handle)
    values = region.numpy()
    queue.put((int(values.sum()), values[:3].tolist()))
    values[:] = 7  # visible to the owner
    region.free()
    own = MemoryManager(spill_dir=spill_dir)  # left open on purpose: cleaned at interpreter exit
    kept = own.allocate(10, "uint8", "shared", owner="child")
    disk = own.allocate(10, "uint8", "disk", owner="child")
    queue.put((own.shm_prefix, (SHM / kept.name).exists(), disk.path.exists()))


def _child_raises(spill_dir, queue):  # runs in a spawned or forked process
    from graphrl.memory import MemoryManager

    manager = MemoryManager(spill_dir=spill_dir)
    regions = [manager.allocate((100,), "float32", "shared", owner="child") for _ in range(3)]
    regions.append(manager.allocate((100,), "float32", "disk", owner="child"))
    queue.put((manager.shm_prefix, [(SHM / r.name).exists() for r in regions[:3]], regions[3].path.exists()))
    raise RuntimeError("child fails on purpose")


def test_other_process_attaches_and_sees_the_same_bytes(mm, tmp_path, capfd):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    r = mm.allocate(1000, "int64", "shared", owner="replay")
    r.tensor().copy_(torch.arange(1000))
    child = ctx.Process(target=_child_attaches, args=(r.handle(), tmp_path, queue))
    child.start()
    total, head = queue.get(timeout=120)
    prefix, existed, disk_existed = queue.get(timeout=120)
    child.join(120)
    assert child.exitcode == 0
    assert (total, head) == (499500, [0, 1, 2])
    assert bool((r.numpy() == 7).all())  # the child's writes
    assert existed and disk_existed
    assert shm_names(prefix) == [] and list(tmp_path.iterdir()) == []  # cleaned at the child's exit
    err = capfd.readouterr().err
    assert "resource_tracker" not in err and "leaked" not in err, err


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_child_that_raises_leaves_nothing_in_dev_shm(tmp_path, method, capfd):
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    child = ctx.Process(target=_child_raises, args=(tmp_path, queue))
    child.start()
    prefix, existed, disk_existed = queue.get(timeout=120)
    child.join(120)
    assert child.exitcode == 1
    assert existed == [True, True, True] and disk_existed
    assert prefix.startswith(f"graphrl_{child.pid}_")
    assert shm_names(prefix) == []
    assert list(tmp_path.iterdir()) == []
    assert "child fails on purpose" in capfd.readouterr().err


def test_normal_exit_without_close_leaves_nothing(tmp_path):
    code = (
        "import sys; from graphrl.memory import MemoryManager\n"
        f"mm = MemoryManager(spill_dir={str(tmp_path)!r})\n"
        "r = mm.allocate(64, 'uint8', 'shared', owner='x'); mm.allocate(8, 'int64', 'disk', owner='x')\n"
        "print(mm.shm_prefix, r.name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    prefix, name = out.stdout.split()
    assert name.startswith(prefix)
    assert shm_names(prefix) == [] and list(tmp_path.iterdir()) == []
    assert out.stderr == ""


def test_exception_inside_manager_block_cleans_up(tmp_path):
    with pytest.raises(KeyError), managed(spill_dir=tmp_path) as manager:
        manager.allocate(10, "uint8", "shared", owner="o")
        manager.allocate(10, "uint8", "disk", owner="o")
        raise KeyError("boom")
    assert manager.closed
    assert shm_names(manager.shm_prefix) == [] and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------- disk


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("bool", (7, 3)), ("float16", (5,)), ("int64", (4, 2, 3)), ("float32", ()), ("uint8", (0, 4)),
     ("complex64", (3,)), (torch.int32, (1000, 17))],
)
def test_disk_round_trip_gives_the_same_bytes(tmp_path, dtype, shape):
    manager = managed({"disk": "1MiB"}, spill_dir=tmp_path / "spill")
    r = manager.allocate(shape, dtype, "disk", owner="spill")
    assert r.tier is Tier.DISK and r.path.parent == tmp_path / "spill" and r.path.exists()
    npd = r.numpy().dtype
    rng = np.random.default_rng(0)
    data = (rng.standard_normal(shape) * 100).astype(npd) if npd != np.bool_ else rng.random(shape) < 0.5
    r.write(data)
    back = r.numpy()
    assert back.dtype == npd and back.shape == shape
    assert back.tobytes() == np.ascontiguousarray(data).tobytes()
    t = r.tensor()
    assert t.shape == shape and t.numpy().tobytes() == data.tobytes()
    if t.numel():
        t.view(-1)[0] = t.view(-1)[0] + 1 if npd != np.bool_ else ~t.view(-1)[0]
        assert r.numpy().tobytes() == data.tobytes()  # tensor() of a disk region is a copy
    r.write(torch.from_numpy(np.array(data, order="C")))
    assert manager.stats()["disk"]["spill"]["bytes"] == r.nbytes
    r.free()
    assert not r.path.exists()
    assert manager.usage()["disk"]["used"] == 0
    manager.close()


def test_disk_partial_writes_fallback_and_close(tmp_path):
    manager = managed({"host": 100}, spill_dir=tmp_path)
    r = manager.allocate((50, 4), "float32", "host", owner="feat", fallback=("disk",))
    assert r.tier is Tier.DISK  # 800 bytes do not fit the host's 100
    r.zarr()[10:20] = 1.5
    assert float(r.numpy().sum()) == 1.5 * 40
    with pytest.raises(ValueError, match="only disk"):
        manager.allocate(4, "uint8", owner="o").zarr()
    with pytest.raises(TypeError, match="bfloat16"):
        manager.allocate(4, "bfloat16", "disk", owner="o")
    with pytest.raises(ValueError, match="no address"):
        r.data_ptr()
    manager.close()
    assert r.freed and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="closed"):
        manager.allocate(4, "uint8", owner="o")
    manager.close()  # idempotent


def test_bfloat16_on_memory_tiers(mm):
    for tier in ("host", "shared"):
        with mm.allocate((2, 3), "bfloat16", tier, owner="o") as r:
            r.tensor().fill_(1.5)
            assert r.nbytes == 12 and float(r.tensor().float().sum()) == 9.0
            with pytest.raises(TypeError):
                r.numpy()


# ---------------------------------------------------------------------------------------------- faults


class _ExhaustedHost(HostResource):
    def allocate(self, shape, dtype, nbytes, name):
        raise MemoryError("host allocator exhausted")


def test_allocator_failure_falls_back_and_releases_the_reservation():
    manager = managed(resources={"host": _ExhaustedHost()})
    r = manager.allocate(64, "uint8", "host", owner="o", fallback=("pinned",))
    assert r.tier is Tier.PINNED
    assert manager.usage()["host"]["used"] == 0
    with pytest.raises(MemoryBudgetError, match="allocator failed: host allocator exhausted") as info:
        manager.allocate(64, "uint8", "host", owner="o")
    assert isinstance(info.value.__cause__, MemoryError)
    assert manager.usage()["host"]["used"] == 0 and manager.usage()["host"]["regions"] == 0
    manager.close()


def test_budget_holds_exactly_under_concurrent_allocate_and_free():
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
def test_random_allocate_free_keeps_stats_equal_to_live_regions(ops):
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

"""graphrl.memory.shm and shared regions: owner-only segments, attach by handle, name and pickle, unlink,
and nothing left in /dev/shm whatever way a process ends."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphrl.memory import Region, RegionHandle, Tier

SHM = Path("/dev/shm")


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


def test_unlink_removes_the_name_and_keeps_the_region(mm, shm_names):
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


def test_unlinked_region_leaves_nothing_when_the_owner_is_killed(tmp_path, shm_names):
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


def test_other_process_attaches_and_sees_the_same_bytes(mm, tmp_path, capfd, shm_names):
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
def test_child_that_raises_leaves_nothing_in_dev_shm(tmp_path, method, capfd, shm_names):
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


def test_normal_exit_without_close_leaves_nothing(tmp_path, shm_names):
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


def test_exception_inside_manager_block_cleans_up(tmp_path, managed, shm_names):
    with pytest.raises(KeyError), managed(spill_dir=tmp_path) as manager:
        manager.allocate(10, "uint8", "shared", owner="o")
        manager.allocate(10, "uint8", "disk", owner="o")
        raise KeyError("boom")
    assert manager.closed
    assert shm_names(manager.shm_prefix) == [] and list(tmp_path.iterdir()) == []

"""MemoryManager lifetimes that cross a fork or meet a failure: a forked child that closes an inherited
manager leaves the parent's spill arrays (and segments) alone; `close` frees every region even when
one free fails, then raises that error; a spill folder deleted behind the manager's back is logged
and its bytes returned; an allocation whose allocator failed never reaches the tier's or the owner's
peak."""

from __future__ import annotations

import multiprocessing as mp
import shutil

import numpy as np
import pytest
import torch

from graphrl.memory import HostResource, Tier
from graphrl.memory import resources as resources_module


def test_a_forked_child_closing_the_manager_leaves_the_parents_data(tmp_path, managed):
    mm = managed({"disk": "1MiB"}, spill_dir=tmp_path / "spill")
    disk = mm.allocate(5, "int64", "disk", owner="parent")
    disk.write(np.arange(1, 6))
    shm = mm.allocate(5, "int64", "shared", owner="parent")
    shm.write(np.arange(1, 6))
    child = mp.get_context("fork").Process(target=mm.close)
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert disk.path.exists() and disk.numpy().tolist() == [1, 2, 3, 4, 5]
    assert shm.numpy().tolist() == [1, 2, 3, 4, 5]
    mm.close()  # the parent's close frees both and deletes its own array
    assert disk.freed and shm.freed and not disk.path.exists()
    assert mm.usage()["disk"]["used"] == mm.usage()["shared"]["used"] == 0


def test_close_frees_every_region_then_raises_the_first_failure(tmp_path, managed, monkeypatch):
    mm = managed({"disk": "1MiB"}, spill_dir=tmp_path / "spill")
    a = mm.allocate(4, "int64", "disk", owner="a")
    b = mm.allocate(4, "int64", "disk", owner="b")
    host = mm.allocate(4, "int64", "host", owner="c")
    real = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        if path == a.path:
            raise PermissionError(13, "denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(resources_module.shutil, "rmtree", rmtree)
    with pytest.raises(PermissionError, match="denied"):
        mm.close()
    assert a.freed and b.freed and host.freed and not b.path.exists()
    assert all(u["used"] == 0 and u["regions"] == 0 for u in mm.usage().values())
    mm.close()  # idempotent


def test_a_spill_folder_deleted_behind_the_manager_is_logged_and_freed(tmp_path, managed, caplog):
    mm = managed({"disk": "1MiB"}, spill_dir=tmp_path / "spill")
    gone = mm.allocate(4, "int64", "disk", owner="gone")
    shm = mm.allocate(4, "int64", "shared", owner="kept")
    shutil.rmtree(gone.path)
    mm.close()
    assert gone.freed and shm.freed and "was already deleted" in caplog.text
    assert mm.usage()["disk"]["used"] == 0 and mm.usage()["shared"]["used"] == 0


class Exhausted(HostResource):
    """A tier whose memory is gone (a GPU out of memory): every allocation fails."""

    def allocate(self, *args):
        raise MemoryError("simulated out of memory")


def test_a_failed_allocation_never_reaches_the_peaks(managed):
    mm = managed({"pinned": 10**6}, resources={"pinned": Exhausted()})
    r = mm.allocate(1000, "uint8", "pinned", owner="feat", fallback=("host",))
    assert r.tier is Tier.HOST
    assert mm.usage()["pinned"] == {"budget": 10**6, "used": 0, "free": 10**6, "peak": 0, "regions": 0}
    assert mm.stats()["pinned"]["feat"]["peak"] == 0
    assert mm.usage()["host"]["peak"] == 1000 and mm.stats()["host"]["feat"]["peak"] == 1000
    r2 = mm.allocate(500, "uint8", "host", owner="feat")
    r.free()
    assert mm.usage()["host"]["peak"] == 1500 and mm.stats()["host"]["feat"] == {
        "bytes": 500, "peak": 1500, "regions": 1}
    r2.free()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without CUDA")
def test_the_device_tier_on_host_is_announced_only_when_not_asked_for(managed, caplog):
    asked = managed(device="cpu")  # the user put the device tier on host memory: nothing to say
    asked.allocate(4, "float32", "device", owner="a")
    assert "no CUDA device" not in caplog.text
    defaulted = managed()
    for _ in range(2):
        defaulted.allocate(4, "float32", "device", owner="b")
    assert caplog.text.count("no CUDA device: the device tier resolves to host memory") == 1

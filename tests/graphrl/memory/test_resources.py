"""graphrl.memory.resources and cudart: the device and pinned tiers with and without CUDA, and the
cudaHostRegister wiring of the pinned tier."""

from __future__ import annotations

import logging
import mmap

import numpy as np
import pytest
import torch

from graphrl.memory import PinnedResource, Tier, cudart

CUDA = torch.cuda.is_available()


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


@pytest.mark.gpu
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


def test_pinned_cuda_path_registers_exact_page_aligned_memory(monkeypatch, managed):
    """The CUDA wiring of the unpooled pinned tier, with cudaHostRegister replaced by a recorder
    (the pooled tier: tests/graphrl/memory/test_pool.py)."""
    calls = []
    monkeypatch.setattr(cudart, "host_register", lambda ptr, n: calls.append(("register", ptr, n)))
    monkeypatch.setattr(cudart, "host_unregister", lambda ptr: calls.append(("unregister", ptr)))
    manager = managed({"pinned": 1000}, resources={"pinned": PinnedResource(cuda=True)}, pool=False)
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

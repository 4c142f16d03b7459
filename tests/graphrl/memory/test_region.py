"""graphrl.memory.region: zero-copy views on every memory tier, lifetime, use after free."""

from __future__ import annotations

import numpy as np
import pytest
import torch

MEMORY_TIERS = ["device", "pinned", "shared", "host"]


@pytest.mark.parametrize(
    "dtype", [torch.float32, np.float32, np.dtype("float32"), "float32", "torch.float32", "f4"]
)
def test_dtype_spellings_agree(mm, dtype):
    with mm.allocate(3, dtype, owner="o") as r:
        assert r.dtype == torch.float32 and r.nbytes == 12 and r.numpy().dtype == np.float32


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
def test_double_free_and_use_after_free_raise(mm, tier, shm_names):
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


def test_context_manager_frees_even_after_explicit_free(mm, shm_names):
    with mm.allocate(8, "uint8", "pinned", owner="o") as r:
        assert mm.usage()["pinned"]["used"] == 8
    assert r.freed and mm.usage()["pinned"]["used"] == 0
    with mm.allocate(8, "uint8", owner="o") as r2:
        r2.free()  # leaving the block does not free twice
    with pytest.raises(RuntimeError), mm.allocate(8, "uint8", "shared", owner="o") as r3:
        raise RuntimeError("boom")
    assert r3.freed and shm_names(mm.shm_prefix) == []


def test_bfloat16_on_memory_tiers(mm):
    for tier in ("host", "shared"):
        with mm.allocate((2, 3), "bfloat16", tier, owner="o") as r:
            r.tensor().fill_(1.5)
            assert r.nbytes == 12 and float(r.tensor().float().sum()) == 9.0
            with pytest.raises(TypeError):
                r.numpy()

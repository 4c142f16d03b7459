"""graphrl.memory disk tier: zarr round trips, partial writes, fallback to disk and close."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrl.memory import Tier


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("bool", (7, 3)), ("float16", (5,)), ("int64", (4, 2, 3)), ("float32", ()), ("uint8", (0, 4)),
     ("complex64", (3,)), (torch.int32, (1000, 17))],
)
def test_disk_round_trip_gives_the_same_bytes(tmp_path, dtype, shape, managed):
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


def test_disk_partial_writes_fallback_and_close(tmp_path, managed):
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

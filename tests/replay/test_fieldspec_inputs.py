"""`FieldSpec` built directly (the issue's ``FieldSpec(..., codec="zstd")``) takes a dtype and a shape as
`TrajectorySpec` takes them, keeps them normalised (numpy dtype, tuple of ints), and a `TrajectorySpec`
refuses a `FieldSpec` filed under another name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from replay import FieldSpec, ReplayStore, TrajectorySpec


@pytest.mark.parametrize("dtype", ["uint8", np.uint8, np.dtype("uint8"), torch.uint8, "torch.uint8"])
def test_fieldspec_normalises_its_dtype(dtype):
    f = FieldSpec("obs", (3, 4, 4), dtype, codec="zstd")
    assert f.dtype == np.dtype("uint8") and isinstance(f.dtype, np.dtype)
    assert f.row_bytes == 48 and f.torch_dtype == torch.uint8
    assert f == FieldSpec("obs", (3, 4, 4), np.dtype("uint8"), codec="zstd")
    assert hash(f) == hash(FieldSpec("obs", (3, 4, 4), np.dtype("uint8"), codec="zstd"))


@pytest.mark.parametrize(("shape", "want"), [(4, (4,)), ([2, 3], (2, 3)), (np.int64(5), (5,)),
                                             (torch.Size([2, 2]), (2, 2)), ((), ())])
def test_fieldspec_normalises_its_shape(shape, want):
    f = FieldSpec("obs", shape, "float32")
    assert f.shape == want and all(type(d) is int for d in f.shape)
    hash(TrajectorySpec({"obs": f}))


def test_fieldspec_bad_shape_and_dtype_name_the_field():
    with pytest.raises(TypeError, match=r"field 'obs': shape must be a tuple of ints, got 2.5"):
        FieldSpec("obs", 2.5, "uint8")
    with pytest.raises(TypeError, match=r"field 'obs': shape must be a tuple of ints"):
        FieldSpec("obs", (2, True), "uint8")
    with pytest.raises(ValueError, match=r"field 'obs': shape \(2, -1\) has a negative size"):
        FieldSpec("obs", (2, -1), "uint8")
    with pytest.raises(TypeError, match=r"field 'obs': unknown dtype 'uint9'"):
        FieldSpec("obs", (2,), "uint9")
    for bf16 in (torch.bfloat16, "bfloat16", "torch.bfloat16"):  # no numpy view, whichever way named
        with pytest.raises(TypeError, match=r"field .obs.: dtype torch.bfloat16 is not supported \(it has"):
            FieldSpec("obs", (2,), bf16)
    with pytest.raises(TypeError, match=r"field 'obs': dtype must be given"):  # not numpy's float64
        FieldSpec("obs", (2,), None)
    with pytest.raises(TypeError, match=r"field 'obs': dtype '>i4' \(>i4\) is not supported: .*native order"):
        FieldSpec("obs", (2,), ">i4")


def test_a_fieldspec_under_another_name_is_refused():
    with pytest.raises(ValueError, match=r"field 'obs': its FieldSpec is named 'frame'"):
        TrajectorySpec({"obs": FieldSpec("frame", (2,), "uint8", codec="lz4")})


def test_a_store_of_a_directly_built_codec_field_round_trips_frames():
    spec = TrajectorySpec({"obs": FieldSpec("obs", (1, 8, 8), "uint8", codec="zstd", chunk=4),
                           "t": FieldSpec("t", (), "int64")})
    store = ReplayStore(spec, capacity_steps=32, seed=0)
    try:
        frames = np.arange(20, dtype=np.uint8)[:, None, None, None].repeat(64, 1).reshape(20, 1, 8, 8)
        with store.writer() as w:
            w.extend({"obs": frames, "t": np.arange(20)})
            w.end_episode()
        with store.sample(16, 3) as batch:
            real = batch.mask
            assert torch.equal(batch["obs"][..., 0, 0, 0][real].long(), batch["t"][real])
    finally:
        store.close()

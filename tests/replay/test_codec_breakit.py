"""Compressed fields under a demanding user's edge cases (issue 29): settings that could never store a
step are refused when the store is made, naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replay import TrajectorySpec
from replay.spec import FieldSpec


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
@pytest.mark.parametrize("shape", [(0,), (2, 0, 3)])
def test_a_codec_on_a_zero_size_field_is_refused_naming_it(codec, shape):
    # its chunks are codec headers only (5 or 9 bytes) and the arena is sized from zero raw bytes:
    # every commit used to raise MemoryBudgetError saying "lower arena_ratio", which could not help
    with pytest.raises(ValueError, match=r"field 'x': codec .*zero size"):
        TrajectorySpec({"x": (shape, "uint8", codec, 0.001), "r": ((), "float32")})
    with pytest.raises(ValueError, match="field 'x'"):
        FieldSpec("x", shape, np.dtype("float32"), codec)



@pytest.mark.parametrize("ratio", [np.float32(2.0), np.int64(2), np.float64(2.0), 2])
def test_a_numpy_arena_ratio_is_a_number(ratio):
    # np.float32(2.0) was refused as "arena_ratio must be a positive number, got np.float32(2.0)"
    spec = TrajectorySpec({"x": ((2,), "uint8", "lz4", ratio)})
    assert spec["x"].arena_ratio == 2.0
    assert json.dumps(spec.to_config()) == '{"x": [[2], "uint8", "lz4", 2.0]}'
    assert TrajectorySpec.from_config(json.loads(json.dumps(spec.to_config()))) == spec


@pytest.mark.parametrize("ratio", [np.bool_(True), True, np.float32("nan"), np.float64(-1.0), "2"])
def test_a_bad_arena_ratio_is_refused(ratio):
    with pytest.raises(ValueError, match="field 'x': arena_ratio must be a positive number"):
        TrajectorySpec({"x": ((2,), "uint8", "lz4", ratio)})

"""Compressed fields under a demanding user's edge cases (issue 29): settings that could never store a
step are refused when the store is made, naming the field."""

from __future__ import annotations

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


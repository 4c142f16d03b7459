"""TrajectorySpec: field parsing and strict step validation that names the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from replay.spec import TrajectorySpec

SPEC = {
    "obs": ((4,), "float32"),
    "action": ((), "int64"),
    "reward": ((), np.float32),
    "done": ((), torch.bool),
}


def good_step():
    return {"obs": np.ones(4, np.float32), "action": np.int64(2), "reward": 1.5, "done": False}


def test_fields_shapes_dtypes_and_bytes():
    spec = TrajectorySpec(SPEC)
    assert list(spec) == ["obs", "action", "reward", "done"]
    assert spec["obs"].shape == (4,) and spec["obs"].dtype == np.float32
    assert spec["done"].dtype == np.bool_ and spec["done"].torch_dtype == torch.bool
    assert spec.step_bytes == 16 + 8 + 4 + 1
    assert TrajectorySpec.from_config(spec.to_config()) == spec
    assert TrajectorySpec({"x": (3, "uint8")})["x"].shape == (3,)


@pytest.mark.parametrize(
    ("fields", "exc", "text"),
    [
        ({}, ValueError, "at least one"),
        ({"mask": ((), "bool")}, ValueError, "reserved"),
        ({"bad name": ((), "bool")}, ValueError, "identifiers"),
        ({"x": ((-1,), "float32")}, ValueError, "negative"),
        ({"x": ((2,), "bfloat16")}, TypeError, "x"),
        ({"x": ((2,), "nonsense")}, TypeError, "x"),
        ({"x": "float32"}, TypeError, "(shape, dtype)"),
        ({"x": ((2.0,), "float32")}, TypeError, "tuple of ints"),
    ],
)
def test_bad_specs(fields, exc, text):
    with pytest.raises(exc, match=text.replace("(", r"\(").replace(")", r"\)")):
        TrajectorySpec(fields)


def test_valid_step_converts_scalars_and_tensors():
    spec = TrajectorySpec(SPEC)
    out = spec.validate_step({**good_step(), "obs": torch.zeros(4), "action": 3})
    assert out["reward"].dtype == np.float32 and out["reward"].shape == ()
    assert out["action"].dtype == np.int64 and int(out["action"]) == 3
    assert out["obs"].dtype == np.float32 and out["done"].dtype == np.bool_


@pytest.mark.parametrize(
    ("change", "exc", "field"),
    [
        ({"obs": np.ones(5, np.float32)}, ValueError, "obs"),  # wrong shape
        ({"obs": np.ones((1, 4), np.float32)}, ValueError, "obs"),  # no broadcasting
        ({"obs": np.ones(4, np.float64)}, TypeError, "obs"),  # wrong dtype
        ({"obs": torch.ones(4, dtype=torch.float16)}, TypeError, "obs"),
        ({"action": np.int32(1)}, TypeError, "action"),
        ({"action": 1.5}, TypeError, "action"),  # float for an int field
        ({"done": 1}, TypeError, "done"),  # int for a bool field
        ({"reward": "1"}, TypeError, "reward"),
        ({"obs": [0.0, 1.0, 2.0, 3.0]}, TypeError, "obs"),  # lists are not accepted (dtype ambiguous)
    ],
)
def test_bad_values_name_the_field(change, exc, field):
    spec = TrajectorySpec(SPEC)
    with pytest.raises(exc, match=f"field '{field}'"):
        spec.validate_step({**good_step(), **change})


def test_int_range_is_checked():
    spec = TrajectorySpec({"a": ((), "uint8")})
    with pytest.raises(ValueError, match="out of range"):
        spec.validate_step({"a": 256})
    assert int(spec.validate_step({"a": 255})["a"]) == 255


def test_missing_and_unknown_fields_are_named():
    spec = TrajectorySpec(SPEC)
    step = good_step()
    del step["reward"]
    with pytest.raises(ValueError, match=r"missing field\(s\) \['reward'\]"):
        spec.validate_step(step)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['rewrd'\]"):
        spec.validate_step({**good_step(), "rewrd": 1.0})
    with pytest.raises(TypeError, match="mapping"):
        spec.validate_step([1, 2])


def test_validate_steps_checks_the_time_axis():
    spec = TrajectorySpec(SPEC)
    cols = {
        "obs": np.zeros((5, 4), np.float32),
        "action": np.zeros(5, np.int64),
        "reward": np.zeros(5, np.float32),
        "done": np.zeros(5, bool),
    }
    t, out = spec.validate_steps(cols)
    assert t == 5 and out["obs"].shape == (5, 4)
    with pytest.raises(ValueError, match="same number of steps"):
        spec.validate_steps({**cols, "action": np.zeros(4, np.int64)})
    with pytest.raises(ValueError, match="field 'obs'"):
        spec.validate_steps({**cols, "obs": np.zeros((5, 3), np.float32)})
    with pytest.raises(TypeError, match="field 'reward'"):
        spec.validate_steps({**cols, "reward": np.zeros(5, np.float64)})
    with pytest.raises(TypeError, match="leading time axis"):
        spec.validate_steps({**cols, "reward": 1.0})


def test_codec_fields_parse_round_trip_and_name_bad_values():
    from replay.spec import FieldSpec

    spec = TrajectorySpec(
        {"obs": ((2, 3), "uint8", "lz4"), "b": FieldSpec("b", (4,), np.dtype("uint8"), "zstd", 2.0),
         "r": ((), "float32")}
    )
    assert spec["obs"].codec == "lz4" and spec["obs"].arena_ratio == 4.0
    assert spec["b"].codec == "zstd" and spec["b"].arena_ratio == 2.0 and spec["r"].codec is None
    assert spec.codec_fields == ("obs", "b")
    assert TrajectorySpec.from_config(spec.to_config()) == spec
    assert spec != TrajectorySpec({"obs": ((2, 3), "uint8"), "b": ((4,), "uint8"), "r": ((), "float32")})
    with pytest.raises(ValueError, match="'obs': codec must be None, 'lz4', 'zstd' or 'lz4dict', got 'gzip'"):
        TrajectorySpec({"obs": ((2,), "uint8", "gzip")})
    with pytest.raises(ValueError, match="field 'x': arena_ratio must be a positive number, got 0"):
        FieldSpec("x", (2,), np.dtype("uint8"), "lz4", 0)

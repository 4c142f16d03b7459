"""Compressed fields under a demanding user's edge cases (issue 29): settings that could never store a
step are refused when the store is made, naming the field; a commit a codec field's arena refuses
loses nothing stored, and its steps never join another episode."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from graphrl.memory import MemoryBudgetError
from replay import ReplayStore, TrajectorySpec
from replay.spec import FieldSpec


@pytest.mark.parametrize("codec", ["lz4", "zstd", "lz4dict"])
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


def _episodes(store) -> list[list[int]]:
    return [e.data["sid"].tolist() for e in store.episodes()]


def _noise(n: int) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 256, (n, 16, 16), dtype=np.uint8)


def test_a_commit_the_arena_refuses_is_not_merged_into_the_next_episode():
    # 16x16 frames in an arena of 64 * 256 / 8 = 2048 bytes; 3 noise frames (~790 bytes) do not fit
    # beside 12 half-noise ones (~1600 bytes). Staged steps (torch columns) used to stay staged after the
    # MemoryBudgetError and were committed with the user's next episode as one: windows crossed them.
    spec = TrajectorySpec({"sid": ((), "int64"), "x": ((16, 16), "uint8", "lz4", 8.0)})
    store = ReplayStore(spec, 64, timeout=1.0)
    try:
        a, b = store.writer(), store.writer()
        half = np.zeros((12, 16, 16), np.uint8)
        half[:, :8] = _noise(12)[:, :8]
        a.add_episode({"sid": np.arange(100, 112), "x": half})
        with pytest.raises(MemoryBudgetError, match="field 'x'.*arena_ratio"):
            a.add_episode({"sid": torch.arange(3), "x": torch.from_numpy(_noise(3))})
        assert a.pending == 0 and _episodes(store) == [list(range(100, 112))]  # nothing stored is lost
        b.add_episode({"sid": np.arange(200, 264), "x": np.zeros((64, 16, 16), np.uint8)})  # frees the arena
        a.add_episode({"sid": np.arange(3, 5), "x": np.zeros((2, 16, 16), np.uint8)})
        assert _episodes(store)[-1] == [3, 4]
    finally:
        store.close()


@pytest.mark.parametrize("columns", ["numpy", "append"])
def test_a_refused_commit_ends_the_open_episode_at_its_last_committed_step(columns):
    # steps 0..2 flushed (the episode open), the rest refused: the next episode used to continue the
    # record of 0..2 (numpy add_episode), joined across the dropped steps
    spec = TrajectorySpec({"sid": ((), "int64"), "x": ((16, 16), "uint8", "zstd", 8.0)})
    store = ReplayStore(spec, 64, timeout=1.0)
    try:
        w = store.writer()
        w.extend({"sid": np.arange(3), "x": np.zeros((3, 16, 16), np.uint8)})
        w.flush()
        with pytest.raises(MemoryBudgetError):
            if columns == "numpy":
                w.add_episode({"sid": np.arange(3, 12), "x": _noise(9)})
            else:
                for t, frame in enumerate(_noise(9)):
                    w.append({"sid": np.int64(3 + t), "x": frame})
                w.end_episode()
        assert w.pending == 0
        w.add_episode({"sid": np.arange(20, 22), "x": np.zeros((2, 16, 16), np.uint8)})
        eps = store.episodes()
        assert [e.data["sid"].tolist() for e in eps] == [[0, 1, 2], [20, 21]]
        assert not eps[0].open
    finally:
        store.close()

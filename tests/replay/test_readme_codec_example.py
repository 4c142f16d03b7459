"""The README's compressed-frames example runs as written on frames that compress poorly: it chose the default
``arena_ratio=4``, so busy frames (about 1.0x to 2x with LZ4) filled the arena after a quarter of the ring and
the writer raised ``MemoryBudgetError`` mid-training; it now sets ``arena_ratio`` from a measurement of sample
frames and wraps its ring many times. The default ratio still fails on such frames, with the error naming
``arena_ratio`` (the README says so)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from graphrl.memory import MemoryBudgetError
from replay import FieldSpec, ReplayStore, TrajectorySpec

README = Path(__file__).resolve().parents[2] / "README.md"
CAPACITY = 512  # the example's 100_000 steps, scaled down for a unit test


def codec_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    hits = [b for b in blocks if 'codec="lz4"' in b and "arena_ratio" in b]
    assert len(hits) == 1, "the README's compressed-frames example (codec='lz4', with arena_ratio) is gone"
    return hits[0]


def busy_frames(rng: np.random.Generator, n: int, noise: float) -> np.ndarray:
    """``n`` 84x84 frames: one background with a fraction ``noise`` of pixels random in each frame."""
    f = np.repeat(rng.integers(0, 256, (1, 84, 84), dtype=np.uint8), n, 0)
    hit = rng.random(f.shape) < noise
    f[hit] = rng.integers(0, 256, int(hit.sum()), dtype=np.uint8)
    return f


@pytest.mark.parametrize("noise", [0.35, 0.05])
def test_the_readme_codec_example_wraps_its_ring_on_frames_that_compress_poorly(noise):
    rng = np.random.default_rng(0)
    frames = busy_frames(rng, 100, noise)
    made = []

    def small_store(spec, capacity_steps, **kwargs):
        assert capacity_steps == 100_000
        made.append(ReplayStore(spec, capacity_steps=CAPACITY, **kwargs))
        return made[0]

    scope = {
        "sample_frames": busy_frames(rng, 400, noise),
        "frames": frames, "actions": np.zeros(100, np.int64), "rewards": np.zeros(100, np.float32),
        "dones": np.arange(100) == 99, "last_frame": busy_frames(rng, 1, noise)[0],
    }
    code = codec_example().replace("ReplayStore(spec", "small_store(spec")
    scope["small_store"] = small_store
    exec(compile(code, str(README), "exec"), scope)  # one namespace: module-level code, as in a script
    store = made[0]
    try:
        assert scope["obs"].shape == (32, 4, 84, 84)
        valid = scope["valid"]
        (ep,) = store.episodes()  # the final frame stored after the 100 steps: the terminal transition
        assert ep.length == 101 and (ep.data["obs"][100] == scope["last_frame"]).all()
        assert scope["done"].dtype == torch.bool and valid.dtype == torch.bool
        with store.writer() as w:
            for _ in range(4 * CAPACITY // 100):  # four ring wraps of busy frames: no MemoryBudgetError
                w.add_episode({"obs": busy_frames(rng, 100, noise), "action": np.zeros(100, np.int64),
                               "reward": np.zeros(100, np.float32), "done": np.arange(100) == 99})
        assert len(store) == CAPACITY
    finally:
        store.close()


def test_the_default_arena_ratio_fails_on_such_frames_at_a_commit_naming_it():
    rng = np.random.default_rng(1)
    spec = TrajectorySpec({"obs": FieldSpec("obs", (84, 84), "uint8", codec="lz4", chunk=4),
                           "action": ((), "int64")})
    with ReplayStore(spec, capacity_steps=CAPACITY, seed=0) as store, store.writer() as w:
        with pytest.raises(MemoryBudgetError, match="field 'obs'.*arena_ratio \\(now 4"):
            for _ in range(CAPACITY // 50):
                w.add_episode({"obs": busy_frames(rng, 50, 0.35), "action": np.zeros(50, np.int64)})
        assert len(store) < CAPACITY // 2

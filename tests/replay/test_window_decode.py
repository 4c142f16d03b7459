"""Long windows of an "lz4dict" frame field (`replay.chunk_decode`'s window decode): on frames with moving
sprites, windows of 16 and 64 steps across chunk boundaries, episode ends and wrap-around give exactly the
raw store's batches, batch after batch in reused staging slots (every byte of a decoded row is written,
whatever the slot held), whether the chunks were written by the aligned parse or by LZ4 HC."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import replay.chunk_encode
from graphrl.memory import MemoryManager
from replay import ReplayStore, TrajectorySpec
from replay.aligned_lz4 import ALIGNED


def spec(codec: str | None) -> TrajectorySpec:
    frame = ((48, 40), "uint8") if codec is None else ((48, 40), "uint8", codec, 2.0, 8)
    return TrajectorySpec({"obs": frame, "pos": ((), "int64")})


def frames(n: int, seed: int) -> np.ndarray:
    """uint8 [n, 48, 40]: a fixed noisy background, three 4x4 sprites moving a pixel a step, a counter."""
    rng = np.random.default_rng(seed)
    out = np.repeat(rng.integers(0, 200, (1, 48, 40), dtype=np.uint8), n, axis=0)
    t = np.arange(n)
    for s in range(3):
        y, x = (5 + 13 * s + t // 3) % 44, (2 + 7 * s + t) % 36
        for dy in range(4):
            for dx in range(4):
                out[t, y + dy, x + dx] = 255 - 40 * s
    out[:, 0, :4] = np.stack([t % 256, t // 256 % 256, 7 * t % 256, 0 * t], axis=1)
    return out


@pytest.mark.parametrize("level", [ALIGNED, 6])
def test_long_windows_give_the_raw_stores_batches(monkeypatch, level):
    monkeypatch.setattr(replay.chunk_encode, "LZ4DICT_LEVEL", level)
    data = frames(700, level + 2)
    with MemoryManager() as mm:
        raw, packed = (ReplayStore(spec(c), 256, 1, memory=mm, seed=5, tier="host", timeout=2.0,
                                   staging_slots=2) for c in (None, "lz4dict"))
        at = 0
        for n in (90, 37, 200, 61, 150, 162):  # past wrap-around; the last episode stays open
            for store in (raw, packed):
                with store.writer(chunk_steps=50) as w:
                    w.extend({"obs": data[at : at + n], "pos": np.arange(at, at + n)})
                    if n != 162:
                        w.end_episode()
            at += n
        for b, length, pad in [(8, 64, "tail"), (16, 16, "head"), (8, 64, "head"), (32, 16, "tail"),
                               (4, 64, "tail"), (16, 16, "tail")]:
            one, two = raw.sample(b, length, pad), packed.sample(b, length, pad)
            assert torch.equal(one.keys, two.keys) and torch.equal(one.mask, two.mask)
            assert torch.equal(one["pos"], two["pos"]) and torch.equal(one["obs"], two["obs"])
            m = two.mask
            assert torch.equal(two["obs"][m], torch.from_numpy(data[two["pos"][m].numpy()]))
            assert (two["obs"][~m] == 0).all()
            one.release()
            two.release()
        raw.close()
        packed.close()

"""The Ray store follows the local store's rules from their one home, not from copies of them.

Ray-sampled windows, wrapped ones included, are the local store's CPU ring gather of the same windows
byte for byte (`replay.windows`: padding zeroed over stale bytes, masks).
"""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import ReplayStore, TrajectorySpec  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402
from replay.keys import decode_keys  # noqa: E402
from replay.windows import gather_fields  # noqa: E402

SPEC = TrajectorySpec({"id": ((), "int64"), "img": ((4, 300), "uint8"), "r": ((), "float32")})


def steps(first: int, n: int) -> dict[str, np.ndarray]:
    """n steps whose every field is a function of the step's id (first, first+1, ...)."""
    ids = np.arange(first, first + n, dtype=np.int64)
    img = (ids[:, None, None] * 7 + np.arange(1200).reshape(4, 300)) % 251
    return {"id": ids, "img": img.astype(np.uint8), "r": (ids * 0.5).astype(np.float32)}


def write(store, lengths) -> None:
    """The same episodes, in order, into ``store`` (one writer: one shard's positions are the local ones)."""
    with store.writer(chunk_steps=16) as w:
        first = 0
        for n in lengths:
            w.extend(steps(first, n))
            w.end_episode()
            first += n


def local_windows(local: ReplayStore, keys: np.ndarray, n: np.ndarray, length: int, pad: str) -> dict:
    """The local store's ring gather (`replay.windows.gather_fields`) of the windows ``keys`` name, into
    outputs full of stale bytes (0xAB)."""
    _, anchor, back = decode_keys(keys)
    first = anchor - back
    rings = local.rings(0)
    capacity = len(rings["id"])
    dst = np.zeros_like(n) if pad == "tail" else length - n
    outs = {name: np.full((len(keys), length, *f.shape), 0xAB, f.dtype) for name, f in SPEC.items()}
    mask = np.ones((len(keys), length), bool)
    gather_fields(
        tuple(rings[name].reshape(-1).view(np.uint8) for name in SPEC),
        tuple(outs[name].reshape(-1).view(np.uint8) for name in SPEC),
        np.array([f.row_bytes for f in SPEC.values()], np.int64),
        capacity,
        first % capacity,
        n,
        dst,
        np.arange(len(keys), dtype=np.int64),
        length,
        mask.reshape(-1),
    )
    outs["mask"] = mask
    return outs


def test_ray_windows_that_wrap_the_ring_are_the_local_gather_of_the_same_keys(cluster):
    # one shard of 100 steps, 163 written: the ring has wrapped (an episode straddles its end) and the
    # oldest live episode lost its head; the local store holds the same steps at the same positions
    lengths = (13, 40, 7, 25, 31, 18, 29)
    with RayReplayStore(SPEC, 100, num_shards=1, seed=11) as store, ReplayStore(
        SPEC, 100, num_shards=1, tier="host"
    ) as local:
        write(store, lengths)
        write(local, lengths)
        wrapped = padded = 0
        for pad, b_size in (("tail", 64), ("head", 64), ("tail", 480), ("head", 8)):  # 480: streamed
            with store.sample(b_size, window=16, pad=pad) as b:
                keys, n = b.keys.numpy(), b.lengths.numpy()
                want = local_windows(local, keys, n, 16, pad)
                for name in SPEC:
                    assert b[name].numpy().tobytes() == want[name].tobytes(), (name, pad)
                assert np.array_equal(b.mask.numpy(), want["mask"])
                _, anchor, back = decode_keys(keys)
                wrapped += int(((anchor - back) % 100 + n > 100).sum())
                padded += int((n < 16).sum())
        assert wrapped > 0 and padded > 0

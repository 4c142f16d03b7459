"""RayReplayStore with a compressed field: the shard stores it as compressed chunks (compressed at insert),
decompresses the drawn windows' runs before the put, and the client's batches equal a reference gather
byte for byte, in the shard's code run here and through a shard actor."""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import MinSize, TrajectorySpec, Uniform  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402
from replay.distributed.shard import ShardActor  # noqa: E402
from replay.distributed.transport import place  # noqa: E402

CODEC = TrajectorySpec(
    {"id": ((), "int64"), "img": ((3, 8, 8), "uint8", "lz4", 1.0, 2), "r": ((), "float32")}
)


def steps(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)
    img = np.zeros((n, 3, 8, 8), np.uint8)
    img[:, 0, 0, 0] = ids % 251
    img[:, 1] = 9
    return {"id": ids, "img": img, "r": (ids * 0.5).astype(np.float32)}


def check(lengths, fields: dict[str, np.ndarray], mask: np.ndarray) -> None:
    """Each window's real steps are consecutive ids' steps, whole, the padding zero (tail padding)."""
    for b, n in enumerate(np.asarray(lengths).tolist()):
        want = steps(int(fields["id"][b, 0]), n)
        assert mask[b, :n].all() and not mask[b, n:].any()
        for name in CODEC:
            assert (fields[name][b, :n] == want[name]).all(), name
            assert (fields[name][b, n:] == 0).all(), name


def test_a_shard_decompresses_its_runs_before_the_put(cluster):
    config = {
        "spec": CODEC.to_config(), "capacity": 40, "num_shards": 1, "selector": Uniform().to_config(),
        "rate_limiter": MinSize(1).to_config(), "max_times_sampled": 0, "chunk_steps": 40, "tier": "host",
        "timeout": 10.0, "staging_slots": 1, "seed": 5,
    }
    shard = ShardActor(0, config, None)
    try:
        for key, (first, n) in enumerate(((0, 23), (23, 30))):  # wrapped: floor 13
            shard.insert(key, steps(first, n), True, 10.0)
        assert shard.store.storage.shards[0].chunks["img"].chunk == 2
        rep = shard.sample(32, 6, "tail", 10.0, None)
        out = {n: np.full((32, 6, *f.shape), 0xAB, f.dtype) for n, f in CODEC.items()}
        mask = np.zeros((32, 6), bool)
        flat = tuple(out[n].reshape(-1).view(np.uint8) for n in CODEC)
        row_bytes = np.array([f.row_bytes for f in CODEC.values()], np.int64)
        place(rep, [ray.get(p[0]) for p in rep["parts"]], flat, mask, row_bytes, 0, 6, False)
        check(rep["n"], out, mask)
    finally:
        shard.close()


def test_a_ray_store_with_a_compressed_field_samples_exact_batches(cluster):
    with RayReplayStore(CODEC, 64, num_shards=1, seed=3) as store:
        with store.writer(chunk_steps=8) as w:
            first = 0
            for n in (9, 30, 17, 21):  # 77 steps in 64: wrapped
                w.extend(steps(first, n))
                w.end_episode()
                first += n
        for window in (1, 5):
            with store.sample(24, window=window) as b:
                fields = {n: b[n].numpy() for n in CODEC}
                check(b.lengths.numpy(), fields, b.mask.numpy())
                assert (b.lengths.numpy() > 1).any() or window == 1

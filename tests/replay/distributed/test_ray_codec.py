"""RayReplayStore with compressed fields: the shard stores them as compressed chunks (compressed at insert)
and puts the chunks the drawn windows read, compressed; the client decompresses them into its batch, which
equals a reference gather byte for byte (lz4 and zstd, chunks of several steps, the open chunk's raw
rows, wrapped rings), in the shard's code run here and through a shard actor. A full arena's error names the
store, the field and the remedy first, locally and from a shard."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from graphrl.memory import MemoryBudgetError  # noqa: E402
from replay import MinSize, ReplayStore, TrajectorySpec, Uniform  # noqa: E402
from replay.chunk_codec import arena_size  # noqa: E402
from replay.chunk_decode import free_zstd_context, new_zstd_context  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402
from replay.distributed.shard import ShardActor  # noqa: E402
from replay.distributed.transport import place  # noqa: E402

CODEC = TrajectorySpec(
    {"id": ((), "int64"), "img": ((3, 8, 8), "uint8", "lz4", 1.5, 2), "r": ((), "float32"),
     "z": ((6, 8), "int16", "zstd", 1.0, 4)}
)


def steps(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)
    img = np.zeros((n, 3, 8, 8), np.uint8)
    img[:, 0, 0, 0] = ids % 251
    img[:, 1] = 9
    z = np.zeros((n, 6, 8), np.int16)
    z[:, 0, :4] = np.stack([ids % 7, -ids, ids // 3, ids], axis=1)
    return {"id": ids, "img": img, "r": (ids * 0.5).astype(np.float32), "z": z}


def check(lengths, fields: dict[str, np.ndarray], mask: np.ndarray) -> None:
    """Each window's real steps are consecutive ids' steps, whole, the padding zero (tail padding)."""
    for b, n in enumerate(np.asarray(lengths).tolist()):
        want = steps(int(fields["id"][b, 0]), n)
        assert mask[b, :n].all() and not mask[b, n:].any()
        for name in CODEC:
            assert (fields[name][b, :n] == want[name]).all(), name
            assert (fields[name][b, n:] == 0).all(), name


def test_a_shard_ships_compressed_chunks_that_the_client_decompresses(cluster):
    config = {
        "spec": CODEC.to_config(), "capacity": 40, "num_shards": 1, "selector": Uniform().to_config(),
        "rate_limiter": MinSize(1).to_config(), "max_times_sampled": 0, "chunk_steps": 40, "tier": "host",
        "insert_headroom": float("inf"), "insert_counts": (0, 0, 0),
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
        (_, _, _, packs), = rep["parts"]
        assert [pk.field for pk in packs] == [1, 3]
        for pk, name in zip(packs, ("img", "z"), strict=True):  # whole chunks travel compressed
            raw = len(pk.offsets) * shard.store.storage.shards[0].chunks[name].chunk_bytes
            assert 0 < pk.blob_bytes < raw / 2
        dctx = new_zstd_context()
        try:
            place(rep, [ray.get(p[0]) for p in rep["parts"]], flat, mask, row_bytes, 0, 6, False, dctx)
        finally:
            free_zstd_context(dctx)
        check(rep["n"], out, mask)
        assert any(len(pk.copies) for pk in packs)  # the open chunk's rows (53 % 4 steps) were read raw
    finally:
        shard.close()


def lead(field: str, arena: int, ratio: str) -> str:
    """The start of a full arena's error: the store, the field and the remedy (then the manager's)."""
    return (rf"replay store \(replay\.shard0\), field '{field}': a compressed chunk of \d+ bytes does not "
            rf"fit in the arena of {arena} bytes beside \d+ bytes of live chunks; lower the field's "
            rf"arena_ratio \(now {ratio}:")


def test_a_ray_store_with_a_compressed_field_samples_exact_batches_and_names_a_full_arena(cluster):
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
        noise = steps(0, 64)  # incompressible images, stored raw: 32 chunks overflow an arena of 2/3 the rows
        noise["img"] = np.random.default_rng(0).integers(0, 256, (64, 3, 8, 8), dtype=np.uint8)
        w = store.writer(chunk_steps=8)
        with pytest.raises(MemoryBudgetError) as info:  # the shard's error, not Ray's wrapper, first
            w.add_episode(noise)
            w.wait()
        want = "shard 0 of the RayReplayStore: " + lead("img", arena_size(64, 192, 2, 1.5), "1.5")
        assert re.match(want, str(info.value))
        w.close()


def test_a_full_arena_names_the_store_the_field_and_the_remedy_first():
    spec = TrajectorySpec({"id": ((), "int64"), "img": ((64,), "uint8", "lz4", 8.0)})
    noise = {"id": np.arange(40), "img": np.random.default_rng(0).integers(0, 256, (40, 64), dtype=np.uint8)}
    local = ReplayStore(spec, 64, 1)
    with local.writer() as w, pytest.raises(MemoryBudgetError) as info:
        w.add_episode(noise)
    assert re.match(lead("img", 512 + 8, "8"), str(info.value)), str(info.value)  # arena_size: one chunk more
    assert "(memory manager: owner 'replay.shard0' asked for" in str(info.value)
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)  # as Ray ships it
    local.close()

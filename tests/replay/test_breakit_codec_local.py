"""Compressed fields of the local store under a demanding user (issue 29): on random episodes written by
two writers (append, extend + flush, add_episode, episodes left open), a store whose fields have codecs
samples exactly the raw store's batches byte for byte (fields, mask, keys, probabilities, weights,
prioritized with priority updates), before and after a checkpoint and restore; a checkpoint whose
compressed chunk file was altered is refused naming the file; a chunk whose bytes or record changed in
memory before a checkpoint sealed it (each codec) never restores as other rows: the restore is refused
naming the file, the field and the chunk, and the older checkpoint restores intact; incompressible
frames take no more arena bytes than raw ones and sample the raw store's bytes; a checkpoint of the
format before chunk checksums is refused, saying so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, TrajectorySpec
from replay._files import seal, unseal
from replay.checkpoint import INTEGRITY, CheckpointError
from replay.chunk_codec import ChunkRing, arena_size


def spec(codec: str | None, chunk: int | None) -> TrajectorySpec:
    extra = (codec, 0.2, chunk) if codec else ()
    return TrajectorySpec(
        {"obs": ((3, 10), "uint8", *extra), "a": ((), "int32"), "f": ((2,), "float32", *extra)}
    )


def episodes(seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(14):
        n = int(rng.integers(1, 11))
        obs = np.repeat(rng.integers(0, 4, (1, 3, 10)), n, 0).astype(np.uint8)
        obs[:, 0, rng.integers(0, 10)] = rng.integers(0, 256, n)
        out.append({
            "obs": obs, "a": rng.integers(-5, 5, n).astype(np.int32),
            "f": rng.normal(size=(n, 2)).astype(np.float32),
        })
    return out


def fill(store: ReplayStore, eps: list[dict[str, np.ndarray]]) -> None:
    w1, w2 = store.writer(chunk_steps=3), store.writer(chunk_steps=5)
    for i, e in enumerate(eps):
        w = (w1, w2)[i % 2]
        if i % 3 == 0:
            w.add_episode(e)
        elif i % 3 == 1:
            for t in range(len(e["a"])):
                w.append({k: v[t] for k, v in e.items()})
            if i % 4:
                w.end_episode()
        else:
            w.extend(e)
            w.flush()
    w1.close()
    w2.close()


def batches(store: ReplayStore) -> list[list[bytes]]:
    out = []
    for j in range(3):
        for window in (1, 3):
            with store.sample(8, window, pad="tail" if j % 2 else "head") as b:
                out.append([b[n].numpy().tobytes() for n in b] + [
                    t.numpy().tobytes() for t in (b.mask, b.keys, b.probabilities, b.weights, b.lengths)
                ])
                store.update_priorities(b.keys, torch.arange(1, 9, dtype=torch.float64) * (j + 1))
    return out


def test_codec_fields_sample_the_raw_stores_bytes_through_a_checkpoint(tmp_path):
    eps = episodes(2)
    got = {}
    for codec, chunk in ((None, None), ("lz4", 1), ("zstd", 4), ("lz4dict", 8), ("lz4dict", 4)):
        s = ReplayStore(spec(codec, chunk), 48, 2, selector=Prioritized(0.7), seed=3)
        fill(s, eps)
        first = batches(s)
        held = [(e.shard, e.start, e.length, e.open, {k: v.tobytes() for k, v in e.data.items()})
                for e in s.episodes()]
        s.checkpoint(tmp_path / f"{codec}{chunk}")
        s.close()
        s = ReplayStore.restore(tmp_path / f"{codec}{chunk}")
        assert s.spec == spec(codec, chunk)
        got[codec, chunk] = (first, held, batches(s))
        s.close()
    ref = got.pop((None, None))
    for key, (first, held, after) in got.items():
        assert held == ref[1], key
        assert first == ref[0], key
        assert after == ref[2], key


@pytest.mark.parametrize("codec", ["lz4", "zstd", "lz4dict"])
def test_an_altered_compressed_chunk_file_is_refused_naming_it(tmp_path, codec):
    s = ReplayStore(TrajectorySpec({"obs": ((3, 10), "uint8", codec, 0.5, 4), "a": ((), "int32")}), 24, 1)
    with s.writer() as w:
        w.add_episode({"obs": np.tile(np.arange(30, dtype=np.uint8).reshape(1, 3, 10), (18, 1, 1)),
                       "a": np.arange(18, dtype=np.int32)})
    folder = s.checkpoint(tmp_path)
    s.close()
    data = next(p for p in (tmp_path / folder).rglob("*") if p.is_file() and "obs.blob/c" in p.as_posix())
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"shard0/obs\.blob/c/0: altered"):
        ReplayStore.restore(tmp_path)


def test_a_chunk_changed_before_it_was_sealed_never_restores_as_other_rows():
    memory = MemoryManager()
    frames = np.random.default_rng(0).integers(0, 3, (10, 3, 10)).astype(np.uint8)
    ring = ChunkRing.create(memory, "obs", (3, 10), np.uint8, "lz4", capacity=16, chunk=4, arena_bytes=4096)
    ring.write(frames, 0)
    state = ring.state()
    silent = []
    for i in range(0, int(state["chunks"][0, 1]), 4):
        bad = dict(state, blob=state["blob"].copy())
        bad["blob"][i] ^= 0x5A
        other = ChunkRing.create(
            memory, "obs", (3, 10), np.uint8, "lz4", capacity=16, chunk=4, arena_bytes=4096
        )
        try:
            other.load_state(bad)
        except ValueError:
            continue  # detected, naming the field and the chunk
        out = np.empty((4, 3, 10), np.uint8)
        other.read(np.arange(4), out)
        if not np.array_equal(out, frames[:4]):
            silent.append(i)
    assert silent == []


def frames_store(codec: str, ratio: float = 0.5) -> ReplayStore:
    sp = TrajectorySpec({"obs": ((4, 40), "uint8", codec, ratio, 4), "a": ((), "int32")})
    return ReplayStore(sp, 32, 1, seed=4)


def frame_episode(first: int, n: int) -> dict[str, np.ndarray]:
    obs = np.zeros((n, 4, 40), np.uint8)
    obs[:, 0, :] = (np.arange(first, first + n) % 251)[:, None]
    obs[:, 2, 5:9] = 7
    return {"obs": obs, "a": np.arange(first, first + n, dtype=np.int32)}


@pytest.mark.parametrize("codec", ["lz4", "zstd", "lz4dict"])
@pytest.mark.parametrize("fault", ["blob", "length", "checksum", "huge length"])
def test_a_chunk_changed_in_memory_is_refused_at_restore_naming_it(tmp_path, codec, fault):
    s = frames_store(codec)
    with s.writer() as w:
        w.add_episode(frame_episode(0, 22))
    s.checkpoint(tmp_path)
    ring = s.storage.shards[0].chunks["obs"]
    slot = 2 % ring.slots  # chunk 2 (positions 8 .. 11)
    assert ring.table[slot, 0] == 2 and ring.table[slot, 2] < ring.chunk_bytes  # compressed
    with s.storage.shards[0]:
        if fault == "blob":
            ring.arena[ring.table[slot, 1] + ring.table[slot, 2] // 2] ^= 0x10
        elif fault == "huge length":  # the records' running offset plus it overflows int64
            ring.table[slot, 2] = np.iinfo(np.int64).max
        else:
            ring.table[slot, 2 if fault == "length" else 3] += 1
    s.checkpoint(tmp_path)
    s.close()
    with pytest.raises(CheckpointError, match=r"shard0/obs\.blob \(field 'obs'\): chunk 2 \(record 2 of 5\) "
                       r"fails its checksum") as e:
        ReplayStore.restore(tmp_path)
    assert set(e.value.files) == {"shard0/obs.blob", "shard0/obs.chunks"}
    assert e.value.intact.endswith("ckpt-000000")
    s = ReplayStore.restore(e.value.intact)  # nothing stored is lost: the older checkpoint restores whole
    (ep,) = s.episodes()
    assert np.array_equal(ep.data["obs"], frame_episode(0, 22)["obs"])
    with s.sample(8, 3) as b:
        pos = b["a"].numpy()
        real = b.mask.numpy()
        assert np.array_equal(b["obs"].numpy()[real], frame_episode(0, 22)["obs"][pos[real]])
    s.close()


@pytest.mark.parametrize("codec", ["lz4", "zstd", "lz4dict"])
def test_a_chunk_missing_from_the_table_refuses_the_checkpoint(tmp_path, codec):
    s = frames_store(codec)
    with s.writer() as w:
        w.add_episode(frame_episode(0, 22))
    ring = s.storage.shards[0].chunks["obs"]
    ring.table[3 % ring.slots, 0] = 11  # chunk 3's record names another chunk
    with pytest.raises(ValueError, match=r"field 'obs': chunk 3, which holds live positions, is not in"):
        s.checkpoint(tmp_path)
    with pytest.raises(RuntimeError, match="field 'obs': a compressed chunk of shard 0 holding live"):
        for _ in range(30):
            s.sample(8, 4).release()
    s.close()


@pytest.mark.parametrize("codec", ["lz4", "zstd", "lz4dict"])
def test_incompressible_frames_take_no_more_than_their_raw_bytes(codec):
    rng = np.random.default_rng(7)
    eps = [{"obs": rng.integers(0, 256, (n, 4, 40), dtype=np.uint8), "a": np.arange(n, dtype=np.int32)}
           for n in (9, 14, 11, 6)]  # 40 steps in a ring of 32: wrapped
    raw, packed = (ReplayStore(TrajectorySpec({"obs": ((4, 40), "uint8", *extra), "a": ((), "int32")}), 32, 1,
                               seed=4) for extra in ((), (codec, 0.8, 4)))
    for st in (raw, packed):
        with st.writer() as w:
            for e in eps:
                w.add_episode(e)
    ring = packed.storage.shards[0].chunks["obs"]
    with packed.storage.shards[0]:
        state = ring.state()
    row = 4 * 40
    assert state["chunks"][:, 0].tolist() == list(range(2, 10))  # positions 8..39 live: chunks 2..9
    assert (state["chunks"][:, 1] == 4 * row).all()  # every chunk stored raw
    assert ring.arena_bytes == arena_size(32, row, 4, 0.8)  # the raw chunks, room to wrap and one chunk more
    for window in (1, 3):
        with raw.sample(16, window) as a, packed.sample(16, window) as b:
            assert torch.equal(a.keys, b.keys) and torch.equal(a.mask, b.mask)
            assert torch.equal(a["obs"], b["obs"])
    raw.close()
    packed.close()


def test_a_checkpoint_of_the_format_before_chunk_checksums_is_refused_clearly(tmp_path):
    s = frames_store("lz4")
    with s.writer() as w:
        w.add_episode(frame_episode(0, 9))
    folder = Path(s.checkpoint(tmp_path))
    s.close()
    body, _ = unseal(folder / INTEGRITY, str(folder))  # the same checkpoint, as format version 2 sealed it
    body.pop("sha256", None)
    digest = seal(folder / INTEGRITY, {**body, "version": 2})
    (tmp_path / "LATEST").write_text(f"{folder.name} {digest}\n")
    with pytest.raises(CheckpointError, match=r"version 2, expected 'graphrl.replay' version 3 \(an older "
                       "format: its compressed chunks carry no checksums"):
        ReplayStore.restore(tmp_path)


@pytest.mark.parametrize("codec", ["lz4", "zstd", "lz4dict"])
@pytest.mark.parametrize("noise", [False, True])  # True: every chunk stored raw
def test_a_ring_read_of_a_chunk_whose_arena_bytes_changed_raises_naming_it(codec, noise):
    frames = frame_episode(0, 12)["obs"]
    if noise:
        frames = np.random.default_rng(5).integers(0, 256, frames.shape, dtype=np.uint8)
    ring = ChunkRing.create(MemoryManager(), "obs", (4, 40), np.uint8, codec, capacity=16, chunk=4,
                            arena_bytes=8192)
    ring.write(frames, 0)
    out = np.empty((4, 4, 40), np.uint8)
    ring.read(np.arange(4, 8), out)
    assert np.array_equal(out, frames[4:8])
    assert (ring.table[1, 2] == ring.chunk_bytes) == noise
    ring.arena[ring.table[1, 1] + ring.table[1, 2] // 2] ^= 0x01
    ring.read(np.arange(4, 8), out)  # the decoded chunk kept: its bytes are not read again
    ring.read(np.arange(0, 4), out)
    with pytest.raises(ValueError, match=r"field 'obs': chunk 1 fails its checksum"):
        ring.read(np.arange(4, 8), out)

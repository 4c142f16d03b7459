"""The compiled decode of codec fields (`replay.chunk_decode`): a store whose field is compressed gives the
very batches of the same store raw (keys, probabilities, weights, masks, every field; windows, the fused
transition path, priorities), decoding outside the shard lock never shows a step a writer overwrote, a
corrupt live chunk raises naming the field, and the ``chunk`` option is checked."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, TrajectorySpec, Uniform
from replay.spec import FieldSpec


def spec(codec: str | None, chunk: int | None = None) -> TrajectorySpec:
    frame = ((3, 4), "uint8") if codec is None else ((3, 4), "uint8", codec, 0.25, chunk)
    return TrajectorySpec({"pos": ((), "int64"), "obs": frame, "r": ((), "float32")})


def steps(start: int, n: int) -> dict[str, np.ndarray]:
    p = np.arange(start, start + n, dtype=np.int64)
    obs = np.zeros((n, 3, 4), np.uint8)
    obs[:, 0, 0] = p % 251
    obs[:, 2, :] = (p // 251 % 251)[:, None]
    return {"pos": p, "obs": obs, "r": p.astype(np.float32) / 2}


def expected_obs(pos: np.ndarray) -> np.ndarray:
    return steps(0, int(pos.max()) + 1)["obs"][pos] if pos.size else np.zeros((0, 3, 4), np.uint8)


def batches_equal(a, b) -> None:
    for name in ("keys", "probabilities", "weights", "mask", "lengths"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name in ("pos", "obs", "r"):
        assert torch.equal(a[name], b[name]), name


@settings(max_examples=10, deadline=None)
@given(
    codec=st.sampled_from(["lz4", "zstd", "lz4dict"]),
    chunk=st.sampled_from([1, 2, 4]),
    prioritized=st.booleans(),
    shards=st.sampled_from([1, 2]),
    episodes=st.lists(st.integers(1, 13), min_size=1, max_size=8),
    draws=st.lists(
        st.tuples(st.integers(1, 9), st.sampled_from([1, 1, 3, 6]), st.sampled_from(["tail", "head"])),
        min_size=1, max_size=4,
    ),
)
def test_a_compressed_store_gives_the_batches_of_the_raw_store(
    codec, chunk, prioritized, shards, episodes, draws
):
    with MemoryManager() as mm:
        stores = [
            ReplayStore(s, 8 * shards, shards, memory=mm, seed=3, tier="host", timeout=2.0,
                        selector=Prioritized(0.7) if prioritized else Uniform())
            for s in (spec(None), spec(codec, chunk))
        ]
        pos = 0
        for n in episodes:  # past wrap-around, one episode left open
            for store in stores:
                with store.writer(chunk_steps=3) as w:
                    w.extend(steps(pos, n))
                    if n % 4:
                        w.end_episode()
            pos += n
        for b, length, pad in draws:
            raw, packed = (s.sample(b, length, pad) for s in stores)
            batches_equal(raw, packed)
            m = packed.mask
            assert torch.equal(packed["obs"][m], torch.from_numpy(expected_obs(packed["pos"][m].numpy())))
            assert (packed["obs"][~m] == 0).all()
            if prioritized:
                prio = torch.rand(b, generator=torch.Generator().manual_seed(b)) + 0.1
                for s, batch in zip(stores, (raw, packed), strict=True):
                    s.update_priorities(batch.keys, prio)
            raw.release()
            packed.release()
        for s in stores:
            s.close()


def write_until(store: ReplayStore, stop: threading.Event, errors: list[BaseException]) -> None:
    """Episodes of 7 steps from position 8 on until ``stop``; an error goes to ``errors``."""
    try:
        pos = 8
        with store.writer(chunk_steps=5) as w:
            while not stop.is_set():
                w.add_episode(steps(pos, 7))
                pos += 7
    except BaseException as err:  # noqa: BLE001 - reported by the test
        errors.append(err)


def test_decoding_outside_the_lock_never_shows_an_overwritten_step():
    """Writers wrap a small ring while batches are drawn (fused transitions and windows): each real step's
    frame is the one written with its position, in chunks of 1 and 4, and lz4dict chunks of 4."""
    for codec, chunk in (("lz4", 1), ("lz4", 4), ("lz4dict", 4)):
        with MemoryManager() as mm:
            store = ReplayStore(spec(codec, chunk), 32, 1, memory=mm, seed=0, tier="host", timeout=5.0)
            with store.writer() as w:
                w.extend(steps(0, 8))
            stop = threading.Event()
            errors: list[BaseException] = []
            t = threading.Thread(target=write_until, args=(store, stop, errors), daemon=True)
            t.start()
            try:
                for i in range(300):
                    with store.sample(16, 1 if i % 2 else 4) as batch:
                        m = batch.mask
                        got = batch["obs"][m].numpy()
                        assert (got == expected_obs(batch["pos"][m].numpy())).all()
            finally:
                stop.set()
                t.join(30)
            assert not errors, errors
            store.close()


@pytest.mark.parametrize("codec", ["lz4", "lz4dict"])
def test_a_corrupt_live_chunk_raises_naming_the_field(codec):
    # rows that compress (lz4dict too: its 12-byte rows of spec() are stored raw)
    big = TrajectorySpec({"pos": ((), "int64"), "obs": ((3, 32), "uint8", codec, 0.25, 2)})
    with MemoryManager() as mm:
        store = ReplayStore(big, 16, 1, memory=mm, seed=0, tier="host", timeout=2.0)
        with store.writer() as w:
            w.add_episode({"pos": np.arange(10), "obs": np.repeat(steps(0, 10)["obs"], 8, axis=2)})
        ring = store.storage.shards[0].chunks["obs"]
        assert (ring.table[:4, 2] < ring.chunk_bytes).all()  # compressed, not stored raw
        ring.arena[:] = 0xFF  # every complete chunk: an LZ4 block that overruns (lz4dict: bad part ends)
        with pytest.raises(RuntimeError, match=r"field 'obs': a compressed chunk of shard 0 holding live"):
            for _ in range(20):
                store.sample(8, 3).release()
        store.close()


def test_the_chunk_option_is_checked_and_kept_in_the_config():
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(ValueError, match=f"'obs': chunk must be None or a positive int, got {bad!r}"):
            FieldSpec("obs", (2,), np.dtype("uint8"), "lz4", 4.0, bad)
    s = spec("zstd", 3)
    assert s["obs"].chunk == 3 and TrajectorySpec.from_config(s.to_config()) == s
    assert TrajectorySpec.from_config(spec("lz4").to_config())["obs"].chunk is None
    with MemoryManager() as mm:
        share = r"field 'obs': chunk=3 needs each shard's capacity, .* = 16 // 1 = 16, to be a multiple of 3"
        with pytest.raises(ValueError, match=share + r" .* e\.g\. 15 or 18$"):
            ReplayStore(s, 16, 1, memory=mm)
        store = ReplayStore(s, 12, 1, memory=mm)
        assert store.storage.shards[0].chunks["obs"].chunk == 3
        store.close()


@pytest.mark.parametrize("codec,chunk", [("zstd", 4), ("lz4", 2), ("lz4dict", 4)])
def test_a_checkpoint_of_multi_step_chunks_restores_the_same_batches(tmp_path, codec, chunk):
    with MemoryManager() as mm:
        store = ReplayStore(spec(codec, chunk), 24, 2, memory=mm, seed=1, tier="host", timeout=2.0,
                            selector=Prioritized(0.6))
        with store.writer(chunk_steps=5) as w:
            for first, n in ((0, 9), (9, 14), (23, 11), (34, 6)):  # wrapped, one chunk of each shard partial
                w.add_episode(steps(first, n))
        b = store.sample(8, 1)
        store.update_priorities(b.keys, np.arange(1, 9, dtype=np.float64))
        b.release()
        store.checkpoint(tmp_path / "ckpt")
        restored = ReplayStore.restore(tmp_path / "ckpt", memory=mm)
        assert restored.storage.shards[0].chunks["obs"].chunk == chunk
        for length in (1, 4):
            a, r = store.sample(16, length), restored.sample(16, length)
            assert torch.equal(a.mask, r.mask) and torch.equal(a.probabilities, r.probabilities)
            for name in ("pos", "obs", "r"):
                assert torch.equal(a[name], r[name]), name
            m = a.mask
            assert torch.equal(a["obs"][m], torch.from_numpy(expected_obs(a["pos"][m].numpy())))
            a.release()
            r.release()
        restored.close()
        store.close()


def test_rings_names_the_codec_fields():
    with MemoryManager() as mm:
        store = ReplayStore(spec("lz4"), 8, 1, memory=mm)
        with pytest.raises(ValueError, match=r"rings\(\): fields \['obs'\] have a codec and no ring"):
            store.rings(0)
        store.close()

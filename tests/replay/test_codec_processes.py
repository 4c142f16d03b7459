"""A field with a codec across processes: the actor's process compresses at commit, a spawned learner
(``store.learner()``) maps the store and samples windows whose decompressed frames are the ones written."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np

from graphrl.memory import MemoryManager
from replay import ReplayStore, TrajectorySpec

SPEC = TrajectorySpec({"pos": ((), "int64"), "frame": ((8, 8), "uint8", "lz4", 2.0)})


def frames(pos: np.ndarray) -> np.ndarray:
    """Frames that name their position: a constant background, a sprite at pos % 8, a counter byte."""
    out = np.full((len(pos), 8, 8), 17, dtype=np.uint8)
    out[np.arange(len(pos)), pos % 8, pos % 8] = 200
    out[:, 0, 0] = pos % 251
    return out


def learner_process(learner, queue) -> None:  # spawned: sample through the learner, check every step
    checked = 0
    for _ in range(3):
        batch = learner.sample(32, window=6, pad="tail", timeout=10.0)
        mask = batch.mask.numpy()
        pos, got = batch["pos"].numpy(), batch["frame"].numpy()
        for b in range(32):
            real = pos[b][mask[b]]
            assert np.array_equal(got[b][mask[b]], frames(real)), (b, real)
            assert (got[b][~mask[b]] == 0).all()
            assert np.array_equal(real, np.arange(real[0], real[0] + len(real)))
            checked += int(mask[b].sum())
        batch.release()
    learner.close()
    queue.put(checked)


def test_a_spawned_learner_samples_frames_the_actor_compressed():
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, capacity_steps=256, num_shards=2, memory=mm, seed=3, chunk_steps=16)
        with store.writer() as w:
            start = 0
            for n in np.random.default_rng(0).integers(1, 40, 20).tolist():  # wraps the 128-step shards
                pos = np.arange(start, start + n, dtype=np.int64)
                w.add_episode({"pos": pos, "frame": frames(pos)})
                start += n
        assert all(sh.chunks["frame"].next_position > 0 for sh in store.storage.shards)
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        p = ctx.Process(target=learner_process, args=(store.learner(), queue))
        p.start()
        p.join(120)
        assert p.exitcode == 0
        assert queue.get(timeout=5) >= 96
        store.close()

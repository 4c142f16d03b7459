"""A store whose every field has a codec (no raw ring at all): commits (`replay.commit_kernel.write_steps`
with no raw field: its copy skipped untyped), draws, priority updates and a checkpoint round trip, as a store
with a raw field. The break-it repro: ``end_episode`` raised numba's TypingError ``getitem(Tuple(),
int64)``."""

from __future__ import annotations

import numpy as np
import pytest

from replay import Prioritized, ReplayStore, TrajectorySpec
from replay.commit_kernel import write_steps
from replay.keys import decode_keys


def test_write_steps_with_no_raw_field_writes_the_step_index():
    steps = np.full((8, 3), -1, np.int64)
    steps[:, 2] = 0
    steps[5:, 0] = 2  # live items the commit overwrites (positions 5, 6, 7 of the last lap)
    got = write_steps((), (), np.zeros(0, np.int64), 8, 5, 4, steps, 9, 100, 5, 8)
    assert got == 3
    assert steps[[5, 6, 7, 0], 0].tolist() == [9] * 4
    assert steps[[5, 6, 7, 0], 1].tolist() == [100, 101, 102, 103]
    assert steps[1:5, 0].tolist() == [-1] * 4


def _obs(g: np.ndarray) -> np.ndarray:
    return np.repeat((g % 251).astype(np.uint8)[:, None], 4, axis=1)


@pytest.mark.parametrize(("codec", "shards"), [("lz4", 1), ("zstd", 2), ("lz4dict", 1)])
def test_a_store_of_only_codec_fields_commits_samples_updates_and_restores(tmp_path, codec, shards):
    spec = TrajectorySpec({"obs": ((4,), "uint8", codec, 0.5, 2), "g": ((), "int64", codec, 0.5, 2)})
    store = ReplayStore(spec, capacity_steps=32, num_shards=shards, seed=0, selector=Prioritized(1.0))
    try:
        with store.writer() as w:
            for e in range(5):  # 60 steps into 32: the first episodes are overwritten
                g = np.arange(12 * e, 12 * e + 12)
                w.extend({"obs": _obs(g[:5]), "g": g[:5]})
                w.extend({"obs": _obs(g[5:]), "g": g[5:]})
                w.end_episode()
        assert store.stats()["inserts"] == 60
        eps = sorted((ep.data["g"].tolist(), ep.data["obs"]) for ep in store.episodes())
        assert sum(len(g) for g, _ in eps) == len(store) == 32  # capacity_steps: all shards
        for g, obs in eps:  # an episode's live steps (its head may be overwritten), in order
            assert g == list(range(g[-1] - len(g) + 1, g[-1] + 1)) and g[-1] % 12 == 11
            assert (obs == _obs(np.array(g))).all()
        batch = store.sample(64)
        g = batch["g"][:, 0].numpy()
        assert (batch["obs"][:, 0].numpy() == _obs(g)).all()
        assert set(g.tolist()) <= {x for gs, _ in eps for x in gs}
        target = int(g[0])
        assert store.update_priorities(batch.keys[:1], np.array([1e4])) == 1
        counts = np.bincount(store.sample(256)["g"][:, 0].numpy(), minlength=60)
        assert counts.argmax() == target and counts[target] > 200  # 1e4 of < 1e4 + 64 mass
        learner = store.learner()  # windows through `replay.windows.gather_fields` (no raw field to copy)
        try:
            for pad in ("tail", "head"):
                w = learner.sample(32, window=3, pad=pad)
                g, m = w["g"].numpy(), w.mask.numpy()
                assert m.any(axis=1).all() and (w["obs"][..., 0].numpy()[m] == _obs(g[m])[:, 0]).all()
                for row, keep in zip(g, m, strict=True):  # a window's real steps: consecutive, one episode
                    real = row[keep]
                    assert (np.diff(real) == 1).all() and len({int(x) // 12 for x in real}) == 1
                    assert np.count_nonzero(np.diff(keep.astype(np.int8))) <= 1  # padding at one end
        finally:
            learner.close()
        store.checkpoint(tmp_path)
    finally:
        store.close()
    restored = ReplayStore.restore(tmp_path)
    try:
        again = sorted((ep.data["g"].tolist(), ep.data["obs"]) for ep in restored.episodes())
        assert [g for g, _ in again] == [g for g, _ in eps]
        assert all((a == b).all() for (_, a), (_, b) in zip(again, eps, strict=True))
        counts = np.bincount(restored.sample(256)["g"][:, 0].numpy(), minlength=60)
        assert counts.argmax() == target  # the priority came through the checkpoint
        with restored.writer() as w:  # and it commits on
            w.add_episode({"obs": _obs(np.arange(60, 64)), "g": np.arange(60, 64)})
        assert restored.stats()["inserts"] == 64
    finally:
        restored.close()


def _expected_windows(store, keys: np.ndarray, length: int, pad: str) -> tuple[np.ndarray, np.ndarray]:
    """Each key's window by hand from `ReplayStore.episodes`: ``g`` int64 [B, L] (0 at padding) and the
    ring slot of each window's first real step plus its real steps ([B, 2])."""
    shard, anchor, _ = decode_keys(keys)
    steps = {}  # (shard, absolute position) -> (episode, g)
    for i, ep in enumerate(store.episodes()):
        for t, x in enumerate(ep.data["g"].tolist()):
            steps[(ep.shard, ep.start + t)] = (i, x)
    g = np.zeros((len(keys), length), np.int64)
    runs = np.zeros((len(keys), 2), np.int64)
    for b, (s, a) in enumerate(zip(shard.tolist(), anchor.tolist(), strict=True)):
        ep = steps[(s, a)][0]
        step = 1 if pad == "tail" else -1
        real = [a]
        while len(real) < length and steps.get((s, real[-1] + step), (None,))[0] == ep:
            real.append(real[-1] + step)
        real.sort()
        at = 0 if pad == "tail" else length - len(real)
        g[b, at : at + len(real)] = [steps[(s, p)][1] for p in real]
        runs[b] = real[0] % store.storage.capacity, len(real)
    return g, runs


@pytest.mark.parametrize(("codec", "shards"), [("lz4", 1), ("lz4", 2), ("zstd", 1), ("zstd", 2)])
def test_the_owner_samples_exact_windows_of_a_store_of_only_codec_fields(codec, shards):
    """`replay.batch_kernels.BatchCopy` with no raw ring (it raised TypingError ``getitem(Tuple(), int64)``
    with one shard, ``invalid operation on untyped list`` with two): the codec fields decoded into the
    staging slot, the mask filled, every frame and padding exact, windows across the ring's end too,
    and prioritized draws follow `update_priorities`."""
    spec = TrajectorySpec({"obs": ((4,), "uint8", codec, 0.5, 2), "g": ((), "int64", codec, 0.5, 2)})
    store = ReplayStore(spec, capacity_steps=32, num_shards=shards, seed=0, selector=Prioritized(1.0))
    try:
        g0 = 1
        with store.writer() as w:  # 65 steps into 32: the rings wrap, the oldest heads are overwritten
            for n in (5, 12, 3, 9, 12, 2, 11, 7, 4):
                g = np.arange(g0, g0 + n)  # never 0 (padding), obs never 0 below 251
                w.extend({"obs": _obs(g), "g": g})
                w.end_episode()
                g0 += n
        wraps = 0
        for pad in ("tail", "head"):
            for _ in range(2):
                batch = store.sample(128, window=4, pad=pad)
                want, runs = _expected_windows(store, batch.keys.numpy(), 4, pad)
                got, mask = batch["g"].numpy(), batch.mask.numpy()
                assert (got == want).all() and (mask == (want > 0)).all()
                assert (batch["obs"].numpy() == _obs(want.ravel()).reshape(128, 4, 4) * mask[..., None]).all()
                assert (batch.lengths.numpy() == runs[:, 1]).all()
                wraps += int((runs.sum(axis=1) > store.storage.capacity).sum())
            assert not mask.all()  # padding drawn (short episodes, episode ends, overwritten heads)
        assert wraps > 0  # some windows run past the ring's last slot into its first
        assert np.allclose(batch.probabilities.numpy(), 1 / 32)  # 32 live steps, priority 1 each
        hot = batch.keys.numpy()[:1]
        assert store.update_priorities(hot, np.array([31.0])) == 1  # half the mass: 31 of 31 + 31 * 1
        batch = store.sample(256, window=4, pad="tail")
        want, _ = _expected_windows(store, batch.keys.numpy(), 4, "tail")
        assert (batch["g"].numpy() == want).all() and (batch.mask.numpy() == (want > 0)).all()
        s, a, _ = decode_keys(batch.keys.numpy())
        s0, a0, _ = decode_keys(hot)
        drew = (s == s0[0]) & (a == a0[0])
        assert 88 <= drew.sum() <= 168  # binomial(256, 1/2): 128 +- 5 sigma
        prob, weights = batch.probabilities.numpy(), batch.weights.numpy()
        assert np.allclose(prob[drew], 1 / 2) and np.allclose(prob[~drew], 1 / 62)
        assert np.allclose(weights[~drew] / weights[drew][0], 31)  # (N p)^-beta, beta 1
    finally:
        store.close()

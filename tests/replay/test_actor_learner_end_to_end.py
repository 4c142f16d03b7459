"""The replay store's user-facing example (actors -> learner), run end to end at small sizes, values checked.

Actors are spawned processes that attach by handle and write with ``append``, ``extend`` and
``end_episode``; the learner samples tail-padded windows, updates priorities, checkpoints into
``ckpt/`` and restores, and converts a batch with ``to_tensordict``.
"""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, SampleToInsertRatio, TrajectorySpec

ACTORS, EPISODES, MAX_LEN = 2, 30, 90


def lengths(actor: int) -> np.ndarray:
    return np.random.default_rng(100 + actor).integers(1, MAX_LEN + 1, EPISODES)


def columns(actor: int, ep: int, length: int) -> dict[str, np.ndarray]:
    """Steps whose content names them: obs = [actor, episode, t, actor * 10000 + episode * 100 + t]."""
    t = np.arange(length)
    obs = np.stack([np.full(length, actor), np.full(length, ep), t, actor * 10_000 + ep * 100 + t], axis=1)
    return {"obs": obs.astype(np.float32), "action": (t % 2).astype(np.int64),
            "reward": t.astype(np.float32), "done": t == length - 1}


def actor_process(handle, actor: int) -> None:  # spawned: attaches by handle, as the example does
    with ReplayStore.attach(handle).writer() as w:
        for ep, length in enumerate(lengths(actor)):
            cols = columns(actor, ep, int(length))
            if ep % 2 == 0:  # one step at a time, plain Python scalars as a gym loop has them
                for i in range(int(length)):
                    o, a, r, d = cols["obs"][i], int(cols["action"][i]), float(cols["reward"][i]), bool(
                        cols["done"][i])
                    w.append({"obs": o, "action": a, "reward": r, "done": d})
            else:
                w.extend({"obs": cols["obs"], "action": cols["action"], "reward": cols["reward"],
                          "done": cols["done"]})
            if ep < EPISODES - 1:
                w.end_episode()  # the last episode is ended by leaving the with block


def test_actors_write_and_the_learner_samples_checkpoints_and_restores(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "ckpt/" as written lands in the test's folder
    mm = MemoryManager()
    spec = TrajectorySpec({"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
                           "done": ((), "bool")})
    store = ReplayStore(spec, capacity_steps=20_000, num_shards=4, selector=Prioritized(exponent=0.6),
                        rate_limiter=SampleToInsertRatio(samples_per_insert=4.0, min_size=1000,
                                                         error_buffer=100_000),
                        memory=mm)
    restored = None
    try:
        handle = store.handle()  # small and picklable: shard names, spec; no step data
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=actor_process, args=(handle, a)) for a in range(ACTORS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
            assert p.exitcode == 0, f"actor exit code {p.exitcode}"
        total = int(sum(lengths(a).sum() for a in range(ACTORS)))
        assert len(store) == total  # number of live steps stored: nothing lost, nothing doubled

        batch = store.sample(batch_size=256, window=64, pad="tail", timeout=5.0)
        assert batch["obs"].shape == (256, 64, 4)
        assert batch.mask.shape == (256, 64)  # True = a real step, False = padding
        assert batch.keys.shape == (256,) and batch.keys.dtype.is_floating_point is False
        # every anchor had the initial priority (1.0), so each was drawn with probability 1 / N
        np.testing.assert_allclose(batch.probabilities.numpy(), 1.0 / total, rtol=1e-9)
        obs, mask = batch["obs"].numpy(), batch.mask.numpy()
        done, reward = batch["done"].numpy(), batch["reward"].numpy()
        for b in range(256):
            n = int(mask[b].sum())
            assert mask[b, :n].all() and not mask[b, n:].any()  # tail padding: real steps first
            actor, ep, t0 = (int(x) for x in obs[b, 0, :3])
            length = int(lengths(actor)[ep])
            assert n == min(64, length - t0)  # never crosses the episode's end
            want = columns(actor, ep, length)
            np.testing.assert_array_equal(obs[b, :n], want["obs"][t0 : t0 + n])
            np.testing.assert_array_equal(reward[b, :n], want["reward"][t0 : t0 + n])
            np.testing.assert_array_equal(done[b, :n], want["done"][t0 : t0 + n])
            assert not obs[b, n:].any() and not done[b, n:].any()  # padding is zeros

        # one window gets a large priority, the other drawn windows priority 0
        keys = batch.keys.numpy()
        new_priorities = np.zeros(256)
        new_priorities[keys == keys[0]] = 1000.0
        assert store.update_priorities(batch.keys, new_priorities) == 256
        untouched = total - len(np.unique(keys))
        p_hot = 1000.0**0.6 / (1000.0**0.6 + untouched * 1.0)
        batch.release()

        counters = store.counters()
        store.checkpoint("ckpt/")
        restored = ReplayStore.restore("ckpt/", memory=mm)
        assert len(restored) == total
        assert restored.counters() == counters
        for s in (store, restored):  # priorities round-trip: the hot window's probability, by hand
            hot_draws = 0
            for _ in range(8):  # 2048 draws: ~47 hot ones expected (one batch of 256 drew 2 once in CI)
                b2 = s.sample(batch_size=256, window=64, pad="tail", timeout=5.0)
                wid = b2.keys.numpy() & ~np.int64(0xF << 24)  # the window, without the store's incarnation
                hot = wid == keys[0]
                hot_draws += int(hot.sum())
                np.testing.assert_allclose(b2.probabilities.numpy()[hot], p_hot, rtol=1e-6)
                np.testing.assert_allclose(b2.probabilities.numpy()[~hot], (1 - p_hot) / untouched, rtol=1e-6)
                assert not np.isin(wid, keys[keys != keys[0]]).any()  # priority 0: never drawn
                b2.release()
            assert hot_draws > 8 * 256 * p_hot / 2, (hot_draws, p_hot)  # P(fail) ~1e-5 (Poisson(47) <= 23)
            b2.release()

        pytest.importorskip("tensordict")
        batch = restored.sample(batch_size=256, window=64, pad="tail", timeout=5.0)
        td = batch.to_tensordict(layout="batch")  # the per-window layout; the TorchRL one: test_torchrl.py
        assert tuple(td.batch_size) == (256,)
        assert td["obs"].shape == (256, 64, 4) and td["mask"].shape == (256, 64)
        assert (td["obs"] == batch["obs"]).all() and (td["keys"] == batch.keys).all()
        batch.release()
    finally:
        if restored is not None:
            restored.close()
        store.close()
        mm.close()

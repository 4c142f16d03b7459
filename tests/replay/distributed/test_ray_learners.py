"""RayReplayStore.learner(): learners in Ray worker processes, each its own client of the shard actors.

One local cluster for the folder (conftest.py) and one store per test: the union of two learners' draws after
priority updates from both is one table's (chi-square), samples per insert is global (the one sample
counter), and a checkpoint taken while a learner samples holds the counters of that moment.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from scipy import stats

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import Prioritized, SampleToInsertRatio, TrajectorySpec  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402
from replay.keys import decode_keys, encode_keys  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray cluster and a store per test (tens of seconds on 2 cores)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the tasks travel by value

SPEC = TrajectorySpec({"id": ((), "int64"), "obs": ((2,), "float32")})


def episode(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 2, axis=1).astype(np.float32)}


def fill(store, lengths) -> None:
    first = 0
    with store.writer() as w:
        for n in lengths:
            w.extend(episode(first, int(n)))
            w.end_episode()
            first += int(n)


@ray.remote(num_cpus=1)
def update(learner, keys, priorities) -> int:
    return learner.update_priorities(keys, priorities)


@ray.remote(num_cpus=1)
def draw(learner, batches: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    keys, ids = [], []
    for _ in range(batches):
        with learner.sample(size, window=1, timeout=60) as batch:
            keys.append(batch.keys.numpy().copy())
            ids.append(batch["id"][:, 0].numpy().copy())
    return np.concatenate(keys), np.concatenate(ids)


@ray.remote(num_cpus=1)
def sample_until_refused(learner) -> int:
    steps = 0
    while True:
        try:  # the Ray store's draws need a moment: timeout=0 would time the shards out, not the limiter
            batch = learner.sample(8, window=1, timeout=2.0)
        except TimeoutError as exc:
            if "sample waited" not in str(exc):  # the rate limiter's refusal, not a slow shard
                raise
            return steps
        steps += int(batch.lengths.sum())
        batch.release()


def test_two_ray_learners_draw_as_one_table_after_updates_from_both(cluster):
    alpha = 1.0
    store = RayReplayStore(SPEC, 400, num_shards=2, selector=Prioritized(alpha), seed=11)
    try:
        fill(store, [12, 9, 15, 11, 13])
        eps = store.episodes()
        items = {int(e.data["id"][i]): (e.shard, e.start + i) for e in eps for i in range(e.length)}
        learners = [store.learner(), store.learner()]
        prio = {i: (1.0 + i % 5 if s == 0 else 0.5 + i % 3) for i, (s, _) in items.items()}
        refs = []
        for role, learner in enumerate(learners):  # learner 0 sets shard 0's priorities, learner 1 shard 1's
            mine = [i for i, (s, _) in items.items() if s == role]
            keys = encode_keys([items[i][0] for i in mine], [items[i][1] for i in mine], np.zeros(len(mine)))
            refs.append((update.remote(learner, keys, np.array([prio[i] for i in mine])), len(mine)))
        assert [ray.get(r) for r, _ in refs] == [n for _, n in refs]
        parts = ray.get([draw.remote(learner, 8, 500) for learner in learners])
        keys = np.concatenate([k for k, _ in parts])
        ids = np.concatenate([i for _, i in parts])
        shard, anchor, _ = decode_keys(keys)
        assert all(items[int(i)] == (int(s), int(a)) for i, s, a in zip(ids, shard, anchor, strict=True))
        order = sorted(items)
        observed = np.array([np.sum(ids == i) for i in order])
        w = np.array([prio[i] ** alpha for i in order])
        assert stats.chisquare(observed, w / w.sum() * len(ids)).pvalue > 1e-3
        assert store.counters()["samples"] == 8000  # both learners' samples in the one counter
    finally:
        store.close()


def test_samples_per_insert_is_global_over_ray_learners(cluster):
    spi, min_size, buffer = 2.0, 20, 400.0
    store = RayReplayStore(SPEC, 1000, num_shards=2, rate_limiter=SampleToInsertRatio(spi, min_size, buffer))
    try:
        fill(store, [50, 50, 50, 50])  # 200 steps: within max_diff = 440 without any sample
        learners = [store.learner(), store.learner()]
        steps = ray.get([sample_until_refused.remote(lr) for lr in learners])
        c = store.counters()
        assert c["samples"] == sum(steps) and c["inserts"] == 200
        min_diff = spi * min_size - buffer  # a sample is admitted while 400 - samples - 1 >= min_diff
        # each learner stops only when refused by counts it read (never above the true count); each
        # admitted batch may overshoot by its 8 steps, and by the other learner's count still in flight
        assert 200 * spi - min_diff <= sum(steps) <= 200 * spi - min_diff + 3 * 8
        with pytest.raises(TimeoutError, match="sample waited"):
            store.sample(8, timeout=0.5)  # the owner is refused too: the learners used the budget
    finally:
        store.close()


@ray.remote
class Gate:
    """Named events between the test and a task (no sleeps)."""

    def __init__(self) -> None:
        import asyncio

        self.events: dict[str, asyncio.Event] = {}

    def _event(self, name: str):
        import asyncio

        return self.events.setdefault(name, asyncio.Event())

    async def set(self, name: str) -> None:
        self._event(name).set()

    async def wait(self, name: str) -> None:
        await self._event(name).wait()

    async def is_set(self, name: str) -> bool:
        return self._event(name).is_set()


@ray.remote(num_cpus=1)
def sample_around_checkpoint(learner, gate) -> tuple[int, int]:
    before = after = 0
    while True:
        checkpointed = ray.get(gate.is_set.remote("checkpointed"))
        with learner.sample(16, window=1, timeout=60) as batch:
            if checkpointed:
                after += int(batch.lengths.sum())
            else:
                before += int(batch.lengths.sum())
        if before == 16 and not checkpointed:
            ray.get(gate.set.remote("started"))
        if after:
            return before, after


def test_a_checkpoint_while_a_ray_learner_samples(cluster, tmp_path):
    store = RayReplayStore(SPEC, 400, num_shards=2, seed=2)
    try:
        fill(store, [40, 30, 50])
        gate = Gate.remote()
        task = sample_around_checkpoint.remote(store.learner(), gate)
        ray.get(gate.wait.remote("started"))
        floor = store.counters()["samples"]
        folder = store.checkpoint(tmp_path / "ckpt")  # the learner keeps sampling meanwhile
        ray.get(gate.set.remote("checkpointed"))
        before, after = ray.get(task)
        assert after == 16  # it went on sampling after the checkpoint
        restored = RayReplayStore.restore(folder)
        try:
            held = restored.counters()["samples"]
            assert floor <= held <= before  # the count of a moment during the checkpoint
            late = restored.learner()  # a learner of the restored store
            keys, ids = ray.get(draw.remote(late, 1, 32))
            assert restored.update_priorities(keys, np.ones(32)) == 32
            assert restored.counters()["samples"] == held + 32
        finally:
            restored.close()
    finally:
        store.close()


@ray.remote(num_cpus=1)
def shard_counts(learner, batches: int) -> list[int]:
    """Windows drawn from shard 0 in each of ``batches`` batches of 16 (the learner's split over shards)."""
    counts = []
    for _ in range(batches):
        with learner.sample(16, window=1, timeout=60) as batch:
            counts.append(int(np.sum(decode_keys(batch.keys.numpy())[0] == 0)))
    return counts


def test_one_seeded_handle_in_two_processes_splits_independently(cluster):
    # the README's recipe: one handle broadcast to every rank; the ranks must not share one split stream
    store = RayReplayStore(SPEC, 400, num_shards=2, seed=5)
    try:
        fill(store, [40, 40, 40, 40])
        learner = store.learner()
        a, b = ray.get([shard_counts.remote(learner, 30), shard_counts.remote(learner, 30)])
        assert a != b  # the same seed in both processes gave both the same 30 Binomial(16, 1/2) splits
        assert store.counters()["samples"] == 2 * 30 * 16
    finally:
        store.close()

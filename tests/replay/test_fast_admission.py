"""The uncontended paths: an admissible sample takes no condition variable, a free staging slot no wait,
and a batch releases its slot exactly once (explicit release from two threads, or garbage collection)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager
from graphrl.tensors import StagingPool
from replay import ReplayStore, TrajectorySpec
from replay.batch import Batch
from replay.rate_limiter import MinSize, Queue, RateLimiterState, SampleToInsertRatio


class CountingCondition:
    """A threading.Condition that counts how often it is entered."""

    def __init__(self) -> None:
        self.inner = threading.Condition()
        self.entered = 0

    def __enter__(self):
        self.entered += 1
        return self.inner.__enter__()

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)

    def wait_for(self, predicate, timeout=None):
        return self.inner.wait_for(predicate, timeout)

    def notify_all(self):
        self.inner.notify_all()


def test_admissible_sample_takes_no_lock_and_a_blocked_one_still_waits():
    cond = CountingCondition()
    state = RateLimiterState(MinSize(10), np.array([10, 0, 0, 0], dtype=np.int64), cond)
    state.await_sample(timeout=0)
    assert cond.entered == 0
    state.counters[2] = 1  # a delete: 9 sampleable steps < min_size
    with pytest.raises(TimeoutError, match="fewer than min_size=10"):
        state.await_sample(timeout=0)
    assert cond.entered == 1
    state.counters[2] = 0
    state.counters[3] = 1  # cancelled: the fast path must not admit
    with pytest.raises(ValueError, match="closed"):
        state.await_sample(timeout=0)


@settings(max_examples=200, deadline=None)
@given(
    inserts=st.integers(0, 500),
    samples=st.integers(0, 2000),
    deletes=st.integers(0, 500),
    which=st.sampled_from(["min_size", "ratio", "queue"]),
)
def test_fast_admission_agrees_with_can_sample(inserts, samples, deletes, which):
    limiter = {
        "min_size": MinSize(7),
        "ratio": SampleToInsertRatio(2.0, 5, 20.0),
        "queue": Queue(50),
    }[which]
    counts = np.array([inserts, samples, deletes, 0], dtype=np.int64)
    state = RateLimiterState(limiter, counts)
    expected = limiter.can_sample(counts)
    if expected:
        state.await_sample(timeout=0)
    else:
        with pytest.raises(TimeoutError):
            state.await_sample(timeout=0)


def test_concurrent_samplers_never_pass_the_ratio_bound():
    # 4 threads sample 1 step per admission while one inserts: with samples_per_insert=1 and min_diff=-4,
    # at most one admitted-but-uncounted call per sampler can overshoot the bound.
    state = RateLimiterState(SampleToInsertRatio(1.0, 1, (-4.0, 4.0)))
    stop = threading.Event()
    worst = []

    def sampler() -> None:
        while not stop.is_set():
            try:
                state.await_sample(timeout=0.5)
            except TimeoutError:
                continue
            state.sample(1)
            with state.cond:
                worst.append(int(state.counters[1]) - int(state.counters[0]))

    threads = [threading.Thread(target=sampler) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(2000):
        state.await_insert(timeout=5.0)
        state.insert(1)
    stop.set()
    for t in threads:
        t.join()
    counts = state.state()
    assert counts["inserts"] == 2000
    assert max(worst) <= 4 + 4  # -min_diff plus one call per concurrent sampler
    assert counts["samples"] == len(worst)


def test_free_slot_handed_out_without_waiting_and_views_stay_put():
    with MemoryManager() as mm:
        pool = StagingPool(mm, (4,), torch.float32, slots=2, tier="host", timeout=0)
        a = pool.acquire()
        b = pool.acquire()
        assert (a.slot, b.slot) == (0, 1)
        a.tensor.fill_(3.0)
        with pytest.raises(TimeoutError, match="stayed held"):
            pool.acquire()
        a.release()
        c = pool.acquire()
        assert c.slot == 0 and c.step == 2
        assert c.tensor.data_ptr() == pool.region.tensor()[0].data_ptr()
        assert torch.equal(c.tensor, torch.full((4,), 3.0))
        b.release()
        c.release()
        pool.close()


def _batch(pool: StagingPool) -> Batch:
    buf = pool.acquire()
    t = buf.tensor
    return Batch({"x": t}, torch.ones(4, 1, dtype=torch.bool), torch.zeros(4, dtype=torch.int64),
                 torch.ones(4, dtype=torch.float64), torch.ones(4), torch.ones(4, dtype=torch.int64), 4, buf)


def test_batch_releases_its_slot_once():
    with MemoryManager() as mm:
        pool = StagingPool(mm, (4, 1), torch.float32, slots=1, tier="host", timeout=0)
        for _ in range(50):  # two threads racing to release: the slot comes back once, no error
            batch = _batch(pool)
            assert not batch.released
            threads = [threading.Thread(target=batch.release) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert batch.released and pool.available == 1
        batch = _batch(pool)
        assert pool.available == 0
        del batch
        gc.collect()
        assert pool.available == 1  # collected: the slot is free again
        pool.close()


def test_windows_of_one_step_charge_exactly_the_batch_size():
    spec = TrajectorySpec({"pos": ((), "int64")})
    with MemoryManager() as mm:
        store = ReplayStore(spec, capacity_steps=64, num_shards=1, memory=mm, timeout=5.0,
                            rate_limiter=SampleToInsertRatio(1.0, min_size=10, error_buffer=(-40.0, 100.0)))
        with store.writer() as w:  # three episodes, 10 + 7 + 3 steps
            for n in (10, 7, 3):
                w.extend({"pos": np.arange(n, dtype=np.int64)})
                w.end_episode()
        charged = []
        for b, length in ((5, 1), (7, 1), (4, 3)):
            with store.sample(b, window=length) as batch:
                charged.append(int(batch.lengths.sum()))
                if length == 1:
                    assert batch.lengths.tolist() == [1] * b
                else:
                    assert 1 <= int(batch.lengths.min()) and int(batch.lengths.max()) <= 3
        assert charged[:2] == [5, 7]
        assert store.counters()["samples"] == sum(charged)
        store.close()

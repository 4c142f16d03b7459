"""`TrajectoryStorage.commit` as one compiled call (`replay.commit_kernel.commit_chunk`, taken when a
writer passes its buffers' `sources`) against the Python steps (no sources): the same returns, rings,
step index, records, meta and control words under hypothesis; the rate limiter's admission; the repair
of a commit whose holder died; exact counts and untorn windows with writer and sampler threads."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replay.storage as storage_module
from graphrl.memory import MemoryManager
from replay import MinSize, ReplayStore, SampleToInsertRatio, TrajectorySpec
from replay.commit_kernel import BLOCKED, OK, commit_chunk
from replay.rate_limiter import RateLimiter
from replay.shard_layout import EXHAUSTED, LOST_RECORD, RESERVE_POS, WRITE_POS
from replay.storage import TrajectoryStorage

SPEC = TrajectorySpec({"obs": ((3,), "float32"), "a": ((), "int64"), "d": ((), "bool")})


def make_storage(mm, capacity, shards, limiter=None, chunk=8):
    limiter = MinSize(1) if limiter is None else limiter
    storage = TrajectoryStorage.create(SPEC, capacity, shards, limiter, mm, chunk, None, tier="host")
    for sh in storage.shards:  # fresh regions are not zeroed: give both sides the same bytes
        sh.steps[:, 1:] = 0
        sh.records[:, 1:] = 0
        for ring in sh.columns.values():
            ring[...] = 0
    return storage


def buffers(chunk: int) -> dict[str, np.ndarray]:
    return {n: np.zeros((chunk, *f.shape), f.dtype) for n, f in SPEC.items()}


def fill(bufs: dict[str, np.ndarray], tag: int, count: int) -> None:
    t = np.arange(count) + tag * 1000
    bufs["obs"][:count] = (t[:, None] * 3 + np.arange(3)).astype(np.float32)
    bufs["a"][:count] = t
    bufs["d"][:count] = t % 2 == 0


def state(storage: TrajectoryStorage) -> list[bytes]:
    out = [storage.control.ctl.tobytes()]
    for sh in storage.shards:
        out += [sh.meta.tobytes(), sh.steps.tobytes(), sh.records.tobytes()]
        out += [sh.columns[n].tobytes() for n in SPEC]
    return out


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(4, 30),
    shards=st.integers(1, 3),
    chunk=st.integers(1, 4),
    ops=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 4), st.booleans(), st.integers(0, 9)),
        min_size=1,
        max_size=40,
    ),
)
def test_compiled_commit_equals_the_python_steps(capacity, shards, chunk, ops):
    """Three writers interleave chunks, ends, empty commits and continuations over wrapping rings."""
    statuses: list[int] = []
    real = storage_module.commit_chunk

    def spy(*args):  # every commit of steps runs compiled and is admitted (MinSize(1) never blocks)
        out = real(*args)
        statuses.append(out[0])
        return out

    storage_module.commit_chunk = spy
    try:
        check_equal(capacity, shards, chunk, ops, statuses)
    finally:
        storage_module.commit_chunk = real


def check_equal(capacity, shards, chunk, ops, statuses):
    with MemoryManager() as mm:
        fast, slow = make_storage(mm, capacity, shards), make_storage(mm, capacity, shards)
        bufs = [buffers(chunk) for _ in range(3)]
        sources = [fast.sources(b) for b in bufs]
        episodes = {"fast": [None] * 3, "slow": [None] * 3}
        ids = [fast.new_writer_id() for _ in range(3)]
        assert ids == [slow.new_writer_id() for _ in range(3)]
        for step, (w, count, end, extra) in enumerate(ops):
            count = min(count, chunk)
            end = end or count == 0  # a writer's commit of no steps only ends its episode
            fill(bufs[w], step, count)
            if extra == 9 and episodes["fast"][w] is None:  # a continuation record (as a Ray shard's writer)
                s = step % shards
                for name, st_ in (("fast", fast), ("slow", slow)):
                    st_.open_episode(s)
                    episodes[name][w] = (s, LOST_RECORD)
            if extra == 8:  # items removed by max_times_sampled: overwriting them deletes nothing
                for st_ in (fast, slow):
                    st_.shards[step % shards].steps[step % capacity, 2] |= EXHAUSTED
            compiled = len(statuses)
            got = fast.commit(bufs[w], count, episodes["fast"][w], end, None, ids[w], sources[w])
            assert statuses[compiled:] == [OK] * (count > 0)
            want = slow.commit(bufs[w], count, episodes["slow"][w], end, None, ids[w])
            assert got == want
            for name, ret in (("fast", got), ("slow", want)):
                episodes[name][w] = None if (end or ret == (-1, -1)) else ret
            assert state(fast) == state(slow)
        for sh in fast.shards:  # positions and sequence numbers: a run per commit, every item stamped
            assert sh.meta[WRITE_POS] == sh.meta[RESERVE_POS]
        fast.close()
        slow.close()


@settings(max_examples=80, deadline=None)
@given(
    spi=st.sampled_from([0.25, 0.5, 1.0, 1.5, 3.0]) | st.floats(0.25, 4.0),  # exact bounds, and any
    min_size=st.integers(1, 40),
    error_buffer=st.integers(4, 30).map(float) | st.floats(4.0, 30.0),
    inserts=st.integers(400, 800),
    size_delta=st.integers(-2, 2),
    samples_delta=st.integers(-2, 2),
    count=st.integers(1, 8),
)
def test_admission_is_the_limiters_can_insert(
    spi, min_size, error_buffer, inserts, size_delta, samples_delta, count
):
    """Counts drawn at both bounds: the size at ``min_size`` and the samples at ``max_diff``."""
    limiter = SampleToInsertRatio(spi, min_size, error_buffer)
    deletes = inserts - (min_size + size_delta)
    samples = max(0, int((inserts + 1) * spi - limiter.max_diff) + samples_delta)
    with MemoryManager() as mm:
        storage = make_storage(mm, 64, 2, limiter)
        bufs = buffers(8)
        fill(bufs, 1, count)
        storage.control.counters[:3] = (inserts, samples, deletes)
        admitted = limiter.can_insert(storage.control.counters)
        wid = storage.new_writer_id()
        before = state(storage)
        sources = storage.sources(bufs)
        if not admitted:  # the Python steps wait, then time out: nothing stored
            with pytest.raises(TimeoutError, match="inserting is ahead of sampling"):
                storage.commit(bufs, count, None, True, 0.0, wid, sources)
            assert state(storage) == before
        status, *_ = commit_chunk(storage.plan, sources, count, -1, -1, True, wid, spi, limiter.max_diff, 0)
        assert status == (OK if admitted else BLOCKED)
        if admitted:
            assert storage.control.counters[0] == inserts + count
        else:
            assert state(storage) == before
        storage.close()


def test_a_closed_store_refuses_the_compiled_commit():
    with MemoryManager() as mm:
        storage = make_storage(mm, 16, 1)
        bufs = buffers(4)
        storage.control.counters[3] = 1  # the owner's close: the rate limiter's cancelled flag
        before = state(storage)
        with pytest.raises(ValueError, match="closed"):
            storage.commit(bufs, 2, None, True, 0.0, 1, storage.sources(bufs))
        assert state(storage) == before
        storage.close()


def die_holding(lock, then=lambda: None) -> None:
    """A thread that locks ``lock``, runs ``then`` and exits holding it (robust mutex: EOWNERDEAD next)."""

    def run() -> None:
        lock.acquire()
        then()

    t = threading.Thread(target=run)
    t.start()
    t.join()


def test_a_dead_holders_commit_is_repaired_the_same_way(caplog):
    with MemoryManager() as mm:
        fast, slow = make_storage(mm, 10, 1), make_storage(mm, 10, 1)
        bufs = buffers(8)
        for st_ in (fast, slow):
            fill(bufs, 0, 3)
            st_.commit(bufs, 3, None, True, None, 1)
            sh = st_.shards[0]

            def half_commit(sh=sh) -> None:  # reserve 4 positions, copy one row, die
                sh.meta[RESERVE_POS] = sh.meta[WRITE_POS] + 4
                sh.columns["a"][3] = -7

            die_holding(sh.lock, half_commit)
        fill(bufs, 5, 5)
        with caplog.at_level(logging.WARNING):
            got = fast.commit(bufs, 5, None, True, None, 2, fast.sources(bufs))
        want = slow.commit(bufs, 5, None, True, None, 2)
        assert got == want and state(fast) == state(slow)
        assert fast.shards[0].meta[3] == 4 and fast.shards[0].write_pos == 12  # a hole of 4, then 5 steps
        assert "died mid-commit; 4 steps at positions [3, 7)" in caplog.text
        # the control mutex's holder dies too: the next compiled commit recovers it and counts
        die_holding(fast.control.mutex)
        fill(bufs, 6, 2)
        fast.commit(bufs, 2, None, True, None, 2, fast.sources(bufs))
        assert fast.control.counters[0] == 3 + 5 + 2
        with fast.control.cond:  # consistent again for the Python side
            pass
        fast.close()
        slow.close()


def test_sources_name_the_bad_buffer():
    with MemoryManager() as mm:
        storage = make_storage(mm, 16, 1)
        bufs = buffers(4)
        bufs["a"] = np.zeros((8, 2), np.int64)[:, 0]  # strided
        with pytest.raises(ValueError, match=r"buffers\['a'\] must be a C-contiguous"):
            storage.sources(bufs)
        storage.close()


class Admit(RateLimiter):
    """A rate limiter of its own admission: commits take the Python steps."""

    def __init__(self) -> None:
        super().__init__(1.0, 1, -1e300, 1e300)
        self.asked = 0

    def can_insert(self, counts, n=1):
        self.asked += 1
        return True


def test_an_overridden_admission_takes_the_python_steps():
    with MemoryManager() as mm:
        limiter = Admit()
        storage = make_storage(mm, 16, 1, limiter)
        bufs = buffers(4)
        fill(bufs, 0, 4)
        storage.commit(bufs, 4, None, True, None, 1, storage.sources(bufs))
        assert limiter.asked == 1 and storage.shards[0].write_pos == 4
        storage.close()


def test_writer_threads_and_a_sampler_keep_counts_and_windows_whole():
    """Four writer threads on two shards (the ring wraps), a sampler drawing windows all along."""
    spec = TrajectorySpec({"wid": ((), "int64"), "ep": ((), "int64"), "t": ((), "int64")})
    n_writers, n_episodes = 4, 120
    lengths = np.random.default_rng(0).integers(1, 40, (n_writers, n_episodes))
    with MemoryManager() as mm:
        store = ReplayStore(spec, capacity_steps=4000, num_shards=2, memory=mm, chunk_steps=16, timeout=30)
        done = threading.Event()
        errors: list[BaseException] = []

        def write(wid: int) -> None:
            try:
                with store.writer() as w:
                    for ep in range(n_episodes):
                        n = int(lengths[wid, ep])
                        w.extend({"wid": np.full(n, wid), "ep": np.full(n, ep), "t": np.arange(n)})
                        w.end_episode()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def sample() -> None:
            try:
                while not done.is_set():
                    b = store.sample(64, window=8, timeout=30)
                    m = b.mask.numpy()
                    for k in range(64):
                        wid, ep, t = (b[f][k].numpy()[m[k]] for f in ("wid", "ep", "t"))
                        assert len(set(wid.tolist())) == 1 and len(set(ep.tolist())) == 1
                        assert np.array_equal(t, np.arange(t[0], t[0] + len(t)))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        writers = [threading.Thread(target=write, args=(i,)) for i in range(n_writers)]
        sampler = threading.Thread(target=sample)
        for t in writers:
            t.start()
        sampler.start()
        for t in writers:
            t.join()
        done.set()
        sampler.join()
        assert not errors, errors
        total = int(lengths.sum())
        storage = store.storage
        c = store.counters()
        assert c["inserts"] == total and int(storage.control.ctl[4]) == total  # global sequence
        assert int(storage.control.assigned.sum()) == total and (storage.control.open == 0).all()
        live = sum(sh.live_steps() for sh in storage.shards)
        assert c["deletes"] == total - live  # every overwritten step was an item
        seqs = np.concatenate([sh.steps[: sh.live_steps(), 1] for sh in storage.shards])
        assert len(np.unique(seqs)) == live  # one sequence number per step
        for e in store.episodes():  # each segment: one episode's steps, in order
            wid, ep, t = (e.data[f] for f in ("wid", "ep", "t"))
            assert len(set(wid.tolist())) == 1 and len(set(ep.tolist())) == 1
            assert np.array_equal(t, np.arange(t[0], t[0] + len(t)))
            assert t[-1] < lengths[wid[0], ep[0]]
        store.close()

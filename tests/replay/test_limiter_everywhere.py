"""A user's RateLimiter subclass rules every process of a local store and survives a restore.

The subclass below admits differently from its base (`replay.MinSize` admits every insert and every
sample once one step is in): the owner, an attached store in a spawned or forked actor process, a
learner process and a store restored from a checkpoint all admit exactly its script of inserts and
samples (the limiter object travels with the handle; a checkpoint records its class name, and
``restore`` takes the user's limiter: `replay.limiter_record`). A limiter that cannot be pickled is
refused when a handle is made, naming it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import threading

import numpy as np
import pytest

from replay import MinSize, ReplayStore, SampleToInsertRatio, TrajectorySpec
from replay.limiter_record import limiter_record, restored_limiter

SPEC = TrajectorySpec({"id": ((), "int64")})
EPISODE = 7  # steps per episode
BATCH = 8  # windows of one step per sample
REFUSED_AFTER_S = 0.5  # a refused call's wait (an admitted one does not wait)


class InsertsAheadOfSamples(MinSize):
    """Inserts at most 30 steps ahead of samples; samples stay at least 20 steps behind inserts."""

    def can_insert(self, counts, n=1):
        return int(counts[0]) + n <= 30 + int(counts[1])

    def can_sample(self, counts, n=1):
        return super().can_sample(counts, n) and int(counts[1]) + n <= int(counts[0]) - 20


# By hand from the rules (counts inserts/samples): 0, 7, .. 28 admit an episode (28 + 1 <= 30), 35 does
# not; samples 0 and 8 admit a batch (9 <= 35 - 20), 16 does not; 35 and 42 inserted admit one more
# (43 <= 46), 49 does not; samples 16 and 24 admit one (25 <= 49 - 20), 32 does not. MinSize admits
# every call (the script stops at 8 inserts and 5 samples).
WANT = [5, 2, 2, 2]
WANT_COUNTERS = {"inserts": 49, "samples": 32, "deletes": 0}


def insert_run(store, first: int, most: int = 8) -> int:
    """Episodes of 7 steps admitted one after another until one is refused (at most ``most``)."""
    for k in range(most):
        w = store.writer(timeout=REFUSED_AFTER_S)
        w.extend({"id": np.arange(first + k * EPISODE, first + (k + 1) * EPISODE, dtype=np.int64)})
        try:
            w.end_episode()
            w.close()
        except TimeoutError as exc:
            assert "InsertsAheadOfSamples.can_insert is False" in str(exc), exc  # its own rule, named
            with contextlib.suppress(TimeoutError):
                w.close()
            return k
    return most


def sample_run(sampler, most: int = 5) -> int:
    """Batches of 8 one-step windows admitted one after another until one is refused."""
    for k in range(most):
        try:
            with sampler.sample(BATCH, window=1, timeout=REFUSED_AFTER_S) as b:
                assert int(b.lengths.sum()) == BATCH
        except TimeoutError:
            return k
    return most


def serve(make, run, conn) -> None:
    """A child process: ``make()`` its store view, then one ``run`` per message (the argument), replied."""
    view = make()
    try:
        while (msg := conn.recv()) is not None:
            conn.send(run(view, msg))
    finally:
        view.close()


def attached_actor(handle, conn) -> None:
    serve(lambda: ReplayStore.attach(handle), insert_run, conn)


def learner_process(learner, conn) -> None:
    serve(lambda: learner, lambda view, _: sample_run(view), conn)


def owner_script(store) -> list[int]:
    first = 0
    got = []
    for phase in range(4):
        if phase % 2 == 0:
            got.append(insert_run(store, first))
            first += got[-1] * EPISODE
        else:
            got.append(sample_run(store))
    return got


@pytest.mark.parametrize("limiter, want", [(InsertsAheadOfSamples(1), WANT), (MinSize(1), [8, 5, 8, 5])])
def test_the_owner_admits_by_the_subclass(limiter, want):
    with ReplayStore(SPEC, 1000, num_shards=1, rate_limiter=limiter) as store:
        assert owner_script(store) == want


def run_with_child(ctx, target, args, store, child_does: str) -> list[int]:
    """The owner's script with the inserts (``child_does="insert"``) or samples done by a child."""
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child))
    proc.start()
    got, first = [], 0
    try:
        for phase in range(4):
            inserting = phase % 2 == 0
            if (child_does == "insert") == inserting:
                parent.send(first)
                assert parent.poll(120), "the child process did not answer"
                got.append(parent.recv())
            else:
                got.append(insert_run(store, first) if inserting else sample_run(store))
            first += got[-1] * EPISODE if inserting else 0
        parent.send(None)
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    return got


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_an_attached_actor_process_admits_inserts_by_the_owners_subclass(method):
    with ReplayStore(SPEC, 1000, num_shards=1, rate_limiter=InsertsAheadOfSamples(1)) as store:
        handle = store.handle()
        assert type(handle.rate_limiter) is InsertsAheadOfSamples
        ctx = mp.get_context(method)
        assert run_with_child(ctx, attached_actor, (handle,), store, "insert") == WANT
        assert store.counters() == WANT_COUNTERS


def test_a_learner_process_samples_by_the_owners_subclass():
    with ReplayStore(SPEC, 1000, num_shards=1, rate_limiter=InsertsAheadOfSamples(1)) as store:
        learner = store.learner()
        ctx = mp.get_context("fork")
        assert run_with_child(ctx, learner_process, (learner,), store, "sample") == WANT
        assert store.counters() == WANT_COUNTERS
        learner.close()


def test_a_restored_store_needs_the_subclass_and_admits_by_it(tmp_path):
    limiter = InsertsAheadOfSamples(1)
    with ReplayStore(SPEC, 1000, num_shards=1, rate_limiter=limiter) as store:
        assert insert_run(store, 0) == 5 and sample_run(store) == 2
        store.checkpoint(tmp_path)
    name = f"{__name__}.InsertsAheadOfSamples"
    with pytest.raises(ValueError, match=rf"{name}, a RateLimiter subclass.*=InsertsAheadOfSamples\(\.\."):
        ReplayStore.restore(tmp_path)
    with pytest.raises(ValueError, match=r"rate_limiter=MinSize\(.*is not the checkpoint's"):
        ReplayStore.restore(tmp_path, rate_limiter=MinSize(1))
    with pytest.raises(ValueError, match="is not the checkpoint's"):  # its class, other settings
        ReplayStore.restore(tmp_path, rate_limiter=InsertsAheadOfSamples(2))
    with ReplayStore.restore(tmp_path, rate_limiter=limiter) as store:
        assert store.rate_limiter is limiter
        assert store.counters() == {"inserts": 35, "samples": 16, "deletes": 0}
        assert [insert_run(store, 35), sample_run(store)] == WANT[2:]
        assert store.counters() == WANT_COUNTERS
        # and its actor processes after the restore
        assert type(store.handle().rate_limiter) is InsertsAheadOfSamples


def test_a_built_in_limiter_restores_from_its_settings_with_or_without_it(tmp_path):
    limiter = SampleToInsertRatio(2.0, min_size=10, error_buffer=(3.0, 40.0))
    assert limiter_record(limiter) == limiter.to_config()  # no class name: built-ins rebuild
    with ReplayStore(SPEC, 1000, num_shards=1, rate_limiter=limiter) as store:
        insert_run(store, 0, most=2)
        store.checkpoint(tmp_path)
    with ReplayStore.restore(tmp_path) as store:
        assert store.rate_limiter == limiter and store.rate_limiter is not limiter
    with ReplayStore.restore(tmp_path, rate_limiter=limiter) as store:
        assert store.rate_limiter is limiter
    with pytest.raises(ValueError, match="is not the checkpoint's"):
        ReplayStore.restore(tmp_path, rate_limiter=InsertsAheadOfSamples(10))


def test_restored_limiter_refuses_what_is_not_a_rate_limiter():
    record = limiter_record(InsertsAheadOfSamples(1))
    assert record == {"kind": "min_size", "min_size": 1, "class": f"{__name__}.InsertsAheadOfSamples",
                      "settings": {}}
    with pytest.raises(TypeError, match="rate_limiter must be a replay.rate_limiter.RateLimiter, got dict"):
        restored_limiter(record, {"kind": "min_size"}, "ReplayStore.restore")


class HoldsALock(MinSize):
    """Importable, but its lock cannot be pickled."""

    def __init__(self) -> None:
        super().__init__(1)
        self.lock = threading.Lock()


def test_an_unpicklable_limiter_is_refused_when_a_handle_is_made():
    class Local(MinSize):  # defined in a function: pickle cannot name it
        def can_insert(self, counts, n=1):
            return int(counts[0]) + n <= 30

    for limiter, what in ((Local(1), "Local"), (HoldsALock(), "HoldsALock")):
        with ReplayStore(SPEC, 1000, num_shards=1, rate_limiter=limiter) as store:
            with pytest.raises(TypeError, match=rf"handle\(\): the store's rate limiter .*{what}.* cannot be "
                               "pickled"):
                store.handle()
            with pytest.raises(TypeError, match=f"{what}.* cannot be pickled"):
                store.learner()
            assert insert_run(store, 0, most=2) == 2 and len(store) == 14  # the owner goes on

"""A Ray store restored from a checkpoint admits by the user's RateLimiter subclass, which it must be given.

The manifest records the limiter's settings and a subclass's class name (`replay.limiter_record`):
``RayReplayStore.restore`` without the limiter refuses naming its class; with it, the restored store
goes on admitting exactly as the checkpointed one would have.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import MinSize, TrajectorySpec  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the limiter's class travels to the actors

SPEC = TrajectorySpec({"id": ((), "int64")})


class InsertsAheadOfSamples(MinSize):
    """Inserts at most 30 steps ahead of samples (MinSize admits every insert)."""

    def can_insert(self, counts, n=1):
        return int(counts[0]) + n <= 30 + int(counts[1])


def insert_run(store, first: int, expect: int) -> int:
    """Episodes of 7 steps admitted one after another until one is refused (at most ``expect + 1``).

    The first ``expect`` wait long (a slow machine does not refuse them), the one after them briefly:
    nothing else runs meanwhile, so the limiter's answer cannot change while it waits, and a wrong
    admission is stored at once (returning ``expect + 1``) whatever the timeout."""
    for k in range(expect + 1):
        w = store.writer(timeout=30.0 if k < expect else 0.2)
        w.extend({"id": np.arange(first + 7 * k, first + 7 * (k + 1), dtype=np.int64)})
        try:
            w.end_episode()
            w.close()  # the shipment: refused by its shard's allowance within the timeout
        except TimeoutError:
            with contextlib.suppress(TimeoutError):
                w.close()
            return k
    return expect + 1


def test_a_restored_ray_store_needs_the_subclass_and_admits_by_it(cluster, tmp_path):
    # 0, 7, .. 28 inserted admit an episode (28 + 1 <= 30), 35 does not; after 8 sampled, 35 admits one
    # more (36 <= 38), 42 does not
    limiter = InsertsAheadOfSamples(1)
    with RayReplayStore(SPEC, 1000, num_shards=1, rate_limiter=limiter, seed=2) as store:
        assert insert_run(store, 0, 5) == 5
        store.checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"RayReplayStore\.restore: .*Samples, a RateLimiter subclass"):
        RayReplayStore.restore(tmp_path)
    with pytest.raises(ValueError, match=r"rate_limiter=MinSize\(.*is not the checkpoint's"):
        RayReplayStore.restore(tmp_path, rate_limiter=MinSize(1))
    with RayReplayStore.restore(tmp_path, rate_limiter=limiter) as store:
        assert store.rate_limiter is limiter
        assert insert_run(store, 35, 0) == 0
        with store.sample(8, window=1, timeout=10) as b:
            assert int(b.lengths.sum()) == 8
        assert insert_run(store, 35, 1) == 1
        assert store.counters() == {"inserts": 42, "samples": 8, "deletes": 0}

"""How far the Ray store's inserts may go past a rate limiter's headroom, against the local store's.

The local store admits a call while its limiter admits one step, then charges all its steps: a headroom
of H steps admits fewer than ``H + m`` (m the shipment's steps). The Ray store splits H over its S shards
in whole steps (`replay.distributed.routing.headroom_shares`: at least one each while H >= 1) and each
shard admits a shipment while its inserts are below its share: fewer than ``H + S * m`` in all, exactly
the local store's count for one-step shipments with ``H >= S``. A limiter subclass capping inserts
(``Cap``: ``inserts + n <= cap``, no samples to move it) gives one headroom for the whole run.
"""

from __future__ import annotations

import contextlib
import math
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

import _limiters  # noqa: E402
from _limiters import Cap  # noqa: E402

from replay import ReplayStore, TrajectorySpec  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402
from replay.distributed.routing import allowances, headroom_shares  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(_limiters)  # the shards and clients get Cap by value

SPEC = TrajectorySpec({"id": ((), "int64")})
REFUSED_S = 0.3  # nothing samples, so a refused shipment stays refused: a short wait tells it


def admitted(store, first: int, steps: int, shard: int | None) -> bool:
    """Whether one episode of ``steps`` steps is admitted (a writer of its own, on ``shard`` if given)."""
    w = store.writer(timeout=REFUSED_S) if shard is None else store.writer(timeout=REFUSED_S, shard=shard)
    w.extend({"id": np.arange(first, first + steps, dtype=np.int64)})
    try:
        w.end_episode()
        w.close()
        return True
    except TimeoutError:
        with contextlib.suppress(TimeoutError):
            w.close()
        return False


def local_inserts(cap: int, steps: int) -> int:
    """Steps the local store (two shards, one limiter) admits in episodes of ``steps`` until one waits."""
    with ReplayStore(SPEC, 1000, num_shards=2, rate_limiter=Cap(cap), seed=0) as store:
        k = 0
        while admitted(store, k * steps, steps, None):
            k += 1
        return store.counters()["inserts"]


def ray_inserts(cap: int, steps: int) -> tuple[int, list[int]]:
    """Steps the Ray store (two shards) admits in episodes of ``steps`` sent to shards 0, 1, 0, ... until
    each shard has refused one; and each shard's count."""
    with RayReplayStore(SPEC, 1000, num_shards=2, rate_limiter=Cap(cap), seed=0) as store:
        open_ = [True, True]
        k = 0
        while any(open_):
            s = k % 2
            if open_[s]:
                open_[s] = admitted(store, k * steps, steps, s)
            k += 1
        stats = store.stats()
        assert stats["deletes"] == 0  # each shard's live steps are its inserts
        return stats["inserts"], stats["shard_steps"]


def test_headroom_shares_are_whole_steps_summing_to_the_headroom():
    assert headroom_shares(12, 2) == [6, 6]
    assert headroom_shares(5, 2) == [3, 2]
    assert headroom_shares(7.9, 3) == [3, 2, 2]
    assert headroom_shares(2, 3) == [1, 1, 1]  # fewer steps than shards: one shipment each
    assert headroom_shares(0, 2) == [0, 0] and headroom_shares(-4, 2) == [0, 0]
    assert headroom_shares(math.inf, 2) == [math.inf, math.inf]
    for h in range(0, 40):
        for s in range(1, 6):
            got = headroom_shares(h, s)
            assert sum(got) == (max(h, s) if h >= 1 else 0) and max(got) - min(got) <= 1
    stats = [{"inserts": 10, "deletes": 0}, {"inserts": 30, "deletes": 0}]
    assert allowances(Cap(45), stats, 0) == [13, 32]  # headroom 5: shares 3 and 2


@pytest.mark.parametrize(
    ("cap", "steps", "local", "ray_per_shard"),
    [
        (5, 1, 5, [3, 2]),  # one-step shipments, H >= S: exactly the local store's (HEAD~: 3 + 3)
        (12, 1, 12, [6, 6]),
        (12, 3, 12, [6, 6]),
        (12, 4, 12, [8, 8]),  # 4 < 6 admits a second episode on each shard: one shipment past per shard
        (12, 5, 15, [10, 10]),
        (1, 1, 1, [1, 1]),  # H < S: each shard may take one shipment
    ],
)
def test_the_ray_store_admits_at_most_one_shipment_per_shard_past_the_headroom(
    cluster, cap, steps, local, ray_per_shard
):
    assert local_inserts(cap, steps) == local  # fewer than cap + steps: one shipment past in all
    total, per_shard = ray_inserts(cap, steps)
    assert per_shard == ray_per_shard and total == sum(ray_per_shard)
    assert local <= total < cap + 2 * steps  # the documented bound: H + S * m
    assert local < cap + steps

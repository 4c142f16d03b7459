"""A Ray shard explains a refused shipment from the one allowance record it admits by.

The client pushes each shard a `replay.distributed.routing.ShardAllowance`: the steps, the global counts
they were computed from, the headroom of those counts and the limiter's explanation past it, all made by
the client's own limiter object (`shard_allowances`, `explained_headroom`). The shard keeps it as one
record, so its refusal message never pairs an allowance with counts it was not computed from, never asks a
possibly stale copy of a stateful limiter, and after a reload goes back to the config-time record whole.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import MinSize, ReplayStore, SampleToInsertRatio, TrajectorySpec, Uniform  # noqa: E402
from replay.distributed.routing import (  # noqa: E402
    ShardAllowance,
    allowance_steps,
    allowances,
    explained_headroom,
    headroom_shares,
    shard_allowances,
)
from replay.distributed.shard import ShardActor  # noqa: E402

SPEC = TrajectorySpec({"id": ((), "int64")})


class Stateful(MinSize):
    """A cap whose explanation tells how often it was asked (state that a shard's copy would not share)."""

    def __init__(self, cap: int) -> None:
        super().__init__(1)
        self.cap = cap
        self.asked = 0

    def can_insert(self, counts, n=1):
        return int(counts[0]) + n <= self.cap

    def explain_insert_block(self, counts):
        self.asked += 1
        return f"capped at {self.cap} (asked {self.asked} times) at inserts={int(counts[0])}"


class Unexplained(MinSize):
    """A limiter a shard must not consult for an allowance pushed with its explanation."""

    def explain_insert_block(self, counts):
        raise AssertionError("the shard recomputed the explanation")


def config(limiter, counts=(0, 0, 0), shard_limiter=None) -> dict:
    headroom, why = explained_headroom(limiter, counts)
    cfg = {
        "spec": SPEC.to_config(), "capacity": 100, "num_shards": 2, "selector": Uniform().to_config(),
        "rate_limiter": limiter.to_config(), "insert_headroom": headroom, "insert_counts": counts,
        "insert_why": why, "max_times_sampled": 0, "chunk_steps": 100, "tier": "host", "timeout": 10.0,
        "staging_slots": 1, "seed": 5,
    }
    if shard_limiter is not None:
        cfg["limiter"] = shard_limiter
    return cfg


def refusal(shard: ShardActor, key: int) -> str:
    with pytest.raises(TimeoutError) as err:
        shard.insert(key, {"id": np.arange(1, dtype=np.int64)}, True, 0.05)
    return str(err.value)


def test_shard_allowances_are_one_record_per_shard_from_one_sum_of_the_counts():
    limiter = SampleToInsertRatio(1.0, min_size=2, error_buffer=(-10.0, 12.0))  # max_diff 12
    stats = [{"inserts": 4, "deletes": 1}, {"inserts": 6, "deletes": 0}]
    records = shard_allowances(limiter, stats, 4)
    assert [r.counts for r in records] == [(10, 4, 1)] * 2
    assert limiter.insert_headroom((10, 4, 1)) == 6  # n - 4 <= 12 up to n = 16
    assert [r.steps for r in records] == [4 + 3, 6 + 3] == allowances(limiter, stats, 4)
    assert all(r.headroom == 6 and r.why == limiter.explain_insert_block((16, 4, 1)) for r in records)
    assert allowance_steps(6, 6, 2, 1) == 6 + headroom_shares(6, 2)[1]
    unbounded = shard_allowances(MinSize(1), stats, 0)
    assert [r.steps for r in unbounded] == [math.inf, math.inf]
    assert unbounded[0].why == MinSize(1).explain_insert_block((10, 0, 1))


def test_a_refusal_gives_the_pushed_records_explanation_not_the_shards_copy(cluster):
    client_limiter = Stateful(3)
    shard = ShardActor(0, config(client_limiter, shard_limiter=Unexplained(1)), None)
    try:
        client_limiter.asked = 40  # the client's object moved on; the shard has no copy of it
        [pushed, _] = shard_allowances(client_limiter, [{"inserts": 0, "deletes": 0}] * 2, 0)
        assert pushed.why == "capped at 3 (asked 41 times) at inserts=3"
        shard.set_allow(pushed)  # 2 steps: its share of the cap's 3
        assert shard.insert(1, {"id": np.arange(2, dtype=np.int64)}, True, 1.0) == (2, False)
        msg = refusal(shard, 2)
        assert ("its allowance is 2: its share, over 2 shards, of the 3 steps the rate limiter admits at the "
                "store's counts when the client set it (inserts=0, samples=0, deletes=0), past which capped "
                "at 3 (asked 41 times) at inserts=3; nothing of this shipment was stored") in msg, msg
        assert client_limiter.asked == 41  # explained once, by the client, when it made the allowance
    finally:
        shard.close()


def test_a_hand_made_allowance_is_explained_by_the_shards_limiter_at_its_counts(cluster):
    limiter = SampleToInsertRatio(1.0, min_size=2, error_buffer=(-10.0, 12.0))
    shard = ShardActor(1, config(limiter), None)
    try:
        shard.set_allow(ShardAllowance(0.0, (10, 4, 0)))
        msg = refusal(shard, 1)
        assert "of the 6 steps the rate limiter admits" in msg, msg
        want = limiter.explain_insert_block((16, 4, 0))
        assert msg.endswith(want + "; nothing of this shipment was stored"), msg
    finally:
        shard.close()


def test_after_a_reload_the_allowance_and_its_counts_go_back_together(cluster, tmp_path):
    limiter = Stateful(9)
    with ReplayStore(SPEC, 100, num_shards=1, rate_limiter=MinSize(1)) as local:
        w = local.writer()
        w.extend({"id": np.arange(4, dtype=np.int64)})
        w.end_episode()
        w.close()
        local.checkpoint(tmp_path)
    shard = ShardActor(0, config(limiter, counts=(2, 0, 0)), None)
    try:
        first_why = limiter.explain_insert_block((9, 0, 0))  # what the config carried: asked once before
        said = "capped at 9 (asked 1 times) at inserts=9"
        assert shard.allowance == ShardAllowance(4.0, (2, 0, 0), 7, said)
        assert first_why.endswith("(asked 2 times) at inserts=9")
        shard.set_allow(ShardAllowance(5.0, (40, 3, 0), 1, "pushed later"))
        shard.awaiting = True  # as after Ray restarted the actor
        shard.load(str(tmp_path))
        # the checkpoint's 4 inserts plus the share (4 of 7) of the config-time headroom, with its counts
        assert shard.allowance == ShardAllowance(4 + 4.0, (2, 0, 0), 7, said)
        assert shard.store.counters()["inserts"] == 4
        assert shard.insert(3, {"id": np.arange(4, dtype=np.int64)}, True, 1.0) == (4, False)
        msg = refusal(shard, 4)
        assert ("its allowance is 8: its share, over 2 shards, of the 7 steps the rate limiter admits at the "
                "store's counts when the client set it (inserts=2, samples=0, deletes=0), past which capped "
                "at 9 (asked 1 times) at inserts=9") in msg, msg
    finally:
        shard.close()

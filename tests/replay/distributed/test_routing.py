"""replay.distributed's pure parts, without a cluster: routing, ring runs, the checkpoint manifest.

Which shard a writer picks, how a draw splits over shards (masses that overflow included), how keys
route back, the insert allowance (the rate limiter's own ``insert_headroom``, a subclass's included);
ring runs merge windows that overlap or touch and split those that wrap; the manifest is numbered,
published atomically (older folders pruned) and read back.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from _limiters import CapAboveSamples

from replay import MinSize, Queue, RateLimiter, SampleToInsertRatio  # noqa: E402
from replay.distributed.routing import (  # noqa: E402
    allowances,
    least_loaded,
    shard_seed,
    shares,
    split_calls,
    split_keys,
)
from replay.distributed.transport import ring_runs  # noqa: E402
from replay.keys import encode_keys  # noqa: E402


def test_a_writer_picks_its_least_loaded_shard_ties_from_its_offset():
    assert least_loaded(np.array([5, 3, 3, 9]), 0) == 1
    assert least_loaded(np.array([5, 3, 3, 9]), 2) == 2
    assert least_loaded(np.zeros(4, np.int64), 3) == 3


def test_shares_follow_the_mass_even_when_it_overflows():
    assert np.allclose(shares(np.array([1.0, 3.0])), [0.25, 0.75])
    assert np.allclose(shares(np.array([np.inf, 1.0, np.inf])), [0.5, 0.0, 0.5])
    big = np.array([1e308, 1e308])  # their sum overflows
    assert np.allclose(shares(big), [0.5, 0.5])


def test_one_shard_splits_a_large_share_into_two_calls():
    assert split_calls(0, 1) == [] and split_calls(15, 1) == [15] and split_calls(33, 1) == [17, 16]
    assert split_calls(33, 2) == [33]


def test_keys_route_back_to_their_shards():
    keys = encode_keys(np.array([1, 0, 1]), np.array([10, 20, 30]), np.array([0, 1, 2]))
    routes = split_keys(keys, 2)
    assert [s for s, _, _ in routes] == [0, 1]
    for s, rows, local in routes:
        assert np.array_equal(local, keys[rows] - s) and (local & 255 == 0).all()
    with pytest.raises(ValueError, match="names shard 1, but the store has shards 0..0"):
        split_keys(keys, 1)


def test_each_allowance_is_the_shards_inserts_plus_its_share_of_the_global_headroom():
    assert math.isinf(MinSize(1).insert_headroom((0, 0, 0)))
    assert allowances(MinSize(1), [{"inserts": 3, "deletes": 0}], 0) == [math.inf]
    limiter = SampleToInsertRatio(1.0, min_size=20, error_buffer=40)  # max_diff 60
    stats = [{"inserts": 10, "deletes": 0}, {"inserts": 30, "deletes": 0}]
    assert limiter.insert_headroom((40, 0, 0)) == 20  # (40 + k + 1) - 0 <= 60 for k = 0..19
    assert allowances(limiter, stats, 0) == [20, 40]
    assert allowances(limiter, stats, 1000) == [10 + 510, 30 + 510]


def test_insert_headroom_counts_the_steps_can_insert_admits_in_a_row():
    # every limiter kind (ratios that round), a subclass with a rule of its own: the count by hand
    rng = np.random.default_rng(0)
    limiters = [
        SampleToInsertRatio(1.0, 20, 40),
        SampleToInsertRatio(0.3, 7, 5.5),
        SampleToInsertRatio(2.7, 3, (-10.0, 13.3)),
        Queue(9),
        RateLimiter(1 / 3, 4, -2.0, 2.0),
        CapAboveSamples(30),
    ]
    for limiter in limiters:
        for _ in range(200):
            inserts, samples = (int(x) for x in rng.integers(0, 60, 2))
            deletes = int(rng.integers(0, inserts + 1))
            k = 0
            while limiter.can_insert((inserts + k, samples, deletes)):
                k += 1
            assert limiter.insert_headroom((inserts, samples, deletes)) == k, (limiter, inserts, samples)
    assert CapAboveSamples(30).insert_headroom((28, 5, 0)) == 7
    assert math.isinf(MinSize(5).insert_headroom((2**62, 0, 0)))
    assert shard_seed(None, 3) is None and shard_seed(7, 0) != shard_seed(7, 1)


def test_ring_runs_merge_overlapping_windows_and_split_wrapped_ones():
    # capacity 10: windows at slots 3..5, 4..7 (overlap), 8..8 (touches), 9..11 (wraps: 9, then 0..1)
    slots, n, dst = np.array([3, 4, 8, 9]), np.array([3, 4, 1, 3]), np.array([0, 1, 0, 2])
    runs, seg = ring_runs(slots, n, dst, 10)
    assert runs.tolist() == [[0, 2], [3, 10]]
    names = ("window", "run", "off", "wdst", "len")
    pieces = sorted(zip(*(seg[k].tolist() for k in names), strict=True))
    assert pieces == [(0, 1, 0, 0, 3), (1, 1, 1, 1, 4), (2, 1, 5, 0, 1), (3, 0, 0, 3, 2), (3, 1, 6, 2, 1)]

"""Rate limiters: Reverb's admission rules in steps, rejected configurations, blocking with timeouts."""

from __future__ import annotations

import logging
import threading

import pytest

from replay.rate_limiter import (
    MinSize,
    Queue,
    RateLimiterState,
    SampleToInsertRatio,
    rate_limiter_from_config,
)


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (lambda: MinSize(0), "min_size"),
        (lambda: SampleToInsertRatio(4.0, 0, 100), "min_size"),
        (lambda: SampleToInsertRatio(4.0, 10, 3.9), "narrower than 2"),  # range 7.8 < 8
        (lambda: SampleToInsertRatio(0.5, 10, 0.9), "narrower than 2"),  # range 1.8 < 2
        (lambda: SampleToInsertRatio(2.0, 10, (100.0, 200.0)), "deadlock"),  # min_diff above spi*min_size
        (lambda: SampleToInsertRatio(0.0, 10, 100), "samples_per_insert"),
        (lambda: SampleToInsertRatio(float("nan"), 10, 100), "samples_per_insert"),
        (lambda: SampleToInsertRatio(1.0, 10, -5), "error_buffer"),
        (lambda: Queue(0), "size"),
    ],
)
def test_deadlock_prone_configurations_are_rejected(make, text):
    with pytest.raises(ValueError, match=text):
        make()


def test_max_diff_below_offset_only_warns(caplog):
    with caplog.at_level(logging.WARNING):
        SampleToInsertRatio(1.0, 10, (-10.0, 5.0))
    assert "deadlock" in caplog.text


def test_capacity_checks():
    with pytest.raises(ValueError, match="exceeds capacity_steps"):
        MinSize(101).check_capacity(100)
    with pytest.raises(ValueError, match="overwritten"):
        Queue(200).check_capacity(100)
    MinSize(100).check_capacity(100)


def test_min_size_rules_count_deletes():
    rl = MinSize(3)
    assert not rl.can_sample((2, 0, 0)) and rl.can_sample((3, 0, 0)) and not rl.can_sample((3, 0, 1))
    assert rl.can_insert((10**9, 0, 0))  # never blocks inserts
    assert rl.can_sample((3, 10**9, 0))  # nor samples once full


def test_sample_to_insert_ratio_rules_match_reverb():
    rl = SampleToInsertRatio(samples_per_insert=2.0, min_size=10, error_buffer=10)  # diff in [10, 30]
    # stage 1: below min_size inserts are free, samples blocked
    assert rl.can_insert((9, 0, 0)) and not rl.can_sample((9, 0, 0))
    # at min_size: diff = 20 -> both allowed
    assert rl.can_sample((10, 0, 0)) and rl.can_insert((10, 0, 0))
    # inserts blocked once (inserts + 1) * 2 - samples > 30
    assert rl.can_insert((14, 0, 0)) and not rl.can_insert((15, 0, 0)) and rl.can_insert((15, 2, 0))
    # samples blocked once inserts * 2 - samples - 1 < 10
    assert rl.can_sample((10, 9, 0)) and not rl.can_sample((10, 10, 0))


def test_queue_rules():
    rl = Queue(3)
    assert not rl.can_sample((0, 0, 0))
    assert rl.can_insert((2, 0, 0)) and not rl.can_insert((3, 0, 0))
    assert rl.can_sample((3, 2, 0)) and not rl.can_sample((3, 3, 0))
    assert rl.can_insert((3, 1, 0))


def test_config_round_trip():
    for rl in (
        MinSize(5),
        SampleToInsertRatio(4.0, 1000, 100_000),
        SampleToInsertRatio(1.0, 3, (-5.0, 5.0)),
        Queue(7),
    ):
        assert rate_limiter_from_config(rl.to_config()) == rl


def test_sample_below_min_size_times_out_with_a_reason():
    state = RateLimiterState(MinSize(5))
    state.insert(4)
    with pytest.raises(TimeoutError, match="4 sampleable steps, fewer than min_size=5"):
        state.await_sample(timeout=0.05)
    with pytest.raises(TimeoutError):
        state.await_sample(timeout=0)


def test_blocked_sampler_wakes_on_insert_without_sleeping():
    state = RateLimiterState(SampleToInsertRatio(1.0, min_size=3, error_buffer=10))
    done = threading.Event()
    errors = []
    entered = threading.Event()

    def sampler():
        try:
            entered.set()
            state.await_sample(timeout=30)
            done.set()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=sampler)
    t.start()
    entered.wait()
    assert not done.is_set()
    state.insert(3)
    t.join(30)
    assert done.is_set() and not errors


def test_blocked_inserter_wakes_on_sample_and_on_cancel():
    state = RateLimiterState(Queue(2))
    state.insert(2)
    with pytest.raises(TimeoutError, match="inserting is ahead of sampling"):
        state.await_insert(timeout=0.02)
    result = []

    def inserter():
        try:
            state.await_insert(timeout=30)
            result.append("ok")
        except ValueError as exc:
            result.append(str(exc))

    t = threading.Thread(target=inserter)
    t.start()
    state.sample(1)
    t.join(30)
    assert result == ["ok"]
    state.insert(1)
    t2 = threading.Thread(target=inserter)
    t2.start()
    state.cancel()
    t2.join(30)
    assert result[-1].endswith("closed")


def test_state_round_trip():
    a = RateLimiterState(SampleToInsertRatio(2.0, 2, 10))
    a.insert(10)
    a.sample(7)
    a.delete(3)
    b = RateLimiterState(SampleToInsertRatio(2.0, 2, 10))
    b.load_state(a.state())
    assert b.state() == {"inserts": 10, "samples": 7, "deletes": 3} and b.size == 7

"""`RateLimiterState.await_sample`'s lock-free admission admits exactly what `RateLimiter.can_sample` plus the
``need`` check admit: MinSize's short cut in `RateLimiter.can_sample` included, and a subclass's own
``can_sample`` obeyed."""

from __future__ import annotations

import itertools

import pytest

from replay.rate_limiter import MinSize, Queue, RateLimiter, RateLimiterState, SampleToInsertRatio


class _Odd(MinSize):
    """A MinSize whose own rule admits only an even number of inserts (its override must be obeyed)."""

    def can_sample(self, counts, n=1):
        return super().can_sample(counts, n) and int(counts[0]) % 2 == 0


LIMITERS = [MinSize(1), MinSize(5), SampleToInsertRatio(2.0, 3, 4.0), Queue(4), _Odd(2)]


@pytest.mark.parametrize("limiter", LIMITERS, ids=lambda r: type(r).__name__)
def test_admission_is_can_sample_and_need(limiter: RateLimiter):
    state = RateLimiterState(limiter)
    grid = itertools.product(range(0, 9), range(0, 12, 3), range(0, 4), (1, 3))
    for inserts, samples, deletes, need in grid:
        state.counters[:3] = (inserts, samples, deletes)
        expect = limiter.can_sample((inserts, samples, deletes)) and inserts - deletes >= need
        try:
            state.await_sample(0.0, need=need)
            admitted = True
        except TimeoutError:
            admitted = False
        assert admitted == expect, (inserts, samples, deletes, need)


def test_a_cancelled_limiter_admits_nothing():
    state = RateLimiterState(MinSize(1))
    state.counters[:4] = (10, 0, 0, 1)
    with pytest.raises(ValueError, match="closed"):
        state.await_sample(0.0)


def test_a_timeout_function_is_asked_only_when_the_sample_waits():
    state = RateLimiterState(MinSize(3))
    asked = []

    def left() -> float:
        asked.append(1)
        return 0.0

    state.counters[:3] = (3, 0, 0)
    state.await_sample(left, given=5.0)
    assert asked == []  # admitted: no clock read
    state.counters[:3] = (2, 0, 0)
    with pytest.raises(TimeoutError, match=r"timeout=5.0"):
        state.await_sample(left, given=5.0)
    assert asked == [1]

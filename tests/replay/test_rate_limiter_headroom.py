"""RateLimiter.insert_headroom's closed form equals the search over can_insert, and subclasses with an
admission rule of their own keep the search.

The closed form (base rule) is compared with `RateLimiter.headroom_by_search` and with `can_insert`
itself: a finite headroom h admits the step at k = h - 1 and refuses the one at k = h (for small
answers: every k counted one by one); ``inf`` admits the step at the int64 limit. Random limiters of
every kind (fractional and tiny or huge ``samples_per_insert``, error buffers, ``(min_diff, max_diff)``
pairs, unbounded ``max_diff``) and counts (below ``min_size``, at the ratio bound and one either side,
near 2**63 - 1).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from _limiters import CapAboveSamples
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from replay.rate_limiter import (
    MAX_STEPS,
    UNLIMITED,
    MinSize,
    Queue,
    RateLimiter,
    SampleToInsertRatio,
)


def counted(limiter: RateLimiter, counts: tuple[int, int, int], cap: int = 2000) -> int | None:
    """can_insert admitted one step at a time from k = 0 (None past ``cap`` steps)."""
    inserts, samples, deletes = counts
    k = 0
    while limiter.can_insert((inserts + k, samples, deletes)):
        k += 1
        if k > cap:
            return None
    return k


def check(limiter: RateLimiter, counts: tuple[int, int, int]) -> None:
    closed = limiter.insert_headroom(counts)
    assert closed == limiter.headroom_by_search(counts), (limiter, counts)
    inserts, samples, deletes = counts
    if math.isinf(closed):
        assert limiter.can_insert((MAX_STEPS - 1, samples, deletes)), (limiter, counts)
        return
    assert isinstance(closed, int) and closed >= 0
    if closed > 0:
        assert limiter.can_insert((inserts + closed - 1, samples, deletes)), (limiter, counts, closed)
    assert not limiter.can_insert((inserts + closed, samples, deletes)), (limiter, counts, closed)
    by_hand = counted(limiter, counts)
    if by_hand is not None:
        assert closed == by_hand, (limiter, counts)


spis = st.one_of(
    st.sampled_from([1.0, 0.5, 0.25, 1 / 3, 0.3, 2.0, 2.7, 3.0, 7.5, 32.0]),
    st.floats(min_value=1e-3, max_value=1e3),
    st.floats(min_value=1e-12, max_value=1e12),
)
small = st.integers(min_value=0, max_value=200)
huge = st.integers(min_value=MAX_STEPS - 2**40, max_value=MAX_STEPS - 1)
counts_ints = st.one_of(small, st.integers(min_value=0, max_value=2**53 + 10), huge)


@st.composite
def limiters(draw: st.DrawFn) -> RateLimiter:
    kind = draw(st.sampled_from(["ratio", "pair", "base", "min_size", "queue"]))
    min_size = draw(st.one_of(st.integers(1, 100), st.integers(1, MAX_STEPS)))
    if kind == "min_size":
        return MinSize(min_size)
    if kind == "queue":
        return Queue(draw(st.one_of(st.integers(1, 100), st.integers(1, MAX_STEPS))))
    spi = draw(spis)
    if kind == "base":  # any bounds, unbounded and inverted ones included
        bound = st.one_of(
            st.floats(-1e6, 1e6), st.floats(-1e300, 1e300), st.sampled_from([UNLIMITED, -UNLIMITED])
        )
        return RateLimiter(spi, min_size, draw(bound), draw(bound))
    try:
        if kind == "ratio":
            buffer = draw(st.one_of(st.floats(0.0, 1e3), st.floats(0.0, 1e18)))
            return SampleToInsertRatio(spi, min_size, buffer)
        lo = draw(st.floats(-1e18, 1e18))
        return SampleToInsertRatio(spi, min_size, (lo, lo + draw(st.floats(0.0, 1e18))))
    except ValueError:
        assume(False)
        raise


@settings(max_examples=800, deadline=None)
@given(limiters(), counts_ints, counts_ints, st.floats(0.0, 1.0))
@example(SampleToInsertRatio(1.0, 20, 40), 40, 0, 0.0)  # by hand: 20
@example(SampleToInsertRatio(0.3, 7, 5.5), 0, 0, 0.0)
@example(Queue(9), 9, 0, 0.0)  # full: 0
@example(MinSize(5), 2**62, 0, 0.0)  # inf
@example(MinSize(5), MAX_STEPS, 0, 0.0)
@example(RateLimiter(1 / 3, 4, -2.0, 2.0), 10, 1, 0.5)
def test_closed_form_equals_the_search(limiter: RateLimiter, inserts: int, samples: int, frac: float) -> None:
    deletes = int(inserts * frac)
    check(limiter, (inserts, samples, deletes))


@settings(max_examples=600, deadline=None)
@given(limiters(), counts_ints, st.integers(-3, 3), st.floats(0.0, 1.0))
def test_at_the_ratio_bound_and_either_side(
    limiter: RateLimiter, samples: int, delta: int, frac: float
) -> None:
    # inserts where the ratio clause flips: n * spi - samples = max_diff, n = inserts + 1
    bound = (limiter.max_diff + samples) / limiter.samples_per_insert
    assume(math.isfinite(bound))
    inserts = int(bound) - 1 + delta
    assume(0 <= inserts <= MAX_STEPS)
    check(limiter, (inserts, samples, int(inserts * frac)))


@settings(max_examples=400, deadline=None)
@given(limiters(), counts_ints, st.integers(-3, 3), st.integers(0, 50))
def test_at_min_size_and_either_side(limiter: RateLimiter, samples: int, delta: int, deletes: int) -> None:
    # the size reaches min_size: inserts - deletes = min_size + delta
    inserts = limiter.min_size + deletes + delta
    assume(0 <= deletes <= inserts <= MAX_STEPS)
    check(limiter, (inserts, samples, deletes))


def test_fractional_ratio_by_hand():
    # samples_per_insert 0.25, min_size 4, max_diff 1.0 + 3: n * 0.25 - 8 <= 4.0 while n <= 48
    limiter = SampleToInsertRatio(0.25, 4, 3.0)
    assert limiter.max_diff == 4.0
    assert limiter.insert_headroom((40, 8, 0)) == 8  # n = 41 .. 48
    assert limiter.insert_headroom((48, 8, 0)) == 0
    assert limiter.insert_headroom((1, 0, 0)) == 15  # the larger: min_size admits n <= 4, the ratio n <= 16
    assert limiter.insert_headroom((100, 8, 99)) == 3  # size 1: min_size admits 3 more


class Renamed(SampleToInsertRatio):
    """The base rule under another name: keeps the closed form."""


class OwnHeadroom(RateLimiter):
    def can_insert(self, counts, n=1):
        return False

    def insert_headroom(self, counts):
        return 0


def test_the_rule_is_chosen_once_per_class():
    assert SampleToInsertRatio.insert_headroom is RateLimiter.insert_headroom
    assert MinSize.insert_headroom is RateLimiter.insert_headroom
    assert Queue.insert_headroom is RateLimiter.insert_headroom
    assert Renamed.insert_headroom is RateLimiter.insert_headroom
    assert CapAboveSamples.insert_headroom is RateLimiter.headroom_by_search
    assert OwnHeadroom.insert_headroom is not RateLimiter.headroom_by_search
    assert CapAboveSamples(30).insert_headroom((28, 5, 0)) == 7  # 28 + k + 1 <= 35
    cap = CapAboveSamples(30)
    for inserts in range(0, 40):
        assert cap.insert_headroom((inserts, 5, 0)) == counted(cap, (inserts, 5, 0))


def test_a_subclass_pickled_by_value_keeps_the_search_in_another_process():
    # a class defined in a function travels by value (cloudpickle, as Ray sends a learner's limiter): the
    # class there is rebuilt from its __dict__, which holds the insert_headroom chosen here
    cloudpickle = pytest.importorskip("cloudpickle")

    def make() -> RateLimiter:
        class Cap(MinSize):
            def can_insert(self, counts, n=1):
                return int(counts[0]) + n <= 30 + int(counts[1])

        return Cap(1)

    code = (
        "import pickle, sys\n"
        "from replay.rate_limiter import RateLimiter\n"
        "lim = pickle.loads(sys.stdin.buffer.read())\n"
        "searched = type(lim).insert_headroom is RateLimiter.headroom_by_search\n"
        "print(searched, lim.insert_headroom((28, 5, 0)))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], input=cloudpickle.dumps(make()), capture_output=True, cwd=root,
        timeout=120, check=True,
    )
    assert out.stdout.decode().split() == ["True", "7"]

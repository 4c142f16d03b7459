"""A rate-limiter subclass's own rule: its refusals are explained by its class and counts, and a restore
checks its own settings (`replay.rate_limiter.RateLimiter.record_settings`), not only ``to_config``.

A subclass overriding ``can_insert`` (``can_sample``) but not ``explain_insert_block``
(``explain_sample_block``) gets ``explain_own_insert_rule`` (``explain_own_sample_rule``) at class
creation, as it gets ``headroom_by_search``; a checkpoint records ``record_settings()`` (by default its
constructor's parameters read back from public attributes of plain types) and ``restore`` refuses a
limiter whose settings differ.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _limiters import fill_until_refused

from replay import MinSize, ReplayStore, SampleToInsertRatio, TrajectorySpec
from replay.limiter_record import limiter_record, restored_limiter
from replay.rate_limiter import Queue, RateLimiter

SPEC = TrajectorySpec({"id": ((), "int64")})
WAIT_S = 0.2  # a refused call's wait


class Cap(MinSize):
    """At most ``cap`` steps ever inserted (``cap`` is not in ``to_config``)."""

    def __init__(self, cap: int, min_size: int = 1) -> None:
        super().__init__(min_size)
        self.cap = cap

    def can_insert(self, counts, n=1):
        return int(counts[0]) + n <= self.cap


class CappedRatio(SampleToInsertRatio):
    """The base ratio rule and at most ``cap`` steps ever inserted."""

    def __init__(self, cap: int) -> None:
        super().__init__(1.0, 1, 10.0)
        self.cap = cap

    def can_insert(self, counts, n=1):
        return super().can_insert(counts, n) and int(counts[0]) + n <= self.cap


class SamplesBehind(MinSize):
    """Samples stay ``lag`` steps behind inserts."""

    def __init__(self, lag: int) -> None:
        super().__init__(1)
        self.lag = lag

    def can_sample(self, counts, n=1):
        return int(counts[1]) + n <= int(counts[0]) - self.lag


class CapSaysWhy(Cap):
    """A subclass that explains its refusals itself."""

    def explain_insert_block(self, counts):
        return f"capped at {self.cap}"


class CapSaysWhyChild(CapSaysWhy):
    def can_insert(self, counts, n=1):
        return int(counts[0]) + n <= self.cap - 1


class Settings(MinSize):
    """Attributes of every kind: record_settings keeps the constructor's parameters of plain types."""

    def __init__(self, cap=None, ratio=None, pair=(1, 2.5), named=None, lock=None) -> None:
        super().__init__(2)
        self.cap = np.int64(7) if cap is None else cap
        self.ratio = np.float32(0.5) if ratio is None else ratio
        self.pair = pair
        self.named = {"a": [1, None, "x"], "b": True} if named is None else named
        self._private = 3
        self.lock = threading.Lock() if lock is None else lock
        self.array = np.zeros(3)

    def can_insert(self, counts, n=1):
        return int(counts[0]) + n <= int(self.cap)


class LockedCap(Cap):
    """Keeps its cap in an attribute of another type: overrides record_settings."""

    def __init__(self, cap: int) -> None:
        super().__init__(cap)
        self.box = np.array([cap])
        del self.cap

    def can_insert(self, counts, n=1):
        return int(counts[0]) + n <= int(self.box[0])

    def record_settings(self):
        return {"cap": int(self.box[0])}


def test_a_subclass_insert_timeout_names_its_class_its_rule_and_the_counts():
    with ReplayStore(SPEC, 100, num_shards=1, rate_limiter=Cap(5)) as store:
        msg = fill_until_refused(store, 10, WAIT_S)
    assert msg is not None
    assert "Cap.can_insert is False for one more step at inserts=5, samples=0, deletes=0 (size 5)" in msg
    assert f"{__name__}.Cap" in msg and "record_settings() {'cap': 5}" in msg
    assert "ahead of sampling" not in msg and "max_diff" not in msg  # not the base rule's clauses


def test_the_base_rule_is_explained_too_where_it_refuses_as_well():
    limiter = CappedRatio(100)  # the ratio clause: inserts - samples <= 1 + 10
    own = limiter.explain_insert_block((11, 0, 0))
    assert "CappedRatio.can_insert is False" in own and "inserting is ahead of sampling" in own
    capped = CappedRatio(3)
    only_cap = capped.explain_insert_block((3, 0, 0))  # the ratio admits, the cap refuses
    assert capped.can_insert((3, 0, 0)) is False and RateLimiter.can_insert(capped, (3, 0, 0))
    assert "CappedRatio.can_insert is False" in only_cap and "ahead of sampling" not in only_cap


def test_a_subclass_sample_timeout_names_its_can_sample():
    with ReplayStore(SPEC, 100, num_shards=1, rate_limiter=SamplesBehind(3)) as store:
        assert fill_until_refused(store, 3, WAIT_S) is None
        with pytest.raises(TimeoutError) as info:
            store.sample(1, window=1, timeout=WAIT_S)
    msg = str(info.value)
    assert "SamplesBehind.can_sample is False for one more step at inserts=3, samples=0, deletes=0" in msg
    assert "record_settings() {'lag': 3}" in msg
    assert "the base RateLimiter rule" not in msg  # size 3 >= min_size 1: the base rule admits
    assert "SamplesBehind.can_sample" not in SamplesBehind(3).explain_insert_block((3, 0, 0))


def test_a_subclass_that_explains_itself_keeps_its_explanation_and_builtins_keep_theirs():
    assert CapSaysWhy(4).explain_insert_block((4, 0, 0)) == "capped at 4"
    assert CapSaysWhyChild(4).explain_insert_block((3, 0, 0)) == "capped at 4"  # inherited, kept
    for cls in (MinSize, SampleToInsertRatio, Queue):
        assert cls.explain_insert_block is RateLimiter.explain_insert_block
        assert cls.explain_sample_block is RateLimiter.explain_sample_block
    assert Cap.explain_sample_block is RateLimiter.explain_sample_block  # can_sample is MinSize's
    msg = Queue(2).explain_insert_block((2, 0, 0))
    assert msg.startswith("inserting is ahead of sampling: 2 steps inserted for 0 sampled")


def test_record_settings_keeps_the_constructors_plain_parameters():
    assert Settings().record_settings() == {
        "cap": 7, "named": {"a": [1, None, "x"], "b": True}, "pair": [1, 2.5], "ratio": 0.5,
    }
    assert type(Settings().record_settings()["cap"]) is int
    assert Cap(20).record_settings() == {"cap": 20}
    assert LockedCap(9).record_settings() == {"cap": 9}
    assert limiter_record(Cap(20))["settings"] == {"cap": 20}
    assert "settings" not in limiter_record(SampleToInsertRatio(2.0, 1, 10.0))  # built-ins: to_config
    assert Cap(20) == Cap(20) and Cap(20) != Cap(1000) and hash(Cap(20)) == hash(Cap(1000))
    assert LockedCap(9) == LockedCap(9) and LockedCap(9) != LockedCap(8)


def test_a_restore_refuses_the_recorded_class_with_other_settings(tmp_path):
    with ReplayStore(SPEC, 100, num_shards=1, rate_limiter=Cap(4)) as store:
        assert fill_until_refused(store, 10, WAIT_S) is not None
        store.checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"record_settings\(\) \{'cap': 1000\}, the checkpoint's .*Cap had "
                       r"\{'cap': 4\}"):
        ReplayStore.restore(tmp_path, rate_limiter=Cap(1000))
    with pytest.raises(ValueError, match=r"its record_settings\(\) \{'cap': 4\}"):
        ReplayStore.restore(tmp_path)
    with ReplayStore.restore(tmp_path, rate_limiter=Cap(4)) as store:
        assert len(store) == 4 and fill_until_refused(store, 2, WAIT_S) is not None  # the cap still binds


def test_an_overridden_record_settings_is_what_is_compared():
    record = limiter_record(LockedCap(9))
    assert restored_limiter(record, LockedCap(9), "restore").record_settings() == {"cap": 9}
    with pytest.raises(ValueError, match="record_settings"):
        restored_limiter(record, LockedCap(8), "restore")


def test_a_record_without_settings_is_checked_on_class_and_config():
    record = limiter_record(Cap(20))
    del record["settings"]  # a checkpoint written before settings were recorded
    given = Cap(1000)
    assert restored_limiter(record, given, "restore") is given
    with pytest.raises(ValueError, match="is not the checkpoint's"):
        restored_limiter(record, Cap(20, min_size=2), "restore")

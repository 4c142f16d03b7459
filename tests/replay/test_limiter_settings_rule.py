"""A rate-limiter subclass's recorded settings are its settings, not its state
(`replay.rate_limiter.RateLimiter.record_settings`).

By default ``record_settings()`` is the constructor's parameters (of every ``__init__`` between the class
and `RateLimiter`) read back from public attributes of the same names holding plain values; a public
counter the limiter keeps is state: not recorded, not compared by ``==`` or a restore. An override's result
is checked once, by ``plain_settings()``: anything but a dict of plain values is a ``ValueError`` naming
the class and ``record_settings``. ``hash`` is over the class and ``to_config``, so equal limiters hash
equal whatever their state.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from _limiters import fill_until_refused

from replay import MinSize, ReplayStore, TrajectorySpec
from replay.limiter_record import limiter_record, restored_limiter

SPEC = TrajectorySpec({"id": ((), "int64")})
WAIT_S = 0.2


class Counting(MinSize):
    """Caps inserts at ``cap`` and counts its refusals in a public attribute (state)."""

    def __init__(self, cap: int, label: str = "x", *, min_size: int = 1) -> None:
        super().__init__(min_size)
        self.cap = cap
        self.label = label
        self.refusals = 0
        self.seen = [0, 0]

    def can_insert(self, counts, n=1):
        ok = int(counts[0]) + n <= self.cap
        self.refusals += not ok
        return ok


class Tagged(Counting):
    """Adds a parameter of its own; its parent's parameters are still recorded."""

    def __init__(self, cap: int, tag: tuple = (1, 2)) -> None:
        super().__init__(cap, "tagged")
        self.tag = tag


class Renamed(MinSize):
    """Keeps its parameter under another name: records nothing by default, so it overrides."""

    def __init__(self, limit: int) -> None:
        super().__init__(1)
        self._limit = limit

    def record_settings(self):
        return {"limit": self._limit}


class ArraySettings(MinSize):
    """An override returning an array: refused by plain_settings."""

    def __init__(self) -> None:
        super().__init__(1)
        self._caps = np.array([5, 6])

    def record_settings(self):
        return {"caps": self._caps}


class ListSettings(MinSize):
    def record_settings(self):
        return [("caps", 5)]


def test_the_default_records_constructor_parameters_not_state():
    limiter = Counting(np.int64(5), min_size=2)
    limiter.refusals = 3
    limiter.seen.append(1)
    assert limiter.record_settings() == {"cap": 5, "label": "x"}  # min_size is to_config's
    assert type(limiter.plain_settings()["cap"]) is int
    assert Tagged(4).record_settings() == {"cap": 4, "label": "tagged", "tag": [1, 2]}
    assert Renamed(3).record_settings() == {"limit": 3}
    assert MinSize(3).record_settings() == {}


def test_state_does_not_change_equality_and_equal_limiters_hash_equal():
    a, b = Counting(5), Counting(5)
    b.refusals = 7
    assert a == b and hash(a) == hash(b)
    assert a != Counting(6) and a != Counting(5, "y") and a != Tagged(5)
    assert hash(a) == hash(Counting(6))  # hash over class and to_config: a changed setting keeps it
    assert len({a, b, Counting(6)}) == 2


def test_a_fresh_instance_restores_a_checkpoint_written_after_refusals(tmp_path):
    limiter = Counting(3)
    with ReplayStore(SPEC, 64, num_shards=1, rate_limiter=limiter) as store:
        fill_until_refused(store, 6, WAIT_S)
        assert limiter.refusals > 0 or store.rate_limiter.refusals > 0
        store.checkpoint(tmp_path)
    with ReplayStore.restore(tmp_path, rate_limiter=Counting(3)) as store:
        assert len(store) == 3
    with pytest.raises(ValueError, match=r"record_settings\(\) \{'cap': 4, 'label': 'x'\}, the checkpoint's "
                       r".*Counting had \{'cap': 3, 'label': 'x'\}.*override record_settings"):
        ReplayStore.restore(tmp_path, rate_limiter=Counting(4))


def test_a_bad_override_is_a_value_error_naming_the_class_and_record_settings(tmp_path):
    name = re.escape(f"{__name__}.ArraySettings.record_settings()")
    with pytest.raises(ValueError, match=rf"{name} returned caps=array\(\[5, 6\]\) of type ndarray"):
        limiter_record(ArraySettings())
    with pytest.raises(ValueError, match=r"ArraySettings\.record_settings\(\)"):
        _ = ArraySettings() == ArraySettings()
    with pytest.raises(ValueError, match=r"ListSettings\.record_settings\(\) returned list"):
        ListSettings().plain_settings()
    with ReplayStore(SPEC, 64, num_shards=1, rate_limiter=ArraySettings()) as store:
        fill_until_refused(store, 1, WAIT_S)
        with pytest.raises(ValueError, match=r"ArraySettings\.record_settings\(\)"):
            store.checkpoint(tmp_path)


def test_the_record_round_trips_through_json():
    record = limiter_record(Tagged(np.int32(4)))
    assert record["settings"] == {"cap": 4, "label": "tagged", "tag": [1, 2]}
    again = json.loads(json.dumps(record))
    given = Tagged(4)
    assert restored_limiter(again, given, "restore") is given
    with pytest.raises(ValueError, match="override record_settings"):
        restored_limiter(again, Tagged(4, (1, 3)), "restore")

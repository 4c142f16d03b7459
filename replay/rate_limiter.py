"""Rate limiters: when inserts and samples may proceed, as in Reverb, counted in steps.

See docs/architecture.md#replay-composition.

Units: an *insert* is one step committed to the store; a *sample* counts the real (unpadded) steps of
the windows drawn, so ``samples_per_insert`` is the replay ratio per step. The *size* is the number of
items that can be drawn: ``inserts - deletes``, where a delete is an item overwritten by the ring or
removed by ``max_times_sampled``.

With ``diff = inserts * samples_per_insert - samples``:

- a sample may proceed when ``size >= min_size`` and ``diff - 1 >= min_diff``;
- an insert may proceed while ``size + 1 <= min_size`` (filling up), or when
  ``(inserts + 1) * samples_per_insert - samples <= max_diff``.

A call is admitted when the limiter would admit one step, then charged all its steps (a batch of
windows, or a writer's chunk), exactly as Reverb admits one item at a time. So no batch or chunk size
can deadlock the limiter; the ratio holds to within the error buffer plus one call's steps (plus one
call per concurrent caller).

Blocking admission over live counters (waits with deadlines, counting, checkpointed counters) is
`replay.limiter_state.RateLimiterState`, re-exported here with the counters' indices; a ``TimeoutError``
there says why in the limiter's own words (`RateLimiter.explain_insert_block` / `explain_sample_block`).

Rejected configurations (``ValueError``), after Reverb's ``rate_limiters.py``: ``min_size < 1``;
``samples_per_insert`` not finite and > 0; an error buffer narrower than ``2 * max(1,
samples_per_insert)`` (it could block both sides for good); a ``min_diff`` above ``samples_per_insert *
min_size`` (deadlock as soon as ``min_size`` steps are in); ``Queue(size < 1)``. The store also rejects
``min_size`` above its capacity (never reachable). As in Reverb, ``max_diff`` below
``samples_per_insert * min_size`` only logs a warning (it deadlocks only if nothing samples
concurrently).

References
----------
DeepMind Reverb: ``reverb/rate_limiters.py`` (MinSize, SampleToInsertRatio, Queue) and
``reverb/cc/rate_limiter.cc`` (CanInsert, CanSample, checkpointed counters).
"""

from __future__ import annotations

import inspect
import logging
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replay.limiter_state import CANCELLED, DELETES, INSERTS, SAMPLES, RateLimiterState

__all__ = [
    "CANCELLED",
    "DELETES",
    "INSERTS",
    "SAMPLES",
    "MinSize",
    "Queue",
    "RateLimiter",
    "RateLimiterState",
    "SampleToInsertRatio",
    "UNLIMITED",
    "rate_limiter_from_config",
]

logger = logging.getLogger(__name__)

UNLIMITED = sys.float_info.max  # a bound that never binds (MinSize's min_diff / max_diff)
MAX_STEPS = 2**63 - 1  # the counters are int64


def _steps(name: str, value: Any) -> int:
    """A count of steps in [1, 2**63 - 1]: TypeError for a non-int (bools included), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int (steps), got {type(value).__name__} {value!r}")
    if not 1 <= value <= MAX_STEPS:
        raise ValueError(f"{name} must be in [1, {MAX_STEPS}] (steps), got {value}")
    return int(value)


def _last_true(pred: Callable[[int], bool], lo: int, hi: int, up: bool) -> int:
    """The last n in [lo, hi) where ``pred`` holds, for a ``pred`` true then false as n grows, true at
    ``lo`` and false at ``hi``: gallops up from ``lo`` (``up``) or down from ``hi``, then bisects, so
    O(log d) calls for an answer d from where it starts."""
    step = 1
    if up:
        while lo + step < hi:
            if not pred(lo + step):
                hi = lo + step
                break
            lo += step
            step *= 2
    else:
        while hi - step > lo:
            if pred(hi - step):
                lo = hi - step
                break
            hi -= step
            step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pred(mid) else (lo, mid)
    return lo


_INIT_FIELDS = frozenset({"samples_per_insert", "min_size", "min_diff", "max_diff"})  # RateLimiter.__init__'s
_NOT_PLAIN = object()


def _plain_value(value: Any) -> Any:
    """``value`` as plain JSON-able data (numpy scalars as Python numbers, tuples as lists), or
    ``_NOT_PLAIN``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic) and isinstance(value.item(), (bool, int, float, str)):
        return value.item()
    if isinstance(value, (list, tuple)):
        items = [_plain_value(v) for v in value]
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        out = {k: _plain_value(v) for k, v in value.items()}
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in out.values()) else out
    return _NOT_PLAIN


class RateLimiter:
    """A rate-limiter configuration: ``samples_per_insert``, ``min_size``, ``min_diff``, ``max_diff``.

    Use `MinSize`, `SampleToInsertRatio` or `Queue`; see the module docstring for the rules.
    """

    kind = "base"

    def __init__(self, samples_per_insert: float, min_size: int, min_diff: float, max_diff: float) -> None:
        min_size = _steps("min_size", min_size)
        if (
            not isinstance(samples_per_insert, (int, float))
            or not math.isfinite(samples_per_insert)
            or samples_per_insert <= 0
        ):
            raise ValueError(f"samples_per_insert must be finite and > 0, got {samples_per_insert!r}")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size = int(min_size)
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)

    def can_insert(self, counts: Sequence[int], n: int = 1) -> bool:
        """Whether ``n`` more steps may be inserted given ``counts = (inserts, samples, deletes)``."""
        inserts, samples, deletes = int(counts[0]), int(counts[1]), int(counts[2])
        if inserts + n - deletes <= self.min_size:
            return True
        return (inserts + n) * self.samples_per_insert - samples <= self.max_diff

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass with an admission rule of its own (a `can_insert` override) that keeps the base
        `insert_headroom` gets `headroom_by_search` as its `insert_headroom`, once, here: the closed
        form holds for the base rule only. Likewise the messages: a `can_insert` (`can_sample`)
        override that keeps the base `explain_insert_block` (`explain_sample_block`) gets
        `explain_own_insert_rule` (`explain_own_sample_rule`), which names the class and the counts its
        rule refused, not the base rule's clauses."""
        super().__init_subclass__(**kwargs)
        own_rule = cls.can_insert is not RateLimiter.can_insert
        if own_rule and cls.insert_headroom is RateLimiter.insert_headroom:
            cls.insert_headroom = RateLimiter.headroom_by_search  # type: ignore[method-assign]
        if own_rule and cls.explain_insert_block is RateLimiter.explain_insert_block:
            cls.explain_insert_block = RateLimiter.explain_own_insert_rule  # type: ignore[method-assign]
        own_sample_rule = cls.can_sample is not RateLimiter.can_sample
        if own_sample_rule and cls.explain_sample_block is RateLimiter.explain_sample_block:
            cls.explain_sample_block = RateLimiter.explain_own_sample_rule  # type: ignore[method-assign]

    def insert_headroom(self, counts: Sequence[int]) -> float:
        """Steps that may be inserted one after another given ``counts = (inserts, samples, deletes)``.

        The number of k = 0, 1, ... in a row for which `can_insert` admits a step at ``(inserts + k,
        samples, deletes)`` (a subclass's rule included: see `headroom_by_search`), ``math.inf`` when it
        admits up to 2**63 - 1 inserts (`MinSize`). The Ray store splits it over its S shards in whole
        steps (`replay.distributed.routing.headroom_shares`; a shard's allowance is its inserts plus its
        share, `routing.allowance_steps`) and a shard admits a shipment while its inserts are below its
        allowance, then charges all its steps: a headroom H admits fewer than ``H + S * m`` steps (m the
        largest shipment), where the local store, admitting a call while one step is admitted, admits
        fewer than ``H + m``.

        For the base rule, in closed form: the ``min_size`` clause admits the first ``min_size -
        inserts + deletes`` steps; the ratio clause ``n * samples_per_insert - samples <= max_diff`` (n
        = inserts + k + 1, evaluated in floating point exactly as `can_insert` does) holds for n up to
        about ``(max_diff + samples) / samples_per_insert``, its last n found from that guess by a
        galloping search on the clause itself (it is monotone in n: rounding is), so float rounding
        near the bound and at huge counts gives `can_insert`'s answer; the headroom is the larger
        count. Two evaluations of the clause where the guess is exact.
        """
        inserts, samples, deletes = int(counts[0]), int(counts[1]), int(counts[2])
        spi, max_diff = self.samples_per_insert, self.max_diff
        # the last total n of inserts in (lo, hi) the ratio clause admits; lo: none; hi: past the end
        lo, hi = inserts, max(MAX_STEPS, inserts + 1) + 1
        guess = (max_diff + samples) / spi
        n = int(guess) if lo < guess < hi else (hi - 1 if guess >= hi else lo + 1)  # NaN: lo + 1
        if n <= lo:
            n = lo + 1
        if n * spi - samples <= max_diff:  # exactly can_insert's clause
            if n + 1 < hi and (n + 1) * spi - samples <= max_diff:  # the guess fell short (rounding)
                n = _last_true(lambda m: m * spi - samples <= max_diff, n + 1, hi, up=True)
        elif n - 1 > lo:  # the guess overshot (rounding)
            n = n - 1 if (n - 1) * spi - samples <= max_diff else (
                _last_true(lambda m: m * spi - samples <= max_diff, lo, n - 1, up=False)
            )
        else:
            n = lo
        admitted = max(self.min_size - inserts + deletes, n - inserts)
        if admitted <= 0:
            return 0
        return math.inf if admitted > MAX_STEPS - 1 - inserts else admitted

    def headroom_by_search(self, counts: Sequence[int]) -> float:
        """`insert_headroom` counted from `can_insert` alone: the one a subclass with an admission rule
        of its own gets (`__init_subclass__`); equal to the closed form for the base rule.

        Its `can_insert` must admit no step once it refuses one as inserts grow, and must admit ``n``
        steps at once exactly when it admits each of them one after another. O(log) calls: doubling,
        then bisection; ``math.inf`` after two calls when it admits every step up to 2**63 - 1 inserts.
        """
        inserts, samples, deletes = int(counts[0]), int(counts[1]), int(counts[2])

        def admits(k: int) -> bool:
            return self.can_insert((inserts + k, samples, deletes), 1)

        if not admits(0):
            return 0
        lo, limit = 0, MAX_STEPS - 1 - inserts  # admits(lo); past limit the counters would overflow
        if admits(limit):  # admits every step up to the limit (no step once one is refused)
            return math.inf
        while True:
            if lo >= limit:
                return math.inf
            hi = min(2 * lo + 1, limit)
            if not admits(hi):
                break
            lo = hi
        while hi - lo > 1:  # admits(lo), not admits(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if admits(mid) else (lo, mid)
        return lo + 1

    def can_sample(self, counts: Sequence[int], n: int = 1) -> bool:
        """Whether ``n`` more steps may be sampled given ``counts = (inserts, samples, deletes)``."""
        inserts, deletes = int(counts[0]), int(counts[2])
        if inserts - deletes < self.min_size:
            return False
        if self.min_diff == -UNLIMITED:  # MinSize: the ratio never binds (counts are int64)
            return True
        return inserts * self.samples_per_insert - int(counts[1]) - n >= self.min_diff

    def check_capacity(self, capacity_steps: int) -> None:
        """Reject a ``min_size`` the store can never hold.

        Raises
        ------
        ValueError
            ``min_size > capacity_steps``.
        """
        if self.min_size > capacity_steps:
            raise ValueError(
                f"min_size={self.min_size} exceeds capacity_steps={capacity_steps}: sampling could never "
                "start; lower min_size or raise capacity_steps"
            )

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "samples_per_insert": self.samples_per_insert,
            "min_size": self.min_size,
            "min_diff": self.min_diff,
            "max_diff": self.max_diff,
        }

    def record_settings(self) -> dict[str, Any]:
        """A subclass's settings beyond `to_config`, which a checkpoint records and a restore compares
        (`replay.limiter_record`), and `==` compares.

        The rule: settings, not state. By default the parameters of the subclasses' ``__init__``
        (every class between ``type(self)`` and `RateLimiter`), each read back from the public attribute of
        the same name where there is one holding a plain value (bool, int, float, str, None, numpy scalars,
        and lists, tuples and str-keyed dicts of them); `RateLimiter.__init__`'s fields are left out
        (`to_config` holds them). Attributes that are not constructor parameters (a counter such as
        ``self.refusals``) are state and not recorded, so a fresh instance built with the same arguments
        restores a checkpoint and equals the limiter. Override it where a setting is kept under another
        name or type; return a dict of plain values (`plain_settings` refuses others). The built-in
        limiters record none."""
        names: list[str] = []
        for cls in type(self).__mro__:
            if cls is RateLimiter:
                break
            init = vars(cls).get("__init__")
            if init is None:
                continue
            for param in list(inspect.signature(init).parameters.values())[1:]:
                named = param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
                if named and param.name not in names:
                    names.append(param.name)
        own = vars(self)
        return {
            name: plain
            for name in sorted(names)
            if not name.startswith("_") and name not in _INIT_FIELDS and name in own
            for plain in [_plain_value(own[name])]
            if plain is not _NOT_PLAIN
        }

    def plain_settings(self) -> dict[str, Any]:
        """`record_settings`, checked and as plain JSON data (numpy scalars as Python numbers, tuples as
        lists): what a checkpoint records, a restore and `==` compare.

        Raises
        ------
        ValueError
            ``record_settings()`` (an override) returned something other than a dict of str keys and
            plain values: the message names the class, the key and the value's type.
        """
        settings = self.record_settings()
        where = f"{type(self).__module__}.{type(self).__qualname__}.record_settings()"
        if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
            raise ValueError(
                f"{where} returned {type(settings).__name__} {settings!r}; return a dict with str keys"
            )
        out: dict[str, Any] = {}
        for key, value in settings.items():
            plain = _plain_value(value)
            if plain is _NOT_PLAIN:
                raise ValueError(
                    f"{where} returned {key}={value!r} of type {type(value).__name__}, not a plain JSON "
                    "value (bool, int, float, str, None, numpy scalars, lists/tuples/str-keyed dicts of "
                    "them): return plain values (e.g. array.tolist())"
                )
            out[key] = plain
        return out

    def __eq__(self, other: object) -> bool:
        """Same class, `to_config` and `plain_settings` (what a checkpoint's restore compares); state that
        `record_settings` leaves out does not count."""
        return (
            type(other) is type(self)
            and other.to_config() == self.to_config()  # type: ignore[union-attr]
            and other.plain_settings() == self.plain_settings()  # type: ignore[union-attr]
        )

    def __hash__(self) -> int:
        """Over the class and `to_config` only: equal limiters have equal `to_config`, so equal hashes, and
        a setting changed after the limiter went into a set or dict leaves its hash as it was."""
        return hash((type(self).__qualname__, tuple(self.to_config().items())))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(samples_per_insert={self.samples_per_insert}, min_size={self.min_size}, "
            f"min_diff={self.min_diff}, max_diff={self.max_diff})"
        )

    # -- messages
    def explain_sample_block(self, counts: Sequence[int]) -> str:
        inserts, samples, deletes = (int(c) for c in counts[:3])
        size = inserts - deletes
        if size < self.min_size:
            return (
                f"the store holds {size} sampleable steps, fewer than min_size={self.min_size}: insert more "
                "steps (are the writers running?) or lower min_size"
            )
        return (
            f"sampling is ahead of inserting: {samples} steps sampled for {inserts} inserted at "
            f"samples_per_insert={self.samples_per_insert} (min_diff={self.min_diff}); insert more steps or "
            "widen error_buffer"
        )

    def explain_insert_block(self, counts: Sequence[int]) -> str:
        inserts, samples = int(counts[0]), int(counts[1])
        return (
            f"inserting is ahead of sampling: {inserts} steps inserted for {samples} sampled at "
            f"samples_per_insert={self.samples_per_insert} (max_diff={self.max_diff}); sample more or widen "
            "error_buffer / the queue size"
        )

    def _explain_own_rule(self, side: str, counts: Sequence[int], base_refuses: bool, base: str) -> str:
        inserts, samples, deletes = (int(c) for c in counts[:3])
        name = type(self).__qualname__
        own_repr = type(self).__repr__ is not RateLimiter.__repr__
        what = (
            repr(self) if own_repr
            else f"to_config() {self.to_config()}, record_settings() {self.plain_settings()}"
        )
        text = (
            f"the rate limiter's own rule refuses: {name}.{side} is False for one more step at "
            f"inserts={inserts}, samples={samples}, deletes={deletes} (size {inserts - deletes}); "
            f"{type(self).__module__}.{name} with {what}"
        )
        return text + (f"; the base RateLimiter rule refuses too: {base}" if base_refuses else "")

    def explain_own_insert_rule(self, counts: Sequence[int]) -> str:
        """`explain_insert_block` of a subclass whose `can_insert` is its own (`__init_subclass__`): its
        class, the counts its ``can_insert`` refused, and the base rule's explanation where that refuses
        too (a rule built on ``super().can_insert``)."""
        base_refuses = not RateLimiter.can_insert(self, counts)
        base = RateLimiter.explain_insert_block(self, counts) if base_refuses else ""
        return self._explain_own_rule("can_insert", counts, base_refuses, base)

    def explain_own_sample_rule(self, counts: Sequence[int]) -> str:
        """`explain_sample_block` of a subclass whose `can_sample` is its own (`__init_subclass__`): as
        `explain_own_insert_rule`, for ``can_sample``."""
        base_refuses = not RateLimiter.can_sample(self, counts)
        base = RateLimiter.explain_sample_block(self, counts) if base_refuses else ""
        return self._explain_own_rule("can_sample", counts, base_refuses, base)


class MinSize(RateLimiter):
    """Block sampling until the store holds ``min_size`` steps; never block inserts.

    Parameters
    ----------
    min_size : int
        Steps, >= 1.

    Raises
    ------
    ValueError
        ``min_size < 1``.
    """

    kind = "min_size"

    def __init__(self, min_size: int = 1) -> None:
        super().__init__(1.0, min_size, -UNLIMITED, UNLIMITED)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "min_size": self.min_size}


class SampleToInsertRatio(RateLimiter):
    """Keep ``samples / inserts`` near ``samples_per_insert`` once ``min_size`` steps are in.

    Parameters
    ----------
    samples_per_insert : float
        Sampled steps per inserted step (the replay ratio), finite and > 0.
    min_size : int
        Steps before sampling starts, >= 1.
    error_buffer : float or (float, float)
        A number: ``diff`` may stray ``error_buffer`` either side of ``samples_per_insert * min_size``;
        a pair: ``(min_diff, max_diff)`` used as is.

    Raises
    ------
    ValueError
        ``min_size < 1``, a bad ``samples_per_insert``, a range narrower than ``2 * max(1,
        samples_per_insert)``, or ``min_diff > samples_per_insert * min_size`` (deadlock).

    References
    ----------
    Reverb's ``SampleToInsertRatio`` and its validation.
    """

    kind = "sample_to_insert_ratio"

    def __init__(
        self, samples_per_insert: float, min_size: int, error_buffer: float | tuple[float, float]
    ) -> None:
        if isinstance(error_buffer, (int, float)) and not isinstance(error_buffer, bool):
            if not math.isfinite(error_buffer) or error_buffer < 0:
                raise ValueError(f"error_buffer must be finite and >= 0, got {error_buffer!r}")
            offset = (
                float(samples_per_insert) * min_size if isinstance(samples_per_insert, (int, float)) else 0.0
            )
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        elif isinstance(error_buffer, (tuple, list)) and len(error_buffer) == 2:
            min_diff, max_diff = (float(x) for x in error_buffer)
        else:
            raise TypeError(
                f"error_buffer must be a number or a (min_diff, max_diff) pair, got {error_buffer!r}"
            )
        super().__init__(samples_per_insert, min_size, min_diff, max_diff)
        spi = self.samples_per_insert
        if max_diff - min_diff < 2 * max(1.0, spi):
            raise ValueError(
                f"error_buffer gives the range [{min_diff}, {max_diff}], narrower than 2 * max(1, "
                f"samples_per_insert) = {2 * max(1.0, spi)}: it could block both inserts and samples for good"
            )
        if min_diff > spi * self.min_size:
            raise ValueError(
                f"min_diff={min_diff} is above samples_per_insert * min_size = {spi * self.min_size}: "
                "sampling would deadlock as soon as min_size steps are in"
            )
        if max_diff < spi * self.min_size:
            logger.warning(
                "max_diff=%s is below samples_per_insert * min_size = %s: unless samples run "
                "concurrently with inserts this deadlocks once min_size steps are in",
                max_diff,
                spi * self.min_size,
            )

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "samples_per_insert": self.samples_per_insert,
            "min_size": self.min_size,
            "error_buffer": [self.min_diff, self.max_diff],
        }


class Queue(RateLimiter):
    """A queue of ``size`` steps: inserts block when ``size`` unsampled steps wait, samples when none do.

    Use with `replay.selectors.Fifo` and ``max_times_sampled=1`` (and windows of one step) for exact
    queue semantics.

    Parameters
    ----------
    size : int
        Steps, >= 1.

    Raises
    ------
    TypeError
        ``size`` not an int (bools included).
    ValueError
        ``size`` not in [1, 2**63 - 1].
    """

    kind = "queue"

    def __init__(self, size: int) -> None:
        size = _steps("Queue size", size)
        super().__init__(1.0, 1, 0.0, float(size))
        self.size = int(size)

    def check_capacity(self, capacity_steps: int) -> None:
        super().check_capacity(capacity_steps)
        if self.size > capacity_steps:
            raise ValueError(
                f"Queue(size={self.size}) exceeds capacity_steps={capacity_steps}: unsampled steps "
                "would be overwritten"
            )

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "size": self.size}


def rate_limiter_from_config(config: dict[str, Any]) -> RateLimiter:
    """The rate limiter described by ``config`` (from `RateLimiter.to_config`).

    Raises
    ------
    ValueError
        An unknown kind or invalid settings.
    """
    config = dict(config)
    kind = config.pop("kind", None)
    if kind == "min_size":
        return MinSize(**config)
    if kind == "sample_to_insert_ratio":
        eb = config.pop("error_buffer")
        return SampleToInsertRatio(error_buffer=tuple(eb) if isinstance(eb, list) else eb, **config)
    if kind == "queue":
        return Queue(**config)
    if kind == "base":
        return RateLimiter(**config)
    raise ValueError(f"unknown rate limiter kind {kind!r}")

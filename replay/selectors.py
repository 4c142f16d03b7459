"""Selectors: which stored items a sample draws, in Reverb's vocabulary.

An *item* is one stored step, the anchor of a window (see `replay.windows`), with a priority, a use
count and a state (empty, live, or exhausted by ``max_times_sampled``).

Selectors
---------
`Uniform`
    Every live item equally likely.
`Prioritized` (exponent)
    Item i drawn with probability ``p_i ** exponent / sum_j p_j ** exponent`` from a sum tree
    (vectorised numba kernels: O(log C) per draw or update). If every live item has priority 0, draws
    are uniform over the live items (and probabilities say so).
`Fifo`, `Lifo`; `MinHeap`, `MaxHeap`
    The oldest / newest live item (commit order across shards); lowest / highest priority (ties: oldest).

Batches behave as if drawn from one table holding every shard's items, one draw after another:
for the sum-tree selectors the shard of each row is drawn in proportion to its live items (Uniform)
or its priority mass (Prioritized), then the item within the shard; the deterministic selectors compare
the best item of every shard. With ``max_times_sampled = m > 0`` an item is removed once drawn m times,
and the next draws of the same batch no longer see it (rejection of the rows that would exceed m is
exactly the sequential distribution, since removing an item only renormalises the others). Without
it (``m = 0``) a deterministic selector returns the same item for every row of a batch, as Reverb's.

Priorities must be finite and >= 0 (`check_priorities`). New items get ``initial_priority``: a number,
or ``"max"`` (default) for the largest priority seen so far (1.0 before any), as in PER.

These classes are plain, picklable settings; the sampling state they configure (priorities, use
counts, trees) is `replay.selector_state.SelectorState`, its kernels `replay.sumtree`. A new selector
is a config class here (its ``kind``, ``deterministic``, ``prioritized``; registered in ``_KINDS``),
its draw in `SelectorState.sample` (a deterministic one: its key in `SelectorState.key_of`, which
refuses a kind it does not know), and any new kernel in `replay.sumtree`; see
docs/architecture.md#replay-composition.

References
----------
DeepMind Reverb: ``reverb.selectors`` and the table's ``max_times_sampled``. Schaul et al.,
"Prioritized Experience Replay", ICLR 2016: proportional prioritisation on a sum tree, new
transitions at maximal priority, importance weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Fifo",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "Prioritized",
    "Selector",
    "Uniform",
    "check_priorities",
    "selector_from_config",
]

def check_priorities(priorities: Any, n: int | None = None, what: str = "priorities") -> np.ndarray:
    """Return ``priorities`` as float64 [n], or raise if any is NaN, infinite or negative.

    Raises
    ------
    ValueError
        A NaN, infinite or negative value (the message counts them and shows the first), or a
        length other than ``n``.
    """
    p = np.asarray(
        priorities.detach().cpu().numpy() if hasattr(priorities, "detach") else priorities, dtype=np.float64
    ).reshape(-1)
    if n is not None and p.size != n:
        raise ValueError(f"{what}: expected {n} values, got {p.size}")
    bad = ~np.isfinite(p) | (p < 0)
    if bad.any():
        idx = np.flatnonzero(bad)
        raise ValueError(
            f"{what}: {idx.size} of {p.size} are NaN, infinite or negative (first: {p[idx[0]]} at index "
            f"{idx[0]}); priorities must be finite and >= 0. Nothing was changed."
        )
    return p


# ------------------------------------------------------------------------------------------ configs


@dataclass(frozen=True)
class Selector:
    """Base of the selector configurations (plain, picklable settings)."""

    kind = "base"
    deterministic = False  # True: the draw is the best item by a key (an argmin tree), not a random one

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind}

    @property
    def prioritized(self) -> bool:
        return False


@dataclass(frozen=True)
class Uniform(Selector):
    """Draw live items uniformly (with replacement across rows)."""

    kind = "uniform"


@dataclass(frozen=True)
class Prioritized(Selector):
    """Draw item i with probability proportional to ``priority_i ** exponent`` (a sum tree).

    Parameters
    ----------
    exponent : float
        PER's alpha, finite and >= 0 (0 is uniform). Default 1.
    initial_priority : float or "max"
        Priority of new items; ``"max"`` (default) is the largest seen so far (1.0 before any).

    Raises
    ------
    ValueError
        A negative or non-finite exponent or initial priority.

    References
    ----------
    Schaul et al., "Prioritized Experience Replay", ICLR 2016 (proportional variant); Reverb's
    ``Prioritized(priority_exponent)``.
    """

    exponent: float = 1.0
    initial_priority: float | str = "max"
    kind = "prioritized"

    def __post_init__(self) -> None:
        if (
            not isinstance(self.exponent, (int, float))
            or not math.isfinite(self.exponent)
            or self.exponent < 0
        ):
            raise ValueError(f"exponent must be finite and >= 0, got {self.exponent!r}")
        _check_initial(self.initial_priority)

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "exponent": float(self.exponent),
            "initial_priority": self.initial_priority,
        }

    @property
    def prioritized(self) -> bool:
        return True


@dataclass(frozen=True)
class Fifo(Selector):
    """The oldest live item (first committed, across shards)."""

    kind = "fifo"
    deterministic = True


@dataclass(frozen=True)
class Lifo(Selector):
    """The newest live item (last committed, across shards)."""

    kind = "lifo"
    deterministic = True


@dataclass(frozen=True)
class MinHeap(Selector):
    """The live item of lowest priority (ties: the oldest).

    Parameters
    ----------
    initial_priority : float or "max"
        Priority of new items (see `Prioritized`).
    """

    initial_priority: float | str = "max"
    kind = "minheap"
    deterministic = True

    def __post_init__(self) -> None:
        _check_initial(self.initial_priority)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "initial_priority": self.initial_priority}


@dataclass(frozen=True)
class MaxHeap(MinHeap):
    """The live item of highest priority (ties: the oldest)."""

    kind = "maxheap"


def _check_initial(value: Any) -> None:
    if value == "max":
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"initial_priority must be 'max' or a finite number >= 0, got {value!r}")


_KINDS: dict[str, type[Selector]] = {c.kind: c for c in (Uniform, Prioritized, Fifo, Lifo, MinHeap, MaxHeap)}


def selector_from_config(config: dict[str, Any]) -> Selector:
    """The selector described by ``config`` (from `Selector.to_config`).

    Raises
    ------
    ValueError
        An unknown kind.
    """
    config = dict(config)
    kind = config.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"unknown selector kind {kind!r}: expected one of {sorted(_KINDS)}")
    return _KINDS[kind](**config)

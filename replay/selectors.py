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
    "check_priority_mass",
    "priority_limit",
    "selector_from_config",
]

def check_priorities(
    priorities: Any, n: int | None = None, what: str = "priorities", limit: float = math.inf
) -> np.ndarray:
    """Return ``priorities`` as float64 [n], or raise if they are not real, or any is NaN, inf, < 0 or
    above ``limit`` (`priority_limit`, checked by `check_priority_mass`).

    Real: a numpy array (or sequence) of a floating, integer or bool dtype, or a torch tensor of such a
    dtype on any device (bfloat16 included: its float64 values are exact).

    Raises
    ------
    TypeError
        Not real numbers: strings, complex numbers, objects (the message names the dtype).
    ValueError
        A NaN, infinite, negative or too large value (the message counts them and shows the
        first), or a length other than ``n``.
    """
    if hasattr(priorities, "detach"):  # a torch tensor
        t = priorities.detach()
        if t.is_complex():
            raise TypeError(f"{what} must be real numbers, got a tensor of dtype {t.dtype}; nothing changed")
        raw = t.cpu().double().numpy()
    else:
        raw = np.asarray(priorities)
        if raw.dtype.kind not in "fiub":
            raise TypeError(
                f"{what} must be real numbers (a float or integer array or tensor), got dtype {raw.dtype}; "
                "nothing changed"
            )
    p = raw.astype(np.float64, copy=False).reshape(-1)
    if n is not None and p.size != n:
        raise ValueError(f"{what}: expected {n} values, got {p.size}")
    bad = ~np.isfinite(p) | (p < 0)
    if bad.any():
        idx = np.flatnonzero(bad)
        raise ValueError(
            f"{what}: {idx.size} of {p.size} are NaN, infinite or negative (first: {p[idx[0]]} at index "
            f"{idx[0]}); priorities must be finite and >= 0. Nothing was changed."
        )
    if limit < math.inf:
        check_priority_mass(p, limit)
    return p


def priority_limit(selector: Selector, items: int) -> float:
    """The largest priority ``update_priorities`` takes: for `Prioritized`, ``p ** exponent`` of each
    item stays <= the largest float64 / (2 * items), so the priority mass of ``items`` items (and every
    sum in the tree) stays finite; ``inf`` for the other selectors (no mass) and for exponent 0.

    Parameters
    ----------
    selector : Selector
        The table's selector; only `Prioritized` (its ``exponent``) has a finite limit.
    items : int
        The slots one weight tree holds (a local store: ``num_shards * capacity``; a Ray shard: its
        ``shard_capacity``).

    Returns
    -------
    float
        The limit (a priority, unitless), or ``math.inf``. Raises nothing.
    """
    exponent = float(getattr(selector, "exponent", 0.0)) if selector.prioritized else 0.0
    if exponent == 0.0:
        return math.inf
    try:
        return (float(np.finfo(np.float64).max) / (2 * max(items, 1))) ** (1.0 / exponent)
    except OverflowError:  # exponent < 1: every finite priority's weight fits
        return math.inf


def check_initial_priority(selector: Selector, limit: float) -> None:
    """Raise if ``selector``'s numeric ``initial_priority`` is above ``limit`` (from `priority_limit`).

    A store checks this when it is made: every inserted item gets that priority, so above the limit
    the priority mass of a full store would overflow, as an update above it would (`check_priority_mass`).

    Parameters
    ----------
    selector : Selector
        The store's selector; only a number as ``initial_priority`` is checked ("max" follows the updates).
    limit : float
        The store's `priority_limit`.

    Raises
    ------
    ValueError
        Naming ``initial_priority``, its value and the limit.
    """
    init = getattr(selector, "initial_priority", "max")
    if init != "max" and float(init) > limit:
        raise ValueError(
            f"initial_priority={init!r} is too large for this store: it must be <= {limit:.6g} "
            "(p ** exponent at most the largest float64 / (2 * capacity)) so that the priority mass "
            "stays finite"
        )


def check_priority_mass(p: np.ndarray, limit: float) -> None:
    """Raise if a priority of ``p`` is above ``limit``.

    Parameters
    ----------
    p : numpy.ndarray, float64 [K]
        Priorities already through `check_priorities`.
    limit : float
        From `priority_limit`.

    Raises
    ------
    ValueError
        Naming ``priorities``, how many are too large, the first and the limit; nothing is changed.
    """
    bad = p > limit
    if bad.any():
        idx = np.flatnonzero(bad)
        raise ValueError(
            f"priorities: {idx.size} of {p.size} are too large (first: {p[idx[0]]} at index {idx[0]}): "
            f"they must be <= {limit:.6g} here (p ** exponent at most the largest float64 / (2 * capacity)) "
            "so that the priority mass stays finite. Nothing was changed."
        )


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

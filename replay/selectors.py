"""Selectors: which stored items a sample draws (DESIGN §4), in Reverb's vocabulary.

An *item* is one stored step, the anchor of a window (see `replay.windows`). A store of S shards
keeps, per shard, one slot per step of its ring; a selector keeps per slot a priority, a use count
and a state (empty, live, or exhausted by ``max_times_sampled``).

Selectors
---------
`Uniform`
    Every live item equally likely.
`Prioritized` (exponent)
    Item i drawn with probability ``p_i ** exponent / sum_j p_j ** exponent`` from a sum tree
    (vectorised numba kernels: O(log C) per draw or update). If every live item has priority 0, draws
    are uniform over the live items (and probabilities say so).
`Fifo`, `Lifo`
    The oldest / newest live item (by commit order across all shards).
`MinHeap`, `MaxHeap`
    The live item of lowest / highest priority (ties: the oldest).

Batches behave as if drawn from one table holding every shard's items, one draw after another:
for the sum-tree selectors the shard of each row is drawn in proportion to its live items (Uniform)
or its priority mass (Prioritized), then the item within the shard; the deterministic selectors compare
the best item of every shard. With ``max_times_sampled = m > 0`` an item is removed once drawn m times,
and the next draws of the same batch no longer see it (rejection of the rows that would exceed m is
exactly the sequential distribution, since removing an item only renormalises the others). Without
it (``m = 0``) a deterministic selector returns the same item for every row of a batch, as Reverb's.

Priorities must be finite and >= 0: NaN, infinite or negative ones raise ``ValueError`` and change
nothing. New items get ``initial_priority``: a number, or ``"max"`` (default) for the largest priority
seen so far (1.0 before any), as in prioritized experience replay.

References
----------
DeepMind Reverb: ``reverb.selectors`` (Uniform, Prioritized, Fifo, Lifo, MinHeap, MaxHeap) and the
table's ``max_times_sampled``. Schaul et al., "Prioritized Experience Replay", ICLR 2016: proportional
prioritisation on a sum tree, new transitions at maximal priority, importance weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

__all__ = [
    "Fifo",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "Prioritized",
    "Selector",
    "SelectorState",
    "Uniform",
    "check_priorities",
    "selector_from_config",
]

EMPTY, LIVE, EXHAUSTED = 0, 1, 2

Alloc = Callable[[tuple[int, ...], Any, str], np.ndarray]


def _np_alloc(shape: tuple[int, ...], dtype: Any, name: str) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


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


@dataclass(frozen=True)
class Lifo(Selector):
    """The newest live item (last committed, across shards)."""

    kind = "lifo"


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


# ------------------------------------------------------------------------------------------ kernels


def _tree_size(capacity: int) -> int:
    return 1 << max(0, (capacity - 1).bit_length())


@nb.njit(cache=True, nogil=True)
def _sum_set(tree, size, leaves, values):  # pragma: no cover - numba
    """Set leaves ``leaves`` of a sum tree to ``values`` and recompute their ancestors (exact sums)."""
    for i in range(leaves.shape[0]):
        j = leaves[i] + size
        tree[j] = values[i]
        j >>= 1
        while j >= 1:
            tree[j] = tree[2 * j] + tree[2 * j + 1]
            j >>= 1


@nb.njit(cache=True, nogil=True)
def _sum_build(tree, size):  # pragma: no cover - numba
    for j in range(size - 1, 0, -1):
        tree[j] = tree[2 * j] + tree[2 * j + 1]


@nb.njit(cache=True, nogil=True)
def _sum_find(tree, size, u, out):  # pragma: no cover - numba
    """For each ``u[i]`` in [0, root): the leaf whose prefix-sum interval holds it (never a zero leaf)."""
    for i in range(u.shape[0]):
        x = u[i]
        j = 1
        while j < size:
            left = tree[2 * j]
            right = tree[2 * j + 1]
            if right <= 0.0 or x < left:
                j = 2 * j
            else:
                x -= left
                j = 2 * j + 1
        out[i] = j - size


@nb.njit(cache=True, nogil=True)
def _draw_rows(tree, size, u, out_shard, out_slot, out_prob, times, count):  # pragma: no cover - numba
    """Draw one item per ``u[i]`` in [0, total) from S sum trees ``tree [S, 2 size]`` as one table.

    The row's shard is the one whose mass interval holds ``u[i]`` (shards in order), its item the
    leaf of that shard's tree holding the rest; ``out_prob`` is the item's weight over the total. With
    ``count``, the draws are added to ``times``. Rounding never picks a shard or leaf of zero mass.
    """
    num_shards = tree.shape[0]
    total = 0.0
    last = 0
    for s in range(num_shards):
        total += tree[s, 1]
        if tree[s, 1] > 0.0:
            last = s
    for i in range(u.shape[0]):
        x = u[i]
        s = 0
        while s < last and (tree[s, 1] <= 0.0 or x >= tree[s, 1]):
            x -= tree[s, 1]
            s += 1
        if x >= tree[s, 1]:
            x = tree[s, 1] * 0.999999999999
        if x < 0.0:
            x = 0.0
        j = 1
        while j < size:
            left = tree[s, 2 * j]
            right = tree[s, 2 * j + 1]
            if right <= 0.0 or x < left:
                j = 2 * j
            else:
                x -= left
                j = 2 * j + 1
        c = j - size
        out_shard[i] = s
        out_slot[i] = c
        out_prob[i] = tree[s, j] / total
        if count:
            times[s, c] += 1


@nb.njit(cache=True, nogil=True, inline="always")
def _better(a, b, key, seq):  # pragma: no cover - numba
    if a < 0:
        return b
    if b < 0:
        return a
    ka = key[a]
    kb = key[b]
    if ka < kb:
        return a
    if kb < ka:
        return b
    return a if seq[a] <= seq[b] else b


@nb.njit(cache=True, nogil=True)
def _min_set(tree, size, leaves, key, seq):  # pragma: no cover - numba
    """Recompute the argmin tree above ``leaves`` after their keys changed (tree holds leaf indices)."""
    for i in range(leaves.shape[0]):
        j = (leaves[i] + size) >> 1
        while j >= 1:
            tree[j] = _better(tree[2 * j], tree[2 * j + 1], key, seq)
            j >>= 1


@nb.njit(cache=True, nogil=True)
def _min_build_keys(tree, size, capacity, key, seq):  # pragma: no cover - numba
    for i in range(size):
        tree[size + i] = i if i < capacity else -1
    for j in range(size - 1, 0, -1):
        tree[j] = _better(tree[2 * j], tree[2 * j + 1], key, seq)


@nb.njit(cache=True, nogil=True)
def _accept_sum(
    shard, slot, times, state, ctree, wtree, weights, size, limit, use_w, prob, accepted
):  # pragma: no cover - numba
    """Accept drawn rows in order while their item is live; remove items reaching ``limit`` draws.

    Rows whose item was removed earlier in the pass are rejected (to be redrawn). ``prob`` gets each
    accepted row's probability under the distribution current at its turn. Returns items removed.
    """
    removed = 0
    zero = np.zeros(1)
    leaf = np.zeros(1, dtype=np.int64)
    num_shards = ctree.shape[0]
    total_w = 0.0
    total_c = 0.0
    for t in range(num_shards):
        total_c += ctree[t, 1]
        if use_w:
            total_w += wtree[t, 1]
    for i in range(shard.shape[0]):
        s = shard[i]
        c = slot[i]
        if state[s, c] != 1:
            accepted[i] = False
            continue
        accepted[i] = True
        prob[i] = weights[s, c] / total_w if use_w else 1.0 / total_c
        times[s, c] += 1
        if limit > 0 and times[s, c] >= limit:
            state[s, c] = 2
            removed += 1
            leaf[0] = c
            _sum_set(ctree[s], size, leaf, zero)
            if wtree.shape[1] > 1:
                _sum_set(wtree[s], size, leaf, zero)
            total_c = 0.0
            total_w = 0.0
            for t in range(num_shards):
                total_c += ctree[t, 1]
                if use_w:
                    total_w += wtree[t, 1]
            if (use_w and total_w <= 0.0) or total_c < 0.5:
                for j in range(i + 1, shard.shape[0]):
                    accepted[j] = False
                break
    return removed


@nb.njit(cache=True, nogil=True)
def _take_best(n, key, seq, state, times, mtree, ctree, size, limit, out_shard, out_slot):  # pragma: no cover
    """Deterministic selectors: ``n`` draws of the best live item across shards, removing exhausted ones."""
    num_shards = key.shape[0]
    removed = 0
    zero = np.zeros(1)
    leaf = np.zeros(1, dtype=np.int64)
    got = 0
    for i in range(n):
        best_s = -1
        best_c = -1
        for s in range(num_shards):
            c = mtree[s, 1]
            if c < 0 or state[s, c] != 1:
                continue
            if best_s < 0:
                best_s = s
                best_c = c
            else:
                kb = key[best_s, best_c]
                kc = key[s, c]
                if kc < kb or (kc == kb and seq[s, c] < seq[best_s, best_c]):
                    best_s = s
                    best_c = c
        if best_s < 0:
            break
        out_shard[i] = best_s
        out_slot[i] = best_c
        got += 1
        times[best_s, best_c] += 1
        if limit > 0 and times[best_s, best_c] >= limit:
            state[best_s, best_c] = 2
            removed += 1
            key[best_s, best_c] = np.inf
            leaf[0] = best_c
            _min_set(mtree[best_s], size, leaf, key[best_s], seq[best_s])
            _sum_set(ctree[best_s], size, leaf, zero)
    return got, removed


# ------------------------------------------------------------------------------------------ state


class SelectorState:
    """The sampling state of S shards of C slots each: priorities, use counts, trees.

    Lives in the process that samples (the store's owner). Not thread-safe: the store serialises calls.

    Parameters
    ----------
    selector : Selector
        The configuration.
    num_shards : int
    capacity : int
        Slots per shard (steps of a shard's ring).
    max_times_sampled : int
        Remove an item once drawn this many times; 0 never.
    seed : int or None
        Seed of the draws (numpy PCG64); the same seed gives the same draws.
    alloc : callable, optional
        ``alloc(shape, dtype, name) -> zeroed numpy array``; the store passes memory-manager regions.

    Raises
    ------
    ValueError
        ``num_shards`` or ``capacity`` < 1, or ``max_times_sampled`` < 0.
    """

    def __init__(
        self,
        selector: Selector,
        num_shards: int,
        capacity: int,
        max_times_sampled: int = 0,
        seed: int | None = None,
        alloc: Alloc | None = None,
    ) -> None:
        if num_shards < 1 or capacity < 1:
            raise ValueError(f"num_shards and capacity must be >= 1, got {num_shards} and {capacity}")
        if (
            isinstance(max_times_sampled, bool)
            or not isinstance(max_times_sampled, (int, np.integer))
            or max_times_sampled < 0
        ):
            raise ValueError(
                f"max_times_sampled must be an int >= 0 (0: unlimited), got {max_times_sampled!r}"
            )
        alloc = alloc or _np_alloc
        self.selector = selector
        self.num_shards, self.capacity = int(num_shards), int(capacity)
        self.max_times_sampled = int(max_times_sampled)
        self.size = _tree_size(self.capacity)
        self.deterministic = isinstance(selector, (Fifo, Lifo, MinHeap))
        self._prioritized = bool(selector.prioritized)
        s, c, p = self.num_shards, self.capacity, self.size
        self.priority = alloc((s, c), np.float64, "priority")
        self.times = alloc((s, c), np.int64, "times_sampled")
        self.state = alloc((s, c), np.uint8, "state")
        self.seq = alloc((s, c), np.int64, "seq")
        self.ctree = alloc((s, 2 * p), np.float64, "count_tree")
        self.wtree = (
            alloc((s, 2 * p), np.float64, "weight_tree") if selector.prioritized else np.zeros((s, 1))
        )
        self.weights = alloc((s, c), np.float64, "weights") if selector.prioritized else np.zeros((s, 1))
        if self.deterministic:
            self.key = alloc((s, c), np.float64, "key")
            self.key.fill(np.inf)
            self.mtree = alloc((s, 2 * p), np.int64, "min_tree")
            for i in range(s):
                _min_build_keys(self.mtree[i], p, c, self.key[i], self.seq[i])
        else:
            self.key = np.zeros((s, 1))
            self.mtree = np.zeros((s, 1), dtype=np.int64)
        self.max_priority = 1.0
        self.rng = np.random.Generator(np.random.PCG64(seed))

    # -- contents

    @property
    def initial_priority(self) -> float:
        init = getattr(self.selector, "initial_priority", "max")
        return self.max_priority if init == "max" else float(init)

    def live_count(self, shard: int | None = None) -> int:
        """Live (drawable) items of one shard, or of all."""
        if shard is None:
            return int(round(float(self.ctree[:, 1].sum())))
        return int(round(float(self.ctree[shard, 1])))

    def mass(self) -> np.ndarray:
        """Per shard, float64 [S]: the priority mass (Prioritized) or the live count (others)."""
        return (self.wtree[:, 1] if self.selector.prioritized else self.ctree[:, 1]).copy()

    def insert(self, shard: int, slots: np.ndarray, seq: np.ndarray, valid: np.ndarray | None = None) -> int:
        """New items in ``slots`` of ``shard`` replace whatever was there.

        Parameters
        ----------
        slots : numpy.ndarray, int64 [k]
            Distinct slots, 0 <= slot < capacity.
        seq : numpy.ndarray, int64 [k]
            Commit order of each item (global across shards).
        valid : numpy.ndarray, bool [k], optional
            False for slots that hold no item (a hole left by a writer that died mid-commit).

        Returns
        -------
        int
            How many replaced items had been exhausted (removed) before: the rate limiter already
            counted them as deleted.
        """
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return 0
        was_exhausted = int(np.count_nonzero(self.state[shard, slots] == EXHAUSTED))
        live = np.ones(slots.size, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
        p0 = self.initial_priority
        self.priority[shard, slots] = p0
        self.times[shard, slots] = 0
        self.state[shard, slots] = np.where(live, LIVE, EMPTY)
        self.seq[shard, slots] = seq
        self._refresh(shard, slots)
        return was_exhausted

    def _refresh(self, shard: int, slots: np.ndarray) -> None:
        """Recompute the trees above ``slots`` from priority and state."""
        live = self.state[shard, slots] == LIVE
        bulk = slots.size > self.size // 8
        self.ctree[shard, self.size + slots] = live
        if bulk:
            _sum_build(self.ctree[shard], self.size)
        else:
            _sum_set(self.ctree[shard], self.size, slots, live.astype(np.float64))
        if self.selector.prioritized:
            w = np.where(live, self.priority[shard, slots] ** float(self.selector.exponent), 0.0)
            self.weights[shard, slots] = w
            if bulk:
                self.wtree[shard, self.size + slots] = w
                _sum_build(self.wtree[shard], self.size)
            else:
                _sum_set(self.wtree[shard], self.size, slots, w)
        if self.deterministic:
            self.key[shard, slots] = np.where(live, self._key(shard, slots), np.inf)
            if bulk:
                _min_build_keys(self.mtree[shard], self.size, self.capacity, self.key[shard], self.seq[shard])
            else:
                _min_set(self.mtree[shard], self.size, slots, self.key[shard], self.seq[shard])

    def _key(self, shard: int, slots: np.ndarray) -> np.ndarray:
        kind = self.selector.kind
        if kind == "fifo":
            return self.seq[shard, slots].astype(np.float64)
        if kind == "lifo":
            return -self.seq[shard, slots].astype(np.float64)
        if kind == "minheap":
            return self.priority[shard, slots].copy()
        return -self.priority[shard, slots]

    def update(self, shard: int, slots: np.ndarray, priorities: Any) -> None:
        """Set the priorities of items in ``slots`` of ``shard`` (later duplicates win).

        Raises
        ------
        ValueError
            NaN, infinite or negative priorities, or a length mismatch; nothing is changed.
        """
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        p = check_priorities(priorities, slots.size)
        if slots.size == 0:
            return
        self.priority[shard, slots] = p
        self.max_priority = max(self.max_priority, float(p.max()))
        uniq = np.unique(slots)
        self._refresh(shard, uniq)

    # -- drawing

    def sample(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Draw up to ``batch_size`` items as from one table (see the module docstring).

        Returns
        -------
        shards : numpy.ndarray, int64 [k]
        slots : numpy.ndarray, int64 [k]
        probabilities : numpy.ndarray, float64 [k]
            Probability of each row's item at its draw (1.0 for the deterministic selectors).
        removed : int
            Items removed by ``max_times_sampled`` during the draw.

        ``k < batch_size`` only when the live items ran out (``max_times_sampled`` emptied the table).
        """
        n = int(batch_size)
        if self.deterministic:
            return self._sample_best(n)
        return self._sample_sum(n)

    def _sample_best(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        out_s = np.zeros(n, dtype=np.int64)
        out_c = np.zeros(n, dtype=np.int64)
        if self.max_times_sampled == 0:
            got, removed = _take_best(
                min(n, 1),
                self.key,
                self.seq,
                self.state,
                self.times,
                self.mtree,
                self.ctree,
                self.size,
                0,
                out_s,
                out_c,
            )
            if got:
                out_s[:] = out_s[0]
                out_c[:] = out_c[0]
                self.times[out_s[0], out_c[0]] += n - 1
                got = n
        else:
            got, removed = _take_best(
                n,
                self.key,
                self.seq,
                self.state,
                self.times,
                self.mtree,
                self.ctree,
                self.size,
                self.max_times_sampled,
                out_s,
                out_c,
            )
        return out_s[:got], out_c[:got], np.ones(got), int(removed)

    def _sample_sum(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        limit = self.max_times_sampled
        shards_out, slots_out, prob_out = [], [], []
        removed = 0
        need = n
        while need > 0:
            if self.ctree[:, 1].sum() < 0.5:
                break
            use_w = self._prioritized and self.wtree[:, 1].sum() > 0
            tree = self.wtree if use_w else self.ctree
            u = self.rng.random(need) * float(tree[:, 1].sum())
            shard = np.empty(need, dtype=np.int64)
            slot = np.empty(need, dtype=np.int64)
            prob = np.empty(need)
            _draw_rows(tree, self.size, u, shard, slot, prob, self.times, limit == 0)
            if limit == 0:  # nothing is removed: every row stands as drawn
                return shard, slot, prob, 0
            accepted = np.empty(need, dtype=np.bool_)
            removed += _accept_sum(
                shard,
                slot,
                self.times,
                self.state,
                self.ctree,
                self.wtree,
                self.weights,
                self.size,
                limit,
                use_w,
                prob,
                accepted,
            )
            shards_out.append(shard[accepted])
            slots_out.append(slot[accepted])
            prob_out.append(prob[accepted])
            need -= int(accepted.sum())
        if not shards_out:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), removed
        return np.concatenate(shards_out), np.concatenate(slots_out), np.concatenate(prob_out), removed

    # -- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Arrays and scalars that `load_state_dict` restores (trees are rebuilt, not stored)."""
        return {
            "priority": self.priority.copy(),
            "times_sampled": self.times.copy(),
            "state": self.state.copy(),
            "seq": self.seq.copy(),
            "max_priority": self.max_priority,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict` (same shard count and capacity), rebuilding the trees.

        Raises
        ------
        ValueError
            Arrays of another shape.
        """
        for name, arr in (
            ("priority", self.priority),
            ("times_sampled", self.times),
            ("state", self.state),
            ("seq", self.seq),
        ):
            src = np.asarray(state[name])
            if src.shape != arr.shape:
                raise ValueError(f"selector state {name!r} has shape {src.shape}, expected {arr.shape}")
            arr[...] = src
        self.max_priority = float(state.get("max_priority", 1.0))
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
        check_priorities(self.priority, what="restored priorities")
        every = np.arange(self.capacity, dtype=np.int64)
        for s in range(self.num_shards):
            self.ctree[s, self.size :] = 0
            self.ctree[s, self.size + every] = self.state[s] == LIVE
            _sum_build(self.ctree[s], self.size)
            if self.selector.prioritized:
                self.wtree[s, self.size :] = 0
                self._refresh(s, every)
            if self.deterministic:
                self._refresh(s, every)

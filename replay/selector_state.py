"""SelectorState: the sampling state of a store's S shards under one selector (priorities, use counts, trees).

Per shard it keeps one slot per step of the shard's ring: a priority, a use count, a state (`EMPTY`,
`LIVE`, or `EXHAUSTED` by ``max_times_sampled``), the item's commit sequence number, and the trees of
`replay.sumtree` over them (a count tree, a weight tree for `Prioritized`, an argmin tree for the
deterministic selectors). `SelectorState.sample` draws as from one table over every shard (see
`replay.selectors`). `state_dict` / `load_state_dict` save and restore it (trees are rebuilt).

>>> state = SelectorState(Prioritized(0.6), num_shards=2, capacity=1000, seed=0)
>>> state.insert(0, np.arange(10), seq=np.arange(10))
>>> shards, slots, probabilities, removed = state.sample(4)
>>> state.update(0, slots[shards == 0], np.ones(int((shards == 0).sum())))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replay.draw_kernels import apply_updates, draw_anchors, draw_items, leaf_weights, set_weights
from replay.selectors import Selector, check_priorities
from replay.sumtree import (
    accept_sum,
    min_build_keys,
    min_set,
    sum_build,
    sum_set,
    take_best,
    tree_size,
)
from replay.update_kernel import update_words

__all__ = ["EMPTY", "EXHAUSTED", "LIVE", "Alloc", "SelectorState"]

EMPTY, LIVE, EXHAUSTED = 0, 1, 2

Alloc = Callable[[tuple[int, ...], Any, str], np.ndarray]


_NO_FILL = np.zeros(0, dtype=np.int64)


def _np_alloc(shape: tuple[int, ...], dtype: Any, name: str) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


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
        self.size = tree_size(self.capacity)
        self.deterministic = bool(selector.deterministic)
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
                min_build_keys(self.mtree[i], p, c, self.key[i], self.seq[i])
        else:
            self.key = np.zeros((s, 1))
            self.mtree = np.zeros((s, 1), dtype=np.int64)
        self._max_priority = np.ones(1)  # max_priority, where update_words' kernel raises it
        self.rng = np.random.Generator(np.random.PCG64(seed))

    # -- contents

    @property
    def max_priority(self) -> float:
        """The largest priority set so far (1.0 at first): the initial priority ``"max"`` gives."""
        return float(self._max_priority[0])

    @max_priority.setter
    def max_priority(self, value: float) -> None:
        self._max_priority[0] = value

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
            sum_build(self.ctree[shard], self.size)
        else:
            sum_set(self.ctree[shard], self.size, slots, live.astype(np.float64))
        if self.selector.prioritized:
            w = np.empty(slots.size)
            leaf_weights(self.priority[shard, slots], live, float(self.selector.exponent), w)
            self.weights[shard, slots] = w
            if bulk:
                self.wtree[shard, self.size + slots] = w
                sum_build(self.wtree[shard], self.size)
            else:
                sum_set(self.wtree[shard], self.size, slots, w)
        if self.deterministic:
            self.key[shard, slots] = np.where(live, self.key_of(shard, slots), np.inf)
            if bulk:
                min_build_keys(self.mtree[shard], self.size, self.capacity, self.key[shard], self.seq[shard])
            else:
                min_set(self.mtree[shard], self.size, slots, self.key[shard], self.seq[shard])

    def key_of(self, shard: int, slots: np.ndarray) -> np.ndarray:
        """The argmin-tree key (float64 [n]) of ``slots`` of a deterministic selector: smallest is drawn.

        Raises
        ------
        ValueError
            The selector's kind has no key here (a new deterministic selector must add its key).
        """
        kind = self.selector.kind
        if kind == "fifo":
            return self.seq[shard, slots].astype(np.float64)
        if kind == "lifo":
            return -self.seq[shard, slots].astype(np.float64)
        if kind == "minheap":
            return self.priority[shard, slots].copy()
        if kind == "maxheap":
            return -self.priority[shard, slots]
        raise ValueError(f"deterministic selector kind {kind!r} has no key in SelectorState.key_of")

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
        self.set_priorities(np.full(slots.size, shard, dtype=np.int64), slots, p)

    def set_priorities(self, shards: np.ndarray, slots: np.ndarray, p: np.ndarray) -> None:
        """`update` over rows of any shards, arguments trusted: int64 [k] each and float64 [k] checked
        priorities of live items (later duplicates win)."""
        if slots.size == 0:
            return
        if self.deterministic:  # the argmin trees need their keys: per shard
            self.priority[shards, slots] = p
            self.max_priority = max(self.max_priority, float(p.max()))
            for s in np.unique(shards):
                self._refresh(int(s), np.unique(slots[shards == s]))
            return
        if not self._prioritized:  # no tree over priorities: only the values
            self.priority[shards, slots] = p
            self.max_priority = max(self.max_priority, float(p.max()))
            return
        exponent = float(self.selector.exponent)
        top = set_weights(
            shards, slots, p, exponent, self.state, self.priority, self.weights, self.wtree, self.size
        )
        self.max_priority = max(self.max_priority, top)

    def accept_and_set(
        self,
        keys: np.ndarray,
        p: np.ndarray,
        capacity: int,
        floors: np.ndarray,
        ingested: np.ndarray,
        incarnation: int,
        restored_at: np.ndarray,
    ) -> int:
        """The generation check of ``keys`` and `set_priorities` of the accepted ones, in one kernel
        call (`replay.draw_kernels.apply_updates`; not for the deterministic selectors, whose argmin
        trees are refreshed per shard). Arguments trusted (checked int64 keys naming shards < S,
        float64 priorities); returns how many were applied."""
        exponent = float(self.selector.exponent) if self._prioritized else 1.0
        applied, top = apply_updates(
            keys, p, capacity, floors, ingested, incarnation, restored_at, self.state, self.priority,
            self.weights, self.wtree, self.size, exponent, self._prioritized,
        )
        self.max_priority = max(self.max_priority, top)
        return int(applied)

    def update_words(
        self, plan: np.ndarray, limit: float, ingested: np.ndarray, repairs: np.ndarray, scratch: np.ndarray
    ) -> np.ndarray:
        """This state's arrays and exponent as `replay.update_kernel.update_locked` takes them
        (`replay.update_kernel.update_words`, with the table's ``plan``, priority ``limit``, ``ingested``,
        ``repairs`` and ``scratch``; the kernel raises `max_priority`); not for the deterministic
        selectors. Valid while this state lives: `load_state_dict` writes into the same arrays."""
        if self.deterministic:
            raise ValueError("update_words: the deterministic selectors refresh their argmin trees per shard")
        exponent = float(self.selector.exponent) if self._prioritized else 1.0
        return update_words(
            plan, self.state, self.priority, self.weights, self.wtree, self.size, exponent, self._prioritized,
            limit, ingested, repairs, scratch, self._max_priority,
        )

    # -- drawing

    def sample(
        self, batch_size: int, filled: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Draw up to ``batch_size`` items as from one table (see the module docstring).

        ``filled`` (int64 [S], optional): per shard, the slots holding a position
        (``min(write_pos, capacity)``); where every one is live a uniform draw skips the tree
        descent (`replay.draw_kernels.draw_anchors`: the same rows).

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
        return self.sample_counted(batch_size, filled)[:4]

    def sample_counted(
        self, batch_size: int, filled: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
        """`sample`, and the live items after the draw (one more value)."""
        n = int(batch_size)
        fill = _NO_FILL if filled is None else filled
        if not self.deterministic and self.max_times_sampled == 0:  # one kernel: nothing is removed
            u = self.rng.random(n)
            shard = np.empty(n, dtype=np.int64)
            slot = np.empty(n, dtype=np.int64)
            prob = np.empty(n)
            trees = (self.ctree, self.wtree, self._prioritized, self.size)
            live = draw_items(u, *trees, fill, self.times, True, shard, slot, prob)
            if live < 0.5:
                return shard[:0], slot[:0], prob[:0], 0, 0
            return shard, slot, prob, 0, int(round(live))
        out = self._sample_best(n) if self.deterministic else self._sample_sum(n, fill)
        return (*out, self.live_count())

    def _sample_best(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        out_s = np.zeros(n, dtype=np.int64)
        out_c = np.zeros(n, dtype=np.int64)
        if self.max_times_sampled == 0:
            got, removed = take_best(
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
            got, removed = take_best(
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

    def _sample_sum(self, n: int, filled: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        limit = self.max_times_sampled
        shards_out, slots_out, prob_out = [], [], []
        removed = 0
        need = n
        while need > 0:
            if self.ctree[:, 1].sum() < 0.5:
                break
            use_w = self._prioritized and self.wtree[:, 1].sum() > 0
            tree = self.wtree if use_w else self.ctree
            u = self.rng.random(need)
            shard = np.empty(need, dtype=np.int64)
            slot = np.empty(need, dtype=np.int64)
            prob = np.empty(need)
            fill = _NO_FILL if use_w else filled
            draw_anchors(u, tree, self.size, fill, self.times, limit == 0, shard, slot, prob)
            if limit == 0:  # nothing is removed: every row stands as drawn
                return shard, slot, prob, 0
            accepted = np.empty(need, dtype=np.bool_)
            removed += accept_sum(
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
        if state.get("rng") is not None:  # None: keep this generator (a restore given a new seed)
            self.rng.bit_generator.state = state["rng"]
        check_priorities(self.priority, what="restored priorities")
        every = np.arange(self.capacity, dtype=np.int64)
        for s in range(self.num_shards):
            self.ctree[s, self.size :] = 0
            self.ctree[s, self.size + every] = self.state[s] == LIVE
            sum_build(self.ctree[s], self.size)
            if self.selector.prioritized:
                self.wtree[s, self.size :] = 0
                self._refresh(s, every)
            if self.deterministic:
                self._refresh(s, every)

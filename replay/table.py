"""Table: the sampling side of a store, in its owner: selector state over the shards, draws, priorities.

As a Reverb table holds items under a selector, a `Table` holds one item per stored step of every
shard of a `replay.storage.TrajectoryStorage`, in a `replay.selector_state.SelectorState`. It learns
of committed steps lazily (`Table.ingest`, under the shard's lock), draws anchors and computes their
windows and keys (`Table.draw`: the kernels of `replay.draw_kernels`, under every shard lock; the
bounds of `replay.windows.window_bounds`), and applies priority updates only to windows whose steps
are all still stored (`Table.update_priorities`: the generation check on absolute positions and the
incarnation rule of docs/architecture.md#keys, one kernel over all keys).

Not thread-safe by itself beyond `Table.lock`, which serialises draws and updates; the gathers that
follow a draw run outside every lock.

>>> table = Table(storage, Prioritized(0.6), max_times_sampled=0, seed=0)
>>> got, table_size, removed = table.draw(k, length, "tail", row0, meta, prob)
>>> table.update_priorities(batch.keys, td_errors)
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numba as nb
import numpy as np
import torch

from graphrl.memory import Region
from replay._checks import check_keys
from replay.commit_kernel import build_plan
from replay.draw_kernels import accept_updates, draw_windows, updates_valid, window_rows
from replay.keys import (
    ISSUER,
    MAX_INCARNATIONS,
    MAX_LINEAGE,
    MAX_SHARDS,
    encode_keys,
    issuer_applies,
    issuer_windows,
    new_store_id,
)
from replay.locked_draw import DRAWN, FAILED, STALE, selector_words
from replay.selector_state import EXHAUSTED, SelectorState
from replay.selectors import Selector, check_initial_priority, check_priorities, priority_limit
from replay.shard import live_parts
from replay.shard_layout import EXHAUSTED as STEP_EXHAUSTED
from replay.shard_layout import WRITE_POS
from replay.storage import TrajectoryStorage
from replay.transition_kernel import sample_transitions, slot_call
from replay.update_kernel import APPLIED, outcome, scratch_for, set_restore, update_args, update_locked
from replay.update_kernel import FAILED as UPDATE_FAILED
from replay.window_kernel import sample_windows
from replay.windows import PAD_CODES

__all__ = ["META_FIELDS", "Table"]

META_FIELDS = ("shard", "anchor", "first", "n", "dst")  # int64 [B] each: a draw's window table
_NO_KEYS = np.zeros(0, dtype=np.int64)
_NO_PRIORITIES = np.zeros(0)
_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)  # tensor dtypes with a numpy view
_NO_WEIGHTS = np.zeros(0, dtype=np.float32)

logger = logging.getLogger(__name__)


class Table:
    """Selector state over a storage's shards, with the draw of windows and the priority updates.

    Parameters
    ----------
    storage : TrajectoryStorage
        The owner's storage (the selector's arrays come from its memory manager, owner
        ``replay.selector``).
    selector : Selector
    max_times_sampled : int
        Remove an item once drawn this many times; 0 never.
    seed : int or None
        Seed of the selector's draws.

    Attributes
    ----------
    state : SelectorState
    lock : threading.Lock
        Serialises draws, updates and checkpoints.
    plan : numpy.ndarray, int64
        The control block's and every shard's addresses (`replay.commit_kernel.build_plan`), for the
        compiled `draw_transitions` and `draw_windows_locked`.
    incarnation : int
        Counted up (mod 16) by each restore; stamped into keys.
    store_id : int
        The store's random 64-bit id: its batches' keys bear it (`replay.keys.stamp_keys`).
    lineage : tuple of int
        The ids of the stores this one was restored from (oldest first): their keys are accepted too,
        and go through the incarnation rule (docs/architecture.md#keys).
    fresh, stale : frozenset of int
        ``store_id`` and ``lineage`` split by `replay.keys.issuer_windows`: issuers whose keys apply (the
        incarnation rule), and ancestors 16 or more restores back, whose keys are all stale.
    restored_at : numpy.ndarray, int64 [S], or None
        Per shard, the write position a restore put back.
    ingested, filled : numpy.ndarray, int64 [S]
        Per shard, the write position the selector has learnt of, and the slots holding a position
        there (``min(ingested, capacity)``: where all are live, a uniform draw skips the descent).
    priority_limit : float
        The largest priority `update_priorities` takes (`replay.selectors.priority_limit`).
    fused : bool
        Whether a draw is one kernel call (Uniform or Prioritized, no ``max_times_sampled``): then
        `draw_transitions` and `draw_windows_locked` apply.
    """

    def __init__(
        self, storage: TrajectoryStorage, selector: Selector, max_times_sampled: int, seed: int | None
    ) -> None:
        self.storage = storage
        self.selector = selector
        self.prioritized = bool(selector.prioritized)
        self.priority_limit = priority_limit(selector, storage.num_shards * storage.capacity)
        check_initial_priority(selector, self.priority_limit)
        self._regions: list[Region] = []
        try:
            self.state = SelectorState(
                selector, storage.num_shards, storage.capacity, max_times_sampled, seed, alloc=self._alloc
            )
        except BaseException:
            self.close()
            raise
        self.ingested = np.zeros(storage.num_shards, dtype=np.int64)
        self.filled = np.zeros(storage.num_shards, dtype=np.int64)  # min(ingested, capacity)
        self._floors = np.zeros(storage.num_shards, dtype=np.int64)  # update_priorities' scratch
        shards = storage.shards
        # each shard's step index and record ring, as the draw kernel takes them (a tuple for one shard)
        self._index: tuple[Any, Any] = (
            (shards[0].steps,) if len(shards) == 1 else nb.typed.List([sh.steps for sh in shards]),
            (shards[0].records,) if len(shards) == 1 else nb.typed.List([sh.records for sh in shards]),
        )
        self.fused = not self.state.deterministic and self.state.max_times_sampled == 0
        # the control block's and every shard's addresses (the compiled locked draws')
        rows = [0 if f.codec else f.row_bytes for f in storage.spec.values()]  # codec: `locked` decodes
        self.step_bytes = sum(rows)  # the bytes of a step the compiled draws copy (the plan's row bytes)
        self.plan = build_plan(
            storage.control.addresses(),
            [sh.addresses() for sh in shards],
            rows,
            storage.capacity,
            storage.limiter.min_size,
        )
        self._repairs = np.zeros(2 * storage.num_shards, dtype=np.int64)  # holes the compiled call repaired
        st = self.state  # the selector's arrays stay the same objects (restores write into them)
        self._words = selector_words(  # the selector by address (restores write into the same arrays)
            st.rng, st.ctree, st.wtree, self.prioritized, st.size, self.filled, st.times, self.ingested
        )
        self._draw_head = (self.plan, False, self._repairs, self._words)  # the one-call path's
        # update_priorities' compiled call (not for the deterministic selectors): the state by address
        self._update_room = 0  # keys a call may take before the scratch grows
        self._update_scratch = np.zeros(2 * storage.num_shards, dtype=np.int64)  # `scratch_for`'s, of 0 keys
        self._update_words = None if st.deterministic else st.update_words(
            self.plan, self.priority_limit, self.ingested, self._repairs, self._update_scratch
        )
        self._update_at = 0 if self._update_words is None else int(self._update_words.ctypes.data)
        self._restored = np.zeros(storage.num_shards, dtype=np.int64)  # restored_at, for the kernel
        self.lock = threading.Lock()
        self.incarnation = 0
        self.store_id = new_store_id()
        self.lineage: tuple[int, ...] = ()
        self.fresh, self.stale = issuer_windows(self.store_id, self.lineage)  # whose keys apply, are stale
        self.restored_at: np.ndarray | None = None

    def _alloc(self, shape: tuple[int, ...], dtype: Any, name: str) -> np.ndarray:
        region = self.storage.memory.allocate(shape, dtype, "host", owner="replay.selector")
        self._regions.append(region)
        arr = region.numpy()
        arr[...] = 0
        return arr

    # -- ingest
    @property
    def max_times_sampled(self) -> int:
        """Draws after which an item is removed (0: never)."""
        return int(self.state.max_times_sampled)

    def ingest(self, s: int) -> None:
        """Add shard s's newly committed steps to the selector (shard lock held)."""
        sh = self.storage.shards[s]
        wp = sh.write_pos
        ing = int(self.ingested[s])
        if wp == ing:
            return
        lo = max(ing, wp - sh.capacity)
        slots = np.arange(lo, wp, dtype=np.int64) % sh.capacity
        valid = sh.steps[slots, 0] >= 0
        self.state.insert(s, slots, sh.steps[slots, 1], valid)
        self.ingested[s] = wp
        self.filled[s] = min(wp, sh.capacity)

    def ingest_all(self) -> None:
        """`ingest` every shard, each under its own lock in turn (``lock`` held)."""
        for s, sh in enumerate(self.storage.shards):
            with sh:
                self.ingest(s)

    def _ingest_new(self) -> None:
        """`ingest_all` for the shards whose write position moved (an unlocked read: only a hint; the
        draw ingests every shard again under all the locks)."""
        ingested = self.ingested
        for s, sh in enumerate(self.storage.shards):
            if sh.meta[WRITE_POS] != ingested[s]:
                with sh:
                    self.ingest(s)

    def selector_mass(self) -> tuple[int, float]:
        """``(live items, priority mass)`` after ingesting every commit (the mass is the live count
        unless the selector is prioritized)."""
        with self.lock:
            self.ingest_all()
            live = self.state.live_count()
            mass = float(self.state.mass().sum()) if self.prioritized else float(live)
        return live, mass

    # -- draws
    def draw(
        self,
        k: int,
        length: int,
        pad: str,
        row0: int,
        meta: dict[str, np.ndarray],
        prob: np.ndarray,
        keys: np.ndarray | None = None,
    ) -> tuple[int, int, int]:
        """Draw up to k anchors under every shard lock and write their windows into rows ``row0...``.

        ``meta`` holds the `META_FIELDS` arrays (int64 [B]), ``prob`` float64 [B]; ``keys`` (int64
        [B], optional) gets the windows' keys (as `keys` gives them).

        Returns
        -------
        got : int
            Windows drawn (fewer than k only when ``max_times_sampled`` emptied the table).
        table_size : int
            N: drawable items at the draw (for the importance weights).
        removed : int
            Items removed by ``max_times_sampled`` (the caller tells the rate limiter).
        """
        shards = self.storage.shards
        cap = self.storage.capacity
        pad_code = PAD_CODES.get(pad)
        if pad_code is None:
            raise ValueError(f"pad must be 'tail' or 'head', got {pad!r}")
        self._hold_all()
        try:
            st = self.state
            out = (meta["shard"], meta["anchor"], meta["first"], meta["n"], meta["dst"])
            stamp = (self.incarnation, _NO_KEYS if keys is None else keys)
            if not st.deterministic and st.max_times_sampled == 0:  # one kernel: nothing is removed
                trees = (st.ctree, st.wtree, self.prioritized, st.size, self.filled, st.times)
                index = (*self._index, self.ingested, cap, length, pad_code, row0)
                live = draw_windows(st.rng.random(k), *trees, *index, *out, prob, *stamp)
                got = k if live >= 0.5 else 0
                return got, int(round(live)) if got else 0, 0
            sh_idx, slots, p, removed, live = st.sample_counted(k, self.filled)
            if removed:  # tell writers (under the shard locks) which items already left the table
                gone = st.state[sh_idx, slots] == EXHAUSTED
                for s, c in zip(sh_idx[gone].tolist(), slots[gone].tolist(), strict=True):
                    shards[s].steps[c, 2] |= STEP_EXHAUSTED
            got = len(sh_idx)
            table_size = live + removed
            prob[row0 : row0 + got] = p
            window_rows(
                sh_idx, slots, *self._index, self.ingested, cap, length, pad_code, row0, *out, *stamp
            )
        finally:
            self._release_all()
        return got, table_size, removed

    def _hold_all(self) -> None:
        """Take the table lock and every shard lock and ingest every shard's committed steps: the state
        in which a draw sees one consistent table (writers wait until `_release_all`)."""
        self.lock.acquire()
        try:
            self._hold_shards()
        except BaseException:
            self.lock.release()
            raise

    def _hold_shards(self) -> None:
        """`_hold_all` with the table lock already held (on an error no shard lock stays held)."""
        shards = self.storage.shards
        held = 0
        try:
            if len(shards) > 1:
                self._ingest_new()  # most of the new steps, one shard locked at a time
            for sh in shards:
                sh.acquire()
                held += 1
            for s in range(held):
                self.ingest(s)
        except BaseException:
            self._release_shards(held)
            raise

    def _release_shards(self, held: int | None = None) -> None:
        """Undo `_hold_shards` (its first ``held`` shard locks; default all), the last shard first. Each
        unlock runs in the ``finally`` of the one after it: an exception one raises (a signal handler's, as
        its unlock returns) propagates only after every shard is unlocked."""
        n = len(self.storage.shards) if held is None else held
        if n:
            try:
                self.storage.shards[n - 1].release()
            finally:
                self._release_shards(n - 1)

    def _release_all(self) -> None:
        """Undo `_hold_all`."""
        self._release_shards()
        self.lock.release()

    def draw_transitions(
        self,
        k: int,
        dst: np.ndarray,
        keys: np.ndarray,
        prob: np.ndarray,
        mask: np.ndarray,
        locked: Callable[[np.ndarray], None] | None = None,
        beta: float = 0.0,
        weights: np.ndarray = _NO_WEIGHTS,
        call: np.ndarray | None = None,
    ) -> int:
        """Draw k windows of one step and copy them into a batch under every shard lock, and count the
        k steps as sampled in the control block's rate-limiter counters, waking its waiters
        (`replay.rate_limiter.RateLimiterState.sample`); `fused` tables only.

        One compiled call takes the shard locks, draws, copies and counts
        (`replay.transition_kernel.sample_transitions`); when a shard has commits not yet ingested,
        or ``locked`` is given, the shard locks are taken in Python, the commits ingested and the
        kernel called again under them. Either way the same uniforms are drawn, so the batch is the
        same. The kernel copies no codec field: ``locked(keys)`` runs after a draw, the shard locks
        still held, to decompress them (`replay.chunk_decode.ChunkDecode.run_locked`).

        Parameters
        ----------
        k : int
            Windows to draw.
        dst : numpy.ndarray, int64 [F]
            The address of the batch's flat bytes of each field, in spec order
            (`replay.batch_staging.StagedSlot.addresses`): ``k`` rows of each field's row bytes.
        keys : numpy.ndarray, int64 [k]
            Gets the keys.
        prob : numpy.ndarray, float64 [k]
            Gets the draw probabilities.
        mask : numpy.ndarray, bool [>= k]
            Rows ``0 .. k - 1`` set True.
        locked : callable, optional
            Decodes the codec fields of the drawn transitions.
        beta : float
            Importance-weight exponent, for ``weights``.
        weights : numpy.ndarray, float32 [k], optional
            Gets the importance weights (empty: none). Nothing is checked.
        call : numpy.ndarray, optional
            `transition_call` of ``dst`` and ``mask`` (kept by the caller with them): the compiled call
            takes its fixed arrays by address from it (`replay.transition_kernel.slot_call`).

        Returns
        -------
        int
            N, the drawable items at the draw; 0: the table is empty and nothing was written or
            counted.

        Raises
        ------
        OSError
            A lock call failed (every lock this call took is released).
        """
        args = (dst, self.incarnation, keys, prob, mask, beta, weights, self.step_bytes, call)
        return self._draw_locked(sample_transitions, args, None if locked is None else lambda: locked(keys))

    def transition_call(self, dst: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """`draw_transitions`' ``call`` for a staging slot's ``dst`` (int64 [F]) and ``mask`` (bool, flat):
        this table's plan, repairs and selector words and those two by address
        (`replay.transition_kernel.slot_call`; valid while the slot's arrays live, the table's live with
        it). Raises ``ValueError`` for arrays of another dtype or layout."""
        return slot_call(self.plan, self._repairs, self._words, dst, mask)

    def draw_windows_locked(
        self,
        length: int,
        pad: int,
        meta: np.ndarray,
        dst: np.ndarray,
        keys: np.ndarray,
        prob: np.ndarray,
        mask: np.ndarray,
        beta: float = 0.0,
        weights: np.ndarray = _NO_WEIGHTS,
    ) -> int:
        """`draw_transitions` for ``len(keys)`` windows of ``length`` steps (2 ..
        `replay.window_kernel.MAX_WINDOW`), ``pad`` 0 tail or 1 head (`replay.windows.PAD_CODES`): drawn
        and copied under every shard lock by `replay.window_kernel.sample_windows`, counted as their real
        steps; `fused` tables without codec fields only.

        ``meta`` int64 [5, B] gets the window table (`META_FIELDS`); ``dst`` (int64 [F], the batch's field
        addresses) and ``mask`` (bool [>= B * length]) hold ``length`` steps a row; ``keys``, ``prob``,
        ``beta`` and ``weights`` as `draw_transitions` takes them. Returns N as `draw_transitions` does
        (0: the table is empty, nothing written or counted).

        Raises
        ------
        OSError
            A lock call failed (every lock this call took is released).
        """
        return self._draw_locked(
            sample_windows, (dst, self.incarnation, length, pad, meta, keys, prob, mask, beta, weights), None
        )

    def _draw_locked(
        self,
        sample: Callable[..., tuple[int, int, int, int]],
        args: tuple[Any, ...],
        after: Callable[[], None] | None,
    ) -> int:
        """One locked draw: ``sample(plan, held, repairs, words, *args)`` (`sample_transitions` or
        `sample_windows`) with the table lock held, one compiled call taking the shard locks; when it
        finds commits not ingested (`STALE`), or ``after`` is given, the shard locks in Python, the
        commits ingested, the same call with ``held`` and ``after()`` under them. Returns N (0: empty);
        raises OSError when a lock call failed."""
        with self.lock:
            status = STALE
            if after is None:
                status, live, err, died = sample(*self._draw_head, *args)
                if died:
                    self._report_dead_holders(died)
            if status == STALE:  # commits to ingest: the shard locks in Python, then the same draw
                self._hold_shards()
                try:
                    status, live, err, died = sample(self.plan, True, self._repairs, self._words, *args)
                    if status == DRAWN and after is not None:
                        after()
                finally:
                    self._release_shards()
                if died:
                    self._report_dead_holders(died)
        return live if status == DRAWN else self._not_drawn(status, err)

    @staticmethod
    def _not_drawn(status: int, err: int) -> int:
        """A locked draw's N for a status other than DRAWN: 0 (the table was empty); raises OSError for
        FAILED (``err`` the errno)."""
        if status == FAILED:
            raise OSError(err, f"a replay-store lock call failed: {errno.errorcode.get(err, err)}")
        return 0

    def _report_dead_holders(self, died: int) -> None:
        """Log what a locked draw (`_draw_locked`) found: mutexes whose holder had died,
        and the holes it repaired (``_repairs``, cleared)."""
        logger.warning("a process died while holding a replay-store lock; recovering it (%d)", died)
        rep = self._repairs
        for s, sh in enumerate(self.storage.shards):
            if rep[2 * s + 1]:
                sh.report_repair(int(rep[2 * s]), int(rep[2 * s + 1]))
                rep[2 * s + 1] = 0

    def keys(self, shard: np.ndarray, anchor: np.ndarray, first: np.ndarray) -> np.ndarray:
        """The keys (int64 [B]) of windows, stamped with this incarnation."""
        return encode_keys(shard, anchor, anchor - first, self.incarnation)

    # -- priorities
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the anchors named by ``keys``; stale keys are ignored; return how many
        applied. Raises as `replay.store.ReplayStore.update_priorities` (keys another store issued
        included; those of an ancestor 16 or more restores back are stale: `replay.keys.issuer_applies`)."""
        fresh = self.fresh  # keys of a fresh issuer apply; issuer_applies rules on the others (or raises)
        if getattr(keys, ISSUER, None) not in fresh and not issuer_applies(
            keys, fresh, self.stale, self.store_id
        ):
            k = check_keys(keys)
            check_priorities(priorities, k.size, limit=self.priority_limit)
            return 0  # every key stale: the incarnation bits of so old an issuer no longer tell
        raw = update_args(keys, priorities) if self._update_at else None
        if raw is not None:  # one compiled call: the checks, the floors under the shard locks, the writes
            with self.lock:
                if raw[3] > self._update_room:
                    self._grow_update_scratch(raw[3])
                applied = update_locked(self._update_at, *raw)
                if applied >= 0:
                    return applied
                status, applied, err, died = outcome(self._update_words)
                if died:
                    self._report_dead_holders(died)
            if status == APPLIED:
                return applied
            if status == UPDATE_FAILED:
                raise OSError(err, f"a replay-store lock call failed: {errno.errorcode.get(err, err)}")
            # INVALID: the checks below name the bad input; STALE: the commits are ingested below
        num_shards = self.storage.num_shards
        k, p = _plain_updates(keys, priorities)
        if k is None or not updates_valid(k, p, num_shards, self.priority_limit):  # the checks naming it
            k = check_keys(keys)
            p = check_priorities(priorities, k.size, limit=self.priority_limit)
            shard = k & (MAX_SHARDS - 1)
            bad = shard >= num_shards
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"key {int(k[i])} names shard {int(shard[i])}, but the store has shards "
                    f"0..{num_shards - 1}; nothing was changed"
                )
        shards = self.storage.shards
        restored = _NO_KEYS if self.restored_at is None else self.restored_at
        with self.lock:
            floors = self._floors  # each named shard's floor, read under its lock (a scratch of this lock)
            for s in range(num_shards) if num_shards <= 8 else np.unique(k & (MAX_SHARDS - 1)).tolist():
                sh = shards[s]
                with sh:
                    self.ingest(s)
                    floors[s] = sh.floor
            stamps = (self.storage.capacity, floors, self.ingested, self.incarnation, restored)
            if not self.state.deterministic:  # one kernel: the check and the writes
                return self.state.accept_and_set(k, p, *stamps)
            shard = k & (MAX_SHARDS - 1)
            slots = np.empty(k.size, dtype=np.int64)
            ok = np.empty(k.size, dtype=np.bool_)
            applied = accept_updates(k, *stamps, self.state.state, shard, slots, ok)
            if applied == k.size:
                self.state.set_priorities(shard, slots, p)
            else:
                self.state.set_priorities(shard[ok], slots[ok], p[ok])
            return int(applied)

    def _grow_update_scratch(self, keys: int) -> None:
        """A scratch for `update_locked` calls of up to ``keys`` keys (``lock`` held)."""
        room = max(keys, 2 * self._update_room)
        self._update_scratch = scratch_for(self._update_words, self.storage.num_shards, room)
        self._update_room = room

    # -- checkpoints
    @contextmanager
    def quiesced(self) -> Iterator[None]:
        """Hold ``lock`` and the store (`replay.storage.TrajectoryStorage.quiesced`: the writers'
        turnstile, every shard lock, the control block's mutex; writers and samplers wait), with every
        commit ingested: the state `state_dict` and the parts' ``state_dict()`` then give is one
        consistent snapshot."""
        with self.lock, self.storage.quiesced():
            for s in range(self.storage.num_shards):
                self.ingest(s)
            yield

    def state_dict(self) -> dict[str, Any]:
        """Per shard the live items' ``priority``, ``times_sampled`` and ``state`` (row blocks, views),
        and ``max_priority``, ``rng`` (JSON text), ``incarnation``, ``store_id`` and ``lineage``. Call
        inside `quiesced`."""
        shards = []
        for s, sh in enumerate(self.storage.shards):
            wp, floor = sh.write_pos, sh.floor
            shards.append(
                {
                    name: live_parts(arr[s], floor, wp)
                    for name, arr in (
                        ("priority", self.state.priority),
                        ("times_sampled", self.state.times),
                        ("state", self.state.state),
                    )
                }
            )
        return {
            "shards": shards,
            "max_priority": self.state.max_priority,
            "rng": json.dumps(self.state.rng.bit_generator.state),
            "incarnation": self.incarnation,
            "store_id": self.store_id,
            "lineage": list(self.lineage),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back `state_dict` (arrays or row blocks) over the restored shards, as a new incarnation.

        The shards must hold their restored steps already. Keys drawn before the checkpoint apply only
        to windows below the restored write positions (docs/architecture.md#keys). This table keeps its
        own new ``store_id`` and accepts the keys of the checkpointed store and of its lineage.
        """
        s_count, cap = self.storage.num_shards, self.storage.capacity
        full = {
            "priority": np.zeros((s_count, cap)),
            "times_sampled": np.zeros((s_count, cap), np.int64),
            "state": np.zeros((s_count, cap), np.uint8),
            "seq": np.zeros((s_count, cap), np.int64),
            "max_priority": float(state["max_priority"]),
            "rng": None if state.get("rng") is None else json.loads(state["rng"]),
        }
        written = np.zeros(s_count, dtype=np.int64)
        for s, sh in enumerate(self.storage.shards):
            wp = sh.write_pos
            slots = np.arange(max(0, wp - cap), wp) % cap
            for name in ("priority", "times_sampled", "state"):
                x = state["shards"][s][name]
                full[name][s, slots] = np.concatenate(x) if isinstance(x, list) else x[...]
            full["seq"][s, slots] = sh.steps[slots, 1]
            written[s] = wp
        with self.lock:
            self.state.load_state_dict(full)
            self.ingested[:] = written
            self.filled[:] = np.minimum(written, cap)
            self.incarnation = (int(state.get("incarnation", 0)) + 1) % MAX_INCARNATIONS
            saved = state.get("store_id")
            ancestors = [int(i) for i in state.get("lineage", ())] + ([] if saved is None else [int(saved)])
            self.lineage = tuple(ancestors[-MAX_LINEAGE:])
            self.fresh, self.stale = issuer_windows(self.store_id, self.lineage)
            self.restored_at = written.copy()
            self._restored[:] = written
            if self._update_words is not None:
                set_restore(self._update_words, self.incarnation, self._restored)

    def close(self) -> None:
        """Free the selector's regions."""
        for r in self._regions:
            if not r.freed:
                r.free()
        self._regions = []


def _plain_updates(keys: Any, priorities: Any) -> tuple[np.ndarray | None, np.ndarray]:
    """``(keys, priorities)`` as int64 [K] and float64 [K] arrays without copies, when they are CPU
    int64 keys (``batch.keys``) and float priorities (float16, 32 or 64) of the same length; else
    ``(None, ...)`` (`check_priorities` takes the rest: bfloat16, integers, sequences)."""
    if type(keys) is torch.Tensor and keys.dtype == torch.int64 and keys.is_cpu:
        k = keys.numpy()
    elif type(keys) is np.ndarray and keys.dtype == np.int64:
        k = keys
    else:
        return None, _NO_PRIORITIES
    if type(priorities) is torch.Tensor and priorities.dtype in _NUMPY_FLOATS:
        p = priorities.detach().cpu().numpy()
    elif type(priorities) is np.ndarray and priorities.dtype.kind == "f":
        p = priorities
    else:
        return None, _NO_PRIORITIES
    if k.ndim != 1 or k.strides[0] != 8:
        k = np.ascontiguousarray(k.reshape(-1))
    if p.ndim != 1 or p.dtype != np.float64 or p.strides[0] != 8:
        p = np.ascontiguousarray(p.reshape(-1), dtype=np.float64)
    return (k, p) if k.size == p.size else (None, _NO_PRIORITIES)


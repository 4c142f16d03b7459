"""WindowSampler: a store's sampling loop: draw windows, copy them, drop and redraw torn ones, batch.

`WindowSampler.sample` waits for the rate limiter, draws windows from the `replay.table.Table`,
copies them into a `replay.batch_staging.BatchStaging` slot with `replay.gather.WindowGather` (no lock held),
asks `replay.storage.TrajectoryStorage.stale` which windows a writer overwrote during the copy,
compacts the intact ones to the front and draws again for the rest, then writes the mask
(`replay.windows.window_mask`), the keys and the importance weights into a `replay.batch.Batch`.
`WindowSampler.draw_windows` is the same loop without the copy (for callers that copy the ring views
themselves, such as `replay.distributed`'s shard actors).

Host batches of the owner's own `replay.table.Table` take a compiled path: the table writes the
window table and the keys into the slot's scratch arrays in one kernel call
(`replay.draw_kernels`), `replay.batch_kernels.BatchCopy` copies every shard's windows and fills
the mask in one more (on the thread team for large batches), `replay.chunk_decode.ChunkDecode`
decompresses the codec fields, and the staleness check is one comparison per shard. Transitions
and short windows (`MAX_WINDOW` steps, no codec field for windows) of a `fused` table are drawn and
copied in one call under the locks (`replay.transition_kernel`, `replay.window_kernel`; no
staleness check). Any other table object (a learner process's proxy, offering ``draw``, ``keys``,
``prioritized``, ``incarnation``, ``update_priorities``) and GPU batches take the general loop; both
give the same batches for the same draws.

>>> sampler = WindowSampler(storage, table, limiter, staging_slots=4)
>>> batch = sampler.sample(256, 64, "tail", 0.4, None, lambda: 60.0)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from graphrl.memory import MemoryBudgetError
from graphrl.tensors import StagingBuffer
from replay.batch import Batch, importance_weights
from replay.batch_kernels import BatchCopy
from replay.batch_staging import BatchStaging, StagedSlot
from replay.gather import WindowGather
from replay.rate_limiter import RateLimiterState
from replay.storage import TrajectoryStorage
from replay.table import META_FIELDS, Table
from replay.transition_kernel import LOCKED_COPY_BYTES
from replay.window_kernel import LOCKED_WINDOW_BYTES, MAX_WINDOW
from replay.windows import PAD_CODES, WindowTable, window_mask

_KEYS_LENGTHS = [5, 3]  # the scratch rows of the keys and the real lengths (`StagedSlot.scratch`)
_NO_WEIGHTS = np.empty(0, dtype=np.float32)  # `Table.draw_transitions`' weights of a uniform draw: none

__all__ = ["DEVICE_GATHER_MIN_BYTES", "Deadline", "WindowSampler", "gathers_on_device"]


def release_unless_released(buffer: StagingBuffer) -> None:
    """Give back a failed sample's staging buffer unless the batch made from it already has: a signal's
    exception raised inside `Batch.from_draw` (or the `Batch` constructor) drops the batch that took the
    buffer, and its collection releases the buffer before the sample's ``except`` runs."""
    if not buffer.released:
        buffer.release()


class Deadline:
    """``timeout`` seconds from the first call: calling it gives the seconds left (None: no deadline).

    The clock starts when the seconds left are first asked, that is at a call's first wait (the
    waits call it only when they block): a call that never waits reads no clock, and the time before
    its first wait (microseconds of checks and draws) is not counted against ``timeout``.

    ``timeout`` is kept as the caller gave it, so a ``TimeoutError`` quotes the user's timeout
    (``timeout=0.5``), not the time that was left at the last wait.
    """

    __slots__ = ("end", "timeout")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.end: float | None = None  # set by the first call

    def __call__(self) -> float | None:
        timeout = self.timeout
        if timeout is None:
            return None
        if self.end is None:
            self.end = time.monotonic() + timeout
            return float(timeout)
        return max(0.0, self.end - time.monotonic())



def items_needed(table: Table, k: int) -> int:
    """Items the store must hold before ``k`` windows are drawn from ``table``: with
    ``max_times_sampled`` = m > 0 (draws remove items), ceil(k / m), so that the batch is drawn whole
    and a timeout drops nothing; else 1."""
    m = table.max_times_sampled
    return -(-k // m) if m > 0 else 1


# derived, not measured: where lines through two timed sizes per path cross (~95 MB, H200; performance.md)
DEVICE_GATHER_MIN_BYTES = 96 << 20


def gathers_on_device(batch_bytes: int, min_bytes: int) -> bool:
    """Whether a batch for a GPU is gathered there (`replay.cuda`, reading the rings in place) rather than
    on the host and copied up in one transfer (`replay.batch.Batch.to`).

    The GPU kernel pays a fixed cost a batch (the window table's upload, a launch a field) and then
    copies faster than the host gather, so it wins from a crossover size on: ``batch_bytes`` (B * L
    * bytes of a step) at least ``min_bytes``. ``min_bytes`` 0 always gathers on the GPU.
    `ReplayStore.device_gather_min_bytes` sets it (default `DEVICE_GATHER_MIN_BYTES`, a crossover
    derived from two measured sizes in docs/performance.md, not measured itself), and
    ``benchmarks/gpu_check.py`` measures both paths on each side of it.
    """
    return batch_bytes >= min_bytes


class WindowSampler:
    """Draws and gathers batches of windows for a store's owner (see the module docstring).

    Parameters
    ----------
    storage : TrajectoryStorage
    table : Table
    limiter : RateLimiterState
        The store's rate limiter over the control block's counters.
    staging_slots : int
        Batches that may be held at once per batch shape.
    """

    def __init__(
        self, storage: TrajectoryStorage, table: Table, limiter: RateLimiterState, staging_slots: int
    ) -> None:
        self.storage = storage
        self.table = table
        self.limiter = limiter
        self.gather = WindowGather(storage)
        self.staging = BatchStaging(
            storage.spec, storage.memory, staging_slots, storage.timeout, scratch_names=META_FIELDS
        )
        self.owner_table = type(table) is Table  # the compiled path (see the module docstring)
        self.decode = self.gather.decode  # codec fields (`replay.chunk_decode`), or None
        self.step_bytes = sum(f.row_bytes for f in storage.spec.values())
        self.device_gather_min_bytes = DEVICE_GATHER_MIN_BYTES
        self.copy = BatchCopy(storage) if self.owner_table else None
        # batches of transitions up to this many rows (of raw bytes, codec fields too: they are decoded under
        # the locks then) are drawn and copied in one call under the locks
        self.locked_rows = LOCKED_COPY_BYTES // max(1, self.step_bytes) if self.copy else 0
        # the fused call counts the samples itself, in the control block: only for its own limiter
        if limiter.cond is not storage.control.cond or type(limiter).sample is not RateLimiterState.sample:
            self.locked_rows = 0
        # likewise windows of 2 .. locked_window steps of up to LOCKED_WINDOW_BYTES: drawn and copied in one
        # call (`replay.window_kernel`); with codec fields they keep the lock-free path (the locked
        # decode takes windows of one step), as they do with 0 here
        self.locked_window = MAX_WINDOW if self.locked_rows and self.decode is None else 0

    def sample(
        self, b: int, length: int, pad: str, beta: float, target: torch.device | None, left: Deadline
    ) -> Batch:
        """B windows of L steps (arguments checked by the caller); ``target`` None: a host batch, else
        the GPU gather's device (`replay._checks.check_device`). The batch's keys bear the table's
        ``store_id`` (`replay.batch.Batch.stamp`). For a device, a batch of fewer than
        ``device_gather_min_bytes`` bytes is gathered on the host and copied up (`gathers_on_device`).

        Raises
        ------
        TimeoutError
            The rate limiter or the staging slots made it wait past the deadline.
        """
        if target is not None and (
            bool(self.storage.spec.codec_fields)  # decompressed on the host, then one copy up
            or not gathers_on_device(b * length * self.step_bytes, self.device_gather_min_bytes)
        ):
            return self.sample(b, length, pad, beta, None, left).to(target)
        try:
            slot = self.staging.acquire(b, length, target, left)  # the clock read only if it waits
        except TimeoutError as err:  # quote the caller's timeout, not the time left at this wait
            raise TimeoutError(
                f"sample(batch_size={b}, window={length}): staging slots stayed held (all of this "
                f"batch shape; timeout={left.timeout}); release batches (Batch.release or a with block) "
                "or raise staging_slots"
            ) from err
        except MemoryBudgetError as err:  # name the call's batch first, the memory manager's figures after
            lead = (
                f"sample(batch_size={b}, window={length}): a staging pool of {self.staging.slots} batches of "
                f"{b} x {length} steps ({b * length * self.step_bytes} bytes of fields each) does not fit; "
                "sample smaller batches or lower staging_slots"
            )
            raise MemoryBudgetError(
                err.tier, err.owner, err.asked, err.free, err.budget, err.attempts, err.note,
                f"{lead}; {err.lead}" if err.lead else lead,
            ) from err
        if target is None and self.owner_table:
            if length == 1 and b <= self.locked_rows and self.table.fused:
                return self._sample_transitions(b, beta, left, slot)
            if (1 < length <= self.locked_window and b * length * self.step_bytes <= LOCKED_WINDOW_BYTES
                    and self.table.fused):
                return self._sample_windows(b, length, pad, beta, left, slot)
            return self._sample_owner(b, length, pad, beta, left, slot)
        try:
            meta, prob, table_size = self._draw_and_gather(b, length, pad, left, slot, target)
            if target is None:
                window_mask(meta["n"], meta["dst"], length, out=slot.mask.numpy())
            else:  # made on the host by the same rule (B x L bools), one copy up
                slot.mask.copy_(torch.from_numpy(window_mask(meta["n"], meta["dst"], length)))
            keys = self.table.keys(meta["shard"], meta["anchor"], meta["first"])
            self.limiter.sample(int(meta["n"].sum()))
            weights = (
                importance_weights(prob, table_size, beta)
                if self.table.prioritized
                else torch.from_numpy(np.ones(b, dtype=np.float32))
            )
            return Batch(
                slot.fields,
                slot.mask,
                torch.from_numpy(keys),
                torch.from_numpy(prob),
                weights if target is None else weights.to(target),
                torch.from_numpy(meta["n"].copy()),
                table_size,
                slot.buffer,
            ).stamp(self.table.store_id)
        except BaseException:
            release_unless_released(slot.buffer)
            raise

    def _check_drawable(self, b: int, length: int, left: Deadline) -> None:
        """After a draw found no item although the rate limiter admitted the sample (another sampler
        removed the last items and has not yet counted them): raise once the deadline has passed.

        Raises
        ------
        TimeoutError
            ``left`` has no time left.
        """
        if left() == 0.0:
            raise TimeoutError(
                f"sample(batch_size={b}, window={length}) waited past timeout={left.timeout}: the rate "
                f"limiter counts {self.limiter.size} sampleable items but the table held none to draw"
            )

    def _draw_locked(
        self, b: int, length: int, left: Deadline, draw: Callable[..., int], args: tuple[object, ...]
    ) -> int:
        """Wait for the rate limiter and call ``draw(*args)`` (one locked draw of all B windows; returns
        N, 0 when it found the table empty and drew nothing) until it draws; returns N.

        Raises
        ------
        TimeoutError
            The rate limiter or an empty table outlasted ``left`` (`_check_drawable`).
        """
        while True:
            self.limiter.await_sample(left, left.timeout)  # (left, given): the clock read only if it waits
            table_size = draw(*args)
            if table_size:  # counted as the batch's sampled steps under the locks
                return table_size
            self._check_drawable(b, length, left)

    def _sample_transitions(self, b: int, beta: float, left: Deadline, slot: StagedSlot) -> Batch:
        """`sample` of B windows of one step for a host batch of the owner's `fused` `Table`: one
        kernel call under the locks draws and copies them, for a prioritized table computes the
        importance weights, and counts the B steps in the rate limiter (nothing can be torn: no
        re-check)."""
        try:
            table = self.table
            keys = np.empty(b, dtype=np.int64)  # the batch's own (they outlive the slot's release)
            prob = np.empty(b)
            # codec fields: decompressed from the drawn keys under the same locks (`replay.chunk_decode`)
            locked = None if self.decode is None else (lambda k: self.decode.run_locked(k, slot.flat))
            weights = np.empty(b, dtype=np.float32) if table.prioritized else None
            call = slot.call
            if call is None:  # made once per slot, kept with its views: the compiled call's fixed arrays
                call = slot.call = table.transition_call(slot.addresses, slot.mask_flat)
            args = (b, slot.addresses, keys, prob, slot.mask_flat, locked, 0.0, _NO_WEIGHTS, call) if (
                weights is None
            ) else (b, slot.addresses, keys, prob, slot.mask_flat, locked, beta, weights, call)
            table_size = self._draw_locked(b, 1, left, table.draw_transitions, args)
            return Batch.from_draw(
                slot.fields, slot.mask, keys, prob, None, table_size, None if weights is None else beta,
                slot.buffer, weights, table.store_id,
            )
        except BaseException:
            release_unless_released(slot.buffer)
            raise

    def _sample_windows(
        self, b: int, length: int, pad: str, beta: float, left: Deadline, slot: StagedSlot
    ) -> Batch:
        """`sample` of B short windows for a host batch of the owner's `fused` `Table` without codec
        fields: as `_sample_transitions`, one kernel call under the locks draws them (the same
        uniforms, bounds and keys as `_sample_owner`'s draw), copies them and their mask, and counts
        their real steps; the window table goes to the slot's scratch."""
        try:
            table = self.table
            block = slot.scratch
            prob = np.empty(b)
            weights = np.empty(b, dtype=np.float32) if table.prioritized else None
            more = () if weights is None else (beta, weights)
            table_size = self._draw_locked(
                b, length, left, table.draw_windows_locked,
                (length, PAD_CODES[pad], block[:5], slot.addresses, block[5], prob, slot.mask_flat, *more),
            )
            keys_lengths = block[_KEYS_LENGTHS]  # one copy of both rows (the batch keeps them)
            return Batch.from_draw(
                slot.fields, slot.mask, keys_lengths[0], prob, keys_lengths[1], table_size, None, slot.buffer,
                weights, table.store_id,
            )
        except BaseException:
            release_unless_released(slot.buffer)
            raise

    def _sample_owner(
        self, b: int, length: int, pad: str, beta: float, left: Deadline, slot: StagedSlot
    ) -> Batch:
        """`sample` for a host batch of the owner's `Table` (the compiled path)."""
        try:
            block, prob, meta = slot.scratch, slot.scratch_prob, slot.scratch_meta
            keys = block[5]
            table, limiter = self.table, self.limiter
            done = table_size = 0
            while done < b:
                limiter.await_sample(left(), given=left.timeout, need=items_needed(table, b - done))
                got, table_size, removed = table.draw(b - done, length, pad, done, meta, prob, keys)
                if removed:
                    limiter.delete(removed)
                if got == 0:
                    self._check_drawable(b, length, left)
                    continue
                self.copy.run(block[0], block[2], block[3], block[4], done, done + got, slot.flat,
                              slot.mask_flat, length)
                if self.decode is not None:
                    win = (block[i, done : done + got] for i in (0, 2, 3, 4))
                    self.decode.run(np.arange(done, done + got), *win, slot.flat, length)
                stale = self._stale(block[0], block[2], done, done + got)
                if stale is None:
                    done += got
                    continue
                rows = np.arange(done, done + got)
                good = rows[~stale]
                kept = len(good)
                dst = slice(done, done + kept)  # compact the good rows to the front, redraw the rest
                for arr in slot.outs.values():
                    arr[dst] = arr[good]
                mask = slot.mask.numpy()
                mask[dst] = mask[good]
                block[:, dst] = block[:, good]
                prob[dst] = prob[good]
                done += kept
            keys_lengths = block[_KEYS_LENGTHS]  # one copy of both rows (the batch keeps them)
            lengths = keys_lengths[1]
            limiter.sample(b if length == 1 else int(lengths.sum()))  # a window of 1 is its live anchor
            # keys, probabilities, lengths and weights become tensors on first access (the weights: ones,
            # or importance weights for a prioritized table)
            return Batch.from_draw(
                slot.fields, slot.mask, keys_lengths[0], prob.copy(), lengths, table_size,
                beta if table.prioritized else None, slot.buffer, None, table.store_id,
            )
        except BaseException:
            release_unless_released(slot.buffer)
            raise

    def _stale(self, shard: np.ndarray, first: np.ndarray, lo: int, hi: int) -> np.ndarray | None:
        """Rows ``lo .. hi - 1`` whose first step a writer overwrote (floors read under each shard's
        lock, after the copy): bool [hi - lo], or None when none did."""
        shards = self.storage.shards
        if len(shards) == 1:
            with shards[0] as sh:
                floor = sh.floor
            if floor == 0 or first[lo:hi].min() >= floor:  # floor 0: the ring has not wrapped yet
                return None
            return first[lo:hi] < floor
        bad = self.storage.stale(shard[lo:hi], first[lo:hi])
        return bad if bad.any() else None

    def _draw_and_gather(
        self, b: int, length: int, pad: str, left: Deadline, slot: StagedSlot, target: torch.device | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
        """Draw and copy windows until ``b`` intact ones fill ``slot``; windows a writer overwrote
        during the copy are compacted out and drawn again. Returns the window table, the
        probabilities and N."""
        meta = {k: np.zeros(b, dtype=np.int64) for k in META_FIELDS}
        prob = np.zeros(b)
        done = table_size = 0
        while done < b:
            self.limiter.await_sample(left(), given=left.timeout, need=items_needed(self.table, b - done))
            got, table_size, removed = self.table.draw(b - done, length, pad, done, meta, prob)
            if removed:
                self.limiter.delete(removed)
            if got == 0:
                self._check_drawable(b, length, left)
                continue
            rows = np.arange(done, done + got)
            if target is None:
                self.gather.to_host(rows, meta, slot.flat, length)
            else:
                self.gather.to_device(rows, meta, slot.flat, length, target)
            stale = self.storage.stale(meta["shard"][rows], meta["first"][rows])
            kept = got - int(stale.sum())
            if kept < got:  # compact the good rows to the front, redraw the rest
                good = rows[~stale]
                dst = slice(done, done + kept)
                if target is None:
                    for arr in slot.outs.values():
                        arr[dst] = arr[good]
                else:
                    idx = torch.from_numpy(good).to(target)
                    for t in slot.fields.values():
                        t[dst] = t.index_select(0, idx)
                for v in meta.values():
                    v[dst] = v[good]
                prob[dst] = prob[good]
            done += kept
        return meta, prob, table_size

    def draw_windows(self, b: int, length: int, pad: str, left: Deadline) -> WindowTable:
        """B windows drawn as `sample` draws them, without copying any step."""
        meta = {k: np.zeros(b, dtype=np.int64) for k in META_FIELDS}
        prob = np.zeros(b)
        done = table_size = 0
        while done < b:
            self.limiter.await_sample(left(), given=left.timeout, need=items_needed(self.table, b - done))
            got, table_size, removed = self.table.draw(b - done, length, pad, done, meta, prob)
            if removed:
                self.limiter.delete(removed)
            if got == 0:
                self._check_drawable(b, length, left)
            done += got
        return WindowTable(
            *(meta[k] for k in META_FIELDS), prob, table_size, self.storage.capacity, self.table.incarnation
        )

    def close(self) -> None:
        """Close the staging pools and unregister the rings registered for the GPU path."""
        self.staging.close()
        self.gather.close()

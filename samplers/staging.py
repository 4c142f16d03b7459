"""Staging buffers for gathered rows that grow with the batch: `RowStaging` hands out `StagingLease`s.

A batch of B rows leases B rows of one of ``slots`` reusable buffers (a `graphrl.tensors.StagingPool`
in a memory-manager region: pinned host memory for a CPU gather on a CUDA machine, host memory without
CUDA, device memory for a GPU gather). A lease is never overwritten while held. ``lease.release()``
gives it back at once (the holder's word that nothing reads it any more); ``lease.release_when_unused()``
gives it back once no tensor views it any more (a host buffer's views are counted,
`graphrl.tensors.StagingBuffer.release_when_unused`; a device buffer's cannot be: it goes back at once).
When every buffer is held and some only by tensors a user kept, `RowStaging.acquire` does not wait:
the lease gets a buffer of its own, a region of the same tier (counted against the manager's budget,
freed when its last tensor is gone or at ``release()``). When a batch needs more rows than a buffer
holds, a pool 1.25 times as large replaces the old one, which is freed once its last lease is given
back. ``lease.hold_until(event)`` keeps a lease's buffer (pooled or its own) from being handed out again
or freed before ``event`` completes, however it is given back: a non-blocking copy to a GPU may still read it
(`graphrl.tensors.StagingBuffer.hold_until`; the loaders' ``batch.to(device, non_blocking=True)``); `acquire`
waits for such a copy (it completes) rather than making a buffer of its own.
`samplers.features.FeatureStore.staging` makes one for a store's rows; `samplers.loader` leases one buffer
per batch in flight (docs/architecture.md#memory-tiers).

>>> staging = store.staging(slots=3)
>>> lease = staging.acquire(len(ids))
>>> store.gather_into(ids, lease.tensor)
>>> lease.release()
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from graphrl.memory import MemoryBudgetError, MemoryManager, Region, Tier, free_quietly
from graphrl.tensors import StagingBuffer, StagingPool

__all__ = ["RowStaging", "StagingLease"]

_DEFAULT = object()


class StagingLease:
    """Rows of one staging buffer held by one batch, from `RowStaging.acquire` until it is given back.

    Attributes
    ----------
    tensor : torch.Tensor, shape [rows, *row]
        The leased rows (a view of the staging buffer, or of the lease's own buffer).
    """

    def __init__(self, buffer: StagingBuffer, rows: int, pool: StagingPool,
                 on_release: Callable[[StagingPool], None]) -> None:
        self._buffer: StagingBuffer | None = buffer
        self._pool = pool
        self._on_release = on_release
        self.tensor = buffer.tensor[:rows]

    @property
    def released(self) -> bool:
        return self._buffer is None

    @property
    def own_buffer(self) -> bool:
        """True for a buffer of the lease's own (every pooled buffer was held when it was leased)."""
        return False

    def release(self) -> None:
        """Give the buffer back now (it may be overwritten at once); idempotent."""
        buffer, self._buffer = self._buffer, None
        if buffer is not None:
            buffer.release()
            self._on_release(self._pool)

    def release_when_unused(self) -> None:
        """Give the buffer back once no tensor views it (``tensor`` and its views, wherever they are kept;
        a device buffer, whose views cannot be counted, goes back at once); idempotent, and a no-op after
        `release`."""
        buffer, self._buffer = self._buffer, None
        if buffer is not None:
            buffer.release_when_unused()
            self._on_release(self._pool)

    def hold_until(self, event: Any) -> None:
        """Keep the buffer from being handed out again before ``event`` completes (``event.query()``), however
        the lease is given back: a copy recorded before ``event`` may still read it. A no-op after the lease
        was given back (its rows may already be another batch's)."""
        buffer = self._buffer
        if buffer is not None:
            buffer.hold_until(event)


class _OwnLease(StagingLease):
    """A lease of a buffer of its own: a region freed by `release` or once its last tensor is gone.

    The tensor is made over a numpy view of the region (``torch.from_numpy``), which the tensor's
    storage keeps alive until the storage itself goes: a finalizer on that view frees the region then.
    """

    def __init__(self, region: Region, rows: int, row_shape: tuple[int, ...], dtype: torch.dtype,
                 keep: Callable[[Any, torch.Tensor], None]) -> None:
        flat = region.tensor().reshape(-1).view(torch.uint8).numpy().view()  # a view only the storage holds
        self.free = weakref.finalize(flat, free_quietly, region)
        self.tensor = torch.from_numpy(flat).view(dtype).view(-1, *row_shape)[:rows]
        self._released = False
        self._keep = keep  # `RowStaging`'s: holds a tensor of the region until an event completes
        self._copied = False

    @property
    def released(self) -> bool:
        return self._released

    @property
    def own_buffer(self) -> bool:
        return True

    def release(self) -> None:
        """Free the buffer's region now (its tensors stay readable, no longer counted); idempotent. After
        `hold_until`, the region is freed once its last tensor is gone, as by `release_when_unused`."""
        self._released = True
        if not self._copied:
            self.free()

    def release_when_unused(self) -> None:
        """The region is freed once its last tensor is gone; idempotent."""
        self._released = True

    def hold_until(self, event: Any) -> None:
        """Keep the region until ``event`` completes (the staging holds a tensor of it till then)."""
        if not self._released:
            self._copied = True
            self._keep(event, self.tensor)


class RowStaging:
    """Staging buffers for gathered rows: a `StagingPool` of ``slots`` buffers that grows with the batch.

    A batch of B rows leases B rows of one buffer. When a batch needs more rows than a buffer holds,
    a new pool with room for 1.25 times as many is allocated and the old one is freed once its last
    lease is given back; a lease is never overwritten while held. See `graphrl.tensors` for the
    underlying reuse rule. When every buffer is held and some of them only by tensors a user kept
    (`StagingLease.release_when_unused`), `acquire` gives the lease a buffer of its own instead of
    waiting for them: a region of ``tier`` (then ``fallback``) under the same owner, counted against
    the manager's budget, freed by ``release()`` or when its last tensor is gone (`own_buffers`).

    Parameters
    ----------
    memory : MemoryManager
    row_shape : tuple of int
        Shape of one row.
    dtype : torch.dtype
    slots : int
        Buffers, >= 1: how many leases may be held at once.
    tier : Tier or str
        Tier of the buffers (then ``fallback``).
    fallback : sequence of Tier or str
    owner : str
        Owner name in the manager's statistics.
    rows : int
        Rows per buffer to start with (0: the first batch's size).

    Raises
    ------
    ValueError
        ``slots < 1`` or a negative ``rows``.
    """

    def __init__(self, memory: MemoryManager, row_shape: tuple[int, ...], dtype: torch.dtype, slots: int = 2,
                 tier: Tier | str = Tier.PINNED, fallback: tuple[Tier | str, ...] = (Tier.HOST,), *,
                 owner: str = "features.staging", rows: int = 0) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an int >= 1, got {slots!r}")
        if rows < 0:
            raise ValueError(f"rows must be >= 0, got {rows}")
        self.memory = memory
        self.row_shape = tuple(row_shape)
        self.dtype = dtype
        self.slots = slots
        self.tier = tier
        self.fallback = tuple(fallback)
        self.owner = owner
        self._rows = rows
        self._pool: StagingPool | None = None
        self._retired: list[StagingPool] = []
        self._own: list[weakref.finalize] = []  # the own buffers' finalizers (alive: region not yet freed)
        self._copies: list[tuple[Any, torch.Tensor]] = []  # own buffers' tensors kept until their events
        self._lock = threading.Lock()
        self._closed = False

    @property
    def capacity(self) -> int:
        """Rows per buffer now (0 before the first lease)."""
        pool = self._pool
        return pool.shape[0] if pool is not None else self._rows

    @property
    def region(self) -> Region | None:
        """The current pool's region (None before the first lease)."""
        return self._pool.region if self._pool is not None else None

    @property
    def own_buffers(self) -> int:
        """Buffers of their own (see the class docstring) whose region is not freed yet."""
        with self._lock:
            self._drop_copied()
            return sum(f.alive for f in self._own)

    def _keep_until(self, event: Any, tensor: torch.Tensor) -> None:
        """Hold ``tensor`` (an own buffer's) until ``event`` completes (`StagingLease.hold_until`)."""
        with self._lock:
            self._copies.append((event, tensor))

    def _drop_copied(self) -> None:
        """Let go of the own buffers' tensors whose events completed (lock held)."""
        if self._copies:
            self._copies = [(e, t) for e, t in self._copies if not e.query()]

    @property
    def held(self) -> int:
        """Pooled buffers not free now: leased, or given back when unused and still viewed (a retired
        pool none of whose buffers is held any more is freed first)."""
        with self._lock:
            if self._retired:
                self._close_unused_retired()
            pools = [p for p in (self._pool, *self._retired) if p is not None]
        return sum(p.slots - p.available for p in pools)

    def acquire(self, rows: int, timeout: float | None | object = _DEFAULT) -> StagingLease:
        """Lease ``rows`` rows of the next free buffer; never waits for a user's tensors.

        A free buffer is leased at once. When none is free and some are held only by tensors a user
        kept, the lease gets a buffer of its own (see the class docstring); when all are leased, it
        waits for a release.

        Raises
        ------
        TimeoutError
            Every buffer stayed leased for ``timeout`` seconds (default the pool's 60 s).
        ValueError
            The staging was closed.
        MemoryBudgetError
            A larger pool was needed, or a buffer of its own, and fits no tier tried.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"staging {self.owner!r} is closed")
            pool = self._pool
            if pool is None or pool.shape[0] < rows:
                old = pool.shape[0] if pool is not None else self._rows
                cap = max(rows, math.ceil(1.25 * old) if pool is not None else old, 1)
                new = StagingPool(self.memory, (cap, *self.row_shape), self.dtype, self.slots, self.tier,
                                  owner=self.owner, fallback=self.fallback)
                if pool is not None:
                    self._retired.append(pool)
                self._pool = pool = new
            if self._retired:
                self._close_unused_retired()
            self._drop_copied()
        try:
            buffer = pool.acquire(0)
        except TimeoutError:
            if pool.waiting_for_views:  # a user keeps tensors of some buffers: waiting could be forever
                return self._own_buffer(rows)
            buffer = pool.acquire() if timeout is _DEFAULT else pool.acquire(timeout)
        return StagingLease(buffer, rows, pool, self._released)

    def _own_buffer(self, rows: int) -> StagingLease:
        try:
            region = self.memory.allocate((max(rows, 1), *self.row_shape), self.dtype, self.tier,
                                          owner=self.owner, fallback=self.fallback)
        except MemoryBudgetError as err:
            raise MemoryBudgetError(
                err.tier, err.owner, err.asked, err.free, err.budget, err.attempts, err.note,
                lead=f"staging {self.owner!r}: all {self.slots} buffers are held by batches (or tensors "
                     f"taken from them) kept past the next batch, and a buffer of its own for this batch "
                     f"does not fit; release() or drop kept batches, or clone() what you keep"
                     + (f"; {err.lead}" if err.lead else ""),
            ) from err
        lease = _OwnLease(region, rows, self.row_shape, self.dtype, self._keep_until)
        with self._lock:
            self._own = [f for f in self._own if f.alive]
            self._own.append(lease.free)
        return lease

    def _close_unused_retired(self) -> None:
        """Close the retired pools whose every slot is free (lock held)."""
        still = []
        for pool in self._retired:
            if pool.available == pool.slots:
                pool.close()
            else:
                still.append(pool)
        self._retired = still

    def _released(self, pool: StagingPool) -> None:
        if pool is self._pool:
            return
        with self._lock:
            if pool in self._retired and pool.available == pool.slots:
                self._retired.remove(pool)
                pool.close()

    def close(self) -> None:
        """Free every buffer; idempotent. Held leases' tensors stay readable but are no longer counted."""
        with self._lock:
            self._closed = True
            pools = [p for p in (self._pool, *self._retired) if p is not None]
            self._pool, self._retired = None, []
            own, self._own = self._own, []
            copies, self._copies = self._copies, []
        for pool in pools:
            pool.close()  # waits for the copies from its buffers
        for event, _ in copies:  # a copy still reading a buffer of its own finishes before it is freed
            event.synchronize()
        for free in own:
            free()

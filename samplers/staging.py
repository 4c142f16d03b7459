"""Staging buffers for gathered rows that grow with the batch: `RowStaging` hands out `StagingLease`s.

A batch of B rows leases B rows of one of ``slots`` reusable buffers (a `graphrl.tensors.StagingPool`
in a memory-manager region: pinned host memory for a CPU gather on a CUDA machine, host memory without
CUDA, device memory for a GPU gather). A lease is never overwritten while held; ``lease.release()``
gives it back. When a batch needs more rows than a buffer holds, a pool 1.25 times as large replaces
the old one, which is freed once its last lease is released. `samplers.features.FeatureStore.staging`
makes one for a store's rows; `samplers.loader` leases one buffer per batch in flight
(docs/architecture.md#memory-tiers).

>>> staging = store.staging(slots=3)
>>> lease = staging.acquire(len(ids))
>>> store.gather_into(ids, lease.tensor)
>>> lease.release()
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import torch

from graphrl.memory import MemoryManager, Region, Tier
from graphrl.tensors import StagingBuffer, StagingPool

__all__ = ["RowStaging", "StagingLease"]

_DEFAULT = object()


class StagingLease:
    """Rows of one staging buffer held by one batch, from `RowStaging.acquire` until `release`.

    Attributes
    ----------
    tensor : torch.Tensor, shape [rows, *row]
        The leased rows (a view of the staging buffer).
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

    def release(self) -> None:
        """Give the buffer back (it may be overwritten at once); idempotent."""
        buffer, self._buffer = self._buffer, None
        if buffer is not None:
            buffer.release()
            self._on_release(self._pool)


class RowStaging:
    """Staging buffers for gathered rows: a `StagingPool` of ``slots`` buffers that grows with the batch.

    A batch of B rows leases B rows of one buffer. When a batch needs more rows than a buffer holds,
    a new pool with room for 1.25 times as many is allocated and the old one is freed once its last
    lease is released; a lease is never overwritten while held. See `graphrl.tensors` for the
    underlying reuse rule.

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

    def acquire(self, rows: int, timeout: float | None | object = _DEFAULT) -> StagingLease:
        """Lease ``rows`` rows of the next free buffer, waiting for a release if all are held.

        Raises
        ------
        TimeoutError
            Every buffer stayed held for ``timeout`` seconds (default the pool's 60 s).
        ValueError
            The staging was closed.
        MemoryBudgetError
            A larger pool was needed and fits no tier tried.
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
                    self._retire(pool)
                self._pool = pool = new
        buffer = pool.acquire() if timeout is _DEFAULT else pool.acquire(timeout)
        return StagingLease(buffer, rows, pool, self._released)

    def _retire(self, pool: StagingPool) -> None:
        if pool.available == pool.slots:
            pool.close()
        else:
            self._retired.append(pool)

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
        for pool in pools:
            pool.close()

"""BatchStaging: a store's staging pools and the views of each slot, which `replay.batch.Batch` views.

One `graphrl.tensors.StagingPool` per batch shape and device (``(B, L, device)``, a few shapes at a
time; older pools close, held buffers stay valid), laid out by `replay.layout.BatchLayout`; each slot's
views are made once (`StagedSlot`: tensors, numpy views, the flat byte views the gathers write, the
window table's scratch). A sampler acquires a `StagedSlot`, fills it and hands its buffer to a `Batch`.

>>> staging = BatchStaging(spec, memory, slots=4, timeout=None)
>>> slot = staging.acquire(256, 64, None, timeout=1.0)   # host slot: views of a [256, 64] batch
>>> batch = Batch(...)                                    # filled by the sampler, holding slot.buffer
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from graphrl.memory import MemoryManager
from graphrl.stream_order import SlotStreams, write_stream
from graphrl.tensors import StagingBuffer, StagingPool, zero_fill
from replay.layout import BatchLayout
from replay.spec import TrajectorySpec

__all__ = ["BatchStaging", "StagedSlot"]

_MAX_SHAPES = 4  # pools kept per store; older ones close (held buffers stay valid)


class _SlotFields(dict):
    """A slot's field views (name -> tensor), shared by every batch of the slot, and its ``mask``."""

    __slots__ = ("mask",)


@dataclass
class StagedSlot:
    """One acquired staging slot and its views (made once per slot; ``buffer`` is the current hand-out).

    Attributes
    ----------
    buffer : StagingBuffer
        The slot (release it, or hand it to a `Batch`).
    fields : dict of str to torch.Tensor
        ``[B, L, *field_shape]`` views.
    mask : torch.Tensor, bool [B, L]
    outs : dict of str to numpy.ndarray, or None
        Numpy views of ``fields`` (host slots only).
    flat : tuple
        Per field, the flat byte view the gathers write: numpy uint8 (host) or numba (device).
    mask_flat : numpy.ndarray, bool [B * L], or None
        The host mask as one flat array (host slots only).
    scratch : numpy.ndarray, int64 [6, B]
        The slot's window table while a sample fills it (rows `replay.table.META_FIELDS`, then the
        keys); private to the call holding the slot, never handed out.
    scratch_prob : numpy.ndarray, float64 [B]
        The draw probabilities, likewise.
    scratch_meta : dict of str to numpy.ndarray, or None
        The rows of ``scratch`` by `replay.table.META_FIELDS` name (the table's ``meta`` argument).
    addresses : numpy.ndarray, int64 [F], or None
        The address of each of ``flat``'s views, in spec order (host slots only; valid while the
        slot's pool is open).
    call : numpy.ndarray, or None
        Its sampler's compiled-call arguments for this slot (`replay.table.Table.transition_call` of
        ``addresses`` and ``mask_flat``), made on the slot's first transition sample; it lives and dies
        with these views.
    """

    buffer: StagingBuffer
    fields: dict[str, torch.Tensor]
    mask: torch.Tensor
    outs: dict[str, np.ndarray] | None
    flat: tuple
    mask_flat: np.ndarray | None = None
    scratch: np.ndarray | None = None
    scratch_prob: np.ndarray | None = None
    scratch_meta: dict[str, np.ndarray] | None = None
    addresses: np.ndarray | None = None
    call: np.ndarray | None = None


@dataclass
class _ShapePool:
    """One shape's staging pool, its layout, the views made for its slots (slot -> views) and, for a
    device pool, the stream each slot was last written on."""

    pool: StagingPool
    layout: BatchLayout
    views: dict[int, StagedSlot]
    streams: SlotStreams | None


class BatchStaging:
    """A store's staging pools: one per ``(B, L, device)``, at most a few shapes at a time.

    A host pool hands out the free slot released last (`graphrl.tensors.StagingPool`'s
    ``reuse="recent"``): a learner that releases each batch before the next sample gets the same slot,
    whose lines are still in the caches, so the gather writes it without reading it from memory first.

    A device pool's slots are held like host ones while a tensor taken from a dropped batch lives
    (``count_views``: each slot's tensor has its own storage), and a slot handed out for a gather on
    another stream than its last one's is ordered after the work queued there
    (`graphrl.stream_order.SlotStreams`: a GPU-side wait, never the host's).

    Parameters
    ----------
    spec : TrajectorySpec
    memory : MemoryManager
        Host slots: tier ``pinned`` (falling back to ``host``), owner ``replay.staging``; device slots:
        tier ``device``, owner ``replay.device_staging`` (host tier under the simulator).
    slots : int
        Batches that may be held at once per shape.
    timeout : float or None
        Default seconds `acquire` waits for a free slot.
    scratch_names : tuple of str
        Names of the first rows of each slot's ``scratch`` (`StagedSlot.scratch_meta`; at most 6).
    """

    def __init__(
        self,
        spec: TrajectorySpec,
        memory: MemoryManager,
        slots: int,
        timeout: float | None,
        scratch_names: tuple[str, ...] = (),
    ) -> None:
        self.spec = spec
        self.scratch_names = tuple(scratch_names)
        self.memory = memory
        self.slots = int(slots)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._pools: dict[tuple[int, int, str | None], _ShapePool] = {}
        self._evicted: list[StagingPool] = []  # closed pools whose region waits for a held buffer or a copy
        self._closed = False

    def acquire(
        self, batch: int, window: int, target: torch.device | None,
        timeout: float | None | Callable[[], float | None],
    ) -> StagedSlot:
        """A free slot for a [B, L] batch on ``target`` (None: host), with its views.

        ``timeout``: seconds, None (no limit), or a function giving the seconds left (such as
        `replay.sampler.Deadline`), called only when every slot of the shape is held
        (`graphrl.tensors.StagingPool.acquire`).

        Raises
        ------
        TimeoutError
            Every slot of the shape stayed held for ``timeout`` seconds.
        ValueError
            The memory manager's device tier places memory on another device than ``target``, or
            `close` ran (a pool another thread's new shape evicted is retried, not raised).
        MemoryBudgetError
            A new pool does not fit its tier.
        """
        key = (batch, window, None if target is None else str(target))
        if self._evicted:
            self._settle()
        while True:
            entry = self._pools.get(key)
            if entry is None:  # a new shape: made under the lock
                with self._lock:
                    entry = self._pool(batch, window, target)
            try:
                buf = entry.pool.acquire(timeout)
                break
            except ValueError:  # the pool closed (before or while waiting: its message says which)
                # closed by `close` raises; evicted by another thread's new shape (no longer the shape's
                # entry), the shape's pool is looked up (or made) again
                if self._closed or self._pools.get(key) is entry:
                    raise
        try:
            staged = entry.views.get(buf.slot)
            if staged is None:  # views die with their pool's entry: no evicted pool's views are reused
                staged = entry.views[buf.slot] = StagedSlot(buf, *self._make_views(entry.layout, buf, target))
                # a batch dropped later waits only for views and references beyond these
                buf.own_views((*staged.fields.values(), staged.mask))
            if entry.streams is not None:  # the gather and the mask are written on the current stream
                entry.streams.write_on(buf.slot, write_stream(target))  # type: ignore[arg-type]
        except BaseException:
            buf.release()
            raise
        staged.buffer = buf  # the slot is this caller's until it releases buf
        return staged

    def _make_views(self, layout: BatchLayout, buf: StagingBuffer, target: torch.device | None) -> tuple:
        fields, mask = layout.views(self.spec, buf.tensor)
        fields = _SlotFields(fields)
        fields.mask = mask
        scratch = np.zeros((6, layout.batch), dtype=np.int64)
        scratch_prob = np.zeros(layout.batch)
        meta = dict(zip(self.scratch_names, scratch, strict=False))
        if target is None:
            outs = {n: t.numpy() for n, t in fields.items()}
            flat = tuple(outs[n].reshape(-1).view(np.uint8) for n in self.spec)
            addresses = np.array([f.ctypes.data for f in flat], dtype=np.int64)
            return fields, mask, outs, flat, mask.numpy().reshape(-1), scratch, scratch_prob, meta, addresses
        from replay.cuda import flat_bytes  # numba.cuda only on the GPU path

        flat = tuple(flat_bytes(buf.tensor[off : off + nbytes]) for off, nbytes in layout.offsets.values())
        return fields, mask, None, flat, None, scratch, scratch_prob, meta, None

    def _pool(self, batch: int, window: int, target: torch.device | None) -> _ShapePool:
        if self._closed:
            raise ValueError("the store's staging is closed")
        key = (batch, window, None if target is None else str(target))
        entry = self._pools.get(key)
        if entry is not None:
            return entry
        layout = BatchLayout(self.spec, batch, window)
        if target is None:  # host staging: pinned with CUDA, else host
            tier, fallback, owner = "pinned", ("host",), "replay.staging"
        elif target.type == "cuda":  # the GPU gather's output batches
            tier, fallback, owner = "device", (), "replay.device_staging"
        else:  # the simulator: CPU tensors stand in for device memory
            tier, fallback, owner = "host", (), "replay.device_staging"
        with torch.cuda.device(target) if target is not None and target.type == "cuda" else nullcontext():
            pool = StagingPool(
                self.memory,
                (layout.nbytes,),
                torch.uint8,
                slots=self.slots,
                tier=tier,
                fallback=fallback,
                owner=owner,
                timeout=self.timeout,
                # host slots: the slot released last, its lines still in the caches (the gather writes it
                # without fetching it from memory); a device slot's order does not matter
                reuse="recent" if target is None else "round-robin",
                count_views=True,  # a device slot too is held while a tensor taken from it lives
            )
        placed = pool.region.tensor().device
        if target is not None and placed != target:
            pool.close()
            raise ValueError(
                f"device={str(target)!r}: the memory manager's device tier places memory on {placed}; "
                f"sample to {placed} or give the MemoryManager device={str(target)!r}"
            )
        zero_fill(pool.region.tensor())  # touch every page now, not inside the first gathers
        if len(self._pools) >= _MAX_SHAPES:  # keep a few shapes; older pools close (held buffers stay valid)
            old = self._pools.pop(next(iter(self._pools))).pool
            old.close(wait=False)  # an acquire racing it retries; no host wait under the lock
            if not old.settle():  # its region goes once its buffers are back and their copies done
                self._evicted.append(old)
        # device slots: each next gather ordered after the stream that wrote the slot last (first the fill's)
        streams = None if target is None else SlotStreams(self.slots, write_stream(target))
        entry = self._pools[key] = _ShapePool(pool, layout, {}, streams)
        return entry

    def _settle(self) -> None:
        """Free the evicted pools' regions that nothing reads any more (`StagingPool.settle`, no wait)."""
        with self._lock:
            self._evicted = [pool for pool in self._evicted if not pool.settle()]

    def close(self) -> None:
        """Close every pool, waiting for the copies announced from their slots; a pool's memory is freed
        once its batches are released (`graphrl.tensors.StagingPool.close`)."""
        with self._lock:
            self._closed = True
            pools = (*(entry.pool for entry in self._pools.values()), *self._evicted)
            self._pools.clear()
            self._evicted.clear()
        for pool in pools:  # the host waits for the copies here, outside the lock
            pool.close()

"""`PoolResource`: the pinned and device tiers' memory taken upstream once and reused by later allocations.

A `PoolResource` wraps a tier's `MemoryResource` (its *upstream*). A freed region's block stays with
the pool, still page-locked (pinned) or still allocated on the device, and a later allocation
of a size it fits is served from it: no ``mmap`` + ``cudaHostRegister`` and no ``cudaHostUnregister``
(which synchronises every GPU) per call. `MemoryManager` wraps its pinned and device tiers in one by
default (``MemoryManager(pool=False)`` does not); `PoolStats` counts registrations (upstream
allocations), unregistrations, pool hits and misses, and the bytes held and idle
(``mm.stats()["pools"]``).

- **Blocks.** An upstream block has exactly the size first asked for. An idle block serves a later
  request of the same byte count, whatever its shape and dtype (best fit; with ``max_waste > 0`` also
  one up to that fraction larger). Views are exactly the requested shape (a prefix of the block).
- **Budget.** Bytes held upstream (live and idle blocks) never exceed ``limit`` (the manager sets the
  tier's budget, less any buffers registered in place): before an upstream allocation that would pass
  it, the oldest idle blocks are released upstream (unregistered). Blocks are exact, so whatever the
  budget admits the pool can serve; ``max_waste > 0`` trades that guarantee for more reuse.
- **Views.** A block is reused only once every tensor viewing its last region is gone (reference
  counting), so tensors taken before a `Region.free` never see a later region's data.
- **CUDA.** Freeing a block records, on the freeing thread, a CUDA event on each stream whose work may
  still use it (`Region.free`'s ``streams``; default the current stream); reusing it waits on those
  events (the host for a pinned block, the current stream for a device block): no host wait on free.
  A free inside a CUDA graph capture records no event: the block is reused only after the capture.
- **Release.** `PoolResource.trim` releases idle blocks upstream; `MemoryManager.close` releases all. A
  block whose last region's views are still alive (a UVA kernel may read it) is released only when
  the last view dies.

>>> from graphrl.memory import MemoryManager
>>> mm = MemoryManager()
>>> mm.allocate((256, 64), "float32", "pinned", owner="x").free()
>>> mm.allocate((64, 256), "float32", "pinned", owner="x").free()  # the same block, no registration
>>> mm.stats()["pools"]["pinned"]["registrations"], mm.stats()["pools"]["pinned"]["pool_hits"]
(1, 1)
>>> mm.close()

References
----------
RMM (RAPIDS Memory Manager): ``pool_memory_resource``. PyTorch's caching host allocator: events
recorded on free, waited on before reuse.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch

from graphrl.memory.backing import Backing, TensorBacking
from graphrl.memory.resources import MemoryResource
from graphrl.memory.sizes import Tier, format_size

__all__ = ["PoolBacking", "PoolResource", "PoolStats", "capturing"]

logger = logging.getLogger(__name__)


def capturing() -> bool:
    """Whether this thread's current CUDA stream is capturing a CUDA graph (False before CUDA ran here)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _event_on(stream: Any) -> Any:
    """A CUDA event recorded on ``stream`` now."""
    event = torch.cuda.Event()
    event.record(stream)
    return event

POOLED_TIERS = (Tier.PINNED, Tier.DEVICE)


@dataclass
class PoolStats:
    """Counters of one tier's pool (``mm.stats()["pools"][tier]``).

    Attributes
    ----------
    registrations : int
        Upstream allocations so far (``mmap`` + ``cudaHostRegister`` on the pinned tier with CUDA;
        counted the same without CUDA), plus buffers registered in place (`MemoryManager.register`).
    unregistrations : int
        Blocks released upstream so far (trimmed or closed), plus registered buffers freed.
    pool_hits : int
        Allocations served from an idle block.
    pool_misses : int
        Allocations that needed an upstream allocation.
    held_bytes : int
        Bytes of the blocks held upstream now, live and idle.
    idle_bytes : int
        Bytes of the blocks held upstream and serving no region now.
    """

    registrations: int = 0
    unregistrations: int = 0
    pool_hits: int = 0
    pool_misses: int = 0
    held_bytes: int = 0
    idle_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict of ints."""
        return asdict(self)

    def plus(self, other: PoolStats) -> PoolStats:
        """Field-wise sum of two counters."""
        return PoolStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


class _Block:
    """One upstream allocation: its backing, a flat uint8 view, and the state of its reuse."""

    __slots__ = ("backing", "device", "doomed", "events", "is_pinned", "lease", "nbytes", "pool", "raw",
                 "seq", "streams")

    def __init__(self, pool: PoolResource, backing: Backing, nbytes: int) -> None:
        raw = backing.tensor().detach().reshape(-1).view(torch.uint8)
        if raw.numel() < nbytes:
            raise ValueError(f"the upstream resource of the {pool.tier} pool returned {raw.numel()} bytes, "
                             f"asked for {nbytes}")
        self.pool = pool
        self.backing = backing
        self.raw = raw
        self.nbytes = nbytes
        self.is_pinned = backing.is_pinned
        self.device = raw.device
        self.lease: weakref.ref[_Lease] | None = None  # the last region's views hold it alive
        self.events: tuple[Any, ...] = ()  # CUDA events recorded when the block was last freed
        self.streams: tuple[Any, ...] = ()  # streams freed during a graph capture: recorded on at reuse
        self.seq = 0  # when it was last freed (oldest first when trimming)
        self.doomed = False  # to be released upstream once its lease dies (a view outlived its region)

    def reusable(self) -> bool:
        return self.lease is None or self.lease() is None

    def lease_died(self, _ref: Any) -> None:
        """The last view of the block's region is gone: release it now if it was waiting for that."""
        if self.doomed:
            self.pool.release_doomed()


class _PoolLock:
    """The pool's lock (not re-entrant), whose release gives upstream what was released under it.

    Under the lock the pool only counts a block as released and queues it (``outgoing``); every
    release of the lock then hands the queue to the upstream resource with no lock held, so a garbage
    collection inside ``upstream.deallocate`` whose finalizer frees into the pool finds it free. A
    dying view's callback that finds the lock taken (another thread, or this one collecting garbage
    under it) sets ``dying`` before trying, and the holder, testing it after its release, releases
    the doomed blocks then: none is lost, whether or not a later trim or close comes.
    """

    __slots__ = ("_lock", "_pool")

    def __init__(self, pool: PoolResource) -> None:
        self._lock = threading.Lock()
        self._pool = pool

    def acquire(self, blocking: bool = True) -> bool:
        return self._lock.acquire(blocking)

    def release(self) -> None:
        self._lock.release()
        self._pool.settle()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Lease:
    """Exposes ``nbytes`` of a block to numpy or torch as a fresh allocation that keeps the block alive.

    Every view of a region keeps its lease alive; the pool reuses the block only once the lease is gone.
    """

    def __init__(self, raw: torch.Tensor, nbytes: int) -> None:
        self.raw = raw
        interface = {"shape": (nbytes,), "typestr": "|u1", "data": (raw.data_ptr(), False)}
        if raw.device.type == "cuda":
            self.__cuda_array_interface__ = {**interface, "strides": None, "version": 2}
        else:
            self.__array_interface__ = {**interface, "version": 3}


class PoolBacking(TensorBacking):
    """The backing of a pooled region: a view of ``nbytes`` at the start of a pool block."""

    def __init__(self, data: torch.Tensor, block: _Block) -> None:
        super().__init__(data, is_pinned=block.is_pinned)
        self.block = block
        self.marked = False
        self.reuse = True

    def freeing(self, streams: tuple[Any, ...] | None = None, reuse: bool = True) -> None:
        """Capture, on the freeing thread, what the block's reuse waits for (`PoolResource.mark_free`);
        `graphrl.memory.Region.free` calls it before handing the backing over (maybe to another thread).
        ``reuse=False``: a device block goes back upstream instead of idling (`PoolResource.deallocate`)."""
        self.block.pool.mark_free(self.block, streams)
        self.marked = True
        self.reuse = reuse
        if not reuse and self.block.device.type == "cuda":  # torch's allocator waits for these streams
            for stream in streams if streams is not None else (torch.cuda.current_stream(self.block.device),):
                self.block.raw.record_stream(stream)


class PoolResource:
    """A `MemoryResource` adaptor that keeps freed blocks and hands them to later allocations.

    Thread-safe; its lock is not re-entrant, so a finalizer must not free into it directly: under a
    `MemoryManager` every pool call runs inside a manager call, where a finalizer's free waits for the
    next call (`Region.free_soon`). It never calls the upstream resource under its lock: blocks
    released (trimmed, over ``limit`` or ``max_idle``, or doomed blocks whose last view died) go
    upstream once the lock is let go, by the thread letting it go.

    Parameters
    ----------
    upstream : MemoryResource
        The tier's resource (`PinnedResource`, `DeviceResource` or a test double); its backings must
        be tensors (``backing.tensor()`` views the block's memory).
    tier : Tier or str
        ``"pinned"`` or ``"device"``: named in messages and statistics.
    limit : int, optional
        Most bytes held upstream at once (idle blocks are released to stay within it); None: no
        limit. `MemoryManager` sets it to the tier's budget (`set_limit`).
    max_waste : float
        Largest fraction of an idle block a smaller request may leave unused, in [0, 1). Default 0:
        only a block of the same byte count is reused, so the pool serves whatever the budget admits.
        Above 0 the unused bytes of live blocks count against ``limit``, and an allocation the budget
        admits can fail near a full budget.
    max_idle : int, optional
        Most idle bytes kept; the oldest idle blocks beyond it are released on free. None: no bound
        but ``limit``.

    Raises
    ------
    ValueError
        A tier other than pinned or device, ``max_waste`` outside [0, 1), or a negative ``limit`` or
        ``max_idle``.
    TypeError
        ``upstream`` lacks ``allocate``, ``deallocate`` or ``capacity``.

    Examples
    --------
    >>> from graphrl.memory import MemoryManager, PinnedResource
    >>> pool = PoolResource(PinnedResource(), tier="pinned", max_waste=0.125)
    >>> mm = MemoryManager(resources={"pinned": pool})  # used as given, not wrapped again

    References
    ----------
    RMM's ``pool_memory_resource``; PyTorch's caching host allocator (events recorded on free).
    """

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        tier: Tier | str,
        limit: int | None = None,
        max_waste: float = 0.0,
        max_idle: int | None = None,
    ) -> None:
        self.tier = Tier.parse(tier)
        if self.tier not in POOLED_TIERS:
            raise ValueError(f"tier must be 'pinned' or 'device' for a PoolResource, got '{self.tier}'")
        for method in ("allocate", "deallocate", "capacity"):
            if not callable(getattr(upstream, method, None)):
                raise TypeError(
                    f"upstream must be a MemoryResource with {method}(), got {type(upstream).__name__}"
                )
        if not 0.0 <= float(max_waste) < 1.0:
            raise ValueError(f"max_waste must be in [0, 1), got {max_waste!r}")
        for name, value in (("limit", limit), ("max_idle", max_idle)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value!r}")
        self.upstream = upstream
        self.max_waste = float(max_waste)
        self.max_idle = max_idle
        self._limit = limit
        self._idle: list[_Block] = []  # oldest freed first
        self._doomed: list[_Block] = []  # released by a trim while a view lived: upstream when it dies
        self._outgoing: deque[_Block] = deque()  # counted as released: upstream at the lock's release
        self._dying = False  # a doomed block's last view died while the lock was taken
        self._stats = PoolStats()
        self._pending = 0  # bytes of upstream allocations under way
        self._seq = itertools.count()
        self._lock = _PoolLock(self)

    # -- MemoryResource

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        """A region of ``shape`` and ``dtype`` (``nbytes`` bytes) from an idle block or a new one.

        Zero-byte requests go to the upstream resource directly (not counted).

        Raises
        ------
        MemoryError
            Not even releasing every idle block leaves room for ``nbytes`` under ``limit`` (only
            possible with ``max_waste > 0``), or the upstream resource is exhausted.
        """
        if nbytes == 0:
            return self.upstream.allocate(shape, dtype, nbytes, name)
        with self._lock:
            block = self._take(nbytes)
            if block is not None:
                self._stats.pool_hits += 1
                self._stats.idle_bytes -= block.nbytes
            else:
                self._stats.pool_misses += 1
                self._reserve(nbytes)
        if block is None:
            block = self._new_block(nbytes, name)
        else:
            self._wait(block)
        return self._lease(block, shape, dtype, nbytes)

    def deallocate(self, backing: Backing) -> None:
        """Keep a pooled region's block for later allocations (other backings go upstream).

        Waits, before reuse, for the CUDA events `mark_free` recorded (on the current stream unless the
        region's `free` named the streams). A device block freed with ``reuse=False`` (a buffer its user
        outgrew: no later request has its size) goes upstream instead, once no view reads it; torch's
        caching allocator then reuses its memory only after the freeing streams' work (``record_stream``).
        Pinned blocks always idle here (releasing one unregisters it, which synchronises every GPU).
        """
        if not isinstance(backing, PoolBacking) or backing.block.pool is not self:
            self.upstream.deallocate(backing)
            return
        block = backing.block
        backing.data = None  # type: ignore[assignment]  # the lease dies with the region's last view
        if not backing.marked:  # freed here directly, not through a Region: this thread's current stream
            self.mark_free(block, None)
        if not backing.reuse and self.tier is Tier.DEVICE:  # outgrown: upstream, once no view reads it
            with self._lock:
                block.doomed = True
                self._doomed.append(block)
                self._release_doomed()
            return
        with self._lock:
            block.seq = next(self._seq)
            self._idle.append(block)
            self._stats.idle_bytes += block.nbytes
            if self.max_idle is not None and self._stats.idle_bytes > self.max_idle:
                self._release_idle(self._stats.idle_bytes - self.max_idle)

    def capacity(self) -> int:
        """The upstream resource's capacity."""
        return self.upstream.capacity()

    # -- pool control

    @property
    def limit(self) -> int | None:
        """Most bytes held upstream at once (None: no limit)."""
        return self._limit

    def set_limit(self, limit: int | None) -> None:
        """Set ``limit``, releasing the oldest idle blocks until the bytes held fit it (live ones stay).

        Raises
        ------
        ValueError
            A negative limit.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit!r}")
        with self._lock:
            self._limit = limit
            if limit is not None:
                self._release_idle(self._stats.held_bytes + self._pending - limit)

    def trim(self, nbytes: int | None = None) -> int:
        """Release idle blocks upstream (unregister them), oldest first: at least ``nbytes``, or all.

        Returns
        -------
        int
            Bytes released.
        """
        with self._lock:
            released = self._release_doomed()
            return released + self._release_idle(self._stats.idle_bytes if nbytes is None else nbytes)

    def stats(self) -> PoolStats:
        """A copy of the pool's counters."""
        with self._lock:
            return PoolStats(**self._stats.as_dict())

    def __repr__(self) -> str:
        s = self.stats()
        return (f"PoolResource(tier={self.tier.value}, held={s.held_bytes}, idle={s.idle_bytes}, "
                f"limit={self._limit})")

    # -- internals (the lock is held where noted)

    def _take(self, nbytes: int) -> _Block | None:
        """Best-fit reusable idle block for ``nbytes``, removed from the idle list. Lock held."""
        best_i, best = -1, None
        in_capture = capturing()
        for i, block in enumerate(self._idle):
            if in_capture and block.streams:  # its events can be recorded only outside the capture
                continue
            size = block.nbytes
            if size < nbytes or (size - nbytes) > self.max_waste * size:
                continue
            if (best is None or size < best.nbytes) and block.reusable():
                best_i, best = i, block
                if size == nbytes:
                    break
        if best is not None:
            del self._idle[best_i]
        return best

    def _reserve(self, nbytes: int) -> None:
        """Count ``nbytes`` as pending, releasing idle blocks first if the limit needs it. Lock held."""
        limit = self._limit
        if limit is not None:
            over = self._stats.held_bytes + self._pending + nbytes - limit
            if over > 0:
                over -= self._release_doomed()  # blocks whose views died since a trim left them
            if over > 0:
                self._release_idle(over)
            if self._stats.held_bytes + self._pending + nbytes > limit:
                raise MemoryError(
                    f"the {self.tier} pool holds {format_size(self._stats.held_bytes)} in live blocks and "
                    f"cannot take {format_size(nbytes)} more within its limit of {format_size(limit)}"
                    f"{self._why_full()}"
                )
        self._pending += nbytes

    def _why_full(self) -> str:
        """What holds a full pool's bytes beyond its regions, with the remedy, for its MemoryError. Lock
        held."""
        reasons = []
        viewed = sum(block.nbytes for block in self._doomed)
        if viewed:
            reasons.append(f"{format_size(viewed)} of them belong to freed regions that tensors taken from "
                           "them still view (an object closed but still referenced may keep such views): "
                           "drop those tensors")
        if self.max_waste > 0:
            reasons.append("live blocks larger than their regions (max_waste) may use the rest; lower "
                           "max_waste")
        return ": " + "; ".join(reasons) if reasons else ""

    def _new_block(self, nbytes: int, name: str) -> _Block:
        """Allocate a block upstream (``nbytes`` already pending); once more after a trim if exhausted."""
        try:
            try:
                backing = self.upstream.allocate((nbytes,), torch.uint8, nbytes, name)
            except (MemoryError, torch.OutOfMemoryError):
                if not self.trim():
                    raise
                logger.info("%s pool: upstream exhausted; released the idle blocks and retried", self.tier)
                backing = self.upstream.allocate((nbytes,), torch.uint8, nbytes, name)
            block = _Block(self, backing, nbytes)
        except BaseException:
            with self._lock:
                self._pending -= nbytes
            raise
        with self._lock:
            self._pending -= nbytes
            self._stats.held_bytes += nbytes
            self._stats.registrations += 1
        return block

    def _release_idle(self, nbytes: int) -> int:
        """Release idle blocks upstream, oldest first, until ``nbytes`` are released. Lock held.

        A block a view still reads (its lease alive: a UVA kernel may still read a pinned block) is never
        released: it leaves the idle list and goes upstream when its last view dies (`release_doomed`)."""
        released = 0
        keep: list[_Block] = []
        while released < nbytes and self._idle:
            block = self._idle.pop(0)
            self._stats.idle_bytes -= block.nbytes
            if not block.reusable():
                block.doomed = True
                keep.append(block)
                continue
            released += self._release(block)
        self._doomed.extend(keep)
        for block in keep:  # its lease may have died between the test and the flag
            if block.reusable():
                released += self._release_doomed()
                break
        return released

    def _release(self, block: _Block) -> int:
        """Count ``block`` as released and queue it for upstream (`settle`, at the lock's release). Lock
        held."""
        self._stats.held_bytes -= block.nbytes
        self._stats.unregistrations += 1
        block.events, block.streams = (), ()
        block.lease = None  # its callback refers to the block: no cycle keeps the block's memory
        block.raw = None  # type: ignore[assignment]  # nor its view of it
        self._outgoing.append(block)
        return block.nbytes

    def settle(self) -> None:
        """Give upstream (unregister) the blocks released under the lock, and release the doomed blocks
        whose last view died while the lock was taken; with no lock held. The lock's release calls it.
        """
        while self._outgoing:
            try:
                block = self._outgoing.popleft()
            except IndexError:  # another thread took the last one
                break
            try:
                self.upstream.deallocate(block.backing)
            except Exception as err:  # noqa: BLE001 - the block is dropped all the same
                logger.warning("%s pool: releasing a block of %s failed: %s", self.tier,
                               format_size(block.nbytes), err)
        if self._dying and self._lock.acquire(blocking=False):  # else the holder tests it after release
            try:
                self._dying = False
                self._release_doomed()
            finally:
                self._lock.release()  # settles again: gives those upstream, and any that died meanwhile

    def _release_doomed(self) -> int:
        """Release the doomed blocks whose last view died. Lock held."""
        released = 0
        for block in [b for b in self._doomed if b.reusable()]:
            self._doomed.remove(block)
            released += self._release(block)
        return released

    def release_doomed(self) -> None:
        """Release upstream the blocks a trim or close left because a view still read them, once their
        last view died (a view's finalizer calls it; also after the pool's manager closed). Never waits
        for the pool's lock: a holder (another thread, or this one garbage collecting under it) releases
        them when it lets the lock go.
        """
        self._dying = True  # before the test: a holder that makes it fail tests this after its release
        self.settle()

    def mark_free(self, block: _Block, streams: tuple[Any, ...] | None) -> None:
        """Record what reusing ``block`` must wait for, on the freeing thread: a CUDA event on each of
        ``streams`` (the streams whose queued work may still read or write it; None: this thread's current
        stream), for a block GPU work may use once CUDA ran here. No host wait. Inside a CUDA graph capture
        on this thread no event is recorded (it would be part of the graph, and recording or querying
        events breaks a global-mode capture, as torch's caching allocator defers them): the streams are
        kept and recorded on when the block is next taken outside a capture (later than needed, never
        earlier)."""
        if not (block.device.type == "cuda" or block.is_pinned) or not torch.cuda.is_initialized():
            block.events, block.streams = (), ()
            return
        if streams is None:
            streams = (torch.cuda.current_stream(block.device if block.device.type == "cuda" else None),)
        if capturing():
            block.events, block.streams = (), tuple(streams)
            return
        block.events, block.streams = tuple(_event_on(s) for s in streams), ()

    @staticmethod
    def _wait(block: _Block) -> None:
        """Order this use after the block's last users: the current stream waits for a device block's
        events, the host for a pinned block's (events recorded now on streams freed during a capture)."""
        events = block.events + tuple(_event_on(s) for s in block.streams)
        block.events, block.streams = (), ()
        for event in events:
            if block.device.type == "cuda":
                torch.cuda.current_stream(block.device).wait_event(event)
            elif not event.query():
                event.synchronize()

    @staticmethod
    def _lease(block: _Block, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int) -> PoolBacking:
        lease = _Lease(block.raw, nbytes)
        if block.device.type == "cuda":
            flat = torch.as_tensor(lease, device=block.device)
        else:
            flat = torch.from_numpy(np.asarray(lease))
        block.lease = weakref.ref(lease, block.lease_died)
        return PoolBacking(flat.view(dtype).view(shape), block)

"""Zero-copy tensors over memory-manager regions: DLPack export, device transfer, staging pools.

A sampler or a replay store hands its trainer views, not copies (docs/architecture.md#memory-tiers):
a batch is written into a reusable staging buffer that the `MemoryManager` owns (pinned when CUDA is
present), the trainer receives a view of that buffer, and `to_device` moves it with a non-blocking
copy that overlaps compute because the source is page-locked.

The staging reuse rule
----------------------
A `StagingPool` of N slots hands out buffers round-robin: slot 0, 1, ..., N-1, 0, ... (or, with
``reuse="recent"``, the slot released last, whose lines are still in the caches). A slot is
handed out again only after its previous holder released it (`StagingBuffer.release` or the end
of its ``with`` block); it is never reused while held. When all N slots are held, `acquire`
waits for a release, up to ``timeout`` seconds, then raises ``TimeoutError`` rather than deadlock
silently. So a producer thread can run at most N batches ahead of the trainer, and the trainer
owns batch t until it releases it. Tensors taken from a buffer alias the slot: after the release
they may be overwritten by the next holder; the buffer's own ``tensor`` refuses use after release.

A holder that cannot know whether its user still reads the slot (a batch dropped without being
released) calls `StagingBuffer.release_when_unused` instead: the slot returns to the pool only once
no tensor views it beyond the views its user recorded as its own cache (`StagingBuffer.own_views`).
On the CPU each slot's tensor has its own storage, so its views are counted by the storage's
reference count (torch's ``_storage_Use_Count``); `acquire` and `available` take back such slots once
their count falls. A GPU slot does so with ``count_views=True``, else it is released at once.

A copy that may still read a slot after its call returned (``.to("cuda", non_blocking=True)``) is announced
by `StagingBuffer.hold_until(event)`: released either way, the slot is not handed out again before the event
completes (``event.query()``, never blocking); a closed pool's region is freed only once every buffer was
released and no such event is pending (`StagingPool.settle`, no host wait; `StagingPool.close` may wait).

References
----------
Min et al., "Large Graph Convolutional Network Training with GPU-Oriented Data Communication
Architecture" (PyTorch-Direct), PVLDB 14(11), 2021: pinned host memory read by the GPU in place.
GEAR (Wang et al., ICML 2023): batches gathered into pinned buffers for the learner.
DLPack: the array-exchange protocol behind ``torch.from_dlpack`` and ``np.from_dlpack``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal, overload

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from graphrl.memory import MemoryManager, Region, Tier

__all__ = ["StagingBuffer", "StagingPool", "as_tensor", "to_device", "to_dlpack", "zero_fill"]

logger = logging.getLogger(__name__)


def zero_fill(tensor: torch.Tensor) -> torch.Tensor:
    """Zero ``tensor`` in place (touching every page) and return it.

    A CPU tensor is zeroed by numpy on the calling thread, never by torch's OpenMP team: in a process
    forked after its parent ran torch on several threads (a learner or actor started with ``fork``),
    torch's next parallel region waits forever for threads the child does not have. Other devices
    use ``Tensor.zero_``.
    """
    if tensor.device.type == "cpu":
        tensor.numpy().fill(0)
    else:
        tensor.zero_()
    return tensor

_DEFAULT = object()
_POLL_S = 0.005  # how often a full pool's `acquire` looks again at slots waiting for their views to go
_storage_users = torch._C._storage_Use_Count  # strong references to a storage, by a weak ref's cdata


def as_tensor(obj: Region | torch.Tensor | np.ndarray) -> torch.Tensor:
    """Return a ``torch.Tensor`` viewing ``obj``'s memory, without copying.

    Parameters
    ----------
    obj : Region, torch.Tensor or numpy.ndarray
        A region (its ``tensor()``; a copy for disk regions), a tensor (returned as is) or an array
        (``torch.from_numpy``).

    Raises
    ------
    TypeError
        ``obj`` is none of these.
    ValueError
        ``obj`` is a freed region.
    """
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Region):
        return obj.tensor()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    raise TypeError(f"expected a Region, torch.Tensor or numpy.ndarray, got {type(obj).__name__}")


def to_dlpack(obj: Region | torch.Tensor | np.ndarray) -> Any:
    """Export ``obj`` as a DLPack capsule (zero-copy) for any DLPack consumer.

    Parameters
    ----------
    obj : Region, torch.Tensor or numpy.ndarray
        What to export; see `as_tensor`.

    Returns
    -------
    PyCapsule
        A "dltensor" capsule, consumed once (``torch.from_dlpack(capsule)``, cupy, jax, ...).
        Objects that speak the protocol themselves (regions, tensors) can also be passed to
        ``from_dlpack`` directly.

    Raises
    ------
    TypeError, ValueError
        As `as_tensor`.
    """
    return as_tensor(obj).__dlpack__()


def to_device(
    obj: Region | torch.Tensor | np.ndarray, device: str | torch.device, non_blocking: bool = True
) -> torch.Tensor:
    """Move a tensor to ``device``: no copy when it is already there, a non-blocking copy from pinned memory.

    Parameters
    ----------
    obj : Region, torch.Tensor or numpy.ndarray
        Source (see `as_tensor`), any shape and dtype.
    device : str or torch.device
        Target, e.g. ``"cuda"``, ``"cuda:1"``, ``"cpu"``.
    non_blocking : bool
        Allow an asynchronous host-to-device copy. It is used only when the source is page-locked
        host memory and the target a GPU, where it overlaps the copy with compute on the current
        stream (reading the result on that stream is safe; other streams must synchronise). Copies
        from pageable memory and device-to-host copies are always synchronous, so their results
        are ready on return.

    Returns
    -------
    torch.Tensor
        ``obj`` itself (zero-copy) when it already lives on ``device`` (a ``"cuda"`` target without
        an index matches any GPU), else a copy on ``device``.

    Raises
    ------
    TypeError, ValueError
        As `as_tensor`; a malformed device string raises torch's ``RuntimeError``.
    """
    t = as_tensor(obj)
    target = torch.device(device)
    if t.device.type == target.type and target.index in (None, t.device.index):
        return t
    asynchronous = non_blocking and t.device.type == "cpu" and target.type == "cuda" and t.is_pinned()
    return t.to(target, non_blocking=asynchronous)


class StagingBuffer:
    """One slot of a `StagingPool`, held from `StagingPool.acquire` until `release`.

    Attributes
    ----------
    slot : int
        Index of the slot in the pool, 0 <= slot < slots.
    step : int
        How many buffers the pool handed out before this one (0 for the first).

    A context manager: leaving the ``with`` block releases it.
    """

    __slots__ = ("slot", "step", "_pool", "_view", "__weakref__")

    def __init__(self, pool: StagingPool, slot: int, step: int, view: torch.Tensor) -> None:
        self.slot = slot
        self.step = step
        self._pool = pool
        self._view: torch.Tensor | None = view

    @property
    def tensor(self) -> torch.Tensor:
        """The slot's memory, shape and dtype of the pool (pinned when the pool's region is); ValueError
        once the buffer was released."""
        view = self._view
        if view is None:
            raise ValueError(f"staging buffer of slot {self.slot} (step {self.step}) was released")
        return view

    def numpy(self) -> np.ndarray:
        """`tensor` as a numpy array (same memory)."""
        return self.tensor.numpy()

    @property
    def released(self) -> bool:
        return self._view is None

    def release(self, if_held: bool = False) -> None:
        """Give the slot back to the pool; it may be handed out (and overwritten) at once.

        ``if_held`` True: a buffer already released is left alone (a holder that may release twice); else a
        second release raises ``ValueError``.
        """
        if self._view is None:
            if if_held:
                return
            self._drop_view()  # raises, naming the slot
        self._view = None
        self._pool.release_slot(self.slot)

    def own_views(self, objects: tuple = ()) -> None:
        """Record the tensors viewing the slot now as its user's own (views it caches across hand-outs).

        Call it right after making them, holding no other view. `release_when_unused` then waits
        only for views beyond these, and for references to ``objects`` (the cached tensors it hands
        to its own users, which they may keep) beyond those alive now.
        """
        self._pool.own_views(self.slot, objects)

    def release_when_unused(self) -> None:
        """Give the slot back once no tensor views it beyond the views recorded by `own_views`.

        For a holder dropped by a user who may still read tensors taken from it: the slot stays
        held (never handed out) while such a tensor lives, and `StagingPool.acquire` takes it back
        after the last one is gone. A GPU slot of a pool without ``count_views`` is released at
        once, as by `release`. The buffer counts as released on return.

        Raises
        ------
        ValueError
            The buffer was already released.
        """
        self._drop_view()
        self._pool.release_slot_when_unused(self.slot)

    def hold_until(self, event: Any) -> None:
        """Keep the slot from being handed out again until ``event`` completes, however it is released.

        For a copy that may still read the slot after its call returned (``tensor.to("cuda",
        non_blocking=True)``): pass a CUDA event recorded after it (as torch's caching host allocator
        does). ``event`` needs ``query()`` (True once complete, never blocking) and ``synchronize()``.

        Raises
        ------
        ValueError
            The buffer was released.
        """
        if self._view is None:
            raise ValueError(f"staging buffer of slot {self.slot} (step {self.step}) was released")
        self._pool.hold_slot_until(self.slot, event)

    def _drop_view(self) -> None:
        """Count the buffer as released (a second release raises `ValueError` naming the slot)."""
        if self._view is None:
            raise ValueError(f"staging buffer of slot {self.slot} (step {self.step}) was already released")
        self._view = None

    def __enter__(self) -> StagingBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._view is not None:
            self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"StagingBuffer(slot={self.slot}, step={self.step}, {state})"


class StagingPool:
    """Reusable staging buffers of one shape and dtype in one region, handed out round-robin.

    A slot is never handed out while a previous holder still holds it: see the module docstring
    for the reuse rule. Buffers are views of one region of shape ``[slots, *shape]`` allocated from
    ``memory`` (pinned by default, so `to_device` copies from them without blocking).

    Parameters
    ----------
    memory : MemoryManager
        Where the slots' region comes from.
    shape : int or sequence of int
        Shape of one buffer.
    dtype : torch.dtype, numpy dtype or str
        Element type.
    slots : int
        Number of buffers, >= 1: how many batches may be in flight at once.
    tier : Tier or str
        Tier of the region: "pinned" (default), "device", "shared" or "host" (not "disk").
    owner : str
        Owner name for the manager's statistics.
    fallback : sequence of Tier or str
        Tiers to try when ``tier`` has no room (see `MemoryManager.allocate`).
    timeout : float or None
        Default seconds `acquire` waits for a free slot; None waits forever.
    reuse : "round-robin" or "recent"
        Which free slot `acquire` hands out: the least recently released (round-robin), or the most
        recently released (its memory still in the caches: for a consumer that releases each buffer
        before it acquires the next).
    count_views : bool
        A GPU slot's tensor gets its own storage too, its views counted (for `stream_order.SlotStreams`).

    Raises
    ------
    ValueError
        ``slots < 1``, a negative timeout, the disk tier, an unknown ``reuse``, or what
        `MemoryManager.allocate` raises.
    MemoryBudgetError
        No tier tried has room for ``slots * prod(shape) * itemsize`` bytes.

    Examples
    --------
    >>> mm = MemoryManager()
    >>> pool = StagingPool(mm, (1024, 128), torch.float32, slots=3, owner="features.staging")
    >>> with pool.acquire() as buf:  # doctest: +SKIP
    ...     torch.index_select(table, 0, ids, out=buf.tensor)
    ...     loss = model(to_device(buf.tensor, "cuda"))
    >>> pool.close(); mm.close()
    """

    def __init__(
        self,
        memory: MemoryManager,
        shape: int | tuple[int, ...],
        dtype: Any,
        slots: int = 2,
        tier: Tier | str = Tier.PINNED,
        *,
        owner: str = "staging",
        fallback: tuple[Tier | str, ...] = (),
        timeout: float | None = 60.0,
        reuse: str = "round-robin",
        count_views: bool = False,
    ) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an int >= 1, got {slots!r}")
        if reuse not in ("round-robin", "recent"):
            raise ValueError(f"reuse must be 'round-robin' or 'recent', got {reuse!r}")
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")
        tiers = [Tier.parse(t) for t in (tier, *fallback)]
        if Tier.DISK in tiers:
            raise ValueError("a staging pool needs memory that can be viewed in place: not the disk tier")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.owner = owner
        self.timeout = timeout
        self._region = memory.allocate((slots, *shape), dtype, tier, owner=owner, fallback=fallback)
        self._base = self._region.tensor()
        own = self._base.device.type == "cpu" or count_views  # a view per slot, own storage each
        self._views = [torch.from_dlpack(self._base[i]) if own else self._base[i] for i in range(slots)]
        self._storage_refs = [StorageWeakRef(v.untyped_storage()) for v in self._views] if own else []
        self._storages: list[int] | None = [r.cdata for r in self._storage_refs] if own else None
        self._own = [_storage_users(c) for c in self._storages] if self._storages else []
        self._own_objects: list[tuple] = [()] * slots  # per slot: the user's cached tensors, their references
        self._own_refs = [0] * slots
        self._unused: list[int] = []  # slots released when unused, still viewed by a user's tensor
        self._copies: list[tuple] = [()] * slots  # per slot: events of copies that may still read it
        self._released_by_copy = [False] * slots  # in _unused after `release`: wait for copies, not views
        self._free: deque[int] = deque(range(slots))
        self._recent = reuse == "recent"  # hand out the free slot released last (right end of _free)
        self._steps = 0
        # the condition's lock, entered directly where nothing waits (no Python frame of Condition's)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0  # `acquire` calls waiting for a slot: a release notifies only when one does
        self._closed = self._gone = False  # closed; region being freed

    @property
    def slots(self) -> int:
        return self._base.shape[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._base.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return self._base.dtype

    @property
    def region(self) -> Region:
        """The region holding every slot (tier, is_pinned, owner...)."""
        return self._region

    @property
    def is_pinned(self) -> bool:
        return self._region.is_pinned

    @property
    def available(self) -> int:
        """Slots free right now (taking back those `StagingBuffer.release_when_unused` left)."""
        with self._cond:
            if self._unused:
                self._take_back_unused()
            return len(self._free)

    @property
    def waiting_for_views(self) -> int:
        """Slots released by `StagingBuffer.release_when_unused` that a user's tensor still views (not those
        only a copy holds, `StagingBuffer.hold_until`: it completes, so `acquire` waits for it)."""
        with self._cond:
            if self._unused:
                self._take_back_unused()
            return sum(not self._released_by_copy[s] and self._viewed(s) for s in self._unused)

    @overload
    def acquire(
        self, timeout: float | None | Callable[[], float | None] | object = ..., if_open: Literal[False] = ...
    ) -> StagingBuffer: ...

    @overload
    def acquire(
        self, timeout: float | None | Callable[[], float | None] | object, if_open: bool
    ) -> StagingBuffer | None: ...

    def acquire(
        self, timeout: float | None | Callable[[], float | None] | object = _DEFAULT, if_open: bool = False
    ) -> StagingBuffer | None:
        """Hand out the next free slot, waiting for a release if every slot is held.

        Parameters
        ----------
        timeout : float, None or callable, optional
            Seconds to wait; 0 fails at once; None waits forever; default the pool's ``timeout``. A
            function giving the seconds left (such as ``replay.sampler.Deadline``) is called only when
            every slot is held (a free slot is handed out without reading a clock).
        if_open : bool
            True: a pool closed (before the call or while it waits) gives None instead of raising, for a
            caller that then acquires from another pool.

        Returns
        -------
        StagingBuffer or None
            The least recently released free slot (round-robin when released in order), or with
            ``reuse="recent"`` the most recently released one; None for a closed pool with ``if_open``.

        Raises
        ------
        TimeoutError
            All slots stayed held for ``timeout`` seconds (names the owner and the remedy).
        ValueError
            The pool is closed (and ``if_open`` is False).
        """
        with self._lock:
            if self._closed:
                if if_open:
                    return None
                raise ValueError(f"staging pool {self.owner!r} is closed")
            if self._unused:
                self._take_back_unused()
            if not self._free:  # a free slot is handed out at once; only a full pool waits
                wait = self.timeout if timeout is _DEFAULT else timeout() if callable(timeout) else timeout
                if not self._wait_free(wait):
                    raise TimeoutError(
                        f"staging pool {self.owner!r}: all {self.slots} slots stayed held for {wait} s; "
                        "release buffers (buffer.release() or a with-block) before acquiring more, or use "
                        "more slots"
                    )
                if self._closed:
                    if if_open:
                        return None
                    raise ValueError(f"staging pool {self.owner!r} was closed while waiting")
            slot = self._free.pop() if self._recent else self._free.popleft()
            step = self._steps
            self._steps += 1
        return StagingBuffer(self, slot, step, self._views[slot])

    def _wait_free(self, wait: float | None) -> bool:
        """Wait (lock held) until a slot is free or the pool closes; False after ``wait`` seconds.

        Slots waiting for their views to go are polled (nothing signals their last view's end).
        """
        end = None if wait is None else time.monotonic() + wait
        self._waiting += 1
        try:
            while not (self._free or self._closed):
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if self._unused:
                    self._cond.wait(_POLL_S if left is None else min(left, _POLL_S))
                    self._take_back_unused()
                else:
                    self._cond.wait(left)
            return True
        finally:
            self._waiting -= 1

    def _take_back_unused(self) -> None:
        """Free the slots left unused that no user's tensor views and no copy reads any more (lock held)."""
        still = []
        for slot in self._unused:
            if (not self._released_by_copy[slot] and self._viewed(slot)) or self._copying(slot):
                still.append(slot)
            else:
                self._released_by_copy[slot] = False
                self.release_slot(slot)  # the condition's lock is reentrant
        self._unused = still

    def _copying(self, slot: int) -> bool:
        """Whether a copy announced by `hold_slot_until` may still read ``slot`` (lock held)."""
        copies = self._copies[slot]
        if copies:
            copies = self._copies[slot] = tuple(e for e in copies if not e.query())
        return bool(copies)

    def hold_slot_until(self, slot: int, event: Any) -> None:
        """Hand ``slot`` out again only after ``event`` completes (`StagingBuffer.hold_until`: use that)."""
        with self._lock:
            self._copies[slot] = (*self._copies[slot], event)

    def _viewed(self, slot: int) -> bool:
        """Whether a tensor beyond the user's own views ``slot`` (slots of their own storage)."""
        # no reference to the user's objects goes while the pool is open: only a new one raises the sum
        return (
            _storage_users(self._storages[slot]) > self._own[slot]  # type: ignore[index]
            or sum(map(sys.getrefcount, self._own_objects[slot])) > self._own_refs[slot]
        )

    def own_views(self, slot: int, objects: tuple = ()) -> None:
        """Record the views of ``slot`` alive now as its user's own (`StagingBuffer.own_views`: use that)."""
        if self._storages is not None:
            with self._cond:
                self._own_objects[slot] = objects = tuple(objects)
                self._own_refs[slot] = sum(map(sys.getrefcount, objects))
                self._own[slot] = _storage_users(self._storages[slot])

    def release_slot_when_unused(self, slot: int) -> None:
        """`release_slot` once no tensor views ``slot`` beyond its user's own views; called once per
        hand-out by `StagingBuffer.release_when_unused` (use that)."""
        if self._storages is not None and self._viewed(slot):  # the caller holds the slot: no lock needed
            with self._cond:
                self._unused.append(slot)  # still held; `acquire` (or `settle`) takes it back once unviewed
                self._cond.notify()  # a waiting `acquire` starts polling it
        else:
            self.release_slot(slot)
        if self._closed:
            self.settle()

    def release_slot(self, slot: int) -> None:
        """Make ``slot`` free again; called once per hand-out by `StagingBuffer.release` (use that)."""
        with self._lock:
            if self._copies[slot] and self._copying(slot):  # wait for the copies only (the holder's word)
                self._released_by_copy[slot] = True
                self._unused.append(slot)
                self._cond.notify()  # a waiting `acquire` starts polling it
            else:
                self._free.append(slot)
                if self._waiting:
                    self._cond.notify()
        if self._closed:
            self.settle()

    def settle(self) -> bool:
        """Free a closed pool's region once every buffer was released and no copy reads a slot (never waits;
        views left by `release_when_unused` keep their memory, not its budget); True once freed (or by its
        manager's close). Each release after `close` calls it; call it again while copies are pending."""
        with self._lock:
            if not self._closed:
                return False
            back = len(self._free) + len(self._unused) == self.slots  # no holder can announce a copy now
            free = back and not self._gone and not any(map(self._copying, range(self.slots)))
            self._gone |= free  # one call frees it
        if free and not self._region.freed:  # the manager may have closed first
            self._region.free()
        return self._region.freed

    def close(self, wait: bool = True) -> None:
        """Close the pool (waiting `acquire` calls raise ``ValueError``); idempotent. Its region is freed by
        `settle`: held buffers stay valid and keep its bytes in the budget till released. ``wait``: first wait
        on the host for the copies announced (False: none, for a caller holding a lock; `settle` later)."""
        with self._cond:
            held = 0 if self._closed else self.slots - len(self._free)  # handed out or waiting for views
            self._closed = True
            copies = [event for events in self._copies for event in events] if wait else []
            self._cond.notify_all()
        for event in copies:  # a copy still reading a slot finishes before the memory goes
            event.synchronize()
        if held:
            logger.debug("staging pool %r closed with %d buffers still held", self.owner, held)
        self.settle()

    def __enter__(self) -> StagingPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"StagingPool(owner={self.owner!r}, slots={self.slots}, shape={self.shape}, dtype={self.dtype}, "
            f"tier={self._region.tier.value}, is_pinned={self.is_pinned}, available={self.available})"
        )

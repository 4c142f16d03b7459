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

References
----------
Min et al., "Large Graph Convolutional Network Training with GPU-Oriented Data Communication
Architecture" (PyTorch-Direct), PVLDB 14(11), 2021: pinned host memory read by the GPU in place.
GEAR (Wang et al., ICML 2023): batches gathered into pinned buffers for the learner.
DLPack: the array-exchange protocol behind ``torch.from_dlpack`` and ``np.from_dlpack``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

import numpy as np
import torch

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


def _same_device(t: torch.Tensor, device: torch.device) -> bool:
    if t.device.type != device.type:
        return False
    return device.index is None or t.device.index == device.index


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
    if _same_device(t, target):
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

    def __init__(self, pool: StagingPool, slot: int, step: int, view: torch.Tensor) -> None:
        self.slot = slot
        self.step = step
        self._pool = pool
        self._view: torch.Tensor | None = view

    @property
    def tensor(self) -> torch.Tensor:
        """The slot's memory, shape and dtype of the pool (pinned when the pool's region is).

        Raises
        ------
        ValueError
            The buffer was released.
        """
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

    def release(self) -> None:
        """Give the slot back to the pool; it may be handed out (and overwritten) at once.

        Raises
        ------
        ValueError
            The buffer was already released.
        """
        if self._view is None:
            raise ValueError(f"staging buffer of slot {self.slot} (step {self.step}) was already released")
        self._view = None
        self._pool.release_slot(self.slot)

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
        self._views = [self._base[i] for i in range(slots)]  # one view per slot, made once
        self._free: deque[int] = deque(range(slots))
        self._recent = reuse == "recent"  # hand out the free slot released last (right end of _free)
        self._held: set[int] = set()
        self._steps = 0
        self._cond = threading.Condition()
        self._closed = False

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
        """Slots free right now."""
        with self._cond:
            return len(self._free)

    def acquire(self, timeout: float | None | object = _DEFAULT) -> StagingBuffer:
        """Hand out the next free slot, waiting for a release if every slot is held.

        Parameters
        ----------
        timeout : float or None, optional
            Seconds to wait; 0 fails at once; None waits forever; default the pool's ``timeout``.

        Returns
        -------
        StagingBuffer
            The least recently released free slot (round-robin when released in order), or with
            ``reuse="recent"`` the most recently released one.

        Raises
        ------
        TimeoutError
            All slots stayed held for ``timeout`` seconds (names the owner and the remedy).
        ValueError
            The pool is closed.
        """
        wait = self.timeout if timeout is _DEFAULT else timeout
        with self._cond:
            if self._closed:
                raise ValueError(f"staging pool {self.owner!r} is closed")
            if not self._free:  # a free slot is handed out at once; only a full pool waits
                if not self._cond.wait_for(lambda: self._free or self._closed, timeout=wait):  # type: ignore[arg-type]
                    raise TimeoutError(
                        f"staging pool {self.owner!r}: all {self.slots} slots stayed held for {wait} s; "
                        "release buffers (buffer.release() or a with-block) before acquiring more, or use "
                        "more slots"
                    )
                if self._closed:
                    raise ValueError(f"staging pool {self.owner!r} was closed while waiting")
            slot = self._free.pop() if self._recent else self._free.popleft()
            self._held.add(slot)
            step = self._steps
            self._steps += 1
        return StagingBuffer(self, slot, step, self._views[slot])

    def release_slot(self, slot: int) -> None:
        """Make ``slot`` free again; called once per hand-out by `StagingBuffer.release` (use that)."""
        with self._cond:
            if self._closed:
                return
            self._held.discard(slot)
            self._free.append(slot)
            self._cond.notify()

    def close(self) -> None:
        """Free the pool's region; idempotent. Waiting `acquire` calls raise ``ValueError``.

        Tensors of buffers still held stay valid memory but no longer count against the budget.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            held = len(self._held)
            self._cond.notify_all()
        if held:
            logger.debug("staging pool %r closed with %d buffers still held", self.owner, held)
        if not self._region.freed:  # the manager may have closed first
            self._region.free()

    def __enter__(self) -> StagingPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"StagingPool(owner={self.owner!r}, slots={self.slots}, shape={self.shape}, dtype={self.dtype}, "
            f"tier={self._region.tier.value}, is_pinned={self.is_pinned}, available={self.available})"
        )

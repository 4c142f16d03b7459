"""`Region`: a block of memory on one tier with zero-copy tensor and numpy views; `RegionHandle` names
a shared one for other processes.

Regions come from `graphrl.memory.MemoryManager.allocate` or ``register``, or from `Region.attach`
in another process. A region lives until `Region.free`, the end of its ``with`` block or the
manager's ``close``; see docs/architecture.md#memory-tiers for the lifetime and sharing rules. A pinned
region's memory is page-locked for CUDA in `graphrl.memory.cudart` (``cudaHostRegister``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from graphrl.memory.backing import Backing, ShmBacking, ZarrBacking
from graphrl.memory.dtypes import DType, parse_dtype
from graphrl.memory.pool import PoolBacking
from graphrl.memory.shm import ShmSegment
from graphrl.memory.sizes import Tier, parse_shape, shape_bytes

if TYPE_CHECKING:
    from graphrl.memory.manager import MemoryManager

__all__ = ["Region", "RegionHandle", "free_quietly"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegionHandle:
    """A picklable name for a shared region, enough for another process to attach to it.

    Parameters
    ----------
    name : str
        The segment's name in /dev/shm (no leading slash).
    shape : tuple of int
        The region's shape.
    dtype : str
        Its dtype's name ("float32", "bfloat16", ...).
    owner : str
        The owner that created it (informative).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    owner: str = ""

    def attach(self) -> Region:
        """Map the region into this process: `Region.attach` of this handle."""
        return Region.attach(self)


class Region:
    """A block of memory on one tier, with zero-copy tensor and numpy views.

    Made by `MemoryManager.allocate`, `MemoryManager.register` or `Region.attach`; never constructed
    directly. Attributes are read-only.

    Attributes
    ----------
    shape : tuple of int
        Shape of the views.
    dtype : torch.dtype
        Element type of the views.
    nbytes : int
        ``prod(shape) * itemsize`` (`graphrl.memory.sizes.shape_bytes`): what the region counts against its
        tier's budget.
    tier : Tier
        Where it lives (the tier that had room, after any fallback).
    owner : str
        Who asked for it; statistics are kept per owner.
    device : str
        Device of ``tensor()``: ``"cuda:0"`` for device regions with CUDA, else ``"cpu"``.
    is_pinned : bool
        Page-locked host memory that GPU kernels can read through UVA (False without CUDA).
    name : str or None
        Shared regions: the /dev/shm name other processes attach by.
    path : pathlib.Path or None
        Disk regions: the zarr array's directory.
    owns : bool
        False for regions attached from another process (freeing them only unmaps).

    A region is a context manager: leaving the ``with`` block frees it (unless already freed).
    It supports DLPack (``torch.from_dlpack(region)``, ``np.from_dlpack(region)``) with the same
    zero-copy rules as ``tensor()``. Pickling a shared region pickles its handle: unpickling attaches.

    Raises
    ------
    ValueError
        Any use after `free` (``tensor``, ``numpy``, ``write``, ``__dlpack__``), and a second `free`.
    """

    def __init__(
        self,
        *,
        shape: tuple[int, ...],
        dtype: DType,
        tier: Tier,
        owner: str,
        backing: Backing,
        manager: MemoryManager | None,
        name: str | None = None,
        path: Path | None = None,
    ) -> None:
        self.shape = shape
        self.dtype = dtype.torch
        self._dt = dtype
        self.nbytes = shape_bytes(shape, dtype.itemsize)
        self.tier = tier
        self.owner = owner
        self.device = backing.device
        self.is_pinned = backing.is_pinned
        self.name = name
        self.path = path
        self.owns = manager is not None
        self._backing: Backing | None = backing
        self._manager = manager
        self._lock = threading.Lock()

    # -- construction for other processes

    @classmethod
    def attach(
        cls, handle: RegionHandle | str, shape: Any = None, dtype: Any = None
    ) -> Region:
        """Map a shared region created by another process (or this one) into this process.

        Parameters
        ----------
        handle : RegionHandle or str
            The region's handle, or its name together with ``shape`` and ``dtype``.
        shape : tuple of int, optional
            Needed with a bare name.
        dtype : torch.dtype, numpy dtype or str, optional
            Needed with a bare name.

        Returns
        -------
        Region
            A non-owning shared region (``owns == False``): writes are visible to every process that
            maps it; `free` unmaps it here and never unlinks it; it counts against no budget.

        Raises
        ------
        FileNotFoundError
            No shared region has that name (its owner freed it or exited).
        ValueError
            A bare name without shape and dtype, or a segment smaller than ``shape`` and ``dtype`` need.

        Examples
        --------
        In an actor process, with the handle the owner sent (``owner_region.handle()``):

        >>> region = Region.attach(handle)  # doctest: +SKIP
        >>> region.tensor()[step] = obs  # doctest: +SKIP
        """
        if isinstance(handle, str):
            if shape is None or dtype is None:
                raise ValueError(f"attaching shared region {handle!r} by name needs shape and dtype")
            handle = RegionHandle(handle, parse_shape(shape), parse_dtype(dtype).name)
        dt = parse_dtype(handle.dtype)
        shp = parse_shape(handle.shape)
        nbytes = shape_bytes(shp, dt.itemsize)
        segment = ShmSegment.open(handle.name, nbytes)
        backing = ShmBacking(segment, dt.torch, shp, nbytes)
        return cls(shape=shp, dtype=dt, tier=Tier.SHARED, owner=handle.owner or "attached", backing=backing,
                   manager=None, name=handle.name)

    def handle(self) -> RegionHandle:
        """The picklable handle other processes attach this shared region by.

        Raises
        ------
        ValueError
            The region is not on the shared tier (other tiers are private to this process), or was
            freed (its name may already be gone).
        """
        if self.tier is not Tier.SHARED or self.name is None:
            raise ValueError(f"only shared regions have handles; this region is on tier '{self.tier}'")
        self._use()
        return RegionHandle(self.name, self.shape, self._dt.name, self.owner)

    def __reduce__(self):
        if self.tier is not Tier.SHARED:
            raise TypeError(
                f"a region on tier '{self.tier}' is private to its process and cannot be pickled; "
                "allocate it on the shared tier to send it to other processes"
            )
        return (Region.attach, (self.handle(),))

    # -- views

    def _use(self) -> Backing:
        backing = self._backing
        if backing is None:
            raise ValueError(f"{self._label()} was freed; it cannot be used")
        return backing

    def tensor(self) -> torch.Tensor:
        """A ``torch.Tensor`` of ``shape`` and ``dtype`` over the region's memory.

        Zero-copy on every tier but disk: writes through it are the region's bytes. On the disk tier
        it is a fresh copy read from the zarr array (write back with `write`).

        Raises
        ------
        ValueError
            The region was freed.
        """
        return self._use().tensor()

    def numpy(self) -> np.ndarray:
        """A numpy array over the region's memory (a copy for disk regions, as `tensor`).

        Raises
        ------
        ValueError
            The region was freed, or lives on a GPU (copy it with ``tensor().cpu().numpy()``).
        TypeError
            The dtype has no numpy equivalent (bfloat16).
        """
        return self._use().numpy()

    def write(self, value: Any) -> None:
        """Copy ``value`` (a tensor, array or scalar, broadcast to ``shape``) into the region.

        Raises
        ------
        ValueError
            The region was freed, or ``value`` does not broadcast to ``shape``.
        """
        backing = self._use()
        try:
            backing.write(value)
        except RuntimeError as exc:  # torch reports shape mismatches as RuntimeError
            shape = tuple(np.shape(value))
            raise ValueError(f"cannot write a value of shape {shape} into {self._label()}: {exc}") from exc

    def zarr(self) -> Any:
        """The zarr array behind a disk region, for partial reads and writes (``region.zarr()[a:b] = x``).

        Raises
        ------
        ValueError
            The region is not on the disk tier, or was freed.
        """
        backing = self._use()
        if not isinstance(backing, ZarrBacking):
            raise ValueError(f"only disk regions have a zarr array; this region is on tier '{self.tier}'")
        return backing.array

    def data_ptr(self) -> int:
        """Address of the first byte (device or host), e.g. for UVA kernels.

        Raises
        ------
        ValueError
            The region was freed or lives on disk.
        """
        backing = self._use()
        if backing.copies:
            raise ValueError(f"{self._label()} lives on disk and has no address")
        return backing.tensor().data_ptr()

    def __dlpack__(self, **kwargs: Any) -> Any:
        """DLPack capsule of `tensor` (zero-copy except for disk regions); keywords go to torch."""
        return self.tensor().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[Any, int]:
        return self.tensor().__dlpack_device__()

    # -- lifetime

    def unlink(self) -> None:
        """Remove this shared region's name from /dev/shm now, keeping the region and its mapping.

        POSIX shared memory outlives a name: after ``unlink`` the segment stays mapped (and readable
        and writable) in this process and in every process that has already attached it, and the
        kernel frees it when the last mapping goes, even if a process is killed by a signal. Use it
        once every process that needs the region has attached: nothing is then left in /dev/shm
        whatever happens to the processes. Afterwards attaching by name or handle (or unpickling the
        region) raises FileNotFoundError; `free` and the manager's ``close`` still unmap the region
        and return its bytes to the budget, and do not fail on the missing name. The budget and
        statistics do not change: the bytes stay in use until `free`. Idempotent.

        Raises
        ------
        ValueError
            The region is not on the shared tier, was attached from another process (only the
            creating manager's region may unlink; ``owns == False``), or was freed.

        Examples
        --------
        >>> region = mm.allocate(n, "int64", "shared", owner="graph")  # doctest: +SKIP
        >>> send(region.handle()); wait_until_everyone_attached()        # doctest: +SKIP
        >>> region.unlink()  # /dev/shm is clean; the region keeps working  # doctest: +SKIP
        """
        backing = self._use()
        if self.tier is not Tier.SHARED or not isinstance(backing, ShmBacking):
            raise ValueError(f"only shared regions have a name to unlink; {self._label()} is not shared")
        if not self.owns:
            raise ValueError(f"{self._label()} was attached, not created here: only its owner may unlink it")
        backing.segment.unlink()

    @property
    def freed(self) -> bool:
        """True once `free` ran (or the manager closed)."""
        return self._backing is None

    def _take(self) -> Backing | None:
        """Mark the region freed and return its backing, once; None if it was freed already.

        Allocates nothing under the lock, so no finalizer (garbage collection) can run while it is held.
        """
        with self._lock:
            backing = self._backing
            self._backing = None
        return backing

    def _claim(self) -> Backing:
        """`_take`, raising ValueError on a second call (double free)."""
        backing = self._take()
        if backing is None:
            raise ValueError(f"{self._label()} was already freed (double free)")
        return backing

    def free(self, streams: tuple[Any, ...] | None = None, reuse: bool = True) -> None:
        """Return the region's bytes to its tier's budget and release the memory.

        Shared regions are unlinked from /dev/shm (attached ones only unmapped), disk regions are
        deleted. Tensors obtained earlier stay valid (they keep host and device memory alive)
        but no longer count against the budget.

        Parameters
        ----------
        streams : tuple of torch.cuda.Stream, optional
            A pinned or device region: the streams whose queued work may still use it. The pool reuses
            its block only after that work (events recorded on them here, on the freeing thread: no
            host wait; `graphrl.memory.pool`). Default: this thread's current stream.
        reuse : bool
            False: a device region's pooled block goes back upstream rather than idling in the pool (a
            buffer outgrown by its user; `graphrl.memory.PoolResource.deallocate`).

        Raises
        ------
        ValueError
            The region was already freed.
        """
        backing = self._claim()
        _freeing(backing, streams, reuse)
        if self._manager is not None:
            self._manager.deallocate(self, backing)
        else:
            self._unmap(backing)

    def free_soon(self, streams: tuple[Any, ...] | None = None, reuse: bool = True) -> None:
        """Free the region from a finalizer: never raises on a freed region, never deadlocks its manager.

        The one way finalizers free regions (`free_quietly` calls it). A finalizer may run wherever
        Python drops a reference or collects garbage, including inside the manager's own critical
        section on the same thread, or its resources', whose locks are not re-entrant: the region is
        marked freed at once, and its bytes go back to the budget now unless a section is in the way
        (this thread holds the manager's lock or is inside a call into a resource, or another thread
        holds the lock); then when that section ends (`MemoryManager.release_soon`). A region freed
        already (by `free`, its manager's ``close`` or another thread) is left alone. Use `free` in
        plain code: it raises on a double free. ``streams`` and ``reuse`` as in `free`: the events are
        recorded here, on the freeing thread, whichever thread gives the bytes back.
        """
        backing = self._take()
        if backing is None:
            return
        _freeing(backing, streams, reuse)
        if self._manager is not None:
            self._manager.release_soon(self, backing)
        else:
            self._unmap(backing)

    @staticmethod
    def _unmap(backing: Backing) -> None:
        """Unmap an attached region's segment (a region without a manager)."""
        if isinstance(backing, ShmBacking):
            backing.segment.release()
            backing.data = None  # type: ignore[assignment]

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.freed:
            try:
                self.free()
            except ValueError:  # freed by another thread in between: nothing left to do
                logger.debug("%s was freed concurrently", self._label())

    def _label(self) -> str:
        where = f" {self.name!r}" if self.name else ""
        return f"region{where} (tier '{self.tier}', owner {self.owner!r}, {self.shape} {self._dt.name})"

    def __repr__(self) -> str:
        extra = ", freed" if self.freed else ""
        extra += f", name={self.name!r}" if self.name else ""
        extra += f", path='{self.path}'" if self.path else ""
        return (
            f"Region(tier={self.tier.value}, owner={self.owner!r}, shape={self.shape}, "
            f"dtype={self._dt.name}, nbytes={self.nbytes}, device={self.device!r}, "
            f"is_pinned={self.is_pinned}{extra})"
        )


def _freeing(backing: Backing, streams: tuple[Any, ...] | None, reuse: bool) -> None:
    """A pooled block's reuse waits for ``streams`` (None: this thread's current stream), captured now."""
    if isinstance(backing, PoolBacking):
        backing.freeing(streams, reuse)


def free_quietly(region: Region) -> None:
    """Free ``region`` unless it is freed already; safe in a finalizer: `Region.free_soon`.

    The finalizer for regions handed out as tensors: ``weakref.finalize(tensor, free_quietly, region)``.
    """
    region.free_soon()

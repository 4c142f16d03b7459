"""Memory resources, one per tier: allocate and free backing memory, no budgets (RMM's memory resources).

`MemoryResource` is the interface (``allocate``, ``deallocate``, ``capacity``); `HostResource`,
`PinnedResource`, `DeviceResource`, `SharedResource` and `DiskResource` implement it for the five
tiers. The manager wraps each in its limiting and statistics layer (`graphrl.memory.accounts`), and
the pinned and device tiers in a pool (`graphrl.memory.pool.PoolResource`) first.
Pass your own to ``MemoryManager(resources={"pinned": ...})`` for custom allocators and tests.

References
----------
RMM (RAPIDS Memory Manager): ``device_memory_resource``.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import shutil
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from graphrl.memory import cudart
from graphrl.memory.backing import Backing, ShmBacking, TensorBacking, ZarrBacking
from graphrl.memory.dtypes import TORCH_TO_NUMPY
from graphrl.memory.shm import SHM_DIR, ExitCleanup, ShmSegment
from graphrl.process_origin import ProcessOrigin, made_here

__all__ = ["DeviceResource", "DiskResource", "HostResource", "MemoryResource", "PinnedResource",
           "SharedResource"]

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 16 * 2**20  # bytes of one zarr chunk of a disk region (whole rows)


class MemoryResource(Protocol):
    """Allocates and frees one tier's backing memory; the manager adds budgets and statistics on top.

    The extension point for custom allocators and for tests (``MemoryManager(resources={...})``),
    after RMM's ``device_memory_resource``. ``allocate`` raises ``MemoryError`` (or
    ``torch.OutOfMemoryError``) when the memory itself is exhausted; the manager then releases the
    reservation and tries the next fallback tier.
    """

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing: ...

    def deallocate(self, backing: Backing) -> None: ...

    def capacity(self) -> int:
        """Bytes the machine offers on this tier: the budget of a tier left out of ``budgets``."""
        ...


def _physical_ram() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class HostResource:
    """Plain host memory (``torch.empty`` on the CPU)."""

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        return TensorBacking(torch.empty(shape, dtype=dtype), is_pinned=False)

    def deallocate(self, backing: Backing) -> None:
        return None  # the tensor's storage goes when its last view does

    def capacity(self) -> int:
        return _physical_ram()


class PinnedResource(HostResource):
    """Page-locked host memory with CUDA; plain host memory (``is_pinned == False``) without.

    With CUDA an allocation is an anonymous, page-aligned mapping of exactly its size, page-locked
    with ``cudaHostRegister`` (mapped into the GPU's address space under UVA) and unregistered by
    `deallocate` (which synchronises the GPUs first, so that no asynchronous copy still reads it);
    the pages go back to the OS once no tensor views them. The manager puts a
    `graphrl.memory.pool.PoolResource` on top, which keeps freed blocks registered for later
    allocations and deallocates them here only when trimmed or closed. We avoid
    ``torch.empty(..., pin_memory=True)``: torch's caching host allocator rounds every request up to
    a power of two, so a 5 GiB region would pin 8 GiB, and the budget would no longer describe the
    machine.

    References
    ----------
    PyTorch-Direct (Min et al., PVLDB 2021): GPU kernels read pinned host memory in place through UVA.
    DGL's ``pin_memory_inplace`` and torch's ``pinned_use_cuda_host_register`` option likewise
    register ordinary host memory.
    """

    def __init__(self, cuda: bool | None = None) -> None:
        self._cuda = cuda  # None: ask torch.cuda.is_available() on first use; tests may force the CUDA path
        self._told = False

    @property
    def cuda(self) -> bool:
        if self._cuda is None:
            self._cuda = torch.cuda.is_available()
        return self._cuda

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        if self.cuda:
            buf = mmap.mmap(-1, max(nbytes, 1))  # page-aligned: no page shared with another registration
            raw = torch.from_numpy(np.frombuffer(buf, dtype=np.uint8, count=nbytes))
            data = raw.view(dtype).view(shape)
            ptr = data.data_ptr() if nbytes else None
            if ptr is not None:
                cudart.host_register(ptr, nbytes)
            return TensorBacking(data, is_pinned=True, registered_ptr=ptr)
        if not self._told:
            self._told = True
            logger.info("no CUDA: the pinned tier is plain host memory (region.is_pinned == False)")
        return TensorBacking(torch.empty(shape, dtype=dtype), is_pinned=False)

    def deallocate(self, backing: Backing) -> None:
        """Unregister memory this resource page-locked (``cudaHostUnregister``, after a GPU sync)."""
        ptr = getattr(backing, "registered_ptr", None)
        if ptr is not None:
            cudart.host_unregister(ptr)
            backing.registered_ptr = None  # type: ignore[attr-defined]


class DeviceResource:
    """GPU memory (``torch.empty`` on a CUDA device); host memory without CUDA (``device == 'cpu'``)."""

    def __init__(self, device: str | torch.device | None = None) -> None:
        self._device = torch.device(device) if device is not None else None
        self._cuda: bool | None = None
        self._warned = False

    @property
    def cuda(self) -> bool:
        if self._cuda is None:
            self._cuda = torch.cuda.is_available()
        return self._cuda

    def _target(self) -> torch.device:
        if self._device is not None:
            return self._device
        return torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        target = self._target()
        if target.type == "cpu" and self._device is None and not self._warned:  # not asked for: say so once
            self._warned = True
            logger.warning("no CUDA device: the device tier resolves to host memory (region.device == 'cpu')")
        return TensorBacking(torch.empty(shape, dtype=dtype, device=target), is_pinned=False)

    def deallocate(self, backing: Backing) -> None:
        return None

    def capacity(self) -> int:
        target = self._target()
        if target.type == "cuda":
            return torch.cuda.get_device_properties(target).total_memory
        return _physical_ram()


class SharedResource:
    """POSIX shared memory (``/dev/shm``), mode 0600, attachable by name from other processes."""

    def __init__(self, cleanup: ExitCleanup | None = None) -> None:
        self._cleanup = cleanup or ExitCleanup()

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        segment = ShmSegment.create(name, nbytes)
        with self._cleanup.lock:
            self._cleanup.segments[name] = segment
        return ShmBacking(segment, dtype, shape, nbytes)

    def deallocate(self, backing: Backing) -> None:
        assert isinstance(backing, ShmBacking)
        segment = backing.segment
        segment.unlink()
        with self._cleanup.lock:
            self._cleanup.segments.pop(segment.name, None)
        segment.release()
        backing.data = None  # type: ignore[assignment]

    def capacity(self) -> int:
        if not SHM_DIR.is_dir():
            return 0
        st = os.statvfs(SHM_DIR)
        return st.f_blocks * st.f_frsize


class DiskResource:
    """Zarr v3 arrays under ``spill_dir``, one per region, uncompressed, chunked by rows."""

    def __init__(self, spill_dir: str | os.PathLike[str] | None, cleanup: ExitCleanup | None = None) -> None:
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        self._cleanup = cleanup or ExitCleanup()

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        import zarr
        from zarr.storage import LocalStore

        if self.spill_dir is None:
            raise ValueError("the disk tier needs spill_dir: MemoryManager(spill_dir='spill/')")
        npd = TORCH_TO_NUMPY[dtype]
        path = self.spill_dir / f"{name}.zarr"
        row_bytes = npd.itemsize * math.prod(shape[1:]) if shape else npd.itemsize
        rows = max(1, _CHUNK_BYTES // max(row_bytes, 1))
        chunks = (max(1, min(shape[0], rows)), *(max(1, d) for d in shape[1:])) if shape else ()
        with self._cleanup.lock:
            self._cleanup.paths.add(path)
        array = zarr.create_array(
            store=LocalStore(path),
            shape=shape,
            dtype=npd,
            chunks=chunks,
            fill_value=np.zeros((), dtype=npd).item(),
            compressors=None,
            zarr_format=3,
        )
        return ZarrBacking(array, path, npd, ProcessOrigin())

    def deallocate(self, backing: Backing) -> None:
        """Delete the array's folder, in the process that made it only (a forked child that frees an
        inherited region drops its handle and leaves the parent's data alone, as shared segments are
        unlinked by their creator only). A folder already gone is logged, not raised: its bytes are
        returned all the same."""
        assert isinstance(backing, ZarrBacking)
        if made_here(backing.origin):
            try:
                shutil.rmtree(backing.path, ignore_errors=False)
            except FileNotFoundError:
                logger.warning("spill array %s was already deleted (by another process?)", backing.path)
            with self._cleanup.lock:
                self._cleanup.paths.discard(backing.path)
        backing.array = None

    def capacity(self) -> int:
        if self.spill_dir is None:
            return 0
        st = os.statvfs(self.spill_dir)
        return st.f_bavail * st.f_frsize

"""The unified memory manager (DESIGN §2): every large buffer of both engines, under one budget per tier.

A `MemoryManager` hands out `Region`\\ s on five tiers, fastest first: ``device`` (GPU memory),
``pinned`` (page-locked host memory that GPU kernels read in place through UVA), ``shared`` (POSIX
shared memory that other processes attach by name), ``host`` (plain memory) and ``disk`` (zarr arrays
under ``spill_dir``). The layering follows RMM's memory resources: one small `MemoryResource` per tier
allocates and frees backing memory and knows nothing of budgets; the manager wraps each in a limiting
and statistics layer (RMM's ``limiting_resource_adaptor`` and ``statistics_resource_adaptor``) that
keeps the budget exactly, per tier and per owner, under one lock.

Decisions a user should know
----------------------------
Budgets
    Bytes per tier, as ints or strings with IEC (``"8GiB"``, ``"512MiB"``: powers of 1024) or SI
    units (``"1.5GB"``, ``"100kB"``: powers of 1000), see `parse_size`. A tier left out of
    ``budgets`` (or given ``None``) is limited only by what the machine has, measured when the tier is
    first used: GPU memory for ``device`` (host RAM without CUDA), physical RAM for ``pinned`` and
    ``host``, the size of ``/dev/shm`` for ``shared``, the free space of ``spill_dir`` for ``disk``.
    So, as with RMM's default resource and Reverb's tables, nothing is limited unless you say so, yet
    a request larger than the machine fails cleanly with `MemoryBudgetError` instead of crashing.
    Budgets count the logical bytes of regions (``prod(shape) * itemsize``), not allocator overhead.
Fallback
    ``allocate(..., tier="pinned", fallback=("host", "disk"))`` tries the tiers in that order and
    places the region on the first one with room. Nothing ever exceeds a budget silently.
Lifetime
    A region lives until `Region.free`, the end of its ``with`` block, or `MemoryManager.close`.
    Dropping the Python object does not free it: the manager keeps it, so the budget never under-counts
    memory that tensors still view. Freeing twice raises ``ValueError`` naming the region, and so
    does any use of a freed region (``tensor()``, ``numpy()``, ``write()``). Tensors handed out before
    the free keep their memory alive (reference counting), so they never dangle: reading them never
    crashes, but their bytes no longer count against the budget, so free a region only when its
    views are done.
Pinned
    With CUDA, pinned regions are exact-size page-aligned mappings page-locked with
    ``cudaHostRegister`` (see `PinnedResource` for why not torch's caching pinned allocator), and
    `MemoryManager.register` pins an existing buffer in place. Freeing one synchronises the GPUs.
No GPU
    ``device`` regions are plain host memory (``region.device == "cpu"``; the manager logs one
    warning), ``pinned`` regions are plain host memory with ``region.is_pinned == False``; the API is
    the same.
Shared memory
    Segments are created with ``shm_open`` and mode 0600 (exactly, whatever the umask), named
    ``graphrl_<pid>_<random>_<n>`` and fully reserved with ``posix_fallocate`` so that a full
    ``/dev/shm`` is a `MemoryBudgetError` (or a fallback), never a SIGBUS later. The creating process
    unlinks them when the region is freed, when the manager closes or is garbage collected, and at
    interpreter exit, also after an exception and in ``multiprocessing`` children (which leave through
    ``os._exit`` when forked). A process killed by a signal cannot clean up: its segments stay in
    ``/dev/shm``, unless the owner called `Region.unlink` once every process had attached (the
    mappings stay valid, the name is gone). Other processes attach with `Region.attach` (or by
    unpickling a shared region); an attached region never unlinks. We call ``_posixshmem`` directly
    rather than ``multiprocessing.shared_memory.SharedMemory``: on Python 3.11 the latter registers
    every attach with the resource tracker, which then unlinks the segment when the attaching process
    exits and warns about "leaked" segments.
Disk
    Zarr v3 arrays, uncompressed, chunked by rows (about 16 MiB a chunk), one per region under
    ``spill_dir``, deleted when the region is freed or the manager closes. ``tensor()`` and
    ``numpy()`` of a disk region read a copy (disk cannot be viewed in place); `Region.write` or
    ``region.zarr()[...] = ...`` writes.
Contents
    Memory of ``device``, ``pinned`` and ``host`` regions is uninitialised (like ``torch.empty``);
    ``shared`` and ``disk`` regions start zeroed.

References
----------
RMM (RAPIDS Memory Manager): ``device_memory_resource``, limiting and statistics resource adaptors.
GEAR (Wang et al., ICML 2023): trajectory storage in shared and pinned host memory for GPU learners.
Min et al., "Large Graph Convolutional Network Training with GPU-Oriented Data Communication
Architecture" (PyTorch-Direct), PVLDB 14(11), 2021: GPU kernels reading pinned host memory through UVA.
"""

from __future__ import annotations

import _posixshmem
import enum
import errno
import functools
import itertools
import logging
import math
import mmap
import multiprocessing.util
import os
import re
import secrets
import shutil
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

__all__ = [
    "Backing",
    "DeviceResource",
    "DiskResource",
    "HostResource",
    "MemoryBudgetError",
    "MemoryManager",
    "MemoryResource",
    "PinnedResource",
    "Region",
    "RegionHandle",
    "SharedResource",
    "Tier",
    "parse_size",
]

logger = logging.getLogger(__name__)

_SHM_DIR = Path("/dev/shm")
_CHUNK_BYTES = 16 * 2**20


# --------------------------------------------------------------------------------------------------
# Tiers, sizes, dtypes, shapes


class Tier(enum.Enum):
    """A memory tier, fastest first: DEVICE, PINNED, SHARED, HOST, DISK."""

    DEVICE = "device"
    PINNED = "pinned"
    SHARED = "shared"
    HOST = "host"
    DISK = "disk"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: Tier | str) -> Tier:
        """Return the tier named by ``value`` (a `Tier` or its name, any case).

        Raises
        ------
        ValueError
            ``value`` names no tier.
        TypeError
            ``value`` is neither a `Tier` nor a string.
        """
        if isinstance(value, Tier):
            return value
        if not isinstance(value, str):
            raise TypeError(f"tier must be a Tier or a string, got {type(value).__name__} {value!r}")
        tier = cls._value2member_map_.get(value.strip().lower())
        if tier is None:
            names = ", ".join(t.value for t in cls)
            raise ValueError(f"unknown tier {value!r}: expected one of {names}")
        return tier  # type: ignore[return-value]


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Return a byte count from an int or a string such as ``"8GiB"``, ``"512 MiB"`` or ``"1.5GB"``.

    Units (case-insensitive): ``B``; SI ``kB MB GB TB PB`` (powers of 1000); IEC ``KiB MiB GiB TiB PiB``
    (powers of 1024); no unit means bytes. Fractions are allowed and rounded down to whole bytes.

    Parameters
    ----------
    value : int or str
        A non-negative byte count, or a string as above.

    Returns
    -------
    int
        Bytes.

    Raises
    ------
    ValueError
        A negative count, or a string that is not a number with a known unit (the message quotes it).
    TypeError
        ``value`` is neither an int nor a string (bools and floats are rejected).
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, str)):
        raise TypeError(f"a size must be an int (bytes) or a string like '8GiB', got {type(value).__name__}")
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            raise ValueError(
                f"cannot parse size {value!r}: expected a number and a unit in B, kB, MB, GB, TB, PB "
                "(powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024), e.g. '8GiB'"
            )
        try:
            return int(Decimal(match.group(1)) * unit)
        except InvalidOperation as exc:  # the regular expression makes this unreachable; be explicit
            raise ValueError(f"cannot parse size {value!r}") from exc
    size = int(value)
    if size < 0:
        raise ValueError(f"a size must be >= 0 bytes, got {size}")
    return size


def _fmt(nbytes: int) -> str:
    """``1536`` -> ``'1.5 KiB (1536 bytes)'``."""
    size, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            break
        size /= 1024
    human = f"{nbytes} B" if unit == "B" else f"{size:.1f} {unit}"
    return human if unit == "B" else f"{human} ({nbytes} bytes)"


# The dtypes that have both a torch and a numpy form (one table for the core and both engines).
TORCH_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
NUMPY_TO_TORCH = {v: k for k, v in TORCH_TO_NUMPY.items()}
_TORCH_ONLY = {"bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class _DType:
    torch: torch.dtype
    numpy: np.dtype | None  # None for torch-only dtypes (bfloat16)
    name: str

    @property
    def itemsize(self) -> int:
        return self.torch.itemsize


def _parse_dtype(dtype: Any) -> _DType:
    """Normalise a torch dtype, numpy dtype or name (``"float32"``, ``"torch.int64"``) to `_DType`."""
    if dtype is None or isinstance(dtype, (str, torch.dtype, np.dtype, type)):
        return _parse_dtype_cached(dtype)
    return _parse_dtype_uncached(dtype)


@functools.lru_cache(maxsize=256)
def _parse_dtype_cached(dtype: Any) -> _DType:
    return _parse_dtype_uncached(dtype)


def _parse_dtype_uncached(dtype: Any) -> _DType:
    supported = "bool, (u)int8/16/32/64, float16/32/64, bfloat16, complex64/128"
    if isinstance(dtype, torch.dtype):
        if dtype in TORCH_TO_NUMPY:
            npd = TORCH_TO_NUMPY[dtype]
            return _DType(dtype, npd, npd.name)
        if dtype in _TORCH_ONLY.values():
            return _DType(dtype, None, str(dtype).removeprefix("torch."))
        raise TypeError(f"dtype {dtype} is not supported: use one of {supported}")
    if dtype is None:
        raise TypeError(f"dtype must be given: one of {supported}")
    if isinstance(dtype, str):
        name = dtype.strip().removeprefix("torch.")
        if name in _TORCH_ONLY:
            return _DType(_TORCH_ONLY[name], None, name)
        dtype = name
    try:
        npd = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"unknown dtype {dtype!r}: use one of {supported}") from exc
    if npd not in NUMPY_TO_TORCH:
        raise TypeError(f"dtype {dtype!r} ({npd.str}) is not supported: use one of {supported}, native order")
    return _DType(NUMPY_TO_TORCH[npd], npd, npd.name)


def _parse_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list, torch.Size)):
        raise TypeError(f"shape must be an int or a sequence of ints, got {type(shape).__name__}")
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"shape {tuple(shape)} must hold ints, got {type(d).__name__} {d!r}")
        if d < 0:
            raise ValueError(f"shape {tuple(int(x) for x in shape)} has a negative size {int(d)}")
        dims.append(int(d))
    return tuple(dims)


def _check_owner(owner: Any) -> str:
    if not isinstance(owner, str) or not owner:
        raise TypeError(f"owner must be a non-empty string such as 'samplers.graph', got {owner!r}")
    return owner


def _to_numpy(value: Any, dtype: np.dtype) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=dtype)


# --------------------------------------------------------------------------------------------------
# Errors


class MemoryBudgetError(MemoryError):
    """An allocation did not fit its tier's budget nor any fallback tier's.

    Attributes
    ----------
    tier : Tier
        The tier asked for (the first one tried).
    owner : str
        The owner the allocation was for.
    asked : int
        Bytes asked for.
    free : int
        Bytes free on ``tier`` at the time.
    budget : int
        ``tier``'s budget in bytes.
    attempts : tuple of (Tier, int)
        Every tier tried, in order, with its free bytes.
    """

    def __init__(
        self,
        tier: Tier,
        owner: str,
        asked: int,
        free: int,
        budget: int,
        attempts: tuple[tuple[Tier, int], ...] = (),
        note: str = "",
    ) -> None:
        self.tier, self.owner, self.asked, self.free, self.budget = tier, owner, asked, free, budget
        self.attempts = attempts or ((tier, free),)
        self.note = note
        tried = ", ".join(f"'{t}' ({_fmt(f)} free)" for t, f in self.attempts)
        msg = (
            f"owner {owner!r} asked for {_fmt(asked)} on tier '{tier}', which has {_fmt(free)} free "
            f"of a {_fmt(budget)} budget; tried {tried}. Free regions, raise a budget or allow a "
            "fallback tier"
        )
        super().__init__(msg + (f" ({note})" if note else ""))

    def __reduce__(self):
        return (
            type(self),
            (self.tier, self.owner, self.asked, self.free, self.budget, self.attempts, self.note),
        )


# --------------------------------------------------------------------------------------------------
# Backing memory: what a resource hands the manager


class Backing(Protocol):
    """The memory behind one region, as a `MemoryResource` returns it.

    ``tensor()`` and ``numpy()`` return views (or copies where ``copies`` is true: disk);
    ``write(value)`` copies ``value`` (broadcast to the region's shape) into it.
    """

    device: str
    is_pinned: bool
    copies: bool

    def tensor(self) -> torch.Tensor: ...

    def numpy(self) -> np.ndarray: ...

    def write(self, value: Any) -> None: ...


class _TensorBacking:
    """Memory held by a torch tensor (host, pinned, device, shared and registered regions)."""

    copies = False

    def __init__(self, data: torch.Tensor, is_pinned: bool, registered_ptr: int | None = None) -> None:
        self.data = data
        self.is_pinned = is_pinned
        self.device = str(data.device)
        self.registered_ptr = registered_ptr  # set when cudaHostRegister pinned a user's buffer

    def tensor(self) -> torch.Tensor:
        return self.data.detach()

    def numpy(self) -> np.ndarray:
        if self.data.device.type != "cpu":
            raise ValueError(
                f"numpy() cannot view memory on {self.data.device}: "
                "use region.tensor().cpu().numpy() to copy it"
            )
        return self.data.detach().numpy()

    def write(self, value: Any) -> None:
        src = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
        self.data.copy_(src)


class _ShmSegment:
    """One POSIX shared-memory segment mapped into this process; unlinks only in its creating process."""

    def __init__(self, name: str, buf: mmap.mmap, creator_pid: int | None) -> None:
        self.name = name
        self.buf: mmap.mmap | None = buf
        self.creator_pid = creator_pid  # None: attached, never unlinks
        self._unlinked = False
        self._lock = threading.Lock()

    @classmethod
    def create(cls, name: str, nbytes: int) -> _ShmSegment:
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.fchmod(fd, 0o600)  # exactly owner-only, whatever the umask
            size = max(nbytes, 1)  # mmap cannot map 0 bytes
            try:
                # reserve now: a full /dev/shm fails here, not as a SIGBUS on first touch
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                    raise MemoryError(f"/dev/shm has no room for {_fmt(nbytes)}: {exc}") from exc
                raise
            buf = mmap.mmap(fd, size)
        except BaseException:
            _posixshmem.shm_unlink("/" + name)
            raise
        finally:
            os.close(fd)
        return cls(name, buf, os.getpid())

    @classmethod
    def open(cls, name: str, nbytes: int) -> _ShmSegment:
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"no shared region named {name!r} (its owner freed it, closed, unlinked its name "
                "with Region.unlink, or never created it)"
            ) from exc
        try:
            size = os.fstat(fd).st_size
            if size < nbytes:
                raise ValueError(f"shared region {name!r} holds {size} bytes, fewer than {nbytes} asked for")
            buf = mmap.mmap(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        return cls(name, buf, None)

    def unlink(self) -> None:
        """Remove the name from /dev/shm (creator only, once); mappings stay valid until closed."""
        with self._lock:
            if self._unlinked or self.creator_pid != os.getpid():
                return
            self._unlinked = True
        try:
            _posixshmem.shm_unlink("/" + self.name)
        except FileNotFoundError:
            logger.debug("shared region %s was already unlinked", self.name)

    def release(self) -> None:
        """Drop this object's mapping; tensors viewing it keep it mapped until they are gone."""
        self.buf = None


class _ShmBacking(_TensorBacking):
    def __init__(self, segment: _ShmSegment, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> None:
        assert segment.buf is not None
        raw = torch.from_numpy(np.frombuffer(segment.buf, dtype=np.uint8, count=nbytes))
        super().__init__(raw.view(dtype).view(shape), is_pinned=False)
        self.segment = segment


class _ZarrBacking:
    copies = True
    is_pinned = False
    device = "cpu"

    def __init__(self, array: Any, path: Path, dtype: np.dtype) -> None:
        self.array = array
        self.path = path
        self.np_dtype = dtype

    def numpy(self) -> np.ndarray:
        out = np.asarray(self.array[...], dtype=self.np_dtype, order="C")  # keeps 0-d arrays 0-d
        return out if out.flags.writeable else out.copy()

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.numpy())

    def write(self, value: Any) -> None:
        self.array[...] = np.broadcast_to(_to_numpy(value, self.np_dtype), self.array.shape)


# --------------------------------------------------------------------------------------------------
# Memory resources: one per tier, no accounting (RMM's device_memory_resource)


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
        return _TensorBacking(torch.empty(shape, dtype=dtype), is_pinned=False)

    def deallocate(self, backing: Backing) -> None:
        return None  # the tensor's storage goes when its last view does

    def capacity(self) -> int:
        return _physical_ram()


class PinnedResource(HostResource):
    """Page-locked host memory with CUDA; plain host memory (``is_pinned == False``) without.

    With CUDA a region is an anonymous, page-aligned mapping of exactly its size, page-locked with
    ``cudaHostRegister`` (mapped into the GPU's address space under UVA) and unregistered when
    freed; the pages go back to the OS at once. We avoid ``torch.empty(..., pin_memory=True)``:
    torch's caching host allocator rounds every request up to a power of two and keeps freed
    blocks pinned, so a 5 GiB region would pin 8 GiB and freeing it would pin them still, and the
    budget would no longer describe the machine. Freeing a pinned region synchronises the GPUs
    first, so that no asynchronous copy still reads it.

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
                _cuda_host_register(ptr, nbytes)
            return _TensorBacking(data, is_pinned=True, registered_ptr=ptr)
        if not self._told:
            self._told = True
            logger.info("no CUDA: the pinned tier is plain host memory (region.is_pinned == False)")
        return _TensorBacking(torch.empty(shape, dtype=dtype), is_pinned=False)


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
        if target.type == "cpu" and not self._warned:
            self._warned = True
            logger.warning("no CUDA device: the device tier resolves to host memory (region.device == 'cpu')")
        return _TensorBacking(torch.empty(shape, dtype=dtype, device=target), is_pinned=False)

    def deallocate(self, backing: Backing) -> None:
        return None

    def capacity(self) -> int:
        target = self._target()
        if target.type == "cuda":
            return torch.cuda.get_device_properties(target).total_memory
        return _physical_ram()


class _ExitCleanup:
    """Shared segments and spill arrays to remove if their manager is never closed.

    Run by ``weakref.finalize`` (garbage collection, interpreter exit) and by
    ``multiprocessing.util.Finalize`` (multiprocessing children, which leave through ``os._exit``
    when forked). Holds no reference to the manager; does nothing in a forked child that inherited it.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.segments: dict[str, _ShmSegment] = {}
        self.paths: set[Path] = set()
        self.lock = threading.Lock()

    def __call__(self) -> None:
        if os.getpid() != self.pid:
            return
        with self.lock:
            segments, paths = list(self.segments.values()), list(self.paths)
            self.segments.clear()
            self.paths.clear()
        for segment in segments:
            segment.unlink()
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
        if segments or paths:
            logger.debug("removed %d shared segments and %d spill arrays at exit", len(segments), len(paths))


class SharedResource:
    """POSIX shared memory (``/dev/shm``), mode 0600, attachable by name from other processes."""

    def __init__(self, cleanup: _ExitCleanup | None = None) -> None:
        self._cleanup = cleanup or _ExitCleanup()

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, name: str) -> Backing:
        segment = _ShmSegment.create(name, nbytes)
        with self._cleanup.lock:
            self._cleanup.segments[name] = segment
        return _ShmBacking(segment, dtype, shape, nbytes)

    def deallocate(self, backing: Backing) -> None:
        assert isinstance(backing, _ShmBacking)
        segment = backing.segment
        segment.unlink()
        with self._cleanup.lock:
            self._cleanup.segments.pop(segment.name, None)
        segment.release()
        backing.data = None  # type: ignore[assignment]

    def capacity(self) -> int:
        if not _SHM_DIR.is_dir():
            return 0
        st = os.statvfs(_SHM_DIR)
        return st.f_blocks * st.f_frsize


class DiskResource:
    """Zarr v3 arrays under ``spill_dir``, one per region, uncompressed, chunked by rows."""

    def __init__(self, spill_dir: str | os.PathLike[str] | None, cleanup: _ExitCleanup | None = None) -> None:
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        self._cleanup = cleanup or _ExitCleanup()

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
        return _ZarrBacking(array, path, npd)

    def deallocate(self, backing: Backing) -> None:
        assert isinstance(backing, _ZarrBacking)
        shutil.rmtree(backing.path, ignore_errors=False)
        with self._cleanup.lock:
            self._cleanup.paths.discard(backing.path)
        backing.array = None

    def capacity(self) -> int:
        if self.spill_dir is None:
            return 0
        st = os.statvfs(self.spill_dir)
        return st.f_bavail * st.f_frsize


def _cudart() -> Any:
    return torch.cuda.cudart()


_CUDA_HOST_REGISTER_PORTABLE_MAPPED = 0x01 | 0x02  # cudaHostRegisterPortable | cudaHostRegisterMapped
_CUDA_ERROR_MEMORY_ALLOCATION = 2


def _cuda_host_register(ptr: int, nbytes: int) -> None:
    """Page-lock ``nbytes`` at host address ``ptr`` for every GPU, mapped into their address space (UVA).

    Raises ``MemoryError`` when no more memory can be page-locked, ``RuntimeError`` on other errors.
    """
    err = int(_cudart().cudaHostRegister(ptr, nbytes, _CUDA_HOST_REGISTER_PORTABLE_MAPPED))
    if err == _CUDA_ERROR_MEMORY_ALLOCATION:
        raise MemoryError(f"cudaHostRegister could not page-lock {_fmt(nbytes)}")
    if err != 0:
        raise RuntimeError(f"cudaHostRegister of {_fmt(nbytes)} at {ptr:#x} failed: CUDA error {err}")


def _cuda_host_unregister(ptr: int) -> None:
    """Synchronise every GPU (no copy may still read the buffer), then ``cudaHostUnregister`` it."""
    for index in range(torch.cuda.device_count()):
        torch.cuda.synchronize(index)
    err = _cudart().cudaHostUnregister(ptr)
    if int(err) != 0:
        logger.warning("cudaHostUnregister at %#x failed with CUDA error %d", ptr, int(err))


# --------------------------------------------------------------------------------------------------
# Regions


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
        ``prod(shape) * itemsize``: what the region counts against its tier's budget.
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
        dtype: _DType,
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
        self.nbytes = math.prod(shape) * dtype.itemsize
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
            handle = RegionHandle(handle, _parse_shape(shape), _parse_dtype(dtype).name)
        dt = _parse_dtype(handle.dtype)
        shp = _parse_shape(handle.shape)
        nbytes = math.prod(shp) * dt.itemsize
        segment = _ShmSegment.open(handle.name, nbytes)
        backing = _ShmBacking(segment, dt.torch, shp, nbytes)
        return cls(shape=shp, dtype=dt, tier=Tier.SHARED, owner=handle.owner or "attached", backing=backing,
                   manager=None, name=handle.name)

    def handle(self) -> RegionHandle:
        """The picklable handle other processes attach this shared region by.

        Raises
        ------
        ValueError
            The region is not on the shared tier (other tiers are private to this process).
        """
        if self.tier is not Tier.SHARED or self.name is None:
            raise ValueError(f"only shared regions have handles; this region is on tier '{self.tier}'")
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
        if not isinstance(backing, _ZarrBacking):
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
        if self.tier is not Tier.SHARED or not isinstance(backing, _ShmBacking):
            raise ValueError(f"only shared regions have a name to unlink; {self._label()} is not shared")
        if not self.owns:
            raise ValueError(f"{self._label()} was attached, not created here: only its owner may unlink it")
        backing.segment.unlink()

    @property
    def freed(self) -> bool:
        """True once `free` ran (or the manager closed)."""
        return self._backing is None

    def _claim(self) -> Backing:
        """Mark the region freed and return its backing, once; a second call raises ValueError."""
        with self._lock:
            backing = self._backing
            if backing is None:
                raise ValueError(f"{self._label()} was already freed (double free)")
            self._backing = None
            return backing

    def free(self) -> None:
        """Return the region's bytes to its tier's budget and release the memory.

        Shared regions are unlinked from /dev/shm (attached ones only unmapped), disk regions are
        deleted. Tensors obtained earlier stay valid (they keep host and device memory alive)
        but no longer count against the budget.

        Raises
        ------
        ValueError
            The region was already freed.
        """
        backing = self._claim()
        if self._manager is not None:
            self._manager._release(self, backing)
        elif isinstance(backing, _ShmBacking):
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


# --------------------------------------------------------------------------------------------------
# Budget accounting: the limiting + statistics layer


@dataclass
class _OwnerUsage:
    bytes: int = 0
    peak: int = 0
    regions: int = 0


@dataclass
class _Account:
    """One tier's budget and per-owner statistics; the manager's lock guards it."""

    budget: int
    used: int = 0
    peak: int = 0
    regions: int = 0
    owners: dict[str, _OwnerUsage] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return self.budget - self.used

    def reserve(self, owner: str, nbytes: int) -> bool:
        if self.used + nbytes > self.budget:
            return False
        self.used += nbytes
        self.regions += 1
        self.peak = max(self.peak, self.used)
        usage = self.owners.setdefault(owner, _OwnerUsage())
        usage.bytes += nbytes
        usage.regions += 1
        usage.peak = max(usage.peak, usage.bytes)
        return True

    def release(self, owner: str, nbytes: int) -> None:
        self.used -= nbytes
        self.regions -= 1
        usage = self.owners[owner]
        usage.bytes -= nbytes
        usage.regions -= 1


# --------------------------------------------------------------------------------------------------
# The manager


class MemoryManager:
    """Budgets, places and tracks every large buffer of a process, per tier and per owner.

    Parameters
    ----------
    budgets : mapping of tier (Tier or name) to bytes (int or str such as "8GiB"), optional
        Budget of each tier. A tier left out, or given ``None``, is limited by what the machine has
        (see the module docstring); ``0`` disables a tier.
    spill_dir : str or path, optional
        Folder of the disk tier's zarr arrays (created if missing). Without it the disk tier is
        unavailable.
    device : str or torch.device, optional
        CUDA device of the device tier; default the current CUDA device (host memory without CUDA).
    resources : mapping of tier to MemoryResource, optional
        Replace a tier's allocator (for tests and custom allocators).

    Raises
    ------
    ValueError
        An unknown tier or an unparsable size in ``budgets``.
    TypeError
        A budget that is neither an int nor a string.

    Examples
    --------
    >>> mm = MemoryManager(budgets={"pinned": "1GiB", "host": "4GiB"})
    >>> with mm.allocate((1024, 128), "float32", "pinned", owner="features", fallback=("host",)) as r:
    ...     r.tensor().zero_().shape
    torch.Size([1024, 128])
    >>> mm.stats()["pinned"]["features"]
    {'bytes': 0, 'peak': 524288, 'regions': 0}
    >>> mm.close()

    References
    ----------
    RMM's memory resources and resource adaptors (limiting, statistics, logging).
    """

    def __init__(
        self,
        budgets: Mapping[Tier | str, int | str | None] | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
        *,
        device: str | torch.device | None = None,
        resources: Mapping[Tier | str, MemoryResource] | None = None,
    ) -> None:
        self._budgets: dict[Tier, int | None] = {}
        for key, value in (budgets or {}).items():
            tier = Tier.parse(key)
            try:
                self._budgets[tier] = None if value is None else parse_size(value)
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"budgets[{tier.value!r}]: {exc}") from exc
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        if self.spill_dir is not None:
            self.spill_dir.mkdir(parents=True, exist_ok=True)
        self.shm_prefix = f"graphrl_{os.getpid()}_{secrets.token_hex(4)}_"
        self._cleanup = _ExitCleanup()
        self._resources: dict[Tier, MemoryResource] = {
            Tier.DEVICE: DeviceResource(device),
            Tier.PINNED: PinnedResource(),
            Tier.SHARED: SharedResource(self._cleanup),
            Tier.HOST: HostResource(),
            Tier.DISK: DiskResource(self.spill_dir, self._cleanup),
        }
        for key, resource in (resources or {}).items():
            self._resources[Tier.parse(key)] = resource
        self._accounts: dict[Tier, _Account] = {}
        self._live: dict[int, Region] = {}
        self._attached: dict[int, Region] = {}
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._finalizer = weakref.finalize(self, self._cleanup)
        multiprocessing.util.Finalize(self, self._cleanup, exitpriority=10)

    # -- budgets

    def _account(self, tier: Tier) -> _Account:
        """The tier's account, created on first use (measuring the machine's capacity if needed)."""
        account = self._accounts.get(tier)
        if account is None:
            budget = self._budgets.get(tier)
            if budget is None:
                budget = self._resources[tier].capacity()
            account = self._accounts[tier] = _Account(budget)
        return account

    def budget(self, tier: Tier | str) -> int:
        """Budget of ``tier`` in bytes (the machine's capacity for a tier given no budget)."""
        tier = Tier.parse(tier)
        with self._lock:
            return self._account(tier).budget

    def free_bytes(self, tier: Tier | str) -> int:
        """Bytes still available on ``tier``: its budget minus the bytes of its live regions."""
        tier = Tier.parse(tier)
        with self._lock:
            return self._account(tier).free

    def usage(self) -> dict[str, dict[str, int]]:
        """Per tier: ``{"budget", "used", "free", "peak", "regions"}`` in bytes (regions: a count).

        Measures the capacity of every tier given no budget (with CUDA this initialises it).
        """
        with self._lock:
            out = {}
            for tier in Tier:
                a = self._account(tier)
                out[tier.value] = {"budget": a.budget, "used": a.used, "free": a.free, "peak": a.peak,
                                   "regions": a.regions}
            return out

    def stats(self) -> dict[str, dict[str, dict[str, int]]]:
        """Bytes in use, peak bytes and live regions per tier and owner, as plain data.

        Returns
        -------
        dict
            ``{tier_name: {owner: {"bytes": int, "peak": int, "regions": int}}}`` with every tier
            present (``{}`` if unused). An owner stays listed after its regions are freed, with
            ``bytes == 0`` and its peak kept.
        """
        with self._lock:
            return {
                tier.value: {
                    owner: {"bytes": u.bytes, "peak": u.peak, "regions": u.regions}
                    for owner, u in (self._accounts[tier].owners.items() if tier in self._accounts else ())
                }
                for tier in Tier
            }

    def regions(self, owner: str | None = None) -> list[Region]:
        """The live regions this manager owns (of ``owner`` only, if given), oldest first."""
        with self._lock:
            return [r for r in self._live.values() if owner is None or r.owner == owner]

    # -- allocation

    def _candidates(self, tier: Tier | str, fallback: Iterable[Tier | str]) -> list[Tier]:
        if isinstance(fallback, (str, Tier)):
            fallback = (fallback,)
        tiers: list[Tier] = []
        for t in (tier, *fallback):
            parsed = Tier.parse(t)
            if parsed not in tiers:
                tiers.append(parsed)
        return tiers

    def allocate(
        self,
        shape: int | tuple[int, ...] | list[int] | torch.Size,
        dtype: Any,
        tier: Tier | str = Tier.HOST,
        *,
        owner: str,
        fallback: Iterable[Tier | str] = (),
    ) -> Region:
        """Allocate a region of ``shape`` and ``dtype`` on ``tier``, or on the first fallback tier with room.

        Parameters
        ----------
        shape : int or sequence of int
            Shape of the region's views; every size >= 0.
        dtype : torch.dtype, numpy dtype or str
            ``torch.float32``, ``np.int64``, ``"bool"``, ``"bfloat16"`` ... (bfloat16 has no numpy
            view and no disk tier).
        tier : Tier or str
            Preferred tier: ``"device"``, ``"pinned"``, ``"shared"``, ``"host"`` (default) or ``"disk"``.
        owner : str
            Who the bytes are for (``"samplers.graph"``, ``"replay.shard3"``); statistics group by it.
        fallback : sequence of Tier or str
            Tiers to try, in order, when ``tier`` has no room. Default none.

        Returns
        -------
        Region
            ``region.tier`` says where it landed.

        Raises
        ------
        MemoryBudgetError
            No tier tried has room (the message and attributes name tier, owner, asked and free bytes).
        ValueError
            A negative size, an unknown tier, a disk tier without ``spill_dir``, or a closed manager.
        TypeError
            An unknown dtype, a bad shape or owner, or bfloat16 on the disk tier.
        """
        shp = _parse_shape(shape)
        dt = _parse_dtype(dtype)
        owner = _check_owner(owner)
        tiers = self._candidates(tier, fallback)
        if Tier.DISK in tiers:
            if self.spill_dir is None:
                raise ValueError(
                    "the disk tier needs spill_dir, which this MemoryManager was created without: "
                    "pass MemoryManager(spill_dir='spill/') or drop 'disk' from the tiers"
                )
            if dt.numpy is None:
                raise TypeError(f"dtype {dt.name} cannot be stored on the disk tier (zarr has no {dt.name})")
        nbytes = math.prod(shp) * dt.itemsize
        attempts: list[tuple[Tier, int]] = []
        failure: BaseException | None = None
        first: _Account | None = None
        for t in tiers:
            with self._lock:
                self._check_open()
                account = self._account(t)
                if first is None:
                    first = account
                if not account.reserve(owner, nbytes):
                    attempts.append((t, account.free))
                    continue
            index = next(self._counter)
            name = f"{self.shm_prefix}{index}"
            try:
                backing = self._resources[t].allocate(shp, dt.torch, nbytes, name)
            except (torch.OutOfMemoryError, MemoryError) as exc:
                with self._lock:
                    account.release(owner, nbytes)
                    attempts.append((t, account.free))
                logger.warning("tier '%s' could not allocate %s for %r: %s", t, _fmt(nbytes), owner, exc)
                failure = exc
                continue
            except BaseException:
                with self._lock:
                    account.release(owner, nbytes)
                raise
            region = Region(
                shape=shp,
                dtype=dt,
                tier=t,
                owner=owner,
                backing=backing,
                manager=self,
                name=name if t is Tier.SHARED else None,
                path=getattr(backing, "path", None),
            )
            with self._lock:
                closed = self._closed
                if not closed:
                    self._live[id(region)] = region
            if closed:  # close() ran while we were allocating
                region.free()
                raise ValueError("this MemoryManager was closed during the allocation")
            if t is not tiers[0]:
                logger.info("%s for %r placed on tier '%s' (tried %s)", _fmt(nbytes), owner, t,
                            ", ".join(str(a[0]) for a in attempts))
            return region
        assert first is not None
        note = f"allocator failed: {failure}" if failure is not None else ""
        free0 = attempts[0][1]
        raise MemoryBudgetError(
            tiers[0], owner, nbytes, free0, first.budget, tuple(attempts), note
        ) from failure

    def register(
        self, array: np.ndarray | torch.Tensor, tier: Tier | str = Tier.PINNED, *, owner: str
    ) -> Region:
        """Make an existing host buffer a region: page-locked in place with CUDA (``cudaHostRegister``).

        The region views ``array`` (no copy) and counts its bytes against ``tier``'s budget. With
        CUDA and ``tier="pinned"`` the buffer is registered with ``cudaHostRegister`` so GPU kernels
        read it in place through UVA, and unregistered on `Region.free`; without CUDA it stays
        plain memory (``is_pinned == False``). Keep ``array`` unchanged in size while registered.

        Parameters
        ----------
        array : numpy.ndarray or torch.Tensor
            C-contiguous, writable, in host memory; any dtype `allocate` accepts.
        tier : "pinned" or "host"
        owner : str

        Raises
        ------
        ValueError
            Another tier, a non-contiguous, read-only or GPU buffer, or a closed manager.
        TypeError
            ``array`` is neither a numpy array nor a tensor, or has an unsupported dtype.
        MemoryBudgetError
            ``tier`` has no room for it.
        MemoryError
            CUDA could not page-lock the buffer.

        References
        ----------
        PyTorch-Direct (Min et al., PVLDB 2021) and DGL's ``pin_memory_inplace``: UVA reads of
        registered host memory.
        """
        tier = Tier.parse(tier)
        owner = _check_owner(owner)
        if tier not in (Tier.PINNED, Tier.HOST):
            raise ValueError(f"register() places buffers on tier 'pinned' or 'host', not '{tier}'")
        if isinstance(array, np.ndarray):
            if not array.flags.writeable:
                raise ValueError("register() needs a writable array")
            dt = _parse_dtype(array.dtype)
            if not array.flags.c_contiguous:
                raise ValueError("register() needs a C-contiguous array (np.ascontiguousarray copies one)")
            data = torch.from_numpy(array)
        elif isinstance(array, torch.Tensor):
            dt = _parse_dtype(array.dtype)
            if array.device.type != "cpu":
                raise ValueError(f"register() needs host memory, got a tensor on {array.device}")
            if not array.is_contiguous():
                raise ValueError("register() needs a contiguous tensor (.contiguous() copies one)")
            data = array.detach()
        else:
            raise TypeError(f"register() takes a numpy array or a torch tensor, got {type(array).__name__}")
        shp = tuple(data.shape)
        nbytes = math.prod(shp) * dt.itemsize
        with self._lock:
            self._check_open()
            account = self._account(tier)
            if not account.reserve(owner, nbytes):
                raise MemoryBudgetError(tier, owner, nbytes, account.free, account.budget)
        pinned = False
        try:
            resource = self._resources[tier]
            if tier is Tier.PINNED and getattr(resource, "cuda", False) and nbytes > 0:
                _cuda_host_register(data.data_ptr(), nbytes)
                pinned = True
        except BaseException:
            with self._lock:
                account.release(owner, nbytes)
            raise
        backing = _TensorBacking(data, is_pinned=pinned, registered_ptr=data.data_ptr() if pinned else None)
        region = Region(shape=shp, dtype=dt, tier=tier, owner=owner, backing=backing, manager=self)
        with self._lock:
            self._live[id(region)] = region
        return region

    def attach(self, handle: RegionHandle | str, shape: Any = None, dtype: Any = None) -> Region:
        """`Region.attach`, and unmap the region when this manager closes. Counts against no budget."""
        with self._lock:
            self._check_open()
        region = Region.attach(handle, shape, dtype)
        with self._lock:
            self._attached[id(region)] = region
        return region

    def _release(self, region: Region, backing: Backing) -> None:
        """Free ``region``'s memory, then return its bytes to the budget (called once, by `Region.free`)."""
        tier = region.tier
        try:
            ptr = getattr(backing, "registered_ptr", None)
            if ptr is not None:
                _cuda_host_unregister(ptr)
                backing.registered_ptr = None
            self._resources[tier].deallocate(backing)
        finally:
            with self._lock:
                self._accounts[tier].release(region.owner, region.nbytes)
                self._live.pop(id(region), None)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this MemoryManager is closed")

    # -- lifetime

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Free every region this manager owns and unmap the ones it attached; idempotent.

        Shared segments are unlinked and spill arrays deleted. Statistics stay readable.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            regions = list(self._live.values()) + list(self._attached.values())
            self._attached.clear()
        for region in regions:
            if not region.freed:
                try:
                    region.free()
                except ValueError:  # freed by another thread in between
                    logger.debug("%r was freed concurrently with close()", region)
        self._cleanup()

    def __enter__(self) -> MemoryManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._live)} live regions"
        return f"MemoryManager({state}, spill_dir={str(self.spill_dir) if self.spill_dir else None!r})"

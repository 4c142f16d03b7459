"""Node features for minibatches: a row table in a memory-manager region, row gathers into reusable
staging buffers, and a cache of the hottest rows on the device tier (DESIGN §3).

Placement
---------
`FeatureStore` copies the feature matrix into a region of its `MemoryManager` on the fastest tier that
fits: ``("device", "pinned", "host")`` in order, except that a CPU gather on a machine with CUDA
skips ``device`` (GPU memory the CPU cannot read) and a GPU gather skips ``host`` (memory the GPU
cannot read in place). Without CUDA the device tier is host memory, so the table lands there.

Gather
------
On the CPU, `FeatureStore.gather` copies each row with one ``memcpy`` (an LLVM intrinsic inside a
``nogil`` numba kernel, `graphrl.kernels`) into a staging buffer, prefetching (the first 16 lines of)
the row about 32 KiB of rows ahead into L2 (`graphrl.kernels.prefetch_l2`), and for batches of at
least 8 MiB with streaming (non-temporal) stores; chunks of rows are claimed dynamically by the calling
thread and helper threads (`graphrl.kernels.parallel_for`), so a busy machine costs at most the
speed-up (an OpenMP fork-join waits for every descheduled worker).
The staging buffer is reused, so a gather writes into memory that is already mapped: it avoids the
page faults a fresh ``torch.index_select`` output pays, which is most of its cost. With CUDA, a
``numba.cuda`` kernel (a warp per row) reads the rows straight from the table in place, from GPU
memory or from pinned host memory through UVA, and writes the batch into a device staging buffer:
the CPU never touches the rows (PyTorch-Direct's zero-copy gather). The kernel runs under numba's
CUDA simulator in the tests.

Huge pages
----------
Random rows of a table of GiBs miss the TLB on almost every row with 4 KiB pages (a 1 GiB table
spans 262,144 pages; the second-level TLB maps 2048), and in a virtual machine every miss is a
two-dimensional page walk. With ``huge_pages=True`` (the default) a CPU store puts a host table of
32 MiB or more on 2 MiB transparent huge pages (`graphrl.kernels.advise_huge_pages`): a region it
allocates is advised before the table is written into it (no extra cost), and a table used in place
(``memory=None``) is collapsed into huge pages once, at construction (the kernel copies it: about
0.5-1 s per GiB). Linux in THP ``madvise`` mode (this project's machines) gives huge pages only to
memory that asks; a table in shared, page-locked or file-mapped memory (``numpy.memmap``: collapsing
would read the whole file in) stays as it is, and so does any table where THP is off.
Measured on 2M x 128 float32 (100k rows, two threads, load 0.9-1.0, medians of 9 interleaved rounds
in one process, three sessions): the gather before this section's changes (L1 hints 8 rows ahead,
cached stores) ran 4.1-5.6 GB/s on 4 KiB pages; with the L2 hints and streaming stores above,
4.9-6.7 on 4 KiB pages and 7.0-7.2 on huge pages, where a streaming copy of the same bytes ran
8.1-12 GB/s. On 2M x 512 float32 (2 KiB rows) huge pages gain 25-33 % (3.2-8.9 -> 4.3-11.9 GB/s).

Cache
-----
With ``cache_rows > 0`` and a table that is not on the device tier, the hottest rows are copied to a
cache on the device tier, and the gather reads a cached row from there. Hot rows are chosen by
in-degree (``cache_policy="degree"``; for the symmetric graphs of our data sets in-degree equals
out-degree), by out-degree (``"out_degree"``: how often a node is drawn as an in-neighbour), or by
how often a node was an input node in a short pre-sampling pass with a `NeighborSampler`
(``"presample"``, GNNLab's PreSC policy). `FeatureStore.stats` reports the hit rate.

Staging reuse
-------------
``gather(ids)`` without ``out`` returns a view of one of the store's ``staging_slots`` staging
buffers, handed out round-robin: the result stays valid until ``staging_slots`` further calls of
``gather`` without ``out``; ``.clone()`` it to keep it longer. `FeatureStore.staging` gives a loader
its own buffers, leased and released explicitly (see `samplers.loader`).

References
----------
Min et al., "Large Graph Convolutional Network Training with GPU-Oriented Data Communication
Architecture" (PyTorch-Direct), PVLDB 14(11), 2021: GPU gathers from pinned host memory through UVA.
Yang et al., "GNNLab: A Factored System for Sample-based GNN Training over GPUs", EuroSys 2022:
caching the features of the nodes that a pre-sampling pass visits most (PreSC).
Lin et al., "PaGraph: Scaling GNN Training on Large Graphs via Computation-aware Caching", SoCC 2020:
caching by degree.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections import deque
from typing import Any

import numba as nb
import numpy as np
import torch

from graphrl.graph import CSCGraph
from graphrl.kernels import (
    LINE,
    STREAM_THRESHOLD,
    advise_huge_pages,
    copy_bytes,
    parallel_for,
    prefetch_l2,
    store_fence,
    stream_bytes_nofence,
    stream_line_nofence,
)
from graphrl.memory import MemoryManager, Region, Tier
from graphrl.tensors import StagingBuffer, StagingPool
from samplers.neighbor import NeighborSampler, check_seeds

__all__ = ["FeatureStore", "RowStaging", "StagingLease", "gather_rows", "gather_rows_cuda"]

logger = logging.getLogger(__name__)

_POLICIES = ("degree", "out_degree", "presample")
_CHUNK_BYTES = 1 << 21  # rows per dynamically claimed chunk: about 2 MiB of output
_PREFETCH_BYTES = 32 << 10  # default prefetch distance of the CPU gather, in bytes of rows ahead ...
_PREFETCH_MIN, _PREFETCH_MAX = 4, 64  # ... but at least 4 and at most 64 rows
_PREFETCH_LINES = 16  # cache lines prefetched per row (the hardware streams the rest of a long row)
# Batches of at least this many bytes are written with streaming stores (`graphrl.kernels.STREAM_THRESHOLD`).
# With rows prefetched far ahead into L2 the stores decide the speed: 100k random rows of 2M x 128 float32
# (51 MB, 2 MiB pages, one thread, load 2) ran at 6.1 GB/s with streaming stores, 4.0 GB/s with cached ones.
_STREAM_BYTES = STREAM_THRESHOLD
# Tables of at least this many bytes go on transparent huge pages (`FeatureStore(huge_pages=True)`):
# below it the 4 KiB pages' translations fit the second-level TLB (2048 entries, 8 MiB) or nearly.
_HUGE_TABLE_BYTES = 32 << 20


def _prefetch_rows(row_bytes: int) -> int:
    """The default prefetch distance, in rows, for rows of ``row_bytes`` bytes."""
    return max(_PREFETCH_MIN, min(_PREFETCH_MAX, _PREFETCH_BYTES // max(row_bytes, 1)))


_DEFAULT = object()


# --------------------------------------------------------------------------------------------------
# CPU kernels


@nb.njit(nogil=True, cache=True, inline="always")
def _prefetch_row(table, start, lines):  # pragma: no cover - compiled
    for k in range(lines):
        prefetch_l2(table, start + k * LINE)


# how `_copy_row` writes a row: memcpy, streaming stores (any size and alignment), or streaming stores of
# whole 64-byte lines (rows of whole lines into a 64-byte aligned buffer: no head or tail to handle)
_CACHED, _STREAM, _STREAM_LINES = 0, 1, 2


@nb.njit(nogil=True, cache=True, inline="always")
def _copy_row(out, o, src, s, row_bytes, mode):  # pragma: no cover - compiled
    if mode == _STREAM_LINES:
        for k in range(0, row_bytes, LINE):
            stream_line_nofence(out, o + k, src, s + k)
    elif mode == _STREAM:
        stream_bytes_nofence(out, o, src, s, row_bytes)
    else:
        copy_bytes(out, o, src, s, row_bytes)


@nb.njit(nogil=True, cache=True)
def _gather_range(table, ids, out, row_bytes, lo, hi, ahead, mode):  # pragma: no cover - compiled
    lines = min((row_bytes + LINE - 1) // LINE, _PREFETCH_LINES)
    for i in range(lo, min(hi, lo + ahead)):
        _prefetch_row(table, ids[i] * row_bytes, lines)
    for i in range(lo, hi):
        if i + ahead < hi:
            _prefetch_row(table, ids[i + ahead] * row_bytes, lines)
        _copy_row(out, i * row_bytes, table, ids[i] * row_bytes, row_bytes, mode)
    if mode != _CACHED:
        store_fence()


@nb.njit(nogil=True, cache=True)
def _gather_range_cached(table, cache, slots, ids, out, row_bytes, lo, hi, ahead, mode):  # pragma: no cover
    lines = min((row_bytes + LINE - 1) // LINE, _PREFETCH_LINES)
    for i in range(lo, min(hi, lo + ahead)):
        s = slots[ids[i]]
        _prefetch_row(cache if s >= 0 else table, (s if s >= 0 else ids[i]) * row_bytes, lines)
    hits = 0
    for i in range(lo, hi):
        if i + ahead < hi:
            v = ids[i + ahead]
            s = slots[v]
            _prefetch_row(cache if s >= 0 else table, (s if s >= 0 else v) * row_bytes, lines)
        v = ids[i]
        s = slots[v]
        if s >= 0:
            _copy_row(out, i * row_bytes, cache, s * row_bytes, row_bytes, mode)
            hits += 1
        else:
            _copy_row(out, i * row_bytes, table, v * row_bytes, row_bytes, mode)
    if mode != _CACHED:
        store_fence()
    return hits


def _flat_bytes(t: torch.Tensor) -> np.ndarray:
    """A flat uint8 numpy view of a contiguous host tensor (any dtype, bfloat16 included)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def gather_rows(table: torch.Tensor, ids: np.ndarray, out: torch.Tensor, threads: int = 1,
                cache: torch.Tensor | None = None, slots: np.ndarray | None = None,
                ahead: int | None = None, stream: bool | None = None) -> int:
    """Copy rows ``table[ids]`` into ``out[:len(ids)]`` on the CPU (no checks: ids are trusted).

    Parameters
    ----------
    table : torch.Tensor, any dtype, shape [N, *row], contiguous host memory
    ids : numpy.ndarray, int64, shape [B], contiguous, every id in [0, N)
    out : torch.Tensor, ``table``'s dtype, shape [>= B, *row], contiguous host memory
    threads : int
        Threads that may copy, the caller included (helpers claim chunks of about 2 MiB).
    cache : torch.Tensor or None, shape [C, *row]
        Cached rows; row ``slots[v]`` of ``cache`` is read instead of ``table[v]`` when ``slots[v] >= 0``.
    slots : numpy.ndarray or None, int32, shape [N]
        Cache slot of every row, -1 when not cached.
    ahead : int or None
        Prefetch distance in rows: while copying row ``i`` the kernel hints the CPU to fetch (up to
        the first ``_PREFETCH_LINES`` cache lines of) row ``i + ahead`` into L2; 0 turns prefetching
        off. Default: about ``_PREFETCH_BYTES`` (32 KiB) ahead, 4 to 64 rows.
    stream : bool or None
        Write ``out`` with streaming (non-temporal) stores (`graphrl.kernels.stream_bytes`), which
        skip reading the output lines into the cache first. Default: when the batch is at least
        ``_STREAM_BYTES`` (8 MiB), rows are whole cache lines and ``out`` is 64-byte aligned. Rows of
        any size may be streamed when asked for (head and tail bytes of a row then go by ``memcpy``).

    Returns
    -------
    int
        Rows read from the cache (0 without one).

    References
    ----------
    Random rows from a table far larger than the caches are latency bound: the prefetch hints keep
    more row misses in flight than the core finds by itself (Intel's optimization manual, "software
    prefetch"). Hints into L2 (``prefetcht1``) issued far ahead keep more in flight than hints into
    L1 near ahead, which hold the few L1 miss buffers (`graphrl.kernels.prefetch_l2`). Streaming
    stores skip the read-for-ownership of the output lines (Drepper, "What Every Programmer Should
    Know About Memory", §6.1), which glibc's ``memcpy`` uses only for single copies above its
    non-temporal threshold; rows of whole lines into an aligned buffer are streamed line by line
    (`graphrl.kernels.stream_line_nofence`), without `graphrl.kernels.stream_bytes`'s head and tail
    handling. Measured on 2M x 128 float32 on huge pages (100k rows, one thread, load 2-2.5,
    interleaved medians): L1 hints 8 rows ahead with cached stores 3.9 GB/s, with streaming stores
    4.9; L2 hints 64 rows ahead with cached stores 4.0, with `stream_bytes` 6.1-6.9, streamed line by
    line 8.0 (a streaming copy of the same bytes: 7.6-8.5).
    """
    b = int(ids.shape[0])
    row_bytes = table[0].numel() * table.element_size() if table.shape[0] else 0
    if b == 0 or row_bytes == 0:
        return 0
    src, dst = _flat_bytes(table), _flat_bytes(out)
    cached = cache is not None
    csrc = _flat_bytes(cache) if cached else src
    if ahead is None:
        ahead = _prefetch_rows(row_bytes)
    lines = row_bytes % LINE == 0 and dst.ctypes.data % LINE == 0
    if stream is None:
        stream = b * row_bytes >= _STREAM_BYTES and lines
    mode = (_STREAM_LINES if lines else _STREAM) if stream else _CACHED
    step = max(64, _CHUNK_BYTES // row_bytes)
    chunks = -(-b // step)
    if threads <= 1 or chunks <= 1:
        if cached:
            return int(_gather_range_cached(src, csrc, slots, ids, dst, row_bytes, 0, b, ahead, mode))
        _gather_range(src, ids, dst, row_bytes, 0, b, ahead, mode)
        return 0
    hits = np.zeros(chunks, dtype=np.int64)
    if cached:
        def fn(i: int) -> None:
            lo, hi = i * step, min(b, (i + 1) * step)
            hits[i] = _gather_range_cached(src, csrc, slots, ids, dst, row_bytes, lo, hi, ahead, mode)
    else:
        def fn(i: int) -> None:
            _gather_range(src, ids, dst, row_bytes, i * step, min(b, (i + 1) * step), ahead, mode)
    parallel_for(fn, chunks, threads)
    return int(hits.sum())


# --------------------------------------------------------------------------------------------------
# CUDA kernel (numba.cuda), defined on first use so that importing this module never imports numba.cuda


_WARP = 32
cuda: Any = None  # numba.cuda, imported by _cuda_kernel (a module global, so that the simulator patches it)


@functools.cache
def _cuda_kernel():
    global cuda
    from numba import cuda as numba_cuda

    cuda = numba_cuda

    @cuda.jit
    def kernel(table, ids, out, cache, slots, hits, use_cache, n):  # pragma: no cover - device code
        lane = cuda.threadIdx.x % _WARP
        warp = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) // _WARP
        warps = (cuda.gridDim.x * cuda.blockDim.x) // _WARP
        width = out.shape[1]
        for r in range(warp, n, warps):
            v = ids[r]
            s = -1
            if use_cache:
                s = slots[v]
            if s >= 0:
                for w in range(lane, width, _WARP):
                    out[r, w] = cache[s, w]
                if lane == 0:
                    cuda.atomic.add(hits, 0, 1)
            else:
                for w in range(lane, width, _WARP):
                    out[r, w] = table[v, w]

    return kernel


def gather_rows_cuda(table: Any, ids: Any, out: Any, cache: Any = None, slots: Any = None, hits: Any = None,
                     stream: Any = 0, warps_per_block: int = 4, max_blocks: int = 65535) -> Any:
    """Launch the GPU gather: ``out[r] = cache[slots[ids[r]]]`` if cached, else ``table[ids[r]]``.

    One warp per row, its 32 lanes striding over the row's words, so each warp reads 32 consecutive
    words of a row per step (coalesced, as PyTorch-Direct's aligned UVA reads). ``table`` may be
    device memory or pinned host memory viewed in place through UVA (`uva_words`).

    Parameters
    ----------
    table : numba device array, words (e.g. int32), shape [N, W]
    ids : numba device array, int64, shape [B]
        Trusted to lie in [0, N).
    out : numba device array, ``table``'s dtype, shape [>= B, W]
    cache : numba device array or None, shape [C, W]
    slots : numba device array or None, int32, shape [N]
        Cache slot of every row, -1 when not cached; required with ``cache``.
    hits : numba device array or None, int64, shape [1]
        Incremented (atomically) by the number of rows read from the cache.
    stream : numba stream or 0
        Stream to launch on (``numba.cuda.external_stream(torch.cuda.current_stream().cuda_stream)``
        to order it with torch's work).
    warps_per_block : int
        Warps per CUDA block (32 threads each).
    max_blocks : int
        Grid size cap; the warps loop over the rows beyond it.

    Returns
    -------
    numba device array
        ``out``.

    Raises
    ------
    ValueError
        ``out`` has fewer rows than ``ids`` or another row width than ``table``; ``cache`` without
        ``slots``.

    References
    ----------
    Min et al., PyTorch-Direct (PVLDB 2021): zero-copy, warp-aligned GPU reads of pinned host memory.
    """
    from numba import cuda

    n = int(ids.shape[0])
    if out.shape[0] < n or out.shape[1] != table.shape[1]:
        raise ValueError(f"out has shape {tuple(out.shape)}, need at least [{n}, {table.shape[1]}]")
    if cache is not None and slots is None:
        raise ValueError("a cache needs slots (the cache slot of every row, -1 when not cached)")
    if n == 0:
        return out
    use_cache = cache is not None
    if not use_cache:
        cache = table[:1]
        slots = cuda.device_array(1, dtype=np.int32, stream=stream)
    if hits is None:
        hits = cuda.device_array(1, dtype=np.int64, stream=stream)
    threads = warps_per_block * _WARP
    blocks = max(1, min(max_blocks, -(-n // warps_per_block)))
    _cuda_kernel()[blocks, threads, stream](table, ids, out, cache, slots, hits, use_cache, n)
    return out


def _word(row_bytes: int) -> tuple[torch.dtype, str]:
    for dtype, typestr in ((torch.int32, "<i4"), (torch.int16, "<i2")):
        if row_bytes % dtype.itemsize == 0:
            return dtype, typestr
    return torch.uint8, "|u1"


def uva_words(tensor: torch.Tensor) -> Any:
    """A numba device array of words [N, W] over a 2-D-able tensor: in place, no copy.

    A CUDA tensor is viewed directly; a page-locked host tensor (a pinned region) through UVA, so GPU
    kernels read its rows over PCIe without a staging copy.

    Parameters
    ----------
    tensor : torch.Tensor, shape [N, *row], contiguous; on a GPU or pinned host memory

    Returns
    -------
    numba device array, int32 (int16 or uint8 when the row size demands), shape [N, W]

    Raises
    ------
    ValueError
        A non-contiguous tensor, or host memory that is not page-locked.
    """
    from numba import cuda

    if not tensor.is_contiguous():
        raise ValueError("uva_words() needs a contiguous tensor")
    n = tensor.shape[0]
    row_bytes = (tensor.numel() // n if n else 0) * tensor.element_size()
    dtype, typestr = _word(row_bytes)
    width = row_bytes // dtype.itemsize
    if tensor.device.type == "cuda":
        return cuda.as_cuda_array(tensor.view(torch.uint8).view(dtype).reshape(n, width))
    if not tensor.is_pinned():
        raise ValueError("uva_words() needs a GPU tensor or page-locked host memory (a pinned region)")

    class _Host:
        def __init__(self) -> None:
            self.__cuda_array_interface__ = {"shape": (n, width), "typestr": typestr,
                                             "data": (tensor.data_ptr(), False), "version": 3,
                                             "strides": None}
            self.owner = tensor

    return cuda.as_cuda_array(_Host())


# --------------------------------------------------------------------------------------------------
# Staging that grows with the batch


class StagingLease:
    """Rows of one staging buffer held by one batch, from `RowStaging.acquire` until `release`.

    Attributes
    ----------
    tensor : torch.Tensor, shape [rows, *row]
        The leased rows (a view of the staging buffer).
    """

    def __init__(self, buffer: StagingBuffer, rows: int, owner: RowStaging, pool: StagingPool) -> None:
        self._buffer: StagingBuffer | None = buffer
        self._owner = owner
        self._pool = pool
        self.tensor = buffer.tensor[:rows]

    @property
    def released(self) -> bool:
        return self._buffer is None

    def release(self) -> None:
        """Give the buffer back (it may be overwritten at once); idempotent."""
        buffer, self._buffer = self._buffer, None
        if buffer is not None:
            buffer.release()
            self._owner._released(self._pool)


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
        return StagingLease(buffer, rows, self, pool)

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


# --------------------------------------------------------------------------------------------------
# The store


def _as_table(x: Any) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        if x.dtype.byteorder == ">":
            raise TypeError(f"x must be in native byte order, got dtype {x.dtype}")
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor or numpy array [num_rows, ...], got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError(f"x must have a row dimension (shape [num_rows, ...]), got shape {tuple(x.shape)}")
    if x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"x must be a real numeric tensor, got dtype {x.dtype}")
    return x.detach()


class FeatureStore:
    """Rows of node features in a memory-manager region, gathered by node id into staging buffers.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray, numeric, shape [N, *row]
        Row v holds node v's features (float32 [N, D] typically).
    memory : MemoryManager or None
        Where the table, the cache and the staging buffers live. The table is copied into a region
        (owner ``f"{owner}.table"``) on the fastest tier that fits (see the module docstring). ``None``:
        the table is ``x`` itself (no copy; made contiguous if needed) and the cache and staging come
        from a private manager.
    cache_rows : int
        Rows to cache on the device tier (clipped to N); 0 for no cache. Ignored (logged) when the
        table itself is on the device tier.
    cache_policy : {"degree", "out_degree", "presample"}
        How hot rows are chosen (see the module docstring); ties go to the smaller node id.
    graph : CSCGraph or None
        Required with a cache: the graph the ids are nodes of (N nodes).
    device : str or torch.device or None
        Where `gather` writes rows: ``"cpu"`` (the numba CPU gather into host or pinned staging) or
        ``"cuda"`` (the numba.cuda gather into device staging). Default ``"cuda"`` when CUDA is
        available, else ``"cpu"``.
    tier : Tier or str or None
        Tier of the table; default as in the module docstring.
    fallback : sequence of Tier or str or None
        Tiers tried after ``tier``; default as in the module docstring.
    owner : str
        Prefix of the owner names in the manager's statistics.
    staging_slots : int
        Buffers for gathers without ``out`` (see "Staging reuse" in the module docstring).
    threads : int or None
        Threads of a CPU gather (default ``numba.get_num_threads()``).
    huge_pages : bool
        For a CPU gather, put a host table of 32 MiB or more on transparent huge pages (2 MiB) where
        Linux allows (see "Huge pages" in the module docstring); the contents never change.
    presample_fanouts : sequence of int
        Fanouts of the pre-sampling pass (``cache_policy="presample"``), outermost first.
    presample_seeds : torch.Tensor or None, int64, shape [S]
        Seed nodes to draw pre-sampling batches from (the training nodes); default every node.
    presample_batches : int
        Batches in the pre-sampling pass.
    presample_batch_size : int
        Seeds per pre-sampling batch.
    seed : int
        Seed of the pre-sampling pass.

    Attributes
    ----------
    table : torch.Tensor, shape [N, *row]
        The rows (a view of the table region, or ``x``).
    table_tier : str
        Tier of the table ("host" for ``x`` itself on the CPU).
    cache_nodes : torch.Tensor, int64, shape [C]
        Cached node ids, in cache-slot order (empty without a cache).

    Raises
    ------
    TypeError
        ``x`` is not a real numeric tensor or array; ``memory`` is not a `MemoryManager`; ``graph`` is
        not a `CSCGraph`.
    ValueError
        A negative ``cache_rows``; an unknown ``cache_policy``; a cache without ``graph``, or a graph of
        another size; a device other than cpu/cuda; CUDA asked for but absent.
    MemoryBudgetError
        The table fits no tier tried, or the cache does not fit the device tier (lower ``cache_rows``).

    References
    ----------
    PyTorch-Direct (PVLDB 2021) for the zero-copy GPU gather; GNNLab (EuroSys 2022) for pre-sampling
    based caching; PaGraph (SoCC 2020) for degree-based caching.

    Examples
    --------
    >>> mm = MemoryManager(budgets={"device": "8GiB"})
    >>> feats = FeatureStore(x, memory=mm, cache_rows=100_000, graph=graph)
    >>> rows = feats.gather(torch.tensor([3, 1, 4]))  # a staging view, valid for 2 more gathers
    >>> feats.stats()["hit_rate"]
    """

    def __init__(self, x: Any, memory: MemoryManager | None = None, cache_rows: int = 0,
                 cache_policy: str = "degree", graph: CSCGraph | None = None, *,
                 device: str | torch.device | None = None, tier: Tier | str | None = None,
                 fallback: Any = None, owner: str = "features", staging_slots: int = 2,
                 threads: int | None = None, huge_pages: bool = True, presample_fanouts: Any = (10, 10),
                 presample_seeds: Any = None, presample_batches: int = 8, presample_batch_size: int = 1024,
                 seed: int = 0) -> None:
        x = _as_table(x)
        if memory is not None and not isinstance(memory, MemoryManager):
            raise TypeError(f"memory must be a MemoryManager or None, got {type(memory).__name__}")
        if isinstance(cache_rows, bool) or not isinstance(cache_rows, (int, np.integer)):
            raise TypeError(f"cache_rows must be an int, got {cache_rows!r}")
        if cache_rows < 0:
            raise ValueError(f"cache_rows must be >= 0, got {cache_rows}")
        if cache_policy not in _POLICIES:
            raise ValueError(f"cache_policy must be one of {_POLICIES}, got {cache_policy!r}")
        if graph is not None and not isinstance(graph, CSCGraph):
            raise TypeError(f"graph must be a CSCGraph or None, got {type(graph).__name__}")
        num_rows = int(x.shape[0])
        if graph is not None and graph.num_nodes != num_rows:
            raise ValueError(f"graph has {graph.num_nodes} nodes but x has {num_rows} rows: one row per node")
        if cache_rows and graph is None:
            raise ValueError(f"cache_policy={cache_policy!r} needs graph= to choose the hot rows")
        cuda_present = torch.cuda.is_available()
        dev = torch.device(device) if device is not None else torch.device("cuda" if cuda_present else "cpu")
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if dev.type == "cuda" and not cuda_present:
            raise ValueError("device='cuda' but CUDA is not available: use device='cpu'")

        self.device = dev
        self.owner = owner
        self.cache_policy = cache_policy
        self.threads = int(threads) if threads is not None else nb.get_num_threads()
        self.huge_pages = bool(huge_pages)
        self.row_shape = tuple(x.shape[1:])
        self.dtype = x.dtype
        self._own_memory = memory is None
        self.memory = memory if memory is not None else MemoryManager()
        self._regions: list[Region] = []
        self._lock = threading.Lock()
        self._gathers = self._rows_out = self._hits = 0
        self._seconds = 0.0
        self._dev_hits = None
        try:
            self._place_table(x, memory, tier, fallback, cuda_present)
            self._cache: torch.Tensor | None = None
            self._slots: np.ndarray | None = None
            self._slots_t: torch.Tensor | None = None
            self.cache_nodes = torch.empty(0, dtype=torch.int64)
            cache_rows = min(int(cache_rows), num_rows)
            if cache_rows and self.table_tier == Tier.DEVICE.value:
                logger.info("the feature table is on the device tier: no cache needed (cache_rows ignored)")
            elif cache_rows:
                if dev.type == "cpu" and cuda_present:
                    raise ValueError("a cache lives on the device tier (GPU memory), which a CPU gather "
                                     "cannot read: use device='cuda' or cache_rows=0")
                assert graph is not None
                hot = self._hot_nodes(graph, cache_rows, presample_fanouts, presample_seeds,
                                      presample_batches, presample_batch_size, seed)
                self._build_cache(hot)
            self._staging = RowStaging(self.memory, self.row_shape, self.dtype, max(1, int(staging_slots)),
                                       *self._staging_tiers(), owner=f"{owner}.staging")
            self._held: deque[StagingLease] = deque()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ placement
    def _place_table(self, x: torch.Tensor, memory: MemoryManager | None, tier: Any, fallback: Any,
                     cuda_present: bool) -> None:
        gpu = self.device.type == "cuda"
        if memory is None:
            table = x.contiguous()
            if gpu and table.device.type == "cpu" and not table.is_pinned():
                # page-lock x in place (cudaHostRegister) so that the GPU kernel reads it through UVA
                region = self.memory.register(table, Tier.PINNED, owner=f"{self.owner}.table")
                self._regions.append(region)
                table = region.tensor()
            elif not gpu and table.device.type != "cpu":
                table = table.cpu()
            if self._wants_huge_pages(table):
                # x is already written: collapse its pages into huge pages in place (same contents)
                t0, nbytes = time.perf_counter(), table.numel() * table.element_size()
                if advise_huge_pages(table.data_ptr(), nbytes, collapse=True):
                    logger.info("feature table (%.2f GiB) collapsed onto huge pages in place in %.2f s "
                                "(huge_pages=False skips this)", nbytes / 2**30, time.perf_counter() - t0)
            self.table = table
            self.table_tier = "device" if table.device.type == "cuda" else ("pinned" if table.is_pinned()
                                                                              else "host")
            return
        if tier is None:
            if gpu:
                tier, default_fallback = Tier.DEVICE, (Tier.PINNED,)
            elif cuda_present:
                tier, default_fallback = Tier.PINNED, (Tier.HOST,)
            else:
                tier, default_fallback = Tier.DEVICE, (Tier.PINNED, Tier.HOST)
            fallback = default_fallback if fallback is None else fallback
        region = memory.allocate(tuple(x.shape), x.dtype, tier, owner=f"{self.owner}.table",
                                 fallback=() if fallback is None else fallback)
        self._regions.append(region)
        if region.tier is Tier.DISK:
            raise ValueError("the feature table cannot live on the disk tier (rows are read in place)")
        huge = self._wants_huge_pages(region.tensor())
        if huge:  # before the first write, so that the pages are faulted in as huge pages
            advise_huge_pages(region.tensor().data_ptr(), region.nbytes)
        region.write(x)
        if huge:  # memory written before (a reused mapping) or shared memory: collapse what is left
            advise_huge_pages(region.tensor().data_ptr(), region.nbytes, collapse=True)
        self.table = region.tensor()
        self.table_tier = region.tier.value
        if self.table.device.type != self.device.type and not (gpu and self.table.is_pinned()):
            raise ValueError(f"the feature table landed on tier '{region.tier}' ({self.table.device}), which "
                             f"a {self.device.type} gather cannot read: choose tier/fallback accordingly")

    def _wants_huge_pages(self, table: torch.Tensor) -> bool:
        return (self.huge_pages and self.device.type == "cpu" and table.device.type == "cpu"
                and not table.is_pinned() and table.numel() * table.element_size() >= _HUGE_TABLE_BYTES)

    def _staging_tiers(self) -> tuple[Tier, tuple[Tier, ...]]:
        if self.device.type == "cuda":
            return Tier.DEVICE, ()
        return Tier.PINNED, (Tier.HOST,)

    def _hot_nodes(self, graph: CSCGraph, count: int, fanouts: Any, seeds: Any, batches: int,
                   batch_size: int, seed: int) -> np.ndarray:
        n = graph.num_nodes
        node_ids = np.arange(n, dtype=np.int64)
        in_deg = graph.in_degrees().cpu().numpy()
        if self.cache_policy == "degree":
            order = np.lexsort((node_ids, -in_deg))
        elif self.cache_policy == "out_degree":
            out_deg = np.bincount(graph.indices.cpu().numpy(), minlength=n)
            order = np.lexsort((node_ids, -out_deg))
        else:
            counts = self.presample_counts(graph, fanouts, seeds, batches, batch_size, seed)
            order = np.lexsort((node_ids, -in_deg, -counts))
        return order[:count].astype(np.int64)

    @staticmethod
    def presample_counts(graph: CSCGraph, fanouts: Any = (10, 10), seeds: Any = None, batches: int = 8,
                         batch_size: int = 1024, seed: int = 0) -> np.ndarray:
        """How often each node is an input node (``blocks[0].src_nodes``) in a short pre-sampling pass.

        Parameters
        ----------
        graph : CSCGraph
        fanouts : sequence of int
            As for `NeighborSampler`, outermost first.
        seeds : torch.Tensor or None, int64, shape [S]
            Nodes to draw seed batches from (without replacement within a batch); default all nodes.
        batches, batch_size : int
            Number and size of the seed batches.
        seed : int
            Seeds the batch draws and the sampler.

        Returns
        -------
        numpy.ndarray, int64, shape [N]

        References
        ----------
        GNNLab (Yang et al., EuroSys 2022): pre-sampling to estimate each vertex's access frequency.
        """
        n = graph.num_nodes
        pool = (np.arange(n, dtype=np.int64) if seeds is None
                else check_seeds(seeds, n, name="presample_seeds"))
        counts = np.zeros(n, dtype=np.int64)
        if pool.size == 0:
            return counts
        rng = np.random.default_rng(seed)
        sampler = NeighborSampler(graph, list(fanouts), seed=seed)
        for _ in range(int(batches)):
            chosen = rng.choice(pool, size=min(int(batch_size), pool.size), replace=False)
            inputs = sampler.sample(torch.from_numpy(chosen))[0].src_nodes.numpy()
            counts += np.bincount(inputs, minlength=n)
        return counts

    def _build_cache(self, hot: np.ndarray) -> None:
        gpu = self.device.type == "cuda"
        c = int(hot.shape[0])
        region = self.memory.allocate((c, *self.row_shape), self.dtype, Tier.DEVICE,
                                      owner=f"{self.owner}.cache")
        self._regions.append(region)
        cache = region.tensor()
        if self._wants_huge_pages(cache):  # a CPU gather's cache is host memory too (no CUDA)
            advise_huge_pages(cache.data_ptr(), region.nbytes)
        table = self.table
        rows = torch.from_numpy(hot)
        cache.copy_(table[rows.to(table.device)] if table.device.type == "cuda" else table[rows])
        slot_region = self.memory.allocate((self.num_rows,), torch.int32, Tier.DEVICE,
                                           owner=f"{self.owner}.cache_map")
        self._regions.append(slot_region)
        slots = np.full(self.num_rows, -1, dtype=np.int32)
        slots[hot] = np.arange(c, dtype=np.int32)
        slot_region.write(torch.from_numpy(slots))
        self._cache = cache
        self._slots_t = slot_region.tensor()
        self._slots = self._slots_t.numpy() if not gpu else None
        self.cache_nodes = torch.from_numpy(hot)
        self.cache_tier = region.tier.value

    # ------------------------------------------------------------------ sizes
    @property
    def num_rows(self) -> int:
        """N."""
        return int(self.table.shape[0])

    @property
    def row_bytes(self) -> int:
        """Bytes of one row."""
        return math.prod(self.row_shape) * self.table.element_size()

    @property
    def cache_rows(self) -> int:
        """Rows in the cache (0 without one)."""
        return int(self.cache_nodes.shape[0])

    def __len__(self) -> int:
        return self.num_rows

    def __repr__(self) -> str:
        return (f"FeatureStore(rows={self.num_rows}, row_shape={self.row_shape}, dtype={self.dtype}, "
                f"table_tier={self.table_tier}, cache_rows={self.cache_rows}, device={self.device.type})")

    # ------------------------------------------------------------------ gather
    def staging(self, slots: int = 2, rows: int = 0) -> RowStaging:
        """New staging buffers for this store's rows, from its manager (pinned for a CPU gather on a
        CUDA machine, host memory without CUDA, device memory for a GPU gather).

        Parameters
        ----------
        slots : int
            Buffers (leases that may be held at once).
        rows : int
            Rows per buffer to start with (it grows on demand).

        Returns
        -------
        RowStaging
            Its owner name is ``f"{owner}.staging"``; close it when done.
        """
        return RowStaging(self.memory, self.row_shape, self.dtype, slots, *self._staging_tiers(),
                          owner=f"{self.owner}.staging", rows=rows)

    def check_ids(self, ids: Any) -> np.ndarray:
        """Validate row ids at the public boundary; return them as a contiguous int64 numpy array.

        Raises
        ------
        TypeError
            ``ids`` is not an integer tensor or array.
        ValueError
            ``ids`` is not 1-D, or holds ids outside [0, num_rows) (the message names ``ids``, counts
            them and quotes the first).
        """
        return check_seeds(ids, self.num_rows, name="ids", bound="num_rows")

    def gather(self, ids: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``x[ids]``, written into a staging buffer or into ``out``.

        Parameters
        ----------
        ids : torch.Tensor or array-like, integer, shape [B]
            Row (node) ids in [0, N); duplicates allowed.
        out : torch.Tensor or None, shape [>= B, *row], the table's dtype, contiguous
            Where to write (on the CPU for a CPU gather, on the GPU for a GPU gather). ``None``: the
            next of the store's staging buffers, valid until ``staging_slots`` more gathers without
            ``out`` (see the module docstring).

        Returns
        -------
        torch.Tensor, shape [B, *row]
            ``out[:B]`` or a staging view: no fresh allocation in steady state.

        Raises
        ------
        TypeError
            ``ids`` is not integer; ``out`` is not a tensor of the table's dtype.
        ValueError
            ``ids`` is not 1-D or holds ids outside [0, num_rows); ``out`` has the wrong shape, is
            not contiguous or is on the wrong device.
        """
        arr = self.check_ids(ids)
        if out is None:
            lease = self._lease(arr.shape[0])
            return self.gather_into(arr, lease.tensor)
        self._check_out(out, arr.shape[0])
        return self.gather_into(arr, out)

    def _lease(self, rows: int) -> StagingLease:
        with self._lock:
            held = self._held
            if len(held) >= self._staging.slots:
                held.popleft().release()
            lease = self._staging.acquire(rows)
            held.append(lease)
            return lease

    def _check_out(self, out: Any, rows: int) -> None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype != self.dtype:
            raise TypeError(f"out must have the table's dtype {self.dtype}, got {out.dtype}")
        if tuple(out.shape[1:]) != self.row_shape or out.shape[0] < rows:
            raise ValueError(f"out must have shape [>= {rows}, {', '.join(map(str, self.row_shape))}], "
                             f"got {tuple(out.shape)}")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")
        if out.device.type != self.device.type:
            raise ValueError(f"out must be on {self.device.type} for this store, got {out.device}")

    def gather_into(self, ids: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        """`gather` without checks, for loaders whose ids come from a sampler (trusted in range).

        Parameters
        ----------
        ids : numpy.ndarray or torch.Tensor, int64, shape [B], every id in [0, N)
        out : torch.Tensor, shape [>= B, *row], contiguous, on the gather's device

        Returns
        -------
        torch.Tensor
            ``out[:B]``.
        """
        t0 = time.perf_counter()
        b = int(ids.shape[0])
        if self.device.type == "cuda":
            hits = self._gather_cuda(ids, out)
        else:
            ids_np = ids.numpy() if isinstance(ids, torch.Tensor) else ids
            ids_np = np.ascontiguousarray(ids_np, dtype=np.int64)
            hits = gather_rows(self.table, ids_np, out, self.threads, self._cache, self._slots)
        dt = time.perf_counter() - t0
        with self._lock:
            self._gathers += 1
            self._rows_out += b
            self._hits += hits
            self._seconds += dt
        return out[:b]

    def _gather_cuda(self, ids: Any, out: torch.Tensor) -> int:  # pragma: no cover - needs a GPU
        from numba import cuda

        dev = out.device
        ids_t = torch.as_tensor(ids).to(dev, torch.int64, non_blocking=True)
        stream = cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream)
        if self._dev_hits is None:
            self._dev_hits = torch.zeros(1, dtype=torch.int64, device=dev)
            self._table_words = uva_words(self.table)
            if self._cache is not None:
                self._cache_words = uva_words(self._cache)
                self._slots_dev = cuda.as_cuda_array(self._slots_t)
        b = int(ids_t.shape[0])
        out_words = uva_words(out[:b]) if b else None
        if b:
            gather_rows_cuda(self._table_words, cuda.as_cuda_array(ids_t), out_words,
                             cache=self._cache_words if self._cache is not None else None,
                             slots=self._slots_dev if self._cache is not None else None,
                             hits=cuda.as_cuda_array(self._dev_hits), stream=stream)
        return 0  # device-side hits are read by stats()

    # ------------------------------------------------------------------ statistics
    def stats(self) -> dict[str, Any]:
        """Gather statistics and placement, as plain data.

        Returns
        -------
        dict
            ``rows``, ``row_bytes``, ``dtype``, ``device``, ``table_tier``, ``cache_rows``,
            ``cache_tier`` (None without a cache), ``cache_policy``, ``gathers`` (calls),
            ``gathered_rows``, ``cache_hits`` (rows read from the cache), ``hit_rate``
            (``cache_hits / gathered_rows``, 0.0 before any gather), ``gathered_bytes``,
            ``gather_seconds`` (wall time inside gathers; a GPU gather is asynchronous) and
            ``gather_bytes_per_s``.
        """
        with self._lock:
            gathers, rows, hits, secs = self._gathers, self._rows_out, self._hits, self._seconds
        if self._dev_hits is not None:  # pragma: no cover - needs a GPU
            hits += int(self._dev_hits.item())
        nbytes = rows * self.row_bytes
        return {
            "rows": self.num_rows, "row_bytes": self.row_bytes,
            "dtype": str(self.dtype).removeprefix("torch."), "device": self.device.type,
            "table_tier": self.table_tier, "cache_rows": self.cache_rows,
            "cache_tier": getattr(self, "cache_tier", None) if self.cache_rows else None,
            "cache_policy": self.cache_policy if self.cache_rows else None,
            "gathers": gathers, "gathered_rows": rows, "cache_hits": hits,
            "hit_rate": hits / rows if rows else 0.0, "gathered_bytes": nbytes, "gather_seconds": secs,
            "gather_bytes_per_s": nbytes / secs if secs > 0 else 0.0,
        }

    def reset_stats(self) -> None:
        """Zero the gather counters (placement is kept)."""
        with self._lock:
            self._gathers = self._rows_out = self._hits = 0
            self._seconds = 0.0
        if self._dev_hits is not None:  # pragma: no cover - needs a GPU
            self._dev_hits.zero_()

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Free the table, cache and staging regions (and a private manager); idempotent.

        Tensors returned earlier stay readable but no longer count against any budget.
        """
        staging = getattr(self, "_staging", None)
        if staging is not None:
            staging.close()
        for region in getattr(self, "_regions", ()):
            if not region.freed:
                try:
                    region.free()
                except ValueError:  # the manager closed first
                    pass
        self._regions = []
        if getattr(self, "_own_memory", False):
            self.memory.close()

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

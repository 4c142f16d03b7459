"""Row gathers of a feature table, ``out[i] = table[ids[i]]``: the CPU kernel and the GPU kernel.

`gather_rows` (CPU) copies each row with one ``memcpy`` (an LLVM intrinsic inside a ``nogil`` numba
kernel, `graphrl.kernels`), prefetching the row about 32 KiB of rows ahead into L2
(`graphrl.kernels.prefetch_l2`) and, for batches of at least 8 MiB, writing with streaming
(non-temporal) stores; chunks of rows are claimed dynamically by the calling thread and helper threads
(`graphrl.kernels.parallel_for`), so a busy machine costs at most the speed-up.

`gather_rows_cuda` (GPU, numba.cuda, a warp per row) reads rows in place from GPU memory or from pinned
host memory through UVA (PyTorch-Direct's zero-copy gather) and writes into device memory; `word_view`
views a tensor's rows as the machine words the kernel copies (`graphrl.cuda` builds the view). Both
read a row from a cache of hot rows instead where its slot says so (`samplers.feature_cache`). Ids are
trusted: `samplers.features.FeatureStore` checks them. Importing this module never imports numba.cuda.

References
----------
Min et al., "Large Graph Convolutional Network Training with GPU-Oriented Data Communication
Architecture" (PyTorch-Direct), PVLDB 14(11), 2021: GPU gathers from pinned host memory through UVA.
"""

from __future__ import annotations

import functools
from typing import Any

import numba as nb
import numpy as np
import torch

from graphrl.kernels import (
    LINE,
    STREAM_THRESHOLD,
    copy_bytes,
    parallel_for,
    prefetch_l2,
    store_fence,
    stream_bytes_nofence,
    stream_line_nofence,
)

__all__ = ["CHUNK_BYTES", "PREFETCH_BYTES", "PREFETCH_LINES", "STREAM_BYTES", "gather_rows",
           "gather_rows_cuda", "prefetch_rows", "word_type", "word_view"]

CHUNK_BYTES = 1 << 21
"""Rows per dynamically claimed chunk of a CPU gather: about 2 MiB of output."""
PREFETCH_BYTES = 32 << 10
"""Default prefetch distance of the CPU gather, in bytes of rows ahead (at least 4, at most 64 rows)."""
PREFETCH_MIN, PREFETCH_MAX = 4, 64
PREFETCH_LINES = 16
"""Cache lines prefetched per row (the hardware streams the rest of a long row)."""
STREAM_BYTES = STREAM_THRESHOLD
"""Batches of at least this many bytes are written with streaming stores (8 MiB, as `graphrl.kernels`)."""


def prefetch_rows(row_bytes: int) -> int:
    """The default prefetch distance, in rows, for rows of ``row_bytes`` bytes."""
    return max(PREFETCH_MIN, min(PREFETCH_MAX, PREFETCH_BYTES // max(row_bytes, 1)))


# --------------------------------------------------------------------------------------------------
# CPU kernel


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
    lines = min((row_bytes + LINE - 1) // LINE, PREFETCH_LINES)
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
    lines = min((row_bytes + LINE - 1) // LINE, PREFETCH_LINES)
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
        the first ``PREFETCH_LINES`` cache lines of) row ``i + ahead`` into L2; 0 turns prefetching
        off. Default: about ``PREFETCH_BYTES`` (32 KiB) ahead, 4 to 64 rows.
    stream : bool or None
        Write ``out`` with streaming (non-temporal) stores (`graphrl.kernels.stream_bytes`), which
        skip reading the output lines into the cache first. Default: when the batch is at least
        ``STREAM_BYTES`` (8 MiB), rows are whole cache lines and ``out`` is 64-byte aligned. Rows of
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
    handling. docs/performance.md ("Feature store") has the measurements behind these choices.
    """
    b = int(ids.shape[0])
    row_bytes = table[0].numel() * table.element_size() if table.shape[0] else 0
    if b == 0 or row_bytes == 0:
        return 0
    src, dst = _flat_bytes(table), _flat_bytes(out)
    cached = cache is not None
    csrc = _flat_bytes(cache) if cached else src
    if ahead is None:
        ahead = prefetch_rows(row_bytes)
    lines = row_bytes % LINE == 0 and dst.ctypes.data % LINE == 0
    if stream is None:
        stream = b * row_bytes >= STREAM_BYTES and lines
    mode = (_STREAM_LINES if lines else _STREAM) if stream else _CACHED
    step = max(64, CHUNK_BYTES // row_bytes)
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
# GPU kernel (numba.cuda), defined on first use so that importing this module never imports numba.cuda


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
    device memory or pinned host memory viewed in place through UVA (`word_view`).

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
        Stream to launch on: `graphrl.cuda.launch_stream` (torch's current stream,
        docs/architecture.md#the-stream-rule) orders it with the caller's torch work.
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


def word_type(row_bytes: int) -> tuple[torch.dtype, str]:
    """The widest word (int32, int16 or uint8) that divides a row: its torch dtype and array typestr."""
    for dtype, typestr in ((torch.int32, "<i4"), (torch.int16, "<i2")):
        if row_bytes % dtype.itemsize == 0:
            return dtype, typestr
    return torch.uint8, "|u1"


def word_view(tensor: torch.Tensor) -> Any:
    """A numba device array of words [N, W] over the rows of a tensor: in place, no copy.

    A CUDA tensor is viewed directly (`graphrl.cuda.as_device_array`); a page-locked host tensor (a
    pinned region) through UVA (`graphrl.cuda.uva_view`), so GPU kernels read its rows over PCIe without
    a staging copy.

    Parameters
    ----------
    tensor : torch.Tensor, shape [N, *row], contiguous; on a GPU or in pinned host memory

    Returns
    -------
    numba device array, int32 (int16 or uint8 when the row size demands), shape [N, W]

    Raises
    ------
    ValueError
        A non-contiguous tensor, or host memory that is not page-locked.
    """
    from graphrl import cuda as gcuda  # imports numba.cuda: only when a GPU gather runs

    if not tensor.is_contiguous():
        raise ValueError("word_view() needs a contiguous tensor")
    n = tensor.shape[0]
    row_bytes = (tensor.numel() // n if n else 0) * tensor.element_size()
    dtype, typestr = word_type(row_bytes)
    width = row_bytes // dtype.itemsize
    if tensor.device.type == "cpu" and not gcuda.SIMULATOR:
        if not tensor.is_pinned():
            raise ValueError("word_view() needs a GPU tensor or page-locked host memory (a pinned region)")
        return gcuda.uva_view(tensor, shape=(n, width), typestr=typestr)
    return gcuda.as_device_array(tensor.view(torch.uint8).view(dtype).reshape(n, width))

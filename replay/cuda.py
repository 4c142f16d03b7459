"""GPU window gather (numba.cuda): windows read in place from pinned host rings into a device batch.

GEAR's zero-copy collect: the shard rings live in page-locked host memory that the GPU can address
(UVA), so a kernel copies each window's bytes straight from the ring into the learner's device batch,
with no CPU-side gather and no staging copy. One CUDA block per window; its threads stride over the
window's bytes (as 8-, 4-, 2- or 1-byte words, the widest that the row size and the buffers'
alignment allow: `word_dtype`), copy the one or two runs of the ring the window covers, and zero the
padding. The semantics are those of `replay.windows.gather_windows` (same arguments), which the
tests check under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba is imported).

`replay.gather` uses `gather_fields_cuda` (one upload of the window table, one launch per field) on
`flat_bytes` views (numba views of the pinned rings and of the device batch, in place, made by
`graphrl.cuda.as_device_array`), launched on `graphrl.cuda.launch_stream` (torch's current stream:
docs/architecture.md#the-stream-rule). Importing this module imports ``numba.cuda``; the CPU path
never imports it. Under the simulator blocks have `THREADS` = 8 threads (the simulator runs each as
a Python thread) instead of 256; the kernels are the same.

>>> out = flat_bytes(batch_tensor)                 # CUDA tensor (simulator: a CPU tensor)
>>> gather_fields_cuda(rings, (out,), row_bytes, first_slot, n, dst, rows, length, stream=stream)

References
----------
GEAR (Wang et al., ICML 2023): GPU kernels gathering trajectory windows from pinned shared memory.
Min et al., PyTorch-Direct (PVLDB 2021): GPU reads of pinned host memory through UVA.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numba import cuda

from graphrl.cuda import SIMULATOR, as_device_array

__all__ = ["THREADS", "flat_bytes", "gather_fields_cuda", "gather_windows_cuda", "word_dtype"]

THREADS = 8 if SIMULATOR else 256  # threads a block: the simulator runs one Python thread per thread


@cuda.jit
def _gather_kernel(src, row_words, capacity, first, n, dst, rows, length, out):  # pragma: no cover - device
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    f = first[b]
    k = n[b]
    d = dst[b]
    n1 = min(k, capacity - f)
    base = rows[b] * length * row_words
    o = base + d * row_words
    s = f * row_words
    for i in range(tid, n1 * row_words, step):
        out[o + i] = src[s + i]
    o2 = o + n1 * row_words
    for i in range(tid, (k - n1) * row_words, step):
        out[o2 + i] = src[i]
    for i in range(tid, d * row_words, step):
        out[base + i] = 0
    t0 = base + (d + k) * row_words
    for i in range(tid, (length - d - k) * row_words, step):
        out[t0 + i] = 0


def _address(arr: Any) -> int:
    iface = getattr(arr, "__cuda_array_interface__", None)
    if iface is not None:
        return int(iface["data"][0])
    return 0  # simulator arrays: numpy-backed, aligned by numpy


def word_dtype(row_bytes: int, *arrays: Any) -> type:
    """The widest word (uint64, uint32, uint16 or uint8) dividing ``row_bytes`` and every array's address."""
    for dtype in (np.uint64, np.uint32, np.uint16):
        size = np.dtype(dtype).itemsize
        if row_bytes % size == 0 and all(_address(a) % size == 0 for a in arrays):
            return dtype
    return np.uint8


def gather_windows_cuda(
    src: Any,
    row_bytes: int,
    first_slot: np.ndarray,
    n: np.ndarray,
    dst: np.ndarray,
    out: Any,
    length: int,
    rows: np.ndarray | None = None,
    stream: Any = 0,
    threads: int = THREADS,
) -> Any:
    """Launch the gather: windows of a ring (flat bytes) into a batch (flat bytes), zeroing padding.

    Parameters
    ----------
    src : numba device array, uint8 [capacity * row_bytes]
        One field's ring, flat (device memory, or pinned host memory through UVA: `flat_bytes`).
    row_bytes : int
        Bytes of one step of the field (>= 1).
    first_slot, n, dst : numpy.ndarray, int64 [B]
        As for `replay.windows.gather_windows` (from `replay.windows.window_bounds`).
    out : numba device array, uint8 [R * length * row_bytes]
        The batch field, flat; filled in place.
    length : int
        Window length L.
    rows : numpy.ndarray, int64 [B], optional
        Row of ``out`` for each window (default ``0..B-1``).
    stream : numba stream or 0
        Stream to launch on (asynchronous with respect to the host).
    threads : int
        Threads per block (one block per window).

    Returns
    -------
    numba device array
        ``out``.

    Raises
    ------
    ValueError
        Sizes that do not fit: ``src`` not a whole number of rows, or ``out`` too small for ``rows``.
    """
    if row_bytes < 1 or src.shape[0] % row_bytes:
        raise ValueError(f"src has {src.shape[0]} bytes, not a whole number of {row_bytes}-byte rows")
    b = len(first_slot)
    rows = np.arange(b, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    if b and (rows.max() + 1) * length * row_bytes > out.shape[0]:
        raise ValueError(
            f"out holds {out.shape[0]} bytes, too few for row {int(rows.max())} of {length} steps"
        )
    if b == 0:
        return out
    meta = np.stack(
        [np.asarray(first_slot, np.int64), np.asarray(n, np.int64), np.asarray(dst, np.int64), rows]
    )
    meta_dev = cuda.to_device(meta, stream=stream)
    _launch(src, row_bytes, meta_dev, b, out, length, stream, threads)
    return out


def _launch(
    src: Any, row_bytes: int, meta_dev: Any, b: int, out: Any, length: int, stream: Any, threads: int
) -> None:
    word = word_dtype(row_bytes, src, out)
    size = np.dtype(word).itemsize
    capacity = src.shape[0] // row_bytes
    s = src.view(word) if word is not np.uint8 else src
    o = out.view(word) if word is not np.uint8 else out
    _gather_kernel[b, threads, stream](
        s, row_bytes // size, capacity, meta_dev[0], meta_dev[1], meta_dev[2], meta_dev[3], length, o
    )


def gather_fields_cuda(
    rings: tuple[Any, ...],
    outs: tuple[Any, ...],
    row_bytes: np.ndarray,
    first_slot: np.ndarray,
    n: np.ndarray,
    dst: np.ndarray,
    rows: np.ndarray,
    length: int,
    stream: Any = 0,
    threads: int = THREADS,
) -> None:
    """Launch the gather for every field of one shard: the window table goes up once, one launch a field.

    The GPU counterpart of `replay.windows.gather_fields` (same arguments but the capacity, which is
    each ring's size over its row size). Asynchronous: the copies are done once ``stream`` is
    (`graphrl.cuda.synchronize`). The caller (`replay.gather`) has validated every size; kernels trust
    them.

    Parameters
    ----------
    rings : tuple of numba device arrays, uint8 [capacity * row_bytes[f]]
        One shard's rings, flat, in field order (pinned host memory through UVA, or device memory:
        `flat_bytes`).
    outs : tuple of numba device arrays, uint8 [R * length * row_bytes[f]]
        The batch's fields, flat, in the same order.
    row_bytes : numpy.ndarray, int64 [F]
        Bytes of one step of each field.
    first_slot, n, dst : numpy.ndarray, int64 [B]
        As for `replay.windows.gather_windows`: first ring slot, real steps, offset in the window.
    rows : numpy.ndarray, int64 [B]
        Row of the batch each window fills.
    length : int
        Window length L.
    stream : numba stream or 0
    threads : int
        Threads per block (one block per window).
    """
    b = len(first_slot)
    if b == 0:
        return
    meta = np.stack(
        [
            np.asarray(first_slot, np.int64),
            np.asarray(n, np.int64),
            np.asarray(dst, np.int64),
            np.asarray(rows, np.int64),
        ]
    )
    meta_dev = cuda.to_device(meta, stream=stream)
    for src, out, rb in zip(rings, outs, row_bytes.tolist(), strict=True):
        _launch(src, int(rb), meta_dev, b, out, length, stream, threads)


def flat_bytes(tensor: torch.Tensor) -> Any:
    """A numba device array (flat uint8) over a contiguous tensor's bytes, in place.

    Built on `graphrl.cuda.as_device_array`: a CUDA tensor directly, page-locked host memory through
    UVA, and under the simulator a CPU tensor as it is.

    Raises
    ------
    ValueError
        As `graphrl.cuda.as_device_array`: a non-contiguous tensor, host memory that is not
        page-locked, or (simulator) a GPU tensor.
    """
    if not tensor.is_contiguous():
        raise ValueError("flat_bytes() needs a contiguous tensor")
    return as_device_array(tensor.detach().reshape(-1).view(torch.uint8))

"""GPU window gather (numba.cuda): windows read in place from pinned host rings into a device batch.

GEAR's zero-copy collect: the shard rings live in page-locked host memory that the GPU can address
(UVA), so a kernel copies each window's bytes straight from the ring into the learner's device batch,
with no CPU-side gather and no staging copy. One CUDA block per window; its threads stride over the
window's bytes (as 8-, 4-, 2- or 1-byte words, the widest that the row size and the buffers'
alignment allow), copy the one or two runs of the ring the window covers, and zero the padding.
The semantics are those of `replay.windows.gather_windows` (same arguments), which the tests check
under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba.cuda is imported).

The store never imports this module: the CPU path needs no CUDA. Importing it imports
``numba.cuda`` (choose the simulator with ``NUMBA_ENABLE_CUDASIM=1`` before that).

References
----------
GEAR (Wang et al., ICML 2023): GPU kernels gathering trajectory windows from pinned shared memory.
Min et al., PyTorch-Direct (PVLDB 2021): GPU reads of pinned host memory through UVA.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

__all__ = ["gather_windows_cuda", "uva_array"]

_THREADS = 256


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


def _word(row_bytes: int, *arrays: Any) -> type:
    for dtype in (np.uint64, np.uint32, np.uint16):
        size = np.dtype(dtype).itemsize
        if row_bytes % size == 0 and all(_address(a) % size == 0 for a in arrays):
            return dtype
    return np.uint8


def uva_array(tensor: Any) -> Any:
    """A numba device array (flat uint8) over a page-locked host tensor, addressed in place through UVA.

    Parameters
    ----------
    tensor : torch.Tensor
        Contiguous, on the CPU, page-locked (``tensor.is_pinned()``: a pinned region, or a shared
        region registered with `graphrl.memory.MemoryManager.register`).

    Raises
    ------
    ValueError
        The tensor is not contiguous host memory that is page-locked.
    """
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or not tensor.is_pinned():
        raise ValueError("uva_array() needs a contiguous, page-locked host tensor (pin or register it first)")

    class _Host:
        def __init__(self) -> None:
            self.__cuda_array_interface__ = {
                "shape": (tensor.numel() * tensor.element_size(),),
                "typestr": "|u1",
                "data": (tensor.data_ptr(), False),
                "version": 3,
                "strides": None,
            }
            self.owner = tensor

    return cuda.as_cuda_array(_Host())


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
    threads: int = _THREADS,
) -> Any:
    """Launch the gather: windows of a ring (flat bytes) into a batch (flat bytes), zeroing padding.

    Parameters
    ----------
    src : numba device array, uint8 [capacity * row_bytes]
        One field's ring, flat (device memory, or pinned host memory through `uva_array`).
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
    word = _word(row_bytes, src, out)
    size = np.dtype(word).itemsize
    capacity = src.shape[0] // row_bytes
    meta = np.stack(
        [np.asarray(first_slot, np.int64), np.asarray(n, np.int64), np.asarray(dst, np.int64), rows]
    )
    meta_dev = cuda.to_device(meta, stream=stream)
    s = src.view(word) if word is not np.uint8 else src
    o = out.view(word) if word is not np.uint8 else out
    _gather_kernel[b, threads, stream](
        s, row_bytes // size, capacity, meta_dev[0], meta_dev[1], meta_dev[2], meta_dev[3], length, o
    )
    return out

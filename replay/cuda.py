"""GPU window gather (numba.cuda): windows read in place from pinned host rings into a device batch.

GEAR's zero-copy collect: the shard rings live in page-locked host memory that the GPU can address
(UVA), so a kernel copies each window's bytes straight from the ring into the learner's device batch,
with no CPU-side gather and no staging copy. One CUDA block per window; its threads stride over the
window's bytes (as 8-, 4-, 2- or 1-byte words, the widest that the row size and the buffers'
alignment allow), copy the one or two runs of the ring the window covers, and zero the padding.
The semantics are those of `replay.windows.gather_windows` (same arguments), which the tests check
under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba.cuda is imported).

`ReplayStore.sample(device="cuda")` uses `gather_fields_cuda` (one upload of the window table, one
launch per field), `device_bytes` (numba views of the pinned rings and of the device batch, in place),
`launch_stream` and `synchronize`. The store imports this module only on that path: the CPU path needs
no CUDA. Importing it imports ``numba.cuda`` (choose the simulator with ``NUMBA_ENABLE_CUDASIM=1``
before that).

Under the simulator the same functions run with CPU tensors standing in for device memory:
`device_bytes` wraps any contiguous CPU tensor in place (numba's numpy-backed fake device array; no
page-locking needed or possible), the stream is the default one, `synchronize` does nothing (the
simulator runs kernels synchronously), and blocks have `THREADS` = 8 threads (the simulator runs each
thread as a Python thread) instead of 256. The kernels are the same.

Run on a real GPU: nothing yet (no device machine was lent while this was written); the kernels and
the store's GPU path have run only under the simulator. ``benchmarks/gpu_check.py`` checks both on a GPU.

References
----------
GEAR (Wang et al., ICML 2023): GPU kernels gathering trajectory windows from pinned shared memory.
Min et al., PyTorch-Direct (PVLDB 2021): GPU reads of pinned host memory through UVA.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numba
import numpy as np
import torch
from numba import cuda

__all__ = [
    "SIMULATOR",
    "THREADS",
    "device_bytes",
    "device_context",
    "gather_fields_cuda",
    "gather_windows_cuda",
    "launch_stream",
    "synchronize",
    "uva_array",
]

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)  # numba.cuda is the simulator (chosen at numba's import)
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
    threads: int = THREADS,
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
    meta = np.stack(
        [np.asarray(first_slot, np.int64), np.asarray(n, np.int64), np.asarray(dst, np.int64), rows]
    )
    meta_dev = cuda.to_device(meta, stream=stream)
    _launch(src, row_bytes, meta_dev, b, out, length, stream, threads)
    return out


def _launch(
    src: Any, row_bytes: int, meta_dev: Any, b: int, out: Any, length: int, stream: Any, threads: int
) -> None:
    word = _word(row_bytes, src, out)
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
    (`synchronize`). The caller (`ReplayStore.sample`) has validated every size; kernels trust them.

    Parameters
    ----------
    rings : tuple of numba device arrays, uint8 [capacity * row_bytes[f]]
        One shard's rings, flat, in field order (pinned host memory through UVA, or device memory:
        `device_bytes`).
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


def device_bytes(tensor: torch.Tensor) -> Any:
    """A numba device array (flat uint8) over a tensor's bytes, in place (no copy).

    A CUDA tensor is viewed directly; a page-locked host tensor through UVA (`uva_array`). Under the
    simulator any contiguous CPU tensor is wrapped as it is (it stands in for device memory).

    Parameters
    ----------
    tensor : torch.Tensor
        Contiguous; on a GPU, or page-locked host memory (simulator: any CPU tensor).

    Raises
    ------
    ValueError
        A non-contiguous tensor, host memory that is not page-locked, or (simulator) a GPU tensor.
    """
    if not tensor.is_contiguous():
        raise ValueError("device_bytes() needs a contiguous tensor")
    if SIMULATOR:
        if tensor.device.type != "cpu":
            raise ValueError(
                f"under numba's CUDA simulator, device memory is a CPU tensor; got {tensor.device}"
            )
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(tensor.detach().reshape(-1).view(torch.uint8).numpy())
    if tensor.device.type == "cuda":
        return cuda.as_cuda_array(tensor.detach().reshape(-1).view(torch.uint8))
    return uva_array(tensor)


def launch_stream(device: torch.device) -> Any:
    """The numba stream of torch's current stream on ``device`` (0, the default, under the simulator)."""
    if SIMULATOR or device.type != "cuda":
        return 0
    return cuda.external_stream(torch.cuda.current_stream(device).cuda_stream)


def device_context(device: torch.device) -> Any:
    """Make ``device`` numba's current device for the launches (a no-op under the simulator)."""
    if SIMULATOR or device.type != "cuda":
        return contextlib.nullcontext()
    return cuda.gpus[device.index if device.index is not None else torch.cuda.current_device()]


def synchronize(stream: Any) -> None:
    """Wait until every launch on ``stream`` has finished (the simulator has already finished)."""
    if not isinstance(stream, int):
        stream.synchronize()
    elif not SIMULATOR:
        cuda.synchronize()

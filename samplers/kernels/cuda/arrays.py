"""Device arrays of the GPU kernels: torch tensors from torch's caching allocator where torch has CUDA
(a batch allocates a dozen arrays per layer; ``cudaMalloc`` and the synchronising ``cudaFree`` would
cost more than the kernels), else numba device arrays (the simulator). Every function of the package
takes either kind."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numba import cuda

from graphrl import cuda as gcuda
from samplers.kernels.cuda.device import torch_dtypes
from samplers.kernels.cuda.launch import EDGE_THREADS, grid, launch

__all__ = ["as_device_ids", "concat", "copy_into", "empty", "fill", "fill_with", "full", "is_float64",
           "no_excluded", "to_device", "view_as"]


@cuda.jit
def fill(arr, value):  # pragma: no cover - device
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < arr.shape[0]:
        arr[i] = value
        i += stride


def empty(n: int, dtype: Any) -> Any:
    """An uninitialised device array [n] of a numpy (or torch) dtype: a CUDA tensor from torch's caching
    allocator where torch has CUDA (a batch allocates a dozen arrays per layer: ``cudaMalloc`` and the
    synchronising ``cudaFree`` behind ``cuda.device_array`` would cost more than the kernels), else a
    numba device array (the simulator). Every function of this package takes either kind. torch
    allocates on its current stream, the stream the kernels launch on (`launch.kernel_stream`)."""
    dtypes = torch_dtypes()
    if dtypes:
        return torch.empty(max(n, 0), dtype=dtypes[_np_dtype(dtype)], device="cuda")
    return cuda.device_array(n, dtype=_np_dtype(dtype))


def _np_dtype(dtype: Any) -> np.dtype:
    if isinstance(dtype, torch.dtype):
        return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
    return np.dtype(dtype)


def is_float64(arr: Any) -> bool:
    return arr.dtype == (torch.float64 if isinstance(arr, torch.Tensor) else np.float64)


def view_as(arr: Any, dtype: Any) -> Any:
    """The same 8-byte words as int64 or float64 (numpy dtype), for either kind of array."""
    if isinstance(arr, torch.Tensor):
        return arr.view(torch_dtypes()[np.dtype(dtype)])
    return arr.view(dtype)


def copy_into(out: Any, src: Any, stream: Any = 0) -> None:
    """Device-to-device copy of ``src`` into ``out`` (same length), for either kind of array (torch on
    its current stream, numba on ``stream``)."""
    if isinstance(out, torch.Tensor):
        out.copy_(torch.as_tensor(src, device="cuda"))
    else:
        out.copy_to_device(src, stream=stream)


def concat(parts: list, dtype: Any, stream: Any = 0) -> Any:
    """Device arrays of one dtype, concatenated into a new device array (a single part as it is)."""
    if len(parts) == 1:
        return parts[0]
    out = empty(sum(int(p.shape[0]) for p in parts), dtype)
    at = 0
    for part in parts:
        n = int(part.shape[0])
        if n:
            copy_into(out[at:at + n], part, stream)
        at += n
    return out


def full(n: int, value: int, stream: Any = None) -> Any:
    """A device int64 array [n] filled with ``value`` (``torch.full`` where torch has CUDA; else a fill
    kernel on ``stream``, default `kernel_stream()`)."""
    if torch_dtypes():
        return torch.full((n,), int(value), dtype=torch.int64, device="cuda")
    arr = cuda.device_array(n, dtype=np.int64)
    if n:
        launch(fill, (grid(n, EDGE_THREADS), EDGE_THREADS), arr, np.int64(value), stream=stream)
    return arr


def fill_with(arr: Any, value: int, stream: Any = None) -> None:
    """Fill a device int64 array with ``value`` in place (torch's ``fill_`` on its current stream where
    torch has CUDA; else the fill kernel on ``stream``, default `kernel_stream()`): no allocation."""
    if isinstance(arr, torch.Tensor):
        arr.fill_(int(value))
    elif arr.shape[0]:
        launch(fill, (grid(arr.shape[0], EDGE_THREADS), EDGE_THREADS), arr, np.int64(value), stream=stream)


def to_device(arr: np.ndarray, stream: Any) -> Any:
    """A numba device copy of a host array, copied on ``stream`` (ordered before the kernels on it)."""
    return cuda.to_device(np.ascontiguousarray(arr), stream=stream)


def as_device_ids(ids: Any, stream: Any = 0) -> Any:
    """Device int64 ids: device arrays pass through, tensors are viewed in place (a CUDA tensor; under
    the simulator a host one), host arrays are copied on ``stream``."""
    if isinstance(ids, (np.ndarray, list, tuple)):
        return to_device(np.asarray(ids, dtype=np.int64), stream)
    if isinstance(ids, torch.Tensor):  # int64, contiguous: the caller's job
        return ids if torch_dtypes() else gcuda.as_device_array(ids)
    return ids


def no_excluded() -> Any:
    """An empty device int64 array (no excluded positions), made on first use (needs a CUDA context)."""
    global _NO_EXCLUDED_ARRAY
    if _NO_EXCLUDED_ARRAY is None:
        _NO_EXCLUDED_ARRAY = cuda.to_device(np.zeros(0, dtype=np.int64))
    return _NO_EXCLUDED_ARRAY


_NO_EXCLUDED_ARRAY = None

"""The one bridge between numba.cuda and torch: device-array views, UVA views of pinned memory, streams.

Every GPU kernel of both engines (neighbour sampling, feature gathers, replay window gathers) gets its
arrays and its stream from here, so one rule holds everywhere:

- **Views, not copies.** `as_device_array` views a CUDA tensor as a numba device array in place;
  `uva_view` views a page-locked host tensor (a pinned region, or shared memory registered with
  `graphrl.memory.MemoryManager.register`) in place through unified virtual addressing, so kernels
  read host memory over PCIe without a staging copy. Under numba's CUDA simulator
  (``NUMBA_ENABLE_CUDASIM=1``, set before numba is imported) a CPU tensor stands in for device memory
  and is wrapped as it is.
- **The stream rule** (docs/architecture.md#the-stream-rule): kernels launch on torch's *current*
  stream of the target device (`launch_stream`), the stream the caller's own torch work is ordered on,
  so no engine needs an extra synchronisation to hand a trainer its tensors, and a caller working on a
  side stream gets results ordered on that stream. Under the simulator the stream is numba's default
  (kernels run synchronously there).

>>> from graphrl import cuda as gcuda
>>> arr = gcuda.as_device_array(tensor)                 # CUDA tensor, or (UVA) pinned host tensor
>>> with gcuda.device_context(device):
...     stream = gcuda.launch_stream(device)
...     kernel[blocks, threads, stream](arr, ...)

Importing this module imports ``numba.cuda``. It imports neither engine.

References
----------
Min et al., PyTorch-Direct (PVLDB 2021): GPU kernels reading pinned host memory in place through UVA.
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
    "as_device_array",
    "device_context",
    "has_cuda",
    "launch_stream",
    "synchronize",
    "uva_view",
]

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)  # numba.cuda is the simulator (chosen at numba's import)


def has_cuda() -> bool:
    """True where kernels run on a real GPU and torch can allocate on it (never under the simulator)."""
    return (not SIMULATOR) and torch.cuda.is_available()


class _HostInterface:
    """An object exposing ``__cuda_array_interface__`` over host memory it keeps alive (``owner``)."""

    def __init__(self, tensor: torch.Tensor, shape: tuple[int, ...], typestr: str, readonly: bool) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (tensor.data_ptr(), readonly),
            "version": 3,
            "strides": None,
        }
        self.owner = tensor


def uva_view(
    tensor: torch.Tensor,
    shape: tuple[int, ...] | None = None,
    typestr: str | None = None,
    readonly: bool = False,
) -> Any:
    """A numba device array over a page-locked host tensor, addressed in place through UVA (no copy).

    Parameters
    ----------
    tensor : torch.Tensor
        Contiguous, on the CPU, page-locked (``tensor.is_pinned()``).
    shape : tuple of int, optional
        Shape of the view (default the tensor's); its bytes must not exceed the tensor's.
    typestr : str, optional
        Array-interface type string of the view (``"|u1"``, ``"<i4"``...; default the tensor's dtype).
    readonly : bool
        Mark the view read-only.

    Returns
    -------
    numba device array over the tensor's bytes (the view keeps the tensor alive).

    Raises
    ------
    ValueError
        The tensor is not contiguous host memory that is page-locked, or ``shape`` x ``typestr`` needs more
        bytes than it holds.
    """
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or not tensor.is_pinned():
        raise ValueError(
            f"uva_view() needs a contiguous, page-locked host tensor (pin or register it first); got one on "
            f"{tensor.device}, contiguous={tensor.is_contiguous()}, pinned={tensor.is_pinned()}"
        )
    shape = tuple(tensor.shape) if shape is None else tuple(int(s) for s in shape)
    typestr = tensor.numpy().dtype.str if typestr is None else typestr
    need = int(np.prod(shape, dtype=np.int64)) * np.dtype(typestr).itemsize
    have = tensor.numel() * tensor.element_size()
    if need > have:
        raise ValueError(
            f"uva_view(shape={shape}, typestr={typestr!r}) needs {need} bytes; the tensor has {have}"
        )
    return cuda.as_cuda_array(_HostInterface(tensor, shape, typestr, readonly))


def as_device_array(tensor: torch.Tensor) -> Any:
    """A kernel-readable numba device array over a tensor, in place (no copy).

    A CUDA tensor is viewed directly (without synchronising: work is ordered by `launch_stream`); a
    page-locked host tensor through UVA (`uva_view`). Under the simulator a contiguous CPU tensor stands
    in for device memory and is wrapped as it is.

    Parameters
    ----------
    tensor : torch.Tensor
        Contiguous; on a GPU or in page-locked host memory (simulator: any CPU tensor).

    Raises
    ------
    ValueError
        A non-contiguous tensor, host memory that is not page-locked, or (simulator) a GPU tensor.
    """
    if not tensor.is_contiguous():
        raise ValueError("as_device_array() needs a contiguous tensor")
    if SIMULATOR:
        if tensor.device.type != "cpu":
            raise ValueError(
                f"under numba's CUDA simulator, device memory is a CPU tensor; got {tensor.device}"
            )
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(tensor.detach().numpy())
    if tensor.device.type == "cuda":
        return cuda.as_cuda_array(tensor.detach(), sync=False)
    return uva_view(tensor)


def launch_stream(device: torch.device | str | None = None) -> Any:
    """The stream every engine launches on: torch's current stream on ``device`` as a numba stream.

    Parameters
    ----------
    device : torch.device or str, optional
        A CUDA device (default: torch's current one). Not a CUDA device, or the simulator: numba's default
        stream ``0``.

    Returns
    -------
    ``numba.cuda.external_stream`` over ``torch.cuda.current_stream(device)``, or ``0``.
    """
    dev = torch.device("cuda") if device is None else torch.device(device)
    if SIMULATOR or dev.type != "cuda":
        return 0
    return cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream)


def device_context(device: torch.device | str) -> Any:
    """A context making ``device`` numba's current device for launches (a no-op under the simulator)."""
    dev = torch.device(device)
    if SIMULATOR or dev.type != "cuda":
        return contextlib.nullcontext()
    return cuda.gpus[dev.index if dev.index is not None else torch.cuda.current_device()]


def synchronize(stream: Any) -> None:
    """Wait until every launch on ``stream`` has finished (the simulator has finished already)."""
    if not isinstance(stream, int):
        stream.synchronize()
    elif not SIMULATOR:
        cuda.synchronize()

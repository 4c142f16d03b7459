"""Where the GPU kernels can run: a usable device (`require_cuda`, `check_device_index`) and whether
torch has CUDA (`torch_dtypes`: device arrays are then torch tensors from its caching allocator)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numba import cuda

from graphrl import cuda as gcuda
from graphrl.errors import GPUUnavailableError

__all__ = ["SIM", "check_device_index", "require_cuda", "torch_dtypes"]

SIM = gcuda.SIMULATOR  # the simulator runs a thread per Python thread: small blocks


def require_cuda() -> None:
    """Raise unless numba.cuda can run kernels here (a GPU and driver, or the simulator).

    Raises
    ------
    graphrl.GPUUnavailableError
        No usable CUDA device: the message says so and names the remedy (``device="cpu"``).
    """
    if not cuda.is_available():
        raise GPUUnavailableError(
            "device='cuda' needs a CUDA GPU with a working driver, and numba.cuda finds none "
            "here (numba.cuda.is_available() is False); use device='cpu' (same semantics)"
        )


def check_device_index(device: Any) -> None:
    """Raise unless ``device`` (a CUDA ``torch.device``) is the current CUDA device, the one the kernels
    and torch's allocations use: ``cuda`` without an index always is.

    Raises
    ------
    ValueError
        ``cuda:N`` for another GPU, or for one that does not exist (the message names the current one
        and how to choose it), instead of sampling silently on the current device.
    """
    if device.index is None:
        return
    get = getattr(cuda, "get_current_device", None)  # the simulator has one device and no such function
    current = get().id if get is not None else 0
    if torch_dtypes() and torch.cuda.current_device() != current:
        raise ValueError(f"device={str(device)!r}: torch's current CUDA device (cuda:"
                         f"{torch.cuda.current_device()}) and numba's (cuda:{current}) differ; make them "
                         "the same (torch.cuda.set_device, numba.cuda.select_device) or CUDA_VISIBLE_DEVICES")
    if device.index != current:
        raise ValueError(f"device={str(device)!r}: the samplers run on the current CUDA device "
                         f"(cuda:{current}); make cuda:{device.index} current first (torch.cuda.set_device, "
                         "numba.cuda.select_device) or give each process its GPU with CUDA_VISIBLE_DEVICES")


def torch_dtypes() -> dict:
    """numpy -> torch dtypes where torch has CUDA (not under the simulator), else {}; decided once."""
    if not _TORCH_DTYPES:
        usable = gcuda.has_cuda()
        _TORCH_DTYPES["usable"] = usable
        if usable:
            _TORCH_DTYPES.update({np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32,
                                  np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32})
    return _TORCH_DTYPES if _TORCH_DTYPES["usable"] else {}


_TORCH_DTYPES: dict = {}

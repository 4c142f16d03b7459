"""Where host memory is pinned for CUDA: ``cudaHostRegister`` / ``cudaHostUnregister`` through torch.

`host_register` page-locks an existing host range for every GPU and maps it into their address
space (UVA), so GPU kernels read it in place; `host_unregister` synchronises every GPU first, then
unregisters. `graphrl.memory.resources.PinnedResource` (the pinned tier) and
`graphrl.memory.MemoryManager.register` (a user's buffer pinned in place) are the only callers.

References
----------
Min et al., "Large Graph Convolutional Network Training with GPU-Oriented Data Communication
Architecture" (PyTorch-Direct), PVLDB 14(11), 2021: GPU kernels reading pinned host memory through UVA.
DGL's ``pin_memory_inplace`` likewise registers ordinary host memory.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from graphrl.memory.sizes import format_size

__all__ = ["host_register", "host_unregister"]

logger = logging.getLogger(__name__)


def _cudart() -> Any:
    return torch.cuda.cudart()


_CUDA_HOST_REGISTER_PORTABLE_MAPPED = 0x01 | 0x02  # cudaHostRegisterPortable | cudaHostRegisterMapped
_CUDA_ERROR_MEMORY_ALLOCATION = 2


def host_register(ptr: int, nbytes: int) -> None:
    """Page-lock ``nbytes`` at host address ``ptr`` for every GPU, mapped into their address space (UVA).

    Raises ``MemoryError`` when no more memory can be page-locked, ``RuntimeError`` on other errors.
    """
    err = int(_cudart().cudaHostRegister(ptr, nbytes, _CUDA_HOST_REGISTER_PORTABLE_MAPPED))
    if err == _CUDA_ERROR_MEMORY_ALLOCATION:
        raise MemoryError(f"cudaHostRegister could not page-lock {format_size(nbytes)}")
    if err != 0:
        raise RuntimeError(f"cudaHostRegister of {format_size(nbytes)} at {ptr:#x} failed: CUDA error {err}")


def host_unregister(ptr: int) -> None:
    """Synchronise every GPU (no copy may still read the buffer), then ``cudaHostUnregister`` it."""
    for index in range(torch.cuda.device_count()):
        torch.cuda.synchronize(index)
    err = _cudart().cudaHostUnregister(ptr)
    if int(err) != 0:
        logger.warning("cudaHostUnregister at %#x failed with CUDA error %d", ptr, int(err))

"""Poison the device memory the GPU samplers are handed under numba's CUDA simulator, so a kernel that reads
an array before anything wrote it fails loudly instead of reading whatever the memory held (fresh numba
allocations were zero, pool memory is whatever its last user left: docs/architecture.md#memory-tiers).
For scripts that tests run with ``NUMBA_ENABLE_CUDASIM=1`` (the ``simulated`` mark of ``tests/conftest.py``,
with ``patches=True``: the patches end with the script's fork child). In a script (run from the repository
root), before anything is sampled::

    import sys
    sys.path.insert(0, "tests")
    from _cuda_poison import poison_new_memory
    poison_new_memory()

What is poisoned, each time it is handed out:

- every region a `samplers.kernels.cuda.memory.CudaMemory` allocates (the graph's copy, LABOR's per-node
  arrays, a workspace's scratch and page-locked buffers: ``device`` and ``pinned`` tiers);
- every array a `samplers.kernels.cuda.workspace.CudaWorkspace.scratch` call returns (scratch is
  uninitialised by contract, also when it is reused: a kernel that counts on what the previous layer or call
  left there fails too);
- every ``numba.cuda.device_array`` (the simulator's fresh arrays: `samplers.kernels.cuda.arrays.empty`,
  a workspace's ``output``).

Integers take `POISON_INT` (an index past any test graph: the simulator raises IndexError; as a count or an
offset it makes sizes absurd), floats NaN (which equals nothing), booleans True.
"""

from __future__ import annotations

from typing import Any

import numpy as np

POISON_INT = 10**9
"""What a poisoned integer item holds (fits int32: the graphs' index dtype)."""


def poison_value(dtype: Any) -> Any:
    """The poison of a numpy dtype: `POISON_INT` (integers of 4 or more bytes; 0x7F narrower), NaN (floats),
    True (booleans)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "b":
        return True
    return POISON_INT if dtype.itemsize >= 4 else 0x7F


def poison_device_array(arr: Any) -> Any:
    """Overwrite a simulated device array (a numba device array) with its dtype's `poison_value`, in place,
    through its public copy (``copy_to_device``); returns it."""
    if arr.size:
        arr.copy_to_device(np.full(arr.shape, poison_value(arr.dtype), dtype=arr.dtype))
    return arr


def poison_new_memory() -> None:
    """Poison what the GPU samplers are handed from now on (see the module). Call it once, before sampling,
    in a script that runs in its own process (``patches=True``).

    Raises
    ------
    RuntimeError
        Not under numba's simulator (the hooks rewrite simulated device memory through the host).
    """
    from numba import config, cuda

    if not config.ENABLE_CUDASIM:
        raise RuntimeError("poison_new_memory runs under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)")
    import torch

    from samplers.kernels.cuda import memory, workspace

    allocate, scratch, device_array = memory.CudaMemory.allocate, workspace.CudaWorkspace.scratch, \
        cuda.device_array

    def poisoned_allocate(self: Any, n: int, dtype: Any, tier: Any, owner: str) -> Any:
        region = allocate(self, n, dtype, tier, owner)
        tensor = region.tensor()
        value = poison_value(tensor.numpy().dtype)
        tensor.fill_(float(value) if tensor.dtype.is_floating_point else
                     bool(value) if tensor.dtype == torch.bool else int(value))
        return region

    def poisoned_scratch(self: Any, name: str, n: int, dtype: Any) -> Any:
        return poison_device_array(scratch(self, name, n, dtype))

    def poisoned_device_array(*args: Any, **kwargs: Any) -> Any:
        return poison_device_array(device_array(*args, **kwargs))

    memory.CudaMemory.allocate = poisoned_allocate
    workspace.CudaWorkspace.scratch = poisoned_scratch
    cuda.device_array = poisoned_device_array

"""A loader's ``memory=`` checked once: one `graphrl.memory.MemoryManager` for everything a loader
allocates or builds (docs/architecture.md#memory-tiers). The stores a loader makes from tensors and its
default sampler come from it; a GPU sampler or a `FeatureStore` it is given must already use it, else their
buffers would sit outside the budget (ValueError naming the argument; no silent second budget).
"""

from __future__ import annotations

from typing import Any

from graphrl.memory import MemoryManager, check_memory  # check_memory: re-exported for the loaders

__all__ = ["check_memory", "check_sampler_memory", "check_store_memory"]


def check_sampler_memory(name: str, sampler: Any, memory: MemoryManager | None) -> None:
    """Check that a given sampler's GPU buffers count against the loader's ``memory``.

    The sampler's ``cuda_memory`` (`samplers.kernels.cuda.memory.CudaMemory`: `NeighborSampler`,
    `LaborSampler`, `HeteroNeighborSampler` on ``device="cuda"``) must be over ``memory`` itself. A sampler
    without one (the CPU, or a `samplers.Sampler` that keeps no regions) passes, as does any sampler when
    ``memory`` is None.

    Raises
    ------
    ValueError
        The sampler's buffers are on a private manager or another one (the message names ``name``, the
        sampler's type and the remedy).
    """
    held = getattr(sampler, "cuda_memory", None)
    if memory is None or held is None:
        return
    kind = type(sampler).__name__
    if held.owns:
        raise ValueError(f"{name}: the {kind}'s GPU buffers are on a private MemoryManager, outside the "
                         f"loader's memory=; build it with {kind}(..., device='cuda', memory=<that manager>)")
    if held.memory is not memory:
        raise ValueError(f"{name}: the {kind}'s GPU buffers come from another MemoryManager than the "
                         f"loader's memory=; build it with {kind}(..., memory=<the loader's manager>)")


def check_store_memory(name: str, store: Any, memory: MemoryManager | None) -> None:
    """Check that a given `FeatureStore` (its table, cache and the staging buffers a loader leases from it)
    counts against the loader's ``memory`` (any store when ``memory`` is None).

    Raises
    ------
    ValueError
        ``store.memory`` is another manager (the message names ``name`` and the remedy).
    """
    if memory is not None and store.memory is not memory:
        raise ValueError(f"{name}: the FeatureStore's table and staging buffers come from another "
                         f"MemoryManager than the loader's memory=; build it with FeatureStore(x, "
                         f"memory=<the loader's manager>), or pass the tensor")

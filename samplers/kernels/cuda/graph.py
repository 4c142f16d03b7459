"""`CudaGraph`: a CSC graph placed for the GPU kernels, in device memory or in page-locked host memory
read in place through UVA: regions of a memory manager's ``device`` or ``pinned`` tier (owner
``"samplers.graph"``, `samplers.kernels.cuda.memory.CudaMemory`; docs/architecture.md#memory-tiers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numba import cuda

from graphrl import cuda as gcuda
from graphrl.memory import Tier
from samplers.kernels.cuda.device import require_cuda
from samplers.kernels.cuda.launch import ROW_THREADS, grid, kernel_stream, launch
from samplers.kernels.cuda.memory import GRAPH_OWNER, CudaMemory, kernel_array
from samplers.kernels.cuda.weighted import row_prefix

__all__ = ["CudaGraph"]


def _device_view(arr: Any, uva: bool, memory: CudaMemory) -> Any:
    """A kernel-readable view of a host array (numpy or torch): a copy in a ``device`` region of
    ``memory``, or with ``uva`` in a ``pinned`` region read in place through UVA (owner
    ``"samplers.graph"``); a CUDA tensor, and with ``uva`` a page-locked torch tensor, is viewed in place
    (its memory is the caller's: a graph's own pinned regions count where they were allocated)."""
    if isinstance(arr, torch.Tensor):
        if arr.device.type == "cuda":
            return gcuda.as_device_array(arr.contiguous())
        if uva and arr.is_pinned() and arr.is_contiguous():  # in place, no copy
            return gcuda.uva_view(arr, readonly=True)
        arr = arr.numpy()
    _, view = memory.copy(np.asarray(arr), Tier.PINNED if uva else Tier.DEVICE, GRAPH_OWNER)
    return view


@dataclass
class CudaGraph:
    """A CSC graph readable by the kernels: device memory, or page-locked host memory through UVA.

    Attributes
    ----------
    indptr : device array, int64 [N + 1]; indices : int32/int64 [E]
    edge_ids : int64 [E] or a 1-element dummy (``has_eids`` False: identity)
    weights : float32 [E] or a 1-element dummy (``weighted`` False)
    times : int64/float64 [E] or a 1-element int64 dummy (``timed`` False)
        Edge times in CSC order, for temporal sampling.
    uva : bool
        Whether the arrays live in host memory that the GPU reads in place.
    prefix : float64 [E] or None; positive : int64 [N] or None
        With weights and without times: the reference's per-row prefix sums ``P`` and positive counts
        ``nz`` (`samplers.kernels.reference.weight_prefix`) that weighted rows sample from, computed on
        the device by ``build`` (8 bytes per edge and per node, placed like the other arrays).
    memory : CudaMemory or None
        Where the arrays' regions came from (``"samplers.graph"``: ``device`` regions, ``pinned`` ones
        with UVA); `close` frees them.
    """

    indptr: Any
    indices: Any
    edge_ids: Any
    has_eids: bool
    weights: Any
    weighted: bool
    uva: bool
    times: Any = None
    timed: bool = False
    prefix: Any = None
    positive: Any = None
    memory: CudaMemory | None = None

    def __post_init__(self) -> None:
        if self.memory is not None:
            self.memory.hold(self)  # its close drops the arrays (`drop_views`)

    def drop_views(self) -> None:
        """Forget the arrays (views of ``memory``'s regions), so a closed sampler keeps no block alive;
        `CudaMemory.close` calls it. Kernels must not read the graph afterwards."""
        self.indptr = self.indices = self.edge_ids = self.weights = self.times = None
        self.prefix = self.positive = None

    @classmethod
    def build(cls, indptr, indices, edge_ids=None, weights=None, uva: bool = False, times=None,
              memory: CudaMemory | None = None) -> CudaGraph:
        """Place the arrays (numpy arrays or torch tensors, CSC order) for the kernels.

        Parameters
        ----------
        indptr : int64 [N + 1]; indices : int32/int64 [E]; edge_ids : int64 [E] or None (identity);
        weights : float32 [E] or None; times : int64 or float64 [E] or None (edge times)
        uva : bool
            Read the arrays from page-locked host memory in place (pinned torch tensors are used as
            they are; others are copied once into ``pinned`` regions) instead of ``device`` regions.
        memory : CudaMemory or None
            Where the copies and the prefix sums go (owner ``"samplers.graph"``); default a private
            `CudaMemory` (a manager of its own, without budgets).

        Raises
        ------
        MemoryBudgetError
            A copy does not fit its tier's budget (the message names the tier and ``"samplers.graph"``);
            the regions placed before it are freed again.
        GPUUnavailableError
            No usable GPU (nor the simulator).
        """
        require_cuda()
        memory = CudaMemory() if memory is None else memory
        with memory.undo_on_error():  # what this build placed goes back
            return cls._place(memory, indptr, indices, edge_ids, weights, bool(uva), times)

    @classmethod
    def _place(cls, memory: CudaMemory, indptr, indices, edge_ids, weights, uva: bool, times) -> CudaGraph:
        tier = Tier.PINNED if uva else Tier.DEVICE
        # 1-element stand-ins for absent arrays (the kernels compile for one signature)
        dummy_i = memory.filled(1, np.int64, 0, tier, GRAPH_OWNER)[1] if edge_ids is None or times is None \
            else None
        dummy_w = memory.filled(1, np.float32, 0, tier, GRAPH_OWNER)[1] if weights is None else None
        graph = cls(indptr=_device_view(indptr, uva, memory), indices=_device_view(indices, uva, memory),
                    edge_ids=dummy_i if edge_ids is None else _device_view(edge_ids, uva, memory),
                    has_eids=edge_ids is not None,
                    weights=dummy_w if weights is None else _device_view(weights, uva, memory),
                    weighted=weights is not None, uva=uva,
                    times=dummy_i if times is None else _device_view(times, uva, memory),
                    timed=times is not None, memory=memory)
        if weights is not None and times is None:
            num, edges = graph.indptr.shape[0] - 1, graph.weights.shape[0]
            # with UVA page-locked host memory, written by the kernel in place
            prefix = memory.allocate(max(edges, 1), np.float64, tier, GRAPH_OWNER)
            positive = memory.allocate(max(num, 1), np.int64, tier, GRAPH_OWNER)
            graph.prefix, graph.positive = kernel_array(prefix), kernel_array(positive)
            if num:
                launch(row_prefix, (grid(num, ROW_THREADS), ROW_THREADS), graph.indptr, graph.weights,
                       graph.prefix, graph.positive, stream=kernel_stream())
        # the build's one wait: the stand-ins' fills (`CudaMemory.filled`), every copy (torch's, into the
        # regions) and the prefix sums done, for any stream
        cuda.synchronize()
        return graph

    def close(self) -> None:
        """Free the regions of this graph's `memory` (the graph copy and, where the memory is shared with a
        sampler's workspaces and LABOR arrays, theirs too); idempotent. Kernels must not read the graph
        afterwards."""
        if self.memory is not None:
            self.memory.close()

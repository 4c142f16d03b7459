"""`CudaGraph`: a CSC graph placed for the GPU kernels, in device memory or in page-locked host memory
read in place through UVA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numba import cuda

from graphrl import cuda as gcuda
from samplers.kernels.cuda.device import require_cuda
from samplers.kernels.cuda.launch import ROW_THREADS, grid, kernel_stream, launch
from samplers.kernels.cuda.weighted import row_prefix

__all__ = ["CudaGraph"]


def _device_view(arr: Any, uva: bool, stream: Any) -> Any:
    """A kernel-readable view of a host array (numpy or torch): a device copy (made on ``stream``), or a
    UVA mapping; a CUDA tensor is viewed in place.

    With ``uva``, a page-locked torch tensor is read in place; any other array is copied once into
    mapped (page-locked, device-addressable) host memory."""
    if isinstance(arr, torch.Tensor):
        if arr.device.type == "cuda":
            return gcuda.as_device_array(arr.contiguous())
        if uva and arr.is_pinned() and arr.is_contiguous():  # in place, no copy
            return gcuda.uva_view(arr, readonly=True)
        arr = arr.numpy()
    arr = np.ascontiguousarray(arr)
    if uva:
        mapped = cuda.mapped_array(arr.shape, dtype=arr.dtype)
        mapped[...] = arr
        return mapped
    return cuda.to_device(arr, stream=stream)


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

    @classmethod
    def build(cls, indptr, indices, edge_ids=None, weights=None, uva: bool = False, times=None) -> CudaGraph:
        """Place the arrays (numpy arrays or torch tensors, CSC order) for the kernels.

        Parameters
        ----------
        indptr : int64 [N + 1]; indices : int32/int64 [E]; edge_ids : int64 [E] or None (identity);
        weights : float32 [E] or None; times : int64 or float64 [E] or None (edge times)
        uva : bool
            Read the arrays from page-locked host memory in place (pinned torch tensors are used as
            they are; others are copied once into mapped host memory) instead of device memory.
        """
        require_cuda()
        stream = kernel_stream()
        dummy_i = cuda.to_device(np.zeros(1, dtype=np.int64))
        dummy_w = cuda.to_device(np.zeros(1, dtype=np.float32))
        graph = cls(indptr=_device_view(indptr, uva, stream), indices=_device_view(indices, uva, stream),
                    edge_ids=dummy_i if edge_ids is None else _device_view(edge_ids, uva, stream),
                    has_eids=edge_ids is not None,
                    weights=dummy_w if weights is None else _device_view(weights, uva, stream),
                    weighted=weights is not None, uva=bool(uva),
                    times=dummy_i if times is None else _device_view(times, uva, stream),
                    timed=times is not None)
        if weights is not None and times is None:
            num, edges = graph.indptr.shape[0] - 1, graph.weights.shape[0]
            if uva:  # page-locked host memory, written by the kernel in place
                graph.prefix = cuda.mapped_array(max(edges, 1), dtype=np.float64)
                graph.positive = cuda.mapped_array(max(num, 1), dtype=np.int64)
            else:
                graph.prefix = cuda.device_array(max(edges, 1), dtype=np.float64)
                graph.positive = cuda.device_array(max(num, 1), dtype=np.int64)
            if num:
                launch(row_prefix, (grid(num, ROW_THREADS), ROW_THREADS), graph.indptr, graph.weights,
                       graph.prefix, graph.positive, stream=stream)
        cuda.synchronize()  # every copy and the prefix sums done, whatever stream samples next
        return graph

"""Sparse (CSR) times dense matrix products with autograd, as numba kernels: arrays in, arrays out.

On CPU tensors `csr_spmm` runs the numba kernels of `graphrl.kernels.spmm` (``torch.index_add_``
and ``torch.sparse.mm``'s backward run serially on CPU; figures in docs/performance.md) on the kernel
team, with the thread count of `graphrl.threads.threads_for`. The forward kernel splits destination
rows; the backward kernel (the transposed product) gives each thread a range of source rows, so there
are no write conflicts, and every output row is summed in edge order: results do not depend on the
number of threads.

Tensors on another device (a GPU) take `csr_spmm_torch` instead: a gather, a scale and
``index_add_`` in torch, differentiable by torch's autograd (atomic adds on a GPU, so the summation
order, and the last bits of the result, may vary from run to run there).
"""

from __future__ import annotations

import numpy as np
import torch

# The kernels are core code, shared with the full-graph engine (docs/architecture.md#layers).
from graphrl.kernels.spmm import csr_spmm_parallel, csr_spmm_t_parallel

__all__ = ["csr_spmm", "csr_spmm_torch"]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


class _CSRSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indptr, indices, weights, h):
        out = np.empty((indptr.shape[0] - 1, h.shape[1]), dtype=_np(h).dtype)
        csr_spmm_parallel(_np(indptr), _np(indices), _np(weights).astype(out.dtype, copy=False), _np(h), out)
        ctx.save_for_backward(indptr, indices, weights)
        ctx.num_src = h.shape[0]
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad_out):
        indptr, indices, weights = ctx.saved_tensors
        g = _np(grad_out)
        grad_h = np.empty((ctx.num_src, g.shape[1]), dtype=g.dtype)
        csr_spmm_t_parallel(_np(indptr), _np(indices), _np(weights).astype(g.dtype, copy=False), g, grad_h)
        return None, None, None, torch.from_numpy(grad_h)


def csr_spmm(indptr: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
             h: torch.Tensor) -> torch.Tensor:
    """``out[v] = sum_{e in row v} weights[e] * h[indices[e]]``, differentiable in ``h`` (not in ``weights``).

    Parameters
    ----------
    indptr : torch.Tensor, int64, shape [D + 1]
        Row pointer over output rows.
    indices : torch.Tensor, int64, shape [nnz]
        Row of ``h`` read by each entry; trusted to lie in [0, S).
    weights : torch.Tensor, float, shape [nnz]
        Value of each entry (cast to ``h``'s dtype).
    h : torch.Tensor, float32 or float64, shape [S, d]
        Dense input. On the CPU the numba kernels run; on any other device, `csr_spmm_torch`.

    Returns
    -------
    torch.Tensor, dtype of ``h``, shape [D, d], on ``h``'s device
    """
    if h.device.type != "cpu":
        return csr_spmm_torch(indptr, indices, weights, h)
    return _CSRSpMM.apply(indptr, indices, weights, h)


def csr_spmm_torch(indptr: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
                   h: torch.Tensor) -> torch.Tensor:
    """`csr_spmm` in torch operations, on ``h``'s device (the GPU path; differentiable in ``h``).

    Same arguments and result as `csr_spmm`; ``indptr``, ``indices`` and ``weights`` are moved to
    ``h``'s device if they are elsewhere.
    """
    dev = h.device
    indptr, indices = indptr.to(dev, torch.int64), indices.to(dev, torch.int64)
    rows = indptr.shape[0] - 1
    row_of_entry = torch.repeat_interleave(torch.arange(rows, device=dev), indptr.diff())
    messages = h.index_select(0, indices) * weights.to(dev, h.dtype).unsqueeze(1)
    return torch.zeros((rows, h.shape[1]), dtype=h.dtype, device=dev).index_add_(0, row_of_entry, messages)

"""Dense layers over host-resident vertex data with weights on a device, chunk by chunk (HongTu).

In full-graph training with host-resident vertex data (`samplers.full_graph.FullGraph` on its staged
path), activations ``x`` [N, F] live in host memory while the model's weights sit on the GPU.
`host_linear(x, weight, bias)` computes ``x @ weight + bias`` by streaming row chunks of ``x`` to the
weight's device and the results back, so the device holds one chunk at a time; the backward pass
streams the output gradient the same way, returns ``grad_x`` on the host and accumulates the weight
and bias gradients on the device. When ``x`` is already on the weight's device this is plain
``torch.addmm``. A sparse COO ``x`` (bag-of-words features) is cut into CSR row chunks.

`chunk_rows_for(width, nbytes)` sizes a chunk from a byte budget.

References
----------
Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024 (vertex data
on the host, NN operations on the GPU partition by partition).
"""

from __future__ import annotations

import torch

__all__ = ["DEFAULT_CHUNK_BYTES", "chunk_rows_for", "host_linear"]

DEFAULT_CHUNK_BYTES = 64 << 20


def chunk_rows_for(width: int, nbytes: int = DEFAULT_CHUNK_BYTES, itemsize: int = 4) -> int:
    """Rows of a chunk of ``width`` columns within ``nbytes`` (at least 1)."""
    return max(int(nbytes) // max(int(width) * int(itemsize), 1), 1)


def _rows(x: torch.Tensor, a: int, b: int, device: torch.device) -> torch.Tensor:
    """Rows [a, b) of ``x`` (dense, or sparse CSR) on ``device``."""
    if x.layout == torch.sparse_csr:
        crow = x.crow_indices()
        lo, hi = int(crow[a]), int(crow[b])
        return torch.sparse_csr_tensor((crow[a:b + 1] - lo).to(device), x.col_indices()[lo:hi].to(device),
                                       x.values()[lo:hi].to(device), size=(b - a, x.shape[1]))
    return x[a:b].to(device, non_blocking=True)


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sparse.mm(x, w) if x.layout == torch.sparse_csr else x @ w


class _HostLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, chunk):
        dev = weight.device
        n = x.shape[0]
        out = torch.empty((n, weight.shape[1]), dtype=weight.dtype,
                          pin_memory=torch.cuda.is_available() and dev.type == "cuda")
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            y = _mm(_rows(x, a, b, dev), weight)
            if bias is not None:
                y = y + bias
            out[a:b].copy_(y)
        ctx.save_for_backward(weight)
        ctx.x, ctx.chunk, ctx.has_bias = x, chunk, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (weight,) = ctx.saved_tensors
        x, chunk = ctx.x, ctx.chunk
        dev = weight.device
        n = x.shape[0]
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = torch.empty(x.shape, dtype=grad_out.dtype) if need_x and x.layout == torch.strided else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = (torch.zeros(weight.shape[1], dtype=weight.dtype, device=dev) if need_b and ctx.has_bias
                  else None)
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            g = grad_out[a:b].to(dev, non_blocking=True)
            if grad_x is not None:
                grad_x[a:b].copy_(g @ weight.t())
            if grad_w is not None:
                xc = _rows(x, a, b, dev)
                xt = xc.t() if xc.layout == torch.strided else xc.to_sparse_coo().t()
                grad_w += xt @ g if xc.layout == torch.strided else torch.sparse.mm(xt, g)
            if grad_b is not None:
                grad_b += g.sum(0)
        return grad_x, grad_w, grad_b, None


def host_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                chunk_rows: int | None = None) -> torch.Tensor:
    """``x @ weight + bias`` with ``x`` on the host and ``weight`` on any device, row chunk by chunk.

    Parameters
    ----------
    x : torch.Tensor, float32, shape [N, F], on the host
        Dense, sparse COO or sparse CSR (no gradient for a sparse ``x``).
    weight : torch.Tensor, float32, shape [F, C], on any device
    bias : torch.Tensor, float32, shape [C], on ``weight``'s device, or None
    chunk_rows : int or None
        Rows moved per chunk (default: `DEFAULT_CHUNK_BYTES` of ``x``'s widest side).

    Returns
    -------
    torch.Tensor, float32, shape [N, C], on the host (pinned with CUDA)
        Differentiable in ``x`` (dense), ``weight`` and ``bias``.

    Raises
    ------
    ValueError
        ``x`` is not 2-D with ``weight.shape[0]`` columns, ``x`` is not on the host, or a bad
        ``chunk_rows``.
    """
    if x.dim() != 2 or x.shape[1] != weight.shape[0]:
        raise ValueError(f"x must have shape [N, {weight.shape[0]}], got {tuple(x.shape)}")
    if x.device.type != "cpu":
        raise ValueError(f"x must be host vertex data, got a tensor on {x.device}")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if x.is_sparse:
        x = x.coalesce().to_sparse_csr()
    chunk = chunk_rows or chunk_rows_for(max(weight.shape[0], weight.shape[1]))
    return _HostLinear.apply(x, weight, bias, int(chunk))

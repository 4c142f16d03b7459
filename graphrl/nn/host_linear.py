"""Dense layers over host-resident vertex data with weights on a device, chunk by chunk (HongTu).

In full-graph training with host-resident vertex data (`samplers.full_graph.FullGraph` on its staged
path), activations ``x`` [N, F] live in host memory while the model's weights sit on the GPU.
`host_linear(x, weight, bias)` computes ``x @ weight + bias`` by streaming row chunks of ``x`` to the
weight's device and the results back, so the device holds one chunk at a time; the backward pass
streams the output gradient the same way, returns ``grad_x`` on the host and accumulates the weight
and bias gradients on the device. When ``x`` is already on the weight's device this is plain
``torch.addmm``. A sparse COO ``x`` (bag-of-words features) is cut into CSR row chunks.

Given the ``transfers`` of a staged `samplers.FullGraph` (`graphrl.memory.transfers.Transfers`), every
copy is asynchronous from or to pinned memory of that memory manager and counted with the
propagations' copies; `graphrl.nn.GraphConv` passes it. `chunk_rows_for(width, nbytes)` sizes a chunk
from a byte budget.

References
----------
Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024 (vertex data
on the host, NN operations on the GPU partition by partition).
"""

from __future__ import annotations

import weakref

import torch

from graphrl.memory import Region, Tier, free_quietly
from graphrl.memory.transfers import Transfers

__all__ = ["DEFAULT_CHUNK_BYTES", "OWNER", "chunk_rows_for", "host_linear"]

DEFAULT_CHUNK_BYTES = 64 << 20
OWNER = "graphrl.nn.host_linear"  # pinned outputs, input gradients and staging buffers


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


def _pinned_out(t: Transfers, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of a pinned region of ``t``'s memory manager, freed with the tensor."""
    region = t.memory.allocate(shape, dtype, Tier.PINNED, owner=OWNER, fallback=(Tier.HOST,))
    out = region.tensor()
    weakref.finalize(out, free_quietly, region)
    return out


class _Feed:
    """Row chunks of a dense host tensor on the device, copied from pinned memory only.

    A pinned ``x`` is copied from in place; a pageable one is first copied on the host into one of
    two pinned staging buffers, reused every other chunk once the copy out of it has completed.
    """

    def __init__(self, t: Transfers, x: torch.Tensor, chunk: int) -> None:
        self.t, self.x = t, x
        self.pinned = t.is_pinned(x)
        self.done = [t.event() for _ in range(2)]
        self.regions: list[Region] = []
        self.stages: list[torch.Tensor] = []
        if not self.pinned:
            rows = min(chunk, x.shape[0])
            for _ in range(2):
                region = t.memory.allocate((max(rows, 1), x.shape[1]), x.dtype, Tier.PINNED,
                                           owner=OWNER + ".staging", fallback=(Tier.HOST,))
                self.regions.append(region)
                self.stages.append(region.tensor())

    def rows(self, k: int, a: int, b: int, device: torch.device) -> torch.Tensor:
        """Rows [a, b) (chunk ``k``) on ``device``, copied asynchronously on the current stream."""
        t = self.t
        if self.pinned:
            src = self.x[a:b]
        else:
            slot = k % 2
            if k >= 2:
                t.wait(self.done[slot])  # chunk k-2's copy out of this buffer has completed
            src = self.stages[slot][:b - a]
            src.copy_(self.x[a:b])
        out = torch.empty((b - a, self.x.shape[1]), dtype=self.x.dtype, device=device)
        t.h2d(out, src)
        if not self.pinned:
            t.record(self.done[k % 2], t.current_stream())
        return out

    def close(self) -> None:
        for region in self.regions:
            free_quietly(region)


def _finish(t: Transfers) -> None:
    """Wait once for everything issued on the current stream (the copies back to pinned memory)."""
    done = t.event()
    t.record(done, t.current_stream())
    t.wait(done)


class _HostLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, chunk, transfers):
        dev = weight.device
        n = x.shape[0]
        dense = x.layout == torch.strided
        # saved through autograd: x changed in place before backward is an error, as for torch's linear
        ctx.save_for_backward(weight, x if dense else None)
        ctx.x = None if dense else x  # a sparse CSR x: autograd cannot save it, and it gets no gradient
        ctx.chunk, ctx.has_bias, ctx.transfers = chunk, bias is not None, transfers
        if transfers is not None and x.layout == torch.strided:
            t = transfers
            out = _pinned_out(t, (n, weight.shape[1]), weight.dtype)
            feed = _Feed(t, x, chunk)
            try:
                for k, a in enumerate(range(0, n, chunk)):
                    b = min(a + chunk, n)
                    y = feed.rows(k, a, b, dev) @ weight
                    if bias is not None:
                        y += bias
                    t.d2h(out[a:b], y)
                _finish(t)
            finally:
                feed.close()
            return out
        out = torch.empty((n, weight.shape[1]), dtype=weight.dtype,
                          pin_memory=torch.cuda.is_available() and dev.type == "cuda")
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            y = _mm(_rows(x, a, b, dev), weight)
            if bias is not None:
                y = y + bias
            out[a:b].copy_(y)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        weight, x = ctx.saved_tensors
        x = ctx.x if x is None else x
        chunk, t = ctx.chunk, ctx.transfers
        dev = weight.device
        n = x.shape[0]
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = (torch.zeros(weight.shape[1], dtype=weight.dtype, device=dev) if need_b and ctx.has_bias
                  else None)
        if t is not None and x.layout == torch.strided:
            grad_out = grad_out.contiguous()
            grad_x = _pinned_out(t, tuple(x.shape), grad_out.dtype) if need_x else None
            feeds = [_Feed(t, grad_out, chunk)] + ([_Feed(t, x, chunk)] if grad_w is not None else [])
            try:
                for k, a in enumerate(range(0, n, chunk)):
                    b = min(a + chunk, n)
                    g = feeds[0].rows(k, a, b, dev)
                    if grad_x is not None:
                        t.d2h(grad_x[a:b], g @ weight.t())
                    if grad_w is not None:
                        grad_w.addmm_(feeds[1].rows(k, a, b, dev).t(), g)
                    if grad_b is not None:
                        grad_b += g.sum(0)
                _finish(t)
            finally:
                for feed in feeds:
                    feed.close()
            return grad_x, grad_w, grad_b, None, None
        grad_x = torch.empty(x.shape, dtype=grad_out.dtype) if need_x and x.layout == torch.strided else None
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
        return grad_x, grad_w, grad_b, None, None


def host_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                chunk_rows: int | None = None, *, transfers: Transfers | None = None) -> torch.Tensor:
    """``x @ weight + bias`` with ``x`` on the host and ``weight`` on any device, row chunk by chunk.

    Parameters
    ----------
    x : torch.Tensor, float32, shape [N, F], on the host
        Dense, sparse COO or sparse CSR (no gradient for a sparse ``x``).
    weight : torch.Tensor, float32, shape [F, C], on any device
    bias : torch.Tensor, float32, shape [C], on ``weight``'s device, or None
    chunk_rows : int or None
        Rows moved per chunk (default: `DEFAULT_CHUNK_BYTES` of ``x``'s widest side).
    transfers : graphrl.memory.transfers.Transfers or None
        Move dense chunks through it (a `samplers.FullGraph`'s ``transfers``): every copy from or to
        pinned memory of its memory manager (a pageable ``x`` or output gradient is first copied on the
        host into two pinned staging buffers), asynchronous, counted; the output and the input gradient
        are pinned regions (owner ``graphrl.nn.host_linear``); the host waits once per call, plus once
        per chunk after the second for a pageable input. None: torch's ``.to(device)`` copies.

    Returns
    -------
    torch.Tensor, float32, shape [N, C], on the host (pinned with CUDA)
        Differentiable in ``x`` (dense), ``weight`` and ``bias``.

    Raises
    ------
    ValueError
        ``x`` is not 2-D with ``weight.shape[0]`` columns, ``x`` is not on the host, a bad
        ``chunk_rows``, or ``transfers`` of another device than ``weight``'s.
    """
    if x.dim() != 2 or x.shape[1] != weight.shape[0]:
        raise ValueError(f"x must have shape [N, {weight.shape[0]}], got {tuple(x.shape)}")
    if x.device.type != "cpu":
        raise ValueError(f"x must be host vertex data, got a tensor on {x.device}")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if transfers is not None and torch.device(transfers.device) != weight.device:
        raise ValueError(f"transfers moves data to {transfers.device}, but weight is on {weight.device}")
    if x.is_sparse:
        x = x.coalesce().to_sparse_csr()
    if transfers is not None and x.layout == torch.strided and not x.is_contiguous():
        x = x.contiguous()
    chunk = chunk_rows or chunk_rows_for(max(weight.shape[0], weight.shape[1]))
    return _HostLinear.apply(x, weight, bias, int(chunk), transfers)

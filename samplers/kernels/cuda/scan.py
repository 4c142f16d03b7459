"""Exclusive scans on the device: output offsets from per-row counts (``torch.cumsum`` where torch has
CUDA, else these block-scan kernels, recursively over the chunk totals)."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch
from numba import cuda

from samplers.kernels.cuda.arrays import empty, fill
from samplers.kernels.cuda.device import SIM, torch_dtypes
from samplers.kernels.cuda.launch import EDGE_THREADS, grid, kernel_stream, launch

__all__ = ["SCAN_CHUNK", "SCAN_ITEMS", "SCAN_THREADS", "exclusive_scan", "scan_add", "scan_blocks"]

SCAN_THREADS = 32 if SIM else 256
SCAN_ITEMS = 2 if SIM else 8  # items per scan thread
SCAN_CHUNK = SCAN_THREADS * SCAN_ITEMS


@cuda.jit
def scan_blocks(inp, out, sums, n):  # pragma: no cover - device
    """Inclusive scan of each SCAN_CHUNK-long chunk of inp into out[1:] (out[0] = 0); chunk totals into
    sums. Each thread sums SCAN_ITEMS consecutive items, the block scans those sums in shared memory,
    then each thread writes its items' running totals."""
    tmp = cuda.shared.array(SCAN_THREADS, numba.int64)
    t = cuda.threadIdx.x
    base = cuda.blockIdx.x * SCAN_CHUNK + t * SCAN_ITEMS
    own = np.int64(0)
    for q in range(SCAN_ITEMS):
        if base + q < n:
            own += inp[base + q]
    tmp[t] = own
    cuda.syncthreads()
    offset = 1
    while offset < SCAN_THREADS:
        v = tmp[t - offset] if t >= offset else 0
        cuda.syncthreads()
        tmp[t] += v
        cuda.syncthreads()
        offset *= 2
    run = tmp[t] - own
    for q in range(SCAN_ITEMS):
        if base + q < n:
            run += inp[base + q]
            out[base + q + 1] = run
    if base == 0:
        out[0] = 0
    if t == SCAN_THREADS - 1:
        sums[cuda.blockIdx.x] = tmp[t]


@cuda.jit
def scan_add(out, offsets, n):  # pragma: no cover - device
    """out[i + 1] += offsets[chunk of i]: the exclusive scan of the chunk totals."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < n:
        out[i + 1] += offsets[i // SCAN_CHUNK]
        i += stride


def _scan_into(counts: Any, out: Any, n: int, stream: Any, ws: Any = None, level: int = 0) -> None:
    """out[0] = 0, out[i + 1] = counts[0] + ... + counts[i], on the device (no host round trip: the
    chunk totals are scanned by the same kernels, recursively; their arrays from ``ws`` when given)."""
    chunks = (n + SCAN_CHUNK - 1) // SCAN_CHUNK
    sums = empty(chunks, np.int64) if ws is None else ws.scratch(f"scan_sums_{level}", chunks, np.int64)
    launch(scan_blocks, (chunks, SCAN_THREADS), counts, out, sums, n, stream=stream)
    if chunks > 1:
        offsets = empty(chunks + 1, np.int64) if ws is None else \
            ws.scratch(f"scan_offsets_{level}", chunks + 1, np.int64)
        _scan_into(sums, offsets, chunks, stream, ws, level + 1)
        launch(scan_add, (grid(n, EDGE_THREADS), EDGE_THREADS), out, offsets, n, stream=stream)


def exclusive_scan(counts: Any, stream: Any = None, ws: Any = None, out: Any = None,
                   read_total: bool = True) -> tuple[Any, int | None]:
    """Offsets of ``counts`` (a device int64 array [n]): a device int64 array [n + 1] and its total.

    The scan stays on the device (``torch.cumsum`` on torch's current stream where torch has CUDA: one
    launch; else these kernels, on ``stream``, default `kernel_stream()`). Reading the total back (to
    size the next outputs) is the call's one synchronisation; ``read_total=False`` skips it (the total
    is then None and stays on the device, in ``out[n]``).

    Parameters
    ----------
    counts : device int64 [n]
    stream : numba stream, optional
    ws : CudaWorkspace, optional
        Scratch for the chunk totals, and the read-back through its page-locked buffer (counted).
    out : device int64 [n + 1], optional
        Where to write the offsets (default: a new array).
    read_total : bool
        Read the total back.
    """
    n = counts.shape[0]
    if out is None:
        out = empty(n + 1, np.int64)
    if torch_dtypes():
        out[:1].zero_()
        if n:
            torch.cumsum(torch.as_tensor(counts, device="cuda"), 0, out=out[1:n + 1])
    else:
        if stream is None:
            stream = kernel_stream()
        if n == 0:
            launch(fill, (1, 1), out, np.int64(0), stream=stream)
        else:
            _scan_into(counts, out, n, stream, ws)
    if not read_total:
        return out, None
    if n == 0:
        return out, 0
    if ws is not None:
        return out, ws.read(out[n:n + 1])[0]
    if torch_dtypes():
        return out, int(out[n])
    total = out[n:n + 1].copy_to_host(stream=stream)
    if not isinstance(stream, int):
        stream.synchronize()  # the copy was queued on the stream
    return out, int(total[0])

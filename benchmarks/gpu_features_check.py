"""Part 3 of ``gpu_check.py``: feature-gather GB/s on the GPU, from device memory and from mapped host memory.

`time_gather` gathers rows of a float32 table by random ids into device memory with a warp-per-row
kernel, from a device-resident table and from a mapped (page-locked) host table read through UVA,
checks both against numpy, and times a device-to-device copy of the same bytes as the ceiling.

Imported by ``gpu_check.py`` (run as a script).

References
----------
Min et al., PyTorch-Direct (PVLDB 2021): GPU gathers reading pinned host memory in place through UVA.
"""

from __future__ import annotations

import time

import numpy as np
from numba import cuda

from graphrl.cuda import launch_stream


@cuda.jit
def _gather(table, ids, out):  # pragma: no cover - device; a warp per row, 8-byte words
    lane = cuda.threadIdx.x % 32
    warp = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) // 32
    warps = (cuda.gridDim.x * cuda.blockDim.x) // 32
    width = table.shape[1]
    while warp < ids.shape[0]:
        r = ids[warp]
        j = lane
        while j < width:
            out[warp, j] = table[r, j]
            j += 32
        warp += warps


def time_gather(rows: int, dim: int, count: int, repeats: int, seed: int) -> dict:
    """GB/s of gathering ``count`` random rows of a ``rows`` x ``dim`` float32 table, from device memory
    and from mapped host memory (UVA), and of a device copy of the same bytes."""
    gather = _gather
    rng = np.random.default_rng(seed)
    host = rng.random((rows, dim), dtype=np.float32).view(np.uint64)  # dim/2 words per row
    dev_table = cuda.to_device(host)
    mapped = cuda.mapped_array(host.shape, dtype=host.dtype)
    mapped[...] = host
    ids = cuda.to_device(rng.integers(0, rows, count))
    out = cuda.device_array((count, host.shape[1]), dtype=host.dtype)
    nbytes = out.size * out.dtype.itemsize
    threads = 256
    stream = launch_stream("cuda")
    blocks = min((count * 32 + threads - 1) // threads, 65_535 * 8)
    result = {"rows": rows, "row_bytes": dim * 4, "gathered_rows": count}
    for name, table in (("device", dev_table), ("pinned_uva", mapped)):
        gather[blocks, threads, stream](table, ids, out)
        cuda.synchronize()
        want = host[ids.copy_to_host()]
        assert np.array_equal(out.copy_to_host(), want), name
        start = time.perf_counter()
        for _ in range(repeats):
            gather[blocks, threads, stream](table, ids, out)
        cuda.synchronize()
        result[f"{name}_GBps"] = nbytes * repeats / (time.perf_counter() - start) / 1e9
    copy_src = cuda.device_array_like(out)
    start = time.perf_counter()
    for _ in range(repeats):
        out.copy_to_device(copy_src)
    cuda.synchronize()
    result["device_copy_GBps"] = nbytes * repeats / (time.perf_counter() - start) / 1e9
    return result

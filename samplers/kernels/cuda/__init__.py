"""Neighbour-sampling kernels for NVIDIA GPUs (numba.cuda): arrays in, arrays out.

They follow the specification of `samplers.kernels.reference` (docs/architecture.md#sampling-rules)
with the RNG of `samplers.kernels.rng`, so their blocks equal the CPU kernels' bit for bit: uniform
rows (`...cuda.uniform`: Floyd's algorithm, draws with replacement, fanout -1), weighted rows without
edge times (`...cuda.weighted`: rejection over per-row float64 prefix sums, a thread per row) and
masked rows with edge times (`...cuda.temporal`: exponential keys, prefix-sum inversion). A layer is
planned (`...cuda.plan`), scanned (`...cuda.scan`: reading the total back is its one
synchronisation), chosen and gathered (`...cuda.layer`), then relabelled through a GPU hash table in
first-occurrence order (`...cuda.relabel`). Graphs are read from device memory or in place from
page-locked host memory through UVA (`CudaGraph`); the graph copy, the workspaces' scratch and LABOR's
arrays are regions of a `graphrl.memory.MemoryManager`'s ``device`` and ``pinned`` tiers (`CudaMemory`).

Every kernel launches on torch's current stream, `graphrl.cuda.launch_stream`
(docs/architecture.md#the-stream-rule), where torch's allocations and scans of this package are
ordered too (`...cuda.launch`, `...cuda.arrays`); no synchronisation hands a caller its blocks.

>>> graph = CudaGraph.build(indptr, indices, edge_ids)
>>> out_indptr, src_nodes, local, eids = sample_block_cuda(graph, seeds, 10, False, layer_key(0, 0, 0))

Importing this package imports ``numba.cuda``; choose the simulator with ``NUMBA_ENABLE_CUDASIM=1``
before that. `require_cuda` raises a clear error where no GPU is usable.

References
----------
Bentley and Floyd (CACM 1987), Floyd's algorithm; Efraimidis and Spirakis (IPL 2006), A-ES exponential
keys, as in GraphBolt's GPU sampler; Pandey et al., C-SAW (SC 2020) and gSampler (SOSP 2023) for
warp-per-row GPU sampling; Min et al., PyTorch-Direct (PVLDB 2021) for reading pinned host memory from
kernels (UVA).
"""

from samplers.kernels.cuda.arrays import concat, empty, fill, full
from samplers.kernels.cuda.device import check_device_index, require_cuda
from samplers.kernels.cuda.graph import CudaGraph
from samplers.kernels.cuda.launch import WARP, grid, launch, wrap
from samplers.kernels.cuda.layer import sample_block_cuda, sample_block_temporal_cuda, sample_layer_cuda
from samplers.kernels.cuda.memory import CudaMemory
from samplers.kernels.cuda.plan import plan_masked, plan_rows, plan_rows_weighted, plan_uniform
from samplers.kernels.cuda.relabel import (
    edge_time_keys_cuda,
    edge_tkeys,
    hash_first,
    hash_first_pairs,
    hash_insert,
    hash_insert_pairs,
    relabel_cuda,
    relabel_out,
    relabel_out_pairs,
    relabel_pairs_cuda,
    relabel_temporal_cuda,
)
from samplers.kernels.cuda.scan import (
    SCAN_CHUNK,
    SCAN_ITEMS,
    SCAN_THREADS,
    exclusive_scan,
    scan_add,
    scan_blocks,
)
from samplers.kernels.cuda.temporal import choose_masked
from samplers.kernels.cuda.uniform import THREAD_FANOUT_MAX, choose_uniform, gather, sample_rows, take_all
from samplers.kernels.cuda.weighted import REJECT_LIMIT, row_prefix, sample_rows_weighted
from samplers.kernels.reference import layer_key

__all__ = ["CudaGraph", "CudaMemory", "require_cuda", "sample_layer_cuda", "relabel_cuda",
           "sample_block_cuda", "relabel_temporal_cuda", "sample_block_temporal_cuda", "layer_key",
           "exclusive_scan", "KERNELS", "check_device_index", "concat", "edge_time_keys_cuda", "empty",
           "full", "relabel_pairs_cuda", "grid", "launch", "wrap", "REJECT_LIMIT", "SCAN_CHUNK",
           "SCAN_ITEMS", "SCAN_THREADS", "THREAD_FANOUT_MAX", "WARP"]

KERNELS = {
    "scan_blocks": scan_blocks, "scan_add": scan_add, "fill": fill, "plan_rows": plan_rows,
    "sample_rows": sample_rows, "row_prefix": row_prefix, "plan_rows_weighted": plan_rows_weighted,
    "sample_rows_weighted": sample_rows_weighted, "plan_uniform": plan_uniform,
    "plan_masked": plan_masked, "choose_uniform": choose_uniform, "choose_masked": choose_masked,
    "gather": gather, "take_all": take_all, "hash_insert": hash_insert, "hash_first": hash_first,
    "relabel_out": relabel_out,
    "edge_tkeys": edge_tkeys, "hash_insert_pairs": hash_insert_pairs, "hash_first_pairs": hash_first_pairs,
    "relabel_out_pairs": relabel_out_pairs,
}
"""Every kernel of this package by name (the tests compile each to PTX where libNVVM is present)."""

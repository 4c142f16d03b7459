"""Numba CPU kernels for neighbour sampling: arrays in, arrays out, plus the threads that run them.

They follow the specification of `samplers.kernels.reference` (docs/architecture.md#sampling-rules)
exactly: the same RNG stream (`samplers.kernels.rng`), the same choice of positions, the same output
order, so the tests demand equality with the reference. A layer runs in flat passes, each a tight loop
of independent iterations (so the core keeps many cache misses in flight):

1. plan (`samplers.kernels.cpu.plan`): each destination's start, degree (minus excluded or ineligible
   edges) and output count; a prefix sum gives the output offsets. In `sample_block` a uniform or weighted
   layer without exclusions is planned by the relabelling of the layer before it (``next_fanout``).
2. choose, by arithmetic alone: uniform rows (`...cpu.uniform`: Floyd's algorithm), weighted rows
   (`...cpu.weighted`: rejection over per-row prefix sums), temporal rows (`...cpu.temporal`:
   exponential keys, prefix-sum inversion); positions go into the edge-id output array.
3. gather: the chosen edges' sources and edge ids.
4. relabel (`...cpu.relabel`): global -> local ids through the workspace's dense int32 map, never
   cleared (entries below ``Workspace.base`` are stale); (node, time) pairs with edge times.

Passes 2 and 3 run per chunk of rows on the caller and helper threads, relabelling pipelined with them
(`samplers.kernels.cpu.layer`). Main names: `sample_block` (a layer, relabelled: one block),
`sample_layer` and `relabel` (the two halves), `Workspace`, `Exclusion`, `Masks`, `weight_prefix`.

>>> ws = Workspace(num_nodes)
>>> key = layer_key(seed, call, layer)
>>> out_indptr, src_nodes, local, eids, _ = sample_block(indptr, indices, None, dst, 10, False, key,
...                                                      None, ws, threads=2)

References
----------
Bentley and Floyd (CACM 1987), Floyd's algorithm; Efraimidis and Spirakis (IPL 2006), A-ES; the
sampling passes follow pyg-lib's and DGL's CPU neighbour samplers.
"""

from samplers.kernels.cpu.layer import CHUNK_EDGES, sample_block, sample_layer
from samplers.kernels.cpu.masks import Masks
from samplers.kernels.cpu.prefix import weight_prefix
from samplers.kernels.cpu.relabel import from_time_keys, relabel, relabel_pairs, time_keys
from samplers.kernels.cpu.threads import parallel_chunks
from samplers.kernels.cpu.workspace import Exclusion, Workspace
from samplers.kernels.reference import layer_key

__all__ = ["layer_key", "sample_layer", "relabel", "relabel_pairs", "sample_block", "Workspace", "Exclusion",
           "Masks", "weight_prefix", "time_keys", "from_time_keys", "CHUNK_EDGES", "parallel_chunks"]

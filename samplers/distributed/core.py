"""The one place the distributed sampler calls the sampling core: its layer loop on an owner's rows.

`owner_loop` builds the core's layer loop (`samplers.layers.LayerLoop`) over an owner's rows as one plain
relation with the uniform, weighted or LABOR-0 mode (`samplers.modes`); `sample_owned_rows` runs its
per-layer entry point, `LayerLoop.sample_relation`, for a frontier (`sample_owned_segments`: a uniform
loop's K batches at once, written into the caller's buffers); `relabel_dst`, `relabel_src` and `Workspace`
are the core's relabelling kernels and their map (`samplers.kernels.cpu`), which the trainer runs as it
assembles a layer (`samplers.distributed.assemble`). A row's draws are keyed by (layer key, global node
id) and the row's CSC positions (docs/architecture.md#sampling-rules), so an owner that keeps each owned
row's in-edges in the graph's CSC order, indexed by global node id, draws exactly what the whole-graph
sampler draws for that row. LABOR-0's per-source variates are keyed by (variate key, global source id) and
its rows need nothing from other rows, so the same holds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from samplers._csc import held_derived
from samplers.kernels import cpu
from samplers.kernels.cpu import Workspace
from samplers.kernels.cpu.layer import sample_layer_segments
from samplers.kernels.cpu.relabel import relabel_dst, relabel_src
from samplers.layers import LayerLoop
from samplers.modes import LaborMode, LayerRequest, RelationArrays, UniformMode, WeightedMode

__all__ = ["KINDS", "NODE", "RELATION", "Workspace", "layer_key", "owner_loop", "relabel_dst", "relabel_src",
           "sample_owned_rows",
           "sample_owned_segments"]

KINDS = ("neighbor", "labor")
"""The samplers owners serve: neighbour sampling (uniform or weighted) and LABOR-0."""

NODE = "node"
"""The owner's rows as one node type of a plain graph (``typed=False``: keys do not depend on names)."""
RELATION = (NODE, "edge", NODE)
"""The one relation of an owner's rows."""


def layer_key(seed: int, call: int, layer: int) -> int:
    """The 64-bit key of one layer of one ``sample`` call on a plain graph (the core's `cpu.layer_key`)."""
    return cpu.layer_key(seed, call, layer)


def owner_loop(indptr: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray, num_nodes: int,
               weights: np.ndarray | None, replace: bool, kind: str = "neighbor",
               derived: dict | None = None) -> LayerLoop:
    """The core's layer loop over an owner's rows as one plain relation.

    Parameters
    ----------
    indptr : int64 [N + 1], indexed by global node id (rows not owned are empty)
    indices : int64 [e_p] global sources; edge_ids : int64 [e_p]; num_nodes : N
    weights : float32 [e_p] or None
        Weighted draws (LABOR: weighted keep probabilities, and edge weights returned), or uniform.
    replace : bool
        Neighbour sampling with replacement.
    kind : {"neighbor", "labor"}
    derived : dict or None
        The derived arrays (`samplers._csc.DERIVED`: the gather's pairs, the weighted prefix sums) of
        the owner's other loops over the same rows and weights: this loop reads them and adds the ones
        it builds, so the loops share one copy (8 bytes per edge each) rather than one per loop.
    """
    if kind == "labor":
        mode = LaborMode(0, want_weights=weights is not None)  # as LaborSampler(importance_sampling=0)
    else:
        mode = UniformMode(replace) if weights is None else WeightedMode(replace)
    relation = RelationArrays(indptr, indices, edge_ids, num_nodes, weights=weights, **(derived or {}))
    loop = LayerLoop({RELATION: relation}, {NODE: num_nodes}, {RELATION: mode}, "cpu", typed=False)
    if derived is not None:
        derived.update(held_derived(relation))
    return loop


def sample_owned_rows(loop: LayerLoop, dst: np.ndarray, fanout: int, key: int, variate_key: int,
                      threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Sample the in-edges of the rows ``dst`` (int64 [D], owned global ids) of one layer, not relabelled.

    Returns counts int64 [D] (edges per row), sources [nnz] (global ids), edge ids int64 [nnz] and the
    mode's edge weights (float32 [nnz], LABOR with weights) or None.
    """
    request = LayerRequest(dst=dst, fanout=int(fanout), key=int(key), variate_key=int(variate_key),
                           threads=threads)
    edges = loop.sample_relation(RELATION, request)
    weights = None if edges.weights is None else np.asarray(edges.weights).astype(np.float32)
    return np.diff(edges.indptr), edges.src, edges.edge_ids, weights



def sample_owned_segments(loop: LayerLoop, dst: np.ndarray, segments: np.ndarray, fanout: int,
                          keys: np.ndarray, threads: int,
                          into: Callable[[np.ndarray], list]) -> np.ndarray:
    """`sample_owned_rows` of a uniform loop for K batches at once, with one set-up: batch b's rows
    ``dst[segments[b]:segments[b + 1]]`` (int64, owned) with ``keys[b]`` (uint64 [K]), its sources and
    edge ids written into the int32 or int64 arrays ``into(nnz)`` gives per batch for the batches' edge
    counts (int64 [K]) (`samplers.kernels.cpu.layer.sample_layer_segments`). Returns the rows' counts,
    int64 [D].

    Raises
    ------
    ValueError
        A weighted or LABOR loop.
    """
    mode, relation = loop.modes[RELATION], loop.relations[RELATION]
    if not isinstance(mode, UniformMode):
        raise ValueError(f"sample_owned_segments samples uniform loops; got a {mode.name} loop")
    out_indptr = sample_layer_segments(relation.indptr, relation.indices, relation.edge_ids, dst, segments,
                                       int(fanout), mode.replace, keys, into, threads, pairs=relation.pairs)
    return np.diff(out_indptr)

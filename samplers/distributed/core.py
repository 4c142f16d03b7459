"""The one place the distributed sampler calls the sampling core: one layer's rows, and relabelling.

`sample_owned_rows` runs the core's per-layer CPU kernel (`samplers.kernels.cpu.sample_layer`, the
layer NeighborSampler's CPU path runs) on a partition owner's rows; `relabel_sources` is the core's
relabelling (`samplers.kernels.cpu.relabel`), run by the trainer on the assembled layer. A row's draws
are keyed by (layer key, global node id) and the row's CSC positions (docs/architecture.md#sampling-rules),
so an owner that keeps each owned row's in-edges in the graph's CSC order, indexed by global node id,
draws exactly what the whole-graph sampler draws for that row.
"""

from __future__ import annotations

import numpy as np

from samplers.kernels import cpu

__all__ = ["layer_key", "relabel_sources", "row_prefix", "sample_owned_rows"]


def layer_key(seed: int, call: int, layer: int) -> int:
    """The 64-bit key of one layer of one ``sample`` call (the core's `cpu.layer_key`)."""
    return cpu.layer_key(seed, call, layer)


def row_prefix(indptr: np.ndarray, weights: np.ndarray, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row prefix sums of the weights (float64 [E]) and positive counts (int64 [N]), computed once."""
    return cpu.weight_prefix(indptr, weights, threads)


def sample_owned_rows(indptr: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray, dst: np.ndarray,
                      fanout: int, replace: bool, key: int, threads: int, weights: np.ndarray | None = None,
                      prefix: tuple[np.ndarray, np.ndarray] | None = None,
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample the in-edges of the rows ``dst`` (global ids) of one layer, without relabelling.

    Parameters
    ----------
    indptr : int64 [N + 1], indexed by global node id (rows not owned are empty)
    indices : int64 [e_p] global sources; edge_ids : int64 [e_p]; dst : int64 [D] owned global ids
    fanout, replace, key, threads : as `samplers.kernels.cpu.sample_layer`
    weights : float32 [e_p] or None; prefix : `row_prefix` of (indptr, weights), or None

    Returns
    -------
    counts : int64 [D] edges per row; src : int64 [nnz] global sources; eids : int64 [nnz] edge ids
    """
    pre, pos = (None, None) if prefix is None else prefix
    out_indptr, src, eids = cpu.sample_layer(indptr, indices, edge_ids, dst, fanout, replace, key, None,
                                             threads, weights, prefix=pre, positive=pos)
    return np.diff(out_indptr), src, eids


def relabel_sources(dst: np.ndarray, src: np.ndarray, node_map: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Local ids of a layer's sources: the destinations first, then new sources in order of first
    occurrence (``node_map``: int32 [N], all -1, left all -1).

    Returns src_nodes int64 [S] and local int64 [nnz]."""
    return cpu.relabel(dst, src, node_map)

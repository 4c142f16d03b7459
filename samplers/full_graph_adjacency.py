"""The normalised adjacency of a `samplers.full_graph.FullGraph` in memory-manager regions.

`build_operators(graph, normalization, add_self_loops, alloc, owner)` returns ``(P, P^T)`` as two
`Operator` s (CSR: row pointer, column indices, float32 weights, each a host- or pinned-tier region);
when P is symmetric (entries and order) one `Operator` serves both. The host path cuts and runs them
with `samplers.full_graph_host`, the staged path with `samplers.full_graph_plan` and
`samplers.full_graph_stream`.

References
----------
Kipf and Welling, "Semi-Supervised Classification with Graph Convolutional Networks", ICLR 2017
(the renormalised adjacency).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from graphrl.graph import CSCGraph
from graphrl.kernels.spmm import csr_transpose, normalized_adjacency
from graphrl.memory import Region

__all__ = ["Operator", "build_operators", "scale"]


class Operator:
    """One CSR matrix (the normalised adjacency or its transpose) in host-tier regions.

    Attributes
    ----------
    regions : tuple of 3 Region
        The memory-manager regions the arrays view (freed by `free`).
    indptr : numpy.ndarray, int64, shape [N + 1]
    indices : numpy.ndarray, int32 or int64 (the graph's), shape [nnz]
        Column of each entry, increasing within a row.
    weights : numpy.ndarray, float32, shape [nnz]
    """

    def __init__(self, regions: tuple[Region, Region, Region]) -> None:
        self.regions = regions
        self.indptr, self.indices, self.weights = (r.numpy() for r in regions)

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    def free(self) -> None:
        for r in self.regions:
            if not r.freed:
                r.free()


def build_operators(graph: CSCGraph, normalization: str, add_self_loops: bool,
                    alloc: Callable[..., Region], owner: str) -> tuple[Operator, Operator]:
    """``(P, P^T)`` of ``graph`` (see `samplers.full_graph.FullGraph`), each array a region from ``alloc``.

    Parameters
    ----------
    graph : CSCGraph
        N nodes; its ``weights`` (float32 [E], if any) are the values of A.
    normalization : {"sym", "left", "right", "none"}
        As `samplers.full_graph.FullGraph` (checked there).
    add_self_loops : bool
        Use ``A + I`` rather than ``A``.
    alloc : callable
        ``alloc(shape, dtype, owner) -> Region``: where the six arrays live.
    owner : str
        The regions' owner.

    Returns
    -------
    (Operator, Operator)
        P and P^T (CSR, nnz = E, + N with self-loops); the same object twice when P is symmetric.

    Raises
    ------
    MemoryBudgetError
        From ``alloc``: no room for the arrays (those taken already are freed).
    """
    n = graph.num_nodes
    indptr = graph.indptr.numpy()
    indices = graph.indices.numpy()
    values = graph.weights.numpy() if graph.weights is not None else None
    loop = 1.0 if add_self_loops else 0.0
    if values is None:
        deg_in = np.diff(indptr).astype(np.float64)
        deg_out = np.bincount(indices, minlength=n).astype(np.float64)
    else:
        csum = np.concatenate(([0.0], np.cumsum(values, dtype=np.float64)))
        deg_in = csum[indptr[1:]] - csum[indptr[:-1]]
        deg_out = np.bincount(indices, weights=values.astype(np.float64), minlength=n)
    deg_in += loop
    deg_out += loop
    power = {"sym": (-0.5, -0.5), "left": (-1.0, 0.0), "right": (0.0, -1.0), "none": (0.0, 0.0)}
    p_dst, p_src = power[normalization]
    scale_dst, scale_src = scale(deg_in, p_dst), scale(deg_out, p_src)
    nnz = graph.num_edges + (n if add_self_loops else 0)

    def regions() -> tuple[Region, Region, Region]:
        return (alloc(n + 1, torch.int64, owner),
                alloc(nnz, indices.dtype, owner),
                alloc(nnz, torch.float32, owner))

    fwd = Operator(regions())
    try:
        normalized_adjacency(indptr, indices, values, add_self_loops, scale_dst, scale_src,
                             out=(fwd.indptr, fwd.indices, fwd.weights))
        bwd = Operator(regions())
    except BaseException:
        fwd.free()
        raise
    # bwd = P^T; then P = (P^T)^T: rows of both list their entries by increasing column, so P is
    # symmetric exactly when the two are equal, and then one copy serves both directions.
    csr_transpose(fwd.indptr, fwd.indices, fwd.weights, n, out=(bwd.indptr, bwd.indices, bwd.weights))
    csr_transpose(bwd.indptr, bwd.indices, bwd.weights, n, out=(fwd.indptr, fwd.indices, fwd.weights))
    if (np.array_equal(fwd.indptr, bwd.indptr) and np.array_equal(fwd.indices, bwd.indices)
            and np.array_equal(fwd.weights, bwd.weights)):
        bwd.free()
        bwd = fwd
    return fwd, bwd


def scale(degrees: np.ndarray, power: float) -> np.ndarray:
    """``degrees ** power`` (float64 [N] in and out), 0 where a degree is <= 0; all ones for power 0."""
    if power == 0.0:
        return np.ones_like(degrees)
    with np.errstate(divide="ignore"):
        out = np.power(degrees, power)
    out[degrees <= 0] = 0.0
    return out

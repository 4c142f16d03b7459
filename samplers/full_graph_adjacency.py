"""The normalised adjacency of a `FullGraph` in memory-manager regions, and the host path's partition cut.

`build_operators(graph, normalization, add_self_loops, alloc, owner)` returns ``(P, P^T)`` as two
`Operator` s (CSR: row pointer, column indices, float32 weights, each a host- or pinned-tier region);
when P is symmetric (entries and order) one `Operator` serves both. `greedy_bounds` cuts the rows of a
matrix into maximal consecutive partitions whose zero-copy working set fits a byte cap (the host path
of `samplers.full_graph`; the staged path plans with `samplers.full_graph_plan`).

References
----------
Kipf and Welling, "Semi-Supervised Classification with Graph Convolutional Networks", ICLR 2017
(the renormalised adjacency).
"""

from __future__ import annotations

from collections.abc import Callable

import numba as nb
import numpy as np
import torch

from graphrl.graph import CSCGraph
from graphrl.kernels.spmm import csr_transpose, normalized_adjacency
from graphrl.memory import Region

__all__ = ["ALIGN", "SLACK", "Operator", "align", "build_operators", "greedy_bounds", "scale"]

ALIGN = 64
SLACK = 3 * ALIGN  # alignment padding of the four arrays of a partition's working set


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@nb.njit(nogil=True, cache=True)
def greedy_bounds(indptr, edge_bytes, row_bytes, cap):  # pragma: no cover - compiled
    """Cut rows into maximal consecutive partitions of cost <= cap; (bounds, -1) or (empty, bad row)."""
    n = indptr.shape[0] - 1
    bounds = np.empty(n + 1, np.int64)
    bounds[0] = 0
    k = 0
    r0 = 0
    while r0 < n:
        cost = 8 + SLACK  # the row pointer's extra entry and the alignment
        r = r0
        while r < n:
            c = row_bytes + edge_bytes * (indptr[r + 1] - indptr[r])
            if cost + c > cap:
                break
            cost += c
            r += 1
        if r == r0:
            return bounds[:0], r0
        k += 1
        bounds[k] = r
        r0 = r
    return bounds[: k + 1], -1


class Operator:
    """One CSR matrix (the normalised adjacency or its transpose) in host-tier regions."""

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
    """``(P, P^T)`` of ``graph`` (see `samplers.full_graph.FullGraph`), each array a region from ``alloc``."""
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
    if power == 0.0:
        return np.ones_like(degrees)
    with np.errstate(divide="ignore"):
        out = np.power(degrees, power)
    out[degrees <= 0] = 0.0
    return out

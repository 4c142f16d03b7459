"""The trainer's side of a distributed layer: a frontier split by owner, and the owners' rows put back.

`split_by_owner` groups a frontier by the part that owns each node (a stable counting sort: within a
part, frontier order is kept); `scatter_rows` copies each owner's answer, rows in the order it
was asked for, to the rows' places in frontier order (one pass, numba). See
docs/architecture.md#partitioned-graphs.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["scatter_rows", "split_by_owner"]


@nb.njit(nogil=True, cache=True)
def _group(ids, node_part, num_parts):  # pragma: no cover - compiled
    bounds = np.zeros(num_parts + 1, dtype=np.int64)
    for i in range(ids.shape[0]):
        bounds[node_part[ids[i]] + 1] += 1
    for p in range(num_parts):
        bounds[p + 1] += bounds[p]
    fill = bounds[:-1].copy()
    order = np.empty(ids.shape[0], dtype=np.int64)
    for i in range(ids.shape[0]):
        p = node_part[ids[i]]
        order[fill[p]] = i
        fill[p] += 1
    return order, bounds


def split_by_owner(ids: np.ndarray, node_part: np.ndarray,
                   num_parts: int) -> tuple[np.ndarray, dict[int, slice]]:
    """Group ``ids`` (int64 [K]) by owner: the stable order (int64 [K]) that sorts them by part, and each
    part's slice of it (parts with no id left out). ``node_part``: int [N] in [0, num_parts)."""
    order, bounds = _group(ids, node_part, int(num_parts))
    return order, {p: slice(int(bounds[p]), int(bounds[p + 1])) for p in range(int(num_parts))
                   if bounds[p + 1] > bounds[p]}


@nb.njit(nogil=True, cache=True)
def _scatter_one(rows, counts, values, out_indptr, out):  # pragma: no cover - compiled
    j = 0
    for i in range(rows.shape[0]):
        o = out_indptr[rows[i]]
        for c in range(counts[i]):
            out[o + c] = values[j]
            j += 1


@nb.njit(nogil=True, cache=True)
def _scatter(rows, counts, src_in, eid_in, out_indptr, src_out, eid_out):  # pragma: no cover - compiled
    j = 0
    for i in range(rows.shape[0]):
        o = out_indptr[rows[i]]
        for c in range(counts[i]):
            src_out[o + c] = src_in[j]
            eid_out[o + c] = eid_in[j]
            j += 1


def scatter_rows(rows: np.ndarray, counts: np.ndarray, src: np.ndarray, eids: np.ndarray,
                 out_indptr: np.ndarray, src_out: np.ndarray, eids_out: np.ndarray,
                 weights: np.ndarray | None = None, weights_out: np.ndarray | None = None) -> None:
    """Copy one owner's answer into frontier order.

    Parameters
    ----------
    rows : int64 [D_p], the frontier positions the owner's rows belong to
    counts : int [D_p]; src, eids : int [nnz_p], rows in the order of ``rows``
    out_indptr : int64 [D + 1], frontier order; src_out, eids_out : int64 [nnz], written
    weights, weights_out : float32 [nnz_p] and [nnz], or None: per-edge weights, copied the same way
    """
    _scatter(rows, counts, src, eids, out_indptr, src_out, eids_out)
    if weights is not None:
        _scatter_one(rows, counts, weights, out_indptr, weights_out)

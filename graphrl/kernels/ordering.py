"""Locality orderings of sparse matrices as numba kernels: arrays in, a permutation out.

`rcm_order(indptr, indices, n)` is the reverse Cuthill-McKee order of the pattern of ``M + M^T`` for a
square CSR matrix M: rows that share neighbours end up close, which is what a partitioner that cuts
contiguous ranges of rows wants (`samplers.full_graph_plan.locality_order` uses it). It follows
scipy's ``reverse_cuthill_mckee``: every connected component is searched breadth first from its
unvisited node of least degree, the children of a node are queued by increasing degree (ties by id),
and the whole order is reversed. Degrees count a node's entries in M and in M^T (an entry present in
both directions counts twice, where scipy counts the union once), so orders can differ from scipy's
in ties. Linear in the entries plus a sort of each node's newly found children; deterministic.

>>> order = rcm_order(indptr, indices, n)   # int64 [n], a permutation   # doctest: +SKIP

References
----------
Cuthill and McKee, "Reducing the bandwidth of sparse symmetric matrices", 1969; George and Liu,
"Computer Solution of Large Sparse Positive Definite Systems", 1981 (the reverse order); scipy's
``scipy.sparse.csgraph.reverse_cuthill_mckee``.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels.prefetch import prefetch

__all__ = ["rcm_order"]


@nb.njit(nogil=True, cache=True)
def _transpose(indptr, indices, n):  # pragma: no cover - compiled
    """The pattern of M^T by a stable counting sort (row u: the rows v with an entry in column u)."""
    nnz = indptr[n]
    tptr = np.zeros(n + 1, np.int64)
    for e in range(nnz):
        tptr[indices[e] + 1] += 1
    for u in range(n):
        tptr[u + 1] += tptr[u]
    fill = tptr[:n].copy()
    tind = np.empty(nnz, indices.dtype)
    for v in range(n):
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            tind[fill[u]] = v
            fill[u] += 1
    return tptr, tind


@nb.njit(nogil=True, cache=True)
def _rcm(indptr, indices, tptr, tind, n):  # pragma: no cover - compiled
    deg = np.empty(n, np.int64)
    for v in range(n):
        deg[v] = (indptr[v + 1] - indptr[v]) + (tptr[v + 1] - tptr[v])
    # least degree first, ties by id (a stable counting sort by degree)
    dmax = 0
    for v in range(n):
        dmax = max(dmax, deg[v])
    start = np.zeros(dmax + 2, np.int64)
    for v in range(n):
        start[deg[v] + 1] += 1
    for d in range(dmax + 1):
        start[d + 1] += start[d]
    by_degree = np.empty(n, np.int64)
    for v in range(n):
        by_degree[start[deg[v]]] = v
        start[deg[v]] += 1
    order = np.empty(n, np.int64)
    seen = np.zeros(n, np.bool_)
    keys = np.empty(n, np.int64)
    top = 0
    for s in by_degree:
        if seen[s]:
            continue
        seen[s] = True
        order[top] = s
        head = top
        top += 1
        while head < top:
            v = order[head]
            if head + 4 < top:  # the rows searched a few steps ahead
                w = order[head + 4]
                prefetch(indices, indptr[w])
                prefetch(tind, tptr[w])
            head += 1
            first = top
            for e in range(indptr[v], indptr[v + 1]):
                u = indices[e]
                if not seen[u]:
                    seen[u] = True
                    order[top] = u
                    top += 1
            for e in range(tptr[v], tptr[v + 1]):
                u = tind[e]
                if not seen[u]:
                    seen[u] = True
                    order[top] = u
                    top += 1
            m = top - first
            if m > 1:  # the new children by (degree, id): keys are distinct, so any sort agrees
                for i in range(m):
                    u = order[first + i]
                    keys[i] = deg[u] * n + u
                if m <= 16:
                    for i in range(1, m):
                        x = keys[i]
                        j = i - 1
                        while j >= 0 and keys[j] > x:
                            keys[j + 1] = keys[j]
                            j -= 1
                        keys[j + 1] = x
                else:
                    keys[:m].sort()
                for i in range(m):
                    order[first + i] = keys[i] % n
    return order[::-1].copy()


def rcm_order(indptr: np.ndarray, indices: np.ndarray, n: int,
              transpose: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Reverse Cuthill-McKee order of the pattern of ``M + M^T``.

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [n + 1]
    indices : numpy.ndarray, int32 or int64, shape [nnz]
        CSR pattern of the square matrix M (columns in ``[0, n)``); values are not needed.
    n : int
        Rows (and columns) of M.
    transpose : (numpy.ndarray int64 [n + 1], numpy.ndarray int [nnz]) or None
        The pattern of M^T as CSR, each row's entries by increasing original row (what
        `graphrl.kernels.spmm.csr_transpose` makes), when the caller has it; else it is built here.
        The order is the same either way.

    Returns
    -------
    numpy.ndarray, int64, shape [n]
        A permutation of ``0 .. n-1``: ``order[i]`` is the row placed i-th.

    References
    ----------
    Cuthill and McKee, 1969; scipy's ``reverse_cuthill_mckee`` (the same search; see the module).
    """
    if n == 0:
        return np.zeros(0, np.int64)
    indptr, indices = np.ascontiguousarray(indptr, dtype=np.int64), np.ascontiguousarray(indices)
    if transpose is None:
        tptr, tind = _transpose(indptr, indices, np.int64(n))
    else:
        tptr, tind = np.ascontiguousarray(transpose[0], dtype=np.int64), np.ascontiguousarray(transpose[1])
    return _rcm(indptr, indices, tptr, tind, np.int64(n))

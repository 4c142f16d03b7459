"""Numba CPU kernels for neighbour sampling: arrays in, arrays out.

They follow the specification in `samplers.kernels.reference` exactly (same RNG stream, same choice of
positions, same output order), so the tests can demand equality with the reference.

Layout of one layer (DESIGN §3): a flat pass reads every destination's start and degree and sizes its
output; a parallel pass chooses positions by arithmetic alone and reads the chosen edges; relabelling
uses a dense int32 map of size N that is reset after each use.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from samplers.kernels.reference import GOLDEN as _GOLDEN_INT
from samplers.kernels.reference import layer_key

__all__ = ["layer_key", "sample_layer", "relabel", "NodeMap"]

_GOLDEN = np.uint64(_GOLDEN_INT)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_NO_EXCL = np.empty(0, dtype=np.int64)


@nb.njit(inline="always", cache=True)
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@nb.njit(inline="always", cache=True)
def _excluded_range(excl, start, end):
    """[lo, hi) of the sorted excluded positions that fall in the row [start, end)."""
    if excl.shape[0] == 0:
        return 0, 0
    return np.searchsorted(excl, start), np.searchsorted(excl, end)


@nb.njit(parallel=True, nogil=True, cache=True)
def _row_counts(indptr, dst, fanout, replace, excl, out_indptr):
    d_count = dst.shape[0]
    for i in nb.prange(d_count):
        v = dst[i]
        lo, hi = _excluded_range(excl, indptr[v], indptr[v + 1])
        deg = indptr[v + 1] - indptr[v] - (hi - lo)
        if fanout < 0 or (not replace and deg <= fanout):
            c = deg
        elif deg == 0:
            c = 0
        else:
            c = fanout
        out_indptr[i + 1] = c
    out_indptr[0] = 0
    for i in range(d_count):
        out_indptr[i + 1] += out_indptr[i]


@nb.njit(parallel=True, nogil=True, cache=True)
def _fill(indptr, indices, edge_ids, has_eids, dst, fanout, replace, key, excl, out_indptr, out_src, out_eid):
    d_count = dst.shape[0]
    for i in nb.prange(d_count):
        v = dst[i]
        start = indptr[v]
        lo, hi = _excluded_range(excl, start, indptr[v + 1])
        deg = indptr[v + 1] - start - (hi - lo)
        o = out_indptr[i]
        c = out_indptr[i + 1] - o
        if c == 0:
            continue
        if c == deg and (fanout < 0 or not replace):
            for j in range(c):
                out_src[o + j] = start + j
        else:
            state = _mix(key ^ (np.uint64(v) * _GOLDEN))
            if replace:
                for j in range(c):
                    state += _GOLDEN
                    out_src[o + j] = start + np.int64(_mix(state) % np.uint64(deg))
            elif deg <= 64:
                mask = np.uint64(0)
                for j in range(deg - c, deg):
                    state += _GOLDEN
                    t = np.int64(_mix(state) % np.uint64(j + 1))
                    bit = np.uint64(1) << np.uint64(t)
                    if mask & bit:
                        mask |= np.uint64(1) << np.uint64(j)
                    else:
                        mask |= bit
                w = 0
                for p in range(deg):
                    if mask & (np.uint64(1) << np.uint64(p)):
                        out_src[o + w] = start + p
                        w += 1
            else:
                n = 0
                for j in range(deg - c, deg):
                    state += _GOLDEN
                    t = np.int64(_mix(state) % np.uint64(j + 1))
                    taken = False
                    for q in range(n):
                        if out_src[o + q] == t:
                            taken = True
                            break
                    out_src[o + n] = j if taken else t
                    n += 1
                out_src[o:o + c].sort()
                for j in range(c):
                    out_src[o + j] += start
        if hi > lo:
            # Virtual position i (over the d' non-excluded positions) -> real position:
            # i + #{j : x_j - j <= i} with x_j the row's excluded relative positions (non-decreasing).
            for j in range(c):
                p = out_src[o + j] - start
                r = p
                for q in range(lo, hi):
                    if excl[q] - start - (q - lo) <= p:
                        r += 1
                    else:
                        break
                out_src[o + j] = start + r
        # out_src holds CSC positions here; resolve them to sources and edge ids.
        for j in range(c):
            pos = out_src[o + j]
            out_eid[o + j] = edge_ids[pos] if has_eids else pos
            out_src[o + j] = indices[pos]


def sample_layer(indptr: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray | None, dst: np.ndarray,
                 fanout: int, replace: bool, key: int, excluded: np.ndarray | None = None,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample the in-edges of each destination (see `samplers.kernels.reference.sample_layer`).

    Parameters
    ----------
    indptr : int64 [N + 1]; indices : int32/int64 [E]; edge_ids : int64 [E] or None (identity)
    dst : int64 [D], trusted in range
    fanout : int, k >= 0 or -1
    replace : bool
    key : int, ``layer_key(seed, call, layer)``
    excluded : int64 [X] or None, sorted distinct CSC positions never drawn

    Returns
    -------
    out_indptr : int64 [D + 1]; src : int64 [nnz] global sources; eids : int64 [nnz] edge ids
    """
    d_count = dst.shape[0]
    out_indptr = np.empty(d_count + 1, dtype=np.int64)
    excl = _NO_EXCL if excluded is None else excluded
    _row_counts(indptr, dst, np.int64(fanout), bool(replace), excl, out_indptr)
    nnz = int(out_indptr[-1])
    out_src = np.empty(nnz, dtype=np.int64)
    out_eid = np.empty(nnz, dtype=np.int64)
    has_eids = edge_ids is not None
    eids_arg = edge_ids if has_eids else np.empty(0, dtype=np.int64)
    _fill(indptr, indices, eids_arg, has_eids, dst, np.int64(fanout), bool(replace), np.uint64(key), excl,
          out_indptr, out_src, out_eid)
    return out_indptr, out_src, out_eid


@nb.njit(nogil=True, cache=True)
def _relabel(dst, src, node_map, src_nodes, local):
    n = 0
    for i in range(dst.shape[0]):
        v = dst[i]
        if node_map[v] < 0:
            node_map[v] = i
        src_nodes[n] = v
        n += 1
    for j in range(src.shape[0]):
        v = src[j]
        m = node_map[v]
        if m < 0:
            m = n
            node_map[v] = n
            src_nodes[n] = v
            n += 1
        local[j] = m
    for i in range(n):
        node_map[src_nodes[i]] = -1
    return n


class NodeMap:
    """A reusable dense global -> local id map (int32, size N), all -1 between uses.

    One per sampler; not shared between threads.
    """

    def __init__(self, num_nodes: int) -> None:
        self.map = np.full(num_nodes, -1, dtype=np.int32)


def relabel(dst: np.ndarray, src: np.ndarray, node_map: NodeMap) -> tuple[np.ndarray, np.ndarray]:
    """Map sampled global sources to local ids (see `samplers.kernels.reference.relabel`).

    Returns
    -------
    src_nodes : int64 [S]; local : int64 [nnz]
    """
    src_nodes = np.empty(dst.shape[0] + src.shape[0], dtype=np.int64)
    local = np.empty(src.shape[0], dtype=np.int64)
    n = _relabel(dst, src, node_map.map, src_nodes, local)
    return src_nodes[:n], local

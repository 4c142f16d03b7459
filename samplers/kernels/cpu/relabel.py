"""Relabelling: global source ids -> local ids, in first-occurrence order after the destinations.

Node ids go through the workspace's dense int32 map (``relabel_dst`` / ``relabel_src``: a branch-free
first-occurrence loop; the map entry 16 ids ahead is prefetched); with edge times the key is the
(node, time key) pair, through an open-addressing table (``relabel_pairs``). Time keys are int64:
integer times as they are, float64 times by their bit pattern (`time_keys`).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels import prefetch
from samplers.kernels.cpu.plan import plan_new_rows
from samplers.kernels.cpu.rng import GOLDEN, mix

__all__ = ["from_time_keys", "relabel", "relabel_dst", "relabel_dst_planned", "relabel_pairs",
           "relabel_pairs_into", "relabel_src", "relabel_src_planned", "time_keys"]

_PREFETCH_AHEAD = 16  # prefetch distance of the relabelling loops


@nb.njit(inline="always", cache=True)
def _pair_slot(tab_node, tab_time, mask, v, t):
    """Slot of (v, t) in the open-addressing table: its own, or the empty one where it belongs."""
    h = np.int64(mix((np.uint64(v) * GOLDEN) ^ np.uint64(t))) & mask
    while tab_node[h] >= 0 and not (tab_node[h] == v and tab_time[h] == t):
        h = (h + 1) & mask
    return h


@nb.njit(nogil=True, cache=True)
def relabel_pairs_into(dst, dst_tkey, src, edge_tkey, src_nodes, src_tkey, local):
    """Local ids keyed on (node, time key) through an open-addressing table; return the source count.

    Time keys are int64 (float64 times by their bit pattern, see `time_keys`). Destinations keep their
    positions (a repeated pair maps to its first one); sampled source j is the pair (src[j],
    edge_tkey[j]) (the time of the row it was sampled for); new pairs are appended in first-occurrence
    order."""
    d_count = dst.shape[0]
    nnz = src.shape[0]
    cap = 16
    while cap < 2 * (d_count + nnz):
        cap *= 2
    mask = cap - 1
    tab_node = np.full(cap, -1, dtype=np.int64)
    tab_time = np.empty(cap, dtype=np.int64)
    tab_id = np.empty(cap, dtype=np.int64)
    for i in range(d_count):
        v = np.int64(dst[i])
        t = dst_tkey[i]
        src_nodes[i] = v
        src_tkey[i] = t
        h = _pair_slot(tab_node, tab_time, mask, v, t)
        if tab_node[h] < 0:
            tab_node[h] = v
            tab_time[h] = t
            tab_id[h] = i
    n = d_count
    for j in range(nnz):
        v = np.int64(src[j])
        t = edge_tkey[j]
        h = _pair_slot(tab_node, tab_time, mask, v, t)
        if tab_node[h] < 0:
            tab_node[h] = v
            tab_time[h] = t
            tab_id[h] = n
            src_nodes[n] = v
            src_tkey[n] = t
            n += 1
        local[j] = tab_id[h]
    return n


def relabel_pairs(dst: np.ndarray, dst_tkey: np.ndarray, src: np.ndarray,
                  edge_tkey: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Map sampled sources to local ids keyed on (node, time key) (as `reference.relabel_temporal`, with
    each source's time key given instead of its row).

    Parameters
    ----------
    dst : int64 [D]; dst_tkey : int64 [D] (`time_keys` of the rows' times); src : int32/int64 [nnz];
    edge_tkey : int64 [nnz], the time key of each sampled source

    Returns
    -------
    src_nodes : int64 [S]; src_tkey : int64 [S]; local : int64 [nnz]
    """
    d_count, nnz = dst.shape[0], src.shape[0]
    src_nodes = np.empty(d_count + nnz, dtype=np.int64)
    src_tkey = np.empty(d_count + nnz, dtype=np.int64)
    local = np.empty(nnz, dtype=np.int64)
    as64 = np.ascontiguousarray
    n = relabel_pairs_into(as64(dst, dtype=np.int64), as64(dst_tkey, dtype=np.int64), src,
                           as64(edge_tkey, dtype=np.int64), src_nodes, src_tkey, local)
    return src_nodes[:n], src_tkey[:n], local


@nb.njit(nogil=True, cache=True)
def relabel_dst(dst, node_map, base, src_nodes):
    """Local ids of the destinations: their positions (the first one for duplicates). Ids must lie in
    [0, len(node_map)): unchecked, indexed as unsigned (a negative id reads far out of bounds)."""
    d_count = dst.shape[0]
    for i in range(min(_PREFETCH_AHEAD, d_count)):
        prefetch(node_map, dst[i])
    for i in range(d_count):
        if i + _PREFETCH_AHEAD < d_count:
            prefetch(node_map, dst[i + _PREFETCH_AHEAD])
        v = np.uint64(dst[i])  # unsigned indices: no negative-index wraparound code
        m = node_map[v]
        node_map[v] = base + i if m < base else m
        src_nodes[np.uint64(i)] = v
    return d_count


@nb.njit(nogil=True, cache=True)
def relabel_src(src, node_map, base, n, src_nodes, local, lo, hi):
    """Local ids of the sampled sources src[lo:hi]; new nodes are appended at src_nodes[n:]; return n.
    Ids must lie in [0, len(node_map)), unchecked (as in `relabel_dst`).

    The map entry of the source 16 places ahead is prefetched: the store to the map in every iteration
    keeps the core from overlapping enough of these random reads."""
    ahead = min(lo + _PREFETCH_AHEAD, hi)
    for j in range(lo, ahead):
        prefetch(node_map, src[j])
    for j in range(lo, hi):
        if j + _PREFETCH_AHEAD < hi:
            prefetch(node_map, src[j + _PREFETCH_AHEAD])
        v = np.uint64(src[j])  # unsigned indices: no negative-index wraparound code
        m = node_map[v]
        new = m < base
        m = base + n if new else m
        node_map[v] = m
        src_nodes[np.uint64(n)] = v  # unconditional: overwritten next time unless v is new
        n += new
        local[np.uint64(j)] = m - base
    return n


@nb.njit(nogil=True, cache=True)
def relabel_dst_planned(dst, node_map, base, src_nodes, indptr, node_count, has_count, fanout, replace, rows,
                        offs):
    """`relabel_dst`, then its destinations planned as the first rows of the next layer (`plan_new_rows`
    over ``src_nodes[0:n]``, offs[0] set to 0): the first step of a layer that plans the next one while it
    relabels (`samplers.kernels.cpu.layer.sample_block` with ``next_fanout``). One compiled call, so the
    layer's Python loop pays one dispatch for both.

    Parameters
    ----------
    dst : numpy.ndarray, int64, shape [D]
        The layer's destinations, in [0, len(node_map)) (unchecked).
    node_map : numpy.ndarray, int32, shape [N]; base : int
        As `relabel_dst`.
    src_nodes : numpy.ndarray, int64, shape [>= D]
        The layer's local ids' nodes; [0, n) written.
    indptr : numpy.ndarray, int64, shape [N + 1]
        The graph's row pointer (the next layer's rows).
    node_count : numpy.ndarray, int64, shape [N]; has_count : bool
        Weighted rows: each node's positive-weight count, the rows' degrees (``has_count``); else unread.
    fanout : numpy.int64; replace : bool
        The next layer's fanout (>= 0 or -1) and rule.
    rows : numpy.ndarray, int64, shape [5, >= D + nnz]
        The next layer's row scratch (`samplers.kernels.cpu.workspace.Workspace.spare_rows`); columns
        [0, n) written.
    offs : numpy.ndarray, int64, shape [>= D + nnz + 1]
        The next layer's output offsets; [0, n] written.

    Returns
    -------
    int
        n, the local ids so far (the destinations' count D).

    Raises nothing: a kernel trusts its inputs (ids out of range read and write out of bounds; the public
    boundary, `samplers.kernels.cpu.layer.sample_block`'s caller, validates them).
    """
    n = relabel_dst(dst, node_map, base, src_nodes)
    offs[0] = 0
    plan_new_rows(src_nodes, 0, n, indptr, node_count, has_count, fanout, replace, rows, offs)
    return n


@nb.njit(nogil=True, cache=True)
def relabel_src_planned(src, node_map, base, n, src_nodes, local, lo, hi, indptr, node_count, has_count,
                        fanout, replace, rows, offs):
    """`relabel_src` over src[lo:hi], then the sources it found new (``src_nodes[n:n1]``) planned as rows of
    the next layer (`plan_new_rows`): a layer's relabelling, chunk by chunk, plans the next layer, whose
    destinations are its sources in this order, so that the next layer has no planning pass of its own. One
    compiled call a chunk (one dispatch from the layer's Python loop).

    Parameters
    ----------
    src : numpy.ndarray, int32 or int64, shape [nnz]
        The layer's sampled sources, in [0, len(node_map)) (unchecked).
    node_map, base, n, src_nodes, local, lo, hi
        As `relabel_src` (``local`` int64 [nnz]; ``src_nodes`` int64 [>= D + nnz]).
    indptr, node_count, has_count, fanout, replace, rows, offs
        As `relabel_dst_planned`; rows and offsets [n, n1) of the next layer written (offs[n] already
        written by the chunk before).

    Returns
    -------
    int
        n1, the local ids after this chunk.

    Raises nothing: a kernel trusts its inputs (ids out of range read and write out of bounds; the public
    boundary, `samplers.kernels.cpu.layer.sample_block`'s caller, validates them).
    """
    n1 = relabel_src(src, node_map, base, n, src_nodes, local, lo, hi)
    plan_new_rows(src_nodes, n, n1, indptr, node_count, has_count, fanout, replace, rows, offs)
    return n1


def relabel(dst: np.ndarray, src: np.ndarray, node_map: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map sampled global sources to local ids (as `reference.relabel`).

    Parameters
    ----------
    dst : int64 [D]; src : int32/int64 [nnz]; node_map : int32 [N], all -1 (left all -1 on return)

    Returns
    -------
    src_nodes : int64 [S]; local : int64 [nnz]
    """
    src_nodes = np.empty(dst.shape[0] + src.shape[0], dtype=np.int64)
    local = np.empty(src.shape[0], dtype=np.int64)
    n = relabel_dst(dst, node_map, 0, src_nodes)
    n = relabel_src(src, node_map, 0, n, src_nodes, local, 0, src.shape[0])
    src_nodes = src_nodes[:n]
    node_map[src_nodes] = -1
    return src_nodes, local


def time_keys(times: np.ndarray) -> np.ndarray:
    """int64 keys of times for (node, time) relabelling: integers as they are, float64 by bit pattern
    (with -0.0 folded into 0.0, so equal times get equal keys)."""
    if times.dtype == np.float64:
        return (times + 0.0).view(np.int64)
    return times.astype(np.int64, copy=False)


def from_time_keys(keys: np.ndarray, dtype) -> np.ndarray:
    """The times (int64 or float64 ``dtype``) of int64 keys made by `time_keys`."""
    return keys.view(np.float64) if np.dtype(dtype) == np.float64 else keys.astype(dtype, copy=False)

"""Relabelling on the GPU: local ids in first-occurrence order, through an open-addressing hash table.

The table holds, per node, the smallest index at which it occurs in (destinations, sampled sources)
(``atomic.cas`` to claim a slot, ``atomic.min`` for the index); an edge is a node's first occurrence
iff the table holds its own index; a scan of those flags numbers the new nodes in first-occurrence
order. So the local ids do not depend on thread timing and equal the CPU's. With edge times the key is
the (node, time key) pair: a slot holds the index of the entry that claimed it (a pair is two words,
too wide for one compare-and-swap), compared through the input arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from samplers.kernels.cuda.arrays import as_device_ids, copy_into, empty, fill_with, full, is_float64, view_as
from samplers.kernels.cuda.launch import EDGE_THREADS, WARP, grid, kernel_stream, launch
from samplers.kernels.cuda.rng import GOLDEN, mix
from samplers.kernels.cuda.rows import NO_INDEX
from samplers.kernels.cuda.scan import exclusive_scan

__all__ = ["UPTO_KERNELS", "edge_time_keys_cuda", "edge_tkeys", "hash_first", "hash_first_pairs",
           "hash_first_upto", "hash_insert", "hash_insert_pairs", "hash_insert_upto", "relabel_bounded",
           "relabel_cuda", "relabel_out", "relabel_out_pairs", "relabel_out_upto", "relabel_pairs_bounded",
           "relabel_pairs_cuda",
           "relabel_temporal_cuda"]

_EMPTY = np.int64(-1)


@cuda.jit(device=True)
def _slot(v, mask):  # pragma: no cover - device
    return np.int64(mix(np.uint64(v)) & np.uint64(mask))


@cuda.jit(device=True)
def _claim(keys, vals, mask, v, i):  # pragma: no cover - device
    """Claim node v's slot (or find it claimed) and keep the smaller of its value and index i."""
    h = _slot(v, mask)
    while True:
        prev = cuda.atomic.cas(keys, h, _EMPTY, v)
        if prev == _EMPTY or prev == v:
            cuda.atomic.min(vals, h, np.int64(i))
            return
        h = (h + 1) & mask


@cuda.jit(device=True)
def _first_of(src, d_count, keys, vals, mask, first, flags, j):  # pragma: no cover - device
    """first[j]: the smallest index of src[j]'s node (its slot's value); flags[j] = 1 iff it is j's."""
    v = np.int64(src[j])
    h = _slot(v, mask)
    while keys[h] != v:
        h = (h + 1) & mask
    f = vals[h]
    first[j] = f
    flags[j] = 1 if f == d_count + j else 0


@cuda.jit
def hash_insert(dst, src, keys, vals, mask):  # pragma: no cover - device
    """Claim a slot per distinct node; keep the smallest index of its occurrences."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count = dst.shape[0]
    total = d_count + src.shape[0]
    while i < total:
        _claim(keys, vals, mask, np.int64(dst[i]) if i < d_count else np.int64(src[i - d_count]), i)
        i += stride


@cuda.jit
def hash_first(src, d_count, keys, vals, mask, first, flags):  # pragma: no cover - device
    """first[j]: smallest index of src[j]'s node; flags[j] = 1 iff edge j is that first occurrence."""
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    while j < src.shape[0]:
        _first_of(src, d_count, keys, vals, mask, first, flags, j)
        j += stride


@cuda.jit(device=True)
def _write_out(dst, src, first, flags, newid, src_nodes, local, d_count, i):  # pragma: no cover - device
    """Entry i of (destinations, sources): a destination copied to its own place; a source's local id,
    and the node itself at its new id if this is its first occurrence. Nodes past ``src_nodes``' end (a
    bounded relabelling's overflow, seen when its sizes are read) are not written."""
    if i < d_count:
        if i < src_nodes.shape[0]:
            src_nodes[i] = dst[i]
    else:
        j = i - d_count
        f = first[j]
        local[j] = f if f < d_count else d_count + newid[f - d_count]
        if flags[j] and d_count + newid[j] < src_nodes.shape[0]:
            src_nodes[d_count + newid[j]] = src[j]


@cuda.jit
def relabel_out(dst, src, first, flags, newid, src_nodes, local):  # pragma: no cover - device
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count = dst.shape[0]
    total = d_count + src.shape[0]
    while i < total:
        _write_out(dst, src, first, flags, newid, src_nodes, local, d_count, i)
        i += stride


@cuda.jit
def hash_insert_upto(dst, nrow, src, nnz, keys, vals, mask):  # pragma: no cover - device
    """`hash_insert` over the first ``nrow[0]`` destinations and the first ``nnz[0]`` sources (``dst``
    and ``src`` may be longer: upper bounds; a count past ``src``'s end, a chain's overflow, is clamped
    to it by the three bounded kernels)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count = nrow[0]
    total = d_count + (nnz[0] if nnz[0] < src.shape[0] else src.shape[0])
    while i < total:
        _claim(keys, vals, mask, np.int64(dst[i]) if i < d_count else np.int64(src[i - d_count]), i)
        i += stride


@cuda.jit
def hash_first_upto(src, nrow, nnz, keys, vals, mask, first, flags):  # pragma: no cover - device
    """`hash_first` over the first ``nnz[0]`` sources, ``nrow[0]`` destinations before them; flags 0
    past them (up to ``src``'s end)."""
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count = nrow[0]
    n_src = nnz[0] if nnz[0] < src.shape[0] else src.shape[0]
    while j < src.shape[0]:
        if j < n_src:
            _first_of(src, d_count, keys, vals, mask, first, flags, j)
        else:
            flags[j] = 0
        j += stride


@cuda.jit(device=True)
def _bounded_sizes(i, nrow, nnz, n_max, newid, sizes):  # pragma: no cover - device
    """The bounded output passes' counts: (``nrow[0]`` destinations, entries to write: those and the first
    ``min(nnz[0], n_max)`` sources); the thread of grid index ``i`` = 0 writes (``nnz[0]``, new nodes:
    ``newid``'s last entry, ``nrow[0]`` + new) into ``sizes``, an ``nnz[0]`` past ``n_max`` (a chain's
    overflow) as it is."""
    d_count = nrow[0]
    n_true = nnz[0]  # read before the write: ``nnz`` may be ``sizes[:1]`` (the same value is written back)
    if i == 0:
        new = newid[newid.shape[0] - 1]
        sizes[0] = n_true
        sizes[1] = new
        sizes[2] = d_count + new
    return d_count, d_count + (n_true if n_true < n_max else n_max)


@cuda.jit
def relabel_out_upto(dst, nrow, src, nnz, first, flags, newid, src_nodes, local,
                     sizes):  # pragma: no cover - device
    """`relabel_out` over the first ``nrow[0]`` destinations and ``nnz[0]`` sources; thread 0 writes
    (edges, new nodes, destinations + new nodes: the next layer's row count) into ``sizes`` (``nnz``
    may be ``sizes[:1]``: the same value is written back)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count, total = _bounded_sizes(i, nrow, nnz, src.shape[0], newid, sizes)
    while i < total:
        _write_out(dst, src, first, flags, newid, src_nodes, local, d_count, i)
        i += stride


@cuda.jit
def edge_tkeys(out_indptr, dst_tkey, edge_tkey):  # pragma: no cover - device
    """Each sampled edge takes the time key of the row that drew it (a warp per row); edges past
    ``edge_tkey``'s end (a chained layer's overflow, seen at its read-back) are dropped."""
    lane = cuda.threadIdx.x
    row = cuda.blockIdx.x
    while row < dst_tkey.shape[0]:
        t = dst_tkey[row]
        j = out_indptr[row] + lane
        end = out_indptr[row + 1]
        if end > edge_tkey.shape[0]:
            end = edge_tkey.shape[0]
        while j < end:
            edge_tkey[j] = t
            j += WARP
        row += cuda.gridDim.x


@cuda.jit(device=True)
def _pair_slot0(v, t, mask):  # pragma: no cover - device
    """Home slot of (node v, time key t): the hash of the CPU kernels' table."""
    return np.int64(mix((np.uint64(v) * GOLDEN) ^ np.uint64(t)) & np.uint64(mask))


@cuda.jit(device=True)
def _pair_at(dst, dst_tkey, src, edge_tkey, d_count, i):  # pragma: no cover - device
    """(node, time key) of entry i of (the first ``d_count`` destinations, sampled sources)."""
    if i < d_count:
        return np.int64(dst[i]), dst_tkey[i]
    return np.int64(src[i - d_count]), edge_tkey[i - d_count]


@cuda.jit
def hash_insert_pairs(dst, dst_tkey, nrow, src, edge_tkey, nnz, keys, vals,
                      mask):  # pragma: no cover - device
    """Claim a slot per distinct (node, time key) pair of the first ``nrow[0]`` destinations and
    ``nnz[0]`` sources (the arrays may be longer: upper bounds; a count past ``src``'s end, a chain's
    overflow, is clamped to it, as by `hash_insert_upto`); keep the smallest index of its occurrences.

    A slot's key is the index of the entry that claimed it (the pair itself is two words, too wide for
    one compare-and-swap); pairs are compared through the (immutable) input arrays."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count = nrow[0]
    total = d_count + (nnz[0] if nnz[0] < src.shape[0] else src.shape[0])
    while i < total:
        v, t = _pair_at(dst, dst_tkey, src, edge_tkey, d_count, i)
        h = _pair_slot0(v, t, mask)
        while True:
            prev = cuda.atomic.cas(keys, h, _EMPTY, np.int64(i))
            if prev == _EMPTY:
                cuda.atomic.min(vals, h, np.int64(i))
                break
            pv, pt = _pair_at(dst, dst_tkey, src, edge_tkey, d_count, prev)
            if pv == v and pt == t:
                cuda.atomic.min(vals, h, np.int64(i))
                break
            h = (h + 1) & mask
        i += stride


@cuda.jit
def hash_first_pairs(dst, dst_tkey, nrow, src, edge_tkey, nnz, keys, vals, mask, first,
                     flags):  # pragma: no cover - device
    """first[j]: smallest index of edge j's (node, time) pair; flags[j] = 1 iff j is that first one
    (0 past the first ``nnz[0]`` sources, up to ``src``'s end)."""
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count = nrow[0]
    n_src = nnz[0]
    while j < src.shape[0]:
        if j < n_src:
            v = np.int64(src[j])
            t = edge_tkey[j]
            h = _pair_slot0(v, t, mask)
            while True:
                pv, pt = _pair_at(dst, dst_tkey, src, edge_tkey, d_count, keys[h])
                if pv == v and pt == t:
                    break
                h = (h + 1) & mask
            f = vals[h]
            first[j] = f
            flags[j] = 1 if f == d_count + j else 0
        else:
            flags[j] = 0
        j += stride


@cuda.jit
def relabel_out_pairs(dst, dst_tkey, nrow, src, edge_tkey, nnz, first, flags, newid, src_nodes, src_tkey,
                      local, sizes):  # pragma: no cover - device
    """`relabel_out_upto` for (node, time key) pairs, the sources' time keys written too."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    d_count, total = _bounded_sizes(i, nrow, nnz, src.shape[0], newid, sizes)
    while i < total:
        _write_out(dst, src, first, flags, newid, src_nodes, local, d_count, i)
        if i < d_count:
            src_tkey[i] = dst_tkey[i]
        elif flags[i - d_count]:
            src_tkey[d_count + newid[i - d_count]] = edge_tkey[i - d_count]
        i += stride


def _hash_table(cap: int, stream: Any, ws: Any = None) -> tuple[Any, Any]:
    """Empty open-addressing table of ``cap`` slots (a power of two): keys -1, values int64 max, filled
    on the device (in ``ws``'s scratch when given)."""
    if ws is None:
        return full(cap, _EMPTY, stream), full(cap, NO_INDEX, stream)
    keys, vals = ws.scratch("hash_keys", cap, np.int64), ws.scratch("hash_vals", cap, np.int64)
    fill_with(keys, _EMPTY, stream)
    fill_with(vals, NO_INDEX, stream)
    return keys, vals


def _capacity(total: int) -> int:
    """Slots of the hash table for ``total`` entries: a power of two >= 2 * total (at least 16)."""
    cap = 16
    while cap < 2 * total:
        cap *= 2
    return cap


def relabel_cuda(dst: Any, src: Any, ws: Any = None) -> tuple[Any, Any]:
    """Local ids through a GPU hash table (as `samplers.kernels.reference.relabel`).

    Parameters
    ----------
    dst : device int64 [D]; src : device int32/int64 [nnz]
    ws : CudaWorkspace, optional
        Scratch for the table, flags and scan, outputs and the count's read-back counted there.

    Returns
    -------
    src_nodes : device int64 [S]; local : device int64 [nnz]
    """
    stream = kernel_stream()
    dst = as_device_ids(dst, stream)
    d_count, nnz = dst.shape[0], src.shape[0]
    total = d_count + nnz
    out = empty if ws is None else ws.output
    local = out(nnz, np.int64)
    if nnz == 0:
        src_nodes = out(d_count, np.int64)
        if d_count:
            copy_into(src_nodes, dst, stream)
        return src_nodes, local
    cap = _capacity(total)
    keys, vals = _hash_table(cap, stream, ws)
    mask = np.int64(cap - 1)
    threads = EDGE_THREADS
    launch(hash_insert, (grid(total, threads), threads), dst, src, keys, vals, mask, stream=stream)
    if ws is None:
        first, flags = empty(nnz, np.int64), empty(nnz, np.int64)
    else:
        first, flags = ws.scratch("first", nnz, np.int64), ws.scratch("flags", nnz, np.int64)
    launch(hash_first, (grid(nnz, threads), threads), src, np.int64(d_count), keys, vals, mask, first,
           flags, stream=stream)
    newid, new_count = exclusive_scan(flags, stream, ws, None if ws is None else
                                      ws.scratch("newid", nnz + 1, np.int64))
    src_nodes = out(d_count + new_count, np.int64)
    launch(relabel_out, (grid(total, threads), threads), dst, src, first, flags, newid, src_nodes, local,
           stream=stream)
    return src_nodes, local


def relabel_bounded(dst: Any, nrow: Any, src: Any, nnz: Any, ws: Any, sizes: Any,
                    num_nodes: int | None = None, repeats: int | None = None) -> tuple[Any, Any]:
    """Relabel the first ``nnz[0]`` of ``src`` after the first ``nrow[0]`` of ``dst`` (counts that stay
    on the device) without reading anything back: outputs at their upper bounds, and the true sizes
    written on the device. Plain chains (`samplers.kernels.cuda.layer`) and typed chains
    (`samplers.kernels.cuda.typed`, once per source type) relabel through it.

    Parameters
    ----------
    dst : device int64 [Db], the first ``nrow[0]`` valid (Db an upper bound); nrow : device int64 [1]
    src : device int32/int64 [M], M >= nnz (an upper bound; the rest unused)
    nnz : device int64 [1], the sources' count (e.g. a layer's ``out_indptr[Db:]``, or ``sizes[:1]``)
    ws : CudaWorkspace
    sizes : device int64 [3], written: (nnz, new sources, ``nrow[0]`` + new)
    num_nodes : int or None
        The nodes' id range N (every id in [0, N)): at most N distinct nodes size the hash table.
    repeats : int or None
        With ``num_nodes``, an upper bound of the rows' repeated entries (entries less distinct nodes):
        ``nrow[0]`` + new <= N + repeats sizes ``src_nodes``; None: ``Db + M``. A count past it is
        written into ``sizes`` as it is, its nodes past the end not written (the caller's overflow).

    Returns
    -------
    src_nodes : device int64 [min(Db + M, N + repeats)], the first ``nrow[0]`` + new valid; local :
    device int64 [M], the first nnz valid
    """
    stream = kernel_stream()
    bound = src.shape[0]
    total = dst.shape[0] + bound
    cap = _capacity(total if num_nodes is None else min(total, num_nodes))
    keys, vals = _hash_table(cap, stream, ws)
    mask = np.int64(cap - 1)
    threads = EDGE_THREADS
    launch(hash_insert_upto, (grid(total, threads), threads), dst, nrow, src, nnz, keys, vals, mask,
           stream=stream)
    first = ws.scratch("first", bound, np.int64)
    flags = ws.scratch("flags", bound, np.int64)
    launch(hash_first_upto, (grid(bound, threads), threads), src, nrow, nnz, keys, vals, mask, first, flags,
           stream=stream)
    newid, _ = exclusive_scan(flags, stream, ws, ws.scratch("newid", bound + 1, np.int64), read_total=False)
    rows_out = total if num_nodes is None or repeats is None else min(total, num_nodes + repeats)
    src_nodes = ws.output(rows_out, np.int64)
    local = ws.output(bound, np.int64)
    launch(relabel_out_upto, (grid(total, threads), threads), dst, nrow, src, nnz, first, flags, newid,
           src_nodes, local, sizes, stream=stream)
    return src_nodes, local


UPTO_KERNELS = {"hash_insert_upto": hash_insert_upto, "hash_first_upto": hash_first_upto,
                "relabel_out_upto": relabel_out_upto}
"""The kernels of `relabel_bounded` by name (their count stays on the device)."""


def _time_keys(times: Any) -> Any:
    """int64 keys of device times (the CPU kernels' `time_keys`): int64 as it is, float64 by its bits.
    The caller folds -0.0 into 0.0 once, on the seeds' times; inner layers inherit folded times."""
    return view_as(times, np.int64) if is_float64(times) else times


def relabel_temporal_cuda(dst: Any, dst_times: Any, out_indptr: Any, src: Any) -> tuple[Any, Any, Any]:
    """Local ids keyed on (node, time) through a GPU hash table (as
    `samplers.kernels.reference.relabel_temporal`): a sampled source takes the time of its row.

    Parameters
    ----------
    dst : device int64 [D]; dst_times : device int64/float64 [D] (no -0.0); out_indptr : device int64
    [D + 1]; src : device int32/int64 [nnz]

    Returns
    -------
    src_nodes : device int64 [S]; src_times : device [S] (dtype of ``dst_times``); local : device int64 [nnz]
    """
    dst = as_device_ids(dst, kernel_stream())
    nnz = src.shape[0]
    edge_tkey = empty(max(nnz, 1), np.int64)
    if nnz:
        edge_time_keys_cuda(out_indptr, dst_times, edge_tkey)
    return relabel_pairs_cuda(dst, dst_times, src, edge_tkey[:nnz] if nnz else edge_tkey)


def edge_time_keys_cuda(out_indptr: Any, dst_times: Any, out: Any) -> Any:
    """Write each sampled edge's time key, the key of the row that drew it, into ``out`` (for
    `relabel_pairs_cuda`, where the sources of one node type come from the rows of several relations).

    Parameters
    ----------
    out_indptr : device int64 [D + 1]; dst_times : device int64/float64 [D] (no -0.0), the rows' times;
    out : device int64 [nnz] (nnz = ``out_indptr[D]``), written in place (a slice of a longer array will do)

    Returns
    -------
    out
    """
    d_count = dst_times.shape[0]
    if d_count and out.shape[0]:
        stream = kernel_stream()
        launch(edge_tkeys, (grid(d_count, 1), WARP), out_indptr, _time_keys(dst_times), out, stream=stream)
    return out


def relabel_pairs_cuda(dst: Any, dst_times: Any, src: Any, edge_tkey: Any) -> tuple[Any, Any, Any]:
    """Local ids keyed on (node, time key) through a GPU hash table, each source's time key given (as
    `samplers.kernels.cpu.relabel_pairs`; `relabel_temporal_cuda` derives the keys from one set of rows).

    Parameters
    ----------
    dst : device int64 [D]; dst_times : device int64/float64 [D] (no -0.0); src : device int32/int64 [nnz];
    edge_tkey : device int64 [nnz], the time key of each source (`edge_time_keys_cuda`)

    Returns
    -------
    src_nodes : device int64 [S]; src_times : device [S] (dtype of ``dst_times``); local : device int64 [nnz]
        First-occurrence order over (destinations, sources), as `relabel_temporal_cuda`.
    """
    stream = kernel_stream()
    dst = as_device_ids(dst, stream)
    d_count, nnz = int(dst.shape[0]), int(src.shape[0])
    sizes = full(3, nnz, stream)  # nnz at sizes[:1], written back unchanged with the other sizes
    return _relabel_pairs(dst, dst_times, full(1, d_count, stream), src, edge_tkey, sizes[:1], None, sizes)


def relabel_pairs_bounded(dst: Any, dst_times: Any, nrow: Any, src: Any, edge_tkey: Any, nnz: Any, ws: Any,
                          sizes: Any) -> tuple[Any, Any, Any]:
    """`relabel_pairs_cuda` over the first ``nrow[0]`` destinations and ``nnz[0]`` sources (counts that
    stay on the device, as `relabel_bounded`): nothing read back, outputs at their upper bounds
    (``src_nodes``, ``src_times`` [Db + M], ``local`` [M]), the true sizes written into ``sizes``
    (device int64 [3]: nnz, new sources, ``nrow[0]`` + new; an nnz past M, a chain's overflow, relabels
    the first M and is written as it is); scratch from ``ws``."""
    return _relabel_pairs(dst, dst_times, nrow, src, edge_tkey, nnz, ws, sizes)


def _relabel_pairs(dst: Any, dst_times: Any, nrow: Any, src: Any, edge_tkey: Any, nnz: Any, ws: Any,
                   sizes: Any) -> tuple[Any, Any, Any]:
    """The pair relabelling of `relabel_pairs_cuda` (exact sizes: ``src_nodes`` sized by the new
    sources' count, read back) and `relabel_pairs_bounded` (``ws`` given: upper bounds, nothing read)."""
    stream = kernel_stream()
    bounded = ws is not None
    d_bound, m = int(dst.shape[0]), int(src.shape[0])
    total = d_bound + m
    dst_tkey = _time_keys(dst_times)
    if m == 0:
        edge_tkey = empty(1, np.int64)
    scratch = ws.scratch if bounded else (lambda name, n, dtype: empty(n, dtype))
    out = ws.output if bounded else empty
    local = out(m, np.int64)
    keys, vals = _hash_table(_capacity(total), stream, ws)
    mask = np.int64(keys.shape[0] - 1)
    threads = EDGE_THREADS
    if total:
        launch(hash_insert_pairs, (grid(total, threads), threads), dst, dst_tkey, nrow, src, edge_tkey, nnz,
               keys, vals, mask, stream=stream)
    first = scratch("first", max(m, 1), np.int64)
    flags = scratch("flags", m, np.int64)
    if m:
        launch(hash_first_pairs, (grid(m, threads), threads), dst, dst_tkey, nrow, src, edge_tkey, nnz, keys,
               vals, mask, first, flags, stream=stream)
    newid, new_count = exclusive_scan(flags, stream, ws, scratch("newid", m + 1, np.int64),
                                      read_total=not bounded)
    size = total if bounded else d_bound + new_count
    src_nodes = out(size, np.int64)
    src_tkey = out(size, np.int64)
    if total:
        launch(relabel_out_pairs, (grid(total, threads), threads), dst, dst_tkey, nrow, src, edge_tkey, nnz,
               first, flags, newid, src_nodes, src_tkey, local, sizes, stream=stream)
    src_times = view_as(src_tkey, np.float64) if is_float64(dst_times) else src_tkey
    return src_nodes, src_times, local

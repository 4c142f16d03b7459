"""The trainer's side of a distributed layer: a frontier split by owner, the owners' replies assembled.

`group_by_owner` groups a frontier's ids by the part that owns each (a stable counting sort: within
a part, frontier order is kept), one array to slice the requests from; `split_by_owner` gives the
same grouping as an order (feature rows). A layer's request to an owner for one or more batches is one
buffer (`pack_request`, `unpack_request`: rows, bounds, keys and settings), and the owner answers with
one buffer (`pack_reply`, `unpack_reply`: per batch its rows' counts, sources and edge ids, one dtype).
`assemble_layer` walks the frontier once, in order, taking each row's edges from its owner's buffer
(each owner's rows come in frontier order, so one cursor per owner finds them), and relabels the
sources chunk by chunk while they are in cache with the sampling core's relabelling kernels
(`samplers.distributed.core`). See docs/architecture.md#partitioned-graphs.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from samplers.distributed.core import KINDS, Workspace, relabel_dst, relabel_src

__all__ = ["RELABEL_CHUNK", "assemble_layer", "group_by_owner", "pack_reply", "pack_request",
           "reply_buffer", "split_by_owner", "unpack_reply", "unpack_request"]

RELABEL_CHUNK = 1 << 13
"""Sampled edges copied into frontier order before the relabelling kernel runs over them (in cache)."""
_INT32_MAX = np.iinfo(np.int32).max


@nb.njit(nogil=True, cache=True)
def _bounds(row_part, num_parts):  # pragma: no cover - compiled
    bounds = np.zeros(num_parts + 1, dtype=np.int64)
    for i in range(row_part.shape[0]):
        bounds[row_part[i] + 1] += 1
    for p in range(num_parts):
        bounds[p + 1] += bounds[p]
    return bounds


@nb.njit(nogil=True, cache=True)
def _group(row_part, num_parts):  # pragma: no cover - compiled
    bounds = _bounds(row_part, num_parts)
    fill = bounds[:-1].copy()
    order = np.empty(row_part.shape[0], dtype=np.int64)
    for i in range(row_part.shape[0]):
        p = row_part[i]
        order[fill[p]] = i
        fill[p] += 1
    return order, bounds


@nb.njit(nogil=True, cache=True)
def _group_ids(ids, row_part, num_parts, out):  # pragma: no cover - compiled
    bounds = _bounds(row_part, num_parts)
    fill = bounds[:-1].copy()
    for i in range(ids.shape[0]):
        p = row_part[i]
        out[fill[p]] = ids[i]
        fill[p] += 1
    return bounds


def split_by_owner(ids: np.ndarray, node_part: np.ndarray,
                   num_parts: int) -> tuple[np.ndarray, dict[int, slice]]:
    """Group ``ids`` (int64 [K]) by owner: the stable order (int64 [K]) that sorts them by part, and each
    part's slice of it (parts with no id left out). ``node_part``: int [N] in [0, num_parts)."""
    order, bounds = _group(node_part[ids], int(num_parts))  # one gather: see group_by_owner
    return order, {p: slice(int(bounds[p]), int(bounds[p + 1])) for p in range(int(num_parts))
                   if bounds[p + 1] > bounds[p]}


def group_by_owner(ids: np.ndarray, node_part: np.ndarray,
                   num_parts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``ids`` (int64 [K]) grouped by owning part, stable; the parts' bounds (int64 [P + 1]: part p's ids
    are ``grouped[bounds[p]:bounds[p + 1]]``); and each id's part (``node_part``'s dtype [K]; for
    `assemble_layer`). ``grouped`` is int32 when ``node_part`` (int [N]) has at most 2^31 - 1 entries,
    else int64: half the bytes of a request."""
    dtype = np.int32 if node_part.shape[0] <= _INT32_MAX else np.int64
    grouped = np.empty(ids.shape[0], dtype=dtype)
    row_part = node_part[ids]  # one gather: numpy overlaps the cache misses a compiled loop here waits on
    bounds = _group_ids(ids, row_part, int(num_parts), grouped)
    return grouped, bounds, row_part


_HEAD = 6  # int64 fields of a request before its arrays: K, fanout, replace, weighted, kind, row bytes


def pack_request(dst: np.ndarray, bounds: np.ndarray, fanout: int, replace: bool, keys: np.ndarray,
                 weighted: bool, kind: str, variate_keys: np.ndarray) -> np.ndarray:
    """One layer's request to an owner for K batches as one uint8 buffer (one argument of one engine
    call): six int64 fields, ``bounds`` (int64 [K + 1]), ``keys`` and ``variate_keys`` (uint64 [K]), then
    ``dst`` (int32 or int64 [D], as given). Arguments as `PartitionOwner.sample_rows`; `unpack_request`
    gives them back.

    Raises
    ------
    ValueError
        ``kind`` not one of `samplers.distributed.core.KINDS`, or ``dst`` neither int32 nor int64.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if dst.dtype not in (np.int32, np.int64):
        raise ValueError(f"dst must be int32 or int64, got {dst.dtype}")
    k = keys.shape[0]
    head = _HEAD + (k + 1) + 2 * k
    out = np.empty(8 * head + dst.nbytes, dtype=np.uint8)
    fields = out[:8 * head].view(np.int64)
    fields[:_HEAD] = (k, fanout, bool(replace), bool(weighted), KINDS.index(kind), dst.dtype.itemsize)
    fields[_HEAD:_HEAD + k + 1] = bounds
    fields[_HEAD + k + 1:_HEAD + 2 * k + 1] = keys.view(np.int64)
    fields[_HEAD + 2 * k + 1:] = variate_keys.view(np.int64)
    out[8 * head:].view(dst.dtype)[:] = dst
    return out


def unpack_request(request: np.ndarray) -> tuple:
    """The arguments of a `pack_request` buffer: ``(dst, bounds, fanout, replace, keys, weighted, kind,
    variate_keys)``, arrays as views of it."""
    fields = request[:8 * _HEAD].view(np.int64)
    k, fanout, replace, weighted, kind, width = (int(x) for x in fields)
    head = _HEAD + (k + 1) + 2 * k
    fields = request[:8 * head].view(np.int64)
    keys = fields[_HEAD + k + 1:_HEAD + 2 * k + 1].view(np.uint64)
    variate_keys = fields[_HEAD + 2 * k + 1:].view(np.uint64)
    dst = request[8 * head:].view(np.int64 if width == 8 else np.int32)
    return (dst, fields[_HEAD:_HEAD + k + 1], fanout, bool(replace), keys, bool(weighted), KINDS[kind],
            variate_keys)


def reply_buffer(rows, nnz, wide: bool) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """An empty `pack_reply` buffer for K batches of ``rows[b]`` rows and ``nnz[b]`` edges (int sequences
    of length K), its header of edge counts written, and each batch's (counts [D_b], sources [nnz_b],
    edge ids [nnz_b]) views into it, to be filled by the caller (int32, or int64 with ``wide``)."""
    k = len(rows)
    rows, nnz = np.asarray(rows, dtype=np.int64).tolist(), np.asarray(nnz, dtype=np.int64).tolist()
    out = np.empty(k + sum(rows) + 2 * sum(nnz), dtype=np.int64 if wide else np.int32)
    out[:k] = nnz
    parts, at = [], k
    for d, m in zip(rows, nnz, strict=True):
        parts.append((out[at:at + d], out[at + d:at + d + m], out[at + d + m:at + d + 2 * m]))
        at += d + 2 * m
    return out, parts


def pack_reply(draws: list[tuple], wide: bool) -> np.ndarray:
    """An owner's answer for K batches' rows as one buffer, in int32 (``wide`` False: every value below
    2^31) or int64: the K batches' edge counts nnz_b, then per batch its rows' counts [D_b], sources
    [nnz_b] and edge ids [nnz_b] (`reply_buffer`). ``draws``: per batch (counts, sources, edge ids, ...)."""
    out, parts = reply_buffer([d[0].shape[0] for d in draws], [d[1].shape[0] for d in draws], wide)
    for (counts, src, eids, *_), (c, s, e) in zip(draws, parts, strict=True):
        c[:], s[:], e[:] = counts, src, eids
    return out


def unpack_reply(reply: np.ndarray, rows: list[int]) -> tuple[list[np.ndarray], list[int]]:
    """The K batches' parts of a `pack_reply` buffer (views: counts, sources, edge ids of each) and
    their edge counts; ``rows``: the K batches' row counts asked of the owner."""
    k = len(rows)
    nnz = reply[:k].tolist()
    out, at = [], k
    for d, m in zip(rows, nnz, strict=True):
        out.append(reply[at:at + d + 2 * m])
        at += d + 2 * m
    return out, nnz


@nb.njit(nogil=True, cache=True)
def _assemble(dst, row_part, rows, replies, weights, has_weights, node_map, base, out_indptr, src, eids,
              w_out, src_nodes, local, chunk):  # pragma: no cover - compiled
    d = dst.shape[0]
    num_parts = rows.shape[0]
    count_at = np.zeros(num_parts, dtype=np.int64)  # each owner's next count, source, edge id and weight
    src_at = rows.copy()
    eid_at = np.empty(num_parts, dtype=np.int64)
    w_at = np.zeros(num_parts, dtype=np.int64)
    for p in range(num_parts):
        eid_at[p] = rows[p] + (replies[p].shape[0] - rows[p]) // 2
    n = relabel_dst(dst, node_map, base, src_nodes)
    lo = 0
    o = 0
    for i in range(d):  # rows in frontier order; each owner's rows come in that order too
        p = row_part[i]
        r = replies[p]
        c = np.int64(r[count_at[p]])
        count_at[p] += 1
        s0 = src_at[p]
        e0 = eid_at[p]
        for j in range(c):
            src[o + j] = r[s0 + j]
            eids[o + j] = r[e0 + j]
        if has_weights:
            w = weights[p]
            w0 = w_at[p]
            for j in range(c):
                w_out[o + j] = w[w0 + j]
            w_at[p] = w0 + c
        src_at[p] = s0 + c
        eid_at[p] = e0 + c
        o += c
        out_indptr[i + 1] = o
        if o - lo >= chunk or i == d - 1:
            n = relabel_src(src, node_map, base, n, src_nodes, local, lo, o)
            lo = o
    return n


def _readonly(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False  # one numba type for every buffer, whether it came by copy or mapped
    return view


def assemble_layer(dst: np.ndarray, row_part: np.ndarray, rows: np.ndarray, replies: list[np.ndarray],
                   weights: list[np.ndarray | None] | None, workspace: Workspace,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """One layer's block arrays from the owners' packed replies, rows in frontier order, relabelled.

    Parameters
    ----------
    dst : int64 [D], the frontier; row_part : int [D], each row's part (`group_by_owner`)
    rows : int64 [P], rows asked of each part (0: not asked)
    replies : P buffers, each one batch's part of a `pack_reply` buffer (`unpack_reply`: counts, sources,
        edge ids; an empty one for parts not asked), int32 or int64
    weights : P float32 [nnz_p] (LABOR's edge weights; empty for parts not asked), or None
    workspace : samplers.kernels.cpu.Workspace over the N nodes (its relabelling map)

    Returns
    -------
    out_indptr : int64 [D + 1]; src_nodes : int64 [S] (the destinations first, then new sources in
    order of first occurrence); local : int64 [nnz]; eids : int64 [nnz]; edge weights : float32 [nnz]
    or None
    """
    if len({r.dtype for r in replies}) > 1:  # a graph above 2^31 edges whose parts differ in width
        replies = [r.astype(np.int64) for r in replies]
    d = dst.shape[0]
    nnz = int(sum(r.shape[0] - k for r, k in zip(replies, rows.tolist(), strict=True)) // 2)
    out_indptr = np.zeros(d + 1, dtype=np.int64)
    src = workspace.src(nnz)
    eids = np.empty(nnz, dtype=np.int64)
    src_nodes = np.empty(d + nnz, dtype=np.int64)
    local = np.empty(nnz, dtype=np.int64)
    has_w = weights is not None
    w_out = np.empty(nnz if has_w else 0, dtype=np.float32)
    w_in = tuple(_readonly(np.ascontiguousarray(w, dtype=np.float32)) for w in weights) if has_w else \
        tuple(_readonly(np.empty(0, dtype=np.float32)) for _ in replies)
    base = workspace.reserve(d + nnz)
    # entries this layer writes lie in [base, base + d + nnz): past them if anything raises part way
    workspace.base = base + d + nnz
    n = _assemble(dst, row_part, rows, tuple(_readonly(r) for r in replies), w_in, has_w,
                  workspace.node_map, base, out_indptr, src, eids, w_out, src_nodes, local, RELABEL_CHUNK)
    workspace.base = base + n
    return out_indptr, src_nodes[:n], local, eids, w_out if has_w else None

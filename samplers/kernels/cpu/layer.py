"""One layer on the CPU: plan, choose and gather in chunks on the helper threads, relabel pipelined.

Passes 2 and 3 (choose, gather) run per chunk of rows (about `CHUNK_EDGES` sampled edges each; a
smaller layer on several threads in about `CHUNKS_PER_THREAD` chunks a thread) on the calling thread
and `graphrl.kernels.parallel_for`'s helper team, which claim chunks dynamically; relabelling is
sequential and pipelined with them: the calling thread relabels the destinations while the helpers
start, then chunk r as soon as it is sampled, and samples chunks itself when it would otherwise wait
(it never waits for a chunk that no helper has claimed). A uniform layer on the calling thread alone
(one thread, or one chunk) runs as one kernel call. Given the next layer's fanout, a uniform or weighted
layer without exclusions plans the next layer as it relabels (each chunk's new sources, the next layer's
rows, in the workspace's spare row scratch): the next layer then starts its helpers at once, with no
planning pass of its own on the calling thread (where, at 2 threads, the helpers would wait for it).
"""

from __future__ import annotations

from collections.abc import Callable

import numba as nb
import numpy as np

from graphrl.kernels import Chunks, engaged
from samplers.kernels.cpu.masks import Masks, sample_rows_masked
from samplers.kernels.cpu.plan import chunk_bounds, plan
from samplers.kernels.cpu.relabel import (
    from_time_keys,
    relabel_dst,
    relabel_dst_planned,
    relabel_pairs_into,
    relabel_src,
    relabel_src_planned,
    time_keys,
)
from samplers.kernels.cpu.threads import parallel_chunks
from samplers.kernels.cpu.uniform import NO_PAIRS, sample_rows
from samplers.kernels.cpu.workspace import Exclusion, NextPlan, Workspace

__all__ = ["CHUNK_EDGES", "sample_block", "sample_layer", "sample_layer_segments"]

CHUNK_EDGES = 1 << 15  # sampled edges per chunk of work (one to a few hundred microseconds)
MIN_CHUNK_EDGES = 1 << 13  # the smallest chunk a layer is cut into for several threads
CHUNKS_PER_THREAD = 4  # chunks per thread a smaller layer aims at (from its bound of d * fanout edges)
_NO_EXCL = np.empty(0, dtype=np.int64)
_NO_ROWS = np.empty((5, 0), dtype=np.int64)


def _chunk_edges(d_count: int, fanout: int, threads: int) -> int:
    """Sampled edges a chunk of a layer aims at: `CHUNK_EDGES`, or for several threads and a layer of
    at most ``d_count * fanout`` edges below ``threads * CHUNKS_PER_THREAD`` chunks of that size,
    that bound over ``threads * CHUNKS_PER_THREAD`` (at least `MIN_CHUNK_EDGES`)."""
    if threads <= 1 or fanout < 0:
        return CHUNK_EDGES
    return int(min(CHUNK_EDGES, max(MIN_CHUNK_EDGES, d_count * fanout // (threads * CHUNKS_PER_THREAD))))


def _gather_args(indices, edge_ids, pairs) -> tuple:
    """The gather's leading kernel arguments (`samplers.kernels.cpu.uniform.gather_edges`)."""
    has_eids = edge_ids is not None
    has_pairs = pairs is not None
    return (indices, edge_ids if has_eids else _NO_EXCL, has_eids, pairs if has_pairs else NO_PAIRS,
            has_pairs)


def _chunk_fn(indices, edge_ids, dst, rows, out_indptr, fanout, replace, key, excl, eids, src,
              masks: Masks | None, row_time, pairs=None) -> Callable[[int, int], None]:
    """The kernel call that samples (chooses and gathers) the rows [lo, hi)."""
    head = (*_gather_args(indices, edge_ids, pairs), dst, *rows, out_indptr, np.int64(fanout), bool(replace),
            np.uint64(key), excl)
    if masks is None:
        args = (*head, eids, src)
        return lambda lo, hi: sample_rows(*args, lo, hi)
    args = (*head, masks.weights, masks.has_weights, masks.times, row_time, masks.has_times, masks.prefix,
            masks.has_prefix, eids, src)
    return lambda lo, hi: sample_rows_masked(*args, lo, hi)


@nb.njit(nogil=True, cache=True)
def _uniform_alone(indices, edge_ids, has_eids, pairs, has_pairs, dst, row_start, row_deg, row_exlo,
                   row_exhi, out_indptr, fanout, replace, key, excl, eids, src, bounds, node_map, base,
                   src_nodes, local, planned, indptr, node_count, has_count, next_fanout, next_rows,
                   next_offs):
    """A uniform layer on the calling thread alone, in one call: the destinations relabelled, then
    each chunk of rows sampled and its sources relabelled (with ``planned``, planning the next layer:
    `relabel_src_planned`); returns the source count."""
    if planned:
        n = relabel_dst_planned(dst, node_map, base, src_nodes, indptr, node_count, has_count, next_fanout,
                                replace, next_rows, next_offs)
    else:
        n = relabel_dst(dst, node_map, base, src_nodes)
    for r in range(bounds.shape[0] - 1):
        lo, hi = bounds[r], bounds[r + 1]
        sample_rows(indices, edge_ids, has_eids, pairs, has_pairs, dst, row_start, row_deg, row_exlo,
                    row_exhi, out_indptr, fanout, replace, key, excl, eids, src, lo, hi)
        if planned:
            n = relabel_src_planned(src, node_map, base, n, src_nodes, local, out_indptr[lo], out_indptr[hi],
                                    indptr, node_count, has_count, next_fanout, replace, next_rows, next_offs)
        else:
            n = relabel_src(src, node_map, base, n, src_nodes, local, out_indptr[lo], out_indptr[hi])
    return n


def _layer_plan(indptr, dst, fanout, replace, excluded, workspace: Workspace, helpers: int,
                masks: Masks | None, row_time, chunk_edges: int) -> tuple:
    """`plan`'s outputs for this layer: taken from the workspace when the layer before planned it and this
    layer excludes nothing (`Workspace.take_plan`; the chunk bounds then from its offsets), else planned
    here (a kept plan dropped: `Workspace.drop_plan`)."""
    counted = masks is not None and masks.has_count
    planned = None
    if excluded is None:  # a plan ahead knows no exclusions: check, then take
        planned = workspace.take_plan(dst, fanout, replace, counted)
    else:
        workspace.drop_plan()
    if planned is None:
        return plan(indptr, dst, fanout, replace, excluded, workspace, helpers, masks, row_time,
                    chunk_edges=chunk_edges)
    d_count = dst.shape[0]
    out_indptr = planned.out_indptr
    rows = workspace.rows(d_count)
    return (out_indptr, rows if counted else rows[:4], _NO_EXCL, int(out_indptr[d_count]),
            chunk_bounds(out_indptr, np.int64(chunk_edges)))


def sample_block(indptr: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray | None, dst: np.ndarray,
                 fanout: int, replace: bool, key: int, excluded: Exclusion | np.ndarray | None,
                 workspace: Workspace, threads: int = 1, masks: Masks | None = None,
                 dst_times: np.ndarray | None = None, *, pairs: np.ndarray | None = None,
                 next_fanout: int | None = None,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Sample one layer and relabel it: the arrays of one block.

    Equal to `samplers.kernels.reference.sample_layer` followed by `~samplers.kernels.reference.relabel`
    (`~samplers.kernels.reference.relabel_temporal` with edge times).

    Parameters
    ----------
    indptr : int64 [N + 1]; indices : int32/int64 [E]; edge_ids : int64 [E] or None (identity)
        The graph in CSC form.
    dst : int64 [D]
        Destination nodes, trusted to be in range.
    fanout : int
        k >= 0, or -1 for every in-edge.
    replace : bool
    key : int
        ``layer_key(seed, call, layer)``.
    excluded : Exclusion, or int64 [X], or None
        Sorted distinct CSC positions never drawn (an `Exclusion` saves preparing them per layer).
    workspace : Workspace
        The sampler's scratch (node map, intermediates).
    threads : int
        Threads that may work on this layer, the caller included (1: the caller alone).
    masks : Masks or None
        Edge weights and/or times: rows follow the masked rules.
    dst_times : [D] or None
        The rows' times (required when ``masks`` has times).
    pairs : int32 [2E] or None
        The (source, edge id) pairs of `samplers._csc.edge_pairs`: the gather reads them in place of
        ``indices`` and ``edge_ids``.
    next_fanout : int or None
        The fanout of the next layer, whose destinations are this layer's ``src_nodes``: uniform and
        weighted layers without exclusions then plan it while relabelling (`relabel_src_planned`) and keep
        the plan in ``workspace``, which the next call takes when given those ``src_nodes`` (the same
        array), ``next_fanout`` and ``replace``; it then skips its planning pass. The blocks are the same.

    Returns
    -------
    out_indptr : int64 [D + 1]; src_nodes : int64 [S]; local : int64 [nnz]; eids : int64 [nnz];
    src_times : [S] in the edge times' dtype, or None without times
        Fresh arrays (``src_nodes`` is a view of a fresh array of D + nnz entries; a planned layer's
        ``out_indptr`` a view of a fresh array of the planning layer's D + nnz + 1).
    """
    helpers = max(int(threads) - 1, 0)
    row_time = None if masks is None else masks.row_times(dst_times)
    d_count = dst.shape[0]
    out_indptr, rows, excl, nnz, bounds = _layer_plan(indptr, dst, fanout, replace, excluded, workspace,
                                                      helpers, masks, row_time,
                                                      _chunk_edges(d_count, fanout, helpers + 1))
    eids = np.empty(nnz, dtype=np.int64)
    src = workspace.src(nnz)
    if nnz:
        fn = _chunk_fn(indices, edge_ids, dst, rows, out_indptr, fanout, replace, key, excl, eids, src, masks,
                       row_time, pairs)
    if masks is not None and masks.has_times:
        if nnz:
            parallel_chunks(lambda i: fn(bounds[i], bounds[i + 1]), bounds.shape[0] - 1, helpers)
        src_nodes = np.empty(d_count + nnz, dtype=np.int64)
        local = np.empty(nnz, dtype=np.int64)
        tkeys = np.empty(d_count + nnz, dtype=np.int64)
        dst_tkey = time_keys(row_time)
        edge_tkey = np.repeat(dst_tkey, np.diff(out_indptr))  # a source takes the time of its row
        n = relabel_pairs_into(dst, dst_tkey, src, edge_tkey, src_nodes, tkeys, local)
        return out_indptr, src_nodes[:n], local, eids, from_time_keys(tkeys[:n], row_time.dtype)
    base = workspace.reserve(d_count + nnz)
    node_map = workspace.node_map
    # Entries this layer writes lie in [base, base + d_count + nnz). If anything raises part way (a
    # helper's error, KeyboardInterrupt between chunks), advance past that whole range so the next call
    # cannot read half-written entries as valid.
    workspace.base = base + d_count + nnz
    counted = masks is not None and masks.has_count
    planning = next_fanout is not None and excluded is None and (masks is None or counted)
    # The next layer's plan: its rows go to the spare row scratch, its offsets to next_offs.
    next_rows = workspace.spare_rows(d_count + nnz) if planning else _NO_ROWS
    next_offs = np.empty(d_count + nnz + 1 if planning else 1, dtype=np.int64)
    plan_args = (indptr, masks.node_count if counted else _NO_EXCL, counted,
                 np.int64(next_fanout if planning else 0), bool(replace), next_rows, next_offs)
    relabel_d, relabel_s, extra = (relabel_dst_planned, relabel_src_planned, plan_args) if planning else \
        (relabel_dst, relabel_src, ())
    if masks is None and (helpers == 0 or bounds.shape[0] == 2):  # the calling thread alone, one call
        src_nodes = np.empty(d_count + nnz, dtype=np.int64)
        local = np.empty(nnz, dtype=np.int64)
        n = _uniform_alone(*_gather_args(indices, edge_ids, pairs), dst, *rows, out_indptr, np.int64(fanout),
                           bool(replace), np.uint64(key), excl, eids, src, bounds, node_map, base, src_nodes,
                           local, planning, plan_args[0], plan_args[1], plan_args[2], plan_args[3],
                           next_rows, next_offs)
    elif not nnz or helpers == 0 or bounds.shape[0] == 2:  # the calling thread alone
        src_nodes = np.empty(d_count + nnz, dtype=np.int64)
        local = np.empty(nnz, dtype=np.int64)
        n = relabel_d(dst, node_map, base, src_nodes, *extra)
        for r in range(bounds.shape[0] - 1 if nnz else 0):
            fn(bounds[r], bounds[r + 1])
            n = relabel_s(src, node_map, base, n, src_nodes, local, out_indptr[bounds[r]],
                          out_indptr[bounds[r + 1]], *extra)
    else:
        task = Chunks(lambda i: fn(bounds[i], bounds[i + 1]), bounds.shape[0] - 1)
        with engaged(task, helpers):  # the helpers start sampling while the destinations are relabelled
            try:
                src_nodes = np.empty(d_count + nnz, dtype=np.int64)
                local = np.empty(nnz, dtype=np.int64)
                n = relabel_d(dst, node_map, base, src_nodes, *extra)
                # Relabel chunk r as soon as it is sampled; sample chunks here rather than wait.
                for r in range(task.num_chunks):
                    task.help_until(r)
                    if task.error is not None:
                        break
                    n = relabel_s(src, node_map, base, n, src_nodes, local, out_indptr[bounds[r]],
                                  out_indptr[bounds[r + 1]], *extra)
            finally:  # no helper writes into the buffers once this returns or raises
                task.finish()
    workspace.base = base + n
    src_nodes = src_nodes[:n]
    if planning:
        workspace.keep_plan(NextPlan(src_nodes, int(next_fanout), bool(replace), counted, next_offs[:n + 1]))
    return out_indptr, src_nodes, local, eids, None


def sample_layer(indptr: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray | None, dst: np.ndarray,
                 fanout: int, replace: bool, key: int, excluded: np.ndarray | None = None,
                 threads: int = 1, weights: np.ndarray | None = None, edge_times: np.ndarray | None = None,
                 dst_times: np.ndarray | None = None, *, prefix: np.ndarray | None = None,
                 positive: np.ndarray | None = None, pairs: np.ndarray | None = None,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample the in-edges of each destination, without relabelling (as `reference.sample_layer`).

    Parameters
    ----------
    indptr : int64 [N + 1]; indices : int32/int64 [E]; edge_ids : int64 [E] or None (identity)
    dst : int64 [D], trusted in range
    fanout : int, k >= 0 or -1
    replace : bool
    key : int, ``layer_key(seed, call, layer)``
    excluded : int64 [X] or None, sorted distinct CSC positions never drawn
    threads : int, threads that may work on it (the caller included)
    weights : float32 [E] or None; edge_times : int64/float64 [E] or None; dst_times : [D] or None
        As in `reference.sample_layer` (CSC order).
    prefix : float64 [E] or None; positive : int64 [N] or None
        Weights without times: ``weight_prefix(indptr, weights)``, computed once by a caller that samples
        the same weights many times. Without them, they are computed for the rows of ``dst`` alone (the
        O(sum of their degrees) pass that the precomputed arrays save).
    pairs : int32 [2E] or None, `samplers._csc.edge_pairs` (as in `sample_block`)

    Returns
    -------
    out_indptr : int64 [D + 1]; src : int64 [nnz] global sources; eids : int64 [nnz] edge ids
    """
    helpers = max(int(threads) - 1, 0)
    masks = None
    if weights is not None or edge_times is not None:
        masks = Masks(weights, edge_times, indptr, rows=dst, prefix=prefix, positive=positive)
    row_time = None if masks is None else masks.row_times(dst_times)
    workspace = Workspace(0, indices.dtype)
    out_indptr, rows, excl, nnz, bounds = plan(indptr, dst, fanout, replace, excluded, workspace, helpers,
                                               masks, row_time, chunk_edges=CHUNK_EDGES)
    eids = np.empty(nnz, dtype=np.int64)
    src = np.empty(nnz, dtype=indices.dtype)
    if nnz:
        fn = _chunk_fn(indices, edge_ids, dst, rows, out_indptr, fanout, replace, key, excl, eids, src, masks,
                       row_time, pairs)
        parallel_chunks(lambda i: fn(bounds[i], bounds[i + 1]), bounds.shape[0] - 1, helpers)
    return out_indptr, src.astype(np.int64, copy=False), eids


def sample_layer_segments(indptr: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray | None,
                          dst: np.ndarray, segments: np.ndarray, fanout: int, replace: bool, keys: np.ndarray,
                          into: Callable[[np.ndarray], list], threads: int = 1, *,
                          pairs: np.ndarray | None = None) -> np.ndarray:
    """Uniform draws of K batches' rows of one layer, each batch with its own key, planned in one pass:
    batch b's edges are those of `sample_layer` of its rows with ``keys[b]`` (no weights, times or
    exclusions), for one call's set-up rather than K.

    Parameters
    ----------
    indptr, indices, edge_ids, fanout, replace, threads, pairs : as `sample_layer`
    dst : int64 [D], trusted in range: the K batches' rows one after another
    segments : int64 [K + 1], batch b's rows are ``dst[segments[b]:segments[b + 1]]``
    keys : uint64 [K], each batch's ``layer_key``
    into : callable
        ``into(nnz)``, given the K batches' edge counts (int64 [K]), gives per batch the two [nnz_b]
        arrays its sources and edge ids are written into (e.g. views of a reply buffer), int64 or int32
        each: int32 edge ids need E and every edge id below 2^31 (they hold CSC positions first),
        int32 sources every node id.

    Returns
    -------
    out_indptr : int64 [D + 1], over all rows: batch b's rows drew ``np.diff(out_indptr)[segments[b]:
    segments[b + 1]]`` edges each.
    """
    helpers = max(int(threads) - 1, 0)
    out_indptr, rows, excl, _, _ = plan(indptr, dst, fanout, replace, None, Workspace(0, indices.dtype),
                                        helpers, None, None, chunk_edges=CHUNK_EDGES)
    ends = out_indptr[segments]
    outs = into(np.diff(ends))
    tasks = []
    for b in range(keys.shape[0]):
        lo, hi = int(segments[b]), int(segments[b + 1])
        first = out_indptr[lo]
        src, eids = outs[b]
        if out_indptr[hi] > first:
            fn = _chunk_fn(indices, edge_ids, dst[lo:hi], tuple(r[lo:hi] for r in rows),
                           out_indptr[lo:hi + 1] - first, fanout, replace, int(keys[b]), excl, eids, src,
                           None, None, pairs)
            tasks.append((fn, hi - lo))
    if helpers == 0 or len(tasks) < 2:
        for fn, d in tasks:
            fn(0, d)
    else:
        parallel_chunks(lambda i: tasks[i][0](0, tasks[i][1]), len(tasks), helpers)
    return out_indptr

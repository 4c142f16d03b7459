"""A chained layer's edges sampled at their bound, nothing read back (`sample_edges_bounded`), and which
layers chain (`bounded_layer`).

A layer of a chain (`samplers.kernels.cuda.layer.DeviceRows` in: rows whose count stays on the device)
sizes its outputs without a size from the host: by ``D * fanout`` (D the rows' upper bound) for uniform
rows (a thread per row up to `THREAD_FANOUT_MAX`, else a warp per row and a thread per edge to gather),
weighted rows (a thread per row) and masked rows by time (a warp per row, with or without replacement);
at fanout -1 (uniform rows a thread per edge; weighted rows, whose zero weights are never kept, and rows
by time a warp per row) by a capacity from the rows' degrees (`full_capacity`, `DegreeBound`), past which the
chain's read-back shows an overflow (`samplers.kernels.cuda.layer.ChainOverflow`) and the caller samples
the call again unchained. The edges are relabelled by `samplers.kernels.cuda.layer.relabel_chained`
(plain chains) or per source type (`samplers.kernels.cuda.relation_chain`).

>>> edges = sample_edges_bounded(graph, rows, -1, False, key, False, None, ws, degrees=DegreeBound.of(indptr))
>>> edges.nnz                       # a device int64 view [1]: read back with the chain's sizes
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from samplers.kernels.cuda.arrays import no_excluded
from samplers.kernels.cuda.graph import CudaGraph
from samplers.kernels.cuda.launch import EDGE_THREADS, ROW_THREADS, WARP, grid, kernel_stream, launch
from samplers.kernels.cuda.plan import plan_masked, plan_rows, plan_rows_weighted, plan_uniform
from samplers.kernels.cuda.scan import exclusive_scan
from samplers.kernels.cuda.temporal import choose_masked
from samplers.kernels.cuda.uniform import choose_uniform, gather, sample_rows, take_all, warp_per_row
from samplers.kernels.cuda.weighted import sample_rows_weighted

if TYPE_CHECKING:
    from samplers.kernels.cuda.layer import DeviceRows

__all__ = ["FULL_EXTRA", "FULL_SLACK", "BoundedEdges", "DegreeBound", "bounded_layer", "full_capacity",
           "row_bound", "sample_edges_bounded", "slack_capacity"]

FULL_SLACK = 2.0
"""A chained layer of fanout -1 sizes its outputs at this many times its rows' expected edges."""
FULL_EXTRA = 1024
"""Edges a chained layer of fanout -1 adds to its capacity (see `full_capacity`)."""


def bounded_layer(graph: CudaGraph, fanout: int, weighted: bool, timed: bool = False) -> bool:
    """Whether a layer's outputs are sized without a size from the host, so that `sample_block_cuda`
    chains it without read-backs: by ``fanout`` per row (uniform rows, with or without replacement;
    weighted rows with prefix sums; masked rows by time (``timed``), with or without replacement), or,
    at fanout -1 (uniform, weighted or masked rows by time), by a capacity from the rows' degrees
    (`full_capacity`) that the chain's read-back checks. Weighted rows without times at fanout >= 0
    need a graph with prefix sums."""
    if timed:
        return True
    if weighted:
        return fanout < 0 or graph.prefix is not None
    return True


@dataclass(frozen=True)
class DegreeBound:
    """A relation's in-degrees as a chained layer of fanout -1 sizes its outputs (`full_capacity`).

    Attributes
    ----------
    max_degree : int; edges : int (E); mean_degree : float (E / N)
    """

    max_degree: int
    edges: int
    mean_degree: float

    @classmethod
    def of(cls, indptr: np.ndarray) -> DegreeBound:
        """The bound of a CSC's host ``indptr`` (int64 [N + 1])."""
        indptr = np.asarray(indptr)
        n = max(int(indptr.shape[0]) - 1, 0)
        edges = int(indptr[-1] - indptr[0]) if n else 0
        return cls(int(np.diff(indptr).max()) if n else 0, edges, edges / max(n, 1))


def row_bound(d_bound: int, max_degree: int, edges: int, repeats: int | None) -> int:
    """The most candidate edges of ``d_bound`` rows of a relation of ``edges`` edges (E) and largest
    in-degree ``max_degree``: ``d_bound * max_degree``, and at most ``E + repeats * max_degree`` where the
    rows are nodes with at most ``repeats`` repeated entries (None: not bounded so, rows by time)."""
    bound = d_bound * max_degree
    return bound if repeats is None else min(bound, edges + repeats * max_degree)


def slack_capacity(bound: int, d_bound: int, per_row: float, slack: float, extra: int) -> int:
    """A chained layer's capacity rule (edges, >= 1): ``min(bound, slack * d_bound * per_row + extra)``,
    ``bound`` its exact upper bound, ``per_row`` the expected edges a row (`full_capacity`,
    `samplers.kernels.cuda.labor.capacity` and ``pi_capacity``)."""
    return max(min(bound, int(slack * d_bound * per_row) + extra), 1)


def full_capacity(d_bound: int, degrees: DegreeBound, distinct_rows: bool, rate: float = 0.0, *,
                  repeats: int | None) -> int:
    """The output capacity of a chained layer of fanout -1 over ``d_bound`` rows (an upper bound of its
    row count): ``min(bound, FULL_SLACK * d_bound * max(mean_degree, rate) + FULL_EXTRA)``, where bound
    is ``d_bound * max_degree``, and at most ``E + repeats * max_degree`` where the rows are nodes
    (``distinct_rows``: without times) and ``repeats``, an upper bound of their repeated entries
    (`samplers.kernels.cuda.layer.DeviceRows.repeats`), is known; None where it is not (``d_bound *
    max_degree`` then; 0 means distinct rows, not unknown: a caller must say which). ``rate`` is the edges
    per row a previous call's layer kept (`CudaWorkspace.edge_rate`). A layer past it overflows
    (`ChainOverflow` at the chain's read)."""
    return slack_capacity(row_bound(d_bound, degrees.max_degree, degrees.edges,
                                    repeats if distinct_rows else None), d_bound,
                          max(degrees.mean_degree, rate), FULL_SLACK, FULL_EXTRA)


@dataclass
class BoundedEdges:
    """A chained layer's sampled edges before relabelling (`sample_edges_bounded`): device arrays at
    their capacity M (``out_indptr`` [Db + 1] and ``eids`` [M] kept by the block, ``src`` [M] the
    workspace's scratch, valid until its next layer), the edge count ``nnz`` a device int64 view [1]
    (past M only after an overflow: a LABOR layer's, or one of fanout -1); ``rate`` the workspace's edge
    rate name of a capacity-sized layer of fanout -1 (`PendingBlock.rate`), else None."""

    out_indptr: Any
    src: Any
    eids: Any
    nnz: Any
    rate: str | None = None


def sample_edges_bounded(graph: CudaGraph, rows: DeviceRows, fanout: int, replace: bool, key: int,
                         weighted: bool, excluded: Any, ws: Any, scratch: str = "src",
                         degrees: DegreeBound | None = None) -> BoundedEdges:
    """One `bounded_layer` layer of a chain sampled, not relabelled, nothing read back: uniform rows (a
    thread per row up to `THREAD_FANOUT_MAX`, else a warp per row; fanout -1 a thread per edge),
    weighted rows (a thread per row), or masked rows by time (a graph built with times and rows with
    times; a warp per row).

    Parameters
    ----------
    graph : CudaGraph; rows : DeviceRows (the chain's rows, Db an upper bound); fanout : int (>= 0, or -1
    for every eligible in-edge); replace : bool; key : int (the layer's key); weighted : bool; excluded :
    device int64 [X] sorted CSC positions or None; ws : CudaWorkspace; scratch : str (the workspace's
    scratch array for the sources); degrees : DegreeBound (fanout -1: the graph's in-degrees) or None

    Returns
    -------
    BoundedEdges
        At the upper bound M = Db * fanout (or 1); at fanout -1 at `full_capacity` (an edge count past
        it raises `ChainOverflow` when the chain is read).

    Raises
    ------
    ValueError
        ``weighted`` on a graph without weights, or fanout -1 without ``degrees``.
    """
    if weighted and not graph.weighted:
        raise ValueError("weighted=True needs a CudaGraph built with weights")
    if fanout < 0 and degrees is None:
        raise ValueError("fanout -1 in a chain needs the graph's DegreeBound (degrees=...) to size its "
                         "outputs")
    if (graph.timed and rows.times is not None) or (weighted and fanout < 0):
        return _masked_edges(graph, rows, fanout, replace, key, weighted, excluded, ws, scratch, degrees)
    if fanout < 0:
        return _all_edges(graph, rows, excluded, ws, scratch, degrees)
    if not weighted and warp_per_row(fanout):
        return _warp_edges(graph, rows, fanout, replace, key, excluded, ws, scratch)
    stream = kernel_stream()
    dst, nrow = rows.ids, rows.count
    d_bound = dst.shape[0]
    bound = d_bound * int(fanout)
    excl = no_excluded() if excluded is None else ws.device_ids(excluded, "excluded")
    counts = ws.scratch("counts", max(d_bound, 1), np.int64)
    config = (grid(d_bound, EDGE_THREADS), EDGE_THREADS)
    if d_bound:
        if weighted:
            launch(plan_rows_weighted, config, graph.positive, graph.weights, graph.indptr, dst, nrow,
                   np.int64(fanout), bool(replace), excl, counts, stream=stream)
        else:
            launch(plan_rows, config, graph.indptr, dst, nrow, np.int64(fanout), bool(replace), excl, counts,
                   stream=stream)
    out_indptr, src, eids = _edge_outputs(graph, counts, d_bound, bound, ws, scratch, stream)
    if bound:
        launch_rows = (grid(d_bound, ROW_THREADS), ROW_THREADS)
        if weighted:
            launch(sample_rows_weighted, launch_rows, graph.indptr, graph.indices, graph.edge_ids,
                   graph.has_eids, graph.weights, graph.prefix, graph.positive, dst, out_indptr,
                   np.int64(fanout), bool(replace), np.uint64(key), excl, src, eids, stream=stream)
        else:
            launch(sample_rows, launch_rows, graph.indptr, graph.indices, graph.edge_ids, graph.has_eids,
                   dst, out_indptr, np.int64(fanout), bool(replace), np.uint64(key), excl, src, eids,
                   stream=stream)
    return BoundedEdges(out_indptr, src, eids, out_indptr[d_bound:])


def _edge_outputs(graph: CudaGraph, counts: Any, d_bound: int, size: int, ws: Any, scratch: str,
                  stream: Any) -> tuple[Any, Any, Any]:
    """A bounded layer's ``out_indptr`` (device int64 [Db + 1], the exclusive scan of its rows' ``counts``
    with the edge count at [Db], not read back), source scratch ``src`` (``graph.indices.dtype``
    [max(size, 1)]: one unused entry when nothing is drawn) and ``eids`` (int64 [size])."""
    out_indptr, _ = exclusive_scan(counts[:d_bound], stream, ws, ws.output(d_bound + 1, np.int64),
                                   read_total=False)
    return out_indptr, ws.scratch(scratch, max(size, 1), graph.indices.dtype), ws.output(size, np.int64)


def _capacity(rows: DeviceRows, ws: Any, scratch: str, degrees: DegreeBound,
              distinct_rows: bool) -> tuple[int, str]:
    """A chained fanout -1 layer's capacity and its edge rate's name (by scratch array and chain slot)."""
    rate = f"{scratch}@{rows.at}"
    return full_capacity(int(rows.ids.shape[0]), degrees, distinct_rows, ws.edge_rate(rate),
                         repeats=rows.repeats), rate


def _all_edges(graph: CudaGraph, rows: DeviceRows, excluded: Any, ws: Any, scratch: str,
               degrees: DegreeBound) -> BoundedEdges:
    """`sample_edges_bounded`'s uniform rows of fanout -1: every non-excluded in-edge, at the capacity."""
    stream = kernel_stream()
    dst, nrow = rows.ids, rows.count
    d_bound = int(dst.shape[0])
    cap, rate = _capacity(rows, ws, scratch, degrees, True)
    excl = no_excluded() if excluded is None else ws.device_ids(excluded, "excluded")
    counts = ws.scratch("counts", max(d_bound, 1), np.int64)
    if d_bound:
        launch(plan_rows, (grid(d_bound, EDGE_THREADS), EDGE_THREADS), graph.indptr, dst, nrow, np.int64(-1),
               False, excl, counts, stream=stream)
    out_indptr, src, eids = _edge_outputs(graph, counts, d_bound, cap, ws, scratch, stream)
    nnz = out_indptr[d_bound:]
    if d_bound:
        launch(take_all, (grid(cap, EDGE_THREADS), EDGE_THREADS), graph.indptr, graph.indices, graph.edge_ids,
               graph.has_eids, dst, out_indptr, excl, nnz, src, eids, stream=stream)
    return BoundedEdges(out_indptr, src, eids, nnz, rate)


def _warp_edges(graph: CudaGraph, rows: DeviceRows, fanout: int, replace: bool, key: int, excluded: Any,
                ws: Any, scratch: str) -> BoundedEdges:
    """`sample_edges_bounded`'s uniform rows above `THREAD_FANOUT_MAX`: a warp per row chooses
    positions (Floyd's subset, or draws), a thread per edge gathers; at the bound ``Db * fanout``."""
    stream = kernel_stream()
    dst, nrow = rows.ids, rows.count
    d_bound = int(dst.shape[0])
    bound = d_bound * int(fanout)
    m = max(d_bound, 1)
    excl = no_excluded() if excluded is None else ws.device_ids(excluded, "excluded")
    counts = ws.scratch("counts", m, np.int64)
    plan = ws.scratch("rows", 4 * m, np.int64)
    row_start, row_deg, row_exlo, row_exhi = (plan[q * m:(q + 1) * m] for q in range(4))
    fanout, replace = np.int64(fanout), bool(replace)
    if d_bound:
        launch(plan_uniform, (grid(d_bound, EDGE_THREADS), EDGE_THREADS), graph.indptr, dst, nrow, fanout,
               replace, excl, row_start, row_deg, row_exlo, row_exhi, counts, stream=stream)
    out_indptr, src, eids = _edge_outputs(graph, counts, d_bound, bound, ws, scratch, stream)
    nnz = out_indptr[d_bound:]
    pos = ws.scratch("pos", max(bound, 1), np.int64)
    if bound:
        launch(choose_uniform, (grid(d_bound, 1), WARP), dst, row_start, row_deg, row_exlo, row_exhi,
               out_indptr, fanout, replace, np.uint64(key), excl, pos, ws.scratch("aux", bound, np.int64),
               stream=stream)
        launch(gather, (grid(bound, EDGE_THREADS), EDGE_THREADS), graph.indices, graph.edge_ids,
               graph.has_eids, pos, nnz, src, eids, stream=stream)
    return BoundedEdges(out_indptr, src, eids, nnz)


def _masked_edges(graph: CudaGraph, rows: DeviceRows, fanout: int, replace: bool, key: int, weighted: bool,
                  excluded: Any, ws: Any, scratch: str, degrees: DegreeBound | None) -> BoundedEdges:
    """`sample_edges_bounded`'s masked rows (a warp per row): by time, or weighted rows without times at
    fanout -1 (every eligible edge: positive weight, not excluded); at ``Db * fanout``, or at fanout -1
    at the capacity (rows by time repeat nodes: the bound is not capped by E)."""
    stream = kernel_stream()
    dst, nrow = rows.ids, rows.count
    timed = graph.timed and rows.times is not None
    dst_times = rows.times if timed else graph.times[:1]
    d_bound = int(dst.shape[0])
    rate = None
    if fanout < 0:
        bound, rate = _capacity(rows, ws, scratch, degrees, not timed)
    else:
        bound = d_bound * int(fanout)
    m = max(d_bound, 1)
    excl = no_excluded() if excluded is None else ws.device_ids(excluded, "excluded")
    counts = ws.scratch("counts", m, np.int64)
    plan = ws.scratch("rows", 5 * m, np.int64)
    row_start, row_raw, row_deg, row_exlo, row_exhi = (plan[q * m:(q + 1) * m] for q in range(5))
    row_blocks = grid(d_bound, 1)
    fanout, weighted, replace = np.int64(fanout), bool(weighted), bool(replace)
    if d_bound:
        launch(plan_masked, (row_blocks, WARP), graph.indptr, dst, nrow, fanout, replace, graph.weights,
               weighted, graph.times, dst_times, timed, excl, row_start, row_raw, row_deg, row_exlo,
               row_exhi, counts, stream=stream)
    out_indptr, src, eids = _edge_outputs(graph, counts, d_bound, bound, ws, scratch, stream)
    nnz = out_indptr[d_bound:]
    pos = ws.scratch("pos", max(bound, 1), np.int64)
    if bound and d_bound:
        launch(choose_masked, (row_blocks, WARP), dst, row_start, row_raw, row_deg, row_exlo, row_exhi,
               out_indptr, fanout, replace, np.uint64(key), graph.weights, weighted, graph.times, dst_times,
               timed, excl, pos, stream=stream)
        launch(gather, (grid(bound, EDGE_THREADS), EDGE_THREADS), graph.indices, graph.edge_ids,
               graph.has_eids, pos, nnz, src, eids, stream=stream)
    return BoundedEdges(out_indptr, src, eids, nnz, rate)

"""One layer on the GPU: plan, scan, choose and gather (`sample_layer_cuda`), then relabel
(`sample_block_cuda`, `sample_block_temporal_cuda`). Each picks the kernels of its rows' rule.

Uniform layers at 0 <= fanout <= `...cuda.uniform.THREAD_FANOUT_MAX` (`...cuda.uniform.warp_per_row`, the
rule of every layer) run a thread per row in two kernels (count, then choose and gather); weighted rows
without times a thread per row likewise; other layers a warp per row for plan and choose, a thread per edge
for the gather. Reading the scan's total back (to size the
outputs) is a layer's one synchronisation before relabelling. Given a sampler's workspace
(`samplers.kernels.cuda.workspace`), layers that `samplers.kernels.cuda.bounded.bounded_layer` admits
skip it: their outputs are sized by an upper bound (``D * fanout``, or at fanout -1 a capacity from the
degrees) and their sizes stay on the device, so successive such layers chain without a read-back
(`DeviceRows` in, `PendingBlock` out: `samplers.kernels.cuda.bounded.sample_edges_bounded`, then
`relabel_chained`, by (node, time) for temporal rows) and `read_blocks` reads all their sizes in one
copy. LABOR layers chain through `samplers.kernels.cuda.labor.labor_edges_bounded`. A layer past its
capacity (fanout -1, LABOR) raises `ChainOverflow` when read; the caller samples the call again
unchained.

>>> rows = start_rows(seeds, ws, layers=3)              # the seeds' count written on the device
>>> first = sample_block_cuda(graph, rows, 10, False, key0, ws=ws)     # a PendingBlock: nothing read
>>> second = sample_block_cuda(graph, first.next_rows, 5, False, key1, ws=ws)
>>> (b1, b2) = read_blocks([first, second], ws)          # one read-back: (indptr, src_nodes, local, eids)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from samplers.kernels.cuda.arrays import as_device_ids, empty, fill_with, full, no_excluded, to_device
from samplers.kernels.cuda.bounded import BoundedEdges, DegreeBound, bounded_layer, sample_edges_bounded
from samplers.kernels.cuda.graph import CudaGraph
from samplers.kernels.cuda.launch import EDGE_THREADS, ROW_THREADS, WARP, grid, kernel_stream, launch
from samplers.kernels.cuda.plan import plan_masked, plan_rows, plan_rows_weighted, plan_uniform
from samplers.kernels.cuda.relabel import (
    edge_time_keys_cuda,
    relabel_bounded,
    relabel_cuda,
    relabel_pairs_bounded,
    relabel_temporal_cuda,
)
from samplers.kernels.cuda.scan import exclusive_scan
from samplers.kernels.cuda.temporal import choose_masked
from samplers.kernels.cuda.uniform import choose_uniform, gather, sample_rows, warp_per_row
from samplers.kernels.cuda.weighted import sample_rows_weighted

__all__ = ["BoundedEdges", "ChainOverflow", "DeviceRows", "PendingBlock", "bounded_layer", "read_blocks",
           "relabel_chained", "relabel_rows", "sample_block_cuda", "sample_block_temporal_cuda",
           "sample_edges_bounded", "sample_layer_cuda", "start_rows"]


class ChainOverflow(RuntimeError):
    """A chained layer kept more edges than its capacity (`PendingBlock.finish`); its chain's blocks are
    incomplete and the call must be sampled again without chaining."""


@dataclass
class DeviceRows:
    """A layer's destination rows on the device, their count not read back.

    Attributes
    ----------
    ids : device int64 [Db]
        The rows; the first ``chain[at]`` are valid (Db is an upper bound).
    chain : device int64 [3 L + 1]
        The sizes of a chain of layers: at ``at`` this layer's row count, then (edges, new sources, next
        row count) written by the layer.
    at : int
    times : device int64/float64 [Db] or None
        Temporal sampling: each row's time (no -0.0).
    repeats : int or None
        An upper bound of the rows' repeated entries (entries less distinct nodes), or None (unknown): a
        plain chain's rows are its seeds, then distinct nodes not among them, so at most ``seeds - 1``.
        Without times the next rows number at most N + repeats (`relabel_chained`'s cap).
    """

    ids: Any
    chain: Any
    at: int
    times: Any = None
    repeats: int | None = None

    @property
    def count(self) -> Any:
        """The row count: a device int64 view [1]."""
        return self.chain[self.at:self.at + 1]


@dataclass
class PendingBlock:
    """A `bounded_layer` layer sampled and relabelled on the device, its sizes not read yet: device
    arrays at their upper bounds (``out_indptr`` [Db + 1], ``src_nodes`` [Db + M] or fewer (capped by
    the graph's nodes: `relabel_chained`), ``local`` [M], ``eids`` [M], M = Db * fanout or 1, or a
    capacity; temporal: ``src_times`` [Db + M], else None), the true sizes in ``rows.chain`` after
    ``rows.at``."""

    out_indptr: Any
    src_nodes: Any
    local: Any
    eids: Any
    rows: DeviceRows
    src_times: Any = None
    rate: str | None = None
    """A capacity-sized layer's (fanout -1) name for its workspace's edge rate (`CudaWorkspace.
    observe_rate`): `read_blocks` records its edges per row there, which later calls size by."""

    @property
    def next_rows(self) -> DeviceRows:
        """The next layer's destinations: this block's sources (and their times), counted on the device."""
        return DeviceRows(self.src_nodes, self.rows.chain, self.rows.at + 3, self.src_times,
                          self.rows.repeats)

    def finish(self, sizes: list[int]) -> tuple[Any, Any, Any, Any, Any]:
        """(out_indptr [D + 1], src_nodes [S], local [nnz], eids [nnz], src_times [S] or None): views at
        the true ``sizes``, (rows D, edges nnz, new sources S - D) as read back.

        Raises
        ------
        ChainOverflow
            nnz exceeds the block's capacity (a chained LABOR or fanout -1 layer's: its rows were not all
            written), or D + new its sources' (``src_nodes``' length: not all written).
        """
        d, nnz, new = sizes
        if nnz > self.local.shape[0]:
            raise ChainOverflow(f"a chained layer kept {nnz} edges, past its capacity of "
                                f"{self.local.shape[0]}: sample the call again without chaining")
        if d + new > self.src_nodes.shape[0]:
            raise ChainOverflow(f"a chained layer has {d + new} sources, past its capacity of "
                                f"{self.src_nodes.shape[0]}: sample the call again without chaining")
        times = None if self.src_times is None else self.src_times[:d + new]
        return self.out_indptr[:d + 1], self.src_nodes[:d + new], self.local[:nnz], self.eids[:nnz], times


def start_rows(ids: Any, ws: Any, layers: int, times: Any = None) -> DeviceRows:
    """Host or device int64 ids [D] as the first rows of a chain of up to ``layers`` layers: on the
    device through ``ws``'s staging buffer, their count written on the device (no read-back).

    Returns
    -------
    DeviceRows
        ``ids`` device int64 [D]; ``chain`` the workspace's device int64 [3 * layers + 1] sizes (reused by
        the next chain of this workspace); ``at`` 0; ``times`` the rows' device times [D] (temporal) or
        None; ``repeats`` D - 1 (the seeds may repeat).
    """
    ids = ws.device_ids(ids)
    chain = ws.scratch("layer_sizes", 3 * layers + 1, np.int64)
    count = int(ids.shape[0])
    fill_with(chain[:1], count, kernel_stream())
    return DeviceRows(ids, chain, 0, times, max(count - 1, 0))


def read_blocks(pending: list[PendingBlock], ws: Any) -> list[tuple[Any, Any, Any, Any, Any]]:
    """The blocks of successive pending layers of one chain, their sizes read back in one copy.

    Returns
    -------
    list of (out_indptr [D + 1], src_nodes [S], local [nnz], eids [nnz], src_times [S] or None)
        Device views of each `PendingBlock`'s arrays at its true sizes, in the order given
        (`PendingBlock.finish`); one counted read-back of the workspace for all of them.

    Raises
    ------
    ChainOverflow
        A layer kept more edges than its capacity (a chained LABOR layer): sample the call again unchained.
    """
    chain, lo = pending[0].rows.chain, pending[0].rows.at
    values = ws.read(chain[lo:pending[-1].rows.at + 4])
    sizes = [values[block.rows.at - lo:block.rows.at - lo + 3] for block in pending]
    for block, (d, nnz, _) in zip(pending, sizes, strict=True):
        if block.rate is not None:  # before an overflow raises: the next call sizes by it
            ws.observe_rate(block.rate, nnz / max(d, 1))
    return [block.finish(size) for block, size in zip(pending, sizes, strict=True)]


def _row_count(d_count: int, ws: Any, stream: Any) -> Any:
    """A device int64 [1] holding ``d_count`` (the plan kernels' row count)."""
    if ws is None:
        return full(1, d_count, stream)
    nrow = ws.scratch("nrow", 1, np.int64)
    fill_with(nrow, d_count, stream)
    return nrow


def sample_layer_cuda(graph: CudaGraph, dst: Any, fanout: int, replace: bool, key: int,
                      weighted: bool = False, excluded: Any = None,
                      dst_times: Any = None, ws: Any = None) -> tuple[Any, Any, Any]:
    """Sample one layer on the GPU (as `samplers.kernels.reference.sample_layer`).

    Parameters
    ----------
    graph : CudaGraph
    dst : device or host int64 array [D]
        Destination nodes, trusted to be in range.
    fanout : int
        k >= 0, or -1 for every in-edge.
    replace : bool
    key : int
        ``layer_key(seed, call, layer)``.
    weighted : bool
        Draw by the graph's weights (the masked rules of the reference).
    excluded : device or host int64 array [X], or None
        Sorted, distinct CSC positions that are never drawn.
    dst_times : device or host array [D] in the dtype of ``graph.times``, or None
        Temporal sampling (needs a graph built with ``times``): the time of each row; a row draws only
        edges of time <= its time (the masked rules of the reference, with or without weights).
    ws : CudaWorkspace or None
        The sampler's workspace: scratch reused across calls, outputs and read-backs counted.

    Returns
    -------
    out_indptr : device int64 [D + 1]; src : device array [nnz] (the graph's index dtype);
    eids : device int64 [nnz]
    """
    stream = kernel_stream()
    dst = as_device_ids(dst, stream)
    d_count = dst.shape[0]
    if weighted and not graph.weighted:
        raise ValueError("weighted=True needs a CudaGraph built with weights")
    timed = dst_times is not None
    if timed:
        if not graph.timed:
            raise ValueError("dst_times needs a CudaGraph built with times")
        if isinstance(dst_times, np.ndarray):
            dst_times = to_device(np.asarray(dst_times, dtype=graph.times.dtype), stream)
        row_time = dst_times if d_count else graph.times[:1]
    else:
        row_time = graph.times[:1]
    masked = weighted or timed
    if excluded is None:
        excl = no_excluded()
    else:
        excl = as_device_ids(excluded, stream) if ws is None else ws.device_ids(excluded, "excluded")
    fanout = np.int64(fanout)
    replace = bool(replace)
    key = np.uint64(key)
    out = empty if ws is None else ws.output
    scratch = (lambda name, n, dtype: empty(n, dtype)) if ws is None else ws.scratch
    counts = scratch("counts", max(d_count, 1), np.int64)
    if weighted and not timed and fanout >= 0:
        # the reference's "weighted rows": plan from the positive counts, then rejection over the prefix
        # sums, a thread per row
        if graph.prefix is None:
            raise ValueError("weighted=True without dst_times needs a CudaGraph built with weights and "
                             "without times (its per-row prefix sums)")
        if d_count:
            launch(plan_rows_weighted, (grid(d_count, EDGE_THREADS), EDGE_THREADS), graph.positive,
                   graph.weights, graph.indptr, dst, _row_count(d_count, ws, stream), fanout, replace, excl,
                   counts, stream=stream)
        out_indptr, nnz = exclusive_scan(counts[:d_count], stream, ws, out(d_count + 1, np.int64))
        src = out(nnz, graph.indices.dtype)
        eids = out(nnz, np.int64)
        if nnz:
            launch(sample_rows_weighted, (grid(d_count, ROW_THREADS), ROW_THREADS), graph.indptr,
                   graph.indices, graph.edge_ids, graph.has_eids, graph.weights, graph.prefix,
                   graph.positive, dst, out_indptr, fanout, replace, key, excl, src, eids, stream=stream)
        return out_indptr, src, eids
    if not masked and not warp_per_row(fanout):
        # plan, scan, then choose and gather in one pass: a thread per row
        if d_count:
            launch(plan_rows, (grid(d_count, EDGE_THREADS), EDGE_THREADS), graph.indptr, dst,
                   _row_count(d_count, ws, stream), fanout, replace, excl, counts, stream=stream)
        out_indptr, nnz = exclusive_scan(counts[:d_count], stream, ws, out(d_count + 1, np.int64))
        src = out(nnz, graph.indices.dtype)
        eids = out(nnz, np.int64)
        if nnz:
            launch(sample_rows, (grid(d_count, ROW_THREADS), ROW_THREADS), graph.indptr, graph.indices,
                   graph.edge_ids, graph.has_eids, dst, out_indptr, fanout, replace, key, excl, src, eids,
                   stream=stream)
        return out_indptr, src, eids
    rows = scratch("rows", 5 * max(d_count, 1), np.int64)
    m = max(d_count, 1)
    row_start, row_raw, row_deg, row_exlo, row_exhi = (rows[q * m:(q + 1) * m] for q in range(5))
    row_blocks = grid(d_count, 1)
    if d_count:
        if masked:
            launch(plan_masked, (row_blocks, WARP), graph.indptr, dst, _row_count(d_count, ws, stream),
                   fanout, replace, graph.weights, bool(weighted), graph.times, row_time, timed, excl,
                   row_start, row_raw, row_deg, row_exlo, row_exhi, counts, stream=stream)
        else:
            launch(plan_uniform, (grid(d_count, EDGE_THREADS), EDGE_THREADS), graph.indptr, dst,
                   _row_count(d_count, ws, stream), fanout, replace, excl, row_start, row_deg, row_exlo,
                   row_exhi, counts, stream=stream)
    out_indptr, nnz = exclusive_scan(counts[:d_count], stream, ws, out(d_count + 1, np.int64))
    pos = scratch("pos", max(nnz, 1), np.int64)
    if nnz:
        if masked:
            launch(choose_masked, (row_blocks, WARP), dst, row_start, row_raw, row_deg, row_exlo, row_exhi,
                   out_indptr, fanout, replace, key, graph.weights, bool(weighted), graph.times, row_time,
                   timed, excl, pos, stream=stream)
        else:
            aux = scratch("aux", nnz, np.int64)
            launch(choose_uniform, (row_blocks, WARP), dst, row_start, row_deg, row_exlo, row_exhi,
                   out_indptr, fanout, replace, key, excl, pos, aux, stream=stream)
    src = out(nnz, graph.indices.dtype)
    eids = out(nnz, np.int64)
    if nnz:
        launch(gather, (grid(nnz, EDGE_THREADS), EDGE_THREADS), graph.indices, graph.edge_ids,
               graph.has_eids, pos, out_indptr[d_count:], src, eids, stream=stream)
    return out_indptr, src, eids


def sample_block_temporal_cuda(graph: CudaGraph, dst: Any, dst_times: Any, fanout: int, replace: bool,
                               key: int, weighted: bool = False,
                               excluded: Any = None) -> tuple[Any, Any, Any, Any, Any]:
    """Sample one temporal layer and relabel it by (node, time) on the GPU (as the CPU kernels'
    `samplers.kernels.cpu.sample_block` with edge times).

    Parameters
    ----------
    graph : CudaGraph (built with ``times``); dst : device int64 [D]; dst_times : device [D] in the
    edge times' dtype (-0.0 folded into 0.0); the rest as `sample_layer_cuda`.

    Returns
    -------
    out_indptr : int64 [D + 1]; src_nodes : int64 [S]; local : int64 [nnz]; eids : int64 [nnz];
    src_times : [S] in the edge times' dtype
        Device arrays (``src_nodes`` starts with ``dst``, ``src_times`` with ``dst_times``).
    """
    stream = kernel_stream()
    dst = as_device_ids(dst, stream)
    if isinstance(dst_times, np.ndarray):
        dst_times = to_device(np.asarray(dst_times, dtype=graph.times.dtype), stream)
    out_indptr, src, eids = sample_layer_cuda(graph, dst, fanout, replace, key, weighted, excluded, dst_times)
    src_nodes, src_times, local = relabel_temporal_cuda(dst, dst_times, out_indptr, src)
    return out_indptr, src_nodes, local, eids, src_times


def sample_block_cuda(graph: CudaGraph, dst: Any, fanout: int, replace: bool, key: int,
                      weighted: bool = False, excluded: Any = None, ws: Any = None,
                      degrees: DegreeBound | None = None) -> tuple[Any, Any, Any, Any] | PendingBlock:
    """Sample one layer and relabel it on the GPU: the device arrays of one block.

    With a workspace ``ws``, `bounded_layer` layers keep their sizes on the device: given `DeviceRows`
    (a chain, `start_rows`), the layer returns a `PendingBlock` without reading anything back
    (`read_blocks` reads a chain's sizes in one copy); given ids, a layer of fanout >= 0 (outputs sized
    by ``D * fanout``) reads its sizes back once. Other layers read back twice (the edges' total, then
    the new sources') and take ids only. Scratch comes from ``ws``, which counts what it does.

    Parameters
    ----------
    degrees : DegreeBound or None
        The graph's in-degrees: a chained layer of fanout -1 sizes its outputs by them (`full_capacity`).

    Returns
    -------
    out_indptr : int64 [D + 1]; src_nodes : int64 [S]; local : int64 [nnz]; eids : int64 [nnz]
        Device arrays (``src_nodes`` starts with ``dst``); or a `PendingBlock` for `DeviceRows`.

    Raises
    ------
    ValueError
        `DeviceRows` for a layer that is not `bounded_layer` (its count must be read first), or of fanout
        -1 without ``degrees``.
    """
    chained = isinstance(dst, DeviceRows)
    timed = chained and dst.times is not None
    if ws is not None and bounded_layer(graph, fanout, weighted, timed) and (chained or fanout >= 0):
        rows = dst if chained else start_rows(dst, ws, 1)
        block = relabel_chained(rows, sample_edges_bounded(graph, rows, fanout, replace, key, weighted,
                                                           excluded, ws, degrees=degrees), ws,
                                num_nodes=int(graph.indptr.shape[0]) - 1)
        return block if chained else read_blocks([block], ws)[0][:4]
    if chained:
        raise ValueError(f"dst: DeviceRows need a workspace and a bounded layer, got fanout={fanout}, "
                         f"weighted={weighted}, ws={ws!r}: read the pending blocks first (read_blocks)")
    dst = as_device_ids(dst, kernel_stream()) if ws is None else ws.device_ids(dst)
    out_indptr, src, eids = sample_layer_cuda(graph, dst, fanout, replace, key, weighted, excluded, ws=ws)
    src_nodes, local = relabel_cuda(dst, src, ws)
    return out_indptr, src_nodes, local, eids


def relabel_chained(rows: DeviceRows, edges: BoundedEdges, ws: Any,
                    num_nodes: int | None = None) -> PendingBlock:
    """A plain chain's layer relabelled on the device (by (node, time) when the rows have times: each
    edge takes its row's time), its sizes (edges, new sources, next rows) written after ``rows.at`` in
    its chain, nothing read back: a `PendingBlock` at the upper bounds of ``edges`` (M = ``edges.src``'s
    length; an edge count past M, a LABOR or fanout -1 overflow, raises `ChainOverflow` when the block is
    read). Given the graph's node count N (``num_nodes``), rows without times and with known
    ``rows.repeats`` cap the sources (the next layer's rows) at N + repeats, however large M is (a layer
    of fanout -1: M its capacity); a count past it (not possible for valid ids) reads as an overflow."""
    tkey = None
    if rows.times is not None:
        tkey = edge_time_keys_cuda(edges.out_indptr, rows.times,
                                   ws.scratch("edge_tkey", edges.src.shape[0], np.int64))
    src_nodes, src_times, local = relabel_rows(rows, edges.src, tkey, edges.nnz, ws,
                                               rows.chain[rows.at + 1:rows.at + 4], num_nodes)
    return PendingBlock(edges.out_indptr, src_nodes, local, edges.eids, rows, src_times, edges.rate)


def relabel_rows(rows: DeviceRows, src: Any, edge_tkey: Any, nnz: Any, ws: Any, sizes: Any,
                 num_nodes: int | None = None) -> tuple[Any, Any, Any]:
    """A chain's sources relabelled after its rows on the device, nothing read back: by (node, time key)
    when the rows have times (`relabel.relabel_pairs_bounded`), else by node (`relabel.relabel_bounded`).
    Plain chains (`relabel_chained`) and typed chains (`samplers.kernels.cuda.relation_chain`, once per
    source type) relabel through it.

    Parameters
    ----------
    rows : DeviceRows; src : device int32/int64 [M] (the first ``nnz[0]`` valid, M an upper bound);
    edge_tkey : device int64 [M], each source's time key (`relabel.edge_time_keys_cuda`), or None
    without times; nnz : device int64 [1]; ws : CudaWorkspace; sizes : device int64 [3], written (nnz,
    new sources, rows + new); num_nodes : int or None (the sources' id range N: without times, caps
    ``src_nodes`` at N + ``rows.repeats`` where known, `relabel.relabel_bounded`)

    Returns
    -------
    (src_nodes [Db + M] or fewer, src_times [Db + M] or None, local [M]): device arrays at their upper
    bounds.
    """
    if rows.times is None:
        src_nodes, local = relabel_bounded(rows.ids, rows.count, src, nnz, ws, sizes, num_nodes, rows.repeats)
        return src_nodes, None, local
    return relabel_pairs_bounded(rows.ids, rows.times, rows.count, src, edge_tkey, nnz, ws, sizes)

"""LABOR layers on the GPU, host side: the order of launches of the kernels of
`samplers.kernels.cuda.labor_kernels` (the CPU's passes, `samplers.kernels.cpu.labor`, with the same
arithmetic, `samplers.kernels.labor_rows`), their sizes and scratch, so the same seed keeps the same edges on
both devices.

Both entry points run one body, `_solve_rows`: each row's c_t and, with importance sampling, the fixed point
over pi (one float64 per unique source of the layer), whose test (the CPU's rule, `labor_rows.converged`, on
the expected source count summed exactly and rounded once, as the CPU's ``math.fsum``) runs on the device: the
iterations after it are launched but their kernels exit at once, nothing read back. `labor_edges_bounded` (a
chained layer, `chains`: a fanout >= 0) launches at most `LABOR_ROUNDS` updates of pi; `labor_layer_cuda` (the
unchained layer) launches them in batches of `LABOR_ROUNDS`, reading the status back once a batch, until
converged (at most `labor_rows.MAX_ITERATIONS`), and reads its edge count back once to size its outputs.

A chained layer keeps each edge with its probability, so D rows keep about k each but up to their whole
degrees. Its outputs are sized by ``min(D * max_degree, LABOR_SLACK * D * k + LABOR_EXTRA)`` (exact when the
first is smaller) and pi by `pi_capacity` (at most the source ids); rows past the capacity are not written,
and a layer whose unique sources pass pi's capacity, or (importance sampling < 0) whose fixed point has not
converged in `LABOR_ROUNDS` updates of pi, reports an edge count past its capacity: the chain's read-back
shows the overflow (`samplers.kernels.cuda.layer.ChainOverflow`), and the caller samples the call again
without chaining (the same edges).

References
----------
Balin and Catalyurek, "Layer-Neighbor Sampling -- Defusing Neighborhood Explosion in GNNs" (NeurIPS 2023);
DGL's ``CSRLaborPick``.

"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrl.memory import Tier
from samplers.kernels import labor_rows
from samplers.kernels.cuda.arrays import as_device_ids, empty, full, no_excluded
from samplers.kernels.cuda.bounded import BoundedEdges, DegreeBound, row_bound, slack_capacity
from samplers.kernels.cuda.exact_sum import SUM_WORDS
from samplers.kernels.cuda.graph import CudaGraph
from samplers.kernels.cuda.labor_kernels import (
    RUNNING,
    labor_claim,
    labor_count,
    labor_decide,
    labor_hop_apply,
    labor_hop_max,
    labor_init,
    labor_owners,
    labor_release,
    labor_solve,
    labor_start,
    labor_take,
    sum_exact,
)
from samplers.kernels.cuda.launch import EDGE_THREADS, ROW_THREADS, grid, kernel_stream, launch
from samplers.kernels.cuda.layer import DeviceRows, PendingBlock
from samplers.kernels.cuda.memory import LABOR_OWNER, CudaMemory
from samplers.kernels.cuda.scan import exclusive_scan
from samplers.kernels.cuda.uniform import gather

__all__ = ["LABOR_EXTRA", "LABOR_ROUNDS", "LABOR_SLACK", "LaborCudaState", "LaborEdges", "LaborPendingBlock",
           "LaborScratchCuda", "capacity", "chains", "labor_edges_bounded", "labor_layer_cuda", "pi_capacity"]

LABOR_SLACK = 2.0
"""A chained LABOR layer's capacity per expected edge (see the module)."""
LABOR_EXTRA = 1024
"""Edges a chained LABOR layer's capacity adds to ``LABOR_SLACK * D * k``."""
LABOR_ROUNDS = 16
"""Updates of pi a chained layer launches for importance_sampling < 0 (`labor_rows.iterations`: weighted, one
iteration more); not converged by then, an overflow (sampled again unchained). Those after it exit at once.
The unchained layer launches its iterations in batches of this many, reading the status back after each."""


class LaborScratchCuda:
    """Device scratch of importance sampling over a source-id space: ``hop`` (float64, zeros) and
    ``owner`` (int64, `labor_rows.NO_OWNER`; during a layer each source's first edge, then its slot in pi),
    both restored after each layer (`labor_release`): ``device`` regions of ``memory`` (owner
    ``"samplers.labor"``, 16 bytes per source id; default a private `CudaMemory`), set on this thread's
    current stream (`LaborCudaState.of` publishes them with its own, once: `CudaMemory.publish`).

    Raises
    ------
    MemoryBudgetError
        The ``device`` tier has no room for them.
    """

    def __init__(self, num_src: int, memory: CudaMemory | None = None) -> None:
        n = max(num_src, 1)
        memory = CudaMemory() if memory is None else memory
        self.memory = memory
        with memory.undo_on_error():
            self.hop = memory.filled(n, np.float64, 0.0, Tier.DEVICE, LABOR_OWNER)[1]
            self.owner = memory.filled(n, np.int64, labor_rows.NO_OWNER, Tier.DEVICE, LABOR_OWNER)[1]
        memory.hold(self)

    def drop_views(self) -> None:
        """Forget the arrays (views of ``memory``'s regions); `CudaMemory.close` calls it."""
        self.hop = self.owner = None


@dataclass
class LaborCudaState:
    """A LABOR relation's state on the GPU (`samplers.modes.LaborMode.prepare`).

    Attributes
    ----------
    scratch : LaborScratchCuda or None
        Importance sampling's scratch (None at LABOR-0).
    max_degree : int
        The relation's largest in-degree (a chained layer's exact capacity bound).
    reach_degree : float
        sum d**2 / sum d over the relation's in-degrees d: the mean in-degree of a row reached through an
        edge (a chained layer's capacity of pi, `pi_capacity`).
    edges : int
        The relation's edges E (distinct rows have at most E candidate edges).
    running : device int64 [1] or None
        `RUNNING`: the status of a chained layer without a fixed point.
    num_src : int
        The relation's source ids (a layer has at most as many unique sources: `pi_capacity`).
    memory : CudaMemory or None
        Where the device arrays' regions came from.
    """

    scratch: LaborScratchCuda | None
    max_degree: int
    reach_degree: float = 0.0
    running: Any = None
    edges: int = 0
    num_src: int = 0
    memory: CudaMemory | None = None

    def __post_init__(self) -> None:
        if self.memory is not None:
            self.memory.hold(self)  # its close drops ``running`` (`drop_views`)

    def drop_views(self) -> None:
        """Forget ``running`` (a view of ``memory``'s region; the scratch drops its own);
        `CudaMemory.close` calls it."""
        self.running = None

    @classmethod
    def of(cls, indptr: np.ndarray, num_src: int, importance_sampling: int,
           memory: CudaMemory | None = None) -> LaborCudaState:
        """The state of a relation of host ``indptr`` (int64 [N + 1]) over ``num_src`` source ids, its
        device arrays (`LaborScratchCuda`, ``running``) in ``device`` regions of ``memory`` (owner
        ``"samplers.labor"``; default a private `CudaMemory`).

        Raises
        ------
        MemoryBudgetError
            The ``device`` tier has no room for them.
        """
        bound = DegreeBound.of(indptr)
        degree = np.diff(np.asarray(indptr)).astype(np.float64)
        memory = CudaMemory() if memory is None else memory
        with memory.undo_on_error():
            scratch = None if importance_sampling == 0 else LaborScratchCuda(num_src, memory)
            running = memory.filled(1, np.int64, RUNNING, Tier.DEVICE, LABOR_OWNER)[1]
        memory.publish(Tier.DEVICE)  # the build's one wait: every stream reads them set
        reach = float(degree @ degree) / bound.edges if bound.edges > 0 else 0.0
        return cls(scratch, bound.max_degree, reach, running, bound.edges, int(num_src), memory)


@dataclass
class LaborEdges(BoundedEdges):
    """`BoundedEdges` of a chained LABOR layer, with its edge weights: device float64 [M] (DGL's
    ``edge_weights``, each row's mean 1) or None; and, with importance sampling, ``fixed_point``: device
    int64 [2], its state (`RUNNING`, `DONE` or `OVERFLOW`) and the iterations it ran (the CPU's count:
    those after convergence launched but not run; no rows: `DONE` and 0; a workspace scratch, valid until
    its next LABOR layer), else None."""

    edge_weights: Any = None
    fixed_point: Any = None


@dataclass
class LaborPendingBlock(PendingBlock):
    """A plain chain's LABOR block (`samplers.kernels.cuda.layer.PendingBlock`) that keeps its edge
    weights (device float64 [M] or None): `finish` appends them at the true edge count."""

    edge_weights: Any = None

    def finish(self, sizes: list[int]) -> tuple:
        """`PendingBlock.finish`'s views, then the edge weights [nnz] or None.

        Raises
        ------
        samplers.kernels.cuda.layer.ChainOverflow
            As `PendingBlock.finish`.
        """
        out = super().finish(sizes)
        return (*out, None if self.edge_weights is None else self.edge_weights[:sizes[1]])


def chains(fanout: int) -> bool:
    """Whether a LABOR layer chains on the device (`labor_edges_bounded`): at a fanout >= 0, whatever its
    importance sampling, weights and edge weights out (the fixed point runs on the device)."""
    return fanout >= 0


def capacity(d_bound: int, fanout: int, max_degree: int) -> int:
    """A chained LABOR layer's output capacity for ``d_bound`` rows (see the module)."""
    return slack_capacity(d_bound * max_degree, d_bound, fanout, LABOR_SLACK, LABOR_EXTRA)


def pi_capacity(d_bound: int, state: LaborCudaState, repeats: int | None) -> int:
    """A chained importance-sampling layer's capacity of pi, one float64 per unique source of its rows:
    ``min(num_src, LABOR_SLACK * d_bound * reach_degree + LABOR_EXTRA, bound)``, the bound of the rows'
    candidate edges ``d_bound * max_degree``, and at most ``E + repeats * max_degree`` where the rows'
    repeated entries are known (``repeats``, `samplers.kernels.cuda.layer.DeviceRows.repeats`; None where
    not, as `...bounded.full_capacity`). So at most 8 bytes a source id (80 MB on a graph of 10M nodes),
    whatever the edges. A layer whose sources pass it overflows (sampled again unchained); one within it
    but past the estimate of its candidate edges does not."""
    estimate = slack_capacity(row_bound(d_bound, state.max_degree, state.edges, repeats), d_bound,
                              state.reach_degree, LABOR_SLACK, LABOR_EXTRA)
    return max(min(estimate, state.num_src), 1)


@dataclass
class _SolvedRows:
    """A layer's rows after `_solve_rows` (device arrays: the arguments of ``labor_count``, ``labor_take``).

    Attributes
    ----------
    cfg : tuple
        The launch configuration of the row kernels (a thread per row).
    excl : device int64 [X]
        The excluded CSC positions (sorted).
    spans : tuple of 4 device int64 [D]
        Each row's CSC span [s, e) and excluded range [a, b).
    raw_off : device int64 [D + 1] or [D]
        Each row's first candidate edge in the layer (the rows' offsets; without a fixed point a stand-in).
    cs : device float64 [D]
        Each row's c_t.
    slots, pi : device arrays
        With importance sampling, each source's slot in pi (the relation's ``owner`` scratch) and pi
        (float64, one per unique source); else stand-ins.
    keep_pi : bool
        The edges keep by pi (importance sampling ran at least one update).
    status : device int64 [2] or [1]
        The fixed point's state (`labor_kernels.RUNNING`, ``DONE``, ``OVERFLOW``) and its iterations run.
    hop : device float64 or None
        The relation's ``hop`` scratch where the rows claimed their sources (restored by `_take`), else None.
    """

    cfg: tuple
    excl: Any
    spans: tuple
    raw_off: Any
    cs: Any
    slots: Any
    pi: Any
    keep_pi: bool
    status: Any
    hop: Any


def _solve_rows(graph: CudaGraph, dst: Any, nrow: Any, fanout: int, excl: Any,
                hop_owner: LaborScratchCuda | None, importance_sampling: int,
                scratch: Callable[[str, int, Any], Any], ws: Any, pi_cap: int, capped: bool,
                running: Any) -> _SolvedRows:
    """The one body of both LABOR layers: the first ``nrow[0]`` rows of ``dst``'s spans and c_t and, with
    importance sampling, the fixed point over pi, its test on the device (see the module).

    ``scratch(name, n, dtype)`` gives the arrays (a workspace's scratch, or fresh ones), ``ws`` the scans'
    workspace (or None); pi holds ``pi_cap`` sources (past it: `labor_kernels.OVERFLOW`; the count then
    writes an overflow). With ``capped`` at most `LABOR_ROUNDS` updates are launched, nothing read back;
    without, batches of `LABOR_ROUNDS` iterations until the status, read back after each batch, is no longer
    running. ``running``: a device int64 [1] `RUNNING`
    (the status of a layer without a fixed point), or None to make one where needed.

    Raises
    ------
    ValueError
        Importance sampling without a `LaborScratchCuda` (``hop_owner`` None).
    """
    if importance_sampling and hop_owner is None:
        raise ValueError("importance sampling needs a LaborScratchCuda over the source ids")
    stream = kernel_stream()
    d_bound = int(dst.shape[0])
    m = max(d_bound, 1)
    plan = scratch("rows", 5 * m, np.int64)
    row_s, row_e, row_a, row_b, raw = (plan[q * m:q * m + d_bound] for q in range(5))
    cs = scratch("labor_c", m, np.float64)[:d_bound]
    cfg = (grid(d_bound, ROW_THREADS), ROW_THREADS)
    has_w = bool(graph.weighted)
    w, fanout = graph.weights, np.int64(fanout)
    # without pi: raw stands in for its offsets and the sources' slots, cs for pi and hop
    raw_off, slots, pi, has_pi, hop = raw, raw, cs, False, cs
    rounds = labor_rows.iterations(importance_sampling, has_w, LABOR_ROUNDS if capped else -1)
    status = scratch("labor_status", 2, np.int64)
    prev, acc = scratch("labor_prev", 1, np.float64), scratch("labor_acc", SUM_WORDS, np.int64)
    if rounds and not d_bound:  # no rows: the fixed point is done, nothing else runs
        launch(labor_start, (1, 1), raw, raw, np.int64(0), nrow, status, prev, acc, stream=stream)
    if d_bound:
        launch(labor_init, cfg, graph.indptr, dst, nrow, fanout, excl, w, has_w, row_s, row_e, row_a, row_b,
               raw, cs, stream=stream)
    if rounds and d_bound:
        raw_off, _ = exclusive_scan(raw, stream, ws, scratch("labor_raw_off", d_bound + 1, np.int64),
                                    read_total=False)
        slot_off, cap = raw_off, np.iinfo(np.int64).max
        if importance_sampling:
            hop, slots = hop_owner.hop, hop_owner.owner
            owned = scratch("labor_owned", m, np.int64)[:d_bound]
            edge_rows = (graph.indices, w, has_w, excl, row_s, row_e, row_a, row_b, raw_off, slots)
            launch(labor_claim, cfg, *edge_rows, stream=stream)
            launch(labor_owners, cfg, *edge_rows, owned, False, stream=stream)
            slot_off = scratch("labor_slot_off", d_bound + 1, np.int64)
            exclusive_scan(owned, stream, ws, slot_off, read_total=False)
            launch(labor_owners, cfg, *edge_rows, slot_off, True, stream=stream)
            cap = max(pi_cap, 1)
            pi = scratch("labor_pi", cap, np.float64)
        contrib = scratch("labor_contrib", m, np.float64)[:d_bound]
        launch(labor_start, (1, 1), raw_off, slot_off, np.int64(cap), nrow, status, prev, acc, stream=stream)
        it = 0
        while rounds < 0 or it < rounds:
            update = not has_w or it > 0
            if update:
                launch(labor_hop_max, cfg, graph.indices, w, has_w, has_w and it == 1, excl, row_s, row_e,
                       row_a, row_b, raw_off, cs, hop, slots, status, stream=stream)
                launch(labor_hop_apply, cfg, graph.indices, w, has_w, excl, row_s, row_e, row_a, row_b,
                       slot_off, hop, slots, pi, not has_pi, contrib, status, stream=stream)
                has_pi = True
            launch(labor_solve, cfg, fanout, graph.indices, slots, w, has_w, pi, has_pi, excl, row_s, row_e,
                   row_a, row_b, raw_off, cs, status, stream=stream)
            if update:
                launch(sum_exact, cfg, contrib, status, acc, stream=stream)
                launch(labor_decide, (1, 1), acc, status, prev, np.int64(it), stream=stream)
            it += 1
            if rounds < 0 and it % LABOR_ROUNDS == 0 and _read_first(status, stream) != RUNNING:
                break
    if not rounds:
        status = full(1, RUNNING, stream) if running is None else running
    return _SolvedRows(cfg, excl, (row_s, row_e, row_a, row_b), raw_off, cs, slots, pi,
                       has_pi and importance_sampling != 0, status,
                       hop if importance_sampling and d_bound else None)


def _read_first(arr: Any, stream: Any) -> int:
    """arr[0] of a device int64 array, read back (one copy, one wait on ``stream``)."""
    if isinstance(arr, torch.Tensor):
        return int(arr[0])  # torch waits for its current stream, the kernels' stream
    host = arr[:1].copy_to_host(stream=stream)
    if not isinstance(stream, int):
        stream.synchronize()
    return int(host[0])


def _count(graph: CudaGraph, rows: _SolvedRows, vkey: np.uint64, counts: Any, capped: bool, cap: int) -> None:
    """Launch ``labor_count``: each row's kept count into ``counts`` (with ``capped``, a fixed point still
    running after the launched iterations writes an overflow of ``cap``)."""
    if counts.shape[0]:
        launch(labor_count, rows.cfg, graph.indices, rows.slots, graph.weights, bool(graph.weighted), rows.pi,
               rows.keep_pi, *_excl_spans(rows), rows.raw_off, rows.cs, vkey, counts, rows.status, capped,
               np.int64(cap), stream=kernel_stream())


def _take(graph: CudaGraph, rows: _SolvedRows, vkey: np.uint64, out_indptr: Any, pos: Any, ew: Any,
          want_weights: bool, nnz: Any, src: Any, eids: Any) -> None:
    """Launch ``labor_take`` (the kept positions into ``pos``, edge weights into ``ew``), restore the
    relation's scratch (``labor_release``) and gather the first ``nnz[0]`` positions' sources and edge ids
    (at most ``pos``'s length) into ``src`` and ``eids``."""
    stream = kernel_stream()
    if rows.cs.shape[0]:
        launch(labor_take, rows.cfg, graph.indices, rows.slots, graph.weights, bool(graph.weighted), rows.pi,
               rows.keep_pi, *_excl_spans(rows), rows.raw_off, rows.cs, vkey, out_indptr, pos, ew,
               bool(want_weights), stream=stream)
    if rows.hop is not None:
        launch(labor_release, rows.cfg, graph.indices, *rows.spans[:2], rows.hop, rows.slots, stream=stream)
    if rows.cs.shape[0] and pos.shape[0]:
        launch(gather, (grid(int(pos.shape[0]), EDGE_THREADS), EDGE_THREADS), graph.indices, graph.edge_ids,
               graph.has_eids, pos, nnz, src, eids, stream=stream)


def _excl_spans(rows: _SolvedRows) -> tuple:
    """(excl, row_s, row_e, row_a, row_b): the kernels' row arguments."""
    return (rows.excl, *rows.spans)


def labor_edges_bounded(graph: CudaGraph, rows: DeviceRows, fanout: int, vkey: int, excluded: Any, ws: Any,
                        state: LaborCudaState, importance_sampling: int = 0, want_weights: bool = False,
                        scratch: str = "src") -> LaborEdges:
    """One LABOR layer (`chains`) sampled on the device, not relabelled, nothing read back.

    The rows' c_t and, with importance sampling, the fixed point over pi run on the device (`_solve_rows`, see
    the module): each iteration's kernels exit at once after the device's test (``labor_decide``, the CPU's
    rule) has ended it, nothing read back, so the blocks and edge weights equal the unchained path's and the
    CPU's. Scratch: pi is one float64 per unique source of the rows (`pi_capacity`: at most num_src), beside
    per-row arrays (about 13 words a row) and the relation's ``hop``/``owner`` over its source ids.

    Parameters
    ----------
    graph : CudaGraph
        Its weights, when built with them, are LABOR's A.
    rows : DeviceRows
        The chain's rows: ids device int64 [Db] (an upper bound), their count on the device.
    fanout : int
        k >= 0.
    vkey : int
        The layer's variate key.
    excluded : device int64 [X] or None
        Sorted excluded CSC positions.
    ws : CudaWorkspace
    state : LaborCudaState
    importance_sampling : int
        i of LABOR-i (< 0: until converged, at most `LABOR_ROUNDS` updates).
    want_weights : bool
        Edge weights out.
    scratch : str
        The workspace's scratch array for the sources.

    Returns
    -------
    LaborEdges
        At the capacity M (`capacity`); its edge count, read back with the chain's sizes, may exceed M
        (an overflow: `samplers.kernels.cuda.layer.ChainOverflow` when the chain is read), as it does
        where the rows' unique sources pass `pi_capacity` or, iterating until convergence, the fixed point
        has not converged in `LABOR_ROUNDS` updates of pi. ``fixed_point`` (importance sampling) holds the
        fixed point's state and the iterations it ran.

    Raises
    ------
    ValueError
        Importance sampling without a `LaborScratchCuda` (``state.scratch`` None).
    """
    d_bound = int(rows.ids.shape[0])
    cap = capacity(d_bound, fanout, state.max_degree)
    excl = no_excluded() if excluded is None else ws.device_ids(excluded, "excluded")
    pi_cap = pi_capacity(d_bound, state, rows.repeats) if importance_sampling else 1
    solved = _solve_rows(graph, rows.ids, rows.count, fanout, excl, state.scratch, importance_sampling,
                         ws.scratch, ws, pi_cap, True, state.running)
    key = np.uint64(vkey)
    counts = ws.scratch("counts", max(d_bound, 1), np.int64)[:d_bound]
    _count(graph, solved, key, counts, importance_sampling < 0, cap)
    out_indptr, _ = exclusive_scan(counts, kernel_stream(), ws, ws.output(d_bound + 1, np.int64),
                                   read_total=False)
    nnz = out_indptr[d_bound:]
    src = ws.scratch(scratch, cap, graph.indices.dtype)
    eids = ws.output(cap, np.int64)
    ew = ws.output(cap, np.float64) if want_weights else ws.scratch("labor_ew", 1, np.float64)
    _take(graph, solved, key, out_indptr, ws.scratch("pos", cap, np.int64), ew, want_weights, nnz, src, eids)
    return LaborEdges(out_indptr, src, eids, nnz, edge_weights=ew if want_weights else None,
                      fixed_point=solved.status if importance_sampling else None)


def labor_layer_cuda(graph: CudaGraph, dst: Any, fanout: int, vkey: int, excluded: Any,
                     importance_sampling: int, want_weights: bool,
                     scratch: LaborScratchCuda | None) -> tuple[Any, Any, Any, Any]:
    """One LABOR layer of one relation on the GPU (as `samplers.kernels.cpu.labor.labor_layer`), unchained:
    the body of `labor_edges_bounded` (`_solve_rows`), its fixed point's status read back once per
    `LABOR_ROUNDS` iterations where it iterates until convergence, and its edge count read back once to size
    the outputs exactly.

    Parameters
    ----------
    graph : CudaGraph
        Its weights, when built with them, are LABOR's A.
    dst : device (or host) int64 [D]
        The layer's destinations.
    fanout : int
        k (-1: every eligible edge).
    vkey : int
        The layer's variate key.
    excluded : device int64 [X] or None
        Sorted excluded CSC positions.
    importance_sampling : int
        i of LABOR-i (< 0: until converged, at most `labor_rows.MAX_ITERATIONS` iterations).
    want_weights : bool
        Edge weights out.
    scratch : LaborScratchCuda or None
        Importance sampling's scratch over the source ids (pi takes one float64 a source id).

    Returns
    -------
    out_indptr : device int64 [D + 1]
    src : device [nnz], the indices' dtype
    eids : device int64 [nnz]
    edge_weights : device float64 [nnz] or None

    Raises
    ------
    ValueError
        Importance sampling without ``scratch``.
    """
    stream = kernel_stream()
    dst = as_device_ids(dst, stream)
    d_count = int(dst.shape[0])
    excl = no_excluded() if excluded is None else as_device_ids(excluded, stream)
    pi_cap = int(scratch.owner.shape[0]) if scratch is not None else 1  # one slot a source id: never past it
    solved = _solve_rows(graph, dst, full(1, d_count, stream), fanout, excl, scratch, importance_sampling,
                         lambda name, n, dtype: empty(n, dtype), None, pi_cap, False, None)
    key = np.uint64(vkey)
    counts = empty(max(d_count, 1), np.int64)[:d_count]
    _count(graph, solved, key, counts, False, 0)
    out_indptr, nnz = exclusive_scan(counts, stream)
    pos = empty(max(nnz, 1), np.int64)
    ew = empty(max(nnz, 1) if want_weights else 1, np.float64)
    src = empty(nnz, graph.indices.dtype)
    eids = empty(nnz, np.int64)
    _take(graph, solved, key, out_indptr, pos, ew, want_weights, out_indptr[d_count:], src, eids)
    return out_indptr, src, eids, (ew[:nnz] if want_weights else None)

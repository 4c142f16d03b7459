"""LABOR rows on the GPU, a thread per row: the passes of `samplers.kernels.cpu.labor` with the same
arithmetic (`samplers.kernels.labor_rows`), so the same seed keeps the same edges on both devices.

Importance sampling takes the max of c_t per source with an atomic max, marks each source's first
edge with an atomic min (both order-independent), and reads the expected source count back once per
iteration (its fixed point decides on the host, as on the CPU).

LABOR-0 without weights chains on the device (`labor_edges_bounded`, `chains`): a row keeps each edge
with probability min(1, k / d), so a layer of D rows keeps min(k, d) per row in expectation, but up to
its whole degree. Its outputs are sized by a capacity, ``min(D * max_degree, LABOR_SLACK * D * k +
LABOR_EXTRA)`` (exact when the first is smaller); rows past it are not written and the chain's read-back
shows the overflow (`samplers.kernels.cuda.layer.ChainOverflow`), after which the caller samples the
call again without chaining (the same edges).
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from samplers.kernels import labor_rows
from samplers.kernels.cuda import rng
from samplers.kernels.cuda.arrays import as_device_ids, empty, full, no_excluded
from samplers.kernels.cuda.graph import CudaGraph
from samplers.kernels.cuda.launch import EDGE_THREADS, ROW_THREADS, grid, kernel_stream, launch
from samplers.kernels.cuda.layer import BoundedEdges, DeviceRows
from samplers.kernels.cuda.rows import row_span
from samplers.kernels.cuda.scan import exclusive_scan
from samplers.kernels.cuda.uniform import gather

__all__ = ["KERNELS", "LABOR_EXTRA", "LABOR_SLACK", "LaborCudaState", "LaborScratchCuda", "chains",
           "labor_edges_bounded", "labor_layer_cuda"]

LABOR_SLACK = 2.0
"""A chained LABOR layer's capacity per expected edge (see the module)."""
LABOR_EXTRA = 1024
"""Edges a chained LABOR layer's capacity adds to ``LABOR_SLACK * D * k``."""

@cuda.jit(device=True)
def _raise_hop_atomic(hop, owner, u, ct, f):  # pragma: no cover - device
    """`labor_rows.raise_hop` with atomics: rows of the layer run concurrently and share sources."""
    cuda.atomic.max(hop, u, ct)
    cuda.atomic.min(owner, u, f)


_ROWS = labor_rows.compile_for(cuda.jit(device=True), types.SimpleNamespace(
    row_state=rng.row_state, draw=rng.draw, unit=rng.unit), raise_hop=_raise_hop_atomic)
_start_c = _ROWS.start_c
_solve_c = _ROWS.solve_c
_count_kept = _ROWS.count_kept
_take_kept = _ROWS.take_kept
_hop_max_row = _ROWS.hop_max_row
_hop_apply_row = _ROWS.hop_apply_row
_hop_reset_row = _ROWS.hop_reset_row


@cuda.jit
def labor_init(indptr, dst, nrow, fanout, excl, weights, has_w, row_s, row_e, row_a, row_b, raw,
               cs):  # pragma: no cover - device
    """Each of the first ``nrow[0]`` rows' span and starting c_t; the rest of ``dst`` (an upper bound)
    an empty row with c_t = 0 (nothing kept)."""
    i = cuda.grid(1)
    n_excl = excl.shape[0]
    n = nrow[0]
    while i < dst.shape[0]:
        if i >= n:
            row_s[i] = 0
            row_e[i] = 0
            row_a[i] = 0
            row_b[i] = 0
            raw[i] = 0
            cs[i] = 0.0
            i += cuda.gridsize(1)
            continue
        s, e, a, b = row_span(indptr, excl, n_excl, dst[i])
        row_s[i] = s
        row_e[i] = e
        row_a[i] = a
        row_b[i] = b
        raw[i] = e - s
        cs[i] = _start_c(fanout, weights, has_w, excl, a, b, s, e)
        i += cuda.gridsize(1)


@cuda.jit
def labor_hop_max(indices, weights, has_w, use_w, excl, row_s, row_e, row_a, row_b, raw_off, cs, hop,
                  owner):  # pragma: no cover - device
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        _hop_max_row(indices, weights, has_w, use_w, excl, row_a[i], row_b[i], row_s[i], row_e[i], raw_off[i],
                     cs[i], hop, owner)
        i += cuda.gridsize(1)


@cuda.jit
def labor_hop_apply(indices, weights, has_w, excl, row_s, row_e, row_a, row_b, raw_off, hop, owner, pi, first,
                    contrib):  # pragma: no cover - device
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        contrib[i] = _hop_apply_row(indices, weights, has_w, excl, row_a[i], row_b[i], row_s[i], row_e[i],
                                    raw_off[i], hop, owner, pi, first)
        i += cuda.gridsize(1)


@cuda.jit
def labor_hop_reset(indices, row_s, row_e, hop, owner):  # pragma: no cover - device
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        _hop_reset_row(indices, row_s[i], row_e[i], hop, owner)
        i += cuda.gridsize(1)


@cuda.jit
def labor_solve(fanout, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off,
                cs):  # pragma: no cover - device
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        if cs[i] > 0:
            cs[i] = _solve_c(cs[i], fanout, weights, has_w, pi, has_pi, raw_off[i], excl, row_a[i], row_b[i],
                             row_s[i], row_e[i])
        i += cuda.gridsize(1)


@cuda.jit
def labor_count(indices, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off, cs, vkey,
                counts):  # pragma: no cover - device
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        n = 0
        if cs[i] > 0:
            n = _count_kept(indices, weights, has_w, pi, has_pi, raw_off[i], excl, row_a[i], row_b[i],
                            row_s[i], row_e[i], cs[i], vkey)
        counts[i] = n
        i += cuda.gridsize(1)


@cuda.jit
def labor_take(indices, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off, cs, vkey,
               out_indptr, pos, ew, want_w):  # pragma: no cover - device
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        o = out_indptr[i]
        n = out_indptr[i + 1] - o
        if n > 0 and o + n > pos.shape[0]:  # past a chain's capacity (an overflow, sampled again): safe
            for x in range(o, pos.shape[0]):  # positions for the gather (o + n is past the end)
                pos[x] = 0
        elif n > 0:
            _take_kept(indices, weights, has_w, pi, has_pi, raw_off[i], excl, row_a[i], row_b[i], row_s[i],
                       row_e[i], cs[i], vkey, pos, ew, want_w, o, n)
        i += cuda.gridsize(1)


KERNELS = {"labor_init": labor_init, "labor_hop_max": labor_hop_max, "labor_hop_apply": labor_hop_apply,
           "labor_hop_reset": labor_hop_reset, "labor_solve": labor_solve, "labor_count": labor_count,
           "labor_take": labor_take}
"""The LABOR kernels by name."""


class LaborScratchCuda:
    """Device scratch of importance sampling over a source-id space (see `samplers.kernels.cpu.labor`)."""

    def __init__(self, num_src: int) -> None:
        n = max(num_src, 1)
        self.hop = cuda.to_device(np.zeros(n, dtype=np.float64))
        self.owner = cuda.to_device(np.full(n, labor_rows.NO_OWNER, dtype=np.int64))


@dataclass
class LaborCudaState:
    """A LABOR relation's state on the GPU (`samplers.modes.LaborMode.prepare`).

    Attributes
    ----------
    scratch : LaborScratchCuda or None
        Importance sampling's scratch (None at LABOR-0).
    max_degree : int
        The relation's largest in-degree (a chained layer's exact capacity bound).
    """

    scratch: LaborScratchCuda | None
    max_degree: int


def chains(importance_sampling: int, weighted: bool, want_weights: bool, fanout: int) -> bool:
    """Whether a LABOR layer chains on the device (`labor_edges_bounded`): LABOR-0 without weights and
    without edge weights out, at a fanout >= 0 (its rows' keep probabilities need nothing from the host)."""
    return importance_sampling == 0 and not weighted and not want_weights and fanout >= 0


def capacity(d_bound: int, fanout: int, max_degree: int) -> int:
    """A chained LABOR layer's output capacity for ``d_bound`` rows (see the module)."""
    return max(min(d_bound * max_degree, int(LABOR_SLACK * d_bound * fanout) + LABOR_EXTRA), 1)


def labor_edges_bounded(graph: CudaGraph, rows: DeviceRows, fanout: int, vkey: int, excluded: Any, ws: Any,
                        max_degree: int, scratch: str = "src") -> BoundedEdges:
    """One LABOR-0 layer (`chains`) sampled on the device, not relabelled, nothing read back.

    Parameters
    ----------
    graph : CudaGraph; rows : DeviceRows (the chain's rows); fanout : int (k >= 0); vkey : int (the
    layer's variate key); excluded : device int64 [X] sorted CSC positions or None; ws : CudaWorkspace;
    max_degree : int (the graph's largest in-degree); scratch : str (the sources' scratch array)

    Returns
    -------
    BoundedEdges
        At the capacity M (`capacity`); its edge count, read back with the chain's sizes, may exceed M
        (an overflow: `samplers.kernels.cuda.layer.ChainOverflow` when the chain is read).
    """
    stream = kernel_stream()
    dst, nrow = rows.ids, rows.count
    d_bound = int(dst.shape[0])
    m = max(d_bound, 1)
    cap = capacity(d_bound, fanout, max_degree)
    excl = no_excluded() if excluded is None else ws.device_ids(excluded, "excluded")
    plan = ws.scratch("rows", 5 * m, np.int64)
    row_s, row_e, row_a, row_b, raw = (plan[q * m:q * m + d_bound] for q in range(5))
    cs = ws.scratch("labor_c", m, np.float64)[:d_bound]
    counts = ws.scratch("counts", m, np.int64)[:d_bound]
    cfg = (grid(d_bound, ROW_THREADS), ROW_THREADS)
    w, key, fanout = graph.weights, np.uint64(vkey), np.int64(fanout)
    if d_bound:  # raw stands in for the pi offsets (no pi at LABOR-0), cs for pi
        launch(labor_init, cfg, graph.indptr, dst, nrow, fanout, excl, w, False, row_s, row_e, row_a, row_b,
               raw, cs, stream=stream)
        launch(labor_count, cfg, graph.indices, w, False, cs, False, excl, row_s, row_e, row_a, row_b, raw,
               cs, key, counts, stream=stream)
    out_indptr, _ = exclusive_scan(counts, stream, ws, ws.output(d_bound + 1, np.int64), read_total=False)
    nnz = out_indptr[d_bound:]
    pos = ws.scratch("pos", cap, np.int64)
    src = ws.scratch(scratch, cap, graph.indices.dtype)
    eids = ws.output(cap, np.int64)
    if d_bound:
        launch(labor_take, cfg, graph.indices, w, False, cs, False, excl, row_s, row_e, row_a, row_b, raw, cs,
               key, out_indptr, pos, ws.scratch("labor_ew", 1, np.float64), False, stream=stream)
        launch(gather, (grid(cap, EDGE_THREADS), EDGE_THREADS), graph.indices, graph.edge_ids, graph.has_eids,
               pos, nnz, src, eids, stream=stream)
    return BoundedEdges(out_indptr, src, eids, nnz)


def _copy_to_host(arr: Any) -> np.ndarray:
    return arr.cpu().numpy() if hasattr(arr, "cpu") else arr.copy_to_host()


def labor_layer_cuda(graph: CudaGraph, dst: Any, fanout: int, vkey: int, excluded: Any,
                     importance_sampling: int, want_weights: bool,
                     scratch: LaborScratchCuda | None) -> tuple[Any, Any, Any, Any]:
    """One LABOR layer of one relation on the GPU (as `samplers.kernels.cpu.labor.labor_layer`).

    Parameters
    ----------
    graph : CudaGraph (its weights, when built with them, are LABOR's A); dst : device int64 [D];
    fanout, vkey, importance_sampling, want_weights : as the CPU's; excluded : device int64 [X] sorted
    CSC positions or None; scratch : LaborScratchCuda over the source ids (importance sampling)

    Returns
    -------
    out_indptr : int64 [D + 1]; src : [nnz] (the indices' dtype); eids : int64 [nnz];
    edge_weights : float64 [nnz] or None (device arrays)
    """
    stream = kernel_stream()
    dst = as_device_ids(dst, stream)
    d_count = int(dst.shape[0])
    excl = no_excluded() if excluded is None else as_device_ids(excluded, stream)
    has_w = bool(graph.weighted)
    w = graph.weights
    fanout = np.int64(fanout)
    m = max(d_count, 1)
    rows = empty(5 * m, np.int64)
    row_s, row_e, row_a, row_b, raw = (rows[q * m:q * m + d_count] for q in range(5))
    cs = empty(m, np.float64)[:d_count]
    cfg = (grid(d_count, ROW_THREADS), ROW_THREADS)
    if d_count:
        launch(labor_init, cfg, graph.indptr, dst, full(1, d_count, stream), fanout, excl, w, has_w, row_s,
               row_e, row_a, row_b, raw, cs, stream=stream)
    raw_off, total = exclusive_scan(raw, stream)
    pi, has_pi = cs, False  # a float64 placeholder until pi exists
    rounds = importance_sampling + has_w if importance_sampling >= 0 else -1
    if rounds != 0 and d_count:
        pi = empty(max(total, 1), np.float64)
        contrib = empty(m, np.float64)[:d_count]
        prev = float(total)
        it = 0
        while rounds < 0 or it < rounds:
            update = not has_w or it > 0
            if update and scratch is None:
                raise ValueError("importance sampling needs a LaborScratchCuda over the source ids")
            if update:
                launch(labor_hop_max, cfg, graph.indices, w, has_w, has_w and it == 1, excl, row_s, row_e,
                       row_a, row_b, raw_off, cs, scratch.hop, scratch.owner, stream=stream)
                launch(labor_hop_apply, cfg, graph.indices, w, has_w, excl, row_s, row_e, row_a, row_b,
                       raw_off, scratch.hop, scratch.owner, pi, not has_pi, contrib, stream=stream)
                launch(labor_hop_reset, cfg, graph.indices, row_s, row_e, scratch.hop, scratch.owner,
                       stream=stream)
                has_pi = True
            launch(labor_solve, cfg, fanout, w, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off,
                   cs, stream=stream)
            if update:
                expected = math.fsum(_copy_to_host(contrib).tolist())
                if prev <= 0 or expected / prev >= 1 - labor_rows.EPS or it >= 1000:
                    break
                prev = expected
            it += 1
    keep_pi = has_pi and importance_sampling != 0
    key = np.uint64(vkey)
    counts = full(m, 0, stream)[:d_count]
    if d_count:
        launch(labor_count, cfg, graph.indices, w, has_w, pi, keep_pi, excl, row_s, row_e, row_a, row_b,
               raw_off, cs, key, counts, stream=stream)
    out_indptr, nnz = exclusive_scan(counts, stream)
    pos = empty(max(nnz, 1), np.int64)
    ew = empty(max(nnz, 1) if want_weights else 1, np.float64)
    if nnz:
        launch(labor_take, cfg, graph.indices, w, has_w, pi, keep_pi, excl, row_s, row_e, row_a, row_b,
               raw_off, cs, key, out_indptr, pos, ew, bool(want_weights), stream=stream)
    src = empty(nnz, graph.indices.dtype)
    eids = empty(nnz, np.int64)
    if nnz:
        launch(gather, (grid(nnz, EDGE_THREADS), EDGE_THREADS), graph.indices, graph.edge_ids, graph.has_eids,
               pos, out_indptr[d_count:], src, eids, stream=stream)
    return out_indptr, src, eids, (ew[:nnz] if want_weights else None)

"""LABOR rows on the GPU, a thread per row: the passes of `samplers.kernels.cpu.labor` with the same
arithmetic (`samplers.kernels.labor_rows`), so the same seed keeps the same edges on both devices.

Importance sampling takes the max of c_t per source with an atomic max and marks each source's first
edge with an atomic min (both order-independent). Its fixed point stops when the expected source count
(the per-row contributions summed exactly and rounded once, as the CPU's ``math.fsum``) stops
shrinking: `labor_layer_cuda` reads the contributions back once per iteration and tests on the host;
a chained layer (`labor_edges_bounded`) sums them on the device (`labor_sum`: 32-bit digits in int64
words, integer atomics, so the order of the adds does not matter) and tests there (`labor_decide`), the
next iterations' kernels skipping once it is done. The two take the same decisions, so they keep the
same edges and edge weights.

A chained layer (`chains`: every LABOR layer at a fanout >= 0, importance sampling, weights and edge
weights included) keeps each edge with its probability, so D rows keep about k each but up to their
whole degrees. Its outputs are sized by a capacity, ``min(D * max_degree, LABOR_SLACK * D * k +
LABOR_EXTRA)`` (exact when the first is smaller), and pi (one float64 per candidate edge) by
`pi_capacity`; rows past the capacity are not written, and a layer whose pi does not fit, or (until
convergence, importance_sampling < 0) whose fixed point has not converged in `LABOR_ROUNDS` launched
iterations, reports an edge count past its capacity. The chain's read-back shows the overflow
(`samplers.kernels.cuda.layer.ChainOverflow`), after which the caller samples the call again without
chaining (the same edges).
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from numba import cuda

from samplers.kernels import labor_rows
from samplers.kernels.cuda import rng
from samplers.kernels.cuda.arrays import as_device_ids, empty, full, no_excluded
from samplers.kernels.cuda.bounded import BoundedEdges, DegreeBound, row_bound, slack_capacity
from samplers.kernels.cuda.graph import CudaGraph
from samplers.kernels.cuda.launch import EDGE_THREADS, ROW_THREADS, grid, kernel_stream, launch
from samplers.kernels.cuda.layer import DeviceRows, PendingBlock
from samplers.kernels.cuda.rows import row_span
from samplers.kernels.cuda.scan import exclusive_scan
from samplers.kernels.cuda.uniform import gather

__all__ = ["DONE", "KERNELS", "LABOR_EXTRA", "LABOR_ROUNDS", "LABOR_SLACK", "OVERFLOW", "RUNNING",
           "SUM_WORDS", "LaborCudaState", "LaborEdges", "LaborPendingBlock", "LaborScratchCuda", "capacity",
           "chains", "labor_edges_bounded", "labor_layer_cuda", "pi_capacity"]

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

RUNNING = 0
"""A chained layer's fixed point is still iterating (`labor_start`)."""
DONE = 1
"""A chained layer's fixed point has converged (the host's loop would have left)."""
OVERFLOW = 2
"""A chained layer's fixed point cannot finish on the device: sampled again unchained."""
SUM_WORDS = 68
"""32-bit digits of the exact sum of up to 2**30 non-negative doubles (`_add_exact`)."""
LABOR_ROUNDS = 16
"""Iterations a chained layer launches for importance_sampling < 0 (until convergence); one that has not
converged by then is an overflow (sampled again unchained)."""
_MASK32 = np.int64(0xFFFFFFFF)
_TWO_60 = 2.0 ** 60
_TWO_M60 = 2.0 ** -60


@cuda.jit(device=True)
def _add_exact(acc, x):  # pragma: no cover - device
    """acc += x exactly: x (a non-negative finite float64) is m 2**(p - 1074) with m < 2**53 and p >= 0;
    its digits go to acc[p // 32 ...] (32 bits each, atomically: a block's threads share acc)."""
    if not x > 0:
        return
    f, e = math.frexp(x)  # x = f 2**e, 0.5 <= f < 1
    m = np.int64(f * 9007199254740992.0)  # f 2**53: an integer below 2**53
    p = e + 1021
    if p < 0:  # a subnormal: m's low bits are zeros
        m = m >> -p
        p = 0
    w = p >> 5
    sh = p & 31
    lo = (m & _MASK32) << sh
    hi = (m >> 32) << sh
    cuda.atomic.add(acc, w, lo & _MASK32)
    cuda.atomic.add(acc, w + 1, (lo >> 32) + (hi & _MASK32))
    cuda.atomic.add(acc, w + 2, hi >> 32)


@cuda.jit(device=True)
def _times_pow2(x, k):  # pragma: no cover - device
    """x 2**k, exact wherever the result is representable (steps of 2**60, one direction)."""
    while k >= 60:
        x *= _TWO_60
        k -= 60
    while k <= -60:
        x *= _TWO_M60
        k += 60
    if k >= 0:
        return x * np.float64(np.int64(1) << k)
    return x / np.float64(np.int64(1) << -k)


@cuda.jit(device=True)
def _round_exact(acc):  # pragma: no cover - device
    """The float64 nearest (ties to even) to the exact sum held by ``acc`` (value sum acc[w] 2**(32 w -
    1074)), as ``math.fsum`` rounds it; ``acc`` is cleared."""
    carry = np.int64(0)
    top = -1
    for w in range(SUM_WORDS):
        v = acc[w] + carry
        acc[w] = v & _MASK32
        carry = v >> 32
        if acc[w] != 0:
            top = w
    out = 0.0
    if top >= 0:
        h = 32 * top + 31
        while (acc[h >> 5] >> (h & 31)) & 1 == 0:
            h -= 1
        if h <= 52:  # fits 53 bits: exact (a subnormal, or the smallest normal binade)
            out = _times_pow2(np.float64(acc[0] | (acc[1] << 32)), -1074)
        else:
            shift = h - 52
            m = np.int64(0)
            for b in range(h, shift - 1, -1):
                m = (m << 1) | ((acc[b >> 5] >> (b & 31)) & 1)
            r = shift - 1
            half = (acc[r >> 5] >> (r & 31)) & 1
            sticky = (acc[r >> 5] & ((np.int64(1) << (r & 31)) - 1)) != 0
            for w in range(r >> 5):
                if acc[w] != 0:
                    sticky = True
            if half == 1 and (sticky or (m & 1) == 1):
                m += 1
                if m == np.int64(9007199254740992):
                    m = m >> 1
                    shift += 1
            out = _times_pow2(np.float64(m), shift - 1074)
    for w in range(SUM_WORDS):
        acc[w] = 0
    return out


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
def labor_hop_max(indices, weights, has_w, use_w, excl, row_s, row_e, row_a, row_b, raw_off, cs, hop, owner,
                  status):  # pragma: no cover - device
    if status[0] != RUNNING:
        return
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        _hop_max_row(indices, weights, has_w, use_w, excl, row_a[i], row_b[i], row_s[i], row_e[i], raw_off[i],
                     cs[i], hop, owner)
        i += cuda.gridsize(1)


@cuda.jit
def labor_hop_apply(indices, weights, has_w, excl, row_s, row_e, row_a, row_b, raw_off, hop, owner, pi, first,
                    contrib, status):  # pragma: no cover - device
    if status[0] != RUNNING:
        return
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        contrib[i] = _hop_apply_row(indices, weights, has_w, excl, row_a[i], row_b[i], row_s[i], row_e[i],
                                    raw_off[i], hop, owner, pi, first)
        i += cuda.gridsize(1)


@cuda.jit
def labor_hop_reset(indices, row_s, row_e, hop, owner, status):  # pragma: no cover - device
    if status[0] != RUNNING:
        return
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        _hop_reset_row(indices, row_s[i], row_e[i], hop, owner)
        i += cuda.gridsize(1)


@cuda.jit
def labor_solve(fanout, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off,
                cs, status):  # pragma: no cover - device
    if status[0] != RUNNING:
        return
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        if cs[i] > 0:
            cs[i] = _solve_c(cs[i], fanout, weights, has_w, pi, has_pi, raw_off[i], excl, row_a[i], row_b[i],
                             row_s[i], row_e[i])
        i += cuda.gridsize(1)


@cuda.jit
def labor_start(raw_off, pi_cap, status, prev, acc):  # pragma: no cover - device
    """A chained layer's fixed point starts (one thread): the expected source count at its bound (the
    rows' edges, ``raw_off``'s last entry), running, or an overflow where the rows' edges pass the
    capacity ``pi_cap`` of pi; the exact sum cleared."""
    if cuda.grid(1) == 0:
        total = raw_off[raw_off.shape[0] - 1]
        prev[0] = np.float64(total)
        status[0] = RUNNING if total <= pi_cap else OVERFLOW
        for w in range(SUM_WORDS):
            acc[w] = 0


@cuda.jit
def labor_sum(contrib, status, acc):  # pragma: no cover - device
    """Add ``contrib`` (non-negative finite float64 [D]) to the exact sum ``acc`` (`_add_exact`): per
    block in shared memory, then one atomic add per digit (integer adds: the same sum in any order)."""
    part = cuda.shared.array(SUM_WORDS, numba.int64)
    w = cuda.threadIdx.x
    while w < SUM_WORDS:
        part[w] = 0
        w += cuda.blockDim.x
    cuda.syncthreads()
    if status[0] == RUNNING:
        i = cuda.grid(1)
        while i < contrib.shape[0]:
            _add_exact(part, contrib[i])
            i += cuda.gridsize(1)
    cuda.syncthreads()
    w = cuda.threadIdx.x
    while w < SUM_WORDS:
        if part[w] != 0:
            cuda.atomic.add(acc, w, part[w])
        w += cuda.blockDim.x


@cuda.jit
def labor_decide(acc, status, prev, it):  # pragma: no cover - device
    """The fixed point's test after iteration ``it`` (one thread), as the host's: the expected source count
    (``acc`` rounded once, as ``math.fsum``) against the previous one; done, or the next iteration's
    previous count; ``acc`` cleared."""
    if cuda.grid(1) != 0:
        return
    expected = _round_exact(acc)
    if status[0] != RUNNING:
        return
    last = prev[0]
    if last <= 0 or expected / last >= 1 - labor_rows.EPS or it >= 1000:
        status[0] = DONE
    else:
        prev[0] = expected


@cuda.jit
def labor_count(indices, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off, cs, vkey,
                counts, status, capped, cap):  # pragma: no cover - device
    """Each row's kept count; a chained layer whose fixed point did not finish on the device (``status``
    an overflow: pi past its capacity; or, with ``capped``, still running after the launched iterations)
    writes ``cap + 1`` for its first row and 0 for the others, an overflow of its edges' capacity ``cap``
    (pi is not read)."""
    bad = status[0] == OVERFLOW or (capped and status[0] == RUNNING)
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        n = 0
        if bad:
            n = cap + 1 if i == 0 else 0
        elif cs[i] > 0:
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
           "labor_take": labor_take, "labor_start": labor_start, "labor_sum": labor_sum,
           "labor_decide": labor_decide}
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
    reach_degree : float
        sum d**2 / sum d over the relation's in-degrees d: the mean in-degree of a row reached through an
        edge (a chained layer's capacity of pi, `pi_capacity`).
    edges : int
        The relation's edges E (distinct rows have at most E candidate edges).
    running : device int64 [1] or None
        `RUNNING`: the status of a chained layer without a fixed point.
    """

    scratch: LaborScratchCuda | None
    max_degree: int
    reach_degree: float = 0.0
    running: Any = None
    edges: int = 0

    @classmethod
    def of(cls, indptr: np.ndarray, num_src: int, importance_sampling: int) -> LaborCudaState:
        """The state of a relation of host ``indptr`` (int64 [N + 1]) over ``num_src`` source ids."""
        bound = DegreeBound.of(indptr)
        degree = np.diff(np.asarray(indptr)).astype(np.float64)
        return cls(None if importance_sampling == 0 else LaborScratchCuda(num_src), bound.max_degree,
                   float(degree @ degree) / bound.edges if bound.edges > 0 else 0.0,
                   cuda.to_device(np.full(1, RUNNING, dtype=np.int64)), bound.edges)


@dataclass
class LaborEdges(BoundedEdges):
    """`BoundedEdges` of a chained LABOR layer, with its edge weights: device float64 [M] (DGL's
    ``edge_weights``, each row's mean 1) or None."""

    edge_weights: Any = None


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


def pi_capacity(d_bound: int, state: LaborCudaState, repeats: int | None = None) -> int:
    """A chained importance-sampling layer's capacity of pi (one float64 per candidate edge of its rows):
    ``min(bound, LABOR_SLACK * d_bound * reach_degree + LABOR_EXTRA)``, bound ``d_bound * max_degree``,
    and at most ``E + repeats * max_degree`` where the rows' repeated entries are known (``repeats``,
    `samplers.kernels.cuda.layer.DeviceRows.repeats`)."""
    return slack_capacity(row_bound(d_bound, state.max_degree, state.edges, repeats), d_bound,
                          state.reach_degree, LABOR_SLACK, LABOR_EXTRA)


def labor_edges_bounded(graph: CudaGraph, rows: DeviceRows, fanout: int, vkey: int, excluded: Any, ws: Any,
                        state: LaborCudaState, importance_sampling: int = 0, want_weights: bool = False,
                        scratch: str = "src") -> LaborEdges:
    """One LABOR layer (`chains`) sampled on the device, not relabelled, nothing read back.

    The rows' c_t and, with importance sampling, the fixed point over pi run on the device: each
    iteration's kernels skip once the device's test (`labor_decide`, the host loop's test on the
    exactly rounded expected source count) has ended it, so the blocks and edge weights equal the
    unchained path's and the CPU's.

    Parameters
    ----------
    graph : CudaGraph (its weights, when built with them, are LABOR's A); rows : DeviceRows (the chain's
    rows); fanout : int (k >= 0); vkey : int (the layer's variate key); excluded : device int64 [X]
    sorted CSC positions or None; ws : CudaWorkspace; state : LaborCudaState; importance_sampling : int;
    want_weights : bool (edge weights out); scratch : str (the sources' scratch array)

    Returns
    -------
    LaborEdges
        At the capacity M (`capacity`); its edge count, read back with the chain's sizes, may exceed M
        (an overflow: `samplers.kernels.cuda.layer.ChainOverflow` when the chain is read), as it does
        where pi passes `pi_capacity` or, iterating until convergence, the fixed point has not
        converged in `LABOR_ROUNDS` iterations.
    """
    stream = kernel_stream()
    dst, nrow = rows.ids, rows.count
    d_bound = int(dst.shape[0])
    m = max(d_bound, 1)
    cap = capacity(d_bound, fanout, state.max_degree)
    excl = no_excluded() if excluded is None else ws.device_ids(excluded, "excluded")
    plan = ws.scratch("rows", 5 * m, np.int64)
    row_s, row_e, row_a, row_b, raw = (plan[q * m:q * m + d_bound] for q in range(5))
    cs = ws.scratch("labor_c", m, np.float64)[:d_bound]
    counts = ws.scratch("counts", m, np.int64)[:d_bound]
    cfg = (grid(d_bound, ROW_THREADS), ROW_THREADS)
    has_w = bool(graph.weighted)
    w, key, fanout = graph.weights, np.uint64(vkey), np.int64(fanout)
    raw_off, pi, has_pi = raw, cs, False  # without pi: raw stands in for its offsets, cs for pi
    rounds = importance_sampling + has_w if importance_sampling >= 0 else LABOR_ROUNDS
    status = ws.scratch("labor_status", 1, np.int64)
    if d_bound:
        launch(labor_init, cfg, graph.indptr, dst, nrow, fanout, excl, w, has_w, row_s, row_e, row_a, row_b,
               raw, cs, stream=stream)
    if rounds and d_bound:
        raw_off, _ = exclusive_scan(raw, stream, ws, ws.scratch("labor_raw_off", d_bound + 1, np.int64),
                                    read_total=False)
        pi_cap = pi_capacity(d_bound, state, rows.repeats) if importance_sampling else np.iinfo(np.int64).max
        pi = ws.scratch("labor_pi", pi_cap if importance_sampling else 1, np.float64)
        prev, acc = ws.scratch("labor_prev", 1, np.float64), ws.scratch("labor_acc", SUM_WORDS, np.int64)
        contrib = ws.scratch("labor_contrib", m, np.float64)[:d_bound]
        launch(labor_start, (1, 1), raw_off, np.int64(pi_cap), status, prev, acc, stream=stream)
        for it in range(rounds):
            update = not has_w or it > 0
            if update:
                if state.scratch is None:
                    raise ValueError("importance sampling needs a LaborScratchCuda over the source ids")
                hop, owner = state.scratch.hop, state.scratch.owner
                launch(labor_hop_max, cfg, graph.indices, w, has_w, has_w and it == 1, excl, row_s, row_e,
                       row_a, row_b, raw_off, cs, hop, owner, status, stream=stream)
                launch(labor_hop_apply, cfg, graph.indices, w, has_w, excl, row_s, row_e, row_a, row_b,
                       raw_off, hop, owner, pi, not has_pi, contrib, status, stream=stream)
                launch(labor_hop_reset, cfg, graph.indices, row_s, row_e, hop, owner, status, stream=stream)
                has_pi = True
            launch(labor_solve, cfg, fanout, w, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off,
                   cs, status, stream=stream)
            if update:
                launch(labor_sum, cfg, contrib, status, acc, stream=stream)
                launch(labor_decide, (1, 1), acc, status, prev, np.int64(it), stream=stream)
    keep_pi = has_pi and importance_sampling != 0
    if d_bound:
        launch(labor_count, cfg, graph.indices, w, has_w, pi, keep_pi, excl, row_s, row_e, row_a, row_b,
               raw_off, cs, key, counts, status if rounds else state.running, importance_sampling < 0,
               np.int64(cap), stream=stream)
    out_indptr, _ = exclusive_scan(counts, stream, ws, ws.output(d_bound + 1, np.int64), read_total=False)
    nnz = out_indptr[d_bound:]
    pos = ws.scratch("pos", cap, np.int64)
    src = ws.scratch(scratch, cap, graph.indices.dtype)
    eids = ws.output(cap, np.int64)
    ew = ws.output(cap, np.float64) if want_weights else ws.scratch("labor_ew", 1, np.float64)
    if d_bound:
        launch(labor_take, cfg, graph.indices, w, has_w, pi, keep_pi, excl, row_s, row_e, row_a, row_b,
               raw_off, cs, key, out_indptr, pos, ew, bool(want_weights), stream=stream)
        launch(gather, (grid(cap, EDGE_THREADS), EDGE_THREADS), graph.indices, graph.edge_ids, graph.has_eids,
               pos, nnz, src, eids, stream=stream)
    return LaborEdges(out_indptr, src, eids, nnz, edge_weights=ew if want_weights else None)


def _copy_to_host(arr: Any) -> np.ndarray:
    return arr.cpu().numpy() if hasattr(arr, "cpu") else arr.copy_to_host()


def labor_layer_cuda(graph: CudaGraph, dst: Any, fanout: int, vkey: int, excluded: Any,
                     importance_sampling: int, want_weights: bool,
                     scratch: LaborScratchCuda | None) -> tuple[Any, Any, Any, Any]:
    """One LABOR layer of one relation on the GPU (as `samplers.kernels.cpu.labor.labor_layer`), its
    sizes and each importance-sampling iteration's expected source count read back (`labor_edges_bounded`
    chains a layer without).

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
    running = full(1, RUNNING, stream)  # the iterations' kernels run (the host decides when to stop)
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
                       row_a, row_b, raw_off, cs, scratch.hop, scratch.owner, running, stream=stream)
                launch(labor_hop_apply, cfg, graph.indices, w, has_w, excl, row_s, row_e, row_a, row_b,
                       raw_off, scratch.hop, scratch.owner, pi, not has_pi, contrib, running, stream=stream)
                launch(labor_hop_reset, cfg, graph.indices, row_s, row_e, scratch.hop, scratch.owner, running,
                       stream=stream)
                has_pi = True
            launch(labor_solve, cfg, fanout, w, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off,
                   cs, running, stream=stream)
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
               raw_off, cs, key, counts, running, False, np.int64(0), stream=stream)
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

"""LABOR rows on the GPU, a thread per row: the passes of `samplers.kernels.cpu.labor` with the same
arithmetic (`samplers.kernels.labor_rows`), so the same seed keeps the same edges on both devices.

Importance sampling numbers the layer's unique sources once (`labor_claim`: each source's first eligible
edge by an atomic min; `labor_owners` counts them per row and, after a scan, numbers them), so pi holds one
float64 per unique source (every edge of a source has the same pi). Each iteration takes the max of c_t per
source (an atomic max), and the owning row updates the source's pi and its share of the expected source
count. The fixed point
stops by the CPU's rule (`labor_rows.converged`) on that count summed exactly and rounded once, as the
CPU's ``math.fsum``: `labor_layer_cuda` reads the shares back once per iteration and tests on the host; a
chained layer (`labor_edges_bounded`) sums them on the device (`samplers.kernels.cuda.exact_sum`) and tests
there (`labor_decide`, which counts the iterations run), nothing read back: the later iterations' kernels
exit at once. Both keep the CPU's edges and edge weights.

A chained layer (`chains`: a fanout >= 0) keeps each edge with its probability, so D rows keep about k
each but up to their whole degrees. Its outputs are sized by ``min(D * max_degree, LABOR_SLACK * D * k +
LABOR_EXTRA)`` (exact when the first is smaller) and pi by `pi_capacity` (at most the source ids); rows
past the capacity are not written, and a layer whose unique sources pass pi's capacity, or (importance
sampling < 0) whose fixed point has not converged in `LABOR_ROUNDS` updates of pi, reports an edge
count past its capacity: the chain's read-back shows the overflow (`samplers.kernels.cuda.layer.
ChainOverflow`), and the caller samples the call again without chaining (the same edges).
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
from samplers.kernels.cuda.bounded import BoundedEdges, DegreeBound, row_bound, slack_capacity
from samplers.kernels.cuda.exact_sum import SUM_WORDS, round_exact, sum_exact
from samplers.kernels.cuda.graph import CudaGraph
from samplers.kernels.cuda.launch import EDGE_THREADS, ROW_THREADS, grid, kernel_stream, launch
from samplers.kernels.cuda.layer import DeviceRows, PendingBlock
from samplers.kernels.cuda.rows import row_span
from samplers.kernels.cuda.scan import exclusive_scan
from samplers.kernels.cuda.uniform import gather

__all__ = ["DONE", "KERNELS", "LABOR_EXTRA", "LABOR_ROUNDS", "LABOR_SLACK", "OVERFLOW", "RUNNING",
           "LaborCudaState", "LaborEdges", "LaborPendingBlock", "LaborScratchCuda", "capacity",
           "chains", "labor_edges_bounded", "labor_layer_cuda", "pi_capacity"]

LABOR_SLACK = 2.0
"""A chained LABOR layer's capacity per expected edge (see the module)."""
LABOR_EXTRA = 1024
"""Edges a chained LABOR layer's capacity adds to ``LABOR_SLACK * D * k``."""

@cuda.jit(device=True)
def _raise_hop_max(hop, owner, u, ct, f):  # pragma: no cover - device
    """`labor_rows.raise_hop`'s max, atomic (rows of the layer run concurrently and share sources); the
    owners were claimed once for the layer (`labor_claim`), so ``owner`` and ``f`` are not used."""
    cuda.atomic.max(hop, u, ct)


@cuda.jit(device=True)
def _pi_slot(indices, slots, p0, s, j):  # pragma: no cover - device
    """`labor_rows.pi_index` on the GPU: pi per unique source of the layer, source u at slot
    ``-1 - slots[u]`` (`labor_owners`; ``p0`` and ``s`` not used)."""
    return -1 - slots[indices[j]]


_ROWS = labor_rows.compile_for(cuda.jit(device=True), types.SimpleNamespace(
    row_state=rng.row_state, draw=rng.draw, unit=rng.unit), raise_hop=_raise_hop_max, pi_index=_pi_slot)
_start_c = _ROWS.start_c
_solve_c = _ROWS.solve_c
_count_kept = _ROWS.count_kept
_take_kept = _ROWS.take_kept
_skipped = _ROWS.skipped
_clip1 = _ROWS.clip1
_next_pi = _ROWS.next_pi
_converged = _ROWS.converged
_hop_max_row = _ROWS.hop_max_row
_hop_reset_row = _ROWS.hop_reset_row

RUNNING = 0
"""A chained layer's fixed point is still iterating (`labor_start`)."""
DONE = 1
"""A chained layer's fixed point has converged (the host's loop would have left)."""
OVERFLOW = 2
"""A chained layer's fixed point cannot finish on the device: sampled again unchained."""
LABOR_ROUNDS = 16
"""Updates of pi a chained layer launches for importance_sampling < 0 (`labor_rows.iterations`: weighted, one
iteration more); not converged by then, an overflow (sampled again unchained). Those after it exit at once."""

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
def labor_claim(indices, weights, has_w, excl, row_s, row_e, row_a, row_b, raw_off,
                owner):  # pragma: no cover - device
    """owner[u] = the first (lowest frontier index ``raw_off[i] + j - s``) of source u's eligible edges in
    the rows (an atomic min: any order), once per layer (eligibility does not change between iterations)."""
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        s, q, b, off = row_s[i], row_a[i], row_b[i], raw_off[i]
        for j in range(s, row_e[i]):
            skip, q = _skipped(weights, has_w, excl, q, b, j)
            if not skip:
                cuda.atomic.min(owner, indices[j], off + j - s)
        i += cuda.gridsize(1)


@cuda.jit
def labor_owners(indices, weights, has_w, excl, row_s, row_e, row_a, row_b, raw_off, owner, slot,
                 number):  # pragma: no cover - device
    """Row i's owned sources (their first eligible edge in row i, `labor_claim`): counted into slot[i];
    with ``number`` (``slot`` their offsets [D + 1]) numbered in CSC order from slot[i], owner[u] =
    ``-1 - slot`` (negative: no row's edge index equals it, so the rows beside still see their owners)."""
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        s, q, b, off = row_s[i], row_a[i], row_b[i], raw_off[i]
        k = slot[i] if number else 0
        for j in range(s, row_e[i]):
            skip, q = _skipped(weights, has_w, excl, q, b, j)
            if not skip and owner[indices[j]] == off + j - s:
                if number:
                    owner[indices[j]] = -1 - k
                k += 1
        if not number:
            slot[i] = k
        i += cuda.gridsize(1)


@cuda.jit
def labor_hop_max(indices, weights, has_w, use_w, excl, row_s, row_e, row_a, row_b, raw_off, cs, hop, owner,
                  status):  # pragma: no cover - device
    """hop[u] = the max of c_t (times A with ``use_w``) over source u's eligible edges (atomic max)."""
    if status[0] != RUNNING:
        return
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        _hop_max_row(indices, weights, has_w, use_w, excl, row_a[i], row_b[i], row_s[i], row_e[i], raw_off[i],
                     cs[i], hop, owner)
        i += cuda.gridsize(1)


@cuda.jit
def labor_hop_apply(indices, weights, has_w, excl, row_s, row_e, row_a, row_b, slot_off, hop, owner, pi,
                    first, contrib, status):  # pragma: no cover - device
    """`labor_rows.hop_apply_row` per unique source: row i's owned sources (slots ``slot_off[i]...`` in CSC
    order) take their pi (`labor_rows.next_pi`) and clear their hop; contrib[i] sums min(1, pi) over them in
    that order (the CPU's sum)."""
    if status[0] != RUNNING:
        return
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        q, b = row_a[i], row_b[i]
        k, end = slot_off[i], slot_off[i + 1]
        total = 0.0
        for j in range(row_s[i], row_e[i]):
            if k == end:
                break
            skip, q = _skipped(weights, has_w, excl, q, b, j)
            u = indices[j]
            if not skip and owner[u] == -1 - k:
                pi[k] = _next_pi(pi[k], hop[u], first)
                hop[u] = 0.0
                total += _clip1(pi[k])
                k += 1
        contrib[i] = total
        i += cuda.gridsize(1)


@cuda.jit
def labor_release(indices, row_s, row_e, hop, owner):  # pragma: no cover - device
    """The scratch restored after a layer: hop[u] = 0 and owner[u] = NO_OWNER for the rows' sources."""
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        _hop_reset_row(indices, row_s[i], row_e[i], hop, owner)
        i += cuda.gridsize(1)


@cuda.jit
def labor_solve(fanout, indices, slots, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off,
                cs, status):  # pragma: no cover - device
    if status[0] != RUNNING:
        return
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        if cs[i] > 0:
            cs[i] = _solve_c(cs[i], fanout, indices, slots, weights, has_w, pi, has_pi, raw_off[i], excl,
                             row_a[i], row_b[i], row_s[i], row_e[i])
        i += cuda.gridsize(1)


@cuda.jit
def labor_start(raw_off, slot_off, pi_cap, nrow, status, prev, acc):  # pragma: no cover - device
    """A chained layer's fixed point starts (one thread), no iteration run (``status[1]``), the exact sum
    cleared: running, the expected source count at its bound (the rows' edges, ``raw_off``'s last entry),
    or an overflow where its sources (``slot_off``'s last) pass pi's capacity ``pi_cap``; no rows
    (``nrow[0]`` 0; ``raw_off``, ``slot_off`` unread, may be empty): done, as the CPU's loop runs none."""
    if cuda.grid(1) != 0:
        return
    for w in range(SUM_WORDS):
        acc[w] = 0
    status[0], status[1] = DONE, 0
    if nrow[0] > 0:
        prev[0] = np.float64(raw_off[raw_off.shape[0] - 1])
        status[0] = RUNNING if slot_off[slot_off.shape[0] - 1] <= pi_cap else OVERFLOW


@cuda.jit
def labor_decide(acc, status, prev, it):  # pragma: no cover - device
    """The fixed point's test after iteration ``it`` (one thread), the CPU's (`labor_rows.converged`): the
    expected source count (``acc`` rounded once, as ``math.fsum``; then cleared) against the previous one;
    done, or the next iteration's previous count; ``status[1]`` = the iterations run (``it + 1``). A fixed
    point no longer running returns at once (``acc`` is clear: `sum_exact` added nothing)."""
    if cuda.grid(1) != 0 or status[0] != RUNNING:
        return
    expected = round_exact(acc)
    status[1] = it + 1
    if _converged(prev[0], expected, it):
        status[0] = DONE
    else:
        prev[0] = expected


@cuda.jit
def labor_count(indices, slots, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off, cs,
                vkey, counts, status, capped, cap):  # pragma: no cover - device
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
            n = _count_kept(indices, slots, weights, has_w, pi, has_pi, raw_off[i], excl, row_a[i], row_b[i],
                            row_s[i], row_e[i], cs[i], vkey)
        counts[i] = n
        i += cuda.gridsize(1)


@cuda.jit
def labor_take(indices, slots, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off, cs,
               vkey, out_indptr, pos, ew, want_w):  # pragma: no cover - device
    i = cuda.grid(1)
    while i < row_s.shape[0]:
        o = out_indptr[i]
        n = out_indptr[i + 1] - o
        if n > 0 and o + n > pos.shape[0]:  # past a chain's capacity (an overflow, sampled again): safe
            for x in range(o, pos.shape[0]):  # positions for the gather (o + n is past the end)
                pos[x] = 0
        elif n > 0:
            _take_kept(indices, slots, weights, has_w, pi, has_pi, raw_off[i], excl, row_a[i], row_b[i],
                       row_s[i], row_e[i], cs[i], vkey, pos, ew, want_w, o, n)
        i += cuda.gridsize(1)


KERNELS = {"labor_init": labor_init, "labor_claim": labor_claim, "labor_owners": labor_owners,
           "labor_hop_max": labor_hop_max, "labor_hop_apply": labor_hop_apply,
           "labor_release": labor_release, "labor_solve": labor_solve, "labor_count": labor_count,
           "labor_take": labor_take, "labor_start": labor_start, "sum_exact": sum_exact,
           "labor_decide": labor_decide}
"""The LABOR kernels by name."""


class LaborScratchCuda:
    """Device scratch of importance sampling over a source-id space: ``hop`` (float64, zeros) and
    ``owner`` (int64, `labor_rows.NO_OWNER`; during a layer each source's first edge, then its slot in pi),
    both restored after each layer (`labor_release`)."""

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
    num_src : int
        The relation's source ids (a layer has at most as many unique sources: `pi_capacity`).
    """

    scratch: LaborScratchCuda | None
    max_degree: int
    reach_degree: float = 0.0
    running: Any = None
    edges: int = 0
    num_src: int = 0

    @classmethod
    def of(cls, indptr: np.ndarray, num_src: int, importance_sampling: int) -> LaborCudaState:
        """The state of a relation of host ``indptr`` (int64 [N + 1]) over ``num_src`` source ids."""
        bound = DegreeBound.of(indptr)
        degree = np.diff(np.asarray(indptr)).astype(np.float64)
        return cls(None if importance_sampling == 0 else LaborScratchCuda(num_src), bound.max_degree,
                   float(degree @ degree) / bound.edges if bound.edges > 0 else 0.0,
                   cuda.to_device(np.full(1, RUNNING, dtype=np.int64)), bound.edges, int(num_src))


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


def labor_edges_bounded(graph: CudaGraph, rows: DeviceRows, fanout: int, vkey: int, excluded: Any, ws: Any,
                        state: LaborCudaState, importance_sampling: int = 0, want_weights: bool = False,
                        scratch: str = "src") -> LaborEdges:
    """One LABOR layer (`chains`) sampled on the device, not relabelled, nothing read back.

    The rows' c_t and, with importance sampling, the fixed point over pi run on the device (see the module):
    each iteration's kernels exit at once after the device's test (`labor_decide`, the CPU's rule) has
    ended it, nothing read back, so the blocks and edge weights equal the unchained path's and the CPU's.
    Scratch: pi is one float64 per unique source of the rows (`pi_capacity`: at most num_src), beside
    per-row arrays (about 13 words a row) and the relation's ``hop``/``owner`` over its source ids.

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
        where the rows' unique sources pass `pi_capacity` or, iterating until convergence, the fixed point
        has not converged in `LABOR_ROUNDS` updates of pi. ``fixed_point`` (importance sampling) holds the
        fixed point's state and the iterations it ran.

    Raises
    ------
    ValueError
        Importance sampling without a `LaborScratchCuda` (``state.scratch`` None).
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
    # without pi: raw stands in for its offsets and the sources' slots, cs for pi
    raw_off, slots, pi, has_pi = raw, raw, cs, False
    rounds = labor_rows.iterations(importance_sampling, has_w, LABOR_ROUNDS)
    status = ws.scratch("labor_status", 2, np.int64)
    prev, acc = ws.scratch("labor_prev", 1, np.float64), ws.scratch("labor_acc", SUM_WORDS, np.int64)
    if importance_sampling and state.scratch is None:
        raise ValueError("importance sampling needs a LaborScratchCuda over the source ids")
    if rounds and not d_bound:  # no rows: the fixed point is done (``fixed_point``), nothing else runs
        launch(labor_start, (1, 1), raw, raw, np.int64(0), nrow, status, prev, acc, stream=stream)
    if d_bound:
        launch(labor_init, cfg, graph.indptr, dst, nrow, fanout, excl, w, has_w, row_s, row_e, row_a, row_b,
               raw, cs, stream=stream)
    if rounds and d_bound:
        raw_off, _ = exclusive_scan(raw, stream, ws, ws.scratch("labor_raw_off", d_bound + 1, np.int64),
                                    read_total=False)
        slot_off, pi_cap = raw_off, np.iinfo(np.int64).max
        if importance_sampling:
            hop, slots = state.scratch.hop, state.scratch.owner
            owned = ws.scratch("labor_owned", m, np.int64)[:d_bound]
            edge_rows = (graph.indices, w, has_w, excl, row_s, row_e, row_a, row_b, raw_off, slots)
            launch(labor_claim, cfg, *edge_rows, stream=stream)
            launch(labor_owners, cfg, *edge_rows, owned, False, stream=stream)
            slot_off = ws.scratch("labor_slot_off", d_bound + 1, np.int64)
            exclusive_scan(owned, stream, ws, slot_off, read_total=False)
            launch(labor_owners, cfg, *edge_rows, slot_off, True, stream=stream)
            pi_cap = pi_capacity(d_bound, state, rows.repeats)
            pi = ws.scratch("labor_pi", pi_cap, np.float64)
        contrib = ws.scratch("labor_contrib", m, np.float64)[:d_bound]
        launch(labor_start, (1, 1), raw_off, slot_off, np.int64(pi_cap), nrow, status, prev, acc,
               stream=stream)
        for it in range(rounds):
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
    keep_pi = has_pi and importance_sampling != 0
    if d_bound:
        launch(labor_count, cfg, graph.indices, slots, w, has_w, pi, keep_pi, excl, row_s, row_e, row_a,
               row_b, raw_off, cs, key, counts, status if rounds else state.running, importance_sampling < 0,
               np.int64(cap), stream=stream)
    out_indptr, _ = exclusive_scan(counts, stream, ws, ws.output(d_bound + 1, np.int64), read_total=False)
    nnz = out_indptr[d_bound:]
    pos = ws.scratch("pos", cap, np.int64)
    src = ws.scratch(scratch, cap, graph.indices.dtype)
    eids = ws.output(cap, np.int64)
    ew = ws.output(cap, np.float64) if want_weights else ws.scratch("labor_ew", 1, np.float64)
    if d_bound:
        launch(labor_take, cfg, graph.indices, slots, w, has_w, pi, keep_pi, excl, row_s, row_e, row_a, row_b,
               raw_off, cs, key, out_indptr, pos, ew, bool(want_weights), stream=stream)
        if importance_sampling:
            launch(labor_release, cfg, graph.indices, row_s, row_e, hop, slots, stream=stream)
        launch(gather, (grid(cap, EDGE_THREADS), EDGE_THREADS), graph.indices, graph.edge_ids, graph.has_eids,
               pos, nnz, src, eids, stream=stream)
    return LaborEdges(out_indptr, src, eids, nnz, edge_weights=ew if want_weights else None,
                      fixed_point=status if importance_sampling else None)


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
    slots, pi, has_pi = raw, cs, False  # placeholders until the sources have slots in pi
    rounds = labor_rows.iterations(importance_sampling, has_w)
    if importance_sampling and scratch is None:
        raise ValueError("importance sampling needs a LaborScratchCuda over the source ids")
    if rounds != 0 and d_count:
        if importance_sampling:
            slots = scratch.owner
            edge_rows = (graph.indices, w, has_w, excl, row_s, row_e, row_a, row_b, raw_off, slots)
            owned = empty(m, np.int64)[:d_count]
            launch(labor_claim, cfg, *edge_rows, stream=stream)
            launch(labor_owners, cfg, *edge_rows, owned, False, stream=stream)
            slot_off, _ = exclusive_scan(owned, stream, read_total=False)
            launch(labor_owners, cfg, *edge_rows, slot_off, True, stream=stream)
            # one float64 per unique source: at most the rows' edges and the source ids
            pi = empty(max(min(total, int(slots.shape[0])), 1), np.float64)
        contrib = empty(m, np.float64)[:d_count]
        prev = float(total)
        it = 0
        while rounds < 0 or it < rounds:
            update = not has_w or it > 0
            if update:
                launch(labor_hop_max, cfg, graph.indices, w, has_w, has_w and it == 1, excl, row_s, row_e,
                       row_a, row_b, raw_off, cs, scratch.hop, slots, running, stream=stream)
                launch(labor_hop_apply, cfg, graph.indices, w, has_w, excl, row_s, row_e, row_a, row_b,
                       slot_off, scratch.hop, slots, pi, not has_pi, contrib, running, stream=stream)
                has_pi = True
            launch(labor_solve, cfg, fanout, graph.indices, slots, w, has_w, pi, has_pi, excl, row_s, row_e,
                   row_a, row_b, raw_off, cs, running, stream=stream)
            if update:
                expected = math.fsum(_copy_to_host(contrib).tolist())
                if labor_rows.converged(prev, expected, it):
                    break
                prev = expected
            it += 1
    keep_pi = has_pi and importance_sampling != 0
    key = np.uint64(vkey)
    counts = full(m, 0, stream)[:d_count]
    if d_count:
        launch(labor_count, cfg, graph.indices, slots, w, has_w, pi, keep_pi, excl, row_s, row_e, row_a,
               row_b, raw_off, cs, key, counts, running, False, np.int64(0), stream=stream)
    out_indptr, nnz = exclusive_scan(counts, stream)
    pos = empty(max(nnz, 1), np.int64)
    ew = empty(max(nnz, 1) if want_weights else 1, np.float64)
    if nnz:
        launch(labor_take, cfg, graph.indices, slots, w, has_w, pi, keep_pi, excl, row_s, row_e, row_a, row_b,
               raw_off, cs, key, out_indptr, pos, ew, bool(want_weights), stream=stream)
    if importance_sampling and rounds != 0 and d_count:
        launch(labor_release, cfg, graph.indices, row_s, row_e, scratch.hop, slots, stream=stream)
    src = empty(nnz, graph.indices.dtype)
    eids = empty(nnz, np.int64)
    if nnz:
        launch(gather, (grid(nnz, EDGE_THREADS), EDGE_THREADS), graph.indices, graph.edge_ids, graph.has_eids,
               pos, out_indptr[d_count:], src, eids, stream=stream)
    return out_indptr, src, eids, (ew[:nnz] if want_weights else None)

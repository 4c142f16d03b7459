"""Partitions and deduplication plans of a staged full-graph propagation (HongTu's scheme).

A staged propagation ``out = M @ h`` (M: the normalised adjacency or its transpose, CSR by
destination row) moves data the way a GPU needs it: for each partition of destination rows, the
distinct source rows it reads are gathered from host vertex data into a device buffer, the
partition's local CSR (columns remapped into that buffer) is multiplied there, and the output rows go
back to the host. `plan_propagation` decides, for one matrix, feature width and device budget:

- the order of destination rows: `locality_order` (reverse Cuthill-McKee on the pattern of M + M^T,
  `graphrl.kernels.ordering.rcm_order`), so that consecutive rows share sources;
- contiguous ranges of that order (the partitions), each within a per-slot byte cap (``slot_bytes``,
  at most half what the budget leaves) that counts its local CSR, its distinct streamed sources and
  its output rows, cut in one greedy pass that also keeps the working set (two slots of the largest
  arena and the largest stream) within the budget, then re-cut to balance edges and bytes over the
  same number of partitions where every balanced range still fits (HongTu's multi-objective split).
  A row too large for one slot (a hub) is split by its entries over consecutive partitions, whose
  partial sums are added on the host;
- with ``dedup``, a device-side cache of source rows read by several partitions, loaded once per
  propagation, then served from the device (``dedup_hit``). Candidates: the partitions as large as
  the slots allow, the cache filling what they leave (most-read rows first); and partitions cut
  after reserving up to ``cache_share`` of the budget for the rows most destinations read (they do
  not count against a slot, so partitions grow). The candidate moving the fewest bytes wins, never
  more vertex bytes than the plan without dedup.

The device buffer of sources is ``[cache rows | slot 0 | slot 1]``; a partition's local columns point
into the cache or into its slot (``slot = k % 2``), so one SpMM per partition reads both. Each slot
also has an arena for the partition's local CSR and output rows (byte rules: `samplers.full_graph_bytes`).
Plans are host arrays (numpy); `samplers.full_graph_stream` runs them. The passes over M's entries in
plan order (threaded, bitwise the same plan for any count) live in `samplers.full_graph_entries`, whose
`PlanCache` (importable here too) shares that work and the single-partition layout among plans of M.

References
----------
Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024 (partitioned
vertex data, deduplicated host-GPU communication, multi-objective partitioning); Cuthill and McKee,
"Reducing the bandwidth of sparse symmetric matrices", 1969 (the reverse order of George and Liu).

Example: ``plan_propagation(indptr, indices, weights, locality_order(indptr, indices, n), 64, 4,
16 << 20, True, slot_bytes=1 << 20)`` plans 1 MiB slots and a cache in 16 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba as nb
import numpy as np

from graphrl.kernels.ordering import rcm_order
from graphrl.memory import MemoryBudgetError, Tier
from samplers.full_graph_bytes import (
    align,
    arena_offsets,
    cache_rows_within,
    moved_bytes,
    piece_entries,
    slot_bound,
    slot_cost,
    source_bytes,
    working_set_bytes,
)
from samplers.full_graph_entries import (
    PlanCache,
    by_count,
    count_ids,
    distinct,
    permuted,
    range_chunks,
    ranked,
    run_parallel,
    streamed,
    whole_rows,
    work_groups,
)
from samplers.kernels.cpu.partition import fill_columns, number_sources, remap_partitions

__all__ = ["DEFAULT_CACHE_SHARE", "PartitionPlan", "PlanCache", "PlanPart", "locality_order",
           "plan_propagation"]

# Largest share of the device budget a dedup candidate reserves for the most-read rows.
DEFAULT_CACHE_SHARE = 0.5


@dataclass
class PlanPart:
    """One partition of a plan: what moves to the device and the local product run there.

    Attributes
    ----------
    rows : numpy.ndarray, int64, shape [r]
        Destination rows (original ids), in plan order.
    indptr : numpy.ndarray, int64, shape [r + 1]
    cols : numpy.ndarray, int32, shape [e]
        Local columns into the device source buffer (cache rows first, then the slot's rows).
    weights : numpy.ndarray, float32, shape [e]
        The matrix values, in the matrix's entry order within each row.
    stream : numpy.ndarray, int64, shape [s]
        Source rows gathered for this partition (distinct, not cached), in first-read order.
    cache_reads : int
        Distinct cached rows this partition reads (each one a row not moved again).
    slot : int
        Double-buffer slot (0 or 1).
    add : numpy.ndarray, bool, shape [r], or None
        Rows whose output is a piece of a split row: added to the host output, not copied.
    pinned : tuple of torch.Tensor or None
        The local CSR as pinned host tensors, made by the CUDA executor on first use.
    """

    rows: np.ndarray
    indptr: np.ndarray
    cols: np.ndarray
    weights: np.ndarray
    stream: np.ndarray
    cache_reads: int
    slot: int
    add: np.ndarray | None = None
    pinned: tuple | None = None


@dataclass
class PartitionPlan:
    """A staged propagation of one matrix at one feature width under one device budget.

    Attributes
    ----------
    parts : list of PlanPart
    cache : numpy.ndarray, int64, shape [C]
        Source rows held in the device cache during a propagation (empty without dedup).
    row_bytes : int
        Bytes of one vertex row (width x itemsize).
    max_stream, max_rows : int
        Largest streamed-source count and row count of a partition.
    arena_bytes : int
        Bytes of one slot's arena (the largest partition's local CSR and output rows, packed).
    device_bytes : int
        Bytes of the device working set (cache, two slots), within the budget it was planned for.
    split_rows : numpy.ndarray, int64, shape [R]
        Destination rows too large for one slot, split by entries over several partitions (sorted);
        the executor zeroes them in the output and adds the pieces.
    """

    parts: list[PlanPart]
    cache: np.ndarray
    row_bytes: int
    max_stream: int
    max_rows: int
    arena_bytes: int
    device_bytes: int
    split_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def num_partitions(self) -> int:
        """Partitions of the plan (split pieces of a row each counted)."""
        return len(self.parts)

    def vertex_bytes(self) -> int:
        """Vertex bytes one propagation moves to the device: the cache once, then every streamed row."""
        return (len(self.cache) + sum(p.stream.shape[0] for p in self.parts)) * self.row_bytes

    def moved_bytes(self) -> int:
        """All bytes one propagation moves: vertex rows and local CSRs in, output rows (and pieces) back."""
        return moved_bytes(self.vertex_bytes(), sum(p.rows.shape[0] for p in self.parts), len(self.parts),
                           sum(p.cols.shape[0] for p in self.parts), self.row_bytes)

    def arena_offsets(self, part: PlanPart) -> tuple[int, int, int, int]:
        """Byte offsets of ``part``'s indptr, cols, weights and output rows in its slot's arena."""
        return arena_offsets(part.rows.shape[0], part.cols.shape[0], self.row_bytes)[:4]

    @property
    def src_bytes(self) -> int:
        """Bytes of the source buffer: cache rows, then two slots of ``max_stream`` rows."""
        return source_bytes(len(self.cache), self.max_stream, self.row_bytes)


def locality_order(indptr: np.ndarray, indices: np.ndarray, num_nodes: int,
                   transpose: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Reverse Cuthill-McKee order of the pattern of ``M + M^T`` (rows that share sources end up close).

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [N + 1]; indices : numpy.ndarray, int, shape [nnz]
        CSR pattern of M (N x N).
    num_nodes : int
        N.
    transpose : (indptr, indices) of M^T or None
        M^T's pattern in CSR (entries of each row by increasing row of M, as
        `graphrl.kernels.spmm.csr_transpose` makes it), if at hand: saves building it; same order.

    Returns
    -------
    numpy.ndarray, int64, shape [N]
        A permutation of ``0 .. N-1`` (`graphrl.kernels.ordering.rcm_order`).
    """
    return rcm_order(indptr, indices, int(num_nodes), transpose)


@nb.njit(nogil=True, cache=True)
def _greedy(lo, hi, indices, row_bytes, cap, budget, hubs, cached, bits, fresh):  # pragma: no cover
    """Maximal ranges of rows (entries ``lo[p]:hi[p]``) in plan order.

    A range's slot cost (its arena and its distinct sources not ``cached``, a bitmap) is <= cap, and
    the working set it implies (two slots of the largest arena and of the largest stream of the
    ranges so far, and ``hubs`` cached rows) is <= budget. Returns (bounds, -1), or (empty, p) when
    row p does not fit beside the ranges before it. ``bits`` (int64 [N/64 + 1]) and ``fresh`` are
    scratch.
    """
    n = lo.shape[0]
    bounds = np.empty(n + 1, np.int64)
    bounds[0] = 0
    k = 0
    pos = 0
    amax = 0
    smax = 0
    while pos < n:
        bits[:] = cached
        rows = 0
        entries = 0
        sources = 0
        arena = 0
        p = pos
        while p < n:
            nf = 0
            for e in range(lo[p], hi[p]):
                u = indices[e]
                w = u >> 6
                m = np.int64(1) << (u & 63)
                if bits[w] & m == 0:
                    bits[w] |= m
                    fresh[nf] = u
                    nf += 1
            deg = hi[p] - lo[p]
            a = arena_offsets(rows + 1, entries + deg, row_bytes)[4]
            s = sources + nf
            ok = slot_cost(a, s, row_bytes) <= cap
            if ok:
                ok = working_set_bytes(max(amax, a), hubs, max(smax, s), row_bytes) <= budget
            if not ok:
                for i in range(nf):
                    u = fresh[i]
                    bits[u >> 6] &= ~(np.int64(1) << (u & 63))
                break
            rows += 1
            entries += deg
            sources = s
            arena = a
            p += 1
        if p == pos:
            return bounds[:0], pos
        amax = max(amax, arena)
        smax = max(smax, sources)
        k += 1
        bounds[k] = p
        pos = p
    return bounds[: k + 1], -1


def _cut(lo, hi, k, row_bytes) -> np.ndarray:
    """Boundaries of ``k`` non-empty ranges of rows of about equal edge + byte cost."""
    n = lo.shape[0]
    cost = np.concatenate(([0], np.cumsum(8 * (hi - lo) + row_bytes + 1, dtype=np.int64)))
    cuts = np.searchsorted(cost, cost[-1] * np.arange(1, k) / k, side="left")
    bounds = np.empty(k + 1, np.int64)
    bounds[0], bounds[k] = 0, n
    for i in range(1, k):  # strictly increasing, one row left for each later range
        bounds[i] = min(max(int(cuts[i - 1]), int(bounds[i - 1]) + 1), n - (k - i))
    return bounds


def _rows(lo, hi, order, row_bytes, cap):
    """Rows in plan order as entry ranges ``lo:hi`` (of the entries in plan order) of original row
    ``vrow``; a row too large for one slot (``cap``) is split into pieces of its entries (their
    outputs are summed on the host).

    Returns (lo, hi, vrow, split rows), or None when not even one entry fits a slot.
    """
    deg = hi - lo
    big = slot_bound(1, deg, deg, row_bytes) > cap  # one row alone, its sources bounded by its entries
    if not big.any():
        return lo, hi, order, np.zeros(0, np.int64)
    m = piece_entries(cap, row_bytes)  # entries of a piece
    if m < 1:
        return None
    pieces = np.where(big, -(-deg // m), 1)
    vrow = np.repeat(order, pieces)
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    j = np.arange(vrow.shape[0]) - first  # piece number within its row
    step = np.where(np.repeat(big, pieces), m, np.repeat(deg, pieces))
    vlo = np.repeat(lo, pieces) + j * step
    vhi = np.minimum(vlo + step, np.repeat(hi, pieces))
    return vlo, vhi, vrow, np.sort(order[big])


def plan_propagation(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, order: np.ndarray,
                     width: int, itemsize: int, budget: int, dedup: bool,
                     cache_share: float = DEFAULT_CACHE_SHARE, owner: str = "samplers.full_graph",
                     partitions: int | None = None, slot_bytes: int | None = None, *,
                     cache: PlanCache | None = None) -> PartitionPlan:
    """Partitions and cache of ``M @ h`` for ``h`` of ``width`` columns within ``budget`` device bytes.

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [N + 1]; indices : numpy.ndarray, int, shape [nnz];
    weights : numpy.ndarray, float32, shape [nnz]
        M in CSR form (rows: destinations, columns: sources in ``[0, N)``).
    order : numpy.ndarray, int64, shape [N]
        Destination rows in the order partitions cut them (`locality_order`).
    width, itemsize : int
        Feature width d and bytes per item of ``h``.
    budget : int
        Device bytes the working set (cache and both slots) may take.
    dedup : bool
        Keep multiply-read source rows in a device cache (else every partition moves all it reads).
    cache_share : float
        With ``dedup``, the largest share of ``budget`` the candidates reserve for the most-read
        source rows before cutting partitions, [0, 1); 0 tries only the plan without reserve.
    owner : str
        Named in a `MemoryBudgetError`.
    partitions : int or None
        Cut exactly this many ranges, balanced by edges and bytes (None: as few as the budget allows).
    slot_bytes : int or None
        Most bytes of one partition's slot (its local CSR, output rows and streamed sources); the
        cache takes what the two slots leave of ``budget``. None: half the budget.
    cache : PlanCache or None
        Work shared with other plans of the same arrays (widths, directions, budgets); plans are the
        same with or without it. None: a fresh one.

    Returns
    -------
    PartitionPlan
        Plans of the same arrays may share (read-only) numpy arrays.

    Raises
    ------
    MemoryBudgetError
        Not even one entry (with its source and output row) fits half the budget, or ``partitions``
        ranges do not fit it (that path does not split rows).
    ValueError
        ``cache`` was used for other arrays.
    """
    ctx = PlanCache() if cache is None else cache
    ctx.bind(indptr, indices, weights, order)
    pind, pw, _ = permuted(ctx)
    row_bytes = int(width) * int(itemsize)
    budget = int(budget)
    n = order.shape[0]
    if partitions is not None:
        k = min(int(partitions), max(n, 1))
        lo, hi = whole_rows(ctx)
        bounds = _cut(lo, hi, k, row_bytes)
        uniq, offsets = distinct(ctx, lo, hi, pind, bounds, n, whole=True)
        lay = _layout(ctx, lo, hi, order, pind, bounds, uniq, offsets, n, row_bytes, budget, bool(dedup),
                      None, np.zeros(0, np.int64))
        if lay is None:
            raise MemoryBudgetError(Tier.DEVICE, owner, budget + 1, budget, budget,
                                    note=f"{k} partitions of width {width} do not fit {budget} device bytes; "
                                         "ask for more partitions or raise the budget")
        return _finish(ctx, lay, pind, pw)
    slot = budget if slot_bytes is None else int(slot_bytes)
    best = base = _plan(ctx, indptr, pind, order, int(width), row_bytes, budget, slot, owner, bool(dedup),
                        None)
    if dedup and cache_share > 0.0 and row_bytes > 0 and base.k > 1:
        # Candidates that reserve part of the budget for the most-read rows (by in-degree of the
        # transposed pattern) before cutting: partitions do not count them, so they grow, and the one
        # moving the fewest bytes wins, never more vertex bytes than the plan without reserve.
        top, floor = ranked(ctx, indices, n)
        floor *= row_bytes  # every row read moves once
        for share in _shares(float(cache_share)) if base.vertex > floor else ():
            c = min(int(share * budget) // row_bytes, top.shape[0])
            if c == 0:
                continue
            lay = _plan(ctx, indptr, pind, order, int(width), row_bytes, budget, slot, owner, True,
                        top[:c])
            if lay is not None and lay.moved < best.moved and lay.vertex <= base.vertex:
                best = lay
            if best.vertex <= floor:  # nothing moves less
                break
    return _finish(ctx, best, pind, pw)


def _shares(top: float) -> list[float]:
    """The reserve shares tried, largest first: ``top`` and fractions of it."""
    return [top * f for f in (1.0, 0.75, 0.5, 0.25)]


@dataclass
class _Layout:
    """Partitions, streamed counts and cache of one candidate plan, before its local CSRs are built."""

    lo: np.ndarray
    hi: np.ndarray
    vrow: np.ndarray
    bounds: np.ndarray
    uniq: np.ndarray
    offsets: np.ndarray
    cache: np.ndarray
    cached: np.ndarray
    streams: np.ndarray
    max_stream: int
    max_rows: int
    arena: int
    total: int
    split: np.ndarray
    row_bytes: int
    vertex: int
    moved: int
    whole: bool

    @property
    def k(self) -> int:
        return self.bounds.shape[0] - 1


def _bitmap(n: int, rows: np.ndarray | None) -> np.ndarray:
    bits = np.zeros((n >> 6) + 1, np.int64)
    if rows is not None and rows.shape[0]:
        np.bitwise_or.at(bits, rows >> 6, np.left_shift(np.int64(1), (rows & 63).astype(np.int64)))
    return bits


def _sizes(lo, hi, bounds, row_bytes):
    """Rows, entries and arena bytes of every range ``bounds[i]:bounds[i+1]``."""
    rows_of = np.diff(bounds)
    ends = np.concatenate(([0], np.cumsum(hi - lo, dtype=np.int64)))
    entries = ends[bounds[1:]] - ends[bounds[:-1]]
    return rows_of, entries, arena_offsets(rows_of, entries, row_bytes)[4]


def _plan(ctx, indptr, indices, order, width, row_bytes, budget, slot, owner, dedup, hubs) -> _Layout | None:
    """The plan of as few partitions as fit; with ``hubs`` (rows reserved for the cache first) None
    when the slots left cannot hold one entry, else a `MemoryBudgetError` then.

    Ranges are cut greedily under the exact working-set bound (both slots sized by the largest arena
    and the largest stream so far); only when one row cannot join that shape does it fall back to a
    per-slot cap, shrunk until the layout fits."""
    n = order.shape[0]
    cached = np.zeros(n, np.bool_)
    nh = 0
    reserve = 0
    if hubs is not None:
        cached[hubs] = True
        nh = hubs.shape[0]
        reserve = align(nh * row_bytes)
    cbits = _bitmap(n, hubs)
    bits = np.empty_like(cbits)
    slot_cap = min((budget - reserve) // 2, slot)
    for _ in range(60):  # shrink the slot cap until both slots of the largest parts fit
        rows = _rows(*whole_rows(ctx), order, row_bytes, slot_cap) if slot_cap > 0 else None
        if rows is None and hubs is not None:
            return None
        if rows is None:
            need = 2 * slot_bound(1, 1, 1, row_bytes)
            raise MemoryBudgetError(
                Tier.DEVICE, owner, need, budget, budget,
                note=f"one partition cannot fit: one entry at feature width {width} x {row_bytes // width} B "
                     f"needs {need // 2} bytes per double-buffered slot, more than the {slot_cap} a slot may "
                     f"take; a device budget of at least {need} bytes fits every row at this width")
        lo, hi, vrow, split = rows
        nnz = int(indptr[n])
        if hubs is None and not split.shape[0] and slot_bound(n, nnz, n, row_bytes) <= slot_cap:
            bounds = np.array([0, n], np.int64)  # all of M fits one slot (what _greedy finds, sooner)
        else:
            fresh = np.empty(max(int((hi - lo).max(initial=0)), 1), np.int64)
            bounds, bad = _greedy(lo, hi, indices, np.int64(row_bytes), np.int64(slot_cap), np.int64(budget),
                                  np.int64(nh), cbits, bits, fresh)
            if bad >= 0:  # a row (a piece of a long one) does not fit the slots' shape before it: shrink
                slot_cap = int(slot_cap * 0.95)
                continue
        k = bounds.shape[0] - 1
        uniq = offsets = None
        if k > 1:  # re-cut to balance edges and bytes over the same count where every range still fits
            better = _cut(lo, hi, k, row_bytes)
            u2, o2 = distinct(ctx, lo, hi, indices, better, n)
            _, _, arenas = _sizes(lo, hi, better, row_bytes)
            streams = streamed(u2, o2, cached)
            total = working_set_bytes(int(arenas.max()), nh, int(streams.max()), row_bytes)
            if int(slot_cost(arenas, streams, row_bytes).max()) <= slot_cap and total <= budget:
                bounds, uniq, offsets = better, u2, o2
        if uniq is None:
            uniq, offsets = distinct(ctx, lo, hi, indices, bounds, n, whole=not split.shape[0])
        lay = _layout(ctx, lo, hi, vrow, indices, bounds, uniq, offsets, n, row_bytes, budget, dedup, hubs,
                      split, cached)
        if lay is not None:
            return lay
        slot_cap = int(slot_cap * 0.95)  # cannot happen: the greedy ranges bound the working set
    if hubs is not None:
        return None
    raise MemoryBudgetError(Tier.DEVICE, owner, budget + 1, budget, budget,
                            note=f"no partitioning of width {width} fits {budget} device bytes")


def _layout(ctx, lo, hi, vrow, indices, bounds, uniq, offsets, n, row_bytes, budget, dedup, hubs, split,
            cached=None) -> _Layout | None:
    """Streamed sources and the cache for ``bounds``; None when the slots overflow the budget."""
    k = bounds.shape[0] - 1
    nnz = int((hi - lo).sum())
    rows_of, _, sizes = _sizes(lo, hi, bounds, row_bytes)
    max_rows = int(rows_of.max(initial=0))
    arena = int(sizes.max(initial=0))
    if cached is None:
        cached = np.zeros(n, np.bool_)
        if hubs is not None:
            cached[hubs] = True
    if dedup and k > 1 and row_bytes > 0:
        reads = count_ids(uniq, n)
        cached = cached.copy()
        fixed = int(np.count_nonzero(cached))
        shared = by_count(reads, (reads > 1) & ~cached)
        # grow the cache while the room left (after slots sized for the remaining streams) allows
        size = 0
        trial = cached.copy()
        for _ in range(3):
            trial[:] = cached
            trial[shared[:size]] = True
            widest = int(streamed(uniq, offsets, trial).max(initial=0))
            room = cache_rows_within(budget, arena, widest, row_bytes) - fixed  # beside the fixed rows
            size = int(min(shared.shape[0], max(room, 0)))
        cached[shared[:size]] = True
    cache = np.flatnonzero(cached).astype(np.int64)
    streams = streamed(uniq, offsets, cached) if k else np.zeros(0, np.int64)
    max_stream = int(streams.max(initial=0))
    total = max(working_set_bytes(arena, cache.shape[0], max_stream, row_bytes), 1)
    if total > budget:
        return None
    vertex = (cache.shape[0] + int(streams.sum())) * row_bytes
    moved = moved_bytes(vertex, int(rows_of.sum()), k, nnz, row_bytes)
    whole = k == 1 and not cache.shape[0] and not split.shape[0] and lo.shape[0] == n
    return _Layout(lo=lo, hi=hi, vrow=vrow, bounds=bounds, uniq=uniq, offsets=offsets, cache=cache,
                   cached=cached, streams=streams, max_stream=max_stream, max_rows=max_rows, arena=arena,
                   total=total, split=split, row_bytes=row_bytes, vertex=vertex, moved=moved, whole=whole)


def _finish(ctx, lay: _Layout, indices: np.ndarray, weights: np.ndarray) -> PartitionPlan:
    """The local CSRs and streamed sources of every partition of ``lay``: the plan."""
    if lay.whole:  # one partition, no cache: the same arrays at any width
        ends, cols, w_out, stream, cache_reads = ctx.get("whole", lambda: _local(ctx, lay, indices, weights))
    else:
        ends, cols, w_out, stream, cache_reads = _local(ctx, lay, indices, weights)
    s_offsets = np.concatenate(([0], np.cumsum(lay.streams)))
    parts = []
    bounds, split = lay.bounds, lay.split
    for i in range(lay.k):
        a, b = int(bounds[i]), int(bounds[i + 1])
        e0, e1 = int(ends[a]), int(ends[b])
        rows = lay.vrow[a:b]
        add = np.isin(rows, split) if split.shape[0] else None
        parts.append(PlanPart(rows=rows, indptr=ends[a:b + 1] - e0, cols=cols[e0:e1], weights=w_out[e0:e1],
                              stream=stream[s_offsets[i]:s_offsets[i + 1]], cache_reads=int(cache_reads[i]),
                              slot=i % 2, add=add if add is not None and add.any() else None))
    return PartitionPlan(parts=parts, cache=lay.cache, row_bytes=lay.row_bytes, max_stream=lay.max_stream,
                         max_rows=lay.max_rows, arena_bytes=lay.arena, device_bytes=lay.total,
                         split_rows=split)


def _local(ctx, lay, indices, weights):
    """Entry offsets, local columns, weights, streamed sources and cache reads of every partition."""
    k, cache, n = lay.k, lay.cache, lay.cached.shape[0]
    lo, hi, bounds = lay.lo, lay.hi, lay.bounds
    ends = np.concatenate((lo, [hi[-1] if hi.shape[0] else 0]))  # the rows tile the entries in plan order
    nnz = int(ends[-1])
    slot_of = np.full(n, -1, np.int32)
    slot_of[cache] = np.arange(cache.shape[0], dtype=np.int32)
    cols = np.empty(nnz, np.int32)
    w_out = weights  # the values in plan order, shared by every plan of the matrix
    s_offsets = np.concatenate(([0], np.cumsum(lay.streams))).astype(np.int64)
    stream = np.empty(max(int(s_offsets[-1]), 1), np.int64)
    cache_reads = np.empty(k, np.int64)
    base, ms = np.int64(cache.shape[0]), np.int64(lay.max_stream)
    threads = ctx.threads
    if k >= 4 * threads or threads == 1:  # many partitions: groups of them, each with its own scratch
        groups = work_groups(ends[bounds[1:]] - ends[bounds[:-1]], 4 * threads)

        def run(g):
            remap_partitions(indices, bounds, lay.uniq, lay.offsets, groups[g], groups[g + 1], ends,
                             s_offsets, slot_of.copy(), base, ms, cols, stream, cache_reads)

        run_parallel(run, groups.shape[0] - 1, threads)
    else:  # few large partitions: number each, then fill its rows in parallel chunks
        rows, first, _ = range_chunks(lo, hi, bounds, threads, ctx.min_chunk)
        for i in range(k):
            cache_reads[i] = number_sources(lay.uniq, lay.offsets[i], lay.offsets[i + 1], slot_of, stream,
                                     s_offsets[i])
            fst = base + (i % 2) * ms
            c0 = int(first[i])

            def run(c, c0=c0, fst=fst):
                fill_columns(indices, ends[rows[c0 + c]], ends[rows[c0 + c + 1]], slot_of, fst, cols)

            run_parallel(run, int(first[i + 1]) - c0, threads)
            slot_of[stream[s_offsets[i]:s_offsets[i + 1]]] = -1
    return ends, cols, w_out, stream[:int(s_offsets[-1])] if s_offsets[-1] else stream[:0], cache_reads

"""Partitions and deduplication plans of a staged full-graph propagation (HongTu's scheme).

A staged propagation ``out = M @ h`` (M: the normalised adjacency or its transpose, CSR by
destination row) moves data the way a GPU needs it: for each partition of destination rows, the
distinct source rows it reads are gathered from host vertex data into a device buffer, the
partition's local CSR (columns remapped into that buffer) is multiplied there, and the output rows go
back to the host. `plan_propagation` decides, for one matrix, feature width and device budget:

- the order of destination rows: `locality_order` (reverse Cuthill-McKee on the pattern of M + M^T,
  scipy), so that consecutive rows share sources;
- contiguous ranges of that order (the partitions), each within a per-slot byte cap that counts its
  local CSR, its distinct streamed sources and its output rows, then re-cut to balance edges and bytes
  over the same number of partitions where every balanced range still fits (HongTu's
  multi-objective split); the budget forces the count. A row too large for one slot (a hub) is
  split by its entries over consecutive partitions, whose partial sums are added on the host;
- with ``dedup``, a device-side cache of the source rows that more than one partition reads, most
  read first, as many as the budget leaves after the two double-buffered slots: loaded once per
  propagation, then served from the device (``dedup_hit``). Two partitionings are tried, slots as
  large as the budget allows and slots that leave ``cache_share`` of it to the cache; the one moving
  fewer vertex bytes wins, so a dedup plan never moves more than the plan without dedup.

The device buffer of sources is ``[cache rows | slot 0 | slot 1]``; a partition's local columns point
into the cache or into its slot (``slot = k % 2``), so one SpMM per partition reads both. Each slot
also has an arena for the partition's local CSR and output rows, packed at offsets of its own. Plans are
host arrays (numpy); `samplers.full_graph_stream` runs them.

References
----------
Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024 (partitioned
vertex data, deduplicated host-GPU communication, multi-objective partitioning); Cuthill and McKee,
"Reducing the bandwidth of sparse symmetric matrices", 1969 (the reverse order of George and Liu).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba as nb
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee

from graphrl.memory import MemoryBudgetError, Tier

__all__ = ["ALIGN", "DEFAULT_CACHE_SHARE", "PartitionPlan", "PlanPart", "arena_offsets", "locality_order",
           "plan_propagation"]

ALIGN = 64
# Share of the device budget that partitioning leaves to the dedup cache (the slots take the rest).
DEFAULT_CACHE_SHARE = 0.5
_FIXED = 8 + 6 * ALIGN  # a slot's extra row-pointer entry and the alignment of its arrays


def _align(n: int) -> int:
    return -(-int(n) // ALIGN) * ALIGN


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
        return len(self.parts)

    def vertex_bytes(self) -> int:
        """Vertex bytes one propagation moves to the device: the cache once, then every streamed row."""
        return (len(self.cache) + sum(p.stream.shape[0] for p in self.parts)) * self.row_bytes

    def moved_bytes(self) -> int:
        """All bytes one propagation moves: vertex rows and local CSRs in, output rows (and pieces) back."""
        structure = sum(p.indptr.nbytes + p.cols.nbytes + p.weights.nbytes for p in self.parts)
        return self.vertex_bytes() + structure + sum(p.rows.shape[0] for p in self.parts) * self.row_bytes

    def arena_offsets(self, part: PlanPart) -> tuple[int, int, int, int]:
        """Byte offsets of ``part``'s indptr, cols, weights and output rows in its slot's arena."""
        return arena_offsets(part.rows.shape[0], part.cols.shape[0], self.row_bytes)[:4]

    @property
    def src_bytes(self) -> int:
        """Bytes of the source buffer: cache rows, then two slots of ``max_stream`` rows."""
        return _align((len(self.cache) + 2 * self.max_stream) * self.row_bytes)


def arena_offsets(rows: int, entries: int, row_bytes: int) -> tuple[int, int, int, int, int]:
    """Offsets of indptr, cols, weights, out rows in a slot arena, and the arena's size (bytes)."""
    o_cols = _align(8 * (rows + 1))
    o_w = o_cols + _align(4 * entries)
    o_out = o_w + _align(4 * entries)
    return 0, o_cols, o_w, o_out, o_out + _align(rows * row_bytes)


def locality_order(indptr: np.ndarray, indices: np.ndarray, num_nodes: int) -> np.ndarray:
    """Reverse Cuthill-McKee order of the pattern of ``M + M^T`` (rows that share sources end up close).

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [N + 1]; indices : numpy.ndarray, int, shape [nnz]
        CSR pattern of M (N x N).
    num_nodes : int
        N.

    Returns
    -------
    numpy.ndarray, int64, shape [N]
        A permutation of ``0 .. N-1``.
    """
    if num_nodes == 0:
        return np.zeros(0, np.int64)
    pattern = sp.csr_matrix((np.ones(indices.shape[0], np.int8), indices, indptr),
                            shape=(num_nodes, num_nodes))
    return np.asarray(reverse_cuthill_mckee(pattern, symmetric_mode=False), dtype=np.int64)


@nb.njit(nogil=True, cache=True)
def _greedy(lo, hi, indices, row_bytes, cap, mark, fresh):  # pragma: no cover - compiled
    """Maximal ranges of rows (entries ``lo[p]:hi[p]``) whose slot cost is <= cap.

    The cost counts the local CSR, the distinct sources and the output rows; returns (bounds, -1),
    or (empty, p) when row p alone does not fit.
    """
    n = lo.shape[0]
    bounds = np.empty(n + 1, np.int64)
    bounds[0] = 0
    k = 0
    pos = 0
    stamp = 0
    while pos < n:
        stamp += 1
        rows = 0
        entries = 0
        sources = 0
        p = pos
        while p < n:
            nf = 0
            for e in range(lo[p], hi[p]):
                u = indices[e]
                if mark[u] != stamp:
                    mark[u] = stamp
                    fresh[nf] = u
                    nf += 1
            deg = hi[p] - lo[p]
            cost = (_FIXED + 8 * (rows + 1) + 8 * (entries + deg) + (rows + 1) * row_bytes
                    + (sources + nf) * row_bytes)
            if cost > cap:
                for i in range(nf):
                    mark[fresh[i]] = 0
                break
            rows += 1
            entries += deg
            sources += nf
            p += 1
        if p == pos:
            return bounds[:0], pos
        k += 1
        bounds[k] = p
        pos = p
    return bounds[: k + 1], -1


@nb.njit(nogil=True, cache=True)
def _range_cost(lo, hi, indices, a, b, row_bytes, mark, stamp):  # pragma: no cover - compiled
    sources = 0
    entries = 0
    for p in range(a, b):
        entries += hi[p] - lo[p]
        for e in range(lo[p], hi[p]):
            u = indices[e]
            if mark[u] != stamp:
                mark[u] = stamp
                sources += 1
    rows = b - a
    return _FIXED + 8 * (rows + 1) + 8 * entries + rows * row_bytes + sources * row_bytes


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


def _balanced(lo, hi, indices, k, row_bytes, cap, mark) -> np.ndarray | None:
    """``k`` ranges of equal edge + byte cost, or None when one of them would not fit ``cap``."""
    bounds = _cut(lo, hi, k, row_bytes)
    mark[:] = 0
    for i in range(k):
        if _range_cost(lo, hi, indices, bounds[i], bounds[i + 1], row_bytes, mark, i + 1) > cap:
            return None
    return bounds


def _rows(indptr, order, row_bytes, cap):
    """Rows in plan order as entry ranges ``lo:hi`` of original row ``vrow``; a row too large for one
    slot (``cap``) is split into pieces of its entries (their outputs are summed on the host).

    Returns (lo, hi, vrow, split rows), or None when not even one entry fits a slot.
    """
    lo, hi = indptr[order], indptr[order + 1]
    deg = hi - lo
    lone = _FIXED + 16 + 8 * deg + (deg + 1) * row_bytes  # one row alone, its sources bounded by its entries
    big = lone > cap
    if not big.any():
        return lo, hi, order, np.zeros(0, np.int64)
    m = (cap - _FIXED - 16 - row_bytes) // (8 + row_bytes)  # entries of a piece
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
                     partitions: int | None = None) -> PartitionPlan:
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
        With ``dedup``, the share of ``budget`` the second candidate's slots leave to the cache, [0, 1).
    owner : str
        Named in a `MemoryBudgetError`.
    partitions : int or None
        Cut exactly this many ranges, balanced by edges and bytes (None: as few as the budget allows).

    Returns
    -------
    PartitionPlan

    Raises
    ------
    MemoryBudgetError
        Not even one entry (with its source and output row) fits half the budget, or ``partitions``
        ranges do not fit it (that path does not split rows).
    """
    row_bytes = int(width) * int(itemsize)
    if partitions is not None:
        k = min(int(partitions), max(order.shape[0], 1))
        lo, hi = indptr[order], indptr[order + 1]
        plan = _build(lo, hi, order, indices, weights, _cut(lo, hi, k, row_bytes), row_bytes, int(budget),
                      bool(dedup), np.zeros(0, np.int64))
        if plan is None:
            raise MemoryBudgetError(Tier.DEVICE, owner, budget + 1, budget, budget,
                                    note=f"{k} partitions of width {width} do not fit {budget} device bytes; "
                                         "ask for more partitions or raise the budget")
        return plan
    args = (indptr, indices, weights, order, int(width), int(itemsize), int(budget), owner)
    plan = _plan(*args, bool(dedup), 0.0)
    if dedup and cache_share > 0.0 and plan.num_partitions > 1:
        # Two candidates: the slots as large as the budget allows (the cache gets what is left), and
        # slots that leave ``cache_share`` to the cache; the second wins if it moves fewer vertex bytes
        # and fewer bytes in all (its smaller slots mean more partitions, local CSRs and split pieces).
        other = _plan(*args, True, float(cache_share))
        if other.vertex_bytes() < plan.vertex_bytes() and other.moved_bytes() < plan.moved_bytes():
            plan = other
    return plan


def _plan(indptr, indices, weights, order, width, itemsize, budget, owner, dedup, share) -> PartitionPlan:
    n = order.shape[0]
    row_bytes = width * itemsize
    mark = np.zeros(n, np.int32)
    slot_cap = int(budget * (1.0 - share)) // 2
    for _ in range(60):  # shrink the slot cap until both slots of the largest parts fit
        rows = _rows(indptr, order, row_bytes, slot_cap)
        if rows is None and share > 0.0:  # the cache's share leaves too little: slots first, cache after
            share = 0.0
            slot_cap = int(budget) // 2
            continue
        if rows is None:
            need = 2 * (_FIXED + 16 + 8 + 2 * row_bytes)
            raise MemoryBudgetError(
                Tier.DEVICE, owner, need, budget, budget,
                note=f"one partition cannot fit: one entry at feature width {width} x {itemsize} B needs "
                     f"{need // 2} bytes per double-buffered slot, more than the {slot_cap} a slot may take; "
                     f"a device budget of at least {need} bytes fits every row at this width")
        lo, hi, vrow, split = rows
        mark[:] = 0
        fresh = np.empty(max(int((hi - lo).max(initial=0)), 1), np.int64)
        bounds, bad = _greedy(lo, hi, indices, np.int64(row_bytes), np.int64(slot_cap), mark, fresh)
        if bad >= 0:  # a row fits alone by its entries only if its sources are fewer; cannot happen
            raise AssertionError(f"row piece {bad} does not fit a slot of {slot_cap} bytes")
        k = bounds.shape[0] - 1
        better = _balanced(lo, hi, indices, k, row_bytes, slot_cap, mark) if k > 1 else None
        if better is not None:
            bounds = better
        plan = _build(lo, hi, vrow, indices, weights, bounds, row_bytes, budget, dedup, split)
        if plan is not None:
            return plan
        slot_cap = int(slot_cap * 0.95)
    raise MemoryBudgetError(Tier.DEVICE, owner, budget + 1, budget, budget,
                            note=f"no partitioning of width {width} fits {budget} device bytes")


@nb.njit(nogil=True, cache=True)
def _distinct(lo, hi, indices, bounds, mark, readers, uniq, offsets):  # pragma: no cover - compiled
    """Distinct sources of each partition in first-seen order (``uniq[offsets[i]:offsets[i+1]]``);
    ``readers[u]`` += 1 for every partition that reads u. ``mark`` (zeros, int32 [N]) is scratch."""
    k = bounds.shape[0] - 1
    top = 0
    for i in range(k):
        offsets[i] = top
        stamp = i + 1
        for p in range(bounds[i], bounds[i + 1]):
            for e in range(lo[p], hi[p]):
                u = indices[e]
                if mark[u] != stamp:
                    mark[u] = stamp
                    uniq[top] = u
                    top += 1
                    readers[u] += 1
    offsets[k] = top
    return top


@nb.njit(nogil=True, cache=True)
def _remap(lo, hi, indices, weights, bounds, uniq, offsets, slot_of, base, max_stream,
           cols, w_out, local_ptr, stream, s_offsets, cache_reads):  # pragma: no cover - compiled
    """Local columns (cache slot, or ``base + slot * max_stream + i`` for the i-th streamed source of
    the partition, first-seen order), weights and row pointers of every partition, concatenated."""
    k = bounds.shape[0] - 1
    e_out = 0
    s_top = 0
    for i in range(k):
        s_offsets[i] = s_top
        first = base + (i % 2) * max_stream
        hits = 0
        for j in range(offsets[i], offsets[i + 1]):  # number the streamed sources
            u = uniq[j]
            if slot_of[u] < 0:
                slot_of[u] = -2 - (s_top - s_offsets[i])  # -2 - local index: streamed in this partition
                stream[s_top] = u
                s_top += 1
            else:
                hits += 1
        cache_reads[i] = hits
        for p in range(bounds[i], bounds[i + 1]):
            local_ptr[p + i] = e_out
            for e in range(lo[p], hi[p]):
                t = slot_of[indices[e]]
                cols[e_out] = t if t >= 0 else first + (-2 - t)
                w_out[e_out] = weights[e]
                e_out += 1
        local_ptr[bounds[i + 1] + i] = e_out
        for j in range(s_offsets[i], s_top):  # back to "not cached" for the next partition
            slot_of[stream[j]] = -1
    s_offsets[k] = s_top


def _build(lo, hi, vrow, indices, weights, bounds, row_bytes, budget, dedup, split) -> PartitionPlan | None:
    """Local CSRs, streamed sources and the cache for ``bounds``; None when the slots overflow."""
    k = bounds.shape[0] - 1
    n = int(vrow.max(initial=-1)) + 1  # every destination row is in vrow: n = N
    nnz = int((hi - lo).sum())
    readers = np.zeros(n, np.int32)
    uniq = np.empty(nnz, np.int64)
    offsets = np.empty(k + 1, np.int64)
    _distinct(lo, hi, indices, bounds, np.zeros(n, np.int32), readers, uniq, offsets)
    rows_of = np.diff(bounds)
    entries = np.add.reduceat(hi - lo, bounds[:-1]) if k else np.zeros(0, np.int64)
    entries[rows_of == 0] = 0
    distinct = np.diff(offsets)
    max_rows = int(rows_of.max(initial=0))
    arena = max((arena_offsets(int(r), int(e), row_bytes)[4] for r, e in zip(rows_of, entries, strict=True)),
                default=0)
    slots = 2 * arena
    cache = np.zeros(0, np.int64)
    is_cached = np.zeros(n, bool)
    part_of = np.repeat(np.arange(k), distinct)

    def streamed() -> np.ndarray:  # per partition: its distinct sources not in the cache
        return np.bincount(part_of, weights=~is_cached[uniq[:offsets[k]]], minlength=k).astype(np.int64)

    if dedup and k > 1 and row_bytes > 0:
        shared = np.flatnonzero(readers > 1)
        shared = shared[np.argsort(-readers[shared], kind="stable")]
        # grow the cache while the room left (after slots sized for the remaining streams) allows
        size = 0
        for _ in range(3):
            is_cached[:] = False
            is_cached[shared[:size]] = True
            room = budget - slots - ALIGN - 2 * int(streamed().max(initial=0)) * row_bytes
            size = int(min(shared.shape[0], max(room // row_bytes, 0)))
        cache = np.sort(shared[:size])
        is_cached[:] = False
        is_cached[cache] = True
    max_stream = int(streamed().max(initial=0)) if k else 0
    total = max(_align((cache.shape[0] + 2 * max_stream) * row_bytes) + 2 * arena, 1)
    if total > budget:
        return None
    slot_of = np.full(n, -1, np.int64)
    slot_of[cache] = np.arange(cache.shape[0])
    cols = np.empty(nnz, np.int32)
    w_out = np.empty(nnz, np.float32)
    local_ptr = np.empty(lo.shape[0] + k, np.int64)
    stream = np.empty(max(int(offsets[k]), 1), np.int64)
    s_offsets = np.empty(k + 1, np.int64)
    cache_reads = np.empty(k, np.int64)
    _remap(lo, hi, indices, weights, bounds, uniq, offsets, slot_of, np.int64(cache.shape[0]),
           np.int64(max_stream), cols, w_out, local_ptr, stream, s_offsets, cache_reads)
    parts = []
    for i in range(k):
        a, b = int(bounds[i]), int(bounds[i + 1])
        ptr = local_ptr[a + i:b + i + 1]
        e0, e1 = int(ptr[0]), int(ptr[-1])
        rows = vrow[a:b]
        add = np.isin(rows, split) if split.shape[0] else None
        parts.append(PlanPart(rows=rows, indptr=ptr - e0, cols=cols[e0:e1], weights=w_out[e0:e1],
                              stream=stream[s_offsets[i]:s_offsets[i + 1]], cache_reads=int(cache_reads[i]),
                              slot=i % 2, add=add if add is not None and add.any() else None))
    return PartitionPlan(parts=parts, cache=cache, row_bytes=row_bytes, max_stream=max_stream,
                         max_rows=max_rows, arena_bytes=arena, device_bytes=total, split_rows=split)

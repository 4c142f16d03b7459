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
  its output rows, then re-cut to balance edges and bytes over the same number of partitions where
  every balanced range still fits (HongTu's multi-objective split); the budget forces the count. A
  row too large for one slot (a hub) is split by its entries over consecutive partitions, whose
  partial sums are added on the host;
- with ``dedup``, a device-side cache of source rows read by several partitions, loaded once per
  propagation, then served from the device (``dedup_hit``). Candidates: the partitions as large as
  the slots allow, the cache filling what they leave (most-read rows first); and partitions cut
  after reserving up to ``cache_share`` of the budget for the rows most destinations read (they do
  not count against a slot, so partitions grow). The candidate moving the fewest bytes wins, never
  more vertex bytes than the plan without dedup.

The device buffer of sources is ``[cache rows | slot 0 | slot 1]``; a partition's local columns point
into the cache or into its slot (``slot = k % 2``), so one SpMM per partition reads both. Each slot
also has an arena for the partition's local CSR and output rows, packed at offsets of its own. Plans are
host arrays (numpy); `samplers.full_graph_stream` runs them.

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

__all__ = ["ALIGN", "DEFAULT_CACHE_SHARE", "PartitionPlan", "PlanPart", "arena_offsets", "locality_order",
           "plan_propagation"]

ALIGN = 64
# Largest share of the device budget a dedup candidate reserves for the most-read rows.
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
        A permutation of ``0 .. N-1`` (`graphrl.kernels.ordering.rcm_order`).
    """
    return rcm_order(indptr, indices, int(num_nodes))


@nb.njit(nogil=True, cache=True)
def _greedy(lo, hi, indices, row_bytes, cap, cached, mark, fresh):  # pragma: no cover - compiled
    """Maximal ranges of rows (entries ``lo[p]:hi[p]``) whose slot cost is <= cap.

    The cost counts the local CSR, the distinct sources not ``cached`` and the output rows; returns
    (bounds, -1), or (empty, p) when row p alone does not fit.
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
                if mark[u] != stamp and not cached[u]:
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
def _fits(lo, hi, indices, bounds, row_bytes, cap, cached, mark):  # pragma: no cover - compiled
    """Whether every range ``bounds[i]:bounds[i+1]`` costs <= cap (as `_greedy` counts); ``mark``: zeros."""
    for i in range(bounds.shape[0] - 1):
        stamp = i + 1
        sources = 0
        entries = 0
        for p in range(bounds[i], bounds[i + 1]):
            entries += hi[p] - lo[p]
            for e in range(lo[p], hi[p]):
                u = indices[e]
                if mark[u] != stamp and not cached[u]:
                    mark[u] = stamp
                    sources += 1
        rows = bounds[i + 1] - bounds[i]
        if _FIXED + 8 * (rows + 1) + 8 * entries + rows * row_bytes + sources * row_bytes > cap:
            return False
    return True


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
                     partitions: int | None = None, slot_bytes: int | None = None) -> PartitionPlan:
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
    budget = int(budget)
    n = order.shape[0]
    if partitions is not None:
        k = min(int(partitions), max(n, 1))
        lo, hi = indptr[order], indptr[order + 1]
        lay = _layout(lo, hi, order, indices, _cut(lo, hi, k, row_bytes), n, row_bytes, budget, bool(dedup),
                      None, np.zeros(0, np.int64))
        if lay is None:
            raise MemoryBudgetError(Tier.DEVICE, owner, budget + 1, budget, budget,
                                    note=f"{k} partitions of width {width} do not fit {budget} device bytes; "
                                         "ask for more partitions or raise the budget")
        return _finish(lay, indices, weights)
    slot = budget if slot_bytes is None else int(slot_bytes)
    best = base = _plan(indptr, indices, order, int(width), row_bytes, budget, slot, owner, bool(dedup), None)
    if dedup and cache_share > 0.0 and row_bytes > 0 and base.k > 1:
        # Candidates that reserve part of the budget for the most-read rows (by in-degree of the
        # transposed pattern) before cutting: partitions do not count them, so they grow, and the one
        # moving the fewest bytes wins, never more vertex bytes than the plan without reserve.
        readers = np.bincount(indices, minlength=n)
        ranked = np.argsort(-readers, kind="stable")
        ranked = ranked[:int(np.count_nonzero(readers > 1))]
        floor = int(np.count_nonzero(readers)) * row_bytes  # every row read moves once
        for share in _shares(float(cache_share)) if base.vertex > floor else ():
            c = min(int(share * budget) // row_bytes, ranked.shape[0])
            if c == 0:
                continue
            lay = _plan(indptr, indices, order, int(width), row_bytes, budget, slot, owner, True, ranked[:c])
            if lay is not None and lay.moved < best.moved and lay.vertex <= base.vertex:
                best = lay
            if best.vertex <= floor:  # nothing moves less
                break
    return _finish(best, indices, weights)


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
    max_stream: int
    max_rows: int
    arena: int
    total: int
    split: np.ndarray
    row_bytes: int
    vertex: int
    moved: int

    @property
    def k(self) -> int:
        return self.bounds.shape[0] - 1


def _plan(indptr, indices, order, width, row_bytes, budget, slot, owner, dedup, hubs) -> _Layout | None:
    """The plan of as few partitions as fit; with ``hubs`` (rows reserved for the cache first) None
    when the slots left cannot hold one entry, else a `MemoryBudgetError` then."""
    n = order.shape[0]
    mark = np.zeros(n, np.int32)
    cached = np.zeros(n, np.bool_)
    reserve = 0
    if hubs is not None:
        cached[hubs] = True
        reserve = _align(hubs.shape[0] * row_bytes)
    slot_cap = min((budget - reserve) // 2, slot)
    for _ in range(60):  # shrink the slot cap until both slots of the largest parts fit
        rows = _rows(indptr, order, row_bytes, slot_cap) if slot_cap > 0 else None
        if rows is None and hubs is not None:
            return None
        if rows is None:
            need = 2 * (_FIXED + 16 + 8 + 2 * row_bytes)
            raise MemoryBudgetError(
                Tier.DEVICE, owner, need, budget, budget,
                note=f"one partition cannot fit: one entry at feature width {width} x {row_bytes // width} B "
                     f"needs {need // 2} bytes per double-buffered slot, more than the {slot_cap} a slot may "
                     f"take; a device budget of at least {need} bytes fits every row at this width")
        lo, hi, vrow, split = rows
        nnz = int(indptr[n])
        whole = _FIXED + 8 * (n + 1) + 8 * nnz + 2 * n * row_bytes
        if hubs is None and not split.shape[0] and whole <= slot_cap:
            bounds = np.array([0, n], np.int64)  # all of M fits one slot (what _greedy finds, sooner)
        else:
            mark[:] = 0
            fresh = np.empty(max(int((hi - lo).max(initial=0)), 1), np.int64)
            bounds, bad = _greedy(lo, hi, indices, np.int64(row_bytes), np.int64(slot_cap), cached, mark,
                                  fresh)
            if bad >= 0:  # a row fits alone by its entries only if its sources are fewer; cannot happen
                raise AssertionError(f"row piece {bad} does not fit a slot of {slot_cap} bytes")
        k = bounds.shape[0] - 1
        if k > 1:  # re-cut to balance edges and bytes over the same count where every range still fits
            better = _cut(lo, hi, k, row_bytes)
            mark[:] = 0
            if _fits(lo, hi, indices, better, np.int64(row_bytes), np.int64(slot_cap), cached, mark):
                bounds = better
        lay = _layout(lo, hi, vrow, indices, bounds, n, row_bytes, budget, dedup, hubs, split)
        if lay is not None:
            return lay
        slot_cap = int(slot_cap * 0.95)
    if hubs is not None:
        return None
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
def _streamed(uniq, offsets, cached):  # pragma: no cover - compiled
    """Per partition, its distinct sources that are not ``cached``."""
    k = offsets.shape[0] - 1
    out = np.zeros(k, np.int64)
    for i in range(k):
        c = 0
        for j in range(offsets[i], offsets[i + 1]):
            if not cached[uniq[j]]:
                c += 1
        out[i] = c
    return out


def _layout(lo, hi, vrow, indices, bounds, n, row_bytes, budget, dedup, hubs, split) -> _Layout | None:
    """Streamed sources and the cache for ``bounds``; None when the slots overflow the budget."""
    k = bounds.shape[0] - 1
    deg = hi - lo
    nnz = int(deg.sum())
    if k == 1 and lo.shape[0] == n and not split.shape[0]:  # all of M, whole rows: its sources, ascending
        readers = np.minimum(np.bincount(indices, minlength=n), 1).astype(np.int32)
        uniq = np.flatnonzero(readers).astype(np.int64)
        offsets = np.array([0, uniq.shape[0]], np.int64)
    else:
        readers = np.zeros(n, np.int32)
        uniq = np.empty(nnz, np.int64)
        offsets = np.empty(k + 1, np.int64)
        _distinct(lo, hi, indices, bounds, np.zeros(n, np.int32), readers, uniq, offsets)
    rows_of = np.diff(bounds)
    ends = np.concatenate(([0], np.cumsum(deg, dtype=np.int64)))
    entries = ends[bounds[1:]] - ends[bounds[:-1]]
    max_rows = int(rows_of.max(initial=0))
    sizes = _align_all(8 * (rows_of + 1)) + 2 * _align_all(4 * entries) + _align_all(rows_of * row_bytes)
    arena = int(sizes.max(initial=0))
    cached = np.zeros(n, np.bool_)
    if hubs is not None:
        cached[hubs] = True
    if dedup and k > 1 and row_bytes > 0:
        fixed = int(np.count_nonzero(cached))
        shared = np.flatnonzero((readers > 1) & ~cached)
        shared = shared[np.argsort(-readers[shared], kind="stable")]
        # grow the cache while the room left (after slots sized for the remaining streams) allows
        size = 0
        trial = cached.copy()
        for _ in range(3):
            trial[:] = cached
            trial[shared[:size]] = True
            widest = int(_streamed(uniq, offsets, trial).max(initial=0))
            room = budget - 2 * arena - ALIGN - 2 * widest * row_bytes - fixed * row_bytes
            size = int(min(shared.shape[0], max(room // row_bytes, 0)))
        cached[shared[:size]] = True
    cache = np.flatnonzero(cached).astype(np.int64)
    streams = _streamed(uniq, offsets, cached) if k else np.zeros(0, np.int64)
    max_stream = int(streams.max(initial=0))
    total = max(_align((cache.shape[0] + 2 * max_stream) * row_bytes) + 2 * arena, 1)
    if total > budget:
        return None
    vertex = (cache.shape[0] + int(streams.sum())) * row_bytes
    moved = vertex + 8 * (int(rows_of.sum()) + k) + 8 * nnz + int(rows_of.sum()) * row_bytes
    return _Layout(lo=lo, hi=hi, vrow=vrow, bounds=bounds, uniq=uniq, offsets=offsets, cache=cache,
                   max_stream=max_stream, max_rows=max_rows, arena=arena, total=total, split=split,
                   row_bytes=row_bytes, vertex=vertex, moved=moved)


def _align_all(n: np.ndarray) -> np.ndarray:
    return -(-n // ALIGN) * ALIGN


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


def _finish(lay: _Layout, indices: np.ndarray, weights: np.ndarray) -> PartitionPlan:
    """The local CSRs and streamed sources of every partition of ``lay``: the plan."""
    k, cache, n = lay.k, lay.cache, lay.vrow.max(initial=-1) + 1
    nnz = int((lay.hi - lay.lo).sum())
    slot_of = np.full(int(n), -1, np.int64)
    slot_of[cache] = np.arange(cache.shape[0])
    cols = np.empty(nnz, np.int32)
    w_out = np.empty(nnz, np.float32)
    local_ptr = np.empty(lay.lo.shape[0] + k, np.int64)
    stream = np.empty(max(int(lay.offsets[k]), 1), np.int64)
    s_offsets = np.empty(k + 1, np.int64)
    cache_reads = np.empty(k, np.int64)
    _remap(lay.lo, lay.hi, indices, weights, lay.bounds, lay.uniq, lay.offsets, slot_of,
           np.int64(cache.shape[0]), np.int64(lay.max_stream), cols, w_out, local_ptr, stream, s_offsets,
           cache_reads)
    parts = []
    bounds, split = lay.bounds, lay.split
    for i in range(k):
        a, b = int(bounds[i]), int(bounds[i + 1])
        ptr = local_ptr[a + i:b + i + 1]
        e0, e1 = int(ptr[0]), int(ptr[-1])
        rows = lay.vrow[a:b]
        add = np.isin(rows, split) if split.shape[0] else None
        parts.append(PlanPart(rows=rows, indptr=ptr - e0, cols=cols[e0:e1], weights=w_out[e0:e1],
                              stream=stream[s_offsets[i]:s_offsets[i + 1]], cache_reads=int(cache_reads[i]),
                              slot=i % 2, add=add if add is not None and add.any() else None))
    return PartitionPlan(parts=parts, cache=cache, row_bytes=lay.row_bytes, max_stream=lay.max_stream,
                         max_rows=lay.max_rows, arena_bytes=lay.arena, device_bytes=lay.total,
                         split_rows=split)

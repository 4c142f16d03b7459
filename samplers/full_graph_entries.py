"""A matrix's entries in plan order and the threaded passes over them that its plans share.

`samplers.full_graph_plan.plan_propagation` decides partitions and a cache; the work it does over the
entries of M (CSR by destination row) lives here, kept in a `PlanCache` that every plan of one matrix
(any width, budget, dedup, direction of a symmetric matrix) may share:

- `permuted`: M's columns and values with rows in plan order (each in its own entry order), and their
  row starts, gathered once on the cache's threads; `whole_rows`: the rows as entry ranges of that;
- `readers` / `count_ids`: how many destinations read each source row; `ranked`: the rows read more
  than once, most-read first (`by_count`, a stable counting sort);
- `distinct`: the distinct sources of each range of rows, in first-seen order, in chunks on threads
  (`range_chunks`, `work_groups` split the work; `run_parallel` runs it); `streamed`: per range, the
  ones not cached.

Every pass gives bitwise the same result for any thread count (chunks are merged in order). Kernels:
`samplers.kernels.cpu.partition`; threads: `graphrl.kernels.team.parallel_for`.

References
----------
Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024 (the plans these
passes serve).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels.prefetch import prefetch
from graphrl.kernels.team import parallel_for
from graphrl.threads import team_size
from samplers.kernels.cpu.partition import compact_chunks, distinct_chunks, merge_chunks

__all__ = ["PlanCache", "by_count", "count_ids", "distinct", "permuted", "range_chunks", "ranked", "readers",
           "run_parallel", "streamed", "whole_rows", "work_groups"]


class PlanCache:
    """Work the plans of one matrix share (any width, budget or dedup): its entries in plan order
    (whose values every plan's parts view), its read counts and ranking, and the single-partition
    local CSR; and the threads planning may use.

    Pass the same object to every `plan_propagation` of one ``(indptr, indices, weights, order)``
    (both directions of a symmetric matrix passed as the same arrays included); it keeps references
    to them and refuses others. It holds about ``nnz * 8`` bytes besides: drop it once planned.

    Parameters
    ----------
    threads : int or None
        Threads the planning kernels may use, the caller included (None: `graphrl.threads.team_size`);
        plans are bitwise the same for any count.
    min_chunk : int
        Fewest entries of one piece of parallel work.

    Raises
    ------
    ValueError
        ``threads`` or ``min_chunk`` < 1 (here), or arrays other than the first planned for (on use).

    Example
    -------
    >>> cache = PlanCache()   # doctest: +SKIP
    >>> plans = [plan_propagation(*op, order, d, 4, budget, True, cache=cache) for d in (64, 256)]
    """

    def __init__(self, threads: int | None = None, min_chunk: int = 1 << 16) -> None:
        threads = team_size() if threads is None else int(threads)
        if threads < 1 or int(min_chunk) < 1:
            raise ValueError(f"threads={threads} and min_chunk={min_chunk} must be >= 1")
        self.threads = threads
        self.min_chunk = int(min_chunk)
        self.arrays: tuple | None = None
        self.store: dict = {}

    def bind(self, indptr, indices, weights, order) -> None:
        """Tie the cache to one operator and order on first use; a different one is a `ValueError`."""
        arrays = (indptr, indices, weights, order)
        if self.arrays is None:
            self.arrays = arrays
        elif any(a is not b for a, b in zip(self.arrays, arrays, strict=True)):
            raise ValueError("cache: a PlanCache serves the (indptr, indices, weights, order) it first "
                             "planned "
                             "for; pass a new PlanCache() for another operator or order")

    def get(self, key, make):
        """The value kept under ``key``, made by ``make()`` on first use."""
        if key not in self.store:
            self.store[key] = make()
        return self.store[key]


def readers(ctx, indices, n):
    """Destinations that read each source row (``np.bincount(indices, minlength=n)``), kept in ``ctx``."""
    return ctx.get("readers", lambda: count_ids(indices, n))


def ranked(ctx, indices, n):
    """Rows read by more than one destination, most-read first (stable), and the count of rows read;
    kept in ``ctx``."""
    def make():
        counts = readers(ctx, indices, n)
        return by_count(counts, counts > 1), int(np.count_nonzero(counts))
    return ctx.get("ranked", make)


@nb.njit(nogil=True, cache=True)
def count_ids(ids, n):  # pragma: no cover - compiled
    """``np.bincount(ids, minlength=n)`` as int64, without a converted copy of ``ids``."""
    out = np.zeros(n, np.int64)
    for e in range(ids.shape[0]):
        out[ids[e]] += 1
    return out


@nb.njit(nogil=True, cache=True)
def by_count(counts, keep):  # pragma: no cover - compiled
    """The ids u with ``keep[u]``, by decreasing ``counts[u]``, ties by id (a stable counting sort)."""
    top = 0
    m = 0
    for u in range(counts.shape[0]):
        if keep[u]:
            top = max(top, counts[u])
            m += 1
    start = np.zeros(top + 2, np.int64)
    for u in range(counts.shape[0]):
        if keep[u]:
            start[top - counts[u] + 1] += 1
    for c in range(top + 1):
        start[c + 1] += start[c]
    out = np.empty(m, np.int64)
    for u in range(counts.shape[0]):
        if keep[u]:
            out[start[top - counts[u]]] = u
            start[top - counts[u]] += 1
    return out


def whole_rows(ctx):
    """``lo, hi`` of the rows in plan order (no row split), in the entries in plan order (`permuted`)."""
    start = permuted(ctx)[2]
    return start[:-1], start[1:]


def permuted(ctx):
    """The entries of M in plan order (rows by ``order``, each in its own entry order): columns,
    values and row starts. Every later pass then reads them front to back."""
    def make():
        indptr, indices, weights, order = ctx.arrays
        start = np.concatenate(([0], np.cumsum(indptr[order + 1] - indptr[order], dtype=np.int64)))
        cols = np.empty(int(start[-1]), indices.dtype)
        vals = np.empty(int(start[-1]), np.float32)
        threads = ctx.threads
        groups = work_groups(np.diff(start) + 1, 4 * threads)

        def run(g):
            _gather(indptr, indices, weights, order, start, groups[g], groups[g + 1], cols, vals)

        run_parallel(run, groups.shape[0] - 1, threads)
        return cols, vals, start
    return ctx.get("permuted", make)


@nb.njit(nogil=True, cache=True)
def _gather(indptr, indices, weights, order, start, r0, r1, cols, vals):  # pragma: no cover - compiled
    """Entries of rows ``order[r0:r1]`` to ``cols``/``vals`` at ``start``."""
    for r in range(r0, r1):
        if r + 8 < r1:
            prefetch(indices, indptr[order[r + 8]])
            prefetch(weights, indptr[order[r + 8]])
        o = start[r]
        for e in range(indptr[order[r]], indptr[order[r] + 1]):
            cols[o] = indices[e]
            vals[o] = weights[e]
            o += 1


def work_groups(work: np.ndarray, parts: int) -> np.ndarray:
    """Boundaries of at most ``parts`` consecutive groups of items of about equal ``work``."""
    m = work.shape[0]
    if m == 0:
        return np.zeros(1, np.int64)
    cum = np.cumsum(work, dtype=np.float64)
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts, side="right")
    return np.unique(np.concatenate(([0], np.minimum(cuts, m), [m]))).astype(np.int64)


def range_chunks(lo, hi, bounds, threads, min_chunk):
    """Row ranges that split every range ``bounds[i]:bounds[i+1]`` into pieces of about equal entries
    (only ranges larger than a share of the work are split), and each range's first chunk."""
    ends = np.concatenate(([0], np.cumsum(hi - lo, dtype=np.int64)))
    k = bounds.shape[0] - 1
    entries = ends[bounds[1:]] - ends[bounds[:-1]]
    target = max(int(ends[-1]) // (4 * threads), min_chunk) if threads > 1 else 1 << 62
    pieces = np.maximum(-(-entries // target), 1)
    first = np.concatenate(([0], np.cumsum(pieces)))
    rows = np.empty(int(first[-1]) + 1, np.int64)
    for i in range(k):
        a, b, m = int(bounds[i]), int(bounds[i + 1]), int(pieces[i])
        if m == 1:
            rows[first[i]] = a
            continue
        cut = np.searchsorted(ends[a:b + 1], ends[a] + entries[i] * np.arange(m) // m, side="left") + a
        rows[first[i]:first[i + 1]] = np.minimum(np.maximum.accumulate(cut), b)
    rows[-1] = bounds[-1]
    return rows, first, ends


def distinct(ctx, lo, hi, indices, bounds, n, whole=False):
    """Distinct sources of each range in first-seen order: ``uniq[offsets[i]:offsets[i+1]]`` (int32 or
    the dtype of ``indices``). Chunks of rows run on the cache's threads; the result does not depend
    on how many."""
    k = bounds.shape[0] - 1
    if k == 1 and whole and lo.shape[0] == n:  # all of M, whole rows: its sources, ascending
        uniq = ctx.get("sources", lambda: np.flatnonzero(readers(ctx, indices, n)).astype(indices.dtype))
        return uniq, np.array([0, uniq.shape[0]], np.int64)
    threads = ctx.threads
    rows, first, ends = range_chunks(lo, hi, bounds, threads, ctx.min_chunk)
    nc = rows.shape[0] - 1
    starts = ends[rows[:-1]]
    out = ctx.store.pop("scratch", None)  # kept between calls (not shared by concurrent ones)
    if out is None or out.shape[0] < max(int(ends[-1]), 1):
        out = np.empty(max(int(ends[-1]), 1), indices.dtype)
    counts = np.zeros(nc, np.int64)
    words = (n >> 6) + 1
    groups = work_groups(np.diff(ends[rows]), 4 * threads)

    def run(g):
        distinct_chunks(lo, hi, indices, rows, starts, groups[g], groups[g + 1], np.zeros(words, np.int64),
                         out, counts)

    run_parallel(run, groups.shape[0] - 1, threads)
    if nc > k:  # ranges of several chunks: merge their lists in order
        part = np.zeros(k, np.int64)
        multi = np.flatnonzero(np.diff(first) > 1)

        def merge(j):
            i = int(multi[j])
            part[i] = merge_chunks(starts, counts, first[i], first[i + 1], np.zeros(words, np.int64), out)

        run_parallel(merge, multi.shape[0], threads)
        rc = counts[first[:-1]].copy()
        rc[multi] = part[multi]
        starts, counts = starts[first[:-1]], rc
    uniq = np.empty(int(counts.sum()), indices.dtype)
    offsets = np.empty(k + 1, np.int64)
    compact_chunks(out, starts, counts, uniq, offsets)
    ctx.store["scratch"] = out
    return uniq, offsets


def run_parallel(fn, n, threads):
    """Call ``fn(i)`` for ``i`` in ``range(n)``: in this thread, or on ``threads`` of the team."""
    if threads <= 1 or n <= 1:
        for i in range(n):
            fn(i)
    else:
        parallel_for(fn, n, threads)


@nb.njit(nogil=True, cache=True)
def streamed(uniq, offsets, cached):  # pragma: no cover - compiled
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

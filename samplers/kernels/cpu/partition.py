"""Numba kernels of a staged full-graph plan: distinct sources and local columns.

`distinct_chunks` lists the distinct source columns of chunks of rows in first-seen order (a bitmap of
seen ids, left zeroed), `merge_chunks` merges the chunks of one partition in place and `compact_chunks`
packs them into one array with offsets: `samplers.full_graph_entries.distinct` calls these three.
`remap_partitions` numbers each partition's streamed sources (`number_sources`) and rewrites its
entries' columns into the device buffer (`fill_columns`): `samplers.full_graph_plan` calls these
three when it builds a plan's local CSRs. Each kernel but `compact_chunks` works on a range of chunks
or partitions, so its caller runs it on the thread team (`samplers.full_graph_entries.run_parallel`,
over `graphrl.kernels.team.parallel_for`); the results do not depend on the thread count. Inputs are
trusted (the plan builds them).
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["compact_chunks", "distinct_chunks", "fill_columns", "merge_chunks", "number_sources",
           "remap_partitions"]


@nb.njit(nogil=True, cache=True)
def distinct_chunks(lo, hi, indices, rows, starts, c0, c1, bits, out, counts):  # pragma: no cover
    """Distinct sources of chunks ``c0..c1-1`` (rows ``rows[c]:rows[c+1]``), in first-seen order, into
    ``out[starts[c]:]``; ``counts[c]`` their number. ``bits`` (int64 [N/64 + 1], zeros) is scratch,
    left zero."""
    for c in range(c0, c1):
        top = starts[c]
        for p in range(rows[c], rows[c + 1]):
            for e in range(lo[p], hi[p]):
                u = indices[e]
                m = np.int64(1) << (u & 63)
                if bits[u >> 6] & m == 0:
                    bits[u >> 6] |= m
                    out[top] = u
                    top += 1
        counts[c] = top - starts[c]
        for j in range(starts[c], top):
            u = out[j]
            bits[u >> 6] = 0


@nb.njit(nogil=True, cache=True)
def merge_chunks(starts, counts, c0, c1, bits, out):  # pragma: no cover - compiled
    """Merge the first-seen lists of chunks ``c0..c1-1`` (one range) in place at ``out[starts[c0]:]``:
    the range's first-seen order. Returns their number; ``bits`` (zeros) is left zero."""
    top = starts[c0]
    for c in range(c0, c1):
        for j in range(starts[c], starts[c] + counts[c]):
            u = out[j]
            m = np.int64(1) << (u & 63)
            if bits[u >> 6] & m == 0:
                bits[u >> 6] |= m
                out[top] = u
                top += 1
    for j in range(starts[c0], top):
        u = out[j]
        bits[u >> 6] = 0
    return top - starts[c0]


@nb.njit(nogil=True, cache=True)
def compact_chunks(out, starts, counts, uniq, offsets):  # pragma: no cover - compiled
    top = 0
    for i in range(counts.shape[0]):
        offsets[i] = top
        for j in range(starts[i], starts[i] + counts[i]):
            uniq[top] = out[j]
            top += 1
    offsets[counts.shape[0]] = top


@nb.njit(nogil=True, cache=True)
def number_sources(uniq, j0, j1, slot_of, stream, s0):  # pragma: no cover - compiled
    """Number one partition's streamed sources (``slot_of[u] = -2 - i`` for the i-th, first-seen order)
    into ``stream[s0:]``; returns how many of its sources are cached (``slot_of >= 0``)."""
    s = s0
    hits = 0
    for j in range(j0, j1):
        u = uniq[j]
        if slot_of[u] < 0:
            slot_of[u] = -2 - (s - s0)
            stream[s] = u
            s += 1
        else:
            hits += 1
    return hits


@nb.njit(nogil=True, cache=True)
def fill_columns(indices, e0, e1, slot_of, first, cols):  # pragma: no cover - compiled
    """Local columns of entries ``e0..e1-1`` (in plan order): the cache slot, or ``first + i`` for the
    i-th streamed source."""
    for e in range(e0, e1):
        t = slot_of[indices[e]]
        cols[e] = t if t >= 0 else first + (-2 - t)


@nb.njit(nogil=True, cache=True)
def remap_partitions(indices, bounds, uniq, offsets, i0, i1, ends, s_offsets, slot_of, base, max_stream, cols,
                     stream, cache_reads):  # pragma: no cover - compiled
    """`number_sources` and `fill_columns` of partitions ``i0..i1-1`` with one scratch ``slot_of`` (left as
    it came)."""
    for i in range(i0, i1):
        cache_reads[i] = number_sources(uniq, offsets[i], offsets[i + 1], slot_of, stream, s_offsets[i])
        first = base + (i % 2) * max_stream
        fill_columns(indices, ends[bounds[i]], ends[bounds[i + 1]], slot_of, first, cols)
        for j in range(s_offsets[i], s_offsets[i + 1]):
            slot_of[stream[j]] = -1

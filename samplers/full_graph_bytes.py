"""The byte rules of a staged full-graph propagation: how a partition's data is laid out on the device.

One rule, one place, for every full-graph path: the planner (`samplers.full_graph_plan`) sizes its
partitions, slots and working set with them, the staged executor (`samplers.full_graph_stream`) packs
its slot arenas with them, and the host path (`samplers.full_graph_host.working_set_layout`) packs its
working set with `csr_offsets`. Planning kernels compile the same functions (``register_jitable``), so
the compiled plan and the Python plan agree byte for byte.

Main names:

- `ALIGN` (64) and `align`: every array in a device buffer starts at a multiple of `ALIGN` bytes;
  `SLOT_OVERHEAD`: at most what a slot adds to its arrays' bytes (the extra row-pointer entry and
  the alignment of its arrays).
- `csr_offsets`: a partition's local CSR (int64 row pointer, columns, float32 weights) and output rows
  packed in one buffer; `arena_offsets`: the same at int32 columns, the end aligned (a slot arena).
- `source_bytes`: the device source buffer ``[cache rows | slot 0 | slot 1]``; `working_set_bytes`: it
  and two slot arenas (what a device budget bounds); `slot_cost`: what one partition takes of its slot.
- `slot_bound`: an upper bound of `slot_cost` that needs no layout (whether a row, or all of M, fits a
  slot); `piece_entries`: its inverse, the most entries of one row alone in a slot; `cache_rows_within`:
  the inverse of `working_set_bytes`, the cache rows a budget surely holds beside two slots.
- `moved_bytes`: host-device bytes of one propagation (vertex rows and local CSRs in, outputs back).

All take ints (bytes, rows, entries), most also int64 numpy arrays elementwise, and raise nothing.

Example: ``arena_offsets(rows, entries, 64 * 4)`` gives the byte offsets of a slot arena's indptr,
cols, weights and output rows and its size, for a partition of ``rows`` rows and ``entries`` entries
at width 64 in float32.
"""

from __future__ import annotations

from numba.extending import register_jitable

__all__ = ["ALIGN", "SLOT_OVERHEAD", "align", "arena_offsets", "cache_rows_within", "csr_offsets",
           "moved_bytes", "piece_entries", "slot_bound", "slot_cost", "source_bytes", "working_set_bytes"]

ALIGN = 64
SLOT_OVERHEAD = 8 + 6 * ALIGN  # a slot's extra row-pointer entry and the alignment of its arrays


@register_jitable
def align(n):
    """``n`` bytes rounded up to a multiple of `ALIGN` (int, or numpy int64 array elementwise); planning
    kernels compile the same function."""
    return -(-n // ALIGN) * ALIGN


@register_jitable
def csr_offsets(rows, entries, index_bytes, row_bytes):
    """Byte layout of a partition's local CSR and output rows packed in one buffer: the one rule of the
    staged path's slot arenas (`arena_offsets`) and the host path's working set
    (`samplers.full_graph_host.working_set_layout`).

    Parameters
    ----------
    rows, entries : int, or numpy.ndarray of int64 (elementwise)
        A partition's rows and local CSR entries.
    index_bytes : int
        Bytes of one column index (4 or 8).
    row_bytes : int
        Bytes of one output row (width x itemsize).

    Returns
    -------
    tuple of 5 int (or int64 arrays)
        Byte offsets of the int64 row pointer (0), the columns, the float32 weights and the output rows,
        each aligned to `ALIGN`, and the end of the output rows (not aligned). Planning kernels compile
        the same function.
    """
    o_cols = align(8 * (rows + 1))
    o_w = o_cols + align(index_bytes * entries)
    o_out = o_w + align(4 * entries)
    return 0, o_cols, o_w, o_out, o_out + rows * row_bytes


@register_jitable
def arena_offsets(rows, entries, row_bytes):
    """Offsets of indptr, cols, weights, out rows in a slot arena, and the arena's size: `csr_offsets` at
    int32 columns, its end aligned to `ALIGN` (two arenas sit back to back). Ints, or int64 arrays
    elementwise (``rows``, ``entries``); planning kernels compile the same function."""
    o_ptr, o_cols, o_w, o_out, end = csr_offsets(rows, entries, 4, row_bytes)
    return o_ptr, o_cols, o_w, o_out, align(end)


@register_jitable
def source_bytes(cache_rows, stream_rows, row_bytes):
    """Bytes of the device source buffer ``[cache rows | slot 0 | slot 1]``, slots of ``stream_rows`` rows
    (ints: rows, and bytes a row); raises nothing."""
    return align((cache_rows + 2 * stream_rows) * row_bytes)


@register_jitable
def working_set_bytes(arena, cache_rows, stream_rows, row_bytes):
    """Bytes of the device working set: the source buffer (`source_bytes`) and two slot arenas of
    ``arena`` bytes (`arena_offsets`); a plan's ``device_bytes`` and what a budget bounds. Ints (rows and
    bytes); raises nothing."""
    return source_bytes(cache_rows, stream_rows, row_bytes) + 2 * arena


@register_jitable
def slot_cost(arena, stream_rows, row_bytes):
    """Bytes one partition takes of its slot: its arena and its ``stream_rows`` streamed source rows; at
    most ``slot_bytes`` (`plan_propagation`). Ints, or int64 arrays elementwise (one per partition); raises
    nothing."""
    return arena + stream_rows * row_bytes


@register_jitable
def slot_bound(rows, entries, sources, row_bytes):
    """At least `slot_cost` of a partition of ``rows`` rows, ``entries`` entries and ``sources`` streamed
    rows, whatever its alignment: its arrays' bytes and `SLOT_OVERHEAD`. Ints, or int64 arrays
    elementwise; raises nothing."""
    return SLOT_OVERHEAD + 8 * (rows + 1) + 8 * entries + (rows + sources) * row_bytes


@register_jitable
def piece_entries(cap, row_bytes):
    """The most entries ``e`` of one row that fit a slot of ``cap`` bytes alone with their ``e`` sources
    (``slot_bound(1, e, e, row_bytes) <= cap``); below 1 when not even one does. Ints; raises nothing."""
    return (cap - SLOT_OVERHEAD - 16 - row_bytes) // (8 + row_bytes)


@register_jitable
def cache_rows_within(budget, arena, stream_rows, row_bytes):
    """The most cache rows that surely fit ``budget`` beside two slot arenas of ``arena`` bytes and two
    slots of ``stream_rows`` rows (`working_set_bytes` with its alignment at its most); may be negative.
    Ints, ``row_bytes`` > 0; raises nothing."""
    return (budget - 2 * arena - ALIGN - 2 * stream_rows * row_bytes) // row_bytes


def moved_bytes(vertex: int, rows: int, parts: int, entries: int, row_bytes: int) -> int:
    """Bytes one propagation moves: ``vertex`` bytes of source rows, the local CSRs of ``parts``
    partitions (``rows`` rows and ``entries`` entries in all: int64 row pointers, int32 columns, float32
    weights) in, and ``rows`` output rows of ``row_bytes`` back (ints); raises nothing."""
    return vertex + 8 * (rows + parts) + 8 * entries + rows * row_bytes

"""The kernels of typed layers on the GPU (`samplers.kernels.cuda.typed`): one work list of (relation,
destination row) items over a concatenated CSC (`typed.TypedCsc`), item j of relation slot k at row ``i``
of its destination type.

``typed_plan`` counts each item's outputs (a thread per item), ``typed_rows`` chooses and gathers them (a
thread per item) and ``typed_choose`` does so for the `WARP_ROWS` items (a warp per item), each through the
homogeneous kernels' per-row device functions (`...cuda.uniform.uniform_row`, `...cuda.uniform.choose_row`,
`...cuda.weighted.weighted_row`), so the blocks equal the per-relation launches' and the CPU's. The host
side (parameters, launches, outputs) is `samplers.kernels.cuda.typed`.

References
----------
GraphBolt's ``FusedCSCSamplingGraph`` (DGL): one CSC with per-edge types, sampled in one pass over all
edge types.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda

from samplers.kernels.cuda.launch import WARP
from samplers.kernels.cuda.rows import lower_bound, output_count, row_span, upper_bound
from samplers.kernels.cuda.uniform import THREAD_FANOUT_MAX, choose_row, take_position, uniform_row
from samplers.kernels.cuda.weighted import eligible_weighted, weighted_row
from samplers.kernels.reference import SHORT_ROW_MAX

__all__ = ["DRAWS", "WARP_ROWS", "WEIGHTED", "typed_choose", "typed_plan", "typed_rows"]

WEIGHTED = np.int64(1)
"""Item flag: the relation draws by weight."""
DRAWS = np.int64(2)
"""Item flag: the relation draws with replacement (replace and fanout >= 0)."""
WARP_ROWS = np.int64(4)
"""Item flag: a uniform relation whose rows take a warp each (``typed_choose``) instead of a thread
(``typed_rows``): `...cuda.uniform.warp_per_row`, fanout -1 or above `THREAD_FANOUT_MAX`."""


@cuda.jit(device=True)
def _item(item_off, n_rel, j):  # pragma: no cover - device
    """Work item j: (its relation's slot k, its row i within the relation)."""
    k = lower_bound(item_off, 0, n_rel + 1, j + 1) - 1
    return k, j - item_off[k]


@cuda.jit(device=True)
def _valid(nrows, nrow_at, k, i):  # pragma: no cover - device
    """Whether row i of relation slot k is a row: all are where ``nrow_at[k] < 0`` (exact sizes), else
    the first ``nrows[nrow_at[k]]`` (a chain's count on the device; the rest of an upper bound)."""
    return nrow_at[k] < 0 or i < nrows[nrow_at[k]]


@cuda.jit(device=True)
def _outputs(out_indptr, out_base, scan_base, out_end, k, j):  # pragma: no cover - device
    """Item j's first output and output count (relation slot k): from ``out_base[k] + out_indptr[j] -
    out_indptr[scan_base[k]]``; count 0 where they would pass ``out_end[k]`` (a chain's capacity: the item
    is skipped, an overflow that the chain's read reports)."""
    o = out_indptr[j]
    c = out_indptr[j + 1] - o
    o += out_base[k] - out_indptr[scan_base[k]]
    if o + c > out_end[k]:
        c = np.int64(0)
    return o, c


@cuda.jit
def typed_plan(indptr, weights, positive, frontier, item_off, row_base, dst_base, fanout, flags, excl, counts,
               rel_indptr, nrows, nrow_at):  # pragma: no cover - device
    """Each item's output count (a thread per item): uniform rows from the degree, weighted rows from
    the positive count, excluded positions removed, 0 past a relation's row count (`_valid`); writes
    the leading 0 of each relation's indptr."""
    n_rel = row_base.shape[0]
    n_items = item_off[n_rel]
    n_excl = excl.shape[0]
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    k = j
    while k < n_rel:
        rel_indptr[item_off[k] + k] = 0
        k += stride
    while j < n_items:
        k, i = _item(item_off, n_rel, j)
        if _valid(nrows, nrow_at, k, i):
            g = row_base[k] + frontier[dst_base[k] + i]
            s, e, a, b = row_span(indptr, excl, n_excl, g)
            if flags[k] & WEIGHTED:
                d = eligible_weighted(weights, positive, excl, a, b, g)
            else:
                d = e - s - (b - a)
            counts[j] = output_count(d, fanout[k], (flags[k] & DRAWS) != 0)
        else:
            counts[j] = 0
        j += stride


@cuda.jit
def typed_rows(indptr, indices, edge_ids, weights, prefix, positive, frontier, item_off, row_base, dst_base,
               flags, keys, excl, out_indptr, src, eids, rel_indptr, out_base, scan_base, out_end, sizes,
               size_at):  # pragma: no cover - device
    """Choose and gather every item's outputs (a thread per item; `WARP_ROWS` items are left to
    ``typed_choose``) with its relation's key and rule at ``out_base[k] + out_indptr[j] -
    out_indptr[scan_base[k]]`` (packed: both 0), items past ``out_end[k]`` skipped (`_outputs`), and write
    each relation's own indptr (rebased to 0) into ``rel_indptr``. Where ``size_at[k] >= 0`` (a chain),
    thread 0 writes relation k's edge count at ``sizes[size_at[k]]`` and its source group's (the relations
    from ``scan_base[k]`` to ``size_at[n_rel + k]``'s item: the items written, a prefix of them where
    one passes ``out_end[k]``) at ``sizes[size_at[2 n_rel + k]]``."""
    sub = cuda.local.array(THREAD_FANOUT_MAX, numba.int64)
    sums = cuda.local.array(SHORT_ROW_MAX, numba.float64)
    n_rel = row_base.shape[0]
    n_items = item_off[n_rel]
    n_excl = excl.shape[0]
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    if j == 0:
        for k in range(n_rel):
            if size_at[k] >= 0:
                lo = out_indptr[scan_base[k]]
                sizes[size_at[k]] = out_indptr[item_off[k + 1]] - out_indptr[item_off[k]]
                cap = lo + out_end[k] - out_base[k]
                q = upper_bound(out_indptr, scan_base[k], size_at[n_rel + k] + 1, cap) - 1
                sizes[size_at[2 * n_rel + k]] = out_indptr[q] - lo
    while j < n_items:
        k, i = _item(item_off, n_rel, j)
        o, c = _outputs(out_indptr, out_base, scan_base, out_end, k, j)
        if c > 0 and (flags[k] & WARP_ROWS) == 0:
            v = frontier[dst_base[k] + i]
            g = row_base[k] + v
            draws = (flags[k] & DRAWS) != 0
            key = np.uint64(keys[k])
            if flags[k] & WEIGHTED:
                weighted_row(indptr, indices, edge_ids, True, weights, prefix, positive, g, v, o, c, draws,
                             key, excl, n_excl, src, eids, sums)
            else:
                uniform_row(indptr, indices, edge_ids, True, g, v, o, c, draws, key, excl, n_excl, src, eids,
                            sub)
        rel_indptr[item_off[k] + k + i + 1] = out_indptr[j + 1] - out_indptr[item_off[k]]
        j += stride


@cuda.jit
def typed_choose(indptr, indices, edge_ids, frontier, item_off, row_base, dst_base, flags, keys, excl,
                 out_indptr, out_base, scan_base, out_end, pos, aux, src, eids):  # pragma: no cover - device
    """The `WARP_ROWS` items' outputs, a warp (one block) per item, placed as ``typed_rows`` places them:
    positions chosen by `...cuda.uniform.choose_row` (the plain warp rows' rule) into ``pos`` (``aux``
    its scratch), then gathered by the lanes (`...cuda.uniform.take_position`)."""
    lane = cuda.threadIdx.x
    n_rel = row_base.shape[0]
    n_items = item_off[n_rel]
    n_excl = excl.shape[0]
    j = cuda.blockIdx.x
    while j < n_items:
        k, i = _item(item_off, n_rel, j)
        o, c = _outputs(out_indptr, out_base, scan_base, out_end, k, j)
        if c > 0 and (flags[k] & WARP_ROWS) != 0:
            v = frontier[dst_base[k] + i]
            s, e, a, b = row_span(indptr, excl, n_excl, row_base[k] + v)
            choose_row(lane, v, s, e - s - (b - a), a, b, o, c, (flags[k] & DRAWS) != 0, np.uint64(keys[k]),
                       excl, pos, aux)
            cuda.syncthreads()
            q = lane
            while q < c:
                take_position(indices, edge_ids, True, pos[o + q], src, eids, o + q)
                q += WARP
        cuda.syncthreads()
        j += cuda.gridDim.x

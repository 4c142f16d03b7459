"""Uniform rows on the GPU: Floyd's algorithm and draws with replacement, then the gather.

``sample_rows`` (0 <= fanout <= `THREAD_FANOUT_MAX`, the usual minibatch fanouts) runs a thread per row,
choosing and gathering in one pass (Floyd's subset in a per-thread array); ``choose_uniform`` (other
fanouts) runs a warp per row: take-all rows copied by all lanes, draws with replacement one per lane,
Floyd's algorithm run by lane 0 keeping the subset sorted; ``gather`` then reads a thread per edge.
``take_all`` (fanout -1 in a chain) writes every non-excluded in-edge a thread per output edge, each
finding its row in the output offsets. The subsets are the reference's, so the blocks equal the CPU's.

References
----------
Bentley and Floyd (CACM 1987), Floyd's algorithm; Pandey et al., C-SAW (SC 2020), warp-per-row sampling.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda

from samplers.kernels.cuda.launch import WARP
from samplers.kernels.cuda.rng import GOLDEN, bounded, draw, mix, row_state
from samplers.kernels.cuda.rows import row_span, upper_bound, virtual_to_real

__all__ = ["THREAD_FANOUT_MAX", "choose_row", "choose_uniform", "gather", "sample_rows", "take_all",
           "take_position", "uniform_row", "warp_per_row"]

THREAD_FANOUT_MAX = 64  # uniform layers with 0 <= fanout <= this run one thread per row (`sample_rows`)


def warp_per_row(fanout: int) -> bool:
    """Whether uniform rows at ``fanout`` take a warp each (`choose_uniform`, `choose_row`) rather than a
    thread each (`sample_rows`, `uniform_row`): at fanout -1 or above `THREAD_FANOUT_MAX`, with or without
    replacement (a thread keeps Floyd's subset in a local array of `THREAD_FANOUT_MAX` entries; with
    replacement a row makes ``fanout`` draws, which a warp's lanes share). The one rule of the plain layers
    (`...cuda.layer`, `...cuda.bounded`; a chain's fanout -1 takes a thread per edge) and the typed ones
    (`...cuda.typed`); either way the positions are the same, so only the work per thread differs."""
    return not 0 <= fanout <= THREAD_FANOUT_MAX


@cuda.jit(device=True)
def choose_row(lane, node, s, deg, a, b, o, c, draws, key, excl, pos, aux):  # pragma: no cover - device
    """A warp's uniform row (``lane`` its lane, every lane of the block calls it): the CSC positions of the
    row's c > 0 outputs into pos[o:o + c], drawn with the stream of node ``node``; the row spans CSC
    positions [s, ...) with ``deg`` eligible ones and its excluded positions at excl[a:b]. Take-all rows
    are copied by all lanes, draws with replacement one per lane, Floyd's subset by lane 0, kept sorted
    (aux[o:o + c] holds the left-out positions). `choose_uniform` and the typed graphs' warp rows
    (`...cuda.typed`) choose through it."""
    shift = s if a == b else 0  # rows with excluded edges choose virtual positions, mapped below
    if c == deg and not draws:
        j = lane
        while j < c:
            pos[o + j] = shift + j
            j += WARP
    elif draws:
        state0 = row_state(key, node)
        j = lane
        while j < c:
            pos[o + j] = shift + bounded(draw(state0, j + 1), np.uint64(deg))
            j += WARP
    elif lane == 0:
        # Floyd's m-subset, kept sorted in out[o:o + m]; m = k, or the d - k left out
        state = row_state(key, node)
        m = c if 2 * c <= deg else deg - c
        take = m == c
        for n in range(m):
            j = deg - m + n
            state += GOLDEN
            t = bounded(mix(state), np.uint64(j + 1))
            taken = False
            for q in range(o, o + n):
                if (pos[q] if take else aux[q]) == t:
                    taken = True
            x = j if taken else t
            q = o + n
            if take:
                while q > o and pos[q - 1] > x:
                    pos[q] = pos[q - 1]
                    q -= 1
                pos[q] = x
            else:
                while q > o and aux[q - 1] > x:
                    aux[q] = aux[q - 1]
                    q -= 1
                aux[q] = x
        if take:
            for q in range(o, o + c):
                pos[q] += shift
        else:
            q = o
            w = o
            for p in range(deg):
                if q < o + m and aux[q] == p:
                    q += 1
                else:
                    pos[w] = shift + p
                    w += 1
    if a < b:  # map virtual positions to CSC positions, each lane its own outputs
        cuda.syncthreads()
        j = lane
        while j < c:
            pos[o + j] = virtual_to_real(excl, a, b, s, pos[o + j])
            j += WARP


@cuda.jit
def choose_uniform(dst, row_start, row_deg, row_exlo, row_exhi, out_indptr, fanout, replace, key, excl, pos,
                   aux):  # pragma: no cover - device
    lane = cuda.threadIdx.x
    row = cuda.blockIdx.x
    draws = replace and fanout >= 0
    while row < dst.shape[0]:
        o = out_indptr[row]
        c = out_indptr[row + 1] - o
        if c > 0:
            choose_row(lane, dst[row], row_start[row], row_deg[row], row_exlo[row], row_exhi[row], o, c,
                       draws, key, excl, pos, aux)
        cuda.syncthreads()
        row += cuda.gridDim.x


@cuda.jit(device=True)
def take_position(indices, edge_ids, has_eids, q, src, eids, j):  # pragma: no cover - device
    """Write output j from CSC position q: its source and edge id (q itself without edge ids)."""
    src[j] = indices[q]
    eids[j] = edge_ids[q] if has_eids else q


@cuda.jit(device=True)
def _emit(indices, edge_ids, has_eids, excl, a, b, s, p, src, eids, j):  # pragma: no cover - device
    """Write output j for virtual position p of a row starting at CSC position s."""
    q = s + p if a == b else virtual_to_real(excl, a, b, s, p)
    take_position(indices, edge_ids, has_eids, q, src, eids, j)


@cuda.jit(device=True)
def uniform_row(indptr, indices, edge_ids, has_eids, row, node, o, c, replace, key, excl, n_excl, src, eids,
                sub):  # pragma: no cover - device
    """One uniform row's c outputs, written to src[o:o + c] and eids[o:o + c]: row ``row`` of ``indptr``,
    drawn with the stream of node ``node`` (the two differ in a concatenated CSC: `...cuda.typed`);
    ``sub`` is a per-thread int64 array of THREAD_FANOUT_MAX entries (Floyd's subset, c <= that size
    without replacement unless c is the row's degree)."""
    s, e, a, b = row_span(indptr, excl, n_excl, row)
    deg = e - s - (b - a)
    if replace:
        state0 = row_state(key, node)
        for j in range(c):
            p = bounded(draw(state0, j + 1), np.uint64(deg))
            _emit(indices, edge_ids, has_eids, excl, a, b, s, p, src, eids, o + j)
    elif c == deg:
        for j in range(c):
            _emit(indices, edge_ids, has_eids, excl, a, b, s, j, src, eids, o + j)
    else:
        # Floyd's m-subset, sorted; m = c, or the deg - c positions left out
        state = row_state(key, node)
        m = c if 2 * c <= deg else deg - c
        for n in range(m):
            j = deg - m + n
            state += GOLDEN
            t = bounded(mix(state), np.uint64(j + 1))
            x = t
            for q in range(n):
                if sub[q] == t:
                    x = j
                    break
            q = n
            while q > 0 and sub[q - 1] > x:
                sub[q] = sub[q - 1]
                q -= 1
            sub[q] = x
        if m == c:
            for j in range(c):
                _emit(indices, edge_ids, has_eids, excl, a, b, s, sub[j], src, eids, o + j)
        else:
            q = 0
            w = o
            for p in range(deg):
                if q < m and sub[q] == p:
                    q += 1
                else:
                    _emit(indices, edge_ids, has_eids, excl, a, b, s, p, src, eids, w)
                    w += 1


@cuda.jit
def sample_rows(indptr, indices, edge_ids, has_eids, dst, out_indptr, fanout, replace, key, excl, src,
                eids):  # pragma: no cover - device
    """Uniform rows with 0 <= fanout <= THREAD_FANOUT_MAX, one thread per row, positions chosen and
    their sources and edge ids gathered in one pass (no position array). Floyd's subset lives in a
    per-thread array, insertion-sorted; the choices are the reference's, so the blocks equal the CPU's."""
    sub = cuda.local.array(THREAD_FANOUT_MAX, numba.int64)
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_excl = excl.shape[0]
    while i < dst.shape[0]:
        o = out_indptr[i]
        c = out_indptr[i + 1] - o
        if c > 0:
            uniform_row(indptr, indices, edge_ids, has_eids, dst[i], dst[i], o, c, replace, key, excl, n_excl,
                        src, eids, sub)
        i += stride


@cuda.jit
def gather(indices, edge_ids, has_eids, pos, nnz, src, eids):  # pragma: no cover - device
    """The sources and edge ids of the first ``nnz[0]`` positions (``pos`` may be longer: a bound; a count
    past its end, a chain's overflow, is clamped to it)."""
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = nnz[0] if nnz[0] < pos.shape[0] else pos.shape[0]  # (builtin min does not compile to PTX here)
    while j < n:
        take_position(indices, edge_ids, has_eids, pos[j], src, eids, j)
        j += stride


@cuda.jit
def take_all(indptr, indices, edge_ids, has_eids, dst, out_indptr, excl, nnz, src,
             eids):  # pragma: no cover - device
    """Every non-excluded in-edge of each row (fanout -1), a thread per output edge: output j belongs to
    the last row whose offset is <= j (rows past a chain's count are empty) and is that row's virtual
    position ``j - out_indptr[row]``. Outputs past ``src``'s end (a chain's capacity: an overflow, read
    back with the chain's sizes) are not written."""
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = nnz[0] if nnz[0] < src.shape[0] else src.shape[0]
    n_excl = excl.shape[0]
    rows = dst.shape[0]
    while j < n:
        row = upper_bound(out_indptr, 0, rows + 1, j) - 1
        s, e, a, b = row_span(indptr, excl, n_excl, dst[row])
        _emit(indices, edge_ids, has_eids, excl, a, b, s, j - out_indptr[row], src, eids, j)
        j += stride

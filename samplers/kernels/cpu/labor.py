"""LABOR rows on the CPU: each row's c_t (and the importance-sampling pi), the kept count, the kept
positions and their edge weights; the arithmetic is `samplers.kernels.labor_rows`'.

`labor_layer` runs one layer of one relation: plan (c_t per row; with importance sampling, the
fixed-point iterations over pi), count, prefix sum, choose and gather, the row passes in chunks on
the caller and the helper threads. The returned edges are not relabelled.
"""

from __future__ import annotations

import math
import types

import numba as nb
import numpy as np

from samplers.kernels import labor_rows
from samplers.kernels.cpu import rng
from samplers.kernels.cpu.eligible import excl_range
from samplers.kernels.cpu.threads import parallel_chunks
from samplers.kernels.cpu.uniform import NO_PAIRS, gather_edges
from samplers.kernels.cpu.workspace import exclusion_arrays

__all__ = ["LaborScratch", "labor_layer"]

# Without NRT: the row helpers take arrays and branch per edge, and numba would reference-count those
# arrays at every call inside the row loops (docs/performance.md, "LABOR and the one layer loop"); LLVM
# inlines them.
_ROWS = labor_rows.compile_for(nb.njit(_nrt=False), types.SimpleNamespace(
    row_state=rng.row_state, draw=rng.draw, unit=rng.unit))
start_c = _ROWS.start_c
solve_c = _ROWS.solve_c
count_kept = _ROWS.count_kept
take_kept = _ROWS.take_kept
hop_max_row = _ROWS.hop_max_row
hop_apply_row = _ROWS.hop_apply_row
hop_reset_row = _ROWS.hop_reset_row

_CHUNK_ROWS = 2048
_NO_PI = np.zeros(1, dtype=np.float64)
_NO_W = np.zeros(1, dtype=np.float32)
_NO_SLOTS = np.zeros(1, dtype=np.int64)  # `labor_rows.pi_index`'s slots: pi is per candidate edge here


class LaborScratch:
    """Per-source-space scratch of importance sampling: the max of c_t per source (float64, zeros)
    and the first edge of each source (int64, `labor_rows.NO_OWNER`), both restored after each use."""

    def __init__(self, num_src: int) -> None:
        self.hop = np.zeros(max(num_src, 1), dtype=np.float64)
        self.owner = np.full(max(num_src, 1), labor_rows.NO_OWNER, dtype=np.int64)


@nb.njit(nogil=True, cache=True)
def _init_rows(indptr, dst, fanout, excl, excl_rows, weights, has_w, row_s, row_e, row_a, row_b, cs, lo, hi):
    for i in range(lo, hi):
        v = dst[i]
        s = indptr[v]
        e = indptr[v + 1]
        a, b = excl_range(excl, excl_rows, v, s, e)
        row_s[i] = s
        row_e[i] = e
        row_a[i] = a
        row_b[i] = b
        cs[i] = start_c(fanout, weights, has_w, excl, a, b, s, e)


@nb.njit(nogil=True, cache=True)
def _hop_max(indices, weights, has_w, use_w, excl, row_s, row_e, row_a, row_b, raw_off, cs, hop, owner):
    """hop[u] = max over the rows' eligible edges (t, u) of c_t (times A with ``use_w``); owner[u] =
    the first such edge's frontier index (sequential: rows share sources)."""
    for i in range(row_s.shape[0]):
        hop_max_row(indices, weights, has_w, use_w, excl, row_a[i], row_b[i], row_s[i], row_e[i], raw_off[i],
                    cs[i], hop, owner)


@nb.njit(nogil=True, cache=True)
def _hop_apply(indices, weights, has_w, excl, row_s, row_e, row_a, row_b, raw_off, hop, owner, pi, first,
               contrib, lo, hi):
    for i in range(lo, hi):
        contrib[i] = hop_apply_row(indices, weights, has_w, excl, row_a[i], row_b[i], row_s[i], row_e[i],
                                   raw_off[i], hop, owner, pi, first)


@nb.njit(nogil=True, cache=True)
def _hop_reset(indices, row_s, row_e, hop, owner):
    for i in range(row_s.shape[0]):
        hop_reset_row(indices, row_s[i], row_e[i], hop, owner)


@nb.njit(nogil=True, cache=True)
def _solve_rows(fanout, indices, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off, cs,
                lo, hi):
    for i in range(lo, hi):
        if cs[i] > 0:
            cs[i] = solve_c(cs[i], fanout, indices, _NO_SLOTS, weights, has_w, pi, has_pi, raw_off[i], excl,
                            row_a[i], row_b[i], row_s[i], row_e[i])


@nb.njit(nogil=True, cache=True)
def _count_rows(indices, weights, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off, cs, vkey,
                counts, lo, hi):
    for i in range(lo, hi):
        counts[i + 1] = 0 if cs[i] == 0 else count_kept(indices, _NO_SLOTS, weights, has_w, pi, has_pi,
                                                        raw_off[i], excl, row_a[i], row_b[i], row_s[i],
                                                        row_e[i], cs[i], vkey)


@nb.njit(nogil=True, cache=True)
def _take_rows(indices, edge_ids, has_eids, pairs, has_pairs, weights, has_w, pi, has_pi, excl, row_s, row_e,
               row_a, row_b, raw_off, cs, vkey, out_indptr, pos, ew, want_w, src, lo, hi):
    for i in range(lo, hi):
        o = out_indptr[i]
        n = out_indptr[i + 1] - o
        if n > 0:
            take_kept(indices, _NO_SLOTS, weights, has_w, pi, has_pi, raw_off[i], excl, row_a[i], row_b[i],
                      row_s[i], row_e[i], cs[i], vkey, pos, ew, want_w, o, n)
    gather_edges(indices, edge_ids, has_eids, pairs, has_pairs, pos, src, out_indptr[lo], out_indptr[hi])


def _run(fn, d_count: int, helpers: int) -> None:
    bounds = np.arange(0, d_count + _CHUNK_ROWS, _CHUNK_ROWS).clip(max=d_count)
    if bounds.shape[0] <= 2 or helpers == 0:
        fn(0, d_count)
    else:
        parallel_chunks(lambda i: fn(bounds[i], bounds[i + 1]), bounds.shape[0] - 1, helpers)


def labor_layer(indptr: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray | None, dst: np.ndarray,
                fanout: int, vkey: int, excluded: np.ndarray | None, weights: np.ndarray | None,
                importance_sampling: int, want_weights: bool, scratch: LaborScratch | None,
                threads: int = 1, *, pairs: np.ndarray | None = None,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """One LABOR layer of one relation (DGL's ``CSRLaborPick``), unrelabelled.

    Parameters
    ----------
    indptr : int64 [N + 1]; indices : int32/int64 [E]; edge_ids : int64 [E] or None (identity)
    dst : int64 [D], trusted in range
    fanout : int, k >= 0 or -1 (every eligible edge)
    vkey : int, the variate key (one per layer, or per call with layer dependency; per source type)
    excluded : int64 [X] sorted distinct CSC positions, or None
    weights : float32 [E] (CSC order, >= 0) or None
    importance_sampling : int, i of LABOR-i (negative: iterate until the expected sources converge)
    want_weights : bool, return the kept edges' weights
    scratch : LaborScratch over the source ids (needed when importance sampling runs)
    threads : int, threads that may work on the row passes (the caller included)
    pairs : int32 [2E] or None, the (source, edge id) pairs of `samplers._csc.edge_pairs`: the gather
        reads them in place of ``indices`` and ``edge_ids``

    Returns
    -------
    out_indptr : int64 [D + 1]; src : [nnz] sources (the indices' dtype); eids : int64 [nnz];
    edge_weights : float64 [nnz] or None
    """
    helpers = max(int(threads) - 1, 0)
    d_count = dst.shape[0]
    excl, excl_rows = exclusion_arrays(indptr, excluded)
    has_w = weights is not None
    w = _NO_W if weights is None else weights
    fanout = np.int64(fanout)
    row = np.empty((4, d_count), dtype=np.int64)
    row_s, row_e, row_a, row_b = row
    cs = np.empty(d_count, dtype=np.float64)
    _run(lambda lo, hi: _init_rows(indptr, dst, fanout, excl, excl_rows, w, has_w, row_s, row_e, row_a, row_b,
                                   cs, lo, hi), d_count, helpers)
    raw_off = np.zeros(d_count + 1, dtype=np.int64)
    np.cumsum(row_e - row_s, out=raw_off[1:])
    pi, has_pi = _NO_PI, False
    rounds = labor_rows.iterations(importance_sampling, has_w)
    if rounds != 0 and d_count:
        pi = np.empty(max(int(raw_off[-1]), 1), dtype=np.float64)
        contrib = np.empty(d_count, dtype=np.float64)
        prev = float(raw_off[-1])
        it = 0
        while rounds < 0 or it < rounds:
            update = not has_w or it > 0
            if update and scratch is None:
                raise ValueError("importance sampling needs a LaborScratch over the source ids")
            if update:
                _hop_max(indices, w, has_w, has_w and it == 1, excl, row_s, row_e, row_a, row_b, raw_off, cs,
                         scratch.hop, scratch.owner)
                first = not has_pi
                _run(lambda lo, hi, first=first: _hop_apply(
                    indices, w, has_w, excl, row_s, row_e, row_a, row_b, raw_off, scratch.hop, scratch.owner,
                    pi, first, contrib, lo, hi), d_count, helpers)
                _hop_reset(indices, row_s, row_e, scratch.hop, scratch.owner)
                has_pi = True
            _run(lambda lo, hi, has_pi=has_pi: _solve_rows(
                fanout, indices, w, has_w, pi, has_pi, excl, row_s, row_e, row_a, row_b, raw_off, cs, lo, hi),
                d_count, helpers)
            if update:
                expected = math.fsum(contrib)
                if labor_rows.converged(prev, expected, it):
                    break
                prev = expected
            it += 1
    keep_pi = has_pi and importance_sampling != 0
    counts = np.zeros(d_count + 1, dtype=np.int64)
    key = np.uint64(vkey)
    _run(lambda lo, hi: _count_rows(indices, w, has_w, pi, keep_pi, excl, row_s, row_e, row_a, row_b, raw_off,
                                    cs, key, counts, lo, hi), d_count, helpers)
    out_indptr = np.cumsum(counts)
    nnz = int(out_indptr[-1])
    pos = np.empty(nnz, dtype=np.int64)
    src = np.empty(nnz, dtype=indices.dtype)
    ew = np.empty(nnz if want_weights else 1, dtype=np.float64)
    has_eids = edge_ids is not None
    eids_arr = edge_ids if has_eids else np.empty(0, np.int64)
    want = bool(want_weights)
    has_pairs = pairs is not None
    pair_arr = pairs if has_pairs else NO_PAIRS
    _run(lambda lo, hi: _take_rows(indices, eids_arr, has_eids, pair_arr, has_pairs, w, has_w, pi, keep_pi,
                                   excl, row_s, row_e, row_a, row_b, raw_off, cs, key, out_indptr, pos, ew,
                                   want, src, lo, hi), d_count, helpers)
    return out_indptr, src, pos, (ew if want_weights else None)

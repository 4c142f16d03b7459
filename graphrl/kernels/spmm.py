"""Sparse (CSR) times dense products as numba kernels: arrays in, arrays out.

Two families share one row body (`_spmm_row`: ``out[o] = sum_e weights[e] * h[indices[e]]`` over the
entries of row ``v`` in storage order, so a row's result never depends on threads):

- `csr_spmm_serial` / `csr_spmm_parallel` and the transposed `csr_spmm_t_serial` /
  `csr_spmm_t_parallel`: the whole product at once. The parallel ones run ``nogil`` kernels over row
  ranges on the kernel team (`graphrl.kernels.parallel_for`: dynamic claiming, no OpenMP fork-join),
  with the thread count of `graphrl.threads.threads_for` (serial below ``SERIAL_WORK``); the
  transposed kernel gives each thread a range of output rows and scans every entry, so it needs no
  transposed copy of the matrix. Both builds give the same bits for any number of threads. Used by
  `graphrl.nn.csr_spmm` on sampled blocks and by `graphrl.nn.graph_filter`.
- `spmm_partition`: one destination partition of a full-graph propagation (as `samplers.full_graph`
  runs it),
  staged the way a GPU would run it: the partition's rows of the matrix are copied into a workspace
  (on the memory manager's device tier), the output rows are computed there from the host-resident
  vertex data read in place, and copied back to the host output. Rows are cut into chunks of about
  `CHUNK_WORK` multiply-adds that helper threads claim dynamically (`graphrl.kernels.parallel_for`),
  so the result is bitwise the same for any number of threads.

Also `csr_transpose` (a stable counting sort: the transposed rows list their entries by original row)
and `normalized_adjacency` (the entries of ``D_in^a (A + I) D_out^b`` in CSR form). Tuning figures:
docs/performance.md.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels.prefetch import prefetch as _prefetch
from graphrl.kernels.team import parallel_for
from graphrl.threads import SERIAL_WORK, threads_for

__all__ = [
    "CHUNK_WORK",
    "chunk_bounds",
    "csr_spmm_parallel",
    "csr_spmm_serial",
    "csr_spmm_t_parallel",
    "csr_spmm_t_serial",
    "csr_transpose",
    "normalized_adjacency",
    "spmm_partition",
]

# Multiply-adds per chunk of a partitioned product.
CHUNK_WORK = 1 << 22


@nb.njit(nogil=True, cache=True)
def _prefetch_plan(row_bytes):
    """Cache lines to hint per source row (at most 16) and how many entries ahead (about 4 KiB ahead)."""
    lines = min((row_bytes + 63) // 64, 16)
    ahead = min(max(4096 // max(lines * 64, 1), 4), 64)
    return lines, ahead


@nb.njit(nogil=True, cache=True, inline="always")
def _spmm_row(indptr, indices, weights, h, hf, out, v, o, ahead, lines, step, e_end):
    """``out[o, :] = sum_{e in row v} weights[e] * h[indices[e], :]``, entries in storage order.

    With ``ahead > 0`` it first prefetches ``lines`` cache lines (``step`` items apart) of the source
    row ``ahead`` entries on (``hf`` is ``h`` flattened; entries at or past ``e_end`` are not looked
    at): the rows are random reads, and the hint lets the core keep more of them in flight.
    """
    d = h.shape[1]
    for j in range(d):
        out[o, j] = 0.0
    for e in range(indptr[v], indptr[v + 1]):
        if ahead > 0 and e + ahead < e_end:
            p = indices[e + ahead] * d
            for k in range(lines):
                _prefetch(hf, p + k * step)
        u = indices[e]
        w = weights[e]
        for j in range(d):
            out[o, j] += w * h[u, j]


@nb.njit(nogil=True, cache=True)
def _spmm_rows(indptr, indices, weights, h, out, lo, hi):
    """``out[v] = sum_{e in row v} weights[e] * h[indices[e]]`` for rows v in [lo, hi)."""
    for v in range(lo, hi):
        _spmm_row(indptr, indices, weights, h, h, out, v, v, 0, 0, 1, 0)


@nb.njit(nogil=True, cache=True)
def _spmm_t_range(indptr, indices, weights, g, out, lo, hi):
    """Output rows [lo, hi) of ``out = M^T @ g``: scan every entry of M, keep those whose column is in
    [lo, hi), so each output row is summed in entry order."""
    d = g.shape[1]
    n_dst = indptr.shape[0] - 1
    for u in range(lo, hi):
        for j in range(d):
            out[u, j] = 0.0
    for v in range(n_dst):
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if lo <= u < hi:
                w = weights[e]
                for j in range(d):
                    out[u, j] += w * g[v, j]


@nb.njit(nogil=True, cache=True)
def csr_spmm_serial(indptr, indices, weights, h, out):
    """``out[v] = sum_{e in row v} weights[e] * h[indices[e]]`` for every row, on the calling thread.

    ``indptr`` int32/int64 [D + 1], ``indices`` int [nnz] in [0, S), ``weights`` [nnz], ``h`` [S, d],
    ``out`` [D, d] (written). `csr_spmm_parallel` gives the same bits.
    """
    _spmm_rows(indptr, indices, weights, h, out, 0, indptr.shape[0] - 1)


@nb.njit(nogil=True, cache=True)
def csr_spmm_t_serial(indptr, indices, weights, g, out, parts):
    """``out = M^T @ g`` for the CSR matrix M, without a transposed copy of M, on the calling thread.

    ``indptr`` [D + 1], ``indices`` [nnz] in [0, S), ``weights`` [nnz], ``g`` [D, d], ``out`` [S, d]
    (written). The output rows are cut into ``parts`` ranges, each scanning every entry; each output row
    is summed in entry order whatever ``parts`` is (`csr_spmm_t_parallel` gives the same bits).
    """
    n_src = out.shape[0]
    for t in range(parts):
        _spmm_t_range(indptr, indices, weights, g, out, n_src * t // parts, n_src * (t + 1) // parts)


def _row_chunks(indptr: np.ndarray, width: int, threads: int) -> np.ndarray:
    """Row boundaries of about four chunks per thread (at least `SERIAL_WORK` multiply-adds each, at
    most `CHUNK_WORK`), so that the threads that run claim the chunks of one that does not."""
    ip = np.asarray(indptr, dtype=np.int64)
    rows = ip.shape[0] - 1
    work = (int(ip[-1]) + rows) * max(int(width), 1)
    per_chunk = min(CHUNK_WORK, max(SERIAL_WORK, work // (4 * threads)))
    return chunk_bounds(ip, 0, rows, width, per_chunk)


def csr_spmm_parallel(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, h: np.ndarray,
                      out: np.ndarray, threads: int | None = None) -> None:
    """`csr_spmm_serial` on the kernel team (`graphrl.kernels.parallel_for`): row chunks claimed
    dynamically, each row summed in entry order by one thread, so the result is bitwise that of
    `csr_spmm_serial` for any number of threads.

    Parameters
    ----------
    indptr : numpy.ndarray, int32 or int64, shape [D + 1]
    indices : numpy.ndarray, int32 or int64, shape [nnz], trusted in [0, S)
    weights : numpy.ndarray, dtype of ``h`` (or float32), shape [nnz]
    h : numpy.ndarray, float32 or float64, shape [S, d]
    out : numpy.ndarray, float32 or float64, shape [D, d]; written
    threads : int or None
        Threads, the caller included; None: `graphrl.threads.threads_for` of the multiply-adds (1 below
        ``SERIAL_WORK``).
    """
    work = (indices.shape[0] + indptr.shape[0] - 1) * h.shape[1]
    threads = threads_for(work) if threads is None else max(1, int(threads))
    if threads <= 1:
        csr_spmm_serial(indptr, indices, weights, h, out)
        return
    b = _row_chunks(indptr, h.shape[1], threads)
    parallel_for(lambda i: _spmm_rows(indptr, indices, weights, h, out, b[i], b[i + 1]), b.shape[0] - 1,
                 threads)


def csr_spmm_t_parallel(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, g: np.ndarray,
                        out: np.ndarray, threads: int | None = None) -> None:
    """`csr_spmm_t_serial` on the kernel team: the output rows cut into one range per thread
    (`graphrl.kernels.parallel_for` claims them dynamically), each range scanning every entry, so the
    result is bitwise that of `csr_spmm_t_serial` for any number of threads.

    The arguments are `csr_spmm_parallel`'s, transposed: ``g`` (float32 or float64 [D, d]) in place of
    ``h``, ``out`` [S, d] written; ``threads`` also sets the number of ranges (at most one per output
    row).
    """
    work = indices.shape[0] * g.shape[1]
    threads = threads_for(work) if threads is None else max(1, int(threads))
    parts = max(1, min(threads, out.shape[0]))
    if parts <= 1:
        csr_spmm_t_serial(indptr, indices, weights, g, out, 1)
        return
    n = out.shape[0]
    parallel_for(lambda t: _spmm_t_range(indptr, indices, weights, g, out, n * t // parts,
                                         n * (t + 1) // parts), parts, parts)


@nb.njit(nogil=True, cache=True)
def _stage_rows(indptr, indices, weights, h, ws_indptr, ws_indices, ws_weights, ws_out, out, r0, a, b):
    """Rows [a, b) of the partition that starts at row r0: stage the matrix rows, compute, copy back."""
    e0 = indptr[r0]
    # Entries a - r0 .. b - r0: the first is also the previous chunk's last (the same value), so no
    # chunk reads an entry another thread may not have written yet.
    for v in range(a, b + 1):
        ws_indptr[v - r0] = indptr[v] - e0
    for e in range(indptr[a], indptr[b]):
        ws_indices[e - e0] = indices[e]
        ws_weights[e - e0] = weights[e]
    d = h.shape[1]
    hf = h.reshape(-1)
    lines, ahead = _prefetch_plan(d * h.itemsize)
    step = max(64 // h.itemsize, 1)
    e_end = indptr[b] - e0
    for v in range(a - r0, b - r0):
        _spmm_row(ws_indptr, ws_indices, ws_weights, h, hf, ws_out, v, v, ahead, lines, step, e_end)
        for j in range(d):
            out[v + r0, j] = ws_out[v, j]


def chunk_bounds(indptr: np.ndarray, lo: int, hi: int, width: int,
                 chunk_work: int | None = None) -> np.ndarray:
    """Row boundaries that cut rows [lo, hi) into chunks of about ``chunk_work`` multiply-adds.

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [R + 1]
        Row pointer of the matrix.
    lo, hi : int
        Row range, ``0 <= lo <= hi <= R``.
    width : int
        Feature width d (a row of e entries costs e * d multiply-adds, plus d to write it).
    chunk_work : int or None
        Multiply-adds per chunk (default `CHUNK_WORK`, read at call time).

    Returns
    -------
    numpy.ndarray, int64, shape [C + 1]
        Increasing boundaries, first ``lo`` and last ``hi``; a row is never split.
    """
    width = max(int(width), 1)
    chunk_work = CHUNK_WORK if chunk_work is None else int(chunk_work)
    rows = hi - lo
    # cost before row r (relative to lo): entries * width + rows * width
    base = int(indptr[lo]) * width
    total = (int(indptr[hi]) - int(indptr[lo])) * width + rows * width
    if total <= chunk_work or rows <= 1:
        return np.array([lo, hi], dtype=np.int64)
    cost = indptr[lo:hi + 1] * width - base + np.arange(rows + 1, dtype=np.int64) * width
    cuts = np.searchsorted(cost, np.arange(chunk_work, total, chunk_work, dtype=np.int64), side="left")
    return np.unique(np.concatenate(([0], cuts, [rows]))).astype(np.int64) + lo


def spmm_partition(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, h: np.ndarray,
                   out: np.ndarray, r0: int, r1: int, ws_indptr: np.ndarray, ws_indices: np.ndarray,
                   ws_weights: np.ndarray, ws_out: np.ndarray, threads: int = 1) -> None:
    """``out[r0:r1] = M[r0:r1] @ h`` through a workspace: one partition of a partitioned product.

    The partition's rows of M are copied into ``ws_indptr`` (rebased to 0), ``ws_indices`` and
    ``ws_weights``; output rows are computed into ``ws_out`` reading ``h`` in place, then copied to
    ``out``. Each row is summed in entry order by one thread: bitwise the same for any ``threads``.

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [R + 1]
    indices : numpy.ndarray, int32 or int64, shape [nnz], trusted in [0, S)
    weights : numpy.ndarray, float32, shape [nnz]
    h : numpy.ndarray, float32 or float64, shape [S, d], C-contiguous
    out : numpy.ndarray, dtype of ``h``, shape [R, d]; rows [r0, r1) are written
    r0, r1 : int
        The partition's rows.
    ws_indptr : int64 [>= r1 - r0 + 1]; ws_indices : dtype of ``indices`` [>= partition entries];
    ws_weights : float32 [>= partition entries]; ws_out : dtype of ``h`` [>= r1 - r0, d]
        The workspace (the memory manager's device tier).
    threads : int
        Threads that may work on it, the caller included.
    """
    if r1 <= r0:
        return
    bounds = chunk_bounds(indptr, r0, r1, h.shape[1])
    args = (indptr, indices, weights, h, ws_indptr, ws_indices, ws_weights, ws_out, out, np.int64(r0))
    n = bounds.shape[0] - 1
    if n == 1 or threads <= 1:
        for i in range(n):
            _stage_rows(*args, bounds[i], bounds[i + 1])
        return
    parallel_for(lambda i: _stage_rows(*args, bounds[i], bounds[i + 1]), n, threads)


@nb.njit(nogil=True, cache=True)
def _transpose(indptr, indices, weights, num_cols, t_indptr, t_indices, t_weights):
    for c in range(num_cols + 1):
        t_indptr[c] = 0
    for e in range(indices.shape[0]):
        t_indptr[indices[e] + 1] += 1
    for c in range(num_cols):
        t_indptr[c + 1] += t_indptr[c]
    pos = t_indptr[:-1].copy()
    for r in range(indptr.shape[0] - 1):
        for e in range(indptr[r], indptr[r + 1]):
            c = indices[e]
            p = pos[c]
            pos[c] = p + 1
            t_indices[p] = r
            t_weights[p] = weights[e]


def csr_transpose(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, num_cols: int,
                  out: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The transpose of a CSR matrix, by a stable counting sort (O(nnz + rows + cols), serial).

    Row ``c`` of the result lists the entries of column ``c``, by increasing original row.

    Parameters
    ----------
    indptr : int64 [R + 1]; indices : int32/int64 [nnz] in [0, num_cols); weights : float32 [nnz]
    num_cols : int
    out : (int64 [num_cols + 1], indices dtype [nnz], float32 [nnz]) or None
        Arrays to fill (e.g. memory-manager regions); fresh ones if None.

    Returns
    -------
    t_indptr : int64 [num_cols + 1]; t_indices : [nnz], dtype of ``indices``; t_weights : float32 [nnz]
    """
    if out is None:
        out = (np.empty(num_cols + 1, np.int64), np.empty_like(indices), np.empty_like(weights))
    _transpose(indptr, indices, weights, np.int64(num_cols), *out)
    return out


@nb.njit(nogil=True, cache=True)
def _normalized(indptr, indices, values, has_values, self_loops, scale_dst, scale_src, out_indptr,
                out_indices, out_weights):
    n = indptr.shape[0] - 1
    p = 0
    out_indptr[0] = 0
    for v in range(n):
        sv = scale_dst[v]
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            a = values[e] if has_values else 1.0
            out_indices[p] = u
            out_weights[p] = sv * a * scale_src[u]
            p += 1
        if self_loops:
            out_indices[p] = v
            out_weights[p] = sv * scale_src[v]
            p += 1
        out_indptr[v + 1] = p


def normalized_adjacency(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray | None,
                         add_self_loops: bool, scale_dst: np.ndarray, scale_src: np.ndarray,
                         out: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR entries of ``diag(scale_dst) (A + I) diag(scale_src)`` from the CSC of a graph.

    Row v of the result holds v's in-edges (``A[v, u] = values[e]`` or 1 for edge e = u -> v; parallel
    edges stay separate entries) in storage order, then the self-loop ``(v, v)`` with value 1 when
    ``add_self_loops``. ``weight = scale_dst[v] * A[v, u] * scale_src[u]``, computed in float64 and
    stored as float32.

    Parameters
    ----------
    indptr : int64 [N + 1]; indices : int32/int64 [E]; values : float32 [E] or None (all ones)
    add_self_loops : bool
    scale_dst, scale_src : float64 [N]
    out : (int64 [N + 1], indices dtype [E (+ N)], float32 [E (+ N)]) or None
        Arrays to fill; fresh ones if None.

    Returns
    -------
    indptr : int64 [N + 1]; indices : [E + N or E], dtype of ``indices``; weights : float32, same length
    """
    n = indptr.shape[0] - 1
    nnz = indices.shape[0] + (n if add_self_loops else 0)
    if out is None:
        out = (np.empty(n + 1, np.int64), np.empty(nnz, indices.dtype), np.empty(nnz, np.float32))
    has_values = values is not None
    vals = values if has_values else np.empty(0, np.float32)
    _normalized(indptr, indices, vals, has_values, bool(add_self_loops), scale_dst, scale_src, *out)
    return out

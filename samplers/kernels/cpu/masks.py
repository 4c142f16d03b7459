"""Masked rows: edge weights and/or edge times in CSC order (`Masks`) and their choosing pass.

Rows of a sampler with weights or times follow the reference's masked rules
(docs/architecture.md#sampling-rules): weighted rows without times by rejection over prefix sums
(`samplers.kernels.cpu.weighted`), rows with times by exponential keys or prefix-sum inversion
(`samplers.kernels.cpu.temporal`).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from samplers.kernels.cpu.prefix import prefix_listed_rows, weight_prefix
from samplers.kernels.cpu.temporal import choose_rows_temporal
from samplers.kernels.cpu.uniform import gather_edges
from samplers.kernels.cpu.weighted import choose_rows_weighted

__all__ = ["Masks", "choose_rows_masked", "sample_rows_masked"]

_NO_EXCL = np.empty(0, dtype=np.int64)
_NO_WEIGHTS = np.empty(0, dtype=np.float32)
_NO_TIMES = np.empty(0, dtype=np.int64)
_NO_PREFIX = np.empty(0, dtype=np.float64)


class Masks:
    """Edge weights and/or edge times in CSC order: rows are then sampled by the masked rules.

    Parameters
    ----------
    weights : numpy.ndarray or None, float32, shape [E]
        Finite, non-negative weight of the edge at each CSC position (trusted).
    times : numpy.ndarray or None, int64 or float64, shape [E]
        Time of the edge at each CSC position; a row of time t draws only edges of time <= t.
    indptr : numpy.ndarray or None, int64, shape [N + 1]
        The graph's row pointer. Weighted rows without times need the per-row prefix sums ``P`` and
        positive counts ``nz`` of the weights (`weight_prefix`; the reference's "weighted rows"): given
        ``indptr``, they are computed here for every node (8 bytes per edge and 8 per node, one parallel
        pass over the weights), or only for the nodes ``rows`` when given (a one-off call).
    threads : int
        Threads that may compute ``P`` and ``nz`` (the caller included).
    rows : numpy.ndarray or None, int64, shape [D]
        Compute ``P`` and ``nz`` for these nodes only; the other entries stay undefined, so the masks then
        serve only rows of these nodes.
    prefix, positive : numpy.ndarray or None, float64 [E] and int64 [N]
        ``P`` and ``nz`` computed beforehand (`weight_prefix`), instead of ``indptr``.

    Attributes
    ----------
    prefix : numpy.ndarray, float64, shape [E] (empty without weights or with times)
        ``P``: inclusive prefix sums of the weights in float64, restarting at every row.
    node_count : numpy.ndarray, int64, shape [N] (empty without weights or with times)
        ``nz``: each node's count of positive-weight in-edges, so that planning a layer reads no weights.
    has_prefix : bool
        Weighted rows without times: sampled by rejection over ``prefix``.

    Raises
    ------
    ValueError
        Weights without times and neither ``indptr`` nor ``prefix`` and ``positive``.
    """

    def __init__(self, weights: np.ndarray | None = None, times: np.ndarray | None = None,
                 indptr: np.ndarray | None = None, *, threads: int = 1, rows: np.ndarray | None = None,
                 prefix: np.ndarray | None = None, positive: np.ndarray | None = None) -> None:
        self.weights = _NO_WEIGHTS if weights is None else np.ascontiguousarray(weights, dtype=np.float32)
        self.has_weights = weights is not None
        self.times = _NO_TIMES if times is None else np.ascontiguousarray(times)
        self.has_times = times is not None
        self.node_count = _NO_EXCL
        self.prefix = _NO_PREFIX
        self.has_prefix = weights is not None and times is None
        if self.has_prefix:
            if prefix is not None and positive is not None:
                self.prefix = np.ascontiguousarray(prefix, dtype=np.float64)
                self.node_count = np.ascontiguousarray(positive, dtype=np.int64)
            elif indptr is None:
                raise ValueError("weights without edge times need indptr (or prefix and positive, see "
                                 "weight_prefix) for their per-row prefix sums")
            elif rows is None:
                self.prefix, self.node_count = weight_prefix(indptr, self.weights, threads)
            else:
                self.prefix = np.empty(self.weights.shape[0], dtype=np.float64)
                self.node_count = np.empty(indptr.shape[0] - 1, dtype=np.int64)
                prefix_listed_rows(indptr, self.weights, np.ascontiguousarray(rows, dtype=np.int64),
                                   self.prefix, self.node_count)
        self.has_count = self.has_prefix

    def row_times(self, dst_times: np.ndarray | None) -> np.ndarray:
        """The destination rows' times in the edge times' dtype (an empty array without times)."""
        if not self.has_times:
            return self.times[:0]
        if dst_times is None:
            raise ValueError("masks with edge times need the destination rows' times")
        return np.ascontiguousarray(dst_times, dtype=self.times.dtype)


@nb.njit(nogil=True, cache=True)
def choose_rows_masked(dst, row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, fanout, replace,
                       key, excl, weights, has_w, times, row_time, has_t, prefix, has_prefix, pos, lo, hi):
    """Pass 2 of masked rows [lo, hi): choose CSC positions (weighted rows with ``has_prefix``: rejection
    over the prefix sums; temporal rows: A-ES keys, or prefix-sum inversion)."""
    draws = replace and fanout >= 0
    if has_prefix:
        choose_rows_weighted(dst, row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, draws, key,
                             excl, weights, times, prefix, pos, lo, hi)
    else:
        choose_rows_temporal(dst, row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, draws, key,
                             excl, weights, has_w, times, row_time, has_t, pos, lo, hi)


@nb.njit(nogil=True, cache=True)
def sample_rows_masked(indices, edge_ids, has_eids, pairs, has_pairs, dst, row_start, row_deg, row_exlo,
                       row_exhi, row_end, out_indptr, fanout, replace, key, excl, weights, has_w, times,
                       row_time, has_t, prefix, has_prefix, eids, src, lo, hi):
    """Passes 2 and 3 of masked rows [lo, hi) (one chunk of work)."""
    choose_rows_masked(dst, row_start, row_deg, row_exlo, row_exhi, row_end, out_indptr, fanout, replace,
                       key, excl, weights, has_w, times, row_time, has_t, prefix, has_prefix, eids, lo, hi)
    gather_edges(indices, edge_ids, has_eids, pairs, has_pairs, eids, src, out_indptr[lo], out_indptr[hi])

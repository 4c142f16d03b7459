"""The per-row float64 prefix sums ``P`` and positive-weight counts ``nz`` that weighted rows sample
from (the reference's `weight_prefix`, equal bit for bit), computed once per sampler in parallel over
chunks of rows of about equal edge counts, or for the listed rows of a one-off call."""

from __future__ import annotations

import numba as nb
import numpy as np

from samplers.kernels.cpu.threads import parallel_chunks

__all__ = ["prefix_listed_rows", "weight_prefix"]


@nb.njit(nogil=True, cache=True)
def _prefix_rows(indptr, weights, prefix, positive, lo, hi):
    """P and nz of the nodes [lo, hi): float64 inclusive prefix sums of each row's weights (restarting at
    every row, summed in position order) and each row's count of positive weights."""
    for v in range(lo, hi):
        total = 0.0
        count = 0
        for p in range(indptr[v], indptr[v + 1]):
            wp = np.float64(weights[p])
            total += wp
            prefix[p] = total
            count += wp > 0
        positive[v] = count


@nb.njit(nogil=True, cache=True)
def prefix_listed_rows(indptr, weights, rows, prefix, positive):
    """`_prefix_rows` for the listed nodes only (a one-off call: only their entries are written)."""
    for i in range(rows.shape[0]):
        v = rows[i]
        _prefix_rows(indptr, weights, prefix, positive, v, v + 1)


def weight_prefix(indptr: np.ndarray, weights: np.ndarray, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Per-row prefix sums ``P`` and positive counts ``nz`` of the weights (as `reference.weight_prefix`).

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [N + 1]
    weights : numpy.ndarray, float32, shape [E]
        CSC order, finite and >= 0 (trusted).
    threads : int
        Threads that may work on it, the caller included (chunks of rows of about equal edge counts).

    Returns
    -------
    prefix : numpy.ndarray, float64, shape [E]
        Inclusive prefix sums of the weights widened to float64, in position order, restarting at every
        row (the same additions as the reference, so equal bit for bit).
    positive : numpy.ndarray, int64, shape [N]
        Each row's count of positive weights.
    """
    num = indptr.shape[0] - 1
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    prefix = np.empty(weights.shape[0], dtype=np.float64)
    positive = np.empty(num, dtype=np.int64)
    chunks = max(1, min(64, weights.shape[0] // (1 << 18)))
    bounds = np.searchsorted(indptr, np.linspace(0, weights.shape[0], chunks + 1)[1:-1]).astype(np.int64)
    bounds = np.unique(np.concatenate(([0], bounds.clip(0, num), [num])))
    parallel_chunks(lambda i: _prefix_rows(indptr, weights, prefix, positive, bounds[i], bounds[i + 1]),
                    bounds.shape[0] - 1, max(int(threads) - 1, 0))
    return prefix, positive

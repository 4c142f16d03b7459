"""Spectral initialisation of user-item embedding tables from the normalised interaction matrix.

`spectral_embeddings` takes the top-``d`` singular triplets of ``R~ = D_u^-1/2 R D_i^-1/2`` (R the binary
user-item training matrix, D its degrees) and returns ``[U; V]``, one row per user then per item, scaled to
a chosen mean row norm. ``[u_k; v_k]`` is an eigenvector of the bipartite graph's normalised adjacency
``[[0, R~], [R~^T, 0]]`` with eigenvalue ``sigma_k``, so LightGCN's propagation keeps this table's
directions and only reweights them: training starts from the graph's smoothest signals (those the
training-free graph filters GF-CF and BSPM rank with) instead of from noise.

Usage::

    table = spectral_embeddings(dataset.user_item_csr("train"), num_items, dim=64, seed=0)
    model.embedding.weight.data.copy_(torch.from_numpy(table))      # [U + I, 64]
"""

from __future__ import annotations

import numpy as np

from graphrl.nn.interaction_matrix import lowrank_svd, normalized_interactions

__all__ = ["spectral_embeddings"]


def spectral_embeddings(train: tuple[np.ndarray, np.ndarray], num_items: int, dim: int,
                        row_norm: float = 0.8, seed: int = 0, power_iters: int = 4,
                        oversample: int = 32) -> np.ndarray:
    """Top-``dim`` singular vectors of the normalised training matrix as one [U + I, dim] table.

    Parameters
    ----------
    train : tuple[np.ndarray, np.ndarray]
        Per-user item CSR ``(indptr int64 [U + 1], items int64 [M])``, item ids in [0, num_items).
    num_items : int
        I.
    dim : int
        d, 1 <= d < min(U, I).
    row_norm : float
        > 0: the table is scaled so that its rows' mean L2 norm is this (0.8 is the mean norm of a
        64-wide N(0, 0.1^2) row, LightGCN's usual initialisation).
    seed : int
        Seeds the randomised SVD.
    power_iters, oversample : int
        `torch.svd_lowrank` settings (Halko, Martinsson and Tropp, SIAM Review 2011).

    Returns
    -------
    np.ndarray, float32, shape [U + I, dim]
        Users' rows (left singular vectors) then items' rows (right singular vectors), column k scaled by
        nothing but the common factor; a user or item with no interaction gets a zero row.

    Raises
    ------
    ValueError
        ``dim`` out of range, ``row_norm`` <= 0, or an item id outside [0, num_items).

    References
    ----------
    Shen et al., "How Powerful is Graph Convolution for Recommendation?" (CIKM 2021, GF-CF); Peng et al.,
    "SVD-GCN: A Simplified Graph Convolution Paradigm for Recommendation" (CIKM 2022).
    """
    num_users = train[0].size - 1
    if isinstance(dim, bool) or int(dim) != dim or not 1 <= dim < min(num_users, num_items):
        raise ValueError(f"dim must be an int in [1, min(U, I) = {min(num_users, num_items)}), got {dim!r}")
    if not row_norm > 0:
        raise ValueError(f"row_norm must be > 0, got {row_norm!r}")
    m = normalized_interactions(train, num_items)
    u, v = lowrank_svd(m.normalized, dim, seed=seed, oversample=oversample, power_iters=power_iters)
    table = np.concatenate([u, v]).astype(np.float32)
    mean_norm = float(np.linalg.norm(table, axis=1).mean())
    return table * np.float32(row_norm / mean_norm)

"""The degree-normalised user-item matrix and its top singular vectors, shared by graph-filter models.

`normalized_interactions` builds the binary training matrix R from a per-user item CSR and
``R~ = D_U^-1/2 R D_I^-1/2``; `lowrank_svd` takes R~'s top-k singular vectors with a seeded randomised SVD.
GF-CF (`graphrl.nn.graph_filter`) ranks with R~ and its right vectors; the spectral initialisation
(`graphrl.nn.spectral_init`) starts LightGCN from both sides.

Usage::

    m = normalized_interactions(train_csr, num_items)
    u, v = lowrank_svd(m.normalized, k=64, seed=0)      # [U, 64], [I, 64]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

__all__ = ["NormalizedInteractions", "lowrank_svd", "normalized_interactions"]


@dataclass(frozen=True, eq=False)
class NormalizedInteractions:
    """R and ``R~ = D_U^-1/2 R D_I^-1/2`` of a training split.

    Attributes
    ----------
    interactions : scipy.sparse.csr_matrix, float64, shape [U, I]
        The binary matrix R (a repeated pair counts once).
    normalized : scipy.sparse.csr_matrix, float64, shape [U, I]
        R~; rows and columns of zero degree stay zero.
    user_scale, item_scale : np.ndarray, float64, shapes [U] and [I]
        ``d^-1/2`` of each user and item (0 for degree 0).
    """

    interactions: sp.csr_matrix
    normalized: sp.csr_matrix
    user_scale: np.ndarray
    item_scale: np.ndarray


def normalized_interactions(train: tuple[np.ndarray, np.ndarray], num_items: int) -> NormalizedInteractions:
    """Build R and R~ from a per-user item CSR.

    Parameters
    ----------
    train : tuple[np.ndarray, np.ndarray]
        ``(indptr int64 [U + 1], items int64 [M])``, item ids in [0, num_items).
    num_items : int
        I.

    Returns
    -------
    NormalizedInteractions

    Raises
    ------
    ValueError
        An item id outside [0, num_items).
    """
    indptr, items = train
    if items.size and (items.min() < 0 or items.max() >= num_items):
        raise ValueError(f"train: item ids must lie in [0, num_items={num_items})")
    r = sp.csr_matrix((np.ones(items.size, np.float64), items, indptr), shape=(indptr.size - 1, num_items))
    r.sum_duplicates()
    r.data[:] = 1.0
    d_u = np.asarray(r.sum(axis=1)).ravel()
    d_i = np.asarray(r.sum(axis=0)).ravel()
    su = np.where(d_u > 0, 1.0 / np.sqrt(np.maximum(d_u, 1.0)), 0.0)
    si = np.where(d_i > 0, 1.0 / np.sqrt(np.maximum(d_i, 1.0)), 0.0)
    return NormalizedInteractions(interactions=r, normalized=sp.csr_matrix(sp.diags(su) @ r @ sp.diags(si)),
                                  user_scale=su, item_scale=si)


def lowrank_svd(matrix: sp.spmatrix, k: int, seed: int = 0, oversample: int = 64,
                power_iters: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` left and right singular vectors of a sparse matrix by randomised SVD.

    Parameters
    ----------
    matrix : scipy.sparse matrix, shape [m, n]
    k : int
        1 <= k <= min(m, n).
    seed : int
        Seeds the random start (torch's generator is forked, so the caller's stream is untouched).
    oversample, power_iters : int
        Extra columns and power iterations of `torch.svd_lowrank` (Halko, Martinsson and Tropp, SIAM
        Review 2011).

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        ``u`` [m, k] and ``v`` [n, k], matrix's dtype, columns by decreasing singular value.

    Raises
    ------
    ValueError
        ``k`` out of range.
    """
    if not 1 <= k <= min(matrix.shape):
        raise ValueError(f"k must lie in [1, {min(matrix.shape)}], got {k}")
    coo = matrix.tocoo()
    mat = torch.sparse_coo_tensor(np.vstack([coo.row, coo.col]), coo.data, size=coo.shape,
                                  check_invariants=True).coalesce()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        u, _, v = torch.svd_lowrank(mat, q=min(k + oversample, min(coo.shape)), niter=power_iters)
    return u[:, :k].numpy(), v[:, :k].numpy()

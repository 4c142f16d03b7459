"""GF-CF: a training-free graph-filter recommender (one normalised item-item filter plus an ideal low-pass).

GF-CF scores every item for a user as ``r_u R~^T R~ + alpha * r_u D_I^-1/2 V_k V_k^T D_I^1/2``, where
``R~ = D_U^-1/2 R D_I^-1/2`` is the degree-normalised user-item matrix and V_k its top-k right singular
vectors (one truncated SVD: `torch.svd_lowrank`, randomised with power iterations, or ARPACK through
`scipy.sparse.linalg.svds`). There is nothing to train: `GFCF.fit` is the
normalisation and the SVD; `GFCF.scores` is two sparse products and two thin dense ones per user batch.

Usage::

    model = GFCF.fit(train_csr, num_items, k=256, alpha=0.3)   # train_csr: per-user item CSR
    evaluate_ranking(model.scores, train_csr, test_csr, k=20)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from graphrl.nn.interaction_matrix import lowrank_svd, normalized_interactions

__all__ = ["GFCF"]


@dataclass(eq=False)
class GFCF:
    """A fitted GF-CF model (use `GFCF.fit`).

    Attributes
    ----------
    interactions : scipy.sparse.csr_matrix, float32, shape [U, I]
        The binary training matrix R.
    normalized : scipy.sparse.csr_matrix, float32, shape [U, I]
        ``R~ = D_U^-1/2 R D_I^-1/2`` (zero-degree rows/columns stay zero).
    vt : np.ndarray, float32, shape [k, I]
        Top-k right singular vectors of ``R~`` (rows).
    item_scale : np.ndarray, float32, shape [I]
        ``d_I^-1/2`` (0 for items without interactions).
    alpha : float
        Weight of the ideal low-pass term.

    References
    ----------
    Shen et al., "How Powerful is Graph Convolution for Recommendation?" (CIKM 2021), GF-CF; alpha 0.3 and
    k 256 on Gowalla as in the authors' code.
    """

    interactions: sp.csr_matrix
    normalized: sp.csr_matrix
    vt: np.ndarray
    item_scale: np.ndarray
    alpha: float

    @classmethod
    def fit(cls, train: tuple[np.ndarray, np.ndarray], num_items: int, k: int = 256, alpha: float = 0.3,
            seed: int = 0, solver: str = "lowrank", oversample: int = 64, power_iters: int = 6) -> GFCF:
        """Normalise the training matrix and take its top-``k`` right singular vectors.

        Parameters
        ----------
        train : tuple[np.ndarray, np.ndarray]
            Per-user item CSR ``(indptr int64 [U + 1], items int64 [M])``, item ids in [0, num_items).
        num_items : int
            I.
        k : int
            Singular vectors, 1 <= k < min(U, I).
        alpha : float
            >= 0.
        seed : int
            Seeds the SVD's random start (either solver), so a fit is reproducible.
        solver : {"lowrank", "arpack"}
            ``lowrank``: `torch.svd_lowrank` (Halko et al. 2011) on ``k + oversample`` columns with
            ``power_iters`` power iterations, the top k kept (seconds); ``arpack``: `scipy.sparse.linalg.svds`
            to ARPACK's tolerance (minutes for k = 256 on Gowalla).
        oversample, power_iters : int
            ``lowrank`` only.

        Returns
        -------
        GFCF

        Raises
        ------
        ValueError
            ``k`` out of range, ``alpha`` < 0, an unknown ``solver``, or an item id outside [0, num_items).
        """
        num_users = train[0].size - 1
        if not 1 <= k < min(num_users, num_items):
            raise ValueError(f"k must lie in [1, min(U, I) = {min(num_users, num_items)}), got {k}")
        if solver not in ("lowrank", "arpack"):
            raise ValueError(f"solver must be 'lowrank' or 'arpack', got {solver!r}")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        m = normalized_interactions(train, num_items)
        norm, si = m.normalized, m.item_scale
        if solver == "arpack":
            v0 = np.random.default_rng(seed).standard_normal(min(norm.shape))
            _, _, vt = spla.svds(norm, k=k, v0=v0, solver="arpack")
        else:
            vt = lowrank_svd(norm, k, seed=seed, oversample=oversample, power_iters=power_iters)[1].T
        r = sp.csr_matrix(m.interactions, dtype=np.float32)
        return cls(interactions=r, normalized=sp.csr_matrix(norm, dtype=np.float32),
                   vt=np.ascontiguousarray(vt, dtype=np.float32), item_scale=si.astype(np.float32),
                   alpha=float(alpha))

    def scores(self, users: torch.Tensor) -> torch.Tensor:
        """GF-CF scores of every item for ``users``.

        Parameters
        ----------
        users : torch.Tensor, int64, shape [B]

        Returns
        -------
        torch.Tensor, float32, shape [B, I]
        """
        u = users.numpy()
        r_u = self.interactions[u]
        linear = ((r_u @ self.normalized.T) @ self.normalized).toarray()
        low = (r_u.multiply(self.item_scale[None, :]).tocsr() @ self.vt.T) @ self.vt
        with np.errstate(divide="ignore"):
            back = np.where(self.item_scale > 0, 1.0 / self.item_scale, 0.0).astype(np.float32)
        out = linear + self.alpha * (low * back[None, :])
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))

"""Training-free graph-filter recommenders: GF-CF and ChebyCF.

GF-CF scores every item for a user as ``r_u R~^T R~ + alpha * r_u D_I^-1/2 V_k V_k^T D_I^1/2``, where
``R~ = D_U^-1/2 R D_I^-1/2`` is the degree-normalised user-item matrix and V_k its top-k right singular
vectors (one truncated SVD: `torch.svd_lowrank`, randomised with power iterations, or ARPACK through
`scipy.sparse.linalg.svds`). There is nothing to train: `GFCF.fit` is the
normalisation and the SVD; `GFCF.scores` is two sparse products and two thin dense ones per user batch.

ChebyCF (`ChebyCF`) replaces the linear filter with a degree-K Chebyshev interpolation of a plateau
low-pass on the item-item Laplacian ``L = I - R~^T R~`` (K sparse double products per user batch), adds the
same ideal-pass term, and wraps both in an item-degree normalisation ``D_I^-beta (.) D_I^beta``.

Usage::

    model = GFCF.fit(train_csr, num_items, k=256, alpha=0.3)   # train_csr: per-user item CSR
    evaluate_ranking(model.scores, train_csr, test_csr, k=20)
    model = ChebyCF.fit(train_csr, num_items, order=8, flatness=1.5, ideal_k=512, ideal_weight=0.2,
                        degree_power=0.4)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from graphrl.kernels.spmm import csr_spmm_parallel
from graphrl.nn.interaction_matrix import lowrank_svd, normalized_interactions

__all__ = ["GFCF", "ChebyCF", "chebyshev_coefficients", "plateau_targets"]


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

        Raises
        ------
        ValueError
            A user id outside [0, U).
        """
        u = _user_rows(users, self.interactions.shape[0])
        r_u = self.interactions[u]
        linear = ((r_u @ self.normalized.T) @ self.normalized).toarray()
        low = (r_u.multiply(self.item_scale[None, :]).tocsr() @ self.vt.T) @ self.vt
        with np.errstate(divide="ignore"):
            back = np.where(self.item_scale > 0, 1.0 / self.item_scale, 0.0).astype(np.float32)
        out = linear + self.alpha * (low * back[None, :])
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def plateau_targets(order: int, flatness: float) -> np.ndarray:
    """ChebyCF's target response at its ``order + 1`` interpolation points, low frequencies first.

    Point j (0..K) is ``x_j = cos(pi (K - j) / K)`` rounded to 3 decimals (-1 is the lowest frequency of the
    rescaled Laplacian); the target is ``0.5 + 0.5 |x|^phi`` for ``x < 0`` and ``0.5 - 0.5 x^phi`` otherwise,
    rounded to 3 decimals: 1 at the low end, 0 at the high end, flatter near both ends as ``phi`` grows.

    Parameters
    ----------
    order : int
        K >= 1.
    flatness : float
        phi > 0.

    Returns
    -------
    np.ndarray, float64, shape [K + 1]

    Raises
    ------
    ValueError
        ``order`` < 1 or ``flatness`` <= 0.

    References
    ----------
    Kim et al., "Graph Spectral Filtering with Chebyshev Interpolation for Recommendation" (SIGIR 2025).
    """
    if isinstance(order, bool) or int(order) != order or order < 1:
        raise ValueError(f"order must be an int >= 1, got {order!r}")
    if not flatness > 0:
        raise ValueError(f"flatness must be > 0, got {flatness!r}")
    x = np.round(np.cos((order - np.arange(order + 1)) / order * np.pi), 3)
    out = np.where(x < 0, 0.5 + 0.5 * np.abs(x) ** flatness, 0.5 - 0.5 * np.abs(x) ** flatness)
    return np.round(out, 3)


def chebyshev_coefficients(order: int, flatness: float) -> np.ndarray:
    """Coefficients ``c_0..c_K`` of ChebyCF's filter ``sum_k c_k T_k(x)`` on the rescaled spectrum [-1, 1].

    Chebyshev interpolation (Mason and Handscomb, "Chebyshev Polynomials", 2003, ch. 6) through the K + 1
    Chebyshev nodes of the first kind ``cos(pi (K + 1.5 - j) / (K + 1))``, j = 1..K+1 (increasing), with
    values `plateau_targets` in the same order: ``c_k = 2 / (K + 1) sum_j f_j T_k(x_j)``, ``c_0`` halved.

    Parameters
    ----------
    order, flatness
        As in `plateau_targets`.

    Returns
    -------
    np.ndarray, float64, shape [K + 1]

    Raises
    ------
    ValueError
        As `plateau_targets`.
    """
    target = plateau_targets(order, flatness)
    nodes = np.cos((order + 1.5 - np.arange(1, order + 2)) / (order + 1) * np.pi)
    coeffs = np.polynomial.chebyshev.chebvander(nodes, order).T @ target * (2.0 / (order + 1))
    coeffs[0] /= 2
    return coeffs


def _check_weights(ideal_weight: float, degree_power: float) -> None:
    if not 0 <= ideal_weight < np.inf:
        raise ValueError(f"ideal_weight must be finite and >= 0, got {ideal_weight!r}")
    if not 0 <= degree_power < np.inf:
        raise ValueError(f"degree_power must be finite and >= 0, got {degree_power!r}")


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _user_rows(users: torch.Tensor, num_users: int) -> np.ndarray:
    """``users`` (int64 [B]) as a numpy index; raises ValueError for an id outside [0, num_users)."""
    u = users.numpy()
    if u.size and not (0 <= u.min() and u.max() < num_users):
        raise ValueError(f"users must lie in [0, {num_users}), got ids from {u.min()} to {u.max()}")
    return u


@dataclass(eq=False)
class ChebyCF:
    """A fitted ChebyCF model (use `ChebyCF.fit`).

    A user's scores are ``(sum_k c_k T_k(L~) s + w V_k V_k^T s) * d_I^beta`` with ``s = r_u * d_I^-beta``
    (row vectors read as columns), ``L~ = I - 2 R~^T R~`` the item Laplacian rescaled to [-1, 1] and V_k the
    top right singular vectors of R~.

    Attributes
    ----------
    interactions : scipy.sparse.csr_matrix, float32, shape [U, I]
        The binary training matrix R.
    normalized : scipy.sparse.csr_matrix, float32, shape [U, I]
        ``R~ = D_U^-1/2 R D_I^-1/2``.
    normalized_t : scipy.sparse.csr_matrix, float32, shape [I, U]
        ``R~^T``.
    coeffs : np.ndarray, float64, shape [K + 1]
        `chebyshev_coefficients`.
    vt : np.ndarray, float32, shape [k, I]
        Top-k right singular vectors of R~ (k = 0 without the ideal-pass term).
    ideal_weight : float
        w.
    pre_scale, post_scale : np.ndarray, float32, shape [I]
        ``d_I^-beta`` and ``d_I^beta`` (0 for items without interactions).
    item_degrees : np.ndarray, float64, shape [I]
        Training interactions per item.

    References
    ----------
    Kim et al., "Graph Spectral Filtering with Chebyshev Interpolation for Recommendation" (SIGIR 2025);
    on Gowalla the authors use K = 8, phi = 1.5, k = 512, w = 0.2, beta = 0.4.
    """

    interactions: sp.csr_matrix
    normalized: sp.csr_matrix
    normalized_t: sp.csr_matrix
    coeffs: np.ndarray
    vt: np.ndarray
    ideal_weight: float
    pre_scale: np.ndarray
    post_scale: np.ndarray
    item_degrees: np.ndarray

    @classmethod
    def fit(cls, train: tuple[np.ndarray, np.ndarray], num_items: int, order: int = 8, flatness: float = 1.5,
            ideal_k: int = 512, ideal_weight: float = 0.2, degree_power: float = 0.4, seed: int = 0,
            oversample: int = 64, power_iters: int = 6) -> ChebyCF:
        """Normalise the training matrix, take its top-``ideal_k`` right singular vectors, fix the filter.

        Parameters
        ----------
        train : tuple[np.ndarray, np.ndarray]
            Per-user item CSR ``(indptr int64 [U + 1], items int64 [M])``, item ids in [0, num_items).
        num_items : int
            I.
        order : int
            K >= 1, the Chebyshev degree (K double sparse products per scored batch).
        flatness : float
            phi > 0 (`plateau_targets`).
        ideal_k : int
            Singular vectors of the ideal-pass term, 0 <= k < min(U, I); 0 drops the term.
        ideal_weight : float
            w >= 0.
        degree_power : float
            beta >= 0.
        seed, oversample, power_iters : int
            The randomised SVD's (`graphrl.nn.interaction_matrix.lowrank_svd`).

        Returns
        -------
        ChebyCF

        Raises
        ------
        ValueError
            A setting out of range, or an item id outside [0, num_items).
        """
        num_users = train[0].size - 1
        chebyshev_coefficients(order, flatness)  # checks both before the SVD
        _check_weights(ideal_weight, degree_power)
        top = min(num_users, num_items)
        if not _is_int(ideal_k) or not 0 <= ideal_k < top:
            raise ValueError(f"ideal_k must be an int in [0, min(U, I) = {top}), got {ideal_k!r}")
        m = normalized_interactions(train, num_items)
        norm = sp.csr_matrix(m.normalized, dtype=np.float32)
        if ideal_k > 0:
            vt = lowrank_svd(m.normalized, ideal_k, seed=seed, oversample=oversample,
                             power_iters=power_iters)[1].T
        else:
            vt = np.zeros((0, num_items))
        empty = np.zeros(0, np.float32)
        model = cls(interactions=sp.csr_matrix(m.interactions, dtype=np.float32), normalized=norm,
                    normalized_t=sp.csr_matrix(norm.T), coeffs=np.zeros(0),
                    vt=np.ascontiguousarray(vt, dtype=np.float32), ideal_weight=0.0, pre_scale=empty,
                    post_scale=empty, item_degrees=np.asarray(m.interactions.sum(axis=0)).ravel())
        return model.with_settings(order, flatness, ideal_weight, degree_power)

    def with_settings(self, order: int, flatness: float, ideal_weight: float, degree_power: float,
                      ideal_k: int | None = None) -> ChebyCF:
        """The same fit (matrices, singular vectors) with other filter settings: no second SVD.

        Parameters are as in `fit`; ``ideal_k`` (None: all fitted vectors) keeps the top ``ideal_k`` of
        the fitted singular vectors, at most as many as were fitted.

        Raises
        ------
        ValueError
            A setting out of range.
        """
        _check_weights(ideal_weight, degree_power)
        k = self.vt.shape[0] if ideal_k is None else ideal_k
        if not _is_int(k) or not 0 <= k <= self.vt.shape[0]:
            raise ValueError(f"ideal_k must be an int in [0, {self.vt.shape[0]}] (the fitted vectors), "
                             f"got {k!r}")
        d_i = self.item_degrees
        pre = np.where(d_i > 0, np.maximum(d_i, 1.0) ** -degree_power, 0.0)
        with np.errstate(over="ignore"):
            post = np.where(d_i > 0, np.maximum(d_i, 1.0) ** degree_power, 0.0).astype(np.float32)
        if not np.isfinite(post).all():
            raise ValueError(f"degree_power {degree_power!r} overflows float32 d_I^beta (largest item "
                             f"degree {d_i.max():.0f})")
        return dataclasses.replace(self, coeffs=chebyshev_coefficients(order, flatness), vt=self.vt[:k],
                                   ideal_weight=float(ideal_weight), pre_scale=pre.astype(np.float32),
                                   post_scale=post.astype(np.float32))

    def signal(self, users: torch.Tensor) -> np.ndarray:
        """The users' degree-normalised interaction rows ``r_u * d_I^-beta``: float32 [B, I] for int64 [B]."""
        u = _user_rows(users, self.interactions.shape[0])
        return (self.interactions[u].toarray() * self.pre_scale[None, :]).astype(np.float32)

    def terms(self, signal: np.ndarray, order: int) -> Iterator[np.ndarray]:
        """Yield ``T_k(L~) s`` for k = 0..order, each float32 [I, B], for a float32 [B, I] ``signal``.

        The three-term recurrence ``T_{k+1} = 2 L~ T_k - T_{k-1}``; each ``L~ x = x - 2 R~^T (R~ x)`` is
        two parallel CSR products (`graphrl.kernels.spmm`) with the batch as columns.
        """
        rows = np.empty((self.normalized.shape[0], signal.shape[0]), np.float32)
        a, b = self.normalized, self.normalized_t

        def lap(x: np.ndarray) -> np.ndarray:
            y = np.empty_like(x)
            csr_spmm_parallel(a.indptr, a.indices, a.data, x, rows)
            csr_spmm_parallel(b.indptr, b.indices, b.data, rows, y)
            return x - 2.0 * y

        prev = np.ascontiguousarray(signal.T, dtype=np.float32)
        yield prev
        if order >= 1:
            cur = lap(prev)
            yield cur
            for _ in range(2, order + 1):
                prev, cur = cur, 2.0 * lap(cur) - prev
                yield cur

    def scores(self, users: torch.Tensor) -> torch.Tensor:
        """ChebyCF scores of every item for ``users``.

        Parameters
        ----------
        users : torch.Tensor, int64, shape [B]

        Returns
        -------
        torch.Tensor, float32, shape [B, I]

        Raises
        ------
        ValueError
            A user id outside [0, U).
        """
        s = self.signal(users)
        acc = np.zeros((s.shape[1], s.shape[0]), np.float32)
        for c, t in zip(self.coeffs, self.terms(s, self.coeffs.size - 1), strict=True):
            acc += np.float32(c) * t
        out = acc.T
        if self.vt.shape[0]:
            out += self.ideal_weight * ((s @ self.vt.T) @ self.vt)
        out *= self.post_scale[None, :]
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))

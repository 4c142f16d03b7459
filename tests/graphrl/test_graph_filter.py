"""GF-CF against its formula in dense numpy (full SVD), and on the real Gowalla split's users."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrl.datasets import synthetic_bipartite
from graphrl.nn.graph_filter import GFCF


def test_gfcf_scores_equal_the_dense_formula():
    ds = synthetic_bipartite(40, 30, 300, seed=2)
    train = ds.user_item_csr("train")
    k, alpha = 6, 0.3
    model = GFCF.fit(train, ds.num_items, k=k, alpha=alpha, solver="arpack")
    lowrank = GFCF.fit(train, ds.num_items, k=k, alpha=alpha)  # q = min(k + 64, 30): the full SVD
    r = np.zeros((ds.num_users, ds.num_items))
    r[ds.train_users.numpy(), ds.train_items.numpy()] = 1.0
    du, di = r.sum(1), r.sum(0)
    su = np.where(du > 0, 1 / np.sqrt(np.maximum(du, 1)), 0)
    si = np.where(di > 0, 1 / np.sqrt(np.maximum(di, 1)), 0)
    rn = su[:, None] * r * si[None, :]
    _, _, vt = np.linalg.svd(rn)
    v = vt[:k].T
    back = np.where(si > 0, 1 / np.where(si > 0, si, 1), 0)
    expect = r @ rn.T @ rn + alpha * ((r * si[None, :]) @ v @ v.T) * back[None, :]
    got = model.scores(torch.arange(ds.num_users)).numpy()
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-5)
    low = lowrank.scores(torch.arange(ds.num_users)).numpy()
    np.testing.assert_allclose(low, expect, rtol=1e-3, atol=1e-4)


def test_gfcf_rejects_bad_arguments():
    ds = synthetic_bipartite(40, 30, 300, seed=2)
    train = ds.user_item_csr("train")
    with pytest.raises(ValueError, match="k must"):
        GFCF.fit(train, ds.num_items, k=30)
    with pytest.raises(ValueError, match="solver"):
        GFCF.fit(train, ds.num_items, k=4, solver="qr")
    with pytest.raises(ValueError, match="alpha"):
        GFCF.fit(train, ds.num_items, k=4, alpha=-1.0)


def _dense_normalised(ds):
    r = np.zeros((ds.num_users, ds.num_items))
    r[ds.train_users.numpy(), ds.train_items.numpy()] = 1.0
    du, di = r.sum(1), r.sum(0)
    su = np.where(du > 0, 1 / np.sqrt(np.maximum(du, 1)), 0)
    si = np.where(di > 0, 1 / np.sqrt(np.maximum(di, 1)), 0)
    return r, su[:, None] * r * si[None, :], di


def test_chebycf_coefficients_interpolate_the_plateau():
    # the degree-K interpolant passes through the targets at the K + 1 first-kind Chebyshev nodes
    from numpy.polynomial import chebyshev as C

    from graphrl.nn.graph_filter import chebyshev_coefficients, plateau_targets
    for order, phi in [(1, 1.0), (4, 2.0), (8, 1.5)]:
        nodes = np.cos((order + 1.5 - np.arange(1, order + 2)) / (order + 1) * np.pi)
        np.testing.assert_allclose(C.chebval(nodes, chebyshev_coefficients(order, phi)),
                                   plateau_targets(order, phi), atol=1e-12)
    np.testing.assert_allclose(plateau_targets(2, 1.0), [1.0, 0.5, 0.0])
    np.testing.assert_allclose(plateau_targets(4, 2.0), [1.0, 0.75, 0.5, 0.25, 0.0])


def test_chebycf_scores_equal_the_dense_spectral_formula():
    from numpy.polynomial import chebyshev as C

    from graphrl.nn.graph_filter import ChebyCF, chebyshev_coefficients
    ds = synthetic_bipartite(40, 30, 300, seed=3)
    train = ds.user_item_csr("train")
    order, phi, k, w, beta = 6, 1.5, 5, 0.3, 0.4
    model = ChebyCF.fit(train, ds.num_items, order=order, flatness=phi, ideal_k=k, ideal_weight=w,
                        degree_power=beta)  # q = min(k + 64, 30): the full SVD
    r, rn, di = _dense_normalised(ds)
    # the filter through the item-item matrix's eigendecomposition, not the recurrence
    mu, q = np.linalg.eigh(rn.T @ rn)
    response = C.chebval(1.0 - 2.0 * mu, chebyshev_coefficients(order, phi))
    v = np.linalg.svd(rn)[2][:k].T
    pre = np.where(di > 0, np.maximum(di, 1) ** -beta, 0)
    s = r * pre[None, :]
    expect = (s @ (q * response) @ q.T + w * s @ v @ v.T) * (1 / np.where(pre > 0, pre, 1) * (pre > 0))
    got = model.scores(torch.arange(ds.num_users)).numpy()
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-5)
    plain = ChebyCF.fit(train, ds.num_items, order=order, flatness=phi, ideal_k=0, degree_power=0.0)
    np.testing.assert_allclose(plain.scores(torch.arange(ds.num_users)).numpy(),
                               r @ (q * response) @ q.T, rtol=1e-4, atol=1e-5)
    # other settings on the same fit: the top 3 singular vectors, another exponent, order and flatness
    other = model.with_settings(4, 2.0, 0.5, 0.2, ideal_k=3)
    response = C.chebval(1.0 - 2.0 * mu, chebyshev_coefficients(4, 2.0))
    pre = np.where(di > 0, np.maximum(di, 1) ** -0.2, 0)
    s = r * pre[None, :]
    expect = (s @ (q * response) @ q.T + 0.5 * s @ v[:, :3] @ v[:, :3].T) * (1 / np.where(pre > 0, pre, 1))
    np.testing.assert_allclose(other.scores(torch.arange(ds.num_users)).numpy(), expect, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="ideal_k"):
        model.with_settings(4, 2.0, 0.5, 0.2, ideal_k=k + 1)


def test_chebycf_rejects_bad_arguments():
    from graphrl.nn.graph_filter import ChebyCF
    ds = synthetic_bipartite(40, 30, 300, seed=2)
    train = ds.user_item_csr("train")
    for kwargs, match in [({"order": 0}, "order"), ({"flatness": 0.0}, "flatness"),
                          ({"ideal_k": 30}, "ideal_k"), ({"ideal_weight": -0.1}, "ideal_weight"),
                          ({"degree_power": -1.0}, "degree_power")]:
        with pytest.raises(ValueError, match=match):
            ChebyCF.fit(train, ds.num_items, **{"ideal_k": 4, **kwargs})


def test_graph_filters_reject_what_would_score_silently_wrong():
    from graphrl.nn.graph_filter import ChebyCF
    ds = synthetic_bipartite(40, 30, 300, seed=2)
    train = ds.user_item_csr("train")
    for kwargs in ({"degree_power": float("inf")}, {"degree_power": 400.0}):  # inf d_I^beta: NaN scores
        with pytest.raises(ValueError, match="degree_power"):
            ChebyCF.fit(train, ds.num_items, ideal_k=4, **kwargs)
    with pytest.raises(ValueError, match="ideal_k"):
        ChebyCF.fit(train, ds.num_items, ideal_k=4.0)
    models = (ChebyCF.fit(train, ds.num_items, ideal_k=4, order=2), GFCF.fit(train, ds.num_items, k=4))
    for model in models:
        for users in (torch.tensor([-1]), torch.tensor([0, 40])):  # -1 would wrap to the last user
            with pytest.raises(ValueError, match="users"):
                model.scores(users)

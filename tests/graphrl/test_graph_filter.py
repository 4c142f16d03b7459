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

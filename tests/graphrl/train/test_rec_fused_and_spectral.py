"""The chunked full softmax against the materialised one; the spectral initialisation against scipy's SVD."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.datasets import load_gowalla
from graphrl.nn.spectral_init import spectral_embeddings
from graphrl.train.rec_losses import full_softmax_loss


def _materialised(user, items, rows, cols, temperature):
    user, items = F.normalize(user, dim=1), F.normalize(items, dim=1)
    logits = user @ items.t() / temperature
    return (torch.logsumexp(logits, dim=1)[rows] - logits[rows, cols]).mean()


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 12), i=st.integers(2, 30), chunk=st.integers(1, 13), pairs=st.integers(1, 40),
       temperature=st.sampled_from([0.05, 0.1, 0.5, 2.0]), seed=st.integers(0, 2**16))
def test_chunked_full_softmax_equals_the_materialised_one_in_value_and_gradients(b, i, chunk, pairs,
                                                                                  temperature, seed):
    g = torch.Generator().manual_seed(seed)
    user = torch.randn(b, 6, generator=g, dtype=torch.float64, requires_grad=True)
    items = torch.randn(i, 6, generator=g, dtype=torch.float64, requires_grad=True)
    rows = torch.randint(0, b, (pairs,), generator=g)   # users without a positive weigh nothing
    cols = torch.randint(0, i, (pairs,), generator=g)
    want = _materialised(user, items, rows, cols, temperature)
    got = full_softmax_loss(user, items, rows, cols, temperature, chunk_rows=chunk)
    assert got.item() == pytest.approx(want.item(), rel=1e-10, abs=1e-12)
    got_grads = torch.autograd.grad(got * 3.0, [user, items])
    for a, e in zip(got_grads, torch.autograd.grad(want * 3.0, [user, items]), strict=True):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-8, atol=1e-12)


def test_chunked_full_softmax_passes_gradcheck_and_rejects_a_bad_chunk():
    g = torch.Generator().manual_seed(3)
    user = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    items = torch.randn(9, 3, generator=g, dtype=torch.float64, requires_grad=True)
    rows, cols = torch.tensor([0, 0, 1, 4, 4, 4]), torch.tensor([2, 8, 0, 1, 2, 3])
    assert torch.autograd.gradcheck(lambda u, v: full_softmax_loss(u, v, rows, cols, 0.3, chunk_rows=2),
                                    (user, items))
    with pytest.raises(ValueError, match="chunk_rows must be an int >= 1, got 0"):
        full_softmax_loss(user, items, rows, cols, 0.3, chunk_rows=0)


def test_spectral_table_holds_the_normalised_matrix_top_singular_vectors(data_root):
    ds = load_gowalla(data_root)
    indptr, items = ds.user_item_csr("train")
    sub = indptr[:2001]                       # the first 2000 users, their items renumbered densely
    used, cols = np.unique(items[:sub[-1]], return_inverse=True)
    table = spectral_embeddings((sub, cols), used.size, dim=8, seed=0, power_iters=20)
    assert table.shape == (2000 + used.size, 8) and table.dtype == np.float32
    assert np.linalg.norm(table, axis=1).mean() == pytest.approx(0.8, rel=1e-5)
    r = sp.csr_matrix((np.ones(cols.size), cols, sub), shape=(2000, used.size))
    d_u, d_i = np.asarray(r.sum(1)).ravel(), np.asarray(r.sum(0)).ravel()
    norm = sp.diags(1 / np.sqrt(d_u)) @ r @ sp.diags(1 / np.sqrt(d_i))
    _, sigma, vt = sp.linalg.svds(norm, k=8)
    u_tab, v_tab = table[:2000].astype(np.float64), table[2000:].astype(np.float64)
    # each column of the table is (a multiple of) one singular pair: R~ v = sigma u, and the top sigma is 1
    col_sigma = np.linalg.norm(norm @ v_tab, axis=0) / np.linalg.norm(u_tab, axis=0)
    np.testing.assert_allclose(np.sort(col_sigma)[::-1], np.sort(sigma)[::-1], rtol=1e-3)
    assert col_sigma.max() == pytest.approx(1.0, abs=1e-4)
    # the item rows span scipy's top right singular space
    overlap = np.linalg.svd(vt @ (v_tab / np.linalg.norm(v_tab, axis=0)), compute_uv=False)
    assert overlap.min() > 0.99
    with pytest.raises(ValueError, match="dim must be an int in"):
        spectral_embeddings((sub, cols), used.size, dim=0)


@pytest.fixture(scope="module")
def tiny_split():
    from graphrl.datasets import synthetic_bipartite
    from graphrl.datasets.validation import holdout_validation

    return holdout_validation(synthetic_bipartite(200, 300, 5000, seed=1), fraction=0.1, seed=0)


def test_cosine_schedule_follows_the_half_cosine_over_the_epoch_budget(tiny_split):
    from graphrl.train.recommend import RecommendConfig, train_recommender

    cfg = RecommendConfig(batch_size=50, lr=1e-2, min_lr=1e-4, epochs=4, minutes=None, eval_every=1,
                          embedding_dim=8, patience=10, schedule="cosine")
    report = train_recommender(tiny_split, cfg)
    total = report.steps
    assert total == 4 * (tiny_split.dataset.user_item_csr("train")[0].size - 1) // 50
    for entry in report.curve:          # the rate of the interval's last step (step index s - 1)
        want = 1e-4 + (1e-2 - 1e-4) * 0.5 * (1 + math.cos(math.pi * (entry["step"] - 1) / total))
        assert entry["lr"] == pytest.approx(want, rel=1e-12)
    assert report.curve[-1]["lr"] < 2e-4 < 5e-3 < report.curve[0]["lr"]


def test_spectral_init_starts_from_the_spectral_table(tiny_split):
    from graphrl.train.recommend import RecommendConfig, train_recommender

    ds = tiny_split.dataset
    cfg = RecommendConfig(batch_size=50, lr=1e-12, epochs=1, minutes=None, eval_every=1, embedding_dim=8,
                          init="spectral", seed=4)
    report = train_recommender(tiny_split, cfg)
    table = spectral_embeddings(ds.user_item_csr("train"), ds.num_items, 8, seed=4)
    np.testing.assert_allclose(report.model.embedding.weight.detach().numpy(), table, atol=1e-9)
    assert report.train_seconds > 0 and report.curve[0]["train_seconds"] > 0


def test_config_rejects_an_unknown_init_or_schedule():
    from graphrl.train.recommend import RecommendConfig

    with pytest.raises(ValueError, match="init must be one of"):
        RecommendConfig(init="xavier")
    with pytest.raises(ValueError, match="schedule must be one of"):
        RecommendConfig(schedule="step")


def test_normalized_interactions_by_hand_and_lowrank_svd_checks_k():
    from graphrl.nn.interaction_matrix import lowrank_svd, normalized_interactions

    # user 0: items 0, 1, 1 (a repeat counts once); user 1: item 1; user 2: nothing
    m = normalized_interactions((np.array([0, 3, 4, 4]), np.array([0, 1, 1, 1])), num_items=3)
    np.testing.assert_array_equal(m.interactions.toarray(), [[1, 1, 0], [0, 1, 0], [0, 0, 0]])
    s2 = 1 / np.sqrt(2)
    np.testing.assert_allclose(m.normalized.toarray(), [[s2, s2 * s2, 0], [0, s2, 0], [0, 0, 0]])
    np.testing.assert_allclose(m.item_scale, [1, s2, 0])
    with pytest.raises(ValueError, match=r"item ids must lie in \[0, num_items=3\)"):
        normalized_interactions((np.array([0, 1]), np.array([3])), num_items=3)
    u, v = lowrank_svd(m.normalized, k=2, seed=0, oversample=1)
    want = np.linalg.svd(m.normalized.toarray(), compute_uv=False)[:2]
    np.testing.assert_allclose(np.linalg.norm(m.normalized @ v, axis=0), want, rtol=1e-8)
    with pytest.raises(ValueError, match=r"k must lie in \[1, 3\], got 4"):
        lowrank_svd(m.normalized, k=4)

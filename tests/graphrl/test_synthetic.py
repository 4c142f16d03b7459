"""Synthetic generators: seeding, power-law shape (scaled), bipartite invariants, argument errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from graphrl.datasets import synthetic_bipartite, synthetic_graph
from graphrl.datasets.synthetic import powerlaw_rank_probabilities


# -------------------------------------------------------------------------------- rank probabilities
def test_rank_probabilities_closed_forms():
    p = powerlaw_rank_probabilities(4, 0.0)
    assert np.allclose(p, 0.25)
    p = powerlaw_rank_probabilities(3, 1.0)  # ln(k+2) - ln(k+1) over ln 4
    assert np.allclose(p, np.log([2 / 1, 3 / 2, 4 / 3]) / np.log(4))
    p = powerlaw_rank_probabilities(1000, 0.8)
    assert p.sum() == pytest.approx(1.0)
    assert np.all(np.diff(p) < 0)
    # continuous law x^-0.8 on [1, 1001): P(rank 0) = (2^0.2 - 1) / (1001^0.2 - 1)
    assert p[0] == pytest.approx((2**0.2 - 1) / (1001**0.2 - 1))


def test_full_scale_hub_is_predicted_above_1e5():
    """The scaled law (checked empirically below at 20K / 400K) predicts the 1M / 20M hub size."""
    expected_top = 20_000_000 * powerlaw_rank_probabilities(1_000_000)
    assert expected_top[0] > 1.5e5
    assert expected_top[1] > 1e5


# ---------------------------------------------------------------------------------------- graph
def test_synthetic_graph_is_seeded():
    a = synthetic_graph(500, 4000, "powerlaw", seed=5)
    b = synthetic_graph(500, 4000, "powerlaw", seed=5)
    c = synthetic_graph(500, 4000, "powerlaw", seed=6)
    for f in ("indptr", "indices", "edge_ids"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.indices, c.indices)
    # no global RNG: reseeding numpy's legacy global state changes nothing
    np.random.seed(0)  # noqa: NPY002 - deliberately touching the legacy global state
    d = synthetic_graph(500, 4000, "uniform", seed=5)
    np.random.seed(1)  # noqa: NPY002
    e = synthetic_graph(500, 4000, "uniform", seed=5)
    assert torch.equal(d.indices, e.indices) and torch.equal(d.indptr, e.indptr)


def test_uniform_graph_degrees_are_poisson_like():
    g = synthetic_graph(20_000, 400_000, "uniform", seed=1)
    assert g.num_nodes == 20_000 and g.num_edges == 400_000
    assert g.indices.dtype == torch.int32
    deg = g.in_degrees().numpy()
    assert deg.mean() == 20
    # Poisson(20): P(d >= 50) ~ 1e-8 per node; the power-law graph below has hubs of thousands
    assert deg.max() < 50
    assert deg.var() == pytest.approx(20, rel=0.1)
    out = np.bincount(g.indices.numpy(), minlength=20_000)
    assert out.max() < 50


@pytest.mark.parametrize("exponent", [0.8, 1.0])
def test_powerlaw_hubs_match_the_law_at_small_scale(exponent):
    n, e = 20_000, 400_000  # the benchmark's 1M / 20M scaled down 50x, same mean degree 20
    g = synthetic_graph(n, e, "powerlaw", seed=1, exponent=exponent)
    deg = g.in_degrees().numpy()
    expected = e * powerlaw_rank_probabilities(n, exponent)
    top = np.sort(deg)[::-1]
    assert np.allclose(top[:5], expected[:5], rtol=0.05)
    assert top[0] > 400 * deg.mean()  # far from uniform
    # hubs are spread over the id range by the permutation, not ids 0..9
    assert set(np.argsort(deg)[::-1][:10].tolist()) != set(range(10))
    # degree tail: about k nodes have in-degree >= expected[k-1]
    for k in (10, 100, 1000):
        assert 0.8 * k <= (deg >= expected[k - 1]).sum() <= 1.25 * k


def test_powerlaw_exponent_zero_is_uniform_like():
    deg = synthetic_graph(20_000, 400_000, "powerlaw", seed=1, exponent=0.0).in_degrees().numpy()
    assert deg.max() < 50


def test_sources_stay_uniform_in_powerlaw_graph():
    g = synthetic_graph(20_000, 400_000, "powerlaw", seed=2)
    out = np.bincount(g.indices.numpy(), minlength=20_000)
    assert out.max() < 50


def test_synthetic_graph_small_and_empty():
    g = synthetic_graph(1, 5, "powerlaw", seed=0)
    assert g.indptr.tolist() == [0, 5] and g.indices.tolist() == [0] * 5
    g = synthetic_graph(10, 0, "uniform")
    assert g.num_edges == 0 and g.num_nodes == 10


def test_synthetic_graph_errors():
    with pytest.raises(ValueError, match="in_degree"):
        synthetic_graph(10, 10, "zipf")
    with pytest.raises(ValueError, match="num_nodes"):
        synthetic_graph(0, 10)
    with pytest.raises(ValueError, match="num_edges"):
        synthetic_graph(10, -1)
    with pytest.raises(TypeError, match="num_edges"):
        synthetic_graph(10, 1e3)
    with pytest.raises(ValueError, match="exponent"):
        synthetic_graph(10, 10, "powerlaw", exponent=-0.5)
    with pytest.raises(ValueError, match="exponent"):
        synthetic_graph(10, 10, "powerlaw", exponent=float("nan"))
    with pytest.raises(TypeError, match="seed"):
        synthetic_graph(10, 10, seed=1.5)


def test_full_scale_powerlaw_graph_has_hubs_over_1e5():
    """The benchmark graph itself (~3 s, ~1 GB peak): seed 0 gives a largest hub of 200,271 in-edges."""
    g = synthetic_graph(1_000_000, 20_000_000, "powerlaw", seed=0)
    deg = g.in_degrees().numpy()
    assert g.num_edges == 20_000_000
    assert deg.max() > 1e5 and (deg > 1e5).sum() >= 2


# ------------------------------------------------------------------------------------------ bipartite
def _pairs(users, items, num_items):
    return users.numpy().astype(np.int64) * num_items + items.numpy()


def test_bipartite_invariants():
    u, i, m = 3000, 5000, 60_000
    ds = synthetic_bipartite(u, i, m, seed=2, test_fraction=0.2)
    assert ds.name == "synthetic" and ds.num_users == u and ds.num_items == i
    assert ds.num_train + ds.num_test == m
    train = _pairs(ds.train_users, ds.train_items, i)
    test = _pairs(ds.test_users, ds.test_items, i)
    assert np.unique(train).size == train.size and np.unique(test).size == test.size
    assert np.intersect1d(train, test).size == 0
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)  # sorted by (user, item)
    per_user_train = np.bincount(ds.train_users.numpy(), minlength=u)
    per_user = per_user_train + np.bincount(ds.test_users.numpy(), minlength=u)
    assert per_user_train.min() >= 1
    assert np.array_equal(np.bincount(ds.test_users.numpy(), minlength=u), np.floor(per_user * 0.2))
    for t in (ds.train_users, ds.train_items, ds.test_users, ds.test_items):
        assert t.dtype == torch.int64
    assert ds.train_items.max() < i and ds.train_users.max() < u
    assert ds.graph.num_nodes == u + i and ds.graph.num_edges == 2 * ds.num_train
    assert np.array_equal(ds.graph.in_degrees().numpy()[:u], per_user_train)


def test_bipartite_is_power_law_in_both_sides():
    u, i, m = 3000, 5000, 60_000
    skewed = synthetic_bipartite(u, i, m, seed=2)
    flat = synthetic_bipartite(u, i, m, seed=2, exponent=0.0)

    def ratios(ds):
        users = np.concatenate([ds.train_users.numpy(), ds.test_users.numpy()])
        items = np.concatenate([ds.train_items.numpy(), ds.test_items.numpy()])
        ud, idg = np.bincount(users, minlength=u), np.bincount(items, minlength=i)
        return ud.max() / ud.mean(), idg.max() / idg.mean()

    su, si = ratios(skewed)
    fu, fi = ratios(flat)
    assert su > 20 and si > 20
    assert fu < 3 and fi < 3


def test_bipartite_is_seeded():
    a = synthetic_bipartite(200, 300, 3000, seed=9)
    b = synthetic_bipartite(200, 300, 3000, seed=9)
    c = synthetic_bipartite(200, 300, 3000, seed=10)
    for f in ("train_users", "train_items", "test_users", "test_items"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.train_items, c.train_items)


def test_bipartite_no_test_split_and_exact_minimum():
    ds = synthetic_bipartite(50, 80, 50, seed=0, test_fraction=0.5)  # one item per user: nothing to hold out
    assert ds.num_train == 50 and ds.num_test == 0
    assert torch.equal(ds.train_users, torch.arange(50))
    ds = synthetic_bipartite(50, 80, 400, seed=0, test_fraction=0.0)
    assert ds.num_train == 400 and ds.num_test == 0


def test_bipartite_saturated_power_law_still_exact():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = synthetic_bipartite(4, 100, 200, seed=0, exponent=4.0)  # density cap 1/2 reached
    assert any(issubclass(w.category, RuntimeWarning) and "saturated" in str(w.message) for w in caught)
    pairs = np.concatenate([_pairs(ds.train_users, ds.train_items, 100),
                            _pairs(ds.test_users, ds.test_items, 100)])
    assert pairs.size == 200 and np.unique(pairs).size == 200


def test_bipartite_errors():
    with pytest.raises(ValueError, match="num_interactions"):
        synthetic_bipartite(10, 10, 9)
    with pytest.raises(ValueError, match="num_interactions"):
        synthetic_bipartite(10, 10, 51)
    with pytest.raises(ValueError, match="test_fraction"):
        synthetic_bipartite(10, 10, 20, test_fraction=1.0)
    with pytest.raises(ValueError, match="num_items"):
        synthetic_bipartite(10, 0, 20)
    with pytest.raises(TypeError, match="num_users"):
        synthetic_bipartite(10.0, 10, 20)

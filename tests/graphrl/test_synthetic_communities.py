"""synthetic_communities: power-law degrees (rank-frequency slopes), planted communities, a per-user
hold-out disjoint from train, exact counts, seeding and argument errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrl.datasets.synthetic import synthetic_communities

U, ITEMS, M, C = 3000, 4000, 100_000, 16


@pytest.fixture(scope="module")
def ds():
    return synthetic_communities(U, ITEMS, M, num_communities=C, affinity=0.8, seed=3, min_degree=10,
                                 user_exponent=0.3, item_exponent=0.8)


def _pairs(ds):
    users = torch.cat([ds.train_users, ds.test_users]).numpy()
    items = torch.cat([ds.train_items, ds.test_items]).numpy()
    return users, items


def _rank_slope(counts: np.ndarray, lo: int, hi: int) -> tuple[float, float]:
    """Least-squares slope and R^2 of log(count) against log(rank) over ranks lo..hi (1-based)."""
    c = np.sort(counts)[::-1][lo - 1:hi].astype(np.float64)
    x, y = np.log(np.arange(lo, hi + 1)), np.log(c)
    slope, icpt = np.polyfit(x, y, 1)
    r2 = 1 - np.sum((y - (slope * x + icpt)) ** 2) / np.sum((y - y.mean()) ** 2)
    return float(slope), float(r2)


def test_counts_split_and_hold_out_are_exact(ds):
    users, items = _pairs(ds)
    assert ds.num_train + ds.num_test == M
    keys = users * ITEMS + items
    assert np.unique(keys).size == M  # no duplicate pair, so train and test are disjoint
    train_keys = ds.train_users.numpy() * ITEMS + ds.train_items.numpy()
    test_keys = ds.test_users.numpy() * ITEMS + ds.test_items.numpy()
    assert np.intersect1d(train_keys, test_keys).size == 0
    n = np.bincount(users, minlength=U)
    assert n.min() >= 10
    assert np.array_equal(np.bincount(ds.test_users.numpy(), minlength=U), np.floor(n * 0.2).astype(np.int64))
    assert ds.graph.num_edges == 2 * ds.num_train  # both directions of the training pairs


def test_degrees_follow_the_power_laws(ds):
    users, items = _pairs(ds)
    item_slope, item_r2 = _rank_slope(np.bincount(items, minlength=ITEMS), 10, 1000)
    assert -0.9 < item_slope < -0.5 and item_r2 > 0.97  # Zipf exponent 0.8, flattened by repeats drawn again
    extra = np.bincount(users, minlength=U) - 10  # degree = min_degree + a Zipf(0.3) share
    user_slope, user_r2 = _rank_slope(extra, 10, 1000)
    assert -0.4 < user_slope < -0.2 and user_r2 > 0.95
    # against the same generator without the laws: flat rank-frequency
    flat = synthetic_communities(U, ITEMS, M, num_communities=C, seed=3, user_exponent=0.0, item_exponent=0.0)
    flat_items = torch.cat([flat.train_items, flat.test_items]).numpy()
    assert abs(_rank_slope(np.bincount(flat_items, minlength=ITEMS), 10, 1000)[0]) < 0.1


def test_communities_are_planted(ds):
    users, items = _pairs(ds)
    uc, ic = ds.extra["user_community"].numpy(), ds.extra["item_community"].numpy()
    assert np.bincount(uc).max() - np.bincount(uc).min() <= 1 and np.bincount(ic).size == C
    within = (uc[users] == ic[items]).mean()
    assert 0.75 < within <= 0.8 + 0.2 / C + 0.01  # at most about affinity + (1 - affinity) / C
    shuffled = np.random.default_rng(0).permutation(ic)  # the same pairs, communities dealt at random
    assert (uc[users] == shuffled[items]).mean() < 2.0 / C
    no_affinity = synthetic_communities(U, ITEMS, M, num_communities=C, affinity=0.0, seed=3)
    u0, i0 = _pairs(no_affinity)
    assert (no_affinity.extra["user_community"].numpy()[u0]
            == no_affinity.extra["item_community"].numpy()[i0]).mean() < 2.0 / C


def test_seeded():
    a = synthetic_communities(200, 300, 4000, num_communities=4, seed=11)
    b = synthetic_communities(200, 300, 4000, num_communities=4, seed=11)
    c = synthetic_communities(200, 300, 4000, num_communities=4, seed=12)
    for f in ("train_users", "train_items", "test_users", "test_items"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert torch.equal(a.extra["item_community"], b.extra["item_community"])
    assert not torch.equal(a.train_items, c.train_items)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_interactions": 100}, "num_interactions"),
    ({"num_communities": 301}, "num_communities"),
    ({"affinity": 1.5}, "affinity"),
    ({"test_fraction": 1.0}, "test_fraction"),
    ({"num_interactions": 60_000, "user_exponent": 3.0}, "num_items / 2"),
    ({"item_exponent": float("nan")}, "item_exponent"),
    ({"user_exponent": -1.0}, "user_exponent"),
    ({"affinity": "high"}, "affinity"),
    ({"test_fraction": None}, "test_fraction"),
])
def test_errors_name_the_argument(kwargs, match):
    args = {"num_users": 200, "num_items": 300, "num_interactions": 4000, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        synthetic_communities(**args)
    with pytest.raises(TypeError, match="num_users"):
        synthetic_communities(2.5, 300, 4000)

"""The validation split: carved from train only, disjoint, deterministic, every user keeps a training item."""

from __future__ import annotations

import numpy as np
import pytest

from graphrl.datasets import load_gowalla
from graphrl.datasets.validation import holdout_validation


@pytest.fixture(scope="module")
def gowalla(data_root):
    return load_gowalla(data_root)


def _pairs(users, items):
    return set(zip(users.tolist(), items.tolist(), strict=True))


def test_split_is_disjoint_from_train_and_test_and_partitions_train(gowalla):
    split = holdout_validation(gowalla, fraction=0.05, seed=0)
    tr, va = split.train_index.numpy(), split.val_index.numpy()
    assert np.intersect1d(tr, va).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([tr, va])), np.arange(gowalla.num_train))
    val = _pairs(split.val_users, split.val_items)
    kept = _pairs(split.dataset.train_users, split.dataset.train_items)
    test = _pairs(gowalla.test_users, gowalla.test_items)
    assert not val & kept and not val & test
    assert abs(len(val) / gowalla.num_train - 0.05) < 0.002
    # the training graph has no validation edge: its edges are exactly the kept interactions, both ways
    g = split.dataset.graph
    assert g.num_edges == 2 * split.dataset.num_train
    counts = np.bincount(split.dataset.train_users.numpy(), minlength=gowalla.num_users)
    before = np.bincount(gowalla.train_users.numpy(), minlength=gowalla.num_users)
    assert (counts >= np.minimum(before, 1)).all()
    np.testing.assert_array_equal(g.in_degrees().numpy()[:gowalla.num_users], counts)
    # test untouched
    assert split.dataset.test_users is gowalla.test_users


def test_split_is_deterministic_and_depends_on_the_seed(gowalla):
    a = holdout_validation(gowalla, fraction=0.05, seed=0)
    b = holdout_validation(gowalla, fraction=0.05, seed=0)
    c = holdout_validation(gowalla, fraction=0.05, seed=1)
    np.testing.assert_array_equal(a.val_index.numpy(), b.val_index.numpy())
    assert not np.array_equal(a.val_index.numpy(), c.val_index.numpy())
    indptr, items = a.validation_csr()
    assert indptr[-1] == a.val_users.numel() and (np.diff(indptr) >= 0).all()


def test_bad_fraction(gowalla):
    for bad in (0.0, 1.0, -0.1, "x"):
        with pytest.raises(ValueError, match="fraction"):
            holdout_validation(gowalla, fraction=bad)

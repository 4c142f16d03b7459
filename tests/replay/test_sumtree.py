"""Sum-tree and argmin-tree kernels (replay.sumtree): invariants under random updates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.sumtree import min_build_keys, min_set, sum_find, sum_set, tree_size


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 70),
    ops=st.lists(st.tuples(st.integers(0, 69), st.floats(0, 1e6, allow_nan=False)), min_size=1, max_size=80),
    us=st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=20),
)
def test_sum_tree_invariants(capacity, ops, us):
    size = tree_size(capacity)
    tree = np.zeros(2 * size)
    leaves = np.zeros(capacity)
    for idx, val in ops:
        idx %= capacity
        leaves[idx] = val
        sum_set(tree, size, np.array([idx]), np.array([val]))
    assert np.array_equal(tree[size : size + capacity], leaves)
    for j in range(1, size):  # every inner node is exactly the sum of its children
        assert tree[j] == tree[2 * j] + tree[2 * j + 1]
    assert tree[1] == pytest.approx(leaves.sum(), rel=1e-12, abs=1e-9)
    if tree[1] > 0:
        u = np.array(us) * tree[1]
        out = np.empty(len(u), dtype=np.int64)
        sum_find(tree, size, u, out)
        cum = np.concatenate([[0.0], np.cumsum(leaves)])
        for x, leaf in zip(u, out, strict=True):
            assert 0 <= leaf < capacity and leaves[leaf] > 0  # never a zero leaf
            # x falls in the leaf's interval (up to rounding of the partial sums)
            assert cum[leaf] - 1e-6 * tree[1] <= x <= cum[leaf + 1] + 1e-6 * tree[1]


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 40),
    ops=st.lists(st.tuples(st.integers(0, 39), st.sampled_from([0.0, 1.0, 2.0, np.inf])), max_size=60),
)
def test_min_tree_root_is_the_argmin_by_key_then_seq(capacity, ops):
    size = tree_size(capacity)
    key = np.full(capacity, np.inf)
    seq = np.arange(capacity)[::-1].copy()
    tree = np.zeros(2 * size, dtype=np.int64)
    min_build_keys(tree, size, capacity, key, seq)
    for idx, val in ops:
        idx %= capacity
        key[idx] = val
        min_set(tree, size, np.array([idx]), key, seq)
    root = tree[1]
    best = min(range(capacity), key=lambda i: (key[i], seq[i]))
    assert key[root] == key[best] and (np.isinf(key[best]) or root == best)

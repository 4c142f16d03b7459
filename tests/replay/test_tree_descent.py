"""The sum-tree kernels of a prioritized draw (replay.draw_kernels): `draw_anchors`' select-based
descent and `set_weights`' update (each row's ancestors, then whole levels near the root).

Exact checks use dyadic leaves whose total is a power of two, so every partial sum, every ``u * total``
and every prefix is exact and the drawn leaf must equal numpy's searchsorted on the cumulative leaves.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from replay.draw_kernels import draw_anchors, set_weights
from replay.selector_state import SelectorState
from replay.selectors import Prioritized
from replay.sumtree import sum_build, tree_size

NO_FILL = np.zeros(0, dtype=np.int64)


def built(leaves: np.ndarray) -> tuple[np.ndarray, int]:
    """A one-shard weight tree over ``leaves`` (float64 [C]) from `sum_build`."""
    size = tree_size(leaves.size)
    tree = np.zeros((1, 2 * size))
    tree[0, size : size + leaves.size] = leaves
    sum_build(tree[0], size)
    return tree, size


def draw(tree: np.ndarray, size: int, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = u.size
    shard, slot, prob = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n)
    draw_anchors(u, tree, size, NO_FILL, np.zeros((tree.shape[0], 1), np.int64), False, shard, slot, prob)
    return shard, slot, prob


@settings(max_examples=80, deadline=None)
@given(
    weights=st.lists(st.integers(0, 9), min_size=1, max_size=300),
    capacity_extra=st.integers(0, 40),
)
def test_every_leaf_is_reached_exactly_where_searchsorted_puts_it(weights, capacity_extra):
    """Integer leaves (zeros among them) padded so the total is a power of two; capacity not a power
    of two in general. For the left edge, middle and last float below the right edge of every leaf's
    interval the descent returns that leaf, never a zero one, and probability leaf / total exactly."""
    w = np.array(weights, dtype=np.float64)
    total = float(w.sum())
    pad = (1 << max(0, int(total) - 1).bit_length()) - total if total > 0 else 1.0
    leaves = np.concatenate([w, [pad], np.zeros(capacity_extra)])
    total = float(leaves.sum())
    assert int(total) & (int(total) - 1) == 0
    tree, size = built(leaves)
    cum = np.cumsum(leaves)
    live = np.flatnonzero(leaves > 0)
    lo = cum[live] - leaves[live]
    xs = np.concatenate([lo, lo + leaves[live] / 2, np.nextafter(cum[live], -np.inf)])
    u = xs / total  # exact: total is a power of two
    assert np.array_equal(u * total, xs)
    shard, slot, prob = draw(tree, size, u)
    want = np.searchsorted(cum, xs, side="right")
    np.testing.assert_array_equal(slot, want)
    np.testing.assert_array_equal(slot, np.tile(live, 3))  # every live leaf, from each of its points
    assert (shard == 0).all() and (leaves[slot] > 0).all()
    np.testing.assert_array_equal(prob, leaves[slot] / total)


@settings(max_examples=60, deadline=None)
@given(shards=st.integers(1, 4), capacity=st.integers(1, 90), data=st.data())
def test_set_weights_keeps_every_node_the_sum_of_its_children(shards, capacity, data):
    """After rounds of random updates of any size (duplicates included, some items not live) every
    inner node equals a rebuilt tree bitwise and the roots equal numpy's sums of the leaves."""
    size = tree_size(capacity)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    exponent = data.draw(st.sampled_from([0.0, 0.5, 0.6, 1.0]))
    priority = np.zeros((shards, capacity))
    weights = np.zeros((shards, capacity))
    state = (rng.random((shards, capacity)) < 0.85).astype(np.uint8)
    wtree = np.zeros((shards, 2 * size))
    every = np.arange(shards * capacity)
    set_weights(every // capacity, every % capacity, np.ones(every.size), exponent, state, priority, weights,
                wtree, size)  # every item written once, then rounds of random updates
    for _ in range(data.draw(st.integers(1, 6))):
        k = data.draw(st.integers(0, 3 * shards * capacity))
        shard = rng.integers(0, shards, k)
        slot = rng.integers(0, capacity, k)
        p = rng.choice([0.0, 0.25, 1.0, 3.0], k) if data.draw(st.booleans()) else rng.uniform(0, 5, k)
        top = set_weights(shard, slot, p, exponent, state, priority, weights, wtree, size)
        assert top == (p.max() if k else -1.0)
    want_w = np.where(state == 1, priority**exponent, 0.0)
    np.testing.assert_allclose(weights, want_w, rtol=1e-15, atol=0)  # numba's pow and numpy's: an ulp
    np.testing.assert_array_equal(wtree[:, size : size + capacity], weights)
    want = np.zeros_like(wtree)
    want[:, size : size + capacity] = weights
    for s in range(shards):
        sum_build(want[s], size)
    np.testing.assert_array_equal(wtree, want)
    np.testing.assert_allclose(wtree[:, 1], want_w.sum(axis=1), rtol=1e-12, atol=0)
    if exponent == 1.0 and set(np.unique(priority)) <= {0.0, 0.25, 1.0, 3.0}:
        np.testing.assert_array_equal(wtree[:, 1], weights.sum(axis=1))  # dyadic: exact


def test_draws_follow_the_priorities_and_never_a_zero_leaf():
    """Chi-square of 200k draws against p ** 0.6 / sum over a tree of 1000 leaves (not a power of two)
    written by `set_weights`, a fifth of them zero."""
    rng = np.random.default_rng(7)
    cap = 1000
    size = tree_size(cap)
    p = rng.uniform(0.1, 3.0, cap)
    p[rng.random(cap) < 0.2] = 0.0
    priority, weights = np.zeros((1, cap)), np.zeros((1, cap))
    wtree = np.zeros((1, 2 * size))
    state = np.ones((1, cap), np.uint8)
    set_weights(np.zeros(cap, np.int64), np.arange(cap), p, 0.6, state, priority, weights, wtree, size)
    counts = np.zeros(cap, np.int64)
    for _ in range(50):
        _, slot, prob = draw(wtree, size, rng.random(4000))
        np.add.at(counts, slot, 1)
        np.testing.assert_allclose(prob, weights[0, slot] / weights.sum(), rtol=1e-12)
    assert counts[p == 0].sum() == 0
    nz = p > 0
    expected = weights[0, nz] / weights[0, nz].sum() * counts.sum()
    assert stats.chisquare(counts[nz], expected).pvalue > 1e-3


def test_state_dict_round_trip_restores_the_tree_and_the_draws():
    """Priorities set through the update kernel; a restored state has the same weight tree bitwise
    (rebuilt from the leaves) and draws the same rows with the same probabilities."""
    a = SelectorState(Prioritized(0.6), 3, 300, seed=3)
    for s in range(3):
        a.insert(s, np.arange(250 + s * 20), np.arange(250 + s * 20) + 1000 * s)
    rng = np.random.default_rng(1)
    for _ in range(5):
        shards = rng.integers(0, 3, 256)
        slots = rng.integers(0, 250, 256)
        a.set_priorities(shards, slots, rng.uniform(0.0, 4.0, 256))
    b = SelectorState(Prioritized(0.6), 3, 300, seed=99)
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(b.wtree, a.wtree)
    np.testing.assert_array_equal(b.weights, a.weights)
    for want, got in zip(a.sample(512), b.sample(512), strict=True):
        np.testing.assert_array_equal(np.asarray(want), np.asarray(got))

"""Selectors: distributions (chi-square, across shards), deterministic orders, max_times_sampled, configs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from replay.selector_state import EXHAUSTED, SelectorState
from replay.selectors import (
    Fifo,
    Lifo,
    MaxHeap,
    MinHeap,
    Prioritized,
    Uniform,
    selector_from_config,
)

FILL = [7, 30, 0, 50]  # items per shard: shards of different sizes, one empty


def filled(selector, max_times_sampled=0, seed=0, capacity=50):
    state = SelectorState(selector, len(FILL), capacity, max_times_sampled=max_times_sampled, seed=seed)
    seq = 0
    for s, n in enumerate(FILL):
        state.insert(s, np.arange(n), np.arange(seq, seq + n))
        seq += n
    return state


def draw_counts(state, draws, batch=500):
    counts = np.zeros((state.num_shards, state.capacity))
    probs = {}
    for _ in range(draws // batch):
        sh, sl, p, _ = state.sample(batch)
        np.add.at(counts, (sh, sl), 1)
        for a, b, q in zip(sh, sl, p, strict=True):
            probs[(int(a), int(b))] = q
    return counts, probs


def test_uniform_across_shards_is_one_table_chi_square():
    state = filled(Uniform())
    n_items = sum(FILL)
    counts, probs = draw_counts(state, 200 * n_items)
    live = np.zeros_like(counts, dtype=bool)
    for s, n in enumerate(FILL):
        live[s, :n] = True
    assert counts[~live].sum() == 0  # never an empty slot
    assert stats.chisquare(counts[live]).pvalue > 1e-3
    assert np.allclose(list(probs.values()), 1 / n_items)
    # shards in proportion to their sizes
    per_shard = counts.sum(axis=1)
    expected = np.array(FILL) / n_items * per_shard.sum()
    keep = expected > 0
    assert stats.chisquare(per_shard[keep], expected[keep]).pvalue > 1e-3


def test_prioritized_across_shards_matches_p_to_the_alpha_chi_square():
    alpha = 0.7
    state = filled(Prioritized(exponent=alpha), seed=1)
    rng = np.random.default_rng(5)
    prios = {}
    for s, n in enumerate(FILL):
        if n:
            p = rng.uniform(0.0, 5.0, n)
            p[0] = 0.0  # a zero-priority item is never drawn while others have mass
            state.update(s, np.arange(n), p)
            prios[s] = p
    weights = np.concatenate([prios[s] ** alpha for s in prios])
    expected_p = weights / weights.sum()
    draws = 100_000
    counts, probs = draw_counts(state, draws)
    observed = np.concatenate([counts[s, : len(prios[s])] for s in prios])
    assert observed[expected_p == 0].sum() == 0
    nz = expected_p > 0
    assert stats.chisquare(observed[nz], expected_p[nz] * observed.sum()).pvalue > 1e-3
    flat = {}
    i = 0
    for s in prios:
        for c in range(len(prios[s])):
            flat[(s, c)] = expected_p[i]
            i += 1
    for key, q in probs.items():
        assert q == pytest.approx(flat[key], rel=1e-9)


def test_all_zero_priorities_sample_uniformly():
    state = filled(Prioritized())
    for s, n in enumerate(FILL):
        state.update(s, np.arange(n), np.zeros(n))
    counts, probs = draw_counts(state, 100 * sum(FILL))
    live = counts[counts > 0]
    assert live.size == sum(FILL)
    assert stats.chisquare(live).pvalue > 1e-3
    assert np.allclose(list(probs.values()), 1 / sum(FILL))


def test_zero_mass_shard_is_never_drawn_while_others_have_mass():
    state = filled(Prioritized())
    state.update(1, np.arange(30), np.zeros(30))
    sh, _, _, _ = state.sample(2000)
    assert 1 not in set(sh.tolist()) and {0, 3} <= set(sh.tolist())


def test_uniform_max_times_sampled_one_is_without_replacement():
    state = filled(Uniform(), max_times_sampled=1)
    n = sum(FILL)
    sh, sl, p, removed = state.sample(n + 10)  # asks more than there are: gets each item exactly once
    assert len(sh) == n and removed == n
    assert len(set(zip(sh.tolist(), sl.tolist(), strict=True))) == n
    # sequential probabilities: 1/n, 1/(n-1), ..., 1
    assert np.allclose(np.sort(1 / p), np.arange(1, n + 1))
    assert state.live_count() == 0 and state.sample(5)[0].size == 0


def test_prioritized_max_times_sampled_caps_each_item():
    state = filled(Prioritized(), max_times_sampled=3, seed=3)
    sh, sl, _, removed = state.sample(3 * sum(FILL))
    pairs, counts = np.unique(np.stack([sh, sl]), axis=1, return_counts=True)
    assert counts.max() == 3 and counts.sum() == 3 * sum(FILL) and removed == sum(FILL)
    assert (state.state[state.state > 0] == EXHAUSTED).all()


def test_fifo_and_lifo_follow_commit_order_across_shards():
    # commit order interleaves shards: shard 0 gets even seqs, shard 1 odd seqs
    for selector, expect in ((Fifo(), list(range(8))), (Lifo(), list(range(7, -1, -1)))):
        state = SelectorState(selector, 2, 4, max_times_sampled=1)
        state.insert(0, np.arange(4), np.arange(0, 8, 2))
        state.insert(1, np.arange(4), np.arange(1, 8, 2))
        sh, sl, p, removed = state.sample(10)
        assert (sl * 2 + sh).tolist() == expect and removed == 8 and np.all(p == 1)


def test_deterministic_selectors_without_limit_repeat_the_same_item():
    state = filled(Fifo())
    sh, sl, _, removed = state.sample(6)
    assert sh.tolist() == [0] * 6 and sl.tolist() == [0] * 6 and removed == 0
    assert state.times[0, 0] == 6


def test_heaps_order_by_priority_then_age():
    for selector, expect in (
        (MinHeap(), [(1, 1), (0, 0), (1, 0), (0, 2), (0, 1)]),
        (MaxHeap(), [(0, 1), (1, 0), (0, 2), (0, 0), (1, 1)]),
    ):
        state = SelectorState(selector, 2, 3, max_times_sampled=1)
        state.insert(0, np.arange(3), np.array([0, 2, 4]))
        state.insert(1, np.arange(2), np.array([1, 3]))
        state.update(0, np.arange(3), [1.0, 5.0, 2.0])
        state.update(1, np.arange(2), [2.0, 0.5])
        sh, sl, _, _ = state.sample(5)
        assert list(zip(sh.tolist(), sl.tolist(), strict=True)) == expect


def test_config_round_trip_and_validation():
    for sel in (Uniform(), Prioritized(0.6, 2.0), Fifo(), Lifo(), MinHeap(), MaxHeap(initial_priority=0.5)):
        assert selector_from_config(sel.to_config()) == sel
    with pytest.raises(ValueError, match="exponent"):
        Prioritized(exponent=-1)
    with pytest.raises(ValueError, match="initial_priority"):
        Prioritized(initial_priority=float("nan"))
    with pytest.raises(ValueError, match="unknown selector"):
        selector_from_config({"kind": "nope"})
    with pytest.raises(ValueError, match="max_times_sampled"):
        SelectorState(Uniform(), 1, 4, max_times_sampled=-1)


# ------------------------------------------------------------------------------ tree properties

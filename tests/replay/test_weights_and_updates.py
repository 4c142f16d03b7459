"""Importance weights computed with the draw, and `update_priorities` on one shard and on several.

`replay.draw_kernels.importance_weights_into` is the one implementation of PER's weights: the fused
transition kernel runs it while it draws, and `replay.batch.importance_weights` (the general loop, the
Ray store) calls it. These tests hold it to numpy's formula ``(N P) ** -beta / max`` (float64, then
float32) under hypothesis, hold a fused batch's weights to `importance_weights` of its own
probabilities bit for bit, and hold the priority updates of the one-shard and the several-shard locking
to a per-key reference (stale keys untouched, later duplicates win, bad input changes nothing).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import Prioritized, ReplayStore, TrajectorySpec
from replay.batch import importance_weights
from replay.draw_kernels import importance_weights_into
from replay.keys import decode_keys

SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((2,), "float32")})


def reference(prob: np.ndarray, n: int, beta: float) -> np.ndarray:
    """Schaul et al.'s weights as numpy computes them (float64, normalised, then float32)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        w = (max(n, 1) * prob) ** (-beta)
        return (w / w.max()).astype(np.float32)


def fill(store: ReplayStore, lengths: list[int], start: int = 0) -> int:
    w = store.writer(chunk_steps=7)
    pos = start
    for n in lengths:
        p = np.arange(pos, pos + n, dtype=np.int64)
        w.extend({"pos": p, "obs": np.stack([p, -p], axis=1).astype(np.float32)})
        w.end_episode()
        pos += n
    w.close()
    return pos


@settings(max_examples=150, deadline=None)
@given(
    prob=st.lists(st.floats(1e-12, 1.0, allow_nan=False), min_size=1, max_size=300),
    n=st.integers(0, 10**7),
    beta=st.floats(0.0, 3.0, allow_nan=False),
)
def test_kernel_weights_are_numpys_formula(prob, n, beta):
    p = np.array(prob)
    got = np.empty(p.size, dtype=np.float32)
    importance_weights_into(p, n, beta, got)
    want = reference(p, n, beta)
    np.testing.assert_allclose(got, want, rtol=2.5e-7, atol=0)  # at most one float32 rounding apart
    assert got.max() == 1.0 and got[int(np.argmin(p))] == 1.0  # the least likely row weighs 1
    np.testing.assert_array_equal(importance_weights(p, n, beta).numpy(), got)  # the public wrapper


def test_kernel_weights_follow_ieee_like_numpy_wherever_the_nan_or_zero_sits():
    for prob, beta in [
        ([0.5, 0.0, 0.25], 0.4),  # P = 0: weight inf, so NaN for it and 0 for every finite one
        ([0.5, np.nan, 0.25], 0.4),  # one NaN: every weight NaN
        ([0.25, 0.5, np.nan], 1.0),
        ([0.0, np.nan, 0.25], 0.0),  # beta 0: ones, NaN and 0 included
        ([np.inf, 0.5], 0.7),  # P = inf: weight 0
    ]:
        p = np.array(prob)
        got = np.empty(p.size, dtype=np.float32)
        importance_weights_into(p, 4, beta, got)
        np.testing.assert_array_equal(got, reference(p, 4, beta))


def test_importance_weights_takes_any_float_layout():
    p = np.linspace(0.1, 0.9, 12).reshape(3, 4).T  # not contiguous
    np.testing.assert_array_equal(
        importance_weights(p, 5, 0.6).numpy(), reference(np.ascontiguousarray(p).reshape(-1), 5, 0.6)
    )
    assert importance_weights(p.astype(np.float32), 5, 0.6).dtype == importance_weights(p, 5, 0.6).dtype


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_fused_batch_weights_are_importance_weights_of_its_probabilities(mm, shards, beta):
    store = ReplayStore(SPEC, 90, shards, selector=Prioritized(0.6), memory=mm, seed=3, timeout=5.0)
    fill(store, [13, 29, 7, 40, 21, 33])
    rng = np.random.default_rng(0)
    for _ in range(5):
        b = store.sample(48, beta=beta)
        assert b.table_size == len(store)
        want = importance_weights(b.probabilities.numpy(), b.table_size, beta).numpy()
        np.testing.assert_array_equal(b.weights.numpy(), want)
        np.testing.assert_allclose(
            b.weights.numpy(), reference(b.probabilities.numpy(), b.table_size, beta), rtol=2.5e-7, atol=0
        )
        assert b.weights is b.weights
        store.update_priorities(b.keys, rng.uniform(0.0, 5.0, 48))
        b.release()
    store.close()


@pytest.mark.parametrize("shards", [1, 2])
def test_updates_apply_to_live_keys_only_and_later_duplicates_win(mm, shards):
    store = ReplayStore(SPEC, 60, shards, selector=Prioritized(0.7), memory=mm, seed=5, timeout=5.0)
    pos = fill(store, [10, 25, 17, 30])
    rng = np.random.default_rng(1)
    old = store.sample(40).keys.clone()  # some of these go stale below
    pos = fill(store, [19, 23], start=pos)  # the rings wrap: the oldest steps are overwritten
    fresh = store.sample(40).keys
    keys = np.concatenate([old.numpy(), fresh.numpy(), fresh.numpy()[:10]])  # duplicates: last wins
    p = rng.uniform(0.0, 4.0, keys.size)
    state = store.table.state
    before = state.priority.copy()
    shard, anchor, _ = decode_keys(keys)
    floors = [sh.floor for sh in store.storage.shards]
    cap = store.storage.capacity
    want = before.copy()
    live = np.array([anchor[i] >= floors[shard[i]] for i in range(keys.size)])
    assert 0 < live.sum() < keys.size  # some stale, some live
    for i in np.flatnonzero(live):
        want[shard[i], anchor[i] % cap] = p[i]
    assert store.update_priorities(keys, p) == int(live.sum())
    np.testing.assert_array_equal(state.priority, want)
    # the weight tree is the leaves ** exponent and their sums
    leaves = np.where(state.state == 1, state.priority**0.7, 0.0)
    np.testing.assert_allclose(state.wtree[:, 1], leaves.sum(axis=1), rtol=1e-12)
    store.close()


def test_bad_updates_raise_naming_the_value_and_change_nothing(mm):
    store = ReplayStore(SPEC, 50, 1, selector=Prioritized(0.6), memory=mm, seed=2, timeout=5.0)
    fill(store, [20, 30])
    keys = store.sample(8).keys
    state = store.table.state
    before = (state.priority.copy(), state.wtree.copy())
    for p, match in [
        ([1.0] * 7 + [np.nan], "nan"),
        ([1.0, -2.0] + [1.0] * 6, "-2"),
        ([1.0] * 7, "7"),
    ]:
        with pytest.raises(ValueError, match=match):
            store.update_priorities(keys, np.array(p))
    bad = keys.numpy().copy()
    bad[3] |= 5  # names shard 5 of a one-shard store
    with pytest.raises(ValueError, match="shard 5"):
        store.update_priorities(bad, np.ones(8))
    np.testing.assert_array_equal(state.priority, before[0])
    np.testing.assert_array_equal(state.wtree, before[1])
    store.close()

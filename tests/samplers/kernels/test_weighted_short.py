"""Weighted short rows (`samplers.kernels.weighted_short`): the CPU's whole-vector pass equals the plain
loop bit for bit, two rows run together (`short_pair`) equal each run alone and the reference, and the
chosen subsets follow successive sampling (exact enumeration, chi-square)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from samplers.kernels import cpu, weighted_short
from samplers.kernels import reference as ref
from samplers.kernels.cpu.short_sums import count_le, count_le64, subtract_count
from samplers.kernels.cpu.weighted import SHORT_SCRATCH, short_pair, short_row


def rounding_sums(rng: np.random.Generator, d: int) -> np.ndarray:
    """Running sums of float32 weights of mixed scales (heavy, tiny, zero), as a short row's."""
    w = rng.random(d).astype(np.float32) * rng.choice([1.0, 1e6, 1e-30, 0.0], d, p=[0.7, 0.1, 0.1, 0.1])
    return np.cumsum(w.astype(np.float64))


@pytest.mark.parametrize("d", [1, 7, 8, 9, 16, 17, 31, 32, 33, 63, 64])
def test_cpu_pass_equals_the_plain_loop(d):
    rng = np.random.default_rng(d)
    for trial in range(40):
        acc = np.full(64, np.nan)
        acc[:d] = rounding_sums(rng, d)
        p = int(rng.integers(0, d + 1))
        wp = float(acc[p] - acc[p - 1]) if 0 < p < d else float(rng.choice([0.0, 1e6, 0.5]))
        # x on an entry (after subtraction), between entries, and past the last
        on_entry = acc[rng.integers(0, d)] - (wp if trial % 2 else 0.0)
        x = [on_entry, rng.random() * acc[d - 1], 1e300][trial % 3]
        want = acc.copy()
        want_count = weighted_short.subtract_count(want, d, p, wp, x)  # plain Python: the GPU's loop
        got = acc.copy()
        assert subtract_count(got, d, p, wp, x) == want_count
        assert np.array_equal(got[:d].view(np.int64), want[:d].view(np.int64))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 17, 31, 32, 33, 63, 64])
def test_whole_vector_count_equals_the_count(n):
    # count_le (rejection's search) reads the 8/16/32/64 entries from lo and counts only the first n
    rng = np.random.default_rng(100 + n)
    for trial in range(40):
        lo = int(rng.integers(0, 9))
        arr = np.full(lo + 64, [np.nan, -1.0][trial % 2])  # past n: left out whatever they hold
        arr[lo:lo + n] = rounding_sums(rng, n)
        x = [arr[lo + rng.integers(0, n)], rng.random() * arr[lo + n - 1], 1e300, -0.5][trial % 4]
        assert count_le(arr, lo, n, x) == int((arr[lo:lo + n] <= x).sum())
        if n == 64:
            assert count_le64(arr, lo, x) == int((arr[lo:lo + n] <= x).sum())


def short_layer(rng: np.random.Generator, rows: int, k: int):
    """A CSC of short rows for fanout k (2 to 64 edges, k < eligible < SHORT_SHARE * k), float32 weights of
    mixed scales (heavy ones make the running sums be summed afresh) and sorted excluded positions."""
    degs, weights, excluded, start = [], [], [], 0
    while len(degs) < rows:
        d = int(rng.integers(k + 1, 65))
        w = rng.random(d).astype(np.float32) * rng.choice(np.array([1.0, 1e6, 1e-30, 0.0], np.float32), d,
                                                          p=[0.8, 0.05, 0.05, 0.1])
        ex = np.sort(rng.choice(d, int(rng.integers(0, d // 4 + 1)), replace=False))
        d_e = int((w > 0).sum()) - int((w[ex] > 0).sum())
        if k < d_e < ref.SHORT_SHARE * k:
            degs.append(d)
            weights.append(w)
            excluded.append(ex + start)
            start += d
    indptr = np.concatenate([[0], np.cumsum(degs)]).astype(np.int64)
    return indptr, np.concatenate(weights), np.concatenate(excluded).astype(np.int64)


@pytest.mark.parametrize("k", [2, 5, 15, 40])
def test_short_row_and_short_pair_equal_the_reference(k):
    rng = np.random.default_rng(k)
    rows = 60
    indptr, weights, excl = short_layer(rng, rows, k)
    key = ref.layer_key(3, k, 0)
    want_ptr, _, want = ref.sample_layer(indptr, np.zeros(weights.size, np.int64), None, np.arange(rows), k,
                                         False, key, excl, weights)
    assert np.array_equal(want_ptr, np.arange(rows + 1) * k)
    bounds = np.searchsorted(excl, indptr)  # row r's excluded positions: excl[bounds[r]:bounds[r + 1]]
    states = [np.uint64(ref.mix(key ^ ((r * ref.GOLDEN) & ref.MASK64))) for r in range(rows)]
    prefix, _ = cpu.weight_prefix(indptr, weights)
    acc, acc2 = np.zeros(SHORT_SCRATCH), np.zeros(SHORT_SCRATCH)
    single = np.zeros(rows * k, dtype=np.int64)
    paired = np.zeros(rows * k, dtype=np.int64)
    for r in range(rows):
        short_row(weights, prefix, excl, bounds[r], bounds[r + 1], indptr[r], indptr[r + 1], states[r], k,
                  acc, single, r * k)
    for r in range(0, rows, 2):  # rows side by side
        short_pair(weights, prefix, excl, bounds[r], bounds[r + 1], indptr[r], indptr[r + 1], states[r], k,
                   acc, paired, r * k, bounds[r + 1], bounds[r + 2], indptr[r + 1], indptr[r + 2],
                   states[r + 1], k, acc2, (r + 1) * k)
    assert np.array_equal(single, want)
    assert np.array_equal(paired, want)


def successive_subsets(w: np.ndarray, k: int) -> dict[tuple, float]:
    """Exact probability of each k-subset (sorted indices) under successive sampling by weights w."""
    probs: dict[tuple, float] = {}
    for order in itertools.permutations(range(w.size), k):
        p, left = 1.0, w.sum()
        for i in order:
            p *= w[i] / left
            left -= w[i]
        probs[tuple(sorted(order))] = probs.get(tuple(sorted(order)), 0.0) + p
    return probs


def test_short_rows_choose_subsets_with_successive_sampling_probabilities():
    # 30 000 identical rows of 6 edges (weights 1..5 and one 0), k = 3: short (3k > 5 eligible); every row
    # draws its own stream. Each of the 10 subsets of the 5 positive edges against its exact probability.
    wts = np.array([1.0, 0.0, 2.0, 3.0, 4.0, 5.0], dtype=np.float32)
    rows, k = 30_000, 3
    indptr = np.arange(rows + 1, dtype=np.int64) * wts.size
    indices = np.zeros(rows * wts.size, dtype=np.int64)
    w = np.tile(wts, rows)
    _, _, eids = cpu.sample_layer(indptr, indices, None, np.arange(rows, dtype=np.int64), k, False,
                                  ref.layer_key(11, 0, 0), None, 1, w)
    chosen = [tuple(r) for r in (eids.reshape(rows, k) % wts.size).tolist()]
    pos = np.flatnonzero(wts > 0)
    probs = {tuple(pos[list(s)]): p for s, p in successive_subsets(wts[pos].astype(np.float64), k).items()}
    assert set(chosen) <= set(probs)
    observed = [chosen.count(s) for s in probs]
    assert chisquare(observed, [p * rows for p in probs.values()]).pvalue > 1e-4


def test_short_pair_of_rows_with_different_counts_equals_each_row_alone():
    rng = np.random.default_rng(5)
    rows, k = 40, 12
    indptr, weights, excl = short_layer(rng, rows, k)
    bounds = np.searchsorted(excl, indptr)
    prefix, _ = cpu.weight_prefix(indptr, weights)
    acc, acc2 = np.zeros(SHORT_SCRATCH), np.zeros(SHORT_SCRATCH)
    for r in range(0, rows, 2):
        c, c2 = (k, int(rng.integers(1, k))) if r % 4 else (int(rng.integers(1, k)), k)
        args = [(bounds[q], bounds[q + 1], indptr[q], indptr[q + 1], np.uint64(rng.integers(0, 2**63)), n)
                for q, n in ((r, c), (r + 1, c2))]
        alone = np.zeros(c + c2, dtype=np.int64)
        short_row(weights, prefix, excl, *args[0], acc, alone, 0)
        short_row(weights, prefix, excl, *args[1], acc, alone, c)
        paired = np.zeros(c + c2, dtype=np.int64)
        short_pair(weights, prefix, excl, *args[0], acc, paired, 0, *args[1], acc2, c)
        assert np.array_equal(paired, alone)


def test_compile_for_replaces_only_the_row_start_and_the_chosen_weight():
    with pytest.raises(ValueError, match=r"not \['step'\]"):
        weighted_short.compile_for(lambda fn: fn, None, None, None, {"step": weighted_short.step})


def test_is_short_is_the_reference_rule_on_every_target():
    # the one selection test, plain and compiled for the CPU, against the reference's rule written out
    import numba as nb

    from samplers.kernels.cpu import rng as cpu_rng
    from samplers.kernels.cpu.bits import trailing_zeros

    compiled = weighted_short.compile_for(nb.njit, cpu_rng, trailing_zeros, subtract_count).is_short
    cases = list(itertools.product([False, True], [0, 5], [1, 63, 64, 65, 200], range(1, 30), range(0, 70)))
    for replace, s, d, c, eligible in cases:
        want = not replace and d <= ref.SHORT_ROW_MAX and ref.SHORT_SHARE * c > eligible
        assert weighted_short.is_short(replace, s, s + d, c, eligible) is want
        assert compiled(replace, s, s + d, c, eligible) is want
    assert weighted_short.is_short(False, 0, 64, 3, 8) and not weighted_short.is_short(False, 0, 64, 3, 9)
    assert not weighted_short.is_short(False, 0, 65, 30, 8)  # past SHORT_ROW_MAX

"""Numba kernels of the selectors: sum trees and argmin trees over S shards of C slots.

A tree over C leaves is an array ``[2 P]`` with P = `tree_size` (C rounded up to a power of two);
node j has children 2j and 2j+1, leaf i sits at P + i, the root at 1. A *sum tree* (float64) holds
at each node the sum of its leaves: `sum_set` / `sum_build` write it, `sum_find` and `draw_rows`
walk it down (O(log C) a draw). An *argmin tree* (int64) holds at each node the leaf of smallest key
(ties: the smaller commit sequence number), -1 for none: `min_set` / `min_build_keys` write it.
`accept_sum` and `take_best` apply ``max_times_sampled`` while drawing. `replay.selector_state` owns
the arrays and calls these (arrays in, arrays out).

References
----------
Schaul et al., "Prioritized Experience Replay", ICLR 2016 (sum-tree sampling).
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = [
    "accept_sum",
    "better",
    "draw_rows",
    "min_build_keys",
    "min_set",
    "sum_build",
    "sum_find",
    "sum_set",
    "take_best",
    "tree_size",
]


def tree_size(capacity: int) -> int:
    return 1 << max(0, (capacity - 1).bit_length())


@nb.njit(cache=True, nogil=True)
def sum_set(tree, size, leaves, values):  # pragma: no cover - numba
    """Set leaves ``leaves`` of a sum tree to ``values`` and recompute their ancestors (exact sums)."""
    for i in range(leaves.shape[0]):
        j = leaves[i] + size
        tree[j] = values[i]
        j >>= 1
        while j >= 1:
            tree[j] = tree[2 * j] + tree[2 * j + 1]
            j >>= 1


@nb.njit(cache=True, nogil=True)
def sum_build(tree, size):  # pragma: no cover - numba
    for j in range(size - 1, 0, -1):
        tree[j] = tree[2 * j] + tree[2 * j + 1]


@nb.njit(cache=True, nogil=True)
def sum_find(tree, size, u, out):  # pragma: no cover - numba
    """For each ``u[i]`` in [0, root): the leaf whose prefix-sum interval holds it (never a zero leaf)."""
    for i in range(u.shape[0]):
        x = u[i]
        j = 1
        while j < size:
            left = tree[2 * j]
            right = tree[2 * j + 1]
            if right <= 0.0 or x < left:
                j = 2 * j
            else:
                x -= left
                j = 2 * j + 1
        out[i] = j - size


@nb.njit(cache=True, nogil=True)
def draw_rows(tree, size, u, out_shard, out_slot, out_prob, times, count):  # pragma: no cover - numba
    """Draw one item per ``u[i]`` in [0, total) from S sum trees ``tree [S, 2 size]`` as one table.

    The row's shard is the one whose mass interval holds ``u[i]`` (shards in order), its item the
    leaf of that shard's tree holding the rest; ``out_prob`` is the item's weight over the total. With
    ``count``, the draws are added to ``times``. Rounding never picks a shard or leaf of zero mass.
    """
    num_shards = tree.shape[0]
    total = 0.0
    last = 0
    for s in range(num_shards):
        total += tree[s, 1]
        if tree[s, 1] > 0.0:
            last = s
    for i in range(u.shape[0]):
        x = u[i]
        s = 0
        while s < last and (tree[s, 1] <= 0.0 or x >= tree[s, 1]):
            x -= tree[s, 1]
            s += 1
        if x >= tree[s, 1]:
            x = tree[s, 1] * 0.999999999999
        if x < 0.0:
            x = 0.0
        j = 1
        while j < size:
            left = tree[s, 2 * j]
            right = tree[s, 2 * j + 1]
            if right <= 0.0 or x < left:
                j = 2 * j
            else:
                x -= left
                j = 2 * j + 1
        c = j - size
        out_shard[i] = s
        out_slot[i] = c
        out_prob[i] = tree[s, j] / total
        if count:
            times[s, c] += 1


@nb.njit(cache=True, nogil=True, inline="always")
def better(a, b, key, seq):  # pragma: no cover - numba
    if a < 0:
        return b
    if b < 0:
        return a
    ka = key[a]
    kb = key[b]
    if ka < kb:
        return a
    if kb < ka:
        return b
    return a if seq[a] <= seq[b] else b


@nb.njit(cache=True, nogil=True)
def min_set(tree, size, leaves, key, seq):  # pragma: no cover - numba
    """Recompute the argmin tree above ``leaves`` after their keys changed (tree holds leaf indices)."""
    for i in range(leaves.shape[0]):
        j = (leaves[i] + size) >> 1
        while j >= 1:
            tree[j] = better(tree[2 * j], tree[2 * j + 1], key, seq)
            j >>= 1


@nb.njit(cache=True, nogil=True)
def min_build_keys(tree, size, capacity, key, seq):  # pragma: no cover - numba
    for i in range(size):
        tree[size + i] = i if i < capacity else -1
    for j in range(size - 1, 0, -1):
        tree[j] = better(tree[2 * j], tree[2 * j + 1], key, seq)


@nb.njit(cache=True, nogil=True)
def accept_sum(
    shard, slot, times, state, ctree, wtree, weights, size, limit, use_w, prob, accepted
):  # pragma: no cover - numba
    """Accept drawn rows in order while their item is live; remove items reaching ``limit`` draws.

    Rows whose item was removed earlier in the pass are rejected (to be redrawn). ``prob`` gets each
    accepted row's probability under the distribution current at its turn. Returns items removed.
    """
    removed = 0
    zero = np.zeros(1)
    leaf = np.zeros(1, dtype=np.int64)
    num_shards = ctree.shape[0]
    total_w = 0.0
    total_c = 0.0
    for t in range(num_shards):
        total_c += ctree[t, 1]
        if use_w:
            total_w += wtree[t, 1]
    for i in range(shard.shape[0]):
        s = shard[i]
        c = slot[i]
        if state[s, c] != 1:
            accepted[i] = False
            continue
        accepted[i] = True
        prob[i] = weights[s, c] / total_w if use_w else 1.0 / total_c
        times[s, c] += 1
        if limit > 0 and times[s, c] >= limit:
            state[s, c] = 2
            removed += 1
            leaf[0] = c
            sum_set(ctree[s], size, leaf, zero)
            if wtree.shape[1] > 1:
                sum_set(wtree[s], size, leaf, zero)
            total_c = 0.0
            total_w = 0.0
            for t in range(num_shards):
                total_c += ctree[t, 1]
                if use_w:
                    total_w += wtree[t, 1]
            if (use_w and total_w <= 0.0) or total_c < 0.5:
                for j in range(i + 1, shard.shape[0]):
                    accepted[j] = False
                break
    return removed


@nb.njit(cache=True, nogil=True)
def take_best(n, key, seq, state, times, mtree, ctree, size, limit, out_shard, out_slot):  # pragma: no cover
    """Deterministic selectors: ``n`` draws of the best live item across shards, removing exhausted ones."""
    num_shards = key.shape[0]
    removed = 0
    zero = np.zeros(1)
    leaf = np.zeros(1, dtype=np.int64)
    got = 0
    for i in range(n):
        best_s = -1
        best_c = -1
        for s in range(num_shards):
            c = mtree[s, 1]
            if c < 0 or state[s, c] != 1:
                continue
            if best_s < 0:
                best_s = s
                best_c = c
            else:
                kb = key[best_s, best_c]
                kc = key[s, c]
                if kc < kb or (kc == kb and seq[s, c] < seq[best_s, best_c]):
                    best_s = s
                    best_c = c
        if best_s < 0:
            break
        out_shard[i] = best_s
        out_slot[i] = best_c
        got += 1
        times[best_s, best_c] += 1
        if limit > 0 and times[best_s, best_c] >= limit:
            state[best_s, best_c] = 2
            removed += 1
            key[best_s, best_c] = np.inf
            leaf[0] = best_c
            min_set(mtree[best_s], size, leaf, key[best_s], seq[best_s])
            sum_set(ctree[best_s], size, leaf, zero)
    return got, removed

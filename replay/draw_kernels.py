"""Numba kernels of a store's draw: anchors from the sum trees, their windows, priority writes.

`draw_anchors` draws the anchors of one batch as from one table over S shards, from uniforms
``u`` in [0, 1): the shard of each row in proportion to its root mass, then the leaf. The descent
runs level by level over all rows at once (each level's loads are independent, so the CPU overlaps
their cache misses instead of waiting for one row's chain of 18; each row's next pair of children is
prefetched as the row steps down), and is skipped for a *dense*
count tree (every slot that holds a position is live: the leaf is ``floor(x)`` exactly, the
descent's own answer). `window_rows` turns (shard, slot) into the window table from each shard's step
and record index, each window's bounds from `replay.windows.window_of` (the one rule). `set_weights` writes
priorities and the weight tree's leaves and recomputes the touched ancestors level by level (`sum_levels`);
`write_updates` is the generation check of priority updates (`accept_updates`) and those writes in one
pass without allocating (`replay.update_kernel` calls it; `apply_updates` with its own scratch).
`importance_weights_into` is PER's importance-weight formula, the one implementation every path uses.
`replay.table.Table` calls them with every shard lock held; they take arrays and return nothing
(outputs are filled in place).

>>> draw_anchors(u, tree, size, filled, times, 1, shard, slot, prob)
>>> window_rows(shard, slot, steps, records, written, capacity, 64, 0, row0, *meta_arrays, 0, keys)

References
----------
Schaul et al., "Prioritized Experience Replay", ICLR 2016 (sum-tree sampling); TorchRL's
``SliceSampler`` (windows within trajectories).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels.prefetch import prefetch
from replay.keys import (
    INC_MASK,
    SHARD_BITS,
    SHARD_MASK,
    key_anchor,
    key_back,
    key_incarnation,
    key_shard,
    pack_key,
)
from replay.windows import window_of

__all__ = [
    "accept_updates",
    "apply_updates",
    "draw_anchors",
    "draw_items",
    "draw_windows",
    "importance_weights_into",
    "key_current",
    "leaf_weights",
    "set_weights",
    "sum_levels",
    "updates_valid",
    "window_rows",
    "write_updates",
]

@nb.njit(cache=True, nogil=True)
def draw_anchors(u, tree, size, filled, times, count, out_shard, out_slot, out_prob):  # pragma: no cover
    """One item per ``u[i]`` in [0, 1) from S sum trees ``tree [S, 2 size]`` as one table.

    Same rows as `replay.sumtree.draw_rows` on ``u * total`` (shards in order, then the leaf whose
    prefix interval holds the rest; never a shard or leaf of zero mass). ``filled`` (int64 [S], or
    empty for a weight tree): the slots of each shard that hold a position; a count tree whose root
    equals it in every shard is *dense* (leaves ``0 .. root - 1`` all live) and its leaf is the
    integer part of the rest, without the descent. With ``count``, the draws are added to
    ``times [S, C]``.
    """
    num_shards = tree.shape[0]
    k = u.shape[0]
    total = 0.0
    last = 0
    dense = filled.shape[0] == num_shards
    for s in range(num_shards):
        total += tree[s, 1]
        if tree[s, 1] > 0.0:
            last = s
        if dense and tree[s, 1] != filled[s]:
            dense = False
    xs = np.empty(k)
    js = np.empty(k, dtype=np.int64)
    for i in range(k):
        x = u[i] * total
        s = 0
        while s < last and (tree[s, 1] <= 0.0 or x >= tree[s, 1]):
            x -= tree[s, 1]
            s += 1
        if x >= tree[s, 1]:
            x = tree[s, 1] * 0.999999999999
        if x < 0.0:
            x = 0.0
        out_shard[i] = s
        xs[i] = x
        js[i] = 1
    if dense:
        for i in range(k):
            js[i] = size + np.int64(xs[i])
    else:
        flat = tree.reshape(-1)  # shard s's node j at s * row + j
        row = tree.shape[1] if num_shards > 1 else 0
        width = 1
        while width < size:  # one level for every row, then the next; selects, not branches
            ahead = 2 * width < size
            for i in range(k):
                b = out_shard[i] * row
                j = js[i]
                x = xs[i]
                left = flat[b + 2 * j]
                right = (x >= left) & (flat[b + 2 * j + 1] > 0.0)
                j = 2 * j + np.int64(right)
                js[i] = j
                xs[i] = x - (left if right else 0.0)
                if ahead:  # the row's next pair of children, asked for a level ahead of its read
                    prefetch(flat, b + 2 * j)
            width *= 2
    for i in range(k):
        s = out_shard[i]
        c = js[i] - size
        out_slot[i] = c
        out_prob[i] = (1.0 if dense else tree[s, js[i]]) / total  # a dense tree's live leaves are 1
        if count:
            times[s, c] += 1


@nb.njit(cache=True, nogil=True)
def draw_items(
    u, ctree, wtree, prioritized, size, filled, times, count, out_shard, out_slot, out_prob
):  # pragma: no cover - numba
    """`draw_anchors` from the weight tree when ``prioritized`` and its mass is positive, else from
    the count tree (``filled`` as there). Returns the live items (the count trees' total); below 0.5
    nothing is drawn."""
    live = 0.0
    mass = 0.0
    for s in range(ctree.shape[0]):
        live += ctree[s, 1]
        if prioritized:
            mass += wtree[s, 1]
    if live < 0.5:
        return live
    if prioritized and mass > 0.0:
        draw_anchors(u, wtree, size, filled[:0], times, count, out_shard, out_slot, out_prob)
    else:
        draw_anchors(u, ctree, size, filled, times, count, out_shard, out_slot, out_prob)
    return live


@nb.njit(cache=True, nogil=True)
def window_rows(
    shard, slot, steps, records, written, capacity, length, pad, row0,
    o_shard, o_anchor, o_first, o_n, o_dst, incarnation, o_keys,
):  # pragma: no cover - numba
    """Windows of the anchors in ``slot`` of ``shard`` into rows ``row0 ...`` of the ``o_*`` arrays.

    ``steps[s]`` / ``records[s]``: shard s's step index ``[C, 3]`` and record ring ``[C, 4]`` (a
    tuple or a typed list); ``written[s]``: its write position at the draw. The outputs (int64 [B])
    are the fields of `replay.table.META_FIELDS`, each window's bounds `replay.windows.window_of`'s;
    ``pad`` 0 tail, 1 head (`replay.windows.PAD_CODES`). ``o_keys`` (int64 [B], or empty for none)
    gets each window's key (`replay.keys.encode_keys` with ``incarnation``). Returns the real steps
    of the rows written.
    """
    steps_total = 0
    with_keys = o_keys.shape[0] > 0
    k = shard.shape[0]
    rec = np.empty(k, dtype=np.int64)
    for i in range(k):  # one pass of independent loads, then the next (their misses overlap)
        rec[i] = steps[shard[i]][slot[i], 0] % capacity
    for i in range(k):
        s = shard[i]
        c = slot[i]
        wp = written[s]
        anchor = c + capacity * ((wp - 1 - c) // capacity)
        r = records[s]
        start = r[rec[i], 1]
        end = start + r[rec[i], 2]
        row = row0 + i
        first, n, dst = window_of(anchor, start, end, max(0, wp - capacity), length, pad)
        o_shard[row] = s
        o_anchor[row] = anchor
        o_first[row] = first
        o_n[row] = n
        o_dst[row] = dst
        steps_total += n
        if with_keys:
            o_keys[row] = pack_key(anchor, anchor - first, incarnation, s)
    return steps_total


@nb.njit(cache=True, nogil=True)
def draw_windows(
    u, ctree, wtree, prioritized, size, filled, times, steps, records, written, capacity, length, pad, row0,
    o_shard, o_anchor, o_first, o_n, o_dst, o_prob, incarnation, o_keys,
):  # pragma: no cover - numba
    """`draw_items` then `window_rows` in one call, rows ``row0 .. row0 + len(u) - 1`` of the outputs
    (``o_prob`` float64 [B] too). Returns the live items; below 0.5 nothing is drawn."""
    k = u.shape[0]
    shard = np.empty(k, dtype=np.int64)
    slot = np.empty(k, dtype=np.int64)
    prob = np.empty(k)
    live = draw_items(u, ctree, wtree, prioritized, size, filled, times, True, shard, slot, prob)
    if live < 0.5:
        return live
    for i in range(k):
        o_prob[row0 + i] = prob[i]
    window_rows(
        shard, slot, steps, records, written, capacity, length, pad, row0,
        o_shard, o_anchor, o_first, o_n, o_dst, incarnation, o_keys,
    )
    return live


@nb.njit(cache=True, nogil=True)
def importance_weights_into(prob, table_size, beta, out):  # pragma: no cover - numba
    """``out[i] = w[i] / max(w)`` with ``w = (max(N, 1) * prob) ** -beta`` (Schaul et al., 2016).

    ``prob`` float64 [k], ``table_size`` N (int), ``beta`` >= 0 (trusted), ``out`` float32 [k]: the
    quotient is taken in float64, then rounded to float32. IEEE arithmetic as numpy's vectorised
    formula: a probability of 0 (with ``beta > 0``) makes the maximum inf, so its weight is NaN and
    every finite one 0; any NaN weight makes every weight NaN; ``beta = 0`` gives ones.
    """
    k = prob.shape[0]
    scale = float(max(table_size, 1))
    w = np.empty(k)
    top = -np.inf
    nan = False
    for i in range(k):
        x = (scale * prob[i]) ** (-beta)
        w[i] = x
        if x > top:
            top = x
        elif x != x:
            nan = True
    if nan:
        top = np.nan
    for i in range(k):
        out[i] = np.float32(w[i] / top)


@nb.njit(cache=True, nogil=True)
def leaf_weights(priority, live, exponent, out):  # pragma: no cover - numba
    """``out[i] = priority[i] ** exponent`` where ``live[i]``, else 0: the weight-tree leaves, with the
    same ``**`` as `set_weights` (numpy's vectorised power can differ from it in the last bit)."""
    for i in range(priority.shape[0]):
        out[i] = priority[i] ** exponent if live[i] else 0.0


@nb.njit(cache=True, nogil=True)
def sum_levels(wtree, size, nodes, m):  # pragma: no cover - numba
    """Recompute the ancestors of the ``m`` leaves ``nodes[:m]`` of the sum trees ``wtree [S, 2 size]``,
    exact sums (as `replay.sumtree.sum_set`): from each leaf in turn, its ancestors up through the
    levels that have more nodes than rows; then every node of the levels above, in order. ``nodes``
    int64, each ``leaf node << SHARD_BITS | shard`` (the leaf node of slot c is ``size + c``), is not
    changed. An ancestor of several leaves is last recomputed by the last of their walks, when both its
    children are final (each changed leaf under it has walked up to it by then), so every node gets the
    sum of its final children, as a level-by-level pass gives it."""
    num_shards = wtree.shape[0]
    cols = wtree.shape[1]
    flat = wtree.reshape(num_shards * cols)  # row s, node j at s * cols + j (unsigned: no wraparound code)
    level = size >> 1  # the first node of the parents' level, and how many nodes it has
    depth = 0  # levels each leaf walks up
    while level >= 1 and num_shards * level > m:
        level >>= 1
        depth += 1
    one = np.uint64(1)
    bits = np.uint64(SHARD_BITS)
    low = np.uint64(SHARD_MASK)
    ucols = np.uint64(cols)
    leaves = nodes.view(np.uint64)
    if depth > 0:
        for i in range(m):  # the rows' own ancestors
            x = leaves[i]
            row = (x & low) * ucols
            j = x >> bits
            for _ in range(depth):
                j >>= one
                at = row + (j << one)
                flat[row + j] = flat[at] + flat[at + one]
    while level >= 1:  # levels of at most m nodes in all: every node, in order
        width = np.uint64(level)
        for s in range(num_shards):
            row = np.uint64(s) * ucols
            for j in range(row + width, row + width + width):
                at = j + j - row
                flat[j] = flat[at] + flat[at + one]
        level >>= 1


@nb.njit(cache=True, nogil=True)
def set_weights(shard, slot, p, exponent, state, priority, weights, wtree, size):  # pragma: no cover
    """``priority[s, c] = p`` for each row (later duplicates win), then the weight tree's leaves
    (``p ** exponent`` for live items, ``state == 1``; 0 for others) and their ancestors
    (`sum_levels`). Returns the largest priority written (-1.0 for none)."""
    k = shard.shape[0]
    top = -1.0
    for i in range(k):
        priority[shard[i], slot[i]] = p[i]
        if p[i] > top:
            top = p[i]
    nodes = np.empty(k, dtype=np.int64)
    for i in range(k):
        s = shard[i]
        c = slot[i]
        w = priority[s, c] ** exponent if state[s, c] == 1 else 0.0
        weights[s, c] = w
        wtree[s, size + c] = w
        nodes[i] = ((size + c) << SHARD_BITS) | s
    sum_levels(wtree, size, nodes, k)
    return top


@nb.njit(cache=True, nogil=True, inline="always")  # a call would count the arrays' references per key
def key_current(k, floors, ingested, incarnation, prev, restored, restored_at):  # pragma: no cover - numba
    """The generation rule of one key (int64; docs/architecture.md#keys) shared by `accept_updates`
    and `write_updates`: ``(shard, anchor, current)``, ``current`` when its window still has every
    step stored (``anchor - back >= floors[s]``, ``anchor < ingested[s]``) and its incarnation is
    ``incarnation`` or ``prev`` (the one before, only with ``restored`` and ``anchor <
    restored_at[s]``). The key's shard must be < S (``floors``, ``ingested`` int64 [S])."""
    s = key_shard(k)
    back = key_back(k)
    inc = key_incarnation(k)
    anchor = key_anchor(k)
    good = anchor - back >= floors[s] and anchor < ingested[s]
    if good:
        good = inc == incarnation or (restored and inc == prev and anchor < restored_at[s])
    return s, anchor, good


@nb.njit(cache=True, nogil=True)
def accept_updates(
    keys, capacity, floors, ingested, incarnation, restored_at, state, out_shard, out_slot, ok
):  # pragma: no cover - numba
    """The generation check of priority updates (docs/architecture.md#keys): ``ok[i]`` when key i's
    window still has every step stored (``anchor - back >= floors[s]``, ``anchor < ingested[s]``),
    its incarnation is ``incarnation`` (or the one before, below ``restored_at[s]``; ``restored_at``
    empty: no restore) and its item is live (``state == 1``). Fills the shard and slot of each key;
    every key's shard must be < S. Returns how many are ok."""
    count = 0
    prev = (incarnation - 1) & INC_MASK
    restored = restored_at.shape[0] > 0
    for i in range(keys.shape[0]):
        s, anchor, good = key_current(keys[i], floors, ingested, incarnation, prev, restored, restored_at)
        c = anchor % capacity
        out_shard[i] = s
        out_slot[i] = c
        if good:
            good = state[s, c] == 1
        ok[i] = good
        count += good
    return count


@nb.njit(cache=True, nogil=True)
def updates_valid(keys, p, num_shards, limit):  # pragma: no cover - numba
    """True when every key is >= 0 and names a shard < ``num_shards`` and every priority is finite,
    >= 0 and <= ``limit`` (``keys`` int64 [K], ``p`` float64 [K]; ``limit`` from
    `replay.selectors.priority_limit`); the caller's checks name the first bad one."""
    ok = True
    for i in range(keys.shape[0]):  # no branch per key: a vectorised loop
        k = keys[i]
        x = p[i]
        ok &= (k >= 0) & (key_shard(k) < num_shards) & (x >= 0.0) & (x < np.inf) & (x <= limit)
    return ok


@nb.njit(cache=True, nogil=True)
def write_updates(
    keys, p, capacity, floors, ingested, incarnation, restored_at, state, priority, weights, wtree, size,
    exponent, weighted, nodes,
):  # pragma: no cover - numba
    """`accept_updates` and, for the accepted keys, the writes of `set_weights` in one pass, without
    allocating: ``priority[s, c] = p[i]`` (float32 or float64 [K]; later duplicates win) and, with
    ``weighted``, the weight ``p[i] ** exponent`` into ``weights`` and the weight tree's leaf, then
    the leaves' ancestors (`sum_levels`; ``nodes`` int64 [>= K + S] is the scratch). The same state
    as `accept_updates` then `set_weights` of the accepted rows. Returns ``(applied, top)``."""
    if nodes.shape[0] < keys.shape[0] + ingested.shape[0]:
        raise ValueError("write_updates: nodes holds fewer than K + S words")
    applied = 0
    top = -1.0
    prev = (incarnation - 1) & INC_MASK
    restored = restored_at.shape[0] > 0
    base = nodes[keys.shape[0] : keys.shape[0] + ingested.shape[0]]  # each shard's ingested - ingested % C
    for s in range(ingested.shape[0]):
        base[s] = ingested[s] - ingested[s] % capacity
    for i in range(keys.shape[0]):
        s, anchor, good = key_current(keys[i], floors, ingested, incarnation, prev, restored, restored_at)
        if not good:
            continue
        c = anchor - base[s]  # anchor % capacity without a division: the ring's last lap or the one before
        if c < 0:
            c += capacity
            if c < 0:
                c = anchor % capacity
        if state[s, c] != 1:
            continue
        v = np.float64(p[i])
        priority[s, c] = v
        if v > top:
            top = v
        if weighted:
            w = v if exponent == 1.0 else v ** exponent  # pow(v, 1) is v exactly: the same weight
            weights[s, c] = w
            wtree[s, size + c] = w
            nodes[applied] = ((size + c) << SHARD_BITS) | s
        applied += 1
    if weighted and applied > 0:
        sum_levels(wtree, size, nodes, applied)
    return applied, top


@nb.njit(cache=True, nogil=True)
def apply_updates(
    keys, p, capacity, floors, ingested, incarnation, restored_at, state, priority, weights, wtree, size,
    exponent, weighted,
):  # pragma: no cover - numba
    """`accept_updates` then, for the accepted keys only, `set_weights` (``weighted``: the weight
    tree too; else the priorities alone), as `write_updates` with its own scratch. Returns
    ``(applied, top)``: how many keys were accepted and the largest priority written (-1.0 for
    none)."""
    nodes = np.empty(keys.shape[0] + ingested.shape[0], dtype=np.int64)
    return write_updates(
        keys, p, capacity, floors, ingested, incarnation, restored_at, state, priority, weights, wtree,
        size, exponent, weighted, nodes,
    )

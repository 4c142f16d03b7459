"""`replay.draw_kernels.sum_levels`: after leaves change, the touched ancestors it recomputes (each leaf
walking up the wide levels, then every node of the narrow ones) equal a full bottom-up rebuild bit for bit,
for one or several rows, repeated leaves, more leaves than a level has nodes, and none."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.draw_kernels import sum_levels
from replay.keys import SHARD_BITS
from replay.sumtree import sum_build, tree_size


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 5),
    capacity=st.sampled_from([1, 2, 3, 7, 64, 100, 1000]),
    m=st.integers(0, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_sum_levels_equals_a_full_rebuild(rows: int, capacity: int, m: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = tree_size(capacity)
    tree = np.zeros((rows, 2 * size))
    scale = 10.0 ** rng.uniform(-5, 5, (rows, capacity))  # sums that round
    tree[:, size : size + capacity] = rng.random((rows, capacity)) * scale
    for r in range(rows):
        sum_build(tree[r], size)
    slots = rng.integers(0, capacity, m)  # repeats when m > capacity, and by chance
    shards = rng.integers(0, rows, m)
    tree[shards, size + slots] = rng.random(m) * 10.0 ** rng.uniform(-5, 5, m)
    want = tree.copy()
    for r in range(rows):
        sum_build(want[r], size)
    nodes = np.full(m + 3, -1, dtype=np.int64)  # longer than m: the rest is not read
    nodes[:m] = ((size + slots) << SHARD_BITS) | shards
    given_nodes = nodes.copy()
    sum_levels(tree, size, nodes, m)
    assert tree.tobytes() == want.tobytes()
    np.testing.assert_array_equal(nodes, given_nodes)

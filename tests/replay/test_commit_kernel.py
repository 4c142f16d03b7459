"""`replay.commit_kernel.write_steps` (contiguous chunks) against the shard's numpy commit path (strided
chunks), through `ShardStorage.commit`, on runs that wrap and overwrite items, holes and removed items."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager
from replay.shard import ShardStorage
from replay.shard_layout import EXHAUSTED, RESERVE_POS, WRITE_POS
from replay.spec import TrajectorySpec

SPEC = TrajectorySpec({"obs": ((3,), "float32"), "a": ((), "int64"), "d": ((), "bool")})


@settings(max_examples=50, deadline=None)
@given(
    capacity=st.integers(1, 24),
    wp=st.integers(0, 80),
    count_frac=st.floats(0.01, 1.0),
    holes=st.lists(st.integers(0, 23), max_size=6),
    exhausted=st.lists(st.integers(0, 23), max_size=6),
    seed=st.integers(0, 9),
)
def test_write_steps_matches_the_numpy_path(capacity, wp, count_frac, holes, exhausted, seed):
    count = max(1, int(round(count_frac * capacity)))
    rng = np.random.default_rng(seed)
    data = {
        "obs": rng.standard_normal((count, 3)).astype(np.float32),
        "a": rng.integers(0, 1000, count),
        "d": rng.random(count) < 0.5,
    }
    with MemoryManager() as mm:
        shards = [ShardStorage.create(mm, i, SPEC, capacity, tier="host") for i in range(2)]
        for sh in shards:  # the same previous contents: stamps, holes, exhausted items
            sh.steps[:, 0] = np.arange(capacity) % 3
            sh.steps[:, 1] = np.arange(capacity) + 100
            sh.steps[:, 2] = 0
            sh.steps[[h % capacity for h in holes], 0] = -1
            sh.steps[[e % capacity for e in exhausted], 2] |= EXHAUSTED
            for ring in sh.columns.values():
                ring[...] = np.ones_like(ring)
        for sh in shards:
            sh.meta[WRITE_POS] = sh.meta[RESERVE_POS] = wp
        kernel, numpy_path = shards
        # ShardStorage.commit: contiguous sources take the kernel, strided ones the numpy copies
        strided = {n: np.repeat(v, 2, axis=0)[::2] for n, v in data.items()}
        got = kernel.commit(data, count, 500, None, True)
        want = numpy_path.commit(strided, count, 500, None, True)
        assert got == want
        np.testing.assert_array_equal(kernel.steps, numpy_path.steps)
        np.testing.assert_array_equal(kernel.records[0], numpy_path.records[0])
        for n in SPEC:
            np.testing.assert_array_equal(kernel.columns[n], numpy_path.columns[n])
        first = wp % capacity
        slots = (first + np.arange(count)) % capacity
        np.testing.assert_array_equal(kernel.columns["a"][slots], data["a"])  # the chunk, in order
        assert (kernel.steps[slots, 1] == 500 + np.arange(count)).all()
        assert (kernel.steps[slots, 0] == got[0]).all() and kernel.write_pos == wp + count
        not_items = {h % capacity for h in holes} | {e % capacity for e in exhausted}
        gone = [p % capacity for p in range(max(0, wp - capacity), max(0, wp + count - capacity))]
        assert got[1] == sum(c not in not_items for c in gone)  # overwritten items, by hand
        for sh in shards:
            sh.free()

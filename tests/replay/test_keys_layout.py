"""The key layout has one home (`replay.keys`): the compiled `pack_key` / `key_*` functions, which the
draw, copy and update kernels use, agree bit for bit with `encode_keys` / `decode_keys` /
`key_incarnations` on every part's extremes and on random keys."""

from __future__ import annotations

import numba as nb
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.keys import (
    MAX_INCARNATIONS,
    MAX_POSITION,
    MAX_SHARDS,
    MAX_WINDOW,
    decode_keys,
    encode_keys,
    key_anchor,
    key_back,
    key_incarnation,
    key_incarnations,
    key_shard,
    pack_key,
)


@nb.njit(cache=False)
def _packed(anchor, back, incarnation, shard):
    out = np.empty(anchor.shape[0], dtype=np.int64)
    for i in range(anchor.shape[0]):
        out[i] = pack_key(anchor[i], back[i], incarnation, shard[i])
    return out


@nb.njit(cache=False)
def _parts(keys):
    out = np.empty((4, keys.shape[0]), dtype=np.int64)
    for i in range(keys.shape[0]):
        k = keys[i]
        out[0, i], out[1, i] = key_shard(k), key_anchor(k)
        out[2, i], out[3, i] = key_back(k), key_incarnation(k)
    return out


def _check(anchor, back, shard, incarnation):
    a, b, s = (np.asarray(x, dtype=np.int64) for x in (anchor, back, shard))
    keys = encode_keys(s, a, b, incarnation)
    np.testing.assert_array_equal(_packed(a, b, incarnation, s), keys)
    parts = _parts(keys)
    for got, want in zip(parts[:3], decode_keys(keys), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(parts[3], key_incarnations(keys))
    np.testing.assert_array_equal(parts[:3], [s, a, b])  # the round trip gives the parts back
    np.testing.assert_array_equal(parts[3], incarnation % MAX_INCARNATIONS)


def test_the_compiled_layout_is_encode_keys_at_every_parts_extremes():
    top = [0, 1, MAX_POSITION - 1]
    for incarnation in (0, 1, MAX_INCARNATIONS - 1, MAX_INCARNATIONS, 37):
        grid = np.array(np.meshgrid(top, [0, 1, MAX_WINDOW - 1], [0, 1, MAX_SHARDS - 1])).reshape(3, -1)
        _check(grid[0], grid[1], grid[2], incarnation)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, MAX_POSITION - 1), st.integers(0, MAX_WINDOW - 1),
                       st.integers(0, MAX_SHARDS - 1)), min_size=1, max_size=20),
    st.integers(0, 1000),
)
def test_the_compiled_layout_round_trips_random_keys(rows, incarnation):
    a, b, s = zip(*rows, strict=True)
    _check(a, b, s, incarnation)

"""The owner's compiled sample path against the general loop, and the fused draw / copy kernels.

`WindowSampler` takes its compiled path for the owner's own `Table` and the general loop for any
other table object (a learner's proxy); both must give the same batches from the same draws.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import Prioritized, ReplayStore, TrajectorySpec, Uniform
from replay.batch_kernels import BatchCopy
from replay.draw_kernels import draw_anchors, set_weights
from replay.keys import decode_keys
from replay.rate_limiter import RateLimiterState
from replay.sampler import Deadline, WindowSampler
from replay.sumtree import draw_rows, sum_build, tree_size
from replay.windows import reference_gather

SPEC = TrajectorySpec({"pos": ((), "int64"), "ep": ((), "int32"), "obs": ((2, 3), "float32")})


class ProxyTable:
    """A table object that is not the owner's `Table` (as a learner process's proxy): the protocol only."""

    def __init__(self, table) -> None:
        self.inner = table

    def draw(self, k, length, pad, row0, meta, prob):
        return self.inner.draw(k, length, pad, row0, meta, prob)

    def keys(self, shard, anchor, first):
        return self.inner.keys(shard, anchor, first)

    @property
    def prioritized(self):
        return self.inner.prioritized

    @property
    def store_id(self):  # the issuer the batch's keys bear (issue 32)
        return self.inner.store_id

    @property
    def incarnation(self):
        return self.inner.incarnation

    @property
    def max_times_sampled(self):
        return self.inner.max_times_sampled

    def update_priorities(self, keys, priorities):
        return self.inner.update_priorities(keys, priorities)


def fill(store, lengths, wrap=0):
    """Episodes of the given lengths; ``pos`` counts every step ever appended, ``ep`` the episode."""
    w = store.writer(chunk_steps=7)
    pos = 0
    for rnd in range(1 + wrap):
        for e, n in enumerate(lengths):
            p = np.arange(pos, pos + n, dtype=np.int64)
            obs = (p[:, None, None] * 10 + np.arange(6).reshape(2, 3)).astype(np.float32)
            w.extend({"pos": p, "ep": np.full(n, rnd * 100 + e, np.int32), "obs": obs})
            w.end_episode()
            pos += n
    w.close()


def sampler_of(store, general: bool) -> WindowSampler:
    """A sampler over the store's parts: the owner's `Table` itself, or behind a `ProxyTable`."""
    control = store.storage.control
    limiter = RateLimiterState(store.rate_limiter, control.counters, control.cond)
    table = ProxyTable(store.table) if general else store.table
    return WindowSampler(store.storage, table, limiter, staging_slots=2)


@pytest.mark.parametrize("selector", [Uniform(), Prioritized(0.6)])
@pytest.mark.parametrize(
    "shards,pad,window", [(1, "tail", 1), (1, "head", 5), (3, "tail", 4), (3, "head", 1)]
)
def test_compiled_path_and_general_loop_give_the_same_batches(mm, selector, shards, pad, window):
    lengths = [5, 11, 3, 17, 8, 2, 13]
    a = ReplayStore(SPEC, 60, shards, selector=selector, memory=mm, seed=3, timeout=5.0)
    b = ReplayStore(SPEC, 60, shards, selector=selector, memory=mm, seed=3, timeout=5.0)
    for store in (a, b):
        fill(store, lengths, wrap=1)  # the rings wrapped: floors above 0, head windows clipped
        store.update_priorities(store.sample(16).keys, np.arange(1, 17) / 4.0)
    owner, general = sampler_of(a, general=False), sampler_of(b, general=True)
    assert owner.owner_table and not general.owner_table
    for _ in range(3):
        x = owner.sample(9, window, pad, 0.5, None, Deadline(5.0))
        y = general.sample(9, window, pad, 0.5, None, Deadline(5.0))
        for name in SPEC:
            np.testing.assert_array_equal(x[name].numpy(), y[name].numpy())
        for attr in ("mask", "keys", "probabilities", "weights", "lengths"):
            np.testing.assert_array_equal(getattr(x, attr).numpy(), getattr(y, attr).numpy())
        assert x.table_size == y.table_size
        # the windows are what the rings hold: consecutive positions of one episode, zeros elsewhere
        pos = x["pos"].numpy()
        shard, anchor, back = decode_keys(x.keys.numpy())
        for i in range(9):
            real = pos[i][x.mask[i].numpy()]
            assert real[0] + len(real) - 1 == real[-1] and len(real) == int(x.lengths[i])
            assert (pos[i][~x.mask[i].numpy()] == 0).all()
            assert len(set(x["ep"][i][x.mask[i]].tolist())) == 1
        x.release()
        y.release()
    owner.close()
    general.close()
    a.close()
    b.close()


def test_general_loop_redraws_windows_overwritten_during_the_copy(mm, monkeypatch):
    import replay.gather as gather_module

    store = ReplayStore(SPEC, 10, 1, memory=mm, seed=0, timeout=5.0)
    fill(store, [10])
    sampler = sampler_of(store, general=True)
    real = gather_module.gather_fields
    calls = []
    w = store.writer()

    def overwrite_then_gather(*args, **kwargs):
        if not calls:  # a writer overwrites the whole ring in the middle of the copy
            p = np.arange(100, 110, dtype=np.int64)
            w.extend({"pos": p, "ep": np.ones(10, np.int32), "obs": np.zeros((10, 2, 3), np.float32)})
            w.end_episode()
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gather_module, "gather_fields", overwrite_then_gather)
    b = sampler.sample(4, 3, "tail", 1.0, None, Deadline(5.0))
    assert len(calls) == 2
    assert (b["ep"][b.mask] == 1).all() and (b["pos"][b.mask] >= 100).all()
    b.release()
    sampler.close()
    store.close()


@settings(max_examples=60, deadline=None)
@given(
    shards=st.integers(1, 4),
    capacity=st.integers(1, 40),
    data=st.data(),
)
def test_draw_anchors_gives_the_rows_of_the_tree_descent(shards, capacity, data):
    """Dense or not, count or weight tree: the same rows as `replay.sumtree.draw_rows` on u * total."""
    size = tree_size(capacity)
    weighted = data.draw(st.booleans())
    fills = [data.draw(st.integers(0, capacity)) for _ in range(shards)]
    filled = np.array(fills, dtype=np.int64)
    tree = np.zeros((shards, 2 * size))
    for s, f in enumerate(fills):
        if weighted:
            tree[s, size : size + f] = data.draw(
                st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.25]), min_size=f, max_size=f)
            )
        else:
            live = data.draw(st.lists(st.booleans(), min_size=f, max_size=f))
            tree[s, size : size + f] = live if data.draw(st.booleans()) else True
        sum_build(tree[s], size)
    if tree[:, 1].sum() <= 0:
        return
    u = np.random.default_rng(data.draw(st.integers(0, 99))).random(50)
    want = [np.zeros(50, np.int64), np.zeros(50, np.int64), np.zeros(50)]
    got = [np.zeros(50, np.int64), np.zeros(50, np.int64), np.zeros(50)]
    t_want, t_got = np.zeros((shards, capacity), np.int64), np.zeros((shards, capacity), np.int64)
    draw_rows(tree, size, u * tree[:, 1].sum(), *want, t_want, True)
    draw_anchors(u, tree, size, np.zeros(0, np.int64) if weighted else filled, t_got, True, *got)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(w, g)
    np.testing.assert_array_equal(t_want, t_got)
    assert (tree[got[0], size + got[1]] > 0).all()  # never an item of zero mass


def test_set_weights_matches_a_rebuilt_tree_and_later_duplicates_win():
    rng = np.random.default_rng(0)
    s_count, cap = 3, 37
    size = tree_size(cap)
    priority = rng.uniform(0.1, 2.0, (s_count, cap))
    state = (rng.random((s_count, cap)) < 0.8).astype(np.uint8)
    weights = np.where(state == 1, priority**0.6, 0.0)
    wtree = np.zeros((s_count, 2 * size))
    wtree[:, size : size + cap] = weights
    for s in range(s_count):
        sum_build(wtree[s], size)
    shard = rng.integers(0, s_count, 200)
    slot = rng.integers(0, cap, 200)
    p = rng.uniform(0.0, 5.0, 200)
    top = set_weights(shard, slot, p, 0.6, state, priority, weights, wtree, size)
    want_p = priority.copy()
    for s, c, v in zip(shard, slot, p, strict=True):  # in order: the last of duplicates wins
        want_p[s, c] = v
    np.testing.assert_array_equal(priority, want_p)
    want = np.zeros((s_count, 2 * size))
    want[:, size : size + cap] = np.where(state == 1, want_p**0.6, 0.0)
    for s in range(s_count):
        sum_build(want[s], size)
    np.testing.assert_allclose(wtree, want, rtol=1e-12, atol=0)
    assert top == p.max()


@pytest.mark.parametrize("threads", [1, 2])
def test_batch_copy_matches_the_reference_gather_threaded_or_not(mm, threads):
    """Windows of several shards, wrapping the ring, padded head and tail; large enough to be split
    into chunks on the thread team when threads > 1."""
    spec = TrajectorySpec({"img": ((4096,), "uint8"), "t": ((), "int64")})
    store = ReplayStore(spec, 3 * 300, 3, memory=mm, seed=1, timeout=5.0)
    w = store.writer()
    rng = np.random.default_rng(5)
    for _ in range(12):
        n = int(rng.integers(20, 90))
        w.extend({"img": rng.integers(0, 256, (n, 4096), dtype=np.uint8), "t": np.arange(n)})
        w.end_episode()
    w.close()
    length, b = 48, 96  # 96 * 48 * 4104 bytes: several 4 MiB chunks
    table = store.draw_windows(b, length, "head")
    copy = BatchCopy(store.storage, threads=threads)
    flat = {n: np.zeros(b * length * f.row_bytes, np.uint8) for n, f in spec.items()}
    mask = np.ones(b * length, dtype=bool)
    copy.run(table.shard, table.first, table.n, table.dst, 0, b, tuple(flat.values()), mask, length)
    for name, f in spec.items():
        out = flat[name].view(f.dtype).reshape(b, length, *f.shape)
        for s in range(3):
            rows = np.flatnonzero(table.shard == s)
            ring = store.rings(s)[name]
            want = reference_gather(ring, table.slots[rows], table.n[rows], table.dst[rows], length)
            np.testing.assert_array_equal(out[rows], want)
    want_mask = np.arange(length)[None, :] >= table.dst[:, None]
    want_mask &= np.arange(length)[None, :] < (table.dst + table.n)[:, None]
    np.testing.assert_array_equal(mask.reshape(b, length), want_mask)
    store.close()

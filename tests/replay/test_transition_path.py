"""The fused transition path (`replay.transition_kernel`) and the one-kernel priority update.

Windows of one step of a Uniform or Prioritized owner table are drawn and copied under the locks in one
kernel call; these tests hold it to the lock-free compiled path (`WindowSampler.locked_rows = 0`) and to
the general loop row for row, to the uniform and proportional laws by chi-square, to the generation
rule with writers wrapping the ring, and `update_priorities`' kernel to the per-array reference.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from scipy import stats

from replay import Prioritized, ReplayStore, TrajectorySpec, Uniform
from replay.batch import importance_weights
from replay.draw_kernels import accept_updates, apply_updates, set_weights
from replay.keys import decode_keys, encode_keys
from replay.rate_limiter import RateLimiterState
from replay.sampler import Deadline, WindowSampler

SPEC = TrajectorySpec({"pos": ((), "int64"), "ep": ((), "int32"), "obs": ((3,), "float32")})


def fill(store, lengths, start=0):
    """Episodes of the given lengths; ``pos`` counts every step appended from ``start``."""
    w = store.writer(chunk_steps=5)
    pos = start
    for e, n in enumerate(lengths):
        p = np.arange(pos, pos + n, dtype=np.int64)
        obs = (p[:, None] * 10 + np.arange(3)).astype(np.float32)
        w.extend({"pos": p, "ep": np.full(n, e, np.int32), "obs": obs})
        w.end_episode()
        pos += n
    w.close()
    return pos


class Proxy:
    """Any table object that is not the owner's `Table`: the sampler takes its general loop."""

    def __init__(self, table) -> None:
        self.inner = table
        self.prioritized = table.prioritized
        self.max_times_sampled = table.max_times_sampled
        self.store_id = table.store_id  # the issuer the batch's keys bear (issue 32)

    def draw(self, k, length, pad, row0, meta, prob):
        return self.inner.draw(k, length, pad, row0, meta, prob)

    def keys(self, shard, anchor, first):
        return self.inner.keys(shard, anchor, first)

    @property
    def incarnation(self):
        return self.inner.incarnation


def sampler(store, kind: str) -> WindowSampler:
    control = store.storage.control
    limiter = RateLimiterState(store.rate_limiter, control.counters, control.cond)
    table = Proxy(store.table) if kind == "general" else store.table
    out = WindowSampler(store.storage, table, limiter, 2)
    if kind == "lock-free":
        out.locked_rows = 0  # the compiled path's copy outside the locks
    return out


@pytest.mark.parametrize("selector", [Uniform(), Prioritized(0.6)])
@pytest.mark.parametrize("shards,pad", [(1, "tail"), (3, "head"), (2, "tail")])
def test_fused_path_equals_the_lock_free_path_and_the_general_loop(mm, selector, shards, pad):
    lengths = [5, 11, 3, 17, 8, 2, 13, 9]
    stores = [
        ReplayStore(SPEC, 40, shards, selector=selector, memory=mm, seed=7, timeout=5.0) for _ in range(3)
    ]
    for store in stores:
        fill(store, lengths)
        fill(store, lengths, start=1000)  # wrapped rings: floors above 0
        store.update_priorities(store.sample(16).keys, np.arange(1, 17) / 4.0)
    samplers = [sampler(s, k) for s, k in zip(stores, ("fused", "lock-free", "general"), strict=True)]
    assert samplers[0].locked_rows >= 9 and samplers[0].owner_table and not samplers[2].owner_table
    for _ in range(4):
        batches = [s.sample(9, 1, pad, 0.5, None, Deadline(5.0)) for s in samplers]
        ref = batches[1]
        for got in (batches[0], batches[2]):
            for name in SPEC:
                np.testing.assert_array_equal(got[name].numpy(), ref[name].numpy())
            for attr in ("mask", "keys", "probabilities", "weights", "lengths"):
                np.testing.assert_array_equal(getattr(got, attr).numpy(), getattr(ref, attr).numpy())
            assert got.table_size == ref.table_size
        # each row is the step its key names: pos is the absolute position, one real step
        shard, anchor, back = decode_keys(batches[0].keys.numpy())
        assert (back == 0).all() and batches[0].mask.all()
        np.testing.assert_array_equal(batches[0].lengths.numpy(), np.ones(9, np.int64))
        for b in batches:
            b.release()
    np.testing.assert_array_equal(stores[0].table.state.times, stores[1].table.state.times)
    for s in samplers:
        s.close()
    for store in stores:
        store.close()


def test_keys_and_weights_outlive_the_released_slot(mm):
    store = ReplayStore(
        SPEC, 64, 1, selector=Prioritized(0.6), memory=mm, seed=1, timeout=5.0, staging_slots=1
    )
    fill(store, [30, 34])
    store.update_priorities(store.sample(64).keys, np.linspace(0.1, 3.0, 64))
    a = store.sample(32, beta=0.4)
    keys, prob = a.keys.clone(), a.probabilities.clone()
    a.release()
    b = store.sample(32, beta=0.4)  # the same (only) slot again
    np.testing.assert_array_equal(a.keys.numpy(), keys.numpy())
    np.testing.assert_array_equal(a.probabilities.numpy(), prob.numpy())
    want = importance_weights(a.probabilities.numpy(), a.table_size, 0.4)
    np.testing.assert_array_equal(a.weights.numpy(), want.numpy())
    assert a.weights is a.weights and a.keys.dtype == torch.int64
    b.release()
    store.close()


@pytest.mark.parametrize("shards", [1, 3])
def test_fused_draws_are_uniform_over_the_steps(mm, shards):
    store = ReplayStore(SPEC, 1500, shards, memory=mm, seed=11, timeout=5.0)
    total = fill(store, [37, 101, 5, 64, 93, 200])  # 500 steps, none overwritten: shards unevenly filled
    counts = np.zeros(total, np.int64)
    for _ in range(60):
        with store.sample(256) as b:
            np.add.at(counts, b["pos"].numpy(), 1)
    assert counts.sum() == 60 * 256
    assert stats.chisquare(counts).pvalue > 1e-4
    assert len(store) == total
    store.close()


def test_fused_draws_follow_the_priorities(mm):
    store = ReplayStore(SPEC, 200, 2, selector=Prioritized(0.5), memory=mm, seed=5, timeout=5.0)
    total = fill(store, [50, 50, 50, 50])
    pos_keys = {}
    while len(pos_keys) < total:  # every step's key
        with store.sample(200) as b:
            pos_keys.update(zip(b["pos"][:, 0].tolist(), b.keys.tolist(), strict=True))
    pos = np.arange(total)
    prio = 1.0 + (pos % 7)
    store.update_priorities(np.array([pos_keys[p] for p in pos]), prio)
    counts = np.zeros(total, np.int64)
    for _ in range(80):
        with store.sample(256) as b:
            np.add.at(counts, b["pos"].numpy(), 1)
            w = prio[b["pos"][:, 0].numpy()] ** 0.5
            np.testing.assert_allclose(b.probabilities.numpy(), w / (prio**0.5).sum(), rtol=1e-12)
    expected = prio**0.5 / (prio**0.5).sum() * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-4
    store.close()


def test_writers_wrapping_the_ring_never_show_a_stale_transition(mm):
    """Writers overwrite a small ring while samplers draw: every sampled step is the one its key
    names, and the limiter counts every sampled transition."""
    store = ReplayStore(SPEC, 64, 2, memory=mm, seed=3, timeout=10.0)
    fill(store, [64, 64])
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(w_id: int) -> None:
        try:
            w = store.writer(chunk_steps=4)
            pos = 10_000 * (w_id + 1)
            while not stop.is_set():
                p = np.arange(pos, pos + 16, dtype=np.int64)
                obs = (p[:, None] * 10 + np.arange(3)).astype(np.float32)
                w.extend({"pos": p, "ep": np.zeros(16, np.int32), "obs": obs})
                w.end_episode()
                pos += 16
            w.close()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    drawn = [0, 0]

    def sample(t: int) -> None:
        try:
            for _ in range(150):
                with store.sample(48) as b:
                    pos = b["pos"].numpy()
                    obs = b["obs"].numpy()
                    np.testing.assert_array_equal(obs[:, 0, :], pos[:, 0, None] * 10.0 + np.arange(3))
                    shard, anchor, back = decode_keys(b.keys.numpy())
                    assert (back == 0).all()
                    drawn[t] += 48
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    before = store.counters()["samples"]
    writers = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    samplers = [threading.Thread(target=sample, args=(i,)) for i in range(2)]
    for t in writers + samplers:
        t.start()
    for t in samplers:
        t.join()
    stop.set()
    for t in writers:
        t.join()
    assert not errors, errors
    assert store.counters()["samples"] - before == sum(drawn) == 2 * 150 * 48
    store.close()


def test_apply_updates_equals_the_check_then_the_writes():
    rng = np.random.default_rng(4)
    s_count, cap, size = 3, 50, 64
    keys_anchor = rng.integers(0, 160, 300)
    shard = rng.integers(0, s_count, 300)
    back = rng.integers(0, 3, 300)
    keys = encode_keys(shard, keys_anchor, back, 1)
    keys[::7] = encode_keys(shard[::7], keys_anchor[::7], back[::7], 0)  # a previous incarnation
    p = rng.uniform(0, 4, 300)
    floors = np.array([60, 100, 0], np.int64)
    ingested = np.array([110, 150, 40], np.int64)
    restored = np.array([80, 120, 30], np.int64)
    state = (rng.random((s_count, cap)) < 0.9).astype(np.uint8)
    arrays = [rng.uniform(0.1, 2, (s_count, cap)), np.zeros((s_count, cap)), np.zeros((s_count, 2 * size))]
    ref = [a.copy() for a in arrays]
    slot = np.empty(300, np.int64)
    out_shard = np.empty(300, np.int64)
    ok = np.empty(300, np.bool_)
    want = accept_updates(keys, cap, floors, ingested, 1, restored, state, out_shard, slot, ok)
    want_top = set_weights(out_shard[ok], slot[ok], p[ok], 0.7, state, *ref, size)
    got, top = apply_updates(keys, p, cap, floors, ingested, 1, restored, state, *arrays, size, 0.7, True)
    assert 0 < got == want < 300 and top == want_top
    for a, r in zip(arrays, ref, strict=True):
        np.testing.assert_array_equal(a, r)


def test_update_priorities_names_bad_input_on_the_fast_path_too(mm):
    store = ReplayStore(SPEC, 32, 2, selector=Prioritized(0.6), memory=mm, seed=0, timeout=5.0)
    fill(store, [16, 16])
    b = store.sample(4)
    with pytest.raises(ValueError, match="NaN, infinite or negative"):
        store.update_priorities(b.keys, np.array([1.0, np.nan, 1.0, 1.0]))
    with pytest.raises(ValueError, match="negative"):
        store.update_priorities(torch.tensor([-1, 2, 3, 4]), torch.ones(4))
    with pytest.raises(ValueError, match="names shard 3"):
        store.update_priorities(b.keys | 3, np.ones(4))
    with pytest.raises(ValueError, match="expected 4 values"):
        store.update_priorities(b.keys, np.ones(3))
    assert store.update_priorities(b.keys, torch.full((4,), 2.0, dtype=torch.float32)) == 4
    b.release()
    store.close()


def test_fused_path_streams_page_rows_and_equals_the_lock_free_path(mm):
    """256 rows of 4096-byte frames: 1 MiB of one field, written with streaming stores
    (`replay.windows.STREAM_BATCH_BYTES`); each row is the frame of the step its key names."""
    from replay.windows import STREAM_BATCH_BYTES

    spec = TrajectorySpec({"frame": ((4096,), "uint8"), "pos": ((), "int64")})
    assert 256 * 4096 >= STREAM_BATCH_BYTES
    stores = [ReplayStore(spec, 300, 1, memory=mm, seed=3, timeout=5.0) for _ in range(2)]
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (500, 4096), dtype=np.uint8)  # wraps the ring of 300
    for store in stores:
        w = store.writer()
        for lo in range(0, 500, 50):
            w.extend({"frame": frames[lo : lo + 50], "pos": np.arange(lo, lo + 50, dtype=np.int64)})
            w.end_episode()
        w.close()
    samplers = [sampler(stores[0], "fused"), sampler(stores[1], "lock-free")]
    assert samplers[0].locked_rows >= 256
    for _ in range(2):
        got, ref = (s.sample(256, 1, "tail", 1.0, None, Deadline(5.0)) for s in samplers)
        for name in spec:
            np.testing.assert_array_equal(got[name].numpy(), ref[name].numpy())
        np.testing.assert_array_equal(got.keys.numpy(), ref.keys.numpy())
        _, anchor, _ = decode_keys(got.keys.numpy())
        np.testing.assert_array_equal(got["pos"].numpy()[:, 0], anchor)
        np.testing.assert_array_equal(got["frame"].numpy()[:, 0], frames[anchor])
        got.release()
        ref.release()
    for s in samplers:
        s.close()
    for store in stores:
        store.close()

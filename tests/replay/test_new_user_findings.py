"""Findings of a new user's attack on the replay store (writers, priorities, weights, checkpoints).

One test per bug, each asserting the correct behaviour (all fixed: none is marked xfail any more).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
import warnings

import numpy as np
import pytest
import torch

from replay import Prioritized, ReplayStore
from replay.batch import importance_weights


def _keys_by_x(store: ReplayStore, n: int) -> np.ndarray:
    """The key of each step ``x = 0 .. n - 1`` (single-step windows), collected from uniform-ish draws."""
    keys: dict[int, int] = {}
    for _ in range(50):
        b = store.sample(64, window=1)
        keys.update(zip(b["x"][:, 0].tolist(), b.keys.tolist(), strict=True))
        if len(keys) == n:
            break
    assert len(keys) == n
    return np.array([keys[i] for i in range(n)], dtype=np.int64)


@pytest.mark.parametrize(
    ("bad", "err"), [("1", TypeError), (True, TypeError), (-1.0, ValueError), (float("nan"), ValueError),
                     (float("inf"), ValueError)]
)
def test_writer_timeout_is_checked_when_the_writer_is_made(mm, bad, err):
    store = ReplayStore({"x": ((), "int64")}, 64, memory=mm, timeout=1.0)
    with pytest.raises(err, match="timeout") as exc:
        store.writer(timeout=bad)
    assert repr(bad) in str(exc.value)
    attached = ReplayStore.attach(store.handle())
    with pytest.raises(err, match="timeout"):
        attached.writer(timeout=bad)
    for good in (None, 0, 0.5):
        store.writer(timeout=good).close()
    attached.close()
    store.close()


def test_a_python_scalar_overflowing_a_float_field_raises_and_stores_nothing(mm):
    store = ReplayStore({"h": ((), "float16")}, 16, memory=mm, timeout=1.0)
    w = store.writer()
    for bad in (10**6, 70000.0, -70000.0, 65520.0, 10**400):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # neither stored nor warned about: refused
            with pytest.raises(ValueError, match="'h'") as exc:
                w.append({"h": bad})
        assert str(bad)[:20] in str(exc.value)
        assert w.pending == 0
    for good in (65504.0, 1e-10, float("inf"), -3):  # in range, underflow to 0, inf itself, an int
        w.append({"h": good})
    w.end_episode()
    w.close()
    b = store.sample(64, window=1)
    assert set(b["h"][:, 0].tolist()) == {65504.0, 0.0, float("inf"), -3.0}
    store.close()


@pytest.mark.parametrize(("alpha", "bad"), [(1.0, 1e308), (1.0, 1e307), (2.0, 1e154), (3.0, 1e103)])
def test_priorities_whose_mass_overflows_are_rejected_or_still_sample_sanely(mm, alpha, bad):
    store = ReplayStore({"x": ((), "int64")}, 16, selector=Prioritized(alpha), memory=mm, seed=3, timeout=1.0)
    with store.writer() as w:
        w.extend({"x": np.arange(8, dtype=np.int64)})
    keys = _keys_by_x(store, 8)
    p = np.ones(8)
    p[5] = bad
    for priorities in (p, torch.from_numpy(p), p.tolist()):  # the fast path and the general one
        with pytest.raises(ValueError, match="priorities") as exc:
            store.update_priorities(keys, priorities)
        assert str(bad) in str(exc.value) and "index 5" in str(exc.value)
        assert store.selector_mass() == (8, 8.0)  # nothing changed
    big = np.full(8, (np.finfo(np.float64).max / 32) ** (1 / alpha) * 0.999)  # just within: a full store's
    assert store.update_priorities(keys, big) == 8  # mass stays finite
    for window in (1, 2):
        b = store.sample(32, window=window, beta=0.5)
        assert np.isfinite(b.weights.numpy()).all()
        assert (b.probabilities.numpy() > 0).all()
        assert len(set(b["x"][:, 0].tolist())) > 1
    store.close()


@pytest.mark.parametrize(("alpha", "init"), [(1.0, 1e308), (2.0, 1e154)])
def test_an_initial_priority_whose_mass_would_overflow_is_refused_when_the_store_is_made(mm, alpha, init):
    with pytest.raises(ValueError, match=r"initial_priority=1e\+\d+ is too large for this store"):
        ReplayStore({"x": ((), "int64")}, 16, selector=Prioritized(alpha, initial_priority=init), memory=mm)
    assert mm.regions() == []  # nothing left allocated
    ok = (np.finfo(np.float64).max / 32) ** (1 / alpha) * 0.999  # just within (16 slots): taken, finite mass
    store = ReplayStore({"x": ((), "int64")}, 16, selector=Prioritized(alpha, initial_priority=ok), memory=mm)
    with store.writer() as w:
        w.extend({"x": np.arange(16, dtype=np.int64)})
    live, mass = store.selector_mass()
    assert live == 16 and np.isfinite(mass) and mass == pytest.approx(16 * ok**alpha)
    store.close()


@pytest.mark.parametrize("beta", [torch.tensor(0.5), torch.tensor(0.5, dtype=torch.float64), np.float32(0.5),
                                  np.array(0.5), torch.tensor(1), np.int64(1)])
def test_a_tensor_beta_samples_transitions_as_it_samples_windows(mm, beta):
    store = ReplayStore({"x": ((), "int64")}, 16, selector=Prioritized(0.5), memory=mm, seed=0, timeout=1.0)
    with store.writer() as w:
        w.extend({"x": np.arange(8, dtype=np.int64)})
    keys = _keys_by_x(store, 8)
    store.update_priorities(keys, np.arange(1.0, 9.0))
    b2 = store.sample(4, window=2, beta=beta)  # the general path takes it
    assert np.isfinite(b2.weights.numpy()).all()
    b1 = store.sample(4, window=1, beta=beta)  # the fused transition path
    assert np.isfinite(b1.weights.numpy()).all()
    assert torch.equal(b1.weights, importance_weights(b1.probabilities.numpy(), b1.table_size, float(beta)))
    store.close()


@pytest.mark.parametrize(
    ("bad", "err"),
    [("1", TypeError), (True, TypeError), (np.bool_(True), TypeError), (1 + 0j, TypeError),
     (torch.tensor([0.5, 0.5]), TypeError), (torch.tensor(True), TypeError), (None, TypeError),
     (-0.5, ValueError), (float("nan"), ValueError), (torch.tensor(float("inf")), ValueError)],
)
def test_a_non_numeric_beta_raises_naming_beta(mm, bad, err):
    store = ReplayStore({"x": ((), "int64")}, 16, selector=Prioritized(0.5), memory=mm, timeout=1.0)
    with store.writer() as w:
        w.extend({"x": np.arange(8, dtype=np.int64)})
    before = store.counters()
    for window in (1, 2):
        with pytest.raises(err, match="beta") as exc:
            store.sample(4, window=window, beta=bad)
        if isinstance(bad, (str, bool, float)):
            assert str(bad) in str(exc.value)
    assert store.counters() == before
    store.close()


def test_restore_closes_the_episodes_left_open_by_writers(mm, tmp_path):
    store = ReplayStore({"x": ((), "int64")}, 16, memory=mm, timeout=1.0)
    with store.writer() as w:
        w.extend({"x": np.arange(8, dtype=np.int64)})
    w = store.writer(chunk_steps=2)
    w.extend({"x": np.arange(5, dtype=np.int64)})  # 4 steps committed, the episode still open
    assert [e.open for e in store.episodes()] == [False, True]
    store.checkpoint(tmp_path)
    restored = ReplayStore.restore(tmp_path)
    try:
        assert [e.length for e in restored.episodes()] == [8, 4]
        assert [e.open for e in restored.episodes()] == [False, False]
        with restored.writer() as w2:  # a new writer starts a new episode
            w2.extend({"x": np.arange(2, dtype=np.int64)})
            w2.flush()
            assert [e.open for e in restored.episodes()] == [False, False, True]
        assert [(e.length, e.open) for e in restored.episodes()] == [(8, False), (4, False), (2, False)]
        again = tmp_path / "again"
        restored.checkpoint(again)  # restoring a restored store: the same episodes, all closed
        with ReplayStore.restore(again) as twice:
            assert [(e.length, e.open) for e in twice.episodes()] == [(8, False), (4, False), (2, False)]
    finally:
        restored.close()
        w.close()
        store.close()


@pytest.mark.parametrize(
    "bad",
    [np.array(["1"] * 8), ["1"] * 8, np.ones(8, dtype=np.complex128) * (1 + 2j), [1 + 2j] * 8,
     torch.ones(8, dtype=torch.complex64), np.array([1.0] * 7 + [None]), [None] * 8],
)
def test_non_real_priorities_raise_and_change_nothing(mm, bad):
    store = ReplayStore({"x": ((), "int64")}, 16, selector=Prioritized(1.0), memory=mm, seed=3, timeout=1.0)
    with store.writer() as w:
        w.extend({"x": np.arange(8, dtype=np.int64)})
    keys = _keys_by_x(store, 8)
    before = store.selector_mass()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TypeError, match="priorities") as exc:
            store.update_priorities(keys, bad)
    dtype = bad.dtype if hasattr(bad, "dtype") else np.asarray(bad).dtype
    assert str(dtype) in str(exc.value)
    assert store.selector_mass() == before
    store.close()


def test_keys_stay_valid_or_commits_stop_at_the_key_layouts_position_limit(mm):
    from replay.keys import MAX_POSITION, POS_BITS, decode_keys
    from replay.shard_layout import RESERVE_POS, WRITE_POS

    assert MAX_POSITION == 1 << POS_BITS  # the key layout's limit is the shards' limit
    store = ReplayStore({"x": ((), "int64")}, 16, selector=Prioritized(1.0), memory=mm, seed=3, timeout=1.0)
    sh = store.storage.shards[0]
    # stands for 2**35 - 10 steps having passed through the shard (about 10 h at 1 M steps/s)
    sh.meta[WRITE_POS] = sh.meta[RESERVE_POS] = MAX_POSITION - 10
    with store.writer() as w:  # positions up to MAX_POSITION - 3: they fit in a key
        w.extend({"x": np.arange(8, dtype=np.int64)})
    b = store.sample(32, window=1)
    assert (b.keys.numpy() >= 0).all()
    _, anchor, _ = decode_keys(b.keys.numpy())
    assert anchor.min() >= MAX_POSITION - 10 and anchor.max() < MAX_POSITION
    assert store.update_priorities(b.keys, np.ones(32)) == 32
    w = store.writer()
    w.extend({"x": np.arange(8, dtype=np.int64)})
    with pytest.raises(OverflowError, match=str(MAX_POSITION)):  # the commit stops at the limit
        w.end_episode()
    w.close()
    assert [e.length for e in store.episodes()] == [8] and sh.write_pos == MAX_POSITION - 2  # nothing more
    assert (store.sample(32, window=1).keys.numpy() >= 0).all()
    store.close()


def test_bfloat16_priorities_are_taken(mm):
    store = ReplayStore({"x": ((), "int64")}, 16, selector=Prioritized(1.0), memory=mm, seed=3, timeout=1.0)
    with store.writer() as w:
        w.extend({"x": np.arange(8, dtype=np.int64)})
    keys = _keys_by_x(store, 8)
    assert store.update_priorities(keys, torch.full((8,), 2.0, dtype=torch.bfloat16)) == 8
    assert store.selector_mass() == (8, 16.0)
    p = torch.tensor([0.1, 1.5, 3.0, 257.0, 0.0, 1e-3, 7.0, 1e30], dtype=torch.bfloat16)
    assert store.update_priorities(keys, p) == 8  # bfloat16 -> float64 exactly
    assert store.selector_mass() == (8, float(p.double().sum()))
    for other in (torch.arange(8, dtype=torch.int32), np.arange(8, dtype=np.uint8), list(range(8)),
                  torch.ones(8, dtype=torch.float16), np.ones(8, dtype=np.float32)):
        assert store.update_priorities(keys, other) == 8
        assert store.selector_mass()[1] == float(np.asarray(other, dtype=np.float64).sum())
    with pytest.raises(ValueError, match="priorities"):  # a bfloat16 NaN is still refused
        store.update_priorities(keys, torch.full((8,), float("nan"), dtype=torch.bfloat16))
    assert store.selector_mass()[1] == 8.0
    store.close()


def _open_then_die(handle, ready) -> None:  # a forked actor: one episode left open, then SIGKILLed
    store = ReplayStore.attach(handle)
    w = store.writer(chunk_steps=4)
    w.extend({"x": np.arange(6, dtype=np.int64)})
    w.flush()
    ready.put(1)
    time.sleep(60)


def test_a_dead_writers_open_episode_does_not_starve_its_shard(mm, caplog):
    store = ReplayStore({"x": ((), "int64")}, 64, num_shards=2, memory=mm, timeout=2.0)
    ctx = mp.get_context("fork")
    ready = ctx.Queue()
    child = ctx.Process(target=_open_then_die, args=(store.handle(), ready))
    child.start()
    try:
        ready.get(timeout=30)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    try:
        (dead,) = [e for e in store.episodes() if e.length == 6]
        assert dead.open and list(store.storage.control.open) == [int(dead.shard == 0), int(dead.shard == 1)]
        with caplog.at_level(logging.WARNING, logger="replay.storage"):
            for _ in range(40):
                with store.writer() as w:
                    w.extend({"x": np.arange(3, dtype=np.int64)})
        assert "left open by writer processes that died" in caplog.text
        later = [e.shard for e in store.episodes() if e.length == 3]
        assert set(later) == {0, 1}
        assert abs(later.count(0) - later.count(1)) <= 2  # the dead writer's shard is no longer starved
        assert [e.open for e in store.episodes() if e.length == 6] in ([False], [])  # closed (or overwritten)
        assert list(store.storage.control.open) == [0, 0]
    finally:
        store.close()

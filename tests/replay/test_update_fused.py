"""`update_priorities`' one compiled call (`replay.update_kernel.update_locked`) against the checked path.

Twin stores (same spec, seed and writes) take the same updates, one through the compiled call (tensors
and numpy arrays) and one through the checked Python path (priorities as a list, which the compiled
call does not take): under hypothesis (shards, capacity, ring wraps, ``max_times_sampled``, Uniform or
Prioritized, stale, repeated and other-incarnation keys) both return the same count and leave the same
priorities, weights, weight trees and largest priority bit for bit, the count and priorities equal a
numpy oracle of the key rule (both paths share `write_updates`), and every tree equals its full
rebuild from its leaves. Also: float32 tensors, commits the table has not ingested (the call's `STALE`),
keys of another store (refused, nothing changed) and of a restored store's checkpoint (accepted).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, TrajectorySpec, Uniform
from replay.keys import decode_keys, encode_keys, key_incarnations
from replay.sumtree import sum_build
from replay.update_kernel import P_ARRAY, STALE, outcome, update_args, update_locked

SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((2,), "float32")})


@pytest.fixture(scope="module")
def mm():
    manager = MemoryManager()
    yield manager
    manager.close()


def fill(store: ReplayStore, lengths: list[int], start: int = 0) -> int:
    w = store.writer(chunk_steps=5)
    pos = start
    for n in lengths:
        p = np.arange(pos, pos + n, dtype=np.int64)
        w.extend({"pos": p, "obs": np.stack([p, -p], axis=1).astype(np.float32)})
        w.end_episode()
        pos += n
    w.close()
    return pos


def selector_arrays(store: ReplayStore) -> dict[str, object]:
    s = store.table.state
    return {
        "priority": s.priority.copy(),
        "weights": s.weights.copy(),
        "wtree": s.wtree.copy(),
        "state": s.state.copy(),
        "max_priority": s.max_priority,
    }


def assert_same(a: dict[str, object], b: dict[str, object]) -> None:
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def assert_trees_rebuilt(store: ReplayStore) -> None:
    """Every weight tree is the exact rebuild from its leaves (level-wise sums change nothing)."""
    s = store.table.state
    if s.wtree.shape[1] == 1:
        return
    for t in s.wtree:
        want = t.copy()
        want[: s.size] = 0
        sum_build(want, s.size)
        np.testing.assert_array_equal(t[1:], want[1:])


def by_hand(store: ReplayStore, keys: np.ndarray, p: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """The count, priorities and touched (shard, slot) mask an update of a store of incarnation 0 with
    every commit ingested must give: the key rule of docs/architecture.md#keys in numpy, from the
    shards' write positions and floors and the item states (not the kernels under test)."""
    st = store.table.state
    cap = store.storage.capacity
    wp = np.array([sh.write_pos for sh in store.storage.shards])
    np.testing.assert_array_equal(store.table.ingested, wp)  # else ingesting would change the state
    floor = np.array([sh.floor for sh in store.storage.shards])
    shard, anchor, back = decode_keys(keys)
    slot = anchor % cap
    ok = (key_incarnations(keys) == 0) & (anchor < wp[shard]) & (anchor - back >= floor[shard])
    ok &= st.state[shard, slot] == 1
    priority = st.priority.copy()
    touched = np.zeros(priority.shape, dtype=bool)
    for s, c, v in zip(shard[ok].tolist(), slot[ok].tolist(), p[ok].tolist(), strict=True):
        priority[s, c] = v  # in order: a later duplicate wins
        touched[s, c] = True
    return int(ok.sum()), priority, touched


def twins(mm, shards: int, capacity: int, selector, mts: int, lengths: list[int]):
    stores = [
        ReplayStore(
            SPEC, capacity * shards, shards, selector=selector, memory=mm, seed=5, max_times_sampled=mts,
            timeout=10.0,
        )
        for _ in range(2)
    ]
    for s in stores:
        fill(s, lengths)
    return stores


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shards=st.integers(1, 3),
    capacity=st.sampled_from([16, 24, 64]),
    selector=st.sampled_from([Prioritized(0.6), Prioritized(1.0), Prioritized(0.3), Uniform()]),
    mts=st.sampled_from([0, 0, 2]),
    lengths=st.lists(st.integers(8, 40), min_size=2, max_size=8),
    more=st.lists(st.integers(1, 40), min_size=0, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_compiled_update_equals_the_checked_path(mm, shards, capacity, selector, mts, lengths, more, seed):
    rng = np.random.default_rng(seed)
    fast, slow = twins(mm, shards, capacity, selector, mts, lengths)
    try:
        old = [s.sample(8) for s in (fast, slow)]  # keys that the writes below may make stale
        old_keys = [b.keys.clone() for b in old]
        for b in old:
            b.release()
        np.testing.assert_array_equal(old_keys[0], old_keys[1])
        pos = sum(lengths)
        for s in (fast, slow):
            fill(s, more, pos)
        batches = [s.sample(16) for s in (fast, slow)]
        keys = np.asarray(batches[0].keys)  # plain arrays (no issuer): both twins take them as their own
        np.testing.assert_array_equal(keys, np.asarray(batches[1].keys))
        shard, anchor, back = decode_keys(keys)
        mixed = np.concatenate(
            [
                keys,
                np.asarray(old_keys[0]),
                keys[rng.integers(0, keys.size, 6)],  # repeated: the later value wins
                encode_keys(shard[:3], anchor[:3], back[:3], incarnation=1),  # another incarnation
                encode_keys(shard[:2], anchor[:2] + 10 * capacity, back[:2]),  # not yet written
            ]
        )
        rng.shuffle(mixed)
        p = rng.uniform(0.0, 5.0, mixed.size)
        p[rng.random(mixed.size) < 0.1] = 0.0
        count, priority, touched = by_hand(fast, mixed, p)
        got = fast.update_priorities(torch.from_numpy(mixed.copy()), torch.from_numpy(p.copy()))
        want = slow.update_priorities(mixed, p.tolist())  # a list: the checked path
        assert got == want == count <= mixed.size - 5  # the other incarnation and the unwritten: never
        assert_same(selector_arrays(fast), selector_arrays(slow))
        state = fast.table.state
        np.testing.assert_array_equal(state.priority, priority)
        if state.wtree.shape[1] > 1:  # the touched leaves: p ** exponent (numpy's pow and libm's: 1 ulp)
            np.testing.assert_allclose(
                state.weights[touched], priority[touched] ** state.selector.exponent, rtol=1e-15, atol=0
            )
        assert_trees_rebuilt(fast)
        for b in batches:
            b.release()
        # numpy in, float32 tensors in: the same as the checked path of the same values
        q = rng.uniform(0.0, 3.0, keys.size).astype(np.float32)
        assert fast.update_priorities(keys, torch.from_numpy(q)) == slow.update_priorities(keys, q.tolist())
        assert_same(selector_arrays(fast), selector_arrays(slow))
        q64 = rng.uniform(0.0, 3.0, keys.size)
        assert fast.update_priorities(keys, q64) == slow.update_priorities(keys.tolist(), q64.tolist())
        assert_same(selector_arrays(fast), selector_arrays(slow))
        strided = rng.uniform(0.0, 3.0, 2 * mixed.size)[::2]  # strided 1-D arrays: the compiled call too
        assert update_args(mixed[::-1], strided) is not None
        got = fast.update_priorities(mixed[::-1], strided)
        assert got == slow.update_priorities(mixed[::-1].tolist(), strided.tolist())
        assert_same(selector_arrays(fast), selector_arrays(slow))
        assert_trees_rebuilt(fast)
    finally:
        fast.close()
        slow.close()


def test_commits_not_ingested_take_the_checked_path_with_the_same_result(mm):
    fast, slow = twins(mm, 2, 32, Prioritized(0.6), 0, [20, 30, 25])
    try:
        batches = [s.sample(12) for s in (fast, slow)]
        keys = batches[0].keys
        for s in (fast, slow):
            fill(s, [15, 9], 75)  # committed, not ingested: some keys go stale
        table = fast.table
        before = table.ingested.copy()
        repairs = np.zeros(4, dtype=np.int64)
        scratch = np.zeros(4 + keys.numel(), dtype=np.int64)
        words = table.state.update_words(table.plan, table.priority_limit, table.ingested, repairs, scratch)
        with pytest.raises(ValueError, match=r"ingested has shape \(3,\), expected \(2,\)"):  # by address
            table.state.update_words(table.plan, 1.0, np.zeros(3, np.int64), repairs, scratch)
        p = np.linspace(0.5, 2.0, keys.numel())
        with table.lock:
            assert update_locked(words.ctypes.data, keys.numpy(), p, P_ARRAY, p.size) == -1
        assert outcome(words) == (STALE, 0, 0, 0)  # nothing changed
        np.testing.assert_array_equal(table.ingested, before)
        assert_same(selector_arrays(fast), selector_arrays(slow))
        got = fast.update_priorities(keys, p)
        want = slow.update_priorities(np.asarray(keys), p.tolist())  # fast's keys, as a plain array
        assert 0 < got == want < keys.numel()
        assert (table.ingested > before).any()
        assert_same(selector_arrays(fast), selector_arrays(slow))
        with table.lock:  # all ingested now: the call applies
            assert update_locked(words.ctypes.data, keys.numpy(), p, P_ARRAY, p.size) == got
            with pytest.raises(ValueError, match="fewer than 2 S"):  # more keys than the scratch holds
                update_locked(words.ctypes.data, np.zeros(keys.numel() + 1, np.int64), np.ones(13), P_ARRAY,
                              keys.numel() + 1)
        for b in batches:
            b.release()
    finally:
        fast.close()
        slow.close()


def test_foreign_keys_are_refused_and_change_nothing(mm):
    a, b = twins(mm, 1, 32, Prioritized(0.6), 0, [20, 20])
    try:
        assert a.update_priorities(torch.zeros(0, dtype=torch.int64), torch.zeros(0)) == 0  # first: none
        batch = b.sample(6)
        before = selector_arrays(a)
        with pytest.raises(ValueError, match=r"keys: 6 of 6 keys were issued by another replay store"):
            a.update_priorities(batch.keys, torch.ones(6))
        assert_same(before, selector_arrays(a))
        with pytest.raises(ValueError, match=r"keys: 2 of 2 keys were issued by another replay store"):
            a.update_priorities(batch.keys.numpy()[:2], np.ones(2))  # a numpy slice keeps the issuer
        assert a.update_priorities(np.asarray(batch.keys), np.ones(6)) == 6  # no issuer: taken as its own
        batch.release()
        with pytest.raises(ValueError, match="NaN, infinite or negative"):  # the checks name bad input
            a.update_priorities(np.zeros(2, np.int64), torch.tensor([1.0, -1.0]))
        with pytest.raises(ValueError, match="names shard 1"):
            a.update_priorities(torch.tensor([1, 0]), torch.ones(2, dtype=torch.float64))
    finally:
        a.close()
        b.close()


def test_restored_store_takes_its_checkpoints_keys_by_the_incarnation_rule(mm, tmp_path):
    src = ReplayStore(SPEC, 64, 2, selector=Prioritized(0.6), memory=mm, seed=1)
    fill(src, [20, 20, 20])
    batch = src.sample(10)
    keys = batch.keys.clone()
    batch.release()
    src.checkpoint(tmp_path)
    src.close()
    fast = ReplayStore.restore(tmp_path, memory=mm)
    slow = ReplayStore.restore(tmp_path, memory=mm)
    try:
        for s in (fast, slow):
            fill(s, [12], 60)  # new positions: the old keys still apply below the restored ones
        p = np.linspace(0.1, 3.0, keys.numel())
        other = slow.sample(2)
        with pytest.raises(ValueError, match="another replay store"):  # the twin's own keys are not fast's
            fast.update_priorities(other.keys, torch.ones(2))
        other.release()
        got = fast.update_priorities(keys, torch.from_numpy(p))
        want = slow.update_priorities(keys.numpy(), p.tolist())
        assert got == want == keys.numel() and set(key_incarnations(keys.numpy())) == {0}
        assert_same(selector_arrays(fast), selector_arrays(slow))
        assert_trees_rebuilt(fast)
    finally:
        fast.close()
        slow.close()

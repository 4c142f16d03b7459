"""`replay.transition_kernel.slot_call`: the one compiled transition call taking a table's and a staging
slot's fixed arrays by address (`replay.table.Table.transition_call`, kept in
`replay.batch_staging.StagedSlot.call`) draws, copies and counts exactly as the call given the arrays
themselves; bad arrays are refused naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
from _stores import SPEC, steps

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, Uniform
from replay.transition_kernel import DRAWN, SLOT_CALL_WORDS, STALE, sample_transitions, slot_call


def filled(mm, selector, shards: int = 2) -> ReplayStore:
    store = ReplayStore(SPEC, 64, shards, selector=selector, memory=mm, seed=11, timeout=5.0)
    w = store.writer(chunk_steps=4)
    pos = 0
    for n in (7, 5, 9, 3, 11, 6):
        w.extend(steps(pos, n))
        w.end_episode()
        pos += n
    w.close()
    return store


def one_call(store, b: int, by_address: bool, beta: float = 0.0, weights: bool = False):
    table = store.table
    slot = store._sampler.staging.acquire(b, 1, None, None)
    keys, prob = np.zeros(b, np.int64), np.zeros(b)
    w = np.zeros(b if weights else 0, np.float32)
    call = table.transition_call(slot.addresses, slot.mask_flat) if by_address else None
    with table.lock:
        out = sample_transitions(
            table.plan, False, table._repairs, table._words, slot.addresses, table.incarnation, keys, prob,
            slot.mask_flat, beta, w, table.step_bytes, call,
        )
    fields = {n: t.clone() for n, t in slot.fields.items()}
    mask = slot.mask.clone()
    slot.buffer.release()
    return out, keys, prob, w, fields, mask


@pytest.mark.parametrize("selector", [Uniform(), Prioritized(0.6)], ids=["uniform", "prioritized"])
def test_the_call_by_address_is_the_call_with_the_arrays(selector):
    with MemoryManager() as mm:
        by_arrays, by_address = filled(mm, selector), filled(mm, selector)
        for store in (by_arrays, by_address):  # pending commits: STALE either way, nothing drawn
            assert one_call(store, 8, store is by_address)[0] == (STALE, 0, 0, 0)
            store.table.ingest_all()
        weights = isinstance(selector, Prioritized)
        for b in (1, 8, 24):
            want = one_call(by_arrays, b, False, 0.4, weights)
            got = one_call(by_address, b, True, 0.4, weights)
            assert got[0] == want[0] and got[0][0] == DRAWN and got[0][1] == 41
            for g, w in zip(got[1:4], want[1:4], strict=True):
                np.testing.assert_array_equal(g, w)
            for name in SPEC:
                np.testing.assert_array_equal(got[4][name].numpy(), want[4][name].numpy())
                pos = got[4]["pos"].numpy()[:, 0]
                np.testing.assert_array_equal(got[4]["obs"].numpy()[:, 0], pos[:, None] * 10 + np.arange(3))
            assert got[5].numpy()[:, 0].all()
        np.testing.assert_array_equal(by_address.table.state.times, by_arrays.table.state.times)
        assert by_address.counters() == by_arrays.counters()
        by_arrays.close()
        by_address.close()


def test_a_store_sample_keeps_one_call_array_per_slot():
    with MemoryManager() as mm:
        store = filled(mm, Uniform(), shards=1)
        with store.sample(4, 1) as batch:
            assert batch["obs"].shape == (4, 1, 3)
        staged = store._sampler.staging.acquire(4, 1, None, None)
        call = staged.call
        assert call is not None and call.shape == (SLOT_CALL_WORDS,)
        assert call[6] == staged.addresses.ctypes.data and call[8] == staged.mask_flat.ctypes.data
        staged.buffer.release()
        store.sample(4, 1).release()
        assert store._sampler.staging.acquire(4, 1, None, None).call is call  # made once, reused
        store.close()


def test_slot_call_refuses_arrays_of_another_dtype_or_layout():
    plan, dst = np.zeros(8, np.int64), np.zeros(4, np.int64)
    mask = np.zeros(4, np.bool_)
    with pytest.raises(ValueError, match=r"^plan must be a C-contiguous 1-D int64 array"):
        slot_call(plan.astype(np.int32), plan, plan, dst, mask)
    with pytest.raises(ValueError, match=r"^dst must be a C-contiguous 1-D int64 array"):
        slot_call(plan, plan, plan, np.zeros(8, np.int64)[::2], mask)
    with pytest.raises(ValueError, match=r"^mask must be a C-contiguous 1-D bool array"):
        slot_call(plan, plan, plan, dst, np.zeros((2, 2), np.bool_))
    out = slot_call(plan, plan, plan, dst, mask)
    assert out.tolist() == [plan.ctypes.data, 8] * 3 + [dst.ctypes.data, 4, mask.ctypes.data, 4]

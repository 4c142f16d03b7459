"""Batch and BatchStaging (replay.batch): slot reuse and release, copies holding their slot,
to_tensordict, importance weights, and the staging views on their own."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from replay import ReplayStore, TrajectorySpec
from replay.batch import importance_weights
from replay.batch_staging import BatchStaging

SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((2, 3), "float32")})


def make(mm, capacity=64, **kw):
    kw.setdefault("timeout", 5.0)
    return ReplayStore(SPEC, capacity_steps=capacity, num_shards=1, memory=mm, **kw)


def fill_shards(store, lengths):
    w = store.writer()
    pos = 0
    for n in lengths:
        p = np.arange(pos, pos + n, dtype=np.int64)
        w.extend({"pos": p, "obs": (p[:, None, None] * 10 + np.arange(6).reshape(2, 3)).astype(np.float32)})
        w.end_episode()
        pos += n
    return pos


def test_staging_is_reused_and_released_on_gc(mm):
    store = make(mm, staging_slots=2)
    fill_shards(store, [10])
    a = store.sample(4, window=3)
    ptr = a["obs"].data_ptr()
    a.release()
    b = store.sample(4, window=3)
    c = store.sample(4, window=3)
    assert ptr in (b["obs"].data_ptr(), c["obs"].data_ptr())
    with pytest.raises(TimeoutError, match="slots stayed held"):
        store.sample(4, window=3, timeout=0.01)
    del b
    gc.collect()
    d = store.sample(4, window=3, timeout=1)  # b's slot came back when it was collected
    assert d.batch_size == 4
    with d:
        pass
    assert d.released
    assert (
        store.memory.stats()["pinned"]["replay.staging"]["regions"] >= 1
        or store.memory.stats()["host"]["replay.staging"]["regions"] >= 1
    )


def test_a_host_batch_gets_the_slot_released_last_and_never_a_held_one(mm):
    """Host staging hands out the slot released last (its lines still cached); a held slot never."""
    store = make(mm, staging_slots=3)
    fill_shards(store, [10])
    for window in (1, 3):  # transitions (the fused call) and windows
        first = store.sample(4, window=window)
        ptr = first["obs"].data_ptr()
        first.release()
        for _ in range(3):
            with store.sample(4, window=window) as b:
                assert b["obs"].data_ptr() == ptr
        held = store.sample(4, window=window)
        other = store.sample(4, window=window)
        assert other["obs"].data_ptr() != held["obs"].data_ptr()
        np.testing.assert_array_equal(  # the held batch is intact after the other's gather
            held["obs"].numpy()[..., 0, 0], held["pos"].numpy() * 10 * held.mask.numpy()
        )
        other.release()
        held.release()
    store.close()


def test_copies_keep_the_staging_slot_until_released(mm):
    store = make(mm, staging_slots=1)
    fill_shards(store, [6])
    host = store.sample(3, window=2)
    copy = host.to("cpu")
    assert torch.equal(copy["pos"], host["pos"]) and copy["pos"].data_ptr() != host["pos"].data_ptr()
    del host
    gc.collect()
    with pytest.raises(TimeoutError):  # the copy still holds the only slot
        store.sample(3, window=2, timeout=0.01)
    copy.release()
    assert store.sample(3, window=2, device="cpu").batch_size == 3
    with pytest.raises(ValueError, match="tier"):
        ReplayStore(SPEC, 10, 1, memory=mm, tier="device")


def test_to_tensordict_is_lazy(mm):
    store = make(mm)
    fill_shards(store, [3])
    b = store.sample(2, window=2)
    try:
        import tensordict  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="tensordict"):
            b.to_tensordict()
    else:
        td = b.to_tensordict()
        assert td["obs"].shape == (2, 2, 2, 3) and td["mask"].shape == (2, 2)


def test_importance_weights_are_normalised_and_check_beta():
    w = importance_weights(np.array([0.5, 0.25, 0.25]), 3, 1.0)
    assert w.dtype == torch.float32 and float(w.max()) == 1.0
    assert np.allclose(w.numpy(), [0.5, 1.0, 1.0])
    assert importance_weights(np.zeros(0), 3, 0.4).shape == (0,)
    with pytest.raises(ValueError, match="beta"):
        importance_weights(np.array([1.0]), 1, -1.0)
    assert np.allclose(importance_weights(np.array([0.5, 0.5]), 0, 1.0).numpy(), 1.0)  # N counts as 1


def test_importance_weights_edge_cases_follow_ieee_arithmetic():
    # the contract both stores rely on (the Ray store passes its probabilities here as they are)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = importance_weights(np.array([0.0, 0.5]), 2, 0.4).numpy()  # a mass that overflowed: P = 0
        assert np.isnan(w[0]) and w[1] == 0.0
        assert np.isnan(importance_weights(np.zeros(3), 3, 0.4).numpy()).all()
        assert np.isnan(importance_weights(np.array([np.nan, 0.5]), 2, 0.4).numpy()).all()
    assert np.array_equal(importance_weights(np.array([0.0, np.nan, 0.25]), 4, 0.0).numpy(), np.ones(3))


def test_staging_views_lay_out_fields_and_mask_in_one_slot(mm):
    staging = BatchStaging(SPEC, mm, slots=1, timeout=0.01)
    slot = staging.acquire(4, 3, None, 0.01)
    assert slot.fields["obs"].shape == (4, 3, 2, 3) and slot.mask.shape == (4, 3)
    assert slot.outs["pos"].shape == (4, 3) and [f.dtype for f in slot.flat] == [np.uint8, np.uint8]
    slot.fields["pos"][:] = 7
    assert (slot.outs["pos"] == 7).all()  # numpy and torch views share the slot's bytes
    with pytest.raises(TimeoutError):
        staging.acquire(4, 3, None, 0.01)
    slot.buffer.release()
    again = staging.acquire(4, 3, None, 0.01)
    assert again.fields["pos"].data_ptr() == slot.fields["pos"].data_ptr()  # views made once per slot
    again.buffer.release()
    staging.close()

"""A batch's staging slot and the tensors taken from it: a batch dropped without a release keeps its
slot held while any tensor taken from it (``batch["pos"]``, `Batch.to_tensordict`'s entries, views of
them) lives, so the next samples never overwrite data the user still reads; an explicit release (or a
``with`` block's end) gives the slot back at once; the pool neither leaks a slot nor hands out a held
one, and a pool whose slots are all held by kept tensors waits and times out as for held batches."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
import torch

from graphrl.memory import MemoryManager
from graphrl.tensors import StagingPool
from replay import ReplayStore, TrajectorySpec

SPEC = TrajectorySpec({"pos": ((), "int64"), "obs": ((2, 3), "float32")})


@pytest.fixture
def store():
    with MemoryManager() as mm:
        s = ReplayStore(SPEC, 256, 1, memory=mm, seed=3, staging_slots=2, timeout=5.0)
        with s.writer() as w:
            start = 0
            for n in (40, 50, 60):  # distinct positions: each draw gives other values with near certainty
                p = np.arange(start, start + n, dtype=np.int64)
                w.add_episode({"pos": p, "obs": (p[:, None, None] * 10 + np.arange(6).reshape(2, 3)).astype(
                    np.float32)})
                start += n
        yield s
        s.close()


def _check_consistent(pos: torch.Tensor, obs: torch.Tensor) -> None:
    """The fill rule: obs[..., i, j] = pos * 10 + 3 i + j at real steps (0 at padding)."""
    want = pos[..., None, None].to(torch.float32) * 10 + torch.arange(6, dtype=torch.float32).reshape(2, 3)
    real = pos > 0
    assert torch.equal(obs[real], want[real])


@pytest.mark.parametrize("device", [None, "cpu"])  # host staging; the device path's pool in host memory
def test_a_tensor_kept_from_a_dropped_batch_survives_later_samples(store, device):
    kw = {} if device is None else {"device": device}
    pos = store.sample(8, 3, **kw)["pos"]  # the batch is dropped at once
    obs_view = store.sample(8, 3, **kw)["obs"][2:].numpy()  # a numpy view of a slice of another's field
    pos0, obs0 = pos.clone(), obs_view.copy()
    with pytest.raises(TimeoutError, match="slots stayed held"):  # both slots are held
        store.sample(8, 3, timeout=0, **kw)
    ptr = pos.data_ptr()
    del obs_view  # its slot comes back; pos's stays held
    ptrs = set()
    for _ in range(20):
        b = store.sample(8, 3, timeout=0.5, **kw)
        ptrs.add(b["pos"].data_ptr())
        b.release()
    assert torch.equal(pos, pos0) and obs0.shape == (6, 3, 2, 3)
    assert ptr not in ptrs and len(ptrs) == 1  # the other slot served every sample


def test_a_tensordict_kept_from_a_dropped_batch_survives_later_samples(store):
    pytest.importorskip("tensordict")
    td = store.sample(8, 3).to_tensordict()
    flat = store.sample(8, 3).to_tensordict(flat=True)  # reshaped: views of the slot, not its tensors
    kept = [(td["pos"].clone(), td["obs"].clone()), (flat["pos"].clone(), flat["obs"].clone())]
    for _ in range(20):
        with pytest.raises(TimeoutError, match="slots stayed held"):  # both slots are held by the tds
            store.sample(8, 3, timeout=0)
    del flat
    for _ in range(20):
        store.sample(8, 3, timeout=1)
    gc.collect()
    assert torch.equal(td["pos"], kept[0][0]) and torch.equal(td["obs"], kept[0][1])
    _check_consistent(td["pos"], td["obs"])


def test_a_tensordict_of_layout_batch_holds_the_slot(store):
    pytest.importorskip("tensordict")
    td = store.sample(8, 3).to_tensordict(layout="batch")  # the batch's own field tensors, in a new dict
    p0 = td["pos"].clone()
    for _ in range(20):
        store.sample(8, 3, timeout=0.5).release()
    assert torch.equal(td["pos"], p0)


def test_an_explicitly_released_batch_gives_its_slot_back_at_once(store):
    b = store.sample(8, 3)
    kept = b["pos"]  # kept past the release: the user's word that it is not read any more
    ptr = kept.data_ptr()
    b.release()
    c = store.sample(8, 3, timeout=0)  # the slot released last, although a tensor of it lives
    assert c["pos"].data_ptr() == ptr
    with store.sample(8, 3, timeout=0) as d:
        x = d["pos"]
    with store.sample(8, 3, timeout=0) as e:  # the with block's end released d's slot
        assert e["pos"].data_ptr() == x.data_ptr()


def test_dropped_batches_leak_no_slot(store):
    for _ in range(30):
        b = store.sample(8, 3, timeout=0.5)
        _check_consistent(b["pos"], b["obs"])
        del b
        store.sample(8, 3, timeout=0.5)["obs"].sum()  # a temporary taken from a dropped batch
    gc.collect()
    held = [store.sample(8, 3, timeout=0), store.sample(8, 3, timeout=0)]  # both slots are free
    with pytest.raises(TimeoutError, match="slots stayed held"):
        store.sample(8, 3, timeout=0)
    assert held[0]["pos"].data_ptr() != held[1]["pos"].data_ptr()


def test_a_kept_tensor_holds_only_its_slot(store):
    kept = store.sample(8, 3)["obs"]
    k0 = kept.clone()
    for _ in range(10):  # the other slot serves every sample
        b = store.sample(8, 3, timeout=0)
        assert b["obs"].data_ptr() != kept.data_ptr()
        _check_consistent(b["pos"], b["obs"])
        del b
    held = store.sample(8, 3, timeout=0)
    with pytest.raises(TimeoutError, match="slots stayed held"):  # one slot held by the batch, one by kept
        store.sample(8, 3, timeout=0.05)
    assert torch.equal(kept, k0)
    ptr = kept.data_ptr()
    del kept
    again = store.sample(8, 3, timeout=0)  # the kept tensor's slot came back
    assert again["obs"].data_ptr() == ptr and held["obs"].data_ptr() != ptr


def test_slots_all_held_by_kept_tensors_wait_then_time_out(store):
    kept = [store.sample(8, 3)["pos"], store.sample(8, 3)["pos"][:, 1:]]
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"staging slots stayed held .*timeout=0.2"):
        store.sample(8, 3, timeout=0.2)
    assert time.monotonic() - t0 >= 0.2  # it waited (no assertion on how long beyond)
    dropper = threading.Timer(0.05, kept.pop)  # another thread drops one while sample waits
    dropper.start()
    b = store.sample(8, 3, timeout=5)  # a waiting sample sees the slot come back
    dropper.join()
    assert b["pos"].data_ptr() != kept[0].data_ptr()
    _check_consistent(b["pos"], b["obs"])


def test_a_copy_made_by_to_lets_the_slot_go_with_it(store):
    c = store.sample(8, 3).to("cpu")  # copies: they do not view the slot
    c0 = c["pos"].clone()
    del c
    gc.collect()
    held = [store.sample(8, 3, timeout=0), store.sample(8, 3, timeout=0)]
    assert len(held) == 2 and c0.shape == (8, 3)


def test_pool_release_when_unused_counts_views_and_named_objects():
    with MemoryManager() as mm:
        pool = StagingPool(mm, (16,), torch.uint8, slots=2, tier="host", timeout=0.0, reuse="recent")
        buf = pool.acquire()
        first = buf.slot
        cached = buf.tensor[4:8]  # a view its user caches across hand-outs
        buf.own_views((cached,))
        view = buf.tensor[:2].view(torch.int16)
        buf.release_when_unused()
        assert buf.released and pool.available == 1 and pool.waiting_for_views == 1
        del view
        assert pool.available == 2 and pool.waiting_for_views == 0
        buf = pool.acquire()
        assert buf.slot == first  # the slot taken back last
        user_ref = cached  # a reference to the cached view itself (no new view of the storage)
        buf.release_when_unused()
        assert pool.waiting_for_views == 1
        del user_ref
        assert pool.waiting_for_views == 0
        a, b = pool.acquire(), pool.acquire()
        kept = a.tensor[0:1]
        a.release_when_unused()
        with pytest.raises(TimeoutError, match="all 2 slots stayed held"):
            pool.acquire()
        b.release()  # an explicit release does not wait for views
        assert pool.acquire(timeout=0).slot == b.slot
        del kept
        assert pool.acquire(timeout=0).slot == a.slot
        pool.close()


def test_a_sample_waiting_without_deadline_sees_a_slot_left_to_its_views(store):
    """A sample that waits with no timeout while the last held batch is dropped (its slot then held only
    by a kept tensor) and the tensor goes later: it polls the slot and gets it."""
    b1, b2 = store.sample(8, 3), store.sample(8, 3)
    out: list = []
    waiter = threading.Thread(target=lambda: out.append(store.sample(8, 3, timeout=None)), daemon=True)
    waiter.start()
    time.sleep(0.05)
    kept = b1["pos"]
    del b1  # its slot is left to `kept`; the waiter keeps waiting
    b2.release()  # the other slot: the waiter takes it
    waiter.join(5)
    assert out and out[0]["pos"].data_ptr() != kept.data_ptr()
    out.clear()
    waiter = threading.Thread(target=lambda: out.append(store.sample(8, 3, timeout=None)), daemon=True)
    other = store.sample(8, 3, timeout=0)  # both slots held again: the batch and the kept tensor
    waiter.start()
    time.sleep(0.05)
    ptr = kept.data_ptr()
    del kept  # nothing signals this: the waiter polls
    waiter.join(5)
    assert out and out[0]["pos"].data_ptr() == ptr and other.batch_size == 8

"""``batch.to(device, non_blocking=True)``: the staging slot a loader batch's features live in is not handed
out again before the copies from it complete (an event recorded after them: `samplers.batches.copy_event`,
`graphrl.tensors.StagingBuffer.hold_until`), however the batch is released or dropped. On the CPU a fake
event stands for the CUDA one (`copy_event` is the one place a copy decides whether to wait); the ``gpu``
test does the real non-blocking copy, drops the batch and compares the device values with a fresh gather."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from _fakes import FakeEvent

import samplers.batches
from graphrl.datasets import load_planetoid
from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager
from graphrl.tensors import StagingPool
from samplers import HeteroNodeBatch, LinkLoader, LinkSampler, NeighborLoader, NeighborSampler, NodeBatch
from samplers.batches import copy_event
from samplers.features import FeatureStore
from samplers.hetero_graph import HeteroGraph
from samplers.staging import RowStaging


def span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


# -- the pool's rule (graphrl.tensors) --------------------------------------------------------------------


@pytest.mark.parametrize("how", ["release", "release_when_unused"])
def test_a_slot_held_by_a_copy_is_not_handed_out_until_its_event_completes(mm, how):
    pool = StagingPool(mm, (4,), torch.float32, slots=1, tier="host", owner="t.copy")
    buf = pool.acquire()
    event = FakeEvent()
    buf.hold_until(event)
    getattr(buf, how)()
    assert pool.available == 0 and pool.waiting_for_views == 0  # a copy completes: acquire waits for it
    with pytest.raises(TimeoutError):
        pool.acquire(0)
    assert event.queries >= 2  # polled, never waited for
    event.done = True
    assert pool.available == 1 and pool.waiting_for_views == 0
    again = pool.acquire(0)
    assert again.slot == buf.slot
    again.release()  # no event on this hand-out: free at once
    assert pool.available == 1
    pool.close()


def test_a_slot_waits_for_both_its_views_and_its_copies(mm):
    pool = StagingPool(mm, (4,), torch.float32, slots=1, tier="host", owner="t.copy")
    buf = pool.acquire()
    kept = buf.tensor[1:]
    event = FakeEvent()
    buf.hold_until(event)
    buf.release_when_unused()
    assert pool.waiting_for_views == 1
    event.done = True
    assert pool.available == 0 and pool.waiting_for_views == 1  # `kept` still views it
    del kept
    assert pool.available == 1
    buf = pool.acquire()
    event = FakeEvent()
    buf.hold_until(event)
    buf.release_when_unused()  # no view left: the copy alone holds it
    assert pool.available == 0
    event.done = True
    assert pool.available == 1
    pool.close()


def test_a_waiting_acquire_gets_the_slot_once_the_copy_completes(mm):
    import threading

    pool = StagingPool(mm, (4,), torch.float32, slots=1, tier="host", owner="t.copy")
    buf = pool.acquire()
    event = FakeEvent()
    buf.hold_until(event)
    buf.release()
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(30)), daemon=True)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got
    event.done = True
    waiter.join(30)
    assert len(got) == 1 and got[0].slot == buf.slot
    got[0].release()
    pool.close()


def test_close_waits_for_copies_and_hold_after_release_raises(mm):
    pool = StagingPool(mm, (4,), torch.float32, slots=2, tier="host", owner="t.copy")
    buf = pool.acquire()
    event = FakeEvent()
    buf.hold_until(event)
    buf.release()
    with pytest.raises(ValueError, match=r"slot 0 \(step 0\) was released"):
        buf.hold_until(FakeEvent())
    pool.close()
    assert event.synchronized == 1


# -- RowStaging and its leases ------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["release", "release_when_unused"])
def test_acquire_waits_for_a_lease_held_by_a_copy_and_gets_it_once_the_copy_completes(mm, how):
    import threading

    staging = RowStaging(mm, (3,), torch.float32, slots=1, owner="t.staging")
    first = staging.acquire(4)
    first_span = span(first.tensor)
    event = FakeEvent()
    first.hold_until(event)
    getattr(first, how)()
    del first
    with pytest.raises(TimeoutError):  # the only slot is being copied from: not handed out
        staging.acquire(4, timeout=0.05)
    assert staging.own_buffers == 0  # a copy completes: no buffer of its own, the acquire waits
    threading.Timer(0.1, lambda: setattr(event, "done", True)).start()
    second = staging.acquire(4, timeout=30)
    assert event.done and not second.own_buffer and span(second.tensor) == first_span
    second.release()
    staging.close()


def test_a_lease_both_kept_and_copied_makes_the_next_one_a_buffer_of_its_own(mm):
    staging = RowStaging(mm, (3,), torch.float32, slots=1, owner="t.staging")
    first = staging.acquire(4)
    kept = first.tensor[:2]
    event = FakeEvent()
    first.hold_until(event)
    first.release_when_unused()
    second = staging.acquire(4)  # a user's tensor may be kept forever: no wait
    assert second.own_buffer and not overlaps(span(second.tensor), span(kept))
    second.release()
    del kept
    event.done = True
    staging.close()


def test_a_buffer_of_its_own_held_by_a_copy_is_freed_after_the_copy(mm):
    staging = RowStaging(mm, (3,), torch.float32, slots=1, owner="t.staging")
    pooled = staging.acquire(2)  # held: the next lease gets a buffer of its own
    kept = pooled.tensor[:1]
    pooled.release_when_unused()
    own = staging.acquire(2)
    assert own.own_buffer and staging.own_buffers == 1
    event = FakeEvent()
    own.hold_until(event)
    own.release()  # the user's word, but a copy still reads it: kept until the event completes
    del own
    gc.collect()
    assert staging.own_buffers == 1
    event.done = True
    assert staging.own_buffers == 0  # the copy done and no tensor left: freed
    del kept
    staging.close()
    assert mm.stats()["pinned"].get("t.staging", {"bytes": 0})["bytes"] == 0


def test_staging_close_waits_for_copies_from_buffers_of_their_own(mm):
    staging = RowStaging(mm, (3,), torch.float32, slots=1, owner="t.staging")
    pooled = staging.acquire(2)
    kept = pooled.tensor[:1]
    pooled_event, own_event = FakeEvent(), FakeEvent()
    pooled.hold_until(pooled_event)
    pooled.release_when_unused()
    own = staging.acquire(2)
    assert own.own_buffer
    own.hold_until(own_event)
    own.release_when_unused()
    staging.close()
    assert pooled_event.synchronized == 1 and own_event.synchronized == 1
    del kept


# -- the loaders' batch.to ---------------------------------------------------------------------------------


def test_copy_event_waits_only_for_a_non_blocking_copy_to_cuda():
    assert copy_event(torch.device("cpu"), True) is None
    assert copy_event(torch.device("cpu"), False) is None
    assert copy_event(torch.device("cuda"), False) is None  # a blocking copy completed on return
    assert copy_event(torch.device("meta"), True) is None


@pytest.fixture(scope="module")
def cora(data_root):
    return load_planetoid("cora", data_root)


class Events:
    """`copy_event` replaced by fake events, one per non-blocking copy, kept for the test."""

    def __init__(self) -> None:
        self.made: list[FakeEvent] = []

    def __call__(self, device: torch.device, non_blocking: bool) -> FakeEvent | None:
        if not non_blocking:
            return None
        self.made.append(FakeEvent())
        return self.made[-1]


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_a_dropped_batch_copied_without_blocking_keeps_its_slot_until_the_copy_completes(
        cora, monkeypatch, prefetch):
    events = Events()
    monkeypatch.setattr(samplers.batches, "copy_event", events)
    with MemoryManager() as mm:
        loader = NeighborLoader(cora.graph, torch.ones(cora.graph.num_nodes, dtype=torch.bool), [5, 5],
                                batch_size=64, shuffle=False, seed=0, prefetch=prefetch,
                                features=FeatureStore(cora.features, memory=mm))
        for _ in loader:  # the first epoch grows the pool to its largest batch
            pass
        it = iter(loader)
        batch = next(it)
        copied = span(batch.input_features)
        moved = batch.to("meta", non_blocking=True)  # no view of the slot: only the copy holds it
        assert isinstance(moved, NodeBatch) and moved.input_features.device.type == "meta"
        assert moved.blocks[0].src_nodes.device.type == "meta" and moved.seeds.device.type == "meta"
        assert len(events.made) == 1
        del batch
        for _ in range(12):  # more batches than slots: none is gathered into the copied slot
            b = next(it)
            assert not overlaps(span(b.input_features), copied)
            assert torch.equal(b.input_features, cora.features[b.input_nodes])
        del b
        events.made[0].done = True
        reused = False
        for b in it:  # the copy done: the slot comes back to the pool
            reused |= overlaps(span(b.input_features), copied)
        assert reused
        del b, moved
        it.close()
        loader.close()


def test_a_released_batch_copied_without_blocking_keeps_its_slot_until_the_copy_completes(cora, monkeypatch):
    events = Events()
    monkeypatch.setattr(samplers.batches, "copy_event", events)
    with MemoryManager() as mm:
        loader = NeighborLoader(cora.graph, cora.train_mask, [5, 5], batch_size=16, shuffle=False, seed=0,
                                prefetch=0, features=FeatureStore(cora.features, memory=mm))
        for _ in loader:
            pass
        it = iter(loader)
        batch = next(it)
        copied = span(batch.input_features)
        batch.to("meta", non_blocking=True)
        batch.release()  # the user's word on its own tensors: the copy still holds the slot
        for _ in range(4):
            b = next(it)
            assert not overlaps(span(b.input_features), copied)
            assert torch.equal(b.input_features, cora.features[b.input_nodes])
        it.close()
        loader.close()


def test_to_copies_every_tensor_of_each_batch_type_and_holds_no_buffer():
    n = 30
    rng = np.random.default_rng(2)
    src, dst = torch.from_numpy(rng.integers(0, n, 200)), torch.from_numpy(rng.integers(0, n, 200))
    graph = CSCGraph.from_edges(src, dst, n)
    x = torch.randn(n, 5)
    with MemoryManager() as mm:
        plain = next(iter(NeighborLoader(graph, torch.arange(n), [3, 2], batch_size=8, features=FeatureStore(
            x, memory=mm), labels=torch.arange(n), shuffle=False, seed=0, prefetch=0)))
        moved = plain.to("cpu")
        assert type(moved) is NodeBatch and moved.index == plain.index and moved.ready is None
        for name in ("seeds", "input_features", "labels"):
            assert torch.equal(getattr(moved, name), getattr(plain, name))
        assert [b.edge_ids.tolist() for b in moved.blocks] == [b.edge_ids.tolist() for b in plain.blocks]
        moved.release()  # holds nothing: the original still does
        assert torch.equal(plain.input_features, x[plain.input_nodes])
        meta = plain.to("meta")
        assert all(t.device.type == "meta" for b in meta.blocks for t in (b.src_nodes, b.indptr, b.indices))
        plain.release()

        typed = HeteroGraph.from_edges({"u": n, "i": n},
                                       {("u", "to", "i"): (src, dst), ("i", "by", "u"): (dst, src)})
        hetero = next(iter(NeighborLoader(typed, ("i", torch.arange(n)), [2], batch_size=8, shuffle=False,
                                          seed=0, prefetch=0, features={"u": FeatureStore(x, memory=mm)})))
        hmoved = hetero.to("meta")
        assert type(hmoved) is HeteroNodeBatch and hmoved.seed_type == "i"
        assert hmoved.input_features["u"].device.type == "meta"
        assert all(t.device.type == "meta" for t in hmoved.blocks[0].indptr.values())
        hetero.release()

        link = LinkSampler(NeighborSampler(graph, [2], seed=0), torch.arange(10), torch.arange(10, 20),
                           batch_size=4, item_range=(10, 20), seed=0)
        lbatch = next(iter(LinkLoader(link, FeatureStore(x, memory=mm), prefetch=0)))
        lmoved = lbatch.to("meta")
        assert type(lmoved) is type(lbatch) and lmoved.users.device.type == "meta"
        assert lmoved.input_features.device.type == "meta" and lmoved.index == lbatch.index
        lbatch.release()


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [1, 2])
def test_gpu_non_blocking_copies_of_dropped_batches_equal_a_fresh_gather(cora, prefetch):
    """The real hazard: each batch is copied without blocking behind a long GPU sleep (the copy reads the
    pinned slot well after ``to`` returns), then dropped; the loader gathers many more batches meanwhile."""
    assert torch.cuda.is_available()
    with MemoryManager() as mm:
        store = FeatureStore(cora.features, memory=mm)
        loader = NeighborLoader(cora.graph, torch.ones(cora.graph.num_nodes, dtype=torch.bool), [10, 10],
                                batch_size=32, shuffle=True, seed=1, prefetch=prefetch, features=store)
        moved = []
        for batch in loader:
            assert batch.input_features.is_pinned()
            torch.cuda._sleep(20_000_000)  # ~10 ms: the copy queued behind it reads the slot late
            moved.append(batch.to("cuda", non_blocking=True))
        del batch
        torch.cuda.synchronize()
        assert len(moved) == len(loader) > 3 * (prefetch + 3)
        features = cora.features.cuda()
        for m in moved:
            assert m.input_features.is_cuda and m.blocks[0].src_nodes.is_cuda
            assert torch.equal(m.input_features, features[m.input_nodes]), m.index
        loader.close()

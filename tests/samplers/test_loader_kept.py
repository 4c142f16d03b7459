"""Batches kept past ``next()`` (PyG's and DGL's habit: ``list(loader)``, a cache for evaluation): their
``input_features`` stay their own rows, a kept tensor stays right, ``batch.release()`` still frees at once,
the pool never hands out a slot a user's tensor views, and the memory of kept batches goes with them."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphrl.datasets import load_planetoid
from graphrl.graph import CSCGraph
from graphrl.memory import MemoryBudgetError, MemoryManager
from samplers.features import FeatureStore
from samplers.link import LinkSampler, bipartite_reverse_eids
from samplers.loader import LinkLoader, NeighborLoader, staging_slots
from samplers.neighbor import NeighborSampler
from samplers.staging import RowStaging

OWNER = "features.staging"


@pytest.fixture(scope="module")
def cora(data_root):
    return load_planetoid("cora", data_root)


@pytest.fixture(scope="module")
def cora_store(cora):
    """Cora's features in a store of their own manager, shared by the hypothesis examples (each closes its
    loader, which frees its staging regions)."""
    with MemoryManager() as mm:
        store = FeatureStore(cora.features, memory=mm)
        yield store
        store.close()


def cora_loader(cora, store: FeatureStore, prefetch: int, **kw) -> NeighborLoader:
    kw = {"batch_size": 32, "shuffle": False, "seed": 0, **kw}
    return NeighborLoader(cora.graph, cora.train_mask, [5, 5], features=store, prefetch=prefetch, **kw)


def staging_regions(mm: MemoryManager) -> int:
    return len(mm.regions(owner=OWNER))


def features_of(held: object) -> torch.Tensor:
    """A kept batch's input features, or a kept tensor itself."""
    return held.input_features if hasattr(held, "input_features") else held


def span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_list_of_batches_keeps_every_batchs_own_rows(cora, prefetch):
    x = cora.features
    with MemoryManager() as mm:
        store = FeatureStore(x, memory=mm)
        loader = cora_loader(cora, store, prefetch, batch_size=16)
        batches = list(loader)
        assert len(batches) == len(loader) == 9 > staging_slots(prefetch)  # more than one pool's slots
        for b in batches:
            assert torch.equal(b.input_features, x[b.input_nodes]), b.index
        assert staging_regions(mm) > 1  # a pool retired by growth, or buffers of their own
        if prefetch == 0:
            assert loader.own_buffers > 0
        del batches, b
        gc.collect()
        staging = loader._staging
        assert staging.own_buffers == 0 and staging.held == 0
        assert staging_regions(mm) == 1  # the pool alone: kept batches' memory went with them
        second = [(b.input_nodes, b.input_features) for b in loader]  # the next epoch is right too
        assert all(torch.equal(f, x[n]) for n, f in second)
        loader.close()
        assert staging_regions(mm) == 0  # closed: every staging region freed, kept tensors still readable
        assert all(torch.equal(f, x[n]) for n, f in second)


@pytest.mark.parametrize("prefetch", [0, 1])
def test_a_kept_tensor_stays_right_past_next(cora, prefetch):
    x = cora.features
    loader = cora_loader(cora, x, prefetch, batch_size=16, shuffle=True)
    kept = []
    for batch in loader:
        feats = batch.input_features  # the batch itself is dropped: the tensor alone holds the buffer
        kept.append((batch.input_nodes, feats, feats[1:4]))
    del batch, feats
    assert len(kept) == 9
    for nodes, feats, view in kept:
        assert torch.equal(feats, x[nodes]) and torch.equal(view, x[nodes[1:4]])
    loader.close()


def test_a_plain_loop_reuses_the_pool_and_makes_no_buffer_of_its_own(cora):
    with MemoryManager() as mm:
        loader = cora_loader(cora, FeatureStore(cora.features, memory=mm), prefetch=1, batch_size=8)
        for _ in range(2):  # the first epoch grows the pool to its largest batch; the second is the same
            ptrs = set()
            for batch in loader:
                ptrs.add(batch.input_features.data_ptr())
                assert torch.equal(batch.input_features, cora.features[batch.input_nodes])
        del batch
        assert loader.own_buffers == 0
        assert len(ptrs) == staging_slots(1) and staging_regions(mm) == 1  # the pool's slots, no more


def test_release_gives_the_buffer_back_at_once(cora):
    x = cora.features
    loader = cora_loader(cora, x, prefetch=0)
    assert len([b.index for b in loader]) == 5  # the pool grows to the largest batch: the next epoch uses it
    it = iter(loader)
    b0 = next(it)
    first = b0.input_features.data_ptr()
    b0.release()  # the user's word: its slot is free now, though b0 is still referenced
    b1 = next(it)
    assert torch.equal(b1.input_features, x[b1.input_nodes])
    b2 = next(it)  # b1 is kept (not released): b2 goes to b0's slot
    assert b2.input_features.data_ptr() == first
    rows = min(b0.input_features.shape[0], b2.input_features.shape[0])
    assert torch.equal(b0.input_features[:rows], x[b2.input_nodes[:rows]])  # overwritten, as promised
    assert torch.equal(b1.input_features, x[b1.input_nodes])
    assert loader.own_buffers == 0
    it.close()


@pytest.fixture
def frozen_gc():
    """The objects alive before the test exempt from Python's cyclic collector (`gc.freeze`) during it:
    its ``gc.collect()`` then looks at the objects the test made (every loader, batch and tensor of its
    examples), not at the hundreds of thousands torch, numba and hypothesis made, which took most of an
    example's time. None of the test's objects can be garbage only through an object made before it."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefetch=st.integers(0, 2), seed=st.integers(0, 3),
       actions=st.lists(st.sampled_from(["drop", "keep", "tensor", "view", "release"]), min_size=9,
                        max_size=9))
def test_no_slot_is_handed_out_while_a_users_tensor_views_it(cora, cora_store, frozen_gc, prefetch, seed,
                                                             actions):
    x, mm = cora.features, cora_store.memory
    loader = cora_loader(cora, cora_store, prefetch, batch_size=16, shuffle=True, seed=seed)
    try:
        # (x[nodes], what the user holds: a batch or a tensor); x is never written, so its rows are gathered
        # once per kept item, and every later check compares the held tensor with them
        kept: list[tuple[torch.Tensor, object]] = []
        for i, batch in enumerate(loader):
            new = span(batch.input_features)
            for lo, hi in (span(features_of(h)) for _, h in kept):  # no overlap with a tensor a user holds
                assert hi <= new[0] or new[1] <= lo
            want = x[batch.input_nodes]
            assert torch.equal(batch.input_features, want)
            action = actions[i]
            if action == "keep":
                kept.append((want, batch))
            elif action == "tensor":
                kept.append((want, batch.input_features))
            elif action == "view":
                kept.append((want[2:7], batch.input_features[2:7]))
            elif action == "release":
                batch.release()
            del want
            assert all(torch.equal(features_of(h), rows) for rows, h in kept)
        assert i == 8
        kept = [(rows, features_of(h)) for rows, h in kept]  # the batches go, their tensors stay
        del batch
        assert all(torch.equal(feats, rows) for rows, feats in kept)
        del kept
        gc.collect()
        staging = loader._staging
        assert staging.own_buffers == 0 and staging.held == 0
        assert staging_regions(mm) == 1
    finally:
        loader.close()


def test_link_loader_batches_kept_in_a_list_stay_right():
    rng = np.random.default_rng(0)
    num_users, num_items = 30, 20
    users, items = np.nonzero(rng.random((num_users, num_items)) < 0.4)
    graph = CSCGraph.bipartite(users, items, num_users, num_items)
    m = users.size
    x = torch.randn(num_users + num_items, 8)
    for prefetch in (0, 2):
        pairs = LinkSampler(NeighborSampler(graph, [3, 3], seed=0), users, items + num_users, batch_size=16,
                            exclude="reverse", target_eids=torch.arange(m),
                            reverse_eids=bipartite_reverse_eids(m), seed=1)
        batches = list(LinkLoader(pairs, features=x, prefetch=prefetch))
        assert len(batches) > staging_slots(prefetch)
        assert all(torch.equal(b.input_features, x[b.input_nodes]) for b in batches)


def test_a_budget_with_no_room_for_a_kept_batchs_buffer_raises_instead_of_waiting():
    n = 64
    v = np.arange(n)
    ring = CSCGraph.from_edges((v + 1) % n, v, n)  # fanout [1], even seeds: every batch reads 8 rows
    x = torch.randn(n, 16)
    slot = 8 * 16 * 4
    with MemoryManager(budgets={"pinned": 2 * slot, "host": slot // 2}, device="cpu") as mm:
        loader = NeighborLoader(ring, torch.arange(0, n, 2), [1], batch_size=4, shuffle=False, seed=0,
                                features=FeatureStore(x, memory=mm), prefetch=0)
        it = iter(loader)
        kept = [next(it), next(it)]  # both slots held by the user
        with pytest.raises(MemoryBudgetError, match="kept past the next batch"):
            next(it)
        assert all(torch.equal(b.input_features, x[b.input_nodes]) for b in kept)
        del kept
        gc.collect()
        again = [(b.input_nodes, b.input_features.clone()) for b in loader]  # nothing kept: the pool suffices
        assert len(again) == 8 and all(torch.equal(f, x[nodes]) for nodes, f in again)


def test_device_tier_buffers_follow_their_memory(mm):
    """A device-tier buffer in host memory (no CUDA) is counted like any host buffer: a kept one gets a
    buffer of its own; on a GPU its views cannot be counted, so it goes back at once (the older rule)."""
    staging = RowStaging(mm, (4,), torch.float32, slots=1, tier="device", fallback=(), owner="t.staging")
    lease = staging.acquire(3)
    kept = lease.tensor
    kept.copy_(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    lease.release_when_unused()
    other = staging.acquire(3)
    if kept.device.type == "cpu":
        assert other.own_buffer and other.tensor.data_ptr() != kept.data_ptr()
        other.tensor.fill_(-1)
        assert torch.equal(kept, torch.arange(12, dtype=torch.float32).reshape(3, 4))
    else:
        assert not other.own_buffer and other.tensor.data_ptr() == kept.data_ptr()
    other.release()
    assert staging.own_buffers == 0
    staging.close()

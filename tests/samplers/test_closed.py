"""Use after close on the sampler side: a clear ValueError, and nothing already handed out is lost.

What closes: `FeatureStore.close`, a loader's `close`, `FullGraph.close`, and a `MemoryManager.close`,
which frees every region it owns (the graph's arrays, a feature table, staging buffers).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from graphrl import CSCGraph
from graphrl.memory import MemoryManager
from samplers import FeatureStore, FullGraph, LinkLoader, LinkSampler, NeighborLoader, NeighborSampler


def _edges(n: int = 50, e: int = 300, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, e), rng.integers(0, n, e), n


def _x(n: int = 50) -> torch.Tensor:
    return torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)


# ------------------------------------------------------------------------------------------- samplers
def test_manager_close_frees_the_graph_regions_and_the_sampler_refuses():
    mm = MemoryManager()
    graph = CSCGraph.from_edges(*_edges(), memory=mm)
    sampler = NeighborSampler(graph, [5, 5], seed=0)
    before = sampler.sample(torch.arange(10))
    kept = [(b.src_nodes.clone(), b.indices.clone(), b.edge_ids.clone()) for b in before]
    mm.close()
    assert graph.regions and all(r.freed for r in graph.regions)
    with pytest.raises(ValueError, match=r"sampler's graph reads memory-manager regions that were freed "
                                         r"\(graph\.indptr.*MemoryManager was closed"):
        sampler.sample(torch.arange(10))
    # blocks sampled before the close are intact
    for b, (src, ind, eid) in zip(before, kept, strict=True):
        assert torch.equal(b.src_nodes, src) and torch.equal(b.indices, ind) and torch.equal(b.edge_ids, eid)
    with pytest.raises(ValueError, match=r"graph reads memory-manager regions that were freed"):
        NeighborSampler(graph, [5])


def test_graph_free_makes_the_sampler_refuse_too():
    with MemoryManager() as mm:
        graph = CSCGraph.from_edges(*_edges(), memory=mm)
        sampler = NeighborSampler(graph, [3], seed=0)
        sampler.sample(torch.tensor([1]))
        graph.free()
        with pytest.raises(ValueError, match="were freed"):
            sampler.sample(torch.tensor([1]))


def test_a_graph_without_memory_has_no_regions_to_close():
    graph = CSCGraph.from_edges(*_edges())
    assert NeighborSampler(graph, [3], seed=0).sample(torch.tensor([1]))[-1].dst_nodes.tolist() == [1]


def test_link_sampler_over_a_closed_manager_refuses():
    mm = MemoryManager()
    graph = CSCGraph.bipartite(np.array([0, 1, 2]), np.array([0, 1, 1]), 3, 2, memory=mm)
    link = LinkSampler(NeighborSampler(graph, [2], seed=0), np.array([0, 1, 2]), np.array([3, 4, 4]),
                       batch_size=2, seed=0)
    first = next(iter(link))
    mm.close()
    with pytest.raises(ValueError, match="were freed"):
        next(iter(link))
    assert first.seeds.numel() > 0  # the batch handed out before is intact


# ------------------------------------------------------------------------------------------- features
def test_feature_store_use_after_close():
    x = _x()
    store = FeatureStore(x, memory=MemoryManager(), staging_slots=2)
    rows = store.gather(torch.tensor([4, 2])).clone()
    out = torch.empty(2, 3)
    store.gather(torch.tensor([1, 0]), out=out)
    store.close()
    assert store.closed
    for call in (lambda: store.gather(torch.tensor([0])),
                 lambda: store.gather(torch.tensor([0]), out=torch.empty(1, 3)),
                 lambda: store.gather_into(np.array([0]), torch.empty(1, 3)),
                 lambda: store.staging(slots=1)):
        with pytest.raises(ValueError, match="this FeatureStore is closed; it cannot be used"):
            call()
    # what it had handed out is intact, and its statistics stay readable
    assert torch.equal(rows, x[[4, 2]]) and torch.equal(out, x[[1, 0]])
    assert store.stats()["gathered_rows"] == 4
    store.close()  # idempotent


def test_feature_store_over_a_closed_manager_refuses():
    mm = MemoryManager()
    store = FeatureStore(_x(), memory=mm)
    assert store.gather(torch.tensor([1])).tolist() == [[3.0, 4.0, 5.0]]
    mm.close()
    with pytest.raises(ValueError, match="the MemoryManager of this FeatureStore is closed"):
        store.gather(torch.tensor([1]))
    store.close()


# ------------------------------------------------------------------------------------------- loaders
def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t.name.startswith("graphrl-") and t.name.endswith("loader") and t.is_alive()]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_neighbor_loader_use_after_close(prefetch):
    graph = CSCGraph.from_edges(*_edges())
    x = _x()
    loader = NeighborLoader(graph, torch.arange(20), [3], batch_size=4, features=x, seed=0, prefetch=prefetch)
    it = iter(loader)
    batch = next(it)
    seeds = batch.seeds.clone()
    blocks = [b.src_nodes.clone() for b in batch.blocks]
    loader.close()
    with pytest.raises(ValueError, match="closed during the epoch after 1 of 5 batches"):
        next(it)  # the live iterator is stopped, its thread gone: not a normal end of the epoch
    assert not _loader_threads()
    with pytest.raises(ValueError, match="this NeighborLoader is closed; it cannot be used"):
        iter(loader)
    # the batch handed out keeps its seeds and blocks
    assert torch.equal(batch.seeds, seeds)
    assert all(torch.equal(b.src_nodes, s) for b, s in zip(batch.blocks, blocks, strict=True))
    # the FeatureStore the loader made from the tensor is closed with it; the tensor is untouched
    assert loader.features.closed and torch.equal(x, _x())
    loader.close()  # idempotent


def test_loader_over_a_closed_feature_store_refuses():
    graph = CSCGraph.from_edges(*_edges())
    store = FeatureStore(_x())
    loader = NeighborLoader(graph, torch.arange(8), [2], batch_size=4, features=store, seed=0, prefetch=1)
    assert len(list(loader)) == 2
    store.close()
    with pytest.raises(ValueError, match="the FeatureStore of this NeighborLoader is closed"):
        iter(loader)
    loader.close()


def test_a_loader_does_not_close_a_feature_store_it_was_given():
    graph = CSCGraph.from_edges(*_edges())
    with FeatureStore(_x()) as store:
        loader = NeighborLoader(graph, torch.arange(8), [2], batch_size=4, features=store, seed=0)
        loader.close()
        assert not store.closed and store.gather(torch.tensor([0])).shape == (1, 3)


def test_link_loader_use_after_close():
    graph = CSCGraph.bipartite(np.array([0, 1, 2]), np.array([0, 1, 1]), 3, 2)
    link = LinkSampler(NeighborSampler(graph, [2], seed=0), np.array([0, 1, 2]), np.array([3, 4, 4]),
                       batch_size=2, seed=0)
    loader = LinkLoader(link, prefetch=1)
    first = next(iter(loader))
    loader.close()
    with pytest.raises(ValueError, match="this LinkLoader is closed"):
        iter(loader)
    assert first.users.numel() > 0
    assert not _loader_threads()


# ------------------------------------------------------------------------------------------- full graph
def test_full_graph_over_a_closed_manager_refuses():
    graph = CSCGraph.from_edges(*_edges())
    mm = MemoryManager(device="cpu")
    fg = FullGraph(graph, memory=mm)
    h = torch.ones(50, 2)
    out = fg(h).clone()
    mm.close()
    with pytest.raises(ValueError, match="the MemoryManager of this FullGraph is closed"):
        fg(h)
    with pytest.raises(ValueError, match="the MemoryManager of this FullGraph is closed"):
        fg.multiply(h)
    assert out.shape == (50, 2)
    fg.close()
    with pytest.raises(ValueError, match="this FullGraph is closed"):
        fg(h)

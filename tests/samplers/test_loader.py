"""NeighborLoader and LinkLoader: batching, identical batches with and without prefetch, the staging
reuse rule, exceptions from the background thread, early abandonment, budgets, bad input."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryBudgetError, MemoryManager
from samplers.batches import LoadedLinkBatch, NodeBatch
from samplers.features import FeatureStore
from samplers.link import LinkSampler, bipartite_reverse_eids
from samplers.loader import LinkLoader, NeighborLoader, staging_slots
from samplers.neighbor import NeighborSampler

N = 400


@pytest.fixture(scope="module")
def graph() -> CSCGraph:
    rng = np.random.default_rng(0)
    return CSCGraph.from_edges(rng.integers(0, N, 4000), rng.integers(0, N, 4000), N)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(N, 6)


def ring(n: int = 64) -> CSCGraph:
    """Edge v+1 -> v: with fanout [1] a batch of even seeds reads exactly 2B distinct input nodes."""
    v = np.arange(n)
    return CSCGraph.from_edges((v + 1) % n, v, n)


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("graphrl-") and "loader" in t.name]


def snapshot(batch) -> tuple:
    blocks = [(b.src_nodes.clone(), b.indptr.clone(), b.indices.clone(), b.edge_ids.clone())
              for b in batch.blocks]
    feats = None if batch.input_features is None else batch.input_features.clone()
    return batch.seeds.clone(), blocks, feats


def same(a: tuple, b: tuple) -> bool:
    if not torch.equal(a[0], b[0]) or len(a[1]) != len(b[1]):
        return False
    for u, v in zip(a[1], b[1], strict=True):
        if not all(torch.equal(p, q) for p, q in zip(u, v, strict=True)):
            return False
    return (a[2] is None and b[2] is None) or torch.equal(a[2], b[2])


# ------------------------------------------------------------------------------------------- batches
def test_neighbor_loader_batches_cover_the_seeds_with_features_and_labels(graph, x):
    labels = torch.arange(N) % 7
    train = torch.arange(0, N, 3)
    loader = NeighborLoader(graph, train, [4, 3], batch_size=32, features=x, labels=labels, seed=1)
    assert len(loader) == -(-train.numel() // 32)
    for _ in range(2):
        seen = []
        for i, batch in enumerate(loader):
            assert isinstance(batch, NodeBatch) and batch.index == i
            assert len(batch.blocks) == 2 and torch.equal(batch.blocks[-1].dst_nodes, batch.seeds)
            assert torch.equal(batch.input_features, x[batch.input_nodes])
            assert torch.equal(batch.labels, labels[batch.seeds])
            seen.append(batch.seeds)
        assert i == len(loader) - 1
        assert sorted(torch.cat(seen).tolist()) == train.tolist()
    assert not loader_threads()


def test_no_shuffle_drop_last_and_a_bool_mask(graph):
    mask = torch.zeros(N, dtype=torch.bool)
    mask[10:110] = True
    loader = NeighborLoader(graph, mask, [2], batch_size=30, shuffle=False, drop_last=True, seed=0,
                            prefetch=0)
    assert len(loader) == 3
    got = [b.seeds for b in loader]
    assert torch.equal(torch.cat(got), torch.arange(10, 100))
    assert all(b.input_features is None for b in loader)


@pytest.mark.parametrize("fanouts", [[3, 2], [-1]])
def test_prefetch_gives_the_same_batches_as_no_prefetch(graph, x, fanouts):
    runs = {}
    for prefetch in (0, 1, 2):
        loader = NeighborLoader(graph, torch.arange(N), fanouts, batch_size=50, features=FeatureStore(x),
                                seed=7, prefetch=prefetch)
        runs[prefetch] = [[snapshot(b) for b in loader] for _ in range(2)]  # two epochs
    for prefetch in (1, 2):
        for e0, e1 in zip(runs[0], runs[prefetch], strict=True):
            assert len(e0) == len(e1) == 8
            assert all(same(a, b) for a, b in zip(e0, e1, strict=True))
    assert not same(runs[0][0][0], runs[0][1][0])  # epochs differ (shuffled)


# ------------------------------------------------------------------------------------------- staging reuse
def test_held_batch_is_not_overwritten_while_the_thread_runs_ahead_then_its_buffer_is_reused():
    g = ring()
    feats = FeatureStore(torch.randn(64, 16))
    x = feats.table
    gathered = threading.Semaphore(0)
    original = feats.gather_into

    def counting(ids, out):
        result = original(ids, out)
        gathered.release()
        return result

    feats.gather_into = counting  # instance attribute: the loader calls this one
    loader = NeighborLoader(g, torch.arange(0, 64, 2), [1], batch_size=4, features=feats, shuffle=False,
                            prefetch=2, seed=0)
    it = iter(loader)
    first = next(it)
    # batches 1, 2 wait in the queue and batch 3 is gathered (its put blocks): 4 gathers in all
    for _ in range(4):
        assert gathered.acquire(timeout=30)
    assert torch.equal(first.input_features, x[first.input_nodes])  # untouched while held
    ptrs = {first.input_features.data_ptr()}
    del first  # nothing views the first batch's buffer once next() gives it back: it can be reused
    second = next(it)
    assert gathered.acquire(timeout=30)
    assert torch.equal(second.input_features, x[second.input_nodes])
    ptrs.add(second.input_features.data_ptr())
    del second
    rest = [(b.input_features.data_ptr(), torch.equal(b.input_features, x[b.input_nodes])) for b in it]
    assert all(ok for _, ok in rest) and len(rest) == 6
    # prefetch + 3 buffers (staging_slots(2)), reused round-robin: no fresh tensor per batch
    assert len({p for p, _ in rest} | ptrs) == staging_slots(2) == 5
    assert loader.own_buffers == 0


def test_release_early_and_buffers_all_returned_after_an_epoch(graph, x):
    with MemoryManager() as mm:
        loader = NeighborLoader(graph, torch.arange(N), [2], batch_size=64,
                                features=FeatureStore(x, memory=mm), seed=0, prefetch=1)
        for batch in loader:
            batch.release()
            batch.release()
        pool = loader._staging._pool
        assert pool.available == pool.slots == staging_slots(1) == 4
        assert mm.stats()["pinned"]["features.staging"]["regions"] >= 1
        loader.close()
        assert mm.stats()["pinned"]["features.staging"]["bytes"] == 0


# ------------------------------------------------------------------------------------------- threads
@pytest.mark.parametrize("prefetch", [0, 2])
def test_an_exception_in_sampling_reaches_the_consumer_in_order(graph, prefetch):
    loader = NeighborLoader(graph, torch.arange(N), [2], batch_size=40, seed=0, prefetch=prefetch)
    calls = []
    sample = loader.sampler.sample

    def failing(seeds, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom in batch 2")
        return sample(seeds, *args, **kwargs)

    loader.sampler.sample = failing
    it = iter(loader)
    thread = it.thread
    assert [next(it).index, next(it).index] == [0, 1]
    with pytest.raises(RuntimeError, match="boom in batch 2"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    if thread is not None:
        thread.join(30)
        assert not thread.is_alive()
    loader.sampler.sample = sample
    assert len(list(loader)) == 10  # the loader still works


def test_a_budget_error_in_the_thread_reaches_the_consumer(graph, x):
    with MemoryManager(budgets={"pinned": 100, "host": 100}, device="cpu") as mm:  # also with CUDA
        feats = FeatureStore(x, memory=mm)  # the table fits the device tier; staging does not fit
        loader = NeighborLoader(graph, torch.arange(N), [2], batch_size=40, features=feats, seed=0,
                                prefetch=1)
        with pytest.raises(MemoryBudgetError, match="features.staging"):
            next(iter(loader))
        assert not loader_threads()


def test_abandoning_an_epoch_stops_the_thread_and_frees_its_batches(graph, x):
    loader = NeighborLoader(graph, torch.arange(N), [3, 3], batch_size=20, features=x, seed=0, prefetch=2)
    for i, batch in enumerate(loader):
        if batch.index == i == 1:
            break  # the loop drops the iterator: its finaliser stops the thread
    del batch  # the last batch's buffer returns once nothing views it
    gc.collect()
    assert not loader_threads()
    pool = loader._staging._pool
    assert pool.available == pool.slots

    it = iter(loader)
    thread = it.thread
    next(it)
    del it
    gc.collect()
    thread.join(30)
    assert not thread.is_alive() and not loader_threads()

    a = iter(loader)
    next(a)
    b = iter(loader)  # a new epoch closes the previous iterator
    assert a.thread is not None and not a.thread.is_alive()
    with pytest.raises(StopIteration):
        next(a)
    assert sum(1 for _ in b) == len(loader)
    assert not loader_threads()


def test_close_in_a_with_block(graph):
    loader = NeighborLoader(graph, torch.arange(N), [2], batch_size=10, seed=0, prefetch=3)
    with iter(loader) as it:
        next(it)
        thread = it.thread
    assert not thread.is_alive()
    with loader:
        next(iter(loader))
    assert not loader_threads()


# ------------------------------------------------------------------------------------------- link loader
def _link(seed: int = 0, batch_size: int = 16):
    rng = np.random.default_rng(seed)
    num_users, num_items = 30, 20
    mask = rng.random((num_users, num_items)) < 0.3
    mask[np.arange(num_users), rng.integers(0, num_items, num_users)] = True
    mask[np.arange(num_users), (np.arange(num_users) + 1) % num_items] = False
    users, items = np.nonzero(mask)
    g = CSCGraph.bipartite(users, items, num_users, num_items)
    m = users.size
    return g, LinkSampler(NeighborSampler(g, [3, 3], seed=seed), users, items + num_users,
                          batch_size=batch_size, num_negatives=2, exclude="reverse",
                          target_eids=torch.arange(m), reverse_eids=bipartite_reverse_eids(m), seed=seed + 1)


def test_link_loader_gives_the_link_samplers_batches_with_features():
    g, plain = _link()
    want = list(plain)
    x = torch.randn(g.num_nodes, 5)
    for prefetch in (0, 2):
        _, link = _link()
        loader = LinkLoader(link, features=x, prefetch=prefetch)
        assert len(loader) == len(plain)
        got = []
        for batch in loader:
            assert isinstance(batch, LoadedLinkBatch)
            assert torch.equal(batch.input_features, x[batch.input_nodes])
            got.append(batch)
        assert len(got) == len(want)
        for a, b in zip(want, got, strict=True):
            for name in ("users", "pos_items", "neg_items", "user_index", "neg_index", "pair_ids",
                         "excluded_eids"):
                assert torch.equal(getattr(a, name), getattr(b, name)), name
            assert all(torch.equal(p.edge_ids, q.edge_ids) for p, q in zip(a.blocks, b.blocks, strict=True))
        assert loader.sampled_edges == link.sampled_edges > 0 and loader.sample_seconds > 0
    _, link = _link()
    batches = list(LinkLoader(link))
    assert batches[0].input_features is None and batches[0].index == 0


def test_bad_arguments(graph, x):
    seeds = torch.arange(10)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        NeighborLoader(graph, seeds, [2], batch_size=0)
    with pytest.raises(ValueError, match="prefetch must be an int >= 0"):
        NeighborLoader(graph, seeds, [2], batch_size=4, prefetch=-1)
    with pytest.raises(ValueError, match=r"seeds: 1 of 2 ids outside \[0, num_nodes=400\), first 400"):
        NeighborLoader(graph, [3, 400], [2], batch_size=4)
    with pytest.raises(TypeError, match="seeds must be an integer tensor"):
        NeighborLoader(graph, torch.tensor([1.0]), [2], batch_size=4)
    with pytest.raises(ValueError, match="mask must have shape"):
        NeighborLoader(graph, torch.ones(5, dtype=torch.bool), [2], batch_size=4)
    with pytest.raises(ValueError, match="features has 10 rows"):
        NeighborLoader(graph, seeds, [2], batch_size=4, features=torch.randn(10, 2))
    with pytest.raises(ValueError, match="labels must have shape"):
        NeighborLoader(graph, seeds, [2], batch_size=4, labels=torch.zeros(3))
    with pytest.raises(TypeError, match="features must be"):
        NeighborLoader(graph, seeds, [2], batch_size=4, features="x")
    with pytest.raises(TypeError, match="graph must be a CSCGraph"):
        NeighborLoader(None, seeds, [2], batch_size=4)
    with pytest.raises(ValueError, match="fanouts"):
        NeighborLoader(graph, seeds, [], batch_size=4)
    with pytest.raises(TypeError, match="link_sampler must be a LinkSampler"):
        LinkLoader(NeighborSampler(graph, [2]))
    g, link = _link()
    with pytest.raises(ValueError, match="features has 3 rows"):
        LinkLoader(link, features=torch.randn(3, 2))
    assert len(NeighborLoader(graph, torch.empty(0, dtype=torch.int64), [2], batch_size=4)) == 0
    assert list(NeighborLoader(graph, torch.empty(0, dtype=torch.int64), [2], batch_size=4)) == []

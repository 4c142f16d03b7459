"""samplers.distributed in this process: blocks identical to NeighborSampler, one request per owner per
layer, the feature store's rows, cache and counters, and refusals."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphrl.datasets import synthetic_graph
from graphrl.graph import CSCGraph
from graphrl.partition import PartitionError, graph_fingerprint, write_partitions
from samplers import LaborSampler, NeighborSampler
from samplers.distributed import (
    DistFeatureStore,
    DistLaborSampler,
    DistNeighborSampler,
    LocalOwners,
    OwnerError,
)

N, E, P = 1500, 24000, 3


@pytest.fixture(scope="module")
def graph() -> CSCGraph:
    g = synthetic_graph(N, E, "powerlaw", seed=2)  # hubs: rows above 64 and 4096 edges take other paths
    rng = np.random.default_rng(0)
    w = rng.random(E).astype(np.float32)
    w[rng.random(E) < 0.2] = 0  # zero weights: never drawn
    src = g.indices.numpy()[np.argsort(g.csc_edge_ids().numpy())]
    dst = np.repeat(np.arange(N), np.diff(g.indptr.numpy()))[np.argsort(g.csc_edge_ids().numpy())]
    return CSCGraph.from_edges(torch.from_numpy(src.astype(np.int64)), torch.from_numpy(dst), N,
                               weights=torch.from_numpy(w))


@pytest.fixture(scope="module")
def owners(graph, tmp_path_factory) -> LocalOwners:
    path = tmp_path_factory.mktemp("dist") / "parts"
    feats = np.arange(N * 2, dtype=np.float32).reshape(N, 2)
    write_partitions(graph, path, P, method="ldg", seed=1, features=feats, labels=np.arange(N) % 5)
    return LocalOwners(str(path), expect=graph_fingerprint(graph))


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for f in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("replace", [False, True])
def test_blocks_equal_neighbor_sampler(graph, owners, weighted, replace):
    fanouts = [4, -1, 6] if not replace else [4, 3, 6]
    ref = NeighborSampler(graph, fanouts, replace=replace, weights=True if weighted else None, seed=11)
    dist = DistNeighborSampler(owners, fanouts, replace=replace, weighted=weighted, seed=11)
    rng = np.random.default_rng(3)
    hubs = torch.argsort(graph.in_degrees(), descending=True)[:3]
    for _ in range(3):  # successive calls continue the same stream
        seeds = torch.cat([torch.from_numpy(rng.integers(0, N, 40)), hubs, hubs[:1]])  # a duplicate too
        _same(ref.sample(seeds), dist.sample(seeds))
    assert dist.sampled_edges == ref.sampled_edges > 0


def test_one_request_per_owner_per_layer(graph, owners):
    dist = DistNeighborSampler(owners, [3, 3], seed=0)
    before = owners.stats.requests
    seeds = torch.from_numpy(np.flatnonzero(owners.book.node_part == 1)[:5])  # one owner at layer 1
    blocks = dist.sample(seeds)
    touched = len(set(owners.book.node_part[blocks[0].dst_nodes.numpy()].tolist()))
    assert owners.stats.requests - before == 1 + touched
    assert dist.sample(torch.empty(0, dtype=torch.int64))[0].num_edges == 0


def test_refusals(graph, owners, tmp_path):
    with pytest.raises(ValueError, match="seeds"):
        DistNeighborSampler(owners, [2]).sample(torch.tensor([N]))
    with pytest.raises(ValueError, match="fanouts"):
        DistNeighborSampler(owners, [])
    plain = tmp_path / "plain"
    write_partitions(synthetic_graph(50, 200), plain, 2, method="ldg")
    with pytest.raises(ValueError, match="holds no edge weights"):
        DistNeighborSampler(LocalOwners(str(plain)), [2], weighted=True)
    with pytest.raises(ValueError, match="holds no features"):
        DistFeatureStore(LocalOwners(str(plain)))
    with pytest.raises(PartitionError, match="another graph"):
        LocalOwners(str(plain), expect=graph_fingerprint(graph))
    with pytest.raises(OwnerError, match="partition owner 0 .* failed rows"):
        owners.call("rows", {0: (np.flatnonzero(owners.book.node_part == 1)[:1], "features")})
    with pytest.raises(ValueError, match=r"part: part -1 outside \[0, 3\)"):
        owners.restart(-1)  # not the last owner
    with pytest.raises(TypeError, match="part: a part must be an int, got float 1.0"):
        owners.restart(1.0)


def test_feature_store_rows_cache_and_counters(graph, owners):
    store = DistFeatureStore(owners, cache_rows=50)
    deg = np.bincount(graph.indices.numpy(), minlength=N)  # out-degrees
    assert store.cache_ids.shape[0] == 50 and deg[store.cache_ids].min() >= np.sort(deg)[-50]
    ids = torch.cat([torch.from_numpy(store.cache_ids[:10]), torch.tensor([7, 7, 1499, 0])])
    before = owners.stats.requests
    rows = store.fetch(ids)
    assert torch.equal(rows, torch.stack([2 * ids, 2 * ids + 1], 1).float())
    assert store.stats.hits + store.stats.misses == 14 and store.stats.hits >= 10
    parts = {int(owners.book.node_part[v]) for v in (7, 1499, 0) if v not in set(store.cache_ids.tolist())}
    assert owners.stats.requests - before == store.stats.requests == len(parts)
    missed = store.stats.misses
    assert store.stats.bytes_moved == missed * 8 + missed * 8  # ids out (int64) and 2 float32 per row back
    labels = DistFeatureStore(owners, "labels").fetch(torch.tensor([3, 9, 11]))
    assert labels.tolist() == [3, 4, 1] and labels.dtype == torch.int64
    assert 0 < store.stats.hit_rate < 1


def test_restart_rebuilds_from_the_folder(graph, owners):
    dist = DistNeighborSampler(owners, [5], seed=4)
    seeds = torch.arange(0, N, 7)
    first = dist.sample(seeds)
    owners.restart(1)
    ref = NeighborSampler(graph, [5], seed=4)
    _same(ref.sample(seeds), first)
    _same(ref.sample(seeds), dist.sample(seeds))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 60), e=st.integers(0, 400), parts=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       fanouts=st.lists(st.integers(-1, 6), min_size=1, max_size=3), replace=st.booleans(),
       weighted=st.booleans())
def test_any_graph_and_partition_give_the_same_blocks(tmp_path, n, e, parts, seed, fanouts, replace,
                                                      weighted):
    rng = np.random.default_rng(seed)
    w = torch.from_numpy(rng.random(e).astype(np.float32) * (rng.random(e) < 0.8))
    src, dst = (torch.from_numpy(rng.integers(0, n, e)) for _ in range(2))
    g = CSCGraph.from_edges(src, dst, n, weights=w)
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "parts"  # one folder per example
    write_partitions(g, path, min(parts, n), method="ldg", seed=seed)
    fan = [abs(k) if replace else k for k in fanouts]
    ref = NeighborSampler(g, fan, replace=replace, weights=True if weighted else None, seed=seed)
    dist = DistNeighborSampler(LocalOwners(str(path)), fan, replace=replace, weighted=weighted, seed=seed)
    for _ in range(2):
        seeds = torch.from_numpy(rng.integers(0, n, int(rng.integers(0, 12))))
        _same(ref.sample(seeds), dist.sample(seeds))


def test_a_failed_owner_is_named_and_its_batch_comes_again_whole(graph, owners, monkeypatch):
    ref = NeighborSampler(graph, [4, 4], seed=6)
    dist = DistNeighborSampler(owners, [4, 4], seed=6)
    seeds = torch.arange(0, N, 11)

    def dead(*args):
        raise ConnectionError("owner process gone")

    monkeypatch.setattr(owners.owners[2], "sample", dead)
    with pytest.raises(OwnerError, match="partition owner 2 .* failed sample: owner process gone") as err:
        dist.sample(seeds)
    assert err.value.part == 2 and dist.sampled_edges == 0
    owners.restart(2)  # a fresh owner from the folder
    _same(ref.sample(seeds), dist.sample(seeds))  # the failed call's batch, whole


@pytest.mark.parametrize(("weighted", "layer_dependency"), [(False, False), (True, False), (False, True)])
def test_labor0_blocks_equal_labor_sampler(graph, owners, weighted, layer_dependency):
    ref = LaborSampler(graph, [4, -1, 6], importance_sampling=0, weights=True if weighted else None,
                       layer_dependency=layer_dependency, seed=5)
    dist = DistLaborSampler(owners, [4, -1, 6], weighted=weighted, layer_dependency=layer_dependency, seed=5)
    hubs = torch.argsort(graph.in_degrees(), descending=True)[:3]
    for lo in (0, 40):
        seeds = torch.cat([torch.arange(lo, lo + 40), hubs])
        a, b = ref.sample(seeds), dist.sample(seeds)
        _same(a, b)
        for x, y in zip(a, b, strict=True):
            assert (x.edge_weights is None) == (y.edge_weights is None) == (not weighted)
            assert x.edge_weights is None or torch.equal(x.edge_weights, y.edge_weights)


def test_restart_from_a_folder_written_again_is_refused(tmp_path):
    small = synthetic_graph(200, 1500, "powerlaw", seed=6)
    path = tmp_path / "parts"
    write_partitions(small, path, 3, method="ldg", seed=0)
    owners = LocalOwners(str(path))
    seeds = torch.arange(0, 200, 3)
    dist, ref = DistNeighborSampler(owners, [4, 4], seed=2), NeighborSampler(small, [4, 4], seed=2)
    _same(ref.sample(seeds), dist.sample(seeds))
    import shutil

    shutil.rmtree(path)
    write_partitions(small, path, 3, method="ldg", seed=1)  # same graph, other parts: the book would lie
    for p in range(3):
        with pytest.raises(PartitionError, match="written again since its partition book was read"):
            owners.restart(p)
    _same(ref.sample(seeds), dist.sample(seeds))  # the old owners were kept: no batch short
    fresh = DistNeighborSampler(LocalOwners(str(path)), [4, 4], seed=2)  # the new folder, started anew
    _same(NeighborSampler(small, [4, 4], seed=2).sample(seeds), fresh.sample(seeds))


def test_sampler_pickles_and_continues_the_stream(graph, owners):
    import pickle

    dist = DistNeighborSampler(owners, [3, 2], seed=8)
    seeds = torch.arange(0, N, 11)
    dist.sample(seeds)
    copy = pickle.loads(pickle.dumps(dist))
    _same(dist.sample(seeds), copy.sample(seeds))


def test_owners_of_another_type_are_refused_by_name(owners):
    with pytest.raises(TypeError, match="owners must be LocalOwners or RayOwners .* got str 'parts/'"):
        DistNeighborSampler("parts/", [2])
    with pytest.raises(TypeError, match="owners must be LocalOwners or RayOwners .* got NoneType"):
        DistFeatureStore(None)
    assert DistFeatureStore(owners, cache_rows=np.int64(3)).cache_ids.shape == (3,)


@pytest.mark.parametrize(("per", "in_flight"), [(3, 2), (1, 1), (4, 3)])
def test_sample_many_equals_successive_calls_with_one_request_per_owner_per_layer(graph, owners, per,
                                                                                  in_flight):
    rng = np.random.default_rng(per)
    batches = [torch.from_numpy(rng.integers(0, N, int(rng.integers(0, 30)))) for _ in range(7)]
    batches[2] = torch.empty(0, dtype=torch.int64)  # an empty batch among others
    ref = NeighborSampler(graph, [4, -1, 3], weights=True, seed=12)
    dist = DistNeighborSampler(owners, [4, -1, 3], weighted=True, seed=12)
    _same(ref.sample(batches[0]), dist.sample(batches[0]))  # a call before the stream: the stream goes on
    before = owners.stats.requests
    got = list(dist.sample_many(batches[1:], batches_per_request=per, in_flight=in_flight))
    assert len(got) == 6
    for seeds, blocks in zip(batches[1:], got, strict=True):
        _same(ref.sample(seeds), blocks)
    waves = -(-6 // per)
    assert owners.stats.requests - before <= waves * 3 * P  # one request per owner per layer per group
    assert dist.sampled_edges == ref.sampled_edges and dist.profile.calls == 7
    _same(ref.sample(batches[3]), dist.sample(batches[3]))  # the counter advanced by the batches yielded


def test_sample_many_labor_weights_equal_labor_sampler(graph, owners):
    ref = LaborSampler(graph, [4, 6], importance_sampling=0, weights=True, seed=3)
    dist = DistLaborSampler(owners, [4, 6], weighted=True, seed=3)
    batches = [torch.arange(lo, lo + 25) for lo in range(0, 125, 25)]
    for seeds, b in zip(batches, dist.sample_many(batches, batches_per_request=2), strict=True):
        a = ref.sample(seeds)
        _same(a, b)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x.edge_weights, y.edge_weights)


def test_sample_many_failure_yields_the_batches_before_and_counts_only_them(graph, owners, monkeypatch):
    ref = NeighborSampler(graph, [3, 3], seed=21)
    dist = DistNeighborSampler(owners, [3, 3], seed=21)
    batches = [torch.arange(lo, N, 37) for lo in range(6)]
    real = owners.owners[0].sample
    calls = []

    def flaky(*args):
        calls.append(1)
        if len(calls) == 3:  # the second group's first layer
            raise ConnectionError("owner process gone")
        return real(*args)

    monkeypatch.setattr(owners.owners[0], "sample", flaky)
    got = []
    with pytest.raises(OwnerError, match="partition owner 0 .* owner process gone"):
        for blocks in dist.sample_many(batches, batches_per_request=2, in_flight=1):
            got.append(blocks)
    assert len(got) == 2
    monkeypatch.setattr(owners.owners[0], "sample", real)
    for seeds, blocks in zip(batches, [*got, *dist.sample_many(batches[2:])], strict=True):
        _same(ref.sample(seeds), blocks)  # the failed group's batches come again, whole


def test_sample_many_refusals(owners):
    dist = DistNeighborSampler(owners, [2], seed=0)
    with pytest.raises(ValueError, match="batches_per_request must be an int >= 1, got 0"):
        next(dist.sample_many([torch.arange(3)], batches_per_request=0))
    with pytest.raises(ValueError, match="in_flight must be an int >= 1, got True"):
        next(dist.sample_many([torch.arange(3)], in_flight=True))
    stream = dist.sample_many([torch.arange(3)] * 3, batches_per_request=1)
    next(stream)
    with pytest.raises(RuntimeError, match="while a sample_many"):
        dist.sample(torch.arange(3))
    with pytest.raises(RuntimeError, match="another stream"):
        next(dist.sample_many([torch.arange(3)]))
    stream.close()  # closed early: the counter holds the one batch read
    assert dist.profile.calls >= 1 and dist.sample(torch.arange(3))[0].num_edges >= 0
    with pytest.raises(ValueError, match="seeds"):
        list(dist.sample_many([torch.tensor([N])]))


@settings(max_examples=25, deadline=None)
@given(k=st.integers(0, 4), rows=st.integers(0, 30), wide=st.booleans(),
       kind=st.sampled_from(["neighbor", "labor"]), fanout=st.integers(-1, 2**40),
       flags=st.tuples(st.booleans(), st.booleans()), seed=st.integers(0, 2**32))
def test_a_packed_request_unpacks_to_its_arguments(k, rows, wide, kind, fanout, flags, seed):
    from samplers.distributed.assemble import pack_request, unpack_request

    rng = np.random.default_rng(seed)
    dst = rng.integers(0, 2**31 - 1, rows, dtype=np.int64 if wide else np.int32)
    bounds = np.sort(rng.integers(0, rows + 1, k + 1))
    keys = rng.integers(0, 2**64, (k, 2), dtype=np.uint64)  # columns: strided, as the sampler slices them
    got = unpack_request(pack_request(dst, bounds, fanout, flags[0], keys[:, 0], flags[1], kind, keys[:, 1]))
    want = (dst, bounds, fanout, flags[0], keys[:, 0], flags[1], kind, keys[:, 1])
    for g, w in zip(got, want, strict=True):
        if isinstance(w, np.ndarray):
            assert g.dtype == w.dtype and np.array_equal(g, w)
        else:
            assert type(g) is type(w) and g == w
    with pytest.raises(ValueError, match="kind must be one of"):
        pack_request(dst, bounds, fanout, False, keys[:, 0], False, "uniform", keys[:, 1])

"""NeighborLoader over a HeteroGraph (LastFM users, artists, friendships: real data): seeds of one node
type, every seed once per epoch in the plain loader's seeded order, batches equal to calling the typed
sampler itself (the default HeteroNeighborSampler and a typed LaborSampler), features per node type equal
to the store rows of each type's input nodes, labels of the seed type, prefetch 0 and 2 giving equal
batches, pickling, closing, and bad input named by argument and value."""

from __future__ import annotations

import gc
import pickle
import threading

import numpy as np
import pytest
import torch
from _typed_blocks import same_blocks

from graphrl.memory import MemoryManager
from samplers import FeatureStore, HeteroNeighborSampler, HeteroNodeBatch, LaborSampler, NeighborLoader
from samplers.hetero_graph import HeteroGraph, lastfm_hetero_graph
from samplers.neighbor import NeighborSampler

LISTENS, HEARD = ("user", "listens", "artist"), ("artist", "heard_by", "user")
FRIENDS = ("user", "friends", "user")
FANOUTS = {LISTENS: [4, 3], HEARD: [3, 2], FRIENDS: [2, 2]}


@pytest.fixture(scope="module")
def lastfm(data_root):
    """LastFM as a HeteroGraph, the data set (its plain friendship graph), features per node type and user
    labels (features and labels synthetic: the data has none)."""
    from graphrl.datasets import load_lastfm

    ds = load_lastfm(data_root)
    graph = lastfm_hetero_graph(ds)
    gen = torch.Generator().manual_seed(0)
    x = {"user": torch.randn(graph.num_nodes["user"], 5, generator=gen),
         "artist": torch.randn(graph.num_nodes["artist"], 3, generator=gen)}
    y = torch.randint(0, 7, (graph.num_nodes["user"],), generator=gen)
    return graph, ds, x, y


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("graphrl-") and "loader" in t.name]


def snapshot(batch: HeteroNodeBatch) -> tuple:
    feats = None if batch.input_features is None else {t: v.clone() for t, v in batch.input_features.items()}
    return batch.seeds.clone(), batch.blocks, feats, batch.labels


def check_batch(batch: HeteroNodeBatch, i: int, graph: HeteroGraph, x: dict, y: torch.Tensor | None,
                seed_type: str) -> None:
    assert isinstance(batch, HeteroNodeBatch) and batch.index == i and batch.seed_type == seed_type
    assert torch.equal(batch.blocks[-1].dst_nodes[seed_type], batch.seeds)
    assert batch.input_nodes is batch.blocks[0].src_nodes
    assert set(batch.input_features) == set(x)
    for t, table in x.items():  # every featured type, also where the batch reads none of it
        assert torch.equal(batch.input_features[t], table[batch.input_nodes[t]])
    if y is not None:
        assert torch.equal(batch.labels, y[batch.seeds])


# ------------------------------------------------------------------------------------------- batches
def test_default_sampler_visits_every_seed_once_and_gives_the_samplers_own_batches(lastfm):
    graph, _, x, y = lastfm
    train = torch.arange(0, graph.num_nodes["user"], 7)
    loader = NeighborLoader(graph, ("user", train), FANOUTS, batch_size=64, features=x, labels=y, seed=11,
                            prefetch=1)
    assert isinstance(loader.sampler, HeteroNeighborSampler) and loader.sampler.seed == 11
    assert loader.seed_type == "user" and len(loader) == -(-train.numel() // 64)
    twin = HeteroNeighborSampler(graph, FANOUTS, seed=11)  # called in the loader's order: same per-call keys
    orders = []
    for _ in range(2):
        seen = []
        for i, batch in enumerate(loader):
            check_batch(batch, i, graph, x, y, "user")
            same_blocks(batch.blocks, twin.sample({"user": batch.seeds}))
            seen.append(batch.seeds)
        assert i == len(loader) - 1
        order = torch.cat(seen)
        assert sorted(order.tolist()) == train.tolist()
        orders.append(order)
    assert not torch.equal(orders[0], orders[1])  # a fresh order each epoch
    assert not loader_threads()


def test_the_seeded_order_is_the_plain_loaders(lastfm):
    """Same seeds, same seed, same batch size: the typed loader cuts the same batches as the plain one (over
    the plain friendship graph of the same users), shuffled, and in input order with shuffle=False."""
    graph, ds, _, _ = lastfm
    train = torch.arange(3, graph.num_nodes["user"], 5)
    for shuffle in (True, False):
        typed = NeighborLoader(graph, ("user", train), [1], batch_size=50, seed=4, shuffle=shuffle,
                               drop_last=True, prefetch=0)
        plain = NeighborLoader(ds.extra["friends"], train, [1], batch_size=50, seed=4, shuffle=shuffle,
                               drop_last=True, prefetch=0)
        assert len(typed) == len(plain) == train.numel() // 50
        for _ in range(2):
            got = [b.seeds for b in typed]
            assert all(torch.equal(a, b.seeds) for a, b in zip(got, plain, strict=True))
        if not shuffle:
            assert torch.equal(torch.cat(got), train[:len(got) * 50])


def test_typed_labor_through_sampler_with_a_mask_gives_the_samplers_own_batches(lastfm):
    graph, _, x, _ = lastfm
    mask = torch.zeros(graph.num_nodes["artist"], dtype=torch.bool)
    mask[::9] = True
    labels = torch.arange(graph.num_nodes["artist"]) * 3
    sampler = LaborSampler(graph, [5, 3], seed=8, importance_sampling=1)
    loader = NeighborLoader(graph, {"artist": mask}, batch_size=100, sampler=sampler,
                            features={"artist": x["artist"]}, labels={"artist": labels, "user": None}, seed=2)
    assert loader.sampler is sampler
    twin = LaborSampler(graph, [5, 3], seed=8, importance_sampling=1)
    seen = []
    for i, batch in enumerate(loader):
        check_batch(batch, i, graph, {"artist": x["artist"]}, labels, "artist")
        want = twin.sample({"artist": batch.seeds})
        same_blocks(batch.blocks, want)
        assert batch.blocks[0].edge_weights is not None
        seen.append(batch.seeds)
    assert sorted(torch.cat(seen).tolist()) == torch.nonzero(mask).reshape(-1).tolist()


@pytest.mark.parametrize("kind", ["neighbor", "labor"])
def test_prefetch_0_and_2_give_equal_batches(lastfm, kind):
    graph, _, x, y = lastfm
    train = torch.arange(0, graph.num_nodes["user"], 4)

    def make(prefetch: int) -> NeighborLoader:
        if kind == "labor":
            return NeighborLoader(graph, ("user", train), batch_size=48, labels=y, features=x, seed=5,
                                  prefetch=prefetch, sampler=LaborSampler(graph, FANOUTS, seed=6))
        return NeighborLoader(graph, ("user", train), FANOUTS, batch_size=48, labels=y, features=x, seed=5,
                              prefetch=prefetch)

    eager, ahead = make(0), make(2)
    for _ in range(2):
        got = [snapshot(b) for b in ahead]  # cloned features: the staging rule
        want = [snapshot(b) for b in eager]
        assert len(got) == len(want) == len(eager)
        for (s, blocks, feats, labels), (s2, blocks2, feats2, labels2) in zip(got, want, strict=True):
            assert torch.equal(s, s2) and torch.equal(labels, labels2)
            same_blocks(blocks, blocks2)
            assert feats.keys() == feats2.keys() and all(torch.equal(feats[t], feats2[t]) for t in feats)
            assert all(torch.equal(feats[t], x[t][blocks[0].src_nodes[t]]) for t in feats)
    assert not loader_threads()


def test_feature_stores_per_type_leases_released_and_closing(lastfm):
    """Given stores are gathered from and never closed by the loader; stores it made from tensors are;
    each type's staging buffers are all back after an epoch; a closed store stops the next epoch, naming
    its type."""
    graph, _, x, _ = lastfm
    with MemoryManager() as mm:
        users = FeatureStore(x["user"], memory=mm, owner="users")
        loader = NeighborLoader(graph, ("artist", torch.arange(200)), FANOUTS, batch_size=30, seed=0,
                                features={"user": users, "artist": x["artist"]}, prefetch=1)
        made = loader.features["artist"]
        assert loader.features["user"] is users and made is not users
        for i, batch in enumerate(loader):
            check_batch(batch, i, graph, x, None, "artist")
            if i == 2:
                kept = batch.input_features["user"]
                batch.release()
                batch.release()  # idempotent
        assert kept.shape[1] == 5
        assert mm.stats()["pinned"]["users.staging"]["regions"] >= 1
        loader.close()
        assert made.closed and not users.closed
        assert mm.stats()["pinned"]["users.staging"]["bytes"] == 0
        with pytest.raises(ValueError, match="closed"):
            iter(loader)

        other = NeighborLoader(graph, ("artist", torch.arange(10)), FANOUTS, batch_size=5,
                               features={"user": users}, seed=0)
        users.close()
        with pytest.raises(ValueError, match="FeatureStore of node type 'user'"):
            iter(other)


def test_without_features_or_labels_and_abandoned_epochs(lastfm):
    graph, _, _, _ = lastfm
    loader = NeighborLoader(graph, ("user", np.arange(300)), [2, 2], batch_size=25, seed=3, prefetch=2)
    for i, batch in enumerate(loader):
        assert batch.input_features is None and batch.labels is None and batch.batch_size == 25
        if i == 1:
            break
    gc.collect()
    assert not loader_threads()
    assert len(list(loader)) == 12


def test_a_pickled_loader_continues_with_the_originals_next_epoch(lastfm):
    graph, _, x, y = lastfm
    loader = NeighborLoader(graph, ("user", torch.arange(120)), FANOUTS, batch_size=40, features=x,
                            labels=y, seed=9, prefetch=1)
    list(loader)
    copy = pickle.loads(pickle.dumps(loader))
    got = [snapshot(b) for b in copy]
    want = [snapshot(b) for b in loader]
    for (s, blocks, feats, labels), (s2, blocks2, feats2, labels2) in zip(got, want, strict=True):
        assert torch.equal(s, s2) and torch.equal(labels, labels2)
        same_blocks(blocks, blocks2)
        assert all(torch.equal(feats[t], feats2[t]) for t in feats)
    copy.close()
    loader.close()


# ------------------------------------------------------------------------------------------- bad input
def test_bad_typed_inputs_raise_naming_the_argument_and_value(lastfm):
    graph, ds, x, y = lastfm
    nu, na = graph.num_nodes["user"], graph.num_nodes["artist"]
    ids = torch.arange(10)

    def make(seeds=("user", ids), **kw):
        kw.setdefault("batch_size", 4)
        if "sampler" not in kw:
            kw.setdefault("fanouts", [2])
        return NeighborLoader(graph, seeds, **kw)

    with pytest.raises(ValueError, match=r"seeds: unknown node type 'paper' \(the graph has \['artist', "
                                         r"'user'\]\)"):
        make(("paper", ids))
    with pytest.raises(ValueError, match=r"seeds: unknown node type 'paper'"):
        make({"paper": ids})
    with pytest.raises(ValueError, match=r"seeds must name at least one node type, got an empty dict"):
        make({})  # several types are test_loader_multitype's
    with pytest.raises(TypeError, match=r"seeds over a HeteroGraph must be \(node type, ids or mask\)"):
        make(ids)
    with pytest.raises(ValueError, match=rf"seeds\['user'\].*outside \[0, num_nodes\['user'\]={nu}\)"
                                         rf".*first {nu}"):
        make(("user", torch.tensor([0, nu])))
    with pytest.raises(ValueError, match=rf"seeds\['artist'\] as a mask must have shape "
                                         rf"\[num_nodes\['artist'\]={na}\], got \({nu},\)"):
        make(("artist", torch.ones(nu, dtype=torch.bool)))
    with pytest.raises(TypeError, match=r"seeds\['user'\] must be an integer tensor, got dtype "
                                        r"torch.float32"):
        make(("user", ids.float()))

    with pytest.raises(TypeError, match=r"features must be a dict node type -> FeatureStore or tensor for a "
                                        r"HeteroGraph, got Tensor"):
        make(features=x["user"])
    with pytest.raises(ValueError, match=r"features: unknown node type 'song' \(the graph has "
                                         r"\['artist', 'user'\]\)"):
        make(features={"song": x["user"]})
    with pytest.raises(ValueError, match=rf"features\['artist'\] has {nu} rows but the graph has {na} "
                                         rf"'artist' nodes"):
        make(features={"artist": x["user"]})
    store = FeatureStore(x["user"][:-1])
    with pytest.raises(ValueError, match=rf"features\['user'\] has {nu - 1} rows but the graph has {nu} "
                                         rf"'user' nodes"):
        make(features={"artist": x["artist"], "user": store})
    assert not store.closed  # a store the caller gave is never closed by a failed loader
    with pytest.raises(TypeError, match=r"features\['user'\] must be a FeatureStore, a tensor or None, "
                                        r"got list"):
        make(features={"user": [1, 2]})

    with pytest.raises(ValueError, match=rf"labels must have shape \[num_nodes\['user'\]={nu}, \.\.\.\], "
                                         rf"got \({na},\)"):
        make(labels=torch.zeros(na))
    with pytest.raises(ValueError, match=r"labels has no labels for the seed types \['user'\] \(it has "
                                         r"\['artist'\]; an entry None is none"):
        make(labels={"artist": torch.zeros(na)})
    with pytest.raises(ValueError, match=r"labels: unknown node type 'song'"):
        make(labels={"user": y, "song": y})

    with pytest.raises(ValueError, match=r"fanouts.*\('user', 'likes', 'artist'\)"):
        make(fanouts={("user", "likes", "artist"): [2]})
    with pytest.raises(ValueError, match="sampler samples another graph than graph"):
        make(sampler=LaborSampler(lastfm_hetero_graph(ds), [2]))
    with pytest.raises(ValueError, match="sampler samples another graph than graph"):
        make(sampler=NeighborSampler(ds.extra["friends"], [2]))
    with pytest.raises(TypeError, match=r"graph must be a CSCGraph or a HeteroGraph, got dict"):
        NeighborLoader({"user": 3}, ("user", ids), [2], batch_size=4)
    assert not loader_threads()


class _Broken:
    """A sampler over the HeteroGraph that breaks the contract: plain blocks (from ``plain``), or typed blocks
    of other seeds."""

    def __init__(self, graph: HeteroGraph, plain: NeighborSampler | None) -> None:
        self.graph, self.num_layers, self.sampled_edges, self.plain = graph, 1, 0, plain
        self.inner = HeteroNeighborSampler(graph, [1], seed=0)

    def sample(self, seeds, exclude_eids=None, seed_times=None):
        if self.plain is not None:
            return self.plain.sample(seeds["user"])
        return self.inner.sample({t: s + 1 for t, s in seeds.items()})


def test_a_typed_sampler_breaking_the_contract_is_named(lastfm):
    graph, ds, _, _ = lastfm
    shifted = NeighborLoader(graph, ("user", torch.arange(8)), batch_size=4, sampler=_Broken(graph, None),
                             prefetch=0, shuffle=False)
    with pytest.raises(ValueError, match=r"_Broken.sample broke the Sampler contract: "
                                         r"blocks\[-1\].dst_nodes\['user'\] must be the 4 seeds in order"):
        next(iter(shifted))
    plain = NeighborLoader(graph, ("user", torch.arange(8)), batch_size=4, prefetch=1,
                           sampler=_Broken(graph, NeighborSampler(ds.extra["friends"], [1], seed=0)))
    with pytest.raises(TypeError, match=r"_Broken.sample must return typed blocks \(samplers.HeteroBlock: "
                                        r"dst_nodes a dict by node type with the seed type 'user'\), got "
                                        r"dst_nodes Tensor"):
        next(iter(plain))
    assert not loader_threads()


@pytest.mark.parametrize("prefetch", [0, 1])
def test_typed_batches_kept_in_a_list_keep_every_types_rows(lastfm, prefetch):
    graph, _, x, _ = lastfm
    users = torch.arange(0, graph.num_nodes["user"], 3)
    loader = NeighborLoader(graph, ("user", users), FANOUTS, batch_size=64, features=x, seed=5,
                            prefetch=prefetch)
    batches = list(loader)  # every batch kept: each type's staging gives the later ones buffers of their own
    assert len(batches) > prefetch + 3
    for b in batches:
        for t, table in x.items():
            assert torch.equal(b.input_features[t], table[b.input_nodes[t]]), (b.index, t)
    del batches, b
    assert loader.own_buffers == 0  # gone with the batches
    loader.close()

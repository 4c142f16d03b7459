"""NeighborLoader over a HeteroGraph with seeds of several node types (LastFM users and artists: real data),
as DGL's ``DataLoader(g, {"user": u, "artist": a}, sampler)``: every (type, id) once per epoch, batches cut as
DGL's DataLoader cuts them (same seeds per batch and type with shuffle=False), blocks equal to calling the
typed sampler itself on the batch's seeds (default HeteroNeighborSampler, typed LaborSampler), features and
labels per type, prefetch 0 and 2 equal, pickling, and bad input named by argument and value."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from _typed_blocks import same_blocks

from samplers import HeteroNeighborSampler, LaborSampler, MultiTypeNodeBatch, NeighborLoader
from samplers.hetero_graph import lastfm_hetero_graph

LISTENS, HEARD = ("user", "listens", "artist"), ("artist", "heard_by", "user")
FRIENDS = ("user", "friends", "user")
FANOUTS = {LISTENS: [4, 3], HEARD: [3, 2], FRIENDS: [2, 2]}


@pytest.fixture(scope="module")
def lastfm(data_root):
    """LastFM as a HeteroGraph, synthetic features and labels per node type (the data has none), and train
    ids of both types."""
    from graphrl.datasets import load_lastfm

    graph = lastfm_hetero_graph(load_lastfm(data_root))
    gen = torch.Generator().manual_seed(0)
    x = {"user": torch.randn(graph.num_nodes["user"], 5, generator=gen),
         "artist": torch.randn(graph.num_nodes["artist"], 3, generator=gen)}
    y = {"user": torch.randint(0, 7, (graph.num_nodes["user"],), generator=gen),
         "artist": torch.randint(0, 4, (graph.num_nodes["artist"], 2), generator=gen)}
    train = {"user": torch.arange(0, graph.num_nodes["user"], 11), "artist": torch.arange(3, 4_000, 29)}
    return graph, x, y, train


def check_batch(batch: MultiTypeNodeBatch, i: int, x: dict, y: dict | None) -> None:
    assert isinstance(batch, MultiTypeNodeBatch) and batch.index == i
    assert list(batch.seeds) == ["user", "artist"]  # every seed type, in the loader's order
    for t, s in batch.seeds.items():
        assert torch.equal(batch.blocks[-1].dst_nodes[t], s)
        if y is not None:
            assert torch.equal(batch.labels[t], y[t][s])
    assert batch.batch_size == sum(s.numel() for s in batch.seeds.values())
    for t, table in x.items():
        assert torch.equal(batch.input_features[t], table[batch.input_nodes[t]])


@pytest.mark.parametrize("kind", ["neighbor", "labor"])
def test_every_typed_seed_once_and_the_samplers_own_batches(lastfm, kind):
    graph, x, y, train = lastfm
    if kind == "labor":
        loader = NeighborLoader(graph, train, batch_size=64, features=x, labels=y, seed=3,
                                sampler=LaborSampler(graph, [5, 3], seed=8, importance_sampling=1))
        twin = LaborSampler(graph, [5, 3], seed=8, importance_sampling=1)
    else:
        loader = NeighborLoader(graph, train, FANOUTS, batch_size=64, features=x, labels=y, seed=3)
        twin = HeteroNeighborSampler(graph, FANOUTS, seed=3)
    assert loader.seed_type is None and loader.seed_types == ("user", "artist")
    total = sum(v.numel() for v in train.values())
    assert loader.num_seeds == total and len(loader) == -(-total // 64)
    orders = []
    for _ in range(2):
        seen = {t: [] for t in train}
        mixed = 0
        for i, batch in enumerate(loader):
            check_batch(batch, i, x, y)
            same_blocks(batch.blocks, twin.sample(batch.seeds))  # its n-th call: the n-th batch
            mixed += all(s.numel() > 0 for s in batch.seeds.values())
            for t, s in batch.seeds.items():
                seen[t].append(s)
        assert i == len(loader) - 1 and mixed >= len(loader) // 2  # shuffled together: most batches mix
        for t in train:
            assert sorted(torch.cat(seen[t]).tolist()) == train[t].tolist()
        orders.append(torch.cat(seen["user"]))
    assert not torch.equal(orders[0], orders[1])


def test_batches_are_cut_as_dgls_dataloader_cuts_them(lastfm):
    from graphrl.dglshim import dgl_available, import_dgl

    if not dgl_available():
        pytest.skip("DGL not installed (install the 'dgl' extra)")
    from samplers import DglSampler

    dgl = import_dgl()
    graph, _, _, train = lastfm
    g = dgl.heterograph({rel: ([0], [0]) for rel in graph.relations}, num_nodes_dict=dict(graph.num_nodes))
    theirs = dgl.dataloading.DataLoader(g, train, DglSampler([1], seed=0), batch_size=40, shuffle=False)
    ours = NeighborLoader(graph, train, [1], batch_size=40, shuffle=False, prefetch=0)
    count = 0
    for (_, output_nodes, _), batch in zip(theirs, ours, strict=True):
        for t in train:  # DGL leaves out the types a batch has none of; ours gives them empty
            want = output_nodes.get(t, torch.empty(0, dtype=torch.int64)).to(torch.int64)
            assert torch.equal(batch.seeds[t], want)
        count += 1
    assert count == len(ours)


def test_prefetch_drop_last_and_pickling(lastfm):
    graph, x, y, train = lastfm

    def snap(batch):
        return ({t: s.clone() for t, s in batch.seeds.items()}, batch.blocks,
                {t: v.clone() for t, v in batch.input_features.items()}, batch.labels)

    def make(prefetch: int) -> NeighborLoader:
        return NeighborLoader(graph, train, FANOUTS, batch_size=48, features=x, labels=y, seed=5,
                              prefetch=prefetch, drop_last=True)

    eager, ahead = make(0), make(2)
    assert len(eager) == sum(v.numel() for v in train.values()) // 48
    list(eager), list(ahead)
    copy = pickle.loads(pickle.dumps(ahead))  # after one epoch: its next epoch is the original's
    want = [snap(b) for b in eager]
    for loader in (ahead, copy):
        got = [snap(b) for b in loader]
        assert len(got) == len(want) == len(eager)
        for (s, blocks, feats, labels), (s2, blocks2, feats2, labels2) in zip(got, want, strict=True):
            assert all(torch.equal(s[t], s2[t]) and torch.equal(labels[t], labels2[t]) for t in s)
            assert sum(v.numel() for v in s.values()) == 48
            same_blocks(blocks, blocks2)
            assert all(torch.equal(feats[t], feats2[t]) for t in feats)
    copy.close()
    for loader in (eager, ahead):
        loader.close()


def test_without_labels_and_one_type_in_a_dict_keeps_the_one_type_batches(lastfm):
    graph, _, _, train = lastfm
    loader = NeighborLoader(graph, {"artist": np.arange(10), "user": np.arange(5)}, [2], batch_size=6,
                            shuffle=False, prefetch=0)
    batches = list(loader)
    assert [b.seeds["artist"].tolist() for b in batches] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9], []]
    assert [b.seeds["user"].tolist() for b in batches] == [[], [0, 1], [2, 3, 4]]
    assert all(b.labels is None and b.input_features is None for b in batches)
    one = NeighborLoader(graph, {"user": train["user"]}, [2], batch_size=6, prefetch=0)
    assert one.seed_type == "user" and one.seed_types == ("user",)
    assert type(next(iter(one))).__name__ == "HeteroNodeBatch"


@pytest.mark.parametrize("types", [("user",), ("user", "artist")])
def test_a_seed_types_labels_none_in_a_dict_is_refused_with_one_seed_type_or_several(lastfm, types):
    """One rule for one seed type and several (loader_seeds._typed_labels): a dict whose entry for a seed
    type is None is refused naming labels and the type, never read as "no labels" (labels=None says that);
    a None entry for a type that is not a seed type is unused."""
    graph, _, y, train = lastfm
    seeds = {t: train[t][:8] for t in types}
    with pytest.raises(ValueError, match=r"labels has no labels for the seed types \['user'\] \(it has "
                                         r"\['artist'\]; an entry None is none"):
        NeighborLoader(graph, seeds, [2], batch_size=4, labels={"user": None, "artist": y["artist"]})
    if types == ("user",):
        loader = NeighborLoader(graph, seeds, [2], batch_size=4, prefetch=0,
                                labels={"user": y["user"], "artist": None}, seed=0)
        batch = next(iter(loader))
        assert torch.equal(batch.labels, y["user"][batch.seeds])


def test_bad_multi_type_inputs_raise_naming_the_argument_and_value(lastfm):
    graph, _, y, train = lastfm
    nu, na = graph.num_nodes["user"], graph.num_nodes["artist"]

    def make(seeds=None, **kw):
        return NeighborLoader(graph, train if seeds is None else seeds, [2], batch_size=4, **kw)

    with pytest.raises(ValueError, match=r"seeds must name at least one node type, got an empty dict"):
        make({})
    with pytest.raises(ValueError, match=r"seeds: unknown node type 'song'"):
        make({"user": train["user"], "song": train["user"]})
    with pytest.raises(ValueError, match=rf"seeds\['artist'\].*outside \[0, num_nodes\['artist'\]={na}\)"):
        make({"user": train["user"], "artist": torch.tensor([0, na])})
    with pytest.raises(TypeError, match=r"labels must be a dict node type -> tensor \(or None\) with seeds "
                                        r"of several types \['user', 'artist'\], got Tensor"):
        make(labels=y["user"])
    with pytest.raises(ValueError, match=r"labels has no labels for the seed types \['artist'\] \(it has "
                                         r"\['user'\]; an entry None is none: give every seed type's labels, "
                                         r"or labels=None\)"):
        make(labels={"user": y["user"]})
    with pytest.raises(ValueError, match=rf"labels\['artist'\] must have shape \[num_nodes\['artist'\]={na}, "
                                         rf"\.\.\.\], got \({nu},\)"):
        make(labels={"user": y["user"], "artist": y["user"]})
    with pytest.raises(ValueError, match=r"labels: unknown node type 'song'"):
        make(labels={**y, "song": y["user"]})


def test_the_readme_typed_example_runs(data_root, monkeypatch):
    monkeypatch.setenv("GRAPHRL_DATA", str(data_root))
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "MultiTypeNodeBatch" in b]
    exec(compile(block, "README.md", "exec"), {})  # asserts the typed seeds and labels of every batch

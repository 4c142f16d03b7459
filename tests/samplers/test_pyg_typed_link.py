"""Typed link prediction through PyG (LastFM users, artists, friendships: real data): PygSampler's
``sample_from_edges`` on a HeteroData equals PyG's own ``NeighborSampler.sample_from_edges`` (PyG's
``edge_sample``: negatives, unique seeds, ``edge_label_index`` / triplet indices, disjoint ``batch``) with
only the per-hop kernel put in its place (pyg-lib and torch-sparse are not installed here, so PyG's sampler
has none of its own); PyG's ``LinkLoader`` batches hold edges of the graph with their types, the input
links as positives; a typed LaborSampler behind it gives the blocks of calling it directly on the batch's
seeds."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from samplers import LaborSampler, PygSampler
from samplers.hetero_graph import lastfm_hetero_graph
from samplers.protocol import edges_by_id

pyg = pytest.importorskip("torch_geometric", reason="torch_geometric not installed (install the 'pyg' extra)")
from torch_geometric.sampler import EdgeSamplerInput, NegativeSampling  # noqa: E402

pytestmark = pytest.mark.pyg

LISTENS, HEARD = ("user", "listens", "artist"), ("artist", "heard_by", "user")
FRIENDS = ("user", "friends", "user")
NEGATIVES = {"none": None, "binary": ("binary", 1), "binary_1.5": ("binary", 1.5), "triplet": ("triplet", 3)}


@pytest.fixture(scope="module")
def lastfm(data_root):
    """LastFM as our HeteroGraph and as a HeteroData (edge j of each type is column j of its edge_index)."""
    from graphrl.datasets import load_lastfm

    graph = lastfm_hetero_graph(load_lastfm(data_root))
    data = pyg.data.HeteroData()
    for t, n in graph.num_nodes.items():
        data[t].num_nodes = n
    for rel in graph.relations:
        src, dst = edges_by_id(graph, rel)
        data[rel].edge_index = torch.from_numpy(np.stack([src, dst]))
    return graph, data


def negative(name: str):
    spec = NEGATIVES[name]
    return None if spec is None else NegativeSampling(spec[0], amount=spec[1])


def links(data, rel, count: int, offset: int = 7) -> EdgeSamplerInput:
    ids = torch.arange(offset, offset + 3 * count, 3)
    ei = data[rel].edge_index[:, ids]
    return EdgeSamplerInput(input_id=ids, row=ei[0], col=ei[1], input_type=rel)


def pyg_own(data, twin: PygSampler, disjoint: bool):
    """PyG's NeighborSampler on ``data`` whose per-hop kernel (``_sample``, pyg-lib's call) is ``twin``'s
    ``sample_nodes``: everything around it (negatives, seeds, metadata) is PyG's own code."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "NeighborSampler without pyg-lib is deprecated"
        theirs = pyg.sampler.NeighborSampler(data, [1], disjoint=disjoint)
    theirs._sample = lambda seed, seed_time=None, **kw: twin.sample_nodes(seed, seed_time)
    return theirs


def same(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            same(u, v)
    else:
        assert a == b


@pytest.mark.parametrize("disjoint", [False, True])
@pytest.mark.parametrize("neg", list(NEGATIVES))
@pytest.mark.parametrize("rel", [LISTENS, FRIENDS], ids=["two_types", "one_type"])
def test_sample_from_edges_is_pygs_own_edge_sample(lastfm, rel, neg, disjoint):
    _, data = lastfm
    ours = PygSampler(data, [3, 2], seed=5, disjoint=disjoint)
    twin = PygSampler(data, [3, 2], seed=5, disjoint=disjoint)
    ours.negatives = torch.Generator().manual_seed(11)  # PyG draws negatives with torch.randint, global RNG
    inputs = links(data, rel, 20)
    got = ours.sample_from_edges(inputs, negative(neg))
    torch.manual_seed(11)
    want = pyg_own(data, twin, disjoint).sample_from_edges(inputs, negative(neg))
    for field in ("node", "row", "col", "edge", "batch", "num_sampled_nodes", "num_sampled_edges"):
        same(getattr(got, field), getattr(want, field))
    same(got.metadata, want.metadata)
    # and the values mean what PyG says: positives are the input links, every edge is a graph edge
    src_t, dst_t = rel[0], rel[-1]
    if neg in ("none", "binary", "binary_1.5"):
        _, label_index, label, _ = got.metadata
        num_neg = 0 if neg == "none" else math.ceil(20 * NEGATIVES[neg][1])
        assert label_index.shape == (2, 20 + num_neg)
        if neg == "none":
            assert label is None  # PyG's: no negatives, no labels
        else:
            assert torch.equal(label, torch.cat([torch.ones(20), torch.zeros(num_neg)]))
        assert torch.equal(got.node[src_t][label_index[0, :20]], inputs.row)
        assert torch.equal(got.node[dst_t][label_index[1, :20]], inputs.col)
    else:
        _, src_index, dst_pos, dst_neg, _ = got.metadata
        assert dst_neg.shape == (20, 3)
        assert torch.equal(got.node[src_t][src_index], inputs.row)
        assert torch.equal(got.node[dst_t][dst_pos], inputs.col)
    for et in data.edge_types:
        ends = torch.stack([got.node[et[0]][got.row[et]], got.node[et[-1]][got.col[et]]])
        assert torch.equal(data[et].edge_index[:, got.edge[et]], ends)
        assert sum(got.num_sampled_edges[et]) == got.edge[et].numel()


def test_link_loader_batches_hold_typed_graph_edges_and_the_input_links(lastfm):
    _, data = lastfm
    ids = torch.arange(0, 4_000, 41)
    label_index = data[LISTENS].edge_index[:, ids]
    loader = pyg.loader.LinkLoader(data, link_sampler=PygSampler(data, {LISTENS: [4, 2], HEARD: [4, 2],
                                                                        FRIENDS: [2, 0]}, seed=1),
                                   edge_label_index=(LISTENS, label_index),
                                   neg_sampling=NegativeSampling("binary", amount=2), batch_size=32,
                                   shuffle=True)
    seen = []
    for batch in loader:
        p = int(batch[LISTENS].input_id.numel())
        seen.append(batch[LISTENS].input_id)
        eli, lab = batch[LISTENS].edge_label_index, batch[LISTENS].edge_label
        assert eli.shape == (2, 3 * p) and torch.equal(lab, torch.cat([torch.ones(p), torch.zeros(2 * p)]))
        pos = label_index[:, batch[LISTENS].input_id]
        assert torch.equal(batch["user"].n_id[eli[0, :p]], pos[0])
        assert torch.equal(batch["artist"].n_id[eli[1, :p]], pos[1])
        for t, kind in (("user", 0), ("artist", 1)):  # the seeds: the links' ends, unique and sorted
            ends = batch[t].n_id[eli[kind]]
            assert torch.equal(batch[t].n_id[:batch[t].num_sampled_nodes[0]], ends.unique())
        for et in data.edge_types:
            row, col = batch[et].edge_index
            ends = torch.stack([batch[et[0]].n_id[row], batch[et[-1]].n_id[col]])
            assert torch.equal(data[et].edge_index[:, batch[et].e_id], ends)  # right types, real edges
        assert batch[FRIENDS].num_sampled_edges[1] == 0  # FRIENDS: [2, 0] draws nothing at hop 2
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(ids.numel()))


def test_typed_labor_behind_link_loader_gives_its_own_blocks(lastfm):
    graph, data = lastfm

    def labor():
        return LaborSampler(graph, [5, 3], seed=2, importance_sampling=1)

    loader = PygSampler.keep_edge_weight(pyg.loader.LinkLoader(
        data, link_sampler=PygSampler(data, sampler=labor()), edge_label_index=(FRIENDS, None),
        neg_sampling=NegativeSampling("triplet", amount=2), batch_size=24))
    batch = next(iter(loader))
    seeds = {"user": batch["user"].n_id[:batch["user"].num_sampled_nodes[0]]}  # one node type: merged
    ids = batch[FRIENDS].input_id
    assert torch.equal(batch["user"].n_id[batch["user"].src_index], data[FRIENDS].edge_index[0, ids])
    assert torch.equal(batch["user"].n_id[batch["user"].dst_pos_index], data[FRIENDS].edge_index[1, ids])
    assert batch["user"].dst_neg_index.shape == (24, 2)
    direct = PygSampler(data, sampler=labor()).sample_nodes(seeds)
    blocks = labor().sample(seeds)
    for et in data.edge_types:
        assert torch.equal(batch[et].e_id, direct.edge[et])
        assert torch.equal(batch[et].edge_weight, direct.edge_weight[et])
        inner = blocks[-1].edge_ids[et]  # hop 1 is the innermost block, whole
        assert torch.equal(batch[et].e_id[:inner.numel()].sort().values, inner.sort().values)


@pytest.mark.parametrize("neg", ["binary", "triplet"])
def test_temporal_sample_from_edges_is_pygs_own_where_no_time_ties(lastfm, neg):
    """Node-level float times (no two equal, so PyG's retry rule, which also rejects a negative whose time
    equals its link's, cannot differ from ours, which keeps it): PyG's own edge_sample, disjoint."""
    _, base = lastfm
    data = base.clone()
    gen = torch.Generator().manual_seed(3)
    for t in data.node_types:
        data[t].time = torch.rand(data[t].num_nodes, generator=gen, dtype=torch.float64) * 50
    inputs = links(data, LISTENS, 20)
    inputs.time = torch.rand(20, generator=gen, dtype=torch.float64) * 50
    ours = PygSampler(data, [3, 2], seed=5, time_attr="time")
    twin = PygSampler(data, [3, 2], seed=5, time_attr="time")
    ours.negatives = torch.Generator().manual_seed(11)
    got = ours.sample_from_edges(inputs, negative(neg))
    torch.manual_seed(11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = pyg.sampler.NeighborSampler(data, [1], time_attr="time")
    theirs._sample = lambda seed, seed_time=None, **kw: twin.sample_nodes(seed, seed_time)
    want = theirs.sample_from_edges(inputs, negative(neg))
    for field in ("node", "row", "col", "edge", "batch", "num_sampled_nodes", "num_sampled_edges"):
        same(getattr(got, field), getattr(want, field))
    same(got.metadata, want.metadata)
    artists = got.node["artist"]  # disjoint: the links' artists, then the negatives, then what they drew
    amount = NEGATIVES[neg][1]
    negs = artists[20:20 + 20 * amount]
    limit = inputs.time.repeat(amount)
    ok = data["artist"].time[negs] <= limit
    assert bool((ok | (negs == data["artist"].time.argmin())).all())  # PyG's rule: never later than its link

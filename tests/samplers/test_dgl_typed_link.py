"""Typed link prediction through DGL (LastFM users, artists, friendships: real data): DGL's own
``as_edge_prediction_sampler`` around a `DglSampler` on a heterograph, through ``dgl.dataloading.DataLoader(g,
{edge_type: eids}, ...)``: the pair graphs hold the seed edges, the blocks hold edges of ``g`` of the right
types and are the blocks of our sampler called directly on the pair graph's nodes with the same exclusions;
excluded edges (``exclude="self"`` and ``"reverse_types"``) are absent, exactly at fanout -1; a typed
LaborSampler behind it (``sampler=``) gives its own blocks; DGL's ``GlobalUniform`` negatives are never edges
of ``g``; a DataLoader over seeds of two node types gives our sampler's blocks for both."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from samplers import DglSampler, HeteroNeighborSampler, LaborSampler
from samplers.hetero_graph import HeteroGraph, lastfm_hetero_graph
from samplers.protocol import edges_by_id

pytestmark = pytest.mark.dgl

LISTENS, HEARD = ("user", "listens", "artist"), ("artist", "heard_by", "user")
FRIENDS = ("user", "friends", "user")


@pytest.fixture(scope="module")
def lastfm(data_root, dgl):
    """LastFM as a DGL heterograph and as our HeteroGraph in DGL's (sorted) relation order, same edge ids."""
    from graphrl.datasets import load_lastfm

    ours = lastfm_hetero_graph(load_lastfm(data_root))
    edges = {}
    for rel in ours.relations:
        src, dst = edges_by_id(ours, rel)
        edges[rel] = (torch.from_numpy(src), torch.from_numpy(dst))
    g = dgl.heterograph(edges, num_nodes_dict=dict(ours.num_nodes))
    graph = HeteroGraph.from_edges(dict(ours.num_nodes), {rel: edges[rel] for rel in g.canonical_etypes})
    return g, graph


def check_block_edges(dgl, g, blocks) -> None:
    """Every block edge is the edge of ``g`` its EID names, of the block's relation, between the block's
    source and destination nodes it joins."""
    for block in blocks:
        for rel in g.canonical_etypes:
            local_src, local_dst = block.edges(etype=rel)
            eid = block.edges[rel].data[dgl.EID]
            src, dst = g.find_edges(eid, etype=rel)
            assert torch.equal(block.srcnodes[rel[0]].data[dgl.NID][local_src], src)
            assert torch.equal(block.dstnodes[rel[-1]].data[dgl.NID][local_dst], dst)


def check_same_as(dgl, blocks, ours, g) -> None:
    """DGL blocks equal our typed blocks: node ids per type, edge ids per relation in the same order."""
    assert len(blocks) == len(ours)
    for got, want in zip(blocks, ours, strict=True):
        for t in g.ntypes:
            assert torch.equal(got.srcnodes[t].data[dgl.NID].to(torch.int64), want.src_nodes[t])
            assert torch.equal(got.dstnodes[t].data[dgl.NID].to(torch.int64), want.dst_nodes[t])
        for rel in g.canonical_etypes:
            assert torch.equal(got.edges[rel].data[dgl.EID].to(torch.int64), want.edge_ids[rel])


@pytest.mark.parametrize("exclude", [None, "self", "reverse_types"])
def test_edge_prediction_blocks_are_our_samplers_with_the_seed_edges_excluded(dgl, lastfm, exclude):
    g, graph = lastfm
    fanouts = [{LISTENS: 3, HEARD: 4, FRIENDS: 2}, {LISTENS: -1, HEARD: -1, FRIENDS: 3}]
    kw = {"reverse_etypes": {LISTENS: HEARD, HEARD: LISTENS}} if exclude == "reverse_types" else {}
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        DglSampler(fanouts, seed=4), exclude=exclude,
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(2), **kw)
    eids = torch.arange(0, 6_000, 97)
    loader = dgl.dataloading.DataLoader(g, {LISTENS: eids}, sampler, batch_size=16, shuffle=False)
    direct = HeteroNeighborSampler(graph, {rel: [f[rel] for f in fanouts] for rel in graph.relations}, seed=4)
    seen = []
    for i, (input_nodes, pos, neg, blocks) in enumerate(loader):
        seed_eids = pos.edges[LISTENS].data[dgl.EID]
        assert torch.equal(seed_eids, eids[16 * i:16 * (i + 1)])
        seen.append(seed_eids)
        src, dst = g.find_edges(seed_eids, etype=LISTENS)
        pu, pa = pos.edges(etype=LISTENS)
        assert torch.equal(pos.nodes["user"].data[dgl.NID][pu], src)
        assert torch.equal(pos.nodes["artist"].data[dgl.NID][pa], dst)
        assert neg.num_edges(LISTENS) == 2 * seed_eids.numel()
        check_block_edges(dgl, g, blocks)
        seeds = {t: pos.nodes[t].data[dgl.NID].to(torch.int64) for t in g.ntypes}
        excluded = None if exclude is None else {LISTENS: seed_eids}
        if exclude == "reverse_types":
            excluded[HEARD] = seed_eids  # LastFM's reverse edge i is edge i
        want = direct.sample(seeds, exclude_eids=excluded)  # its n-th call: the loader's n-th batch
        check_same_as(dgl, blocks, want, g)
        assert all(torch.equal(input_nodes[t].to(torch.int64), want[0].src_nodes[t]) for t in g.ntypes)
        inner = blocks[-1]  # fanout -1 into the seeds: every in-edge but the excluded ones, exactly
        for rel, gone in (excluded or {}).items():
            drawn = torch.cat([b.edges[rel].data[dgl.EID] for b in blocks])
            assert not np.isin(gone.numpy(), drawn.numpy()).any()
        for rel in (LISTENS, HEARD):
            dst_t = rel[-1]
            dst_ids = inner.dstnodes[dst_t].data[dgl.NID]
            all_in = g.in_edges(dst_ids, form="eid", etype=rel)
            gone = (excluded or {}).get(rel, torch.empty(0, dtype=all_in.dtype))
            want = set(all_in.tolist()) - set(gone.tolist())
            assert set(inner.edges[rel].data[dgl.EID].tolist()) == want
    assert torch.equal(torch.cat(seen), eids)


def test_typed_labor_behind_edge_prediction_gives_its_own_blocks(dgl, lastfm):
    g, graph = lastfm

    def labor():
        return LaborSampler(graph, [5, 3], seed=6, importance_sampling=1)

    sampler = dgl.dataloading.as_edge_prediction_sampler(
        DglSampler(sampler=labor()), exclude="self",
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(1))
    loader = dgl.dataloading.DataLoader(g, {FRIENDS: torch.arange(200)}, sampler, batch_size=50)
    direct = labor()
    for _, pos, _, blocks in loader:
        seed_eids = pos.edges[FRIENDS].data[dgl.EID]
        seeds = {t: pos.nodes[t].data[dgl.NID].to(torch.int64) for t in g.ntypes}
        assert seeds["artist"].numel() == 0  # a user-user relation seeds users alone
        want = direct.sample(seeds, exclude_eids={FRIENDS: seed_eids})
        check_same_as(dgl, blocks, want, g)
        for got, ref in zip(blocks, want, strict=True):
            for rel in g.canonical_etypes:
                assert torch.equal(got.edges[rel].data["edge_weights"], ref.edge_weights[rel])
        check_block_edges(dgl, g, blocks)
        every = torch.cat([b.edges[FRIENDS].data[dgl.EID] for b in blocks])
        assert not np.isin(seed_eids.numpy(), every.numpy()).any()


def test_global_uniform_negatives_are_never_edges(dgl, lastfm):
    g, _ = lastfm
    dgl.seed(3)
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        DglSampler([2, 2], seed=0), exclude="self",
        negative_sampler=dgl.dataloading.negative_sampler.GlobalUniform(3))
    loader = dgl.dataloading.DataLoader(g, {LISTENS: torch.arange(300)}, sampler, batch_size=100)
    listened = set(zip(*(v.tolist() for v in g.edges(etype=LISTENS)), strict=True))
    count = 0
    for _, _, neg, blocks in loader:
        nu, na = neg.edges(etype=LISTENS)
        users, artists = neg.nodes["user"].data[dgl.NID][nu], neg.nodes["artist"].data[dgl.NID][na]
        pairs = zip(users.tolist(), artists.tolist(), strict=True)
        for pair in pairs:
            assert pair not in listened
            count += 1
        check_block_edges(dgl, g, blocks)
    assert count > 0


def test_dataloader_over_two_seed_types_gives_our_samplers_blocks(dgl, lastfm):
    g, graph = lastfm
    seeds = {"user": torch.arange(0, 1_800, 37), "artist": torch.arange(5, 4_000, 53)}
    loader = dgl.dataloading.DataLoader(g, seeds, DglSampler([3, 2], seed=8), batch_size=40, shuffle=False)
    direct = HeteroNeighborSampler(graph, [3, 2], seed=8)
    both = 0
    for _, output_nodes, blocks in loader:
        both += len(output_nodes) == 2
        full = {t: output_nodes.get(t, torch.empty(0, dtype=torch.int64)).to(torch.int64) for t in g.ntypes}
        want = direct.sample({t: v for t, v in full.items() if t in output_nodes})
        check_same_as(dgl, blocks, want, g)
        check_block_edges(dgl, g, blocks)
    assert both >= 1  # one batch straddles the two types

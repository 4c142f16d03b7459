"""Heterogeneous sampling: one CSC per relation, fanouts per relation, blocks per relation; DGL's
heterogeneous full-neighbour blocks; LastFM user-artist + friendship data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from samplers.hetero import HeteroBlock, HeteroGraph, HeteroNeighborSampler, lastfm_hetero_graph

LISTENS = ("user", "listens", "artist")
HEARD = ("artist", "heard_by", "user")
FRIENDS = ("user", "friends", "user")


def random_hetero(seed: int = 0, users: int = 40, artists: int = 25):
    rng = np.random.default_rng(seed)
    u, a = rng.integers(0, users, 300), rng.integers(0, artists, 300)
    f1, f2 = rng.integers(0, users, 120), rng.integers(0, users, 120)
    edges = {LISTENS: (u, a), HEARD: (a, u), FRIENDS: (f1, f2)}
    return HeteroGraph.from_edges({"user": users, "artist": artists}, edges), edges


def check_hetero_blocks(graph: HeteroGraph, edges, blocks: list[HeteroBlock], seeds, fanouts) -> None:
    for t in graph.num_nodes:
        want = seeds.get(t, torch.empty(0, dtype=torch.int64))
        assert torch.equal(blocks[-1].dst_nodes[t], torch.as_tensor(want, dtype=torch.int64))
    for i, b in enumerate(blocks):
        for t in graph.num_nodes:
            d = b.dst_nodes[t].shape[0]
            assert torch.equal(b.src_nodes[t][:d], b.dst_nodes[t])
            assert len(set(b.src_nodes[t][d:].tolist())) == b.src_nodes[t].shape[0] - d
            if i + 1 < len(blocks):
                assert torch.equal(b.dst_nodes[t], blocks[i + 1].src_nodes[t])
        for rel, (src, dst) in edges.items():
            s_type, _, d_type = rel
            eids = b.edge_ids[rel].numpy()
            assert np.array_equal(b.src_nodes[s_type].numpy()[b.indices[rel].numpy()], np.asarray(src)[eids])
            assert np.array_equal(b.dst_nodes[d_type].numpy()[b.edge_dst(rel).numpy()], np.asarray(dst)[eids])
            k = fanouts[rel][i]
            deg = np.bincount(np.asarray(dst), minlength=graph.num_nodes[d_type])[b.dst_nodes[d_type].numpy()]
            got = (b.indptr[rel][1:] - b.indptr[rel][:-1]).numpy()
            assert np.array_equal(got, deg if k == -1 else np.minimum(deg, k))
            for v in range(b.dst_nodes[d_type].shape[0]):
                row = eids[int(b.indptr[rel][v]):int(b.indptr[rel][v + 1])]
                assert len(set(row.tolist())) == row.size


def test_hetero_blocks_follow_the_contract_with_per_relation_fanouts():
    graph, edges = random_hetero()
    fanouts = {LISTENS: [3, -1], HEARD: [2, 4], FRIENDS: [1, 2]}
    sampler = HeteroNeighborSampler(graph, fanouts, seed=0)
    seeds = {"user": torch.tensor([0, 5, 5, 39]), "artist": torch.tensor([3])}
    blocks = sampler.sample(seeds)
    assert len(blocks) == 2
    check_hetero_blocks(graph, edges, blocks, seeds, fanouts)
    assert sampler.sampled_edges == sum(b.num_edges() for b in blocks)
    # same seed, same blocks; another call differs
    again = HeteroNeighborSampler(graph, fanouts, seed=0).sample(seeds)
    for x, y in zip(blocks, again, strict=True):
        assert all(torch.equal(x.edge_ids[r], y.edge_ids[r]) for r in graph.relations)
    other = sampler.sample(seeds)
    assert any(not torch.equal(x.edge_ids[r], y.edge_ids[r]) for x, y in zip(blocks, other, strict=True)
               for r in graph.relations)


def test_hetero_relations_left_out_draw_nothing_and_errors():
    graph, edges = random_hetero(1)
    sampler = HeteroNeighborSampler(graph, {LISTENS: [-1], HEARD: [-1]}, seed=0)
    b = sampler.sample({"user": torch.tensor([1, 2])})[0]
    assert FRIENDS not in b.indices and b.num_edges(LISTENS) == 0  # users are not listened to
    assert b.num_edges(HEARD) == int(np.isin(edges[HEARD][1], [1, 2]).sum())
    with pytest.raises(ValueError, match="unknown relations"):
        HeteroNeighborSampler(graph, {("user", "x", "user"): [1]})
    with pytest.raises(ValueError, match="same number"):
        HeteroNeighborSampler(graph, {LISTENS: [1], HEARD: [1, 2]})
    with pytest.raises(ValueError, match="unknown node type"):
        sampler.sample({"song": torch.tensor([0])})
    with pytest.raises(ValueError, match=r"seeds\['user'\]: 1 of 1 ids outside"):
        sampler.sample({"user": torch.tensor([40])})
    with pytest.raises(ValueError, match="outside"):
        HeteroGraph.from_edges({"user": 2, "artist": 2}, {LISTENS: ([0, 2], [0, 1])})
    with pytest.raises(ValueError, match="unknown node type"):
        HeteroGraph.from_edges({"user": 2}, {LISTENS: ([0], [0])})


@pytest.mark.dgl
def test_hetero_full_neighbour_blocks_match_dgl():
    from graphrl.dglshim import dgl_available, import_dgl

    if not dgl_available():
        pytest.skip("DGL not installed")
    dgl = import_dgl()
    graph, edges = random_hetero(2)
    g = dgl.heterograph({rel: (torch.as_tensor(s), torch.as_tensor(d)) for rel, (s, d) in edges.items()},
                        num_nodes_dict=graph.num_nodes)
    seeds = {"user": torch.tensor([0, 7, 12]), "artist": torch.tensor([4, 9])}
    ours = HeteroNeighborSampler(graph, [-1, -1], seed=0).sample(seeds)
    _, _, theirs = dgl.dataloading.MultiLayerFullNeighborSampler(2).sample_blocks(g, seeds)
    for a, b in zip(ours, theirs, strict=True):
        d = a.to_dgl()
        assert d.is_block
        for t in graph.num_nodes:
            assert set(a.src_nodes[t].tolist()) == set(b.srcnodes[t].data[dgl.NID].tolist())
            assert torch.equal(d.dstnodes[t].data[dgl.NID], a.dst_nodes[t])
        for rel in graph.relations:
            assert sorted(a.edge_ids[rel].tolist()) == sorted(b.edges[rel].data[dgl.EID].tolist())
            src, dst = d.edges(etype=rel, order="eid")
            assert torch.equal(src, a.indices[rel]) and torch.equal(dst, a.edge_dst(rel))


def test_lastfm_hetero_sampling(data_root):
    from graphrl.datasets import load_lastfm

    ds = load_lastfm(data_root)
    graph = lastfm_hetero_graph(ds)
    assert graph.num_nodes == {"user": 1892, "artist": 4489}
    assert graph.num_edges(LISTENS) == graph.num_edges(HEARD) == 42135 and graph.num_edges(FRIENDS) == 25434
    users = ds.train_users.numpy().astype(np.int64)
    items = ds.train_items.numpy().astype(np.int64)
    friends = ds.extra["friends"]
    f_eids = friends.csc_edge_ids().numpy()
    f_src, f_dst = np.empty(friends.num_edges, np.int64), np.empty(friends.num_edges, np.int64)
    f_src[f_eids] = friends.indices.numpy()
    f_dst[f_eids] = np.repeat(np.arange(friends.num_nodes), friends.in_degrees().numpy())
    edges = {LISTENS: (users, items), HEARD: (items, users), FRIENDS: (f_src, f_dst)}
    fanouts = {LISTENS: [10, 10], HEARD: [10, 10], FRIENDS: [5, 5]}
    seeds = {"user": torch.tensor([0, 1, 100, 1500])}
    blocks = HeteroNeighborSampler(graph, fanouts, seed=1).sample(seeds)
    check_hetero_blocks(graph, edges, blocks, seeds, fanouts)
    assert blocks[0].num_edges(FRIENDS) > 0 and blocks[0].num_edges(LISTENS) > 0

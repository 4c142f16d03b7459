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


# ------------------------------------------------------------- weights, exclusion, times per relation
CLICKS = ("user", "clicks", "item")
CLICKED = ("item", "clicked_by", "user")
FOLLOWS = ("user", "follows", "user")


@pytest.fixture
def shop() -> HeteroGraph:
    """Users 0..2, items 0..3. clicks (user -> item): e0 u0->i0, e1 u1->i0, e2 u2->i0, e3 u0->i1,
    e4 u1->i2; clicked_by is its reverse (same ids); follows (user -> user): e0 u1->u0, e1 u2->u0,
    e2 u0->u1."""
    u, i = [0, 1, 2, 0, 1], [0, 0, 0, 1, 2]
    return HeteroGraph.from_edges({"user": 3, "item": 4},
                                  {CLICKS: (u, i), CLICKED: (i, u), FOLLOWS: ([1, 2, 0], [0, 0, 1])},
                                  weights={CLICKS: torch.tensor([0.0, 1.0, 2.0, 0.0, 5.0])})


def rows(block: HeteroBlock, rel) -> list[list[int]]:
    ptr = block.indptr[rel].tolist()
    return [block.edge_ids[rel][ptr[v]:ptr[v + 1]].tolist() for v in range(len(ptr) - 1)]


def test_hetero_weights_per_relation_exact(shop):
    seeds = {"item": torch.tensor([0, 1, 2]), "user": torch.tensor([0])}
    # the graph's weights (True): zero-weight edges are never drawn, -1 takes every positive one
    b = HeteroNeighborSampler(shop, [-1], seed=0, weights=True).sample(seeds)[0]
    assert rows(b, CLICKS) == [[1, 2], [], [4]]
    assert rows(b, CLICKED) == [[0, 3]] and rows(b, FOLLOWS) == [[0, 1]]  # unweighted relations
    assert b.src_nodes["user"].tolist() == [0, 1, 2]  # the seed user, then u1, u2 (clicks), u1/u2 again
    assert b.indices[CLICKS].tolist() == [1, 2, 1] and b.indices[FOLLOWS].tolist() == [1, 2]
    # a dict: a tensor for follows (by edge id), the graph's weights for clicks, uniform elsewhere
    w = {CLICKS: True, FOLLOWS: torch.tensor([0.0, 3.0, 1.0]), CLICKED: None}
    b = HeteroNeighborSampler(shop, [5], seed=0, weights=w).sample(seeds)[0]
    assert rows(b, CLICKS) == [[1, 2], [], [4]] and rows(b, FOLLOWS) == [[1]] and rows(b, CLICKED) == [[0, 3]]
    # fanout 1: a row with two eligible edges draws one of them, never a zero-weight one
    sampler = HeteroNeighborSampler(shop, [1], seed=3, weights=True)
    drawn = {tuple(rows(sampler.sample(seeds)[0], CLICKS)[0]) for _ in range(40)}
    assert drawn == {(1,), (2,)}
    # with replacement: exactly k draws from positive-weight edges, none from a row of all zeros
    b = HeteroNeighborSampler(shop, [4], replace=True, seed=1, weights=True).sample(seeds)[0]
    r = rows(b, CLICKS)
    assert len(r[0]) == 4 and set(r[0]) <= {1, 2} and r[1] == [] and r[2] == [4] * 4


def test_hetero_excluded_edges_per_relation_exact(shop):
    seeds = {"item": torch.tensor([0]), "user": torch.tensor([0, 1])}
    sampler = HeteroNeighborSampler(shop, [-1, -1], seed=0)
    blocks = sampler.sample(seeds, exclude_eids={CLICKS: torch.tensor([1, 1]), FOLLOWS: [0]})
    b = blocks[-1]
    assert rows(b, CLICKS) == [[0, 2]] and rows(b, FOLLOWS) == [[1], [2]]
    assert rows(b, CLICKED) == [[0, 3], [1, 4]]
    for blk in blocks:  # no layer draws them
        assert 1 not in blk.edge_ids[CLICKS].tolist() and 0 not in blk.edge_ids[FOLLOWS].tolist()
    # without exclusions the same call draws them; a dict of fewer relations leaves the others alone
    b = sampler.sample(seeds, exclude_eids={CLICKED: torch.tensor([3])})[-1]
    assert rows(b, CLICKS) == [[0, 1, 2]] and rows(b, CLICKED) == [[0], [1, 4]]
    # fanout 2 on item 0's three clicks, one excluded: the other two, whatever the draw
    b = HeteroNeighborSampler(shop, [2], seed=5).sample({"item": torch.tensor([0])},
                                                       exclude_eids={CLICKS: torch.tensor([0])})[0]
    assert rows(b, CLICKS) == [[1, 2]]


def test_hetero_temporal_exact(shop):
    # clicks at times 1, 5, 9, 2, 3; follows at 4, 8, 0; clicked_by static (left out of edge_times)
    times = {CLICKS: torch.tensor([1, 5, 9, 2, 3]), FOLLOWS: torch.tensor([4, 8, 0])}
    sampler = HeteroNeighborSampler(shop, [-1], seed=0, edge_times=times)
    b = sampler.sample({"item": torch.tensor([0]), "user": torch.tensor([0])},
                       seed_times={"item": torch.tensor([5]), "user": torch.tensor([6])})[0]
    assert rows(b, CLICKS) == [[0, 1]]  # item 0 at 5: not e2 (at 9)
    assert rows(b, FOLLOWS) == [[0]]  # user 0 at 6: not e1 (at 8)
    assert rows(b, CLICKED) == [[0, 3]]  # static: every edge
    # sources take the time of the row that drew them; (node, time) pairs are deduplicated per type
    assert b.src_nodes["user"].tolist() == [0, 0, 1, 1] and b.src_times["user"].tolist() == [6, 5, 5, 6]
    assert b.indices[CLICKS].tolist() == [1, 2] and b.indices[FOLLOWS].tolist() == [3]
    assert b.src_nodes["item"].tolist() == [0, 0, 1] and b.src_times["item"].tolist() == [5, 6, 6]
    assert b.indices[CLICKED].tolist() == [1, 2]
    assert b.dst_times == {"user": torch.tensor([6]), "item": torch.tensor([5])}
    # two layers: the inner rows inherit their seed's time, no future edge anywhere
    blocks = HeteroNeighborSampler(shop, [-1, -1], seed=0, edge_times=times).sample(
        {"item": torch.tensor([0])}, seed_times={"item": torch.tensor([2.5])})  # floored to 2
    outer = blocks[0]
    assert outer.dst_times["user"].tolist() == [2] and outer.dst_nodes["user"].tolist() == [0]
    assert rows(outer, CLICKS) == [[0]] and rows(outer, FOLLOWS) == [[]]  # item 0 at 2; u0 follows at 4, 8
    t_clicks = times[CLICKS].numpy()
    for blk in blocks:
        row_t = blk.dst_times["item"][blk.edge_dst(CLICKS)].numpy()
        assert (t_clicks[blk.edge_ids[CLICKS].numpy()] <= row_t).all()
    # float times on one relation make every time float64
    ft = {CLICKS: torch.tensor([1.0, 5.0, 9.0, 2.0, 3.0]), FOLLOWS: torch.tensor([4, 8, 0])}
    s = HeteroNeighborSampler(shop, [-1], seed=0, edge_times=ft)
    b = s.sample({"user": torch.tensor([0])}, seed_times={"user": torch.tensor([8])})[0]
    assert b.src_times["user"].dtype == torch.float64 and rows(b, FOLLOWS) == [[0, 1]]


def test_hetero_options_reject_bad_input_naming_argument_and_relation(shop):
    rel = r"\('user', 'clicks', 'item'\)"
    with pytest.raises(ValueError, match=r"weights: unknown relation \('user', 'x', 'item'\)"):
        HeteroNeighborSampler(shop, [2], weights={("user", "x", "item"): torch.ones(5)})
    with pytest.raises(ValueError, match=rf"weights\[{rel}\] must have shape \[5\]"):
        HeteroNeighborSampler(shop, [2], weights={CLICKS: torch.ones(4)})
    for bad in (float("nan"), -1.0, float("inf")):
        w = torch.ones(5)
        w[2] = bad
        with pytest.raises(ValueError, match=rf"weights\[{rel}\]: 1 of 5 weights are negative, NaN"):
            HeteroNeighborSampler(shop, [2], weights={CLICKS: w})
        with pytest.raises(ValueError, match=rf"weights\[{rel}\]: 1 of 5 weights"):
            HeteroGraph.from_edges(shop.num_nodes, {CLICKS: ([0] * 5, [0] * 5)}, weights={CLICKS: w})
    with pytest.raises(ValueError, match=r"weights\[\('user', 'follows', 'user'\)\]=True: the relation has"):
        HeteroNeighborSampler(shop, [2], weights={FOLLOWS: True})
    with pytest.raises(ValueError, match="weights=True needs a graph with edge weights on a sampled"):
        HeteroNeighborSampler(shop, {FOLLOWS: [2], CLICKED: [2]}, weights=True)  # neither has weights
    with pytest.raises(TypeError, match="weights must be a dict"):
        HeteroNeighborSampler(shop, [2], weights=torch.ones(5))
    with pytest.raises(ValueError, match=r"edge_times: unknown relation"):
        HeteroNeighborSampler(shop, [2], edge_times={("item", "x", "user"): torch.zeros(5)})
    with pytest.raises(ValueError, match=rf"edge_times\[{rel}\] must have shape \[5\]"):
        HeteroNeighborSampler(shop, [2], edge_times={CLICKS: torch.zeros(3)})
    with pytest.raises(ValueError, match=rf"edge_times\[{rel}\]: 1 of 5 times are NaN"):
        HeteroNeighborSampler(shop, [2], edge_times={CLICKS: torch.tensor([0.0, 1, float("nan"), 2, 3])})
    # seed and replace checked as NeighborSampler checks them (before, replace="no" meant True)
    for kw, err, msg in ((dict(replace="no"), TypeError, "replace must be a bool"),
                         (dict(replace=None), TypeError, "replace must be a bool"),
                         (dict(seed=1.5), TypeError, "seed must be an int"),
                         (dict(seed="7"), TypeError, "seed"),
                         (dict(seed=-1), ValueError, r"seed must be in \[0, 2\*\*64\)"),
                         (dict(seed=2**70), ValueError, "seed must be in")):
        with pytest.raises(err, match=msg):
            HeteroNeighborSampler(shop, [2], **kw)
    with pytest.raises(TypeError, match=r"fanouts\[0\] must be an int, got None"):
        HeteroNeighborSampler(shop, [None])
    with pytest.raises(ValueError, match=r"weights\[.*\]: 1 of 5 weights do not fit float32"):
        big = torch.tensor([1, 1, 1e39, 1, 1], dtype=torch.float64)
        HeteroNeighborSampler(shop, [2], weights={CLICKS: big})
    plain = HeteroNeighborSampler(shop, [2], seed=0)
    seeds = {"item": torch.tensor([0])}
    with pytest.raises(ValueError, match=r"exclude_eids: unknown relation"):
        plain.sample(seeds, exclude_eids={("a", "b", "c"): torch.tensor([0])})
    with pytest.raises(ValueError, match=rf"exclude_eids\[{rel}\]: 1 of 2 ids outside \[0, num_edges=5\)"):
        plain.sample(seeds, exclude_eids={CLICKS: torch.tensor([0, 5])})
    with pytest.raises(ValueError, match="no edge_times"):
        plain.sample(seeds, seed_times={"item": torch.tensor([1])})
    timed = HeteroNeighborSampler(shop, [2], seed=0, edge_times={CLICKS: torch.arange(5)})
    with pytest.raises(ValueError, match="seed_times is required"):
        timed.sample(seeds)
    with pytest.raises(ValueError, match=r"seed_times\['item'\] must have one time per seed \(\[1\]\)"):
        timed.sample(seeds, seed_times={"item": torch.tensor([1, 2])})
    with pytest.raises(ValueError, match=r"seed_times\['user'\] is required"):
        timed.sample({"item": torch.tensor([0]), "user": torch.tensor([1])}, seed_times={"item": [1]})
    with pytest.raises(ValueError, match=r"seed_times: node type 'user' has no seeds"):
        timed.sample(seeds, seed_times={"item": [1], "user": [1]})
    with pytest.raises(ValueError, match=r"seed_times\['item'\]: 1 of 1 times are NaN"):
        timed.sample(seeds, seed_times={"item": torch.tensor([float("nan")])})


def test_lastfm_hetero_weights_and_exclusion(data_root):
    from graphrl.datasets import load_lastfm

    ds = load_lastfm(data_root)
    graph = lastfm_hetero_graph(ds)
    rng = np.random.default_rng(0)
    n_listen, n_friend = graph.num_edges(LISTENS), graph.num_edges(FRIENDS)
    w = ds.train_weights.numpy().astype(np.float64) * (rng.random(n_listen) < 0.6)  # counts, 40 % zeroed
    excl = {HEARD: torch.from_numpy(rng.choice(n_listen, 8000, replace=False)),
            FRIENDS: torch.from_numpy(rng.choice(n_friend, 5000, replace=False))}
    fanouts = {LISTENS: [10, 10], HEARD: [10, 10], FRIENDS: [5, 5]}
    sampler = HeteroNeighborSampler(graph, fanouts, seed=2, weights={LISTENS: torch.from_numpy(w)})
    seeds = {"user": torch.from_numpy(rng.choice(1892, 256, replace=False)),
             "artist": torch.from_numpy(rng.choice(4489, 128, replace=False))}
    blocks = sampler.sample(seeds, exclude_eids=excl)
    dst_of = {LISTENS: ds.train_items.numpy(), HEARD: ds.train_users.numpy(),
              FRIENDS: np.repeat(np.arange(1892), ds.extra["friends"].in_degrees().numpy())[
                  np.argsort(ds.extra["friends"].csc_edge_ids().numpy())]}
    ok = {LISTENS: w > 0, HEARD: np.ones(n_listen, bool), FRIENDS: np.ones(n_friend, bool)}
    for rel, ids in excl.items():
        ok[rel][ids.numpy()] = False
    for b in blocks:
        for rel, k in ((LISTENS, 10), (HEARD, 10), (FRIENDS, 5)):
            eids = b.edge_ids[rel].numpy()
            assert ok[rel][eids].all(), f"{rel}: a zero-weight or excluded edge was drawn"
            eligible = np.bincount(dst_of[rel][ok[rel]], minlength=graph.num_nodes[rel[2]])
            counts = (b.indptr[rel][1:] - b.indptr[rel][:-1]).numpy()
            assert np.array_equal(counts, np.minimum(eligible[b.dst_nodes[rel[2]].numpy()], k))
    assert blocks[0].num_edges(LISTENS) > 1000 and blocks[0].num_edges(FRIENDS) > 100

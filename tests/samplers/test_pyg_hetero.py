"""PygSampler on HeteroData: our HeteroNeighborSampler behind PyG's NodeLoader / LinkLoader, batches laid out
as the HeteroData batches of PyG's NeighborLoader (pyg-lib's hetero_neighbor_sample)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from samplers import HeteroNeighborSampler, PygSampler

pyg = pytest.importorskip("torch_geometric", reason="torch_geometric not installed (install the 'pyg' extra)")
from torch_geometric.data import HeteroData  # noqa: E402
from torch_geometric.loader import LinkLoader, NodeLoader  # noqa: E402
from torch_geometric.sampler import HeteroSamplerOutput, NegativeSampling  # noqa: E402

pytestmark = pytest.mark.pyg

BUYS, REV, FOLLOWS = ("user", "buys", "item"), ("item", "rev_buys", "user"), ("user", "follows", "user")


def by_target(pairs) -> torch.Tensor:
    """``edge_index`` [2, E] of (src, dst) pairs sorted by (dst, src): one order of each row for all."""
    return torch.tensor(sorted(pairs, key=lambda p: (p[1], p[0])), dtype=torch.int64).t().contiguous()


@pytest.fixture(scope="module")
def small() -> HeteroData:
    """5 users, 4 items: user -buys-> item, its reverse, user -follows-> user (hand-made)."""
    d = HeteroData()
    d["user"].x = torch.arange(5.0).view(-1, 1)
    d["item"].x = torch.arange(4.0).view(-1, 1) + 100
    buys = [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3), (0, 3)]
    d[BUYS].edge_index = by_target(buys)
    d[REV].edge_index = by_target([(i, u) for u, i in buys])
    d[FOLLOWS].edge_index = by_target([(1, 0), (2, 1), (3, 2), (4, 3)])
    return d


@pytest.fixture(scope="module")
def rand() -> HeteroData:
    rng = np.random.default_rng(5)
    nu, ni = 30, 20
    buys = sorted(set(zip(rng.integers(0, nu, 90).tolist(), rng.integers(0, ni, 90).tolist(),
                          strict=True)))
    pairs = zip(rng.integers(0, nu, 60).tolist(), rng.integers(0, nu, 60).tolist(), strict=True)
    follows = sorted({(a, b) for a, b in pairs if a != b})
    d = HeteroData()
    d["user"].num_nodes, d["item"].num_nodes = nu, ni
    d[BUYS].edge_index = by_target(buys)
    d[REV].edge_index = by_target([(i, u) for u, i in buys])
    d[FOLLOWS].edge_index = by_target(follows)
    return d


def pyglib_reference(data: HeteroData, seeds: dict, hops: int):
    """pyg-lib's hetero_neighbor_sample with every neighbour, written out: each hop expands, edge type by
    edge type (``data.edge_types`` order), the nodes of the edge type's target type found at the previous
    hop, each row in column order of ``edge_index``; new sources are numbered in order of discovery."""
    node = {t: [int(v) for v in seeds.get(t, [])] for t in data.node_types}
    where = {t: {} for t in data.node_types}
    for t, ids in node.items():
        for i, v in enumerate(ids):
            where[t].setdefault(v, i)
    frontier = {t: list(range(len(ids))) for t, ids in node.items()}
    counts = {t: [len(ids)] for t, ids in node.items()}
    rows, cols, eids, ecounts = ({et: [] for et in data.edge_types} for _ in range(4))
    for _ in range(hops):
        found = {t: [] for t in data.node_types}
        for et in data.edge_types:
            s, _, d = et
            ei = data[et].edge_index
            m = 0
            for v in frontier[d]:
                for j in (ei[1] == node[d][v]).nonzero().view(-1).tolist():
                    u = int(ei[0, j])
                    if u not in where[s]:
                        where[s][u] = len(node[s])
                        node[s].append(u)
                        found[s].append(where[s][u])
                    rows[et].append(where[s][u])
                    cols[et].append(v)
                    eids[et].append(j)
                    m += 1
            ecounts[et].append(m)
        frontier = found
        for t in data.node_types:
            counts[t].append(len(found[t]))
    return node, rows, cols, eids, counts, ecounts


def check_hetero_layout(data: HeteroData, batch: HeteroData, seeds: dict, num_neighbors: dict) -> None:
    """NeighborLoader's hetero contract: seeds first, every edge a graph edge, hop counts consistent."""
    hops = len(next(iter(num_neighbors.values())))
    starts = {}
    for t in data.node_types:
        n_id = batch[t].n_id
        want = seeds.get(t, torch.empty(0, dtype=torch.int64))
        assert torch.equal(n_id[: want.numel()], want)
        assert n_id.unique().numel() == n_id.numel()
        ns = batch[t].num_sampled_nodes
        assert len(ns) == hops + 1 and sum(ns) == n_id.numel() and ns[0] == want.numel()
        starts[t] = np.cumsum([0, *ns])
    for et in data.edge_types:
        s, _, d = et
        (row, col), e_id = batch[et].edge_index, batch[et].e_id
        glob = torch.stack([batch[s].n_id[row], batch[d].n_id[col]])
        assert torch.equal(data[et].edge_index[:, e_id], glob)
        ne = batch[et].num_sampled_edges
        assert len(ne) == hops and sum(ne) == e_id.numel()
        estart = np.cumsum([0, *ne])
        deg = torch.bincount(data[et].edge_index[1], minlength=data[d].num_nodes)
        for hop, k in enumerate(num_neighbors[et]):  # hop h's edges enter the target-type nodes of hop h - 1
            tgt, src = col[estart[hop]:estart[hop + 1]], row[estart[hop]:estart[hop + 1]]
            lo, hi = int(starts[d][hop]), int(starts[d][hop + 1])
            assert bool(((tgt >= lo) & (tgt < hi)).all()) and bool((src < starts[s][hop + 2]).all())
            got = torch.bincount(tgt - lo, minlength=hi - lo)
            full = deg[batch[d].n_id[lo:hi]]
            assert torch.equal(got, full if k < 0 else torch.minimum(full, torch.tensor(k)))


def first_batch(data, sampler, seeds: torch.Tensor, input_type: str = "user") -> HeteroData:
    loader = NodeLoader(data, node_sampler=sampler, input_nodes=(input_type, seeds), batch_size=seeds.numel())
    return next(iter(loader))


# ------------------------------------------------------------------------------------------- structure
def test_builds_our_hetero_sampler_and_returns_hetero_sampler_output(small):
    s = PygSampler(small, {BUYS: [2, 1], REV: [1, 2], "user__follows__user": [0, 3]}, seed=3)
    assert isinstance(s.sampler, HeteroNeighborSampler) and s.graph.relations == small.edge_types
    assert s.sampler.fanouts == {BUYS: [1, 2], REV: [2, 1], FOLLOWS: [3, 0]}  # outermost first
    out = s.sample_nodes({"user": torch.tensor([0, 3])})
    assert isinstance(out, HeteroSamplerOutput) and set(out.node) == {"user", "item"}
    assert set(out.row) == set(out.col) == set(out.edge) == set(small.edge_types)
    assert set(out.num_sampled_edges) == set(small.edge_types)


def test_every_neighbour_exact_values_on_a_hand_made_graph(small):
    # seeds users [0, 3]. Hop 1: buys expands no item; rev_buys expands users 0 (<- items 0, 3) and 3
    # (<- item 2); follows expands 0 (<- user 1) and 3 (<- user 4). Hop 2: buys expands items 0, 3, 2,
    # rev_buys users 1, 4, follows users 1 (<- user 2, new) and 4 (no in-edge).
    b = first_batch(small, PygSampler(small, [-1, -1]), torch.tensor([0, 3]))
    assert b["user"].n_id.tolist() == [0, 3, 1, 4, 2] and b["item"].n_id.tolist() == [0, 3, 2]
    assert b["user"].num_sampled_nodes == [2, 2, 1] and b["item"].num_sampled_nodes == [0, 3, 0]
    # edge ids are columns of the (target, source)-sorted edge_index of each edge type
    assert b[BUYS].edge_index.tolist() == [[0, 2, 0, 3, 1], [0, 0, 1, 1, 2]]
    assert b[BUYS].e_id.tolist() == [0, 1, 4, 5, 3] and b[BUYS].num_sampled_edges == [0, 5]
    assert b[REV].edge_index.tolist() == [[0, 1, 2, 0, 1], [0, 0, 1, 2, 3]]
    assert b[REV].e_id.tolist() == [0, 1, 4, 2, 5] and b[REV].num_sampled_edges == [3, 2]
    assert b[FOLLOWS].edge_index.tolist() == [[2, 3, 4], [0, 1, 2]] and b[FOLLOWS].e_id.tolist() == [0, 3, 1]
    assert b[FOLLOWS].num_sampled_edges == [2, 1]
    assert b["user"].batch_size == 2 and b["user"].input_id.tolist() == [0, 1]
    assert torch.equal(b["user"].x.view(-1), b["user"].n_id.float())  # features gathered by n_id
    assert torch.equal(b["item"].x.view(-1), b["item"].n_id.float() + 100)


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_fanout_minus_one_is_pyglib_full_neighbourhood(rand, hops):
    for input_type, seeds in (("user", torch.tensor([4, 17, 0, 29])), ("item", torch.tensor([3, 11]))):
        b = first_batch(rand, PygSampler(rand, [-1] * hops, seed=1), seeds, input_type)
        node, rows, cols, eids, counts, ecounts = pyglib_reference(rand, {input_type: seeds}, hops)
        for t in rand.node_types:
            assert b[t].n_id.tolist() == node[t] and b[t].num_sampled_nodes == counts[t]
        for et in rand.edge_types:
            assert b[et].edge_index.tolist() == [rows[et], cols[et]] and b[et].e_id.tolist() == eids[et]
            assert b[et].num_sampled_edges == ecounts[et]
        check_hetero_layout(rand, b, {input_type: seeds}, {et: [-1] * hops for et in rand.edge_types})


@pytest.mark.parametrize("num_neighbors", [[2, 2], {BUYS: [3, 1], REV: [1, 2], FOLLOWS: [0, 2]}, [1, 2, 1]])
def test_sampled_batches_keep_the_layout(rand, num_neighbors):
    seeds = torch.tensor([4, 17, 0, 29, 8])
    s = PygSampler(rand, num_neighbors, seed=7)
    per_et = num_neighbors if isinstance(num_neighbors, dict) else dict.fromkeys(rand.edge_types,
                                                                                 num_neighbors)
    batches = [first_batch(rand, s, seeds) for _ in range(3)]  # three calls: three different draws
    for b in batches:
        check_hetero_layout(rand, b, {"user": seeds}, per_et)
    again = first_batch(rand, PygSampler(rand, num_neighbors, seed=7), seeds)
    assert torch.equal(again[REV].e_id, batches[0][REV].e_id)  # same seed, same first batch
    assert torch.equal(again["item"].n_id, batches[0]["item"].n_id)


def test_weight_attr_on_the_edge_types_that_have_it(rand):
    data = rand.clone()
    w = torch.ones(data[REV].edge_index.shape[1])
    w[::2] = 0.0  # even edge ids of rev_buys are never drawn
    data[REV].w = w
    s = PygSampler(data, [2, 2], seed=4, weight_attr="w")
    assert set(s.graph.weights) == {REV}
    drawn = 0
    for _ in range(5):
        b = first_batch(data, s, torch.arange(30))
        assert bool((b[REV].e_id % 2 == 1).all()) and b[REV].e_id.numel() > 0
        drawn += int(b[BUYS].e_id.numel())
    assert drawn > 0


def test_link_loader_on_hetero_data(rand):
    pos = rand[BUYS].edge_index[:, 5:25]
    ll = LinkLoader(rand, link_sampler=PygSampler(rand, [2, 2], seed=1), edge_label_index=(BUYS, pos),
                    neg_sampling=NegativeSampling("binary", amount=1), batch_size=8)
    for b in ll:
        p = b[BUYS].input_id.numel()
        eli = b[BUYS].edge_label_index
        assert eli.shape == (2, 2 * p)
        assert torch.equal(b[BUYS].edge_label, torch.cat([torch.ones(p), torch.zeros(p)]))
        assert torch.equal(b["user"].n_id[eli[0, :p]], pos[0, b[BUYS].input_id])
        assert torch.equal(b["item"].n_id[eli[1, :p]], pos[1, b[BUYS].input_id])
        seeds = {"user": torch.unique(b["user"].n_id[eli[0]]), "item": torch.unique(b["item"].n_id[eli[1]])}
        check_hetero_layout(rand, b, seeds, {et: [2, 2] for et in rand.edge_types})
    ll = LinkLoader(rand, link_sampler=PygSampler(rand, [2], seed=1), edge_label_index=(FOLLOWS, None),
                    neg_sampling=NegativeSampling("triplet", amount=2), batch_size=6)
    b = next(iter(ll))
    assert b["user"].dst_neg_index.shape == (6, 2)  # PyG keeps triplet indices on the node types
    ids = b[FOLLOWS].input_id
    assert torch.equal(b["user"].n_id[b["user"].src_index], rand[FOLLOWS].edge_index[0, ids])
    assert torch.equal(b["user"].n_id[b["user"].dst_pos_index], rand[FOLLOWS].edge_index[1, ids])


def test_bad_hetero_input_raises_naming_the_argument(small):
    with pytest.raises(ValueError, match="no number of neighbours for edge types"):
        PygSampler(small, {BUYS: [2], REV: [2]})
    with pytest.raises(ValueError, match="unknown edge type"):
        PygSampler(small, {BUYS: [2], REV: [2], FOLLOWS: [2], ("item", "x", "item"): [1]})
    with pytest.raises(ValueError, match="Number of hops must be the same across all edge types"):
        PygSampler(small, {BUYS: [2], REV: [2, 2], FOLLOWS: [2]})
    with pytest.raises(ValueError, match=r"num_neighbors\[1\]=-3"):
        PygSampler(small, [1, -3])
    with pytest.raises(ValueError, match="weight_attr='w'"):
        PygSampler(small, [2], weight_attr="w")
    s = PygSampler(small, [2])
    with pytest.raises(ValueError, match="typed inputs"):
        s.sample_from_nodes(pyg.sampler.NodeSamplerInput(input_id=None, node=torch.tensor([0])))



def test_num_neighbors_default_fills_the_edge_types_a_dict_leaves_out(small):
    # PyG's NumNeighbors(values, default=...) gives the left-out edge types the default list
    nn = pyg.sampler.base.NumNeighbors({BUYS: [-1, 0]}, default=[0, -1])
    s = PygSampler(small, nn)
    assert s.num_neighbors == {BUYS: [-1, 0], REV: [0, -1], FOLLOWS: [0, -1]}
    # item 0: hop 1 buys <- users 0, 1; hop 2 rev_buys user 0 <- items 0, 3, user 1 <- item 0, follows
    # user 0 <- user 1, user 1 <- user 2
    b = first_batch(small, s, torch.tensor([0]), "item")
    assert b[BUYS].num_sampled_edges == [2, 0] and b[REV].num_sampled_edges == [0, 3]
    assert b[FOLLOWS].num_sampled_edges == [0, 2] and b["user"].n_id.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="no number of neighbours for edge types"):
        PygSampler(small, pyg.sampler.base.NumNeighbors({BUYS: [2]}))

# ------------------------------------------------------------------------- a PyG hetero model trains
def synthetic_shop(seed: int = 0) -> HeteroData:
    """Users buy 5 items each; a user's class is whether the mean first feature of its items is positive;
    user features are noise, so a model must read its items."""
    g = torch.Generator().manual_seed(seed)
    nu, ni = 400, 120
    item_x = torch.randn(ni, 8, generator=g)
    users = torch.arange(nu).repeat_interleave(5)
    items = torch.randint(ni, (nu * 5,), generator=g)
    d = HeteroData()
    d["user"].x = torch.randn(nu, 8, generator=g)
    d["item"].x = item_x
    d["user"].y = (item_x[items, 0].view(nu, 5).mean(1) > 0).long()
    d[BUYS].edge_index = torch.stack([users, items])
    d[REV].edge_index = torch.stack([items, users])
    d[FOLLOWS].edge_index = torch.randint(nu, (2, 800), generator=g)
    return d


def test_to_hetero_sage_trains_one_epoch_through_node_loader():
    from torch_geometric.nn import SAGEConv, to_hetero

    class Sage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = SAGEConv((-1, -1), 32), SAGEConv((-1, -1), 2)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    data = synthetic_shop()
    torch.manual_seed(0)
    model = to_hetero(Sage(), data.metadata(), aggr="sum")
    loader = NodeLoader(data, node_sampler=PygSampler(data, [5, 5], seed=0),
                        input_nodes=("user", torch.arange(320)), batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # lazy layers take their shapes from a first batch
        warm = next(iter(loader))
        model(warm.x_dict, warm.edge_index_dict)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for b in loader:
        assert isinstance(b, HeteroData)
        opt.zero_grad()
        bs = b["user"].batch_size
        out = model(b.x_dict, b.edge_index_dict)["user"][:bs]
        loss = torch.nn.functional.cross_entropy(out, b["user"].y[:bs])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert len(losses) == 20
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    print(f"to_hetero(SAGE) through NodeLoader+PygSampler, 1 epoch: loss {first:.3f} -> {last:.3f}")
    assert last < first - 0.1

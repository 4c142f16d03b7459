"""PygSampler's PyG options: disjoint, time_attr ("uniform", "last"; node and edge times), induced and
bidirectional subgraphs, backward sampling, (FeatureStore, GraphStore) input, num_neighbors=[] and graphs
without edges; values by hand or from networkx."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

from samplers import PygSampler

pyg = pytest.importorskip("torch_geometric", reason="torch_geometric not installed (install the 'pyg' extra)")
from torch_geometric.data import Data, HeteroData  # noqa: E402
from torch_geometric.loader import LinkLoader, NodeLoader  # noqa: E402
from torch_geometric.sampler import EdgeSamplerInput, NodeSamplerInput  # noqa: E402
from torch_geometric.testing import MyFeatureStore, MyGraphStore  # noqa: E402

pytestmark = pytest.mark.pyg


@pytest.fixture(scope="module")
def rand() -> Data:
    rng = np.random.default_rng(3)
    n, e = 60, 300
    ei = torch.unique(torch.from_numpy(np.stack([rng.integers(0, n, e), rng.integers(0, n, e)])), dim=1)
    return Data(edge_index=ei, num_nodes=n, time=torch.from_numpy(rng.integers(0, 20, n)),
                edge_time=torch.from_numpy(rng.integers(0, 20, ei.shape[1])))


def nodes_of(sampler: PygSampler, seeds, times=None):
    return sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.as_tensor(seeds),
                                                      time=None if times is None else torch.as_tensor(times)))


def in_neighbourhood(ei: torch.Tensor, node: int, hops: int) -> set:
    g = nx.DiGraph(ei.t().tolist())
    g.add_node(node)
    return set(nx.single_source_shortest_path_length(g.reverse(), node, cutoff=hops))


def test_disjoint_every_seed_its_own_full_subgraph(rand):
    seeds = torch.tensor([3, 7, 3, 11])
    out = nodes_of(PygSampler(rand, [-1, -1], disjoint=True), seeds)
    assert torch.equal(out.node[:4], seeds) and torch.equal(out.batch[:4], torch.arange(4))
    for b, s in enumerate(seeds.tolist()):
        mine = out.node[out.batch == b]
        assert mine.unique().numel() == mine.numel()  # within a seed, a node once
        assert set(mine.tolist()) == in_neighbourhood(rand.edge_index, s, 2)
    assert (out.batch[out.row] == out.batch[out.col]).all()  # no edge between two seeds' subgraphs
    assert torch.equal(rand.edge_index[:, out.edge], torch.stack([out.node[out.row], out.node[out.col]]))


@pytest.mark.parametrize("attr", ["time", "edge_time"])
def test_temporal_uniform_draws_only_the_past(rand, attr):
    sampler = PygSampler(rand, [3, 3], time_attr=attr, seed=1)
    assert sampler.disjoint and sampler.is_temporal
    seeds, times = torch.arange(0, 60, 5), torch.tensor([5, 9, 0, 19, 12, 3, 7, 15, 2, 8, 11, 6])
    out = nodes_of(sampler, seeds, times)
    seed_time = times[out.batch]
    if attr == "time":
        assert (rand.time[out.node[out.row]] <= seed_time[out.row]).all()
    else:
        assert (rand.edge_time[out.edge] <= seed_time[out.col]).all()
    assert all(c <= 3 for c in torch.bincount(out.col).tolist())


def test_temporal_last_takes_the_latest_neighbours():
    # node 0's in-neighbours 1..6 with times 6, 1, 5, 2, 9, 3; at time 6 the 2 latest are 1 (6) and 3 (5)
    ei = torch.tensor([[1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 0]])
    data = Data(edge_index=ei, num_nodes=7, time=torch.tensor([0, 6, 1, 5, 2, 9, 3]))
    out = nodes_of(PygSampler(data, [2], time_attr="time", temporal_strategy="last"), [0, 0], [6, 2])
    got = {b: sorted(out.node[out.row[out.batch[out.col] == b]].tolist()) for b in (0, 1)}
    assert got == {0: [1, 3], 1: [2, 4]}
    with pytest.raises(ValueError, match="temporal_strategy"):
        PygSampler(data, [2], time_attr="time", temporal_strategy="first")


def test_hetero_temporal_static_types_and_seed_times_from_node_times():
    data = HeteroData()
    data["a"].num_nodes = 4
    data["b"].num_nodes = 4
    data["b"].time = torch.tensor([0, 5, 1, 7])
    for et in [("b", "to", "a"), ("a", "to", "b")]:
        data[et].edge_index = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])
    out = PygSampler(data, [-1], time_attr="time").sample_from_nodes(
        NodeSamplerInput(input_id=None, node=torch.tensor([0, 1, 2, 3]), time=torch.tensor([3, 3, 3, 3]),
                         input_type="a"))
    assert out.node["b"].tolist() == [0, 2]  # b nodes of time <= 3 only
    assert out.batch["b"].tolist() == [0, 2]


def test_bad_seed_times_are_refused_naming_the_argument(rand):
    s = PygSampler(rand, [3], time_attr="edge_time")
    with pytest.raises(ValueError, match=r"seed_time .* shape \[5\].*got \[3\]"):
        nodes_of(s, torch.arange(5), torch.zeros(3))
    with pytest.raises(ValueError, match=r"seed_time .* shape \[5\].*got \[5, 2\]"):
        nodes_of(s, torch.arange(5), torch.zeros(5, 2))
    with pytest.raises(ValueError, match=r"seed_time holds NaN at positions \[1\]"):  # not "every edge"
        nodes_of(s, torch.arange(3), torch.tensor([1.0, float("nan"), 2.0]))
    with pytest.raises(TypeError, match="seed_time must hold integer or float times, got dtype bool"):
        nodes_of(s, torch.arange(2), torch.tensor([True, False]))
    out = nodes_of(s, torch.arange(5), torch.full((5,), -1, dtype=torch.int16))  # times before every edge
    assert out.node.tolist() == [0, 1, 2, 3, 4] and out.edge.numel() == 0


def test_times_not_one_per_node_or_edge_are_refused_naming_time_attr(rand):
    d = Data(edge_index=rand.edge_index, num_nodes=60, t2=torch.zeros(60, 2),
             tb=torch.zeros(60, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"time_attr='t2' .* shape \[60\], one time per node, got \[60, 2\]"):
        PygSampler(d, [2], time_attr="t2")
    with pytest.raises(TypeError, match="time_attr='tb' .* must hold integer or float times, got torch.bool"):
        PygSampler(d, [2], time_attr="tb")


def test_induced_is_the_graphs_subgraph_on_the_sampled_nodes(rand):
    out = nodes_of(PygSampler(rand, [2, 2], subgraph_type="induced", seed=4), [0, 9, 30])
    assert out.num_sampled_nodes is None and out.num_sampled_edges is None
    nodes = set(out.node.tolist())
    want = sorted(j for j, (u, v) in enumerate(rand.edge_index.t().tolist()) if u in nodes and v in nodes)
    assert sorted(out.edge.tolist()) == want
    assert torch.equal(rand.edge_index[:, out.edge], torch.stack([out.node[out.row], out.node[out.col]]))
    with pytest.raises(ValueError, match="'disjoint' sampling not supported"):
        PygSampler(rand, [2], subgraph_type="induced", disjoint=True)


def test_bidirectional_adds_every_reverse_edge(rand):
    out = nodes_of(PygSampler(rand, [3, 2], subgraph_type="bidirectional", seed=2), [1, 2, 3])
    pairs = set(zip(out.row.tolist(), out.col.tolist(), strict=True))
    assert pairs == {(c, r) for r, c in pairs}


def test_backward_is_forward_on_the_reversed_graph(rand):
    rev = Data(edge_index=rand.edge_index.flip(0), num_nodes=rand.num_nodes)
    a = nodes_of(PygSampler(rand, [3, 2], sample_direction="backward", seed=5), [4, 8])
    b = nodes_of(PygSampler(rev, [3, 2], seed=5), [4, 8])
    assert torch.equal(a.node, b.node) and torch.equal(a.edge, b.edge)
    assert torch.equal(a.row, b.col) and torch.equal(a.col, b.row)
    with pytest.raises(NotImplementedError, match="Temporal Sampling not yet supported for backward"):
        PygSampler(rand, [2], sample_direction="backward", time_attr="time")


def test_feature_and_graph_store_input_equals_data(rand):
    fs, gs = MyFeatureStore(), MyGraphStore()
    fs.put_tensor(torch.arange(60.0).view(-1, 1), group_name=None, attr_name="x", index=None)
    gs.put_edge_index((rand.edge_index[0], rand.edge_index[1]), edge_type=None, layout="coo", size=(60, 60))
    a = nodes_of(PygSampler((fs, gs), [4, 3], seed=8), [5, 6])
    b = nodes_of(PygSampler(rand, [4, 3], seed=8), [5, 6])
    assert torch.equal(a.node, b.node) and torch.equal(a.edge, b.edge)
    with pytest.raises(NotImplementedError, match="'weight_attr' argument not yet supported"):
        PygSampler((fs, gs), [2], weight_attr="w")


def test_no_hops_and_no_edges_give_the_seeds_alone(rand):
    out = nodes_of(PygSampler(rand, []), [4, 2, 4])
    assert out.node.tolist() == [4, 2, 4] and out.row.numel() == 0 and out.num_sampled_nodes == [3]
    loader = NodeLoader(Data(num_nodes=5), node_sampler=PygSampler(Data(num_nodes=5), [2, 2]), batch_size=5)
    batch = next(iter(loader))
    assert batch.n_id.tolist() == [0, 1, 2, 3, 4] and batch.num_edges == 0


def test_disjoint_link_loader_follows_pygs_edge_sample(rand):
    sampler = PygSampler(rand, [2], time_attr="edge_time", seed=3)
    out = sampler.sample_from_edges(EdgeSamplerInput(input_id=torch.arange(3), row=torch.tensor([0, 1, 2]),
                                                     col=torch.tensor([5, 6, 7]), time=torch.full((3,), 9)))
    _, label_index, _, seed_time = out.metadata
    assert label_index.tolist() == [[0, 1, 2], [3, 4, 5]] and seed_time.tolist() == [9, 9, 9]
    assert out.node[:6].tolist() == [0, 1, 2, 5, 6, 7] and out.batch[:6].tolist() == [0, 1, 2, 0, 1, 2]
    loader = LinkLoader(rand, link_sampler=sampler, edge_label_index=rand.edge_index[:, :8],
                        edge_label_time=torch.full((8,), 10), neg_sampling="binary", batch_size=4)
    batch = next(iter(loader))
    assert batch.edge_label.tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert (batch.edge_time <= 10).all()

"""A typed LaborSampler (LastFM users, artists, friendships) behind PygSampler and DglSampler through
``sampler=``: the batches are those of calling the sampler itself with the same seed; PyG outputs and
loader batches carry LABOR's edge weights as ``edge_weight`` aligned with ``e_id`` (plain and typed);
LaborSampler's argument errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from samplers import LaborSampler, NeighborLoader
from samplers._checks import check_seed
from samplers.hetero_graph import HeteroGraph, lastfm_hetero_graph
from samplers.protocol import edges_by_id

SEEDS = torch.tensor([0, 1, 100, 1500, 7])


@pytest.fixture(scope="module")
def lastfm(data_root) -> tuple[HeteroGraph, dict]:
    """LastFM as a HeteroGraph and its edges per relation in edge-id order (real data)."""
    from graphrl.datasets import load_lastfm

    graph = lastfm_hetero_graph(load_lastfm(data_root))
    edges = {}
    for rel in graph.relations:
        src, dst = edges_by_id(graph, rel)
        edges[rel] = (torch.from_numpy(src), torch.from_numpy(dst))
    return graph, edges


def labor(graph, **kw) -> LaborSampler:
    return LaborSampler(graph, [6, 4], seed=3, importance_sampling=1, **kw)


def pairs(eids: torch.Tensor, weights: torch.Tensor) -> set:
    return set(zip(eids.tolist(), weights.tolist(), strict=True))


def check_pyg_output(out, blocks, edges: dict, seeds: dict, typed: bool) -> None:
    """PyG's expand-once layout of ``blocks``: seeds first; hop 1 is the whole innermost block (edge ids and
    weights); every later hop's (edge id, weight) pairs are edges of its block; endpoints are the graph's."""
    for rel, (src, dst) in edges.items():
        get = (lambda v, r=rel: v[r]) if typed else (lambda v: v)
        get_node = (lambda v, t: v[t]) if typed else (lambda v, t: v)
        eid, weight, ne = get(out.edge), get(out.edge_weight), get(out.num_sampled_edges)
        assert weight.dtype == torch.float32 and weight.shape == eid.shape
        assert torch.equal(src[eid], get_node(out.node, rel[0])[get(out.row)])
        assert torch.equal(dst[eid], get_node(out.node, rel[-1])[get(out.col)])
        start = np.cumsum([0, *ne])
        for hop, block in enumerate(reversed(blocks)):
            want = pairs(get(block.edge_ids), get(block.edge_weights))
            got = pairs(eid[start[hop]:start[hop + 1]], weight[start[hop]:start[hop + 1]])
            assert got == want if hop == 0 else got <= want
    for t, s in seeds.items():
        assert torch.equal(get_node(out.node, t)[:s.numel()], s)


def test_typed_labor_through_pyg_sampler_and_node_loader(lastfm):
    pyg = pytest.importorskip("torch_geometric")
    from samplers import PygSampler

    graph, edges = lastfm
    data = pyg.data.HeteroData()
    for t, n in graph.num_nodes.items():
        data[t].num_nodes = n
    for rel, (src, dst) in edges.items():
        data[rel].edge_index = torch.stack([src, dst])
    adapter = PygSampler(data, sampler=labor(graph))
    seeds = {"user": SEEDS}
    out = adapter.sample_nodes(seeds)
    want = labor(graph).sample(seeds)
    check_pyg_output(out, want, edges, seeds, typed=True)
    loader = PygSampler.keep_edge_weight(pyg.loader.NodeLoader(
        data, node_sampler=PygSampler(data, sampler=labor(graph)), input_nodes=("user", SEEDS),
        batch_size=SEEDS.numel()))
    batch = next(iter(loader))
    for rel in edges:
        assert torch.equal(batch[rel].e_id, out.edge[rel])
        assert torch.equal(batch[rel].edge_weight, out.edge_weight[rel])
    listens = ("user", "listens", "artist")
    links = PygSampler.keep_edge_weight(pyg.loader.LinkLoader(
        data, link_sampler=PygSampler(data, sampler=labor(graph)),
        edge_label_index=(listens, torch.stack(edges[listens])[:, :6]), batch_size=6))
    batch = next(iter(links))  # the links' users and artists are the seeds, sorted (torch.unique)
    ends = {"user": edges[listens][0][:6].unique(), "artist": edges[listens][1][:6].unique()}
    direct = PygSampler(data, sampler=labor(graph)).sample_nodes(ends)
    check_pyg_output(direct, labor(graph).sample(ends), edges, ends, typed=True)
    for rel in edges:
        assert torch.equal(batch[rel].e_id, direct.edge[rel])
        assert torch.equal(batch[rel].edge_weight, direct.edge_weight[rel])
    with pytest.raises(ValueError, match="HeteroGraph"):  # a plain sampler for HeteroData
        PygSampler(data, sampler=LaborSampler(CSCGraph.from_edges(*edges[("user", "friends", "user")],
                                                                  graph.num_nodes["user"]), [2]))
    shuffled = {rel: (src.flip(0), dst.flip(0)) for rel, (src, dst) in edges.items()}
    with pytest.raises(ValueError, match="edge ids of"):
        PygSampler(data, sampler=labor(HeteroGraph.from_edges(graph.num_nodes, shuffled)))


def test_plain_labor_edge_weight_reaches_pyg_batches():
    pyg = pytest.importorskip("torch_geometric")
    from samplers import PygSampler

    rng = np.random.default_rng(1)
    src, dst = torch.from_numpy(rng.integers(0, 200, 2_000)), torch.from_numpy(rng.integers(0, 200, 2_000))
    data = pyg.data.Data(edge_index=torch.stack([src, dst]), num_nodes=200)
    ours = CSCGraph.from_edges(src, dst, 200)
    seeds = torch.arange(10)
    out = PygSampler(data, sampler=labor(ours)).sample_nodes(seeds)
    check_pyg_output(out, labor(ours).sample(seeds), {("n", "e", "n"): (src, dst)}, {"n": seeds}, typed=False)
    loader = PygSampler.keep_edge_weight(pyg.loader.NodeLoader(
        data, node_sampler=PygSampler(data, sampler=labor(ours)), input_nodes=seeds, batch_size=10))
    batch = next(iter(loader))
    assert torch.equal(batch.e_id, out.edge) and torch.equal(batch.edge_weight, out.edge_weight)
    loader = PygSampler.keep_edge_weight(PygSampler.keep_edge_weight(pyg.loader.NodeLoader(
        data, node_sampler=PygSampler(data, sampler=labor(ours)), input_nodes=seeds, batch_size=10,
        transform=pyg.transforms.ToUndirected())))  # the transform sees the weights (was: added after it)
    batch = next(iter(loader))
    assert batch.edge_weight.shape == batch.e_id.shape and batch.edge_index.shape[1] > out.edge.numel()
    plain = PygSampler(data, sampler=LaborSampler(ours, [4, 4], seed=0)).sample_nodes(seeds)  # unweighted
    want = LaborSampler(ours, [4, 4], seed=0).sample(seeds)
    assert plain.edge_weight is None and torch.equal(plain.node[:10], seeds)
    got = set(plain.edge.tolist())  # PyG's layout expands each node once: a subset of the blocks' edges
    assert set(want[-1].edge_ids.tolist()) <= got <= set(torch.cat([b.edge_ids for b in want]).tolist())
    assert torch.equal(dst[plain.edge], plain.node[plain.col])
    assert torch.equal(src[plain.edge], plain.node[plain.row])
    assert PygSampler(data, [3]).sample_nodes(seeds).edge_weight is None  # our neighbour sampler: none
    theirs = pyg.loader.NodeLoader(data, node_sampler=pyg.sampler.NeighborSampler(data, [3]),
                                   input_nodes=seeds)
    with pytest.raises(TypeError, match="NeighborSampler, not a PygSampler"):
        PygSampler.keep_edge_weight(theirs)
    with pytest.raises(ValueError, match="disjoint"):
        PygSampler(data, disjoint=True, sampler=labor(ours))


def test_typed_labor_through_dgl_sampler(lastfm):
    from graphrl.dglshim import dgl_available, import_dgl

    if not dgl_available():
        pytest.skip("DGL not installed (install the 'dgl' extra)")
    from samplers import DglSampler

    dgl = import_dgl()
    graph, edges = lastfm
    g = dgl.heterograph({rel: e for rel, e in edges.items()}, num_nodes_dict=dict(graph.num_nodes))
    if list(g.canonical_etypes) != list(graph.relations):  # DGL sorts edge types: rebuild ours in its order
        graph = HeteroGraph.from_edges(dict(graph.num_nodes), {rel: edges[rel] for rel in g.canonical_etypes})
    adapter = DglSampler(sampler=labor(graph))
    seeds = {"user": SEEDS}
    input_nodes, output_nodes, blocks = adapter.sample(g, seeds)
    want = labor(graph).sample(seeds)
    assert all(torch.equal(input_nodes[t], want[0].src_nodes[t].to(g.idtype)) for t in g.ntypes)
    assert torch.equal(output_nodes["user"], SEEDS.to(g.idtype))
    for got, ref in zip(blocks, want, strict=True):
        for rel in g.canonical_etypes:
            assert torch.equal(got.edges[rel].data[dgl.EID].to(torch.int64), ref.edge_ids[rel])
            assert torch.equal(got.edges[rel].data["edge_weights"], ref.edge_weights[rel])
    other = dgl.heterograph({rel: (e[0].flip(0), e[1].flip(0)) for rel, e in edges.items()},
                            num_nodes_dict=dict(graph.num_nodes))
    with pytest.raises(ValueError, match="edge ids of"):
        adapter.sample(other, seeds)


def test_our_loaders_refuse_a_typed_sampler_naming_it(lastfm):
    graph, _ = lastfm
    friends = CSCGraph.from_edges(np.arange(3), np.arange(3), 3)
    with pytest.raises(TypeError, match="LaborSampler's graph is a HeteroGraph"):
        NeighborLoader(friends, torch.arange(3), batch_size=2, sampler=labor(graph))


def test_labor_argument_errors_name_what_is_accepted():
    g = CSCGraph.from_edges(np.arange(3), np.arange(3), 3)
    with pytest.raises(TypeError, match=r"^seed must be an int, got None$"):
        LaborSampler(g, [2], seed=None)
    with pytest.raises(TypeError, match=r"seed must be an int, got 1.5"):
        LaborSampler(g, [2], seed=1.5)
    with pytest.raises(TypeError, match=r"^layer_dependency must be True or False, got 'no'$"):
        LaborSampler(g, [2], layer_dependency="no")
    assert LaborSampler(g, [2], layer_dependency=np.bool_(True)).layer_dependency is True
    assert check_seed("seed", None, allow_none=True) is None
    with pytest.raises(TypeError, match=r"seed must be an int or None, got 'x'"):
        check_seed("seed", "x", allow_none=True)
    with pytest.raises(TypeError, match=r"seed must be an int or None, got 'x'"):
        NeighborLoader(g, torch.arange(3), [2], batch_size=2, seed="x")

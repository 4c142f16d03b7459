"""Interop: our blocks as DGL blocks (DGL layers give the same outputs as on DGL's own blocks), back from
DGL, and PyG's NeighborLoader layout (a real torch_geometric Data where PyG is installed, a PygSubgraph
where it is not)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from test_neighbor import blocks_equal, edge_endpoints

from graphrl.graph import CSCGraph
from samplers import Blocks, NeighborSampler, PygSubgraph
from samplers.block import Block


@pytest.fixture(scope="module")
def graph() -> CSCGraph:
    rng = np.random.default_rng(3)
    n, e = 120, 1500
    return CSCGraph.from_edges(rng.integers(0, n, e), np.minimum(rng.geometric(0.03, e) - 1, n - 1), n)


def dgl_graph(dgl, graph: CSCGraph):
    src, dst = edge_endpoints(graph)
    return dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=graph.num_nodes)


# --------------------------------------------------------------------------------------------- DGL
@pytest.mark.dgl
def test_to_dgl_keeps_edges_ids_and_order_and_round_trips(dgl, graph):
    blocks = NeighborSampler(graph, [4, 3], seed=0).sample(torch.tensor([5, 9, 0, 77]))
    assert isinstance(blocks, Blocks) and isinstance(blocks, list)
    for b in blocks:
        d = b.to_dgl()
        assert d.is_block and d.num_src_nodes() == b.num_src_nodes and d.num_dst_nodes() == b.num_dst_nodes
        src, dst = d.edges(order="eid")
        assert torch.equal(src, b.indices) and torch.equal(dst, b.edge_dst())
        assert torch.equal(d.srcdata[dgl.NID], b.src_nodes) and torch.equal(d.dstdata[dgl.NID], b.dst_nodes)
        assert torch.equal(d.edata[dgl.EID], b.edge_ids)
    assert blocks_equal([Block.from_dgl(b.to_dgl()) for b in blocks], blocks)


@pytest.mark.dgl
def test_from_dgl_reads_dgl_full_neighbour_blocks(dgl, graph):
    seeds = torch.tensor([3, 50, 7, 119])
    full = dgl.dataloading.MultiLayerFullNeighborSampler(2)
    _, _, theirs = full.sample_blocks(dgl_graph(dgl, graph), seeds)
    ours = NeighborSampler(graph, [-1, -1], seed=0).sample(seeds)
    src_of, dst_of = edge_endpoints(graph)
    for t, o in zip(theirs, ours, strict=True):
        b = Block.from_dgl(t)
        assert torch.equal(b.src_nodes[: b.num_dst_nodes], b.dst_nodes)
        assert torch.equal(b.dst_nodes, t.dstdata[dgl.NID])
        assert np.array_equal(b.src_nodes.numpy()[b.indices.numpy()], src_of[b.edge_ids.numpy()])
        assert np.array_equal(b.dst_nodes.numpy()[b.edge_dst().numpy()], dst_of[b.edge_ids.numpy()])
        assert sorted(b.edge_ids.tolist()) == sorted(o.edge_ids.tolist())
    with pytest.raises(TypeError, match="dgl_block"):
        Block.from_dgl(dgl_graph(dgl, graph))


@pytest.mark.dgl
@pytest.mark.parametrize("layer", ["sage_mean", "sage_gcn", "graphconv_both", "graphconv_right"])
def test_dgl_layers_on_our_blocks_equal_dgl_full_neighbour_blocks(dgl, graph, layer):
    from dgl.nn import GraphConv, SAGEConv

    torch.manual_seed(0)
    feats = [8, 16, 4]

    def make(i):
        if layer.startswith("sage"):
            return SAGEConv(feats[i], feats[i + 1], layer.split("_")[1])
        return GraphConv(feats[i], feats[i + 1], norm=layer.split("_")[1], allow_zero_in_degree=True)

    convs = [make(0), make(1)]  # fixed weights, shared by both runs
    x = torch.randn(graph.num_nodes, feats[0])
    seeds = torch.tensor([3, 50, 7, 119, 0, 64])

    def run(dgl_blocks):
        h = x[dgl_blocks[0].srcdata[dgl.NID]]
        for conv, blk in zip(convs, dgl_blocks, strict=True):
            h = conv(blk, h)
        return h

    ours = [b.to_dgl() for b in NeighborSampler(graph, [-1, -1], seed=0).sample(seeds)]
    full = dgl.dataloading.MultiLayerFullNeighborSampler(2)
    _, _, theirs = full.sample_blocks(dgl_graph(dgl, graph), seeds)
    assert torch.equal(ours[-1].dstdata[dgl.NID], theirs[-1].dstdata[dgl.NID])
    with torch.no_grad():
        torch.testing.assert_close(run(ours), run(theirs), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------- PyG
def pyg_reference(graph: CSCGraph, seeds: list[int], hops: int) -> tuple:
    """PyG's NeighborLoader with every neighbour (pyg-lib's order): expand each node once, at the hop
    after the one that discovered it; edges of a node in CSC order."""
    indptr, indices = graph.indptr.tolist(), graph.indices.tolist()
    eids = graph.csc_edge_ids().tolist()
    n_id = list(seeds)
    local = {}
    for i, v in enumerate(seeds):
        local.setdefault(v, i)
    frontier = list(range(len(seeds)))
    rows, cols, e_id, nodes, edges = [], [], [], [len(seeds)], []
    for _ in range(hops):
        new = []
        count = 0
        for t in frontier:
            v = n_id[t]
            for p in range(indptr[v], indptr[v + 1]):
                u = indices[p]
                if u not in local:
                    local[u] = len(n_id)
                    n_id.append(u)
                    new.append(local[u])
                rows.append(local[u])
                cols.append(t)
                e_id.append(eids[p])
                count += 1
        nodes.append(len(new))
        edges.append(count)
        frontier = new
    return n_id, [rows, cols], e_id, nodes, edges


@pytest.fixture(params=[pytest.param("with_pyg", marks=pytest.mark.pyg), "without_pyg"])
def pyg_installed(request, monkeypatch) -> bool:
    """Run a test with PyG, and again as if it were not installed (``sys.modules`` entry None: any
    ``import torch_geometric`` raises ModuleNotFoundError)."""
    if request.param == "without_pyg":
        monkeypatch.setitem(sys.modules, "torch_geometric", None)
        return False
    pytest.importorskip("torch_geometric", reason="torch_geometric not installed (install the 'pyg' extra)")
    return True


def tiny() -> CSCGraph:
    """Five nodes, edge i = src[i] -> dst[i]."""
    src, dst = [1, 2, 0, 3, 0, 4, 2], [0, 0, 1, 1, 2, 3, 4]
    return CSCGraph.from_edges(torch.tensor(src), torch.tensor(dst), 5)


def check_type(out, pyg_installed: bool) -> None:
    if pyg_installed:
        from torch_geometric.data import Data

        assert type(out) is Data
    else:
        assert type(out) is PygSubgraph


def test_to_pyg_exact_values_on_a_hand_made_graph(pyg_installed):
    # seeds [3, 0]; hop 1 expands 3 (<- 4 by e5) and 0 (<- 1 by e0, <- 2 by e1); hop 2 expands 4, 1, 2
    blocks = NeighborSampler(tiny(), [-1, -1], seed=0).sample(torch.tensor([3, 0]))
    out = blocks.to_pyg(input_id=torch.tensor([10, 11]))
    check_type(out, pyg_installed)
    assert out.n_id.tolist() == [3, 0, 4, 1, 2]
    assert out.edge_index.tolist() == [[2, 3, 4, 4, 1, 0, 1], [0, 1, 1, 2, 3, 3, 4]]
    assert out.e_id.tolist() == [5, 0, 1, 6, 2, 3, 4]
    assert out.num_sampled_nodes == [2, 3, 0] and out.num_sampled_edges == [3, 4]
    assert out.batch_size == 2 and out.num_nodes == 5 and out.input_id.tolist() == [10, 11]
    # fanout 1: block 0 drew 0 <- 2 (e1) for node 0, a row PyG does not expand at hop 2, so it is left
    # out; node 2 comes in through node 4's row (e6) instead
    out = NeighborSampler(tiny(), [1, 1], seed=0).sample(torch.tensor([3, 0])).to_pyg()
    check_type(out, pyg_installed)
    assert out.n_id.tolist() == [3, 0, 4, 1, 2]
    assert out.edge_index.tolist() == [[2, 3, 4, 0], [0, 1, 2, 3]] and out.e_id.tolist() == [5, 0, 6, 3]
    assert out.num_sampled_nodes == [2, 2, 1] and out.num_sampled_edges == [2, 2]
    assert out.input_id is None if not pyg_installed else "input_id" not in out


@pytest.mark.pyg
def test_to_pyg_data_runs_a_pyg_layer():
    pytest.importorskip("torch_geometric", reason="torch_geometric not installed (install the 'pyg' extra)")
    from torch_geometric.nn import SAGEConv

    out = NeighborSampler(tiny(), [-1, -1], seed=0).sample(torch.tensor([3, 0])).to_pyg()
    out.x = torch.arange(5.0).view(-1, 1)[out.n_id]
    torch.manual_seed(0)
    h = SAGEConv(1, 4)(out.x, out.edge_index)
    assert h.shape == (5, 4) and out.validate()


def test_to_pyg_with_every_neighbour_is_pyg_neighbor_loader_output(graph, pyg_installed):
    seeds = [3, 50, 7, 119, 0]
    for hops in (1, 2, 3):
        out = NeighborSampler(graph, [-1] * hops, seed=0).sample(torch.tensor(seeds)).to_pyg()
        check_type(out, pyg_installed)
        n_id, edge_index, e_id, nodes, edges = pyg_reference(graph, seeds, hops)
        assert out.n_id.tolist() == n_id and out.edge_index.tolist() == edge_index
        assert out.e_id.tolist() == e_id
        assert out.num_sampled_nodes == nodes and out.num_sampled_edges == edges
        assert out.batch_size == len(seeds) and out.num_nodes == len(n_id)
        assert out.edge_index.dtype == out.n_id.dtype == out.e_id.dtype == torch.int64


def test_to_pyg_invariants_with_fanouts(graph):
    src_of, dst_of = edge_endpoints(graph)
    seeds = torch.tensor([3, 50, 7, 119, 0, 64, 22])
    for replace, fanouts in ((False, [3, 4, 2]), (True, [2, 2, 5])):
        blocks = NeighborSampler(graph, fanouts, replace=replace, seed=4).sample(seeds)
        out = blocks.to_pyg()
        n_id, (row, col), e_id = out.n_id, out.edge_index, out.e_id
        assert torch.equal(n_id[: out.batch_size], seeds)
        assert len(set(n_id.tolist())) == n_id.numel()  # every node once (seeds distinct here)
        assert sum(out.num_sampled_nodes) == n_id.numel() and sum(out.num_sampled_edges) == e_id.numel()
        assert np.array_equal(n_id[row].numpy(), src_of[e_id.numpy()])  # row 0 = source
        assert np.array_equal(n_id[col].numpy(), dst_of[e_id.numpy()])  # row 1 = target
        node_hop = np.repeat(np.arange(len(out.num_sampled_nodes)), out.num_sampled_nodes)
        edge_hop = np.repeat(np.arange(1, len(fanouts) + 1), out.num_sampled_edges)
        assert (node_hop[col.numpy()] == edge_hop - 1).all()  # hop h expands the nodes found at hop h - 1
        assert (node_hop[row.numpy()] <= edge_hop).all()
        for hop in range(1, len(fanouts) + 1):  # each expanded node: its row of block L - hop, whole
            k = fanouts[len(fanouts) - hop]
            per_target = np.bincount(col.numpy()[edge_hop == hop], minlength=n_id.numel())
            expanded = node_hop == hop - 1
            deg = graph.in_degrees().numpy()[n_id.numpy()]
            want = np.where(deg > 0, k, 0) if replace else np.minimum(deg, k)
            assert np.array_equal(per_target[expanded], want[expanded])
        # every node after the seeds is the source of an edge of its hop
        first_edge_hop = {}
        for r, h in zip(row.tolist(), edge_hop.tolist(), strict=True):
            first_edge_hop.setdefault(r, h)
        assert all(first_edge_hop[i] == node_hop[i] for i in range(out.batch_size, n_id.numel()))


def test_to_pyg_errors():
    with pytest.raises(ValueError, match="at least one block"):
        Blocks().to_pyg()
    blocks = NeighborSampler(tiny(), [1], seed=0).sample(torch.tensor([3, 0]))
    with pytest.raises(ValueError, match=r"input_id must be a tensor of shape \[2\]"):
        blocks.to_pyg(input_id=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="not chained"):
        Blocks([blocks[0], blocks[0]]).to_pyg()

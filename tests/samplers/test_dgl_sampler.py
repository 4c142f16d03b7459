"""DglSampler: our kernels behind DGL's DataLoader, yielding real DGL blocks."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from samplers import Block, DglSampler, NeighborSampler

pytestmark = pytest.mark.dgl


@pytest.fixture(scope="module")
def edges():
    rng = np.random.default_rng(5)
    n, e = 60, 500
    return torch.from_numpy(rng.integers(0, n, e)), torch.from_numpy(rng.integers(0, n, e)), n


def test_is_a_dgl_sampler_and_blocks_equal_ours(dgl, edges):
    src, dst, n = edges
    g = dgl.graph((src, dst), num_nodes=n)
    s = DglSampler([3, 2], seed=4)
    assert isinstance(s, dgl.dataloading.Sampler) and isinstance(s, DglSampler)
    ours = NeighborSampler(CSCGraph.from_edges(src, dst, n), [3, 2], seed=4)
    loader = dgl.dataloading.DataLoader(g, torch.arange(n), s, batch_size=16, shuffle=False)
    for i, (input_nodes, output_nodes, blocks) in enumerate(loader):
        seeds = torch.arange(16 * i, min(16 * (i + 1), n))
        want = ours.sample(seeds)
        assert torch.equal(output_nodes, seeds) and torch.equal(input_nodes, want[0].src_nodes)
        assert len(blocks) == 2 and all(b.is_block for b in blocks)
        for b, w in zip(blocks, want, strict=True):
            got = Block.from_dgl(b)
            for name in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids"):
                assert torch.equal(getattr(got, name), getattr(w, name)), name
            s_, d_ = b.edges()  # every block edge is a graph edge, with its id
            gs, gd = b.srcdata[dgl.NID][s_], b.dstdata[dgl.NID][d_]
            eid = b.edata[dgl.EID]
            assert torch.equal(src[eid], gs) and torch.equal(dst[eid], gd)
        assert torch.equal(blocks[0].dstdata[dgl.NID], blocks[1].srcdata[dgl.NID])
    assert len(s.samplers) == 1  # one CSCGraph for the one DGL graph


def test_fanout_minus_one_gives_dgls_full_in_neighbourhood(dgl, edges):
    src, dst, n = edges
    g = dgl.graph((src, dst), num_nodes=n)
    seeds = torch.tensor([1, 7, 30])
    _, _, blocks = DglSampler([-1, -1]).sample(g, seeds)
    full = dgl.dataloading.MultiLayerFullNeighborSampler(2)
    _, _, theirs = full.sample_blocks(g, seeds)
    for b, t in zip(blocks, theirs, strict=True):
        assert b.num_src_nodes() == t.num_src_nodes() and b.num_dst_nodes() == t.num_dst_nodes()
        assert torch.equal(torch.sort(b.edata[dgl.EID]).values, torch.sort(t.edata[dgl.EID]).values)
        assert set(b.srcdata[dgl.NID].tolist()) == set(t.srcdata[dgl.NID].tolist())


def test_bad_input_raises(dgl, edges):
    with pytest.raises(ValueError, match="fanout"):
        DglSampler([2, -3])
    with pytest.raises(TypeError, match="fanouts"):
        DglSampler(3)
    with pytest.raises(TypeError, match="seed"):
        DglSampler([2], seed=None)
    s = DglSampler([2])
    with pytest.raises(TypeError, match="DGLGraph"):
        s.sample("graph", torch.tensor([0]))
    hetero = dgl.heterograph({("u", "r", "v"): (torch.tensor([0]), torch.tensor([0]))})
    with pytest.raises(TypeError, match="dict keyed by node type"):
        s.sample(hetero, torch.tensor([0]))
    src, dst, n = edges
    with pytest.raises(ValueError, match="outside"):
        s.sample(dgl.graph((src, dst), num_nodes=n), torch.tensor([n]))


def coo(graph: CSCGraph):
    dst = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.in_degrees())
    src = torch.empty(graph.num_edges, dtype=torch.int64)
    out = torch.empty(graph.num_edges, dtype=torch.int64)
    eids = graph.csc_edge_ids().long()
    src[eids], out[eids] = graph.indices.long(), dst
    return src, out


@pytest.mark.slow
def test_sageconv_trains_on_cora_through_dataloader(dgl, data_root):
    from dgl.nn import SAGEConv

    from graphrl.datasets import load_planetoid

    cora = load_planetoid("cora", data_root)
    g = dgl.graph(coo(cora.graph), num_nodes=cora.num_nodes)
    x, y = cora.features, cora.labels

    class Sage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([SAGEConv(x.shape[1], 64, "mean"),
                                               SAGEConv(64, cora.num_classes, "mean")])

        def forward(self, graphs, h):
            for i, (layer, block) in enumerate(zip(self.layers, graphs, strict=True)):
                h = layer(block, h)
                if i == 0:
                    h = torch.nn.functional.dropout(torch.relu(h), 0.5, self.training)
            return h

    torch.manual_seed(0)
    np.random.seed(0)  # noqa: NPY002  # DGL's DataLoader shuffles with numpy's global RNG
    model = Sage()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    train = cora.train_mask.nonzero().view(-1)
    loader = dgl.dataloading.DataLoader(g, train, DglSampler([10, 10], seed=0), batch_size=35, shuffle=True)
    t0 = time.perf_counter()
    for _ in range(15):
        model.train()
        for input_nodes, output_nodes, blocks in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(blocks, x[input_nodes]), y[output_nodes])
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        pred = model([g, g], x).argmax(-1)
    acc = float((pred[cora.test_mask] == y[cora.test_mask]).float().mean())
    print(f"Cora DGL SAGEConv through DataLoader+DglSampler[10,10]: test accuracy {acc:.3f} "
          f"({time.perf_counter() - t0:.1f} s)")
    assert acc >= 0.74  # full-neighbourhood GraphSAGE on Cora reaches about 0.80


def test_in_place_changes_of_the_graph_rebuild_the_cached_csc(dgl):
    g = dgl.graph((torch.tensor([1, 2]), torch.tensor([0, 0])), num_nodes=5)
    sampler = DglSampler([-1])
    sampler.sample(g, torch.tensor([0]))
    g.remove_edges(torch.tensor([0]))
    g.add_edges(torch.tensor([3, 4]), torch.tensor([0, 0]))
    _, _, blocks = sampler.sample(g, torch.tensor([0]))
    assert sorted(blocks[0].srcdata[dgl.NID][1:].tolist()) == [2, 3, 4]
    g.remove_edges(torch.tensor([0]))  # now (3, 0) (4, 0); same node count, one edge less
    g.add_edges(torch.tensor([1]), torch.tensor([0]))  # same counts as before: only the structure differs
    _, _, blocks = sampler.sample(g, torch.tensor([0]))
    assert sorted(blocks[0].srcdata[dgl.NID][1:].tolist()) == [1, 3, 4]
    src, dst = g.find_edges(blocks[0].edata[dgl.EID])
    assert torch.equal(dst, torch.zeros_like(dst)) and sorted(src.tolist()) == [1, 3, 4]


@pytest.fixture(scope="module")
def cora_g(dgl, data_root):
    from graphrl.datasets import load_planetoid

    cora = load_planetoid("cora", data_root)
    g = dgl.graph(coo(cora.graph), num_nodes=cora.num_nodes)
    g.ndata["feat"], g.ndata["label"] = cora.features, cora.labels
    g.edata["w"] = torch.rand(g.num_edges(), generator=torch.Generator().manual_seed(0))
    return g


def test_edge_prediction_sampler_excludes_the_batch_edges(dgl, cora_g):
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        DglSampler([5, 5], seed=0), exclude="self",
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(1))
    loader = dgl.dataloading.DataLoader(cora_g, torch.arange(cora_g.num_edges()), sampler, batch_size=512,
                                        shuffle=True)
    batches = 0
    for input_nodes, pair_graph, neg_graph, blocks in loader:
        batch_eids = pair_graph.edata[dgl.EID]
        for block in blocks:
            assert not torch.isin(block.edata[dgl.EID], batch_eids).any()
        assert torch.equal(blocks[0].srcdata[dgl.NID], input_nodes)
        assert neg_graph.num_edges() == pair_graph.num_edges()
        batches += 1
    assert batches == -(-cora_g.num_edges() // 512)


def test_blocks_carry_node_and_edge_features_as_dgls(dgl, cora_g):
    seeds = torch.arange(0, 200, 7)
    ours = DglSampler([5, 5]).sample(cora_g, seeds)[2]
    theirs = dgl.dataloading.MultiLayerNeighborSampler([5, 5]).sample(cora_g, seeds)[2]
    for a, b in zip(ours, theirs, strict=True):
        assert set(a.srcdata.keys()) == set(b.srcdata.keys())
        assert set(a.dstdata.keys()) == set(b.dstdata.keys())
        assert set(a.edata.keys()) == set(b.edata.keys())
        for name in ("feat", "label"):
            assert torch.equal(a.srcdata[name], cora_g.ndata[name][a.srcdata[dgl.NID]])
            assert torch.equal(a.dstdata[name], cora_g.ndata[name][a.dstdata[dgl.NID]])
            # the same node ids carry the same rows as in DGL's own blocks
            common, ia, ib = np.intersect1d(a.srcdata[dgl.NID], b.srcdata[dgl.NID], return_indices=True)
            assert len(common) > 0 and torch.equal(a.srcdata[name][ia], b.srcdata[name][ib])
        assert torch.equal(a.edata["w"], cora_g.edata["w"][a.edata[dgl.EID]])
    assert torch.equal(ours[-1].dstdata["label"], cora_g.ndata["label"][seeds])


def test_int32_graph_gives_int32_blocks_and_ids(dgl, cora_g):
    g32 = cora_g.int()
    seeds = torch.arange(32, dtype=torch.int32)
    input_nodes, output_nodes, blocks = DglSampler([5, 5]).sample(g32, seeds)
    ref_in, ref_out, ref_blocks = dgl.dataloading.MultiLayerNeighborSampler([5, 5]).sample(g32, seeds)
    assert input_nodes.dtype == output_nodes.dtype == ref_in.dtype == torch.int32
    for block, ref in zip(blocks, ref_blocks, strict=True):
        assert block.idtype == ref.idtype == torch.int32
        assert block.srcdata[dgl.NID].dtype == block.edata[dgl.EID].dtype == torch.int32
        src, dst = g32.find_edges(block.edata[dgl.EID])
        assert torch.equal(src, block.srcdata[dgl.NID][block.edges()[0].long()])
        assert torch.equal(dst, block.dstdata[dgl.NID][block.edges()[1].long()])


def test_prob_draws_only_positive_weight_neighbours_as_dgls(dgl, edges):
    src, dst, n = edges
    g = dgl.graph((src, dst), num_nodes=n)
    w = torch.rand(g.num_edges(), generator=torch.Generator().manual_seed(1))
    w[::3] = 0
    g.edata["w"] = w
    seeds = torch.arange(n)
    ours, theirs = set(), set()
    for i in range(30):
        for block in DglSampler([4], seed=i, prob="w").sample(g, seeds)[2]:
            ours |= set(block.edata[dgl.EID].tolist())
        for block in dgl.dataloading.NeighborSampler([4], prob="w").sample(g, seeds)[2]:
            theirs |= set(block.edata[dgl.EID].tolist())
    positive = set((w > 0).nonzero().view(-1).tolist())
    assert ours <= positive and theirs <= positive
    # a fanout above every in-degree draws a node's whole positive-weight neighbourhood
    assert int(g.in_degrees().max()) < 50
    ours = DglSampler([50], prob="w").sample(g, seeds)[2][0].edata[dgl.EID]
    theirs = dgl.dataloading.NeighborSampler([50], prob="w").sample(g, seeds)[2][0].edata[dgl.EID]
    assert set(ours.tolist()) == set(theirs.tolist()) == positive
    with pytest.raises(ValueError, match="prob"):
        DglSampler([4], prob="nope").sample(g, seeds)

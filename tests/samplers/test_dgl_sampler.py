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
def dgl():
    from graphrl.dglshim import dgl_available, import_dgl

    if not dgl_available():
        pytest.skip("DGL not installed (install the 'dgl' extra)")
    return import_dgl()


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
    with pytest.raises(TypeError, match="homogeneous"):
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

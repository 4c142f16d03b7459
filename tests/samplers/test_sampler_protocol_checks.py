"""The `Sampler` protocol at the loaders' and adapters' boundary: a sampler given to `PygSampler` /
`DglSampler` must sample the caller's graph edge by edge (else the batches' edge ids and edge features
would name other edges, silently), and a rejected sampler's message says what it lacks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrl.dglshim import dgl_available, import_dgl
from graphrl.graph import CSCGraph
from samplers import LaborSampler, NeighborLoader, NeighborSampler
from samplers.hetero_graph import HeteroGraph
from samplers.protocol import check_same_edges, edges_by_id


def random_edges(n: int = 60, e: int = 400, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, n, e)), torch.from_numpy(rng.integers(0, n, e))


def test_edges_by_id_inverts_from_edges():
    src, dst = random_edges()
    s, d = edges_by_id(CSCGraph.from_edges(src, dst, 60))
    assert np.array_equal(s, src.numpy()) and np.array_equal(d, dst.numpy())


def test_check_same_edges_names_the_first_edge_that_differs():
    src, dst = random_edges()
    perm = torch.arange(400)
    perm[[7, 9]] = perm[[9, 7]]
    sampler = NeighborSampler(CSCGraph.from_edges(src[perm], dst[perm], 60), [3], seed=0)
    if (src[7], dst[7]) == (src[9], dst[9]):
        pytest.skip("edges 7 and 9 are parallel")
    with pytest.raises(ValueError, match=r"first edge 7: .* in the sampler's graph"):
        check_same_edges("sampler", sampler, src, dst, 60, "g")
    with pytest.raises(ValueError, match="61 and 400"):
        check_same_edges("sampler", sampler, src, dst, 61, "g")
    check_same_edges("sampler", NeighborSampler(CSCGraph.from_edges(src, dst, 60), [3]), src, dst, 60, "g")


def test_a_rejected_sampler_message_says_what_it_lacks():
    src, dst = random_edges()
    graph = CSCGraph.from_edges(src, dst, 60)

    class NoCounters:
        def __init__(self) -> None:
            self.graph = graph

        def sample(self, seeds, exclude_eids=None, seed_times=None):
            return []

    with pytest.raises(TypeError, match="NoCounters has no num_layers, sampled_edges"):
        NeighborLoader(graph, torch.arange(10), batch_size=4, sampler=NoCounters())
    typed = HeteroGraph.from_edges({"a": 5}, {("a", "r", "a"): ([0, 1], [1, 2])})
    with pytest.raises(TypeError, match="LaborSampler's graph is a HeteroGraph"):
        NeighborLoader(graph, torch.arange(10), batch_size=4, sampler=LaborSampler(typed, [2]))


def test_pyg_sampler_refuses_a_sampler_of_a_reordered_graph_and_weight_attr():
    pyg = pytest.importorskip("torch_geometric")
    from samplers import PygSampler

    src, dst = random_edges()
    data = pyg.data.Data(edge_index=torch.stack([src, dst]), num_nodes=60, w=torch.rand(400))
    perm = torch.from_numpy(np.random.default_rng(3).permutation(400))
    shuffled = LaborSampler(CSCGraph.from_edges(src[perm], dst[perm], 60), [3], seed=0)
    with pytest.raises(ValueError, match="edge ids join other nodes"):
        PygSampler(data, sampler=shuffled)
    same = LaborSampler(CSCGraph.from_edges(src, dst, 60), [3], seed=0)
    with pytest.raises(ValueError, match="weight_attr='w' with sampler="):
        PygSampler(data, weight_attr="w", sampler=same)
    out = PygSampler(data, sampler=same).sample_nodes(torch.arange(5))
    assert torch.equal(src[out.edge], out.node[out.row]) and torch.equal(dst[out.edge], out.node[out.col])


def test_dgl_sampler_refuses_a_dgl_graph_of_other_edges_once_per_graph():
    if not dgl_available():
        pytest.skip("DGL not installed (install the 'dgl' extra)")
    from samplers import DglSampler

    dgl = import_dgl()
    src, dst = random_edges()
    adapter = DglSampler(sampler=LaborSampler(CSCGraph.from_edges(src, dst, 60), [3], seed=0))
    perm = torch.from_numpy(np.random.default_rng(3).permutation(400))
    with pytest.raises(ValueError, match="edge ids join other nodes"):
        adapter.sample(dgl.graph((src[perm], dst[perm]), num_nodes=60), torch.arange(5))
    g = dgl.graph((src, dst), num_nodes=60)
    _, _, blocks = adapter.sample(g, torch.arange(5))
    eids = blocks[-1].edata[dgl.EID]
    assert torch.equal(blocks[-1].srcdata[dgl.NID][blocks[-1].edges()[0].long()], src[eids])
    assert adapter.fixed_checked[0]() is g
    g.add_edges(torch.tensor([0]), torch.tensor([1]))  # a new structure: checked again (and refused)
    with pytest.raises(ValueError, match="401 edges"):
        adapter.sample(g, torch.arange(5))


class Scripted:
    """A user-written sampler over ``graph`` whose ``sample`` returns what ``make(seeds)`` builds."""

    def __init__(self, graph: CSCGraph, make, num_layers: int = 1) -> None:
        self.graph, self.make, self.num_layers, self.sampled_edges = graph, make, num_layers, 0

    def sample(self, seeds, exclude_eids=None, seed_times=None):
        return self.make(seeds)


@pytest.mark.parametrize("prefetch", [0, 1])
def test_loaders_refuse_blocks_that_break_the_contract_instead_of_misaligning_labels(prefetch):
    """A sampler whose last destinations are not the seeds in order would pair batch.labels (labels of
    the seeds) with other nodes' outputs; its blocks are refused naming it, as are a wrong block count
    and a non-list."""
    src, dst = random_edges()
    graph = CSCGraph.from_edges(src, dst, 60)
    inner = NeighborSampler(graph, [3], seed=0)
    labels = torch.arange(60)
    cases = [(lambda s: inner.sample(s.flip(0)), ValueError, r"Scripted.sample broke the Sampler contract: "
              r"blocks\[-1\].dst_nodes must be the 8 seeds in order, got first at position 0"),
             (lambda s: inner.sample(s) + inner.sample(s), ValueError,
              "returned 2 blocks, but its num_layers is 1"),
             (lambda s: None, TypeError, "must return its blocks .* got NoneType"),
             (lambda s: [], TypeError, "got an empty list")]
    for make, error, match in cases:
        loader = NeighborLoader(graph, torch.arange(16), batch_size=8, sampler=Scripted(graph, make),
                                labels=labels, shuffle=False, prefetch=prefetch)
        with pytest.raises(error, match=match):
            next(iter(loader))
    batch = next(iter(NeighborLoader(graph, torch.arange(16), batch_size=8, labels=labels, shuffle=False,
                                     sampler=Scripted(graph, lambda s: tuple(inner.sample(s))))))
    assert torch.equal(batch.labels, batch.seeds) and torch.equal(batch.seeds, torch.arange(8))


def test_link_sampler_refuses_blocks_of_other_seeds():
    from samplers import LinkSampler

    src, dst = random_edges()
    graph = CSCGraph.from_edges(src, dst, 60)
    inner = NeighborSampler(graph, [3], seed=0)
    users, items = torch.tensor([0, 1, 2]), torch.tensor([40, 41, 42])
    link = LinkSampler(Scripted(graph, lambda s: inner.sample(s[1:])), users, items, batch_size=3,
                       item_range=(30, 60), seed=0)
    with pytest.raises(ValueError, match="must be the .* seeds in order"):
        next(iter(link))


def test_neighbor_loader_refuses_replace_with_a_sampler():
    src, dst = random_edges()
    graph = CSCGraph.from_edges(src, dst, 60)
    with pytest.raises(ValueError, match="replace=True with sampler="):
        NeighborLoader(graph, torch.arange(8), batch_size=4, replace=True, sampler=LaborSampler(graph, [2]))

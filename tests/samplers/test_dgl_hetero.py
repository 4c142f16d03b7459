"""DglSampler on heterographs: per-edge-type fanouts, prob / mask per edge type, exclude_eids as DGL treats
ids that name no edge, and distinct draws per DataLoader worker."""

from __future__ import annotations

import pytest
import torch

from samplers import DglSampler

pytestmark = pytest.mark.dgl


def two_types(dgl):
    """DGL's test graph: A nodes 0, 1 with in-edges from B and C nodes 1..8; p picks half of each."""
    ends = ([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 1, 1, 1, 1])
    g = dgl.heterograph({("B", "BA", "A"): ends, ("C", "CA", "A"): ends})
    g.edges["BA"].data["p"] = torch.tensor([1.0, 1, 0, 0, 1, 1, 0, 0])
    g.edges["CA"].data["p"] = torch.tensor([0.0, 0, 1, 1, 0, 0, 1, 1])
    for et in ("BA", "CA"):
        g.edges[et].data["mask"] = g.edges[et].data["p"] != 0
    return g


@pytest.mark.parametrize("option", ["prob", "mask"])
def test_prob_and_mask_per_edge_type_draw_only_the_allowed_edges(dgl, option):
    g = two_types(dgl)
    sampler = DglSampler([2], seed=3, **{option: "p" if option == "prob" else "mask"})
    loader = dgl.dataloading.DataLoader(g, {"A": torch.tensor([0, 1])}, sampler, batch_size=1)
    want = {0: ({1, 2}, {3, 4}), 1: ({5, 6}, {7, 8})}
    for input_nodes, output_nodes, blocks in loader:
        seed = int(output_nodes["A"])
        assert (set(input_nodes["B"].tolist()), set(input_nodes["C"].tolist())) == want[seed]
        assert blocks[0].num_edges("BA") == 2 and blocks[0].num_edges("CA") == 2


def test_fanout_dicts_per_edge_type_and_features_on_blocks(dgl):
    g = two_types(dgl)
    g.nodes["B"].data["x"] = torch.arange(9.0)
    sampler = DglSampler([{"BA": 1, ("C", "CA", "A"): -1}], seed=0)
    input_nodes, output_nodes, (block,) = sampler.sample(g, {"A": torch.tensor([1])})
    assert block.num_edges("BA") == 1 and sorted(input_nodes["C"].tolist()) == [5, 6, 7, 8]
    assert torch.equal(block.srcnodes["B"].data["x"], input_nodes["B"].float())
    src, dst = g.find_edges(block.edges["CA"].data[dgl.EID], etype="CA")
    assert torch.equal(block.srcnodes["C"].data[dgl.NID][block.edges(etype="CA")[0]], src)
    assert DglSampler([{"BA": 0}]).sample(g, {"A": torch.tensor([0])})[2][0].num_edges() == 0


def test_exclude_eids_ignores_ids_that_name_no_edge(dgl):
    g = dgl.graph(([1, 2, 3], [0, 0, 0]))
    sampler = DglSampler([-1], seed=0)
    _, _, (block,) = sampler.sample(g, torch.tensor([0]), exclude_eids=torch.tensor([1, 7, -2]))
    assert sorted(block.edata[dgl.EID].tolist()) == [0, 2]
    h = two_types(dgl)
    _, _, (block,) = sampler.sample(h, {"A": torch.tensor([0])}, exclude_eids={"BA": torch.tensor([0, 99])})
    assert sorted(block.edges["BA"].data[dgl.EID].tolist()) == [1, 2, 3]


def test_bad_fanout_keys_and_untyped_exclude_eids_are_refused_as_dgl_refuses_them(dgl):
    g = two_types(dgl)
    with pytest.raises(ValueError, match=r"fanouts\[1\]: unknown relations \['BX'\]"):
        DglSampler([{"BA": 1, "CA": 1}, {"BX": 2, "CA": 1}]).sample(g, {"A": torch.tensor([0])})  # a typo
    with pytest.raises(TypeError, match="exclude_eids must be a dict keyed by edge type"):
        DglSampler([-1]).sample(g, {"A": torch.tensor([0])}, exclude_eids=torch.tensor([0]))
    one = dgl.heterograph({("B", "BA", "A"): ([1, 2], [0, 0])})  # one edge type: a tensor is unambiguous
    _, _, (block,) = DglSampler([-1]).sample(one, {"A": torch.tensor([0])}, exclude_eids=torch.tensor([0, 5]))
    assert block.edges["BA"].data[dgl.EID].tolist() == [1]


def test_one_node_type_gives_tensors_as_dgl_does(dgl):
    # a homogeneous graph under a fanout dict, or one node type with two edge types: DGL's input_nodes is a
    # tensor, output_nodes as the seeds were given
    g = dgl.graph(([1, 2, 3], [0, 0, 1]))
    input_nodes, output_nodes, (block,) = DglSampler([{"_E": -1}]).sample(g, torch.tensor([0]))
    assert input_nodes.tolist() == [0, 1, 2] and output_nodes.tolist() == [0]
    assert sorted(block.edata[dgl.EID].tolist()) == [0, 1]
    h = dgl.heterograph({("u", "f", "u"): ([1, 2, 3], [0, 0, 1]), ("u", "l", "u"): ([3], [0])})
    input_nodes, output_nodes, _ = DglSampler([-1]).sample(h, {"u": torch.tensor([0])})
    assert sorted(input_nodes.tolist()) == [0, 1, 2, 3] and output_nodes["u"].tolist() == [0]


def test_workers_draw_differently(dgl):
    g = dgl.graph((torch.arange(1, 401), torch.zeros(400, dtype=torch.int64)))
    loader = dgl.dataloading.DataLoader(g, torch.zeros(4, dtype=torch.int64), DglSampler([3], seed=1),
                                        batch_size=1, num_workers=2, multiprocessing_context="fork")
    drawn = [tuple(sorted(b[0].edata[dgl.EID].tolist())) for _, _, b in loader]
    assert drawn[0] != drawn[1]  # batches 0 and 1: each worker's first; same seed, mixed per worker

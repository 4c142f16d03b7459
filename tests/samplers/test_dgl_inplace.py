"""DglSampler sees a ``prob`` / ``mask`` edge feature written in place between batches, as DGL's own
``NeighborSampler`` does (it reads the feature every batch), and keeps its sampler while nothing changed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from samplers import DglSampler

pytestmark = pytest.mark.dgl


def star(dgl, option: str):
    """Node 0 with in-edges 0..9 from nodes 1..10; the feature ``"f"`` allows every edge."""
    g = dgl.graph((torch.arange(1, 11), torch.zeros(10, dtype=torch.int64)), num_nodes=11)
    g.edata["f"] = torch.ones(10) if option == "prob" else torch.ones(10, dtype=torch.bool)
    return g


def support(dgl, sampler, g, batches: int = 40) -> set[int]:
    """The edge ids ``sampler`` draws for seed 0 over ``batches`` batches."""
    got = set()
    for _ in range(batches):
        got |= set(sampler.sample(g, torch.tensor([0]))[2][0].edata[dgl.EID].tolist())
    return got


@pytest.mark.parametrize("option", ["prob", "mask"])
def test_in_place_edit_is_seen_at_the_next_batch_as_by_dgls_sampler(dgl, option):
    g = star(dgl, option)
    ours = DglSampler([3], seed=0, **{option: "f"})
    theirs = dgl.dataloading.NeighborSampler([3], **{option: "f"})
    assert support(dgl, ours, g) == support(dgl, theirs, g) == set(range(10))
    g.edata["f"][:8] = 0  # in place: only edges 8 and 9 may be drawn
    assert support(dgl, ours, g) == support(dgl, theirs, g) == {8, 9}
    g.edata["f"][2:4] = 1  # in place again: edges 2, 3, 8, 9
    assert support(dgl, ours, g) == support(dgl, theirs, g) == {2, 3, 8, 9}
    g.edata["f"].fill_(0)  # nothing allowed: no edge drawn
    assert support(dgl, ours, g, 3) == support(dgl, theirs, g, 3) == set()


def test_in_place_new_weights_are_drawn_by_their_law(dgl):
    # 2,000 destination nodes, each with 8 in-edges at positions 0..7 (edge id = 8 * node + position)
    m, d = 2000, 8
    src = torch.arange(m * d) % 500 + m
    dst = torch.arange(m).repeat_interleave(d)
    g = dgl.graph((src, dst), num_nodes=m + 500)
    g.edata["w"] = torch.ones(m * d)
    sampler = DglSampler([1], seed=4, prob="w")
    sampler.sample(g, torch.arange(m))  # builds the cached weights (uniform)
    new = torch.arange(d, dtype=torch.float32)  # position j has weight j: position 0 never drawn
    g.edata["w"].view(m, d).copy_(new)
    counts = np.zeros(d)
    for _ in range(3):
        eids = sampler.sample(g, torch.arange(m))[2][0].edata[dgl.EID]
        counts += np.bincount((eids % d).numpy(), minlength=d)
    assert counts[0] == 0 and counts.sum() == 3 * m
    expected = new[1:].double().numpy() / float(new.sum()) * counts.sum()
    assert stats.chisquare(counts[1:], expected).pvalue > 1e-4
    # the cached uniform weights would be refused by the same test
    assert stats.chisquare(counts[1:], np.full(d - 1, counts.sum() / (d - 1))).pvalue < 1e-6


def test_unchanged_column_keeps_the_sampler_and_a_change_keeps_the_graph(dgl):
    g = star(dgl, "prob")
    ours = DglSampler([3], seed=0, prob="f")
    first = ours.sampler_for(g)
    for _ in range(5):
        ours.sample(g, torch.tensor([0]))
        assert ours.sampler_for(g) is first  # no rebuild while nothing changed
    g.edata["f"][0] = 0.5
    second = ours.sampler_for(g)
    assert second is not first and second.graph is first.graph  # new weights over the same CSCGraph
    assert ours.sampler_for(g) is second
    g.edata["f"] = torch.ones(10)  # another tensor
    third = ours.sampler_for(g)
    assert third is not second and third.graph is first.graph
    g.add_edges(torch.tensor([1]), torch.tensor([0]), data={"f": torch.ones(1)})
    assert ours.sampler_for(g).graph is not first.graph  # a changed structure: a new graph
    assert ours.sampler_for(g).graph.num_edges == 11


def test_a_rebuilt_sampler_does_not_repeat_the_previous_random_stream(dgl):
    g = dgl.graph((torch.arange(1, 201), torch.arange(200) % 20), num_nodes=201)
    g.edata["f"] = torch.ones(200)
    seeds = torch.arange(20)
    edited = DglSampler([3], seed=7, prob="f")
    fresh = DglSampler([3], seed=7, prob="f")
    g2 = dgl.graph(g.edges(), num_nodes=201)
    g2.edata["f"] = torch.ones(200)
    first = edited.sample(g, seeds)[2][0].edata[dgl.EID]
    assert torch.equal(first, fresh.sample(g2, seeds)[2][0].edata[dgl.EID])  # same seed, same first batch
    g.edata["f"].mul_(1.0)  # an in-place write that keeps the values: a rebuild all the same
    again = edited.sample(g, seeds)[2][0].edata[dgl.EID]
    assert not torch.equal(again, first)  # not the first batch's draws once more


@pytest.mark.parametrize("option", ["prob", "mask"])
def test_heterograph_in_place_edit_of_one_edge_type(dgl, option):
    ends = ([1, 2, 3, 4], [0, 0, 0, 0])
    g = dgl.heterograph({("B", "BA", "A"): ends, ("C", "CA", "A"): ends})
    for et in ("BA", "CA"):
        g.edges[et].data["f"] = torch.ones(4) if option == "prob" else torch.ones(4, dtype=torch.bool)
    ours = DglSampler([{"BA": 2, "CA": 2}], seed=1, **{option: "f"})
    theirs = dgl.dataloading.NeighborSampler([{"BA": 2, "CA": 2}], **{option: "f"})

    def drawn(sampler) -> tuple[set, set]:
        ba, ca = set(), set()
        for _ in range(30):
            block = sampler.sample(g, {"A": torch.tensor([0])})[2][0]
            ba |= set(block.edges["BA"].data[dgl.EID].tolist())
            ca |= set(block.edges["CA"].data[dgl.EID].tolist())
        return ba, ca

    assert drawn(ours) == drawn(theirs) == ({0, 1, 2, 3}, {0, 1, 2, 3})
    g.edges["CA"].data["f"][1:] = 0  # CA: only edge 0
    assert drawn(ours) == drawn(theirs) == ({0, 1, 2, 3}, {0})


def test_a_stamp_matches_only_its_live_unchanged_tensor():
    from samplers._stamp import TensorStamp

    t = torch.ones(4)
    stamp = TensorStamp.of(t)
    assert stamp.matches(t) and not stamp.matches(torch.ones(4)) and not stamp.matches(None)
    t[0] = 2.0  # an in-place write bumps the version
    assert not stamp.matches(t)
    del t
    assert not stamp.matches(None)  # the tensor gone: its column deleted from the graph

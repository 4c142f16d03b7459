"""PygSampler(data, sampler=...): the given sampler's graph is the one sampled, so no CSC of ``data`` is built
(counted by patching the builders); the graph is still checked against ``data``; the outputs are the sampler's
own draws laid out as PyG's (plain and typed)."""

from __future__ import annotations

import pytest
import torch

from graphrl.graph import CSCGraph
from samplers import LaborSampler
from samplers.hetero_graph import HeteroGraph

pyg = pytest.importorskip("torch_geometric")
from samplers.pyg_sampler import PygSampler  # noqa: E402 - after the skip

N = 40
SEEDS = torch.tensor([0, 3, 17, 39])


@pytest.fixture
def builds(monkeypatch) -> list[str]:
    """The CSC builds (``CSCGraph.from_edges``, ``HeteroGraph.from_edges``) from now on, by kind."""
    seen: list[str] = []
    for cls, kind in ((CSCGraph, "csc"), (HeteroGraph, "hetero")):
        build = cls.__dict__["from_edges"].__func__

        def counted(owner, *args, _build=build, _kind=kind, **kwargs):
            seen.append(_kind)
            return _build(owner, *args, **kwargs)

        monkeypatch.setattr(cls, "from_edges", classmethod(counted))
    return seen


def _edges(seed: int, n: int, m: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, m), generator=g)


def _check_drawn(out, blocks, src, dst) -> None:
    """``out`` is ``blocks`` in PyG's expand-once layout: seeds first, hop 1 the whole innermost block, later
    hops edges of their block, every edge's endpoints the data's."""
    assert torch.equal(out.node[:SEEDS.numel()], SEEDS)
    assert torch.equal(src[out.edge], out.node[out.row]) and torch.equal(dst[out.edge], out.node[out.col])
    start = 0
    for hop, (block, ne) in enumerate(zip(reversed(blocks), out.num_sampled_edges, strict=True)):
        got, want = set(out.edge[start:start + ne].tolist()), set(block.edge_ids.tolist())
        assert got == want if hop == 0 else got <= want
        start += ne
    assert start == out.edge.numel() > 0


def test_a_given_sampler_is_sampled_without_building_a_csc_of_the_data(builds):
    ei = _edges(0, N, 200)
    data = pyg.data.Data(edge_index=ei, num_nodes=N)
    graph = CSCGraph.from_edges(ei[0], ei[1], N)
    builds.clear()
    wrapped = PygSampler(data, sampler=LaborSampler(graph, [3, 2], seed=5))
    assert builds == [] and wrapped.graph is graph and wrapped.draw.graph is graph
    PygSampler(data, [3, 2])
    assert builds == ["csc"]  # our own sampler needs its CSC: built once
    out = wrapped.sample_nodes(SEEDS)
    _check_drawn(out, LaborSampler(graph, [3, 2], seed=5).sample(SEEDS), ei[0], ei[1])


def test_a_given_samplers_graph_is_still_checked_against_the_data(builds):
    ei = _edges(1, N, 120)
    data = pyg.data.Data(edge_index=ei, num_nodes=N)
    other = ei.clone()
    other[0, 7] = (other[0, 7] + 1) % N  # edge 7 joins other nodes
    for bad, match in ((CSCGraph.from_edges(other[0], other[1], N), "edge"),
                       (CSCGraph.from_edges(ei[0], ei[1], N + 1), "nodes")):
        with pytest.raises(ValueError, match=match):
            PygSampler(data, sampler=LaborSampler(bad, [2], seed=0))
    with pytest.raises(TypeError, match="sampler must be a Sampler"):
        PygSampler(data, sampler=object())


def test_a_given_typed_sampler_is_sampled_without_building_a_heterograph(builds):
    num_nodes = {"user": N, "item": 25}
    edges = {("user", "buys", "item"): _edges(2, 25, 90), ("item", "rev_buys", "user"): _edges(3, N, 90)}
    edges[("user", "buys", "item")][0] %= N
    edges[("item", "rev_buys", "user")][0] %= 25
    data = pyg.data.HeteroData()
    for t, n in num_nodes.items():
        data[t].num_nodes = n
    for et, ei in edges.items():
        data[et].edge_index = ei
    graph = HeteroGraph.from_edges(num_nodes, {et: (ei[0], ei[1]) for et, ei in edges.items()})
    builds.clear()
    wrapped = PygSampler(data, sampler=LaborSampler(graph, [3, 2], seed=5))
    assert builds == [] and wrapped.graph is graph
    PygSampler(data, [3, 2])
    assert builds == ["hetero"]
    seeds = {"user": SEEDS}
    out = wrapped.sample_nodes(seeds)
    blocks = LaborSampler(graph, [3, 2], seed=5).sample(seeds)
    assert torch.equal(out.node["user"][:SEEDS.numel()], SEEDS)
    for et, ei in edges.items():
        eid = out.edge[et]
        assert torch.equal(ei[0][eid], out.node[et[0]][out.row[et]])
        assert torch.equal(ei[1][eid], out.node[et[-1]][out.col[et]])
        assert set(eid.tolist()) <= set(torch.cat([b.edge_ids[et] for b in blocks]).tolist())

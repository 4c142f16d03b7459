"""A DGL/PyG user's review: a DGL heterograph (DGL sorts ``canonical_etypes``) drives a typed sampler whose
`HeteroGraph` keeps another relation order (LastFM: listens, heard_by, friends; DGL: heard_by, friends,
listens), blocks right relation by relation; DGL's typed fanouts (``[{etype: k}, ...]``, bare etype names)
reach the typed samplers through the one normaliser (`samplers._checks.check_relation_fanouts`), with
messages naming the argument and the bad value; seeds on a device without values (``meta``) are refused
naming ``seeds`` and the device; the README's PyG LABOR example runs, and its batches have ``edge_weight``
only through ``PygSampler.keep_edge_weight``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from graphrl.graph import CSCGraph
from samplers import HeteroNeighborSampler, LaborSampler, NeighborSampler
from samplers._checks import check_relation_fanouts
from samplers.hetero_graph import HeteroGraph, lastfm_hetero_graph
from samplers.protocol import edges_by_id

SEEDS = torch.tensor([0, 1, 100, 1500, 7])
LISTENS, HEARD = ("user", "listens", "artist"), ("artist", "heard_by", "user")
FRIENDS = ("user", "friends", "user")


@pytest.fixture(scope="module")
def lastfm(data_root) -> tuple[HeteroGraph, dict]:
    """LastFM as a HeteroGraph (relations listens, heard_by, friends) and its edges per relation in edge-id
    order."""
    from graphrl.datasets import load_lastfm

    graph = lastfm_hetero_graph(load_lastfm(data_root))
    assert list(graph.relations) == [LISTENS, HEARD, FRIENDS]
    edges = {}
    for rel in graph.relations:
        src, dst = edges_by_id(graph, rel)
        edges[rel] = (torch.from_numpy(src), torch.from_numpy(dst))
    return graph, edges


def labor(graph: HeteroGraph) -> LaborSampler:
    return LaborSampler(graph, [6, 4], seed=3, importance_sampling=1)


@pytest.mark.parametrize("order", ["ours", "dgl"])
def test_dgl_heterograph_drives_a_hetero_graph_in_either_relation_order(lastfm, dgl, order):
    graph, edges = lastfm
    g = dgl.heterograph(edges, num_nodes_dict=dict(graph.num_nodes))
    assert list(g.canonical_etypes) == [HEARD, FRIENDS, LISTENS]  # DGL sorts them
    if order == "dgl":
        graph = HeteroGraph.from_edges(dict(graph.num_nodes), {rel: edges[rel] for rel in g.canonical_etypes})
    from samplers import DglSampler

    seeds = {"user": SEEDS}
    input_nodes, output_nodes, blocks = DglSampler(sampler=labor(graph)).sample(g, seeds)
    want = labor(graph).sample(seeds)
    assert torch.equal(output_nodes["user"], SEEDS.to(g.idtype))
    assert all(torch.equal(input_nodes[t], want[0].src_nodes[t].to(g.idtype)) for t in g.ntypes)
    for got, ref in zip(blocks, want, strict=True):
        assert sum(int(ref.edge_ids[rel].numel()) for rel in ref.edge_ids) > 0
        for rel in g.canonical_etypes:  # per relation: its edge ids, weights, and the graph's endpoints
            eid = got.edges[rel].data[dgl.EID].to(torch.int64)
            assert torch.equal(eid, ref.edge_ids[rel])
            assert torch.equal(got.edges[rel].data["edge_weights"], ref.edge_weights[rel])
            s, d = got.edges(etype=rel)
            assert torch.equal(got.srcnodes[rel[0]].data[dgl.NID][s.long()].long(), edges[rel][0][eid])
            assert torch.equal(got.dstnodes[rel[2]].data[dgl.NID][d.long()].long(), edges[rel][1][eid])
    loader = dgl.dataloading.DataLoader(g, {"user": torch.arange(64)}, DglSampler(sampler=labor(graph)),
                                        batch_size=32)  # the reviewer's reproducer: DGL's own loader
    _, out, (first, _) = next(iter(loader))
    assert out["user"].tolist() == list(range(32)) and first.num_edges() > 0


def test_relation_sets_must_still_agree(lastfm, dgl):
    graph, edges = lastfm
    from samplers import DglSampler

    two = dgl.heterograph({rel: edges[rel] for rel in (LISTENS, HEARD)}, num_nodes_dict=dict(graph.num_nodes))
    with pytest.raises(ValueError, match=r"\[\('user', 'friends', 'user'\)\] only in the sampler's"):
        DglSampler(sampler=labor(graph)).sample(two, {"user": SEEDS})
    swapped = dgl.heterograph({LISTENS: edges[LISTENS], HEARD: edges[HEARD], FRIENDS: edges[FRIENDS][::-1]},
                              num_nodes_dict=dict(graph.num_nodes))  # friends' ends swapped: same count
    with pytest.raises(ValueError, match=r"edge ids of \('user', 'friends', 'user'\) join other nodes"):
        DglSampler(sampler=labor(graph)).sample(swapped, {"user": SEEDS})


def test_pyg_hetero_data_in_another_relation_order(lastfm):
    pyg = pytest.importorskip("torch_geometric")
    from samplers import PygSampler

    graph, edges = lastfm
    data = pyg.data.HeteroData()
    for t, n in graph.num_nodes.items():
        data[t].num_nodes = n
    for rel in (FRIENDS, HEARD, LISTENS):
        data[rel].edge_index = torch.stack(edges[rel])
    out = PygSampler(data, sampler=labor(graph)).sample_nodes({"user": SEEDS})
    want = labor(graph).sample({"user": SEEDS})
    for rel, (src, dst) in edges.items():
        assert set(want[-1].edge_ids[rel].tolist()) <= set(out.edge[rel].tolist())
        assert torch.equal(src[out.edge[rel]], out.node[rel[0]][out.row[rel]])
        assert torch.equal(dst[out.edge[rel]], out.node[rel[2]][out.col[rel]])


@pytest.mark.parametrize("kind", [LaborSampler, HeteroNeighborSampler])
def test_dgl_fanout_forms_draw_what_ours_draws(lastfm, kind):
    graph, _ = lastfm
    ours = {LISTENS: [5, 3], HEARD: [2, 4], FRIENDS: [1, 0]}
    forms = ([{"listens": 5, HEARD: 2, "friends": 1}, {FRIENDS: 0, "heard_by": 4, LISTENS: 3}],  # DGL's
             {"listens": [5, 3], "heard_by": [2, 4], FRIENDS: [1, 0]})  # ours, with bare names
    want = kind(graph, ours, seed=5).sample({"user": SEEDS})
    for form in forms:
        sampler = kind(graph, form, seed=5)
        assert sampler.fanouts == ours and list(sampler.fanouts) == list(graph.relations)
        got = sampler.sample({"user": SEEDS})
        for a, b in zip(got, want, strict=True):
            assert all(torch.equal(a.edge_ids[rel], b.edge_ids[rel]) for rel in b.edge_ids)
    left_out = kind(graph, [{"friends": 3}, {"friends": 2}], seed=5)  # other relations draw nothing
    assert left_out.fanouts == {FRIENDS: [3, 2]}


def test_typed_fanout_errors_name_argument_and_value():
    rels = [("a", "r", "b"), ("b", "r", "a"), ("a", "s", "a")]
    with pytest.raises(ValueError, match=r"fanouts\[0\]: edge type name 'r' is ambiguous, relations "
                                         r"\[\('a', 'r', 'b'\), \('b', 'r', 'a'\)\] share it"):
        check_relation_fanouts([{"r": 1, "s": 1}], rels)
    with pytest.raises(ValueError, match="fanouts: edge type name 'r' is ambiguous"):
        check_relation_fanouts({"r": [1]}, rels)
    with pytest.raises(ValueError, match=r"fanouts\[1\] has no fanout for \('a', 's', 'a'\), which other "
                                         r"layers give"):
        check_relation_fanouts([{"s": 1, ("a", "r", "b"): 2}, {("a", "r", "b"): 2}], rels)
    with pytest.raises(ValueError, match=r"every relation needs the same number \(>= 1\) of layers"):
        check_relation_fanouts({"s": [1, 2], ("a", "r", "b"): [3]}, rels)
    with pytest.raises(ValueError, match=r"fanouts\[0\]: unknown relations \['t'\]"):
        check_relation_fanouts([{"t": 1}], rels)
    with pytest.raises(ValueError, match=r"relation \('a', 's', 'a'\) is given twice"):
        check_relation_fanouts({"s": [1], ("a", "s", "a"): [2]}, rels)
    with pytest.raises(TypeError, match=r"fanouts\[1\]\['s'\] must be an int, got 2.5"):
        check_relation_fanouts([{"s": 1}, {"s": 2.5}], rels)
    with pytest.raises(TypeError, match="fanouts mixes per-layer dicts and ints"):
        check_relation_fanouts([{"s": 1}, 2], rels)
    with pytest.raises(ValueError, match=r"fanouts\[0\]\['s'\]=-2: a fanout must be >= 0"):
        check_relation_fanouts([{"s": -2}], rels)
    assert check_relation_fanouts([{"s": 1, ("a", "r", "b"): -1}], rels) == {rels[0]: [-1], rels[2]: [1]}


def test_dgl_sampler_uses_the_same_normaliser(dgl):
    from samplers import DglSampler

    g = dgl.heterograph({("a", "r", "b"): ([0, 1], [0, 0]), ("b", "r", "a"): ([0], [1]),
                         ("a", "s", "a"): ([1, 2], [0, 0])})
    with pytest.raises(ValueError, match="edge type name 'r' is ambiguous"):
        DglSampler([{"r": 1, "s": 1}]).sample(g, {"a": torch.tensor([0])})
    with pytest.raises(ValueError, match=r"fanouts\[0\] has no fanout for \('a', 'r', 'b'\)"):
        DglSampler([{"s": 1}, {("a", "r", "b"): 1}]).sample(g, {"a": torch.tensor([0])})
    with pytest.raises(TypeError, match=r"fanouts\[0\]\['s'\] must be an int"):
        DglSampler([{"s": "1"}])
    _, _, (block,) = DglSampler([{"s": -1, ("b", "r", "a"): -1}]).sample(g, {"a": torch.tensor([0, 1])})
    assert sorted(block.edges["s"].data[dgl.EID].tolist()) == [0, 1]
    assert block.edges[("b", "r", "a")].data[dgl.EID].tolist() == [0]
    assert block.num_edges(("a", "r", "b")) == 0


def test_seeds_on_the_meta_device_are_refused_naming_seeds_and_device(lastfm):
    graph, _ = lastfm
    plain = CSCGraph.from_edges(torch.tensor([1, 2]), torch.tensor([0, 0]), 3)
    meta = torch.tensor([1], device="meta")
    for sampler in (NeighborSampler(plain, [2]), LaborSampler(plain, [2])):
        with pytest.raises(ValueError, match="seeds is on device 'meta', which the sampler cannot read"):
            sampler.sample(meta)
    for sampler in (HeteroNeighborSampler(graph, [2]), LaborSampler(graph, [2])):
        with pytest.raises(ValueError, match=r"seeds\['user'\] is on device 'meta'"):
            sampler.sample({"user": meta})


def test_readme_pyg_labor_example_runs_and_needs_keep_edge_weight():
    pytest.importorskip("torch_geometric")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "keep_edge_weight(" in b]
    exec(compile(block, "README.md", "exec"), {})  # asserts one weight per edge of each batch
    without = block.replace("PygSampler.keep_edge_weight(", "(")
    without = re.sub(r"assert batch\.edge_weight.*", "assert 'edge_weight' not in batch", without)
    exec(compile(without, "README.md (no keep_edge_weight)", "exec"), {})  # PyG's loader drops the weights

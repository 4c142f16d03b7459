"""Regression tests from the fresh-user review of issue 2: interrupted calls and hand-built graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import samplers.neighbor
from graphrl import CSCGraph
from samplers import NeighborSampler
from samplers.kernels.cpu import layer as cpu_layer


def _edges(seed: int = 0, n: int = 20_000, e: int = 400_000):
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, e), rng.integers(0, n, e), n


def _blocks_are_right(blocks, seeds, src) -> bool:
    if not torch.equal(blocks[-1].dst_nodes, seeds):
        return False
    for b in blocks:
        if b.num_edges and int(b.indices.max()) >= b.num_src_nodes:
            return False
        if not np.array_equal(src[b.edge_ids.numpy()], b.src_nodes[b.indices].numpy()):
            return False
        new = b.src_nodes[b.num_dst_nodes:].numpy()
        if np.unique(new).size != new.size:
            return False
    return True


def test_a_call_interrupted_between_chunks_leaves_the_next_call_correct(monkeypatch):
    src, dst, n = _edges()
    graph = CSCGraph.from_edges(src, dst, n)
    sampler = NeighborSampler(graph, [15, 10, 5], seed=0)
    rng = np.random.default_rng(1)
    seeds = torch.from_numpy(rng.choice(n, 4096, replace=False))
    original = cpu_layer.relabel_src
    calls = {"n": 0}

    def interrupted(*args):
        out = original(*args)
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("simulated Ctrl-C between chunks")
        return out

    monkeypatch.setattr(cpu_layer, "relabel_src", interrupted)
    # Chunks are relabelled one call at a time only when several threads share a layer (on one thread
    # a uniform layer is one kernel call), so the sampler is given two whatever the policy says.
    monkeypatch.setattr(samplers.neighbor, "team_size", lambda: 2)
    with pytest.raises(KeyboardInterrupt):
        sampler.sample(seeds)
    assert calls["n"] == 2  # the interruption really happened inside the layer
    monkeypatch.setattr(cpu_layer, "relabel_src", original)
    reference = NeighborSampler(graph, [15, 10, 5], seed=0)
    reference.sample(seeds)  # same call index as the interrupted one
    for _ in range(3):
        more = torch.from_numpy(rng.choice(n, 4096, replace=False))
        got, want = sampler.sample(more), reference.sample(more)
        assert _blocks_are_right(got, more, src)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.src_nodes, b.src_nodes) and torch.equal(a.edge_ids, b.edge_ids)


def test_a_hand_built_graph_with_an_index_out_of_range_is_refused_by_the_sampler():
    graph = CSCGraph(torch.tensor([0, 2]), torch.tensor([0, 7_000_000], dtype=torch.int32))
    with pytest.raises(ValueError, match="indices"):
        NeighborSampler(graph, [2])


def test_edge_ids_that_are_not_a_permutation_are_refused():
    graph = CSCGraph(torch.tensor([0, 2]), torch.tensor([0, 0], dtype=torch.int32),
                     edge_ids=torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="edge_ids must be a permutation"):
        graph.validate()
    repeated = CSCGraph(torch.tensor([0, 2]), torch.tensor([0, 0], dtype=torch.int32),
                        edge_ids=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="edge_ids must be a permutation"):
        NeighborSampler(repeated, [1])


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"fanouts": 5}, TypeError, "fanouts"),
    ({"fanouts": [None]}, TypeError, r"fanouts\[0\]"),
    ({"fanouts": [float("nan")]}, TypeError, r"fanouts\[0\]"),
    ({"fanouts": [2.0]}, TypeError, r"fanouts\[0\]"),
    ({"fanouts": [2], "seed": "x"}, TypeError, "seed"),
    ({"fanouts": [2], "seed": -1}, ValueError, "seed"),
    ({"fanouts": [2], "seed": 2**64}, ValueError, "seed"),
    ({"fanouts": [2], "replace": "no"}, TypeError, "replace"),
])
def test_bad_sampler_arguments_name_the_argument(kwargs, error, name):
    graph = CSCGraph.from_edges([0, 1], [1, 0], 2)
    with pytest.raises(error, match=name):
        NeighborSampler(graph, **kwargs)

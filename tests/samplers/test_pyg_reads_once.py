"""PygSampler reads a graph's weights and times once per draw it builds, and sees in-place writes: an
in-place write to ``weight_attr`` or ``time_attr`` (edge or node times) is drawn by the next batch, every part
of a batch (seeds' own times, neighbours, temporal negatives) from one snapshot; a batch with nothing written
reads none of them (counted by a tensor subclass); a bad write raises at every batch until it is undone; a
pickled copy keeps what its original saw. Values by hand (zero weights and times forbid edges), chi-square."""

from __future__ import annotations

import collections
import pickle

import numpy as np
import pytest
import torch
from scipy import stats

from samplers import PygSampler

pyg = pytest.importorskip("torch_geometric", reason="torch_geometric not installed (install the 'pyg' extra)")
from torch_geometric.data import Data, HeteroData  # noqa: E402
from torch_geometric.sampler import EdgeSamplerInput, NegativeSampling, NodeSamplerInput  # noqa: E402

pytestmark = pytest.mark.pyg

# edges into node 0 from 1, 2 and 3 (ids 0, 1, 2), and 0 -> 3 (id 3); node 4 has none (5 nodes, 4 edges:
# PyG tells node from edge attributes by their length)
EDGES = torch.tensor([[1, 2, 3, 0], [0, 0, 0, 3]])


def nodes_of(sampler: PygSampler, seeds, times=None):
    return sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.as_tensor(seeds),
                                                      time=None if times is None else torch.as_tensor(times)))


def drawn(sampler: PygSampler, seeds=(0,), times=None) -> set:
    return set(nodes_of(sampler, seeds, times).edge.tolist())


@pytest.mark.parametrize("replace", [False, True])
def test_weights_written_in_place_are_drawn_by_the_next_batch(replace):
    data = Data(edge_index=EDGES, num_nodes=5, w=torch.ones(4))
    sampler = PygSampler(data, [10 if replace else 3], replace=replace, weight_attr="w", seed=0)
    assert drawn(sampler) == {0, 1, 2}
    data.w[1:3] = 0  # edges 1 and 2 may no longer be drawn
    assert drawn(sampler) == {0}
    data.w.copy_(torch.tensor([0.0, 5.0, 0.0, 1.0]))
    assert drawn(sampler) == {1}
    with torch.no_grad():
        data.w.fill_(1.0)
    assert drawn(sampler) == {0, 1, 2}
    assert sampler.generation == 3  # one rebuild per batch after a write, none otherwise
    assert drawn(sampler) == {0, 1, 2} and sampler.generation == 3


def test_the_next_batch_follows_the_written_weights_law():
    """Weights 1, 3, 0 written over 1, 1, 1: 4,000 draws with replacement, chi-square against 1 : 3."""
    data = Data(edge_index=EDGES, num_nodes=5, w=torch.ones(4))
    sampler = PygSampler(data, [4000], replace=True, weight_attr="w", seed=5)
    nodes_of(sampler, [0])
    data.w[:3] = torch.tensor([1.0, 3.0, 0.0])
    out = nodes_of(sampler, [0])
    counts = np.bincount(out.edge.numpy(), minlength=4)
    assert counts[2] == 0 and counts[3] == 0 and counts.sum() == 4000
    assert stats.chisquare(counts[:2], [1000, 3000]).pvalue > 1e-3


def test_typed_weights_written_in_place_are_drawn_by_the_next_batch():
    data = HeteroData()
    data["u"].num_nodes, data["i"].num_nodes = 3, 1
    data["u", "to", "i"].edge_index = torch.tensor([[0, 1, 2], [0, 0, 0]])
    data["u", "to", "i"].w = torch.ones(3)
    data["i", "by", "u"].edge_index = torch.tensor([[0], [1]])
    data["i", "by", "u"].w = torch.ones(1)
    sampler = PygSampler(data, [3], weight_attr="w", seed=0)

    def typed() -> set:
        seeds = NodeSamplerInput(input_id=None, node=torch.tensor([0]), input_type="i")
        out = sampler.sample_from_nodes(seeds)
        return set(out.edge[("u", "to", "i")].tolist())

    assert typed() == {0, 1, 2}
    data["u", "to", "i"].w[0] = 0
    assert typed() == {1, 2}


def test_edge_times_written_in_place_are_drawn_by_the_next_batch():
    data = Data(edge_index=EDGES, num_nodes=5, t=torch.tensor([5, 1, 9, 0]))
    sampler = PygSampler(data, [-1], time_attr="t", seed=0)
    assert drawn(sampler, times=[3]) == {1}  # edge 0 at 5 and edge 2 at 9 are later than the seed's 3
    data.t[0] = 2
    assert drawn(sampler, times=[3]) == {0, 1}
    data.t[1] = 4
    assert drawn(sampler, times=[3]) == {0}
    assert drawn(sampler, times=[9]) == {0, 1, 2}  # the seeds' given times: per batch, as before


@pytest.mark.parametrize("strategy", ["uniform", "last"])
def test_node_times_written_in_place_are_one_snapshot_for_seeds_and_neighbours(strategy):
    """Node times 3, 5, 1, 0: node 0 (its own time 3) sees neighbour 2 (1) only; neighbour 1 written to 2
    is seen too, by the neighbours' rule (not only by the seeds' own times, as before); the seed's own
    time written to 0 leaves no neighbour."""
    data = Data(edge_index=EDGES, num_nodes=5, t=torch.tensor([3, 5, 1, 0, 0]))
    sampler = PygSampler(data, [-1], time_attr="t", temporal_strategy=strategy, seed=0)
    assert drawn(sampler) == {1, 2}
    data.t[1] = 2
    assert drawn(sampler) == {0, 1, 2}
    data.t[0] = 0
    assert drawn(sampler) == {2}
    assert drawn(sampler, times=[9]) == {0, 1, 2}


def test_a_bad_weight_written_raises_at_every_batch_until_undone():
    data = Data(edge_index=EDGES, num_nodes=5, w=torch.ones(4))
    sampler = PygSampler(data, [3], weight_attr="w", seed=0)
    drawn(sampler)
    data.w[1] = -1.0
    for _ in range(2):
        with pytest.raises(ValueError, match="negative, NaN or infinite"):
            drawn(sampler)
    data.w[1] = 0.0
    assert drawn(sampler) == {0, 2}


def test_a_pickled_copy_draws_what_its_original_would():
    data = Data(edge_index=EDGES, num_nodes=5, w=torch.ones(4))
    sampler = PygSampler(data, [2], weight_attr="w", seed=3)
    drawn(sampler)
    twin = pickle.loads(pickle.dumps(sampler))  # current: the same next batches
    for _ in range(3):
        assert torch.equal(nodes_of(twin, [0, 3]).edge, nodes_of(sampler, [0, 3]).edge)
    data.w[0] = 0  # written, not yet drawn: the copy rebuilds at its first batch
    twin = pickle.loads(pickle.dumps(sampler))
    assert drawn(twin) == {1, 2} and twin.generation == sampler.generation + 1
    twin.source.weights[("node", "to", "node")][1] = 0  # the copy's own tensors are stamped
    assert drawn(twin) == {2}


class Counted(torch.Tensor):
    """A tensor that counts the accesses to its values by name (torch functions on it other than the
    property reads, e.g. its version counter, shape and dtype; a view taken by detach counts once)."""

    reads: collections.Counter = collections.Counter()
    META = {"__get__", "is_complex", "dim", "size", "numel", "__len__"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if args and isinstance(args[0], Counted) and name not in cls.META:
            cls.reads[args[0].label] += 1
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def counted(t: torch.Tensor, label: str) -> Counted:
    out = t.as_subclass(Counted)
    out.label = label
    return out


@pytest.mark.parametrize("case", ["weights", "node_times_links", "edge_times"])
def test_a_batch_reads_each_weight_and_time_tensor_once_after_a_write_and_never_else(case):
    rng = np.random.default_rng(0)
    n, e = 40, 200
    ei = torch.from_numpy(rng.integers(0, n, (2, e)))
    data = Data(edge_index=ei, num_nodes=n, w=counted(torch.rand(e) + 0.1, "w"),
                nt=counted(torch.from_numpy(rng.integers(0, 10, n)), "nt"),
                et=counted(torch.from_numpy(rng.integers(0, 10, e)), "et"))
    time_attr = {"weights": None, "node_times_links": "nt", "edge_times": "et"}[case]
    sampler = PygSampler(data, [3, 2], weight_attr="w", time_attr=time_attr, seed=0)
    watched = {"w"} | ({time_attr} if time_attr else set())

    def batch() -> None:
        if case == "node_times_links":  # seed times, binary negatives redrawn by the node times
            sampler.sample_from_edges(EdgeSamplerInput(input_id=None, row=ei[0, :6], col=ei[1, :6],
                                                       time=torch.tensor([0, 1, 2, 3, 0, 9])),
                                      NegativeSampling("binary", 2.0))
        else:
            nodes_of(sampler, torch.arange(8), None if case == "weights" else torch.full((8,), 9))

    for write in ("w", *sorted(watched - {"w"})):
        Counted.reads.clear()
        batch()
        batch()
        assert Counted.reads == {}  # nothing written: no read
        with torch.no_grad():
            getattr(data, write).add_(1)
        Counted.reads.clear()  # the write's own access
        batch()
        assert Counted.reads == dict.fromkeys(watched, 1), write  # one snapshot of each
        Counted.reads.clear()
        batch()
        assert Counted.reads == {}

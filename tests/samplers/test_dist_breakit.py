"""samplers.distributed under hostile use: a sampler pickled while its stream is read, and batches whose
tensor the caller reuses while `sample_many` reads ahead; blocks stay those of `NeighborSampler`."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from graphrl.datasets import synthetic_graph
from graphrl.graph import CSCGraph
from graphrl.partition import graph_fingerprint, write_partitions
from samplers import LaborSampler, NeighborSampler
from samplers.distributed import DistLaborSampler, DistNeighborSampler, LocalOwners

N, E, P = 600, 6000, 3


@pytest.fixture(scope="module")
def graph() -> CSCGraph:
    return synthetic_graph(N, E, "powerlaw", seed=4)


@pytest.fixture(scope="module")
def owners(graph, tmp_path_factory) -> LocalOwners:
    path = tmp_path_factory.mktemp("breakit") / "parts"
    write_partitions(graph, path, P, method="ldg", seed=1)
    return LocalOwners(str(path), expect=graph_fingerprint(graph))


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for f in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids"):
            assert getattr(x, f).dtype == getattr(y, f).dtype, f
            assert torch.equal(getattr(x, f), getattr(y, f)), f


def test_a_sampler_pickled_while_its_stream_is_read_continues_it(graph, owners):
    ref = NeighborSampler(graph, [4, 3], seed=5)
    dist = DistNeighborSampler(owners, [4, 3], seed=5)
    batches = [torch.arange(lo, N, 23) for lo in range(6)]
    stream = dist.sample_many(batches, batches_per_request=2, in_flight=2)
    for seeds in batches[:3]:
        _same(ref.sample(seeds), next(stream))
    copy = pickle.loads(pickle.dumps(dist))  # the copy has no stream: it samples the 4th call
    fourth = copy.sample(batches[3])
    _same(ref.sample(batches[3]), fourth)
    _same(fourth, next(stream))  # the original's stream goes on as before
    stream.close()


def test_sample_many_copies_each_batch_as_it_reads_it(graph, owners):
    ref = NeighborSampler(graph, [4, 3], seed=6)
    dist = DistNeighborSampler(owners, [4, 3], seed=6)
    rng = np.random.default_rng(0)
    batches = [torch.from_numpy(rng.integers(0, N, 20)) for _ in range(6)]
    buffer = torch.empty(20, dtype=torch.int64)

    def reused():  # one buffer refilled per batch, as a hand-written loader might
        for seeds in batches:
            buffer.copy_(seeds)
            yield buffer

    for seeds, blocks in zip(batches, dist.sample_many(reused(), batches_per_request=2, in_flight=2),
                             strict=True):
        _same(ref.sample(seeds), blocks)


def test_sample_many_holds_one_relabelling_map_for_every_batch_in_flight(tmp_path):
    import tracemalloc

    n = 40_000  # a map is 4 bytes per node: 160 KB here
    path = tmp_path / "parts"
    graph = synthetic_graph(n, 40_000, "powerlaw", seed=1)
    write_partitions(graph, path, 2, method="ldg")
    dist = DistNeighborSampler(LocalOwners(str(path)), [3, 2], seed=0)
    ref = NeighborSampler(graph, [3, 2], seed=0)
    batches = [torch.arange(k, 5 * k + 9) for k in range(64)]  # 16 groups of 4 in flight at once
    for per, in_flight in ((4, 16), (64, 1)):
        tracemalloc.start()
        try:
            blocks = []
            for got in dist.sample_many(batches, batches_per_request=per, in_flight=in_flight):
                blocks.append(got)
                peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        for seeds, got in zip(batches, blocks, strict=True):
            _same(ref.sample(seeds), got)
        assert peak < 4 << 20  # the blocks and one map; a map per batch in flight would be 10 MB


def test_weighted_labor0_blocks_of_an_empty_batch_carry_empty_edge_weights(graph, owners, tmp_path):
    w = torch.rand(E, generator=torch.Generator().manual_seed(0))
    order = torch.argsort(graph.csc_edge_ids())
    dst = torch.repeat_interleave(torch.arange(N), torch.diff(graph.indptr))
    weighted = CSCGraph.from_edges(graph.indices[order], dst[order], N, weights=w)
    write_partitions(weighted, tmp_path / "parts", 2, method="ldg")
    dist = DistLaborSampler(LocalOwners(str(tmp_path / "parts")), [3, 2], weighted=True, seed=1)
    ref = LaborSampler(weighted, [3, 2], importance_sampling=0, weights=True, seed=1)
    batches = [torch.empty(0, dtype=torch.int64), torch.arange(5), torch.empty(0, dtype=torch.int64)]
    got = [dist.sample(batches[0]), *dist.sample_many(batches[1:], batches_per_request=1)]
    for seeds, b in zip(batches, got, strict=True):
        a = ref.sample(seeds)
        _same(a, b)
        for x, y in zip(a, b, strict=True):
            assert y.edge_weights is not None and y.edge_weights.dtype == torch.float32
            assert torch.equal(x.edge_weights, y.edge_weights)


def test_sample_many_checks_its_arguments_when_called_not_when_first_read(owners):
    dist = DistNeighborSampler(owners, [2], seed=0)
    with pytest.raises(ValueError, match="in_flight must be an int >= 1, got 0"):
        dist.sample_many([torch.arange(3)], in_flight=0)
    with pytest.raises(ValueError, match="batches_per_request must be an int >= 1, got 2.0"):
        dist.sample_many([torch.arange(3)], batches_per_request=2.0)
    with pytest.raises(TypeError, match="batches must be an iterable of seed tensors, got int"):
        dist.sample_many(5)
    assert dist.sample(torch.arange(3))[0].num_dst_nodes == 3  # nothing refused is left streaming


@pytest.mark.parametrize("bad", ["out of range", "reader fails"])
def test_a_bad_batch_is_raised_in_its_turn_after_the_batches_before_it(graph, owners, bad):
    ref = NeighborSampler(graph, [3, 2], seed=9)
    dist = DistNeighborSampler(owners, [3, 2], seed=9)
    good = [torch.arange(lo, N, 41) for lo in range(7)]

    def batches():  # successive sample calls give 7 blocks, then the error
        yield from good
        if bad == "out of range":
            yield torch.tensor([3, N + 5])
        raise KeyError("loader broke")

    got = []
    error = ValueError if bad == "out of range" else KeyError
    with pytest.raises(error, match=str(N + 5) if bad == "out of range" else "loader broke"):
        for blocks in dist.sample_many(batches(), batches_per_request=4, in_flight=2):
            got.append(blocks)
    assert len(got) == len(good)
    for seeds, blocks in zip([*good, torch.arange(9)], [*got, dist.sample(torch.arange(9))], strict=True):
        _same(ref.sample(seeds), blocks)  # the bad batch is not counted: the next call follows the 7th

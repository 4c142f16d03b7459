"""LayerLoop.plain_cpu_blocks: a plain CPU sampler's blocks straight from the fused pass equal the blocks of
the general layer loop (`LayerLoop.run` then `plain_blocks`) for every mode, with and without exclusions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from samplers.layers import PLAIN_NODE, PLAIN_RELATION, plain_blocks
from samplers.neighbor import NeighborSampler


def same_blocks(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.src_nodes, y.src_nodes) and torch.equal(x.dst_nodes, y.dst_nodes)
        and torch.equal(x.indptr, y.indptr) and torch.equal(x.indices, y.indices)
        and torch.equal(x.edge_ids, y.edge_ids) and (x.src_times is None) == (y.src_times is None)
        and (x.src_times is None or torch.equal(x.src_times, y.src_times)) and y.edge_weights is None
        for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", ["uniform", "replace", "weighted", "temporal"])
@pytest.mark.parametrize("threads", [1, 2])
def test_plain_cpu_blocks_equal_the_general_loop(kind, threads):
    rng = np.random.default_rng(3)
    n, e = 400, 8000
    graph = CSCGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    kw = {"replace": kind == "replace"}
    if kind == "weighted":
        kw["weights"] = torch.from_numpy(rng.random(e).astype(np.float32))
    if kind == "temporal":
        kw["edge_times"] = torch.from_numpy(rng.integers(0, 50, e))
    sampler = NeighborSampler(graph, [6, -1, 3], seed=11, **kw)
    loop = sampler.loop
    for call in range(3):
        dst = rng.integers(0, n, 64)
        times = rng.integers(0, 50, 64) if kind == "temporal" else None
        excluded = None if call == 0 else np.unique(rng.integers(0, e, 500))
        before = loop.sampled_edges
        fast = loop.plain_cpu_blocks(dst, sampler.fanouts, sampler.seed, call, excluded=excluded,
                                     seed_times=times, threads=threads)
        fast_edges = loop.sampled_edges - before
        excl = None if excluded is None else {PLAIN_RELATION: excluded}
        general = plain_blocks(loop.run({PLAIN_NODE: dst}, {PLAIN_RELATION: sampler.fanouts}, sampler.seed,
                                        call, excluded=excl,
                                        seed_times=None if times is None else {PLAIN_NODE: times},
                                        threads=threads))
        assert same_blocks(fast, general)
        assert fast_edges == loop.sampled_edges - before - fast_edges == sum(b.num_edges for b in fast) > 0

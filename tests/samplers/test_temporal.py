"""Temporal neighbour sampling: no edge from a seed's future in any layer, per-(node, time) rows, equality
with the reference, argument checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_neighbor import blocks_equal, edge_endpoints, reference_blocks

from graphrl.graph import CSCGraph
from samplers.neighbor import NeighborSampler


def check_no_future_edges(graph: CSCGraph, blocks, edge_times: np.ndarray) -> None:
    """Every sampled edge is no later than the time of the row that drew it, and times chain."""
    src_of, dst_of = edge_endpoints(graph)
    for i, b in enumerate(blocks):
        assert b.src_times is not None and b.src_times.shape == b.src_nodes.shape
        assert torch.equal(b.dst_times, b.src_times[: b.num_dst_nodes])
        if i + 1 < len(blocks):
            assert torch.equal(b.dst_times, blocks[i + 1].src_times)
        eids = b.edge_ids.numpy()
        row_time = b.dst_times.numpy()[b.edge_dst().numpy()]
        assert (edge_times[eids] <= row_time).all(), "an edge from the future of its row was drawn"
        # a sampled source carries the time of the row that drew it
        assert np.array_equal(b.src_times.numpy()[b.indices.numpy()], row_time)
        assert np.array_equal(b.src_nodes.numpy()[b.indices.numpy()], src_of[eids])
        assert np.array_equal(b.dst_nodes.numpy()[b.edge_dst().numpy()], dst_of[eids])
        pairs = list(zip(b.src_nodes[b.num_dst_nodes:].tolist(), b.src_times[b.num_dst_nodes:].tolist(),
                         strict=True))
        assert len(set(pairs)) == len(pairs)  # new sources: each (node, time) once


@pytest.fixture
def chain() -> tuple[CSCGraph, torch.Tensor]:
    """0 <- 1 at t=5, 0 <- 2 at t=20 (the future for a seed at t=10); 1 <- 3 at t=8, 1 <- 4 at t=9,
    1 <- 5 at t=15; 2 <- 6 at t=1; 3 <- 7 at t=12."""
    src = [1, 2, 3, 4, 5, 6, 7]
    dst = [0, 0, 1, 1, 1, 2, 3]
    t = torch.tensor([5, 20, 8, 9, 15, 1, 12])
    return CSCGraph.from_edges(src, dst, 8), t


def test_a_future_edge_never_leaks_into_any_layer(chain):
    graph, t = chain
    for replace, fanouts in ((False, [-1, -1, -1]), (False, [5, 5, 5]), (True, [3, 3, 3])):
        sampler = NeighborSampler(graph, fanouts, replace=replace, edge_times=t, seed=0)
        blocks = sampler.sample(torch.tensor([0]), seed_times=torch.tensor([10]))
        check_no_future_edges(graph, blocks, t.numpy())
        eids = set(torch.cat([b.edge_ids for b in blocks]).tolist())
        assert 1 not in eids  # 0 <- 2 at t=20 is after the seed's time 10
        assert 4 not in eids and 6 not in eids  # 1 <- 5 at 15 and 3 <- 7 at 12: after the inherited 10
        if not replace:
            assert eids == {0, 2, 3}
    # the same seed at a later time sees them
    blocks = NeighborSampler(graph, [-1, -1, -1], edge_times=t, seed=0).sample(torch.tensor([0]),
                                                                              seed_times=torch.tensor([30]))
    assert set(torch.cat([b.edge_ids for b in blocks]).tolist()) == set(range(7))


def test_a_node_reached_at_two_times_is_two_rows(chain):
    graph, t = chain
    # seeds 0 at t=10 and 1 at t=16: node 1 is a seed (t=16) and a neighbour of 0 (inherits t=10)
    sampler = NeighborSampler(graph, [-1, -1], edge_times=t, seed=0)
    blocks = sampler.sample(torch.tensor([0, 1]), seed_times=torch.tensor([10, 16]))
    check_no_future_edges(graph, blocks, t.numpy())
    last = blocks[-1]
    assert last.src_nodes.tolist() == [0, 1, 1, 3, 4, 5]
    assert last.src_times.tolist() == [10, 16, 10, 16, 16, 16]
    assert last.edge_ids.tolist() == [0, 2, 3, 4]
    assert last.indices.tolist() == [2, 3, 4, 5]  # 0 <- (1 at 10); 1 <- 3, 4, 5 at 16
    outer = blocks[0]
    rows = {(v, tt): outer.edge_ids[int(outer.indptr[i]):int(outer.indptr[i + 1])].tolist()
            for i, (v, tt) in enumerate(zip(outer.dst_nodes.tolist(), outer.dst_times.tolist(), strict=True))}
    assert rows[(1, 10)] == [2, 3] and rows[(1, 16)] == [2, 3, 4]  # node 1 at 10 does not see 1 <- 5 at 15
    # the same node at the same time is one source node
    b = NeighborSampler(graph, [-1], edge_times=t, seed=0).sample(torch.tensor([1, 0]),
                                                                  seed_times=torch.tensor([10, 10]))[0]
    assert b.src_nodes.tolist() == [1, 0, 3, 4] and b.indices.tolist() == [2, 3, 0]


def test_float_times_and_mixed_dtypes(chain):
    graph, t = chain
    ft = t.double() + 0.5
    sampler = NeighborSampler(graph, [-1], edge_times=ft, seed=0)
    b = sampler.sample(torch.tensor([0, 0]), seed_times=torch.tensor([5.5, 5.49]))[0]
    assert b.edge_ids.tolist() == [0] and b.src_times.dtype == torch.float64
    # float seed times against integer edge times: floored (an edge at 9 is not after 9.9)
    sampler = NeighborSampler(graph, [-1], edge_times=t, seed=0)
    b = sampler.sample(torch.tensor([1, 1]), seed_times=torch.tensor([9.9, -0.5]))[0]
    assert b.edge_ids.tolist() == [2, 3] and b.src_times.dtype == torch.int64
    assert b.dst_times.tolist() == [9, -1]


def test_temporal_arguments_are_checked(chain):
    graph, t = chain
    sampler = NeighborSampler(graph, [2], edge_times=t, seed=0)
    with pytest.raises(ValueError, match="seed_times is required"):
        sampler.sample(torch.tensor([0]))
    with pytest.raises(ValueError, match=r"seed_times must have one time per seed \(\[2\]\)"):
        sampler.sample(torch.tensor([0, 1]), seed_times=torch.tensor([1]))
    with pytest.raises(ValueError, match="seed_times: 1 of 1 times are NaN"):
        sampler.sample(torch.tensor([0]), seed_times=torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="no edge_times"):
        NeighborSampler(graph, [2], seed=0).sample(torch.tensor([0]), seed_times=torch.tensor([1]))
    with pytest.raises(ValueError, match=r"edge_times must have shape \[7\]"):
        NeighborSampler(graph, [2], edge_times=torch.zeros(6))
    with pytest.raises(ValueError, match="edge_times: 1 of 7 times are NaN"):
        NeighborSampler(graph, [2], edge_times=torch.tensor([0.0, 1, 2, 3, float("nan"), 5, 6]))


@st.composite
def temporal_cases(draw):
    n = draw(st.integers(1, 30))
    e = draw(st.integers(0, 250))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dst = np.minimum(rng.geometric(draw(st.sampled_from([0.05, 0.3])), e) - 1, n - 1)
    graph = CSCGraph.from_edges(rng.integers(0, n, e), dst, n)
    times = rng.integers(0, 20, e)
    if draw(st.booleans()):
        times = times + rng.random(e)
    seeds = rng.integers(0, n, draw(st.integers(0, 10)))
    seed_times = rng.integers(0, 25, seeds.size).astype(times.dtype)
    w = rng.random(e) * (rng.random(e) < 0.8) if draw(st.booleans()) else None
    fanouts = draw(st.lists(st.sampled_from([-1, 0, 1, 3, 8, 40]), min_size=1, max_size=3))
    excluded = rng.integers(0, e, e // 5) if e and draw(st.booleans()) else None
    return graph, times, w, seeds, seed_times, fanouts, draw(st.booleans()), excluded, seed % 1000


@settings(max_examples=80, deadline=None)
@given(temporal_cases())
def test_temporal_cpu_kernels_equal_the_reference(case):
    graph, times, w, seeds, seed_times, fanouts, replace, excluded, seed = case
    sampler = NeighborSampler(graph, fanouts, replace=replace, seed=seed, edge_times=torch.from_numpy(times),
                              weights=None if w is None else torch.from_numpy(w))
    for call in range(2):
        ex = None if excluded is None else torch.from_numpy(excluded)
        blocks = sampler.sample(torch.from_numpy(seeds), exclude_eids=ex,
                                seed_times=torch.from_numpy(seed_times))
        want = reference_blocks(graph, seeds, fanouts, replace, seed, call, excluded, weights=w,
                                edge_times=times, seed_times=seed_times)
        assert blocks_equal(blocks, want)
        check_no_future_edges(graph, blocks, times)


def test_temporal_blocks_convert_to_pyg(chain):
    graph, t = chain
    blocks = NeighborSampler(graph, [-1, -1], edge_times=t, seed=0).sample(torch.tensor([0, 1]),
                                                                          seed_times=torch.tensor([10, 16]))
    out = blocks.to_pyg()
    assert out.n_id[:2].tolist() == [0, 1] and out.num_sampled_edges[0] == 4
    assert out.n_id.tolist().count(1) == 2  # node 1 at two times is two nodes of the subgraph


def test_float_seed_times_at_the_int64_ends_keep_the_time_rule():
    # int64 edge times at both ends: float seed times are floored and clamped to the int64 range,
    # never to a narrower one; below -2**63 no int64 time can stand for them, so they are refused
    g = CSCGraph.from_edges([1, 2, 3], [0, 0, 0], 4)
    et = torch.tensor([-(2**63), 9_205_000_000_000_000_000, 2**63 - 1])
    sampler = NeighborSampler(g, [-1], seed=0, edge_times=et)

    def seen(t: float) -> list[int]:
        times = torch.tensor([t], dtype=torch.float64)
        return sorted(sampler.sample(torch.tensor([0]), seed_times=times)[0].edge_ids.tolist())

    assert seen(-(2.0**63)) == [0]
    assert seen(9.2e18) == [0]  # below the middle edge
    assert seen(9.21e18) == [0, 1]
    assert seen(2.0**63) == seen(float("inf")) == [0, 1, 2]
    for t in (float("-inf"), -1e19):
        with pytest.raises(ValueError, match=r"1 of 1 times are below -2\*\*63, first -(inf|1e\+19)"):
            seen(t)

"""Heterogeneous sampling on the GPU (``HeteroNeighborSampler(device="cuda")``) under numba's CUDA simulator,
in a subprocess (the simulator must be chosen before numba.cuda is first imported): the simulated-GPU
blocks equal the CPU blocks exactly (node ids, indptr, local indices, edge ids, source times, per node type
and relation) for uniform draws with and without replacement, weighted draws on deterministic fanouts,
exclusions, UVA and temporal sampling; and the clear errors of a bad device and of device="cuda" without a
GPU. Graphs are tiny and simulated calls few: each costs seconds."""

from __future__ import annotations

import textwrap

import pytest
import torch

from samplers.hetero import HeteroGraph, HeteroNeighborSampler

COMMON = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy scalar uint64 wrap-around in simulated kernels
    import numpy as np
    import torch
    from numba import config
    assert config.ENABLE_CUDASIM  # the simulator, not a GPU
    from samplers.hetero import HeteroGraph, HeteroNeighborSampler

    LISTENS = ("user", "listens", "artist")
    HEARD = ("artist", "heard_by", "user")
    FRIENDS = ("user", "friends", "user")
    rng = np.random.default_rng(0)
    U, A = 12, 8
    u, a = rng.integers(0, U, 40), rng.integers(0, A, 40)
    f1, f2 = rng.integers(0, U, 20), rng.integers(0, U, 20)
    w_listen = rng.random(40) * (rng.random(40) < 0.7)  # 30 % zero weights: never drawn
    edges = {LISTENS: (u, a), HEARD: (a, u), FRIENDS: (f1, f2)}
    graph = HeteroGraph.from_edges({"user": U, "artist": A}, edges, weights={LISTENS: torch.tensor(w_listen)})
    seeds = {"user": torch.tensor([0, 3, 3, 11]), "artist": torch.tensor([2, 7])}
    excluded = {LISTENS: torch.from_numpy(rng.integers(0, 40, 10)), FRIENDS: torch.tensor([0, 5, 5])}

    def same(want, got, what):
        assert len(want) == len(got), what
        for x, y in zip(want, got):
            for f in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids", "src_times"):
                dx, dy = getattr(x, f), getattr(y, f)
                if dx is None:
                    assert dy is None, (what, f)
                    continue
                assert dx.keys() == dy.keys(), (what, f)
                for k in dx:
                    assert dx[k].dtype == dy[k].dtype, (what, f, k, dx[k].dtype, dy[k].dtype)
                    assert torch.equal(dx[k], dy[k]), (what, f, k, dx[k], dy[k])

    def compare(fanouts, calls, what, uva=None, **kw):
        cpu_s = HeteroNeighborSampler(graph, fanouts, seed=9, **kw)
        gpu_s = HeteroNeighborSampler(graph, fanouts, seed=9, device="cuda", uva=uva, **kw)
        for i, call in enumerate(calls):
            got = gpu_s.sample(**call)
            same(cpu_s.sample(**call), got, (what, i))
        assert cpu_s.sampled_edges == gpu_s.sampled_edges > 0, (what, gpu_s.sampled_edges)
        return gpu_s, got
    """
)

STATIC_SCRIPT = COMMON + textwrap.dedent(
    """
    # uniform without replacement: fanouts below and above the degrees, -1, a relation left out; the
    # second call excludes edges of two relations
    fan = {LISTENS: [3, -1], HEARD: [2, 2], FRIENDS: [-1, 1]}
    compare(fan, [dict(seeds=seeds), dict(seeds=seeds, exclude_eids=excluded)], "uniform")
    # with replacement, one seeded type, the graphs read through UVA (mapped host memory)
    s, blocks = compare({LISTENS: [2, 3], HEARD: [3, 2]}, [dict(seeds={"artist": seeds["artist"]},
                                                                exclude_eids=excluded)],
                        "replace", uva=True, replace=True)
    assert all(g.uva for g in s._cuda_graphs.values()) and FRIENDS not in s._cuda_graphs
    assert blocks[-1].dst_nodes["user"].numel() == 0 and blocks[-1].num_edges(HEARD) == 0  # no user rows
    assert blocks[-1].num_edges(LISTENS) == 3 * 2 and blocks[0].num_edges(HEARD) > 0
    # weighted on deterministic fanouts (-1, and a fanout above every degree): every positive-weight edge
    deg = max(int(np.bincount(d).max()) for d in (a, u, f2))
    s, blocks = compare({LISTENS: [-1, deg], HEARD: [deg, -1], FRIENDS: [-1, -1]},
                        [dict(seeds=seeds, exclude_eids=excluded)], "weighted", weights=True)
    assert all((w_listen[b.edge_ids[LISTENS].numpy()] > 0).all() for b in blocks)
    assert s._cuda_graphs[LISTENS].weighted and not s._cuda_graphs[HEARD].weighted
    print("OK")
    """
)

TEMPORAL_SCRIPT = COMMON + textwrap.dedent(
    """
    # integer times on two relations, heard_by static; sources deduplicated per type by (node, time)
    times = {LISTENS: torch.from_numpy(rng.integers(0, 10, 40)),
             FRIENDS: torch.from_numpy(rng.integers(0, 10, 20))}
    st = {"user": torch.tensor([5, 2, 7, 9]), "artist": torch.tensor([4, 8])}
    fan = {LISTENS: [3, -1], HEARD: [2, 2], FRIENDS: [-1, 2]}
    s, blocks = compare(fan, [dict(seeds=seeds, seed_times=st, exclude_eids=excluded)], "temporal int",
                        edge_times=times)
    assert blocks[0].src_times["user"].dtype == torch.int64
    t_listen = times[LISTENS].numpy()
    for b in blocks:  # no future edge
        row_t = b.dst_times["artist"][b.edge_dst(LISTENS)].numpy()
        assert (t_listen[b.edge_ids[LISTENS].numpy()] <= row_t).all()
    # chained on the device relation by relation (temporal masked rows, the static relation's thread-per-row
    # rows): fanouts >= 0 without replacement, one read-back a call
    s, blocks = compare({LISTENS: [2, 3], HEARD: [2, 1], FRIENDS: [3, 2]},
                        [dict(seeds=seeds, seed_times=st, exclude_eids=excluded)], "temporal chained",
                        edge_times=times)
    assert s.traffic.readbacks == 1 and s.traffic.chain_overflows == 0, s.traffic
    # relations of fanout -1 past their capacity (sized without the degrees' guess: a mean degree of 0):
    # sampled again unchained, their edges per row learned, so the same call chains the second time
    import dataclasses
    from samplers.kernels.cuda import bounded
    own_of = bounded.DegreeBound.of
    bounded.DegreeBound.of = classmethod(lambda cls, indptr: dataclasses.replace(own_of(indptr),
                                                                                 mean_degree=0.0))
    bounded.FULL_SLACK, bounded.FULL_EXTRA = 1.0, 1
    call = dict(seeds=seeds, seed_times=st, exclude_eids=excluded)
    s, _ = compare({LISTENS: [-1], HEARD: [2], FRIENDS: [-1]}, [call, call], "temporal -1 overflow",
                   edge_times=times)
    assert s.traffic.chain_overflows == 1, s.traffic
    bounded.FULL_SLACK, bounded.FULL_EXTRA, bounded.DegreeBound.of = 2.0, 1024, own_of
    # a chain's masked rows by time draw with replacement too: k draws a row with an eligible edge, at the
    # bound D * k, nothing read back
    from numba import cuda
    from samplers.kernels.cuda.graph import CudaGraph
    from samplers.kernels.cuda.layer import sample_edges_bounded, start_rows
    from samplers.kernels.cuda.workspace import CudaWorkspace
    tg = CudaGraph.build(np.array([0, 2, 3]), np.array([1, 0, 1], np.int32), times=np.array([0, 1, 2]))
    ws = CudaWorkspace()
    rows = start_rows(np.array([0, 1]), ws, 1, cuda.to_device(np.array([5, 1])))
    got = sample_edges_bounded(tg, rows, 3, True, 0, False, None, ws)
    assert got.src.shape[0] == 6 and got.nnz.copy_to_host().tolist() == [3] and ws.traffic.readbacks == 0
    assert set(got.eids.copy_to_host()[:3].tolist()) <= {0, 1}  # row 1's one edge has time 2 > 1
    # float times (then float64 for all) with replacement, -0.0 among the seed times, one layer
    ft = {LISTENS: times[LISTENS].double() - 0.5, FRIENDS: times[FRIENDS]}
    st = {"user": torch.tensor([-0.0, 2.5, 0.0, 9.0])}
    s, blocks = compare({LISTENS: [2], HEARD: [2], FRIENDS: [3]}, [dict(seeds={"user": seeds["user"]},
                                                                       seed_times=st)],
                        "temporal float", replace=True, edge_times=ft)
    assert blocks[0].src_times["user"].dtype == torch.float64
    print("OK")
    """
)


@pytest.mark.slow
@pytest.mark.simulated(STATIC_SCRIPT)
def test_hetero_cuda_blocks_equal_the_cpu_blocks_under_the_simulator(simulated_part):
    """Uniform with and without replacement, weighted on deterministic fanouts, exclusions, UVA."""
    part = simulated_part
    assert part.ok and part.output.strip().endswith("OK"), part.output


@pytest.mark.slow
@pytest.mark.simulated(TEMPORAL_SCRIPT)
def test_hetero_temporal_cuda_blocks_equal_the_cpu_blocks_under_the_simulator(simulated_part):
    """Integer and float edge times (a static relation among them), -0.0 seed times, exclusions."""
    part = simulated_part
    assert part.ok and part.output.strip().endswith("OK"), part.output


CLICKS = ("user", "clicks", "item")


def _tiny() -> HeteroGraph:
    return HeteroGraph.from_edges({"user": 3, "item": 2}, {CLICKS: ([0, 1, 2], [0, 0, 1])})


def test_hetero_bad_device_raises_value_error():
    with pytest.raises(ValueError, match=r"device must be 'cpu' or 'cuda', got 'tpu'"):
        HeteroNeighborSampler(_tiny(), [2], device="tpu")
    b = HeteroNeighborSampler(_tiny(), [2], seed=0, device=torch.device("cpu")).sample(
        {"item": torch.tensor([0])})[0]
    assert b.num_edges() == 2 and b.indices[CLICKS].device.type == "cpu"


def test_hetero_device_cuda_without_a_gpu_raises_a_clear_error():
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a CUDA device (or the simulator) is present")
    with pytest.raises(RuntimeError, match=r"device='cuda' needs a CUDA GPU.*use device='cpu'"):
        HeteroNeighborSampler(_tiny(), [2], device="cuda")
    cpu_sampler = HeteroNeighborSampler(_tiny(), [-1], seed=0)  # the remedy
    assert cpu_sampler.sample({"item": torch.tensor([1])})[0].num_edges() == 1

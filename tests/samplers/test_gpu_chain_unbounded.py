"""Plain-graph CUDA layers that once read their sizes back every layer now chain on the device: fanout -1
(every in-edge, sized by a capacity from the degrees; weighted rows: every edge of positive weight),
uniform fanouts above the thread-per-row limit (a warp per row), and temporal layers with replacement
(the prefix-sum inversion without per-edge scratch). Under numba's CUDA simulator in a subprocess (it
must be chosen before numba.cuda is first imported), the script asserts for each:

- the blocks equal the CPU sampler's for the same seed (exact, times included);
- one read-back a call, counted by the library (`HostTraffic.readbacks`) and by wrapping the simulator's
  device-to-host copies and host-side scalar reads;
- a warm call copies no pageable host memory to the device (seed ids, seed times and excluded ids are
  staged page-locked): `cuda.to_device` and kernels' host-array arguments counted, zero;
- a fanout -1 layer past its capacity is sampled again unchained (the same blocks, counted in
  `chain_overflows`), and the edges per row it kept size the next call's capacity;
- weighted fanout -1 keeps the uniform fanout -1 edges where every weight is positive;
- the layer after a fanout -1 layer has at most N + (seeds - 1) rows (N nodes; the seeds may repeat,
  every later row is a distinct node), however large the capacity, and that bound is met exactly with
  the same seed repeated; rows that repeat more than their bound says read as an overflow.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

SCRIPT = textwrap.dedent(
    """
    import sys
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy scalar uint64 wrap-around in simulated kernels
    import numpy as np
    import torch
    from numba import config, cuda
    from numba.cuda.simulator import kernel as sim_kernel
    assert config.ENABLE_CUDASIM
    from graphrl.graph import CSCGraph
    from samplers.kernels.cuda import bounded
    from samplers.neighbor import NeighborSampler
    sys.path.insert(0, "tests")
    from _cuda_copies import count_host_copies

    # independent counters: read-backs (the shared simulator counter) and pageable copies to the device
    # (cuda.to_device on the host, host arrays handed to kernels)
    copies = count_host_copies()
    cuda.to_device = copies.counting("pageable", cuda.to_device)
    wrap_arg = sim_kernel.wrap_arg
    def counted_arg(value, *a, **k):
        copies.seen["pageable"] += 1
        return wrap_arg(value, *a, **k)
    sim_kernel.wrap_arg = counted_arg

    rng = np.random.default_rng(0)
    n = 12  # node 0 has 80 in-edges (above the thread-per-row limit of 64), the rest a few each
    dst = np.concatenate([np.zeros(80, np.int64), rng.integers(1, n, 40)])
    graph = CSCGraph.from_edges(rng.integers(0, n, dst.shape[0]), dst, n)
    e = graph.num_edges
    etimes = torch.from_numpy(rng.integers(0, 20, e) + 0.5)  # float times: staged as float64
    weights = torch.from_numpy(rng.random(e) * (rng.random(e) < 0.8))
    excluded = torch.from_numpy(rng.integers(0, e, 12))
    seeds = torch.tensor([0, 3, 3, 7])
    seed_times = torch.tensor([9.0, -0.0, 15.5, 30.0])

    def same(want, got, what, timed):
        assert len(want) == len(got), what
        fields = ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids") + (("src_times",) * timed)
        for x, y in zip(want, got):
            for f in fields:
                assert torch.equal(getattr(x, f), getattr(y, f)), (what, f, getattr(x, f), getattr(y, f))

    def check(fanouts, what, calls=2, overflows=0, seeds=seeds, **kw):
        timed = "edge_times" in kw
        cpu_s = NeighborSampler(graph, fanouts, seed=3, **kw)
        gpu_s = NeighborSampler(graph, fanouts, seed=3, device="cuda", **kw)
        call = dict(exclude_eids=excluded, seed_times=seed_times if timed else None)
        for i in range(calls):
            want = cpu_s.sample(seeds, **call)
            copies.clear()
            before = gpu_s.loop.traffic.snapshot()
            got = gpu_s.sample(seeds, **call)
            used = gpu_s.loop.traffic.since(before)
            same(want, got, (what, i), timed)
            if not overflows:
                assert used.readbacks == 1 == copies.readbacks, (what, i, used, copies.seen)
                assert used.chain_overflows == 0, (what, i, used)
            if i:  # warm: no pageable copy to the device, no scratch grown
                assert copies.seen["pageable"] == 0, (what, copies.seen)
                assert used.pinned_copies == 2 + timed and used.scratch_allocations == 0, (what, used)
        assert gpu_s.loop.traffic.chain_overflows == overflows, (what, gpu_s.loop.traffic)
        return gpu_s, got

    check([-1, 2], "fanout -1 first")
    check([2, -1], "fanout -1 inner", calls=1)
    check([70, 1], "fanout 70", calls=1)  # node 0: Floyd's subset by a warp's lane 0; the others take all
    check([70], "fanout 70 with replacement", calls=1, replace=True)
    check([2, 3], "temporal with replacement", edge_times=etimes, replace=True)
    check([3], "temporal weighted with replacement", calls=1, edge_times=etimes, weights=weights,
          replace=True)
    check([-1], "temporal fanout -1", calls=1, edge_times=etimes)
    check([-1, 2], "weighted fanout -1 first", weights=weights)  # zero weights: never kept
    check([2, -1], "weighted fanout -1 inner", calls=1, weights=weights)
    _, got = check([-1, -1], "weighted fanout -1, positive weights", calls=1, weights=weights + 0.5)
    _, want = check([-1, -1], "uniform fanout -1", calls=1)
    same(want, got, "weighted fanout -1 = uniform fanout -1", False)
    check([2, -1], "repeated seeds, fanout -1 first", calls=1, seeds=torch.zeros(4, dtype=torch.int64))

    # the rows after a fanout -1 layer: capped at N + repeats (here 12 + 3), not the seeds + the capacity
    from dataclasses import replace as with_
    from samplers.kernels.cuda.graph import CudaGraph
    from samplers.kernels.cuda.layer import ChainOverflow, read_blocks, sample_block_cuda, start_rows
    from samplers.kernels.cuda.workspace import CudaWorkspace
    cg, ws = CudaGraph.build(graph.indptr, graph.indices), CudaWorkspace()
    deg = bounded.DegreeBound.of(graph.indptr.numpy())
    rows = start_rows(np.zeros(4, np.int64), ws, 2)
    first = sample_block_cuda(cg, rows, -1, False, 11, ws=ws, degrees=deg)
    second = sample_block_cuda(cg, first.next_rows, 2, False, 12, ws=ws, degrees=deg)
    assert first.local.shape[0] == 4 * 80 and first.src_nodes.shape[0] == n + 3, first.src_nodes.shape
    assert second.local.shape[0] == (n + 3) * 2, second.local.shape  # not (4 + 320) * 2
    (_, nodes, local, _, _), (indptr2, _, _, _, _) = read_blocks([first, second], ws)
    assert nodes.shape[0] == n + 3 and indptr2.shape[0] == n + 4  # every node reached: the bound is met
    nodes, local = nodes.copy_to_host(), local.copy_to_host()
    assert sorted(nodes[4:]) == list(range(1, n))
    assert np.array_equal(nodes[local], np.tile(graph.indices.numpy()[:80], 4))  # every edge of node 0
    rows = with_(start_rows(np.zeros(4, np.int64), ws, 1), repeats=0)  # a wrong bound: an overflow
    block = sample_block_cuda(cg, rows, 60, False, 11, ws=ws)  # 60 of node 0's 80 edges, 4 times
    assert block.src_nodes.shape[0] == n  # 4 rows + 11 new nodes do not fit: nothing written past it
    try:
        read_blocks([block], ws)
        raise AssertionError("no ChainOverflow")
    except ChainOverflow as err:
        assert "past its capacity of 12" in str(err), err

    # past the capacity: sampled again unchained (the same blocks); the kept edges per row are recorded
    bounded.FULL_SLACK, bounded.FULL_EXTRA = 0.0, 1
    s, _ = check([-1, 1], "overflow", calls=1, overflows=1)
    (ws,) = s.loop.cuda_workspaces.values()
    assert ws.edge_rate("src@3") > 1, ws.edge_rate("src@3")  # the layer after the seeds' (3 sizes a layer)
    # masked rows (a warp per row) past the capacity: rows that run past it write nothing beyond it
    check([-1], "temporal fanout -1 overflow", calls=1, overflows=1, edge_times=etimes)
    check([-1], "weighted fanout -1 overflow", calls=1, overflows=1, weights=weights)
    bounded.FULL_SLACK, bounded.FULL_EXTRA = 2.0, 1024
    print("OK")
    """
)


@pytest.mark.simulated(SCRIPT, patches=True, timeout=300)
def test_unbounded_layers_chain_under_the_simulator(simulated_part) -> None:
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output


def test_full_capacity_is_bounded_by_the_degrees_and_learns_the_rate() -> None:
    from samplers.kernels.cuda.bounded import FULL_EXTRA, FULL_SLACK, DegreeBound, full_capacity
    from samplers.kernels.cuda.workspace import CudaWorkspace

    deg = DegreeBound.of(np.array([0, 3, 3, 10, 12]))  # degrees 3, 0, 7, 2
    assert deg == DegreeBound(7, 12, 3.0)
    assert DegreeBound.of(np.array([0])) == DegreeBound(0, 0, 0.0)
    assert full_capacity(1, deg, True, repeats=0) == 7  # one row: its degree at most
    assert full_capacity(4, deg, True, repeats=0) == 12  # distinct rows: every edge at most
    assert full_capacity(4, deg, True, repeats=None) == 28  # repeats unknown: 4 x the max degree
    assert full_capacity(4, deg, False, repeats=0) == 28  # rows by time repeat nodes: 4 x the max degree
    with pytest.raises(TypeError, match="repeats"):
        full_capacity(4, deg, True)  # unknown (None) or known: the caller says which
    assert full_capacity(4, deg, True, repeats=1) == 12 + 7  # one repeated row: E + its max degree
    assert full_capacity(4, deg, True, repeats=3) == 28
    big = DegreeBound(10_000, 10**9, 5.0)
    assert full_capacity(100, big, True, repeats=0) == int(FULL_SLACK * 100 * 5.0) + FULL_EXTRA
    assert full_capacity(100, big, True, rate=50.0, repeats=0) == int(FULL_SLACK * 100 * 50.0) + FULL_EXTRA
    assert full_capacity(0, big, True, repeats=0) == 1
    ws = CudaWorkspace()
    assert ws.edge_rate("src@0") == 0.0
    ws.observe_rate("src@0", 4.5)
    ws.observe_rate("src@0", 2.0)
    assert ws.edge_rate("src@0") == 4.5 and ws.edge_rate("src@3") == 0.0


@pytest.mark.gpu
def test_gpu_unbounded_layers_read_back_once_per_call() -> None:
    """On a GPU: fanout -1 (uniform and weighted), a fanout above 64 and temporal layers with replacement
    chain on the device (one read-back a call) and give the CPU's blocks."""
    from graphrl.graph import CSCGraph
    from samplers.neighbor import NeighborSampler

    rng = np.random.default_rng(4)
    n, e = 3000, 60000
    graph = CSCGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    times = torch.from_numpy(rng.integers(0, 100, e))
    weights = torch.from_numpy(rng.random(e) * (rng.random(e) < 0.9))
    cases = [([-1, 5], {}), ([100, 3], {}), ([5, -1], {}), ([10, 5], {"edge_times": times, "replace": True}),
             ([5, -1, -1], {"weights": weights})]
    for fanouts, kw in cases:
        cpu_s = NeighborSampler(graph, fanouts, seed=1, **kw)
        gpu_s = NeighborSampler(graph, fanouts, seed=1, device="cuda", **kw)
        for _ in range(2):
            seeds = torch.from_numpy(rng.integers(0, n, 64))
            call = {"seed_times": torch.from_numpy(rng.integers(50, 150, 64))} if "edge_times" in kw else {}
            before = gpu_s.loop.traffic.snapshot()
            got = gpu_s.sample(seeds, **call)
            used = gpu_s.loop.traffic.since(before)
            assert used.readbacks == 1, (fanouts, used)
            for x, y in zip(cpu_s.sample(seeds, **call), got, strict=True):
                for f in ("indptr", "indices", "edge_ids", "src_nodes"):
                    assert torch.equal(getattr(x, f), getattr(y, f).cpu()), (fanouts, f)

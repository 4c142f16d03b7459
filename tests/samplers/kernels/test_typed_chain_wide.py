"""Typed layers of fanout -1 and above the thread-per-row subset chained on the device
(`samplers.kernels.cuda.typed.sample_typed_bounded`), under numba's CUDA simulator in a subprocess: one
read-back per chain (the workspace's `HostTraffic`), no scratch grown on a warm call, one launch of each
kernel per layer over both relations (a warp per row where a relation needs one), blocks equal to the CPU
typed sampler's for the same seed, the edge counts of the wide and full rows known by hand, and a fanout
-1 layer past its degree capacity sampled again unchained (its rows past their region not written)."""

from __future__ import annotations

import textwrap

import pytest

SIM_SCRIPT = textwrap.dedent(
    """
    import sys
    import warnings
    import numpy as np
    import torch
    from numba import config
    assert config.ENABLE_CUDASIM  # the simulator, not a GPU
    from samplers.hetero import HeteroGraph, HeteroNeighborSampler
    from samplers.kernels.cuda import bounded
    warnings.simplefilter("ignore", RuntimeWarning)  # uint64 wrap-around in the simulated RNG

    CLICKS, BY = ("user", "clicks", "item"), ("item", "by", "user")
    rng = np.random.default_rng(1)
    U, I = 5, 4
    # item 0 has 130 in-clicks (Floyd's subset of 65 kept), item 1 90 (the 25 left out), items 2-3 20
    cu = rng.integers(0, U, 240)
    ci = np.concatenate([np.zeros(130, np.int64), np.ones(90, np.int64), rng.integers(2, I, 20)])
    bi, bu = rng.integers(0, I, 12), rng.integers(0, U, 12)
    graph = HeteroGraph.from_edges({"user": U, "item": I}, {CLICKS: (cu, ci), BY: (bi, bu)})
    deg = {rel: np.diff(graph.indptr[rel].numpy()) for rel in (CLICKS, BY)}

    sys.path.insert(0, "tests")
    from _typed_blocks import same_blocks

    def compare(cpu_s, gpu_s, call, what):
        want = cpu_s.sample(**call)
        before = gpu_s.traffic.snapshot()
        got = gpu_s.sample(**call)
        same_blocks(got, want, what)
        return got, gpu_s.traffic.since(before)

    # fanout -1 in both layers (the inner one over repeated seeds), cold then warm: one read-back each
    fan = {CLICKS: [1, 0], BY: [-1, -1]}
    users = dict(seeds={"user": torch.tensor([1, 3, 3])})
    cpu_s = HeteroNeighborSampler(graph, fan, seed=3)
    gpu_s = HeteroNeighborSampler(graph, fan, seed=3, device="cuda")
    for i in range(2):
        blocks, used = compare(cpu_s, gpu_s, users, ("full", i))
        assert used.readbacks == 1 and used.chain_overflows == 0, ("full", i, used)
        assert blocks[-1].indices[BY].numel() == deg[BY][[1, 3, 3]].sum() > 0, ("full", i)
    assert used.scratch_allocations == 0 and used.registrations == 0, ("full warm", used)
    assert gpu_s.launches == {"plan": 4, "scan": 4, "rows": 4, "choose": 4}, gpu_s.launches

    # past its capacity (slack 0.25 of the edges seen, nothing extra): sampled again unchained, same blocks
    bounded.FULL_SLACK, bounded.FULL_EXTRA = 0.25, 0
    _, used = compare(cpu_s, gpu_s, users, "overflow")
    assert used.chain_overflows == 1, ("overflow", used)
    bounded.FULL_SLACK, bounded.FULL_EXTRA = 2.0, 1024

    # fanout 65 (a warp per row: Floyd's subset and its complement, an excluded edge in item 1's row), then
    # a thread-per-row layer
    fan = {CLICKS: [0, 65], BY: [1, 0]}
    items = dict(seeds={"item": torch.tensor([0, 1, 1, 3])}, exclude_eids={CLICKS: torch.tensor([150])})
    cpu_s = HeteroNeighborSampler(graph, fan, seed=4)
    gpu_s = HeteroNeighborSampler(graph, fan, seed=4, device="cuda")
    blocks, used = compare(cpu_s, gpu_s, items, "wide")
    assert used.readbacks == 1 and used.chain_overflows == 0, ("wide", used)
    assert blocks[-1].indices[CLICKS].numel() == 3 * 65 + deg[CLICKS][3], blocks[-1].indptr[CLICKS]
    assert gpu_s.launches == {"plan": 2, "scan": 2, "rows": 2, "choose": 1}, gpu_s.launches
    print("OK")
    """
)


@pytest.mark.simulated(SIM_SCRIPT)
def test_typed_chain_of_full_and_wide_layers_reads_back_once_and_equals_the_cpu(simulated_part):
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output

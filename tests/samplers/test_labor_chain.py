"""LABOR chained on the GPU with importance sampling, weights and edge weights (`samplers.kernels.cuda.
labor.labor_edges_bounded`), under numba's CUDA simulator in a subprocess: the device's exact sum rounds as
``math.fsum`` (the fixed point's test); blocks and edge weights equal the CPU's on plain and typed graphs
with one read-back a call, counted by the library (`HostTraffic`) and by a counter around the simulator's
copies; a warm call allocates only its blocks' arrays and copies no pageable host memory to the device; pi
past its capacity, or a fixed point not converged in the launched iterations, is sampled again unchained
(the same blocks); an unbounded typed layer stages its parameters page-locked (no pageable copy)."""

from __future__ import annotations

import textwrap

import pytest

SIM_SCRIPT = textwrap.dedent(
    """
    import math
    import sys
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # uint64 wrap-around in the simulated RNG
    import numpy as np
    import torch
    from numba import config, cuda
    assert config.ENABLE_CUDASIM
    from graphrl.graph import CSCGraph
    from samplers import LaborSampler
    from samplers.hetero import HeteroNeighborSampler
    from samplers.hetero_graph import HeteroGraph
    from samplers.kernels.cuda import exact_sum, labor as labor_cuda
    sys.path.insert(0, "tests")
    from _cuda_copies import ALLOCATION, PAGEABLE, count_host_copies
    copies = count_host_copies()

    # the exact sum (per-block digits, one rounding) against math.fsum: ties, sticky bits far below,
    # subnormals, exponents across the whole range
    @cuda.jit
    def rounded(acc, out):
        if cuda.grid(1) == 0:
            out[0] = exact_sum.round_exact(acc)
    rng = np.random.default_rng(3)
    sums = [[1.0, 2.0 ** -53], [1.0, 2.0 ** -53, 2.0 ** -1000], [3.0, 3 * 2.0 ** -52], [5e-324, 1e-310],
            [0.0, 0.0], [0.1] * 10] + [rng.random(6) * 2.0 ** rng.integers(-1080, 1000, 6).astype(float)
                                       for _ in range(12)]
    for values in sums:
        acc = cuda.to_device(np.zeros(exact_sum.SUM_WORDS, np.int64))
        status = cuda.to_device(np.zeros(1, np.int64))
        exact_sum.sum_exact[2, 4](cuda.to_device(np.array(values)), status, acc)
        out = cuda.to_device(np.zeros(1))
        rounded[1, 1](acc, out)
        assert out.copy_to_host()[0] == math.fsum(values), (values, out.copy_to_host()[0], math.fsum(values))

    def same(want, got, what):
        for x, y in zip(want, got, strict=True):
            for f in ("src_nodes", "indptr", "indices", "edge_ids", "edge_weights"):
                a, b = getattr(x, f), getattr(y, f)
                assert (a is None) == (b is None), (what, f)
                if isinstance(a, dict):
                    assert a.keys() == b.keys(), (what, f)
                    assert all(torch.equal(a[k], b[k]) for k in a), (what, f)
                else:
                    assert a is None or torch.equal(a, b), (what, f, a, b)

    def check(make, calls, what, overflows=0):
        cpu_s, gpu_s = make("cpu"), make("cuda")
        for i, call in enumerate(calls):
            want = cpu_s.sample(*call)
            copies.clear()
            before = gpu_s.loop.traffic.snapshot()
            with copies.device_traffic():  # pageable copies to the device and allocations
                got = gpu_s.sample(*call)
            same(want, got, (what, i))
            used = gpu_s.loop.traffic.since(before)
            assert used.chain_overflows == (overflows if i == 0 else 0), (what, i, used)
            if not overflows:
                assert used.readbacks == 1 == copies.readbacks, (what, i, used, copies.seen)
            if i and not overflows:  # warm: only the blocks' arrays, no pageable copy
                assert used.scratch_allocations == 0 and used.registrations == 0, (what, used)
                assert copies.seen[ALLOCATION] == used.output_allocations > 0, (what, copies.seen)
                assert copies.seen[PAGEABLE] == 0, (what, copies.seen)

    g = CSCGraph.from_edges(rng.integers(0, 30, 160), rng.integers(0, 30, 160), 30)
    w = torch.from_numpy(rng.random(160) * (rng.random(160) < 0.8))
    call = (torch.tensor([0, 1, 5, 5, 9]), torch.tensor([0, 3, 7, 50]))
    check(lambda d: LaborSampler(g, [2], seed=4, weights=w, importance_sampling=1, device=d), [call, call],
          "plain, weights and importance sampling")
    check(lambda d: LaborSampler(g, [2], seed=1, weights=w, device=d), [call], "plain, weights only")
    own = labor_cuda.pi_capacity
    labor_cuda.pi_capacity = lambda *args: 1  # pi past its capacity: sampled again unchained
    check(lambda d: LaborSampler(g, [2], seed=2, importance_sampling=2, device=d), [call], "pi", overflows=1)
    labor_cuda.pi_capacity = own
    labor_cuda.LABOR_ROUNDS = 1  # iterating until convergence, not converged in one launched iteration
    check(lambda d: LaborSampler(g, [2], seed=2, importance_sampling=-1, device=d), [call], "rounds",
          overflows=1)
    labor_cuda.LABOR_ROUNDS = 16

    rels = {("u", "l", "a"): (rng.integers(0, 20, 50), rng.integers(0, 10, 50)),
            ("a", "h", "u"): (rng.integers(0, 10, 50), rng.integers(0, 20, 50)),
            ("u", "f", "u"): (rng.integers(0, 20, 40), rng.integers(0, 20, 40))}
    hw = {("u", "l", "a"): torch.from_numpy(rng.random(50))}
    hg = HeteroGraph.from_edges({"u": 20, "a": 10}, rels, weights=hw)
    seeds = {"u": torch.tensor([0, 1, 7]), "a": torch.tensor([2])}
    check(lambda d: LaborSampler(hg, [2], seed=0, weights=True, importance_sampling=1, device=d),
          [(seeds,), (seeds,)], "typed, weights and importance sampling")

    # an unbounded typed layer (fanout -1 on every relation: one fused launch per kernel, read back) stages
    # its parameters through the workspace's page-locked buffer
    fan = {rel: [-1] for rel in rels}
    cpu_s, gpu_s = (HeteroNeighborSampler(hg, fan, seed=5, device=d) for d in ("cpu", "cuda"))
    for i in range(2):
        want = cpu_s.sample(seeds)
        copies.clear()
        with copies.device_traffic():
            got = gpu_s.sample(seeds)
        same(want, got, ("unbounded typed", i))
        assert gpu_s.launches["rows"] == i + 1 and (i == 0 or copies.seen[PAGEABLE] == 0), (gpu_s.launches,
                                                                                  copies.seen)
    print("OK")
    """
)


@pytest.mark.simulated(SIM_SCRIPT, patches=True)
def test_chained_labor_equals_the_cpu_with_one_read_back_and_no_pageable_copy(simulated_part):
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output

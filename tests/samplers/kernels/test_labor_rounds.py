"""LABOR's importance-sampling fixed point on the GPU (`samplers.kernels.cuda.labor`), under numba's CUDA
simulator in a subprocess: a chained layer stops at the CPU's iteration (the device's record of it, written by
`labor_decide`, equals the iteration at which the CPU's loop called `labor_rows.converged` last) while its
later launched iterations change nothing (the blocks and edge weights equal the CPU's); pi is one float64 per
unique source of the layer, so on a dense graph its scratch is the source ids', not the candidate edges'
(counted in bytes by `HostTraffic.scratch_bytes`); the relation's hop/owner scratch is restored after each
layer, chained or not; the unchained layer runs the same body, reading its status back once a batch of
`LABOR_ROUNDS` iterations, never once an iteration."""

from __future__ import annotations

import textwrap

import pytest

SIM_SCRIPT = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # uint64 wrap-around in the simulated RNG
    import numpy as np
    from numba import config, cuda
    assert config.ENABLE_CUDASIM
    from samplers.kernels import labor_rows
    from samplers.kernels.cpu.labor import LaborScratch, labor_layer
    from samplers.kernels.cuda import labor as lc
    from samplers.kernels.cuda.labor_kernels import DONE, RUNNING
    from samplers.kernels.cuda.graph import CudaGraph
    from samplers.kernels.cuda.layer import DeviceRows
    from samplers.kernels.cuda.workspace import CudaWorkspace

    tested = []  # the iterations at which the CPU's loop tested convergence
    rule = labor_rows.converged
    def recording(prev, expected, it):
        tested.append(it)
        return rule(prev, expected, it)
    labor_rows.converged = recording

    class Recording(CudaWorkspace):
        # the bytes each scratch array took (HostTraffic.scratch_bytes around each request)
        def __init__(self):
            super().__init__()
            self.took = {}
        def scratch(self, name, n, dtype):
            before = self.traffic.scratch_bytes
            out = super().scratch(name, n, dtype)
            self.took[name] = self.took.get(name, 0) + self.traffic.scratch_bytes - before
            return out

    def csc(n, src, dst):
        order = np.lexsort((src, dst))
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
        return indptr, src[order].astype(np.int32), order

    def layer(n, indptr, indices, w, dst, fanout, IS):
        tested.clear()
        want = labor_layer(indptr, indices, None, dst, fanout, 7, None, w, IS, True, LaborScratch(n))
        graph = CudaGraph.build(indptr, indices, weights=w)
        chain = cuda.to_device(np.array([len(dst), 0, 0, 0], np.int64))
        state = lc.LaborCudaState.of(indptr, n, IS)
        ws = Recording()
        got = lc.labor_edges_bounded(graph, DeviceRows(cuda.to_device(dst), chain, 0, repeats=0), fanout, 7,
                                     None, ws, state, IS, True)
        nnz = int(got.nnz.copy_to_host()[0])
        assert got.out_indptr.copy_to_host().tolist() == want[0].tolist(), IS
        assert got.eids.copy_to_host()[:nnz].tolist() == want[2].tolist(), IS
        assert got.edge_weights.copy_to_host()[:nnz].tolist() == want[3].tolist(), IS
        assert (state.scratch.hop.copy_to_host() == 0).all(), "hop restored"
        assert (state.scratch.owner.copy_to_host() == labor_rows.NO_OWNER).all(), "owner restored"
        return got.fixed_point.copy_to_host().tolist(), tested[-1] + 1, ws, state, want

    rng = np.random.default_rng(0)
    n = 40
    indptr, indices, order = csc(n, rng.integers(0, n, 300), rng.integers(0, n, 300))
    w = (rng.random(300) * (rng.random(300) < 0.8)).astype(np.float32)[order]
    dst = np.array([0, 3, 5, 8, 13, 21, 34], np.int64)
    # until convergence: LABOR_ROUNDS launched, the CPU's count run (converged), the rest exit at once
    (state, ran), cpu_ran, *_ = layer(n, indptr, indices, None, dst, 3, -1)
    assert state == DONE and ran == cpu_ran == 7, (state, ran, cpu_ran)
    (state, ran), cpu_ran, *_ = layer(n, indptr, indices, w, dst, 3, -1)
    assert state == DONE and ran == cpu_ran and 2 < ran < lc.LABOR_ROUNDS, (state, ran, cpu_ran)
    # weighted, settled at the 16th update of pi (iteration 16: iteration 0 updates nothing): LABOR_ROUNDS
    # updates reach it, as unweighted (not an overflow sampled again unchained)
    picks = np.random.default_rng(5)
    for _ in range(200):  # rows the CPU settles at update 16 (on this graph [0, 1, 7] among the first)
        rows = np.sort(picks.choice(n, int(picks.integers(1, 10)), replace=False)).astype(np.int64)
        tested.clear()
        labor_layer(indptr, indices, None, rows, 3, 7, None, w, -1, True, LaborScratch(n))
        if tested[-1] == lc.LABOR_ROUNDS:
            break
    assert tested[-1] == lc.LABOR_ROUNDS, tested
    (state, ran), cpu_ran, *_ = layer(n, indptr, indices, w, rows, 3, -1)
    assert state == DONE and ran == cpu_ran == lc.LABOR_ROUNDS + 1, (state, ran, cpu_ran)
    first = (n, indptr, indices, w, dst, rows)
    # a fixed count of 12: converged after 7, the 5 launched after change nothing
    (state, ran), cpu_ran, *_ = layer(n, indptr, indices, None, dst, 3, 12)
    assert state == DONE and ran == cpu_ran == 7, (state, ran, cpu_ran)
    # not converged in 2: both stop at the count
    (state, ran), cpu_ran, *_ = layer(n, indptr, indices, None, dst, 3, 2)
    assert state == RUNNING and ran == cpu_ran == 2, (state, ran, cpu_ran)

    # dense: 12 source ids, 480 candidate edges; pi takes the bytes of 12 float64, not 480
    n = 12
    indptr, indices, _ = csc(n, rng.integers(0, n, 480), np.repeat(np.arange(n), 40))
    (state, ran), cpu_ran, ws, _, want = layer(n, indptr, indices, None, np.arange(n, dtype=np.int64), 5, 1)
    assert state == RUNNING and ran == cpu_ran == 1, (state, ran, cpu_ran)
    def took(count):
        probe = CudaWorkspace()
        probe.scratch("pi", count, np.float64)
        return probe.traffic.scratch_bytes
    assert ws.took["labor_pi"] == took(n) < took(480), (ws.took, took(n), took(480))
    assert ws.traffic.scratch_bytes == sum(ws.took.values()), (ws.traffic, ws.took)
    assert lc.pi_capacity(n, lc.LaborCudaState.of(indptr, n, 1), 0) == n
    # no rows after a layer that ran one iteration (ws's status scratch): done, none run, nothing kept
    graph = CudaGraph.build(indptr, indices)
    for bound in (0, 3):  # no row at all; three rows' room, a count of 0
        rows = DeviceRows(cuda.to_device(np.zeros(bound, np.int64)), cuda.to_device(np.zeros(4, np.int64)), 0,
                          repeats=0)
        got = lc.labor_edges_bounded(graph, rows, 5, 7, None, ws, lc.LaborCudaState.of(indptr, n, -1), -1,
                                     True)
        assert got.fixed_point.copy_to_host().tolist() == [DONE, 0], (bound, got.fixed_point)
        assert int(got.nnz.copy_to_host()[0]) == 0, bound

    # the unchained layer (the chained one's body, run until converged) keeps the same edges, restores the
    # scratch, and reads back once per LABOR_ROUNDS iterations launched and once its edge count (per
    # iteration, as before, would be 7 + 2 and 17 + 2): 7 iterations one batch, the settled rows' 17 two
    import sys
    sys.path.insert(0, "tests")
    from _cuda_copies import count_host_copies
    copies = count_host_copies()
    n, indptr, indices, w, dst, settled = first
    for weights, rows, cpu_iterations in ((None, dst, 7), (w, settled, lc.LABOR_ROUNDS + 1)):
        scratch = lc.LaborScratchCuda(n)
        g = CudaGraph.build(indptr, indices, weights=weights)
        tested.clear()
        want = labor_layer(indptr, indices, None, rows, 3, 7, None, weights, -1, True, LaborScratch(n))
        assert tested[-1] + 1 == cpu_iterations, tested
        d_rows = cuda.to_device(rows)
        copies.clear()
        got = lc.labor_layer_cuda(g, d_rows, 3, 7, None, -1, True, scratch)
        batches = -(-cpu_iterations // lc.LABOR_ROUNDS)
        assert copies.readbacks == batches + 1, (copies.seen, cpu_iterations)
        for a, b in zip(got, want):
            assert a.copy_to_host().tolist() == b.tolist()
        assert (scratch.hop.copy_to_host() == 0).all()
        assert (scratch.owner.copy_to_host() == labor_rows.NO_OWNER).all()
    print("OK")
    """
)


@pytest.mark.simulated(SIM_SCRIPT, patches=True)
def test_device_rounds_stop_with_the_cpu_and_pi_is_per_source(simulated_part):
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output


def test_iterations_count_the_updates_of_pi() -> None:
    from samplers.kernels.labor_rows import iterations

    # LABOR-i updates pi i times; weighted, iteration 0 solves c_t over the weights and updates nothing
    assert [iterations(i, False) for i in (0, 1, 2)] == [0, 1, 2]
    assert [iterations(i, True) for i in (0, 1, 2)] == [1, 2, 3]
    # until convergence: no cap (-1), or a cap of updates, one more iteration weighted
    assert iterations(-1, False) == iterations(-1, True) == -1
    assert (iterations(-1, False, 16), iterations(-1, True, 16)) == (16, 17)

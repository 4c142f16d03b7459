"""The GPU samplers never read device memory before writing it: under numba's CUDA simulator, with every
region, scratch array and fresh device array poisoned as it is handed out (``tests/_cuda_poison.py``:
integers 10**9, floats NaN), the simulated-GPU blocks still equal the CPU's, for LABOR (plain, chained,
typed, past its capacity), typed (fused and relation by relation), hetero, uniform, weighted and temporal
sampling. The GPU samplers' buffers are pool memory (docs/architecture.md#memory-tiers), not fresh zeroed
allocations, so a kernel that counts on zeros, or on what a previous layer left, reads garbage on a GPU.
The poisoning turns such a read into an IndexError (an index of 10**9) or a mismatch (a NaN, an absurd
count) here.

The first test pins the bug this found: a typed chain relation by relation (`...cuda.relation_chain`) placed
a source type's next relation after the previous one's true edge count, so after a relation overflowed its
capacity the region had unwritten holes that the relabelling read as sources (then as the next layer's row
ids: "index 1000000000 out of bounds" in ``labor_init``)."""

from __future__ import annotations

import textwrap

import pytest

POISON = textwrap.dedent(
    """
    import sys
    import torch
    # these scripts patch, so each runs in a fork child of the simulated scripts' interpreter; torch's
    # OpenMP pool does not survive a fork (a parallel op such as repeat_interleave crashed the child with
    # SIGSEGV once the parent had run the temporal scripts): one thread here
    torch.set_num_threads(1)
    sys.path.insert(0, "tests")
    from _cuda_poison import poison_new_memory
    poison_new_memory()
    """
)


def poisoned(module: str, name: str) -> str:
    """A script that poisons the memory, then runs the simulated script ``name`` of the test module
    ``module`` (in tests/samplers) as it is: imported in the subprocess, not copied into this script (the
    session's simulated scripts travel as one command-line argument, which has a length limit)."""
    return POISON + textwrap.dedent(
        f"""
        import linecache
        sys.path.insert(0, "tests/samplers")
        from {module} import {name} as _SCRIPT
        _FILE = "<{module}.{name}, poisoned>"
        linecache.cache[_FILE] = (len(_SCRIPT), None, _SCRIPT.splitlines(True), _FILE)
        exec(compile(_SCRIPT, _FILE, "exec"), {{"__name__": "__main__"}})
        """
    )


UNIT_SCRIPT = POISON + textwrap.dedent(
    """
    import numpy as np
    from numba import cuda
    from _cuda_poison import POISON_INT
    from graphrl.memory import Tier
    from samplers.kernels.cuda.arrays import empty
    from samplers.kernels.cuda.launch import launch
    from samplers.kernels.cuda.memory import CudaMemory, WORKSPACE_OWNER
    from samplers.kernels.cuda.relabel import relabel_bounded
    from samplers.kernels.cuda.relation_chain import pack_edges
    from samplers.kernels.cuda.workspace import CudaWorkspace

    # the hooks bite: new regions, every scratch hand-out (also a reused one) and fresh arrays are poison
    ws = CudaWorkspace()
    counts = ws.scratch("counts", 4, np.int64)
    assert counts.copy_to_host().tolist() == [POISON_INT] * 4
    counts.copy_to_device(np.zeros(4, np.int64))
    assert ws.scratch("counts", 3, np.int64).copy_to_host().tolist() == [POISON_INT] * 3  # reused: poison
    assert np.isnan(ws.scratch("c", 2, np.float64).copy_to_host()).all()
    assert empty(2, np.int32).copy_to_host().tolist() == [POISON_INT] * 2
    mem = CudaMemory()
    region = mem.allocate(3, np.int64, Tier.DEVICE, WORKSPACE_OWNER)
    assert region.numpy().tolist() == [POISON_INT] * 3

    # one source type's region after two relations of capacities 1 and 2: the first kept 5 edges (past its
    # capacity: an overflow), the second 2. The running total counts the sources written (1, then 3): the
    # second relation's follow the first's, and the relabelling reads those 3, all written
    dev = lambda *v: cuda.to_device(np.array(v, np.int64))
    sizes = dev(*[-5] * 4)  # (count 0, count 1, end 0, end 1)
    out = empty(3, np.int64)
    for k, (src, nnz, base_at) in enumerate([(dev(7), dev(5), -1), (dev(3, 4), dev(2), 2)]):
        launch(pack_edges, (1, 32), src, src, False, nnz, sizes, np.int64(base_at), np.int64(2 + k),
               np.int64(k), out, out)
    assert sizes.copy_to_host().tolist() == [5, 2, 1, 3], sizes.copy_to_host()
    assert out.copy_to_host().tolist() == [7, 3, 4], out.copy_to_host()
    triple = dev(0, 0, 0)
    nodes, local = relabel_bounded(dev(9), dev(1), out, sizes[3:4], ws, triple)
    assert triple.copy_to_host().tolist() == [3, 3, 4], triple.copy_to_host()
    assert nodes.copy_to_host()[:4].tolist() == [9, 7, 3, 4] and local.copy_to_host().tolist() == [1, 2, 3]
    print("OK")
    """
)


REAL_SCRIPT = POISON + textwrap.dedent(
    """
    import os
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy scalar uint64 wrap-around in simulated kernels
    from pathlib import Path
    import numpy as np
    import torch
    from graphrl.datasets import load_lastfm, load_planetoid
    from samplers import LaborSampler, NeighborSampler
    from samplers.hetero import HeteroNeighborSampler, lastfm_hetero_graph
    from samplers.kernels.cuda import labor as labor_cuda

    def same(want, got, what):
        assert len(want) == len(got), what
        for x, y in zip(want, got):
            for f in ("src_nodes", "indptr", "indices", "edge_ids", "edge_weights", "src_times"):
                dx, dy = getattr(x, f, None), getattr(y, f, None)
                assert (dx is None) == (dy is None), (what, f)
                if isinstance(dx, dict):
                    assert dx.keys() == dy.keys(), (what, f)
                    pairs = [(dx[k], dy[k], k) for k in dx]
                else:
                    pairs = [] if dx is None else [(dx, dy, None)]
                for a, b, k in pairs:
                    assert a.dtype == b.dtype and torch.equal(a, b), (what, f, k, a, b)

    def calls(make, args, what, slack=None):
        # two calls of one sampler (the second reuses the workspace's scratch: poisoned again when handed
        # out), against the CPU's; with ``slack`` the chained LABOR layers overflow (sampled again unchained)
        cpu, gpu = make(), make(device="cuda")
        labor_cuda.LABOR_SLACK, labor_cuda.LABOR_EXTRA = (2.0, 1024) if slack is None else (slack, 1)
        try:
            for call in range(2):
                same(cpu.sample(**args), gpu.sample(**args), (what, call))
        finally:
            labor_cuda.LABOR_SLACK, labor_cuda.LABOR_EXTRA = 2.0, 1024
        return gpu

    root = Path(os.environ.get("GRAPHRL_DATA", Path.cwd().parent / "shared" / "data"))
    cora = load_planetoid("cora", root).graph
    n, e = cora.num_nodes, cora.num_edges
    rng = np.random.default_rng(5)
    w = torch.from_numpy(rng.random(e) * (rng.random(e) < 0.8))
    plain = dict(seeds=torch.from_numpy(rng.integers(0, n, 10)),
                 exclude_eids=torch.from_numpy(np.sort(rng.integers(0, e, 40))))
    calls(lambda **kw: NeighborSampler(cora, [4, -1], seed=3, **kw), plain, "cora uniform")
    calls(lambda **kw: NeighborSampler(cora, [4, 3], weights=w, seed=3, **kw), plain, "cora weighted")
    calls(lambda **kw: LaborSampler(cora, [4, 3], weights=w, importance_sampling=-1, seed=3, **kw), plain,
          "cora labor")
    gpu = calls(lambda **kw: LaborSampler(cora, [4, 3], seed=3, **kw), plain, "cora labor overflow", 0.0)
    assert gpu.loop.traffic.chain_overflows == 2, gpu.loop.traffic

    graph = lastfm_hetero_graph(load_lastfm(root))
    LISTENS, HEARD, FRIENDS = graph.relations
    e_l, e_f = graph.num_edges(LISTENS), graph.num_edges(FRIENDS)
    w_listen = torch.from_numpy(rng.random(e_l) * (rng.random(e_l) < 0.8))
    t_friends = torch.from_numpy(rng.integers(0, 50, e_f))
    seeds = {"user": torch.tensor([0, 5, 77, 1500]), "artist": torch.tensor([3, 100, 4000])}
    typed = dict(seeds=seeds)
    calls(lambda **kw: LaborSampler(graph, [3, 2], importance_sampling=1, seed=3, **kw), typed,
          "lastfm labor")
    gpu = calls(lambda **kw: LaborSampler(graph, [3, 2], seed=3, **kw), typed, "lastfm labor overflow", 0.0)
    assert gpu.loop.traffic.chain_overflows == 2, gpu.loop.traffic
    fan = {LISTENS: [3, 2], HEARD: [2, 2], FRIENDS: [2, -1]}
    calls(lambda **kw: HeteroNeighborSampler(graph, fan, weights={LISTENS: w_listen}, seed=3, **kw), typed,
          "lastfm hetero")
    timed = dict(seeds=seeds, seed_times={"user": torch.tensor([10, 49, 0, 30]),
                                          "artist": torch.tensor([20, 5, 40])})
    calls(lambda **kw: HeteroNeighborSampler(graph, fan, edge_times={FRIENDS: t_friends}, seed=3, **kw),
          timed, "lastfm hetero temporal")
    print("OK")
    """
)


def _ok(part) -> bool:
    return part.ok and part.output.strip().endswith("OK")


@pytest.mark.simulated(UNIT_SCRIPT, patches=True)
def test_poisoning_bites_and_a_typed_region_has_no_holes_after_an_overflow(simulated_part):
    assert _ok(simulated_part), simulated_part.output


@pytest.mark.slow
@pytest.mark.simulated(poisoned("test_labor", "SIM_SCRIPT"), patches=True)
def test_labor_plain_typed_and_past_capacity_on_poisoned_memory(simulated_part):
    assert _ok(simulated_part), simulated_part.output


@pytest.mark.slow
@pytest.mark.simulated(poisoned("test_labor_chain", "SIM_SCRIPT"), patches=True)
def test_chained_labor_on_poisoned_memory(simulated_part):
    assert _ok(simulated_part), simulated_part.output


@pytest.mark.slow
@pytest.mark.simulated(poisoned("test_typed_launch", "SIM_SCRIPT"), patches=True)
def test_fused_typed_layers_on_poisoned_memory(simulated_part):
    assert _ok(simulated_part), simulated_part.output


@pytest.mark.slow
@pytest.mark.simulated(poisoned("test_hetero_cuda_sim", "STATIC_SCRIPT"), patches=True)
def test_hetero_layers_on_poisoned_memory(simulated_part):
    assert _ok(simulated_part), simulated_part.output


@pytest.mark.slow
@pytest.mark.simulated(poisoned("test_hetero_cuda_sim", "TEMPORAL_SCRIPT"), patches=True)
def test_hetero_temporal_layers_on_poisoned_memory(simulated_part):
    assert _ok(simulated_part), simulated_part.output


@pytest.mark.slow
@pytest.mark.simulated(poisoned("test_sampler_cuda_sim", "SIM_SCRIPT"), patches=True, timeout=900)
def test_uniform_and_weighted_layers_on_poisoned_memory(simulated_part):
    assert _ok(simulated_part), simulated_part.output


@pytest.mark.slow
@pytest.mark.simulated(poisoned("test_sampler_cuda_sim", "TEMPORAL_SIM_SCRIPT"), patches=True, timeout=900)
def test_temporal_layers_on_poisoned_memory(simulated_part):
    assert _ok(simulated_part), simulated_part.output


@pytest.mark.slow
@pytest.mark.simulated(REAL_SCRIPT, patches=True, timeout=900)
def test_real_graphs_on_poisoned_memory(simulated_part):
    """Cora (uniform with fanout -1, weighted, LABOR until converged, LABOR past its capacity) and LastFM
    (typed LABOR with importance sampling and past its capacity, hetero uniform/weighted, hetero temporal):
    two calls of each sampler equal the CPU's."""
    assert _ok(simulated_part), simulated_part.output

"""The GPU samplers' buffers on the memory manager's tiers (docs/architecture.md#memory-tiers): the graph copy
and prefix sums (``"samplers.graph"``: ``device``, ``pinned`` with UVA), the workspace's scratch and staging
buffers (``"samplers.workspace"``: ``device`` and ``pinned``) and LABOR's per-node arrays
(``"samplers.labor"``: ``device``), on Cora. Under numba's CUDA simulator (a subprocess: the simulator is
chosen before numba.cuda is imported; its device tier is host memory, ``MemoryManager(device="cpu")``):
the regions per tier and owner (the graph's bytes exactly), the manager's budget error naming the tier and
the owner when a budget is too small (nothing left counted), every region freed by ``close``, by garbage
collection and with the manager's close, and the blocks equal to the CPU sampler's. The same checks run on a
real GPU (``pytest -m gpu``), where the device regions are CUDA tensors and the pinned ones page-locked."""

from __future__ import annotations

import textwrap

import pytest

COMMON = textwrap.dedent(
    """
    import gc
    import os
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy scalar uint64 wrap-around in simulated kernels
    from pathlib import Path
    import numpy as np
    import torch
    from graphrl import cuda as gcuda
    from graphrl.memory import MemoryBudgetError, MemoryManager
    from samplers.labor import LaborSampler
    from samplers.neighbor import NeighborSampler

    import sys
    sys.path.insert(0, "tests")
    from _cuda_tiers import DEVICE, budget_error, manager, tiers

    def same(want, got, what):
        assert len(want) == len(got), what
        for x, y in zip(want, got):
            for f in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids", "edge_weights"):
                a, b = getattr(x, f), getattr(y, f)
                if a is None:
                    assert b is None, (what, f)
                    continue
                assert torch.equal(a, b.cpu()), (what, f)
    """
)

CORA = textwrap.dedent(
    """
    from graphrl.datasets import load_planetoid
    root = Path(os.environ.get("GRAPHRL_DATA", Path.cwd().parent / "shared" / "data"))
    graph = load_planetoid("cora", root).graph
    n, e = graph.num_nodes, graph.num_edges
    rng = np.random.default_rng(3)
    weights = torch.from_numpy(rng.random(e) * (rng.random(e) < 0.8))
    seeds = torch.from_numpy(rng.integers(0, n, 12))
    excluded = torch.from_numpy(rng.integers(0, e, 40))
    # the graph's copy, by hand (7 regions): indptr int64 [N + 1], indices int32 [E], edge ids int64 [E],
    # weights float32 [E], prefix sums float64 [E], positive counts int64 [N], a 1-element int64 stand-in for
    # the times; without weights (5 regions) no prefix sums, and a float32 stand-in for the weights
    assert graph.indices.dtype == torch.int32 and graph.edge_ids is not None
    GRAPH_BYTES = (n + 1) * 8 + e * 4 + e * 8 + e * 4 + e * 8 + n * 8 + 8
    UNIFORM_BYTES = (n + 1) * 8 + e * 4 + e * 8 + 8 + 4
    """
)

NEIGHBOR = COMMON + CORA + textwrap.dedent(
    """
    mm = manager()
    gpu = NeighborSampler(graph, [4, 3], weights=weights, seed=5, device="cuda", memory=mm)
    cpu = NeighborSampler(graph, [4, 3], weights=weights, seed=5)
    assert tiers(mm) == {("device", "samplers.graph"): (GRAPH_BYTES, 7)}, tiers(mm)
    for call in range(2):
        same(cpu.sample(seeds, exclude_eids=excluded), gpu.sample(seeds, exclude_eids=excluded), call)
    now = tiers(mm)
    assert set(now) == {("device", "samplers.graph"), ("device", "samplers.workspace"),
                        ("pinned", "samplers.workspace")}, now
    assert now[("device", "samplers.graph")] == (GRAPH_BYTES, 7)
    # the staging buffers (seeds, excluded positions, the read-back buffer) are page-locked int64 regions
    staging = [r for r in mm.regions("samplers.workspace") if r.tier.value == "pinned"]
    assert staging and all(r.dtype == torch.int64 for r in staging)
    assert all(r.is_pinned for r in staging) == torch.cuda.is_available()  # page-locked wherever CUDA is
    traffic = gpu.loop.traffic
    assert 0 < now[("device", "samplers.workspace")][0] <= traffic.scratch_bytes
    assert now[("pinned", "samplers.workspace")][1] <= traffic.registrations
    assert all(r.device.startswith(DEVICE) for r in mm.regions("samplers.graph"))
    # close frees every region and makes the sampler unusable; the manager stays open
    gpu.close()
    assert tiers(mm) == {} and mm.usage()["device"]["used"] == 0 and mm.usage()["pinned"]["used"] == 0
    try:
        gpu.sample(seeds)
        raise AssertionError("a closed sampler sampled")
    except ValueError as err:
        assert "closed" in str(err)
    gpu.close()  # idempotent

    # UVA: the copy on the pinned tier (read in place), nothing of the graph on the device tier
    uva = NeighborSampler(graph, [4, 3], weights=weights, seed=5, device="cuda", uva=True, memory=mm)
    assert tiers(mm) == {("pinned", "samplers.graph"): (GRAPH_BYTES, 7)}, tiers(mm)
    fresh = NeighborSampler(graph, [4, 3], weights=weights, seed=5)  # its first call, as uva's
    same(fresh.sample(seeds), uva.sample(seeds), "uva")
    # garbage collection frees the regions as close does
    del uva
    gc.collect()
    assert tiers(mm) == {}, tiers(mm)

    # budgets: a device tier one byte short of the graph's copy raises the manager's error naming the tier
    # and "samplers.graph", and leaves nothing counted; room for the graph but not the scratch fails at the
    # first sample naming "samplers.workspace"; a pinned tier without room for the staging buffers likewise
    small = manager(device=GRAPH_BYTES - 1)
    budget_error(lambda: NeighborSampler(graph, [4, 3], weights=weights, device="cuda", memory=small),
                 "device", "samplers.graph")
    assert small.usage()["device"]["used"] == 0 and not small.regions()
    exact = manager(device=GRAPH_BYTES)
    s = NeighborSampler(graph, [4, 3], weights=weights, device="cuda", memory=exact)
    budget_error(lambda: s.sample(seeds), "device", "samplers.workspace")
    s.close()
    assert exact.usage()["device"]["used"] == 0
    no_pin = manager(pinned=64)
    s = NeighborSampler(graph, [4, 3], device="cuda", memory=no_pin)
    assert tiers(no_pin) == {("device", "samplers.graph"): (UNIFORM_BYTES, 5)}, tiers(no_pin)
    budget_error(lambda: s.sample(seeds), "pinned", "samplers.workspace")
    budget_error(lambda: NeighborSampler(graph, [2], device="cuda", uva=True, memory=no_pin),
                 "pinned", "samplers.graph")
    s.close()
    assert not no_pin.regions()

    # the manager's close frees the sampler's regions: the sampler then raises instead of sampling
    s = NeighborSampler(graph, [2], device="cuda", memory=exact)
    exact.close()
    try:
        s.sample(seeds)
        raise AssertionError("sampled after the manager closed")
    except ValueError as err:
        assert "MemoryManager was closed" in str(err), str(err)

    # a device tier where the kernels cannot read it (host memory on a GPU) is refused, naming the remedy
    if gcuda.has_cuda():
        try:
            NeighborSampler(graph, [2], device="cuda", memory=MemoryManager(device="cpu"))
            raise AssertionError("a host device tier was taken on a GPU")
        except ValueError as err:
            assert "device tier" in str(err) and "MemoryManager(device='cuda:" in str(err), str(err)

    # without memory=: a private manager, closed with the sampler
    s = NeighborSampler(graph, [2], device="cuda")
    private = s.cuda_memory.memory
    assert s.cuda_memory.owns and tiers(private) == {("device", "samplers.graph"): (UNIFORM_BYTES, 5)}
    s.close()
    assert private.closed
    for m in (mm, small, no_pin):
        m.close()
    print("OK")
    """
)

LABOR = COMMON + CORA + textwrap.dedent(
    """
    mm = manager()
    kw = dict(importance_sampling=1, weights=weights, seed=2)
    gpu = LaborSampler(graph, [4, 3], device="cuda", memory=mm, **kw)
    cpu = LaborSampler(graph, [4, 3], **kw)
    # LABOR's per-node arrays: hop (float64) and owner (int64) per source id, and the status word
    labor_bytes = n * 8 + n * 8 + 8
    graph_bytes = GRAPH_BYTES
    assert tiers(mm) == {("device", "samplers.graph"): (graph_bytes, 7),
                         ("device", "samplers.labor"): (labor_bytes, 3)}, tiers(mm)
    same(cpu.sample(seeds, exclude_eids=excluded), gpu.sample(seeds, exclude_eids=excluded), "labor")
    assert ("device", "samplers.workspace") in tiers(mm) and ("pinned", "samplers.workspace") in tiers(mm)
    gpu.close()
    assert tiers(mm) == {}
    # room for the graph but not LABOR's arrays: the error names "samplers.labor"; nothing stays counted
    small = manager(device=graph_bytes)
    budget_error(lambda: LaborSampler(graph, [4, 3], device="cuda", memory=small, **kw),
                 "device", "samplers.labor")
    assert small.usage()["device"]["used"] == 0 and not small.regions()
    # LABOR-0 keeps no per-node arrays but the status word
    s = LaborSampler(graph, [4, 3], device="cuda", memory=mm)
    assert tiers(mm)[("device", "samplers.labor")] == (8, 1)
    del s
    gc.collect()
    assert tiers(mm) == {}
    mm.close()
    small.close()
    print("OK")
    """
)


def _check(part) -> None:
    assert part.ok and part.output.strip().endswith("OK"), part.output


@pytest.mark.slow
@pytest.mark.simulated(NEIGHBOR)
def test_neighbor_sampler_buffers_live_on_the_tiers_under_the_simulator(data_root, simulated_part):
    """Regions per tier and owner, budget errors, close / gc / the manager's close, the CPU's blocks."""
    _check(simulated_part)


@pytest.mark.slow
@pytest.mark.simulated(LABOR)
def test_labor_sampler_per_node_arrays_live_on_the_device_tier_under_the_simulator(data_root, simulated_part):
    """LABOR's per-node arrays on the device tier (samplers.labor), its budget error, the CPU's blocks."""
    _check(simulated_part)


@pytest.mark.gpu
@pytest.mark.parametrize("script", [NEIGHBOR, LABOR], ids=["neighbor", "labor"])
def test_gpu_sampler_buffers_live_on_the_tiers(script: str, data_root, monkeypatch) -> None:
    """On a real GPU: the same checks, the device regions CUDA tensors and the pinned ones page-locked
    (registered with cudaHostRegister, read through UVA)."""
    monkeypatch.setenv("GRAPHRL_DATA", str(data_root))
    namespace: dict = {}
    exec(compile(script, "<gpu tiers script>", "exec"), namespace)  # noqa: S102 - the module's own script


def test_memory_must_be_a_memory_manager() -> None:
    """``memory`` of another type is a TypeError naming it, on either device (no GPU needed)."""
    from graphrl.graph import CSCGraph
    from samplers.kernels.cuda.memory import CudaMemory
    from samplers.labor import LaborSampler
    from samplers.neighbor import NeighborSampler

    graph = CSCGraph.from_edges([0, 1], [1, 0], 2)
    for build in (lambda: NeighborSampler(graph, [1], memory="1GiB"),
                  lambda: LaborSampler(graph, [1], memory=object()), lambda: CudaMemory({"device": 1})):
        with pytest.raises(TypeError, match="memory must be a MemoryManager"):
            build()
    mem = CudaMemory()  # a private manager is made at the first allocation only: none here
    assert mem.owns and mem.regions() == [] and not mem.closed
    mem.close()
    with pytest.raises(ValueError, match="closed"):
        mem.check_open("this memory")

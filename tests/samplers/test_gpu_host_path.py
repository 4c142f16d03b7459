"""The host side of the GPU sampler, counted in the code path itself under numba's CUDA simulator.

No GPU is needed: the simulator runs the same host code (in a subprocess, since it must be chosen before
numba.cuda is first imported), and the script counts, independently of the library's own counter
(`samplers.kernels.cuda.workspace.HostTraffic`), every device-to-host copy and host-side scalar read of
a device array, every device allocation and every page-locked or mapped host allocation. It asserts:

- successive uniform layers (fanout -1 included), weighted layers of fanout >= 0 and temporal layers (with
  and without replacement) read back once per call, all their sizes in one copy; the library's count
  equals the independent one;
- once warm (after a call at least as large), a call allocates no scratch on the device and registers
  no host memory: its only device allocations are the arrays its blocks keep (4 per layer);
- the blocks equal the CPU sampler's for the same seed, with and without excluded edges;
- through UVA, the graph is copied into pinned regions once, when the sampler is built, never per batch;
- `NeighborLoader` with a CUDA sampler yields the CPU loader's batches (prefetching or not).

The bounded relabelling kernels these chains run compile to PTX for sm_90 in test_sampler_cuda_sim's PTX
test (one interpreter compiles every sampling kernel).
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
    assert config.ENABLE_CUDASIM
    import samplers.layers as layers
    from graphrl.graph import CSCGraph
    from samplers.loader import NeighborLoader
    from samplers.neighbor import NeighborSampler

    # --- independent counters: wrap the simulator's API (host-side calls only: kernels run in threads)
    sys.path.insert(0, "tests")
    from _cuda_copies import count_host_copies
    copies = count_host_copies()  # read-backs, under seen["readback"]
    seen = copies.seen
    for name in ("device_array", "to_device"):
        setattr(cuda, name, copies.counting("device_alloc", getattr(cuda, name)))
    for name in ("pinned_array", "mapped_array", "pinned"):
        setattr(cuda, name, copies.counting("host_register", getattr(cuda, name)))
    for name in ("synchronize",):
        setattr(cuda, name, copies.counting("synchronize", getattr(cuda, name)))
    torch.cuda.synchronize = copies.counting("synchronize", torch.cuda.synchronize)  # device-wide, too
    # the samplers' scratch and page-locked buffers are memory-manager regions (device and pinned tiers)
    from graphrl.memory import MemoryManager
    own_allocate = MemoryManager.allocate
    region_counts = {"device": copies.counting("device_alloc", lambda: None),
                     "pinned": copies.counting("host_register", lambda: None)}

    def allocate(self, shape, dtype, tier="host", **kw):
        region_counts.get(str(tier), lambda: None)()
        return own_allocate(self, shape, dtype, tier, **kw)

    MemoryManager.allocate = allocate

    def same(a, b, what):
        assert len(a) == len(b), what
        for x, y in zip(a, b):
            for f in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids"):
                assert torch.equal(getattr(x, f), getattr(y, f)), (what, f, getattr(x, f), getattr(y, f))

    rng = np.random.default_rng(0)
    n, e = 30, 240
    graph = CSCGraph.from_edges(rng.integers(0, n, e), np.minimum(rng.geometric(0.06, e) - 1, n - 1), n)
    weights = torch.from_numpy(rng.random(e) * (rng.random(e) < 0.8))
    excluded = torch.from_numpy(rng.integers(0, e, 40))
    later = torch.from_numpy(rng.integers(0, n, 6))
    batches = [torch.cat([later, torch.from_numpy(rng.integers(0, n, 4))]), later]  # the first is the larger

    # (fanouts, sampler options, read-backs per call: one for a chain, fanout -1 included)
    cases = [([3, 2], {}, 1), ([2], {"weights": weights, "replace": True}, 1), ([-1, 4], {}, 1),
             ([2, -1, 3], {}, 1), ([2, 3, 2], {"weights": weights}, 1)]
    for fanouts, kw, per_call in cases:
        outputs = 4 * len(fanouts)
        cpu_s = NeighborSampler(graph, fanouts, seed=5, **kw)
        gpu_s = NeighborSampler(graph, fanouts, seed=5, device="cuda", **kw)
        for call, seeds in enumerate(batches):
            ex = None if fanouts == [-1, 4] else excluded[call::2]  # the first call's no shorter
            want = cpu_s.sample(seeds, exclude_eids=ex)
            seen.clear()
            before = gpu_s.loop.traffic.snapshot()
            got = gpu_s.sample(seeds, exclude_eids=ex)
            used = gpu_s.loop.traffic.since(before)
            same(want, got, (fanouts, call))
            assert used.readbacks == per_call == seen["readback"], (fanouts, call, used, seen)
            assert seen["synchronize"] == 0, seen
            assert used.pinned_copies == 1 + (ex is not None), used  # no pageable copy: see device_alloc
            assert used.output_allocations == outputs, used
            if call == 0:
                assert used.registrations == 2 + (ex is not None), used  # read-back, staging buffers
                continue
            # warm: no scratch, no registration; device allocations: only the blocks' arrays
            assert used.scratch_allocations == 0 and used.registrations == 0, (call, used)
            assert seen["host_register"] == 0, seen
            assert seen["device_alloc"] == used.output_allocations, (used, seen)

    # temporal layers chain too (uniform and weighted rows by edge time, with and without replacement): one
    # read-back a call
    etimes = torch.from_numpy(rng.integers(0, 20, e))
    seed_times = torch.from_numpy(rng.integers(5, 25, batches[0].shape[0]))
    for fanouts, kw, per_call in (([3, 2], {}, 1), ([2, 2], {"weights": weights}, 1),
                                  ([2], {"replace": True}, 1)):
        cpu_s = NeighborSampler(graph, fanouts, seed=5, edge_times=etimes, **kw)
        gpu_s = NeighborSampler(graph, fanouts, seed=5, device="cuda", edge_times=etimes, **kw)
        want = cpu_s.sample(batches[0], seed_times=seed_times)
        seen.clear()
        before = gpu_s.loop.traffic.snapshot()
        got = gpu_s.sample(batches[0], seed_times=seed_times)
        used = gpu_s.loop.traffic.since(before)
        same(want, got, ("temporal", fanouts))
        for x, y in zip(want, got):
            assert torch.equal(x.src_times, y.src_times), ("temporal", fanouts, x.src_times, y.src_times)
        assert used.readbacks == per_call, (fanouts, used)
        assert seen["readback"] == per_call, (fanouts, seen)

    # UVA: the graph is copied into pinned regions once, when the sampler is built; batches register nothing
    seen.clear()
    uva = NeighborSampler(graph, [3, 2], seed=2, device="cuda", uva=True)
    assert uva.loop.relations[layers.PLAIN_RELATION].cuda.uva
    built = seen["host_register"]
    assert built >= 3, seen  # indptr, indices, edge ids
    cpu_s = NeighborSampler(graph, [3, 2], seed=2)
    for call, seeds in enumerate(batches):
        seen.clear()
        same(cpu_s.sample(seeds), uva.sample(seeds), ("uva", call))
        assert seen["host_register"] == (2 if call == 0 else 0), (call, seen)  # the workspace's buffers
    assert uva.loop.traffic.registrations == 2

    # the loader with a CUDA sampler: the CPU loader's batches, prefetching or not
    train = torch.arange(0, n, 3)
    for prefetch in (0, 1):
        loaders = [NeighborLoader(graph, train, batch_size=5, seed=3, prefetch=prefetch,
                                  sampler=NeighborSampler(graph, [3], seed=4, device=dev))
                   for dev in ("cpu", "cuda")]
        count = 0
        for a, b in zip(*loaders, strict=True):
            assert b.ready is None  # no CUDA streams under the simulator
            same(a.blocks, b.blocks, ("loader", prefetch, a.index))
            count += 1
        assert count == len(loaders[0]) == 2
    print("OK")
    """
)


@pytest.mark.simulated(SCRIPT, patches=True, timeout=240)
def test_gpu_host_path_under_the_simulator(simulated_part) -> None:
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output


def test_host_traffic_counts_and_differences() -> None:
    from samplers.kernels.cuda.workspace import HostTraffic

    t = HostTraffic(readbacks=3, output_allocations=8)
    before = t.snapshot()
    t.readbacks += 2
    t.registrations += 1
    assert t.since(before) == HostTraffic(readbacks=2, registrations=1)
    assert before == HostTraffic(readbacks=3, output_allocations=8)  # a copy, not a view


def test_bounded_layers_are_the_thread_per_row_rules() -> None:
    from types import SimpleNamespace

    from samplers.kernels.cuda.layer import bounded_layer
    from samplers.kernels.cuda.uniform import THREAD_FANOUT_MAX

    plain = SimpleNamespace(prefix=None)
    weighted = SimpleNamespace(prefix=np.zeros(1))
    assert bounded_layer(plain, 0, False) and bounded_layer(plain, THREAD_FANOUT_MAX, False)
    assert bounded_layer(plain, THREAD_FANOUT_MAX + 1, False) and bounded_layer(plain, -1, False)
    assert bounded_layer(plain, -1, False, timed=True) and bounded_layer(weighted, -1, True)
    assert bounded_layer(weighted, 500, True) and not bounded_layer(plain, 5, True)


def _count_syncs(monkeypatch) -> list[str]:
    """torch.cuda.synchronize and numba's cuda.synchronize counted (and run) until the patch is undone."""
    from numba import cuda

    calls: list[str] = []
    own_torch, own_numba = torch.cuda.synchronize, cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: (calls.append("torch"), own_torch(*a)))
    monkeypatch.setattr(cuda, "synchronize", lambda *a: (calls.append("numba"), own_numba(*a)))
    return calls


@pytest.mark.gpu
def test_gpu_sample_reads_back_once_per_call_and_allocates_no_scratch_when_warm(monkeypatch) -> None:
    from graphrl.graph import CSCGraph
    from samplers.neighbor import NeighborSampler

    rng = np.random.default_rng(1)
    n, e = 5000, 60000
    graph = CSCGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    cpu_s = NeighborSampler(graph, [10, 5], seed=1)
    gpu_s = NeighborSampler(graph, [10, 5], seed=1, device="cuda")
    syncs = _count_syncs(monkeypatch)
    for call in range(3):
        seeds = torch.from_numpy(rng.integers(0, n, 512))
        syncs.clear()
        before = gpu_s.loop.traffic.snapshot()
        got = gpu_s.sample(seeds)
        used = gpu_s.loop.traffic.since(before)
        assert syncs == [] or call == 0, syncs  # no device-wide sync (torch's or numba's) once warm
        for x, y in zip(cpu_s.sample(seeds), got, strict=True):
            assert torch.equal(x.edge_ids, y.edge_ids.cpu()) and torch.equal(x.src_nodes, y.src_nodes.cpu())
        assert used.readbacks == 1 and used.pinned_copies == 1  # both layers chained on the device
        if call:
            assert used.scratch_allocations == 0 and used.registrations == 0


@pytest.mark.gpu
def test_gpu_typed_temporal_and_labor_chains_read_back_once_per_call(monkeypatch) -> None:
    """On a GPU: typed layers (uniform and weighted relations in one launch per kernel; LABOR-0 and temporal
    relation by relation), temporal layers and LABOR-0 layers chain on the device (one read-back a call, the
    library's count) and give the CPU's blocks."""
    from graphrl.graph import CSCGraph
    from samplers import LaborSampler
    from samplers.hetero import HeteroGraph, HeteroNeighborSampler
    from samplers.neighbor import NeighborSampler

    rng = np.random.default_rng(3)
    n, e = 4000, 48000
    graph = CSCGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    times = torch.from_numpy(rng.integers(0, 100, e))
    clicks, by = ("user", "clicks", "item"), ("item", "clicked_by", "user")
    src, dst = rng.integers(0, 3000, 30000), rng.integers(0, 1000, 30000)
    hetero = HeteroGraph.from_edges({"user": 3000, "item": 1000}, {clicks: (src, dst), by: (dst, src)},
                                    weights={clicks: torch.from_numpy(rng.random(30000))})
    samplers = [(NeighborSampler(graph, [10, 5], seed=1, edge_times=times, device=d), "temporal")
                for d in ("cpu", "cuda")]
    samplers += [(LaborSampler(graph, [10, 5], seed=1, device=d), "labor") for d in ("cpu", "cuda")]
    samplers += [(HeteroNeighborSampler(hetero, [10, 5], seed=1, weights={clicks: True}, device=d), "typed")
                 for d in ("cpu", "cuda")]
    samplers += [(LaborSampler(hetero, [10, 5], seed=1, device=d), "typed") for d in ("cpu", "cuda")]
    # typed temporal: relation by relation (masked rows by time, a static weighted relation), by (node, time)
    by_times = {by: torch.from_numpy(rng.integers(0, 100, 30000))}
    samplers += [(HeteroNeighborSampler(hetero, [10, 5], seed=1, weights={clicks: True}, device=d,
                                        edge_times=by_times), "typed temporal") for d in ("cpu", "cuda")]
    for (cpu_s, kind), (gpu_s, _) in zip(samplers[::2], samplers[1::2], strict=True):
        traffic = gpu_s.traffic if isinstance(gpu_s, HeteroNeighborSampler) else gpu_s.loop.traffic
        for call in range(2):
            seeds = torch.from_numpy(rng.integers(0, 1000, 256))
            timed = kind.endswith("temporal")
            kw = {"seed_times": torch.from_numpy(rng.integers(50, 150, 256))} if timed else {}
            if kind.startswith("typed"):
                seeds = {"item": seeds}
                kw = {"seed_times": {"item": kw["seed_times"]}} if kw else kw
            before = traffic.snapshot()
            syncs = _count_syncs(monkeypatch)
            got = gpu_s.sample(seeds, **kw)
            used = traffic.since(before)
            assert syncs == [] or call == 0, (kind, syncs)  # none once warm (a lazy build syncs once)
            monkeypatch.undo()
            want = cpu_s.sample(seeds, **kw)
            assert used.readbacks == 1 and used.chain_overflows == 0, (kind, used)
            for x, y in zip(want, got, strict=True):
                if kind.startswith("typed"):  # the local ids too: the device relabelling's result
                    for rel in x.indices:
                        for f in ("indptr", "indices", "edge_ids"):
                            assert torch.equal(getattr(x, f)[rel], getattr(y, f)[rel].cpu()), (kind, rel, f)
                    for t in x.src_nodes:
                        assert torch.equal(x.src_nodes[t], y.src_nodes[t].cpu()), (kind, t)
                else:
                    for f in ("indptr", "indices", "edge_ids", "src_nodes"):
                        assert torch.equal(getattr(x, f), getattr(y, f).cpu()), (kind, f)


@pytest.mark.gpu
def test_gpu_loader_samples_on_its_side_stream_and_hands_out_ready_batches() -> None:
    from graphrl.graph import CSCGraph
    from samplers.loader import NeighborLoader
    from samplers.neighbor import NeighborSampler

    rng = np.random.default_rng(2)
    n, e = 3000, 30000
    graph = CSCGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    train = torch.arange(0, n, 3)
    for prefetch in (0, 2):
        loaders = [NeighborLoader(graph, train, batch_size=256, seed=3, prefetch=prefetch,
                                  sampler=NeighborSampler(graph, [5, 5], seed=4, device=dev))
                   for dev in ("cpu", "cuda")]
        for a, b in zip(*loaders, strict=True):
            assert isinstance(b.ready, torch.cuda.Event) and b.ready.query() in (True, False)
            for x, y in zip(a.blocks, b.blocks, strict=True):
                assert torch.equal(x.edge_ids, y.edge_ids.cpu())
                assert torch.equal(x.src_nodes, y.src_nodes.cpu())
        side = loaders[1].sampler.loop.cuda_workspaces
        assert len(side) == 1  # every batch on the loader's one side stream


@pytest.mark.gpu
def test_gpu_loader_gathers_host_features_of_cuda_blocks() -> None:
    """A CUDA sampler's blocks with a host feature table: each batch's input features are the rows of its
    input nodes (the loader once called ``.numpy()`` on the device ids)."""
    from graphrl.graph import CSCGraph
    from samplers.loader import NeighborLoader
    from samplers.neighbor import NeighborSampler

    rng = np.random.default_rng(5)
    n, e = 2000, 20000
    graph = CSCGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    x = torch.from_numpy(rng.random((n, 8), dtype=np.float32))
    for prefetch in (0, 1):
        loader = NeighborLoader(graph, torch.arange(0, n, 4), batch_size=128, seed=1, prefetch=prefetch,
                                features=x, sampler=NeighborSampler(graph, [4, 4], seed=2, device="cuda"))
        for batch in loader:
            assert batch.blocks[0].src_nodes.is_cuda
            assert torch.equal(batch.input_features.cpu(), x[batch.input_nodes.cpu()])
            batch.release()
        loader.close()

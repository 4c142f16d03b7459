"""Host waits of the GPU samplers' memory, counted (docs/architecture.md#memory-tiers).

Under numba's CUDA simulator (a subprocess, the ``simulated`` mark) on Cora, with ``torch.cuda.synchronize``
and numba's ``cuda.synchronize`` patched into counters:

- a warm sampling loop makes no device-wide sync;
- a sampler used on more streams than its layer loop keeps workspaces for (6 > 4) makes none: an evicted
  workspace's regions go back with an event on its stream, never a sync;
- closing a sampler, then dropping it, makes none (also with torch pretending to have a started GPU, the
  case where the old finalizers synchronised) and frees every region exactly once;
- a workspace's outgrown device scratch goes back upstream (no idle block left in the device pool);
- every device region a build fills (LABOR's ``hop``/``owner``/``running``, the graph's stand-ins) is
  waited for before the build returns, once per build, not per fill (LABOR's state:
  `samplers.kernels.cuda.memory.publish`; the graph: its build's one ``cuda.synchronize``), so a loader's
  side stream reads it initialised.

On a GPU (``pytest -m gpu``; small, in-process, Cora): the same counts with real streams, LABOR's first batch
on a side stream right after construction (its build's stream kept busy) equal to the CPU sampler's, and a
UVA sampler closed while a prefetching loader samples with it leaves no sticky CUDA error.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

SYNCS = textwrap.dedent(
    """
    import gc
    import os
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy scalar uint64 wrap-around in simulated kernels
    from collections import Counter
    from pathlib import Path
    import numpy as np
    import torch
    from numba import cuda
    import importlib
    launch = importlib.import_module("samplers.kernels.cuda.launch")
    import samplers.kernels.cuda.memory as cmem
    from graphrl import cuda as gcuda
    from graphrl.datasets import load_planetoid
    from graphrl.memory import MemoryManager, Tier
    from samplers.labor import LaborSampler
    from samplers.neighbor import NeighborSampler

    syncs = Counter()
    log = []  # the builds' fills and waits, in order

    def numba_sync(*a, **k):
        syncs.update(["numba"])
        log.append(("sync", "numba"))

    cuda.synchronize = numba_sync
    own_torch_sync = torch.cuda.synchronize
    torch.cuda.synchronize = lambda *a, **k: syncs.update(["torch"])

    # every region given back, counted by the manager's one free path
    freed = []  # the regions, kept alive: their ids stay distinct

    def once():
        return len({id(r) for r in freed}) == len(freed)

    own_deallocate = MemoryManager.deallocate

    def deallocate(self, region, backing):
        freed.append(region)
        return own_deallocate(self, region, backing)

    MemoryManager.deallocate = deallocate

    own_filled, own_publish = cmem.CudaMemory.filled, cmem.publish

    def filled(self, n, dtype, value, tier, owner):
        log.append(("filled", str(tier)))
        out = own_filled(self, n, dtype, value, tier, owner)
        log.append(("returned", str(tier)))
        return out

    def publish(tier):
        log.append(("publish", str(tier)))
        own_publish(tier)

    cmem.CudaMemory.filled = filled
    cmem.publish = publish

    root = Path(os.environ.get("GRAPHRL_DATA", Path.cwd().parent / "shared" / "data"))
    graph = load_planetoid("cora", root).graph
    n = graph.num_nodes
    rng = np.random.default_rng(5)
    batches = [torch.from_numpy(rng.integers(0, n, 16)) for _ in range(4)]

    def published(log):
        # (device fills, waits): no fill waits itself; every device fill is followed by a wait, one per
        # build (publish(device), or the graph build's synchronize that also covers its copies)
        starts = [i for i, (what, tier) in enumerate(log) if what == "filled" and tier == "device"]
        assert starts, log
        for i in starts:
            assert log[i + 1] == ("returned", "device"), log[i:i + 2]
            assert any(what in ("publish", "sync") for what, _ in log[i + 2:]), log[i:]
        waits = [(what, tier) for what, tier in log if what in ("publish", "sync")]
        assert all(w in (("publish", "device"), ("sync", "numba")) for w in waits), waits
        return len(starts), len(waits)

    mm = MemoryManager(device="cpu")
    labor = LaborSampler(graph, [4, 3], seed=1, device="cuda", memory=mm, importance_sampling=1)
    # hop, owner, running and the graph's stand-ins for times and weights; waits: the graph's, LABOR's state's
    assert published(log) == (5, 2), log
    log.clear()
    plain = NeighborSampler(graph, [4, 3], seed=1, device="cuda", memory=mm)
    assert published(log) == (2, 1), log  # the stand-ins for times and weights; the graph's one wait
    cpu = NeighborSampler(graph, [4, 3], seed=1)
    cpu_labor = LaborSampler(graph, [4, 3], seed=1, importance_sampling=1)

    # growing batches: each outgrown scratch block goes back upstream, none idles in the device pool
    for size in (8, 40, 200):
        grow = torch.from_numpy(rng.integers(0, n, size))
        for a, b in zip(plain.sample(grow), cpu.sample(grow)):
            assert torch.equal(a.edge_ids, b.edge_ids)
    assert plain.loop.traffic.scratch_allocations > 0
    assert mm.stats()["pools"]["device"]["idle_bytes"] == 0, mm.stats()["pools"]

    # a warm loop: no sync
    for s in (plain, labor, cpu, cpu_labor):  # each call's draws depend on the call's number: keep in step
        s.sample(batches[0])
    syncs.clear()
    for seeds in batches:
        for a, b in zip(plain.sample(seeds), cpu.sample(seeds)):
            assert torch.equal(a.edge_ids, b.edge_ids)
        for a, b in zip(labor.sample(seeds), cpu_labor.sample(seeds)):
            assert torch.equal(a.edge_ids, b.edge_ids)
    assert not syncs, syncs

    # six streams (the simulator's one stream, told apart by handle): 2 workspaces evicted, no sync
    which = [0]
    own_handle = launch.stream_handle
    launch.stream_handle = lambda stream: which[0]
    before = len(freed)
    ws_regions = len(mm.regions("samplers.workspace"))
    for k in range(6):
        which[0] = 100 + k
        for a, b in zip(plain.sample(batches[k % 4]), cpu.sample(batches[k % 4])):
            assert torch.equal(a.edge_ids, b.edge_ids)
    launch.stream_handle = own_handle
    assert len(plain.loop.cuda_workspaces) == 4
    assert not syncs, syncs
    assert len(freed) > before and once()  # the evicted workspaces' regions, each once
    assert len(mm.regions("samplers.workspace")) > ws_regions  # more streams, more live workspaces

    # close, then drop: no sync, every region freed once, the workspaces' too
    live = mm.regions()
    plain.close()
    del plain
    gc.collect()
    labor.close()
    assert not syncs, syncs
    assert {id(r) for r in live} <= {id(r) for r in freed} and once()
    assert not mm.regions(), mm.regions()

    # torch pretending a started GPU (where the finalizers synchronised): close and drop sync nothing
    s = NeighborSampler(graph, [4, 3], seed=1, device="cuda", memory=mm)
    s.sample(batches[0])
    assert mm.regions("samplers.workspace")
    syncs.clear()  # CudaGraph.build's own, once
    gcuda.has_cuda = lambda: True
    torch.cuda.is_initialized = lambda: True
    s.close()
    box = [s]
    del s
    import threading
    t = threading.Thread(target=box.clear)
    t.start()
    t.join()
    gc.collect()
    assert not syncs, syncs
    assert once() and not mm.regions()
    mm.close()
    print("OK")
    """
)


@pytest.mark.simulated(SYNCS, patches=True)
def test_no_sync_in_warm_loops_evictions_close_or_drop_and_builds_publish_fills(data_root, simulated_part):
    """Zero device-wide syncs (torch's and numba's) while warm, with 6 streams, on close and drop; each
    region freed once; each device fill of a build published before the build returns."""
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output


def test_publish_waits_for_the_current_stream_of_device_fills_only(monkeypatch) -> None:
    """`publish` waits for this thread's current stream (not the device) where torch has CUDA, for the
    device tier only; nothing under the simulator."""
    from graphrl import cuda as gcuda
    from graphrl.memory import Tier
    from samplers.kernels.cuda import memory as cmem

    waits: list[str] = []

    class Stream:
        def synchronize(self) -> None:
            waits.append("stream")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: waits.append("device"))
    monkeypatch.setattr(gcuda, "has_cuda", lambda: False)
    cmem.publish(Tier.DEVICE)
    assert waits == []
    monkeypatch.setattr(gcuda, "has_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    cmem.publish(Tier.PINNED)
    assert waits == []
    cmem.publish(Tier.DEVICE)
    assert waits == ["stream"]


# --- on a GPU


def _count_syncs(monkeypatch) -> list[str]:
    from numba import cuda

    calls: list[str] = []
    own_torch, own_numba = torch.cuda.synchronize, cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: (calls.append("torch"), own_torch(*a)))
    monkeypatch.setattr(cuda, "synchronize", lambda *a, **k: (calls.append("numba"), own_numba(*a)))
    return calls


def _cora(data_root):
    from graphrl.datasets import load_planetoid

    return load_planetoid("cora", data_root).graph


def _same(got, want) -> None:
    assert len(got) == len(want)
    for x, y in zip(got, want, strict=True):
        assert torch.equal(x.edge_ids.cpu(), y.edge_ids) and torch.equal(x.src_nodes.cpu(), y.src_nodes)


@pytest.mark.gpu
def test_gpu_warm_loop_and_six_streams_make_no_device_sync(data_root, monkeypatch) -> None:
    """On a GPU, Cora: once warm no torch/numba synchronize; six streams (two workspaces evicted) none
    either, the CPU's blocks on each; close and drop none."""
    import gc

    from samplers.neighbor import NeighborSampler

    graph = _cora(data_root)
    rng = np.random.default_rng(2)
    cpu = NeighborSampler(graph, [10, 5], seed=1)
    gpu = NeighborSampler(graph, [10, 5], seed=1, device="cuda")
    batches = [torch.from_numpy(rng.integers(0, graph.num_nodes, 256)) for _ in range(4)]
    _same(gpu.sample(batches[0]), cpu.sample(batches[0]))  # in step: a call's draws depend on its number
    calls = _count_syncs(monkeypatch)
    for seeds in batches:
        _same(gpu.sample(seeds), cpu.sample(seeds))
    assert calls == []
    streams = [torch.cuda.Stream() for _ in range(6)]
    for k, stream in enumerate(streams):
        with torch.cuda.stream(stream):
            got = gpu.sample(batches[k % 4])
        stream.synchronize()
        _same(got, cpu.sample(batches[k % 4]))
    assert calls == [] and len(gpu.loop.cuda_workspaces) == 4
    gpu.close()
    del gpu
    gc.collect()
    assert calls == []
    torch.cuda.current_stream().synchronize()


@pytest.mark.gpu
def test_gpu_labor_on_a_side_stream_right_after_construction_equals_the_cpu(data_root, monkeypatch) -> None:
    """LABOR's per-node arrays are set before the first batch on a side stream reads them, even with the
    building stream kept busy (torch.cuda._sleep queued before the fills): the CPU's blocks."""
    import samplers.kernels.cuda.labor as labor_cuda
    from samplers.labor import LaborSampler
    from samplers.loader import NeighborLoader

    own = labor_cuda.LaborCudaState.of.__func__

    def slow_of(cls, *args, **kwargs):
        torch.cuda._sleep(1_000_000_000)  # about a second of spin on the current stream
        return own(cls, *args, **kwargs)

    monkeypatch.setattr(labor_cuda.LaborCudaState, "of", classmethod(slow_of))
    graph = _cora(data_root)
    seeds = torch.from_numpy(np.random.default_rng(4).integers(0, graph.num_nodes, 300))
    cpu = LaborSampler(graph, [10, 5], seed=1, importance_sampling=1)
    gpu = LaborSampler(graph, [10, 5], seed=1, importance_sampling=1, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        got = gpu.sample(seeds)
    side.synchronize()
    _same(got, cpu.sample(seeds))
    gpu2 = LaborSampler(graph, [10, 5], seed=1, importance_sampling=1, device="cuda")
    want = NeighborLoader(graph, seeds, batch_size=100, shuffle=False, prefetch=0,
                          sampler=LaborSampler(graph, [10, 5], seed=1, importance_sampling=1))
    loader = NeighborLoader(graph, seeds, batch_size=100, shuffle=False, prefetch=2, sampler=gpu2)
    for a, b in zip(loader, want, strict=True):
        _same(a.blocks, b.blocks)


@pytest.mark.gpu
def test_gpu_uva_sampler_closed_while_a_loader_prefetches_leaves_no_cuda_error(data_root) -> None:
    """A UVA sampler (graph in pooled pinned blocks) closed, and its manager closed, while a prefetching
    loader samples with it: no block it reads is unregistered under a kernel (a sticky illegal address
    would fail the synchronize below and every later test)."""
    import gc

    from graphrl.memory import MemoryManager
    from samplers.loader import NeighborLoader
    from samplers.neighbor import NeighborSampler

    graph = _cora(data_root)
    mm = MemoryManager(device=torch.device("cuda", torch.cuda.current_device()))
    gpu = NeighborSampler(graph, [10, 5], seed=1, device="cuda", uva=True, memory=mm)
    loader = NeighborLoader(graph, torch.arange(graph.num_nodes), batch_size=64, prefetch=3, sampler=gpu,
                            memory=mm)
    it = iter(loader)
    next(it)
    gpu.close()
    mm.close()
    try:
        for _ in it:
            pass
    except ValueError:  # the closed sampler refuses the next batch: the loader raises it
        pass
    it.close()
    del it, loader, gpu
    gc.collect()
    torch.cuda.synchronize()
    probe = torch.arange(10, device="cuda")
    assert int(probe.sum()) == 45


def test_close_frees_after_every_used_and_unfinished_retired_stream(monkeypatch) -> None:
    """`CudaMemory.close` frees its regions after the streams its workspaces use and those retired whose
    work may still run; past 8 retired streams the finished ones are forgotten (queried, no host wait)."""
    from graphrl.memory import MemoryManager, Region, Tier
    from samplers.kernels.cuda.memory import CudaMemory

    class Stream:
        def __init__(self, name: str, done: bool) -> None:
            self.name, self.done = name, done

        def query(self) -> bool:
            return self.done

    given: list[tuple] = []
    own = Region.free_soon
    monkeypatch.setattr(Region, "free_soon", lambda self, streams=None, reuse=True: (
        given.append(tuple(s.name for s in streams or ())), own(self, streams, reuse))[1])
    mm = MemoryManager(device="cpu")
    mem = CudaMemory(mm)
    mem.allocate(4, np.int64, Tier.DEVICE, "samplers.graph")
    live = Stream("live", False)
    mem.use_stream(live)
    retired = [Stream(f"r{i}", done=i % 2 == 0) for i in range(10)]  # even ones finished
    for stream in retired:
        mem.use_stream(stream)
        mem.retire_stream(stream)
    mem.close()
    assert len(given) == 1
    # r0..r7 kept until the 9th retirement; then the finished ones among them went: r1 r3 r5 r7 r8 r9 left
    assert sorted(given[0]) == sorted(["live", "r1", "r3", "r5", "r7", "r8", "r9"]), given
    mm.close()



def test_retire_stream_walks_a_snapshot_while_another_retirement_changes_the_set(monkeypatch) -> None:
    """A retirement while `CudaMemory.retire_stream` queries the retired streams (another thread, or a
    workspace's finalizer run during a query) changes the set, not the walk: before, 'dictionary changed
    size during iteration'. Here the first query retires another stream, deterministically."""
    from graphrl.memory import MemoryManager, Region, Tier
    from samplers.kernels.cuda.memory import CudaMemory

    mm = MemoryManager(device="cpu")
    mem = CudaMemory(mm)
    mem.allocate(4, np.int64, Tier.DEVICE, "samplers.graph")

    class Stream:
        def __init__(self, name: str, done: bool, retire_on_query: Stream | None = None) -> None:
            self.name, self.done, self.retire_on_query = name, done, retire_on_query

        def query(self) -> bool:
            if self.retire_on_query is not None:
                other, self.retire_on_query = self.retire_on_query, None
                mem.retire_stream(other)
            return self.done

    given: list[tuple] = []
    own = Region.free_soon
    monkeypatch.setattr(Region, "free_soon", lambda self, streams=None, reuse=True: (
        given.append(tuple(s.name for s in streams or ())), own(self, streams, reuse))[1])
    late = Stream("late", done=False)
    first = Stream("r0", done=True, retire_on_query=late)
    for stream in [first] + [Stream(f"r{i}", done=i % 2 == 0) for i in range(1, 8)]:
        mem.retire_stream(stream)
    mem.retire_stream(Stream("last", done=False))  # the 9th: the 8 kept are queried; r0's query retires late
    mem.close()
    # the finished r0 r2 r4 r6 forgotten; late (retired during the walk) and last kept
    assert len(given) == 1 and sorted(given[0]) == sorted(["r1", "r3", "r5", "r7", "late", "last"]), given
    mm.close()

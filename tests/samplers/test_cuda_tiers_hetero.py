"""The heterogeneous GPU sampler's buffers on one memory manager's tiers (docs/architecture.md#memory-tiers),
on LastFM (users, artists; ``listens``, its reverse ``heard_by``, ``friends``):
``HeteroNeighborSampler(memory=mm)`` puts every relation's graph (the uniform and weighted relations'
concatenated CSC with its prefix sums, a temporal relation's own graph) and the workspaces on ``mm``, so one
budget governs them all.

Under numba's CUDA simulator (a subprocess; its device tier is host memory, ``MemoryManager(device="cpu")``):
the regions per tier and owner (the graphs' bytes exactly, by hand from the relations' sizes), one manager for
every relation (a private one without ``memory=``), the budget error naming the tier and the owner when the
device budget is one byte short (the relations placed before the failing one freed too: nothing left counted),
the workspace's errors on ``device`` and ``pinned``, ``close`` / garbage collection / the manager's close, and
the blocks equal to the CPU sampler's. A loader given ``memory=`` counts the sampler's regions beside its
features' and refuses a GPU sampler or a `FeatureStore` of another manager. The same checks run on a real GPU
(``pytest -m gpu``)."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager
from samplers.features import FeatureStore
from samplers.hetero import HeteroGraph, HeteroNeighborSampler
from samplers.link import LinkSampler
from samplers.loader import LinkLoader, NeighborLoader
from samplers.neighbor import NeighborSampler

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
    from graphrl.datasets import load_lastfm
    from graphrl.memory import MemoryBudgetError, MemoryManager
    from samplers.hetero import HeteroNeighborSampler, lastfm_hetero_graph

    import sys
    sys.path.insert(0, "tests")
    from _cuda_tiers import DEVICE, budget_error, manager, tiers

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
                    assert torch.equal(dx[k], dy[k].cpu()), (what, f, k)

    def raises(call, text):
        try:
            call()
        except ValueError as err:
            assert text in str(err), str(err)
            return
        raise AssertionError(f"no ValueError with {text!r}")

    def live(mm):
        return sorted(id(r) for r in mm.regions())

    root = Path(os.environ.get("GRAPHRL_DATA", Path.cwd().parent / "shared" / "data"))
    graph = lastfm_hetero_graph(load_lastfm(root))
    LISTENS, HEARD, FRIENDS = graph.relations
    U, A = graph.num_nodes["user"], graph.num_nodes["artist"]
    E_L, E_F = graph.num_edges(LISTENS), graph.num_edges(FRIENDS)
    assert graph.num_edges(HEARD) == E_L
    assert all(graph.indices[r].dtype == torch.int32 for r in graph.relations)
    rng = np.random.default_rng(11)
    w_listen = torch.from_numpy(rng.random(E_L) * (rng.random(E_L) < 0.8))  # 20 % zero weights: never drawn
    t_friends = torch.from_numpy(rng.integers(0, 50, E_F))
    seeds = {"user": torch.tensor([0, 5, 77, 1500]), "artist": torch.tensor([3, 100, 4000])}
    seed_times = {"user": torch.tensor([10, 49, 0, 30]), "artist": torch.tensor([20, 5, 40])}
    excluded = {LISTENS: torch.from_numpy(rng.integers(0, E_L, 200)),
                FRIENDS: torch.from_numpy(rng.integers(0, E_F, 100))}

    def fused_bytes(rows, edges):
        # TypedCsc by hand: the concatenated indptr int64 [R + 1], indices int32 [E], edge ids int64 [E],
        # weights float32 [E], the times' 1-element int64 stand-in, prefix sums float64 [E], positive counts
        # int64 [R] (7 regions), and each relation's own indptr int64 [N_r + 1] (one region each)
        total = sum(rows)
        return (total + 1) * 8 + edges * (4 + 8 + 4 + 8) + 8 + total * 8 + sum((n + 1) * 8 for n in rows)

    # listens (weighted) and heard_by (uniform) concatenated; friends temporal, its own graph: indptr int64
    # [U + 1], indices int32, edge ids and times int64 [E_F], the weights' 1-element float32 stand-in (5)
    FUSED = fused_bytes([A, U], 2 * E_L)
    TEMPORAL = (U + 1) * 8 + E_F * (4 + 8 + 8) + 4
    GRAPH_BYTES, GRAPH_REGIONS = FUSED + TEMPORAL, 9 + 5
    KW = dict(weights={LISTENS: w_listen}, edge_times={FRIENDS: t_friends}, seed=7)
    FAN = {LISTENS: [3, 2], HEARD: [2, 2], FRIENDS: [2, 1]}
    """
)

SAMPLER = COMMON + textwrap.dedent(
    """
    mm = manager()
    gpu = HeteroNeighborSampler(graph, FAN, device="cuda", memory=mm, **KW)
    cpu = HeteroNeighborSampler(graph, FAN, **KW)
    # one manager for every relation: the concatenation and the temporal relation's graph, exactly
    assert gpu.cuda_memory.memory is mm and not gpu.cuda_memory.owns
    assert tiers(mm) == {("device", "samplers.graph"): (GRAPH_BYTES, GRAPH_REGIONS)}, tiers(mm)
    assert gpu.typed_csc.graph.memory is gpu.cuda_memory and gpu.typed_csc.relations == [LISTENS, HEARD]
    for call in range(2):
        args = dict(seeds=seeds, seed_times=seed_times, exclude_eids=excluded)
        same(cpu.sample(**args), gpu.sample(**args), call)
    assert cpu.sampled_edges == gpu.sampled_edges > 0
    now = tiers(mm)
    assert set(now) == {("device", "samplers.graph"), ("device", "samplers.workspace"),
                        ("pinned", "samplers.workspace")}, now
    assert now[("device", "samplers.graph")] == (GRAPH_BYTES, GRAPH_REGIONS)
    assert 0 < now[("device", "samplers.workspace")][0] <= gpu.traffic.scratch_bytes
    assert live(mm) == sorted(id(r) for r in gpu.cuda_memory.regions())  # every region is the sampler's
    gpu.close()
    assert tiers(mm) == {} and mm.usage()["device"]["used"] == 0 and mm.usage()["pinned"]["used"] == 0
    raises(lambda: gpu.sample(seeds, seed_times=seed_times), "closed")
    gpu.close()  # idempotent

    # UVA: every relation's copy on the pinned tier, nothing of the graphs on the device tier; gc frees them
    uva = HeteroNeighborSampler(graph, FAN, device="cuda", uva=True, memory=mm, **KW)
    assert tiers(mm) == {("pinned", "samplers.graph"): (GRAPH_BYTES, GRAPH_REGIONS)}, tiers(mm)
    del uva
    gc.collect()
    assert tiers(mm) == {}, tiers(mm)

    # one byte short: the temporal relation's last array fails after the concatenation was placed; the error
    # names the tier and "samplers.graph", and nothing of either relation stays counted (while the error's
    # traceback still holds the half-built sampler: freed by the sampler, not by garbage collection)
    small = manager(device=GRAPH_BYTES - 1)
    err = budget_error(lambda: HeteroNeighborSampler(graph, FAN, device="cuda", memory=small, **KW),
                       "device", "samplers.graph")
    assert small.usage()["device"]["used"] == 0 and not small.regions() and not small.closed
    del err
    # room for every graph but not the scratch: the first sample names "samplers.workspace"
    exact = manager(device=GRAPH_BYTES)
    s = HeteroNeighborSampler(graph, FAN, device="cuda", memory=exact, **KW)
    budget_error(lambda: s.sample(seeds, seed_times=seed_times), "device", "samplers.workspace")
    s.close()
    assert exact.usage()["device"]["used"] == 0 and not exact.regions()
    # no room for the page-locked staging buffers of the seeds
    no_pin = manager(pinned=64)
    s = HeteroNeighborSampler(graph, FAN, device="cuda", memory=no_pin, **KW)
    budget_error(lambda: s.sample(seeds, seed_times=seed_times), "pinned", "samplers.workspace")
    del s
    gc.collect()
    assert not no_pin.regions()

    # the manager's close frees the regions: the sampler then raises instead of sampling
    s = HeteroNeighborSampler(graph, FAN, device="cuda", memory=exact, **KW)
    exact.close()
    raises(lambda: s.sample(seeds, seed_times=seed_times), "MemoryManager was closed")

    # without memory=: one private manager for every relation, closed with the sampler
    s = HeteroNeighborSampler(graph, FAN, device="cuda", **KW)
    private = s.cuda_memory.memory
    assert s.cuda_memory.owns
    assert tiers(private) == {("device", "samplers.graph"): (GRAPH_BYTES, GRAPH_REGIONS)}, tiers(private)
    s.close()
    assert private.closed
    for m in (mm, small, no_pin):
        m.close()
    print("OK")
    """
)

LOADER = COMMON + textwrap.dedent(
    """
    from samplers.features import FeatureStore
    from samplers.hetero_link import HeteroLinkSampler
    from samplers.loader import LinkLoader, NeighborLoader

    # every relation concatenated (no times): 10 regions
    STATIC = fused_bytes([A, U, U], 2 * E_L + E_F)
    fan = {LISTENS: [2, 2], HEARD: [2, 2], FRIENDS: [2, 1]}
    kw = dict(weights={LISTENS: w_listen}, seed=3)
    x_user = torch.from_numpy(rng.random((U, 8), dtype=np.float32))
    x_artist = torch.from_numpy(rng.random((A, 4), dtype=np.float32))
    mm = manager()
    s = HeteroNeighborSampler(graph, fan, device="cuda", memory=mm, **kw)
    users = torch.arange(0, 40)
    loader = NeighborLoader(graph, ("user", users), batch_size=8, sampler=s, shuffle=False, prefetch=0,
                            features={"user": x_user, "artist": x_artist}, memory=mm, seed=0)
    assert loader.memory is mm and all(f.memory is mm for f in loader.features.values())
    batch = next(iter(loader))
    same(HeteroNeighborSampler(graph, fan, **kw).sample({"user": users[:8]}), batch.blocks, "loader")
    for t, x in (("user", x_user), ("artist", x_artist)):
        assert torch.equal(batch.input_features[t].cpu(), x[batch.blocks[0].src_nodes[t].cpu()]), t
    owners = {}
    for (tier, owner), (nbytes, count) in tiers(mm).items():
        owners[owner] = owners.get(owner, 0) + nbytes
    # the one manager counts the sampler's graph and workspace beside the features' tables and staging
    assert tiers(mm)[("device", "samplers.graph")] == (STATIC, 10), tiers(mm)
    want = {"samplers.graph", "samplers.workspace", "features.table", "features.staging"}
    assert set(owners) == want, owners
    assert owners["features.table"] == x_user.nbytes + x_artist.nbytes, owners
    del batch
    loader.close()  # the stores it made and their staging go; the sampler it was given stays
    assert set(o for _, o in tiers(mm)) == {"samplers.graph", "samplers.workspace"}, tiers(mm)

    # a GPU sampler or a FeatureStore outside the loader's manager is refused, naming the argument
    other = manager()
    elsewhere = HeteroNeighborSampler(graph, fan, device="cuda", memory=other, **kw)
    raises(lambda: NeighborLoader(graph, ("user", users), batch_size=8, sampler=elsewhere, memory=mm),
           "sampler: the HeteroNeighborSampler's GPU buffers come from another MemoryManager")
    private = HeteroNeighborSampler(graph, fan, device="cuda", **kw)
    raises(lambda: NeighborLoader(graph, ("user", users), batch_size=8, sampler=private, memory=mm),
           "sampler: the HeteroNeighborSampler's GPU buffers are on a private MemoryManager")
    store = FeatureStore(x_user, memory=other)
    raises(lambda: NeighborLoader(graph, ("user", users), batch_size=8, sampler=s, memory=mm,
                                  features={"user": store}), "features['user']: the FeatureStore's")
    # a LinkLoader checks the sampler behind its link sampler
    pairs = (graph.indices[LISTENS][:16].long(), torch.zeros(16, dtype=torch.int64))  # users, artist 0
    link = LinkLoader(HeteroLinkSampler(s, LISTENS, *pairs, batch_size=8, seed=1), memory=mm,
                      features={"artist": x_artist}, prefetch=0)
    assert link.features["artist"].memory is mm
    link.close()
    raises(lambda: LinkLoader(HeteroLinkSampler(elsewhere, LISTENS, *pairs, batch_size=8, seed=1), memory=mm),
           "link_sampler.sampler: the HeteroNeighborSampler's GPU buffers come from another")
    for x in (s, elsewhere, private, store):
        x.close()
    assert tiers(mm) == {} and tiers(other) == {}, (tiers(mm), tiers(other))
    mm.close()
    other.close()
    print("OK")
    """
)


def _check(part) -> None:
    assert part.ok and part.output.strip().endswith("OK"), part.output


@pytest.mark.slow
@pytest.mark.simulated(SAMPLER)
def test_hetero_sampler_relations_share_one_manager_under_the_simulator(data_root, simulated_part):
    """Every relation's regions on one manager, exact bytes, budget errors, close / gc, the CPU's blocks."""
    _check(simulated_part)


@pytest.mark.slow
@pytest.mark.simulated(LOADER)
def test_loader_memory_counts_the_sampler_regions_under_the_simulator(data_root, simulated_part):
    """A loader's memory= counts the GPU sampler's regions beside its features'; other managers refused."""
    _check(simulated_part)


@pytest.mark.gpu
@pytest.mark.parametrize("script", [SAMPLER, LOADER], ids=["sampler", "loader"])
def test_gpu_hetero_buffers_live_on_one_manager(script: str, data_root, monkeypatch) -> None:
    """On a real GPU: the same checks, the device regions CUDA tensors and the pinned ones page-locked."""
    monkeypatch.setenv("GRAPHRL_DATA", str(data_root))
    namespace: dict = {}
    exec(compile(script, "<gpu hetero tiers script>", "exec"), namespace)  # noqa: S102 - the module's script


CLICKS = ("user", "clicks", "item")


def _tiny() -> HeteroGraph:
    return HeteroGraph.from_edges({"user": 3, "item": 2}, {CLICKS: ([0, 1, 2], [0, 0, 1])})


def test_memory_of_another_type_is_a_type_error() -> None:
    """``memory`` of another type is a TypeError naming it, for the sampler and both loaders (no GPU)."""
    graph = _tiny()
    plain = CSCGraph.from_edges([0, 1], [1, 0], 3)
    link = LinkSampler(NeighborSampler(plain, [1], seed=0), [0], [1], item_range=(1, 3), batch_size=1, seed=0)
    for build in (lambda: HeteroNeighborSampler(graph, [1], memory="1GiB"),
                  lambda: NeighborLoader(graph, ("item", [0]), [1], batch_size=1, memory={"device": 1}),
                  lambda: LinkLoader(link, memory=object())):
        with pytest.raises(TypeError, match="memory must be a MemoryManager or None, got"):
            build()


def test_a_cpu_hetero_sampler_closes() -> None:
    """On the CPU ``close`` holds no regions to free but makes `sample` raise, as on CUDA; idempotent."""
    s = HeteroNeighborSampler(_tiny(), [-1], seed=0)
    assert s.cuda_memory is None
    assert s.sample({"item": torch.tensor([0])})[0].num_edges() == 2
    s.close()
    s.close()
    with pytest.raises(ValueError, match="this HeteroNeighborSampler is closed"):
        s.sample({"item": torch.tensor([0])})


@pytest.mark.parametrize("typed", [False, True], ids=["plain", "hetero"])
def test_loader_memory_holds_the_stores_it_makes(typed: bool) -> None:
    """The loader's memory= holds the stores it makes from tensors (tables and staging), freed by its close
    while the manager stays open; a given FeatureStore of another manager is refused (CPU: no GPU needed)."""
    if typed:
        graph, seeds, n = _tiny(), ("item", [0, 1]), 2
    else:
        graph, seeds, n = CSCGraph.from_edges([0, 1, 2], [1, 2, 0], 3), [0, 1, 2], 3
    x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
    features = {"item": x} if typed else x
    with MemoryManager(device="cpu") as mm:
        loader = NeighborLoader(graph, seeds, [-1], batch_size=2, features=features, memory=mm, seed=0,
                                prefetch=0)
        stores = list(loader.features.values()) if typed else [loader.features]
        assert [s.memory for s in stores] == [mm]
        batch = next(iter(loader))
        got = batch.input_features["item"] if typed else batch.input_features
        src = batch.blocks[0].src_nodes["item"] if typed else batch.blocks[0].src_nodes
        assert torch.equal(got, x[src])
        owners = {r.owner for r in mm.regions()}
        assert owners == {"features.table", "features.staging"}, owners
        assert sum(r.nbytes for r in mm.regions("features.table")) == x.nbytes
        del batch, got
        loader.close()
        assert mm.regions() == [] and not mm.closed
        with MemoryManager(device="cpu") as other, FeatureStore(x, memory=other) as store:
            given = {"item": store} if typed else store
            name = "features['item']" if typed else "features"
            with pytest.raises(ValueError, match=re.escape(name) + r": the FeatureStore's .* another Memory"):
                NeighborLoader(graph, seeds, [-1], batch_size=2, features=given, memory=mm)

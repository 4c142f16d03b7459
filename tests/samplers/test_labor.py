"""LaborSampler (LABOR, Balin and Catalyurek, NeurIPS 2023): keep probabilities by exact enumeration and
chi-square, k kept in expectation, shared variates, fewer vertices than neighbour sampling, importance
weights, typed graphs, the loaders and adapters, and CPU = CUDA (numba's simulator)."""

from __future__ import annotations

import itertools
import textwrap

import numpy as np
import pytest
import torch
from scipy.stats import chi2, chisquare

from graphrl.datasets.synthetic import synthetic_graph
from graphrl.graph import CSCGraph
from samplers import LaborSampler, NeighborLoader, NeighborSampler, Sampler
from samplers.hetero_graph import HeteroGraph
from samplers.interop import hetero_block_to_dgl
from samplers.layers import LayerLoop
from samplers.modes import MODES, LaborMode, LayerRequest, RelationArrays, UniformMode


def private_rows(rows: int, deg: int) -> CSCGraph:
    """Destination i (0..rows-1) has ``deg`` in-edges from sources of its own (no source shared)."""
    src = rows + np.arange(rows * deg)
    dst = np.repeat(np.arange(rows), deg)
    return CSCGraph.from_edges(src, dst, rows + rows * deg)


def kept_sets(block, deg: int, rows: int) -> list[tuple[int, ...]]:
    """Per row, the kept positions within the row (the edge id minus the row's first edge id)."""
    ptr = block.indptr.numpy()
    eids = block.edge_ids.numpy()
    return [tuple(int(x) - i * deg for x in eids[ptr[i]:ptr[i + 1]]) for i in range(rows)]


def test_labor0_keeps_each_subset_with_its_exact_probability():
    """LABOR-0 keeps each edge independently with probability min(1, k/d): with d = 4, k = 2 every one of
    the 16 subsets of a row has probability (1/2)^4, checked by chi-square over 4000 rows with private
    sources (independent variates); rows with d <= k keep everything."""
    rows, deg, k = 4000, 4, 2
    block = LaborSampler(private_rows(rows, deg), [k], seed=3).sample(torch.arange(rows))[0]
    sets = kept_sets(block, deg, rows)
    subsets = [s for r in range(deg + 1) for s in itertools.combinations(range(deg), r)]
    counts = np.array([sum(1 for s in sets if s == sub) for sub in subsets])
    sizes = np.array([len(s) for s in subsets])
    p = (k / deg) ** sizes * (1 - k / deg) ** (deg - sizes)
    assert counts.sum() == rows
    assert chisquare(counts, p * rows).pvalue > 1e-3, counts
    # d = 3, k = 2: each edge with probability 2/3, edges independent
    block = LaborSampler(private_rows(3000, 3), [2], seed=5).sample(torch.arange(3000))[0]
    per_edge = np.bincount(np.concatenate([np.array(s, dtype=np.int64) for s in kept_sets(block, 3, 3000)]),
                           minlength=3)
    stat = ((per_edge - 3000 * 2 / 3) ** 2 / (3000 * 2 / 3 * 1 / 3)).sum()
    assert chi2.sf(stat, 3) > 1e-3, per_edge
    small = LaborSampler(private_rows(5, 2), [3], seed=0).sample(torch.arange(5))[0]
    assert small.in_degrees().tolist() == [2] * 5


def test_a_destination_keeps_k_sources_in_expectation():
    rows, deg, k = 4000, 20, 5
    block = LaborSampler(private_rows(rows, deg), [k], seed=1).sample(torch.arange(rows))[0]
    mean = block.in_degrees().double().mean().item()
    assert abs(mean - k) < 0.15, mean  # sd of the mean: sqrt(20 * 1/4 * 3/4 / 4000) = 0.03


def test_destinations_with_identical_in_neighbourhoods_keep_identical_sources():
    """The variate belongs to the source: rows 0 and 1 (the same 12 in-neighbours) keep the same ones, in
    every call and every variant; duplicate seeds likewise."""
    src = np.concatenate([np.arange(2, 14), np.arange(2, 14), np.arange(5, 9)])
    dst = np.concatenate([np.zeros(12), np.ones(12), np.full(4, 14)]).astype(np.int64)
    g = CSCGraph.from_edges(src, dst, 15)
    for kw in ({}, {"importance_sampling": 1}, {"importance_sampling": -1}):
        sampler = LaborSampler(g, [3], seed=7, **kw)
        for _ in range(20):
            b = sampler.sample(torch.tensor([0, 1, 14, 0]))[0]
            rows = [set(b.src_nodes[b.indices[b.indptr[i]:b.indptr[i + 1]]].tolist()) for i in range(4)]
            assert rows[0] == rows[1] == rows[3], (kw, rows)


def test_labor_samples_fewer_vertices_than_neighbour_sampling():
    """Where in-neighbourhoods overlap (5,000 nodes of in-degree 40, 512 seeds, [10, 10]), neighbour
    sampling reaches nearly every node in two hops; LABOR-0 keeps only sources whose variate is below
    k / d = 1/4, and layer dependency reuses the same sources in both hops."""
    g = synthetic_graph(5_000, 200_000, seed=0)
    seeds = torch.from_numpy(np.random.default_rng(0).integers(0, 5_000, 512))
    ns = NeighborSampler(g, [10, 10], seed=0).sample(seeds)
    ours = LaborSampler(g, [10, 10], seed=0).sample(seeds)
    dep = LaborSampler(g, [10, 10], seed=0, importance_sampling=-1, layer_dependency=True).sample(seeds)
    for a, b, c in zip(ours, ns, dep, strict=True):
        assert a.num_src_nodes < 0.65 * b.num_src_nodes, (a, b)
        assert c.num_src_nodes < 0.65 * b.num_src_nodes, (c, b)
    assert dep[0].num_src_nodes < 0.8 * ours[0].num_src_nodes


def test_importance_weights_average_one_per_row_and_follow_dgl():
    g = synthetic_graph(2_000, 30_000, in_degree="powerlaw", seed=1)
    seeds = torch.arange(300)
    plain = LaborSampler(g, [5, 5], seed=2).sample(seeds)
    assert all(b.edge_weights is None for b in plain)
    for kw in ({"importance_sampling": 1}, {"weights": torch.rand(g.num_edges)}):
        for b in LaborSampler(g, [5, 5], seed=2, **kw).sample(seeds):
            assert b.edge_weights.dtype == torch.float32 and b.edge_weights.shape == (b.num_edges,)
            deg = b.in_degrees()
            sums = torch.zeros(b.num_dst_nodes).index_add_(0, b.edge_dst(), b.edge_weights)
            assert torch.allclose(sums[deg > 0], deg[deg > 0].float(), rtol=1e-4), kw


def test_weights_exclusions_and_fanout_minus_one():
    rng = np.random.default_rng(0)
    g = CSCGraph.from_edges(rng.integers(0, 50, 600), rng.integers(0, 50, 600), 50)
    w = torch.from_numpy(rng.random(600) * (rng.random(600) < 0.7))
    excl = torch.arange(0, 600, 7)
    for kw in ({}, {"weights": w}, {"weights": w, "importance_sampling": 2}):
        for b in LaborSampler(g, [4, 3], seed=1, **kw).sample(torch.arange(50), exclude_eids=excl):
            e = b.edge_ids
            assert not torch.isin(e, excl).any()
            if "weights" in kw:
                assert (w[e] > 0).all()
    full = LaborSampler(g, [-1], seed=0).sample(torch.arange(50), exclude_eids=excl)[0]
    assert full.num_edges == 600 - excl.numel()


def test_typed_graphs_share_variates_per_source_type():
    """A user reached through two relations into artists and users is one variate: rows of different
    relations with the same candidate users keep the same ones."""
    users = np.arange(10)
    g = HeteroGraph.from_edges({"user": 10, "artist": 2}, {
        ("user", "listens", "artist"): (users, np.zeros(10, np.int64)),
        ("user", "friends", "user"): (users, np.zeros(10, np.int64))})
    sampler = LaborSampler(g, [3], seed=4)
    for _ in range(10):
        b = sampler.sample({"user": torch.tensor([0]), "artist": torch.tensor([0])})[0]
        la = ("user", "listens", "artist")
        fr = ("user", "friends", "user")
        got = [set(b.src_nodes["user"][b.indices[r]].tolist()) for r in (la, fr)]
        assert got[0] == got[1]
    assert b.edge_weights is None


def test_typed_blocks_keep_importance_weights_through_dgl():
    """HeteroBlock.to_dgl and the DGL adapter's conversion (`interop.hetero_block_to_dgl`, with a relation the
    block did not sample) carry each relation's importance weights as DGL's ``edata["edge_weights"]``."""
    from graphrl.dglshim import dgl_available, import_dgl

    if not dgl_available():
        pytest.skip("DGL not installed (install the 'dgl' extra)")
    dgl = import_dgl()
    rng = np.random.default_rng(3)
    rels = {("user", "listens", "artist"): (rng.integers(0, 30, 200), rng.integers(0, 8, 200)),
            ("user", "friends", "user"): (rng.integers(0, 30, 300), rng.integers(0, 30, 300))}
    g = HeteroGraph.from_edges({"user": 30, "artist": 8}, rels)
    block = LaborSampler(g, [3], seed=1, importance_sampling=1).sample({"artist": torch.arange(8)})[0]
    la = ("user", "listens", "artist")
    assert block.edge_weights[la].shape == block.edge_ids[la].shape and block.edge_ids[la].numel() > 0
    unsampled = ("artist", "liked_by", "user")
    for out in (block.to_dgl(), hetero_block_to_dgl(block, [la, unsampled])):
        assert torch.equal(out.edges[la].data["edge_weights"], block.edge_weights[la])
        assert torch.equal(out.edges[la].data[dgl.EID], block.edge_ids[la])
    assert "edge_weights" not in hetero_block_to_dgl(block, [la, unsampled]).edges[unsampled].data


def test_bad_arguments_raise_clear_errors():
    g = private_rows(3, 2)
    with pytest.raises(TypeError, match="graph must be"):
        LaborSampler("g", [2])
    with pytest.raises(TypeError, match="importance_sampling"):
        LaborSampler(g, [2], importance_sampling=1.5)
    with pytest.raises(ValueError, match="seed_times"):
        LaborSampler(g, [2]).sample(torch.tensor([0]), seed_times=torch.tensor([1]))
    with pytest.raises(ValueError, match="fanouts"):
        LaborSampler(g, [])
    with pytest.raises(ValueError, match="weights=True"):
        LaborSampler(g, [2], weights=True)


def test_modes_registry_and_the_per_layer_entry_point():
    """Every mode runs through the one layer loop; LayerLoop.sample_relation is the per-layer entry."""
    assert set(MODES) >= {"uniform", "weighted", "temporal", "labor"}
    g = private_rows(4, 3)
    arr = RelationArrays(g.indptr.numpy(), g.indices.numpy(), g.edge_ids.numpy(), g.num_nodes)
    rel = ("n", "e", "n")
    for mode in (UniformMode(), LaborMode()):
        loop = LayerLoop({rel: arr}, {"n": g.num_nodes}, {rel: mode}, "cpu", typed=False)
        edges = loop.sample_relation(rel, LayerRequest(dst=np.arange(4), fanout=-1, key=1, variate_key=2))
        assert edges.indptr.tolist() == [0, 3, 6, 9, 12]
        layers = loop.run({"n": np.arange(2)}, {rel: [2]}, seed=0, call=0)
        assert layers[0].dst_nodes["n"].tolist() == [0, 1]


def test_labor_through_the_loaders():
    g = synthetic_graph(500, 5_000, seed=0)
    sampler = LaborSampler(g, [5, 5], seed=0)
    assert isinstance(sampler, Sampler)
    loader = NeighborLoader(g, torch.arange(200), batch_size=64, sampler=sampler,
                            features=torch.randn(500, 4), shuffle=False, prefetch=1)
    batches = list(loader)
    assert len(batches) == 4 and batches[0].input_features.shape[1] == 4
    assert torch.equal(batches[-1].seeds, torch.arange(192, 200))
    with pytest.raises(ValueError, match="not both"):
        NeighborLoader(g, torch.arange(10), [5], batch_size=4, sampler=sampler)
    from samplers import LinkSampler

    link = LinkSampler(LaborSampler(g, [3], seed=0), torch.arange(20), torch.arange(20, 40), batch_size=8,
                       seed=0, item_range=(20, 500))
    batch = next(iter(link))
    assert batch.blocks[-1].num_dst_nodes > 0


SIM_SCRIPT = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)
    import numpy as np
    import torch
    from numba import config
    assert config.ENABLE_CUDASIM
    from graphrl.graph import CSCGraph
    from samplers import LaborSampler
    from samplers.hetero_graph import HeteroGraph

    rng = np.random.default_rng(0)
    g = CSCGraph.from_edges(rng.integers(0, 30, 160), rng.integers(0, 30, 160), 30)
    w = torch.from_numpy(rng.random(160) * (rng.random(160) < 0.8))
    seeds, ex = torch.tensor([0, 1, 5, 5, 9]), torch.tensor([0, 3, 7, 50])
    # independent read-back counter: the simulator's device-to-host copies and scalar reads on the host
    import sys
    sys.path.insert(0, "tests")
    from _cuda_copies import count_host_copies
    from samplers.kernels.cuda import labor as labor_cuda
    copies = count_host_copies()

    # (options, capacity slack, read-backs per call: LABOR chains, one, importance sampling and weights
    # included; a chain past its capacity is sampled again without chaining)
    cases = ((dict(), None, 1), (dict(), 0.0, None), (dict(weights=w, importance_sampling=2), None, 1),
             (dict(importance_sampling=-1, layer_dependency=True), None, 1))
    for kw, slack, per_call in cases:
        a = LaborSampler(g, [3, 2], seed=4, **kw).sample(seeds, exclude_eids=ex)
        gpu_s = LaborSampler(g, [3, 2], seed=4, device="cuda", **kw)
        labor_cuda.LABOR_SLACK, labor_cuda.LABOR_EXTRA = (2.0, 1024) if slack is None else (slack, 1)
        copies.clear()
        b = gpu_s.sample(seeds, exclude_eids=ex)
        for x, y in zip(a, b):
            for f in ("src_nodes", "indptr", "indices", "edge_ids", "edge_weights"):
                assert (getattr(x, f) is None) == (getattr(y, f) is None), (kw, f)
                assert getattr(x, f) is None or torch.equal(getattr(x, f), getattr(y, f)), (kw, f)
        traffic = gpu_s.loop.traffic
        assert traffic.chain_overflows == (slack is not None), (kw, traffic)
        if per_call is not None:
            assert traffic.readbacks == per_call == copies.readbacks, (kw, traffic, copies.seen)
        else:
            assert copies.readbacks >= 4, (kw, copies.seen)  # at least two per layer
    labor_cuda.LABOR_SLACK, labor_cuda.LABOR_EXTRA = 2.0, 1024
    rels = {("u", "l", "a"): (rng.integers(0, 20, 60), rng.integers(0, 10, 60)),
            ("a", "h", "u"): (rng.integers(0, 10, 60), rng.integers(0, 20, 60))}
    hg = HeteroGraph.from_edges({"u": 20, "a": 10}, rels)
    # LABOR-0 on a typed graph chains relation by relation: the CPU's blocks, one read-back a call
    a = LaborSampler(hg, [2, 2], seed=0).sample({"u": torch.tensor([0, 1, 7])})
    gpu_s = LaborSampler(hg, [2, 2], seed=0, device="cuda")
    copies.clear()
    b = gpu_s.sample({"u": torch.tensor([0, 1, 7])})
    assert gpu_s.loop.traffic.readbacks == 1 == copies.readbacks, (gpu_s.loop.traffic, copies.seen)
    for x, y in zip(a, b):
        for r in x.indices:
            assert torch.equal(x.indices[r], y.indices[r]) and torch.equal(x.edge_ids[r], y.edge_ids[r])
            assert torch.equal(x.indptr[r], y.indptr[r])
        for t in x.src_nodes:
            assert torch.equal(x.src_nodes[t], y.src_nodes[t])
    # past the capacity (1 edge a relation): two relations from one source type both overflow, the second
    # packed past its type's region, the relabelling's count past its sources; sampled again unchained
    rels[("u", "f", "u")] = (rng.integers(0, 20, 60), rng.integers(0, 20, 60))
    hg2 = HeteroGraph.from_edges({"u": 20, "a": 10}, rels)
    seeds2 = {"u": torch.tensor([0, 1, 7]), "a": torch.tensor([2, 3])}
    a = LaborSampler(hg2, [2, 2], seed=0).sample(seeds2)
    gpu_s = LaborSampler(hg2, [2, 2], seed=0, device="cuda")
    labor_cuda.LABOR_SLACK, labor_cuda.LABOR_EXTRA = 0.0, 1
    b = gpu_s.sample(seeds2)
    labor_cuda.LABOR_SLACK, labor_cuda.LABOR_EXTRA = 2.0, 1024
    assert gpu_s.loop.traffic.chain_overflows == 1, gpu_s.loop.traffic
    for x, y in zip(a, b):
        for r in x.indices:
            assert torch.equal(x.indices[r], y.indices[r]) and torch.equal(x.edge_ids[r], y.edge_ids[r])
        for t in x.src_nodes:
            assert torch.equal(x.src_nodes[t], y.src_nodes[t])
    # the pair relabelling (a typed chain with times) past its sources' capacity: the first 3 relabelled,
    # the true count written for the read-back, nothing written past the arrays (the simulator checks)
    from numba import cuda
    from samplers.kernels.cuda.relabel import edge_time_keys_cuda, relabel_pairs_bounded
    from samplers.kernels.cuda.workspace import CudaWorkspace
    dev = lambda *v: cuda.to_device(np.array(v, np.int64))
    row_t, tkey, sizes = dev(3, 5, 0), dev(0, 0, 0), dev(0, 0, 0)
    edge_time_keys_cuda(dev(0, 2, 5, 5), row_t, tkey)  # 5 edges kept, 3 fit
    nodes, st, local = relabel_pairs_bounded(dev(4, 7, 9), row_t, dev(2), dev(7, 1, 1), tkey, dev(5),
                                             CudaWorkspace(), sizes)
    assert tkey.copy_to_host().tolist() == [3, 3, 5] and sizes.copy_to_host().tolist() == [5, 3, 5]
    assert nodes.copy_to_host()[:5].tolist() == [4, 7, 7, 1, 1]
    assert st.copy_to_host()[:5].tolist() == [3, 5, 3, 3, 5]
    assert local.copy_to_host().tolist() == [2, 3, 4]
    a = LaborSampler(hg, [2, 2], seed=0, importance_sampling=1).sample({"u": torch.tensor([0, 1])})
    b = LaborSampler(hg, [2, 2], seed=0, importance_sampling=1, device="cuda").sample(
        {"u": torch.tensor([0, 1])})
    for x, y in zip(a, b):
        for r in x.indices:
            assert torch.equal(x.indices[r], y.indices[r])
            assert torch.equal(x.edge_weights[r], y.edge_weights[r])
        for t in x.src_nodes:
            assert torch.equal(x.src_nodes[t], y.src_nodes[t])
    print("OK")
    """
)


@pytest.mark.slow
@pytest.mark.simulated(SIM_SCRIPT, patches=True)
def test_cpu_and_cuda_simulator_keep_the_same_edges(simulated_part):
    assert simulated_part.ok and simulated_part.output.strip().endswith("OK"), simulated_part.output


def test_labor_through_dgl_sampler_and_pickling():
    import pickle

    from graphrl.dglshim import dgl_available, import_dgl
    from samplers import DglSampler

    g = synthetic_graph(300, 3_000, seed=0)
    sampler = LaborSampler(g, [4, 4], seed=0, importance_sampling=1)
    copy = pickle.loads(pickle.dumps(sampler))
    sampler.sample(torch.arange(5))
    clone = pickle.loads(pickle.dumps(sampler))  # continues at call 1
    a, b = sampler.sample(torch.arange(20)), clone.sample(torch.arange(20))
    assert all(torch.equal(x.edge_ids, y.edge_ids) for x, y in zip(a, b, strict=True))
    assert copy.sampled_edges == 0
    if not dgl_available():
        pytest.skip("DGL not installed (install the 'dgl' extra)")
    dgl = import_dgl()
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 300, 3_000), rng.integers(0, 300, 3_000)
    ours = CSCGraph.from_edges(src, dst, 300)
    dg = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=300)
    dg.edata["x"] = torch.arange(3_000)
    adapter = DglSampler(sampler=LaborSampler(ours, [4, 4], seed=0, importance_sampling=1))
    input_nodes, output_nodes, blocks = adapter.sample(dg, torch.arange(20))
    want = LaborSampler(ours, [4, 4], seed=0, importance_sampling=1).sample(torch.arange(20))
    assert torch.equal(input_nodes, want[0].src_nodes) and torch.equal(output_nodes, torch.arange(20))
    for got, ref in zip(blocks, want, strict=True):
        assert torch.equal(got.edata["edge_weights"], ref.edge_weights)
        assert torch.equal(got.edata["x"], ref.edge_ids) and torch.equal(got.edata[dgl.EID], ref.edge_ids)
    with pytest.raises(ValueError, match="nodes"):
        adapter.sample(dgl.graph(([0], [1]), num_nodes=2), torch.tensor([0]))


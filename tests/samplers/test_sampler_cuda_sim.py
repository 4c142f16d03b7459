"""The numba.cuda sampling kernels under numba's CUDA simulator (in a subprocess: the simulator must be
chosen before numba.cuda is first imported), against the CPU kernels, temporal sampling included; their
PTX for sm_90 where libNVVM is present; and the clear error of device="cuda" without a GPU.

(Named test_sampler_cuda_sim.py, not test_cuda_sim.py: tests/replay has a module of that name and the
test folders are not packages.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from samplers.neighbor import NeighborSampler

REPO = Path(__file__).resolve().parents[2]

SIM_SCRIPT = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy scalar uint64 wrap-around in simulated kernels
    import numpy as np
    import torch
    from numba import config, cuda
    assert config.ENABLE_CUDASIM  # the simulator, not a GPU
    from graphrl.graph import CSCGraph
    from samplers.kernels import cpu, cuda as ck
    from samplers.kernels import reference as ref
    from samplers.neighbor import NeighborSampler

    def same(a, b, what):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            for f in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids"):
                assert torch.equal(getattr(x, f), getattr(y, f)), (what, f, getattr(x, f), getattr(y, f))

    rng = np.random.default_rng(0)
    # a skewed graph: rows of degree 0, small rows, and rows above 64 (Floyd's complement and large paths)
    n, e = 40, 500
    dst = np.minimum(rng.geometric(0.04, e) - 1, n - 1)
    graph = CSCGraph.from_edges(rng.integers(0, n, e), dst, n)
    assert int(graph.in_degrees().max()) > 64
    seeds = torch.tensor([0, 1, 5, 5, 39, 2, 17])
    weights = torch.from_numpy(rng.random(e) * (rng.random(e) < 0.7))
    # each path once (two layers where the second layer's frontier matters); every case excludes edges
    # (link prediction), one also samples without: each simulated layer costs a second or more
    cases = [(False, [-1, 3], None), (False, [3, 2], None), (False, [40], None), (True, [2], None),
             (False, [-1], weights), (False, [2, 30], weights), (True, [3], weights)]
    excluded = torch.from_numpy(rng.integers(0, e, 150))
    for replace, fanouts, w in cases:
        cpu_s = NeighborSampler(graph, fanouts, replace=replace, weights=w, seed=9)
        gpu_s = NeighborSampler(graph, fanouts, replace=replace, weights=w, seed=9, device="cuda")
        for call, ex in enumerate((None, excluded) if fanouts == [3, 2] else (excluded,)):
            same(cpu_s.sample(seeds, exclude_eids=ex), gpu_s.sample(seeds, exclude_eids=ex),
                 (replace, fanouts, w is not None, call))
        assert cpu_s.sampled_edges == gpu_s.sampled_edges
    # weighted short rows (running sums): dense rows up to 64 edges with heavy weights (their sums summed
    # afresh) and excluded edges, against the reference too
    short = CSCGraph.from_edges(rng.integers(0, 8, 120), np.repeat(np.arange(6), [3, 9, 17, 40, 1, 50]), 8)
    wshort = rng.random(120) * (rng.random(120) < 0.8)
    wshort[::11] = 1e6
    for k in (6, 20):
        want = ref.sample_layer(short.indptr.numpy(), short.indices.numpy(), short.edge_ids.numpy(),
                                np.arange(6), k, False, ref.layer_key(2, 0, 0), np.arange(0, 120, 13),
                                wshort[short.edge_ids.numpy()].astype(np.float32))
        ex = torch.from_numpy(short.edge_ids.numpy()[np.arange(0, 120, 13)])
        for dev in ("cpu", "cuda"):
            got = NeighborSampler(short, [k], weights=torch.from_numpy(wshort), seed=2, device=dev).sample(
                torch.arange(6), exclude_eids=ex)[0]
            assert np.array_equal(got.edge_ids.cpu().numpy(), want[2]), (dev, k)
    # UVA: the graph read from mapped host memory gives the same blocks
    uva = NeighborSampler(graph, [4], seed=3, device="cuda", uva=True)
    from samplers.layers import PLAIN_RELATION
    assert uva.loop.relations[PLAIN_RELATION].cuda.uva
    same(NeighborSampler(graph, [4], seed=3).sample(seeds), uva.sample(seeds), "uva")
    # int64 indices, identity edge ids (a CSCGraph built without edge_ids), seeds given as device arrays
    plain = CSCGraph(indptr=graph.indptr, indices=graph.indices.to(torch.int64))
    a = NeighborSampler(plain, [5], seed=1).sample(seeds)
    b = NeighborSampler(plain, [5], seed=1, device="cuda").sample(seeds)
    same(a, b, "int64 identity eids")
    # the layer kernel against the reference directly, on rows of degree 200 with fanouts on each path
    star = CSCGraph.from_edges(np.arange(600) % 97, np.repeat([0, 1, 2], 200), 100)
    cg = ck.CudaGraph.build(star.indptr, star.indices, star.edge_ids)
    d = np.array([0, 1, 2, 3, 1])
    for fanout, replace in ((5, False), (64, False), (150, False), (199, False), (200, False), (7, True)):
        key = ref.layer_key(4, 0, 1)
        want = ref.sample_layer(star.indptr.numpy(), star.indices.numpy(), star.edge_ids.numpy(), d, fanout,
                                replace, key)
        got = ck.sample_layer_cuda(cg, d, fanout, replace, key)
        for w_, g_ in zip(want, got):
            assert np.array_equal(w_, g_.copy_to_host().astype(np.int64)), (fanout, replace)
    # relabelling: duplicates among destinations and sources, first-occurrence order
    for trial in range(1):
        dd = rng.integers(0, 50, 9)
        ss = rng.integers(0, 50, 70).astype(np.int32)
        nodes, local = ck.relabel_cuda(dd, cuda.to_device(ss))
        want_nodes, want_local = ref.relabel(dd, ss)
        assert np.array_equal(nodes.copy_to_host(), want_nodes)
        assert np.array_equal(local.copy_to_host(), want_local)
    # the scan across several chunks, and chunks of chunks (the chunk totals scanned on the device too):
    # at the simulator's chunk of 64 items that takes 68 blocks; the same kernels with 8-thread blocks
    # (chunks of 16) take 20 (the simulator runs a Python thread per GPU thread); then the usual chunk on
    # one item, one chunk and several chunks
    import samplers.kernels.cuda.scan as scan
    usual = (scan.SCAN_THREADS, scan.SCAN_ITEMS, scan.SCAN_CHUNK)
    for threads, items in ((8, 2), usual[:2]):
        scan.SCAN_THREADS, scan.SCAN_ITEMS, scan.SCAN_CHUNK = threads, items, threads * items
        chunk = scan.SCAN_CHUNK
        sizes = (chunk * chunk + 3 * chunk + 7,) if threads == 8 else (1, chunk, 3 * chunk + 7)
        for size in sizes:
            counts = rng.integers(0, 5, size)
            offs, total = ck.exclusive_scan(cuda.to_device(counts))
            assert total == counts.sum(), (threads, size)
            want = np.concatenate([[0], np.cumsum(counts)])
            assert np.array_equal(offs.copy_to_host(), want), (threads, size)
    assert (scan.SCAN_THREADS, scan.SCAN_ITEMS, scan.SCAN_CHUNK) == usual
    # cuda:N names the device the kernels run on: the current one (cuda:0 here), never silently another
    assert NeighborSampler(graph, [2], seed=0, device="cuda:0").device.index == 0
    for bad in ("cuda:1", "cuda:5"):
        try:
            NeighborSampler(graph, [2], device=bad)
        except ValueError as err:
            assert bad in str(err) and "current CUDA device (cuda:0)" in str(err), err
        else:
            raise AssertionError(bad)
    # seed_times on a sampler without edge_times: the CPU's error
    s = NeighborSampler(graph, [2], seed=0, device="cuda")
    try:
        s.sample(seeds, seed_times=torch.tensor([1] * 7))
    except ValueError as err:
        assert "edge_times" in str(err), err
    else:
        raise AssertionError("seed_times without edge_times")
    print("OK")
    """
)

TEMPORAL_SIM_SCRIPT = textwrap.dedent(
    """
    import sys
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy scalar uint64 wrap-around in simulated kernels
    import numpy as np
    import torch
    from numba import config
    from scipy.stats import chisquare
    assert config.ENABLE_CUDASIM  # the simulator, not a GPU
    sys.path.insert(0, "tests/samplers")
    from test_neighbor import edge_endpoints
    from test_temporal import check_no_future_edges
    from graphrl.graph import CSCGraph
    from samplers.neighbor import NeighborSampler

    def same(a, b, what):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            for f in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids", "src_times"):
                assert torch.equal(getattr(x, f), getattr(y, f)), (what, f, getattr(x, f), getattr(y, f))

    def check_counts(graph, blocks, fanouts, replace, times, w=None, excluded=()):
        # rows draw min(k, eligible) edges without replacement, k (0 if none eligible) with
        src_of, dst_of = edge_endpoints(graph)
        ok = np.ones(graph.num_edges, bool) if w is None else np.asarray(w) > 0
        ok[np.asarray(list(excluded), dtype=np.int64)] = False
        for b, k in zip(blocks, fanouts):
            for i, (v, t) in enumerate(zip(b.dst_nodes.tolist(), b.dst_times.tolist())):
                elig = int((ok & (dst_of == v) & (times <= t)).sum())
                want = elig if k == -1 else (k if elig else 0) if replace else min(k, elig)
                assert int(b.indptr[i + 1] - b.indptr[i]) == want, (v, t, k, elig)

    # 1. the future-edge leak test of test_temporal.py, on the simulated GPU
    src, dst = [1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 1, 2, 3]
    t = torch.tensor([5, 20, 8, 9, 15, 1, 12])
    chain = CSCGraph.from_edges(src, dst, 8)
    for replace, fanouts in ((False, [-1, -1, -1]), (True, [3, 3])):  # every eligible edge; draws
        sampler = NeighborSampler(chain, fanouts, replace=replace, edge_times=t, seed=0, device="cuda")
        blocks = sampler.sample(torch.tensor([0]), seed_times=torch.tensor([10]))
        check_no_future_edges(chain, blocks, t.numpy())
        eids = set(torch.cat([b.edge_ids for b in blocks]).tolist())
        assert 1 not in eids and 4 not in eids and 6 not in eids, eids
        if not replace:
            assert eids == {0, 2, 3}
        same(blocks, NeighborSampler(chain, fanouts, replace=replace, edge_times=t, seed=0).sample(
            torch.tensor([0]), seed_times=torch.tensor([10])), ("chain", replace))
    # a node reached at two times is two rows; float times, -0.0 folded, float seed times floored
    blocks = NeighborSampler(chain, [-1, -1], edge_times=t, seed=0, device="cuda").sample(
        torch.tensor([0, 1]), seed_times=torch.tensor([10, 16]))
    assert blocks[-1].src_nodes.tolist() == [0, 1, 1, 3, 4, 5]
    assert blocks[-1].src_times.tolist() == [10, 16, 10, 16, 16, 16]
    for tt, st in ((t.double() - 5.5, torch.tensor([-0.0, 0.0, 9.5])), (t, torch.tensor([9.9, -0.5, 16.0]))):
        three = torch.tensor([1, 1, 0])
        a = NeighborSampler(chain, [2, -1], edge_times=tt, seed=1).sample(three, seed_times=st)
        b = NeighborSampler(chain, [2, -1], edge_times=tt, seed=1, device="cuda").sample(three, seed_times=st)
        same(a, b, ("float", tt.dtype))
        assert b[-1].src_times.dtype == tt.dtype

    # 2. a skewed graph: weights, exclusions, both time dtypes; CPU and GPU blocks equal, invariants hold
    rng = np.random.default_rng(0)
    n, e = 40, 500
    dst = np.minimum(rng.geometric(0.04, e) - 1, n - 1)
    graph = CSCGraph.from_edges(rng.integers(0, n, e), dst, n)
    times = rng.integers(0, 20, e)
    ftimes = times + rng.random(e)
    weights = rng.random(e) * (rng.random(e) < 0.7)
    seeds = torch.tensor([0, 1, 5, 5, 39, 2, 17])
    seed_times = torch.tensor([12, 3, 19, 7, 25, 0, 15])
    excluded = torch.from_numpy(rng.integers(0, e, 150))
    # (uniform with replacement on int times is part 3's)
    cases = [(False, [3, 2], ftimes, None), (False, [2, 8], ftimes, weights), (True, [3], times, weights)]
    for replace, fanouts, tm, w in cases:
        kw = dict(replace=replace, edge_times=torch.from_numpy(tm), seed=9,
                  weights=None if w is None else torch.from_numpy(w))
        cpu_s = NeighborSampler(graph, fanouts, **kw)
        gpu_s = NeighborSampler(graph, fanouts, device="cuda", **kw)
        st = seed_times.to(torch.from_numpy(tm).dtype)
        # with exclusions only (each simulated sample call costs seconds; part 1 samples without them)
        for ex in (excluded,):
            b = gpu_s.sample(seeds, exclude_eids=ex, seed_times=st)
            same(cpu_s.sample(seeds, exclude_eids=ex, seed_times=st), b, (replace, fanouts, w is not None))
            check_no_future_edges(graph, b, tm)
            check_counts(graph, b, fanouts, replace, tm, w, () if ex is None else ex.tolist())
            if w is not None:
                assert (w[torch.cat([x.edge_ids for x in b]).numpy()] > 0).all()

    # 3. uniformity over eligible edges: 24 rows of 10 in-edges at times 0..9, seen at time 5 (6 eligible;
    # 8 and 12 draws expected per time)
    rows, deg = 24, 10
    star = CSCGraph.from_edges(np.arange(rows * deg) % 7 + rows, np.repeat(np.arange(rows), deg), rows + 7)
    st_times = torch.from_numpy(np.tile(np.arange(deg), rows))
    for replace, k in ((False, 2), (True, 3)):
        b = NeighborSampler(star, [k], replace=replace, edge_times=st_times, seed=5, device="cuda").sample(
            torch.arange(rows), seed_times=torch.full((rows,), 5))[0]
        rel = b.edge_ids.numpy() % deg  # position within the row = its time
        assert rel.max() <= 5 and b.num_edges == rows * k
        counts = np.bincount(rel, minlength=6)
        assert chisquare(counts).pvalue > 1e-3, counts
    print("OK")
    """
)

PTX_SCRIPT = textwrap.dedent(
    """
    import types
    import numba.cuda.dispatcher as disp
    from numba import cuda, types as t
    # compile for sm_90 without a GPU: device functions ask the current device for its capability
    disp.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    from samplers.kernels import cuda as ck
    i64 = t.int64[::1]; i32 = t.int32[::1]; f32 = t.float32[::1]; f64 = t.float64[::1]
    any64 = t.Array(t.int64, 1, "A")
    sigs = {
        "scan_blocks": (any64, i64, i64, t.int64),
        "scan_add": (i64, i64, t.int64),
        "fill": (i64, t.int64),
        "plan_rows": (i64, i64, i64, t.int64, t.boolean, i64, i64),
        "sample_rows": (i64, i32, i64, t.boolean, i64, i64, t.int64, t.boolean, t.uint64, i64, i32, i64),
        "row_prefix": (i64, f32, f64, i64),
        "plan_rows_weighted": (i64, f32, i64, i64, i64, t.int64, t.boolean, i64, i64),
        "sample_rows_weighted": (i64, i32, i64, t.boolean, f32, f64, i64, i64, i64, t.int64, t.boolean,
                                 t.uint64, i64, i32, i64),
        "plan_uniform": (i64, i64, i64, t.int64, t.boolean, i64, any64, any64, any64, any64, i64),
        "plan_masked": (i64, i64, i64, t.int64, t.boolean, f32, t.boolean, i64, i64, t.boolean, i64, any64,
                        any64, any64, any64, any64, i64),
        "choose_uniform": (i64, any64, any64, any64, any64, i64, t.int64, t.boolean, t.uint64, i64, i64, i64),
        "choose_masked": (i64, any64, any64, any64, any64, any64, i64, t.int64, t.boolean, t.uint64, f32,
                          t.boolean, f64, f64, t.boolean, i64, i64),
        "gather": (i32, i64, t.boolean, i64, i64, i32, i64),
        "take_all": (i64, i32, i64, t.boolean, i64, i64, i64, i64, i32, i64),
        "hash_insert": (i64, i32, i64, i64, t.int64),
        "hash_first": (i32, t.int64, i64, i64, t.int64, i64, i64),
        "relabel_out": (i64, i32, i64, i64, i64, i64, i64),
        "edge_tkeys": (i64, i64, i64),
        "hash_insert_pairs": (i64, i64, i64, i32, i64, i64, i64, i64, t.int64),
        "hash_first_pairs": (i64, i64, i64, i32, i64, i64, i64, i64, t.int64, i64, i64),
        "relabel_out_pairs": (i64, i64, i64, i32, *[i64] * 9),
    }
    assert set(sigs) == set(ck.KERNELS)
    for name, kernel in ck.KERNELS.items():
        ptx, _ = cuda.compile_ptx(kernel.py_func, sigs[name], cc=(9, 0))
        assert ".entry" in ptx and "sm_90" in ptx, name
    # the bounded relabelling of the chained layers (test_gpu_host_path runs them under the simulator)
    from samplers.kernels.cuda.relabel import UPTO_KERNELS
    upto_sigs = {
        "hash_insert_upto": (i64, i64, i32, i64, i64, i64, t.int64),
        "hash_first_upto": (i32, i64, i64, i64, i64, t.int64, i64, i64),
        "relabel_out_upto": (i64, i64, i32, i64, i64, i64, i64, i64, i64, i64),
    }
    assert set(upto_sigs) == set(UPTO_KERNELS)
    for name, kernel in UPTO_KERNELS.items():
        ptx, _ = cuda.compile_ptx(kernel.py_func, upto_sigs[name], cc=(9, 0))
        assert ".entry" in ptx and "sm_90" in ptx, name
    from samplers.kernels.cuda import labor_kernels as labor
    anyf = t.Array(t.float64, 1, "A")
    rows = (i64, any64, any64, any64, any64, i64)  # excl, row_s, row_e, row_a, row_b, raw_off
    labor_sigs = {
        "labor_init": (i64, i64, i64, t.int64, i64, f32, t.boolean, any64, any64, any64, any64, any64, anyf),
        "labor_claim": (i32, f32, t.boolean, *rows, i64),
        "labor_owners": (i32, f32, t.boolean, *rows, i64, any64, t.boolean),
        "labor_hop_max": (i32, f32, t.boolean, t.boolean, *rows, anyf, f64, i64, i64),
        "labor_hop_apply": (i32, f32, t.boolean, *rows, f64, i64, f64, t.boolean, anyf, i64),
        "labor_release": (i32, any64, any64, f64, i64),
        "labor_solve": (t.int64, i32, i64, f32, t.boolean, f64, t.boolean, *rows, anyf, i64),
        "labor_count": (i32, i64, f32, t.boolean, f64, t.boolean, *rows, anyf, t.uint64, anyf, i64, t.boolean,
                        t.int64),
        "labor_take": (i32, i64, f32, t.boolean, f64, t.boolean, *rows, anyf, t.uint64, i64, i64, f64,
                       t.boolean),
        "labor_start": (any64, i64, t.int64, i64, i64, f64, i64),
        "sum_exact": (anyf, i64, i64),
        "labor_decide": (i64, i64, f64, t.int64),
    }
    assert set(labor_sigs) == set(labor.KERNELS)
    for name, kernel in labor.KERNELS.items():
        ptx, _ = cuda.compile_ptx(kernel.py_func, labor_sigs[name], cc=(9, 0))
        assert ".entry" in ptx and "sm_90" in ptx, name
    # the typed kernels and the relation chain's edge packing (test_typed_launch runs them simulated)
    from samplers.kernels.cuda import typed
    typed_sigs = {"typed_plan": (i64, f32, *[i64] * 12),
                  "typed_rows": (i64, i32, i64, f32, f64, *[i64] * 9, i32, *[i64] * 7),
                  "typed_choose": (i64, i32, i64, *[i64] * 13, i32, i64)}
    for name, sig in typed_sigs.items():
        ptx, _ = cuda.compile_ptx(getattr(typed, name).py_func, sig, cc=(9, 0))
        assert ".entry" in ptx and "sm_90" in ptx, name
    from samplers.kernels.cuda.relation_chain import pack_edges
    sig = (i32, i64, t.boolean, i64, i64, t.int64, t.int64, t.int64, i32, i64)
    ptx, _ = cuda.compile_ptx(pack_edges.py_func, sig, cc=(9, 0))
    assert ".entry" in ptx and "sm_90" in ptx
    print("OK")
    """
)


@pytest.mark.slow
@pytest.mark.simulated(SIM_SCRIPT, timeout=900)
def test_cuda_kernels_equal_the_cpu_kernels_under_the_simulator(simulated_part):
    part = simulated_part
    assert part.ok and part.output.strip().endswith("OK"), part.output


@pytest.mark.slow
@pytest.mark.simulated(TEMPORAL_SIM_SCRIPT, timeout=900)
def test_temporal_cuda_kernels_under_the_simulator(simulated_part):
    """Temporal sampling on the (simulated) GPU: test_temporal.py's future-edge leak test, blocks equal to
    the CPU's (weights, exclusions, int and float times), counts of eligible edges, and uniform draws over
    the eligible edges (chi-square)."""
    part = simulated_part
    assert part.ok and part.output.strip().endswith("OK"), part.output


def test_cuda_kernels_compile_to_ptx_for_sm90(compile_ptx):
    proc = compile_ptx(PTX_SCRIPT, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("OK")


def test_device_cuda_without_a_gpu_raises_a_clear_error():
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a CUDA device (or the simulator) is present")
    graph = CSCGraph.from_edges(np.array([1, 2]), np.array([0, 0]), 3)
    with pytest.raises(RuntimeError, match=r"device='cuda' needs a CUDA GPU.*use device='cpu'"):
        NeighborSampler(graph, [2], device="cuda")
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        NeighborSampler(graph, [2], device="tpu")
    assert NeighborSampler(graph, [2], device=torch.device("cpu")).sample(torch.tensor([0]))[0].num_edges == 2


def test_gpu_check_says_why_without_a_gpu():
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a CUDA device (or the simulator) is present")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA GPU here" in proc.stderr


def test_fast_launcher_builds_the_words_numba_builds():
    """The fast launcher (real GPUs only) passes each 1-D array as numba-cuda's ``_prepare_args`` does:
    meminfo 0, parent 0, size, itemsize, data pointer, shape, strides; scalars as ctypes of their type.
    Checked here on host tensors and numba's own types; the launches themselves run in gpu_check."""
    import ctypes

    from numba import types

    from samplers.kernels.cuda.launch import arg_kind, pack_array, packer

    t = torch.arange(5, dtype=torch.int32)
    words: list = []
    packer(types.Array(types.int32, 1, "C"))(t, words)
    assert words == [0, 0, 5, 4, t.data_ptr(), 5, 4]
    with pytest.raises(ValueError, match="1-D and contiguous"):
        pack_array(torch.arange(10)[::2], [])
    with pytest.raises(TypeError, match="1-D arrays"):
        packer(types.Array(types.int64, 2, "C"))
    scalars: list = []
    packer(types.int64)(np.int64(-3), scalars)
    packer(types.uint64)(np.uint64(2**63 + 1), scalars)
    packer(types.boolean)(np.bool_(True), scalars)
    packer(types.float64)(0.5, scalars)
    assert [type(w) for w in scalars] == [ctypes.c_int64, ctypes.c_uint64, bool, ctypes.c_double]
    assert [scalars[0].value, scalars[1].value, scalars[2], scalars[3].value] == [-3, 2**63 + 1, True, 0.5]
    # argument kinds: one compiled kernel per (kernel, kinds)
    assert arg_kind(t) == torch.int32
    assert arg_kind(np.int64(1)) == (np.int64, "<i8")
    assert arg_kind(True) == (bool, None)


def _unused(*args):  # pragma: no cover - a stand-in for cuda.core that must not be called
    raise AssertionError(f"called with {args}")


def test_fast_launcher_falls_back_to_numba_where_internals_differ():
    """Where a compiled kernel cannot be read (other numba-cuda internals), the launcher warns once per
    signature and launches that kernel through numba's dispatcher from then on, on the given stream."""
    from samplers.kernels.cuda.launch import FastLauncher

    launches = []

    class Kernel:  # a dispatcher without the internals the fast path reads
        overloads: dict = {}

        def __getitem__(self, config):
            return lambda *args: launches.append((config, args))

        def typeof_pyval(self, value):
            return "int64"

    launcher = FastLauncher(core_launch=_unused, launch_config=_unused, to_core_stream=_unused)
    kernel = Kernel()
    with pytest.warns(RuntimeWarning, match="launches through numba's dispatcher"):
        launcher(kernel, (4, 128), 0, (np.int64(1), True))
    launcher(kernel, (4, 128), 0, (np.int64(2), False))  # no second warning: the signature is remembered
    assert launches == [((4, 128, 0), (np.int64(1), True)), ((4, 128, 0), (np.int64(2), False))]


def test_fast_launcher_launches_on_the_callers_stream():
    """The stream rule on the fast path: the first launch of a signature goes through numba's dispatcher on
    the given numba stream, later ones through cuda.core on that stream's cuda.core stream, converted once
    per stream handle (numba-cuda's own conversion, as its dispatcher does)."""
    import types as pytypes

    from numba import types

    from samplers.kernels.cuda.launch import FastLauncher

    dispatched, launched, converted = [], [], []
    function = object()

    class Kernel:  # a dispatcher whose compiled kernel the fast path can read
        def __init__(self):
            code = pytypes.SimpleNamespace(get_cufunc=lambda: pytypes.SimpleNamespace(kernel=function))
            self.overloads = {(types.int64, types.boolean): pytypes.SimpleNamespace(_codelibrary=code)}

        def __getitem__(self, config):
            return lambda *args: dispatched.append((config, args))

        def typeof_pyval(self, value):
            return types.boolean if isinstance(value, bool) else types.int64

    def to_core(stream):
        converted.append(stream)
        return ("core", stream.handle)

    side, other = pytypes.SimpleNamespace(handle=7), pytypes.SimpleNamespace(handle=9)
    launcher = FastLauncher(core_launch=lambda *a: launched.append(a),
                            launch_config=lambda grid, block: (grid, block), to_core_stream=to_core)
    kernel = Kernel()
    launcher(kernel, (4, 128), side, (np.int64(1), True))  # compiles: numba's dispatcher, on `side`
    assert dispatched == [((4, 128, side), (np.int64(1), True))] and not launched
    launcher(kernel, (4, 128), side, (np.int64(2), False))
    launcher(kernel, (2, 32), side, (np.int64(3), True))
    launcher(kernel, (4, 128), other, (np.int64(4), True))
    assert [(a[0], a[1], a[2]) for a in launched] == [(("core", 7), (4, 128), function),
                                                      (("core", 7), (2, 32), function),
                                                      (("core", 9), (4, 128), function)]
    assert [a[3].value for a in launched] == [2, 3, 4] and [a[4] for a in launched] == [False, True, True]
    assert converted == [side, other]  # once per stream handle
    assert len(dispatched) == 1


STREAM_SIM_SCRIPT = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy scalar uint64 wrap-around in simulated kernels
    import numpy as np
    import torch
    from numba import config, cuda
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    assert config.ENABLE_CUDASIM
    import graphrl.cuda as gcuda
    from graphrl.graph import CSCGraph
    from samplers.neighbor import NeighborSampler

    side = cuda.stream()  # stands in for torch's current stream
    asked, streams = [], []
    gcuda.launch_stream = lambda device=None: asked.append(device) or side
    original = FakeCUDAKernel.__getitem__

    def configure(self, configuration):
        streams.append(configuration[2] if len(configuration) > 2 else "no stream")
        return original(self, configuration)

    FakeCUDAKernel.__getitem__ = configure
    rng = np.random.default_rng(0)
    n, e = 30, 200
    graph = CSCGraph.from_edges(rng.integers(0, n, e), np.minimum(rng.geometric(0.1, e) - 1, n - 1), n)
    seeds = torch.tensor([0, 1, 2, 5])
    cases = [dict(fanouts=[3, 2]), dict(fanouts=[-1]), dict(fanouts=[2], replace=True),
             dict(fanouts=[2], weights=torch.from_numpy(rng.random(e))),
             dict(fanouts=[2], edge_times=torch.from_numpy(rng.integers(0, 9, e)))]
    for kw in cases:
        fanouts = kw.pop("fanouts")
        sampler = NeighborSampler(graph, fanouts, seed=1, device="cuda", **kw)
        times = torch.full((4,), 5) if "edge_times" in kw else None
        before = len(streams)
        blocks = sampler.sample(seeds, exclude_eids=torch.tensor([0, 3]), seed_times=times)
        want = NeighborSampler(graph, fanouts, seed=1, **kw).sample(seeds, exclude_eids=torch.tensor([0, 3]),
                                                                    seed_times=times)
        for a, b in zip(blocks, want):
            assert torch.equal(a.indices, b.indices) and torch.equal(a.src_nodes, b.src_nodes), kw
        assert len(streams) > before, kw  # the case launched kernels
    assert asked and streams and all(s is side for s in streams), set(map(repr, streams))
    print("OK", len(streams))
    """
)


@pytest.mark.slow
@pytest.mark.simulated(STREAM_SIM_SCRIPT, patches=True)  # the simulator's kernel configuration, the stream
def test_kernels_launch_on_graphrl_cuda_launch_stream_under_the_simulator(simulated_part):
    """The stream rule: every kernel of a sample (plan, scan, choose, gather, relabel; uniform, weighted,
    temporal) launches on the stream `graphrl.cuda.launch_stream` gives (torch's current stream)."""
    part = simulated_part
    assert part.ok and part.output.strip().split()[0] == "OK", part.output

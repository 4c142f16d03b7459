"""The numba.cuda sampling kernels under numba's CUDA simulator (in a subprocess: the simulator must be
chosen before numba.cuda is first imported), against the CPU kernels; their PTX for sm_90 where libNVVM
is present; and the clear error of device="cuda" without a GPU.

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
    cases = [(False, [-1, -1], None), (False, [3, 2], None), (False, [40, 5], None), (True, [2, 4], None),
             (False, [-1, 3], weights), (False, [2, 30], weights), (True, [3, 2], weights)]
    excluded = torch.from_numpy(rng.integers(0, e, 150))
    for replace, fanouts, w in cases:
        cpu_s = NeighborSampler(graph, fanouts, replace=replace, weights=w, seed=9)
        gpu_s = NeighborSampler(graph, fanouts, replace=replace, weights=w, seed=9, device="cuda")
        for call, ex in enumerate((None, excluded)):  # the second call excludes edges (link prediction)
            same(cpu_s.sample(seeds, exclude_eids=ex), gpu_s.sample(seeds, exclude_eids=ex),
                 (replace, fanouts, w is not None, call))
        assert cpu_s.sampled_edges == gpu_s.sampled_edges
    # UVA: the graph read from mapped host memory gives the same blocks
    uva = NeighborSampler(graph, [4, 4], seed=3, device="cuda", uva=True)
    assert uva._cuda_graph.uva
    same(NeighborSampler(graph, [4, 4], seed=3).sample(seeds), uva.sample(seeds), "uva")
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
    for trial in range(3):
        dd = rng.integers(0, 50, 9)
        ss = rng.integers(0, 50, 70).astype(np.int32)
        nodes, local = ck.relabel_cuda(dd, cuda.to_device(ss))
        want_nodes, want_local = ref.relabel(dd, ss)
        assert np.array_equal(nodes.copy_to_host(), want_nodes)
        assert np.array_equal(local.copy_to_host(), want_local)
    # the scan across several chunks
    counts = rng.integers(0, 5, 3 * ck.SCAN_THREADS + 7)
    offs, total = ck.exclusive_scan(cuda.to_device(counts))
    assert total == counts.sum()
    assert np.array_equal(offs.copy_to_host(), np.concatenate([[0], np.cumsum(counts)]))
    # what the GPU path does not do yet says so
    s = NeighborSampler(graph, [2], seed=0, device="cuda")
    for kwargs, word in ((dict(seed_times=torch.tensor([1] * 7)), "edge_times"),):
        try:
            s.sample(seeds, **kwargs)
        except ValueError as err:
            assert word in str(err), err
        else:
            raise AssertionError(word)
    try:
        NeighborSampler(graph, [2], edge_times=torch.zeros(e), device="cuda")
    except ValueError as err:
        assert "edge_times" in str(err)
    else:
        raise AssertionError("temporal on cuda")
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
        "plan_uniform": (i64, i64, t.int64, t.boolean, i64, any64, any64, any64, any64, i64),
        "plan_weighted": (i64, i64, t.int64, t.boolean, f32, i64, any64, any64, any64, any64, any64, i64),
        "choose_uniform": (i64, any64, any64, any64, any64, i64, t.int64, t.boolean, t.uint64, i64, i64, i64),
        "choose_weighted": (i64, any64, any64, any64, any64, any64, i64, t.int64, t.boolean, t.uint64, f32,
                            i64, i64, f64, i64),
        "gather": (i32, i64, t.boolean, i64, i32, i64),
        "hash_insert": (i64, i32, i64, i64, t.int64),
        "hash_first": (i32, t.int64, i64, i64, t.int64, i64, i64),
        "relabel_out": (i64, i32, i64, i64, i64, i64, i64),
    }
    assert set(sigs) == set(ck.KERNELS)
    for name, kernel in ck.KERNELS.items():
        ptx, _ = cuda.compile_ptx(kernel.py_func, sigs[name], cc=(9, 0))
        assert ".entry" in ptx and "sm_90" in ptx, name
    print("OK")
    """
)


def _run(script: str, simulator: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=900, cwd=REPO)


@pytest.mark.slow
def test_cuda_kernels_equal_the_cpu_kernels_under_the_simulator():
    proc = _run(SIM_SCRIPT, simulator=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("OK")


def _nvvm_present() -> bool:
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception:  # noqa: BLE001 - any failure means no libNVVM to compile with
        return False
    return True


def test_cuda_kernels_compile_to_ptx_for_sm90():
    if not _nvvm_present():
        pytest.skip("libNVVM not found: cannot compile numba.cuda kernels to PTX here")
    proc = _run(PTX_SCRIPT, simulator=False)
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

"""One script for a lent GPU machine: the numba.cuda sampling kernels for real (not the simulator).

1. Correctness against the CPU kernels on a 1M-node graph (power-law in-degrees, 10M edges by default),
   fanouts [15, 10, 5], batches of 1024: uniform without and with replacement and fanout -1 must give
   identical blocks; weighted draws report the share of identical rows (GPU ``log`` may round
   differently in the last bit) and must keep the counting rules.
2. Sampled edges/s on a 10M-node / 200M-edge graph (every node 20 random in-edges, int32 indices),
   fanouts [15, 10, 5], batch 1024, with the graph in device memory and read in place from mapped
   (page-locked) host memory through UVA; kernels only (blocks stay on the device; one synchronise
   per batch), uniform and weighted; our CPU sampler on the same graph for scale.
3. Feature gather GB/s: rows of a float32 table gathered by random ids into device memory, from a
   device-resident table and from a mapped host table (UVA); a device-to-device copy of the same bytes
   as the ceiling.
4. Replay sample to the GPU (``ReplayStore.sample(device="cuda")``: windows read in place from the
   registered shard rings by the numba.cuda kernel into a device batch, GEAR's zero-copy collect).
   Correctness first: on a small store whose rings have wrapped, with open episodes, 3 shards, head and
   tail padding and uniform and prioritized draws, every GPU batch must equal, byte for byte, the batch
   of an identical store (same data, same seed) sampled on the CPU and copied to the device (fields,
   mask, keys, probabilities, weights). Then windows/s and GB/s (bytes of the gathered steps) for obs of
   3x64x64 uint8 (and of 4 float32), B=256, L=64, uniform: the GPU path against the CPU gather into
   pinned staging then a non-blocking copy (``sample()`` then ``Batch.to("cuda")``), each batch
   completed before the next, and a pinned-host-to-device copy of the same bytes (the PCIe ceiling).
5. Heterogeneous sampling (run right after part 1, ``hetero_part``, about 15 s): on a synthetic
   user/item graph of ``--check-nodes / 10`` nodes (100k by default), ``HeteroNeighborSampler(device=
   "cuda")`` must give the CPU's blocks for uniform draws without and with replacement (with excluded
   edges), weights with fanout -1 and temporal draws (counted in part 1's ``deterministic_ok``); then
   sampled edges/s of ``sample()`` on the device and on the CPU.

Writes ``benchmarks/results/gpu_check.json`` and prints a table; sized to finish in about 3 minutes on
one H200 (each part checks the clock and shrinks its repeats if it runs late); ``--only-replay`` runs
part 4 alone (about a minute). Without a usable CUDA
device it prints why and exits with status 2. ``NUMBA_ENABLE_CUDASIM=1`` with tiny sizes
(``--nodes 2000 --edges-per-node 5 --check-nodes 300 --check-edges 3000 --batches 1 --feature-rows 500
--batch-size 16``; for part 4 ``--only-replay --replay-check-steps 300 --replay-check-batches 2
--replay-steps 2000 --replay-batch 8 --replay-window 4 --replay-repeats 2``) runs the same code in
numba's simulator, for testing the script itself.

Runs on a lent H200 (numba 0.68.0 with numba-cuda 0.30.4, torch 2.11.0+cu130). 2026-11-29, first session:
sampled edges/s on 10M/200M, b1024: device 46.6M (weighted 40.6M), UVA 38.2M, our CPU sampler on its 16 cores
48.2M (launch- and sync-bound). 2026-11-30, after the thread-per-row kernels, device-side scans, pooled torch
arrays and the fast launcher (69 s in all): every deterministic case identical, weighted rows identical
(3/3 batches, the prefix-sum rejection rule has no ``log``), hetero 4/4 cases identical; replay 12/12
byte-equal. b1024 ``NeighborSampler.sample()`` on the device graph 674-747M edges/s (1.4-1.5 ms a batch;
weighted 395-566M), through UVA 321-455M (weighted 118M: the prefix sums are binary-searched in host
memory), kernels alone at b8192 2594M (weighted 1614M); our CPU sampler on the 16 cores 58M. Per layer
about 0.24 ms choose + 0.18 ms relabel whatever its size: host-side steps (a launch 15-23 us, a scan with
its read-back 39 us) still set the pace at b1024. Feature gather: device 1127 GB/s (device copy 1707),
UVA from pinned host 29.5 GB/s. Replay 3x64x64 uint8, B=256, L=64: GPU gather 41.4 GB/s (75 % of the
pinned->device copy, 5.2x the CPU gather then copy). That image's numpy 2.5 breaks numba-cuda's import
(``np.row_stack`` is gone): carry a numpy 2.4 wheel (see the device tool's notes) and put it first on
``PYTHONPATH``. DGL's GPU sampler is not installable there (no network; its CUDA wheels are not on PyPI
and are larger than what a run may carry), so this script has no GPU baseline.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

# run as a script, this file's folder comes first on sys.path and benchmarks/replay.py would shadow the
# replay package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import click  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402  # numba.cuda imports without a GPU; kernels need one (or the simulator)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "gpu_check.json"


def _no_gpu_exit() -> None:
    click.echo("gpu_check: no CUDA GPU here (numba.cuda.is_available() is False: no device or no driver). "
               "This script measures the numba.cuda kernels on a real GPU; run it on a machine with one "
               "(or set NUMBA_ENABLE_CUDASIM=1 with tiny sizes to test the script).", err=True)
    sys.exit(2)


def _blocks_equal(a, b) -> bool:
    return all(torch.equal(getattr(x, f).cpu(), getattr(y, f).cpu()) for x, y in zip(a, b, strict=True)
               for f in ("src_nodes", "indptr", "indices", "edge_ids"))


def _row_agreement(a, b) -> float:
    """Share of destination rows (all layers) whose sampled edge ids are identical."""
    same = total = 0
    for x, y in zip(a, b, strict=True):
        if x.num_dst_nodes != y.num_dst_nodes or not torch.equal(x.dst_nodes.cpu(), y.dst_nodes.cpu()):
            return float("nan")  # rows no longer correspond once an earlier layer differs
        xi, yi = x.indptr.cpu().numpy(), y.indptr.cpu().numpy()
        xe, ye = x.edge_ids.cpu().numpy(), y.edge_ids.cpu().numpy()
        for v in range(x.num_dst_nodes):
            same += np.array_equal(xe[xi[v]:xi[v + 1]], ye[yi[v]:yi[v + 1]])
            total += 1
    return same / max(total, 1)


def check_correctness(n: int, e: int, fanouts: list[int], batch: int, batches: int, seed: int) -> dict:
    from graphrl.datasets.synthetic import synthetic_graph
    from samplers.neighbor import NeighborSampler

    graph = synthetic_graph(n, e, "powerlaw", seed=seed)
    rng = np.random.default_rng(seed)
    keep = rng.random(graph.num_edges) < 0.8
    weights = torch.from_numpy(rng.random(graph.num_edges).astype(np.float32) * keep)
    out = {"graph": f"power-law {n:,}/{e:,}", "max_in_degree": int(graph.in_degrees().max())}
    cases = {"uniform": dict(), "replace": dict(replace=True), "fanout_-1": dict(fanouts=[-1]),
             "weighted": dict(weights=weights), "weighted_replace": dict(weights=weights, replace=True)}
    for name, kw in cases.items():
        fans = kw.pop("fanouts", fanouts)
        seeds_per = batch if fans != [-1] else min(batch, 64)
        cpu_s = NeighborSampler(graph, fans, seed=seed, **kw)
        gpu_s = NeighborSampler(graph, fans, seed=seed, device="cuda", **kw)
        equal = 0
        agreement = []
        for _ in range(batches):
            seeds = torch.from_numpy(rng.integers(0, n, seeds_per))
            a, b = cpu_s.sample(seeds), gpu_s.sample(seeds)
            if _blocks_equal(a, b):
                equal += 1
            agreement.append(_row_agreement(a, b))
            for blk in b:  # counting rules on the GPU blocks whatever the rounding
                deg = blk.in_degrees().cpu()
                if "replace" in kw:
                    assert bool((deg <= max(fans)).all())
                assert int(blk.indptr[-1]) == blk.num_edges
        out[name] = {"identical_batches": equal, "batches": batches,
                     "identical_rows": float(np.nanmean(agreement)) if agreement else None}
        click.echo(f"  correctness {name:<17} identical batches {equal}/{batches}, rows "
                   f"{out[name]['identical_rows']:.6f}", err=True)
    out["deterministic_ok"] = all(out[k]["identical_batches"] == batches
                                  for k in ("uniform", "replace", "fanout_-1"))
    return out


def _hetero_blocks_equal(a, b) -> bool:
    fields = ("src_nodes", "indptr", "indices", "edge_ids", "src_times")
    for x, y in zip(a, b, strict=True):
        for f in fields:
            dx, dy = getattr(x, f), getattr(y, f)
            if (dx is None) != (dy is None) or dx is not None and (
                    dx.keys() != dy.keys() or not all(torch.equal(dx[k].cpu(), dy[k].cpu()) for k in dx)):
                return False
    return True


def hetero_part(result: dict, n: int, batch: int, batches: int, seed: int, seconds: float = 15.0) -> None:
    """Part 5 into ``result`` (``hetero``, two rows; its correctness folded into
    ``result["correctness"]["deterministic_ok"]``): ``HeteroNeighborSampler(device="cuda")`` against the
    CPU sampler on a synthetic two-type graph of ``n`` nodes (3/5 users, 2/5 items; clicks user -> item,
    4 per node, item popularity skewed; its reverse clicked_by; follows user -> user, 3 per node),
    fanouts [10, 5]. Uniform draws without and with replacement (the latter with excluded edges of two
    relations), weights with fanout -1, and temporal uniform draws must give identical blocks; then
    sampled edges/s of ``sample()`` (host seeds, blocks of CUDA tensors, each batch completed before the
    next) on the device and on the CPU, within about ``seconds``."""
    from samplers.hetero import HeteroGraph, HeteroNeighborSampler

    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    users, items = max(3 * n // 5, 2), max(2 * n // 5, 2)
    clicks, follows = ("user", "clicks", "item"), ("user", "follows", "user")
    clicked = ("item", "clicked_by", "user")
    e_c, e_f = 4 * n, 3 * n
    c_src, c_dst = rng.integers(0, users, e_c), (items * rng.random(e_c) ** 3).astype(np.int64)
    f_src, f_dst = rng.integers(0, users, e_f), rng.integers(0, users, e_f)
    graph = HeteroGraph.from_edges({"user": users, "item": items},
                                   {clicks: (c_src, c_dst), clicked: (c_dst, c_src), follows: (f_src, f_dst)})
    w = torch.from_numpy(rng.random(e_c).astype(np.float32) * (rng.random(e_c) < 0.8))
    times = {clicks: torch.from_numpy(rng.integers(0, 1000, e_c)),
             follows: torch.from_numpy(rng.integers(0, 1000, e_f))}
    excl = {clicks: torch.from_numpy(rng.integers(0, e_c, e_c // 100)),
            follows: torch.from_numpy(rng.integers(0, e_f, e_f // 100))}
    fans = [10, 5]
    out = {"graph": f"2-type {users:,} users / {items:,} items, {2 * e_c + e_f:,} edges", "fanouts": fans,
           "max_item_in_degree": int(np.bincount(c_dst).max())}
    cases = {"uniform": ({}, {}), "replace_excluded": ({"replace": True}, {"exclude_eids": excl}),
             "weighted_fanout_-1": ({"weights": {clicks: w}, "fanouts": [-1, -1]}, {}),
             "temporal": ({"edge_times": times}, {})}
    for name, (kw, call_kw) in cases.items():
        fanouts = kw.pop("fanouts", fans)
        per = batch if fanouts != [-1, -1] else min(batch, 64)
        cpu_s = HeteroNeighborSampler(graph, fanouts, seed=seed, **kw)
        gpu_s = HeteroNeighborSampler(graph, fanouts, seed=seed, device="cuda", **kw)
        equal = 0
        for _ in range(batches):
            seeds = {"user": torch.from_numpy(rng.integers(0, users, per)),
                     "item": torch.from_numpy(rng.integers(0, items, per // 2))}
            if "edge_times" in kw:
                call_kw = {"seed_times": {t: torch.from_numpy(rng.integers(0, 1200, s.shape[0]))
                                          for t, s in seeds.items()}}
            equal += _hetero_blocks_equal(cpu_s.sample(seeds, **call_kw), gpu_s.sample(seeds, **call_kw))
        out[name] = {"identical_batches": equal, "batches": batches}
        click.echo(f"  hetero correctness {name:<19} identical batches {equal}/{batches}", err=True)
    out["deterministic_ok"] = all(out[k]["identical_batches"] == batches for k in cases)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else cuda.synchronize
    left = max(seconds - (time.perf_counter() - t_start), 2.0)
    for device in ("cuda", "cpu"):
        sampler = HeteroNeighborSampler(graph, fans, seed=seed, device=device)
        seeds = [{"user": torch.from_numpy(rng.integers(0, users, batch)),
                  "item": torch.from_numpy(rng.integers(0, items, batch // 2))}
                 for _ in range(4 * batches + 1)]
        sampler.sample(seeds[0])  # warm-up (JIT)
        sync()
        before, done = sampler.sampled_edges, 0
        start = time.perf_counter()
        deadline = start + left / 2
        for s in seeds[1:]:
            sampler.sample(s)
            sync()
            done += 1
            if time.perf_counter() > deadline:
                break
        dt = time.perf_counter() - start
        rate = (sampler.sampled_edges - before) / dt
        out[f"{device}_sampled_edges_per_s"] = rate
        out[f"{device}_ms_per_batch"] = dt / done * 1e3
        case = f"hetero {out['graph']} {fans} b{batch}+{batch // 2} sample() {device}"
        result["rows"].append({"case": case, "metric": "sampled_edges_per_s", "ours": rate, "batches": done})
        click.echo(f"  hetero sample() {device}: {rate / 1e6:.2f} M edges/s, {dt / done * 1e3:.1f} ms/batch",
                   err=True)
    out["seconds"] = time.perf_counter() - t_start
    result["hetero"] = out
    result["correctness"]["deterministic_ok"] &= out["deterministic_ok"]


def _big_graph(n: int, per_node: int, seed: int):
    """Every node ``per_node`` uniformly random in-edges: indptr int64, indices int32, weights float32."""
    rng = np.random.default_rng(seed)
    indptr = np.arange(n + 1, dtype=np.int64) * per_node
    indices = rng.integers(0, n, n * per_node, dtype=np.int32)
    weights = rng.random(n * per_node, dtype=np.float32)
    return indptr, indices, weights


def time_gpu(cuda_graph, n: int, fanouts: list[int], batch: int, batches: int, weighted: bool,
             seed: int, deadline: float) -> dict:
    from samplers.kernels import cuda as ck
    from samplers.kernels.reference import layer_key

    rng = np.random.default_rng(seed)
    seeds = [cuda.to_device(rng.integers(0, n, batch)) for _ in range(batches + 2)]
    edges = 0
    for call, s in enumerate(seeds[:2]):  # warm-up: JIT of every kernel
        dst = s
        for layer in range(len(fanouts) - 1, -1, -1):
            _, dst, local, _ = ck.sample_block_cuda(cuda_graph, dst, fanouts[layer], False,
                                                    layer_key(seed, call, layer), weighted)
    cuda.synchronize()
    start = time.perf_counter()
    done = 0
    for call, s in enumerate(seeds[2:]):
        dst = s
        for layer in range(len(fanouts) - 1, -1, -1):
            _, dst, local, _ = ck.sample_block_cuda(cuda_graph, dst, fanouts[layer], False,
                                                    layer_key(seed, call + 2, layer), weighted)
            edges += local.shape[0]
        cuda.synchronize()
        done += 1
        if time.perf_counter() > deadline:
            break
    dt = time.perf_counter() - start
    return {"sampled_edges_per_s": edges / dt, "batches": done, "edges_per_batch": edges / max(done, 1),
            "seconds": dt}


def time_cpu(indptr, indices, n: int, fanouts: list[int], batch: int, batches: int, seed: int) -> dict:
    from graphrl.graph import CSCGraph
    from samplers.neighbor import NeighborSampler

    graph = CSCGraph(indptr=torch.from_numpy(indptr), indices=torch.from_numpy(indices))
    sampler = NeighborSampler(graph, fanouts, seed=seed)
    rng = np.random.default_rng(seed)
    sampler.sample(torch.from_numpy(rng.integers(0, n, batch)))
    edges = 0
    start = time.perf_counter()
    for _ in range(batches):
        edges += sum(b.num_edges for b in sampler.sample(torch.from_numpy(rng.integers(0, n, batch))))
    dt = time.perf_counter() - start
    return {"sampled_edges_per_s": edges / dt, "threads": numba.get_num_threads()}


def profile_layers(cuda_graph, n: int, fanouts: list[int], batch: int, repeats: int, seed: int) -> list[dict]:
    """Median milliseconds per layer of the two halves of a block (choose + gather, then relabel), each
    followed by a synchronise, over ``repeats`` batches: where a batch's time goes."""
    from samplers.kernels import cuda as ck
    from samplers.kernels.reference import layer_key

    rng = np.random.default_rng(seed + 1)
    times: dict[int, dict[str, list[float]]] = {}
    for call in range(repeats + 1):
        dst = cuda.to_device(rng.integers(0, n, batch))
        for layer in range(len(fanouts) - 1, -1, -1):
            t0 = time.perf_counter()
            out_indptr, src, _ = ck.sample_layer_cuda(cuda_graph, dst, fanouts[layer], False,
                                                      layer_key(seed, call, layer))
            cuda.synchronize()
            t1 = time.perf_counter()
            nodes, _ = ck.relabel_cuda(dst, src)
            cuda.synchronize()
            t2 = time.perf_counter()
            if call:  # the first batch compiles
                row = times.setdefault(layer, {"sample_ms": [], "relabel_ms": [], "dst": [], "edges": []})
                row["sample_ms"].append((t1 - t0) * 1e3)
                row["relabel_ms"].append((t2 - t1) * 1e3)
                row["dst"].append(dst.shape[0])
                row["edges"].append(src.shape[0])
            dst = nodes
    return [{"layer": layer, **{k: float(np.median(v)) for k, v in row.items()}}
            for layer, row in sorted(times.items(), reverse=True)]


def overheads(cuda_graph, n: int, repeats: int, seed: int) -> dict:
    """Microseconds of the host-side steps a layer repeats: a device array from the pool, a launch of the
    plan and choose kernels (1024 rows, no synchronise between launches), a scan with its read-back, an
    empty synchronise."""
    from samplers.kernels import cuda as ck
    from samplers.kernels.reference import layer_key

    rng = np.random.default_rng(seed + 3)
    dst = cuda.to_device(rng.integers(0, n, 1024))
    counts = ck.empty(1024, np.int64)
    excl = ck.empty(0, np.int64)
    grid = ck._grid(1024, 128)
    fanout, key = np.int64(10), np.uint64(layer_key(seed, 0, 0))
    ck._launch(ck._plan_rows, (grid, 128), cuda_graph.indptr, dst, fanout, False, excl, counts)
    offsets, nnz = ck.exclusive_scan(counts)
    src, eids = ck.empty(nnz, cuda_graph.indices.dtype), ck.empty(nnz, np.int64)
    wrapped = [ck._wrap(a) for a in (cuda_graph.indptr, dst, excl, counts)]
    steps = {
        "empty": lambda: ck.empty(4096, np.int64),
        "launch_plan_rows": lambda: ck._launch(ck._plan_rows, (grid, 128), cuda_graph.indptr, dst, fanout,
                                               False, excl, counts),
        "launch_plan_rows_numba_dispatcher": lambda: ck._plan_rows[grid, 128](
            wrapped[0], wrapped[1], fanout, False, wrapped[2], wrapped[3]),
        "launch_sample_rows": lambda: ck._launch(
            ck._sample_rows, (grid, 128), cuda_graph.indptr, cuda_graph.indices, cuda_graph.edge_ids,
            cuda_graph.has_eids, dst, offsets, fanout, False, key, excl, src, eids),
        "exclusive_scan": lambda: ck.exclusive_scan(counts),
        "synchronize": cuda.synchronize,
    }
    out = {}
    for name, step in steps.items():
        step()
        cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        cuda.synchronize()
        out[name] = (time.perf_counter() - start) / repeats * 1e6
    return out


def time_sampler_api(indptr, indices, weights, n: int, fanouts: list[int], batch: int, batches: int,
                     uva: bool, weighted: bool, seed: int, deadline: float) -> dict:
    """``NeighborSampler(..., device="cuda").sample(seeds)`` end to end: seeds a CUDA tensor, blocks of
    CUDA tensors (what a trainer sees), each batch completed before the next."""
    from graphrl.graph import CSCGraph
    from samplers.neighbor import NeighborSampler

    graph = CSCGraph(indptr=torch.from_numpy(indptr), indices=torch.from_numpy(indices))
    w = torch.from_numpy(weights) if weighted else None
    sampler = NeighborSampler(graph, fanouts, weights=w, seed=seed, device="cuda", uva=uva)
    rng = np.random.default_rng(seed + 2)
    where = "cuda" if torch.cuda.is_available() else "cpu"  # the simulator: host tensors
    seeds = [torch.from_numpy(rng.integers(0, n, batch)).to(where) for _ in range(batches + 2)]
    for s in seeds[:2]:
        sampler.sample(s)
    cuda.synchronize()
    edges = done = 0
    start = time.perf_counter()
    for s in seeds[2:]:
        blocks = sampler.sample(s)
        edges += sum(b.num_edges for b in blocks)
        cuda.synchronize()
        done += 1
        if time.perf_counter() > deadline:
            break
    dt = time.perf_counter() - start
    return {"sampled_edges_per_s": edges / dt, "batches": done, "ms_per_batch": dt / max(done, 1) * 1e3}


def sampler_part(result: dict, nodes: int, edges_per_node: int, fans: list[int], batch_size: int,
                 batches: int, seed: int, seconds: float) -> None:
    """Part 2: throughput of the kernels and of the sampler API, device and UVA, uniform and weighted; a
    per-layer profile; our CPU sampler on the same graph for scale."""
    from samplers.kernels import cuda as ck

    indptr, indices, weights = _big_graph(nodes, edges_per_node, seed)
    fanouts = ",".join(map(str, fans))
    label = f"uniform-degree {nodes / 1e6:g}M/{nodes * edges_per_node / 1e6:g}M [{fanouts}]"
    per_case = max(seconds * 0.8 / 12, 1.0)
    sim = bool(numba.config.ENABLE_CUDASIM)  # testing the script: one batch size, one profiled batch
    for placement in ("device", "uva"):
        graph = ck.CudaGraph.build(indptr, indices, None, weights, uva=placement == "uva")
        for weighted in (False, True):
            for batch in (batch_size,) if sim else (batch_size, 8 * batch_size):
                deadline = time.perf_counter() + per_case
                row = time_gpu(graph, nodes, fans, batch, batches, weighted, seed, deadline)
                case = f"{label} b{batch} kernels {placement}{' weighted' if weighted else ''}"
                result["rows"].append({"case": case, "metric": "sampled_edges_per_s",
                                       "ours": row["sampled_edges_per_s"], **row})
                click.echo(f"  {case}: {row['sampled_edges_per_s'] / 1e6:.1f} M edges/s", err=True)
        profile = profile_layers(graph, nodes, fans, batch_size, 1 if sim else 5, seed)
        result[f"profile_{placement}_b{batch_size}"] = profile
        for p in profile:
            click.echo(f"  profile {placement} layer {p['layer']}: dst {p['dst']:.0f} edges {p['edges']:.0f} "
                       f"sample {p['sample_ms']:.3f} ms relabel {p['relabel_ms']:.3f} ms", err=True)
        if placement == "device":
            result["overheads_us"] = overheads(graph, nodes, 20 if sim else 500, seed)
            steps = ", ".join(f"{k} {v:.1f}" for k, v in result["overheads_us"].items())
            click.echo(f"  host-side steps (us): {steps}", err=True)
        del graph
        for weighted in (False, True):
            deadline = time.perf_counter() + per_case
            row = time_sampler_api(indptr, indices, weights, nodes, fans, batch_size, batches,
                                   placement == "uva", weighted, seed, deadline)
            case = f"{label} b{batch_size} sample() {placement}{' weighted' if weighted else ''}"
            result["rows"].append({"case": case, "metric": "sampled_edges_per_s",
                                   "ours": row["sampled_edges_per_s"], **row})
            click.echo(f"  {case}: {row['sampled_edges_per_s'] / 1e6:.1f} M edges/s, "
                       f"{row['ms_per_batch']:.2f} ms/batch", err=True)
    cpu = time_cpu(indptr, indices, nodes, fans, batch_size, min(batches, 10), seed)
    result["rows"].append({"case": f"{label} b{batch_size} cpu (ours, {cpu['threads']} threads)",
                           "metric": "sampled_edges_per_s", "ours": cpu["sampled_edges_per_s"]})


@cuda.jit
def _gather(table, ids, out):  # pragma: no cover - device; a warp per row, 8-byte words
    lane = cuda.threadIdx.x % 32
    warp = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) // 32
    warps = (cuda.gridDim.x * cuda.blockDim.x) // 32
    width = table.shape[1]
    while warp < ids.shape[0]:
        r = ids[warp]
        j = lane
        while j < width:
            out[warp, j] = table[r, j]
            j += 32
        warp += warps


def time_gather(rows: int, dim: int, count: int, repeats: int, seed: int) -> dict:
    gather = _gather
    rng = np.random.default_rng(seed)
    host = rng.random((rows, dim), dtype=np.float32).view(np.uint64)  # dim/2 words per row
    dev_table = cuda.to_device(host)
    mapped = cuda.mapped_array(host.shape, dtype=host.dtype)
    mapped[...] = host
    ids = cuda.to_device(rng.integers(0, rows, count))
    out = cuda.device_array((count, host.shape[1]), dtype=host.dtype)
    nbytes = out.size * out.dtype.itemsize
    threads = 256
    blocks = min((count * 32 + threads - 1) // threads, 65_535 * 8)
    result = {"rows": rows, "row_bytes": dim * 4, "gathered_rows": count}
    for name, table in (("device", dev_table), ("pinned_uva", mapped)):
        gather[blocks, threads](table, ids, out)
        cuda.synchronize()
        want = host[ids.copy_to_host()]
        assert np.array_equal(out.copy_to_host(), want), name
        start = time.perf_counter()
        for _ in range(repeats):
            gather[blocks, threads](table, ids, out)
        cuda.synchronize()
        result[f"{name}_GBps"] = nbytes * repeats / (time.perf_counter() - start) / 1e9
    copy_src = cuda.device_array_like(out)
    start = time.perf_counter()
    for _ in range(repeats):
        out.copy_to_device(copy_src)
    cuda.synchronize()
    result["device_copy_GBps"] = nbytes * repeats / (time.perf_counter() - start) / 1e9
    return result


# ------------------------------------------------------------------------------------------- replay


def _replay_spec(obs: tuple[int, ...]):
    from replay import TrajectorySpec

    dtype = "uint8" if len(obs) > 1 else "float32"
    return TrajectorySpec({"obs": (obs, dtype), "action": ((), "int64"), "reward": ((), "float32"),
                           "done": ((), "bool")})


def _replay_store(spec, steps: int, shards: int, selector, seed: int, fill: int, open_last: bool):
    """A store of ``steps`` steps filled with ``fill`` steps of episodes of random lengths in [1, 300]
    (deterministic in ``seed``); shared memory when /dev/shm has room, else host memory."""
    from graphrl.memory import MemoryBudgetError, MemoryManager
    from replay import ReplayStore

    mm = MemoryManager()
    try:
        store = ReplayStore(spec, steps, shards, selector=selector, memory=mm, seed=seed, timeout=60.0)
        tier = "shared"
    except MemoryBudgetError:
        store = ReplayStore(spec, steps, shards, selector=selector, memory=mm, seed=seed, timeout=60.0,
                            tier="host")
        tier = "host"
    rng = np.random.default_rng(seed)
    writers = [store.writer() for _ in range(shards)]
    done = 0
    i = 0
    while done < fill:
        n = int(min(rng.integers(1, 301), fill - done))
        ep = {}
        for name, f in spec.items():
            if f.dtype == np.uint8:
                ep[name] = rng.integers(0, 256, (n, *f.shape), dtype=np.uint8)
            elif f.dtype == np.bool_:
                ep[name] = rng.random(n) < 0.5
            elif f.dtype == np.int64:
                ep[name] = rng.integers(-(2**40), 2**40, n)
            else:
                ep[name] = rng.standard_normal((n, *f.shape)).astype(f.dtype)
        w = writers[i % shards]
        w.extend(ep)
        done += n
        i += 1
        if open_last and fill - done < 300 * shards:
            w.flush()  # the last episodes stay open: windows stop at the write cursor
        else:
            w.end_episode()
    return store, mm, tier


def check_replay_equal(steps: int, shards: int, batches: int, seed: int) -> dict:
    """GPU batches against CPU batches (then copied) of an identical store, byte for byte."""
    from replay import Prioritized, Uniform

    spec = _replay_spec((3, 8, 8))
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the simulator's device memory is the CPU
    out = {"steps": steps, "shards": shards, "cases": 0, "equal": 0}
    for selector in (Uniform(), Prioritized(0.6)):
        made = [_replay_store(spec, steps, shards, selector, seed, int(steps * 2.5), True) for _ in range(2)]
        (cpu, mm_c, _), (gpu, mm_g, tier) = made
        for i in range(batches):
            b, length, pad = (64, 16, "tail") if i % 2 == 0 else (33, 50, "head")
            with cpu.sample(b, window=length, pad=pad, beta=0.4) as host:
                want = host.to(dev)
                got = gpu.sample(b, window=length, pad=pad, beta=0.4, device="cuda")
                same = all(torch.equal(want[n].view(torch.uint8), got[n].view(torch.uint8)) for n in spec)
                same &= all(torch.equal(getattr(want, a).cpu(), getattr(got, a).cpu())
                            for a in ("mask", "keys", "probabilities", "weights", "lengths"))
                same &= bool(got["obs"].device.type == dev)
                got.release()
                want.release()
            out["cases"] += 1
            out["equal"] += int(same)
        out["tier"] = tier
        for store, mm in ((cpu, mm_c), (gpu, mm_g)):
            store.close()
            mm.close()
    out["ok"] = out["equal"] == out["cases"]
    click.echo(f"  replay correctness: {out['equal']}/{out['cases']} GPU batches equal to the CPU ones",
               err=True)
    return out


def time_replay(obs: tuple[int, ...], steps: int, batch: int, window: int, repeats: int, seed: int,
                deadline: float) -> list[dict]:
    """windows/s and GB/s: GPU gather, CPU gather + copy, and a pinned-to-device copy of the same bytes."""
    from replay import Uniform

    spec = _replay_spec(obs)
    store, mm, tier = _replay_store(spec, steps, 1, Uniform(), seed, steps, False)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    step_bytes = sum(f.row_bytes for f in spec.values())
    label = f"replay obs {'x'.join(map(str, obs))} {spec['obs'].dtype.name} B{batch} L{window}"

    def gpu() -> int:
        with store.sample(batch, window=window, device="cuda") as b:
            sync()
            return int(b.lengths.sum())

    def cpu_then_copy() -> int:
        with store.sample(batch, window=window) as h:
            d = h.to(dev)
            sync()
            d.release()
            return int(h.lengths.sum())

    rows = []
    results = {}
    for name, fn in (("gpu_gather", gpu), ("cpu_gather_then_copy", cpu_then_copy)):
        fn()
        fn()  # warm-up: the kernel's JIT, the rings' registration, the staging pools
        real = 0
        start = time.perf_counter()
        done = 0
        for _ in range(repeats):
            real += fn()
            done += 1
            if time.perf_counter() > deadline:
                break
        dt = time.perf_counter() - start
        results[name] = {"windows_per_s": batch * done / dt,
                         "GBps": batch * window * step_bytes * done / dt / 1e9,
                         "real_step_share": real / (batch * window * done), "batches": done}
    nbytes = batch * window * step_bytes
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst.copy_(src, non_blocking=True)
    sync()
    start = time.perf_counter()
    n = max(1, min(repeats, 50))
    for _ in range(n):
        dst.copy_(src, non_blocking=True)
    sync()
    ceiling = nbytes * n / (time.perf_counter() - start) / 1e9
    base = results["cpu_gather_then_copy"]
    for name, r in results.items():
        rows.append({"case": f"{label} {name} ({tier} rings)", "metric": "windows_per_s",
                     "ours": r["windows_per_s"], "baseline": "cpu_gather_then_copy",
                     "baseline_value": base["windows_per_s"],
                     "ratio": r["windows_per_s"] / base["windows_per_s"], "GBps": r["GBps"],
                     "copy_ceiling_GBps": ceiling, "share_of_ceiling": r["GBps"] / ceiling,
                     "real_step_share": r["real_step_share"], "batches": r["batches"]})
        click.echo(f"  {label} {name}: {r['windows_per_s']:,.0f} windows/s, {r['GBps']:.2f} GB/s "
                   f"(pinned->device copy {ceiling:.2f} GB/s)", err=True)
    store.close()
    mm.close()
    return rows


def replay_part(result: dict, check_steps: int, check_batches: int, steps: int, batch: int, window: int,
                repeats: int, seed: int, seconds: float) -> bool:
    """Part 4 into ``result`` (``replay_correctness`` and rows); True when every GPU batch was equal."""
    t0 = time.perf_counter()
    result["replay_correctness"] = check_replay_equal(check_steps, 3, check_batches, seed)
    per_case = max((seconds - (time.perf_counter() - t0)) / 2, 5.0)
    for obs in ((3, 64, 64), (4,)):
        deadline = time.perf_counter() + per_case
        result["rows"] += time_replay(obs, steps, batch, window, repeats, seed, deadline)
    return result["replay_correctness"]["ok"]


def _print_replay(result: dict) -> None:
    click.echo(f"\n{'case':<72} {'windows/s':>10} {'GB/s':>7} {'ratio':>6} {'of copy':>8}")
    for row in result["rows"]:
        if row["metric"] == "windows_per_s":
            click.echo(f"{row['case']:<72} {row['ours']:>10,.0f} {row['GBps']:>7.2f} {row['ratio']:>6.2f} "
                       f"{row['share_of_ceiling']:>8.0%}")
    rc = result["replay_correctness"]
    click.echo(f"replay: {rc['equal']}/{rc['cases']} GPU batches byte-equal to CPU batches")


@click.command()
@click.option("--check-nodes", default=1_000_000, show_default=True, help="Nodes, correctness graph.")
@click.option("--check-edges", default=10_000_000, show_default=True, help="Edges, correctness graph.")
@click.option("--check-batches", default=3, show_default=True)
@click.option("--nodes", default=10_000_000, show_default=True, help="Nodes of the throughput graph.")
@click.option("--edges-per-node", default=20, show_default=True, help="In-edges per node (20: 200M edges).")
@click.option("--fanouts", default="15,10,5", show_default=True)
@click.option("--batch-size", default=1024, show_default=True)
@click.option("--batches", default=30, show_default=True, help="Timed batches per throughput case.")
@click.option("--feature-rows", default=4_000_000, show_default=True)
@click.option("--feature-dim", default=128, show_default=True, help="float32 features per row (even).")
@click.option("--replay-check-steps", default=3000, show_default=True, help="Replay equality store.")
@click.option("--replay-check-batches", default=6, show_default=True, help="Batches compared per selector.")
@click.option("--replay-steps", default=100_000, show_default=True, help="Replay throughput store.")
@click.option("--replay-batch", default=256, show_default=True)
@click.option("--replay-window", default=64, show_default=True)
@click.option("--replay-repeats", default=50, show_default=True, help="Timed batches per replay case.")
@click.option("--only-replay", is_flag=True, help="Run only part 4 (replay).")
@click.option("--only-sampler", is_flag=True, help="Run only parts 1 and 2 (sampling kernels).")
@click.option("--budget", default=240.0, show_default=True, help="Seconds the whole check aims to fit in.")
@click.option("--seed", default=0, show_default=True)
@click.option("--output", default=str(RESULTS), show_default=True, type=click.Path(dir_okay=False))
def main(check_nodes, check_edges, check_batches, nodes, edges_per_node, fanouts, batch_size, batches,
         feature_rows, feature_dim, replay_check_steps, replay_check_batches, replay_steps, replay_batch,
         replay_window, replay_repeats, only_replay, only_sampler, budget, seed, output) -> None:
    """Correctness and speed of the numba.cuda sampling kernels on a real GPU (see the module docstring)."""
    if not cuda.is_available():
        _no_gpu_exit()
    t0 = time.perf_counter()
    fans = [int(k) for k in fanouts.split(",")]
    simulator = bool(numba.config.ENABLE_CUDASIM)
    device = "simulator" if simulator else cuda.get_current_device().name
    device = device.decode() if isinstance(device, bytes) else str(device)
    click.echo(f"gpu_check on {device}", err=True)
    result = {"benchmark": "gpu_check", "machine": {
        "cpus": os.cpu_count(), "torch": torch.__version__.split("+")[0], "numba": numba.__version__,
        "cuda_device": device, "simulator": simulator, "python": platform.python_version()}, "rows": []}
    replay_args = (replay_check_steps, replay_check_batches, replay_steps, replay_batch, replay_window,
                   replay_repeats, seed)
    if only_replay:
        replay_ok = replay_part(result, *replay_args, seconds=budget)
        _print_replay(result)
        _write(result, t0, output)
        sys.exit(0 if replay_ok else 1)

    result["correctness"] = check_correctness(check_nodes, check_edges, fans, batch_size, check_batches, seed)
    click.echo(f"  correctness done at {time.perf_counter() - t0:.0f} s", err=True)
    hetero_part(result, max(check_nodes // 10, 50), batch_size, check_batches, seed)

    sampler_part(result, nodes, edges_per_node, fans, batch_size, batches, seed,
                 seconds=max(budget * 0.6 - (time.perf_counter() - t0), 20.0))
    if only_sampler:
        _print_sampler(result)
        _write(result, t0, output)
        sys.exit(0 if result["correctness"]["deterministic_ok"] else 1)
    gather = time_gather(feature_rows, feature_dim, min(feature_rows, 1_000_000), 10, seed)
    result["feature_gather"] = gather
    replay_ok = replay_part(result, *replay_args, seconds=max(budget - (time.perf_counter() - t0), 30.0))
    _print_sampler(result)
    click.echo(f"feature gather ({gather['row_bytes']} B rows): device {gather['device_GBps']:.1f} GB/s, "
               f"pinned host via UVA {gather['pinned_uva_GBps']:.1f} GB/s, "
               f"device copy {gather['device_copy_GBps']:.1f} GB/s")
    _print_replay(result)
    _write(result, t0, output)
    if not result["correctness"]["deterministic_ok"] or not replay_ok:
        sys.exit(1)


def _print_sampler(result: dict) -> None:
    click.echo(f"\n{'case':<80} {'M edges/s':>10}")
    for row in result["rows"]:
        if row["metric"] == "sampled_edges_per_s":
            click.echo(f"{row['case']:<80} {row['ours'] / 1e6:>10.1f}")
    click.echo(f"correctness: deterministic cases identical: {result['correctness']['deterministic_ok']}")


def _write(result: dict, t0: float, output: str) -> None:
    result["seconds"] = time.perf_counter() - t0
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    click.echo(f"total {result['seconds']:.0f} s; wrote {out}")

if __name__ == "__main__":
    main()

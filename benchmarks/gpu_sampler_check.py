"""Parts 1 and 2 of ``gpu_check.py``: the GPU neighbour-sampling kernels against the CPU, then their speed.

Part 1, `check_correctness`: on a power-law graph (1M nodes / 10M edges by default), fanouts
[15, 10, 5], batches of 1024, ``NeighborSampler(device="cuda")`` against the CPU sampler: uniform
without and with replacement and fanout -1 must give identical blocks; weighted draws report the share
of identical rows (GPU ``log`` may round differently in the last bit) and must keep the counting rules.

Part 2, `sampler_part`: sampled edges/s on a graph of every node 20 random in-edges (10M nodes / 200M
edges by default, int32 indices), fanouts [15, 10, 5], with the graph in device memory and read in
place from mapped (page-locked) host memory through UVA: the kernels alone (blocks stay on the
device; one synchronise per batch) and ``NeighborSampler.sample()`` end to end, uniform and weighted
(through UVA also at 8x the batch), ``NeighborLoader`` with batches in flight (`time_loader`), a
per-layer profile (`profile_layers`), the host-side steps a layer repeats (`overheads`), an experiment
on UVA at the larger batch (`_uva_capped`), and our CPU sampler on the same graph for scale.

Imported by ``gpu_check.py`` (run as a script); `sampler_part` appends its rows to the result dict.
"""

from __future__ import annotations

import time

import click
import numba
import numpy as np
import torch
from numba import cuda

from graphrl.cuda import launch_stream


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


def big_graph(n: int, per_node: int, seed: int, weights: bool = True):
    """Every node ``per_node`` uniformly random in-edges: indptr int64, indices int32, weights float32
    (None with ``weights=False``; indptr and indices are the same either way)."""
    rng = np.random.default_rng(seed)
    indptr = np.arange(n + 1, dtype=np.int64) * per_node
    indices = rng.integers(0, n, n * per_node, dtype=np.int32)
    return indptr, indices, rng.random(n * per_node, dtype=np.float32) if weights else None


def time_gpu(cuda_graph, n: int, fanouts: list[int], batch: int, batches: int, weighted: bool,
             seed: int, deadline: float) -> dict:
    from samplers.kernels import cuda as ck
    from samplers.kernels.cuda.bounded import DegreeBound
    from samplers.kernels.cuda.layer import ChainOverflow, bounded_layer, read_blocks, start_rows
    from samplers.kernels.cuda.workspace import CudaWorkspace
    from samplers.kernels.reference import layer_key

    rng = np.random.default_rng(seed)
    seeds = [cuda.to_device(rng.integers(0, n, batch)) for _ in range(batches + 2)]
    ws = CudaWorkspace()  # as a sampler's: scratch reused, one read-back per batch (layers chained)
    chained = all(bounded_layer(cuda_graph, f, weighted) for f in fanouts)
    degrees = DegreeBound.of(cuda_graph.indptr.copy_to_host())  # fanout -1 layers' capacity

    def one_batch(s, call: int, chain: bool = chained) -> int:
        if not chain:  # a layer that reads its sizes back (weighted at fanout -1), or an overflowed chain
            dst, sampled = s, 0
            for layer in range(len(fanouts) - 1, -1, -1):
                _, dst, local, _ = ck.sample_block_cuda(cuda_graph, dst, fanouts[layer], False,
                                                        layer_key(seed, call, layer), weighted, ws=ws)
                sampled += local.shape[0]
            return sampled
        rows, pending = start_rows(s, ws, len(fanouts)), []
        for layer in range(len(fanouts) - 1, -1, -1):
            pending.append(ck.sample_block_cuda(cuda_graph, rows, fanouts[layer], False,
                                                layer_key(seed, call, layer), weighted, ws=ws,
                                                degrees=degrees))
            rows = pending[-1].next_rows
        try:
            return sum(int(block[2].shape[0]) for block in read_blocks(pending, ws))
        except ChainOverflow:  # past a fanout -1 layer's capacity: sampled again unchained, as a sampler does
            return one_batch(s, call, chain=False)

    edges = 0
    for call, s in enumerate(seeds[:2]):  # warm-up: JIT of every kernel
        one_batch(s, call)
    cuda.synchronize()
    start = time.perf_counter()
    done = 0
    for call, s in enumerate(seeds[2:]):
        edges += one_batch(s, call + 2)
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


@cuda.jit
def _touch(a, b, c, d):  # pragma: no cover - device; the cheapest kernel of four array arguments
    i = cuda.grid(1)
    if i == 0 and a.shape[0] + b.shape[0] + c.shape[0] + d.shape[0] < 0:
        a[0] = 0


def overheads(cuda_graph, n: int, repeats: int, seed: int) -> dict:
    """Microseconds of the host-side steps a layer repeats, each without a synchronise between repeats:
    a device array from the pool (``empty``), a launch through numba's dispatcher (a trivial kernel of
    four array arguments), one whole uniform layer of 1024 rows (``sample_layer_cuda``: its planning,
    scan and choose launches through the library's launcher), the same layer sampled and relabelled
    through a sampler's workspace (``sample_block_cuda(..., ws=)``: one read-back), a scan with its
    read-back, an empty synchronise."""
    from samplers.kernels import cuda as ck
    from samplers.kernels.cuda.workspace import CudaWorkspace
    from samplers.kernels.reference import layer_key

    rng = np.random.default_rng(seed + 3)
    dst = cuda.to_device(rng.integers(0, n, 1024))
    counts = cuda.to_device(np.full(1024, 3, dtype=np.int64))
    arrays = [cuda.to_device(np.zeros(1024, dtype=np.int64)) for _ in range(4)]
    stream = launch_stream("cuda")
    key = layer_key(seed, 0, 0)
    ws = CudaWorkspace()
    steps = {
        "empty": lambda: ck.empty(4096, np.int64),
        "launch_numba_dispatcher": lambda: _touch[8, 128, stream](*arrays),
        "sample_layer_1024_rows": lambda: ck.sample_layer_cuda(cuda_graph, dst, 10, False, key),
        "block_1024_rows_one_readback": lambda: ck.sample_block_cuda(cuda_graph, dst, 10, False, key, ws=ws),
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


def _uva_capped(result: dict, graph, label: str, nodes: int, fans: list[int], batch_size: int, batches: int,
                seed: int, per_case: float) -> None:
    """An experiment on why UVA kernels slow down at the larger batch: the b8192 kernels with every
    grid capped at the blocks the b1024 batch's widest layer launches, so as many host-memory reads are
    in flight as at b1024 (the kernels stride over the rest). If the rate comes back, the slowdown is
    the concurrency of reads of mapped host memory (translation misses), not the host steps."""
    import importlib

    # the module (the package's ``launch`` attribute is the function of that name)
    launch_mod = importlib.import_module("samplers.kernels.cuda.launch")

    widest = batch_size
    for k in fans[1:]:
        widest *= 1 + k
    cap = -(-widest // launch_mod.ROW_THREADS)
    saved = launch_mod.MAX_ROW_BLOCKS
    launch_mod.MAX_ROW_BLOCKS = cap
    try:
        deadline = time.perf_counter() + per_case
        row = time_gpu(graph, nodes, fans, 8 * batch_size, batches, False, seed, deadline)
    finally:
        launch_mod.MAX_ROW_BLOCKS = saved
    case = f"{label} b{8 * batch_size} kernels uva grid<={cap} (experiment)"
    result["rows"].append({"case": case, "metric": "sampled_edges_per_s", "ours": row["sampled_edges_per_s"],
                           "max_blocks": cap, **row})
    click.echo(f"  {case}: {row['sampled_edges_per_s'] / 1e6:.1f} M edges/s", err=True)


def time_loader(indptr, indices, n: int, fanouts: list[int], batch: int, batches: int, seed: int,
                deadline: float) -> dict:
    """``NeighborLoader`` over a ``NeighborSampler(device="cuda")`` with batches in flight (prefetch 2: a
    thread samples on the loader's side stream while the caller takes batches; host seeds staged through
    page-locked memory), each batch waited for on the caller's stream as a trainer would; edges/s and
    the sampler's `HostTraffic` per batch (read-backs, scratch allocations)."""
    from graphrl.graph import CSCGraph
    from samplers.loader import NeighborLoader
    from samplers.neighbor import NeighborSampler

    graph = CSCGraph(indptr=torch.from_numpy(indptr), indices=torch.from_numpy(indices))
    sampler = NeighborSampler(graph, fanouts, seed=seed, device="cuda")
    rng = np.random.default_rng(seed + 4)
    train = torch.from_numpy(rng.choice(n, size=min(n, batch * (batches + 2)), replace=False))
    loader = NeighborLoader(graph, train, batch_size=batch, sampler=sampler, seed=seed, prefetch=2)
    edges = done = 0
    it = iter(loader)
    for _ in range(2):  # warm-up: compilation, workspaces
        next(it)
    traffic = sampler.loop.traffic.snapshot()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else cuda.synchronize
    sync()
    start = time.perf_counter()
    for b in it:
        edges += sum(blk.num_edges for blk in b.blocks)
        if torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()  # the batch is ready on the caller's stream
        done += 1
        if time.perf_counter() > deadline:
            break
    dt = time.perf_counter() - start
    it.close()
    used = sampler.loop.traffic.since(traffic)
    per = max(done, 1)
    return {"sampled_edges_per_s": edges / dt, "batches": done, "ms_per_batch": dt / per * 1e3,
            "readbacks_per_batch": used.readbacks / per,
            "scratch_allocations_per_batch": used.scratch_allocations / per}


def sampler_part(result: dict, nodes: int, edges_per_node: int, fans: list[int], batch_size: int,
                 batches: int, seed: int, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """Part 2: throughput of the kernels and of the sampler API, device and UVA, uniform and weighted; a
    per-layer profile; our CPU sampler on the same graph for scale. Returns the graph's ``(indptr,
    indices)`` (`big_graph`), for `labor_part`."""
    from samplers.kernels import cuda as ck

    indptr, indices, weights = big_graph(nodes, edges_per_node, seed)
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
        if placement == "uva" and not sim:
            _uva_capped(result, graph, label, nodes, fans, batch_size, batches, seed, per_case)
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
        api_cases = [(False, batch_size), (True, batch_size)]
        if placement == "uva" and not sim:  # issue 27: UVA never slower at the larger batch, sample() too
            api_cases.append((False, 8 * batch_size))
        for weighted, batch in api_cases:
            deadline = time.perf_counter() + per_case
            row = time_sampler_api(indptr, indices, weights, nodes, fans, batch, batches,
                                   placement == "uva", weighted, seed, deadline)
            case = f"{label} b{batch} sample() {placement}{' weighted' if weighted else ''}"
            result["rows"].append({"case": case, "metric": "sampled_edges_per_s",
                                   "ours": row["sampled_edges_per_s"], **row})
            click.echo(f"  {case}: {row['sampled_edges_per_s'] / 1e6:.1f} M edges/s, "
                       f"{row['ms_per_batch']:.2f} ms/batch", err=True)
        if placement == "device":
            deadline = time.perf_counter() + per_case
            row = time_loader(indptr, indices, nodes, fans, batch_size, batches, seed, deadline)
            case = f"{label} b{batch_size} loader in flight device"
            result["rows"].append({"case": case, "metric": "sampled_edges_per_s",
                                   "ours": row["sampled_edges_per_s"], **row})
            click.echo(f"  {case}: {row['sampled_edges_per_s'] / 1e6:.1f} M edges/s, "
                       f"{row['ms_per_batch']:.2f} ms/batch, read-backs/batch "
                       f"{row['readbacks_per_batch']:.1f}, scratch allocations/batch "
                       f"{row['scratch_allocations_per_batch']:.2f}", err=True)
    cpu = time_cpu(indptr, indices, nodes, fans, batch_size, min(batches, 10), seed)
    result["rows"].append({"case": f"{label} b{batch_size} cpu (ours, {cpu['threads']} threads)",
                           "metric": "sampled_edges_per_s", "ours": cpu["sampled_edges_per_s"]})
    return indptr, indices


def labor_part(result: dict, n: int, e: int, fans: list[int], batch: int, batches: int, seed: int,
               big: tuple | None = None, seconds: float = 15.0) -> None:
    """LABOR on the GPU into ``result["labor"]`` and its rows: ``LaborSampler(device="cuda")`` against the
    CPU sampler on the power-law check graph (LABOR-0, LABOR-1, weighted, layer dependency with
    exclusions: identical blocks and edge weights, folded into ``result["correctness"]``), then
    ``sample()`` edges/s at ``batch`` on the part-2 graph ``big`` = (indptr, indices), device copy."""
    from graphrl.datasets.synthetic import synthetic_graph
    from graphrl.graph import CSCGraph
    from samplers import LaborSampler

    t_start = time.perf_counter()
    graph = synthetic_graph(n, e, "powerlaw", seed=seed)
    rng = np.random.default_rng(seed + 5)
    w = torch.from_numpy(rng.random(graph.num_edges).astype(np.float32))
    cases = {"labor-0": {}, "labor-1": {"importance_sampling": 1}, "weighted": {"weights": w},
             "layer-dep excluded": {"layer_dependency": True}}
    out = {}
    for name, kw in cases.items():
        cpu_s, gpu_s = (LaborSampler(graph, fans, seed=seed, device=d, **kw) for d in ("cpu", "cuda"))
        equal = 0
        for _ in range(batches):
            seeds = torch.from_numpy(rng.integers(0, n, batch))
            ex = None
            if "layer_dependency" in kw:
                ex = torch.from_numpy(rng.integers(0, graph.num_edges, 1000))
            a, b = cpu_s.sample(seeds, exclude_eids=ex), gpu_s.sample(seeds, exclude_eids=ex)
            weights_same = all((x.edge_weights is None and y.edge_weights is None)
                               or torch.equal(x.edge_weights.cpu(), y.edge_weights.cpu())
                               for x, y in zip(a, b, strict=True))
            equal += _blocks_equal(a, b) and weights_same
        out[name] = {"identical_batches": equal, "batches": batches}
        click.echo(f"  labor correctness {name:<19} identical batches {equal}/{batches}", err=True)
    out["deterministic_ok"] = all(out[k]["identical_batches"] == batches for k in cases)
    if "correctness" in result:  # part 1 ran
        result["correctness"]["deterministic_ok"] &= out["deterministic_ok"]
    if big is not None:
        indptr, indices = big
        g = CSCGraph(indptr=torch.from_numpy(indptr), indices=torch.from_numpy(indices))
        sampler = LaborSampler(g, fans, seed=seed, device="cuda")
        where = "cuda" if torch.cuda.is_available() else "cpu"
        seeds = [torch.from_numpy(rng.integers(0, g.num_nodes, batch)).to(where) for _ in range(batches + 2)]
        for s in seeds[:2]:
            sampler.sample(s)
        cuda.synchronize()
        deadline = time.perf_counter() + max(seconds - (time.perf_counter() - t_start), 2.0)
        edges = done = 0
        start = time.perf_counter()
        for s in seeds[2:]:
            edges += sum(b.num_edges for b in sampler.sample(s))
            cuda.synchronize()
            done += 1
            if time.perf_counter() > deadline:
                break
        rate = edges / (time.perf_counter() - start)
        label = f"uniform-degree {g.num_nodes / 1e6:g}M/{g.num_edges / 1e6:g}M {fans}"
        case = f"{label} b{batch} labor sample() device"
        out["sample_edges_per_s"] = rate
        result["rows"].append({"case": case, "metric": "sampled_edges_per_s", "ours": rate, "batches": done})
        click.echo(f"  {case}: {rate / 1e6:.1f} M edges/s", err=True)
    out["seconds"] = time.perf_counter() - t_start
    result["labor"] = out

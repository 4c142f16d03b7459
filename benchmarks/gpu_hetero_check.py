"""Part 5 of ``gpu_check.py``: the GPU ``HeteroNeighborSampler`` against the CPU sampler, then its speed.

`hetero_part` runs right after part 1 (about 15 s): on a synthetic user/item graph (``--check-nodes /
10`` nodes, 100k by default) uniform draws without and with replacement (with excluded edges),
weights with fanout -1 and temporal draws must give the CPU's blocks (counted in part 1's
``deterministic_ok``); then sampled edges/s of ``sample()`` on the device and on the CPU, uniform and with
weights on one relation (both through the fused typed path, `samplers.kernels.cuda.typed`), and the fused
path's launches per kernel and layer (target: 1 each, whatever the number of relations).

Imported by ``gpu_check.py`` (run as a script).
"""

from __future__ import annotations

import time

import click
import numpy as np
import torch
from numba import cuda


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
    next) on the device and on the CPU (all its cores), uniform and with clicks weighted, within about
    ``seconds``; ``launches_per_layer``: the device sampler's fused launches per kernel and layer."""
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
    for weighted, device in ((False, "cuda"), (False, "cpu"), (True, "cuda"), (True, "cpu")):
        kind = "weighted " if weighted else ""
        sampler = HeteroNeighborSampler(graph, fans, seed=seed, device=device,
                                        weights={clicks: w} if weighted else None)
        seeds = [{"user": torch.from_numpy(rng.integers(0, users, batch)),
                  "item": torch.from_numpy(rng.integers(0, items, batch // 2))}
                 for _ in range(4 * batches + 1)]
        sampler.sample(seeds[0])  # warm-up (JIT)
        sync()
        before, done = sampler.sampled_edges, 0
        start = time.perf_counter()
        deadline = start + left / 4
        for s in seeds[1:]:
            sampler.sample(s)
            sync()
            done += 1
            if time.perf_counter() > deadline:
                break
        dt = time.perf_counter() - start
        rate = (sampler.sampled_edges - before) / dt
        prefix = "weighted_" if weighted else ""
        out[f"{prefix}{device}_sampled_edges_per_s"] = rate
        out[f"{prefix}{device}_ms_per_batch"] = dt / done * 1e3
        case = f"hetero {out['graph']} {fans} b{batch}+{batch // 2} {kind}sample() {device}"
        result["rows"].append({"case": case, "metric": "sampled_edges_per_s", "ours": rate, "batches": done})
        click.echo(f"  hetero {kind}sample() {device}: {rate / 1e6:.2f} M edges/s, "
                   f"{dt / done * 1e3:.1f} ms/batch", err=True)
        if device == "cuda":  # every sample() so far (the warm-up included): len(fans) layers each
            layers = (done + 1) * len(fans)
            out[f"{prefix}launches_per_layer"] = {
                k: v / layers for k, v in sampler.launches.items()}
    out["seconds"] = time.perf_counter() - t_start
    result["hetero"] = out
    if "correctness" in result:  # part 1 ran
        result["correctness"]["deterministic_ok"] &= out["deterministic_ok"]


def hetero_targets(result: dict) -> list[dict]:
    """Part 5's rows of ``gpu_check.py``'s closing table (beside its uniform typed-graph ratio): the weighted
    typed graph's ``sample()`` on the GPU over our CPU sampler (issue 27: >= 3x), and the fused typed path's
    launches per kernel and layer (1 each: one plan, one scan, one choose-and-gather launch per layer over
    all relations). Rows with ``met`` None where part 5 did not run."""
    het = result.get("hetero") or {}
    gpu, cpu = het.get("weighted_cuda_sampled_edges_per_s"), het.get("weighted_cpu_sampled_edges_per_s")
    out = [{"figure": "typed graph weighted sample(): GPU over our CPU sampler", "target": ">= 3x",
            "value": "n/a" if not (gpu and cpu) else f"{gpu / cpu:.2f}x",
            "met": None if not (gpu and cpu) else gpu >= 3 * cpu}]
    per = {name: het[f"{prefix}launches_per_layer"]
           for name, prefix in (("uniform", ""), ("weighted", "weighted_"))
           if f"{prefix}launches_per_layer" in het}
    value = "; ".join(f"{name} " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(d.items()))
                      for name, d in per.items())
    met = all(d == {"plan": 1.0, "rows": 1.0, "scan": 1.0} for d in per.values())
    out.append({"figure": "typed graph: fused launches per kernel and layer",
                "target": "plan, scan, rows 1 each", "value": value or "n/a", "met": met if per else None})
    return out

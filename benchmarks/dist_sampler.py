"""DistNeighborSampler and DistFeatureStore on Ray owners against single-process sampling, same run.

The power-law graph of `graphrl.datasets.synthetic_graph` (1M nodes / 20M edges by default) with
float32 features is split into ``--parts`` parts (`graphrl.partition.write_partitions`), each served by a
Ray actor (`samplers.distributed.RayOwners`) on this machine. Each batch of ``--batch`` seeds is sampled
by `NeighborSampler` on the whole graph (features gathered from one tensor: the single-process baseline)
and by `DistNeighborSampler` (features from `DistFeatureStore` with a hot-row cache), alternately, so
both see the same load; every distributed batch is checked identical to the baseline's.

Rows: sampled edges/s (sampling alone, and sampling + features), ``ratio`` = distributed / single
process; bytes and requests per batch; the cache's hit rate. What limits it, per batch (``limits``):
``wait_s`` (waiting for owners) split into the owners' kernel seconds (``owner_kernel_s``, the slowest
owner per layer summed, and all owners'), the engine's round trips (requests x a measured empty round
trip), and serialization (a ``ray.put`` + ``ray.get`` of the same reply bytes); ``assemble_s`` (the
trainer's copies back into frontier order) and ``relabel_s``.

    python benchmarks/dist_sampler.py                       # 1M / 20M, 4 parts, [15, 10, 5], B=1024
    python benchmarks/dist_sampler.py --size 200000,4000000 --batches 10

Results go to ``benchmarks/results/dist_sampler.json``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import torch

from graphrl.datasets import synthetic_graph
from graphrl.partition import graph_fingerprint, write_partitions
from samplers import NeighborSampler
from samplers.distributed import DistFeatureStore, DistNeighborSampler, RayOwners

sys.path.append(str(Path(__file__).resolve().parent))
from _report import machine, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "dist_sampler.json"


def _same(a, b) -> bool:
    return all(torch.equal(x.src_nodes, y.src_nodes) and torch.equal(x.indices, y.indices)
               and torch.equal(x.edge_ids, y.edge_ids) and torch.equal(x.indptr, y.indptr)
               for x, y in zip(a, b, strict=True))


def _delta(before: dict, after: dict, key: str) -> float:
    """The sum over owners of a counter's growth."""
    return sum(after[p][key] - before[p][key] for p in after)


def _round_trip(owners, repeats: int = 50) -> float:
    """Median seconds of an empty request to owner 0 (the engine's round trip alone)."""
    import ray

    actor = owners.actors[0]
    ray.get(actor.counters.remote())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ray.get(actor.counters.remote())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _serialization(nbytes: int, repeats: int = 10) -> float:
    """Median seconds of ray.put + ray.get of ``nbytes`` in three int64 arrays (a reply's shape)."""
    import ray

    arrays = [np.zeros(max(nbytes // 24, 1), dtype=np.int64) for _ in range(3)]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ray.get(ray.put(arrays))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@click.command()
@click.option("--size", default="1000000,20000000", show_default=True, help="NODES,EDGES.")
@click.option("--parts", default=4, show_default=True)
@click.option("--method", type=click.Choice(["auto", "metis", "ldg"]), default="ldg", show_default=True)
@click.option("--fanouts", default="15,10,5", show_default=True)
@click.option("--batch", default=1024, show_default=True)
@click.option("--batches", default=20, show_default=True)
@click.option("--dim", default=32, show_default=True, help="Feature columns (float32).")
@click.option("--cache-rows", default=50_000, show_default=True, help="Hot rows cached by the trainer.")
@click.option("--owner-threads", default=1, show_default=True, help="Kernel threads of each owner.")
@click.option("--folder", default=None, help="Partition folder to write (default: a temporary one).")
@click.option("--seed", default=0, show_default=True)
@click.option("--output", default=str(RESULTS), show_default=True)
def main(size, parts, method, fanouts, batch, batches, dim, cache_rows, owner_threads, folder, seed,
         output) -> None:
    """Distributed against single-process sampling and feature gathering on this machine."""
    import ray

    n, e = (int(x) for x in size.split(","))
    fan = [int(x) for x in fanouts.split(",")]
    info = machine(uptime_at_start=os.getloadavg())
    t0 = time.perf_counter()
    graph = synthetic_graph(n, e, "powerlaw", seed=seed)
    feats = torch.from_numpy(np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32))
    tmp = None
    if folder is None:
        tmp = tempfile.mkdtemp(prefix="dist_sampler-")
        folder = os.path.join(tmp, "parts")
    t1 = time.perf_counter()
    body = write_partitions(graph, folder, parts, method=method, seed=seed, features=feats)
    t_part = time.perf_counter() - t1
    click.echo(f"graph {time.perf_counter() - t0 - t_part:.1f} s, partition ({body['method']}) "
               f"{t_part:.1f} s: edges per part {body['balance']['edges']}, "
               f"cut {body['balance']['cut_fraction']:.3f}")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        owners = RayOwners(folder, expect=graph_fingerprint(graph), threads=owner_threads)
        ref = NeighborSampler(graph, fan, seed=seed)
        dist = DistNeighborSampler(owners, fan, seed=seed)
        store = DistFeatureStore(owners, cache_rows=cache_rows)
        rng = np.random.default_rng(seed + 1)
        seeds = [torch.from_numpy(rng.integers(0, n, batch)) for _ in range(batches + 1)]
        warm = ref.sample(seeds[0])  # warm-up: compilation, the owners' first calls
        identical = _same(warm, dist.sample(seeds[0]))
        store.fetch(warm[0].src_nodes)
        stats0 = (owners.stats.requests, owners.stats.bytes_sent, owners.stats.bytes_received)
        prof0 = (dist.profile.wait_s, dist.profile.assemble_s, dist.profile.relabel_s)
        kern0 = owners.counters()
        fetch0 = (store.stats.hits, store.stats.misses, store.stats.requests, store.stats.bytes_moved)
        t_ref = t_ref_feat = t_dist = t_dist_feat = driver_cpu = 0.0
        edges = 0
        slowest = 0.0
        for s in seeds[1:]:
            a0 = time.perf_counter()
            a = ref.sample(s)
            a1 = time.perf_counter()
            x_ref = feats[a[0].src_nodes]
            a2 = time.perf_counter()
            k_before = owners.counters()
            b0, c0 = time.perf_counter(), time.process_time()
            b = dist.sample(s)
            b1 = time.perf_counter()
            driver_cpu += time.process_time() - c0
            x_dist = store.fetch(b[0].src_nodes)
            b2 = time.perf_counter()
            k_after = owners.counters()
            slowest += max(k_after[p]["sample_s"] - k_before[p]["sample_s"] for p in k_after)
            identical &= _same(a, b) and torch.equal(x_ref, x_dist)
            edges += sum(x.num_edges for x in a)
            t_ref += a1 - a0
            t_ref_feat += a2 - a0
            t_dist += b1 - b0
            t_dist_feat += b2 - b0
        kern1 = owners.counters()
        per = float(batches)
        requests = (owners.stats.requests - stats0[0]) / per
        sent = (owners.stats.bytes_sent - stats0[1]) / per
        received = (owners.stats.bytes_received - stats0[2]) / per
        hits, misses = store.stats.hits - fetch0[0], store.stats.misses - fetch0[1]
        feat_requests = (store.stats.requests - fetch0[2]) / per
        feat_bytes = (store.stats.bytes_moved - fetch0[3]) / per
        sampler_requests = requests - feat_requests
        rt = _round_trip(owners)
        ser = _serialization(int(received - feat_bytes))
        limits = {
            "per_batch_s": t_dist / per,
            "wait_s": (dist.profile.wait_s - prof0[0]) / per,
            "assemble_s": (dist.profile.assemble_s - prof0[1]) / per,
            "relabel_s": (dist.profile.relabel_s - prof0[2]) / per,
            "owner_kernel_all_s": _delta(kern0, kern1, "sample_s") / per,
            "owner_kernel_slowest_s": slowest / per,
            "owner_kernel_cpu_s": _delta(kern0, kern1, "sample_cpu_s") / per,
            "round_trip_s": rt, "round_trips_s": rt * sampler_requests,
            "serialization_s": ser, "single_process_per_batch_s": t_ref / per,
            "driver_cpu_s": driver_cpu / per,
        }
    finally:
        ray.shutdown()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    case = f"power-law {n}/{e} {fan} b{batch}, {parts} Ray owners"
    base = f"NeighborSampler, 1 process ({os.cpu_count()} cores)"
    rows = [
        {"case": case, "metric": "sampled_edges_per_s", "ours": edges / t_dist, "baseline": base,
         "baseline_value": edges / t_ref, "ratio": t_ref / t_dist},
        {"case": case + f", features {dim} x float32, cache {cache_rows}", "metric": "sampled_edges_per_s",
         "ours": edges / t_dist_feat, "baseline": base + " + feature gather",
         "baseline_value": edges / t_ref_feat, "ratio": t_ref_feat / t_dist_feat},
        {"case": case, "metric": "sampler_bytes_per_batch", "ours": sent + received - feat_bytes,
         "requests_per_batch": sampler_requests, "sampled_edges_per_batch": edges / per},
        {"case": case, "metric": "feature_bytes_per_batch", "ours": feat_bytes,
         "hit_rate": hits / max(hits + misses, 1), "requests_per_batch": feat_requests},
    ]
    click.echo(f"identical blocks and features: {identical}; load {os.getloadavg()[0]:.1f}")
    for r in rows:
        extra = f"  baseline {r['baseline_value']:.4g}  ratio {r['ratio']:.2f}" if "ratio" in r else ""
        click.echo(f"{r['metric']:<26}{r['ours']:>12.4g}{extra}   {r['case']}")
    click.echo("limits per batch: " + ", ".join(f"{k} {v:.4g}" for k, v in limits.items()))
    write_result("dist_sampler", rows, info, output, identical=bool(identical), limits=limits,
                 partition={"method": body["method"], "balance": body["balance"], "seconds": t_part},
                 load_at_end=os.getloadavg())


if __name__ == "__main__":
    main()

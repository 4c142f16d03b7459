"""DistNeighborSampler and DistFeatureStore on Ray owners against single-process sampling, same run.

The power-law graph of `graphrl.datasets.synthetic_graph` (1M nodes / 20M edges by default) with
float32 features is split into ``--parts`` parts (`graphrl.partition.write_partitions`), each served by a
Ray actor (`samplers.distributed.RayOwners`) on this machine. Every batch is first checked, untimed,
identical to the baseline's (blocks and feature rows). Then the batches are sampled in rounds, each
round in turn by `NeighborSampler` on the whole graph (with features gathered from one tensor: the
single-process baselines), by `DistNeighborSampler.sample_many` (``--per-request`` batches a request,
``--in-flight`` groups at once; features from `DistFeatureStore` with a hot-row cache), and by
`DistNeighborSampler.sample` (one batch a call), so all see the same load; each timed loop takes one
batch at a time and drops it, as a training loop does.

Rows: sampled edges/s (``ratio`` = distributed / single process, wall time) and CPU seconds per batch
(``cpu_ratio`` = single process / distributed: the trainer's process plus every process of the Ray
session, owners and Ray's daemons; on a machine shared with other work the CPU ratio is the steadier
one); bytes and requests per batch; the cache's hit rate. What limits it, per batch (``limits``, one
batch a call): waiting for owners, the owners' kernel seconds, the engine's round trips (requests x a
measured empty round trip), serialization (a ``ray.put`` + ``ray.get`` of the reply bytes), and the
trainer's assembling and relabelling; and the CPU seconds of each side. This process (the trainer and the
baseline) runs with the owners' allocator settings (`samplers.distributed.OWNER_ENV`, through ``mallopt``)
unless ``--no-trainer-malloc``.

    python benchmarks/dist_sampler.py                       # 1M / 20M, 4 parts, [15, 10, 5], B=1024
    python benchmarks/dist_sampler.py --size 200000,4000000 --batches 12 --rounds 2

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
import psutil
import torch

from graphrl.datasets import synthetic_graph
from graphrl.partition import PartitionError, graph_fingerprint, load_book, write_partitions
from samplers import NeighborSampler
from samplers.distributed import OWNER_ENV, DistFeatureStore, DistNeighborSampler, RayOwners

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


class _Clock:
    """Wall seconds, this process's CPU seconds and the Ray session's (every process this one started:
    owners, raylet, GCS, ...) over timed stretches, summed."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.session_cpu = 0.0
        self._me = psutil.Process()

    def _session(self) -> float:
        total = 0.0
        for p in self._me.children(recursive=True):
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:  # a process that ended meanwhile
                pass
        return total

    def __enter__(self) -> _Clock:
        self._t = (time.perf_counter(), time.process_time(), self._session())
        return self

    def __exit__(self, *exc) -> None:
        t0, c0, s0 = self._t
        self.wall += time.perf_counter() - t0
        self.cpu += time.process_time() - c0
        self.session_cpu += self._session() - s0


def _reuse_freed_pages() -> bool:
    """Give this process the owners' glibc allocator settings (`OWNER_ENV`) through ``mallopt``, so that
    freed block arrays are reused rather than handed back and faulted in again; False where the C
    library has no ``mallopt`` (not glibc). The single-process baseline runs under them too."""
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, int(OWNER_ENV["MALLOC_MMAP_THRESHOLD_"]))
                and mallopt(m_trim_threshold, int(OWNER_ENV["MALLOC_TRIM_THRESHOLD_"])))


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
@click.option("--batches", default=128, show_default=True, help="Timed batches, split into --rounds.")
@click.option("--rounds", default=2, show_default=True,
              help="Rounds; each runs every sampler in turn (keep --per-request x --in-flight batches in "
                   "a round, so that the groups overlap).")
@click.option("--per-request", default=32, show_default=True, help="Batches a request of sample_many.")
@click.option("--in-flight", default=2, show_default=True, help="Groups in flight in sample_many.")
@click.option("--dim", default=32, show_default=True, help="Feature columns (float32).")
@click.option("--cache-rows", default=50_000, show_default=True, help="Hot rows cached by the trainer.")
@click.option("--owner-threads", default=1, show_default=True, help="Kernel threads of each owner.")
@click.option("--folder", default=None,
              help="Partition folder: reused if it holds this graph, else written (default: a temporary).")
@click.option("--seed", default=0, show_default=True)
@click.option("--trainer-malloc/--no-trainer-malloc", default=True, show_default=True,
              help="This process (trainer and baseline) with the owners' allocator settings (OWNER_ENV).")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(size, parts, method, fanouts, batch, batches, rounds, per_request, in_flight, dim, cache_rows,
         owner_threads, folder, seed, trainer_malloc, output) -> None:
    """Distributed against single-process sampling and feature gathering on this machine."""
    import ray

    if trainer_malloc and not _reuse_freed_pages():
        click.echo("--trainer-malloc: this C library has no mallopt; running with its defaults")
        trainer_malloc = False

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
    try:
        body = load_book(folder, graph_fingerprint(graph)).manifest
        if body["num_parts"] != parts or body["features"] != ["float32", [dim]]:
            raise click.UsageError(f"--folder {folder} holds {body['num_parts']} parts with features "
                                   f"{body['features']}, not --parts {parts} --dim {dim}: choose another")
        click.echo(f"reusing the partition folder {folder}")
    except PartitionError:
        body = write_partitions(graph, folder, parts, method=method, seed=seed, features=feats)
    t_part = time.perf_counter() - t1
    click.echo(f"graph {time.perf_counter() - t0 - t_part:.1f} s, partition ({body['method']}) "
               f"{t_part:.1f} s: edges per part {body['balance']['edges']}, "
               f"cut {body['balance']['cut_fraction']:.3f}")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        owners = RayOwners(folder, expect=graph_fingerprint(graph), threads=owner_threads)
        rng = np.random.default_rng(seed + 1)
        seeds = [torch.from_numpy(rng.integers(0, n, batch)) for _ in range(batches + 1)]

        def samplers():  # fresh ones: call k of each is batch k
            return NeighborSampler(graph, fan, seed=seed), DistNeighborSampler(owners, fan, seed=seed)

        store = DistFeatureStore(owners, cache_rows=cache_rows)
        ref, one = samplers()
        warm = ref.sample(seeds[0])  # warm-up: compilation, the owners' first calls
        identical = _same(warm, one.sample(seeds[0]))
        store.fetch(warm[0].src_nodes)
        ref, many = samplers()
        one = DistNeighborSampler(owners, fan, seed=seed)
        for s, b in zip(seeds[1:], many.sample_many(seeds[1:], per_request, in_flight), strict=True):
            a = ref.sample(s)  # untimed check of every batch, one at a time
            identical &= _same(a, b) and _same(a, one.sample(s))
            identical &= torch.equal(store.fetch(b[0].src_nodes), feats[a[0].src_nodes])
        ref, many = samplers()
        ref_feat, many_feat = samplers()
        one = DistNeighborSampler(owners, fan, seed=seed)
        prof0 = (one.profile.wait_s, one.profile.assemble_s)
        fetch0 = (store.stats.hits, store.stats.misses, store.stats.requests, store.stats.bytes_moved)
        clocks = {k: _Clock() for k in ("ref", "ref_feat", "many", "many_feat", "one")}
        traffic = {k: [0, 0] for k in ("many", "one")}  # requests, bytes

        def counted(name: str, fn):
            r0, b0 = owners.stats.requests, owners.stats.bytes_sent + owners.stats.bytes_received
            out = fn()
            traffic[name][0] += owners.stats.requests - r0
            traffic[name][1] += owners.stats.bytes_sent + owners.stats.bytes_received - b0
            return out

        def drain(stream, features: bool = False) -> int:
            got = 0
            for b in stream:
                got += 1
                if features:
                    store.fetch(b[0].src_nodes)
            return got

        one_kernel = {"sample_s": 0.0, "sample_cpu_s": 0.0, "process_cpu_s": 0.0}
        edges = 0
        slowest = 0.0
        loads = []
        for r in range(rounds):
            part = seeds[1 + r * batches // rounds: 1 + (r + 1) * batches // rounds]
            loads.append(os.getloadavg()[0])
            with clocks["ref"]:
                for s in part:
                    edges += sum(x.num_edges for x in ref.sample(s))
            with clocks["ref_feat"]:
                for s in part:
                    feats[ref_feat.sample(s)[0].src_nodes]
            with clocks["many"]:
                got = counted("many", lambda part=part: drain(many.sample_many(part, per_request, in_flight)))
            with clocks["many_feat"]:
                got += drain(many_feat.sample_many(part, per_request, in_flight), features=True)
            identical &= got == 2 * len(part)
            for s in part:
                k_before = owners.counters()
                with clocks["one"]:
                    counted("one", lambda s=s: one.sample(s))
                k_after = owners.counters()
                for key in one_kernel:
                    one_kernel[key] += _delta(k_before, k_after, key)
                slowest += max(k_after[p]["sample_s"] - k_before[p]["sample_s"] for p in k_after)
        per = float(batches)
        hits, misses = store.stats.hits - fetch0[0], store.stats.misses - fetch0[1]
        feat_requests = (store.stats.requests - fetch0[2]) / per
        feat_bytes = (store.stats.bytes_moved - fetch0[3]) / per
        rt = _round_trip(owners)
        ser = _serialization(int(traffic["one"][1] / per))
        one_cpu = (clocks["one"].cpu + clocks["one"].session_cpu) / per
        limits = {
            "per_batch_s": clocks["one"].wall / per,
            "wait_s": (one.profile.wait_s - prof0[0]) / per,
            "assemble_and_relabel_s": (one.profile.assemble_s - prof0[1]) / per,
            "owner_kernel_all_s": one_kernel["sample_s"] / per,
            "owner_kernel_slowest_s": slowest / per,
            "owner_kernel_cpu_s": one_kernel["sample_cpu_s"] / per,
            "owner_process_cpu_s": one_kernel["process_cpu_s"] / per,
            "trainer_cpu_s": clocks["one"].cpu / per,
            "ray_session_cpu_s": clocks["one"].session_cpu / per,
            "round_trip_s": rt, "serialization_s": ser,
            "single_process_per_batch_s": clocks["ref"].wall / per,
            "single_process_cpu_s": clocks["ref"].cpu / per,
            "cpu_per_batch_s": one_cpu,
        }
    finally:
        ray.shutdown()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    case = f"power-law {n}/{e} {fan} b{batch}, {parts} Ray owners"
    base = f"NeighborSampler, 1 process ({os.cpu_count()} cores)"
    many_case = f"{case}, sample_many ({per_request} a request, {in_flight} in flight)"

    def row(name: str, case: str, baseline: str) -> dict:
        c = clocks[name]
        base_wall, base_cpu = clocks["ref"].wall, clocks["ref"].cpu / per
        if name == "many_feat":  # the baseline samples and gathers rows
            base_wall, base_cpu = clocks["ref_feat"].wall, clocks["ref_feat"].cpu / per
        ours_cpu = (c.cpu + c.session_cpu) / per
        return {"case": case, "metric": "sampled_edges_per_s", "ours": edges / c.wall, "baseline": baseline,
                "baseline_value": edges / base_wall, "ratio": base_wall / c.wall, "cpu_per_batch_s": ours_cpu,
                "trainer_cpu_per_batch_s": c.cpu / per, "ray_session_cpu_per_batch_s": c.session_cpu / per,
                "baseline_cpu_per_batch_s": base_cpu, "cpu_ratio": base_cpu / ours_cpu}

    rows = [
        row("many", many_case, base),
        row("one", case + ", sample (one batch a call)", base),
        row("many_feat", many_case + f", features {dim} x float32, cache {cache_rows}",
            base + " + feature gather"),
        {"case": case + ", one batch a call", "metric": "sampler_bytes_per_batch",
         "ours": traffic["one"][1] / per, "requests_per_batch": traffic["one"][0] / per,
         "sampled_edges_per_batch": edges / per},
        {"case": many_case, "metric": "sampler_bytes_per_batch", "ours": traffic["many"][1] / per,
         "requests_per_batch": traffic["many"][0] / per, "sampled_edges_per_batch": edges / per},
        {"case": case, "metric": "feature_bytes_per_batch", "ours": feat_bytes,
         "hit_rate": hits / max(hits + misses, 1), "requests_per_batch": feat_requests},
    ]
    click.echo(f"identical blocks and features: {identical}; load at the rounds' starts {loads}, at the end "
               f"{os.getloadavg()[0]:.1f}")
    for r in rows:
        extra = ""
        if "ratio" in r:
            ms = {k: 1e3 * r[k] for k in ("cpu_per_batch_s", "trainer_cpu_per_batch_s",
                                          "ray_session_cpu_per_batch_s", "baseline_cpu_per_batch_s")}
            extra = (f"  baseline {r['baseline_value']:.4g}  ratio {r['ratio']:.2f}  cpu/batch "
                     f"{ms['cpu_per_batch_s']:.1f} ms (trainer {ms['trainer_cpu_per_batch_s']:.1f}, Ray "
                     f"session {ms['ray_session_cpu_per_batch_s']:.1f}) against "
                     f"{ms['baseline_cpu_per_batch_s']:.1f} ms  cpu_ratio {r['cpu_ratio']:.2f}")
        if "requests_per_batch" in r:
            extra = f"  requests/batch {r['requests_per_batch']:.2f}"
        click.echo(f"{r['metric']:<26}{r['ours']:>12.4g}{extra}   {r['case']}")
    click.echo("limits per batch (one batch a call): " + ", ".join(f"{k} {v:.4g}" for k, v in limits.items()))
    write_result("dist_sampler", rows, info, output, identical=bool(identical), limits=limits,
                 partition={"method": body["method"], "balance": body["balance"], "seconds": t_part},
                 load_at_rounds=loads, load_at_end=os.getloadavg(),
                 config={"per_request": per_request, "in_flight": in_flight, "rounds": rounds,
                         "owner_threads": owner_threads, "trainer_malloc": trainer_malloc})


if __name__ == "__main__":
    main()

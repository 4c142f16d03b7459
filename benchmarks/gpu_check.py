"""One script for a lent GPU machine: the numba.cuda kernels of both engines for real (not the simulator).

The parts, one module each beside this driver:

1. correctness of the GPU neighbour sampler against the CPU kernels (``gpu_sampler_check.py``);
5. heterogeneous sampling on the GPU against the CPU, then its speed (``gpu_hetero_check.py``, run
   right after part 1);
2. sampled edges/s of the kernels and of ``NeighborSampler.sample()``, device graph and UVA, uniform and
   weighted, a per-layer profile and the host-side steps of a layer (``gpu_sampler_check.py``);
3. feature gather GB/s, device table and mapped host table (``gpu_features_check.py``);
4. replay windows gathered on the GPU: byte-equal to the CPU's, then windows/s and GB/s against the CPU
   gather and copy (``gpu_replay_check.py``);
6. full-graph GCN with host-resident vertex data (HongTu): all on the device vs `FullGraph`'s staged
   path at 1/4 of the device run's peak, and a graph whose vertex data is 3x the budget
   (``gpu_full_graph_check.py``; ``--only-full-graph``, ``--fg-scale`` to shrink it,
   ``--fg-dry-run`` for a tiny CPU run of the same code).

Writes ``benchmarks/results/gpu_check.json`` and prints a table; each part checks the clock against
``--budget`` and shrinks its repeats if it runs late. ``--only-replay`` runs part 4 alone,
``--only-sampler`` parts 1, 5 and 2. Without a usable CUDA device it prints why and exits with status
2; it exits with 1 when a correctness check fails. ``NUMBA_ENABLE_CUDASIM=1`` with tiny sizes
(``--nodes 2000 --edges-per-node 5 --check-nodes 300 --check-edges 3000 --batches 1 --feature-rows 500
--batch-size 16``; for part 4 ``--only-replay --replay-check-steps 300 --replay-check-batches 2
--replay-steps 2000 --replay-batch 8 --replay-window 4 --replay-repeats 2``) runs the same code in
numba's simulator, for testing the script itself. Figures from real GPUs: docs/performance.md.

    python benchmarks/gpu_check.py --help
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

# run as a script, this file's folder comes first on sys.path and benchmarks/replay.py would shadow the
# replay package: import the packages first, then find the part modules at the end of the path
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import click  # noqa: E402
import numba  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402  # numba.cuda imports without a GPU; kernels need one (or the simulator)

import replay  # noqa: E402, F401  # the package, before benchmarks/replay.py is on the path

sys.path.append(str(_HERE))
from gpu_features_check import time_gather  # noqa: E402
from gpu_full_graph_check import full_graph_part, print_full_graph  # noqa: E402
from gpu_hetero_check import hetero_part  # noqa: E402
from gpu_replay_check import print_replay, replay_part  # noqa: E402
from gpu_sampler_check import check_correctness, sampler_part  # noqa: E402

REPO = _HERE.parent
RESULTS = REPO / "benchmarks" / "results" / "gpu_check.json"


def _no_gpu_exit() -> None:
    click.echo("gpu_check: no CUDA GPU here (numba.cuda.is_available() is False: no device or no driver). "
               "This script measures the numba.cuda kernels on a real GPU; run it on a machine with one "
               "(or set NUMBA_ENABLE_CUDASIM=1 with tiny sizes to test the script).", err=True)
    sys.exit(2)


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
@click.option("--only-sampler", is_flag=True, help="Run only parts 1, 5 and 2 (sampling).")
@click.option("--only-full-graph", is_flag=True, help="Run only part 6 (full-graph GCN, host vertex data).")
@click.option("--full-graph/--no-full-graph", "with_full_graph", default=True, show_default=True,
              help="Run part 6 after the others.")
@click.option("--fg-scale", default=0.5, show_default=True,
              help="Part 6: fraction of ogbn-products' size (2.4M nodes, 62M edges; 1 = that size, a few "
                   "minutes more, mostly host-side planning in the first epoch).")
@click.option("--fg-epochs", default=3, show_default=True, help="Part 6: timed epochs per case.")
@click.option("--fg-dry-run", is_flag=True, help="Part 6 alone, tiny, on the CPU (tests the script; no GPU).")
@click.option("--budget", default=240.0, show_default=True, help="Seconds the whole check aims to fit in.")
@click.option("--seed", default=0, show_default=True)
@click.option("--output", default=str(RESULTS), show_default=True, type=click.Path(dir_okay=False))
def main(check_nodes, check_edges, check_batches, nodes, edges_per_node, fanouts, batch_size, batches,
         feature_rows, feature_dim, replay_check_steps, replay_check_batches, replay_steps, replay_batch,
         replay_window, replay_repeats, only_replay, only_sampler, only_full_graph, with_full_graph, fg_scale,
         fg_epochs, fg_dry_run, budget, seed, output) -> None:
    """Correctness and speed of the numba.cuda sampling kernels on a real GPU (see the module docstring)."""
    t0 = time.perf_counter()
    fg_args = {"nodes": int(2_400_000 * fg_scale), "edges": int(62_000_000 * fg_scale), "epochs": fg_epochs,
               "seed": seed}
    if fg_dry_run or only_full_graph:
        if not fg_dry_run and not torch.cuda.is_available():
            _no_gpu_exit()
        result = {"benchmark": "gpu_check", "machine": {"cpus": os.cpu_count(), "torch": torch.__version__,
                                                        "cuda_device": None if fg_dry_run else
                                                        torch.cuda.get_device_name()}, "rows": []}
        ok = full_graph_part(result, **fg_args, dry_run=fg_dry_run)
        print_full_graph(result, click.echo)
        _write(result, t0, output)
        sys.exit(0 if ok else 1)
    if not cuda.is_available():
        _no_gpu_exit()
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
        print_replay(result)
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
    print_replay(result)
    fg_ok = True
    if with_full_graph and not bool(numba.config.ENABLE_CUDASIM):
        fg_ok = full_graph_part(result, **fg_args)
        print_full_graph(result, click.echo)
    _write(result, t0, output)
    if not result["correctness"]["deterministic_ok"] or not replay_ok or not fg_ok:
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

"""Memory manager costs and the copies it avoids, against the plain-torch / stdlib way, in one process.

Cases (all timed as the best of ``--repeats`` runs of ``--iters`` operations; seconds per operation,
lower is better; ``ratio`` is baseline / ours, so above 1 means ours is faster):

Ours and the baseline of a case alternate run by run (`_report.best_interleaved`: both see the same load).

- hand-off of a batch: what a sampler or replay store gives its trainer. Ours: a zero-copy view of a
  region (``region.tensor()``). Baseline: a fresh copy of the same bytes (``tensor.clone()``), the
  cost a copying API pays. The copy's bandwidth is also reported: it is the machine's ceiling.
- staging a batch: ours acquires a reusable `StagingPool` slot, fills it and releases it; the baseline
  allocates a fresh ``torch.empty`` buffer each batch and fills it (page faults on first touch).
- allocate + free per tier: ours through `MemoryManager` (budget accounting, statistics, cleanup
  registration); baselines ``torch.empty`` (host, pinned and device without CUDA),
  ``multiprocessing.shared_memory.SharedMemory`` create + unlink (shared) and ``zarr.create_array``
  + delete (disk). This is the manager's overhead, paid once per buffer, not per batch.

Run ``python benchmarks/memory.py --help``; results go to ``benchmarks/results/memory.json``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path

import click
import torch
import zarr
from _report import best_interleaved, machine, write_result
from zarr.storage import LocalStore

from graphrl.memory import MemoryManager
from graphrl.tensors import StagingPool

RESULTS = Path(__file__).resolve().parent / "results" / "memory.json"


def row(case: str, ours: float, baseline: str, baseline_value: float, **extra: object) -> dict:
    return {"case": case, "metric": "seconds_per_op", "ours": ours, "baseline": baseline,
            "baseline_value": baseline_value, "ratio": baseline_value / ours, **extra}


@click.command()
@click.option("--batch-mib", default=64, show_default=True, help="Size of the handed-off batch.")
@click.option("--staging-mib", default=16, show_default=True, help="Size of one staging buffer.")
@click.option("--alloc-kib", default=1024, show_default=True, help="Size of each allocate + free.")
@click.option("--iters", default=20, show_default=True)
@click.option("--repeats", default=5, show_default=True)
@click.option("--output", default=str(RESULTS), show_default=True)
def main(batch_mib: int, staging_mib: int, alloc_kib: int, iters: int, repeats: int, output: str) -> None:
    """Zero-copy hand-off, staging reuse and allocation overhead of graphrl.memory."""
    rows = []
    spill = Path(tempfile.mkdtemp(prefix="graphrl_bench_"))
    try:
        with MemoryManager(spill_dir=spill) as mm:
            nbytes = batch_mib * 2**20
            region = mm.allocate((nbytes // 4,), torch.float32, "pinned", owner="bench.batch")
            region.tensor().normal_()
            src = region.tensor()
            ours, base = best_interleaved([region.tensor, src.clone], iters, repeats)
            rows.append(row(f"hand-off {batch_mib} MiB batch: view vs copy", ours, "torch clone", base,
                            copy_gb_per_s=nbytes / base / 1e9, bytes_not_copied=nbytes))
            region.free()

            shape = (staging_mib * 2**20 // 4,)
            with StagingPool(mm, shape, torch.float32, slots=2, owner="bench.staging") as pool:
                def staged() -> None:
                    with pool.acquire() as buf:
                        buf.tensor.fill_(1.0)

                def fresh() -> None:
                    torch.empty(shape, dtype=torch.float32).fill_(1.0)

                ours, base = best_interleaved([staged, fresh], iters, repeats)
            rows.append(row(f"stage {staging_mib} MiB batch: pool slot vs fresh buffer", ours,
                            "torch.empty + fill", base))

            alloc = alloc_kib * 1024

            def through_manager(tier: str) -> Callable[[], None]:
                return lambda: mm.allocate(alloc, torch.uint8, tier, owner="bench.alloc").free()

            def torch_empty() -> None:
                torch.empty(alloc, dtype=torch.uint8)

            def shm() -> None:
                seg = shared_memory.SharedMemory(create=True, size=alloc)
                seg.close()
                seg.unlink()

            counter = iter(range(10**9))

            def zarr_array() -> None:
                path = spill / f"base_{next(counter)}.zarr"
                zarr.create_array(store=LocalStore(path), shape=(alloc,), dtype="uint8", fill_value=0,
                                  compressors=None)
                shutil.rmtree(path)

            baselines = {"host": ("torch.empty", torch_empty), "pinned": ("torch.empty", torch_empty),
                         "device": ("torch.empty", torch_empty),
                         "shared": ("SharedMemory create+unlink", shm),
                         "disk": ("zarr.create_array+rmtree", zarr_array)}
            for tier, (name, fn) in baselines.items():
                if tier in ("pinned", "device") and torch.cuda.is_available():
                    continue  # the baseline would be a different kind of memory
                ours, base = best_interleaved([through_manager(tier), fn], iters, repeats)
                rows.append(row(f"allocate+free {alloc_kib} KiB on {tier}", ours, name, base))
    finally:
        shutil.rmtree(spill, ignore_errors=True)

    click.echo(f"\n{'case':<52} {'ours (us)':>12} {'baseline (us)':>14} {'ratio':>8}  baseline")
    for r in rows:
        click.echo(f"{r['case']:<52} {r['ours'] * 1e6:>12.1f} {r['baseline_value'] * 1e6:>14.1f} "
                   f"{r['ratio']:>8.2f}  {r['baseline']}")
    write_result("memory", rows, machine(zarr=zarr.__version__), output)

if __name__ == "__main__":
    main()

"""PyG's neighbour sampler as a third baseline of ``benchmarks/sampler.py``, when PyG and a backend import.

PyG samples through ``torch_geometric.sampler.NeighborSampler``, the sampler that ``NeighborLoader`` calls
for each batch; it is timed through ``sample_from_nodes`` alone, without the loader's worker processes
and feature collation (``filter_fn``), so it stands beside ours and DGL's ``sample_blocks``. That sampler
runs ``torch.ops.pyg.neighbor_sample`` where pyg-lib is installed, else
``torch.ops.torch_sparse.neighbor_sample``. pyg-lib has no source distribution on PyPI and torch-sparse
builds from source (``benchmarks/setup_pyg.sh``), so here the backend is torch-sparse; CI installs neither,
and the benchmark then prints once that PyG is skipped. The full torch-sparse package needs torch-scatter
and 32 C++ files (build time: docs/performance.md); ``setup_pyg.sh --op-only`` compiles only the two
files of its ``neighbor_sample`` op into ``.venv/pyg_ops/``. Without the package PyG's
``NeighborSampler`` refuses to sample, so then the op is called directly, as that sampler calls it
(same CSC from PyG's ``to_csc``, same arguments).

What is counted: the sampled edges PyG returns (``out.row.numel()``), the same quantity as the edges of
our blocks and DGL's. PyG's output is one subgraph in which each node's neighbours are drawn once (a
node reached again at a later hop is not sampled again), whereas ours and DGL's blocks draw again for
every destination node of every layer, the seeds included; so PyG's edges per batch are fewer and
edges/s is the comparable figure. Weighted draws need pyg-lib >= 0.3.0 (``weight_attr``); torch-sparse
has no weighted neighbour sampler, and the weighted rows say so instead of a number.

References
----------
torch-sparse 0.6.18 ``csrc/cpu/neighbor_sample_cpu.cpp`` (one thread, Floyd's sampling without
replacement with a ``torch::randint`` call per draw); torch_geometric 2.8.1 ``sampler/neighbor_sampler.py``.
"""

from __future__ import annotations

import importlib
import sys
import time
import warnings
from pathlib import Path

import click
import numpy as np
import torch

_STATE: dict = {}
OP_DIR = Path(sys.prefix) / "pyg_ops"  # where setup_pyg.sh --op-only puts torch-sparse's neighbor_sample op
OP_LIB = OP_DIR / "_neighbor_sample_cpu.so"


def pyg_status() -> tuple[str | None, str]:
    """Which PyG backend imports: ``(name, version text)`` or ``(None, why PyG is skipped)``; cached."""
    if "status" not in _STATE:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tg = importlib.import_module("torch_geometric")
                import torch_geometric.typing as tgt
        except ImportError as err:
            _STATE["status"] = (None, f"torch_geometric not installed ({err}); run benchmarks/setup_pyg.sh")
        else:
            if tgt.WITH_PYG_LIB:
                import pyg_lib

                version = f"pyg {tg.__version__} (pyg-lib {pyg_lib.__version__})"
                _STATE["status"] = ("pyg-lib", version)
            elif tgt.WITH_TORCH_SPARSE:
                import torch_sparse

                version = f"pyg {tg.__version__} (torch-sparse {torch_sparse.__version__})"
                _STATE["status"] = ("torch-sparse", version)
            elif OP_LIB.exists():
                torch.ops.load_library(str(OP_LIB))
                version = (OP_DIR / "VERSION").read_text().strip() if (OP_DIR / "VERSION").exists() else "?"
                _STATE["status"] = ("torch-sparse op", f"pyg {tg.__version__} (torch-sparse {version} "
                                                       "neighbor_sample op alone)")
            else:
                why = (f"torch_geometric {tg.__version__} is installed but neither pyg-lib nor torch-sparse "
                       "imports; run benchmarks/setup_pyg.sh")
                _STATE["status"] = (None, why)
    return _STATE["status"]


def weighted_supported() -> bool:
    """Whether the installed PyG backend draws neighbours by edge weight (pyg-lib >= 0.3.0 only)."""
    import torch_geometric.typing as tgt

    return bool(tgt.WITH_WEIGHTED_NEIGHBOR_SAMPLE)


def _batches(num_nodes: int, batch_size: int, num_batches: int, seed: int) -> list[torch.Tensor]:
    # The same seeds as sampler.bench_graph: the same generator drawn in the same order.
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.integers(0, num_nodes, batch_size)) for _ in range(num_batches)]


def _time(sampler, batches: list[torch.Tensor]) -> tuple[int, float, float]:
    """Sampled edges, wall seconds and this process's CPU seconds for sampling ``batches``."""
    from torch_geometric.sampler import NodeSamplerInput

    edges = 0
    if pyg_status()[0] == "torch-sparse op":
        # What NeighborSampler._sample runs with torch-sparse, minus its output wrapping.
        fanouts, op = sampler.num_neighbors.get_mapped_values(), torch.ops.torch_sparse.neighbor_sample
        cpu, start = time.process_time(), time.perf_counter()
        for seeds in batches:
            _node, row, _col, _edge = op(sampler.colptr, sampler.row, seeds, fanouts, sampler.replace, True)
            edges += row.numel()
        return edges, time.perf_counter() - start, time.process_time() - cpu
    cpu, start = time.process_time(), time.perf_counter()
    for seeds in batches:
        out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds))
        edges += out.row.numel()
    return edges, time.perf_counter() - start, time.process_time() - cpu


def pyg_sampler(src: torch.Tensor, dst: torch.Tensor, num_nodes: int, fanouts: list[int],
                weights: torch.Tensor | None = None):
    """PyG's ``NeighborSampler`` on the graph ``src -> dst`` (edge ids = positions), CSC built here, untimed.

    Parameters
    ----------
    src, dst : torch.Tensor, int64, shape [E]
        Source and destination of every edge, indexed by edge id.
    num_nodes : int
    fanouts : list[int]
        Neighbours per hop, outermost first (PyG's ``num_neighbors``).
    weights : torch.Tensor, float32, shape [E], optional
        Edge weights by edge id (``weight_attr``); only with a backend where `weighted_supported()`.
    """
    from torch_geometric.data import Data
    from torch_geometric.sampler import NeighborSampler as PygNeighborSampler

    data = Data(edge_index=torch.stack([src, dst]), num_nodes=num_nodes)
    if weights is not None:
        data.w = weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "without pyg-lib is deprecated"
        return PygNeighborSampler(data, list(fanouts), replace=False,
                                  weight_attr="w" if weights is not None else None)


def bench_pyg(row: dict, coo: tuple[torch.Tensor, torch.Tensor], num_nodes: int, fanouts: list[int],
              batch_size: int, num_batches: int, warmup: int, repeats: int, seed: int, mode: str,
              weights: torch.Tensor | None = None) -> dict:
    """Add PyG's sampled edges/s to ``row`` (a row of ``sampler.bench_graph``) for the same graph and seeds.

    Fields added: ``baseline_pyg`` (version text), ``baseline_pyg_value`` (best sampled edges/s over
    ``repeats``, or None), ``ratio_pyg`` (ours / PyG), ``edges_per_batch_pyg``, ``pyg_edges_per_cpu_s``
    (edges over this process's CPU time: a serial sampler's rate on an unshared core) and ``pyg_note``
    when PyG has no number (weighted without pyg-lib). Nothing is added when PyG does not import.
    """
    backend, version = pyg_status()
    if backend is None:
        return row
    row["baseline_pyg"] = version
    if mode == "weighted" and not weighted_supported():
        row.update(baseline_pyg_value=None, ratio_pyg=None, edges_per_batch_pyg=None,
                   pyg_note=f"weighted neighbour sampling needs pyg-lib>=0.3.0; {backend} has none")
        return row
    torch.manual_seed(seed)  # torch-sparse draws from torch's global generator
    sampler = pyg_sampler(coo[0], coo[1], num_nodes, fanouts, weights if mode == "weighted" else None)
    batches = _batches(num_nodes, batch_size, num_batches, seed)
    _time(sampler, batches[:warmup])
    best = best_cpu = 0.0
    edges = 0
    for _ in range(repeats):
        edges, dt, cpu = _time(sampler, batches)
        best, best_cpu = max(best, edges / dt), max(best_cpu, edges / max(cpu, 1e-9))
    # Edges per CPU second: for a serial sampler, its rate on a core of its own, whatever the load.
    row.update(baseline_pyg_value=best, ratio_pyg=row["ours"] / best, edges_per_batch_pyg=edges / num_batches,
               pyg_edges_per_cpu_s=best_cpu)
    return row


def print_pyg(rows: list[dict]) -> None:
    """PyG's table after the DGL one, or the one line that says why PyG was skipped."""
    backend, version = pyg_status()
    if backend is None:
        click.echo(f"PyG skipped: {version}")
        return
    if backend == "torch-sparse op":
        how = "torch.ops.torch_sparse.neighbor_sample as NeighborSampler calls it"
    else:
        how = "NeighborSampler.sample_from_nodes (what NeighborLoader calls)"
    serial = "; torch-sparse's sampler runs on one thread" if backend.startswith("torch-sparse") else ""
    click.echo(f"\n{version}: {how}{serial}")
    click.echo(f"{'case':<53} {'ours (M edges/s)':>17} {'pyg (M edges/s)':>16} {'ratio':>6} "
               f"{'pyg (M edges/cpu-s)':>19} {'edges/batch ours':>17} {'pyg':>8}")
    for row in rows:
        if "baseline_pyg" not in row:
            continue
        if row["baseline_pyg_value"] is None:
            click.echo(f"{row['case']:<53} {row['ours'] / 1e6:>17.1f} {'n/a':>16} {'':>6}  {row['pyg_note']}")
            continue
        click.echo(f"{row['case']:<53} {row['ours'] / 1e6:>17.1f} {row['baseline_pyg_value'] / 1e6:>16.2f} "
                   f"{row['ratio_pyg']:>6.1f} {row['pyg_edges_per_cpu_s'] / 1e6:>19.2f} "
                   f"{row['edges_per_batch_ours']:>17,.0f} "
                   f"{row['edges_per_batch_pyg']:>8,.0f}")

"""gpu_check part 6: full-graph GCN training with host-resident vertex data (HongTu) on a real GPU.

Three cases on a synthetic power-law graph of ogbn-products' size (2.4M nodes, 62M edges, 100
features, 3 GCN layers of 256, 47 classes; gpu_check's ``--fg-scale`` shrinks it, 0.5 by default):

- ``device``: everything on the GPU with plain torch sparse ops (CSR ``P`` and ``P^T`` in device
  memory, features and activations too): the baseline; its peak is ``torch.cuda.max_memory_allocated``;
- ``staged``: ours, ``FullGraph(device="cuda", dedup=True)`` with the memory manager's device budget
  at 1/4 of the baseline's peak, weights on the GPU, features pinned on the host: epoch time,
  ``fg.traffic()`` bytes per epoch, the effective PCIe GB/s (bytes moved / epoch time) next to the
  pinned-copy GB/s of both directions measured in the same run. Targets: the epoch within 1.25x of
  the PCIe limit (host-to-device bytes / pinned host-to-device GB/s plus device-to-host bytes /
  pinned device-to-host GB/s) and within 4x of the baseline's epoch;
- ``3x``: the same graph with the device budget at a third of its vertex data (features and
  activations of all layers): the baseline limited to that budget
  (``torch.cuda.set_per_process_memory_fraction``) must fail with out-of-memory (a RuntimeError is
  recorded in ``device_error``: met only when its text is an allocation failure), ours trains (one
  epoch, planning included).

Every figure goes into ``result["full_graph"]`` as soon as it exists and ``on_progress`` is called
(gpu_check writes its JSON there), so a later crash loses nothing. With ``seconds`` the part keeps to
a time budget: the baseline's timed epochs stop at a quarter of it, the staged case's at its end, and
the 3x case is left out (said so) when the staged case's first epoch would not fit in what is left. An
epoch itself is not interrupted: gpu_check's alarms stop a run that overruns. `full_graph_targets`
turns the figures into target rows.

``dry_run=True`` runs the same code on the CPU at a tiny size (the baseline on CPU torch, ours through
the staged path with ``MemoryManager(device="cpu")`` and ``FullGraph(device="cpu", dedup=True)``), for
testing the script without a GPU (and on a machine with one).

References
----------
Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from graphrl.datasets import synthetic_graph
from graphrl.kernels.spmm import csr_transpose, normalized_adjacency
from graphrl.memory import MemoryManager
from graphrl.nn.gcn import GCN
from samplers.full_graph import FullGraph

__all__ = ["full_graph_part", "full_graph_targets", "print_full_graph", "symmetric_propagation"]

PCIE_FACTOR = 1.25
"""Target: the staged epoch at most this many times the PCIe limit of its bytes."""
DEVICE_FACTOR = 4.0
"""Target: the staged epoch at most this many times the all-on-device epoch."""
PLAN_SECONDS = 5.0
"""Target: the planning one epoch needs (order, partitions, dedup sets), 1.2M nodes / 31M edges, 16 cores."""


def symmetric_propagation(graph):
    """P = D_in^-1/2 (A + I) D_out^-1/2 and P^T as numpy CSR arrays (the FullGraph contract)."""
    n = graph.num_nodes
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
    deg_in = np.diff(indptr).astype(np.float64) + 1
    deg_out = np.bincount(indices, minlength=n).astype(np.float64) + 1
    nnz = graph.num_edges + n
    p = (np.empty(n + 1, np.int64), np.empty(nnz, indices.dtype), np.empty(nnz, np.float32))
    normalized_adjacency(indptr, indices, None, True, deg_in ** -0.5, deg_out ** -0.5, out=p)
    t = (np.empty(n + 1, np.int64), np.empty(nnz, indices.dtype), np.empty(nnz, np.float32))
    csr_transpose(*p, n, out=t)
    return p, t


class _DeviceProp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, p, pt):
        ctx.pt = pt
        return torch.sparse.mm(p, h)

    @staticmethod
    def backward(ctx, g):
        return torch.sparse.mm(ctx.pt, g), None, None


class _DeviceGCN(torch.nn.Module):
    """The baseline: the same GCN as ours (weights before propagating when that narrows), all on device."""

    def __init__(self, dims: list[int], seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        pairs = zip(dims[:-1], dims[1:], strict=True)
        self.lins = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in pairs)
        for lin in self.lins:
            torch.nn.init.xavier_uniform_(lin.weight, generator=gen)

    def forward(self, p, pt, x):
        h = x
        for i, lin in enumerate(self.lins):
            if lin.in_features > lin.out_features:
                h = _DeviceProp.apply(h @ lin.weight.t(), p, pt) + lin.bias
            else:
                h = lin(_DeviceProp.apply(h, p, pt))
            if i + 1 < len(self.lins):
                h = torch.relu(h)
        return h


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _time(step, epochs: int, dev: torch.device, deadline: float | None = None) -> list[float]:
    """A warm-up step, then up to ``epochs`` timed steps (at least one when ``epochs`` > 0; no more once
    ``deadline``, a ``time.perf_counter()`` value, has passed)."""
    step()  # warm-up: plans, JIT, allocator
    times: list[float] = []
    for _ in range(epochs):
        if times and deadline is not None and time.perf_counter() > deadline:
            break
        _sync(dev)
        t0 = time.perf_counter()
        step()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return times


def _baseline(graph, p, t, x, y, dims, epochs, dev, seed, deadline: float | None = None) -> dict:
    n = graph.num_nodes
    def csr(arrays):  # torch wants one index dtype for the row pointer and the columns
        ptr, cols, vals = (torch.from_numpy(a) for a in arrays)
        return torch.sparse_csr_tensor(ptr, cols.to(torch.int64), vals, size=(n, n)).to(dev)

    pd, ptd = csr(p), csr(t)
    xd, yd = x.to(dev), y.to(dev)
    model = _DeviceGCN(dims, seed).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(pd, ptd, xd), yd).backward()
        opt.step()

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = _time(step, epochs, dev, deadline)
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev)
    else:  # estimate: both matrices, features, two saved [N, width] tensors per layer and their gradients
        peak = sum(a.nbytes for a in (*p, *t)) + x.numel() * 4 + 4 * n * 4 * sum(dims[1:])
    best = min(times) if times else None
    return {"epoch_seconds": best, "epoch_seconds_all": times, "peak_bytes": int(peak)}


def _ours(graph, x, y, dims, epochs, dev, budget, seed, deadline: float | None = None) -> dict:
    """Our staged path: one epoch that plans every width, then up to ``epochs`` timed epochs (as many as
    end before ``deadline``, at least one); ``epochs=0`` times the first epoch alone.

    Raises
    ------
    TimeoutError
        ``deadline`` (a ``time.perf_counter()`` value) has passed before the first epoch.
    """
    if deadline is not None and time.perf_counter() > deadline:
        raise TimeoutError(f"the staged case at budget {budget} B not started: its deadline passed "
                           f"{time.perf_counter() - deadline:.0f} s ago")
    # the dry run: the staged path on the CPU, its device tier host memory (FullGraph refuses a
    # host-memory device tier for device="cuda" where CUDA is available)
    with MemoryManager(budgets={"device": budget}, device=dev) as mm:
        fg = FullGraph(graph, memory=mm, device=dev, dedup=True, partition_bytes=None)
        model = GCN(dims[0], dims[1], out_dim=dims[-1], layers=len(dims) - 1, dropout=0.0, seed=seed).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)

        def step():
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(fg, x), y).backward()
            opt.step()

        fg.traffic(reset=True)
        _sync(dev)
        t_plan = time.perf_counter()
        step()  # plans every width (kept), then the timed epochs
        _sync(dev)
        t_plan = time.perf_counter() - t_plan
        times: list[float] = []
        if epochs > 0:
            fg.traffic(reset=True)
            while len(times) < epochs:
                last = times[-1] if times else 0.0
                if times and deadline is not None and time.perf_counter() + last > deadline:
                    break
                t0 = time.perf_counter()
                step()
                _sync(dev)
                times.append(time.perf_counter() - t0)
        t = fg.traffic()
        rounds = max(len(times), 1)
        moved = (t["host_to_device_bytes"] + t["device_to_host_bytes"]) / rounds
        best = min(times) if times else t_plan
        return {"epoch_seconds": best, "epoch_seconds_all": times, "first_epoch_seconds": t_plan,
                "budget_bytes": budget, "partitions": t["partitions"],
                "device_peak_bytes": mm.stats()["device"].get("samplers.full_graph", {}).get("peak", 0),
                "h2d_bytes_per_epoch": t["host_to_device_bytes"] / rounds,
                "d2h_bytes_per_epoch": t["device_to_host_bytes"] / rounds,
                "dedup_hit_bytes_per_epoch": t["dedup_hit_bytes"] / rounds,
                "effective_pcie_GBps": moved / best / 1e9, "intermediate": t["intermediate"],
                # the GPU rules over the timed (steady) epochs: what FullGraph's transfers counted
                "timed_epochs": len(times), "registrations_per_epoch": t["registrations"] / rounds,
                "pageable_transfers_per_epoch": t["pageable_transfers"] / rounds,
                "host_waits_per_epoch": t["host_waits"] / rounds,
                "partitions_per_epoch": sum(c["partitions"] for c in t["per_call"]) / rounds,
                "host_linear_calls_per_epoch": 2 * (len(dims) - 1)}


def _pinned_copy_GBps(dev: torch.device, nbytes: int = 1 << 30) -> tuple[float | None, float | None]:
    """Pinned host-to-device and device-to-host copy GB/s (None, None on the CPU)."""
    if dev.type != "cuda":
        return None, None
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    rates = []
    for a, b in ((dst, host), (host, dst)):
        a.copy_(b)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(5):
            a.copy_(b, non_blocking=True)
        torch.cuda.synchronize(dev)
        rates.append(5 * nbytes / (time.perf_counter() - t0) / 1e9)
    del host, dst
    torch.cuda.empty_cache()
    return rates[0], rates[1]


def _data(nodes, edges, features, classes, seed, pin):
    graph = synthetic_graph(nodes, edges, "powerlaw", seed=seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, features, generator=gen)
    y = torch.randint(0, classes, (nodes,), generator=gen)
    return graph, (x.pin_memory() if pin else x), y


def full_graph_part(result: dict, nodes: int = 2_400_000, edges: int = 62_000_000, features: int = 100,
                    hidden: int = 256, layers: int = 3, classes: int = 47, epochs: int = 3, seed: int = 0,
                    dry_run: bool = False, seconds: float | None = None, on_progress=None, echo=None) -> bool:
    """Run the three cases into ``result["full_graph"]``; True when every target of the part is met.

    ``seconds``: the part's time budget (None: no limit). ``on_progress()`` is called each time figures
    are added; ``echo`` (a print function) shows the partial table before the 3x case.
    """
    start = time.perf_counter()
    deadline = None if seconds is None else start + float(seconds)
    if dry_run:
        dev = torch.device("cpu")
        nodes, edges, features, hidden, classes, epochs = 3000, 30000, 16, 32, 5, 1
    else:  # an explicit index: torch.cuda.set_per_process_memory_fraction needs one
        dev = torch.device("cuda", torch.cuda.current_device())
    pin = dev.type == "cuda"
    dims = [features] + [hidden] * (layers - 1) + [classes]
    out: dict = {"nodes": nodes, "edges": edges, "dims": dims, "dry_run": dry_run, "device_name": str(dev)}
    result["full_graph"] = out

    def progress(what: str) -> None:
        out["done"] = what
        out["seconds"] = time.perf_counter() - start
        if on_progress is not None:
            on_progress()

    graph, x, y = _data(nodes, edges, features, classes, seed, pin)
    p, t = symmetric_propagation(graph)
    progress("data")
    h2d, d2h = _pinned_copy_GBps(dev)
    out["pinned_copy_GBps"], out["pinned_copy_d2h_GBps"] = h2d, d2h
    # the baseline's timed epochs stop at a quarter of the part's time: the staged cases need the rest
    base = _baseline(graph, p, t, x, y, dims, epochs, dev, seed,
                     None if deadline is None else start + float(seconds) / 4)
    out["device"] = base
    progress("device")
    budget = max(base["peak_bytes"] // 4, 1 << 16)
    ours = _ours(graph, x, y, dims, epochs, dev, budget, seed, deadline)
    ours["vs_device"] = ours["epoch_seconds"] / base["epoch_seconds"]
    if h2d and d2h:
        limit = ours["h2d_bytes_per_epoch"] / (h2d * 1e9) + ours["d2h_bytes_per_epoch"] / (d2h * 1e9)
        ours["pcie_limit_seconds"] = limit
        ours["vs_pcie_limit"] = ours["epoch_seconds"] / limit if limit > 0 else None
    out["staged"] = ours
    progress("staged")
    if echo is not None:
        print_full_graph(result, echo)
    # 3x: the budget is a third of the vertex data (features plus every layer's activations)
    vertex = nodes * 4 * (features + sum(dims[1:]))
    budget3 = vertex // 3
    three: dict = {"vertex_bytes": vertex, "budget_bytes": budget3}
    out["3x"] = three
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(min(budget3 / total, 1.0), dev.index)
        try:
            _baseline(graph, p, t, x, y, dims, 0, dev, seed)  # one step: it runs out of memory at once
            three["device_trained"] = True
        except torch.OutOfMemoryError:
            three["device_trained"] = False
        except RuntimeError as exc:  # cuSPARSE's failed allocations and CUDA errors come as RuntimeError
            three["device_trained"] = False
            three["device_error"] = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, dev.index)
            torch.cuda.empty_cache()
        progress("3x device")
    # ours: one epoch, planning included; left out when the staged case's first epoch would not fit
    need = ours["first_epoch_seconds"] * 1.5
    if deadline is not None and time.perf_counter() + need > deadline:
        three["staged"] = None
        three["skipped"] = (f"out of the part's time: {deadline - time.perf_counter():.0f} s left, about "
                            f"{need:.0f} s needed")
    else:
        three["staged"] = _ours(graph, x, y, dims, 0, dev, budget3, seed, deadline)
    progress("3x")
    return all(row["met"] for row in full_graph_targets(result) if row["met"] is not None)


def _is_oom(error: str) -> bool:
    """Whether a RuntimeError's text is an allocation failure (CUDA's or cuSPARSE's wording)."""
    return "out of memory" in error or "ALLOC_FAILED" in error


def _peak_text(o: dict) -> str:
    return f"{o['device_peak_bytes'] / 2**20:,.1f} of {o['budget_bytes'] / 2**20:,.1f} MiB"


def full_graph_targets(result: dict) -> list[dict]:
    """The part's targets as rows ``{"figure", "value", "target", "met"}`` (met None: not measurable
    here, e.g. the pinned copy rate or the baseline's out-of-memory in a CPU dry run)."""
    r = result.get("full_graph") or {}
    rows: list[dict] = []
    ours, base, three = r.get("staged"), r.get("device"), r.get("3x") or {}
    if ours is None or base is None:
        rows.append({"figure": "part 6 full-graph: staged case", "value": f"not reached ({r.get('done')})",
                     "target": "runs", "met": False})
        return rows
    limit = ours.get("pcie_limit_seconds")
    rows.append({"figure": "part 6 staged epoch (1/4 of device peak) / PCIe limit",
                 "value": (f"{ours['epoch_seconds']:.3f} s / {limit:.3f} s = {ours['vs_pcie_limit']:.2f}x"
                           if limit else f"{ours['epoch_seconds']:.3f} s / n/a (no pinned copy on the CPU)"),
                 "target": f"<= {PCIE_FACTOR}x",
                 "met": (ours["vs_pcie_limit"] <= PCIE_FACTOR) if limit else None})
    rows.append({"figure": "part 6 staged epoch / all-on-device epoch",
                 "value": (f"{ours['epoch_seconds']:.3f} s / {base['epoch_seconds']:.3f} s = "
                           f"{ours['vs_device']:.2f}x"),
                 "target": f"<= {DEVICE_FACTOR}x",
                 "met": None if r.get("dry_run") else ours["vs_device"] <= DEVICE_FACTOR})
    if ours.get("timed_epochs"):
        regs, pageable = ours["registrations_per_epoch"], ours["pageable_transfers_per_epoch"]
        waits_max = ours["partitions_per_epoch"] + ours["host_linear_calls_per_epoch"]
        rows.append({"figure": "part 6 steady staged epoch: registrations / pageable transfers",
                     "value": f"{regs:g} / {pageable:g}", "target": "0 / 0",
                     "met": regs == 0 and pageable == 0})
        rows.append({"figure": "part 6 steady staged epoch: host waits",
                     "value": (f"{ours['host_waits_per_epoch']:g} "
                               f"(partitions {ours['partitions_per_epoch']:g})"),
                     "target": f"<= {waits_max:g}", "met": ours["host_waits_per_epoch"] <= waits_max})
        planning = ours["first_epoch_seconds"] - ours["epoch_seconds"]
        rows.append({"figure": "part 6 planning (first staged epoch - steady epoch)",
                     "value": f"{planning:.2f} s", "target": f"<= {PLAN_SECONDS:g} s",
                     "met": None if r.get("dry_run") else planning <= PLAN_SECONDS})
    rows.append({"figure": "part 6 staged device peak within its budget",
                 "value": _peak_text(ours),
                 "target": "<= budget", "met": 0 < ours["device_peak_bytes"] <= ours["budget_bytes"]})
    if "device_trained" in three:
        error = three.get("device_error")
        oom = error is None or _is_oom(error)
        rows.append({"figure": "part 6 3x case: all-on-device baseline",
                     "value": ("trained" if three["device_trained"] else
                               "out of memory" if error is None else f"failed: {error[:80]}"),
                     "target": "out of memory", "met": not three["device_trained"] and oom})
    else:
        rows.append({"figure": "part 6 3x case: all-on-device baseline",
                     "value": "not tried" if r.get("dry_run") else f"not reached ({r.get('done')})",
                     "target": "out of memory", "met": None if r.get("dry_run") else False})
    staged3 = three.get("staged")
    if staged3:
        fits = 0 < staged3["device_peak_bytes"] <= staged3["budget_bytes"]
        rows.append({"figure": "part 6 3x case: ours trains within the budget",
                     "value": (f"1 epoch in {staged3['first_epoch_seconds']:.1f} s, peak "
                               f"{_peak_text(staged3)}"),
                     "target": "trains, peak <= budget", "met": fits})
    else:
        rows.append({"figure": "part 6 3x case: ours trains within the budget",
                     "value": three.get("skipped") or f"not reached ({r.get('done')})",
                     "target": "trains, peak <= budget", "met": False})
    return rows


def print_full_graph(result: dict, echo=print) -> None:
    """The part's table."""
    r = result.get("full_graph")
    if not r:
        return
    base, ours, three = r.get("device"), r.get("staged"), r.get("3x") or {}
    if base is None or ours is None:
        return
    echo(f"\nfull-graph GCN {r['dims']} on {r['nodes']:,} nodes / {r['edges']:,} edges"
         f"{' (dry run, CPU)' if r['dry_run'] else ''}")
    echo(f"{'case':<28} {'epoch s':>8} {'peak/budget MiB':>16} {'h2d GB/ep':>10} {'d2h GB/ep':>10} "
         f"{'dedup hit GB/ep':>16} {'PCIe GB/s':>10} {'parts':>6}")
    echo(f"{'device (torch sparse)':<28} {base['epoch_seconds']:>8.3f} {base['peak_bytes'] / 2**20:>16,.0f}")
    for name, o in (("staged, 1/4 of device peak", ours), ("staged, vertex data 3x", three.get("staged"))):
        if o is None:
            continue
        echo(f"{name:<28} {o['epoch_seconds']:>8.3f} {o['budget_bytes'] / 2**20:>16,.0f} "
             f"{o['h2d_bytes_per_epoch'] / 1e9:>10.2f} {o['d2h_bytes_per_epoch'] / 1e9:>10.2f} "
             f"{o['dedup_hit_bytes_per_epoch'] / 1e9:>16.2f} {o['effective_pcie_GBps']:>10.1f} "
             f"{o['partitions']:>6}")
    if not three:
        verdict = "not run yet"
    elif "device_trained" not in three:
        verdict = "was not tried (CPU)"
    elif three.get("device_error"):
        verdict = f"failed ({three['device_error'][:80]})"
    else:
        verdict = "trained (unexpected)" if three["device_trained"] else "ran out of memory"
    vs_pcie = f"{ours['vs_pcie_limit']:.2f}x" if ours.get("pcie_limit_seconds") else "n/a"
    echo(f"staged / device epoch time: {ours['vs_device']:.2f}x (target <= {DEVICE_FACTOR}); staged / PCIe "
         f"limit: {vs_pcie} (target <= {PCIE_FACTOR}); "
         f"pinned copy {r.get('pinned_copy_GBps') or 0:.1f} GB/s h2d, "
         f"{r.get('pinned_copy_d2h_GBps') or 0:.1f} "
         f"GB/s d2h; 3x case: the device baseline {verdict}")

"""Planning time and dedup saving of the staged full-graph path (`samplers.full_graph_plan`).

Rows:

- ``plan_seconds``: the order (`locality_order`) plus every plan one epoch of a GCN [100, 256, 256, 47]
  needs (forward at 100, 256 and 47, backward at 256 and 47) on a synthetic power-law graph
  (``synthetic_graph(..., "powerlaw")``, 240k nodes / 6.2M edges by default, as
  ``gpu_check --fg-scale 0.1``) with the device budget at 1/4 of the all-on-device peak estimate of
  ``benchmarks/gpu_full_graph_check.py``; target 2 s on 2 cores. Twice: with P^T's pattern given to
  the order and one `PlanCache` per direction shared by its plans, and with neither (every plan from
  scratch). No baseline runs in-process.
- ``dedup_h2d_ratio``: host-to-device bytes (vertex rows and local CSRs) of one propagation of
  Gowalla's symmetric user-item graph at width 64 (LightGCN, float32) with ``dedup=True`` over
  ``dedup=False``, 1 MiB slots (``slot_bytes``) in a 16 MiB device budget; target 0.75. Also the
  same ratio with the whole working set in 1 MiB (what ``FullGraph(partition_bytes="1MiB")`` plans
  today). Skipped when the Gowalla data is absent (``GRAPHRL_DATA``).

Run ``python benchmarks/full_graph_plan.py [--scale 0.1] [--repeats 3]``; writes
``benchmarks/results/full_graph_plan.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import machine, write_result  # noqa: E402
from gpu_full_graph_check import symmetric_propagation  # noqa: E402

from graphrl.datasets import load_gowalla, synthetic_graph  # noqa: E402
from samplers.full_graph_plan import PlanCache, locality_order, plan_propagation  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "full_graph_plan.json"
DIMS = [100, 256, 256, 47]
EPOCH_PLANS = [(False, 100), (False, 256), (True, 256), (False, 47), (True, 47)]


def h2d_bytes(plan) -> int:
    """Host-to-device bytes of one propagation: vertex rows and local CSRs (what ``traffic`` counts)."""
    return plan.moved_bytes() - sum(p.rows.shape[0] for p in plan.parts) * plan.row_bytes


def epoch_plans(p, t, n: int, budget: int, shared: bool = True) -> tuple[float, list[int]]:
    """Seconds of the order and the plans of one GCN epoch, and each plan's partition count.

    With ``shared`` the order reuses P^T's pattern and each direction's plans share one `PlanCache` (as
    a FullGraph that keeps one per operator would); else the order builds P^T itself and every plan
    starts from scratch."""
    t0 = time.perf_counter()
    order = locality_order(p[0], p[1], n, transpose=(t[0], t[1]) if shared else None)
    caches = {False: PlanCache(), True: PlanCache()} if shared else None
    parts = []
    for transpose, width in EPOCH_PLANS:
        op = t if transpose else p
        cache = caches[transpose] if shared else None
        parts.append(plan_propagation(*op, order, width, 4, budget, True, cache=cache).num_partitions)
    return time.perf_counter() - t0, parts


@click.command()
@click.option("--scale", default=0.1, show_default=True, help="Of ogbn-products' 2.4M nodes / 62M edges.")
@click.option("--repeats", default=3, show_default=True, help="Planning runs (the best is reported).")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(scale: float, repeats: int, output: str) -> None:
    rows = []
    nodes, edges = int(2_400_000 * scale), int(62_000_000 * scale)
    graph = synthetic_graph(nodes, edges, "powerlaw", seed=0)
    p, t = symmetric_propagation(graph)
    peak = sum(a.nbytes for a in (*p, *t)) + nodes * DIMS[0] * 4 + 4 * nodes * 4 * sum(DIMS[1:])
    budget = peak // 4
    small = synthetic_graph(2000, 20000, "powerlaw", seed=0)  # compile the kernels outside the timing
    ps, ts = symmetric_propagation(small)
    epoch_plans(ps, ts, 2000, 1 << 16)
    for shared in (True, False):
        runs = [epoch_plans(p, t, nodes, budget, shared) for _ in range(repeats)]
        best = min(r[0] for r in runs)
        how = "P^T given, one PlanCache per direction" if shared else "no P^T, no PlanCache"
        rows.append({"case": f"power-law {nodes // 1000}k/{edges / 1e6:.1f}M GCN {DIMS} epoch plans ({how}), "
                             f"budget 1/4 of device peak ({budget / 2**20:.0f} MiB), partitions {runs[0][1]}",
                     "metric": "plan_seconds", "ours": best, "target": 2.0, "baseline": None,
                     "baseline_value": None, "ratio": None, "all": [r[0] for r in runs]})
    try:
        ds = load_gowalla()
    except FileNotFoundError as err:
        click.echo(f"skipping the Gowalla rows: {err}")
        ds = None
    if ds is not None:
        g = ds.graph
        gp, _ = symmetric_propagation(g)  # symmetric: P = P^T
        order = locality_order(gp[0], gp[1], g.num_nodes)
        for budget_g, slot, label in ((16 << 20, 1 << 20, "1 MiB slots, 16 MiB device"),
                                      (1 << 20, None, "1 MiB working set")):
            moved = {}
            for dedup in (False, True):
                plan = plan_propagation(*gp, order, 64, 4, budget_g, dedup, slot_bytes=slot)
                moved[dedup] = (h2d_bytes(plan), plan.num_partitions, len(plan.cache))
            rows.append({"case": f"gowalla d=64 float32, {label}: dedup {moved[True][1]} parts, "
                                 f"{moved[True][2]} cached rows; plain {moved[False][1]} parts",
                         "metric": "dedup_h2d_ratio", "ours": moved[True][0] / moved[False][0],
                         "target": 0.75 if slot else None, "baseline": "dedup=False (same order, budget)",
                         "baseline_value": moved[False][0], "ratio": moved[True][0] / moved[False][0]})
    click.echo(f"\n{'case':<140} {'metric':>16} {'ours':>10} {'target':>8}")
    for r in rows:
        target = "" if r["target"] is None else f"{r['target']:.2f}"
        click.echo(f"{r['case']:<140} {r['metric']:>16} {r['ours']:>10.3f} {target:>8}")
    write_result("full_graph_plan", rows, machine(), output,
                 config={"scale": scale, "repeats": repeats, "dims": DIMS})


if __name__ == "__main__":
    main()

"""Threads under load: the staged full-graph propagation and the neighbour sampler, quiet and with 4 busy
processes, before and after the thread policy (`graphrl.threads`, issue 32).

Cases (each variant in a fresh worker process, which times its case quiet, then starts ``--load``
competing processes, each a pure-Python busy loop pinned nowhere, and times it again):

- ``staged``: ``FullGraph(dedup=True, device="cpu")`` under ``MemoryManager(budgets={"device":
  "16MiB"}, device="cpu")`` on a power-law graph (``synthetic_graph(..., "powerlaw")``, 200k nodes /
  2M edges by default), width 64, float32: about 140 partitions and split hub rows. Metric: seconds
  per propagation (``FullGraph.multiply``), the median of ``--repeats`` (fewer when a phase passes
  ``--phase-seconds``).
- ``sampler``: ``NeighborSampler(fanouts=[15, 10, 5]).sample`` of batches of 1024 random seeds on a
  power-law graph (1M nodes / 10M edges by default). Metric: seconds per batch, the median over
  ``--repeats`` passes of ``--batches`` batches.

Variants: ``after`` (this tree, the policy in force: ``graphrl.threads.configure()``), ``opt-out`` (this
tree, ``GRAPHRL_THREADS=off``), ``passive`` (as ``after``, with ``OMP_WAIT_POLICY=PASSIVE``) and, with
``--baseline-tree DIR`` (e.g. ``git archive HEAD | tar -x -C DIR``), ``before``: that tree's code.
The row's ratio is loaded / quiet; the target is 3x. Each row records the mean number of runnable
tasks seen in ``/proc/loadavg`` while loaded and the 1-minute load average at the end.

Run ``python benchmarks/threads_under_load.py [--cases staged,sampler] [--baseline-tree DIR]``; writes
``benchmarks/results/threads_under_load.json``. Needs Linux (``/proc/loadavg``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import click

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "threads_under_load.json"
TARGET = 3.0
BUSY = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
        "    for _ in range(1_000_000):\n        pass\n")


def _runnable() -> int:
    """Runnable tasks now (the fourth field of /proc/loadavg, ``running/total``), this process included."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0])


class Competitors:
    """``n`` busy processes (pure-Python loops, one core each, exiting when their parent does)."""

    def __init__(self, n: int, new_session: bool = False) -> None:
        self.n = n
        self.new_session = new_session
        self.procs: list[subprocess.Popen] = []
        self.samples: list[int] = []
        self._stop = threading.Event()

    def __enter__(self) -> Competitors:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        self.procs = [subprocess.Popen([sys.executable, "-c", BUSY], env=env,
                                       start_new_session=self.new_session)
                      for _ in range(self.n)]
        threading.Thread(target=self._watch, daemon=True).start()
        time.sleep(1.0)  # let them reach the run queue
        self.samples.clear()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            self.samples.append(_runnable())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def _phase(step, repeats: int, budget_s: float) -> list[float]:
    """Seconds of up to ``repeats`` calls of ``step`` (at least 2, stopping once ``budget_s`` passed)."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (len(times) < 2 or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times


def _staged_step(args: dict):
    import torch

    from graphrl.datasets import synthetic_graph
    from graphrl.memory import MemoryManager
    from samplers.full_graph import FullGraph

    g = synthetic_graph(args["nodes"], args["edges"], "powerlaw", seed=0)
    mm = MemoryManager(budgets={"device": args["budget"]}, device="cpu")
    fg = FullGraph(g, memory=mm, device="cpu", dedup=True)
    h = torch.randn(args["nodes"], args["width"], generator=torch.Generator().manual_seed(0))
    fg.multiply(h)  # plans, compiles, allocates
    plan = fg.plan(args["width"])
    info = {"partitions": plan.num_partitions, "split_rows": int(plan.split_rows.shape[0])}
    return (lambda: fg.multiply(h)), info


def _sampler_step(args: dict):
    import numpy as np
    import torch

    from graphrl.datasets import synthetic_graph
    from samplers.neighbor import NeighborSampler

    g = synthetic_graph(args["sampler_nodes"], args["sampler_edges"], "powerlaw", seed=0)
    sampler = NeighborSampler(g, [15, 10, 5], seed=0)
    rng = np.random.default_rng(0)
    batches = [torch.from_numpy(rng.integers(0, g.num_nodes, 1024)) for _ in range(args["batches"])]
    for seeds in batches[:2]:
        sampler.sample(seeds)

    def step():
        for seeds in batches:
            sampler.sample(seeds)
    return step, {"batches": args["batches"]}


def worker(case: str, args: dict) -> dict:
    """Time ``case`` quiet and under load in this process; the result as a dict."""
    import numba
    import torch

    threads = None
    if not args.get("baseline"):  # the baseline tree predates the policy (an editable install would
        from graphrl import threads  # still find this tree's graphrl.threads: do not import it there)
    if threads is not None and os.environ.get("GRAPHRL_THREADS", "").strip().lower() != "off":
        threads.configure()
    step, info = (_staged_step if case == "staged" else _sampler_step)(args)
    per = args["batches"] if case == "sampler" else 1
    quiet = _phase(step, args["repeats"], args["phase_seconds"])
    with Competitors(args["load"], args["new_session"]) as comp:
        loaded = _phase(step, args["repeats"], args["phase_seconds"])
        runnable = statistics.mean(comp.samples) if comp.samples else float("nan")
    q, lo = statistics.median(quiet) / per, statistics.median(loaded) / per
    return {"quiet_s": q, "loaded_s": lo, "ratio": lo / q, "quiet_runs": len(quiet),
            "loaded_runs": len(loaded),
            "runnable_mean": runnable, "load_average_1min": os.getloadavg()[0],
            "torch_threads": torch.get_num_threads(), "numba_threads": numba.get_num_threads(),
            "policy": None if threads is None else str(threads.policy()), **info}


def run_variant(case: str, variant: str, args: dict, baseline_tree: str | None) -> dict:
    env = dict(os.environ)
    env.pop("GRAPHRL_THREADS", None)
    if variant == "opt-out":
        env["GRAPHRL_THREADS"] = "off"
    if variant == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    cwd = None
    if variant == "before":
        env["PYTHONPATH"] = baseline_tree
        cwd = baseline_tree
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", case, "--worker-args",
           json.dumps({**args, "baseline": variant == "before"})]
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise click.ClickException(f"{case}/{variant} worker failed:\n{out.stderr[-3000:]}")
    return {"case": case, "variant": variant, **json.loads(out.stdout.strip().splitlines()[-1])}


CASE_NAMES = {"staged": "staged FullGraph, power-law {nodes_m}/{edges_m}, d={width}, {budget}",
              "sampler": "NeighborSampler [15,10,5] b1024, power-law {s_nodes_m}/{s_edges_m}"}


def _m(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


@click.command()
@click.option("--cases", default="staged,sampler", show_default=True,
              help="Comma-separated: staged, sampler.")
@click.option("--variants", default="after,opt-out,passive", show_default=True,
              help="Comma-separated: after, opt-out, passive (and before, added by --baseline-tree).")
@click.option("--baseline-tree", type=click.Path(file_okay=False, exists=True), default=None,
              help="A checkout of the code before the policy (e.g. git archive HEAD), run as 'before'.")
@click.option("--load", default=4, show_default=True, help="Competing busy processes.")
@click.option("--nodes", default=200_000, show_default=True)
@click.option("--edges", default=2_000_000, show_default=True)
@click.option("--width", default=64, show_default=True)
@click.option("--budget", default="16MiB", show_default=True, help="Device-tier budget of the staged case.")
@click.option("--sampler-nodes", default=1_000_000, show_default=True)
@click.option("--sampler-edges", default=10_000_000, show_default=True)
@click.option("--batches", default=30, show_default=True, help="Sampler batches per timed pass.")
@click.option("--repeats", default=5, show_default=True, help="Timed calls (passes) per phase; the median.")
@click.option("--phase-seconds", default=40.0, show_default=True,
              help="Stop a phase after this (>= 2 calls).")
@click.option("--new-session/--same-session", default=False, show_default=True,
              help="Start the competitors in their own session. With autogroup scheduling (Linux's default "
                   "on desktops) CPU time is then shared between sessions, not threads; the same session is "
                   "the harder case: every thread gets its share.")
@click.option("--output", default=str(RESULTS), show_default=True)
@click.option("--worker", "worker_case", type=click.Choice(["staged", "sampler"]), default=None, hidden=True)
@click.option("--worker-args", default=None, hidden=True)
def main(cases, variants, baseline_tree, load, nodes, edges, width, budget, sampler_nodes, sampler_edges,
         batches, repeats, phase_seconds, new_session, output, worker_case, worker_args) -> None:
    if worker_case is not None:
        click.echo(json.dumps(worker(worker_case, json.loads(worker_args))))
        return
    sys.path.insert(0, str(HERE))
    from _report import machine, write_result

    args = {"nodes": nodes, "edges": edges, "width": width, "budget": budget, "sampler_nodes": sampler_nodes,
            "sampler_edges": sampler_edges, "batches": batches, "repeats": repeats,
            "phase_seconds": phase_seconds, "load": load, "new_session": new_session}
    names = [v for v in variants.split(",") if v]
    if baseline_tree:
        names = ["before", *[v for v in names if v != "before"]]
    machine_info = machine(uptime_before=Path("/proc/loadavg").read_text().strip(),
                           autogroup=Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
                           if Path("/proc/sys/kernel/sched_autogroup_enabled").exists() else None)
    results = []
    for case in [c for c in cases.split(",") if c]:
        for variant in names:
            r = run_variant(case, variant, args, baseline_tree)
            results.append(r)
            click.echo(f"{case:8s} {variant:8s} quiet {r['quiet_s'] * 1e3:9.1f} ms  loaded "
                       f"{r['loaded_s'] * 1e3:9.1f} ms  x{r['ratio']:6.1f}  (runnable "
                       f"{r['runnable_mean']:.1f}, load1 {r['load_average_1min']:.1f})")
    label = {"nodes_m": _m(nodes), "edges_m": _m(edges), "width": width, "budget": budget,
             "s_nodes_m": _m(sampler_nodes), "s_edges_m": _m(sampler_edges)}
    click.echo(f"\n{'case':58s} {'variant':8s} {'quiet ms':>9s} {'loaded ms':>10s} {'ratio':>7s} "
               f"target {TARGET:g}x")
    rows = []
    for r in results:
        name = CASE_NAMES[r["case"]].format(**label) + f", load {load}"
        ok = "ok" if r["ratio"] <= TARGET else "MISSED"
        click.echo(f"{name:58s} {r['variant']:8s} {r['quiet_s'] * 1e3:9.1f} {r['loaded_s'] * 1e3:10.1f} "
                   f"{r['ratio']:7.2f} {ok}")
        base = next((b for b in results if b["case"] == r["case"] and b["variant"] == "before"), None)
        if r["variant"] == "before":
            continue
        rows.append({"case": f"{name}, {r['variant']}", "metric": "loaded_over_quiet_time",
                     "ours": r["ratio"],
                     "baseline": "before (--baseline-tree)" if base else None,
                     "baseline_value": base["ratio"] if base else None,
                     "ratio": (base["ratio"] / r["ratio"]) if base else None, "target": TARGET,
                     "quiet_s": r["quiet_s"], "loaded_s": r["loaded_s"]})
    machine_info["uptime_after"] = Path("/proc/loadavg").read_text().strip()
    write_result("threads_under_load", rows, machine_info, output, config=args, cases=results)


if __name__ == "__main__":
    main()

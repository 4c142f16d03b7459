"""Threads under load: the staged full-graph propagation and the neighbour sampler, quiet and with 4 busy
competitors, under the thread policy (`graphrl.threads`, issue 32) and its alternatives.

Each variant runs in a fresh worker process, which times its case in ``--rounds`` rounds of a quiet phase
then a loaded phase (it starts ``--load`` competitors, times, stops them): either ``--load`` single-threaded
pure-Python busy processes (``--competitor processes``) or one process with ``--load`` busy threads
(``threads``), in our session or, with ``--new-session``, their own (autogroup scheduling shares the CPU
between sessions, then between the threads of a session).

- ``staged``: ``FullGraph(dedup=True, device="cpu")`` under ``MemoryManager(budgets={"device":
  "16MiB"}, device="cpu")`` on a power-law graph (``synthetic_graph(..., "powerlaw")``, 200k nodes /
  2M edges by default), width 64, float32: about 140 partitions and split hub rows. Metric: seconds
  per propagation (``FullGraph.multiply``), the median of ``--repeats`` (fewer when a phase passes
  ``--phase-seconds``).
- ``sampler``: ``NeighborSampler(fanouts=[15, 10, 5]).sample`` of batches of 1024 random seeds on a
  power-law graph (1M nodes / 10M edges by default). Metric: seconds per batch, the median over
  ``--repeats`` passes of ``--batches`` batches.
- ``control``: what the scheduler allows in the same placement, with no code of ours in the way: a
  fixed amount of register-only arithmetic (``--control-ms`` of one core, calibrated quiet), split into
  16 equal chunks per thread of ``team_size``, claimed dynamically by `graphrl.kernels.parallel_for`
  (with one thread: all on the calling thread), timed as the sampler is (per call, over passes of
  ``--batches`` calls). Its ratio is the bound the other cases are read against (the ``x control``
  column): a case can only beat it by getting more than its fair share.

Variants: ``after`` (this tree, the policy in force: ``graphrl.threads.configure()``), ``threads=N``
(``GRAPHRL_THREADS=N``), ``opt-out`` (``GRAPHRL_THREADS=off``), ``passive`` (as ``after``, with
``OMP_WAIT_POLICY=PASSIVE``) and, with ``--baseline-tree DIR`` (e.g. ``git archive HEAD | tar -x -C
DIR``), ``before``: that tree's code. A round's ratio is loaded / quiet (medians); the row gives the median
round's and the spread; the target is 3x. Each row also gives the process's CPU time per call and its
CPU share (CPU / wall time) quiet and loaded, which separates a call that waits (share falls below what
the scheduler grants its runnable threads) from one that gets fewer cycles; the runnable tasks seen in
``/proc/loadavg`` (before each quiet phase, and during the loaded ones) and the 1-minute load average.

The output names the placement (who competes, in which session, and what that means for the CFS share
of each thread of ours) and, for competitors in our session, the fair-share bound: with ``c`` cores,
``n`` busy competitors and ``t`` busy threads of ours, each thread gets ``c / (n + t)`` of a core.

Run ``python benchmarks/threads_under_load.py [--cases staged,sampler,control] [--variants after,threads=1]``;
prints a table and writes ``benchmarks/results/threads_under_load.json``. Needs Linux (``/proc/loadavg``).
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
AUTOGROUP_NICE = "GRAPHRL_BENCH_AUTOGROUP_NICE"  # set by --autogroup-nice for the competitors' sessions
BUSY = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
        "    for _ in range(1_000_000):\n        pass\n")
# one process, n busy threads: SHA-256 of 1 MiB releases the GIL for ~2 ms, so all n stay runnable
BUSY_THREADS = ("import hashlib, os, sys, threading\nparent, buf = os.getppid(), bytes(1 << 20)\n"
                "def spin():\n    while True:\n        hashlib.sha256(buf).digest()\n"
                "for _ in range(int(sys.argv[1]) - 1):\n"
                "    threading.Thread(target=spin, daemon=True).start()\n"
                "while os.getppid() == parent:\n"
                "    for _ in range(50):\n        hashlib.sha256(buf).digest()\n")


def _runnable() -> int:
    """Runnable tasks now (the fourth field of /proc/loadavg, ``running/total``), this process included."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0])


class Competitors:
    """``n`` busy processes (pure-Python loops, one core each), or one process with ``n`` busy threads
    (``threads=True``), exiting when their parent does."""

    def __init__(self, n: int, new_session: bool = False, threads: bool = False) -> None:
        self.n = n
        self.new_session = new_session
        self.threads = threads
        self.procs: list[subprocess.Popen] = []
        self.samples: list[int] = []
        self._stop = threading.Event()

    def __enter__(self) -> Competitors:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        nice = os.environ.get(AUTOGROUP_NICE) if self.new_session else None
        cmds = ([[sys.executable, "-c", BUSY_THREADS, str(self.n)]] if self.threads
                else [[sys.executable, "-c", BUSY]] * self.n)
        if nice is not None:  # their own sessions weigh what ours does (see --autogroup-nice)
            cmds = [[c[0], "-c", f"open('/proc/self/autogroup', 'w').write('{int(nice)}')\n" + c[2], *c[3:]]
                    for c in cmds]
        self.procs = [subprocess.Popen(cmd, env=env, start_new_session=self.new_session) for cmd in cmds]
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


def _phase(step, repeats: int, budget_s: float) -> tuple[list[float], list[float]]:
    """Wall and process-CPU seconds of up to ``repeats`` calls of ``step`` (at least 2, stopping once
    ``budget_s`` passed)."""
    times: list[float] = []
    cpu: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (len(times) < 2 or time.perf_counter() - start < budget_s):
        t, c = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return times, cpu


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


def _control_step(args: dict):
    import numba

    from graphrl.kernels import parallel_for
    from graphrl.threads import team_size

    @numba.njit(nogil=True)
    def chain(n):  # a dependent multiply-xorshift chain: no memory traffic, no vectorisation
        x = numba.uint64(88172645463325252)
        for _ in range(n):
            x ^= x >> numba.uint64(13)
            x *= numba.uint64(0x9E3779B97F4A7C15)
        return x

    chain(1000)
    n = 1 << 20
    while True:  # calibrate (quiet): iterations for --control-ms of one core
        t = time.perf_counter()
        chain(n)
        took = time.perf_counter() - t
        if took > 0.02:
            break
        n *= 2
    total = max(1, int(n * args["control_ms"] / 1e3 / took))
    threads = team_size()
    chunks = 16 * threads
    per = -(-total // chunks)
    def step():  # a pass of --batches calls, like the sampler's: the metric is throughput, not one slice
        for _ in range(args["batches"]):
            parallel_for(lambda i: chain(per), chunks, threads)
    return step, {"control_iterations": total}


def worker(case: str, args: dict) -> dict:
    """Time ``case`` quiet and under load in this process; the result as a dict."""
    import numba
    import torch

    threads = None
    if not args.get("baseline"):  # the baseline tree predates the policy (an editable install would
        from graphrl import threads  # still find this tree's graphrl.threads: do not import it there)
    if threads is not None and os.environ.get("GRAPHRL_THREADS", "").strip().lower() != "off":
        threads.configure()
    step, info = {"staged": _staged_step, "sampler": _sampler_step, "control": _control_step}[case](args)
    per = args["batches"] if case in ("sampler", "control") else 1
    med = statistics.median
    rounds, quiet_runnable, loaded_runnable = [], [], []
    for _ in range(args["rounds"]):  # quiet then loaded, in turn: other load on the machine drifts
        quiet_runnable.append(_runnable() - 1)
        quiet, quiet_cpu = _phase(step, args["repeats"], args["phase_seconds"])
        with Competitors(args["load"], args["new_session"], args["competitor"] == "threads") as comp:
            loaded, loaded_cpu = _phase(step, args["repeats"], args["phase_seconds"])
            loaded_runnable.extend(comp.samples)
        rounds.append({"quiet_s": med(quiet) / per, "loaded_s": med(loaded) / per,
                       "ratio": med(loaded) / med(quiet), "quiet_cpu_s": med(quiet_cpu) / per,
                       "loaded_cpu_s": med(loaded_cpu) / per, "quiet_runs": len(quiet),
                       "loaded_runs": len(loaded)})
    ratios = [r["ratio"] for r in rounds]
    out = {k: med([r[k] for r in rounds]) for k in ("quiet_s", "loaded_s", "quiet_cpu_s", "loaded_cpu_s")}
    return {**out, "ratio": med(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "quiet_share": out["quiet_cpu_s"] / out["quiet_s"],
            "loaded_share": out["loaded_cpu_s"] / out["loaded_s"], "rounds": rounds,
            "runnable_quiet_mean": statistics.mean(quiet_runnable),
            "runnable_mean": statistics.mean(loaded_runnable) if loaded_runnable else float("nan"),
            "load_average_1min": os.getloadavg()[0],
            "torch_threads": torch.get_num_threads(), "numba_threads": numba.get_num_threads(),
            "team_size": None if threads is None else threads.team_size(),
            "policy": None if threads is None else str(threads.policy()), **info}


def run_variant(case: str, variant: str, args: dict, baseline_tree: str | None) -> dict:
    env = dict(os.environ)
    env.pop("GRAPHRL_THREADS", None)
    if variant.startswith("threads="):  # a fixed count (numba's pool sized to allow it)
        n = variant.split("=", 1)[1]
        env["GRAPHRL_THREADS"] = n
        env["NUMBA_NUM_THREADS"] = str(max(int(n), int(env.get("NUMBA_NUM_THREADS", "0") or 0)))
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
              "sampler": "NeighborSampler [15,10,5] b1024, power-law {s_nodes_m}/{s_edges_m}",
              "control": "control: {control_ms:g} ms of arithmetic, 16 chunks a thread"}


def placement(load: int, competitor: str, new_session: bool, autogroup: str | None, cores: int) -> str:
    """The load's placement in words, and what the scheduler makes of it."""
    who = (f"{load} busy single-threaded processes" if competitor == "processes"
           else f"1 process with {load} busy threads")
    if new_session and competitor == "processes":
        where = "each in its own session"
    elif new_session:
        where = "in its own session"
    else:
        where = "in this benchmark's session"
    if autogroup != "1":
        rule = "autogroup off: CFS shares the cores per thread"
    elif new_session:
        rule = "autogroup on: CFS shares the cores between sessions first, then between a session's threads"
    else:
        rule = "autogroup on, one session: CFS shares the cores per thread"
    text = f"{who}, {where} ({rule})"
    if autogroup != "1" or not new_session:
        shares = ", ".join(f"{t} thread{'s' if t > 1 else ''} of ours "
                           f"{f'{cores}/{load + t} core' if load + t > cores else 'a core'} each -> "
                           f"at least {max(1.0, (load + t) / cores):.2f}x" for t in (1, 2))
        text += f"; fair share on {cores} cores: {shares} (times any CPU-time growth)"
    return text


def _m(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


@click.command()
@click.option("--cases", default="staged,sampler,control", show_default=True,
              help="Comma-separated: staged, sampler, control.")
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
@click.option("--control-ms", default=3.0, show_default=True,
              help="One core's milliseconds of arithmetic per control call (about a sampler batch).")
@click.option("--repeats", default=5, show_default=True, help="Timed calls (passes) per phase; the median.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(min=1),
              help="Quiet and loaded phases, in turn, per variant; the row's ratio is the median round's.")
@click.option("--phase-seconds", default=40.0, show_default=True,
              help="Stop a phase after this (>= 2 calls).")
@click.option("--new-session/--same-session", default=False, show_default=True,
              help="Start the competitors in their own session. With autogroup scheduling (Linux's default "
                   "on desktops) CPU time is then shared between sessions, not threads; the same session is "
                   "the harder case: every thread gets its share.")
@click.option("--competitor", type=click.Choice(["processes", "threads"]), default="processes",
              show_default=True, help="The load: --load single-threaded busy processes, or one process with "
                                      "--load busy threads.")
@click.option("--autogroup-nice", type=click.IntRange(-20, 19), default=None,
              help="Write this to /proc/self/autogroup: the CPU weight of this run's session against "
                   "other sessions (autogroup scheduling), to measure on a machine others are using "
                   "(negative needs root; run under setsid so that only this run's session changes). "
                   "Competitors in their own sessions (--new-session) get the same weight.")
@click.option("--output", default=str(RESULTS), show_default=True)
@click.option("--worker", "worker_case", type=click.Choice(["staged", "sampler", "control"]), default=None,
              hidden=True)
@click.option("--worker-args", default=None, hidden=True)
def main(cases, variants, baseline_tree, load, nodes, edges, width, budget, sampler_nodes, sampler_edges,
         batches, control_ms, repeats, rounds, phase_seconds, new_session, competitor, autogroup_nice, output,
         worker_case, worker_args) -> None:
    if worker_case is not None:
        click.echo(json.dumps(worker(worker_case, json.loads(worker_args))))
        return
    sys.path.insert(0, str(HERE))
    from _report import machine, write_result

    from graphrl.threads import available_cores

    args = {"nodes": nodes, "edges": edges, "width": width, "budget": budget, "sampler_nodes": sampler_nodes,
            "sampler_edges": sampler_edges, "batches": batches, "control_ms": control_ms, "repeats": repeats,
            "rounds": rounds,
            "competitor": competitor, "autogroup_nice": autogroup_nice,
            "phase_seconds": phase_seconds, "load": load, "new_session": new_session}
    if autogroup_nice is not None:
        Path("/proc/self/autogroup").write_text(str(autogroup_nice))
        os.environ[AUTOGROUP_NICE] = str(autogroup_nice)
    names = [v for v in variants.split(",") if v]
    if baseline_tree:
        names = ["before", *[v for v in names if v != "before"]]
    machine_info = machine(uptime_before=Path("/proc/loadavg").read_text().strip(),
                           session_autogroup=Path("/proc/self/autogroup").read_text().strip(),
                           autogroup=Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
                           if Path("/proc/sys/kernel/sched_autogroup_enabled").exists() else None)
    where = placement(load, competitor, new_session, machine_info["autogroup"], available_cores())
    machine_info["placement"] = where
    click.echo(f"load placement: {where}")
    if autogroup_nice is not None:
        click.echo(f"this run's session weighs as nice {autogroup_nice} against the machine's other sessions "
                   "(--autogroup-nice); the quiet phases are quiet only if nothing else runs")
    results = []
    for case in [c for c in cases.split(",") if c]:
        for variant in names:
            if case == "control" and variant == "before":
                continue  # the control runs no code that the baseline tree changes
            r = run_variant(case, variant, args, baseline_tree)
            results.append(r)
            click.echo(f"{case:8s} {variant:10s} quiet {r['quiet_s'] * 1e3:9.2f} ms  loaded "
                       f"{r['loaded_s'] * 1e3:9.2f} ms  x{r['ratio']:5.2f} ({r['ratio_min']:.2f}-"
                       f"{r['ratio_max']:.2f})  CPU share {r['quiet_share']:.2f} -> {r['loaded_share']:.2f}  "
                       f"CPU per call x{r['loaded_cpu_s'] / r['quiet_cpu_s']:.2f}  "
                       f"(runnable quiet {r['runnable_quiet_mean']:.1f}, loaded {r['runnable_mean']:.1f}; "
                       f"load1 {r['load_average_1min']:.1f}; team {r['team_size']})")
    label = {"nodes_m": _m(nodes), "edges_m": _m(edges), "width": width, "budget": budget,
             "s_nodes_m": _m(sampler_nodes), "s_edges_m": _m(sampler_edges), "control_ms": control_ms}
    click.echo(f"\nload: {where}")
    click.echo(f"{'case':58s} {'variant':10s} {'quiet ms':>9s} {'loaded ms':>10s} {'ratio':>7s} "
               f"{'spread':>11s} {'x control':>9s} target {TARGET:g}x")
    rows = []
    for r in results:
        name = CASE_NAMES[r["case"]].format(**label) + f", load {load}"
        ok = "ok" if r["ratio"] <= TARGET else "MISSED"
        control = next((c for c in results if c["case"] == "control" and c["variant"] == r["variant"]), None)
        over = r["ratio"] / control["ratio"] if control and r is not control else None
        click.echo(f"{name:58s} {r['variant']:10s} {r['quiet_s'] * 1e3:9.2f} {r['loaded_s'] * 1e3:10.2f} "
                   f"{r['ratio']:7.2f} {r['ratio_min']:5.2f}-{r['ratio_max']:<5.2f} "
                   f"{'' if over is None else f'{over:.2f}':>9s} {ok}")
        base = next((b for b in results if b["case"] == r["case"] and b["variant"] == "before"), None)
        if r["variant"] == "before":
            continue
        rows.append({"case": f"{name}, {r['variant']}", "metric": "loaded_over_quiet_time",
                     "ours": r["ratio"],
                     "baseline": "before (--baseline-tree)" if base else None,
                     "baseline_value": base["ratio"] if base else None,
                     "ratio": (base["ratio"] / r["ratio"]) if base else None, "target": TARGET,
                     "control_ratio": control["ratio"] if control else None, "over_control": over,
                     "placement": where,
                     "quiet_s": r["quiet_s"], "loaded_s": r["loaded_s"], "ratio_min": r["ratio_min"],
                     "ratio_max": r["ratio_max"], "quiet_cpu_share": r["quiet_share"],
                     "loaded_cpu_share": r["loaded_share"],
                     "cpu_growth": r["loaded_cpu_s"] / r["quiet_cpu_s"]})
    machine_info["uptime_after"] = Path("/proc/loadavg").read_text().strip()
    write_result("threads_under_load", rows, machine_info, output, config=args, cases=results)


if __name__ == "__main__":
    main()

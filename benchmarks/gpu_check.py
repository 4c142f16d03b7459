"""One script for a lent GPU machine: the CUDA tests, then the numba.cuda kernels of both engines for real.

``python benchmarks/gpu_check.py`` runs, in this order and within ``--budget`` seconds (8 minutes on one
H200, Python's start included):

0. ``pytest -m gpu`` (every test that runs a real CUDA path; target: every collected one ran, none skipped,
   and passed in under 3 minutes; its output goes beside the JSON as ``pytest_gpu.txt``);

then the parts, one module each beside this driver (parts 1 to 5 within ``--parts-seconds``, part 6
in what is left):

1. correctness of the GPU neighbour sampler against the CPU kernels (``gpu_sampler_check.py``);
5. heterogeneous sampling on the GPU against the CPU, then its speed (``gpu_hetero_check.py``, run
   right after part 1); LABOR (``LaborSampler``) on the GPU against the CPU, then its ``sample()``
   edges/s on part 2's graph (``gpu_sampler_check.labor_part``, after part 2);
2. sampled edges/s of the kernels and of ``NeighborSampler.sample()``, device graph and UVA, uniform and
   weighted, a per-layer profile and the host-side steps of a layer (``gpu_sampler_check.py``);
3. feature gather GB/s, device table and mapped host table (``gpu_features_check.py``);
4. replay windows gathered on the GPU: byte-equal to the CPU's, then windows/s and GB/s against the CPU
   gather and copy (``gpu_replay_check.py``);
6. full-graph GCN with host-resident vertex data (HongTu): all on the device vs `FullGraph`'s staged
   path at 1/4 of the device run's peak, and a graph whose vertex data is 3x the budget
   (``gpu_full_graph_check.py``; ``--only-full-graph``, ``--fg-scale`` to shrink it,
   ``--fg-dry-run`` for a tiny CPU run of the same code).

It ends with ONE table: every target of the run (pytest, the correctness of parts 1, 4 and 5 and of
LABOR, issue 27's sampler targets: ``sample()`` >= 1G edges/s at b1024 on the device graph, alone and
through ``NeighborLoader`` with batches in flight, UVA never slower at the larger batch (kernels and
``sample()``), typed graphs >= 3x our CPU sampler; part 6's epoch against the PCIe limit
and the all-on-device epoch, the 3x case, the total time), its figure and
whether it was met; the exit status is 1 when one was not. It always ends with that table: each part runs
under a guard that records an exception's traceback in ``result["parts"]`` and goes on (a row "PART: ran to
its end" says failed, skipped for lack of time, or stopped); SIGTERM (the device command's ``timeout``) and
SIGALRM (``--budget`` + 40 s) stop the run with the table printed; at ``--budget`` + 60 s faulthandler dumps
every stack and exits. ``benchmarks/results/gpu_check.json`` (``--output``) is written after every step with
the targets as they stand and the commit (``source``), so a crash or a kill loses nothing done before it.
Each part checks the clock against its budget and shrinks its repeats if it runs late; part 6 is skipped
with less than ``PART6_MIN_SECONDS`` left. ``--only-replay`` runs part 4 alone,
``--only-sampler`` parts 1, 5 and 2, ``--only-full-graph`` part 6; ``--dry-run`` (``--fg-dry-run``)
runs part 6 tiny on the CPU. Without a usable CUDA device it prints why and exits with status 2.
``NUMBA_ENABLE_CUDASIM=1`` with tiny sizes
(``--nodes 2000 --edges-per-node 5 --check-nodes 300 --check-edges 3000 --batches 1 --feature-rows 500
--batch-size 16``; for part 4 ``--only-replay --replay-check-steps 300 --replay-check-batches 2
--replay-steps 2000 --replay-batch 8 --replay-window 4 --replay-repeats 2``) runs the same code in
numba's simulator, for testing the script itself. On a lent machine: ``bash scripts/gpu_prep.sh`` prints the
command (docs/performance.md, "Running the GPU check on a bare GPU machine"). Figures from real GPUs:
docs/performance.md.

    python benchmarks/gpu_check.py --help
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # before the imports: torch and numba take seconds of the budget

import faulthandler  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from xml.etree import ElementTree  # noqa: E402

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
from gpu_full_graph_check import full_graph_part, full_graph_targets, print_full_graph  # noqa: E402
from gpu_hetero_check import hetero_part, hetero_targets  # noqa: E402
from gpu_replay_check import choice_target, print_replay, replay_part  # noqa: E402
from gpu_sampler_check import big_graph, check_correctness, labor_part, sampler_part  # noqa: E402

REPO = _HERE.parent
RESULTS = REPO / "benchmarks" / "results" / "gpu_check.json"
DRY_RESULTS = REPO / "benchmarks" / "results" / "gpu_check_dry_run.json"
SOURCE = REPO / ".gpudata" / "source.json"
"""Where ``scripts/gpu_prep.sh`` writes the commit and ``git status --short`` for a tree without ``.git``."""
PYTEST_SECONDS = 180.0
"""Target: ``pytest -m gpu`` passes in under this many seconds."""
PYTEST_TEST_SECONDS = 120
"""Per-test limit given to pytest-timeout where it is installed (a hung test fails, the others run)."""
PART6_MIN_SECONDS = 150.0
"""Part 6 is skipped (a missed target, said so in the table) with less than this left of ``--budget``: its
data, all-on-device baseline and first staged epoch at ``--fg-scale 0.5`` do not fit in less."""
ALARM_AFTER = 40.0
"""Seconds past ``--budget`` at which SIGALRM stops the run (SystemExit: the closing table still prints)."""
HARD_AFTER = 60.0
"""Seconds past ``--budget`` at which faulthandler dumps every thread's stack and exits (a hang in C code,
where no Python signal handler runs; the JSON written after the last step keeps its targets)."""


def _no_gpu_exit() -> None:
    click.echo("gpu_check: no CUDA GPU here (numba.cuda.is_available() is False: no device or no driver). "
               "This script measures the numba.cuda kernels on a real GPU; run it on a machine with one "
               "(or set NUMBA_ENABLE_CUDASIM=1 with tiny sizes to test the script).", err=True)
    sys.exit(2)


@dataclass
class _Run:
    """One run's results and clock: every part writes into ``result``; `write` saves it with its targets."""

    result: dict
    t0: float
    output: str
    budget: float

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def write(self, quiet: bool = True) -> None:
        _write(self.result, self.t0, self.output, self.budget, quiet)

    def step(self, name: str, fn, need: float = 0.0) -> bool:
        """Run part ``name`` (``fn()``) unless less than ``need`` seconds are left; an exception is recorded
        in ``result["parts"][name]["error"]`` (its traceback) and the run goes on. True when it ran to its
        end. The JSON is written after it either way."""
        parts = self.result.setdefault("parts", {})
        if self.left() < need:
            parts[name] = {"status": "skipped", "why": f"{self.left():.0f} s left, needs {need:.0f} s"}
            click.echo(f"  {name}: skipped ({parts[name]['why']})", err=True)
            self.write()
            return False
        t = time.perf_counter()
        parts[name] = {"status": "running"}  # what a signal that stops the run finds
        try:
            fn()
            parts[name] = {"status": "done", "seconds": time.perf_counter() - t}
            return True
        except Exception:  # noqa: BLE001 - any failure of a part is recorded and the next part runs
            parts[name] = {"status": "failed", "seconds": time.perf_counter() - t,
                           "error": traceback.format_exc()}
            click.echo(f"  {name} FAILED at {time.perf_counter() - self.t0:.0f} s:\n{parts[name]['error']}",
                       err=True)
            return False
        finally:
            self.write()


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
@click.option("--fg-dry-run", "--dry-run", "fg_dry_run", is_flag=True,
              help="Part 6 alone, tiny, on the CPU (tests the script; no GPU needed).")
@click.option("--pytest/--no-pytest", "with_pytest", default=True, show_default=True,
              help="Run `pytest -m gpu` first.")
@click.option("--budget", default=480.0, show_default=True,
              help="Seconds the whole check must fit in, Python's start included (8 minutes).")
@click.option("--parts-seconds", default=110.0, show_default=True, help="Seconds for parts 1 to 5.")
@click.option("--seed", default=0, show_default=True)
@click.option("--output", default=None, type=click.Path(dir_okay=False),
              help=f"Results file [default: {RESULTS.name}; a dry run {DRY_RESULTS.name}, never the GPU's]; "
                   "pytest's output goes beside it (pytest_gpu.txt)")
def main(check_nodes, check_edges, check_batches, nodes, edges_per_node, fanouts, batch_size, batches,
         feature_rows, feature_dim, replay_check_steps, replay_check_batches, replay_steps, replay_batch,
         replay_window, replay_repeats, only_replay, only_sampler, only_full_graph, with_full_graph, fg_scale,
         fg_epochs, fg_dry_run, with_pytest, budget, parts_seconds, seed, output) -> None:
    """The CUDA tests, then correctness and speed of both engines on a real GPU (see the module docstring)."""
    output = output or str(DRY_RESULTS if fg_dry_run else RESULTS)
    alone_fg = fg_dry_run or only_full_graph
    if alone_fg and not fg_dry_run and not torch.cuda.is_available():
        _no_gpu_exit()
    if not alone_fg and not cuda.is_available():
        _no_gpu_exit()
    run = _Run({"benchmark": "gpu_check", "source": _source(), "machine": {}, "rows": [], "parts": {}},
               T0, output, budget)
    pid = os.getpid()

    def stop(signum, frame) -> None:
        if os.getpid() != pid:  # a process a part forked: it leaves at once, the run's table is the parent's
            os._exit(128 + signum)
        raise SystemExit(f"stopped by {signal.Signals(signum).name} at {time.perf_counter() - T0:.0f} s")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGALRM, stop)
    signal.alarm(max(int(run.left() + ALARM_AFTER), 1))
    faulthandler.dump_traceback_later(max(run.left() + HARD_AFTER, 1.0), exit=True)
    try:
        if alone_fg:
            _full_graph_alone(run, fg_scale, fg_epochs, seed, fg_dry_run)
        else:
            fans = [int(k) for k in fanouts.split(",")]
            replay_args = (replay_check_steps, replay_check_batches, replay_steps, replay_batch,
                           replay_window, replay_repeats, seed)
            _all_parts(run, check_nodes, check_edges, check_batches, nodes, edges_per_node, fans, batch_size,
                       batches, feature_rows, feature_dim, replay_args, only_replay, only_sampler,
                       with_full_graph, fg_scale, fg_epochs, with_pytest, parts_seconds, seed)
    except SystemExit as exc:  # SIGTERM (the device tool's timeout) or SIGALRM: the table still prints
        run.result["stopped"] = str(exc)
        click.echo(f"gpu_check: {exc}", err=True)
    except Exception:  # noqa: BLE001 - outside the parts (their printing, say): recorded, the table prints
        error = traceback.format_exc()
        run.result["parts"]["gpu_check driver"] = {"status": "failed", "error": error}
        click.echo(f"gpu_check: failed outside the parts:\n{error}", err=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut the table short
        faulthandler.cancel_dump_traceback_later()
    sys.exit(_finish(run.result, run.t0, run.output, run.budget))


def _full_graph_args(fg_scale: float, fg_epochs: int, seed: int) -> dict:
    return {"nodes": int(2_400_000 * fg_scale), "edges": int(62_000_000 * fg_scale), "epochs": fg_epochs,
            "seed": seed}


def _full_graph_alone(run: _Run, fg_scale: float, fg_epochs: int, seed: int, dry_run: bool) -> None:
    """``--only-full-graph`` and ``--dry-run``: part 6 alone (on the CPU, tiny, for a dry run)."""
    run.result["machine"] = {"cpus": os.cpu_count(), "torch": torch.__version__,
                             "cuda_device": None if dry_run else torch.cuda.get_device_name()}

    def part6() -> None:
        full_graph_part(run.result, **_full_graph_args(fg_scale, fg_epochs, seed), dry_run=dry_run,
                        seconds=None if dry_run else run.left() - 10, on_progress=run.write, echo=click.echo)
        print_full_graph(run.result, click.echo)

    run.step("part 6 full graph", part6, need=0.0 if dry_run else PART6_MIN_SECONDS)


def _all_parts(run: _Run, check_nodes, check_edges, check_batches, nodes, edges_per_node, fans, batch_size,
               batches, feature_rows, feature_dim, replay_args, only_replay, only_sampler, with_full_graph,
               fg_scale, fg_epochs, with_pytest, parts_seconds, seed) -> None:
    """pytest, then parts 1, 5, 2, LABOR, 3, 4 and 6 (or the ones ``--only-*`` names), each under
    `_Run.step`."""
    result, t0 = run.result, run.t0
    simulator = bool(numba.config.ENABLE_CUDASIM)

    def machine() -> None:
        device = "simulator" if simulator else cuda.get_current_device().name
        device = device.decode() if isinstance(device, bytes) else str(device)
        click.echo(f"gpu_check on {device}", err=True)
        result["machine"] = {"cpus": os.cpu_count(), "torch": torch.__version__.split("+")[0],
                             "numba": numba.__version__, "numpy": sys.modules["numpy"].__version__,
                             "cuda_device": device, "simulator": simulator,
                             "python": platform.python_version()}

    run.step("machine", machine)
    if only_replay:
        run.step("part 4 replay", lambda: replay_part(result, *replay_args, seconds=parts_seconds))
        print_replay(result)
        return
    if with_pytest and not only_sampler and not simulator:
        def pytest_gpu() -> None:
            result["pytest_gpu"] = _pytest_gpu(min(PYTEST_SECONDS, max(run.left() - 60, 30.0)),
                                               Path(run.output).parent)

        run.step("pytest -m gpu", pytest_gpu)
    start = time.perf_counter()

    def part1() -> None:
        result["correctness"] = check_correctness(check_nodes, check_edges, fans, batch_size, check_batches,
                                                  seed)
        result["correctness"]["sampler_ok"] = bool(result["correctness"]["deterministic_ok"])
        click.echo(f"  correctness done at {time.perf_counter() - t0:.0f} s", err=True)

    run.step("part 1 sampler correctness", part1, need=30.0)
    run.step("part 5 hetero", lambda: hetero_part(result, max(check_nodes // 10, 50), batch_size,
                                                   check_batches, seed), need=30.0)
    big: dict = {}

    def part2() -> None:
        big["graph"] = sampler_part(result, nodes, edges_per_node, fans, batch_size, batches, seed,
                                    seconds=max(parts_seconds * 0.6 - (time.perf_counter() - start), 20.0))

    def labor() -> None:  # part 2's graph, or the same one again (no weights) when part 2 failed
        graph = big.pop("graph", None) or big_graph(nodes, edges_per_node, seed, weights=False)[:2]
        labor_part(result, check_nodes, check_edges, fans, batch_size, check_batches, seed, big=graph,
                   seconds=10.0)

    run.step("part 2 sampler speed", part2, need=60.0)
    run.step("LABOR", labor, need=30.0)
    big.clear()  # 200M int32 indices: not kept for the later parts
    if only_sampler:
        _print_sampler(result)
        return

    def part3() -> None:
        gather = time_gather(feature_rows, feature_dim, min(feature_rows, 1_000_000), 10, seed)
        result["feature_gather"] = gather
        click.echo(f"feature gather ({gather['row_bytes']} B rows): device {gather['device_GBps']:.1f} GB/s, "
                   f"pinned host via UVA {gather['pinned_uva_GBps']:.1f} GB/s, "
                   f"device copy {gather['device_copy_GBps']:.1f} GB/s")

    run.step("part 3 feature gather", part3, need=20.0)
    run.step("part 4 replay", lambda: replay_part(
        result, *replay_args, seconds=max(parts_seconds - (time.perf_counter() - start), 30.0)), need=40.0)
    _print_sampler(result)
    print_replay(result)
    if with_full_graph and not simulator:
        def part6() -> None:
            click.echo(f"  part 6 starts at {time.perf_counter() - t0:.0f} s with {run.left() - 10:.0f} s",
                       err=True)
            full_graph_part(result, **_full_graph_args(fg_scale, fg_epochs, seed), seconds=run.left() - 10,
                            on_progress=run.write, echo=click.echo)
            print_full_graph(result, click.echo)

        run.step("part 6 full graph", part6, need=PART6_MIN_SECONDS)


def _source() -> dict:
    """The commit and ``git status --short`` of the tree: from git, else from `SOURCE` (written by
    ``scripts/gpu_prep.sh`` for a copy of the tree without ``.git``); empty when neither is there."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10)
        status = subprocess.run(["git", "status", "--short"], cwd=REPO, capture_output=True, text=True,
                                timeout=10)
        if head.returncode == 0 and status.returncode == 0:
            return {"commit": head.stdout.strip(), "status": status.stdout.splitlines(), "from": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return {**json.loads(SOURCE.read_text()), "from": str(SOURCE.relative_to(REPO))}
    except (OSError, ValueError):
        return {}


def _pytest_gpu(seconds: float, folder: Path) -> dict:
    """``pytest -m gpu`` over tests/ in a subprocess, stopped after ``seconds``; its whole output goes to
    ``folder/pytest_gpu.txt``. Counts every collected GPU test's outcome (pytest's JUnit XML): ``passed``,
    ``failed``, ``skipped`` (with ``skip_reasons``), ``collection_errors``."""
    xml = Path(tempfile.mkdtemp(prefix="gpu_check_")) / "pytest_gpu.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rs", "-p", "no:cacheprovider",
           "-o", "faulthandler_timeout=60", "--continue-on-collection-errors", f"--junitxml={xml}"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", str(PYTEST_TEST_SECONDS)]
    cmd.append("tests")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                                       if p)}
    click.echo(f"pytest -m gpu (at most {seconds:.0f} s) ...", err=True)
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=seconds)
        code, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        raw = (exc.stdout or b"") + (exc.stderr or b"") if isinstance(exc.stdout or b"", bytes) else \
            (exc.stdout or "") + (exc.stderr or "")
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    dt = time.perf_counter() - t
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pytest_gpu.txt").write_text(" ".join(cmd) + "\n\n" + text)
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    summary = lines[-1] if lines else ""
    if code != 0:
        click.echo("\n".join(lines[-40:]), err=True)
    click.echo(f"  pytest -m gpu: {summary} ({dt:.0f} s; output in {folder / 'pytest_gpu.txt'})", err=True)
    out = {"seconds": dt, "returncode": code, "summary": summary if code is not None else
           f"stopped after {seconds:.0f} s; {summary}"}
    out.update(_junit_counts(xml))
    shutil.rmtree(xml.parent, ignore_errors=True)
    return out


def _junit_counts(xml: Path) -> dict:
    """Outcomes of the collected tests in pytest's JUnit XML (a module skipped or broken at collection is a
    testcase without a class name); empty when the file is missing (pytest stopped)."""
    try:
        root = ElementTree.parse(xml).getroot()
    except (OSError, ElementTree.ParseError):
        return {}
    out: dict = {"passed": 0, "failed": 0, "skipped": 0, "skip_reasons": {}, "collection_errors": []}
    for case in root.iter("testcase"):
        tags = {child.tag: child for child in case}
        name = f"{case.get('classname')}::{case.get('name')}"
        if not case.get("classname"):
            if "error" in tags or "failure" in tags:
                out["collection_errors"].append(case.get("name"))
        elif "failure" in tags or "error" in tags:
            out["failed"] += 1
        elif "skipped" in tags:
            out["skipped"] += 1
            out["skip_reasons"][name] = (tags["skipped"].get("message") or "")[:200]
        else:
            out["passed"] += 1
    return out


def _targets(result: dict, seconds: float, budget: float) -> list[dict]:
    """Every target of the run as ``{"figure", "value", "target", "met"}`` rows (met None: not measured)."""
    rows = []
    py = result.get("pytest_gpu")
    if py is not None:
        rows.append(_pytest_target(py))
    corr = result.get("correctness")
    if corr is not None:
        rows.append({"figure": "part 1 sampler: GPU blocks equal the CPU's (uniform, replace, -1, weighted)",
                     "value": "identical" if corr.get("sampler_ok") else "differ", "target": "identical",
                     "met": bool(corr.get("sampler_ok"))})
    het = result.get("hetero")
    if het is not None and "deterministic_ok" in het:
        rows.append({"figure": "part 5 hetero: GPU blocks equal the CPU's", "target": "identical",
                     "value": "identical" if het["deterministic_ok"] else "differ",
                     "met": bool(het["deterministic_ok"])})
    lab = result.get("labor")
    if lab is not None:
        rows.append({"figure": "LABOR: GPU blocks and edge weights equal the CPU's", "target": "identical",
                     "value": "identical" if lab["deterministic_ok"] else "differ",
                     "met": bool(lab["deterministic_ok"])})
    rows.extend(_sampler_targets(result["rows"]))
    rows.extend(hetero_targets(result))
    rep = result.get("replay_correctness")
    if rep is not None:
        rows.append({"figure": "part 4 replay: GPU windows equal the CPU's, byte for byte",
                     "target": "identical",
                     "value": "identical" if rep.get("ok") else "differ", "met": bool(rep.get("ok"))})
        choice = choice_target(result["rows"])
        if choice is not None:
            rows.append(choice)
    if "full_graph" in result:
        rows.extend(full_graph_targets(result))
    for name, part in result.get("parts", {}).items():
        if part["status"] == "done":
            continue
        if part["status"] == "failed":
            last = [ln for ln in part["error"].strip().splitlines() if ln.strip()][-1]
            value = f"failed: {last[:100]}"
        elif part["status"] == "skipped":
            value = f"skipped: {part['why']}"
        else:
            value = "stopped while running"
        rows.append({"figure": f"{name}: ran to its end", "value": value, "target": "no exception",
                     "met": False})
    if "stopped" in result:
        rows.append({"figure": "the check ran to its end", "value": result["stopped"],
                     "target": "not stopped", "met": False})
    rows.append({"figure": "the whole check, Python's start included", "value": f"{seconds:.0f} s",
                 "target": f"<= {budget:.0f} s", "met": seconds <= budget})
    return rows


def _pytest_target(py: dict) -> dict:
    """The pytest row: met when pytest passed in time and every collected GPU test ran (none skipped: on the
    GPU machine a skip means missing data, e.g. ``GRAPHRL_DATA``, or a missing package)."""
    counts = "passed" in py
    value = f"{py['summary']} in {py['seconds']:.0f} s"
    if counts:
        errors = len(py["collection_errors"])
        value = (f"{py['passed']} passed, {py['failed']} failed, {py['skipped']} skipped"
                 f"{f', {errors} collection errors' if errors else ''} in {py['seconds']:.0f} s")
        if py["skip_reasons"]:
            value += f" (skip: {next(iter(py['skip_reasons'].values()))[:60]})"
    met = (py["returncode"] == 0 and py["seconds"] < PYTEST_SECONDS and counts and py["passed"] > 0
           and py["skipped"] == 0 and not py["collection_errors"])
    return {"figure": "pytest -m gpu: every GPU test ran and passed", "value": value,
            "target": f"all ran, passed, < {PYTEST_SECONDS:.0f} s", "met": met}


def _rate(rows: list[dict], *parts: str, weighted: bool = False) -> float | None:
    """The edges/s of the first sampler row whose case holds every one of ``parts`` (weighted or not)."""
    for row in rows:
        case = row["case"]
        if (row.get("metric") == "sampled_edges_per_s" and all(p in case for p in parts)
                and ("weighted" in case) == weighted):
            return row["ours"]
    return None


def _sampler_targets(rows: list[dict]) -> list[dict]:
    """Issue 27's GPU sampler targets, from part 2's and part 5's rows (absent rows: not measured)."""
    out = []
    api = _rate(rows, "b1024 sample() device")
    out.append({"figure": "sample() at b1024, device graph (uniform)", "target": ">= 1000 M edges/s",
                "value": "n/a" if api is None else f"{api / 1e6:.0f} M edges/s",
                "met": None if api is None else api >= 1e9})
    flight = next((r for r in rows if "b1024 loader in flight device" in r["case"]), None)
    out.append({"figure": "sample() at b1024 through NeighborLoader, batches in flight",
                "target": ">= 1000 M edges/s",
                "value": "n/a" if flight is None else
                f"{flight['ours'] / 1e6:.0f} M edges/s, {flight['readbacks_per_batch']:.1f} read-backs/batch",
                "met": None if flight is None else flight["ours"] >= 1e9})
    small, large = _rate(rows, "b1024 sample() uva"), _rate(rows, "b8192 sample() uva")
    both = small is not None and large is not None
    out.append({"figure": "UVA sample() never slower at a larger batch", "target": "b8192 >= b1024",
                "value": f"b8192 {large / 1e6:.0f} vs b1024 {small / 1e6:.0f} M/s" if both else "n/a",
                "met": large >= small if both else None})
    for weighted in (False, True):
        small = _rate(rows, "b1024 kernels uva", weighted=weighted)
        large = _rate(rows, "b8192 kernels uva", weighted=weighted)
        both = small is not None and large is not None
        value = f"b8192 {large / 1e6:.0f} vs b1024 {small / 1e6:.0f} M/s" if both else "n/a"
        figure = "UVA kernels never slower at a larger batch" + (" (weighted)" if weighted else "")
        out.append({"figure": figure, "target": "b8192 >= b1024", "value": value,
                    "met": large >= small if both else None})
    gpu, cpu = _rate(rows, "hetero", "sample() cuda"), _rate(rows, "hetero", "sample() cpu")
    out.append({"figure": "typed graph sample(): GPU over our CPU sampler", "target": ">= 3x",
                "value": "n/a" if not (gpu and cpu) else f"{gpu / cpu:.2f}x",
                "met": None if not (gpu and cpu) else gpu >= 3 * cpu})
    return out


def _finish(result: dict, t0: float, output: str, budget: float) -> int:
    """Print the one table of targets, write the JSON; the exit status (1 when a target was missed)."""
    seconds = time.perf_counter() - t0
    rows = _safe_targets(result, seconds, budget)
    width, vwidth = (max(len(r[k]) for r in rows) for k in ("figure", "value"))
    click.echo(f"\n{'figure':<{width}}  {'value':<{vwidth}}  {'target':<24}  met")
    for r in rows:
        met = "n/a" if r["met"] is None else ("yes" if r["met"] else "NO")
        click.echo(f"{r['figure']:<{width}}  {r['value']:<{vwidth}}  {r['target']:<24}  {met}")
    _write(result, t0, output, budget)
    return 1 if any(r["met"] is False for r in rows) else 0


def _safe_targets(result: dict, seconds: float, budget: float) -> list[dict]:
    """`_targets` into ``result["targets"]``; if building them fails, one row saying so (and the traceback in
    ``result["targets_error"]``), so a table and the JSON's targets always exist."""
    try:
        rows = _targets(result, seconds, budget)
    except Exception:  # noqa: BLE001 - the table must print whatever a part left behind
        result["targets_error"] = traceback.format_exc()
        rows = [{"figure": "the closing table", "value": "failed: see targets_error in the JSON",
                 "target": "built", "met": False}]
    result["targets"] = rows
    return rows


def _print_sampler(result: dict) -> None:
    click.echo(f"\n{'case':<80} {'M edges/s':>10}")
    for row in result["rows"]:
        if row["metric"] == "sampled_edges_per_s":
            click.echo(f"{row['case']:<80} {row['ours'] / 1e6:>10.1f}")
    if "correctness" in result:
        click.echo(f"correctness: deterministic cases identical: {result['correctness']['deterministic_ok']}")


def _write(result: dict, t0: float, output: str, budget: float, quiet: bool = False) -> None:
    """Write ``result`` (with the targets as they stand: a run killed later keeps them) to ``output``."""
    result["seconds"] = time.perf_counter() - t0
    _safe_targets(result, result["seconds"], budget)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)  # a reader never sees half a file
    if not quiet:
        click.echo(f"total {result['seconds']:.0f} s; wrote {out}")


if __name__ == "__main__":
    main()

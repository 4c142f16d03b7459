"""SIGINT and SIGTERM during a ``graphrl`` command: what was done is saved, the exit status is 128 + signal.

Each test runs the command in a subprocess (``python -m graphrl.cli``), waits until it has something
worth keeping (an evaluation, a running benchmark, an RL run with its shared store), signals that process
alone and checks the exit status (130 for SIGINT, 143 for SIGTERM), the files, the printed line and that
no shared-memory segment of the process (or of its children) is left in /dev/shm (issue 32).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _forked import check_in_fork

from graphrl.memory.owners import parse_name

SHM = Path("/dev/shm")


class Command:
    """``python -m graphrl.cli ARGS`` with its output (stdout and stderr) read line by line."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # SIGINT at its default in the child whatever the test run inherited: a shell starts a background job
        # (`cmd &`) with SIGINT ignored, the child would inherit it, and graphrl leaves an ignored signal be
        self.proc = subprocess.Popen([sys.executable, "-m", "graphrl.cli", *args], cwd=cwd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: list[str] = []
        self.children: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def _note_children(self) -> None:
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return
        self.children.update(int(p) for p in text.split())

    def wait_for(self, ready, timeout: float = 60.0) -> None:
        """Poll ``ready()`` until true; fail with the output so far after ``timeout`` s or an early exit."""
        deadline = time.monotonic() + timeout
        while not ready():
            self._note_children()
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                pytest.fail(f"not ready (exit {self.proc.returncode}):\n{self.output}")
            time.sleep(0.05)
        self._note_children()

    def line_matching(self, pattern: str) -> bool:
        return any(re.search(pattern, line) for line in list(self.lines))

    def signal(self, signum: int, timeout: float = 30.0) -> int:
        self._note_children()
        self.proc.send_signal(signum)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"still running {timeout} s after {signal.Signals(signum).name}:\n{self.output}")
        self._reader.join(timeout=5)
        return rc

    def segments(self) -> list[str]:
        """Shared segments in /dev/shm whose recorded owner is this process or one of its children."""
        pids = {self.proc.pid, *self.children}
        return [p.name for p in SHM.glob("graphrl_*") if (o := parse_name(p.name)) and o.pid in pids]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_train_recommend_interrupted_after_an_evaluation_saves_best_weights_and_the_curve(
        tmp_path, tiny_gowalla, signum):
    import torch

    root = tiny_gowalla
    out = tmp_path / "run"
    (out).mkdir()
    (out / "refit.pt").write_bytes(b"an earlier run's")  # would read as this run's refit
    cmd = Command(["train", "recommend", "--data-root", str(root), "--epochs", "1000000", "--minutes", "2",
                   "--eval-every", "1", "--patience", "1000000", "--dim", "8", "--no-refit", "--no-progress",
                   "--out", str(out)], cwd=tmp_path)
    cmd.wait_for(lambda: cmd.line_matching(r"^epoch +\d+\.\d+ .*val recall@20"))
    rc = cmd.signal(signum)
    name = signal.Signals(signum).name
    assert rc == 128 + signum, cmd.output
    line = re.search(rf"^interrupted by {name} at epoch (\d+\.\d+) \(the last evaluation\): saved best\.pt "
                     rf"\(epoch (\d+\.\d+)\) and curve\.json to (.+)$", cmd.output, re.M)
    assert line, cmd.output
    assert Path(line.group(3)) == out and float(line.group(2)) <= float(line.group(1))
    assert "Traceback" not in cmd.output and "Aborted" not in cmd.output
    record = json.loads((out / "curve.json").read_text())
    assert record["stopped_by"] == name and record["curve"]
    assert record["best_epoch"] == pytest.approx(float(line.group(2)))
    assert record["curve"][-1]["epoch"] == pytest.approx(float(line.group(1)))
    state = torch.load(out / "best.pt", weights_only=True)
    assert state and all(torch.isfinite(v).all() for v in state.values())
    assert not (out / "refit.pt").exists()
    assert cmd.segments() == []


def test_train_recommend_interrupted_before_an_evaluation_says_nothing_was_saved(tmp_path, tiny_gowalla):
    root = tiny_gowalla
    out = tmp_path / "run"
    cmd = Command(["train", "recommend", "--data-root", str(root), "--epochs", "1000000", "--minutes", "2",
                   "--eval-every", "1000000", "--dim", "8", "--no-refit", "--no-progress", "--out", str(out)],
                  cwd=tmp_path)
    cmd.wait_for(lambda: cmd.line_matching(r"^config: "))
    time.sleep(0.5)
    rc = cmd.signal(signal.SIGTERM)
    assert rc == 143, cmd.output
    assert re.search(r"^interrupted by SIGTERM before the first evaluation: nothing to save", cmd.output,
                     re.M), cmd.output
    assert not (out / "best.pt").exists() and not (out / "curve.json").exists()


def _fake_benchmarks(folder: Path) -> Path:
    """``sampler.py`` writes its result at once; ``replay.py`` records its pid and runs for a minute."""
    folder.mkdir()
    (folder / "sampler.py").write_text(
        "import json, sys\n"
        "out = sys.argv[sys.argv.index('--output') + 1]\n"
        "json.dump({'benchmark': 'sampler', 'rows': []}, open(out, 'w'))\n")
    (folder / "replay.py").write_text(
        "import os, sys, time\n"
        "open(os.path.join(os.path.dirname(sys.argv[sys.argv.index('--output') + 1]), 'replay.pid'), 'w')"
        ".write(str(os.getpid()))\n"
        "time.sleep(60)\n")
    return folder


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_bench_interrupted_keeps_the_finished_results_and_stops_the_running_benchmark(tmp_path, signum):
    scripts = _fake_benchmarks(tmp_path / "benchmarks")
    out = tmp_path / "out"
    cmd = Command(["bench", "--only", "sampler,replay", "--benchmarks", str(scripts), "--out", str(out)],
                  cwd=tmp_path)
    cmd.wait_for(lambda: (out / "replay.pid").is_file() and (out / "replay.pid").read_text() != "")
    child = int((out / "replay.pid").read_text())
    t0 = time.monotonic()
    rc = cmd.signal(signum)
    name = signal.Signals(signum).name
    assert rc == 128 + signum, cmd.output
    assert time.monotonic() - t0 < 15
    assert re.search(rf"^interrupted by {name} during replay: saved bench\.json \(sampler done\) to "
                     rf"{re.escape(str(out))}$", cmd.output, re.M), cmd.output
    record = json.loads((out / "bench.json").read_text())
    assert record["benchmarks"]["sampler"]["returncode"] == 0
    assert record["interrupted"] == {"signal": name, "benchmark": "replay"}
    assert (out / "sampler.json").is_file()
    assert not _alive(child), "the running benchmark outlived graphrl bench"
    assert cmd.segments() == []


@pytest.mark.slow
def test_demo_rl_sigterm_saves_the_curve_so_far_and_leaves_no_shared_memory(tmp_path):
    pytest.importorskip("gymnasium")
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots"
    cmd = Command(["demo", "--task", "rl", "--minutes", "2", "--plot", str(plots)], cwd=tmp_path)
    cmd.wait_for(lambda: cmd.segments() != [], timeout=90)  # the store exists
    cmd.wait_for(lambda: any(re.search(r"episodes=[1-9]", part) for line in list(cmd.lines)
                             for part in line.split("\r")), timeout=90)
    rc = cmd.signal(signal.SIGTERM)
    assert rc == 143, cmd.output
    assert re.search(rf"^interrupted by SIGTERM during rl: saved demo_curves\.json and demo_rl\.png to "
                     rf"{re.escape(str(plots))}$", cmd.output, re.M), cmd.output
    curves = json.loads((plots / "demo_curves.json").read_text())
    assert curves["rl"]["return"], curves
    assert (plots / "demo_rl.png").is_file()
    assert "Traceback" not in cmd.output
    assert cmd.segments() == []
    # the actors are joined before the demo exits; its other children (multiprocessing's resource tracker)
    # leave once their pipe from the demo closes, just after it: a child alive 10 s on outlived the demo
    deadline = time.monotonic() + 10.0
    while any(_alive(p) for p in cmd.children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in cmd.children), "an actor outlived the demo"


def test_demo_sigint_after_a_seed_saves_the_curves_so_far(tmp_path):
    pytest.importorskip("matplotlib")
    data = Path(os.environ.get("GRAPHRL_DATA", "/nonexistent"))
    if not (data / "cora_citeseer").is_dir():
        pytest.skip("needs GRAPHRL_DATA with Cora")
    plots = tmp_path / "plots"
    cmd = Command(["demo", "--task", "node-classification", "--dataset", "cora", "--seeds", "50", "--epochs",
                   "40", "--data-root", str(data), "--plot", str(plots)], cwd=tmp_path)
    cmd.wait_for(lambda: cmd.line_matching(r"^seed \d+: test accuracy"))
    rc = cmd.signal(signal.SIGINT)
    assert rc == 130, cmd.output
    saved = re.search(rf"^interrupted by SIGINT during node-classification: saved demo_curves\.json and "
                      rf"demo_node-classification\.png to {re.escape(str(plots))}$", cmd.output, re.M)
    assert saved, cmd.output
    curves = json.loads((plots / "demo_curves.json").read_text())
    assert curves["node-classification"], curves
    assert (plots / "demo_node-classification.png").is_file()
    assert "Traceback" not in cmd.output
    assert cmd.segments() == []


def test_interrupts_turns_sigterm_into_interrupted_and_restores_the_handlers():
    from graphrl.interrupts import Interrupted, interrupts

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Interrupted) as info, interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # the handler runs at the next bytecode; never reached
    assert (info.value.name, info.value.exit_code) == ("SIGTERM", 143)
    assert isinstance(info.value, KeyboardInterrupt)  # `except Exception` does not swallow it
    assert {s: signal.getsignal(s) for s in before} == before
    with interrupts():
        pass
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.usefixtures("sigint_default")
def test_a_signal_handled_inside_a_finalizer_still_interrupts_the_run():
    # Python ignores what a finalizer raises ("Exception ignored in: <finalize object>"): a Ctrl-C whose
    # handler ran there was lost and the demo ran to its end with status 0 (seen once in CI)
    import weakref

    from graphrl.interrupts import Interrupted, interrupts

    class Resource:
        pass

    def finalize() -> None:
        signal.raise_signal(signal.SIGINT)  # the handler runs here, inside the finalizer
        for _ in range(10_000):
            pass

    def child() -> None:  # forked: a re-send that came after the block would end the child, not pytest
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        hook = sys.unraisablehook
        reached = []
        with pytest.raises(Interrupted) as info, interrupts():
            resource = Resource()
            weakref.finalize(resource, finalize)
            del resource  # the finalizer runs now
            reached.append(True)
            time.sleep(1.0)  # the signal is delivered again at the next bytecode; never slept through
            reached.append(False)
        assert reached == [True] and info.value.name == "SIGINT"
        assert {s: signal.getsignal(s) for s in before} == before
        assert sys.unraisablehook is hook  # ours only within the block

    check_in_fork(child)


def test_an_ignored_signal_stays_ignored():
    from graphrl.interrupts import interrupts

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with interrupts():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)  # nohup-style: nothing happens
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_train_recommend_interrupted_before_an_evaluation_names_an_earlier_runs_files(tmp_path, capsys):
    from graphrl.cli_train import _save_interrupted
    from graphrl.interrupts import Interrupted

    for name in ("best.pt", "curve.json"):
        (tmp_path / name).write_text("an earlier run's")
    _save_interrupted(Interrupted(signal.SIGINT), str(tmp_path), None, [], {}, {}, 0.0, 0.2)
    out = capsys.readouterr().out
    assert "nothing to save" in out and "best.pt" in out and "curve.json" in out and "earlier run" in out
    assert (tmp_path / "best.pt").read_text() == "an earlier run's"  # left, not deleted

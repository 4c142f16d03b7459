"""Issue 32, tried to break as a user would: the ``graphrl`` commands' output checks, saving when a signal
comes while the results are being written, and bad ``GRAPHRL_THREADS`` values.

Cases the issue's own tests (tests/graphrl/test_cli_out_paths.py, test_cli_interrupts.py, test_threads.py)
do not cover: ``graphrl partition`` into a folder it cannot write (it made and partitioned the graph, then
failed with a traceback), a signal during the final save of ``train recommend``, a second signal during the
interrupted run's save, and a thread count above what numba can run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from graphrl.cli import main
from graphrl.interrupts import Interrupted


def _invoke(args: list[str]):
    t0 = time.perf_counter()
    result = CliRunner().invoke(main, args)
    return result, time.perf_counter() - t0


# ------------------------------------------------------------------------------ outputs checked first


@pytest.mark.parametrize("case", ["under a file", "not empty", "a file"])
def test_partition_refuses_an_out_it_cannot_create_before_making_the_graph(tmp_path, case):
    (tmp_path / "a_file").write_text("x\n")
    out = {"under a file": tmp_path / "a_file" / "parts", "not empty": tmp_path,
           "a file": tmp_path / "a_file"}[case]
    # the default size is a 1M-node, 20M-edge graph: refused at once, not after minutes of work
    result, seconds = _invoke(["partition", str(out), "--parts", "2"])
    assert result.exit_code == 2, result.output
    assert "'OUT'" in result.output and str(out) in result.output, result.output
    want = {"under a file": "Not a directory", "not empty": "exists and is not an empty folder",
            "a file": "is a file"}[case]
    assert want in result.output, result.output
    assert seconds < 2.0, f"refused only after {seconds:.1f} s: {result.output}"
    assert (tmp_path / "a_file").read_text() == "x\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".graphrl-write-probe-"))]


def test_partition_into_an_empty_folder_and_a_new_one_under_new_parents(tmp_path):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "new" / "deeper" / "parts"):
        result, _ = _invoke(["partition", str(out), "--size", "300,1500", "--parts", "2", "--method", "ldg"])
        assert result.exit_code == 0, result.output
        assert (out / "MANIFEST.json").is_file() or any(out.iterdir())


@pytest.mark.parametrize("case", ["train best.pt", "train curve.json", "bench replay.json",
                                  "bench bench.json", "bench --plot", "demo --plot"])
def test_an_output_file_that_is_a_folder_is_refused_before_any_work(tmp_path, tiny_gowalla, case):
    """The folder can be written, but a file the command will write there is a folder: it trained (or
    ran the benchmarks) and failed only when it saved."""
    out = tmp_path / "out"
    command, name = case.split(" ")
    blocked = {"--plot": "bench_replay.png" if command == "bench" else "demo_recommend.png"}.get(name, name)
    (out / blocked).mkdir(parents=True)
    option = "--plot" if name == "--plot" else "--out"
    args = {"train": ["train", "recommend", "--data-root", str(tiny_gowalla), "--epochs", "1",
                      "--out", str(out)],
            "bench": ["bench", "--only", "replay", option, str(out)]
            + ([] if option == "--out" else ["--out", str(tmp_path / "results")]),
            "demo": ["demo", "--task", "recommend", "--plot", str(out)]}[command]
    result, seconds = _invoke(args)
    assert result.exit_code == 2, result.output
    assert f"'{option}'" in result.output and "Is a directory" in result.output, result.output
    assert str(out / blocked) in result.output.replace("\n", ""), result.output
    assert seconds < 2.0, f"refused only after {seconds:.1f} s: {result.output}"


# ------------------------------------------------------------------------------ a signal while saving


EARLIER = b"an earlier run's"


def _earlier_run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("best.pt", "refit.pt", "curve.json"):
        (out / name).write_bytes(EARLIER)


def _this_runs_files(out: Path) -> set[str]:
    """The files of ``out`` that are not the earlier run's; fails on a half-written or temporary file."""
    names = {p.name for p in out.iterdir()}
    assert not [n for n in names if n.endswith(".tmp")], names
    mine = {n for n in names if (out / n).read_bytes() != EARLIER}
    for n in mine & {"best.pt", "refit.pt"}:
        torch.load(out / n, weights_only=True)  # whole
    if "curve.json" in mine:
        json.loads((out / "curve.json").read_text())
    return mine


def _interrupt_nth_torch_save(monkeypatch, n: int, signum: int = signal.SIGTERM, then=None):
    """torch.save raises Interrupted (as the signal handler would) on its ``n``-th call; ``then`` (an
    exception class) on the call after it, as a second signal would."""
    real = torch.save
    calls = []

    def save(obj, f, *args, **kw):
        calls.append(str(f))
        if len(calls) == n:
            Path(f).write_bytes(b"half")  # a partial file, as torch.save leaves it when stopped
            raise Interrupted(signum)
        if then is not None and len(calls) == n + 1:
            Path(f).write_bytes(b"half")
            raise then()
        return real(obj, f, *args, **kw)

    monkeypatch.setattr(torch, "save", save)
    return calls


def _train(data: Path, out: Path, *extra: str):
    return CliRunner().invoke(main, ["train", "recommend", "--data-root", str(data), "--epochs", "2",
                                     "--eval-every", "1", "--dim", "8", "--no-progress", "--out", str(out),
                                     *extra])


@pytest.mark.parametrize("refit", ["--refit", "--no-refit"])
def test_a_signal_during_the_final_save_still_saves_the_run_and_says_where(tmp_path, tiny_gowalla,
                                                                           monkeypatch, refit):
    out = tmp_path / "run"
    _earlier_run(out)
    _interrupt_nth_torch_save(monkeypatch, 1)
    result = _train(tiny_gowalla, out, refit)
    assert result.exit_code == 143, result.output
    mine = _this_runs_files(out)
    # this run's files, whole, and none of the earlier run's left beside them as if they were this run's
    assert {"best.pt", "curve.json"} <= mine, (mine, result.output)
    assert ("refit.pt" in mine) == (out / "refit.pt").exists() == (refit == "--refit")
    assert "interrupted by SIGTERM while saving: saved " in result.output and str(out) in result.output


def test_a_second_signal_during_an_interrupted_runs_save_leaves_no_mix_of_two_runs(tmp_path, tiny_gowalla,
                                                                                    monkeypatch):
    """First signal after an evaluation (the run saves best.pt and curve.json), a second one while it saves
    best.pt: what is left must not pair this run's curve with an earlier run's weights."""
    from graphrl.train import recommend

    out = tmp_path / "run"
    _earlier_run(out)
    real_eval = recommend.train_recommender

    def train_then_signal(*args, on_eval=None, **kw):
        def eval_then_stop(entry, model):
            on_eval(entry, model)
            raise Interrupted(signal.SIGINT)
        return real_eval(*args, on_eval=eval_then_stop, **kw)

    monkeypatch.setattr(recommend, "train_recommender", train_then_signal)
    real = torch.save

    def save(obj, f, *args, **kw):
        Path(f).write_bytes(b"half")
        raise KeyboardInterrupt  # the second Ctrl-C (the handlers in place before are back)

    monkeypatch.setattr(torch, "save", save)
    result = _train(tiny_gowalla, out)
    monkeypatch.setattr(torch, "save", real)
    assert result.exit_code == 130, result.output
    mine = _this_runs_files(out)
    earlier = {p.name for p in out.iterdir()} - mine
    assert not (mine and earlier), f"this run's {mine} beside an earlier run's {earlier}"


# ------------------------------------------------------------------------------ GRAPHRL_THREADS


@pytest.mark.parametrize("value, says", [("0", "must be >= 1"), ("-1", "must be >= 1"),
                                         ("abc", "must be a positive integer or 'off', got 'abc'"),
                                         ("1000", "must be at most")])
@pytest.mark.parametrize("command", [["info"], ["train", "recommend", "--epochs", "1"],
                                     ["partition", "never-made", "--parts", "2"]])
def test_a_bad_graphrl_threads_is_a_usage_error_naming_it_before_any_work(tmp_path, value, says, command):
    before = torch.get_num_threads()
    t0 = time.perf_counter()
    result = CliRunner().invoke(main, command, env={"GRAPHRL_THREADS": value})
    assert result.exit_code == 2, result.output  # it was ignored: the run went on with torch's own count
    assert f"GRAPHRL_THREADS {says}" in result.output and value in result.output, result.output
    assert time.perf_counter() - t0 < 2.0 and torch.get_num_threads() == before
    assert not (tmp_path / "never-made").exists()


def test_the_commands_apply_graphrl_threads_to_torch_and_numba(tmp_path):
    """``GRAPHRL_THREADS=1 graphrl ...`` left torch at its default: the CLI applied no policy unless
    ``train recommend --threads`` was given."""
    import numba

    from graphrl import threads

    before = torch.get_num_threads(), threads.policy()
    try:
        result = CliRunner().invoke(main, ["partition", str(tmp_path / "p"), "--size", "200,800", "--parts",
                                           "2", "--method", "ldg"], env={"GRAPHRL_THREADS": "1"})
        assert result.exit_code == 0, result.output
        assert (torch.get_num_threads(), numba.get_num_threads()) == (1, 1)
        assert threads.policy().source == "GRAPHRL_THREADS"
    finally:
        threads.configure(before[1].threads if before[1] else before[0])
        torch.set_num_threads(before[0])


CASES = """
import os, sys
import numba, torch
from graphrl import threads
def case(fn):
    pid = os.fork()
    if pid == 0:
        try:
            print(*fn(), flush=True)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
def configured():  # configure as the process's first call
    threads.configure(1)
    return "configure(1):", torch.get_num_threads(), numba.get_num_threads()
def opted_out():  # the program's own torch count, then graphrl's first kernel, opted out
    torch.set_num_threads(1)
    os.environ["GRAPHRL_THREADS"] = "off"
    threads.team_size()
    return "off:", torch.get_num_threads()
case(configured)
case(opted_out)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_numbas_threading_layer_starting_keeps_torchs_count():
    """numba's threading layer resets the OpenMP count of the thread that starts it: ``configure(1)`` as a
    process's first call left torch at the cores, and with ``GRAPHRL_THREADS=off`` graphrl's first kernel
    undid the program's ``torch.set_num_threads(1)``. Each case in a fresh fork (numba not yet started)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", CASES], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "GRAPHRL_THREADS"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["configure(1): 1 1", "off: 1"], out.stdout + out.stderr


# ------------------------------------------------------------------------------ demo curves on a full disk


def test_a_full_disk_while_saving_demo_curves_keeps_the_other_tasks_curves(tmp_path, monkeypatch):
    """``demo --plot`` merges its task's curve into demo_curves.json, which keeps the other tasks' curves:
    the file was truncated, then written, so a full disk (or a second Ctrl-C) between the two lost every
    task's curve, and the next merge replaced the unreadable file without a word."""
    import errno
    import io

    from graphrl.curves import DemoCurves

    path = tmp_path / "demo_curves.json"
    earlier = {"node-classification": {"epochs": [1, 2]}, "rl": {"returns": [9.0]}}
    path.write_text(json.dumps(earlier))
    curves = DemoCurves()
    curves.curves["recommend"] = {"epochs": [1]}
    real_open = io.open

    def full_disk(file, mode="r", *args, **kw):
        f = real_open(file, mode, *args, **kw)
        if "w" in mode and "demo_curves" in str(file):
            f.close()  # created or truncated, nothing written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return f

    monkeypatch.setattr(io, "open", full_disk)
    with pytest.raises(OSError):
        curves.save_json(path, merge=True)
    monkeypatch.undo()
    assert json.loads(path.read_text()) == earlier
    assert [p.name for p in tmp_path.iterdir()] == ["demo_curves.json"]
    curves.save_json(path, merge=True)
    assert json.loads(path.read_text()) == {**earlier, "recommend": {"epochs": [1]}}


def test_a_second_signal_while_bench_writes_its_record_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    import io

    from graphrl import bench

    (tmp_path / bench.FILE_NAME).write_text('{"benchmarks": {"replay": {"returncode": 0}}}\n')
    real_open = io.open

    def second_ctrl_c(file, mode="r", *args, **kw):
        f = real_open(file, mode, *args, **kw)
        if "w" in mode and bench.FILE_NAME in str(file):
            f.close()  # created or truncated, nothing written
            raise KeyboardInterrupt
        return f

    monkeypatch.setattr(io, "open", second_ctrl_c)
    record = {"machine": {"load_average_1min": 1.0}, "benchmarks": {}}
    with pytest.raises(KeyboardInterrupt):
        bench._write_record(record, tmp_path, time.perf_counter())
    monkeypatch.undo()
    assert json.loads((tmp_path / bench.FILE_NAME).read_text())["benchmarks"]["replay"]["returncode"] == 0
    assert [p.name for p in tmp_path.iterdir()] == [bench.FILE_NAME]

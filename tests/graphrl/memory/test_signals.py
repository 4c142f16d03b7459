"""graphrl.memory.signals with real processes: SIGTERM and SIGHUP unlink a process's shared segments, chain
to the application's handler, keep the signal's effect (exit status -SIGTERM), leave ignored signals and
later handlers alone. Children report through pipes; nothing waits by sleeping."""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SHM = Path("/dev/shm")


@pytest.fixture(autouse=True)
def _children_start_with_sighup_at_default():
    """Children inherit an ignored SIGHUP (pytest run under nohup), and the library rightly leaves an ignored
    signal alone: start them with the default disposition, as a terminal session would."""
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, before)

# the child makes a manager with shared regions (and a spill array), prints one JSON line, then blocks
# reading stdin until the parent signals it or closes stdin
CHILD = textwrap.dedent("""
    import json, os, signal, sys
    from graphrl.memory import MemoryManager
    SETUP_BEFORE
    mm = MemoryManager(spill_dir=sys.argv[1])
    regions = [mm.allocate(256, "float32", "shared", owner="replay") for _ in range(3)]
    disk = mm.allocate(16, "int64", "disk", owner="spill")
    SETUP_AFTER
    print(json.dumps({"names": [r.name for r in regions], "prefix": mm.shm_prefix,
                      "handler": signal.getsignal(signal.SIGTERM).__name__}), flush=True)
    line = sys.stdin.readline()
    print(json.dumps({"alive": True, "left": [os.path.exists("/dev/shm/" + r.name) for r in regions]}),
          flush=True)
""")

APP_HANDLER = """
def app_handler(signum, frame):
    seen = [os.path.exists("/dev/shm/" + r.name) for r in regions]
    print(json.dumps({"app_handler": signum, "left_when_called": seen}), flush=True)
    sys.exit(7)
"""


def _start(tmp_path, before="", after=""):
    code = CHILD.replace("SETUP_BEFORE", textwrap.dedent(before))
    code = code.replace("SETUP_AFTER", textwrap.dedent(after))
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line, proc.communicate(timeout=120)[1]
    report = json.loads(line)
    assert all((SHM / n).exists() for n in report["names"]) and len(list(tmp_path.iterdir())) == 1
    return proc, report


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_unlinks_segments_and_the_process_dies_of_it(tmp_path, signum, shm_names):
    proc, report = _start(tmp_path)
    assert report["handler"] == "_handle"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signum, err
    assert out == "" and "Traceback" not in err
    assert shm_names(report["prefix"]) == []
    assert list(tmp_path.iterdir()) == []  # the spill array too: the process died


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_application_handler_installed_before_is_called_after_the_cleanup(tmp_path, signum, shm_names):
    before = APP_HANDLER + f"signal.signal({int(signum)}, app_handler)\n"
    proc, report = _start(tmp_path, before=before)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, err  # the application's handler decided: sys.exit(7)
    assert json.loads(out.splitlines()[0]) == {"app_handler": int(signum), "left_when_called": [False] * 3}
    assert shm_names(report["prefix"]) == [] and list(tmp_path.iterdir()) == []  # exit cleaned the rest


def test_ignored_sighup_is_left_alone(tmp_path, shm_names):
    proc, report = _start(tmp_path, before="signal.signal(signal.SIGHUP, signal.SIG_IGN)\n")
    proc.send_signal(signal.SIGHUP)  # an ignored signal is discarded when sent: nothing to wait for
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out) == {"alive": True, "left": [True] * 3}  # nohup'd: kept working, segments kept
    assert shm_names(report["prefix"]) == []  # ... until its normal exit


def test_handler_installed_later_by_the_application_is_never_replaced(tmp_path, shm_names):
    after = APP_HANDLER + textwrap.dedent("""
        signal.signal(signal.SIGTERM, app_handler)
        other = MemoryManager()  # neither a new manager nor a new shared region reinstalls ours
        other.allocate(8, "uint8", "shared", owner="late")
        mm.allocate(8, "uint8", "shared", owner="late")
    """)
    proc, report = _start(tmp_path, after=after)
    assert report["handler"] == "app_handler"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, err
    assert json.loads(out.splitlines()[0]) == {"app_handler": signal.SIGTERM, "left_when_called": [True] * 3}
    assert shm_names(report["prefix"]) == []  # sys.exit in its handler: the normal exit cleaned up


def _spawned_owner(spill_dir, conn):  # runs in a spawned process
    from graphrl.memory import MemoryManager

    mm = MemoryManager(spill_dir=spill_dir)
    regions = [mm.allocate((64, 4), "int32", "shared", owner="graph") for _ in range(2)]
    conn.send((mm.shm_prefix, [r.name for r in regions]))
    conn.recv()  # blocks until terminated


def test_terminate_of_a_spawned_owner_unlinks_its_segments(tmp_path, shm_names):
    ctx = mp.get_context("spawn")
    parent, child_end = ctx.Pipe()
    proc = ctx.Process(target=_spawned_owner, args=(tmp_path, child_end))
    proc.start()
    prefix, names = parent.recv()
    assert all((SHM / n).exists() for n in names)
    proc.terminate()  # SIGTERM
    proc.join(120)
    assert proc.exitcode == -signal.SIGTERM
    assert shm_names(prefix) == []


def test_handlers_are_installed_from_the_main_thread_only():
    code = textwrap.dedent("""
        import signal, threading
        from graphrl.memory import MemoryManager, install_signal_handlers
        mm = MemoryManager()
        t = threading.Thread(target=lambda: mm.allocate(8, "uint8", "shared", owner="t"))
        t.start(); t.join()
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, install_signal_handlers(),
              signal.getsignal(signal.SIGTERM).__name__, signal.getsignal(signal.SIGHUP).__name__)
        mm.close()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "_handle", "_handle"]


def test_unlink_shared_segments_keeps_the_mappings():
    code = textwrap.dedent("""
        import os
        from graphrl.memory import MemoryManager, Region, unlink_shared_segments
        mm = MemoryManager()
        r = mm.allocate(4, "int64", "shared", owner="o")
        r.numpy()[:] = 5
        unlink_shared_segments()
        try:
            Region.attach(r.handle())
        except FileNotFoundError:
            print(os.path.exists("/dev/shm/" + r.name), r.numpy().tolist())
        mm.close()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(maxsplit=1) == ["False", "[5, 5, 5, 5]\n"]


# the engines' owners (a replay store, a shared graph) get their shared memory from a MemoryManager
ENGINE_OWNER = textwrap.dedent("""
    import json, os, sys
    from graphrl.graph import CSCGraph
    from graphrl.memory import MemoryManager
    from graphrl.train.ddp import share_graph
    from replay import ReplayStore, TrajectorySpec
    mm = MemoryManager()
    store = ReplayStore(TrajectorySpec({"obs": ((4,), "float32")}), capacity_steps=64, memory=mm)
    graph = share_graph(lambda: CSCGraph.from_edges([0, 1, 2], [1, 2, 0], 3), mm, unlink=False)
    names = sorted(n for n in os.listdir("/dev/shm") if n.startswith(mm.shm_prefix))
    print(json.dumps({"prefix": mm.shm_prefix, "names": names}), flush=True)
    sys.stdin.readline()
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_replay_store_and_shared_graph_owner_cleans_up_on_signal(signum, shm_names):
    proc = subprocess.Popen([sys.executable, "-c", ENGINE_OWNER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line, proc.communicate(timeout=120)[1]
    report = json.loads(line)
    assert len(report["names"]) >= 3 and all((SHM / n).exists() for n in report["names"])
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signum, err
    assert shm_names(report["prefix"]) == []

"""graphrl.interrupts while numba compiles: a signal that lands inside numba's compiler raises `Interrupted`
only once the compiler is left (an exception between two of the compiler's lines can leave LLVM objects half
made, which llvmlite crashed on later); one that lands elsewhere raises at once. A second signal from the user
while the first waits (not one of the handler's re-sends) ends the process at once, of the signal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _forked import check_in_fork
from numba.core.compiler_lock import global_compiler_lock

from graphrl.interrupts import Interrupted, interrupts


def test_a_signal_inside_numbas_compiler_raises_once_the_compiler_is_left():
    # in a forked child: a re-send that came after the block (on a loaded machine) ends the child, not pytest
    def child() -> None:
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        reached = []
        with pytest.raises(Interrupted) as info, interrupts():
            with global_compiler_lock:  # as a kernel's first call holds it while it compiles
                signal.raise_signal(signal.SIGTERM)
                for _ in range(20):
                    time.sleep(0.01)  # the handler runs (more than once: it is sent again) and defers
                reached.append("compiled")
            time.sleep(2.0)  # the signal sent again after the lock is released raises here
            reached.append("slept through")
        assert reached == ["compiled"] and info.value.name == "SIGTERM"
        assert {s: signal.getsignal(s) for s in before} == before

    check_in_fork(child)


@pytest.mark.usefixtures("sigint_default")
def test_a_signal_while_another_thread_compiles_raises_at_once():
    import threading

    holding, done = threading.Event(), threading.Event()

    def compile_elsewhere() -> None:
        with global_compiler_lock:
            holding.set()
            done.wait(5.0)

    worker = threading.Thread(target=compile_elsewhere)
    worker.start()
    try:
        assert holding.wait(5.0)  # the other thread holds the compiler lock
        t0 = time.perf_counter()
        with pytest.raises(Interrupted), interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2.0)
        assert time.perf_counter() - t0 < 1.0
    finally:
        done.set()
        worker.join()


COMPILE_UNDER_SIGTERM = r'''
import gc, os, signal, sys, time
from llvmlite.binding import ffi, module as llvm_module
import numba
from graphrl.interrupts import Interrupted, interrupts

sent, detached = [], []


def link_modules(dst, src):  # llvmlite.binding.linker.link_modules, with SIGTERM landing in its C call
    with ffi.OutputString() as outerr:
        err = ffi.lib.LLVMPY_LinkModules(dst, src, outerr)
        first = not sent
        if first:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode, here
        src.detach()  # LLVM destroyed src: its wrapper must not dispose of it again
        if first:
            detached.append(True)
        if err:
            raise RuntimeError(str(outerr))


llvm_module.link_modules = link_modules
with interrupts():
    try:
        f = numba.njit(lambda x: x * 2 + 1)
        f(20)
        time.sleep(5.0)  # a signal deferred until the compile ended arrives here at the latest
        print("not interrupted", flush=True)
    except Interrupted as err:
        gc.collect()  # the wrappers of what the compile left behind are freed here
        g = numba.njit(lambda x: x + 3)  # and LLVM is used again
        print("interrupted", err.name, "detached", bool(detached), "then", g(1), flush=True)
        sys.exit(err.exit_code)
'''


def test_sigterm_landing_in_llvmlites_link_while_numba_compiles_stops_the_run_without_a_crash(tmp_path):
    """Raised between LLVM's link and its wrapper's detach (``detached False``), `Interrupted` left a wrapper
    that frees the linked-in module a second time: a store's first sample died of SIGSEGV so. Deferred, the
    compile ends whole, then the run stops with the signal's status."""
    script = tmp_path / "compile_under_sigterm.py"
    script.write_text(COMPILE_UNDER_SIGTERM)
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": repo}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 143, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert proc.stdout.splitlines() == ["interrupted SIGTERM detached True then 4"], proc.stdout


HOLD_THE_COMPILER_LOCK = r'''
import os, signal, sys, time
from numba.core.compiler_lock import global_compiler_lock
from graphrl import interrupts as interrupts_module

hold = float(sys.argv[1])
seen = []
with interrupts_module.interrupts():
    ours = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda s, f: (seen.append(s), ours(s, f)))  # counts, then calls ours
    try:
        with global_compiler_lock:  # as a kernel's first call holds it while it compiles
            print("holding", os.getpid(), flush=True)
            if hold < 0:
                os.kill(os.getpid(), signal.SIGTERM)  # the run's only signal
                hold = -hold
            end = time.monotonic() + hold
            while time.monotonic() < end:  # running Python, as the compiler does: a handler runs at once
                pass  # (a sleep here would wait for a signal that another thread received)
        sys.stdout.write("released\n")  # one write: a re-send can raise as soon as the lock is released, and
        sys.stdout.flush()  # print() may be interrupted between its text and its end (an exception in flush
        # leaves the line buffered, written before the next)
        time.sleep(5.0)  # the deferred signal raises here
        print("not interrupted", flush=True)
    except interrupts_module.Interrupted as err:
        print("interrupted", err.name, "SIGTERMs handled", len(seen), flush=True)
        sys.exit(err.exit_code)
'''


def _hold_the_compiler_lock(tmp_path: Path, hold: float) -> subprocess.Popen:
    """The script above under ``bash``, which prints its status as a shell reports it (``status N``)."""
    script = tmp_path / "hold_the_compiler_lock.py"
    script.write_text(HOLD_THE_COMPILER_LOCK)
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": repo}
    # SIGINT at its default in the child whatever the test run inherited (a background job ignores it)
    return subprocess.Popen(["bash", "-c", '"$0" "$@"; echo "status $?"', sys.executable, str(script),
                             str(hold)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_inside_numbas_compiler_stops_the_process_at_once(tmp_path, signum):
    proc = _hold_the_compiler_lock(tmp_path, 30.0)
    try:
        first = proc.stdout.readline().split()
        assert first[:1] == ["holding"], (first, proc.stderr.read() if proc.poll() is not None else "")
        pid = int(first[1])
        os.kill(pid, signum)
        time.sleep(0.3)  # deferred (sent again every RESEND_DELAY meanwhile), not raised
        assert proc.poll() is None
        t0 = time.perf_counter()
        os.kill(pid, signum)  # the user's second: the process dies of it
        out, err = proc.communicate(timeout=10)
        elapsed = time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.splitlines() == [f"status {128 + signum}"], (out, err)  # 130 / 143, no Interrupted
    assert f"second {signal.Signals(signum).name} while numba compiles" in err
    assert elapsed < 2.0


def test_the_handlers_own_resends_are_not_taken_for_a_second_signal(tmp_path):
    # one SIGTERM while the lock is held 0.5 s: sent again every RESEND_DELAY, each counted as ours
    proc = _hold_the_compiler_lock(tmp_path, -0.5)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = out.splitlines()
    assert lines[:2] == [lines[0], "released"] and lines[0].startswith("holding"), (out, err)
    handled = re.fullmatch(r"interrupted SIGTERM SIGTERMs handled (\d+)", lines[2])
    assert handled and int(handled.group(1)) >= 4, (out, err)  # the signal and its re-sends
    assert lines[3:] == ["status 143"], (out, err)


def deferred_across_the_block_end(defer: str) -> None:
    """In a forked child: a SIGTERM deferred (numba's compiler) or lost (a finalizer) just before the block
    ends, so its re-send is due after the block: it must raise `Interrupted` as the block is left, and no
    re-send may land later (SIGTERM at its default action would end the process, nothing saved)."""
    import weakref

    class Resource:
        pass

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    reached = []
    with pytest.raises(Interrupted) as info:
        with interrupts():
            if defer == "compiler":
                with global_compiler_lock:  # as a kernel's first call holds it while it compiles
                    signal.raise_signal(signal.SIGTERM)  # handled here: deferred, a re-send due in 50 ms
            else:
                resource = Resource()
                weakref.finalize(resource, signal.raise_signal, signal.SIGTERM)
                del resource  # the handler's Interrupted raised in the finalizer, where it is lost
            reached.append("block done")  # the block ends before the re-send is due
        reached.append("after the block")
    time.sleep(10 * 0.05)  # a re-send that came now would end this child, of SIGTERM
    assert reached == ["block done"] and info.value.name == "SIGTERM"
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.SIGTERM not in signal.sigpending()


@pytest.mark.parametrize("defer", ["compiler", "finalizer"])
def test_a_signal_still_deferred_when_the_block_ends_raises_there(defer):
    check_in_fork(lambda: deferred_across_the_block_end(defer))

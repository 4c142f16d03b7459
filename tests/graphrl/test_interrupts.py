"""graphrl.interrupts while numba compiles: a signal that lands inside numba's compiler raises `Interrupted`
only once the compiler is left (an exception between two of the compiler's lines can leave LLVM objects half
made, which llvmlite crashed on later); one that lands elsewhere raises at once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from numba.core.compiler_lock import global_compiler_lock

from graphrl.interrupts import Interrupted, interrupts


def test_a_signal_inside_numbas_compiler_raises_once_the_compiler_is_left():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    reached = []
    with pytest.raises(Interrupted) as info, interrupts():
        with global_compiler_lock:  # as a kernel's first call holds it while it compiles
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(20):
                time.sleep(0.01)  # the handler runs (more than once: it is sent again) and defers
            reached.append("compiled")
        time.sleep(2.0)  # the signal sent again after the lock is released raises here
        reached.append("slept through")
    assert reached == ["compiled"] and info.value.name == "SIGTERM"
    assert {s: signal.getsignal(s) for s in before} == before


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
    import subprocess
    import sys

    script = tmp_path / "compile_under_sigterm.py"
    script.write_text(COMPILE_UNDER_SIGTERM)
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": repo}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 143, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert proc.stdout.splitlines() == ["interrupted SIGTERM detached True then 4"], proc.stdout

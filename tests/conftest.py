"""Shared fixtures. GRAPHRL_DATA defaults to ../shared/data (relative to the repository root)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("GRAPHRL_DATA", str(REPO.parent / "shared" / "data"))
DATA = Path(os.environ["GRAPHRL_DATA"])
_WARM = pytest.StashKey[subprocess.Popen]()


# Run before each simulated script. numba's simulator runs a Python thread per GPU thread and has three
# thread-safety gaps, each closed here without changing what it simulates:
# - ``cuda.shared.array`` checks, then sets, its per-launch allocation: two threads of a block could each make
#   their own "shared" array and see different memory (a wrong block scan: CPU != CUDA results);
# - a device function swaps the ``cuda`` name of its module's globals for the fake module and back, per call,
#   so one thread's exit could restore the real module under another thread still running (AttributeError;
#   numba-cuda fixed it upstream in NVIDIA/numba-cuda#690): here the swap is counted per module;
# - the swap iterates the module's globals, and a warning's first appearance in a module (the RNG's uint64
#   wrap-around) adds ``__warningregistry__`` meanwhile ("dictionary changed size during iteration"): every
#   module loaded from source gets its registry before it runs.
# With those closed, a 20-us switch interval is safe; it halves the simulated tests' CPU time (the simulator
# polls its threads in a loop that otherwise holds the GIL 5 ms at a time).
# A block's barrier is the simulator's own rule, kept without its polling: ``syncthreads`` releases a block's
# threads once every thread still running waits at it (a thread that returned no longer counts), and the
# first exception of a thread aborts the block (threads waiting at the barrier raise, the launch raises it).
# numba polls every thread in a loop until all have ended, and burns the CPU the threads wait for; here a
# launch waits on one condition instead (a 32-thread block with two barriers: 4 ms of CPU instead of 13).
SIMULATOR_PRELUDE = """
import contextlib
import importlib.abc
import importlib.machinery
import sys
import threading


class _RegistryFirst(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if isinstance(spec.loader, importlib.machinery.SourceFileLoader):
                    run = spec.loader.exec_module

                    def exec_module(module, run=run):
                        module.__dict__.setdefault("__warningregistry__", {})
                        run(module)

                    spec.loader.exec_module = exec_module
                return spec
        return None


sys.meta_path.insert(0, _RegistryFirst())

import numba.cuda.simulator.kernel as _sim_kernel  # after the finder: its modules get registries
import numba.cuda.simulator.kernelapi as _sim_api
import numpy as _np
from numba.core import types as _types
from numba.np import numpy_support as _numpy_support

_LOCK = threading.Lock()


def _shared_array(self, shape, dtype):
    if isinstance(dtype, _types.Type):
        dtype = _numpy_support.as_dtype(dtype)
    if shape == 0:
        count = self._dynshared_size // dtype.itemsize
        return _np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    caller = sys._getframe(1)
    key = (caller.f_code.co_filename, caller.f_lineno)
    with _LOCK:
        if key not in self._allocations:
            self._allocations[key] = _np.empty(shape, dtype)
        return self._allocations[key]


_SWAPS = {}  # id(module globals) -> [entries, the globals' original cuda names]


@contextlib.contextmanager
def _swapped_cuda_module(fn, fake):
    from numba import cuda

    scope = fn.__globals__
    with _LOCK:
        entry = _SWAPS.setdefault(id(scope), [0, None])
        if entry[0] == 0:
            entry[1] = {k: v for k, v in scope.items() if v is cuda}
            scope.update({k: fake for k in entry[1]})
        entry[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            entry[0] -= 1
            if entry[0] == 0:
                scope.update(entry[1])


class _BlockBarrier:  # one simulated block's syncthreads: released when every live thread waits at it

    def __init__(self, live):
        self.cond = threading.Condition(threading.Lock())
        self.live, self.waiting, self.generation, self.error = live, 0, 0, None

    def _release_if_all_wait(self):
        if self.waiting and self.waiting == self.live:
            self.waiting = 0
            self.generation += 1
            self.cond.notify_all()

    def wait(self):
        with self.cond:
            if self.error is not None:
                raise RuntimeError("abort flag set on syncthreads call")
            generation = self.generation
            self.waiting += 1
            self._release_if_all_wait()
            while generation == self.generation and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise RuntimeError("abort flag set on syncthreads clear")

    def leave(self, error):
        with self.cond:
            self.live -= 1
            if error is not None and self.error is None:
                self.error = error
            self._release_if_all_wait()
            self.cond.notify_all()


def _thread_run(self):
    error = None
    try:
        self._target()
    except Exception as e:  # numba's message: the thread and block indices, then the error
        where = "tid=%s ctaid=%s" % (list(self.threadIdx), list(self.blockIdx))
        message = where if str(e) == "" else "%s: %s" % (where, e)
        error = self.exception = (type(e)(message), sys.exc_info()[2])
    finally:
        self._manager.barrier.leave(error)


def _thread_syncthreads(self):
    self._manager.barrier.wait()


def _block_run(self, grid_point, *args):
    def target():
        self._f(*args)

    self.barrier = barrier = _BlockBarrier(int(_np.prod(self._block_dim)))
    threads = [_sim_kernel.BlockThread(target, self, grid_point, point, self._debug)
               for point in _np.ndindex(*self._block_dim)]
    for t in threads:
        t.start()
    with barrier.cond:
        while barrier.live and barrier.error is None:
            barrier.cond.wait()
    if barrier.error is not None:
        raise barrier.error[0].with_traceback(barrier.error[1])


_sim_api.FakeCUDAShared.array = _shared_array
_sim_api.swapped_cuda_module = _sim_kernel.swapped_cuda_module = _swapped_cuda_module
_sim_kernel.BlockThread.run = _thread_run
_sim_kernel.BlockThread.syncthreads = _thread_syncthreads
_sim_kernel.BlockManager.run = _block_run
sys.setswitchinterval(2e-5)
"""


@dataclass(frozen=True)
class SimulatedPart:
    """What one script of `_simulate_parts` did: ``ok`` (it ran to its end) and ``output`` (what it printed,
    then its traceback if it raised, or the interpreter's output if that died)."""

    ok: bool
    output: str


_PARTS_MARK = "=== simulated parts: "
_PARTS_RUNNER = """
import contextlib, io, json, linecache, os, traceback


def _run_part(name, code):
    file = "<simulated part " + name + ">"
    linecache.cache[file] = (len(code), None, code.splitlines(True), file)  # tracebacks show the lines
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, file, "exec"), {"__name__": "__main__"})
        return [True, out.getvalue()]
    except BaseException:
        return [False, out.getvalue() + traceback.format_exc()]


def _run_forked(name, code):  # in a fork child: what the script patches ends with the child
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            with os.fdopen(w, "w") as pipe:
                pipe.write(json.dumps(_run_part(name, code)))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not said:
        return [False, "the fork child died before it reported: wait status %d" % status]
    return json.loads(said)


# the forks first, from an interpreter that has imported the library and run nothing: a fork child of a
# process whose torch has started its OpenMP threads (any parallel op of an earlier script) hangs in its
# first parallel region (libgomp is not fork-safe; seen: a child waiting in gomp_team_barrier_wait_end)
import torch, graphrl, samplers, replay  # noqa: E401,F401 - imported once, for the children and the rest
_results = {name: _run_forked(name, code) for name, code in _FORKED}
_results.update((name, _run_part(name, code)) for name, code in _PARTS)
print(_MARK + json.dumps(_results))
"""


# Put before a script started in the background: it waits for process PID (the kernels' warm-up) to end
_AFTER = """
import time as _time


def _running(pid):
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has ended
    except OSError:
        return False


while _running(PID):
    _time.sleep(0.2)
"""


@dataclass
class _Parts:
    """An interpreter started on `_PARTS_RUNNER`: its process, its scripts' names, its timeout (counted from
    when its results are asked for) and the files its output goes to (a pipe nobody reads could fill)."""

    proc: subprocess.Popen
    names: list[str]
    timeout: float
    out: IO[str]
    err: IO[str]


def _start_parts(scripts: dict[str, str], timeout: float = 600, forked: frozenset[str] = frozenset(),
                 after: int | None = None) -> _Parts:
    """Start `_PARTS_RUNNER` on ``scripts`` under the simulator; with ``after`` (a pid), niced and once that
    process has ended (in the background: it takes the core the session leaves idle)."""
    in_turn = [(name, code) for name, code in scripts.items() if name not in forked]
    alone = [(name, code) for name, code in scripts.items() if name in forked]
    header = f"_PARTS = {in_turn!r}\n_FORKED = {alone!r}\n_MARK = {_PARTS_MARK!r}\n"
    wait = "" if after is None else _AFTER.replace("PID", str(int(after)))
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(REPO)}
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    code = wait + SIMULATOR_PRELUDE + header + _PARTS_RUNNER
    # the script on stdin, not ``-c``: one argument may not exceed 128 KiB (execve's E2BIG), and the
    # session's scripts together do
    proc = subprocess.Popen([sys.executable, "-"], env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                            text=True, cwd=REPO, start_new_session=True,
                            preexec_fn=None if after is None else lambda: os.nice(10))
    try:
        proc.stdin.write(code)
    except BrokenPipeError:  # the interpreter died at once: its output says why
        pass
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    return _Parts(proc, list(scripts), timeout, out, err)


def _stop_parts(parts: _Parts) -> None:
    """Kill the interpreter and its fork children (its own session's process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(parts.proc.pid, signal.SIGKILL)
    parts.proc.wait()


def _parts_results(parts: _Parts) -> dict[str, SimulatedPart]:
    """Wait for ``parts`` (at most its timeout: then it is killed and `subprocess.TimeoutExpired` raised, as
    on any other error or an interrupt meanwhile); ``{name: SimulatedPart}``."""
    try:
        parts.proc.wait(timeout=parts.timeout)
    except BaseException:
        _stop_parts(parts)
        raise
    finally:
        parts.out.seek(0)
        parts.err.seek(0)
        stdout, stderr = parts.out.read(), parts.err.read()
        parts.out.close()
        parts.err.close()
    _, mark, tail = stdout.rpartition(_PARTS_MARK)
    if not mark:  # the interpreter died: every part reports its output
        said = f"exit status {parts.proc.returncode}\n{stdout[-3000:]}\n{stderr[-6000:]}"
        return {name: SimulatedPart(False, said) for name in parts.names}
    return {name: SimulatedPart(ok, output) for name, (ok, output) in json.loads(tail).items()}


def _simulate_parts(scripts: dict[str, str], timeout: float = 600,
                    forked: frozenset[str] = frozenset()) -> dict[str, SimulatedPart]:
    return _parts_results(_start_parts(scripts, timeout, forked))


_BATCH = pytest.StashKey["_SimulatedSession"]()


class _SimulatedSession:
    """The scripts of a session's tests marked ``simulated``, run in one interpreter: first each script
    that patches in a fork child of that interpreter (its patches reach no other script; the fork costs no
    second import of numba, torch and the library; forked before any script ran, as libgomp requires),
    then every script that patches nothing one after another in the interpreter itself.
    The interpreter starts in the background with the session (`start`), or when the first of them asks.
    Results are kept by test id."""

    def __init__(self, items: list[pytest.Item]) -> None:
        self._marked = [item for item in items if item.get_closest_marker("simulated") is not None]
        self._results: dict[str, SimulatedPart] = {}
        self._started: _Parts | None = None

    def start(self, after: int | None) -> None:
        """Start every marked script now, in the background (niced), once process ``after`` has ended."""
        if self._marked:
            self._started = _start_parts(*self._batch(self._marked), after=after)

    def stop(self) -> None:
        """Kill the interpreter started by `start` if it is still running, its results never asked for."""
        if self._started is not None:
            _stop_parts(self._started)
            self._started.out.close()
            self._started.err.close()
            self._started = None

    def result(self, item: pytest.Item) -> SimulatedPart:
        if item.nodeid not in self._results and self._started is not None:
            started, self._started = self._started, None
            self._results.update(_parts_results(started))
        if item.nodeid not in self._results:
            pending = [item for item in self._marked if item.nodeid not in self._results]
            if item not in pending:  # not collected with the session (a test run some other way)
                pending.append(item)
            self._results.update(_simulate_parts(*self._batch(pending)))
        return self._results[item.nodeid]

    @staticmethod
    def _batch(items: list[pytest.Item]) -> tuple[dict[str, str], float, frozenset[str]]:
        """The scripts of ``items`` by test id, their timeouts' sum, and the ids of those that patch."""
        marks = [item.get_closest_marker("simulated") for item in items]
        scripts = {item.nodeid: mark.args[0] for item, mark in zip(items, marks, strict=True)}
        timeout = sum(mark.kwargs.get("timeout", 600) for mark in marks)
        forked = frozenset(item.nodeid for item, mark in zip(items, marks, strict=True)
                           if mark.kwargs.get("patches"))
        return scripts, timeout, forked


@pytest.fixture
def simulated_part(request: pytest.FixtureRequest) -> SimulatedPart:
    """What the test's script did under numba's CUDA simulator (`SimulatedPart`: ``ok``, ``output``), the
    script given by the test's mark ``@pytest.mark.simulated(script, patches=False, timeout=600)``. The
    session's marked scripts share one interpreter (imports and numba's cache loads paid once): each runs in
    a namespace of its own, but what it patches at module level would stay patched, so a script that patches
    anything (``count_host_copies`` included) says ``patches=True`` and then runs in a fork child of that
    interpreter, before the others. A failing script fails only its own test, with its output and
    traceback. With the kernels' warm-up (``GRAPHRL_TEST_WARM`` not 0) the interpreter starts when the
    session's tests are collected, in the background once the warm-up ends; else when the first asks."""
    if request.node.get_closest_marker("simulated") is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses simulated_part without a simulated(script) mark")
    session = request.session
    if _BATCH not in session.stash:
        session.stash[_BATCH] = _SimulatedSession(session.items)
    return session.stash[_BATCH].result(request.node)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "simulated(script, patches=False, timeout=600): the script the "
                            "`simulated_part` fixture runs under numba's CUDA simulator for this test")


def _compile_ptx(script: str, timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception:  # noqa: BLE001 - any failure means no libNVVM to compile with
        pytest.skip("libNVVM not found: cannot compile numba.cuda kernels to PTX here")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, "-c", script], env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def compile_ptx():
    """``compile_ptx(script, timeout=600)``: run a script that compiles numba.cuda kernels to PTX (no GPU
    needed, libNVVM is) in a fresh interpreter without the simulator; skips the test where libNVVM is absent.
    Returns the ``subprocess.CompletedProcess``."""
    return _compile_ptx


def _load_script(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_script():
    """``load_script(path)``: the Python file at ``path`` (an example or a benchmark) loaded as a module named
    after its stem, without running its ``__main__`` block."""
    return _load_script


def _need(sub: str) -> Path:
    path = DATA / sub
    if not path.is_dir():
        pytest.skip(f"real data not found at {path}: set GRAPHRL_DATA to the shared data folder")
    return path


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The real-data folder; tests using it skip with a reason when it is absent (CI always has it)."""
    _need("")
    return DATA


@pytest.fixture
def mm():
    """A default `graphrl.memory.MemoryManager` for one test, closed after it (a file that needs another scope
    or a host-memory device tier defines its own ``mm``)."""
    from graphrl.memory import MemoryManager  # here, not at import: collecting must not import torch

    with MemoryManager() as manager:
        yield manager


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start `tests/_warm_kernels.py` in the background (niced: it takes the core the session leaves idle),
    so that the sampler tests, which run last, load their kernels from numba's cache instead of compiling
    them; ``GRAPHRL_TEST_WARM=0`` skips it."""
    if os.environ.get("GRAPHRL_TEST_WARM", "1") == "0" or not hasattr(os, "nice"):
        return
    session.config.stash[_WARM] = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "_warm_kernels.py")], cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.nice(10))


def _freeze_gc() -> None:
    """Collect, then exempt every object alive now from Python's cyclic collector (`gc.freeze`). torch,
    numba, hypothesis and the library make about half a million objects that live as long as the session,
    and every full collection (automatic, or a test's ``gc.collect()``) walked them all again: about 0.3 s
    each on 2 cores, a hundred and more times a session. A test's own objects are made after the freeze
    and collected as before; garbage is never frozen (the collection comes first), and reference counting
    frees frozen objects as usual (only a cycle through an object alive at a freeze waits for the end)."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the objects the collection made (`_freeze_gc`: the test modules and what they import). With
    the warm-up running, start the session's simulated scripts in the background too (niced), to run on the
    idle core once the warm-up has ended (`_SimulatedSession.start`)."""
    if not session.config.option.collectonly:
        _freeze_gc()
    warm = session.config.stash.get(_WARM, None)
    if warm is not None and not session.config.option.collectonly:
        session.stash[_BATCH] = _SimulatedSession(session.items)
        session.stash[_BATCH].start(after=warm.pid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the warm-up and the simulated scripts' interpreter if they are still running."""
    proc = session.config.stash.get(_WARM, None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    if _BATCH in session.stash:
        session.stash[_BATCH].stop()


_RAY_STARTED = pytest.StashKey[bool]()
_RAY_LAST = pytest.StashKey[str]()


def _uses_ray(item: pytest.Item) -> bool:
    return "ray_cluster" in getattr(item, "fixturenames", ())


def _ray_shutdown(config: pytest.Config) -> None:
    if config.stash.get(_RAY_STARTED, False):
        import ray

        ray.shutdown()
        config.stash[_RAY_STARTED] = False


@pytest.fixture(scope="session")
def ray_cluster(request: pytest.FixtureRequest):
    """A local Ray cluster of this machine (2 CPUs, namespace ``graphrl_tests``), shared by every test that
    asks for it (``ray`` is what it gives). Starting one costs seconds (a head process, a raylet, workers
    importing torch): it starts when the first such test asks and shuts down as soon as the last one is done
    (`pytest_runtest_teardown`); those tests run last, one after another (`pytest_collection_modifyitems`),
    so that no other test runs, or forks, beside a Ray driver. Each test still makes (and closes) its own
    stores, owners and actors. A cluster someone started before the tests is used and left running."""
    ray = pytest.importorskip("ray", reason="the Ray backends need ray: pip install 'graphrl[ray]'")
    if not ray.is_initialized():
        # address="local": a cluster of its own, even where someone runs `ray start --head` on this machine
        ray.init(address="local", num_cpus=2, namespace="graphrl_tests", include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
        request.config.stash[_RAY_STARTED] = True
    yield ray
    _ray_shutdown(request.config)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Shut the shared Ray cluster down after the last test that uses it (and its module fixtures' teardown:
    this runs after pytest's own). After a test file's last test (its module fixtures gone), freeze what
    the session keeps (`_freeze_gc`: modules and kernels loaded since, session fixtures)."""
    if _RAY_LAST not in item.config.stash:
        users = [i.nodeid for i in item.session.items if _uses_ray(i)]
        item.config.stash[_RAY_LAST] = users[-1] if users else ""
    if nextitem is None or item.nodeid == item.config.stash[_RAY_LAST]:
        _ray_shutdown(item.config)
    if nextitem is not None and getattr(nextitem, "module", None) is not getattr(item, "module", None):
        _freeze_gc()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests marked ``simulated`` after the others (their scripts have the whole session to run in
    the background: `pytest_collection_finish`), then those that use the shared Ray cluster (`ray_cluster`),
    each group in its order, so that one cluster serves them all. Skip the tests marked ``gpu`` where torch
    finds no CUDA, with the reason said once (the count is in pytest's short summary: ``SKIPPED [N] ... no
    CUDA device``)."""
    items.sort(key=lambda item: 2 if _uses_ray(item) else item.get_closest_marker("simulated") is not None)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch  # here, not at import: collecting a test file must not depend on torch's CUDA state

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: no CUDA device here (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def tiny_gowalla(tmp_path) -> Path:
    """A data folder with a tiny Gowalla-format set (40 users, 30 items), for CLI runs that must be quick."""
    import numpy as np

    rng = np.random.default_rng(0)
    root = tmp_path / "data"
    folder = root / "gowalla"
    folder.mkdir(parents=True)
    rows = [(u, rng.choice(30, size=8, replace=False)) for u in range(40)]
    (folder / "train.txt").write_text("".join(" ".join(map(str, [u, *i[:6]])) + "\n" for u, i in rows))
    (folder / "test.txt").write_text("".join(" ".join(map(str, [u, *i[6:]])) + "\n" for u, i in rows))
    return root


@pytest.fixture
def sigint_default():
    """SIGINT with Python's default handler during the test, restored after: a job that a
    non-interactive shell starts in the background inherits SIGINT ignored, and `graphrl.interrupts`
    leaves an ignored signal ignored (as ``nohup`` wants), so a test sending itself SIGINT needs this."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="module")
def dgl():
    """The DGL module (`graphrl.dglshim.import_dgl`), or the test skipped where the 'dgl' extra is missing."""
    from graphrl.dglshim import dgl_available, import_dgl

    if not dgl_available():
        pytest.skip("DGL not installed (install the 'dgl' extra)")
    return import_dgl()

"""The one thread policy of graphrl: how many threads torch, numba and our helper-thread team may use.

Thread counts are process settings of torch and numba, so graphrl changes them only through this module,
and says so in the log. The policy has two parts (docs/architecture.md#core-graphrl):

- **One count for every pool.** `configure(threads)` sets torch's intra-op pool, numba's thread count and
  the cap of our team (`team_size`, used by `graphrl.kernels.parallel_for`'s callers) to one number:
  ``threads``, else the ``GRAPHRL_THREADS`` environment variable, else the cores this process may use
  (`available_cores`: its CPU affinity, not the machine's, capped by a cgroup CPU quota). The CLI calls it;
  a program may call it once at start. If nobody did, the first kernel that asks (`team_size`) applies it
  implicitly, at most once, with a log line, and then only lowers: torch and numba keep their counts unless
  they exceed the cores or each other (a program that ran ``torch.set_num_threads(1)`` keeps 1, and numba
  and our team follow it). ``GRAPHRL_THREADS=off`` (or ``configure("off")``) opts out: graphrl never changes
  torch's or numba's counts; its team follows ``numba.get_num_threads()``.
- **Small work runs serially** (`threads_for`): an OpenMP fork-join waits for every worker, and when
  another process keeps the cores busy a worker may wait a whole time slice to be scheduled, so a
  split of a millisecond of work can take tens of milliseconds. Below `SERIAL_WORK` units of work a
  kernel runs on the calling thread; above, chunks are claimed dynamically (`graphrl.kernels.team`).
  A loop of many small torch operations runs inside `serial_torch` (torch's count at 1 in the calling
  thread for the loop, then restored; nothing when opted out): the staged full-graph path's copies.

The count does not drop when other processes load the cores: the scheduler shares the cores per thread (or
per session), so a thread fewer is a share fewer (docs/performance.md, "Threads under load"). OpenMP
runtimes read ``OMP_WAIT_POLICY`` once, when they start, so graphrl does not set it. On a machine shared
with busy processes, start Python with ``OMP_WAIT_POLICY=PASSIVE`` to stop idle torch and numba workers from
spinning.

>>> from graphrl import threads
>>> threads.configure(1).threads                       # doctest: +SKIP
1
>>> threads.threads_for(1_000), threads.team_size()    # doctest: +SKIP
(1, 1)
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numba
import torch

__all__ = ["ENV", "SERIAL_WORK", "ThreadPolicy", "available_cores", "cgroup_cpu_limit", "configure",
           "idle_cores", "limit", "policy", "serial_torch", "team_size", "threads_for"]

logger = logging.getLogger(__name__)

ENV = "GRAPHRL_THREADS"
"""Environment variable: a thread count, or ``off`` to leave torch's and numba's counts alone."""
SERIAL_WORK = 1 << 16
"""Work (multiply-adds, or bytes moved / 4) below which a kernel runs on the calling thread."""
_OFF = ("off", "none", "no", "false")


@dataclass(frozen=True)
class ThreadPolicy:
    """The thread policy in force.

    Attributes
    ----------
    threads : int or None
        The count torch, numba and the team use; None when opted out (the team then follows
        ``numba.get_num_threads()``).
    source : str
        Where the count came from: ``"argument"``, ``"GRAPHRL_THREADS"``, ``"cores"``, ``"torch"``
        (implicit, lowered to torch's count), ``"numba"`` (likewise) or ``"off"``.
    explicit : bool
        Set by a call to `configure` (False: applied implicitly by the first kernel).
    """

    threads: int | None
    source: str
    explicit: bool


_lock = threading.Lock()
_policy: ThreadPolicy | None = None


def cgroup_cpu_limit(proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
                     root: str | os.PathLike[str] = "/sys/fs/cgroup") -> float | None:
    """CPUs per period this process's cgroups allow (CFS bandwidth: quota / period), or None if unlimited.

    Reads cgroup v2's ``cpu.max`` and v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` in the process's
    cgroup and each of its ancestors under ``root`` (the smallest limit wins; a container that sees
    its own cgroup as ``/`` is covered by the ancestors). A container run with ``--cpus=1`` on a
    16-core host: 1.0, while its affinity still lists 16 cores. Unreadable files count as no limit.
    """
    limits = []
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            dirs, v1 = [Path(root)], False
        elif "cpu" in controllers.split(","):
            dirs, v1 = [Path(root) / controllers, *(Path(root) / c for c in controllers.split(","))], True
        else:
            continue
        parts = [q for q in path.split("/") if q]
        for base in dirs:
            for k in range(len(parts), -1, -1):
                folder = base.joinpath(*parts[:k])
                try:
                    if v1:
                        quota = int((folder / "cpu.cfs_quota_us").read_text())
                        period = int((folder / "cpu.cfs_period_us").read_text())
                    else:
                        text = (folder / "cpu.max").read_text().split()
                        quota, period = (-1 if text[0] == "max" else int(text[0])), int(text[1])
                except (OSError, ValueError, IndexError):
                    continue
                if quota > 0 and period > 0:
                    limits.append(quota / period)
    return min(limits) if limits else None


def available_cores() -> int:
    """Cores this process may use: its CPU affinity (cpusets, ``taskset``; else ``os.cpu_count()``), at
    most its cgroup's CPU limit (`cgroup_cpu_limit`, rounded down, at least 1).

    More threads than the quota lets run at once get throttled together at the end of each period, and
    a fork-join then waits for the next one (docs/performance.md, "Threads under load").
    """
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        cores = max(1, os.cpu_count() or 1)
    limit = cgroup_cpu_limit()
    return cores if limit is None else max(1, min(cores, math.floor(limit)))


def _parse(value, name: str) -> int | None:
    """A positive int, or None for the opt-out; ValueError / TypeError naming ``name`` otherwise."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _OFF:
            return None
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{name} must be a positive integer or 'off', got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, 'off' or None, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1 (or 'off'), got {value}")
    most = numba.config.NUMBA_NUM_THREADS
    if value > most:  # torch would run more threads than numba and the team: not one count
        raise ValueError(f"{name} must be at most {most} (numba.config.NUMBA_NUM_THREADS, the most numba can "
                         f"run: the machine's cores unless NUMBA_NUM_THREADS is set), got {value}")
    return value


def _start_numba() -> None:
    """Start numba's threading layer (its first count call does) keeping torch's count: the layer's OpenMP
    runtime (torch's too, when both use libgomp) resets the calling thread's count as it starts."""
    before = torch.get_num_threads()
    numba.get_num_threads()
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


def _apply(n: int) -> None:
    """Set torch's intra-op pool and numba's count (in the calling thread) to ``n`` (numba first, as
    starting its layer resets the OpenMP count)."""
    nb_n = min(n, numba.config.NUMBA_NUM_THREADS)
    if numba.get_num_threads() != nb_n:
        numba.set_num_threads(nb_n)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def configure(threads: int | str | None = None) -> ThreadPolicy:
    """Set torch's, numba's and graphrl's thread counts to one number, and return the policy.

    Parameters
    ----------
    threads : int, str or None
        The count (>= 1); ``"off"`` to opt out (graphrl then never changes torch's or numba's counts);
        None: ``$GRAPHRL_THREADS`` if set, else `available_cores`.

    Returns
    -------
    ThreadPolicy

    Raises
    ------
    ValueError
        ``threads`` (or ``$GRAPHRL_THREADS``) is not a positive integer or ``"off"``, or is more than
        ``numba.config.NUMBA_NUM_THREADS`` (numba could not follow: the pools would differ).
    TypeError
        ``threads`` is neither an int, a str nor None.

    Notes
    -----
    torch's and numba's counts are process settings (numba's, and torch's OpenMP count, are kept per
    thread: a thread started later begins with torch's last count and numba's default), so call this
    in the main thread before starting others. Idempotent: calling it again with the same count
    changes and logs nothing.
    """
    global _policy
    if threads is not None:
        n, source = _parse(threads, "threads"), "argument"
    elif os.environ.get(ENV, "").strip():
        n, source = _parse(os.environ[ENV], ENV), ENV
    else:
        n, source = available_cores(), "cores"
    new = ThreadPolicy(n, "off" if n is None else source, True)
    with _lock:
        old, _policy = _policy, new
        if n is not None:
            _apply(n)
        else:
            _start_numba()  # opted out: torch's count stays whatever the program set
    if old is None or old.threads != new.threads:
        logger.info("graphrl.threads: %s", _describe(new))
    return new


def _describe(p: ThreadPolicy) -> str:
    if p.threads is None:
        return (f"opted out ({ENV}=off): torch keeps {torch.get_num_threads()} thread(s), numba "
                f"{numba.get_num_threads()}")
    return f"torch, numba and the kernel team use {p.threads} thread(s) (from {p.source})"


def _implicit() -> ThreadPolicy:
    """The policy applied by the first kernel that asks: $GRAPHRL_THREADS, else align downward."""
    global _policy
    _start_numba()
    env = os.environ.get(ENV, "").strip()
    if env:
        n = _parse(env, ENV)
        p = ThreadPolicy(n, "off" if n is None else ENV, False)
    else:
        counts = {"cores": available_cores(), "torch": torch.get_num_threads(),
                  "numba": numba.get_num_threads()}
        source = min(counts, key=lambda k: (counts[k], k != "cores"))
        p = ThreadPolicy(counts[source], source, False)
    if p.threads is not None:
        before = torch.get_num_threads(), numba.get_num_threads()
        _apply(p.threads)
        if before != (p.threads, numba.get_num_threads()):
            logger.info("graphrl.threads: %s (torch had %d, numba %d); set %s=off or call "
                        "graphrl.threads.configure() to choose", _describe(p), before[0], before[1], ENV)
    else:
        logger.info("graphrl.threads: %s", _describe(p))
    _policy = p
    return p


def policy() -> ThreadPolicy | None:
    """The policy in force, or None before `configure` or the first kernel call."""
    return _policy


def team_size() -> int:
    """Threads graphrl's kernels may use, the caller included (applies the policy on first use).

    Returns
    -------
    int
        ``numba.get_num_threads()`` of the calling thread, at most the policy's count (so a
        ``numba.set_num_threads(1)`` in this thread still makes our kernels serial).
    """
    p = _policy
    if p is None:
        with _lock:
            p = _policy if _policy is not None else _implicit()
    n = numba.get_num_threads()
    return n if p.threads is None else min(n, p.threads)


def threads_for(work: int, chunk_work: int = SERIAL_WORK) -> int:
    """Threads for one call of ``work`` units (multiply-adds, or bytes / 4): 1 below `SERIAL_WORK`,
    else at most one per ``chunk_work`` units, at most `team_size`.

    Parameters
    ----------
    work : int
        Units of work of the call.
    chunk_work : int
        Least work worth a thread of its own (default `SERIAL_WORK`).

    Returns
    -------
    int
        In [1, team_size()].
    """
    if work < SERIAL_WORK:
        return 1
    return max(1, min(team_size(), int(work) // max(int(chunk_work), 1)))


def idle_cores(cores: int, own: int = 0) -> int:
    """How many of ``cores`` (the cores the caller may use, itself included) have nothing else to run at
    this moment: ``cores`` less the machine's runnable tasks, this thread included (the running
    count of ``/proc/loadavg``, read only when ``os.getloadavg()[0]``, the 1-minute mean, is under
    twice ``cores``; above it, 0), plus ``own``: the caller's own threads that count as running there
    but hold their core for it (copy helpers spinning between batches); at most ``cores - 1``. Where
    neither can be read: ``cores - 1``.

    A helper thread works in parallel only on an idle core; on a busy one it takes the caller's core
    or holds the interpreter lock the caller needs next (docs/performance.md, "Replay for pixel
    steps"). `replay.transition_kernel.sample_transitions` asks it before waking copy helpers.
    """
    try:
        if os.getloadavg()[0] >= 2 * cores:
            return 0
        fd = os.open("/proc/loadavg", os.O_RDONLY)  # not open(): its buffered file costs 3 us more a call
        try:
            running = int(os.read(fd, 256).split()[3].split(b"/")[0])
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return cores - 1
    return max(0, min(cores - 1, cores - running + own))


@contextmanager
def limit(threads: int) -> Iterator[None]:
    """Run the block with torch and numba (in this thread) and graphrl's team at ``threads``, then restore.

    For a stretch of small operations (a small graph's training loop, say) where even two threads lose
    to one on a busy machine. Not for concurrent use from several threads: the policy is process-wide.

    Parameters
    ----------
    threads : int
        >= 1.

    Raises
    ------
    ValueError, TypeError
        As `configure`.
    """
    global _policy
    n = _parse(threads, "threads")
    if n is None:
        raise ValueError("threads must be a positive integer for limit(), got 'off'")
    before = torch.get_num_threads(), numba.get_num_threads(), _policy
    with _lock:
        _policy = ThreadPolicy(n, "argument", True)
        _apply(n)
    try:
        yield
    finally:
        with _lock:
            torch.set_num_threads(before[0])
            numba.set_num_threads(before[1])
            _policy = before[2]


@contextmanager
def serial_torch() -> Iterator[None]:
    """Run the block with torch's intra-op count at 1 in this thread, then restore it (opted out: no-op).

    For a loop of many small torch operations (each a fork-join of torch's OpenMP pool, which a busy
    machine stretches to a time slice); our own kernels in the block keep `team_size` threads.
    Changing torch's count costs well under a microsecond.
    """
    if _policy is None:
        team_size()  # applies the policy (once)
    n = torch.get_num_threads()
    if _policy.threads is None or n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)

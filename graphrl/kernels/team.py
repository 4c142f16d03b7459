"""The helper-thread team both engines' CPU kernels share: `parallel_for`, and `Chunks` / `engaged`.

`parallel_for` runs chunks ``0..n-1``, claimed dynamically by the calling thread and daemon helper
threads; callers that interleave their own work with the helpers' (the neighbour sampler's
pipelined relabelling) use `Chunks` and `engaged` directly. No kernel of the project uses
``numba.prange`` (the SpMM products of `graphrl.kernels.spmm` run here too): when
other processes keep the cores busy, every OpenMP fork-join waits for a descheduled worker; with
dynamic claiming the caller never waits for a chunk no helper has started, so a busy machine costs
at most the speed-up (docs/performance.md).

The team is shared by the whole process and serves one task at a time: a caller that finds it
busy runs its chunks alone. It is rebuilt in a forked child (helper threads do not survive
``fork``). An exception in any chunk (a helper's error, ``KeyboardInterrupt`` in the caller) is
re-raised in the caller once every claimed chunk has finished, so no helper still writes into the
caller's buffers after the call returns or raises.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["Chunks", "engaged", "parallel_for"]


class Chunks:
    """Chunks ``0..num_chunks-1`` of one parallel loop, claimed in order by whichever thread asks first.

    Parameters
    ----------
    fn : callable(int) -> None
        Runs one chunk; a numba kernel called from it should be ``nogil`` so that threads overlap.
    num_chunks : int

    Attributes
    ----------
    done : bytearray
        ``done[i]`` is 1 once chunk ``i`` has finished (or raised).
    error : BaseException or None
        The first exception a chunk raised.
    """

    def __init__(self, fn: Callable[[int], None], num_chunks: int) -> None:
        self.fn = fn
        self.num_chunks = num_chunks
        self.next = 0
        self.done = bytearray(num_chunks)
        self.cond = threading.Condition(threading.Lock())
        self.error: BaseException | None = None

    def claim(self) -> int:
        """The next unclaimed chunk, or -1 when all are claimed."""
        with self.cond:
            i = self.next
            if i >= self.num_chunks:
                return -1
            self.next = i + 1
        return i

    def run(self, i: int) -> None:
        """Run chunk ``i`` (claimed by this thread); an exception is kept for `finish`."""
        try:
            self.fn(i)
        except BaseException as err:  # re-raised by finish() in the calling thread
            if self.error is None:
                self.error = err
        finally:
            with self.cond:
                self.done[i] = 1
                self.cond.notify_all()

    def help(self) -> None:
        """Claim and run chunks until none is left."""
        while (i := self.claim()) >= 0:
            self.run(i)

    def help_until(self, r: int) -> None:
        """Return once chunk ``r`` is done, running unclaimed chunks here meanwhile (in order, so ``r``
        is claimed by this thread or already was); used to consume chunks in order while helpers run
        later ones."""
        while not self.done[r]:
            i = self.claim()
            if i < 0:
                self.wait(r)
                return
            self.run(i)

    def wait(self, i: int) -> None:
        """Block until chunk ``i`` (already claimed) is done."""
        if self.done[i]:
            return
        with self.cond:
            while not self.done[i]:
                self.cond.wait()

    def finish(self) -> None:
        """Run the unclaimed chunks here, wait for the claimed ones, re-raise the first error.

        Raises
        ------
        BaseException
            Whatever the first failing chunk raised (in a helper or here).
        """
        self.help()
        for i in range(self.num_chunks):
            self.wait(i)
        if self.error is not None:
            raise self.error


class _Team:
    """Daemon helper threads shared by the whole process; one task at a time."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._task: Chunks | None = None
        self._generation = 0
        self._threads: list[threading.Thread] = []
        self._busy = threading.Lock()

    def _loop(self) -> None:
        seen = 0
        while True:
            with self._cv:
                while self._generation == seen:
                    self._cv.wait()
                seen = self._generation
                task = self._task
            if task is not None:
                task.help()
            task = None

    @contextmanager
    def engaged(self, task: Chunks, helpers: int) -> Iterator[None]:
        if helpers <= 0 or task.num_chunks <= 1 or not self._busy.acquire(blocking=False):
            yield
            return
        try:
            while len(self._threads) < helpers:
                thread = threading.Thread(target=self._loop, name="graphrl-helper", daemon=True)
                thread.start()
                self._threads.append(thread)
            with self._cv:
                self._task = task
                self._generation += 1
                self._cv.notify(helpers)
            yield
        finally:
            with self._cv:
                self._task = None
            self._busy.release()


_TEAM = _Team()


def _reset_team_after_fork() -> None:  # helper threads do not survive fork()
    global _TEAM
    _TEAM = _Team()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_team_after_fork)


@contextmanager
def engaged(task: Chunks, helpers: int) -> Iterator[None]:
    """Let up to ``helpers`` helper threads claim chunks of ``task`` inside the ``with`` block.

    The caller must end the block with ``task.finish()`` (or wait for every claimed chunk itself):
    helpers stop claiming when the block exits but finish the chunk they hold. With ``helpers <= 0``,
    a single chunk, or the team busy with another caller's task, no helper joins.

    Parameters
    ----------
    task : Chunks
    helpers : int
        Helper threads besides the caller (started on first use, then kept).
    """
    with _TEAM.engaged(task, helpers):
        yield


def parallel_for(fn: Callable[[int], None], n: int, threads: int) -> None:
    """Run ``fn(0) .. fn(n-1)``, each exactly once, on up to ``threads`` threads (the caller included).

    Chunks are claimed dynamically, in order; the caller works too and never waits for a chunk no
    helper has started (see the module docstring). ``fn`` should release the GIL (a ``nogil`` numba
    kernel) for the threads to overlap. A chunk that raises does not stop the others: every chunk
    runs, then the first error is re-raised in the caller.

    Parameters
    ----------
    fn : callable(int) -> None
    n : int
        Number of chunks (>= 0).
    threads : int
        Threads that may run chunks, the caller included; 1 (or less) runs them all in the caller.

    Raises
    ------
    BaseException
        The first exception a chunk raised, once every claimed chunk has finished.
    """
    task = Chunks(fn, int(n))
    with _TEAM.engaged(task, int(threads) - 1):
        task.finish()

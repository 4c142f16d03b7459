"""`DeferringLock`: the `MemoryManager`'s lock, which also runs the frees that had to wait for it.

A finalizer (``weakref.finalize(tensor, free_quietly, region)``) runs wherever Python drops a last
reference or collects garbage: also on a thread that holds the manager's lock, or that is inside one of
its resources (a `graphrl.memory.pool.PoolResource`'s lock, an exit cleanup's lock), none of them
re-entrant. Freeing there at once would deadlock. So a finalizer's free goes through
`DeferringLock.defer`, which runs it at once when it can and otherwise queues it for the section in its
way, whose end runs the queue:

- ``with lock:`` holds the lock (not re-entrant). Its release runs what was queued meanwhile, by any
  thread (a finalizer on this thread, or on another that found the lock held).
- ``with lock.busy:`` marks this thread busy without taking the lock, around a call into code whose
  locks a free takes (a resource's ``allocate``, ``deallocate``, ``trim``, ``stats``). A free deferred
  on this thread meanwhile runs when its outermost busy section ends; on other threads, at once.
- `DeferringLock.drain` runs whatever is queued, waiting for the lock if another thread holds it
  (``MemoryManager.close``).

A deferred call runs exactly once: it is appended before ``defer`` tests the lock, so a holder that
made it wait tests the queue after its release and finds it, and ``deque.popleft`` hands each call to
one thread. It waits only as long as the section in its way: never for an unrelated later call.

>>> lock = DeferringLock()
>>> with lock:
...     lock.defer(print, "freed")  # this thread holds the lock: queued
...     print("still inside")
still inside
freed

References
----------
RMM's deferred deallocation; CPython's pending calls (``Py_AddPendingCall``), which run at a point
where the interpreter holds nothing. docs/architecture.md#memory-tiers (Lifetime).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Busy", "DeferringLock"]

logger = logging.getLogger(__name__)

_Queue = deque[tuple[Callable[..., object], tuple[Any, ...]]]


class _Sections(threading.local):
    """Per thread: how many busy sections (or runs of the queue) are under way."""

    depth = 0


def _run_queued(lock: threading.Lock, queue: _Queue, threads: _Sections, wait: bool = False) -> None:
    """Run the queued calls on this thread unless it is busy or, without ``wait``, someone holds ``lock``.

    A holder of ``lock`` (this thread inside its critical section, or another thread) runs them once it
    lets go. While they run this thread counts as busy, so a call that takes ``lock`` does not start
    another run, and a finalizer that fires meanwhile only queues (this loop takes it).
    """
    while queue and not threads.depth:
        if not wait:
            if not lock.acquire(blocking=False):
                return  # its holder tests the queue after its release
            lock.release()
        threads.depth = 1
        try:
            while True:
                try:
                    call, args = queue.popleft()
                except IndexError:  # empty (another thread may have taken the last one)
                    break
                try:
                    call(*args)
                except Exception as err:  # noqa: BLE001 - a finalizer's free: no caller to raise to
                    logger.warning("a deferred %s%r failed: %s", getattr(call, "__qualname__", call), args,
                                   err)
        finally:
            threads.depth = 0


class Busy:
    """``with lock.busy:``: this thread is inside code whose locks a deferred call takes; see the module."""

    __slots__ = ("_lock", "_queue", "_threads")

    def __init__(self, lock: threading.Lock, queue: _Queue, threads: _Sections) -> None:
        self._lock = lock
        self._queue = queue
        self._threads = threads

    def __enter__(self) -> None:
        self._threads.depth += 1

    def __exit__(self, *exc: object) -> None:
        threads = self._threads
        threads.depth -= 1
        if self._queue and not threads.depth:
            _run_queued(self._lock, self._queue, threads)


class DeferringLock:
    """A lock (not re-entrant) whose release runs the calls `defer` queued while it was in the way.

    Use ``with lock:`` for critical sections, ``with lock.busy:`` around calls into code with its own
    locks that a deferred call takes, `defer` from finalizers, and `drain` when closing. See the module.

    Attributes
    ----------
    busy : Busy
        Context manager: this thread is busy (calls deferred on it wait for the outermost section's end).
    """

    __slots__ = ("_lock", "_queue", "_threads", "busy")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: _Queue = deque()
        self._threads = _Sections()
        self.busy = Busy(self._lock, self._queue, self._threads)

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
        if self._queue:
            _run_queued(self._lock, self._queue, self._threads)

    def defer(self, call: Callable[..., object], *args: Any) -> None:
        """Run ``call(*args)`` now, or, if this thread is busy or any thread holds the lock, at the end
        of that section. Never blocks; safe in a finalizer. An exception of ``call`` is logged, not raised.
        """
        self._queue.append((call, args))
        _run_queued(self._lock, self._queue, self._threads)

    def drain(self) -> None:
        """Run every queued call now on this thread, waiting for the lock (through the calls) if another
        thread holds it. Call it holding neither the lock nor a busy section (it returns at once inside
        a busy section, whose end runs them)."""
        _run_queued(self._lock, self._queue, self._threads, wait=True)

    @property
    def queued(self) -> int:
        """How many deferred calls wait now (for tests and diagnostics)."""
        return len(self._queue)

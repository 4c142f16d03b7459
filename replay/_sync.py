"""Process-shared mutexes and condition variables that live inside shared memory (private module).

Writers of a replay store run in other processes (actors) and must block on the store's rate limiter
and serialise their commits to a shard. ``multiprocessing`` locks cannot do this here: they pickle only
while a process is being spawned, so they cannot travel inside a small picklable handle that is sent
any other way. Instead we place a POSIX ``pthread_mutex_t``, initialised ``PTHREAD_PROCESS_SHARED``,
and a condition's futex word inside a shared-memory region: any process that maps the region (by name,
through `graphrl.memory.Region.attach`) can lock and wait on them, and the handle stays a few names.

- The mutex is *robust*: if a process dies while holding it, the next locker gets ``EOWNERDEAD``; we
  mark the mutex consistent and report it (``SharedMutex.acquire`` returns ``True``) so the caller can
  repair the state it protects. No lock is ever lost to a killed actor.
- Conditions are a sequence word and futex(2) (`SharedCondition`): a waiter killed while waiting holds
  nothing, so it cannot block a later broadcast. Waits are relative (``CLOCK_MONOTONIC``) and every
  wait has a deadline, so a wait never hangs longer than its timeout.
- ctypes releases the GIL around each call, so a thread blocked here never blocks other Python threads.

`SharedCondition` has the methods of ``threading.Condition`` that the rate limiter and the store use
(``with cond:``, ``wait``, ``wait_for``, ``notify_all``), so in-process code can take either.

Linux with glibc only (as is `graphrl.memory`'s shared tier). Each object takes `SLOT_BYTES` bytes.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import math
import platform
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

logger = logging.getLogger(__name__)

SLOT_BYTES = 128  # room for a pthread_mutex_t (40 B on glibc) or a futex word, cache-line aligned
_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1
_FUTEX_TID_MASK = 0x3FFFFFFF  # a robust mutex's lock word: the owner's thread id, under two flag bits
_MAX_WAIT_S = 3600.0  # waits without a timeout re-arm every hour (so no timespec overflows)
_SLICE_S = 1.0  # wait_for re-checks at least this often (a blocked C call delays Python signal handlers)

_libc = ctypes.CDLL(None, use_errno=True)
for _name in ("pthread_mutex_lock", "pthread_mutex_timedlock", "pthread_mutex_unlock",
              "pthread_mutex_consistent"):
    getattr(_libc, _name).restype = ctypes.c_int
# timed locks: pthread_mutex_clocklock on CLOCK_MONOTONIC (glibc >= 2.30), else timedlock's CLOCK_REALTIME
_CLOCKLOCK = getattr(_libc, "pthread_mutex_clocklock", None)
if _CLOCKLOCK is not None:
    _CLOCKLOCK.restype = ctypes.c_int
# futex(2): the condition's word; not FUTEX_PRIVATE (the word is shared between processes)
_FUTEX_NUMBERS = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}  # SYS_futex, little-endian


def futex_syscall(machine: str | None = None, byteorder: str | None = None) -> int | None:
    """The futex(2) syscall number of ``machine`` (default ``platform.machine()``) with ``byteorder``
    (default ``sys.byteorder``), or None where futex support is not known: only little-endian x86-64
    and aarch64 are (elsewhere another number could be another call, e.g. riscv64's 202 is ``accept``,
    and a big-endian int64 word's futex half is not its low 32 bits)."""
    machine = platform.machine() if machine is None else machine
    byteorder = sys.byteorder if byteorder is None else byteorder
    return _FUTEX_NUMBERS.get(machine.lower()) if byteorder == "little" else None


SYS_FUTEX = futex_syscall()  # None: no futex here (`SharedCondition` refuses; no copy helpers start)
FUTEX_WAIT, FUTEX_WAKE = 0, 1
_futex = _libc.syscall
_futex.restype = ctypes.c_long
_futex.argtypes = (ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_int)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _address(buf: np.ndarray) -> int:
    if buf.dtype != np.uint8 or buf.ndim != 1 or buf.nbytes < SLOT_BYTES or not buf.flags.c_contiguous:
        raise ValueError(f"a shared lock needs a contiguous uint8 buffer of >= {SLOT_BYTES} bytes")
    addr = buf.ctypes.data
    if addr % 64:
        raise ValueError(f"a shared lock needs a 64-byte aligned buffer, got address {addr:#x}")
    return addr


class SharedMutex:
    """A robust, process-shared ``pthread_mutex_t`` stored in ``buf`` (not recursive).

    Parameters
    ----------
    buf : numpy.ndarray, uint8, shape [>= SLOT_BYTES]
        Memory in a shared region, 64-byte aligned. The array (and so the mapping) is kept alive.
    create : bool
        Initialise the mutex (the region's owner, once); other processes pass False to use it.
    """

    def __init__(self, buf: np.ndarray, create: bool) -> None:
        self._buf = buf
        self._ptr = ctypes.c_void_p(_address(buf))
        if create:
            attr = ctypes.create_string_buffer(64)
            _check(_libc.pthread_mutexattr_init(attr), "pthread_mutexattr_init")
            _check(_libc.pthread_mutexattr_setpshared(attr, _PTHREAD_PROCESS_SHARED), "setpshared")
            _check(_libc.pthread_mutexattr_setrobust(attr, _PTHREAD_MUTEX_ROBUST), "setrobust")
            _check(_libc.pthread_mutex_init(self._ptr, attr), "pthread_mutex_init")
            _libc.pthread_mutexattr_destroy(attr)
        self._word = buf[:4].view(np.int32)  # glibc's ``__lock``: the owner's tid (robust mutexes)
        self.owner_died = 0  # how many times this process recovered the mutex from a dead holder

    def acquire(self) -> bool:
        """Lock; return True when the previous holder died while holding it (the state may need repair).

        A signal handler's exception (`graphrl.interrupts`, ``KeyboardInterrupt``) is raised as the lock
        call returns, with the mutex taken: it is released again before the exception propagates, since
        no caller learns that it holds it.
        """
        return bool(self._lock(None))

    def acquire_within(self, timeout: float) -> bool | None:
        """Lock, waiting at most ``timeout`` seconds: None when it timed out (the mutex not taken), else
        as `acquire` (True: the previous holder died holding it). The deadline is on ``CLOCK_MONOTONIC``
        (``pthread_mutex_clocklock``; before glibc 2.30 ``pthread_mutex_timedlock``'s wall clock)."""
        return self._lock(max(0.0, float(timeout)))

    def _lock(self, timeout: float | None) -> bool | None:
        """Lock for good (``timeout`` None) or for at most ``timeout`` seconds (None returned: timed out);
        a dead holder's mutex is made consistent (True)."""
        try:
            if timeout is None:
                rc = _libc.pthread_mutex_lock(self._ptr)
            else:
                clock = time.CLOCK_MONOTONIC if _CLOCKLOCK is not None else time.CLOCK_REALTIME
                deadline = time.clock_gettime(clock) + timeout
                ts = ctypes.byref(_Timespec(int(deadline), int((deadline - math.floor(deadline)) * 1e9)))
                if _CLOCKLOCK is not None:
                    rc = _CLOCKLOCK(self._ptr, ctypes.c_int(clock), ts)
                else:
                    rc = _libc.pthread_mutex_timedlock(self._ptr, ts)
                if rc == errno.ETIMEDOUT:
                    return None
            if rc == errno.EOWNERDEAD:
                _check(_libc.pthread_mutex_consistent(self._ptr), "pthread_mutex_consistent")
                self.owner_died += 1
                logger.warning("a process died while holding a replay-store lock; recovering it")
                return True
            _check(rc, "pthread_mutex_lock")
        except BaseException:
            if self.held_here():
                _libc.pthread_mutex_unlock(self._ptr)
            raise
        return False

    def held_here(self) -> bool:
        """Whether this thread holds the mutex (the robust lock word names its owner's thread id)."""
        return int(self._word[0]) & _FUTEX_TID_MASK == threading.get_native_id()

    def release(self) -> None:
        _check(_libc.pthread_mutex_unlock(self._ptr), "pthread_mutex_unlock")

    @property
    def pointer(self) -> ctypes.c_void_p:
        """The ``pthread_mutex_t *``."""
        return self._ptr

    def mark_consistent(self) -> None:
        """Make the mutex usable again after a wait on it returned ``EOWNERDEAD`` (its holder died)."""
        _check(_libc.pthread_mutex_consistent(self._ptr), "pthread_mutex_consistent")

    def __enter__(self) -> SharedMutex:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class SharedCondition:
    """A process-shared condition variable over a `SharedMutex`, with ``threading.Condition``'s API.

    A sequence word and futex(2), not a ``pthread_cond_t``: glibc's process-shared condition keeps
    per-waiter state that a waiter killed inside ``pthread_cond_wait`` never gives back, after which a
    broadcast blocks for good while holding the mutex. Here a waiter holds nothing: `wait` reads the
    word (mutex held), releases the mutex and sleeps with ``FUTEX_WAIT`` while the word is unchanged;
    `notify_all` (mutex held) counts the word up and wakes every sleeper (`replay.sync_kernels.
    cond_broadcast` does the same from compiled code). A notification between the read and the sleep
    changes the word, so the sleep returns at once: none is lost.

    Parameters
    ----------
    buf : numpy.ndarray, uint8, shape [>= SLOT_BYTES]
        Memory in a shared region for the sequence word and the waiter count (int32 each, the first
        8 bytes), 64-byte aligned.
    mutex : SharedMutex
        The mutex the condition is used with (several conditions may share one).
    create : bool
        Initialise it (the owner, once).
    on_owner_died : callable, optional
        Called (with the mutex held) when locking finds that a holder died: repairs protected state.
    """

    def __init__(
        self,
        buf: np.ndarray,
        mutex: SharedMutex,
        create: bool,
        on_owner_died: Callable[[], None] | None = None,
    ) -> None:
        if SYS_FUTEX is None:
            raise OSError(errno.ENOSYS, f"no known futex(2) on machine {platform.machine()!r} "
                          f"({sys.byteorder}-endian): a shared condition needs one")
        self._buf = buf
        self._ptr = ctypes.c_void_p(_address(buf))
        self._seq = buf[:4].view(np.int32)
        self._waiters = buf[4:8].view(np.int32)  # sleeping or about to (a killed one stays counted)
        self.mutex = mutex
        self._on_owner_died = on_owner_died
        if create:
            buf[:SLOT_BYTES] = 0

    def acquire(self) -> bool:
        died = self.mutex.acquire()
        if died and self._on_owner_died is not None:
            self._on_owner_died()
        return died

    def release(self) -> None:
        self.mutex.release()

    def __enter__(self) -> SharedCondition:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a notification (mutex held); False on timeout. Spurious wake-ups may return True."""
        wait_s = _MAX_WAIT_S if timeout is None else max(0.0, min(float(timeout), _MAX_WAIT_S))
        seq = int(self._seq[0])
        ts = _Timespec(int(wait_s), int((wait_s - math.floor(wait_s)) * 1e9))  # relative, CLOCK_MONOTONIC
        self._waiters[0] += 1
        self.mutex.release()
        try:
            rc = _futex(SYS_FUTEX, self._ptr, FUTEX_WAIT, seq, ctypes.byref(ts), None, 0)
            err = ctypes.get_errno() if rc != 0 else 0
        finally:
            self.acquire()
            self._waiters[0] -= 1
        if err == errno.ETIMEDOUT:
            return timeout is None  # an hour passed without a timeout: report a (spurious) wake-up
        if err not in (0, errno.EAGAIN, errno.EINTR):  # EAGAIN: notified before the sleep
            raise OSError(err, f"futex wait failed: {errno.errorcode.get(err, err)}")
        return True

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until ``predicate()`` is true (mutex held), at most ``timeout`` seconds; return its value."""
        end = None if timeout is None else time.monotonic() + timeout
        result = predicate()
        while not result:
            # waits are sliced to _SLICE_S so that signals (Ctrl-C) are handled while blocked in C;
            # the predicate decides, so slices change no outcome
            if end is None:
                self.wait(_SLICE_S)
            else:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self.wait(min(left, _SLICE_S))
            result = predicate()
        return result

    def notify_all(self) -> None:
        """Wake every waiter (mutex held)."""
        self.notify(2**31 - 1)

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` waiters (mutex held)."""
        np.add(self._seq, 1, out=self._seq)  # int32 arithmetic wraps: waiters only compare the word
        if self._waiters[0] > 0 and _futex(SYS_FUTEX, self._ptr, FUTEX_WAKE, int(n), None, None, 0) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"futex wake failed: {errno.errorcode.get(err, err)}")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise OSError(rc, f"{what} failed: {errno.errorcode.get(rc, rc)}")

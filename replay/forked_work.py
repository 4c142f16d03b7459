"""Run a function in a forked child process while this thread waits without the GIL.

`call_in_child` forks, runs ``work(mark)`` in the child and returns its result (or raises its exception)
in the parent. The child sees this process's memory as it was at the fork (copy on write; shared mappings
stay shared); ``mark()`` in the child runs ``on_mark()`` in the parent, so the parent can let go of what
the child needed held until then (a checkpoint lets the store go once its rows are written). Meanwhile
the calling thread waits in one blocking read of a pipe, holding no GIL: whatever the work does (many
file writes, hashes, fsyncs, each a GIL release), the parent's thread releases the GIL a bounded number
of times, and a busy thread of the parent (a writer appending steps) neither slows the work nor is
slowed by it. `replay.checkpoint.save` writes a checkpoint's files this way
(docs/architecture.md#checkpoints).

The child is made to die with the calling thread (``PR_SET_PDEATHSIG``), collects no garbage and ends
with ``os._exit``: none of the parent's exit handlers or finalizers run in it (it keeps the descriptors it
inherited until then, a ``flock`` included). It runs only ``work``: no other thread of the parent
exists in it, so ``work`` must take no lock another thread may have held at the fork (the store's
locks, logging handlers of a busy thread); file I/O, numpy, hashlib and zarr (which renews its I/O
threads at a fork) are safe.

References
----------
POSIX ``fork`` (copy-on-write snapshots, as Redis's ``BGSAVE`` writes its dump from a forked child);
Linux ``prctl(PR_SET_PDEATHSIG)``.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import signal
import struct
import traceback
from collections.abc import Callable
from os import _exit  # os._exit: the way a forked child ends
from typing import Any, TypeVar

__all__ = ["call_in_child"]

T = TypeVar("T")

_MARK, _RESULT = b"M", b"R"
_LENGTH = struct.Struct("<Q")  # the result's pickled bytes follow ``R`` and their length
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def _child(work: Callable[[Callable[[], None]], Any], fd: int, parent: int) -> None:
    """The child's side: ``work(mark)``, then its result or exception (pickled) down ``fd``; never returns."""
    try:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above took effect
            return
        gc.disable()  # no finalizer of the parent's garbage runs here (a region's, a batch's)

        def mark() -> None:
            os.write(fd, _MARK)

        try:
            reply: tuple[bool, Any] = (True, work(mark))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
            exc.add_note("(raised in the forked process that wrote the files:\n"
                         + "".join(traceback.format_exception(exc)).rstrip() + ")")
            reply = (False, exc)
        try:
            data = pickle.dumps(reply)
        except Exception:  # noqa: BLE001 - an exception that does not pickle goes back as an OSError
            data = pickle.dumps((False, OSError(f"{reply[1]!r} (raised in the forked process)")))
        view = memoryview(_RESULT + _LENGTH.pack(len(data)) + data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        _exit(0)  # no exit handler, finalizer or buffered output of the parent's runs here


def call_in_child(work: Callable[[Callable[[], None]], T], on_mark: Callable[[], None]) -> T:
    """``work(mark)`` run in a forked child; its result, or its exception raised here.

    Parameters
    ----------
    work : callable
        Called in the child with ``mark``, a function that makes this process run ``on_mark`` (once:
        call it at most once). Its result must pickle.
    on_mark : callable
        Run in this thread when the child calls ``mark`` (not at all if it never does).

    Returns
    -------
    object
        What ``work`` returned.

    Raises
    ------
    BaseException
        What ``work`` raised (with a note carrying the child's traceback), or what ``on_mark`` raised
        (the child is killed first).
    OSError
        The child ended without a result (killed by a signal, out of memory), or the fork failed.
    KeyboardInterrupt
        As any: the child is killed and reaped first.
    """
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:
        os.close(read_fd)
        _child(work, write_fd, os.getppid())
    os.close(write_fd)
    reaped = False
    try:
        got, marked, size = bytearray(), False, -1
        # until the whole result, not EOF: a process forked meanwhile by another thread holds a copy of
        # the pipe's write end until it ends
        while len(got) != size and (chunk := os.read(read_fd, 1 << 16)):
            got += chunk
            if not marked and got[:1] == _MARK:
                del got[:1]
                marked = True
                on_mark()
            if size < 0 and got[:1] == _RESULT and len(got) >= 1 + _LENGTH.size:
                size = 1 + _LENGTH.size + _LENGTH.unpack_from(got, 1)[0]
        _, status = os.waitpid(pid, 0)
        reaped = True
    except BaseException:
        if not reaped:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    finally:
        os.close(read_fd)
    if len(got) != size:
        how = (f"killed by signal {signal.Signals(-os.waitstatus_to_exitcode(status)).name}"
               if os.WIFSIGNALED(status) else f"exit status {os.waitstatus_to_exitcode(status)}")
        raise OSError(f"the forked process writing the files (pid {pid}) ended without a result ({how})")
    ok, value = pickle.loads(bytes(got[1 + _LENGTH.size :]))
    if not ok:
        raise value
    return value

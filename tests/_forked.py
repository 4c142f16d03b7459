"""Run a function in a ``fork`` child and read what it reports: for tests of the fork rule
(`graphrl.process_origin`). Imported as ``from _forked import run_in_fork`` (``tests/`` holds the root
conftest, so pytest puts it on ``sys.path``)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable


def fork_and_wait(child: Callable[[int], object],
                  while_running: Callable[[int], object] | None = None) -> tuple[int, int, str]:
    """Fork; the child runs ``child(fd)`` (``fd``: the write end of a pipe, for it to report into), then
    leaves with ``os._exit(0)`` (never returning into pytest). Returns (the child's pid, its wait status as
    `os.waitpid` gives it, what it wrote), once the child has ended: for children that may die of a signal.
    ``while_running(pid)``, where given, runs in the parent before it reads the report: to watch the child
    stop (``os.waitpid(pid, os.WUNTRACED)``) and continue it, say; it must leave the child able to end. If
    it raises, the child is killed and reaped, and the error goes on.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(r)
            child(w)
        finally:
            os._exit(0)
    os.close(w)
    try:
        if while_running is not None:
            while_running(pid)
        out = b""
        while chunk := os.read(r, 4096):
            out += chunk
    except BaseException:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):  # reaped by while_running
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    return pid, status, out.decode()


def run_in_fork(child: Callable[[], str]) -> tuple[int, str]:
    """Fork; the child runs ``child()`` and writes the string it returns into a pipe, then leaves with
    ``os._exit(0)`` (never returning into pytest). Returns (the child's pid, that string), once the child
    has ended. ``child`` catches the errors it expects itself; any other ends the child with an empty
    report."""
    pid, _, out = fork_and_wait(lambda fd: os.write(fd, child().encode()))
    return pid, out


def check_in_fork(child: Callable[[], object]) -> None:
    """Run ``child()`` in a fork child (`run_in_fork`): the test passes when it returns, and fails here with
    the child's traceback when it raised (an assertion, an unexpected error), or when the child died before
    it reported (of a signal at its default action, say)."""

    def reporting() -> str:
        try:
            child()
            return "ok"
        except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test with it
            import traceback

            return traceback.format_exc()

    _, report = run_in_fork(reporting)
    assert report == "ok", report or "the child died (of a signal?) before it reported"

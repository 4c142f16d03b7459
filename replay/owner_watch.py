"""OwnerWatch: whether the process that owns a replay store (made its regions) still runs, and the one
error a process attached to the store raises once it is gone (`owner_lost`).

An attached process (an actor's `replay.attach.AttachedStore`, a learner's `replay.learner.StoreLearner`)
maps the owner's shared regions: they stay mapped, and writable, after the owner dies, so nothing fails on
its own. A learner finds out through its connection to the owner's table service (EOF); a writer has no
connection, so its storage asks the kernel instead: `OwnerWatch.gone` polls a pidfd of the owner
(``os.pidfd_open``, taken in the first process that asks: it becomes readable when the owner exits, zombie
or not), or without pidfds ``os.kill(pid, 0)`` plus the ``/proc/<pid>/stat`` state (a zombie counts as
gone). It asks at most every `CHECK_EVERY_S` seconds (one ``time.monotonic`` per call in between), so
callers may ask at every commit and in every rate-limiter wait slice.

The owner's pid alone names it only in its own PID namespace and only while it lives, so the handle also
carries the owner's `process_identity` (its PID namespace and start time). A process in another PID
namespace (a container sharing ``/dev/shm`` but not the PID namespace) cannot see the owner and does not
watch (it learns of the owner's end only through a learner's connection, or a closed store); a pid already
reused by another process when the watch arms (the owner ended before) counts as gone. The watch arms in
the process that asks, so a store attached in the owner and inherited by a forked child watches from
the child: each watch registers with the one at-fork hook (`graphrl.process_origin.register_forked`,
through a weak reference: it does not keep the watch alive), which, in the child, closes the parent's
pidfd copy at once and has the watch decide anew at its next question; `OwnerWatch.process` is this
process's pid, kept current the same way.

>>> watch = OwnerWatch(handle.owner_pid, handle.owner_identity)       # in the attached process
>>> if watch.gone():
...     raise watch.ended("TrajectoryWriter.append()", "nothing more can be written")
"""

from __future__ import annotations

import contextlib
import os
import select
import time

from graphrl.memory.owners import Owner, owner_of, owner_state, pid_namespace
from graphrl.process_origin import register_forked

__all__ = ["CHECK_EVERY_S", "OwnerWatch", "owner_lost", "process_identity"]

CHECK_EVERY_S = 0.5  # an attached process asks whether the owner lives at most this often


def owner_lost(who: str, pid: int | None, how: str) -> ValueError:
    """The error of a process attached to a store whose owner is gone (learners and writers alike).

    Parameters
    ----------
    who : str
        The object and call (``"TrajectoryWriter.append()"``, ``"replay learner"``).
    pid : int or None
        The owner's pid when known.
    how : str
        How it was found and what it costs the caller.

    Returns
    -------
    ValueError
        ``"<who>: lost the connection to the store's owner (pid N): <how>"``: raise it.
    """
    owner = "the store's owner" if pid is None else f"the store's owner (pid {pid})"
    return ValueError(f"{who}: lost the connection to {owner}: {how}")


def process_identity(pid: int | None = None) -> str:
    """``"<PID namespace inode>@<start time>"`` of process ``pid`` (this process by default) as this process
    sees it (`graphrl.memory.owners.owner_of`): with its pid, it names one process for good (a reused pid
    has another start time, another namespace other pids); ``""`` where /proc cannot say (not Linux)."""
    owner = owner_of(pid)
    return f"{owner.pidns}@{owner.start}" if owner.pidns and owner.start else ""


class OwnerWatch:
    """Whether the owner process ``pid`` has ended (see the module docstring).

    Parameters
    ----------
    pid : int
        The owner's pid; 0 (unknown) or the asking process's own watch nothing (`gone` is always False).
    identity : str
        The owner's `process_identity` (``""``: unknown, the pid alone is trusted).
    """

    def __init__(self, pid: int, identity: str = "") -> None:
        self.pid = int(pid)
        self.identity = str(identity)
        self.known_gone = False  # once True, stays True
        self.next_check = 0.0  # time.monotonic() of the next real check
        self.fd = -1
        self.process = os.getpid()  # this process (a forked child's own: `forked`)
        self.armed = False  # `watching` is decided in this process (a forked child decides anew)
        self.record = Owner(self.pid, 0, 0)  # the owner as graphrl.memory.owners records it (0: unknown)
        self.watching = False
        register_forked(self)

    @property
    def active(self) -> bool:
        """Whether this process watches the owner: another process than the owner, in its PID namespace."""
        if not self.armed:
            self._arm()
        return self.watching

    def forked(self) -> None:
        """In a forked child, right after the fork (the at-fork hook): close the pidfd copy the child got
        from its parent (before the child's own code can reuse its number) and decide anew at the next
        question."""
        self.process = os.getpid()
        self.armed = False
        self.watching = False
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def _arm(self) -> None:
        """Decide, in this process, whether and how to watch (after a fork: anew, in the child)."""
        self.armed = True
        self.watching = False
        if self.pid <= 0 or self.pid == self.process or self.known_gone:
            return
        if self.identity:
            namespace, _, started = self.identity.rpartition("@")
            self.record = Owner(self.pid, int(started), int(namespace))
            mine = pid_namespace()
            if mine and self.record.pidns != mine:
                return  # another PID namespace: the owner's pid means nothing here
        self.watching = True
        try:
            self.fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self.known_gone = True
            return
        except (OSError, AttributeError):  # no pidfd_open (kernel < 5.3, or not Linux): os.kill + /proc
            self.fd = -1
        if owner_state(self.record) is not None:
            self.known_gone = True  # ended, or the pid is another process's now

    def gone(self, fresh: bool = False) -> bool:
        """Whether the owner has ended: a real check at most every `CHECK_EVERY_S` seconds (or now when
        ``fresh``), else the last answer."""
        if self.known_gone:
            return True
        now = time.monotonic()
        if now < self.next_check and not fresh:
            return False
        self.next_check = now + CHECK_EVERY_S
        if not self.active:  # (re)armed here in a forked child
            return self.known_gone
        self.known_gone = self.known_gone or not self._alive()
        return self.known_gone

    def _alive(self) -> bool:
        if self.fd >= 0:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            return not poller.poll(0)  # a pidfd is readable once its process exits
        return owner_state(self.record) is None  # no pidfd: the pid, its /proc state and start time

    def ended(self, who: str, consequence: str) -> ValueError:
        """The error once `gone`: `owner_lost` naming the owner's pid, ``"its process has ended, so the store
        is gone: <consequence>"`` (what the caller cannot do, what it lost); raise it."""
        return owner_lost(who, self.pid, f"its process has ended, so the store is gone: {consequence}")

    def close(self) -> None:
        """Close the pidfd (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

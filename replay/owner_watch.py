"""OwnerWatch: whether the process that owns a replay store (made its regions) still runs, and the one
error a process attached to the store raises once it is gone (`owner_lost`).

An attached process (an actor's `replay.attach.AttachedStore`, a learner's `replay.learner.StoreLearner`)
maps the owner's shared regions: they stay mapped, and writable, after the owner dies, so nothing fails on
its own. A learner finds out through its connection to the owner's table service (EOF); a writer has no
connection, so its storage asks the kernel instead: `OwnerWatch.gone` polls a pidfd of the owner
(``os.pidfd_open``, taken at attach time: it becomes readable when the owner exits, zombie or not, and a
reused pid cannot fool it), or without pidfds ``os.kill(pid, 0)`` plus the ``/proc/<pid>/stat`` state
(a zombie counts as gone). It asks at most every `CHECK_EVERY_S` seconds (one ``time.monotonic`` per call
in between), so callers may ask at every commit and in every rate-limiter wait slice.

>>> watch = OwnerWatch(handle.owner_pid)       # in the attached process
>>> if watch.gone():
...     raise owner_lost("TrajectoryWriter.append()", watch.pid, "its process has ended")
"""

from __future__ import annotations

import os
import select
import time

__all__ = ["CHECK_EVERY_S", "OwnerWatch", "owner_lost"]

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


class OwnerWatch:
    """Whether the owner process ``pid`` has ended (see the module docstring).

    Parameters
    ----------
    pid : int
        The owner's pid; 0 (unknown) or this process's own watch nothing (`gone` is always False).
    """

    def __init__(self, pid: int) -> None:
        self.pid = int(pid)
        self.active = self.pid > 0 and self.pid != os.getpid()
        self.known_gone = False  # once True, stays True
        self.next_check = 0.0  # time.monotonic() of the next real check
        self.fd = -1
        if self.active:
            try:
                self.fd = os.pidfd_open(self.pid)
            except ProcessLookupError:
                self.known_gone = True
            except (OSError, AttributeError):  # no pidfd_open (kernel < 5.3, or not Linux): os.kill + /proc
                self.fd = -1

    def gone(self, fresh: bool = False) -> bool:
        """Whether the owner has ended: a real check at most every `CHECK_EVERY_S` seconds (or now when
        ``fresh``), else the last answer."""
        if not self.active or self.known_gone:
            return self.known_gone
        now = time.monotonic()
        if now < self.next_check and not fresh:
            return False
        self.next_check = now + CHECK_EVERY_S
        self.known_gone = not self._alive()
        return self.known_gone

    def _alive(self) -> bool:
        if self.fd >= 0:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            return not poller.poll(0)  # a pidfd is readable once its process exits
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True  # no /proc: os.kill said it exists
        return state not in (b"Z", b"X")

    def close(self) -> None:
        """Close the pidfd (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

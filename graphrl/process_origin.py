"""The one rule for objects whose state belongs to the process that made them.

A shared segment is unlinked only by the process that created it, an exit cleanup runs only in its maker,
a writer's staged steps and open episode are its maker's, and a learner's mapping and connection are remade in
each process that uses it. A ``fork`` child inherits all of these objects: each records ``os.getpid()`` when
made and asks this module whether it is still in that process.

Use::

    self.pid = os.getpid()                     # when made
    if not made_here(self.pid): ...            # a forked copy: skip, or remake per-process state
    check_made_here(self.pid, "Writer.append()", "Writer", "make one in this process")   # or raise

`check_made_here` raises an error naming both processes: the maker and this one, a fork of it.
"""

from __future__ import annotations

import os

__all__ = ["check_made_here", "made_here"]


def made_here(pid: int | None) -> bool:
    """Whether ``pid`` (``os.getpid()`` in the process that made an object; None: made by none, such as
    an attached shared segment) is this process: False in a ``fork`` child that inherited the object."""
    return pid == os.getpid()


def check_made_here(
    pid: int, call: str, what: str, why: str, error: type[Exception] = RuntimeError
) -> None:
    """Raise unless this process made the object (``made_here(pid)``).

    Parameters
    ----------
    pid : int
        ``os.getpid()`` in the process that made the object.
    call : str
        The call refused, as the message starts (``"TrajectoryWriter.append()"``).
    what : str
        The object's kind (``"TrajectoryWriter"``).
    why : str
        What belongs to the maker and what to do here instead (ends the message).
    error : type of Exception
        The type raised (``RuntimeError`` unless the caller's contract names another).

    Raises
    ------
    error
        This process is not ``pid``: "<call>: this <what> was made in process <pid>, and this is process
        <now> (a fork of it): <why>".
    """
    now = os.getpid()
    if pid != now:
        raise error(
            f"{call}: this {what} was made in process {pid}, and this is process {now} (a fork of it): {why}"
        )

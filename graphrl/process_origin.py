"""The one rule for objects whose state belongs to the process that made them: `ProcessOrigin`, kept by the
one at-fork hook (`register_forked`).

A shared segment is unlinked only by its creator, an exit cleanup runs only in its maker, a writer's staged
steps are its maker's, a replay store samples only in its owner, a learner remakes its mapping in each
process. A ``fork`` child inherits these objects and a pickle carries copies elsewhere: each asks here::

    self.origin = ProcessOrigin()              # when made (this process; registered with the at-fork hook)
    if not made_here(self.origin): ...         # a copy: skip, or remake per-process state
    check_made_here(self.origin, "Writer.append()", "Writer", "make one in this process")   # or raise
    if self.origin.copy: ...                   # the same question on a hot path: one attribute read

**Why a flag set at fork, not a pid compared per question.** ``ProcessOrigin.copy`` is False where made and
True in every process forked from there (and their forks: the at-fork hook sets it in the child before the
child's code runs) and in every unpickled or copied origin, this process's included. Comparing the maker's
``os.getpid()`` with this process's agrees except where a pid is reused, and there it says "made here" in
a process holding a copy, which then unlinks a segment others still use or writes its parent's steps:

- a fork descendant may get the maker's pid once the maker has ended (pids wrap at ``pid_max``);
- a child forked after ``unshare(CLONE_NEWPID)`` is pid 1 (its forks 2, 3, ...) of a new namespace, the
  pid of a maker that was its own namespace's init (Python as a container's entry point) or any small pid;
- a pid pickled to disk comes back in a later process that got the same pid.

The flag misses only a fork that skips Python's at-fork hooks (C calling ``fork()`` without
``PyOS_AfterFork_Child``), where CPython's own locks and thread state are not reset either, so no Python
may run before ``exec``. So the flag is the stronger rule, and the cheaper: an attribute read where
``os.getpid()`` is a system call. So `made_here` and `check_made_here` take an origin only, never a bare
pid (a ``TypeError``): every object that records its maker holds a `ProcessOrigin` (a shared segment and a
spill array their creator's, an exit cleanup and a learner's per-process state their own). ``None`` is
"made by none" (an attached segment, which never unlinks): `made_here` says False.

The at-fork hook is one per process over a weak set of the live fork-aware objects (`register_forked`
says why): `ProcessOrigin` marks itself a copy, `replay.owner_watch.OwnerWatch` closes the child's copy of
its parent's pidfd, `replay._owner.ThreadOwner` takes the writer from every thread.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["ForkAware", "ProcessOrigin", "check_made_here", "made_here", "register_forked"]


class ForkAware(Protocol):
    """What `register_forked` takes: ``forked()``, run in a forked child right after the fork."""

    def forked(self) -> None: ...


_LIVE: weakref.WeakSet[ForkAware] = weakref.WeakSet()  # every registered object of this process that lives


def register_forked(obj: ForkAware) -> None:
    """Run ``obj.forked()`` in every child forked from this process (and their forks), right after the fork,
    while ``obj`` lives; holds ``obj`` weakly (its class needs ``__weakref__``). Registers no at-fork hook:
    the module's one hook visits every registered object that lives.

    Why one hook over a registry: ``os.register_at_fork`` hooks can never be unregistered, so a hook per
    object leaves one dead hook per object ever made, every one run at every fork: a process that makes many
    stores (tests, notebooks, a trainer that rebuilds its buffer) pays for them all, without bound. The
    module registers one hook, at import, over a `weakref.WeakSet` of the live objects: the hooks stay
    constant however many objects are made, and registering keeps no object alive. The set is the module's
    only state, module-level because the hook is: registered once per process and never removed, it reaches
    objects made after it only through a registry that lives as long as it does (``logging`` keeps its
    handlers' at-fork hook over a module-level WeakSet the same way). The hook visits every live object even
    when one's ``forked`` raises, then raises the first error (Python reports it as an exception ignored in
    the hook, as it does a hook of its own)::

        class Pidfd:
            def __init__(self, pid: int) -> None:
                self.fd = os.pidfd_open(pid)
                register_forked(self)          # once, when made
            def forked(self) -> None:          # in each forked child, right after the fork
                os.close(self.fd)              # the parent's copy, before the child can reuse its number
                self.fd = -1

    Parameters
    ----------
    obj : ForkAware
        The object, with a ``forked()`` method; registering it twice runs it once.

    Raises
    ------
    TypeError
        ``obj`` cannot be weakly referenced (a class with ``__slots__`` and no ``__weakref__``).
    """
    _LIVE.add(obj)


def _after_fork_in_child() -> None:
    first: Exception | None = None
    for obj in list(_LIVE):
        try:
            obj.forked()
        except Exception as exc:  # noqa: BLE001 - the others still run; the first is raised below
            first = first or exc
    if first is not None:
        raise first


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(eq=False, slots=True, weakref_slot=True)
class ProcessOrigin:
    """The process that made an object, and whether this process holds a copy of it (see the module
    docstring). Made with no arguments in the maker; registered with the at-fork hook.

    Attributes
    ----------
    pid : int
        ``os.getpid()`` in the process that made the origin (named in `check_made_here`'s error).
    copy : bool
        False where made; True in every process forked from it (and their forks) and in an unpickled or
        copied origin, this process included.
    unpickled : bool
        True when the origin was unpickled or copied (``copy`` then True too), for the error's words.

    >>> origin = ProcessOrigin()
    >>> made_here(origin), origin.copy
    (True, False)
    >>> import copy
    >>> copy.copy(origin).copy                # a copy, in this process too
    True
    """

    pid: int = field(default_factory=os.getpid, init=False)
    copy: bool = field(default=False, init=False)
    unpickled: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        register_forked(self)

    def forked(self) -> None:
        """In a forked child, right after the fork (the at-fork hook): a copy."""
        self.copy = True

    def __reduce__(self) -> tuple:
        return _unpickled_origin, (self.pid,)


def _unpickled_origin(pid: int) -> ProcessOrigin:
    """An unpickled (or copied) `ProcessOrigin` of process ``pid``: a copy, wherever it is unpickled."""
    origin = ProcessOrigin()
    origin.pid, origin.copy, origin.unpickled = int(pid), True, True
    return origin


def made_here(origin: ProcessOrigin | None) -> bool:
    """Whether this process made the object: ``not origin.copy`` (False in a ``fork`` child and its forks,
    and for an unpickled or copied origin); None (made by none, such as an attached shared segment): False.

    Raises
    ------
    TypeError
        ``origin`` is neither a `ProcessOrigin` nor None (a bare pid: the weaker rule, module docstring).
    """
    if isinstance(origin, ProcessOrigin):
        return not origin.copy
    if origin is None:
        return False
    raise _not_an_origin("made_here", origin)


def _not_an_origin(call: str, origin: object) -> TypeError:
    return TypeError(
        f"{call}(): origin must be a ProcessOrigin (made with the object: ProcessOrigin()), not "
        f"{type(origin).__name__} {origin!r}; a bare pid is fooled where a pid is reused"
    )


def check_made_here(
    origin: ProcessOrigin, call: str, what: str, why: str, error: type[Exception] = RuntimeError
) -> None:
    """Raise unless this process made the object (`made_here`).

    Parameters
    ----------
    origin : ProcessOrigin
        The object's `ProcessOrigin`, made with it.
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
        This process did not make the object: "<call>: this <what> was made in process <pid>, and this is
        process <now> (a fork of it): <why>"; "(a copy unpickled from it)" instead for an unpickled origin.
    TypeError
        ``origin`` is not a `ProcessOrigin`.
    """
    if not isinstance(origin, ProcessOrigin):
        raise _not_an_origin("check_made_here", origin)
    if not origin.copy:
        return
    how = "a copy unpickled from it" if origin.unpickled else "a fork of it"
    raise error(
        f"{call}: this {what} was made in process {origin.pid}, and this is process {os.getpid()} ({how}): "
        f"{why}"
    )

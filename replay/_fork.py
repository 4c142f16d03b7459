"""The replay package's one at-fork hook: objects whose state belongs to the process that made them, put
right in a ``fork`` child right after the fork, before the child's own code runs.

An object calls `register_forked` once, when made; its ``forked()`` then runs in every child forked from
this process (and in their forks) while the object lives. `replay.owner_watch.OwnerWatch` closes the
child's copy of its parent's pidfd, `replay.owner_watch.ForkMark` marks the child, `replay._owner.ThreadOwner`
takes the writer from every thread.

Why a module-level registry: ``os.register_at_fork`` hooks can never be unregistered, so a hook per object
leaves one dead hook per object ever made, every one run at every fork: a process that makes many stores
(tests, notebooks, a trainer that rebuilds its buffer) pays for them all, without bound. This module
registers one hook, at import, over a `weakref.WeakSet` of the live objects: the hooks registered stay
constant however many objects are made, and registering keeps no object alive (a collected one leaves the
set). The set is the only state here, and it is module-level because the hook is: registered once per
process and never removed, the hook reaches objects made after it only through a registry that lives as
long as it does (``logging`` keeps its handlers' at-fork hook over a module-level WeakSet the same way).

Use::

    class Pidfd:
        def __init__(self, pid: int) -> None:
            self.fd = os.pidfd_open(pid)
            register_forked(self)          # once, when made
        def forked(self) -> None:          # in each forked child, right after the fork
            os.close(self.fd)              # the parent's copy, before the child can reuse its number
            self.fd = -1

The hook visits every live object even when one's ``forked`` raises, then raises the first error (Python
reports it as an exception ignored in the hook, as it does a hook of its own).
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["ForkAware", "register_forked"]


class ForkAware(Protocol):
    """What `register_forked` takes: ``forked()``, run in a forked child right after the fork."""

    def forked(self) -> None: ...


_LIVE: weakref.WeakSet[ForkAware] = weakref.WeakSet()  # every registered object of this process that lives


def register_forked(obj: ForkAware) -> None:
    """Run ``obj.forked()`` in every child forked from this process (and their forks), right after the fork,
    while ``obj`` lives; holds ``obj`` weakly (its class needs ``__weakref__``). Registers no at-fork hook:
    the module's one hook visits every registered object that lives.

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

"""ThreadOwner: the rule that one writer is used by one thread at a time, enforced.

A writer's staging buffers and open episode are plain Python state: two threads appending to one writer
interleave their steps and lose or repeat some, with no error. The rule,
as Reverb's ``TrajectoryWriter`` (not thread-safe: one per thread): the first thread that writes owns the
writer; a call from another thread raises ``RuntimeError`` naming both threads. Ownership passes when the
owner calls ``release()`` (the writer's ``release_thread``), or when the owner thread has ended (a writer
made in one thread and used by one worker, or kept across a finished worker). The check on the fast path
is one ``threading.get_ident()`` comparison; since a new thread may get the ident of one that ended, an
owner thread's end makes the writer unowned (a guard in the thread's local storage), so the new thread
claims it like any other. A writer belongs to the process that made it: in a child
made by ``fork`` (where the forking thread's ident lives on) every call raises ``RuntimeError``, since its
staged steps, open episode and writer id are the parent's; the child makes its own (``store.writer()``).
The fork is found by the one at-fork hook (`graphrl.process_origin`: the writer's `ProcessOrigin`, and
`register_forked` for the thread state).
See docs/architecture.md#replay-composition.
"""

from __future__ import annotations

import threading
import weakref

from graphrl.process_origin import ProcessOrigin, check_made_here, made_here, register_forked

__all__ = ["ThreadOwner"]

_HELD = threading.local()  # per thread: guards of the writers it owns, dropped when the thread ends


class _Guard:
    """Kept in its owner thread's local storage: when that thread ends (its locals are cleared, before its
    ident can be handed to a new thread) the writer becomes unowned, so a new thread that gets the same
    ident does not pass the ident check without claiming it."""

    __slots__ = ("ref", "ident")

    def __init__(self, owner: ThreadOwner, ident: int) -> None:
        self.ref, self.ident = weakref.ref(owner), ident

    def __del__(self) -> None:
        owner = self.ref()
        if owner is not None and owner.ident == self.ident:
            owner.ident, owner.thread = None, None


class ThreadOwner:
    """The thread that owns a writer (see the module docstring).

    Parameters
    ----------
    what : str
        The owner's class name for messages (``"TrajectoryWriter"``).
    remedy : str
        How to get a writer of one's own (``"store.writer()"``).
    """

    __slots__ = ("ident", "thread", "what", "remedy", "origin", "_lock", "__weakref__")

    def __init__(self, what: str, remedy: str) -> None:
        self.ident: int | None = None  # the owner's threading.get_ident(), None while unowned
        self.thread: threading.Thread | None = None
        self.what = what
        self.remedy = remedy
        self.origin = ProcessOrigin()  # the process that made the writer
        self._lock = threading.Lock()
        register_forked(self)  # forked() runs in a fork child (graphrl.process_origin's one at-fork hook)

    def forked(self) -> None:
        """In a child made by ``fork``: no thread of this process owns the writer (every call raises)."""
        self.ident, self.thread, self._lock = -1, None, threading.Lock()  # -1: no thread's ident

    def claim(self, call: str) -> None:
        """Make the calling thread the owner, or check that it is (callers compare ``ident`` first).

        Parameters
        ----------
        call : str
            The method called (named in the error).

        Raises
        ------
        RuntimeError
            Another thread, still alive, owns the writer: the message names both threads. Or this
            process is a fork of the one that made the writer.
        """
        me = threading.current_thread()
        check_made_here(
            self.origin, f"{self.what}.{call}()", self.what,
            f"its staged steps, open episode and writer id are that process's; make a writer in this process "
            f"({self.remedy})",
        )
        with self._lock:
            owner = self.thread
            if owner is None or self.ident == me.ident or not owner.is_alive():
                if self.ident != me.ident:
                    guards = _HELD.__dict__.setdefault("guards", {})
                    if len(guards) >= 64:  # a long-lived thread that owned many writers: drop the freed ones'
                        for key in [k for k, g in guards.items() if g.ref() is None]:
                            del guards[key]
                    guards[id(self)] = _Guard(self, me.ident)  # replaces a guard of a released claim
                self.ident, self.thread = me.ident, me
                return
        raise RuntimeError(
            f"{self.what}.{call}(): this {self.what} belongs to thread {owner.name!r} (ident {owner.ident}); "
            f"thread {me.name!r} (ident {me.ident}) called {call}: a {self.what} is not thread-safe, make "
            f"one writer per thread ({self.remedy}), or have the owner call release_thread() to hand it over"
        )

    def release(self, call: str = "release_thread") -> None:
        """Give up ownership: the next thread that writes owns the writer.

        Raises
        ------
        RuntimeError
            Another thread, still alive, owns the writer; or this process is a fork of its maker.
        """
        if not made_here(self.origin) or (self.ident is not None and self.ident != threading.get_ident()):
            self.claim(call)  # raises unless the owner has ended
        with self._lock:
            self.ident, self.thread = None, None

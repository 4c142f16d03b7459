"""ThreadOwner: the rule that one writer is used by one thread at a time, enforced.

A writer's staging buffers and open episode are plain Python state: two threads appending to one writer
interleave their steps and lose or repeat some, with no error. The rule,
as Reverb's ``TrajectoryWriter`` (not thread-safe: one per thread): the first thread that writes owns the
writer; a call from another thread raises ``RuntimeError`` naming both threads. Ownership passes when the
owner calls ``release()`` (the writer's ``release_thread``), or when the owner thread has ended (a writer
made in one thread and used by one worker, or kept across a finished worker). The check on the fast path
is one ``threading.get_ident()`` comparison. See docs/architecture.md#replay-composition.
"""

from __future__ import annotations

import threading

__all__ = ["ThreadOwner"]


class ThreadOwner:
    """The thread that owns a writer (see the module docstring).

    Parameters
    ----------
    what : str
        The owner's class name for messages (``"TrajectoryWriter"``).
    remedy : str
        How to get a writer of one's own (``"store.writer()"``).
    """

    __slots__ = ("ident", "thread", "what", "remedy", "_lock")

    def __init__(self, what: str, remedy: str) -> None:
        self.ident: int | None = None  # the owner's threading.get_ident(), None while unowned
        self.thread: threading.Thread | None = None
        self.what = what
        self.remedy = remedy
        self._lock = threading.Lock()

    def claim(self, call: str) -> None:
        """Make the calling thread the owner, or check that it is (callers compare ``ident`` first).

        Parameters
        ----------
        call : str
            The method called (named in the error).

        Raises
        ------
        RuntimeError
            Another thread, still alive, owns the writer: the message names both threads.
        """
        me = threading.current_thread()
        with self._lock:
            owner = self.thread
            if owner is None or self.ident == me.ident or not owner.is_alive():
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
            Another thread, still alive, owns the writer.
        """
        if self.ident is not None and self.ident != threading.get_ident():
            self.claim(call)  # raises unless the owner has ended
        with self._lock:
            self.ident, self.thread = None, None

"""SIGINT and SIGTERM as an exception in the main thread, so a run can save its work before it exits.

Main names: `interrupts` (a context manager: inside it, SIGINT and SIGTERM raise `Interrupted` in the
main thread) and `Interrupted` (a `KeyboardInterrupt` carrying the signal; ``exit_code`` is the shell's
128 + signal number: 130 for SIGINT, 143 for SIGTERM).

`Interrupted` is a `KeyboardInterrupt`, so ``except Exception`` does not swallow it and every ``finally``
on the way runs: shared memory is released, actor processes and benchmark subprocesses are stopped.

The rule (one place, `graphrl.cli`): the ``graphrl`` command runs every subcommand inside `interrupts`
and turns an `Interrupted` that reaches it into exit status ``exit_code``. A command with work worth
keeping catches `Interrupted`, saves it (best weights, the curve so far, finished results), prints one
line saying what it saved and where, and re-raises.

Details:

- The first signal restores the handlers that were in place before, so a second Ctrl-C interrupts the
  saving itself (Python's `KeyboardInterrupt`) and a second SIGTERM kills.
- A signal ignored (``SIG_IGN``: ``nohup``, a background shell job) or handled outside Python stays so.
- A handler installed on top of ours (`graphrl.memory.signals` unlinks shared memory on SIGTERM, then
  calls the handler it found) still reaches ours; once the block is left, ours passes the signal on to
  the handler it replaced (`graphrl.memory.signals.pass_on`: at the default action the process dies).
- Outside the main thread `interrupts` installs nothing (Python runs signal handlers there only).
- A signal that lands while the main thread is inside numba's compiler (holds its global compiler lock:
  a kernel's first call or cache load) raises only once the compiler is left (an exception between two
  of its lines can leave LLVM objects half made, which llvmlite may crash on): the handler sends it again
  every `RESEND_DELAY` until then. A second SIGINT or SIGTERM from the user meanwhile (not a re-send)
  stops the process at once, as in most CLIs (`graphrl.memory.signals.die_of`: shared segments are
  unlinked, the signal raised again at its default action; shell status 130 / 143, nothing saved).
- A handler that runs inside a finalizer or ``__del__`` (garbage collection can run them at any
  bytecode) raises where Python ignores exceptions ("Exception ignored in ..."): within the block,
  `sys.unraisablehook` sees that `Interrupted` and sends the signal again, so the run still stops.
- A signal still waiting (as above) when the block is left raises `Interrupted` there, its re-send dropped.

>>> with interrupts():                      # doctest: +SKIP
...     try:
...         train()
...     except Interrupted as err:
...         save(); print(f"interrupted by {err.name}"); raise
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

from graphrl.memory.signals import die_of, pass_on

__all__ = ["SIGNALS", "Interrupted", "interrupts"]

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal (SIGINT or SIGTERM) that `interrupts` turned into an exception.

    Parameters
    ----------
    signum : int
        The signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = int(signum)

    @property
    def name(self) -> str:
        """The signal's name, e.g. ``"SIGTERM"``."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number, the status a shell reports for a process the signal stopped."""
        return 128 + self.signum


RESEND_DELAY = 0.05  # seconds until a signal deferred in numba's compiler or lost in a finalizer is resent
# (a user's signal that lands while a re-send is pending merges with it: the rarer, the longer the delay)


def _stop_now(signum: int) -> None:
    """End the process at once by ``signum``'s default action (`graphrl.memory.signals.die_of`: shared
    segments unlinked, the shell reports 128 + ``signum``), as a second Ctrl-C does."""
    log.warning("second %s while numba compiles: stopping now, nothing saved", signal.Signals(signum).name)
    die_of(signum)


def _compiling() -> bool:
    """Whether this thread is inside numba's compiler (holds its global compiler lock); False where numba
    was never imported."""
    lock = sys.modules.get("numba.core.compiler_lock")
    return lock is not None and lock.global_compiler_lock.is_locked()


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise `Interrupted` in the main thread (once; see the module).

    The handlers in place before are restored when the block is left or at the first signal.
    Outside the main thread nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, object] = {}
    active = True
    closing = False  # the block is being left: the handler swallows re-sends already on their way
    waiting: int | None = None  # a signal deferred (in numba's compiler, or lost in a finalizer)
    resent: list[int] = []  # the re-sends of a waiting signal sent and not yet seen by the handler
    lock = _thread.allocate_lock()  # a re-send is sent only while its signal waits and the block is open

    def resend(signum: int) -> None:  # from a thread: the handler must return for the compiler to go on
        time.sleep(RESEND_DELAY)
        with lock:
            if waiting is not None and not closing:  # else raised already, or at the block's end
                resent.append(signum)  # counted before it is sent: one that the handler sees uncounted
                os.kill(os.getpid(), signum)  # is the user's (see handle)

    def restore() -> None:
        nonlocal active
        active = False
        for signum, handler in previous.items():
            if signal.getsignal(signum) is handle:  # else someone installed over ours: leave theirs
                signal.signal(signum, handler)

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal waiting
        if not active:  # reached through a handler installed on top of ours, after the block
            pass_on(previous.get(signum, signal.SIG_DFL), signum, frame)
            return
        try:  # one of our re-sends? A user's signal seen between a re-send's count and its sending takes
            resent.remove(signum)  # its place (the re-send then counts as the user's: the same outcome);
            ours = True  # one that merges with a pending re-send (the main thread in one long call into
        except ValueError:  # LLVM, where handlers wait) is taken for it: the next one stops the process
            ours = False
        if closing and ours:  # the block's end raises the waiting signal itself
            return
        if _compiling():  # raise once numba's compiler is left, never between its lines (see the module)
            if waiting is not None and not ours:  # the user's second signal while the first waits
                _stop_now(signum)
            waiting = signum
            _thread.start_new_thread(resend, (signum,))
            return
        waiting = None
        restore()
        log.info("received %s", signal.Signals(signum).name)
        raise Interrupted(signum)

    hook = sys.unraisablehook

    def unraisable(args) -> None:
        err = args.exc_value
        if isinstance(err, Interrupted) and threading.current_thread() is threading.main_thread():
            nonlocal active, waiting  # raised in a finalizer, where it was lost: arm ours again and send
            active = True  # the signal again, from a thread this hook does not wait for (its handler must
            signal.signal(err.signum, handle)  # run after the hook has returned, or it is lost again)
            waiting = err.signum
            _thread.start_new_thread(resend, (err.signum,))
            return
        hook(args)

    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if current is signal.SIG_IGN or current is None:
            continue
        previous[signum] = current
        signal.signal(signum, handle)
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        deferred = None
        try:
            with lock:  # no re-send is sent after this; the waiting signal is raised here instead
                closing = True
                deferred, waiting = waiting, None
            deadline = time.monotonic() + 1.0
            while resent and time.monotonic() < deadline:  # re-sends sent before: seen while ours is in
                time.sleep(0.001)  # place (a user's signal meanwhile raises here)
        finally:
            restore()
            if sys.unraisablehook is unraisable:
                sys.unraisablehook = hook
        if deferred is not None:
            log.info("received %s", signal.Signals(deferred).name)
            raise Interrupted(deferred)

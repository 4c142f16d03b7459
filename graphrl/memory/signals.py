"""Unlink a process's shared memory on SIGTERM and SIGHUP, then let the signal take its normal effect.

SIGINT and a normal exit already clean up (``KeyboardInterrupt`` unwinds to interpreter exit, where
every manager's `graphrl.memory.shm.ExitCleanup` runs). SIGTERM (``kill``, ``docker stop``) and
SIGHUP (a closed terminal) kill a process without running Python's exit, so `install_signal_handlers`
puts a handler on both that first unlinks every shared segment the process's managers created, then:

- the handler in place before (an application's Python handler) is called with the same arguments;
- with the default action before, the process dies of the signal (`die_of`: spill arrays on the disk
  tier removed too, as at exit, the default action restored, the signal raised again), so its exit
  status says "killed by SIGTERM";
- a signal that was ignored (``nohup`` ignores SIGHUP) or has a handler outside Python is left alone.

`pass_on` (to the handler found) and `die_of` are the one rule every graphrl handler follows to let a
signal act (`graphrl.interrupts` too). Not every default action ends a process (`default_action`, POSIX's
table): `pass_on` drops a signal whose default is to be ignored (SIGCHLD, SIGWINCH, SIGURG, SIGCONT), stops
the process at one whose default stops it (SIGTSTP, SIGTTIN, SIGTTOU) and, continued, puts the handler back,
and dies only of the others; `die_of` refuses a signal that does not end a process (ValueError).

The rule: handlers are installed once per process (a forked child inherits them), only from the main
thread, at the first shared-tier allocation (or by calling `install_signal_handlers`). A handler the
application installs later replaces ours and is never replaced back; such a handler should call
`unlink_shared_segments` itself. After the handler the regions keep working in this process (their
mappings stay); only attaching them by name fails. See docs/architecture.md#memory-tiers.

>>> from graphrl.memory import install_signal_handlers
>>> install_signal_handlers()  # from the main thread, before the application's own  # doctest: +SKIP
"""

from __future__ import annotations

import os
import signal
import threading
import weakref
from types import FrameType
from typing import Any, NoReturn

from graphrl.memory.shm import ExitCleanup

__all__ = ["SIGNALS", "default_action", "die_of", "install_signal_handlers", "pass_on", "track",
           "unlink_shared_segments"]

SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_IGNORED = frozenset(getattr(signal, n) for n in ("SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH", "SIGINFO")
                     if hasattr(signal, n))
_STOPPED = frozenset(getattr(signal, n) for n in ("SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU")
                     if hasattr(signal, n))

_cleanups: weakref.WeakSet[ExitCleanup] = weakref.WeakSet()
_previous: dict[int, Any] = {}
_installed = False


def track(cleanup: ExitCleanup) -> None:
    """Have the signal handlers run ``cleanup`` (held weakly: it goes with its manager)."""
    _cleanups.add(cleanup)


def unlink_shared_segments(remove_spill: bool = False) -> None:
    """Unlink every shared segment this process's managers created; mappings stay valid.

    Safe in a signal handler (takes no lock). ``remove_spill`` also deletes their disk-tier arrays,
    for a process about to die.
    """
    for cleanup in list(_cleanups):
        cleanup.on_signal(remove_spill)


def default_action(signum: int) -> str:
    """What the default action (``SIG_DFL``) does with ``signum``, by POSIX's table (signal(7)):
    ``"ignore"`` (SIGCHLD, SIGCONT, SIGURG, SIGWINCH; SIGINFO where there is one), ``"stop"`` (SIGSTOP,
    SIGTSTP, SIGTTIN, SIGTTOU) or ``"terminate"`` (every other signal, some with a core dump)."""
    return "ignore" if signum in _IGNORED else "stop" if signum in _STOPPED else "terminate"


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def die_of(signum: int) -> NoReturn:
    """End this process by ``signum``'s default action, so that its status says so (a shell reports
    128 + ``signum``): every shared segment is unlinked and its spill arrays removed first
    (`unlink_shared_segments`), then the default action is restored and the signal raised again.

    The one way a graphrl handler lets a signal kill (this module's, and `graphrl.interrupts` at a second
    signal). Safe in a signal handler. Where the calling thread blocks ``signum`` (``pthread_sigmask``)
    the signal cannot act at once: the process leaves with ``os._exit(128 + signum)`` instead.

    Raises
    ------
    ValueError
        ``signum``'s default action does not end a process (`default_action` "ignore" or "stop": raised
        again it would return, or stop the process); nothing is unlinked.
    """
    action = default_action(signum)
    if action != "terminate":
        raise ValueError(f"die_of: signum {signum} ({_name(signum)}) does not end a process: its default "
                         f"action is {action!r}; pass_on gives it its default action")
    unlink_shared_segments(remove_spill=True)
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)  # dies here, of the signal
    os._exit(128 + signum)  # reached only where this thread blocks signum


def pass_on(previous: Any, signum: int, frame: FrameType | None) -> None:
    """Give a signal to the handler that was in place before one's own (``previous``, as
    `signal.getsignal` returned it): a Python handler is called with ``signum`` and ``frame``; at the
    default action (``SIG_DFL``) the signal takes it (`default_action`): the process dies of a terminating
    one (`die_of`), a stopping one (SIGTSTP) stops it until SIGCONT, after which ``signum``'s handler (one's
    own) is back and this returns, and one ignored by default is dropped; an ignored signal (``SIG_IGN``)
    or one handled outside Python (None) is dropped. Called from a signal handler (the main thread)."""
    if callable(previous):
        previous(signum, frame)
    elif previous is signal.SIG_DFL:
        action = default_action(signum)
        if action == "terminate":
            die_of(signum)
        elif action == "stop":
            _stop(signum)


def _stop(signum: int) -> None:
    """Stop the process by ``signum``'s default action; once continued, put its handler back."""
    own = signal.getsignal(signum)
    signal.signal(signum, signal.SIG_DFL)
    try:
        signal.raise_signal(signum)  # stops here until SIGCONT
    finally:
        if own is not None:
            signal.signal(signum, own)


def _handle(signum: int, frame: FrameType | None) -> None:
    unlink_shared_segments()  # before the previous handler runs (die_of also removes the spill arrays)
    pass_on(_previous.get(signum, signal.SIG_DFL), signum, frame)


def install_signal_handlers() -> bool:
    """Install the SIGTERM and SIGHUP handlers once per process; True once installed.

    Returns False, installing nothing, when called from another thread than the main one (a later
    call from the main thread installs them). Signals that are ignored or handled outside Python
    are left alone.
    """
    global _installed
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if current is signal.SIG_IGN or current is None:
            continue
        _previous[signum] = current
        signal.signal(signum, _handle)
    _installed = True
    return True

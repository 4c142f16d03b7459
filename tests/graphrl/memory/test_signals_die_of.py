"""graphrl.memory.signals.die_of and pass_on, the one rule by which a graphrl handler lets a signal act
(the memory module's SIGTERM / SIGHUP handler and graphrl.interrupts both call them). The deadly cases run
in fork children (`_forked.fork_and_wait`), whose wait status the parent reads; the children report through
a pipe (a child that returns instead of dying leaves with status 0)."""

from __future__ import annotations

import os
import signal

import pytest
from _forked import fork_and_wait

from graphrl.interrupts import interrupts
from graphrl.memory import signals


class _Cleanup:
    """Stands in for a manager's `ExitCleanup`: writes how it was called into the pipe ``fd``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def on_signal(self, remove_paths: bool) -> None:
        os.write(self.fd, f"unlinked spill={remove_paths};".encode())


def _killed_by(status: int) -> int | None:
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else None


def test_pass_on_calls_a_python_handler_and_drops_an_ignored_signal():
    seen = []
    signals.pass_on(lambda s, f: seen.append((s, f)), signal.SIGTERM, None)
    signals.pass_on(signal.SIG_IGN, signal.SIGTERM, None)  # would kill us if it fell through to die_of
    signals.pass_on(None, signal.SIGHUP, None)  # a handler outside Python: nothing to call
    assert seen == [(signal.SIGTERM, None)]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_die_of_unlinks_with_the_spill_then_the_process_dies_of_the_signal(signum):
    def child(fd):
        cleanup = _Cleanup(fd)
        signals.track(cleanup)
        signal.signal(signum, lambda s, f: os.write(fd, b"python handler ran;"))  # die_of restores SIG_DFL
        signals.die_of(signum)

    _, status, report = fork_and_wait(child)
    assert _killed_by(status) == signum, status
    assert report == "unlinked spill=True;"


def test_pass_on_at_the_default_action_dies_of_the_signal():
    def child(fd):
        cleanup = _Cleanup(fd)
        signals.track(cleanup)
        signals.pass_on(signal.SIG_DFL, signal.SIGHUP, None)

    _, status, report = fork_and_wait(child)
    assert _killed_by(status) == signal.SIGHUP, status
    assert report == "unlinked spill=True;"


def test_die_of_where_the_thread_blocks_the_signal_exits_with_128_plus_its_number():
    def child(fd):
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # the fork child's only thread
        signals.die_of(signal.SIGTERM)

    _, status, report = fork_and_wait(child)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 128 + signal.SIGTERM, status
    assert report == ""


def test_interrupts_handler_after_its_block_passes_the_signal_on_through_the_shared_rule():
    """A handler installed on top of interrupts' calls it after the block: the signal goes to what was there
    before (the default action), so the process dies of it, its shared segments and spill arrays gone."""

    def child(fd):
        cleanup = _Cleanup(fd)
        signals.track(cleanup)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with interrupts():
            ours = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, lambda s, f: (os.write(fd, b"on top;"), ours(s, f)))
        signal.raise_signal(signal.SIGTERM)

    _, status, report = fork_and_wait(child)
    assert _killed_by(status) == signal.SIGTERM, status
    assert report == "on top;unlinked spill=True;"

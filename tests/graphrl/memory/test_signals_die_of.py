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


@pytest.mark.parametrize("name", ["SIGWINCH", "SIGCHLD", "SIGURG"])
def test_pass_on_at_a_default_action_that_ignores_drops_the_signal(name):
    """Raised again at its default action such a signal returns: the process goes on (it left with
    128 + signum before), nothing unlinked."""
    signum = getattr(signal, name)

    def child(fd):
        signals.track(_Cleanup(fd))
        signals.pass_on(signal.SIG_DFL, signum, None)
        os.write(fd, b"went on;")

    _, status, report = fork_and_wait(child)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert report == "went on;"


@pytest.mark.parametrize("name", ["SIGWINCH", "SIGCONT"])  # SIGTSTP: default_action (would stop the child)
def test_die_of_refuses_a_signal_that_does_not_end_a_process(name):
    signum = getattr(signal, name)

    def child(fd):
        signals.track(_Cleanup(fd))
        try:
            signals.die_of(signum)
        except ValueError as err:
            os.write(fd, str(err).encode())

    _, status, report = fork_and_wait(child)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert f"signum {signum} ({name})" in report and "unlinked" not in report, report
    assert signals.default_action(signum) in report


def test_default_action_follows_posix():
    def actions(*names):
        return [signals.default_action(getattr(signal, n)) for n in names]

    assert actions("SIGTERM", "SIGINT", "SIGSEGV", "SIGUSR1", "SIGHUP") == ["terminate"] * 5
    assert actions("SIGCHLD", "SIGWINCH", "SIGURG", "SIGCONT") == ["ignore"] * 4
    assert actions("SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGSTOP") == ["stop"] * 4


def test_pass_on_at_a_default_action_that_stops_stops_then_puts_the_handler_back():
    """SIGTSTP at its default action stops the child (it left with 128 + 20 once continued before); on
    SIGCONT pass_on returns with the child's own handler back in place."""

    def child(fd):
        os.setpgid(0, 0)  # a process group of its own with a parent outside: not orphaned, so it stops
        own = lambda s, f: None  # noqa: E731
        signal.signal(signal.SIGTSTP, own)
        signals.pass_on(signal.SIG_DFL, signal.SIGTSTP, None)
        os.write(fd, f"back={signal.getsignal(signal.SIGTSTP) is own};".encode())

    def continue_once_stopped(pid):
        _, status = os.waitpid(pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGTSTP, status
        os.kill(pid, signal.SIGCONT)

    _, status, report = fork_and_wait(child, continue_once_stopped)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert report == "back=True;"

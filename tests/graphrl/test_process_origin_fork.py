"""`graphrl.process_origin.ProcessOrigin` in real processes: a ``fork`` child and grandchild hold copies, the
parent does not, an origin made in a child is made there; the flag, not the pid, decides (a pid reused in a
nested PID namespace, and a child that sees its maker's pid); a ``spawn`` child that unpickles an origin holds
a copy. Every child runs under multiprocessing's ``fork`` or ``spawn`` context, joined with a timeout, and
reports through its exit code (0: every check held; n: check n failed)."""

from __future__ import annotations

import copy
import ctypes
import multiprocessing as mp
import os
import pickle
import sys
from collections.abc import Callable

import pytest

from graphrl.process_origin import ProcessOrigin, check_made_here, made_here

TIMEOUT_S = 60
CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000  # <sched.h>
NO_NAMESPACES = 77  # exit code: unshare() refused (no unprivileged user namespaces here)


def _first_failed(checks: list[bool]) -> int:
    """The exit code for ``checks``: 0 when all hold, else the 1-based index of the first that fails."""
    return next((i for i, ok in enumerate(checks, 1) if not ok), 0)


def _exit_code(ctx_name: str, target: Callable[..., object], *args: object) -> int:
    """Run ``target(*args)`` in a child of context ``ctx_name``; its exit code (``sys.exit``'s code), after
    at most `TIMEOUT_S` seconds (a child still running then is killed and fails the test)."""
    child = mp.get_context(ctx_name).Process(target=target, args=args)
    child.start()
    child.join(TIMEOUT_S)
    if child.exitcode is None:
        child.kill()
        child.join()
        pytest.fail(f"the {ctx_name} child did not end within {TIMEOUT_S} s")
    return child.exitcode


def _raised(origin: ProcessOrigin) -> str:
    try:
        check_made_here(origin, "X.f()", "X", "make one here", error=ValueError)
    except ValueError as err:
        return str(err)
    return ""


def test_a_fork_child_and_its_fork_hold_copies_and_the_parent_does_not():
    origin = ProcessOrigin()
    parent = os.getpid()

    def grandchild(child_origin: ProcessOrigin) -> None:
        own = ProcessOrigin()
        sys.exit(_first_failed([
            origin.copy and not made_here(origin),  # the grandparent's
            child_origin.copy and not made_here(child_origin),  # the child's, made before this fork
            made_here(own) and not own.copy,  # made in this process
            origin.pid == parent and own.pid == os.getpid(),
        ]))

    def child() -> None:
        own = ProcessOrigin()
        checks = [
            origin.copy and not made_here(origin),
            made_here(own) and not own.copy and own.pid == os.getpid() != parent,
            _raised(origin) == f"X.f(): this X was made in process {parent}, and this is process "
                               f"{os.getpid()} (a fork of it): make one here",
            _raised(own) == "",
        ]
        failed = _first_failed(checks)
        sys.exit(failed or 10 + _exit_code("fork", grandchild, own))

    assert _exit_code("fork", child) == 10  # every check of the child, and of the grandchild (0)
    assert made_here(origin) and origin.copy is False and origin.pid == parent  # the parent's is untouched
    assert _raised(origin) == ""


def test_the_flag_decides_not_the_pid_a_child_that_sees_its_makers_pid_holds_a_copy():
    """A child whose ``os.getpid()`` is its maker's (as where a pid is reused): a pid compared with
    ``os.getpid()`` says "made here", the origin says "a copy"; the error names the same pid twice, and still
    a fork."""
    origin = ProcessOrigin()
    parent = os.getpid()

    def child() -> None:
        os.getpid = lambda: parent  # this child only: it exits below
        sys.exit(_first_failed([
            parent == os.getpid(),  # the pid rule is fooled
            not made_here(origin),  # the flag is not
            _raised(origin).startswith(f"X.f(): this X was made in process {parent}, and this is process "
                                       f"{parent} (a fork of it)"),
        ]))

    assert _exit_code("fork", child) == 0


def _unshare(flags: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(ctypes.c_int(flags)) == 0


def test_a_pid_reused_in_a_nested_pid_namespace_is_a_copy():
    """A real pid reuse: a process that is pid 1 of a new PID namespace makes an origin, then forks into a
    nested namespace, where its child is pid 1 too. ``os.getpid() == 1`` in that child; the origin is a
    copy. Skipped where unprivileged user namespaces are off (the kernel refuses ``unshare``)."""

    def in_nested(origin: ProcessOrigin) -> None:  # pid 1 of the nested namespace
        sys.exit(_first_failed([os.getpid() == origin.pid == 1, not made_here(origin)]))

    def init() -> None:  # pid 1 of the first new namespace
        origin = ProcessOrigin()
        if not _unshare(CLONE_NEWPID):
            sys.exit(NO_NAMESPACES)
        sys.exit(_first_failed([made_here(origin)]) or 20 + _exit_code("fork", in_nested, origin))

    def child() -> None:
        if not _unshare(CLONE_NEWUSER | CLONE_NEWPID):  # a fork child: one thread, as unshare needs
            sys.exit(NO_NAMESPACES)
        sys.exit(_exit_code("fork", init))

    code = _exit_code("fork", child)
    if code == NO_NAMESPACES:
        pytest.skip("unshare(CLONE_NEWUSER | CLONE_NEWPID) refused: no unprivileged user namespaces here")
    assert code == 20  # init's check (0) and the nested child's (0)


def _unpickled_in_spawn(origin: ProcessOrigin, parent: int) -> None:  # runs in a spawned process
    own = ProcessOrigin()
    sys.exit(_first_failed([
        origin.copy and origin.unpickled and not made_here(origin),
        origin.pid == parent != os.getpid(),
        made_here(own) and own.pid == os.getpid(),
        _raised(origin) == f"X.f(): this X was made in process {parent}, and this is process {os.getpid()} "
                           "(a copy unpickled from it): make one here",
    ]))


def test_a_spawned_process_that_unpickles_an_origin_holds_a_copy():
    origin = ProcessOrigin()
    assert _exit_code("spawn", _unpickled_in_spawn, origin, os.getpid()) == 0
    assert made_here(origin)  # pickling left the maker's origin alone


def test_an_unpickled_or_copied_origin_is_a_copy_in_this_process_too_and_stays_registered():
    origin = ProcessOrigin()
    copies = [pickle.loads(pickle.dumps(origin)), copy.copy(origin), copy.deepcopy(origin)]
    assert all(c.copy and c.unpickled and c.pid == origin.pid and not made_here(c) for c in copies)
    assert made_here(origin) and not origin.unpickled

    def child() -> None:  # the unpickled copies are registered with the at-fork hook like any other
        sys.exit(_first_failed([all(c.copy for c in copies), origin.copy]))

    assert _exit_code("fork", child) == 0


def test_a_bare_pid_is_refused_and_none_is_made_by_none():
    """The pid rule is gone: a bare pid (even this process's) is a TypeError naming it, in both calls."""
    assert not made_here(None)
    for call in (lambda: made_here(os.getpid()), lambda: _raised(os.getpid())):  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=rf"origin must be a ProcessOrigin .*not int {os.getpid()};"):
            call()
    with pytest.raises(TypeError, match=r"^check_made_here\(\): origin must be a ProcessOrigin"):
        check_made_here(None, "X.f()", "X", "why")  # type: ignore[arg-type]

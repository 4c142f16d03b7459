"""graphrl.process_origin: the one rule "is this object used in the process that made it", checked in a
forked child (False there, and the error names the maker and the child)."""

from __future__ import annotations

import os

import pytest
from _forked import run_in_fork

from graphrl.process_origin import check_made_here, made_here


def test_made_here_in_the_maker_and_never_for_none():
    me = os.getpid()
    assert made_here(me) and not made_here(None) and not made_here(me + 1)
    check_made_here(me, "X.f()", "X", "unused")  # no error in the maker


def test_a_forked_child_is_not_the_maker_and_the_error_names_both_processes():
    parent = os.getpid()

    def child() -> str:
        try:
            check_made_here(parent, "X.f()", "X", "make one here", error=ValueError)
            return "no error"
        except ValueError as err:
            return f"{made_here(parent)}|{os.getpid()}|{err}"

    pid, out = run_in_fork(child)
    here, child_pid, msg = out.split("|", 2)
    assert here == "False" and int(child_pid) == pid
    assert msg == (f"X.f(): this X was made in process {parent}, and this is process {pid} (a fork of it): "
                   "make one here")


def test_the_error_type_defaults_to_runtime_error(monkeypatch):
    monkeypatch.setattr(os, "getpid", lambda: 7)
    with pytest.raises(RuntimeError, match=r"^Y\.g\(\): this Y was made in process 3, and this is process 7"):
        check_made_here(3, "Y.g()", "Y", "why")

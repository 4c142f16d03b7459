"""graphrl.process_origin: the one rule "is this object used in the process that made it", checked in a
forked child (False there, and the error names the maker and the child)."""

from __future__ import annotations

import os
import pickle

import pytest
from _forked import run_in_fork

from graphrl.process_origin import ProcessOrigin, check_made_here, made_here


def test_made_here_in_the_maker_and_never_for_none():
    origin = ProcessOrigin()
    assert made_here(origin) and not made_here(None) and origin.pid == os.getpid()
    check_made_here(origin, "X.f()", "X", "unused")  # no error in the maker


def test_a_forked_child_is_not_the_maker_and_the_error_names_both_processes():
    parent, origin = os.getpid(), ProcessOrigin()

    def child() -> str:
        try:
            check_made_here(origin, "X.f()", "X", "make one here", error=ValueError)
            return "no error"
        except ValueError as err:
            return f"{made_here(origin)}|{os.getpid()}|{err}"

    pid, out = run_in_fork(child)
    here, child_pid, msg = out.split("|", 2)
    assert here == "False" and int(child_pid) == pid
    assert msg == (f"X.f(): this X was made in process {parent}, and this is process {pid} (a fork of it): "
                   "make one here")


def test_the_error_type_defaults_to_runtime_error(monkeypatch):
    copied = pickle.loads(pickle.dumps(ProcessOrigin()))
    copied.pid = 3
    monkeypatch.setattr(os, "getpid", lambda: 7)
    with pytest.raises(RuntimeError, match=r"^Y\.g\(\): this Y was made in process 3, and this is process 7 "
                                           r"\(a copy unpickled from it\): why$"):
        check_made_here(copied, "Y.g()", "Y", "why")

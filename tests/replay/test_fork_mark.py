"""`replay.owner_watch.ForkMark`: False where it was made, True in a forked child and its own forks, and its
at-fork hook keeps no mark alive."""

from __future__ import annotations

import gc
import os
import weakref

from replay.owner_watch import ForkMark


def _exit_code_of_fork(body) -> int:
    pid = os.fork()
    if pid == 0:  # the child: exit with body's code, never return into pytest
        code = 99
        try:
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_mark_is_false_where_made_and_true_in_forks_and_their_forks():
    mark = ForkMark()
    assert mark.child is False

    def child() -> int:
        if not mark.child:
            return 1
        grandchild = _exit_code_of_fork(lambda: 0 if mark.child and ForkMark().child is False else 2)
        return 10 + grandchild

    assert _exit_code_of_fork(child) == 10
    assert mark.child is False  # the parent's mark is untouched


def test_a_collected_mark_leaves_a_harmless_hook():
    mark = ForkMark()
    ref = weakref.ref(mark)
    del mark
    gc.collect()
    assert ref() is None
    assert _exit_code_of_fork(lambda: 0) == 0

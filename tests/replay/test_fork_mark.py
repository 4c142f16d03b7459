"""`graphrl.process_origin.ProcessOrigin` (the fork mark the replay store asks): ``copy`` False where it was
made, True in a forked child and its own forks, and the at-fork hook keeps no origin alive."""

from __future__ import annotations

import gc
import os
import weakref

from graphrl.process_origin import ProcessOrigin


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
    mark = ProcessOrigin()
    assert mark.copy is False

    def child() -> int:
        if not mark.copy:
            return 1
        grandchild = _exit_code_of_fork(lambda: 0 if mark.copy and ProcessOrigin().copy is False else 2)
        return 10 + grandchild

    assert _exit_code_of_fork(child) == 10
    assert mark.copy is False  # the parent's mark is untouched


def test_a_collected_mark_leaves_a_harmless_hook():
    mark = ProcessOrigin()
    ref = weakref.ref(mark)
    del mark
    gc.collect()
    assert ref() is None
    assert _exit_code_of_fork(lambda: 0) == 0


def test_a_forked_store_that_sees_its_owners_pid_still_refuses_sample_and_writes(mm):
    """The store's check is its origin's flag, not the pid: a fork child that sees the owner's pid (as where a
    pid is reused) is refused all the same, by `sample` and by the owner's writer (both name the fork)."""
    from _forked import run_in_fork

    from replay import ReplayStore, TrajectorySpec

    store = ReplayStore(TrajectorySpec({"x": ((), "int64")}), capacity_steps=16, num_shards=1, memory=mm,
                        timeout=5.0)
    writer = store.writer()
    owner = os.getpid()

    def child() -> str:
        os.getpid = lambda: owner  # this child only: run_in_fork leaves it with os._exit
        said = []
        for call in (lambda: store.sample(1), lambda: writer.append({"x": 1})):
            try:
                call()
                said.append("no error")
            except (ValueError, RuntimeError) as err:
                said.append(f"{type(err).__name__}: {err}")
        return "\n".join(said)

    _, out = run_in_fork(child)
    said = out.split("\n")
    assert len(said) == 2, out or "the child died before it reported"
    sample_err, write_err = said
    assert sample_err.startswith(f"ValueError: ReplayStore.sample(): this ReplayStore was made in process "
                                 f"{owner}, and this is process {owner} (a fork of it)"), out
    assert write_err.startswith(f"RuntimeError: TrajectoryWriter.append(): this TrajectoryWriter was made in "
                                f"process {owner}, and this is process {owner} (a fork of it)"), out
    writer.close()
    store.close()

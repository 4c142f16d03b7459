"""`replay.owner_watch.OwnerWatch` across fork.

The child's copy of the parent's pidfd is closed by the at-fork hook right after the fork, and the child
decides anew whether to watch, with its own pidfd; nothing the child opened meanwhile (under the number
the parent's pidfd had) is closed by the watch (a double close). ``process`` is the child's pid there:
the records its writers open are stamped with it.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref

from replay.owner_watch import OwnerWatch


def test_a_forked_child_closes_the_parents_pidfd_at_once_and_watches_with_its_own():
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    watch = OwnerWatch(other.pid)
    try:
        assert watch.active and watch.fd >= 0 and watch.process == os.getpid()
        inherited = watch.fd
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            code = 0
            try:
                if watch.fd != -1 or watch.armed or watch.process != os.getpid():
                    code = 1  # the hook did not run
                try:
                    os.fstat(inherited)  # the number of the parent's pidfd: closed in the child
                    code = 2  # the copy was not closed
                except OSError:
                    pass
                mine = os.open(os.devnull, os.O_RDONLY)
                if not watch.active or watch.fd < 0 or watch.gone(fresh=True):
                    code = 3  # the child watches the live process with its own pidfd
                os.fstat(mine)  # still open: the watch closed nothing of the child's
                os.close(mine)
                watch.close()
            except BaseException:  # noqa: BLE001 - reported by the exit status
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, os.WEXITSTATUS(status)
        assert watch.fd == inherited and not watch.gone(fresh=True)  # the parent's watch is untouched
        os.fstat(watch.fd)
    finally:
        watch.close()
        other.stdin.close()
        other.wait(30)


def test_the_at_fork_hook_keeps_no_watch_alive():
    watch = OwnerWatch(os.getppid())
    ref = weakref.ref(watch)
    del watch
    gc.collect()
    assert ref() is None
    pid = os.fork()  # the hook of a collected watch does nothing
    if pid == 0:  # pragma: no cover
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0

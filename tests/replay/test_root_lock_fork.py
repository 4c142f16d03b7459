"""A checkpoint root's lock is released at the end of its block even when a process forked inside the block
(a DataLoader worker, an actor) still holds a copy of the lock's descriptor."""

from __future__ import annotations

import fcntl
import os
import signal

from replay.checkpoint import root_lock


def test_a_child_forked_while_the_root_is_locked_does_not_keep_it_locked(tmp_path):
    with root_lock(tmp_path):
        pid = os.fork()
        if pid == 0:  # the child keeps the inherited descriptor open until killed
            signal.pause()
            os._exit(0)
    try:
        fd = os.open(tmp_path, os.O_RDONLY)
        try:  # the lock is free while the child lives: a non-blocking exclusive flock gets it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

"""POSIX shared-memory segments (``/dev/shm``) and the exit cleanup that unlinks what a process created.

`ShmSegment.create` makes a segment with ``shm_open``, mode 0600 exactly (whatever the umask), and
reserves it whole with ``posix_fallocate``, so a full ``/dev/shm`` is a ``MemoryError`` now, never a
SIGBUS on first touch; `ShmSegment.open` attaches an existing one; only the creating process unlinks
(the segment's `graphrl.process_origin.ProcessOrigin`: never a fork child, whatever its pid).
`ExitCleanup` holds the segments and spill folders a manager created and removes them at garbage
collection, interpreter exit and the exit of ``multiprocessing`` children, and (through
`graphrl.memory.signals`) on SIGTERM and SIGHUP, in the process that made it only.

We call ``_posixshmem`` directly rather than ``multiprocessing.shared_memory.SharedMemory``: on
Python 3.11 the latter registers every attach with the resource tracker, which then unlinks the
segment when the attaching process exits and warns about "leaked" segments.
"""

from __future__ import annotations

import _posixshmem
import errno
import logging
import mmap
import os
import shutil
import threading
from pathlib import Path

from graphrl.memory.sizes import format_size
from graphrl.process_origin import ProcessOrigin, made_here

__all__ = ["SHM_DIR", "ExitCleanup", "ShmSegment"]

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")


class ShmSegment:
    """One POSIX shared-memory segment mapped into this process; unlinks only in its creating process.

    ``origin`` is the creating process's `graphrl.process_origin.ProcessOrigin` (made by `create`), None
    for a segment attached by `open` (it never unlinks). A fork child of the creator holds a copy of the
    origin, so its ``unlink`` (its exit cleanup, a close of the manager it inherited) leaves the name to
    the creator; a segment a fork child creates is its own, and it unlinks it.
    """

    def __init__(self, name: str, buf: mmap.mmap, origin: ProcessOrigin | None) -> None:
        self.name = name
        self.buf: mmap.mmap | None = buf
        self.origin = origin  # None: attached, never unlinks
        self._unlinked = False
        self._lock = threading.Lock()

    @classmethod
    def create(cls, name: str, nbytes: int) -> ShmSegment:
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.fchmod(fd, 0o600)  # exactly owner-only, whatever the umask
            size = max(nbytes, 1)  # mmap cannot map 0 bytes
            try:
                # reserve now: a full /dev/shm fails here, not as a SIGBUS on first touch
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                    raise MemoryError(f"/dev/shm has no room for {format_size(nbytes)}: {exc}") from exc
                raise
            buf = mmap.mmap(fd, size)
        except BaseException:
            _posixshmem.shm_unlink("/" + name)
            raise
        finally:
            os.close(fd)
        return cls(name, buf, ProcessOrigin())

    @classmethod
    def open(cls, name: str, nbytes: int) -> ShmSegment:
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"no shared region named {name!r} (its owner freed it, closed, unlinked its name "
                "with Region.unlink, or never created it)"
            ) from exc
        try:
            size = os.fstat(fd).st_size
            if size < nbytes:
                raise ValueError(f"shared region {name!r} holds {size} bytes, fewer than {nbytes} asked for")
            buf = mmap.mmap(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        return cls(name, buf, None)

    def unlink(self) -> None:
        """Remove the name from /dev/shm (creator only, once); mappings stay valid until closed."""
        with self._lock:
            if self._unlinked or not made_here(self.origin):
                return
            self._unlinked = True
        try:
            _posixshmem.shm_unlink("/" + self.name)
        except FileNotFoundError:
            logger.debug("shared region %s was already unlinked", self.name)

    def unlink_unlocked(self) -> None:
        """`unlink` without taking a lock, for a signal handler that may interrupt a lock's holder."""
        if self._unlinked or not made_here(self.origin):
            return
        self._unlinked = True
        try:
            _posixshmem.shm_unlink("/" + self.name)
        except FileNotFoundError:
            pass

    def release(self) -> None:
        """Drop this object's mapping; tensors viewing it keep it mapped until they are gone."""
        self.buf = None


class ExitCleanup:
    """Shared segments and spill arrays to remove if their manager is never closed.

    Run by ``weakref.finalize`` (garbage collection, interpreter exit) and by
    ``multiprocessing.util.Finalize`` (multiprocessing children, which leave through ``os._exit``
    when forked). Holds no reference to the manager; does nothing outside the process that made it
    (``origin``: a forked child that inherited it, whatever its pid).
    """

    def __init__(self) -> None:
        self.origin = ProcessOrigin()
        self.segments: dict[str, ShmSegment] = {}
        self.paths: set[Path] = set()
        self.lock = threading.Lock()

    def __call__(self) -> None:
        if not made_here(self.origin):
            return
        with self.lock:
            segments, paths = list(self.segments.values()), list(self.paths)
            self.segments.clear()
            self.paths.clear()
        for segment in segments:
            segment.unlink()
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
        if segments or paths:
            logger.debug("removed %d shared segments and %d spill arrays at exit", len(segments), len(paths))

    def on_signal(self, remove_paths: bool) -> None:
        """Unlink this process's segments (and, if asked, remove its spill arrays) from a signal handler.

        Takes no lock: the handler runs in the main thread, which may hold one. Mappings stay valid.
        """
        if not made_here(self.origin):
            return
        for segment in list(self.segments.values()):
            segment.unlink_unlocked()
        if remove_paths:
            for path in list(self.paths):
                shutil.rmtree(path, ignore_errors=True)

"""Who owns a shared segment, and the reclaim of segments whose owner is gone.

Every segment a `MemoryManager` creates is named ``graphrl_<pid>_<start>_<pidns>_<token>_<index>``:
the creating process's pid, its start time (clock ticks since boot, from ``/proc/<pid>/stat``) and
its pid namespace (the inode of ``/proc/<pid>/ns/pid``), both in base 36, then a random token per
manager and a counter. About 40 characters, far below Linux's 255 (``NAME_MAX`` of ``/dev/shm``).

`reclaim` removes the segments whose owner is gone: the pid runs no process, runs a zombie, or runs
a process with another start time (the pid was reused). It never touches a segment of a live owner,
a name that does not parse as ours (other programs, older layouts), a file of another user, or a
segment made in another pid namespace (its pid means nothing here). `MemoryManager` calls it when
created (``reclaim=True``, the default); ``graphrl gc`` calls it from the command line.

>>> from graphrl.memory.owners import reclaim
>>> [r.name for r in reclaim(dry_run=True)]  # what would go  # doctest: +SKIP

See docs/architecture.md#memory-tiers.
"""

from __future__ import annotations

import _posixshmem
import logging
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from graphrl.memory.shm import SHM_DIR
from graphrl.memory.sizes import format_size

__all__ = ["PREFIX", "Owner", "Reclaimed", "owner_of", "owner_state", "parse_name", "pid_namespace",
           "reclaim", "segment_prefix"]

logger = logging.getLogger(__name__)

PREFIX = "graphrl_"
_NAME = re.compile(r"graphrl_([0-9]+)_([0-9a-z]+)_([0-9a-z]+)_([0-9a-f]{8})_([0-9]+)")
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(value: int) -> str:
    if value == 0:
        return "0"
    out = []
    while value:
        value, rest = divmod(value, 36)
        out.append(_DIGITS[rest])
    return "".join(reversed(out))


@dataclass(frozen=True)
class Owner:
    """The process a segment name records: pid, start time (ticks since boot) and pid namespace."""

    pid: int
    start: int
    pidns: int


@dataclass(frozen=True)
class Reclaimed:
    """A segment `reclaim` removed (or would remove, with ``dry_run``): name, owner, bytes and why."""

    name: str
    owner: Owner
    nbytes: int
    reason: str


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of ``/proc/<pid>/stat`` (state first), or None when the pid runs no process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def pid_namespace(pid: int | str = "self") -> int:
    """The inode of process ``pid``'s PID namespace (``/proc/<pid>/ns/pid``; this process's by default), 0
    where /proc cannot say."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return 0


def owner_of(pid: int | None = None) -> Owner:
    """The `Owner` record of process ``pid`` (this process by default) as this process sees it: its start
    time (0 where /proc cannot say) and PID namespace (0 likewise)."""
    pid = os.getpid() if pid is None else pid
    fields = _stat_fields(pid)
    return Owner(pid, int(fields[19]) if fields else 0, pid_namespace(pid if pid != os.getpid() else "self"))


def segment_prefix() -> str:
    """A fresh name prefix for this process's segments: ``graphrl_<pid>_<start>_<pidns>_<token>_``."""
    me = owner_of()
    return f"{PREFIX}{me.pid}_{_base36(me.start)}_{_base36(me.pidns)}_{secrets.token_hex(4)}_"


def parse_name(name: str) -> Owner | None:
    """The owner a segment name records, or None when the name is not one of ours."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    pid, start, pidns = match.group(1, 2, 3)
    return Owner(int(pid), int(start, 36), int(pidns, 36))


def owner_state(owner: Owner) -> str | None:
    """Why ``owner`` is gone (``"is not running"``, ``"is a zombie"``, ``"now runs another process"``: the
    pid was reused), or None when it is alive.

    Judges the pid in this process's pid namespace; `reclaim` skips owners of other namespaces.
    """
    if owner.pid <= 0:  # never a process (and os.kill would address a process group)
        return "is not running"
    fields = _stat_fields(owner.pid)
    if fields is None:  # no such process, or no /proc to read: ask the kernel
        try:
            os.kill(owner.pid, 0)
        except ProcessLookupError:
            return "is not running"
        except PermissionError:
            return None  # runs, as another user
        return None
    if fields[0] in ("Z", "X"):
        return "is a zombie"
    if owner.start and int(fields[19]) != owner.start:
        return "now runs another process"
    return None


def reclaim(dry_run: bool = False, shm_dir: str | os.PathLike[str] = SHM_DIR) -> list[Reclaimed]:
    """Remove our segments whose owner process is gone; log each one removed.

    Parameters
    ----------
    dry_run : bool
        List what would be removed, remove nothing.
    shm_dir : path
        Where the segments live (``/dev/shm``).

    Returns
    -------
    list of Reclaimed
        The segments removed (or, with ``dry_run``, that would be), sorted by name. A segment another
        process removed in between is left out.
    """
    root = Path(shm_dir)
    if not root.is_dir():
        return []
    uid, pidns = os.getuid(), pid_namespace()
    verdicts: dict[Owner, str | None] = {}
    out: list[Reclaimed] = []
    with os.scandir(root) as entries:
        candidates = sorted((e.name, e) for e in entries if e.name.startswith(PREFIX))
    for name, entry in candidates:
        owner = parse_name(name)
        if owner is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            continue
        if owner.pidns != pidns:  # its pid means another process here: not ours to judge
            logger.debug("kept shared segment %s of pid namespace %d", name, owner.pidns)
            continue
        if owner not in verdicts:
            verdicts[owner] = owner_state(owner)
        reason = verdicts[owner]
        if reason is None:
            continue
        if not dry_run:
            try:
                _posixshmem.shm_unlink("/" + name)
            except FileNotFoundError:
                continue
            logger.info("removed shared segment %s (%s): its owner, pid %d, %s", name,
                        format_size(st.st_size), owner.pid, reason)
        out.append(Reclaimed(name, owner, st.st_size, reason))
    return out

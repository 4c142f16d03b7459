"""Checks the ``graphrl`` commands run before any work: can they write where they will write?

`writable_folder` is the one rule for every option that names an output folder (``train recommend
--out``, ``demo --plot`` and ``--logdir``, ``bench --out`` and ``--plot``): create the folder (and its
parents), then create and remove a probe file in it. `new_folder` is its form for an argument that
names a folder the command creates (``partition OUT``): it must not exist, or be empty, and its parent
must pass the probe. A folder that exists but cannot be written
(read-only, another user's, a read-only mount), or a path under a file, is refused at once with a click
error that names the option, the path and the operating system's reason, instead of after an hour of
training. Commands call it first thing, before loading data.

>>> writable_folder("runs/gowalla", "--out")      # doctest: +SKIP
PosixPath('runs/gowalla')

This module raises click errors (it serves the CLI); library code does not use it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import click

__all__ = ["new_folder", "writable_folder"]

PROBE_PREFIX = ".graphrl-write-probe-"


def writable_folder(path: str | os.PathLike, option: str, files: tuple[str, ...] = ()) -> Path:
    """Create ``path`` and prove a file can be created in it, or refuse with a click error.

    Parameters
    ----------
    path : str or path
        The folder a command will write into.
    option : str
        The option that named it (``"--out"``), for the message.
    files : tuple of str
        Names of the files the command will write there (replacing earlier ones): none may be a folder.

    Returns
    -------
    Path
        ``path``, now an existing folder this process can write.

    Raises
    ------
    click.BadParameter
        The folder cannot be created, or no file can be created in it; the message names ``option``,
        ``path`` and the OS's reason ("Permission denied", "Not a directory", "Read-only file system").
        Or one of ``files`` is a folder there ("Is a directory").
    """
    folder = Path(path)
    _probe(folder, folder, option)
    for name in files:
        if (folder / name).is_dir():
            raise click.BadParameter(f"cannot write to {str(folder / name)!r}: {os.strerror(errno.EISDIR)}",
                                     param_hint=f"'{option}'")
    return folder


def new_folder(path: str | os.PathLike, option: str) -> Path:
    """Check that ``path`` is a folder a command can create and fill: absent (or an empty folder), with a
    parent where a file can be created (made if missing); refuse with a click error otherwise.

    Parameters
    ----------
    path : str or path
        The folder the command will create (it writes next to it first, then renames).
    option : str
        The argument or option that named it (``"OUT"``), for the message.

    Returns
    -------
    Path
        ``path`` (not created).

    Raises
    ------
    click.BadParameter
        ``path`` exists and is not an empty folder, or its parent cannot be written (as `writable_folder`).
    """
    folder = Path(path)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise click.BadParameter(f"{str(path)!r} exists and is not an empty folder: choose a new path",
                                 param_hint=f"'{option}'")
    _probe(folder.parent, folder, option)
    return folder


def _probe(folder: Path, named: Path, option: str) -> None:
    """Make ``folder`` (and parents) and create and remove a file in it; refuse naming ``named``."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        reason = err.strerror or str(err)
        if isinstance(err, FileExistsError):  # the folder (or a parent) is a file
            reason = os.strerror(errno.ENOTDIR)
        raise click.BadParameter(f"cannot write to {str(named)!r}: {reason}",
                                 param_hint=f"'{option}'") from None

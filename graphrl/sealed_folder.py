"""A sealed folder: a folder whose file table (size and sha256 of every file) lives in a JSON manifest that
carries the sha256 of its own canonical content, so that any missing, truncated, grown, altered, swapped or
stray file, and any edit to the manifest, is found and named.

Replay checkpoints (`replay._files`, raising `replay.CheckpointError`) and partition folders
(`graphrl.partition.files`, raising `graphrl.partition.PartitionError`) are both sealed this way; each passes
its own error class and wording. Content-addressed manifests as in git's trees and OCI image manifests.

>>> table = file_table(folder, skip=("MANIFEST.json",))
>>> seal(folder / "MANIFEST.json", {"files": table})        # write to a temporary name, then rename
>>> body, digest = unseal(folder / "MANIFEST.json", str(folder))   # SealError if damaged
>>> check_files(folder, body["files"], skip=("MANIFEST.json",))    # [] when every file matches

`fsync_dir` makes renames and new entries in a folder durable. See docs/architecture.md#checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["SealError", "check_files", "file_sha256", "file_table", "fsync_dir", "seal", "unseal"]

_BLOCK = 1 << 20
_MAX_MANIFEST_BYTES = 64 << 20


class SealError(ValueError):
    """A sealed folder is damaged: a file is missing, truncated, altered or unexpected, or its manifest is
    missing, too large, not JSON or altered. The message names the folder, the file and the fault.

    The base of `replay.CheckpointError` and `graphrl.partition.PartitionError`.

    Attributes
    ----------
    folder : str
        The sealed folder.
    files : tuple of str
        The files at fault, relative to ``folder`` (empty when the fault is in no single file).
    """

    def __init__(self, message: str, folder: str = "", files: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.folder = folder
        self.files = tuple(files)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, so that renames and new entries in it survive a crash."""
    fd = os.open(Path(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[str]:
    """Every entry under ``folder`` that is not a directory, as sorted POSIX paths relative to it."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = Path(dirpath).relative_to(folder)
        out.extend((rel / f).as_posix() for f in filenames)
        out.extend((rel / d).as_posix() for d in dirnames if Path(dirpath, d).is_symlink())
    return sorted(out)


def file_table(folder: str | os.PathLike[str], skip: tuple[str, ...] = ()) -> dict[str, list[Any]]:
    """``{relative path: [size in bytes, sha256]}`` of every file under ``folder`` but ``skip``."""
    folder = Path(folder)
    return {
        rel: [os.path.getsize(folder / rel), file_sha256(folder / rel)]
        for rel in _files(folder)
        if rel not in skip
    }


def check_files(
    folder: str | os.PathLike[str],
    table: dict[str, Any],
    only: tuple[str, ...] | None = None,
    skip: tuple[str, ...] = (),
    *,
    written_by: str = "writer",
    recorded_at: str = "write",
    listing: bool = False,
) -> list[str]:
    """What is wrong with ``folder``'s files against ``table`` (from `file_table`): one line per file
    (missing, truncated / grown, altered or holding another file's bytes, unexpected, not a regular file);
    empty when all match.

    ``only``: check these paths of the table alone, and no stray files (an owner verifying its own files);
    ``None`` checks every file under ``folder`` but ``skip``. ``listing`` with ``only``: also compare the
    names of every file under ``folder`` but ``skip`` with the table (missing and unexpected files named),
    reading ``only``'s files alone. ``written_by`` and ``recorded_at`` word the lines: "unexpected file
    (not written by the {written_by})", "sha256 differs from the one recorded at {recorded_at}".
    """
    folder = Path(folder)
    wanted = set(table) if only is None else set(only)
    listed = set(_files(folder)) - set(skip) if only is None or listing else set()
    found = listed if only is None else {r for r in wanted if (folder / r).exists()}
    owner = {digest: rel for rel, (_, digest) in table.items()}
    problems = [f"{rel}: missing" for rel in sorted(wanted - found)]
    if only is not None and listing:  # the rest of the folder by name: missing files, files not in the table
        problems += [f"{rel}: missing" for rel in sorted(set(table) - wanted - listed)]
        found |= listed - set(table)
    for rel in sorted(found):
        p = folder / rel
        if rel not in table:
            problems.append(f"{rel}: unexpected file (not written by the {written_by})")
            continue
        size, digest = table[rel]
        if p.is_symlink() or not p.is_file():
            problems.append(f"{rel}: not a regular file")
        elif (n := os.path.getsize(p)) != size:
            change = "truncated" if n < size else "grown"
            problems.append(f"{rel}: {change} to {n} bytes, written with {size}")
        elif (got := file_sha256(p)) != digest:
            was = f"holds the bytes of {owner[got]} (swapped)" if got in owner else "altered"
            problems.append(f"{rel}: {was} (sha256 differs from the one recorded at {recorded_at})")
    return problems


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(path: str | os.PathLike[str], body: dict[str, Any]) -> str:
    """Write ``body`` as JSON with the sha256 of its canonical form under ``"sha256"``, fsync'd; return
    that digest. ``path`` is written in place: write to a temporary name and rename to publish."""
    digest = _digest(body)
    with open(path, "w") as fh:
        fh.write(json.dumps({**body, "sha256": digest}, indent=1, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return digest


def unseal(
    path: str | os.PathLike[str],
    folder: str,
    *,
    error: type[SealError] = SealError,
    label: str = "sealed folder",
    missing_hint: str = "",
) -> tuple[dict[str, Any], str]:
    """Read a manifest `seal` wrote in ``folder``; return its body and digest.

    ``error`` is raised as ``error(message, folder, (file,))``; messages start "{label} {folder}: {file}",
    and a missing manifest's ends with ``missing_hint``.

    Raises
    ------
    SealError
        (``error``) The file is missing, too large, not JSON, or its content does not match its digest.
    """
    p = Path(path)
    where = os.path.relpath(p, folder)
    head = f"{label} {folder}: {where}"
    if not p.is_file():
        raise error(f"{head} is missing{missing_hint}", folder, (where,))
    if os.path.getsize(p) > _MAX_MANIFEST_BYTES:
        raise error(f"{head} is too large", folder, (where,))
    try:
        data = json.loads(p.read_bytes())
    except (UnicodeDecodeError, ValueError) as e:
        raise error(f"{head} is not valid JSON (truncated or altered: {e})", folder, (where,)) from None
    digest = data.pop("sha256", None) if isinstance(data, dict) else None
    if not isinstance(digest, str) or _digest(data) != digest:
        raise error(f"{head} is altered (its content does not match its sha256)", folder, (where,))
    return data, digest

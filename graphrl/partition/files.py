"""The partition folder's sealed manifest (size and sha256 of every file) and the error of a damaged folder.

`PartitionError` (a ``ValueError``) names the folder, the file and the fault. `file_table` lists a
folder's files with their sizes and sha256; `check_files` compares a folder with such a table (missing,
truncated or grown, altered, unexpected files); `seal` / `unseal` write and read a JSON manifest that
carries the sha256 of its own canonical content. The same scheme seals replay checkpoints
(docs/architecture.md#checkpoints); content-addressed manifests as in git's trees and OCI manifests.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["PartitionError", "check_files", "file_sha256", "file_table", "seal", "unseal"]

_BLOCK = 1 << 20
_MAX_MANIFEST_BYTES = 64 << 20


class PartitionError(ValueError):
    """A partition folder is damaged, of another graph, or asked for a part it does not hold.

    Attributes
    ----------
    folder : str
        The partition folder.
    files : tuple of str
        The files at fault, relative to ``folder`` (empty when the fault is in no single file).
    """

    def __init__(self, message: str, folder: str = "", files: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.folder = folder
        self.files = tuple(files)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = Path(dirpath).relative_to(folder)
        out.extend((rel / f).as_posix() for f in filenames)
        out.extend((rel / d).as_posix() for d in dirnames if Path(dirpath, d).is_symlink())
    return sorted(out)


def file_table(folder: str | os.PathLike[str], skip: tuple[str, ...] = ()) -> dict[str, list[Any]]:
    """``{relative path: [size in bytes, sha256]}`` of every file under ``folder`` but ``skip``."""
    folder = Path(folder)
    return {rel: [os.path.getsize(folder / rel), file_sha256(folder / rel)] for rel in _files(folder)
            if rel not in skip}


def check_files(folder: str | os.PathLike[str], table: dict[str, Any], only: tuple[str, ...] | None = None,
                skip: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with ``folder``'s files against ``table``: one line per file; empty when all match.

    ``only``: check these paths of the table alone (a partition owner verifies its own files).
    """
    folder = Path(folder)
    wanted = set(table) if only is None else set(only)
    if only is None:
        found = set(_files(folder)) - set(skip)
    else:
        found = {r for r in wanted if (folder / r).exists()}
    problems = [f"{rel}: missing" for rel in sorted(wanted - found)]
    for rel in sorted(found):
        p = folder / rel
        if rel not in table:
            problems.append(f"{rel}: unexpected file (not written by the partitioner)")
            continue
        size, digest = table[rel]
        if p.is_symlink() or not p.is_file():
            problems.append(f"{rel}: not a regular file")
        elif (n := os.path.getsize(p)) != size:
            change = "truncated" if n < size else "grown"
            problems.append(f"{rel}: {change} to {n} bytes, written with {size}")
        elif file_sha256(p) != digest:
            problems.append(f"{rel}: altered (sha256 differs from the one recorded at write)")
    return problems


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(path: str | os.PathLike[str], body: dict[str, Any]) -> str:
    """Write ``body`` as JSON with the sha256 of its canonical form under ``"sha256"``, fsync'd; return it."""
    digest = _digest(body)
    with open(path, "w") as fh:
        fh.write(json.dumps({**body, "sha256": digest}, indent=1, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return digest


def unseal(path: str | os.PathLike[str], folder: str) -> tuple[dict[str, Any], str]:
    """Read a manifest `seal` wrote; return its body and digest.

    Raises
    ------
    PartitionError
        The file is missing, too large, not JSON, or its content does not match its digest.
    """
    p = Path(path)
    where = os.path.relpath(p, folder)
    if not p.is_file():
        raise PartitionError(f"partition folder {folder}: {where} is missing (not a partition folder?)",
                             folder, (where,))
    if os.path.getsize(p) > _MAX_MANIFEST_BYTES:
        raise PartitionError(f"partition folder {folder}: {where} is too large", folder, (where,))
    try:
        data = json.loads(p.read_bytes())
    except (UnicodeDecodeError, ValueError) as e:
        raise PartitionError(f"partition folder {folder}: {where} is not valid JSON (truncated or altered: "
                             f"{e})", folder, (where,)) from None
    digest = data.pop("sha256", None) if isinstance(data, dict) else None
    if not isinstance(digest, str) or _digest(data) != digest:
        raise PartitionError(f"partition folder {folder}: {where} is altered (its content does not match its "
                             f"sha256)", folder, (where,))
    return data, digest

"""Durable, verifiable files both checkpoint formats (local and Ray) use.

`CheckpointError` is the one error a damaged checkpoint raises (a ``ValueError``: it names the checkpoint,
the file and what is wrong). `fsync_dir` makes renames durable. `file_sha256` hashes a file in bounded
memory; `file_table` lists a folder's files with their sizes and sha256; `check_files` compares a folder
with such a table (missing, truncated or grown, altered, unexpected files). `seal` / `unseal` write and
read a JSON manifest that carries the sha256 of its own content. See docs/architecture.md#checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["CheckpointError", "check_files", "file_sha256", "file_table", "fsync_dir", "seal", "unseal"]

_BLOCK = 1 << 20
_MAX_MANIFEST_BYTES = 64 << 20


class CheckpointError(ValueError):
    """A checkpoint is damaged or inconsistent: a file is missing, truncated, altered or unexpected, or
    the state it holds breaks an invariant. The message names the checkpoint, the file and the fault.

    Attributes
    ----------
    checkpoint : str
        The checkpoint folder.
    files : tuple of str
        The files at fault, relative to ``checkpoint`` (empty when the fault is in no single file).
    intact : str or None
        An older checkpoint of the same root that verified intact, if any (restore it by this path).
    """

    def __init__(
        self, message: str, checkpoint: str = "", files: tuple[str, ...] = (), intact: str | None = None
    ) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint
        self.files = tuple(files)
        self.intact = intact


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
    folder: str | os.PathLike[str], table: dict[str, Any], skip: tuple[str, ...] = ()
) -> list[str]:
    """What is wrong with ``folder``'s files against ``table`` (from `file_table`): one line per file
    (missing, truncated / grown, altered, unexpected, not a regular file); empty when all match."""
    folder = Path(folder)
    found = set(_files(folder)) - set(skip)
    owner = {digest: rel for rel, (_, digest) in table.items()}
    problems = [f"{rel}: missing" for rel in sorted(set(table) - found)]
    for rel in sorted(found):
        p = folder / rel
        if rel not in table:
            problems.append(f"{rel}: unexpected file (not written by the checkpoint)")
            continue
        size, digest = table[rel]
        if p.is_symlink() or not p.is_file():
            problems.append(f"{rel}: not a regular file")
        elif (n := os.path.getsize(p)) != size:
            change = "truncated" if n < size else "grown"
            problems.append(f"{rel}: {change} to {n} bytes, written with {size}")
        elif (got := file_sha256(p)) != digest:
            was = f"holds the bytes of {owner[got]} (swapped)" if got in owner else "altered"
            problems.append(f"{rel}: {was} (sha256 differs from the one recorded at save)")
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


def unseal(path: str | os.PathLike[str], checkpoint: str) -> tuple[dict[str, Any], str]:
    """Read a manifest `seal` wrote; return its body and digest.

    Raises
    ------
    CheckpointError
        The file is missing, too large, not JSON, or its content does not match its digest.
    """
    p = Path(path)
    where = os.path.relpath(p, checkpoint)
    if not p.is_file():
        raise CheckpointError(f"checkpoint {checkpoint}: {where} is missing", checkpoint, (where,))
    if os.path.getsize(p) > _MAX_MANIFEST_BYTES:
        raise CheckpointError(f"checkpoint {checkpoint}: {where} is too large", checkpoint, (where,))
    try:
        data = json.loads(p.read_bytes())
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {checkpoint}: {where} is not valid JSON (truncated or altered: {e})",
            checkpoint,
            (where,),
        ) from None
    digest = data.pop("sha256", None) if isinstance(data, dict) else None
    if not isinstance(digest, str) or _digest(data) != digest:
        raise CheckpointError(
            f"checkpoint {checkpoint}: {where} is altered (its content does not match its sha256)",
            checkpoint,
            (where,),
        )
    return data, digest

"""The sealed-folder rules (`graphrl.sealed_folder`) in checkpoint words, and the error a damaged checkpoint
raises.

`CheckpointError` is the one error a damaged checkpoint raises (a ``ValueError`` and a
`graphrl.sealed_folder.SealError`: it names the checkpoint, the file and what is wrong). `fsync_dir` makes
renames durable. `file_sha256` hashes a file in bounded memory; `file_table` lists a folder's files with
their sizes and sha256; `check_files` compares a folder with such a table (missing, truncated or grown,
altered, swapped, unexpected files). `seal` / `unseal` write and read a JSON manifest that carries the
sha256 of its own content. See docs/architecture.md#checkpoints.
"""

from __future__ import annotations

import os
from typing import Any

from graphrl import sealed_folder
from graphrl.sealed_folder import SealError, file_sha256, file_table, fsync_dir, seal

__all__ = ["CheckpointError", "check_files", "file_sha256", "file_table", "fsync_dir", "seal", "unseal"]


class CheckpointError(SealError):
    """A checkpoint is damaged or inconsistent: a file is missing, truncated, altered or unexpected, or
    the state it holds breaks an invariant. The message names the checkpoint, the file and the fault.

    Attributes
    ----------
    checkpoint : str
        The checkpoint folder (also ``folder``).
    files : tuple of str
        The files at fault, relative to ``checkpoint`` (empty when the fault is in no single file).
    intact : str or None
        An older checkpoint of the same root that verified intact, if any (restore it by this path).
    """

    def __init__(
        self, message: str, checkpoint: str = "", files: tuple[str, ...] = (), intact: str | None = None
    ) -> None:
        super().__init__(message, checkpoint, files)
        self.checkpoint = checkpoint
        self.intact = intact


def check_files(
    folder: str | os.PathLike[str], table: dict[str, Any], skip: tuple[str, ...] = ()
) -> list[str]:
    """What is wrong with ``folder``'s files against ``table`` (from `file_table`): one line per file
    (missing, truncated / grown, altered, swapped, unexpected, not a regular file); empty when all match."""
    return sealed_folder.check_files(folder, table, skip=skip, written_by="checkpoint", recorded_at="save")


def unseal(path: str | os.PathLike[str], checkpoint: str) -> tuple[dict[str, Any], str]:
    """Read a manifest `seal` wrote; return its body and digest.

    Raises
    ------
    CheckpointError
        The file is missing, too large, not JSON, or its content does not match its digest.
    """
    return sealed_folder.unseal(path, checkpoint, error=CheckpointError, label="checkpoint")

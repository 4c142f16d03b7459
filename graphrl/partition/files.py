"""The sealed-folder rules (`graphrl.sealed_folder`) in partition-folder words, and the error of a damaged
folder.

`PartitionError` (a ``ValueError`` and a `graphrl.sealed_folder.SealError`) names the folder, the file and
the fault. `file_table` lists a folder's files with their sizes and sha256; `check_files` compares a folder
with such a table (missing, truncated or grown, altered, swapped, unexpected files); `seal` / `unseal` write
and read a JSON manifest that carries the sha256 of its own canonical content. The same scheme seals replay
checkpoints (docs/architecture.md#checkpoints).
"""

from __future__ import annotations

import os
from typing import Any

from graphrl import sealed_folder
from graphrl.sealed_folder import SealError, file_sha256, file_table, seal

__all__ = ["PartitionError", "check_files", "file_sha256", "file_table", "seal", "unseal"]


class PartitionError(SealError):
    """A partition folder is damaged, of another graph, or asked for a part it does not hold.

    Its ``folder`` is the partition folder and its ``files`` the files at fault, as in `SealError`.
    """


def check_files(folder: str | os.PathLike[str], table: dict[str, Any], only: tuple[str, ...] | None = None,
                skip: tuple[str, ...] = (), listing: bool = False) -> list[str]:
    """What is wrong with ``folder``'s files against ``table``: one line per file; empty when all match.

    ``only``: check these paths of the table alone (a partition owner verifies its own files); with
    ``listing``, the other files by name too (missing, unexpected), unread.
    """
    return sealed_folder.check_files(folder, table, only, skip, written_by="partitioner", recorded_at="write",
                                     listing=listing)


def unseal(path: str | os.PathLike[str], folder: str) -> tuple[dict[str, Any], str]:
    """Read a manifest `seal` wrote; return its body and digest.

    Raises
    ------
    PartitionError
        The file is missing, too large, not JSON, or its content does not match its digest.
    """
    return sealed_folder.unseal(path, folder, error=PartitionError, label="partition folder",
                                missing_hint=" (not a partition folder?)")

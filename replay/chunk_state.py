"""ChunkState: a compressed field's checkpointed chunks, checked once when made.

`replay.chunk_codec.ChunkRing.state` gives a ring's live chunks as they are (chunk records, their bytes
one after another, the raw tail, the next position); a checkpoint writes them and a restore
(`replay.checkpoint.load`) reads them back into a `ChunkState`, whose making checks every chunk's
record and XXH64 checksum (`chunk_state_fault`, `replay.chunk_encode.verify_chunks`) before anything is
stored; `replay.chunk_codec.ChunkRing.load_state` then takes it without checking again. The ring is
the live store; this module is the form its chunks travel in, and the one check of that form.

>>> state = ChunkState.of(ring.state())     # ValueError naming the first bad chunk
>>> other_ring.load_state(state)

References
----------
xxHash (XXH64); DeepMind Reverb's checkpoints of compressed chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from replay.chunk_encode import verify_chunks

__all__ = ["ChunkState", "chunk_state_fault"]


@dataclass(frozen=True, eq=False)
class ChunkState:
    """A ring's checkpointed chunks (`ChunkRing.state`) whose records and checksums hold: making one runs
    `chunk_state_fault` (raising ``ValueError`` with the fault), so any `ChunkState` was checked, once;
    `ChunkRing.load_state` takes it without checking the checksums again. It cannot be changed after the
    check: its fields are frozen and its arrays are read-only views of those given (their maker hands
    them over: `of` and `replay.checkpoint.load` keep no other reference they write through).

    Parameters
    ----------
    chunks : numpy.ndarray, int64 [K, 3]
        Per live chunk, in chunk order: chunk index, length, checksum.
    blob : numpy.ndarray, uint8 [sum of lengths]
        Their bytes, one after another.
    tail : numpy.ndarray, the field's dtype [C, *field_shape]
        The raw rows of the open chunk.
    next_position : int
        The ring's next position.

    Raises
    ------
    ValueError
        The fault `chunk_state_fault` names (the message is the fault alone; callers name the field).
    """

    chunks: np.ndarray
    blob: np.ndarray
    tail: np.ndarray
    next_position: int

    def __post_init__(self) -> None:
        for name in ("chunks", "blob", "tail"):
            view = np.asarray(getattr(self, name)).view()
            view.flags.writeable = False
            object.__setattr__(self, name, view)  # the frozen dataclass's own way to set a field once
        fault = chunk_state_fault(self.chunks, self.blob)
        if fault is not None:
            raise ValueError(fault)

    @classmethod
    def of(cls, state: dict[str, Any]) -> ChunkState:
        """The checked form of a `ChunkRing.state` dict (``chunks``, ``blob``, ``tail``, ``next_position``);
        raises as the class."""
        return cls(np.asarray(state["chunks"]), np.asarray(state["blob"], dtype=np.uint8),
                   np.asarray(state["tail"]), int(state["next_position"]))


def chunk_state_fault(chunks: np.ndarray, blob: np.ndarray) -> str | None:
    """What is wrong with a ring's checkpointed chunks (`ChunkRing.state`), or None when they hold.

    Parameters
    ----------
    chunks : numpy.ndarray, int64 [K, 3]
        Per live chunk, in chunk order: chunk index, length, checksum (`replay.chunk_encode.chunk_checksum`).
    blob : numpy.ndarray, uint8 [sum of lengths]
        Their bytes, one after another.

    Returns
    -------
    str or None
        The first fault, naming the chunk: records of another shape or dtype (an older format), a chunk
        whose bytes fail its checksum or run past ``blob`` (its bytes or its record changed after it was
        compressed), indices not increasing, or bytes left over.
    """
    if chunks.ndim != 2 or chunks.shape[1] != 3 or chunks.dtype != np.int64:
        return (f"chunk records have shape {chunks.shape} {chunks.dtype}, expected (K, 3) int64 (chunk "
                "index, length, checksum)")
    bad = int(verify_chunks(blob, chunks[:, 0], chunks[:, 1], chunks[:, 2]))
    if bad >= 0:
        return (f"chunk {int(chunks[bad, 0])} (record {bad} of {len(chunks)}) fails its checksum: its bytes "
                "or its record changed after it was compressed")
    if len(chunks) and (chunks[0, 0] < 0 or (np.diff(chunks[:, 0]) <= 0).any()):
        return "chunk records' indices are not increasing from 0 or more"
    if int(chunks[:, 1].sum()) != blob.size:
        return f"chunks' lengths sum to {int(chunks[:, 1].sum())} bytes, its blob holds {blob.size}"
    return None

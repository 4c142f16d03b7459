"""A codec field's arena size: `arena_size`, the store's one rule (`replay.shard.ShardStorage.create` sizes
each shard's arena by it), with the bound that makes it safe, and its inverses: `arena_ratio_of` (the ratio
of an arena's bytes) and `arena_ratio_for` (the largest ratio whose arena holds so many bytes, which a full
arena's message states: `replay.chunk_codec.ChunkRing`).

>>> arena_size(capacity=128, row_bytes=64, chunk=4, arena_ratio=4.0)
2112
"""

from __future__ import annotations

import math

__all__ = ["arena_ratio_for", "arena_ratio_of", "arena_size"]


def arena_size(capacity: int, row_bytes: int, chunk: int, arena_ratio: float) -> int:
    """Bytes of a codec field's arena: ``capacity * row_bytes / arena_ratio`` for the live chunks, plus
    one chunk of ``chunk * row_bytes / max(1, arena_ratio)`` bytes for the bytes `place_chunks` skips.

    Parameters
    ----------
    capacity : int
        Steps of the shard's ring, ``slots * chunk``.
    row_bytes : int
        Bytes of one step of the field.
    chunk : int
        Steps per chunk; ``R = chunk * row_bytes`` is a raw chunk's bytes.
    arena_ratio : float
        Raw bytes per arena byte (`replay.spec.FieldSpec.arena_ratio`), > 0.

    Returns
    -------
    int
        ``max(1, int(capacity * row_bytes / arena_ratio)) + ceil(R / max(1, arena_ratio))``.

    Notes
    -----
    The bound: let every stored chunk take at most ``m = R / max(1, arena_ratio)`` bytes (always so
    for ``arena_ratio <= 1``: a chunk that does not compress is stored raw, ``R`` bytes). A chunk is
    placed beside at most ``slots - 1`` live ones (a write's chunks end at its end, and the positions
    ``capacity`` back are the floor), so at most ``(slots - 1) * m`` live bytes; the live range of the
    circular log holds at most one skipped gap, the bytes before the arena's end that a chunk did not
    fit in, under ``m``. An arena of ``A >= (slots + 1) * m`` bytes so always leaves room: unwrapped,
    the new chunk fits at the head or at 0 (``tail_off > A - (slots - 1) m - m >= m``); wrapped, the
    free bytes ``A - live - gap > m``. Without the extra chunk, ``arena_ratio=1`` refused commits of
    chunks of varying sizes. Its cost: one chunk per shard and codec field (``1 / slots`` of the arena
    at ``arena_ratio >= 1``).
    """
    nominal = max(1, int(capacity * row_bytes / arena_ratio))
    return nominal + math.ceil(chunk * row_bytes / max(1.0, arena_ratio))


def arena_ratio_of(capacity: int, row_bytes: int, chunk: int, arena_bytes: int) -> float:
    """The ``arena_ratio`` that `arena_size` turns into ``arena_bytes`` (about: sizes are whole bytes),
    for messages; an arena below one raw chunk's bytes gives ``capacity * row_bytes / arena_bytes``."""
    raw, r = capacity * row_bytes, chunk * row_bytes
    if (raw + r) / arena_bytes >= 1.0:  # arena_ratio >= 1: arena = (raw + r) / ratio
        return (raw + r) / arena_bytes
    return raw / (arena_bytes - r) if arena_bytes > r else raw / arena_bytes


def arena_ratio_for(capacity: int, row_bytes: int, chunk: int, arena_bytes: int) -> float:
    """The largest ``arena_ratio`` in hundredths whose arena (`arena_size`) has at least ``arena_bytes``
    bytes: the remedy a full arena's message states (`arena_ratio_of` read back, checked on `arena_size`).

    Parameters are `arena_size`'s, with ``arena_bytes`` the bytes wanted. Returns a float ``k / 100``,
    ``k >= 1``: ``arena_size(..., r) >= arena_bytes`` and ``arena_size(..., r + 0.01) < arena_bytes``
    (or 0.01 when even that arena is smaller: more than 100 arena bytes per raw byte).
    """
    r = max(1, math.floor(arena_ratio_of(capacity, row_bytes, chunk, arena_bytes) * 100))
    while r > 1 and arena_size(capacity, row_bytes, chunk, r / 100) < arena_bytes:
        r -= 1
    while arena_size(capacity, row_bytes, chunk, (r + 1) / 100) >= arena_bytes:
        r += 1
    return r / 100

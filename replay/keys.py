"""The bit layout of replay keys: which window of which shard a ``batch.keys`` entry names.

A key (int64) packs, from the low bits up: the window's shard (`SHARD_BITS`), the distance from its
anchor back to its first real step (`BACK_BITS`), the store's incarnation (`INC_BITS`, counted up by
every restore) and the anchor's absolute position in its shard (`POS_BITS`)::

    key = anchor << 28 | incarnation << 24 | back << 8 | shard

>>> from replay.keys import encode_keys, decode_keys
>>> shard, anchor, back = decode_keys(encode_keys([1], [1000], [3]))

See docs/architecture.md#keys for what the store does with each part (generation checks on absolute
positions, the incarnation rule after a restore).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "BACK_BITS",
    "INC_BITS",
    "MAX_INCARNATIONS",
    "MAX_POSITION",
    "MAX_SHARDS",
    "MAX_WINDOW",
    "POS_BITS",
    "SHARD_BITS",
    "decode_keys",
    "encode_keys",
    "key_incarnations",
]

SHARD_BITS, BACK_BITS, INC_BITS, POS_BITS = 8, 16, 4, 35
MAX_SHARDS = 1 << SHARD_BITS
MAX_WINDOW = 1 << BACK_BITS
MAX_INCARNATIONS = 1 << INC_BITS
MAX_POSITION = 1 << POS_BITS  # a shard's positions are 0 .. MAX_POSITION - 1: an anchor fits POS_BITS bits


def encode_keys(
    shards: np.ndarray, anchors: np.ndarray, back: np.ndarray, incarnation: int = 0
) -> np.ndarray:
    """Keys (int64 [B]) of windows: ``anchor << 28 | incarnation << 24 | back << 8 | shard``."""
    return (
        (np.asarray(anchors, np.int64) << (SHARD_BITS + BACK_BITS + INC_BITS))
        | np.int64((int(incarnation) % MAX_INCARNATIONS) << (SHARD_BITS + BACK_BITS))
        | (np.asarray(back, np.int64) << SHARD_BITS)
        | np.asarray(shards, np.int64)
    )


def decode_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(shard, anchor position, back)`` of each key (see `encode_keys`; `key_incarnations` for the rest)."""
    keys = np.asarray(keys, dtype=np.int64)
    return (
        keys & (MAX_SHARDS - 1),
        keys >> (SHARD_BITS + BACK_BITS + INC_BITS),
        (keys >> SHARD_BITS) & (MAX_WINDOW - 1),
    )


def key_incarnations(keys: np.ndarray) -> np.ndarray:
    """The store incarnation (0..15) each key was drawn in (see `encode_keys`)."""
    return (np.asarray(keys, dtype=np.int64) >> (SHARD_BITS + BACK_BITS)) & (MAX_INCARNATIONS - 1)

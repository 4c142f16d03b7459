"""The bit layout of replay keys: which window of which shard a ``batch.keys`` entry names.

A key (int64) packs, from the low bits up: the window's shard (`SHARD_BITS`), the distance from its
anchor back to its first real step (`BACK_BITS`), the store's incarnation (`INC_BITS`, counted up by
every restore) and the anchor's absolute position in its shard (`POS_BITS`)::

    key = anchor << 28 | incarnation << 24 | back << 8 | shard

>>> from replay.keys import encode_keys, decode_keys
>>> shard, anchor, back = decode_keys(encode_keys([1], [1000], [3]))

Keys also carry the identity of the store that issued them: every store has a random 64-bit
``store_id``, and the ``batch.keys`` tensor a batch hands out bears it as the attribute `ISSUER`
(`stamp_keys`; it survives pickling, not ``.numpy()``, slicing or ``torch.cat``). `check_issuer`
refuses, by name, keys another store issued; keys that bear no issuer (numpy arrays, `encode_keys`,
copies) are taken as the store's own, as before.

See docs/architecture.md#keys for what the store does with each part (generation checks on absolute
positions, the incarnation rule after a restore, issuers and checkpoints).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

import numpy as np

__all__ = [
    "BACK_BITS",
    "INC_BITS",
    "ISSUER",
    "MAX_LINEAGE",
    "MAX_INCARNATIONS",
    "MAX_POSITION",
    "MAX_SHARDS",
    "MAX_WINDOW",
    "POS_BITS",
    "SHARD_BITS",
    "check_issuer",
    "decode_keys",
    "encode_keys",
    "key_incarnations",
    "new_store_id",
    "stamp_keys",
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


MAX_LINEAGE = 64  # ancestor store ids a restored store keeps (keys of older ones are refused as foreign)
ISSUER = "replay_store_id"  # the attribute of a batch's keys tensor naming the store that issued them


def new_store_id() -> int:
    """A fresh random store id in ``[0, 2**64)`` (from the OS, not from any seed: two stores made with
    the same seed still have different ids)."""
    return int.from_bytes(os.urandom(8), "little")


def stamp_keys(keys: Any, store_id: int | None) -> Any:
    """Mark a keys tensor as issued by the store ``store_id`` (nothing for None or a numpy array);
    return it."""
    if store_id is not None and not isinstance(keys, np.ndarray):
        setattr(keys, ISSUER, store_id)
    return keys


def check_issuer(keys: Any, accepted: Collection[int], store_id: int) -> None:
    """Refuse keys issued by another store.

    Parameters
    ----------
    keys : torch.Tensor or array
        The ``keys`` argument of ``update_priorities``; only a tensor stamped by `stamp_keys` bears
        an issuer.
    accepted : collection of int
        The store ids whose keys this store takes: its own and those of the stores it was restored
        from (docs/architecture.md#keys).
    store_id : int
        This store's id (named in the error).

    Raises
    ------
    ValueError
        ``keys`` bear the id of a store not in ``accepted``; the message names the argument, the count
        of foreign keys and both stores.
    """
    issuer = getattr(keys, ISSUER, None)
    if issuer is None or issuer in accepted:
        return
    n = int(keys.numel()) if hasattr(keys, "numel") else int(np.size(keys))
    raise ValueError(
        f"keys: {n} of {n} keys were issued by another replay store (store {issuer:#018x}), not by this "
        f"one (store {store_id:#018x}): pass the keys of batches sampled from this store; nothing was changed"
    )

"""The bit layout of replay keys: which window of which shard a ``batch.keys`` entry names.

A key (int64) packs, from the low bits up: the window's shard (`SHARD_BITS`), the distance from its
anchor back to its first real step (`BACK_BITS`), the store's incarnation (`INC_BITS`, counted up by
every restore) and the anchor's absolute position in its shard (`POS_BITS`)::

    key = anchor << 28 | incarnation << 24 | back << 8 | shard

This module is the layout's one home: `encode_keys` / `decode_keys` / `key_incarnations` for numpy
arrays, and for compiled code the shifts and masks (`POS_SHIFT`, `INC_SHIFT`, `BACK_SHIFT`,
`SHARD_MASK`, `BACK_MASK`, `INC_MASK`) with the numba functions `pack_key`, `key_shard`, `key_back`,
`key_incarnation` and `key_anchor` (inlined where a kernel calls them).

>>> from replay.keys import encode_keys, decode_keys
>>> shard, anchor, back = decode_keys(encode_keys([1], [1000], [3]))

Keys also carry the identity of the store that issued them: every store has a random 64-bit
``store_id``, and ``batch.keys`` is a `ReplayKeys` tensor bearing it as the attribute `ISSUER`
(`stamp_keys`). Its slices, indexing, ``clone``, ``detach``, ``to``, ``torch.cat``/``stack`` and
``.numpy()`` (an `IssuedKeys` array; numpy slices and copies) keep it, and pickling does; a ``cat``
of two stores' keys bears both (`MIXED`). `issuer_applies`, the one issuer rule of every
``update_priorities``, refuses by name keys another store issued, and tells keys of an ancestor
`STALE_GENERATIONS` or more restores back (stale: `issuer_windows`); keys that bear no issuer (plain
arrays, `encode_keys`, ``tolist``) are taken as the store's own and have only the incarnation, mod 16:
16 restores later an old key reads as current.

See docs/architecture.md#keys for what the store does with each part (generation checks on absolute
positions, the incarnation rule after a restore, issuers and checkpoints).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

import numba as nb
import numpy as np
import torch

__all__ = [
    "BACK_BITS",
    "BACK_MASK",
    "BACK_SHIFT",
    "INC_BITS",
    "INC_MASK",
    "INC_SHIFT",
    "ISSUER",
    "IssuedKeys",
    "MIXED",
    "MAX_LINEAGE",
    "MAX_INCARNATIONS",
    "MAX_POSITION",
    "MAX_SHARDS",
    "MAX_WINDOW",
    "POS_BITS",
    "POS_SHIFT",
    "ReplayKeys",
    "STALE_GENERATIONS",
    "plain_tensor_ops",
    "SHARD_BITS",
    "SHARD_MASK",
    "decode_keys",
    "encode_keys",
    "issuer_applies",
    "issuer_windows",
    "key_anchor",
    "key_back",
    "key_incarnation",
    "key_incarnations",
    "key_shard",
    "new_store_id",
    "pack_key",
    "stamp_keys",
]

SHARD_BITS, BACK_BITS, INC_BITS, POS_BITS = 8, 16, 4, 35
MAX_SHARDS = 1 << SHARD_BITS
MAX_WINDOW = 1 << BACK_BITS
MAX_INCARNATIONS = 1 << INC_BITS
MAX_POSITION = 1 << POS_BITS  # a shard's positions are 0 .. MAX_POSITION - 1: an anchor fits POS_BITS bits
# where each part sits: ``(key >> *_SHIFT) & *_MASK`` (the shard at bit 0, the anchor the top bits)
SHARD_MASK = MAX_SHARDS - 1
BACK_SHIFT, BACK_MASK = SHARD_BITS, MAX_WINDOW - 1
INC_SHIFT, INC_MASK = SHARD_BITS + BACK_BITS, MAX_INCARNATIONS - 1
POS_SHIFT = SHARD_BITS + BACK_BITS + INC_BITS


@nb.njit(cache=True, nogil=True, inline="always")
def pack_key(anchor, back, incarnation, shard):  # pragma: no cover - numba
    """One key (int64) in compiled code: `encode_keys` of one window (``incarnation`` mod 16)."""
    return (anchor << POS_SHIFT) | ((incarnation & INC_MASK) << INC_SHIFT) | (back << BACK_SHIFT) | shard


@nb.njit(cache=True, nogil=True, inline="always")
def key_shard(key):  # pragma: no cover - numba
    """A key's shard, in compiled code (`decode_keys`)."""
    return key & SHARD_MASK


@nb.njit(cache=True, nogil=True, inline="always")
def key_back(key):  # pragma: no cover - numba
    """A key's distance from its anchor back to its first real step, in compiled code (`decode_keys`)."""
    return (key >> BACK_SHIFT) & BACK_MASK


@nb.njit(cache=True, nogil=True, inline="always")
def key_incarnation(key):  # pragma: no cover - numba
    """A key's store incarnation (0..15), in compiled code (`key_incarnations`)."""
    return (key >> INC_SHIFT) & INC_MASK


@nb.njit(cache=True, nogil=True, inline="always")
def key_anchor(key):  # pragma: no cover - numba
    """A key's anchor position in its shard, in compiled code (`decode_keys`)."""
    return key >> POS_SHIFT


def encode_keys(
    shards: np.ndarray, anchors: np.ndarray, back: np.ndarray, incarnation: int = 0
) -> np.ndarray:
    """Keys (int64 [B]) of windows: ``anchor << 28 | incarnation << 24 | back << 8 | shard``."""
    return (
        (np.asarray(anchors, np.int64) << POS_SHIFT)
        | np.int64((int(incarnation) % MAX_INCARNATIONS) << INC_SHIFT)
        | (np.asarray(back, np.int64) << BACK_SHIFT)
        | np.asarray(shards, np.int64)
    )


def decode_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(shard, anchor position, back)`` of each key (see `encode_keys`; `key_incarnations` for the rest)."""
    keys = np.asarray(keys, dtype=np.int64)
    return keys & SHARD_MASK, keys >> POS_SHIFT, (keys >> BACK_SHIFT) & BACK_MASK


def key_incarnations(keys: np.ndarray) -> np.ndarray:
    """The store incarnation (0..15) each key was drawn in (see `encode_keys`)."""
    return (np.asarray(keys, dtype=np.int64) >> INC_SHIFT) & INC_MASK


MAX_LINEAGE = 64  # ancestor store ids a restored store keeps (keys of older ones are refused as foreign)
ISSUER = "replay_store_id"  # the attribute of a batch's keys tensor naming the store that issued them


def new_store_id() -> int:
    """A fresh random store id in ``[0, 2**64)`` (from the OS, not from any seed: two stores made with
    the same seed still have different ids)."""
    return int.from_bytes(os.urandom(8), "little")


STALE_GENERATIONS = 16  # keys of an ancestor this many restores back or more are stale (MAX_INCARNATIONS)
MIXED = "mixed"  # an issuer ("mixed", id, id, ...): keys joined from several stores' (refused)
# torch's own idiom inside __torch_function__ (its docs' example); torch gives it no public name
plain_tensor_ops = torch._C.DisableTorchFunctionSubclass


def _issuer_of(items: Any, found: list[Any]) -> None:
    """Append the issuers of the `ReplayKeys` among ``items`` (tensors, lists or tuples of them)."""
    for x in items:
        if type(x) is ReplayKeys:
            found.append(getattr(x, ISSUER, None))
        elif type(x) in (list, tuple):
            _issuer_of(x, found)


def _joined(found: list[Any]) -> Any:
    """One issuer for keys derived from keys of the issuers ``found``: the one, or a `MIXED` marker."""
    ids = set()
    for i in found:
        if type(i) is tuple:
            ids.update(i[1:])
        elif i is not None:
            ids.add(i)
    if len(ids) <= 1:
        return next(iter(ids), None)
    return (MIXED, *sorted(ids))


class ReplayKeys(torch.Tensor):
    """``batch.keys``: int64 [B] keys (`encode_keys`) bearing their store's id as the attribute `ISSUER`.

    Every torch op whose result is an int64 tensor computed from them (indexing, slicing, ``clone``,
    ``detach``, ``to``, ``cat``, ``stack``, ...) returns `ReplayKeys` bearing the same issuer (a
    `MIXED` one for keys of several stores); ``numpy()`` returns an `IssuedKeys` view bearing it.
    Other results, and a plain tensor written in place from them (``add_``, ``copy_``, ``out=``), are
    plain tensors.
    """

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        with plain_tensor_ops():
            out = func(*args, **(kwargs or {}))
        if type(out) is torch.Tensor and out.dtype is torch.int64:
            if any(out is x for x in args) or (kwargs and any(out is x for x in kwargs.values())):
                return out  # a caller's tensor written in place (add_, copy_, out=): kept plain
            found: list[Any] = []
            _issuer_of(args, found)
            if kwargs:
                _issuer_of(kwargs.values(), found)
            return stamp_keys(out, _joined(found))
        if type(out) in (list, tuple) and out and all(type(o) is torch.Tensor for o in out):
            found = []
            _issuer_of(args, found)
            issuer = _joined(found)
            return type(out)(stamp_keys(o, issuer) if o.dtype is torch.int64 else o for o in out)
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> ReplayKeys:
        with plain_tensor_ops():
            out = torch.Tensor.clone(self)
        return stamp_keys(out, getattr(self, ISSUER, None))

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The keys as an `IssuedKeys` array (a view, as ``torch.Tensor.numpy``) bearing the issuer."""
        with plain_tensor_ops():
            arr = torch.Tensor.numpy(self, force=force).view(IssuedKeys)
        setattr(arr, ISSUER, getattr(self, ISSUER, None))
        return arr


class IssuedKeys(np.ndarray):
    """``batch.keys.numpy()``: an int64 array bearing the issuing store's id as `ISSUER`; numpy slices,
    indexing and copies keep it (int64 results only)."""

    def __array_finalize__(self, obj: Any) -> None:
        setattr(self, ISSUER, getattr(obj, ISSUER, None) if self.dtype == np.int64 else None)


def stamp_keys(keys: Any, store_id: Any) -> Any:
    """``keys`` (an int64 tensor, made `ReplayKeys` in place: pass a fresh one) issued by the store
    ``store_id`` (a `MIXED` marker too); return it. Unchanged for None or a numpy array."""
    if store_id is None or isinstance(keys, np.ndarray):
        return keys
    if type(keys) is torch.Tensor:
        keys.__class__ = ReplayKeys  # the same object layout; a new view (as_subclass) costs ~1 us more
    elif type(keys) is not ReplayKeys:
        keys = keys.as_subclass(ReplayKeys)
    setattr(keys, ISSUER, store_id)
    return keys


def issuer_windows(store_id: int, lineage: tuple[int, ...]) -> tuple[frozenset[int], frozenset[int]]:
    """``(fresh, stale)``: the issuers whose keys a store with id ``store_id``, restored from the stores
    ``lineage`` (oldest first, its parent last), applies, and those whose keys it ignores as stale
    (ancestors `STALE_GENERATIONS` or more restores back). Ids in neither are foreign."""
    cut = max(0, len(lineage) - STALE_GENERATIONS + 1)
    return frozenset((store_id, *lineage[cut:])), frozenset(lineage[:cut])


def issuer_applies(keys: Any, fresh: Collection[int], stale: Collection[int], store_id: int) -> bool:
    """The issuer rule of every ``update_priorities`` (docs/architecture.md#keys): whether ``keys`` may
    change priorities (then the generation and incarnation checks decide key by key), or are all stale.

    Parameters
    ----------
    keys : torch.Tensor or array
        The ``keys`` argument; only `ReplayKeys` and `IssuedKeys` bear an issuer (keys without one are
        taken as the store's own).
    fresh, stale : collection of int
        `issuer_windows` of the store: issuers whose keys apply, and ancestors `STALE_GENERATIONS` or
        more restores back, whose keys are all ignored.
    store_id : int
        This store's id (named in the error).

    Returns
    -------
    bool
        True for keys without an issuer or of a fresh one; False for a stale issuer's (the caller
        still checks the arguments, then applies none).

    Raises
    ------
    ValueError
        ``keys`` bear the id of a store in neither set (another store's), or join several stores' keys
        (`MIXED`); the message names the argument, the count of keys and the stores.
    """
    issuer = getattr(keys, ISSUER, None)
    if issuer is None or issuer in fresh:
        return True
    if issuer in stale:
        return False
    raise _foreign(keys, issuer, store_id)


def _foreign(keys: Any, issuer: Any, store_id: int) -> ValueError:
    """The error for keys of the issuer ``issuer`` (another store's id, or a `MIXED` marker)."""
    n = int(keys.numel()) if hasattr(keys, "numel") else int(np.size(keys))
    if type(issuer) is tuple:
        names = " and ".join(f"store {i:#018x}" for i in issuer[1:])
        return ValueError(
            f"keys: {n} keys join the keys of {len(issuer) - 1} replay stores ({names}; this one is store "
            f"{store_id:#018x}): pass the keys of batches sampled from one store; nothing was changed"
        )
    return ValueError(
        f"keys: {n} of {n} keys were issued by another replay store (store {issuer:#018x}), not by this "
        f"one (store {store_id:#018x}): pass the keys of batches sampled from this store; nothing was changed"
    )

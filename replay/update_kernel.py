"""The owner's priority update in one numba call: the checks, the shard floors, the generation check and
the writes.

`update_locked` is what `replay.table.Table.update_priorities` does in Python around
`replay.draw_kernels.apply_updates`, in one call and without allocating: the input check of
`replay.draw_kernels.updates_valid` (keys >= 0 naming a shard, priorities finite, >= 0 and at most
the limit), then for every shard a key names, in shard order, its mutex taken by
`replay.commit_kernel.lock_shard_counted` (a dead holder's commit repaired, as every locker does),
the table's ingest checked against the shard's write position and its floor read, the mutex released;
then `replay.draw_kernels.write_updates` (the generation rule of
docs/architecture.md#keys, the priorities, ``p ** exponent`` into the weight tree and its ancestors).
The caller holds the table lock. It changes nothing on bad input (status `INVALID`: the caller's
checks then name it) and when a named shard has commits the table has not ingested (`STALE`: the
caller ingests them under the shard locks in Python and applies the update there).

The selector's arrays, the table's ``ingested`` and restore stamps, the plan and a scratch come by
address in one int64 array (`update_words`); keys and priorities as arrays, or by address (a CPU
tensor's ``data_ptr()``: int64 keys, float32 or float64 priorities), so a call converts nothing
(`update_args` gives them; numba compiles one variant per kind of each).

>>> words = update_words(plan, state, priority, weights, wtree, size, 0.6, True, limit, ingested,
...                      repairs, scratch, max_priority)
>>> applied = update_locked(words.ctypes.data, *update_args(keys, p))  # -1: outcome(words)

References
----------
Schaul et al., "Prioritized Experience Replay", ICLR 2016 (proportional priorities, sum trees).
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
import torch

from replay.commit_kernel import (
    P_CAPACITY,
    P_FIELDS,
    P_ROW_BYTES,
    P_SHARDS,
    SHARD_WORDS,
    lock_shard_counted,
)
from replay.draw_kernels import updates_valid, write_updates
from replay.keys import MAX_INCARNATIONS, IssuedKeys, ReplayKeys, key_shard, plain_tensor_ops
from replay.shard_layout import META_LEN, WRITE_POS
from replay.sync_kernels import float64_at, int64_at, mutex_unlock, uint8_at

__all__ = [
    "APPLIED",
    "FAILED",
    "INVALID",
    "P_ARRAY",
    "P_FLOAT32",
    "P_FLOAT64",
    "STALE",
    "WORDS",
    "outcome",
    "scratch_for",
    "set_restore",
    "update_args",
    "update_locked",
    "update_words",
]

# update_locked's status
APPLIED, INVALID, STALE, FAILED = 0, 1, 2, 3
# where the priorities are: the array argument, or float64 / float32 at the address argument
P_ARRAY, P_FLOAT64, P_FLOAT32 = 0, 1, 2
_INT64, _FLOAT64 = np.dtype(np.int64), np.dtype(np.float64)  # native order: the dtype objects arrays carry
_T_INT64, _T_FLOAT32, _T_FLOAT64, _STRIDED = torch.int64, torch.float32, torch.float64, torch.strided
# update_words' layout (U_EXPONENT and U_LIMIT hold float64 bits); U_STATUS .. U_DIED: a call's outcome
(U_PLAN, U_PLAN_LEN, U_STATE, U_PRIORITY, U_WEIGHTS, U_WTREE, U_WTREE_COLS, U_SIZE, U_WEIGHTED,
 U_EXPONENT, U_LIMIT, U_INGESTED, U_INCARNATION, U_RESTORED, U_RESTORED_ON, U_REPAIRS, U_SCRATCH,
 U_SCRATCH_LEN, U_MAX_PRIORITY, U_STATUS, U_APPLIED, U_ERR, U_DIED) = range(23)
WORDS = 23


def update_words(
    plan: np.ndarray,
    state: np.ndarray,
    priority: np.ndarray,
    weights: np.ndarray,
    wtree: np.ndarray,
    size: int,
    exponent: float,
    weighted: bool,
    limit: float,
    ingested: np.ndarray,
    repairs: np.ndarray,
    scratch: np.ndarray,
    max_priority: np.ndarray,
) -> np.ndarray:
    """The arrays and numbers `update_locked` takes, by address: int64 [`WORDS`].

    Parameters
    ----------
    plan : numpy.ndarray, int64
        `replay.commit_kernel.build_plan`'s (every shard's mutex and meta).
    state : numpy.ndarray, uint8 [S, C]
        The selector's item states (1: live).
    priority, weights : numpy.ndarray, float64 [S, C]
        The selector's priorities and weight-tree leaves (``weights`` [S, 1] when not ``weighted``).
    wtree : numpy.ndarray, float64 [S, 2 size] (or [S, 1] when not ``weighted``)
        The selector's weight (sum) trees.
    size : int
        Leaves of a tree (`replay.sumtree.tree_size`).
    exponent : float
        The weight of priority p is ``p ** exponent``.
    weighted : bool
        Whether the weight tree is kept (a prioritized selector); else only ``priority`` is written.
    limit : float
        The largest priority taken (`replay.selectors.priority_limit`).
    ingested : numpy.ndarray, int64 [S]
        The table's ingested write position of each shard.
    repairs : numpy.ndarray, int64 [2 S]
        Gets each shard's repaired hole, as `replay.transition_kernel.sample_transitions` writes it.
    scratch : numpy.ndarray, int64 [2 S + K]
        `scratch_for`'s: a call takes at most K keys.
    max_priority : numpy.ndarray, float64 [1]
        The largest priority ever set: a call raises it to the largest it writes.

    Valid while the arrays live and stay where they are (a restore writes into the same arrays and
    calls `set_restore`). The incarnation starts at 0, with no restore.

    Raises
    ------
    ValueError
        An array is not C-contiguous, of another dtype, or of another shape than the plan's S and C
        give (the kernel reads and writes them by address).
    """
    for name, arr, dtype in (
        ("plan", plan, np.int64), ("state", state, np.uint8), ("priority", priority, np.float64),
        ("weights", weights, np.float64), ("wtree", wtree, np.float64), ("ingested", ingested, np.int64),
        ("repairs", repairs, np.int64), ("scratch", scratch, np.int64),
        ("max_priority", max_priority, np.float64),
    ):
        if arr.dtype != dtype or not arr.flags.c_contiguous:
            raise ValueError(
                f"{name} must be a C-contiguous {np.dtype(dtype).name} array, got {arr.dtype} "
                f"(C-contiguous: {arr.flags.c_contiguous})"
            )
    s, c = int(plan[P_SHARDS]), int(plan[P_CAPACITY])
    for name, arr, shape in (
        ("state", state, (s, c)), ("priority", priority, (s, c)),
        ("weights", weights, (s, c if weighted else 1)), ("wtree", wtree, (s, 2 * size if weighted else 1)),
        ("ingested", ingested, (s,)), ("repairs", repairs, (2 * s,)), ("max_priority", max_priority, (1,)),
    ):
        if arr.shape != shape:
            raise ValueError(f"{name} has shape {arr.shape}, expected {shape} (the plan's S={s}, C={c})")
    if scratch.size < 2 * s:
        raise ValueError(f"scratch holds {scratch.size} words, fewer than 2 S = {2 * s} (see scratch_for)")
    words = np.zeros(WORDS, dtype=np.int64)
    words[U_PLAN], words[U_PLAN_LEN] = plan.ctypes.data, plan.size
    words[U_STATE], words[U_PRIORITY] = state.ctypes.data, priority.ctypes.data
    words[U_WEIGHTS], words[U_WTREE] = weights.ctypes.data, wtree.ctypes.data
    words[U_WTREE_COLS] = wtree.shape[1]
    words[U_SIZE], words[U_WEIGHTED] = size, int(weighted)
    floats = words.view(np.float64)
    floats[U_EXPONENT], floats[U_LIMIT] = exponent, limit
    words[U_INGESTED], words[U_REPAIRS] = ingested.ctypes.data, repairs.ctypes.data
    words[U_SCRATCH], words[U_SCRATCH_LEN] = scratch.ctypes.data, scratch.size
    words[U_MAX_PRIORITY] = max_priority.ctypes.data
    return words


def outcome(words: np.ndarray) -> tuple[int, int, int, int]:
    """``(status, applied, err, died)`` of the last `update_locked` call with ``words`` (its return
    value says whether it is needed)."""
    status, applied, err, died = words[U_STATUS : U_DIED + 1].tolist()
    return status, applied, err, died


def scratch_for(words: np.ndarray, num_shards: int, keys: int) -> np.ndarray:
    """A scratch (int64 [2 S + keys]) for calls of up to ``keys`` keys, its address set in ``words``;
    the caller keeps it alive while ``words`` is used."""
    scratch = np.zeros(2 * num_shards + max(0, keys), dtype=np.int64)
    words[U_SCRATCH], words[U_SCRATCH_LEN] = scratch.ctypes.data, scratch.size
    return scratch


def set_restore(words: np.ndarray, incarnation: int, restored_at: np.ndarray | None) -> None:
    """Set the table's incarnation and its restored write positions (int64 [S], kept alive by the
    caller; None: no restore) in ``words``.

    Raises
    ------
    ValueError
        ``restored_at`` is not a C-contiguous int64 array (the kernel reads it by address).
    """
    words[U_INCARNATION] = int(incarnation) % MAX_INCARNATIONS
    if restored_at is None:
        words[U_RESTORED], words[U_RESTORED_ON] = 0, 0
        return
    if restored_at.dtype != np.int64 or not restored_at.flags.c_contiguous:
        raise ValueError(
            f"restored_at must be a C-contiguous int64 array, got {restored_at.dtype} "
            f"(C-contiguous: {restored_at.flags.c_contiguous})"
        )
    words[U_RESTORED], words[U_RESTORED_ON] = restored_at.ctypes.data, 1


def update_args(keys: Any, priorities: Any) -> tuple[Any, Any, int, int] | None:
    """`update_locked`'s arguments after ``words``, ``(keys, p, p_kind, n)``, without converting
    anything: int64 keys and float32 or float64 priorities of the same length, each a contiguous CPU
    tensor (its address: valid while the caller holds it) or a numpy array (1-D, or C-contiguous;
    float64 for priorities); else None (the caller converts and checks them). `replay.keys.ReplayKeys`
    and `replay.keys.IssuedKeys` keys count as tensors and arrays (their issuer is not checked here)."""
    tk = type(keys)
    if tk is ReplayKeys or tk is torch.Tensor:
        with plain_tensor_ops():  # ReplayKeys' accessors without its __torch_function__
            if keys.dtype is not _T_INT64 or keys.layout is not _STRIDED or not keys.is_cpu:
                return None
            if not keys.is_contiguous():
                return None
            k, n = keys.data_ptr(), keys.numel()
    else:
        if tk is IssuedKeys:
            keys = keys.view(np.ndarray)
        elif tk is not np.ndarray:
            return None
        if keys.dtype is not _INT64:
            return None
        if keys.ndim != 1:
            if not keys.flags.c_contiguous:
                return None
            keys = keys.reshape(-1)
        k, n = keys, keys.shape[0]
    tp = type(priorities)
    if tp is np.ndarray:
        if priorities.dtype is not _FLOAT64 or priorities.size != n:
            return None
        if priorities.ndim != 1:
            if not priorities.flags.c_contiguous:
                return None
            priorities = priorities.reshape(-1)
        return k, priorities, P_ARRAY, n
    if tp is torch.Tensor:
        dtype = priorities.dtype
        kind = P_FLOAT32 if dtype is _T_FLOAT32 else P_FLOAT64 if dtype is _T_FLOAT64 else P_ARRAY
        if kind == P_ARRAY or priorities.layout is not _STRIDED or not priorities.is_cpu:
            return None
        if priorities.numel() != n or not priorities.is_contiguous():
            return None
        return k, priorities.data_ptr(), kind, n
    return None


@nb.njit(cache=True, nogil=True)
def update_locked(words_at, keys, p, p_kind, n):  # pragma: no cover - numba
    """Apply ``n`` priority updates (see the module docstring); the caller holds the table lock.

    Parameters
    ----------
    words_at : int
        The address of `update_words`' array (``words.ctypes.data``; the caller keeps it alive).
    keys : numpy.ndarray, int64 [n], or int
        The keys, or the address of ``n`` int64 keys.
    p : numpy.ndarray, float64 [n], or int
        The priorities (``p_kind`` `P_ARRAY`), or the address of ``n`` float64 (`P_FLOAT64`) or
        float32 (`P_FLOAT32`) priorities.
    n : int
        The number of updates, at most the scratch's K (more raises ``ValueError``).

    Returns
    -------
    int
        The updates applied (a key given twice counted twice) when the status is `APPLIED` and no
        mutex had a dead holder; else -1, and `outcome` gives ``(status, applied, err, died)``:
        status `APPLIED`, `INVALID` (a bad key or priority: nothing taken or changed), `STALE` (a
        named shard has commits not ingested: nothing changed) or `FAILED` (a pthread call failed, its
        errno in ``err``: the mutexes this call took are released, nothing changed); ``died`` counts
        the mutexes found with a dead holder (their repairs are in ``repairs``).
    """
    # numba compiles one variant per kind (array or address) of keys and of p: the isinstance
    # branches are decided when it compiles, and the others dropped
    words = int64_at(words_at, WORDS)
    k = int64_at(keys, n) if isinstance(keys, int) else keys[:n]
    if not isinstance(p, int):
        return _update(words, k, p[:n])
    if p_kind == P_FLOAT32:
        return _update(words, k, uint8_at(p, 4 * n).view(np.float32))
    return _update(words, k, float64_at(p, n))


@nb.njit(cache=True, nogil=True)
def _update(words, keys, p):  # pragma: no cover - numba
    """`update_locked` on arrays."""
    plan = int64_at(words[U_PLAN], words[U_PLAN_LEN])
    s_count = plan[P_SHARDS]
    capacity = plan[P_CAPACITY]
    nf = plan[P_FIELDS]
    floats = words.view(np.float64)
    if not updates_valid(keys, p, s_count, floats[U_LIMIT]):
        return _outcome(words, INVALID, 0, 0, 0)
    if words[U_SCRATCH_LEN] < 2 * s_count + keys.shape[0]:
        raise ValueError("update_locked: the scratch holds fewer than 2 S + K words (see scratch_for)")
    scratch = int64_at(words[U_SCRATCH], words[U_SCRATCH_LEN])
    floors = scratch[:s_count]  # -1: a shard no key names
    if s_count == 1:
        floors[0] = 0 if keys.shape[0] > 0 else -1
    else:
        floors[:] = -1
        for i in range(keys.shape[0]):
            floors[key_shard(keys[i])] = 0
    ingested = int64_at(words[U_INGESTED], s_count)
    repairs = int64_at(words[U_REPAIRS], 2 * s_count)
    died = 0
    for s in range(s_count):  # each named shard's floor, read under its mutex
        if floors[s] < 0:
            continue
        base = P_ROW_BYTES + nf + s * (SHARD_WORDS + nf)
        err, dead = lock_shard_counted(plan, s, repairs)  # a dead holder's hole repaired
        died += dead
        if err:  # the mutex not held
            return _outcome(words, FAILED, 0, err, died)
        written = int64_at(plan[base + 1], META_LEN)[WRITE_POS]
        mutex_unlock(plan[base])
        if written != ingested[s]:
            return _outcome(words, STALE, 0, 0, died)
        floors[s] = max(0, written - capacity)
    size = words[U_SIZE]
    wcols = words[U_WTREE_COLS]
    leaves = capacity if words[U_WEIGHTED] else 1  # the weights' columns: [S, 1] when not weighted
    restored = int64_at(words[U_RESTORED], s_count if words[U_RESTORED_ON] else 0)
    applied, top = write_updates(
        keys, p, capacity, floors, ingested, words[U_INCARNATION], restored,
        uint8_at(words[U_STATE], (s_count, capacity)),
        float64_at(words[U_PRIORITY], (s_count, capacity)),
        float64_at(words[U_WEIGHTS], (s_count, leaves)),
        float64_at(words[U_WTREE], (s_count, wcols)),
        size, floats[U_EXPONENT], words[U_WEIGHTED] != 0, scratch[s_count:],
    )
    top_at = float64_at(words[U_MAX_PRIORITY], 1)
    if top > top_at[0]:
        top_at[0] = top
    if died:
        return _outcome(words, APPLIED, applied, 0, died)
    return applied


@nb.njit(cache=True, nogil=True)
def _outcome(words, status, applied, err, died):  # pragma: no cover - numba
    """Record a call's outcome in ``words`` (`outcome` reads it); return -1."""
    words[U_STATUS], words[U_APPLIED], words[U_ERR], words[U_DIED] = status, applied, err, died
    return -1

"""The frame of a compiled draw under the shard locks: the locks, the selector by address, the count.

`replay.transition_kernel` (transitions) and `replay.window_kernel` (short windows) each draw and copy
a batch in one numba call with the table lock (taken in Python) and every shard mutex held, so no
writer overwrites a ring slot during the copy. This module is what both calls share around their own
draw and copy:

- `lock_shards` takes every shard mutex in shard order (`replay.commit_kernel.lock_shard_counted`:
  a hole a dead writer's commit left repaired, as every locker does) and
  checks that the table has ingested every commit (`STALE` otherwise: the caller takes the shard
  locks in Python, ingests, and calls again with ``held`` True); `unlock_shards` undoes it;
- `selector_words` gives the selector's generator, trees and use counts by address, `selector` reads
  them back as arrays in a kernel and `uniforms` draws from the generator as ``Generator.random`` does;
- `release` unlocks the shards and counts the sampled steps under the control mutex with a wake-up
  (`replay.rate_limiter.RateLimiterState.sample`).

The plan is `replay.commit_kernel.build_plan`'s. A draw returns one of the status codes `DRAWN`,
`EMPTY`, `STALE`, `FAILED`.

>>> words = selector_words(generator, ctree, wtree, False, size, filled, times, written)
>>> status, err, died = lock_shards(plan, False, repairs, selector(words, s_count, capacity)[6])
>>> status, err, more = release(plan, False, steps)
"""

from __future__ import annotations

import ctypes

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from replay.commit_kernel import (
    P_CTL,
    P_CTL_COND,
    P_CTL_MUTEX,
    P_FIELDS,
    P_ROW_BYTES,
    P_SHARDS,
    SHARD_WORDS,
    lock_shard_counted,
)
from replay.rate_limiter import SAMPLES
from replay.shard_layout import META_LEN, WRITE_POS
from replay.sync_kernels import cond_broadcast, float64_at, int64_at, mutex_lock_robust, mutex_unlock

__all__ = [
    "DRAWN",
    "EMPTY",
    "FAILED",
    "STALE",
    "WORDS",
    "lock_shards",
    "release",
    "selector",
    "selector_words",
    "uniforms",
    "unlock_shards",
]

# a locked draw's status
DRAWN, EMPTY, STALE, FAILED = 0, 1, 2, 3
# selector_words' layout
(W_RNG_NEXT_DOUBLE, W_RNG_STATE, W_CTREE, W_WTREE, W_WTREE_COLS, W_TIMES, W_FILLED, W_WRITTEN, W_SIZE,
 W_PRIORITIZED) = range(10)
WORDS = 10


def selector_words(
    generator: np.random.Generator,
    ctree: np.ndarray,
    wtree: np.ndarray,
    prioritized: bool,
    size: int,
    filled: np.ndarray,
    times: np.ndarray,
    written: np.ndarray,
) -> np.ndarray:
    """The selector's side of a locked draw, by address: int64 [`WORDS`].

    ``generator``'s bit generator's ``next_double`` function and state (``bit_generator.ctypes``), then
    the arrays and numbers `replay.draw_kernels.draw_items` takes (``ctree`` and ``wtree`` float64
    [S, *], ``times`` int64 [S, C], ``filled`` and ``written`` int64 [S], all C-contiguous). Valid while
    they live and stay where they are: a restore must write into the same arrays and the same generator.

    Raises
    ------
    ValueError
        An array is not C-contiguous or of another dtype.
    """
    for name, arr, dtype in (
        ("ctree", ctree, np.float64), ("wtree", wtree, np.float64), ("times", times, np.int64),
        ("filled", filled, np.int64), ("written", written, np.int64),
    ):
        if arr.dtype != dtype or not arr.flags.c_contiguous:
            raise ValueError(f"{name} must be a C-contiguous {np.dtype(dtype).name} array")
    words = np.zeros(WORDS, dtype=np.int64)
    c = generator.bit_generator.ctypes
    words[W_RNG_NEXT_DOUBLE] = ctypes.cast(c.next_double, ctypes.c_void_p).value
    words[W_RNG_STATE] = c.state_address
    words[W_CTREE], words[W_WTREE] = ctree.ctypes.data, wtree.ctypes.data
    words[W_WTREE_COLS] = wtree.shape[1]
    words[W_TIMES], words[W_FILLED] = times.ctypes.data, filled.ctypes.data
    words[W_WRITTEN] = written.ctypes.data
    words[W_SIZE], words[W_PRIORITIZED] = size, int(prioritized)
    return words


@intrinsic
def _call_double(typingctx, fn, state):  # pragma: no cover - compiled
    """``((double (*)(void *)) fn)(state)``: one ``next_double`` of a numpy bit generator."""
    sig = types.float64(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.DoubleType(), [i8p])
        f = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(f, [builder.inttoptr(args[1], i8p)])

    return sig, codegen


@nb.njit(cache=True, nogil=True)
def uniforms(words, k):  # pragma: no cover - numba
    """``k`` uniforms (float64 [k]) in [0, 1) from the selector's generator (``words``, `selector_words`),
    as ``Generator.random(k)`` fills them (``next_double`` of its bit generator, in order)."""
    u = np.empty(k)
    fn, state = words[W_RNG_NEXT_DOUBLE], words[W_RNG_STATE]
    for i in range(k):
        u[i] = _call_double(fn, state)
    return u


@nb.njit(cache=True, nogil=True)
def selector(words, s_count, capacity):  # pragma: no cover - numba
    """The selector's arrays from `selector_words`: ``(ctree, wtree, prioritized, size, filled, times,
    written)`` as `replay.draw_kernels.draw_items` takes them (``written`` int64 [S] last), for
    ``s_count`` shards of ``capacity`` slots."""
    size = words[W_SIZE]
    wcols = words[W_WTREE_COLS]
    return (
        float64_at(words[W_CTREE], s_count * 2 * size).reshape((s_count, 2 * size)),
        float64_at(words[W_WTREE], s_count * wcols).reshape((s_count, wcols)),
        words[W_PRIORITIZED] != 0,
        size,
        int64_at(words[W_FILLED], s_count),
        int64_at(words[W_TIMES], s_count * capacity).reshape((s_count, capacity)),
        int64_at(words[W_WRITTEN], s_count),
    )


@nb.njit(cache=True, nogil=True)
def lock_shards(plan, held, repairs, written):  # pragma: no cover - numba
    """Every shard mutex taken in shard order (unless ``held``), a dead holder's hole repaired, and the
    check that the selector has ingested every commit (``written`` int64 [S]). ``repairs`` int64 [2 S]
    gets, per shard s, the repaired hole's first position and length (only where a holder died).
    Returns ``(status, err, died)``: `DRAWN` with every mutex held, or `STALE` / `FAILED` (errno in
    ``err``) with none held; ``died`` counts the mutexes found with a dead holder."""
    s_count = plan[P_SHARDS]
    nf = plan[P_FIELDS]
    died = 0
    if held:
        return DRAWN, 0, died
    for s in range(s_count):  # an unlocked read, only a hint: commits to ingest, no lock taken
        meta = int64_at(plan[P_ROW_BYTES + nf + s * (SHARD_WORDS + nf) + 1], META_LEN)
        if meta[WRITE_POS] != written[s]:
            return STALE, 0, died
    for s in range(s_count):
        err, dead = lock_shard_counted(plan, s, repairs)
        died += dead
        if err:  # shard s's mutex not held
            unlock_shards(plan, s)
            return FAILED, err, died
    for s in range(s_count):
        meta = int64_at(plan[P_ROW_BYTES + nf + s * (SHARD_WORDS + nf) + 1], META_LEN)
        if meta[WRITE_POS] != written[s]:
            unlock_shards(plan, s_count)
            return STALE, 0, died
    return DRAWN, 0, died


@nb.njit(cache=True, nogil=True)
def unlock_shards(plan, n):  # pragma: no cover - numba
    """Unlock the mutexes of shards ``n - 1 .. 0`` (in that order)."""
    nf = plan[P_FIELDS]
    for s in range(n - 1, -1, -1):
        mutex_unlock(plan[P_ROW_BYTES + nf + s * (SHARD_WORDS + nf)])


@nb.njit(cache=True, nogil=True)
def release(plan, held, count):  # pragma: no cover - numba
    """The end of a locked draw after the copy: the shard mutexes unlocked (unless ``held``), then
    ``count`` steps (> 0) counted as sampled under the control mutex with a wake-up. Returns
    ``(status, err, died)``: `DRAWN`, or `FAILED` with the control mutex's errno."""
    if not held:
        unlock_shards(plan, plan[P_SHARDS])
    if count <= 0:
        return DRAWN, 0, 0
    ctl_mutex = plan[P_CTL_MUTEX]
    rc = mutex_lock_robust(ctl_mutex)
    if rc < 0:
        return FAILED, -rc, 0
    ctl = int64_at(plan[P_CTL], SAMPLES + 1)
    ctl[SAMPLES] += count
    cond_broadcast(plan[P_CTL_COND])
    mutex_unlock(ctl_mutex)
    return DRAWN, 0, rc

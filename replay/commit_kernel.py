"""The numba kernels of a shard commit: the data half (`write_steps`) and the whole protocol (`commit_chunk`).

- `write_steps` is the data half of `replay.shard.ShardStorage.commit` (called with the shard lock
  held, after the reserve position is published): it counts the live items the chunk overwrites,
  copies the chunk's rows of every raw field into the rings as one flat byte run each (two when the run
  wraps past the ring's end; none when every field has a codec) and writes each slot's
  record id, commit sequence number and flags.
- `commit_chunk` runs the three steps of `replay.storage.TrajectoryStorage.commit` in one call, with the
  same locks (through `replay.sync_kernels`): admission and shard choice under the control mutex,
  the shard commit under the shard mutex (repairing a dead holder's commit first), the counts and the
  wake-up under the control mutex with the shard mutex still held. A call the rate limiter does not
  admit returns `BLOCKED` having changed nothing; the caller then takes the Python path, which waits.
- `lock_shard` takes a shard's mutex as every compiled locker does (a dead holder's commit repaired
  by `repair_hole`); `lock_shard_counted` also counts that commit's lost items as deleted at once
  (`replay.locked_draw`, `replay.update_kernel`).

>>> overwritten = write_steps(rings, srcs, row_bytes, capacity, first, count, steps, record, seq, lo, hi)
>>> status, shard, record, overwritten, died, hole_at, hole = commit_chunk(plan, sources, count, -1, -1,
...     True, writer_id, samples_per_insert, max_diff, os.getpid())

The plan (`build_plan`) is one int64 array of addresses and sizes, built once per storage: the
control mutex, condition and counters, then per shard its mutex, meta, step index, records and rings.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels import copy_bytes, store_fence, stream_bytes_nofence
from replay.control import CTL_FIXED, GSEQ, QUIESCE
from replay.keys import MAX_POSITION
from replay.rate_limiter import CANCELLED, DELETES, INSERTS, SAMPLES
from replay.shard_layout import (
    COMMITS,
    CONTINUATION,
    HOLE_END,
    HOLES,
    META_LEN,
    N_RECORDS,
    OPEN,
    OWNER_SHIFT,
    REC_FLAGS,
    REC_ID,
    REC_LENGTH,
    REC_START,
    RESERVE_DELETES,
    RESERVE_POS,
    WRITE_POS,
)
from replay.sync_kernels import (
    compiler_fence,
    cond_broadcast,
    copy_at,
    int64_at,
    mutex_lock_robust,
    mutex_unlock,
    uint8_at,
)

__all__ = [
    "BLOCKED",
    "FAILED",
    "OK",
    "OVERFLOW",
    "P_CAPACITY",
    "P_CTL",
    "P_CTL_COND",
    "P_CTL_MUTEX",
    "P_FIELDS",
    "P_MIN_SIZE",
    "P_ROW_BYTES",
    "P_SHARDS",
    "SHARD_WORDS",
    "STREAM_RUN_BYTES",
    "build_plan",
    "commit_chunk",
    "count_deletes_locked",
    "count_overwritten",
    "lock_shard",
    "lock_shard_counted",
    "plan_layout",
    "repair_hole",
    "write_steps",
]

STREAM_RUN_BYTES = 1 << 16  # a commit's run of a field at least this long is written with streaming stores

# commit_chunk's status
OK, BLOCKED, OVERFLOW, FAILED = 0, 1, 2, 3
# the plan: fixed words, then row bytes per field, then SHARD_WORDS + fields words per shard
P_CTL_MUTEX, P_CTL_COND, P_CTL, P_SHARDS, P_CAPACITY, P_FIELDS, P_MIN_SIZE, P_ROW_BYTES = range(8)
SHARD_WORDS = 4  # mutex, meta, steps, records (then one ring address per field)


def plan_layout(num_shards: int, num_fields: int) -> int:
    """Words (int64) of a plan for ``num_shards`` shards of ``num_fields`` fields."""
    return P_ROW_BYTES + num_fields + num_shards * (SHARD_WORDS + num_fields)


def build_plan(
    control: tuple[int, int, int],
    shards: list[tuple[int, ...]],
    row_bytes: list[int],
    capacity: int,
    min_size: int,
) -> np.ndarray:
    """The plan `commit_chunk` reads: int64 [`plan_layout`].

    Parameters
    ----------
    control : (int, int, int)
        Addresses of the control mutex, condition and int64 words (`replay.control.Control.addresses`).
    shards : list of tuple of int
        Per shard, the addresses of its mutex, meta, step index, records and rings in field order
        (`replay.shard.ShardStorage.addresses`).
    row_bytes : list of int
        Bytes of one step of each field, in field order.
    capacity : int
        Steps per shard ring.
    min_size : int
        The rate limiter's ``min_size``.

    Returns
    -------
    numpy.ndarray, int64, shape [plan_layout(len(shards), len(row_bytes))]
        Valid while the control and shard regions stay mapped in this process; nothing is checked.
    """
    nf = len(row_bytes)
    plan = np.zeros(plan_layout(len(shards), nf), dtype=np.int64)
    plan[P_CTL_MUTEX], plan[P_CTL_COND], plan[P_CTL] = control
    plan[P_SHARDS], plan[P_CAPACITY], plan[P_FIELDS], plan[P_MIN_SIZE] = len(shards), capacity, nf, min_size
    plan[P_ROW_BYTES : P_ROW_BYTES + nf] = row_bytes
    for i, words in enumerate(shards):
        start = P_ROW_BYTES + nf + i * (SHARD_WORDS + nf)
        plan[start : start + SHARD_WORDS + nf] = words
    return plan


@nb.njit(cache=True, nogil=True)
def count_overwritten(steps, capacity, lo, hi):  # pragma: no cover - numba
    """Items among the live positions ``lo .. hi - 1`` that a commit overwrites: int.

    ``steps`` (int64 [C, 3]): per slot record id (-1: a hole), sequence number, flags; an item is a
    slot that is not a hole and was not removed by ``max_times_sampled`` (flag 1).
    """
    overwritten = 0
    for p in range(lo, hi):
        c = p % capacity
        if steps[c, 0] >= 0 and (steps[c, 2] & 1) == 0:
            overwritten += 1
    return overwritten


@nb.njit(cache=True, nogil=True)
def repair_hole(meta, steps, capacity):  # pragma: no cover - numba
    """Repair the commit a dead writer left half done (the shard mutex held, its holder found dead).

    The reserved positions ``WRITE_POS .. RESERVE_POS - 1`` become a hole: no record (-1), counted in
    ``HOLES``, ``HOLE_END`` moved past them, ``WRITE_POS`` moved to ``RESERVE_POS``; the commit's
    ``RESERVE_DELETES`` is taken (cleared). Nothing changes when nothing was reserved.

    Parameters
    ----------
    meta : numpy.ndarray, int64 [META_LEN]
        The shard's meta words (`replay.shard_layout`).
    steps : numpy.ndarray, int64 [3 C]
        The shard's step index, flat (record id, sequence number, flags per slot).
    capacity : int
        C, slots of the ring.

    Returns
    -------
    ``(hole_at, hole, lost)``, all int: the hole's first position and length (0: none), and the items
    the dead commit overwrote, which the caller counts as deleted (the control block's ``DELETES``).
    """
    wp, rp = meta[WRITE_POS], meta[RESERVE_POS]
    if rp <= wp:
        return wp, 0, 0
    for p in range(wp, rp):
        steps[(p % capacity) * 3] = -1
    meta[HOLES] += rp - wp
    meta[HOLE_END] = rp
    meta[WRITE_POS] = rp
    lost = meta[RESERVE_DELETES]
    meta[RESERVE_DELETES] = 0
    return wp, rp - wp, lost


@nb.njit(cache=True, nogil=True)
def count_deletes_locked(plan, n):  # pragma: no cover - numba
    """Count ``n`` deleted items in the control block under its mutex and wake its waiters (a shard
    mutex may be held: the store's lock order is a shard, then the control block).

    Returns
    -------
    int
        0, 1 when the control mutex's holder had died (now consistent), or -errno (nothing counted).
    """
    rc = mutex_lock_robust(plan[P_CTL_MUTEX])
    if rc < 0:
        return rc
    int64_at(plan[P_CTL], DELETES + 1)[DELETES] += n
    cond_broadcast(plan[P_CTL_COND])
    mutex_unlock(plan[P_CTL_MUTEX])
    return rc


@nb.njit(cache=True, nogil=True)
def lock_shard(plan, s):  # pragma: no cover - numba
    """Take shard ``s``'s mutex (robust), and when its holder had died mid-commit repair the hole that
    commit left (`repair_hole`): the one way every compiled locker of a shard takes it.

    Returns
    -------
    ``(rc, hole_at, hole, lost)``, all int: ``rc`` 0 (taken), 1 (taken from a dead holder: ``hole``
    steps from position ``hole_at`` repaired, ``lost`` the items the dead commit overwrote, which the
    caller counts as deleted) or -errno (not taken, nothing changed; the rest 0).
    """
    nf = plan[P_FIELDS]
    capacity = plan[P_CAPACITY]
    base = P_ROW_BYTES + nf + s * (SHARD_WORDS + nf)
    rc = mutex_lock_robust(plan[base])
    if rc != 1:
        return rc, 0, 0, 0
    hole_at, hole, lost = repair_hole(
        int64_at(plan[base + 1], META_LEN), int64_at(plan[base + 2], 3 * capacity), capacity
    )
    return rc, hole_at, hole, lost


@nb.njit(cache=True, nogil=True)
def lock_shard_counted(plan, s, repairs):  # pragma: no cover - numba
    """`lock_shard`, then a dead holder's hole written to ``repairs[2 s]`` (first position) and
    ``repairs[2 s + 1]`` (length; int64 [2 S]) and its lost items counted as deleted at once
    (`count_deletes_locked`), for a locker that does not count in the control block itself.

    Returns
    -------
    ``(err, died)``, both int: ``err`` 0 with the shard mutex held, or the errno of the failed lock
    call with it not held; ``died`` counts the mutexes found with a dead holder (the shard's, the
    control block's).
    """
    rc, hole_at, hole, lost = lock_shard(plan, s)
    if rc < 0:
        return -rc, 0
    if rc == 0:
        return 0, 0
    repairs[2 * s], repairs[2 * s + 1] = hole_at, hole
    if not lost:
        return 0, 1
    rc = count_deletes_locked(plan, lost)
    if rc < 0:
        nf = plan[P_FIELDS]
        mutex_unlock(plan[P_ROW_BYTES + nf + s * (SHARD_WORDS + nf)])
        return -rc, 1
    return 0, 1 + rc


@nb.njit(cache=True, nogil=True)
def write_steps(
    rings, srcs, row_bytes, capacity, first, count, steps, record, seq_base, lo, hi
):  # pragma: no cover - numba
    """Commit rows ``[0, count)`` of ``srcs`` at slot ``first`` of ``rings`` (flat uint8, per field).

    ``rings`` and ``srcs`` are tuples (or typed lists) of each raw field's bytes, ``row_bytes[j]`` a row,
    the run wrapping past ``capacity``; empty tuples when every field has a codec (`replay.chunk_codec`
    stores them). ``steps`` (int64 [C, 3]): per slot record id, sequence number, flags. Positions
    ``lo .. hi - 1`` are the live ones being overwritten; returns how many of them were items
    (`count_overwritten`).

    Numba reads ``len`` of a tuple argument as a constant and drops the branch it rules out before
    typing, so the ``len(rings) > 0`` test keeps the copy of an empty tuple from being typed
    (``getitem(Tuple(), int64)`` does not exist). Every raw-field loop of the replay kernels takes the
    empty case so (`replay.windows.gather_fields`, `replay.batch_kernels.gather_rows`); the test sits in
    the function that receives the tuple: an ``inline="always"`` callee is typed before it is dropped.
    """
    overwritten = count_overwritten(steps, capacity, lo, hi)
    if len(rings) > 0:  # an empty tuple (no raw field): a constant, so numba drops the loop untyped
        n1 = min(count, capacity - first)
        for j in range(row_bytes.shape[0]):
            rb = row_bytes[j]
            copy_bytes(rings[j], first * rb, srcs[j], 0, n1 * rb)
            if count > n1:
                copy_bytes(rings[j], 0, srcs[j], n1 * rb, (count - n1) * rb)
    for i in range(count):
        c = first + i
        if c >= capacity:
            c -= capacity
        steps[c, 0] = record
        steps[c, 1] = seq_base + i
        steps[c, 2] = 0
    return overwritten


@nb.njit(cache=True, nogil=True, inline="always")
def _ring_copy(dst, src, nbytes):  # pragma: no cover - numba
    """``memcpy(dst, src, nbytes)`` between addresses, with streaming stores from `STREAM_RUN_BYTES` on
    (a ring is not read back soon: the stores skip the cache and the line reads before each write).
    Returns whether it streamed (the caller fences once, `graphrl.kernels.store_fence`)."""
    if nbytes >= STREAM_RUN_BYTES:
        stream_bytes_nofence(uint8_at(dst, nbytes), 0, uint8_at(src, nbytes), 0, nbytes)
        return True
    copy_at(dst, src, nbytes)
    return False


@nb.njit(cache=True, nogil=True)
def commit_chunk(
    plan, sources, count, shard, record, end, writer_id, samples_per_insert, max_diff, pid
):  # pragma: no cover - numba
    """Commit rows ``[0, count)`` of a writer's staging buffers as one call (locks taken inside).

    Parameters
    ----------
    plan : numpy.ndarray, int64 [plan_layout(S, F)]
        `build_plan`'s addresses and sizes.
    sources : numpy.ndarray, int64 [1 + F]
        Rows of the staging buffers, then each field's buffer address
        (`replay.storage.TrajectoryStorage.sources`).
    count : int
        Steps, in [1, min(rows, capacity)] (not checked).
    shard, record : int
        The writer's open episode, or -1, -1 for a new one.
    end : bool
        The episode ends with these steps.
    writer_id : int
        Rotates ties in the choice of a new episode's shard.
    samples_per_insert, max_diff : float
        The rate limiter's; admission is `replay.rate_limiter.RateLimiter.can_insert` of one step
        (``min_size`` from the plan).
    pid : int
        The writer's process, stamped on a new record (`OWNER_SHIFT`).

    Returns
    -------
    ``(status, shard, record, overwritten, died, hole_at, hole)``, all int: status `OK`, `BLOCKED`
    (not admitted, closed, or a checkpoint holds the writers, `replay.control.QUIESCE`: nothing
    changed), `OVERFLOW` (the shard would reach 2^35 positions, `replay.keys.MAX_POSITION`: the
    control block gave out the sequence numbers, nothing was written or counted, as the Python path)
    or `FAILED` (a pthread call failed: its errno in ``overwritten``); ``died`` counts mutexes found
    with a dead holder, and ``hole`` steps from position ``hole_at`` are the hole a dead writer's
    commit left (repaired; the items that commit had overwritten are counted as deleted).
    """
    s_count = plan[P_SHARDS]
    cap = plan[P_CAPACITY]
    nf = plan[P_FIELDS]
    ctl_mutex = plan[P_CTL_MUTEX]
    ctl = int64_at(plan[P_CTL], CTL_FIXED + 2 * s_count)
    died = 0
    # 1. admission, shard, sequence numbers (control mutex)
    rc = mutex_lock_robust(ctl_mutex)
    if rc < 0:
        return FAILED, -1, -1, -rc, died, 0, 0
    died += rc
    ins, smp, dels = ctl[INSERTS], ctl[SAMPLES], ctl[DELETES]
    admitted = ctl[CANCELLED] == 0 and ctl[QUIESCE] == 0 and (  # QUIESCE: a checkpoint holds writers
        ins + 1 - dels <= plan[P_MIN_SIZE] or (ins + 1) * samples_per_insert - smp <= max_diff
    )
    if not admitted:
        mutex_unlock(ctl_mutex)
        return BLOCKED, -1, -1, 0, died, 0, 0
    new_episode = shard < 0
    if new_episode:
        shard = 0
        if s_count > 1:  # fewest open episodes, then fewest steps assigned; ties rotate with the writer
            shard = writer_id % s_count
            for k in range(1, s_count):
                i = (k + writer_id) % s_count
                o, b = ctl[CTL_FIXED + s_count + i], ctl[CTL_FIXED + s_count + shard]
                if o < b or (o == b and ctl[CTL_FIXED + i] < ctl[CTL_FIXED + shard]):
                    shard = i
        if not end:
            ctl[CTL_FIXED + s_count + shard] += 1
    seq_base = ctl[GSEQ]
    ctl[GSEQ] = seq_base + count
    mutex_unlock(ctl_mutex)
    # 2. the shard commit (shard mutex)
    base = P_ROW_BYTES + nf + shard * (SHARD_WORDS + nf)
    sh_mutex = plan[base]
    meta = int64_at(plan[base + 1], META_LEN)
    steps = int64_at(plan[base + 2], 3 * cap)
    recs = int64_at(plan[base + 3], 4 * cap)
    rc, hole_at, hole, lost = lock_shard(plan, shard)  # a dead holder's hole repaired (lost: deleted below)
    if rc < 0:
        return FAILED, shard, -1, -rc, died, 0, 0
    died += rc
    wp = meta[WRITE_POS]
    if wp + count >= MAX_POSITION:
        mutex_unlock(sh_mutex)
        if lost:
            rc = count_deletes_locked(plan, lost)
            if rc < 0:
                return FAILED, shard, record, -rc, died, hole_at, hole
            died += rc
        return OVERFLOW, shard, record, 0, died, hole_at, hole
    extend = False
    r = 0
    if not new_episode:
        r = (record % cap) * 4
        extend = (
            recs[r + REC_ID] == record
            and (recs[r + REC_FLAGS] & OPEN) != 0
            and recs[r + REC_START] + recs[r + REC_LENGTH] == wp
        )
    if not extend:
        if not new_episode and recs[r + REC_ID] == record:
            recs[r + REC_FLAGS] &= ~OPEN  # the old part ends at its last committed step
        new = meta[N_RECORDS]
        meta[N_RECORDS] = new + 1
        r = (new % cap) * 4
        recs[r + REC_ID] = new
        recs[r + REC_START] = wp
        recs[r + REC_LENGTH] = 0
        recs[r + REC_FLAGS] = OPEN | (0 if new_episode else CONTINUATION) | (pid << OWNER_SHIFT)
        record = new
    lo, hi = max(0, wp - cap), max(0, wp + count - cap)
    overwritten = count_overwritten(steps.reshape((cap, 3)), cap, lo, hi)
    meta[RESERVE_DELETES] = overwritten
    compiler_fence()  # the items to delete are stored before the reserve position publishes them
    meta[RESERVE_POS] = wp + count
    compiler_fence()  # the reserve position is stored before any slot changes
    store_fence()  # ... streaming stores included (x86 may pass earlier stores with them)
    first = wp % cap
    n1 = min(count, cap - first)
    streamed = False
    for j in range(nf):
        rb = plan[P_ROW_BYTES + j]
        ring, src = plan[base + SHARD_WORDS + j], sources[1 + j]
        streamed |= _ring_copy(ring + first * rb, src, n1 * rb)
        if count > n1:
            streamed |= _ring_copy(ring, src + n1 * rb, (count - n1) * rb)
    if streamed:
        store_fence()  # the streaming stores are ordered before the write position publishes the slots
    for i in range(count):
        c = first + i
        if c >= cap:
            c -= cap
        steps[3 * c] = record
        steps[3 * c + 1] = seq_base + i
        steps[3 * c + 2] = 0
    compiler_fence()  # every slot is written before the write position publishes them
    recs[r + REC_LENGTH] += count
    if end:
        recs[r + REC_FLAGS] &= ~OPEN
    meta[WRITE_POS] = wp + count
    meta[RESERVE_DELETES] = 0  # after the publish: a repair never sees it cleared while reserved
    meta[COMMITS] += 1
    # 3. the counts and the wake-up (control mutex; the shard mutex still held, so a checkpoint, which
    # takes every shard mutex and then the control mutex, sees the steps and their counts together)
    rc = mutex_lock_robust(ctl_mutex)
    if rc < 0:
        mutex_unlock(sh_mutex)
        return FAILED, shard, record, -rc, died, hole_at, hole
    died += rc
    ctl[CTL_FIXED + shard] += count
    ctl[INSERTS] += count
    ctl[DELETES] += overwritten + lost
    if end and not new_episode:
        ctl[CTL_FIXED + s_count + shard] -= 1
    cond_broadcast(plan[P_CTL_COND])
    mutex_unlock(ctl_mutex)
    mutex_unlock(sh_mutex)
    return OK, shard, record, overwritten, died, hole_at, hole

"""The owner's draw of transitions and their copy into a batch, in one numba call.

`draw_transitions` is what `replay.draw_kernels.draw_windows` followed by
`replay.batch_kernels.gather_rows` compute for windows of one step, fused: the selector's draw as
one table over the shards (`replay.draw_kernels.draw_items`: the same rows, probabilities and use
counts for the same uniforms), each anchor's key, the copy of its step from every field's ring into
the staging slot's flat byte views, and the mask. A window of one step is its anchor whatever the
padding (first = anchor, one real step, offset 0), so the step index and the record ring are not
read at all.

It runs with the table lock and every shard lock held, so no writer can overwrite a ring slot during
the copy: the batch needs no staleness check and no redraw. `replay.sampler.WindowSampler` takes this
path only for host batches of transitions of `LOCKED_COPY_BYTES` of output at most (256 steps of
3x64x64 uint8 frames fit), so a writer waits at most the copy of that many bytes (about 0.4 ms);
larger batches keep the lock-free copy. Short windows take the same frame (`replay.window_kernel`).

`sample_transitions` is the whole sample in one call (`replay.table.Table.draw_transitions` makes it,
holding only the table lock) in the frame of `replay.locked_draw`: every shard mutex taken in shard
order (a dead writer's hole repaired), the check that the table has ingested every commit, the
uniforms drawn from the selector's generator (as ``Generator.random`` does), `draw_transitions` (the
selector by address, `replay.locked_draw.selector_words`; the rings and row sizes from the plan; the
slot as addresses ``dst``), then the shard mutexes released and the sampled steps counted under the
control mutex with a wake-up (`replay.rate_limiter.RateLimiterState.sample`). When a shard has
commits the table has not ingested it changes nothing and returns `STALE`: the caller takes the
shard locks in Python, ingests, and calls it again with ``held`` True (the shard mutexes are then the
caller's). The plan is `replay.commit_kernel.build_plan`'s. A batch of ``2 * SPLIT_BYTES`` and more,
when `graphrl.threads` gives it a second thread on an idle core, is copied by the caller and the thread
team's helpers, by groups of rows, between the draw's call and a releasing one (`sample_transitions`'
notes); every other batch takes the one call.

>>> live = draw_transitions(u, ctree, wtree, False, size, filled, times, written, capacity,
...                         rings, outs, row_bytes, incarnation, keys, prob, mask, 0.4, weights)
>>> status, n, err, died = sample_transitions(plan, False, repairs, words, dst, incarnation, keys, prob,
...                                           mask, 0.4, weights)
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels import Chunks, engaged
from graphrl.kernels.copies import address, store_fence
from graphrl.kernels.prefetch import prefetch_l2_at
from graphrl.threads import idle_cores, threads_for
from replay.commit_kernel import P_CAPACITY, P_FIELDS, P_ROW_BYTES, P_SHARDS, SHARD_WORDS
from replay.draw_kernels import draw_items, importance_weights_into
from replay.keys import BACK_BITS, INC_BITS, SHARD_BITS
from replay.locked_draw import (
    DRAWN,
    EMPTY,
    FAILED,
    STALE,
    lock_shards,
    release,
    selector,
    uniforms,
    unlock_shards,
)
from replay.sync_kernels import fetch_add, sched_yield, spin_pause, uint8_at
from replay.windows import AHEAD, PAGE, STREAM_BATCH_BYTES, copy_window, mask_row, prefetch_pages

__all__ = [
    "DRAWN",
    "EMPTY",
    "FAILED",
    "GROUP_BYTES",
    "LOCKED_COPY_BYTES",
    "SPLIT_BYTES",
    "STALE",
    "draw_transitions",
    "sample_transitions",
]

_COPYING = 4  # `_sample_locked`'s status: drawn and not yet copied (after `replay.locked_draw`'s codes)
LOCKED_COPY_BYTES = 4 << 20  # output bytes up to which a batch of transitions is copied under the locks
# `sample_transitions` copies a batch of 2 SPLIT_BYTES and more on a thread for every SPLIT_BYTES
# (`graphrl.threads.threads_for`; docs/performance.md)
SPLIT_BYTES = 1 << 20
GROUP_BYTES = 128 << 10  # output bytes of a group of rows, the unit the copying threads claim
_NO_SPLIT = 1 << 62  # `_sample_locked`'s split_bytes when the batch is copied in the one call
_SPINS = 4096  # pauses before a thread waiting for another's group yields its core instead


@nb.njit(cache=True, nogil=True)
def draw_transitions(
    u, ctree, wtree, prioritized, size, filled, times, written, capacity,
    rings, outs, row_bytes, incarnation, o_keys, o_prob, mask, beta, o_weights,
):  # pragma: no cover - numba
    """Draw ``len(u)`` single-step windows and copy them into rows ``0 .. len(u) - 1`` of a batch.

    ``u`` float64 [k] in [0, 1); the trees, ``filled`` and ``times`` as `draw_items` takes them
    (use counts are added); ``written`` int64 [S], each shard's write position known to the
    selector; ``rings[s * F + j]`` shard s's field j as flat bytes and ``outs[j]`` the slot's field j
    (uint8, ``row_bytes[j]`` bytes a step); ``o_keys`` int64 [k] and ``o_prob`` float64 [k] get the
    keys (`replay.keys.encode_keys`, back 0, ``incarnation``) and probabilities, ``mask`` bool [>= k]
    True; ``o_weights`` float32 [k] (or empty for none) the importance weights for ``beta``
    (`replay.draw_kernels.importance_weights_into`, N the live items). Returns the live items (the
    count trees' total); below 0.5 nothing is drawn or written.
    """
    nf = row_bytes.shape[0]
    bases = np.empty(len(rings), dtype=np.int64)  # each ring's address, as rings is indexed
    for t in range(len(rings)):
        bases[t] = address(rings[t], 0)
    dst = np.empty(nf, dtype=np.int64)
    for j in range(nf):
        dst[j] = address(outs[j], 0)
    return _draw_copy(
        u, ctree, wtree, prioritized, size, filled, times, written, capacity,
        bases, nf, row_bytes, dst, incarnation, o_keys, o_prob, mask, beta, o_weights, True,
    )


@nb.njit(cache=True, nogil=True)
def _draw_copy(
    u, ctree, wtree, prioritized, size, filled, times, written, capacity,
    bases, stride, row_bytes, dst, incarnation, o_keys, o_prob, mask, beta, o_weights, copy,
):  # pragma: no cover - numba
    """`draw_transitions` over addresses: shard s's ring of field j at ``bases[s * stride + j]``, the
    slot's field j at ``dst[j]`` (int64 [F]); ``copy`` False: all but the copy (`_copy_keys` makes it
    from the keys)."""
    k = u.shape[0]
    shard = np.empty(k, dtype=np.int64)
    slot = np.empty(k, dtype=np.int64)
    live = draw_items(u, ctree, wtree, prioritized, size, filled, times, True, shard, slot, o_prob)
    if live < 0.5:
        return live
    if o_weights.shape[0] > 0:
        importance_weights_into(o_prob, np.int64(live + 0.5), beta, o_weights)
    nf = row_bytes.shape[0]
    src = np.empty(nf * k if copy else 0, dtype=np.int64)  # field j of row i: its step's address
    if copy:
        for j in range(nf):
            rb = row_bytes[j]
            for i in range(k):  # independent reads at random places: ask for all of them first
                a = bases[shard[i] * stride + j] + slot[i] * rb
                src[j * k + i] = a
                prefetch_l2_at(a)
    inc_bits = (incarnation % (1 << INC_BITS)) << (SHARD_BITS + BACK_BITS)
    for i in range(k):
        s = shard[i]
        c = slot[i]
        anchor = c + capacity * ((written[s] - 1 - c) // capacity)
        o_keys[i] = (anchor << (SHARD_BITS + BACK_BITS + INC_BITS)) | inc_bits | s
        mask_row(mask, i, 1, 0, 1)
    if copy:
        _copy_range(src, k, dst, row_bytes, 0, k)
    return live


@nb.njit(cache=True, nogil=True)
def _copy_keys(plan, keys, dst, lo, hi):  # pragma: no cover - numba
    """Rows ``lo .. hi - 1`` of a batch of ``len(keys)`` transitions drawn by `_sample_locked` (shard
    mutexes held), each row's step found from its key (shard, anchor) and the plan's rings."""
    nf = plan[P_FIELDS]
    capacity = plan[P_CAPACITY]
    row_bytes = plan[P_ROW_BYTES : P_ROW_BYTES + nf]
    bases = plan[P_ROW_BYTES + nf + SHARD_WORDS :]
    stride = SHARD_WORDS + nf
    n = hi - lo
    src = np.empty(nf * n, dtype=np.int64)
    for i in range(n):
        key = keys[lo + i]
        s = key & ((1 << SHARD_BITS) - 1)
        c = (key >> (SHARD_BITS + BACK_BITS + INC_BITS)) % capacity
        for j in range(nf):
            a = bases[s * stride + j] + c * row_bytes[j]
            src[j * n + i] = a
            prefetch_l2_at(a)
    _copy_range(src, n, dst, row_bytes, lo, keys.shape[0])


@nb.njit(cache=True, nogil=True)
def _copy_groups(job, plan, keys, dst, group, groups, wait):  # pragma: no cover - numba
    """Claim groups of ``group`` rows (`_copy_keys`) from ``job[0]`` until all ``groups`` are claimed,
    counting each copied group in ``job[1]`` (int64 [2], updated atomically). ``wait``: then wait until
    every claimed group is copied (a short spin, then yields): the batch is whole on return."""
    k = keys.shape[0]
    while True:
        g = fetch_add(job, 0, 1)
        if g >= groups:
            break
        lo = g * group
        _copy_keys(plan, keys, dst, lo, min(k, lo + group))
        fetch_add(job, 1, 1)
    spins = 0
    while wait and fetch_add(job, 1, 0) < groups:
        spins += 1
        if spins < _SPINS:
            spin_pause()
        else:
            sched_yield()


@nb.njit(cache=True, nogil=True)
def _abandon_groups(job, groups):  # pragma: no cover - numba
    """Claim every group of ``job`` not yet claimed (`_copy_groups`' counters), so that no helper starts
    one, then wait until each group claimed before is copied: from the return on, no thread reads the
    rings or writes the slot for this batch."""
    claimed = min(fetch_add(job, 0, groups), groups)
    spins = 0
    while fetch_add(job, 1, 0) < claimed:
        spins += 1
        if spins < _SPINS:
            spin_pause()
        else:
            sched_yield()


@nb.njit(cache=True, nogil=True)
def _copy_range(src, n, dst, row_bytes, lo, k):  # pragma: no cover - numba
    """Rows ``lo .. lo + n - 1`` of a batch of k transitions: field j's row ``lo + i`` from address
    ``src[j * n + i]`` to ``dst[j] + (lo + i) * row_bytes[j]``. A field's page rows are streamed when
    the whole batch of that field is `STREAM_BATCH_BYTES` or more, and fenced before the return."""
    streamed = False
    for j in range(row_bytes.shape[0]):  # constant row sizes copy with a move or two, not a memcpy call
        rb = row_bytes[j]
        out = uint8_at(dst[j] + lo * rb, n * rb)
        at = j * n
        if rb == 1:
            _copy_rows(out, src, at, n, 1)
        elif rb == 2:
            _copy_rows(out, src, at, n, 2)
        elif rb == 4:
            _copy_rows(out, src, at, n, 4)
        elif rb == 8:
            _copy_rows(out, src, at, n, 8)
        elif rb == 16:
            _copy_rows(out, src, at, n, 16)
        elif rb == 32:
            _copy_rows(out, src, at, n, 32)
        elif rb >= PAGE:
            stream = k * rb >= STREAM_BATCH_BYTES  # a field's page rows: streamed from 1 MiB
            streamed |= stream
            _copy_pages(out, src, at, n, rb, stream)
        else:
            _copy_rows(out, src, at, n, rb)
    if streamed:  # the streaming stores reach memory before the batch is handed out
        store_fence()


@nb.njit(cache=True, nogil=True, inline="always")
def _copy_pages(out, src, at, k, rb, stream):  # pragma: no cover - numba
    """`_copy_rows` of rows of a page or more, asking for row ``i + AHEAD``'s pages before copying row
    i (`replay.windows.prefetch_pages`); ``stream``: with streaming stores (no fence)."""
    for i in range(min(AHEAD, k)):
        prefetch_pages(uint8_at(src[at + i], rb), rb, 1, 0, 1)
    for i in range(k):
        if i + AHEAD < k:
            prefetch_pages(uint8_at(src[at + i + AHEAD], rb), rb, 1, 0, 1)
        copy_window(out, i * rb, uint8_at(src[at + i], rb), rb, 1, 0, 1, 0, 1, stream)


@nb.njit(cache=True, nogil=True, inline="always")
def _copy_rows(out, src, at, k, rb):  # pragma: no cover - numba
    """Window i of one step (its step at address ``src[at + i]``) into row i of ``out``, for i < k, with
    the one CPU ring gather (`replay.windows.copy_window`, on a view of the step as a ring of one slot)."""
    for i in range(k):
        copy_window(out, i * rb, uint8_at(src[at + i], rb), rb, 1, 0, 1, 0, 1, False)


def sample_transitions(
    plan: np.ndarray,
    held: bool,
    repairs: np.ndarray,
    words: np.ndarray,
    dst: np.ndarray,
    incarnation: int,
    o_keys: np.ndarray,
    o_prob: np.ndarray,
    mask: np.ndarray,
    beta: float,
    o_weights: np.ndarray,
) -> tuple[int, int, int, int]:
    """`draw_transitions` under every shard mutex, then the sample count (see the module docstring).
    The caller holds the table lock.

    Parameters
    ----------
    plan : numpy.ndarray, int64 [plan_layout(S, F)]
        `replay.commit_kernel.build_plan`'s addresses (the control block's and every shard's).
    held : bool
        The caller holds every shard mutex and has ingested every shard: no locking, no check.
    repairs : numpy.ndarray, int64 [2 S]
        Gets, per shard s, ``repairs[2 s]`` the first position and ``repairs[2 s + 1]`` the length of
        the hole repaired after a dead holder (length 0: none; only written where a holder died).
    words : numpy.ndarray, int64 [`replay.locked_draw.WORDS`]
        `replay.locked_draw.selector_words`: the selector's generator, trees, use counts and the
        table's ``filled`` and ``ingested`` (``written``) as `draw_transitions` takes them, by address.
        ``len(o_keys)`` uniforms are drawn from the generator at the draw, exactly as
        ``Generator.random(len(o_keys))`` draws them (none when `STALE` or `FAILED` is returned before
        the draw); the caller holds the only lock that guards the generator and the selector.
    dst : numpy.ndarray, int64 [F]
        The address of the slot's flat bytes of each field (the rings and row sizes come from
        ``plan``).
    incarnation, o_keys, o_prob, mask, beta, o_weights
        As `draw_transitions` takes them.

    Returns
    -------
    ``(status, live, err, died)``, all int: status `DRAWN` (``live`` items drawable, ``len(o_keys)``
    steps counted as sampled), `EMPTY` (the table is empty: nothing drawn, written or counted),
    `STALE` (a shard's write position is past ``written``: nothing drawn; only with ``held`` False) or
    `FAILED` (a pthread call failed, its errno in ``err``: every mutex this call took is released; the
    sample count is lost only when the control mutex failed, after the draw);
    ``died`` counts the mutexes found with a dead holder.

    Notes
    -----
    The copy's threads are chosen before the draw: ``threads_for(bytes / 4, SPLIT_BYTES / 4)`` for a batch
    of ``2 * SPLIT_BYTES`` and more, helpers only on idle cores (`graphrl.threads.idle_cores`); one thread
    takes the one call (draw and copy). Two and more take three steps: one compiled call takes the locks
    and draws; the caller and the helpers of the thread team (`graphrl.kernels.engaged`) copy
    groups of `GROUP_BYTES` of rows, each claimed atomically, so the caller never waits for a helper
    that has not started (it waits only for groups being copied, and the batch is whole when it returns); a
    second call releases the shard mutexes and counts; a signal's exception raised as the draw returns
    (the return value lost) still releases them (`_draw_held` marks them held). When the caller raises
    during the copy, the groups left are claimed and those the helpers began are waited for before that
    release, so no helper reads the rings or writes the slot after it. Smaller batches take the one call.
    """
    k = o_keys.shape[0]
    threads = 1  # the copy's threads, chosen before the draw: on one, the batch takes the one call
    batch = _batch_bytes(plan, k)
    if batch >= 2 * SPLIT_BYTES:
        threads = threads_for(batch // 4, SPLIT_BYTES // 4)
        if threads > 1:
            threads = 1 + min(threads - 1, idle_cores(threads))
    job = np.zeros(3, dtype=np.int64)  # groups claimed, groups copied, 1 while the draw's mutexes are held
    counted = 0
    try:  # from the draw on: a signal's exception is raised as a compiled call returns, held mutexes or not
        status, live, err, died = _draw_held(
            plan, held, repairs, words, dst, incarnation, o_keys, o_prob, mask, beta, o_weights,
            2 * SPLIT_BYTES if threads > 1 else _NO_SPLIT, job,
        )
        if status != _COPYING:
            return status, live, err, died
        # drawn, the shard mutexes held: the copy of ``err`` bytes is left, on ``threads`` threads
        group = max(1, min(k, GROUP_BYTES * k // err))  # rows a group
        groups = -(-k // group)
        # a chunk a thread, the caller's (0) taken here: the helpers' Python runs once each
        task = Chunks(lambda i: _copy_groups(job, plan, o_keys, dst, group, groups, False), threads)
        task.claim()
        try:
            with engaged(task, threads - 1):  # a helper that comes late finds every group claimed
                _copy_groups(job, plan, o_keys, dst, group, groups, True)
        except BaseException:  # (a signal's exception): no helper may copy after the release below
            _abandon_groups(job, groups)
            raise
        counted = k
    finally:  # the shard mutexes are released even when the copy raised (nothing counted then)
        if job[2]:
            status, err, more = release(plan, held, counted)
    return status, live, err, died + more


@nb.njit(cache=True, nogil=True)
def _batch_bytes(plan, k):  # pragma: no cover - numba
    """The output bytes of a batch of ``k`` transitions: ``k`` steps of the plan's fields."""
    batch = 0
    for j in range(plan[P_FIELDS]):
        batch += k * plan[P_ROW_BYTES + j]
    return batch


@nb.njit(cache=True, nogil=True)
def _sample_locked(
    plan, held, repairs, words, dst, incarnation, o_keys, o_prob, mask, beta, o_weights, split_bytes
):  # pragma: no cover - numba
    """`sample_transitions` in one call, or, for a batch of ``split_bytes`` and more, all of it but the
    copy and the release: `_COPYING` (live items, the batch's bytes in place of ``err``), the shard
    mutexes still held and nothing counted; `_copy_groups` and `replay.locked_draw.release` finish it."""
    s_count = plan[P_SHARDS]
    nf = plan[P_FIELDS]
    capacity = plan[P_CAPACITY]
    ctree, wtree, prioritized, size, filled, times, written = selector(words, s_count, capacity)
    status, err, died = lock_shards(plan, held, repairs, written)
    if status != DRAWN:
        return status, 0, err, died
    k = o_keys.shape[0]
    u = uniforms(words, k)
    batch = _batch_bytes(plan, k)
    copy = batch < split_bytes
    live = _draw_copy(
        u, ctree, wtree, prioritized, size, filled, times, written, capacity,
        plan[P_ROW_BYTES + nf + SHARD_WORDS :], SHARD_WORDS + nf, plan[P_ROW_BYTES : P_ROW_BYTES + nf], dst,
        incarnation, o_keys, o_prob, mask, beta, o_weights, copy,
    )
    if live < 0.5:
        if not held:
            unlock_shards(plan, s_count)
        return EMPTY, 0, 0, died
    n = np.int64(live + 0.5)
    if not copy:
        return _COPYING, n, batch, died
    status, err, more = release(plan, held, k)
    return status, n, err, died + more


@nb.njit(cache=True, nogil=True)
def _draw_held(
    plan, held, repairs, words, dst, incarnation, o_keys, o_prob, mask, beta, o_weights, split_bytes, job
):  # pragma: no cover - numba
    """`_sample_locked`, setting ``job[2]`` to 1 when it returns `_COPYING` (the shard mutexes held for the
    copy): the caller releases them by that word even when a signal's exception takes the return value."""
    out = _sample_locked(
        plan, held, repairs, words, dst, incarnation, o_keys, o_prob, mask, beta, o_weights, split_bytes
    )
    if out[0] == _COPYING:
        job[2] = 1
    return out

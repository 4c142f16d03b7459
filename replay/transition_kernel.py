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
when `graphrl.threads` gives it a second thread on an idle core, is copied by the caller and the
process's copy helpers (`replay.copy_helpers`: threads that stay in compiled code between batches),
by groups of rows, between the draw's call and a releasing one (`sample_transitions`' notes); every
other batch takes the one call.

>>> live = draw_transitions(u, ctree, wtree, False, size, filled, times, written, capacity,
...                         rings, outs, row_bytes, incarnation, keys, prob, mask, 0.4, weights)
>>> status, n, err, died = sample_transitions(plan, False, repairs, words, dst, incarnation, keys, prob,
...                                           mask, 0.4, weights)
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels.copies import address
from graphrl.kernels.prefetch import prefetch_l2_at
from graphrl.threads import idle_cores, threads_for
from replay.commit_kernel import P_CAPACITY, P_FIELDS, P_ROW_BYTES, P_SHARDS, SHARD_WORDS
from replay.copy_helpers import MAX_GROUPS, MAX_HELPERS, copy_batch, copy_range, process_helpers
from replay.draw_kernels import draw_items, importance_weights_into
from replay.keys import pack_key
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
from replay.sync_kernels import int64_at, uint8_at
from replay.windows import mask_row

__all__ = [
    "DRAWN",
    "EMPTY",
    "FAILED",
    "GROUP_BYTES",
    "LOCKED_COPY_BYTES",
    "SLOT_CALL_WORDS",
    "SPLIT_BYTES",
    "STALE",
    "draw_transitions",
    "sample_transitions",
    "slot_call",
]

_COPYING = 4  # `_sample_locked`'s status: drawn and not yet copied (after `replay.locked_draw`'s codes)
LOCKED_COPY_BYTES = 4 << 20  # output bytes up to which a batch of transitions is copied under the locks
# `sample_transitions` copies a batch of 2 SPLIT_BYTES and more on a thread for every SPLIT_BYTES
# (`graphrl.threads.threads_for`; docs/performance.md)
SPLIT_BYTES = 1 << 20
GROUP_BYTES = 128 << 10  # output bytes of a group of rows, the unit the copying threads claim
_NO_SPLIT = 1 << 62  # `_sample_locked`'s split_bytes when the batch is copied in the one call
SLOT_CALL_WORDS = 10  # `slot_call`'s words: address and length of plan, repairs, words, dst, mask


def slot_call(
    plan: np.ndarray, repairs: np.ndarray, words: np.ndarray, dst: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """The fixed arrays of `sample_transitions`' one call by address: int64 [`SLOT_CALL_WORDS`], its ``call``.

    ``plan``, ``repairs``, ``words`` (a table's, int64) and ``dst`` (a staging slot's field addresses,
    int64), then ``mask`` (the slot's, bool), each as its address and length. Passed as this one array,
    numba's dispatcher unboxes one argument where it would unbox five. Valid while the five arrays live
    and stay where they are (a table's arrays live with the table, a slot's with its views:
    `replay.batch_staging.StagedSlot.call` keeps the result beside them).

    Raises
    ------
    ValueError
        An array that is not C-contiguous or not of its dtype.
    """
    out = np.empty(SLOT_CALL_WORDS, dtype=np.int64)
    for i, (name, arr, dtype) in enumerate((
        ("plan", plan, np.int64), ("repairs", repairs, np.int64), ("words", words, np.int64),
        ("dst", dst, np.int64), ("mask", mask, np.bool_),
    )):
        if arr.dtype != dtype or not arr.flags.c_contiguous or arr.ndim != 1:
            raise ValueError(
                f"{name} must be a C-contiguous 1-D {np.dtype(dtype).name} array, got dtype {arr.dtype}, "
                f"ndim {arr.ndim}, C-contiguous {arr.flags.c_contiguous}"
            )
        out[2 * i], out[2 * i + 1] = arr.ctypes.data, arr.shape[0]
    return out


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
    slot's field j at ``dst[j]`` (int64 [F]); ``copy`` False: all but the copy
    (`replay.copy_helpers.copy_batch` makes it from the keys)."""
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
    for i in range(k):
        s = shard[i]
        c = slot[i]
        anchor = c + capacity * ((written[s] - 1 - c) // capacity)
        o_keys[i] = pack_key(anchor, 0, incarnation, s)
        mask_row(mask, i, 1, 0, 1)
    if copy:
        copy_range(src, k, dst, row_bytes, 0, k)
    return live


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
    step_bytes: int = -1,
    call: np.ndarray | None = None,
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
    step_bytes : int, optional
        The bytes of one step of the plan's fields (the sum of its row bytes), as the caller knows it
        (`replay.table.Table.step_bytes`); -1 (default): read from ``plan``.
    call : numpy.ndarray, int64 [`SLOT_CALL_WORDS`], optional
        `slot_call` of ``plan``, ``repairs``, ``words``, ``dst`` and ``mask``: the one call (a batch
        below ``2 * SPLIT_BYTES``, ``held`` False) takes those five by address from it; the same batch.

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
    of ``2 * SPLIT_BYTES`` and more, helpers only on idle cores (`graphrl.threads.idle_cores`, which counts
    the cores of helpers still spinning after the last batch as idle: `CopyHelpers.awake`); one thread
    (or the helpers busy with another thread's batch) takes the one call (draw and copy). Two and more
    ring the helpers' bell (`replay.copy_helpers.CopyHelpers.ring`) before the draw, so that they wake
    while it runs; one compiled call takes the locks and draws; a second publishes the batch and copies
    groups of `GROUP_BYTES` of rows alongside the helpers (`replay.copy_helpers.copy_batch`), each group
    claimed atomically, so the caller never waits for a helper that has not started (only for groups
    being copied: the batch is whole when it returns); then the batch is closed
    (`replay.copy_helpers.CopyHelpers.close`: groups not claimed are withdrawn and those claimed waited
    for, so no helper reads the rings or writes the slot after it) and a third call releases the shard
    mutexes and counts. A signal's exception raised as a compiled call returns (the return value lost)
    still closes the batch and releases the mutexes (`_draw_held` marks them held). Smaller batches take
    the one call.
    """
    k = o_keys.shape[0]
    batch = k * step_bytes if step_bytes >= 0 else _batch_bytes(plan, k)
    if batch < 2 * SPLIT_BYTES:  # one thread: the one call draws, copies, releases and counts
        # (`_sample_locked` itself: with `_NO_SPLIT` it never returns holding a mutex, so no job word)
        if call is not None and not held:
            return _sample_call(call, incarnation, o_keys, o_prob, beta, o_weights)
        return _sample_locked(
            plan, held, repairs, words, dst, incarnation, o_keys, o_prob, mask, beta, o_weights, _NO_SPLIT
        )
    # the copy's threads, chosen before the draw: on one, the batch takes the one call
    helpers, bell = process_helpers(), None
    threads = threads_for(batch // 4, SPLIT_BYTES // 4)
    if threads > 1:  # helpers still spinning after the last batch run on cores that are ours
        threads = 1 + min(threads - 1, idle_cores(threads, own=helpers.awake()), MAX_HELPERS)
    job = np.zeros(1, dtype=np.int64)  # 1 while the draw's shard mutexes are held for the copy
    counted = 0
    try:  # from the bell on: a signal's exception is raised as a call returns, held mutexes or not
        if threads > 1:  # rung before the draw: the helpers wake while it runs (None: another batch has them)
            bell = helpers.ring(threads - 1)
        status, live, err, died = _draw_held(
            plan, held, repairs, words, dst, incarnation, o_keys, o_prob, mask, beta, o_weights,
            2 * SPLIT_BYTES if bell is not None else _NO_SPLIT, job,
        )
        if status != _COPYING:
            return status, live, err, died
        # drawn, the shard mutexes held: the copy of ``err`` bytes is left, to the caller and the helpers
        group = max(1, -(-k // MAX_GROUPS), min(k, GROUP_BYTES * k // err))  # rows a group
        copy_batch(helpers.ctl, bell, plan, o_keys, dst, group, -(-k // group))
        counted = k
    finally:  # the batch closed (no helper copies after), then the shard mutexes released, even on a raise
        try:
            if threads > 1:  # this thread's batch, if it holds the helpers (its bell lost or not)
                helpers.close(bell)
        finally:
            if job[0]:
                status, err, more = release(plan, held, counted)
    return status, live, err, died + more


@nb.njit(cache=True, nogil=True)
def _sample_call(call, incarnation, o_keys, o_prob, beta, o_weights):  # pragma: no cover - numba
    """`_sample_locked` in one call (``held`` False, no split) with plan, repairs, words, dst and mask
    read from ``call`` (`slot_call`)."""
    return _sample_locked(
        int64_at(call[0], call[1]), False, int64_at(call[2], call[3]), int64_at(call[4], call[5]),
        int64_at(call[6], call[7]), incarnation, o_keys, o_prob, uint8_at(call[8], call[9]).view(np.bool_),
        beta, o_weights, _NO_SPLIT,
    )


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
    mutexes still held and nothing counted; `replay.copy_helpers.copy_batch` and
    `replay.locked_draw.release` finish it."""
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
    """`_sample_locked`, setting ``job[0]`` to 1 when it returns `_COPYING` (the shard mutexes held for the
    copy): the caller releases them by that word even when a signal's exception takes the return value."""
    out = _sample_locked(
        plan, held, repairs, words, dst, incarnation, o_keys, o_prob, mask, beta, o_weights, split_bytes
    )
    if out[0] == _COPYING:
        job[0] = 1
    return out

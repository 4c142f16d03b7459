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
process's copy helpers (`CopyHelpers`: threads that stay in compiled code between batches), by groups
of rows, between the draw's call and a releasing one (`sample_transitions`' notes); every other batch
takes the one call.

>>> live = draw_transitions(u, ctree, wtree, False, size, filled, times, written, capacity,
...                         rings, outs, row_bytes, incarnation, keys, prob, mask, 0.4, weights)
>>> status, n, err, died = sample_transitions(plan, False, repairs, words, dst, incarnation, keys, prob,
...                                           mask, 0.4, weights)
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import warnings

import numba as nb
import numpy as np

from graphrl.kernels.copies import address, store_fence
from graphrl.kernels.prefetch import prefetch_l2_at
from graphrl.threads import idle_cores, threads_for
from replay._sync import futex_syscall
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
from replay.sync_kernels import (
    compare_exchange,
    fetch_add,
    futex_wait,
    futex_wake,
    int64_at,
    sched_yield,
    spin_pause,
    uint8_at,
)
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


# `CopyHelpers`' control words (int64): the batch bell (its low 32 bits the futex word), the claim word
# (batch tag << 40 | groups << 20 | next group), groups copied, sleeping helpers, quit, then the batch,
# then the holder (the native id of the thread whose batch holds the helpers; 0: none), the wake tickets
# left (a rung batch's helpers: each woken helper takes one or sleeps on), the publication count (its
# low 32 bits the futex word a woken helper sleeps on while the draw runs long), helpers sleeping on it,
# then helper i's counters of batches it was woken for and groups it copied at _C_COUNTS + 2 i and + 1,
# then the groups copied by the batches' threads (`_C_MINE`)
(_C_BELL, _C_WORD, _C_DONE, _C_SLEEP, _C_QUIT, _C_PLAN, _C_PLAN_N, _C_KEYS, _C_K, _C_DST, _C_NF,
 _C_GROUP, _C_HOLDER, _C_TICKETS, _C_PUB, _C_PUB_SLEEP) = range(16)
_C_COUNTS = 16
MAX_HELPERS = 256  # copy helpers a process starts at most
_C_MINE = _C_COUNTS + 2 * MAX_HELPERS
_C_WORDS = _C_MINE + 8
_TAG_MASK = (1 << 23) - 1  # the claim word's batch tag: the bell's low bits
_FIELD_MASK = (1 << 20) - 1  # groups and next group: at most 2**20 - 1 groups a batch
_IDLE_SPINS = 2000  # pauses a helper waits for the next batch before it sleeps on the bell
_PUBLISH_SPINS = 2000  # pauses (about 50 us) a woken helper waits for the draw before it sleeps


@nb.njit(cache=True, nogil=True)
def _claim(ctl, bell):  # pragma: no cover - numba
    """The next group of batch ``bell`` claimed by this thread: >= 0, -1 when every group is claimed,
    -2 when batch ``bell`` is not published (not yet, or no longer)."""
    tag = bell & _TAG_MASK
    while True:
        w = fetch_add(ctl, _C_WORD, 0)
        if (w >> 40) != tag:
            return -2
        nxt = w & _FIELD_MASK
        if nxt >= (w >> 20) & _FIELD_MASK:
            return -1
        if compare_exchange(ctl, _C_WORD, w, w + 1) == w:
            return nxt


@nb.njit(cache=True, nogil=True)
def _copy_claimed(ctl, bell, mine):  # pragma: no cover - numba
    """Claim and copy groups of batch ``bell`` (`_copy_keys`; the batch read from ``ctl`` after each
    claim) until none is left; each copied group counted (and in ``ctl[mine]``, this thread's count).
    Returns `_claim`'s last answer (-1 or -2)."""
    while True:
        g = _claim(ctl, bell)
        if g < 0:
            return g
        plan = int64_at(ctl[_C_PLAN], ctl[_C_PLAN_N])
        keys = int64_at(ctl[_C_KEYS], ctl[_C_K])
        dst = int64_at(ctl[_C_DST], ctl[_C_NF])
        lo = g * ctl[_C_GROUP]
        _copy_keys(plan, keys, dst, lo, min(keys.shape[0], lo + ctl[_C_GROUP]))
        fetch_add(ctl, mine, 1)
        fetch_add(ctl, _C_DONE, 1)


@nb.njit(cache=True, nogil=True)
def _helper_loop(ctl, idle_spins, me):  # pragma: no cover - numba
    """Copy helper ``me``'s whole life in compiled code: wait for the bell to ring (``idle_spins`` pauses,
    then a futex sleep) with a wake ticket left for it (`_take_ticket`; none: wait for the next bell),
    count the batch, copy groups of it once it is published, and again, until quit."""
    seen = fetch_add(ctl, _C_BELL, 0)
    bell_at = address(ctl, _C_BELL)
    while True:
        spins = 0
        while True:
            bell = fetch_add(ctl, _C_BELL, 0)
            if bell != seen:
                if fetch_add(ctl, _C_QUIT, 0):
                    return
                seen = bell
                if _take_ticket(ctl):
                    break
            elif spins < idle_spins:
                spin_pause()
                spins += 1
            else:
                fetch_add(ctl, _C_SLEEP, 1)
                futex_wait(bell_at, seen)  # returns at once if the bell rang meanwhile
                fetch_add(ctl, _C_SLEEP, -1)
        fetch_add(ctl, _C_COUNTS + 2 * me, 1)
        _wait_published(ctl, seen)
        _copy_claimed(ctl, seen, _C_COUNTS + 2 * me + 1)


@nb.njit(cache=True, nogil=True)
def _wait_published(ctl, bell):  # pragma: no cover - numba
    """Wait until batch ``bell`` is published (or closed, or the bell rings again): `_PUBLISH_SPINS`
    pauses, then futex sleeps on the publication count, so a draw blocked on a writer's shard lock
    does not keep a core busy."""
    tag = bell & _TAG_MASK
    pub_at = address(ctl, _C_PUB)
    spins = 0
    while (fetch_add(ctl, _C_WORD, 0) >> 40) != tag and fetch_add(ctl, _C_BELL, 0) == bell:
        if spins < _PUBLISH_SPINS:
            spin_pause()
            spins += 1
        else:
            seen = fetch_add(ctl, _C_PUB, 0)
            fetch_add(ctl, _C_PUB_SLEEP, 1)
            if (fetch_add(ctl, _C_WORD, 0) >> 40) != tag and fetch_add(ctl, _C_BELL, 0) == bell:
                futex_wait(pub_at, seen)  # returns at once if a publication came meanwhile
            fetch_add(ctl, _C_PUB_SLEEP, -1)


@nb.njit(cache=True, nogil=True)
def _announce(ctl):  # pragma: no cover - numba
    """Count a publication (or a quit) and wake the helpers sleeping on it."""
    fetch_add(ctl, _C_PUB, 1)
    if fetch_add(ctl, _C_PUB_SLEEP, 0) > 0:
        futex_wake(address(ctl, _C_PUB), 1 << 30)


@nb.njit(cache=True, nogil=True)
def _ring(ctl, n):  # pragma: no cover - numba
    """Ring the bell for a new batch with ``n`` wake tickets (waking up to ``n`` sleeping helpers: the
    others sleep on); returns the batch's bell."""
    t = fetch_add(ctl, _C_TICKETS, 0)
    while True:
        old = compare_exchange(ctl, _C_TICKETS, t, n)
        if old == t:
            break
        t = old
    bell = fetch_add(ctl, _C_BELL, 1) + 1
    if fetch_add(ctl, _C_SLEEP, 0) > 0:
        futex_wake(address(ctl, _C_BELL), n)
    return bell


@nb.njit(cache=True, nogil=True)
def _take_ticket(ctl):  # pragma: no cover - numba
    """Take one of the rung batch's wake tickets; whether one was left."""
    t = fetch_add(ctl, _C_TICKETS, 0)
    while t > 0:
        old = compare_exchange(ctl, _C_TICKETS, t, t - 1)
        if old == t:
            return True
        t = old
    return False


@nb.njit(cache=True, nogil=True)
def _hold(ctl, holder, new):  # pragma: no cover - numba
    """Set the holder word to ``new`` if it is ``holder``; whether it was."""
    return compare_exchange(ctl, _C_HOLDER, holder, new) == holder


@nb.njit(cache=True, nogil=True)
def _publish(ctl, bell, groups, nxt):  # pragma: no cover - numba
    """Set the claim word to batch ``bell`` with ``groups`` groups, ``nxt`` the next to claim."""
    new = ((bell & _TAG_MASK) << 40) | (groups << 20) | nxt
    w = fetch_add(ctl, _C_WORD, 0)
    while True:
        old = compare_exchange(ctl, _C_WORD, w, new)
        if old == w:
            _announce(ctl)
            return
        w = old


@nb.njit(cache=True, nogil=True)
def _post(ctl, bell, plan, keys, dst, group, groups):  # pragma: no cover - numba
    """Publish batch ``bell`` to the helpers: ``groups`` groups of ``group`` rows of ``keys`` to copy
    (`_copy_keys` with ``plan`` and ``dst``), none copied yet."""
    ctl[_C_PLAN] = address(plan, 0)
    ctl[_C_PLAN_N] = plan.shape[0]
    ctl[_C_KEYS] = address(keys, 0)
    ctl[_C_K] = keys.shape[0]
    ctl[_C_DST] = address(dst, 0)
    ctl[_C_NF] = dst.shape[0]
    ctl[_C_GROUP] = group
    fetch_add(ctl, _C_DONE, -fetch_add(ctl, _C_DONE, 0))  # no helper counts while none is published
    _publish(ctl, bell, groups, 0)


@nb.njit(cache=True, nogil=True)
def _copy_batch(ctl, bell, plan, keys, dst, group, groups):  # pragma: no cover - numba
    """`_post` the batch, copy groups of it alongside the helpers, and wait until every group is
    copied."""
    _post(ctl, bell, plan, keys, dst, group, groups)
    _copy_claimed(ctl, bell, _C_MINE)
    _wait_copied(ctl, groups)


@nb.njit(cache=True, nogil=True)
def _close_batch(ctl, bell):  # pragma: no cover - numba
    """End batch ``bell``: every group not yet claimed claimed (none if it was never published), then
    wait until each claimed group is copied: from the return on, no helper touches the batch."""
    tag = bell & _TAG_MASK
    while True:
        w = fetch_add(ctl, _C_WORD, 0)
        if (w >> 40) != tag:  # never published: an empty batch
            _publish(ctl, bell, 0, 0)
            return
        claimed = min(w & _FIELD_MASK, (w >> 20) & _FIELD_MASK)
        if compare_exchange(ctl, _C_WORD, w, (tag << 40) | (claimed << 20) | claimed) == w:
            break  # the batch is now its claimed groups, all claimed (a second close finds the same)
    _wait_copied(ctl, claimed)


@nb.njit(cache=True, nogil=True)
def _wait_copied(ctl, groups):  # pragma: no cover - numba
    """Wait until ``groups`` groups of the batch are copied (a short spin, then yields)."""
    spins = 0
    while fetch_add(ctl, _C_DONE, 0) < groups:
        spins += 1
        if spins < _SPINS:
            spin_pause()
        else:
            sched_yield()


class CopyHelpers:
    """Threads that copy groups of a split batch alongside the caller, each kept in compiled code
    (`_helper_loop`) between batches: no interpreter lock and no Python per batch. A helper waits for
    the bell ``idle_spins`` pauses (about 25 ns each), then sleeps on it (a futex). One batch at a time:
    `ring` returns None while another batch holds them. The batch is held by its thread (its native id
    in the control words, taken by compare-and-swap), so `close` finds it even when a signal's exception
    took `ring`'s return value. Started by the first `ring`; the process's (`sample_transitions`') are
    made anew in a forked child (threads do not survive ``fork``). On a machine without a known futex
    (`replay._sync.futex_syscall` None) none is ever started: `ring` returns None (the one-thread copy)
    and warns once, naming the machine.

    Parameters
    ----------
    idle_spins : int
        Pauses a helper spins on the bell after a batch before it sleeps.
    """

    def __init__(self, idle_spins: int = _IDLE_SPINS) -> None:
        self.ctl = np.zeros(_C_WORDS, dtype=np.int64)
        self.idle_spins = int(idle_spins)
        self.threads: list[threading.Thread] = []
        self.supported = futex_syscall() is not None
        self._warned = False

    def woken(self) -> list[int]:
        """The batches each started helper was woken for (took a wake ticket of), in start order."""
        return [int(self.ctl[_C_COUNTS + 2 * i]) for i in range(len(self.threads))]

    def copied(self) -> list[int]:
        """The groups each started helper copied, in start order (the batches' own threads' in
        ``ctl[_C_MINE]``)."""
        return [int(self.ctl[_C_COUNTS + 2 * i + 1]) for i in range(len(self.threads))]

    def ring(self, helpers: int) -> int | None:
        """Take the helpers for one batch of this thread (at least ``helpers`` of them started) and ring
        the bell, waking ``helpers`` of them (at most `MAX_HELPERS`; the others sleep on); the batch's
        bell, or None when another batch holds them. The caller ends the batch with
        `close`, also when this call raises. None too on a machine without a known futex (warned once)."""
        if not 0 <= helpers <= MAX_HELPERS:
            raise ValueError(f"helpers must be in [0, {MAX_HELPERS}], got {helpers}")
        if not self.supported:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"no known futex(2) on machine {platform.machine()!r} ({sys.byteorder}-endian): "
                    "replay batches are copied by one thread (no copy helpers)", RuntimeWarning, stacklevel=2,
                )
            return None
        try:
            if not _hold(self.ctl, 0, threading.get_native_id()):
                return None
            if len(self.threads) < helpers:  # compiled or loaded here: no helper holds the compiler lock
                _helper_loop.compile((nb.typeof(self.ctl), nb.int64, nb.int64))
            while len(self.threads) < helpers:
                t = threading.Thread(
                    target=_helper_loop, args=(self.ctl, self.idle_spins, len(self.threads)),
                    name="replay-copy", daemon=True,
                )
                t.start()
                self.threads.append(t)
            return _ring(self.ctl, helpers)
        except BaseException:  # (a signal's exception as a call returns): its batch closed, empty
            self.close()
            raise

    def stop(self) -> None:
        """End the helper threads (they finish the batch they copy, if any) and wait for them; a later
        `ring` starts new ones."""
        self.ctl[_C_QUIT] = 1
        _ring(self.ctl, 1 << 30)
        _announce(self.ctl)
        for t in self.threads:
            t.join()
        self.threads.clear()
        self.ctl[_C_QUIT] = 0

    def close(self, bell: int | None = None) -> None:
        """End this thread's batch (`_close_batch`; ``bell`` its bell, None: the bell last rung, which is
        its own) and free the helpers for the next; nothing when this thread's batch does not hold them."""
        me = threading.get_native_id()
        if self.ctl[_C_HOLDER] != me:
            return
        try:
            _close_batch(self.ctl, int(self.ctl[_C_BELL]) if bell is None else bell)
        finally:
            _hold(self.ctl, me, 0)


_HELPERS = CopyHelpers()  # the process's copy helpers, as `graphrl.kernels.team`'s team is the process's


def _new_helpers_after_fork() -> None:  # helper threads do not survive fork()
    global _HELPERS
    _HELPERS = CopyHelpers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_helpers_after_fork)


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
    (or the helpers busy with another thread's batch) takes the one call (draw and copy). Two and more
    ring the helpers' bell (`CopyHelpers.ring`) before the draw, so that they wake while it runs; one
    compiled call takes the locks and draws; a second publishes the batch and copies groups of
    `GROUP_BYTES` of rows alongside the helpers, each group claimed atomically, so the caller never waits
    for a helper that has not started (only for groups being copied: the batch is whole when it
    returns); then the batch is closed (`CopyHelpers.close`: groups not claimed are withdrawn and those
    claimed waited for, so no helper reads the rings or writes the slot after it) and a third call
    releases the shard mutexes and counts. A signal's exception raised as a compiled call returns (the
    return value lost) still closes the batch and releases the mutexes (`_draw_held` marks them held).
    Smaller batches take the one call.
    """
    k = o_keys.shape[0]
    threads = 1  # the copy's threads, chosen before the draw: on one, the batch takes the one call
    batch = _batch_bytes(plan, k)
    if batch >= 2 * SPLIT_BYTES:
        threads = threads_for(batch // 4, SPLIT_BYTES // 4)
        if threads > 1:
            threads = 1 + min(threads - 1, idle_cores(threads), MAX_HELPERS)
    helpers, bell = _HELPERS, None
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
        group = max(1, -(-k // _FIELD_MASK), min(k, GROUP_BYTES * k // err))  # rows a group
        _copy_batch(helpers.ctl, bell, plan, o_keys, dst, group, -(-k // group))
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
    mutexes still held and nothing counted; `_copy_batch` and `replay.locked_draw.release` finish it."""
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


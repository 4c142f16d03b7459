"""Copy helpers: threads that copy the rows of a batch of transitions in parallel with its caller.

`replay.transition_kernel.sample_transitions` copies a batch of ``2 * SPLIT_BYTES`` and more with the
process's helpers (`process_helpers`) when `graphrl.threads` gives it idle cores. Each helper stays in
compiled code between batches (`CopyHelpers`; no interpreter lock and no Python per batch): it waits
for a bell (a futex word in the helpers' control words ``ctl``), takes one of the batch's wake tickets,
waits for the batch to be published, then claims groups of rows by compare-and-swap and copies each
(`copy_range` of the rows' steps, found from their keys and the plan's rings) until none is left. The
caller copies groups alongside (`copy_batch`), so it never waits for a helper that has not started,
only for groups being copied; `CopyHelpers.close` then withdraws the groups not claimed and waits for
the claimed ones, so no helper reads the rings or writes the slot after it.

Main names:

- `CopyHelpers`: the threads and their control words; `ring` (take the helpers for this thread's batch
  and wake some, before the draw), `close` (end the batch, also after an exception), `stop`.
- `copy_batch` (numba): publish a drawn batch (its keys, the plan, the slot's field addresses) and copy
  groups of it until every group is copied.
- `copy_range` (numba): rows of a batch of one-step windows from their steps' addresses, the copy that
  `replay.transition_kernel`'s one-call path uses too.
- `process_helpers`: the process's helpers, made anew in a forked child (threads do not survive
  ``fork``). `MAX_HELPERS`, `MAX_GROUPS`: the helpers a process starts and the groups a batch has at
  most.

>>> helpers = process_helpers()
>>> bell = helpers.ring(threads - 1)  # None: another thread's batch holds them (copy on this one)
>>> try:
...     ...  # draw the batch, the shard locks held
...     copy_batch(helpers.ctl, bell, plan, keys, dst, group, -(-len(keys) // group))
... finally:
...     helpers.close(bell)

On a machine without a known futex (`replay._sync.futex_syscall` None) no helper starts: `ring`
returns None and warns once. The plan is `replay.commit_kernel.build_plan`'s; the keys are
`replay.keys`' (shard, anchor); the synchronisation words are `replay.sync_kernels`'.
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
from replay._sync import futex_syscall
from replay.commit_kernel import P_CAPACITY, P_FIELDS, P_ROW_BYTES, SHARD_WORDS
from replay.keys import key_anchor, key_shard
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
from replay.windows import AHEAD, PAGE, STREAM_BATCH_BYTES, copy_window, prefetch_pages

__all__ = ["MAX_GROUPS", "MAX_HELPERS", "CopyHelpers", "copy_batch", "copy_range", "process_helpers"]

_SPINS = 4096  # pauses before a thread waiting for another's group yields its core instead


@nb.njit(cache=True, nogil=True)
def _copy_keys(plan, keys, dst, lo, hi):  # pragma: no cover - numba
    """Rows ``lo .. hi - 1`` of a batch of ``len(keys)`` transitions drawn under the shard mutexes
    (`replay.transition_kernel.sample_transitions`), each row's step found from its key (shard, anchor)
    and the plan's rings."""
    nf = plan[P_FIELDS]
    capacity = plan[P_CAPACITY]
    row_bytes = plan[P_ROW_BYTES : P_ROW_BYTES + nf]
    bases = plan[P_ROW_BYTES + nf + SHARD_WORDS :]
    stride = SHARD_WORDS + nf
    n = hi - lo
    src = np.empty(nf * n, dtype=np.int64)
    for i in range(n):
        key = keys[lo + i]
        s = key_shard(key)
        c = key_anchor(key) % capacity
        for j in range(nf):
            a = bases[s * stride + j] + c * row_bytes[j]
            src[j * n + i] = a
            prefetch_l2_at(a)
    copy_range(src, n, dst, row_bytes, lo, keys.shape[0])


@nb.njit(cache=True, nogil=True)
def copy_range(src, n, dst, row_bytes, lo, k):  # pragma: no cover - numba
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
MAX_GROUPS = _FIELD_MASK  # groups of rows a batch has at most (`copy_batch`'s ``groups``)
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
    count the batch, copy groups of it once it is published, and again, until quit. Quit is read after
    the first bell too: a helper that reaches this loop after `CopyHelpers.stop` rang (its thread
    scheduled late) quits at once instead of waiting for a next bell (stop sets quit before it rings)."""
    seen = fetch_add(ctl, _C_BELL, 0)
    if fetch_add(ctl, _C_QUIT, 0):
        return
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
def copy_batch(ctl, bell, plan, keys, dst, group, groups):  # pragma: no cover - numba
    """Publish batch ``bell`` (`CopyHelpers.ring`'s) to the helpers (`_post`), copy groups of it alongside
    them, and wait until every group is copied. ``ctl`` the helpers' control words (`CopyHelpers.ctl`);
    ``plan`` int64, `replay.commit_kernel.build_plan`'s; ``keys`` int64 [k], the batch's keys
    (`replay.keys`; shard and anchor give each row's step); ``dst`` int64 [F], the address of the slot's
    flat bytes of each field; ``groups`` groups of ``group`` rows (the last may be short), at most
    `MAX_GROUPS`. The caller holds the shard mutexes and ends the batch with `CopyHelpers.close`."""
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
    took `ring`'s return value. Started by the first `ring`; the process's (`process_helpers`) are
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

    def awake(self) -> int:
        """Started helpers not asleep on the bell: spinning for the next batch (`_IDLE_SPINS` pauses after
        the last one) or copying. ``/proc/loadavg`` counts them as running, yet their cores are this
        process's to use (`graphrl.threads.idle_cores`' ``own``). A racy read: a hint, not a count."""
        return max(0, len(self.threads) - int(self.ctl[_C_SLEEP]))

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


def process_helpers() -> CopyHelpers:
    """The process's copy helpers (`replay.transition_kernel.sample_transitions` copies with them): one
    `CopyHelpers` a process, made anew in a forked child."""
    return _HELPERS


def _new_helpers_after_fork() -> None:  # helper threads do not survive fork()
    global _HELPERS
    _HELPERS = CopyHelpers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_helpers_after_fork)

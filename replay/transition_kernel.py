"""The owner's draw of transitions and short windows and their copy into a batch, in one numba call.

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
larger batches keep the lock-free copy.

`sample_transitions` is the whole sample in one call (`replay.table.Table.draw_transitions` makes it,
holding only the table lock): it takes every shard mutex in shard order through
`replay.sync_kernels` (repairing a hole a dead writer's commit left with
`replay.commit_kernel.repair_hole`, as every locker does), checks that the table has ingested every
commit, draws the uniforms from the selector's generator (as ``Generator.random`` does), runs
`draw_transitions` (the selector by address, `selector_words`; the rings and row sizes from the plan;
the slot as addresses ``dst``), releases the shard mutexes and counts the sampled steps under the
control mutex with a wake-up (`replay.rate_limiter.RateLimiterState.sample`). When a shard has
commits the table has not ingested it changes nothing and returns `STALE`: the caller takes the
shard locks in Python, ingests, and calls it again with ``held`` True (the shard mutexes are then the
caller's). The plan is `replay.commit_kernel.build_plan`'s. A batch of ``2 * SPLIT_BYTES`` and more is
copied by the caller and the thread team's helpers, by groups of rows, between the draw's call and a
releasing one (`sample_transitions`' notes), as `graphrl.threads` allows.

With ``window`` (windows of 2 .. `MAX_WINDOW` steps, batches of `LOCKED_WINDOW_BYTES` at most) the
same call runs the lock-free path's own kernels under the locks instead: `draw_kernels.draw_windows`
(bounds from `draw_kernels.window_rows`, the one rule) and `batch_kernels.gather_rows` (its copy).

>>> live = draw_transitions(u, ctree, wtree, False, size, filled, times, written, capacity,
...                         rings, outs, row_bytes, incarnation, keys, prob, mask, 0.4, weights)
>>> words = selector_words(generator, ctree, wtree, False, size, filled, times, written)
>>> status, n, err, died = sample_transitions(plan, False, repairs, words, dst, incarnation, keys, prob,
...                                           mask, 0.4, weights)
"""

from __future__ import annotations

import ctypes

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from graphrl.kernels import Chunks, engaged
from graphrl.kernels.copies import address, store_fence
from graphrl.kernels.prefetch import prefetch_l2_at
from graphrl.threads import idle_cores, threads_for
from replay.batch_kernels import gather_rows
from replay.commit_kernel import (
    P_CAPACITY,
    P_CTL,
    P_CTL_COND,
    P_CTL_MUTEX,
    P_FIELDS,
    P_ROW_BYTES,
    P_SHARDS,
    SHARD_WORDS,
    count_deletes_locked,
    repair_hole,
)
from replay.draw_kernels import draw_items, draw_windows, importance_weights_into
from replay.keys import BACK_BITS, INC_BITS, SHARD_BITS
from replay.rate_limiter import SAMPLES
from replay.shard_layout import META_LEN, WRITE_POS
from replay.sync_kernels import (
    cond_broadcast,
    fetch_add,
    float64_at,
    int64_at,
    mutex_lock_robust,
    mutex_unlock,
    sched_yield,
    spin_pause,
    uint8_at,
)
from replay.windows import AHEAD, PAGE, STREAM_BATCH_BYTES, copy_window, mask_row, prefetch_pages

__all__ = [
    "DRAWN",
    "EMPTY",
    "FAILED",
    "LOCKED_COPY_BYTES",
    "LOCKED_WINDOW_BYTES",
    "MAX_WINDOW",
    "SPLIT_BYTES",
    "GROUP_BYTES",
    "STALE",
    "WORDS",
    "draw_transitions",
    "sample_transitions",
    "selector_words",
]

# sample_transitions' status (_COPYING: `_sample_locked`'s, drawn and not yet copied)
DRAWN, EMPTY, STALE, FAILED, _COPYING = 0, 1, 2, 3, 4
# selector_words' layout
(W_RNG_NEXT_DOUBLE, W_RNG_STATE, W_CTREE, W_WTREE, W_WTREE_COLS, W_TIMES, W_FILLED, W_WRITTEN, W_SIZE,
 W_PRIORITIZED) = range(10)
WORDS = 10

LOCKED_COPY_BYTES = 4 << 20  # output bytes up to which a batch of transitions is copied under the locks
# batches of windows of 2 .. MAX_WINDOW steps of LOCKED_WINDOW_BYTES of output at most: drawn and copied
# in one call under the locks too (docs/performance.md)
MAX_WINDOW = 8
LOCKED_WINDOW_BYTES = 2 << 20
# `sample_transitions` copies a batch of 2 SPLIT_BYTES and more on a thread for every SPLIT_BYTES
# (`graphrl.threads.threads_for`; docs/performance.md)
SPLIT_BYTES = 1 << 20
GROUP_BYTES = 128 << 10  # output bytes of a group of rows, the unit the copying threads claim
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
    """The selector's side of a `sample_transitions` call, by address: int64 [`WORDS`].

    ``generator``'s bit generator's ``next_double`` function and state (``bit_generator.ctypes``), then
    the arrays and numbers `draw_transitions` takes (``ctree`` and ``wtree`` float64 [S, *], ``times``
    int64 [S, C], ``filled`` and ``written`` int64 [S], all C-contiguous). Valid while they live and
    stay where they are: a restore must write into the same arrays and the same generator.

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
def _unlock_shards(plan, n):  # pragma: no cover - numba
    """Unlock the mutexes of shards ``n - 1 .. 0`` (in that order)."""
    nf = plan[P_FIELDS]
    for s in range(n - 1, -1, -1):
        mutex_unlock(plan[P_ROW_BYTES + nf + s * (SHARD_WORDS + nf)])


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
    window: tuple[int, int, np.ndarray] | None = None,
) -> tuple[int, int, int, int]:
    """`draw_transitions` under every shard mutex, then the sample count (see the module docstring).
    The caller holds the table lock. With ``window``, short windows instead of transitions.

    Parameters
    ----------
    plan : numpy.ndarray, int64 [plan_layout(S, F)]
        `replay.commit_kernel.build_plan`'s addresses (the control block's and every shard's).
    held : bool
        The caller holds every shard mutex and has ingested every shard: no locking, no check.
    repairs : numpy.ndarray, int64 [2 S]
        Gets, per shard s, ``repairs[2 s]`` the first position and ``repairs[2 s + 1]`` the length of
        the hole repaired after a dead holder (length 0: none; only written where a holder died).
    words : numpy.ndarray, int64 [`WORDS`]
        `selector_words`: the selector's generator, trees, use counts and the table's ``filled`` and
        ``ingested`` (``written``) as `draw_transitions` takes them, by address. ``len(o_keys)``
        uniforms are drawn from the generator at the draw, exactly as ``Generator.random(len(o_keys))``
        draws them (none when `STALE` or `FAILED` is returned before the draw); the caller holds the
        only lock that guards the generator and the selector.
    dst : numpy.ndarray, int64 [F]
        The address of the slot's flat bytes of each field (the rings and row sizes come from
        ``plan``).
    incarnation, o_keys, o_prob, mask, beta, o_weights
        As `draw_transitions` takes them.
    window : (int, int, numpy.ndarray), optional
        ``(length, pad, meta)``: draw windows of ``length`` (2 .. `MAX_WINDOW`) steps, ``pad`` 0 tail or
        1 head (`replay.windows.PAD_CODES`), as the lock-free path draws them
        (`replay.draw_kernels.draw_windows`: each window's bounds from `replay.draw_kernels.window_rows`),
        and copy them with its copy (`replay.batch_kernels.gather_rows`: padding zeroed, ``mask`` bool
        [>= B * length] filled); ``meta`` int64 [5, B] gets the window table (rows
        `replay.table.META_FIELDS`), ``o_keys`` their keys. In one call, whatever the bytes: the
        caller keeps the batch small (`LOCKED_WINDOW_BYTES`). Codec fields are not copied.

    Returns
    -------
    ``(status, live, err, died)``, all int: status `DRAWN` (``live`` items drawable, ``len(o_keys)``
    steps counted as sampled, or with ``window`` the windows' real steps), `EMPTY` (the table is
    empty: nothing drawn, written or counted), `STALE` (a shard's write position is past ``written``:
    nothing drawn; only with ``held`` False) or `FAILED` (a pthread call failed, its errno in
    ``err``: every mutex this call took is released; the sample count is lost only when the control
    mutex failed, after the draw);
    ``died`` counts the mutexes found with a dead holder.

    Notes
    -----
    A batch of ``2 * SPLIT_BYTES`` and more takes three steps: one compiled call takes the locks and
    draws; the caller and up to ``threads_for(bytes / 4, SPLIT_BYTES / 4) - 1`` helpers of the thread
    team (`graphrl.threads`, `graphrl.kernels.engaged`; at most `graphrl.threads.idle_cores`) copy
    groups of `GROUP_BYTES` of rows, each claimed atomically, so the caller never waits for a helper
    that has not started (it waits only for groups being copied, and the batch is whole when it returns); a
    second call releases the shard mutexes and counts; a signal's exception raised as the draw returns
    (the return value lost) still releases them (`_draw_held` marks them held). When the caller raises
    during the copy, the groups left are claimed and those the helpers began are waited for before that
    release, so no helper reads the rings or writes the slot after it. Smaller batches take the one call.
    """
    if window is not None:
        length, pad, meta = window
        return _sample_windows_locked(
            plan, held, repairs, words, dst, incarnation, length, pad, meta, o_keys, o_prob, mask, beta,
            o_weights,
        )
    job = np.zeros(3, dtype=np.int64)  # groups claimed, groups copied, 1 while the draw's mutexes are held
    counted = 0
    try:  # from the draw on: a signal's exception is raised as a compiled call returns, held mutexes or not
        status, live, err, died = _draw_held(
            plan, held, repairs, words, dst, incarnation, o_keys, o_prob, mask, beta, o_weights,
            2 * SPLIT_BYTES, job,
        )
        if status != _COPYING:
            return status, live, err, died
        # drawn, the shard mutexes held: the copy of ``err`` bytes is left
        k = o_keys.shape[0]
        threads = threads_for(err // 4, SPLIT_BYTES // 4)
        if threads > 1:
            threads = 1 + min(threads - 1, idle_cores(threads))
        if threads <= 1:  # no idle core: the caller copies the whole batch
            _copy_keys(plan, o_keys, dst, 0, k)
        else:
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
            status, err, more = _release(plan, held, counted)
    return status, live, err, died + more


@nb.njit(cache=True, nogil=True)
def _lock_shards(plan, held, repairs, written):  # pragma: no cover - numba
    """Every shard mutex taken in shard order (unless ``held``), a dead holder's hole repaired, and the
    check that the selector has ingested every commit (``written``). Returns ``(status, err, died)``:
    `DRAWN` with every mutex held, or `STALE` / `FAILED` (errno in ``err``) with none held."""
    s_count = plan[P_SHARDS]
    nf = plan[P_FIELDS]
    capacity = plan[P_CAPACITY]
    died = 0
    if held:
        return DRAWN, 0, died
    for s in range(s_count):  # an unlocked read, only a hint: commits to ingest, no lock taken
        meta = int64_at(plan[P_ROW_BYTES + nf + s * (SHARD_WORDS + nf) + 1], META_LEN)
        if meta[WRITE_POS] != written[s]:
            return STALE, 0, died
    for s in range(s_count):
        base = P_ROW_BYTES + nf + s * (SHARD_WORDS + nf)
        rc = mutex_lock_robust(plan[base])
        if rc < 0:
            _unlock_shards(plan, s)
            return FAILED, -rc, died
        if rc == 1:  # its holder died mid-commit: the reserved slots become a hole (repair_hole)
            died += 1
            hole_at, hole, lost = repair_hole(
                int64_at(plan[base + 1], META_LEN), int64_at(plan[base + 2], 3 * capacity), capacity
            )
            repairs[2 * s], repairs[2 * s + 1] = hole_at, hole
            if lost:  # the items the dead commit overwrote: deleted
                rc = count_deletes_locked(plan, lost)
                if rc < 0:
                    _unlock_shards(plan, s + 1)
                    return FAILED, -rc, died
                died += rc
    for s in range(s_count):
        meta = int64_at(plan[P_ROW_BYTES + nf + s * (SHARD_WORDS + nf) + 1], META_LEN)
        if meta[WRITE_POS] != written[s]:
            _unlock_shards(plan, s_count)
            return STALE, 0, died
    return DRAWN, 0, died


@nb.njit(cache=True, nogil=True)
def _uniforms(words, k):  # pragma: no cover - numba
    """``k`` uniforms in [0, 1) from the selector's generator, as ``Generator.random(k)`` fills them
    (``next_double`` of its bit generator, in order)."""
    u = np.empty(k)
    fn, state = words[W_RNG_NEXT_DOUBLE], words[W_RNG_STATE]
    for i in range(k):
        u[i] = _call_double(fn, state)
    return u


@nb.njit(cache=True, nogil=True)
def _selector(words, s_count, capacity):  # pragma: no cover - numba
    """The selector's arrays from `selector_words`: ``(ctree, wtree, prioritized, size, filled, times,
    written)`` as `draw_items` and `draw_transitions` take them."""
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
def _sample_locked(
    plan, held, repairs, words, dst, incarnation, o_keys, o_prob, mask, beta, o_weights, split_bytes
):  # pragma: no cover - numba
    """`sample_transitions` in one call, or, for a batch of ``split_bytes`` and more, all of it but the
    copy and the release: `_COPYING` (live items, the batch's bytes in place of ``err``), the shard
    mutexes still held and nothing counted; `_copy_keys` and `_release` finish the call."""
    s_count = plan[P_SHARDS]
    nf = plan[P_FIELDS]
    capacity = plan[P_CAPACITY]
    ctree, wtree, prioritized, size, filled, times, written = _selector(words, s_count, capacity)
    status, err, died = _lock_shards(plan, held, repairs, written)
    if status != DRAWN:
        return status, 0, err, died
    k = o_keys.shape[0]
    u = _uniforms(words, k)
    batch = 0  # the batch's bytes
    for j in range(nf):
        batch += k * plan[P_ROW_BYTES + j]
    copy = batch < split_bytes
    live = _draw_copy(
        u, ctree, wtree, prioritized, size, filled, times, written, capacity,
        plan[P_ROW_BYTES + nf + SHARD_WORDS :], SHARD_WORDS + nf, plan[P_ROW_BYTES : P_ROW_BYTES + nf], dst,
        incarnation, o_keys, o_prob, mask, beta, o_weights, copy,
    )
    if live < 0.5:
        if not held:
            _unlock_shards(plan, s_count)
        return EMPTY, 0, 0, died
    n = np.int64(live + 0.5)
    if not copy:
        return _COPYING, n, batch, died
    status, err, more = _release(plan, held, k)
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


@nb.njit(cache=True, nogil=True)
def _sample_windows_locked(
    plan, held, repairs, words, dst, incarnation, length, pad, meta, o_keys, o_prob, mask, beta, o_weights
):  # pragma: no cover - numba
    """`sample_transitions` of windows of ``length`` steps (its ``window``), in one call."""
    s_count = plan[P_SHARDS]
    capacity = plan[P_CAPACITY]
    ctree, wtree, prioritized, size, filled, times, written = _selector(words, s_count, capacity)
    status, err, died = _lock_shards(plan, held, repairs, written)
    if status != DRAWN:
        return status, 0, err, died
    u = _uniforms(words, o_keys.shape[0])
    live, real = _draw_window_copy(
        u, ctree, wtree, prioritized, size, filled, times, written, plan, dst, length, pad, incarnation,
        meta, o_keys, o_prob, mask, beta, o_weights,
    )
    if live < 0.5:
        if not held:
            _unlock_shards(plan, s_count)
        return EMPTY, 0, 0, died
    status, err, more = _release(plan, held, real)
    return status, np.int64(live + 0.5), err, died + more


@nb.njit(cache=True, nogil=True)
def _draw_window_copy(
    u, ctree, wtree, prioritized, size, filled, times, written, plan, dst, length, pad, incarnation,
    meta, o_keys, o_prob, mask, beta, o_weights,
):  # pragma: no cover - numba
    """`replay.draw_kernels.draw_windows` (the draw, then each window's bounds from `window_rows`) into
    ``meta`` (int64 [5, k], rows `replay.table.META_FIELDS`), ``o_keys`` and ``o_prob``, the importance
    weights into ``o_weights`` (or empty for none), then `replay.batch_kernels.gather_rows` (the lock-free
    window path's copy and mask) from the plan's rings into the slot at ``dst``, every field of a ring
    (row bytes > 0). Returns ``(live, real)``: the live items (below 0.5 nothing is drawn or written)
    and the windows' real steps."""
    s_count = plan[P_SHARDS]
    nf = plan[P_FIELDS]
    capacity = plan[P_CAPACITY]
    stride = SHARD_WORDS + nf
    at = P_ROW_BYTES + nf  # shard 0's words
    steps = [  # each shard's step index [C, 3] and record ring [C, 4], as `window_rows` reads them
        int64_at(plan[at + s * stride + 2], 3 * capacity).reshape((capacity, 3)) for s in range(s_count)
    ]
    records = [
        int64_at(plan[at + s * stride + 3], 4 * capacity).reshape((capacity, 4)) for s in range(s_count)
    ]
    k = u.shape[0]
    live = draw_windows(
        u, ctree, wtree, prioritized, size, filled, times, steps, records, written, capacity, length, pad, 0,
        meta[0], meta[1], meta[2], meta[3], meta[4], o_prob, incarnation, o_keys,
    )
    if live < 0.5:
        return live, 0
    if o_weights.shape[0] > 0:
        importance_weights_into(o_prob, np.int64(live + 0.5), beta, o_weights)
    raw = 0  # fields with a ring (a codec field has row bytes 0 in the plan)
    for j in range(nf):
        raw += plan[P_ROW_BYTES + j] > 0
    row_bytes = np.empty(raw, dtype=np.int64)
    outs = []
    r = 0
    for j in range(nf):
        rb = plan[P_ROW_BYTES + j]
        if rb > 0:
            row_bytes[r] = rb
            outs.append(uint8_at(dst[j], k * length * rb))
            r += 1
    rings = []
    for s in range(s_count):
        for j in range(nf):
            rb = plan[P_ROW_BYTES + j]
            if rb > 0:
                rings.append(uint8_at(plan[at + s * stride + SHARD_WORDS + j], capacity * rb))
    stream = k * length * row_bytes.sum() >= STREAM_BATCH_BYTES  # as `replay.batch_kernels.BatchCopy`
    window = (meta[0], meta[2], meta[3], meta[4])  # shard, first, n, dst
    gather_rows(rings, outs, row_bytes, capacity, *window, 0, k, length, mask, stream)
    real = 0
    for i in range(k):
        real += meta[3, i]
    return live, real


@nb.njit(cache=True, nogil=True)
def _release(plan, held, count):  # pragma: no cover - numba
    """The end of `sample_transitions` after the copy: the shard mutexes unlocked (unless ``held``), then
    ``count`` steps (> 0) counted as sampled under the control mutex with a wake-up. Returns
    ``(status, err, died)``: `DRAWN`, or `FAILED` with the control mutex's errno."""
    if not held:
        _unlock_shards(plan, plan[P_SHARDS])
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

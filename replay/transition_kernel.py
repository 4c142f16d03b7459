"""The owner's draw of single-step windows (transitions) and their copy into a batch, in one numba call.

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
caller's). The plan is `replay.commit_kernel.build_plan`'s.

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

from graphrl.kernels.copies import address, store_fence
from graphrl.kernels.prefetch import prefetch_l2_at
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
from replay.draw_kernels import draw_items, importance_weights_into
from replay.keys import BACK_BITS, INC_BITS, SHARD_BITS
from replay.rate_limiter import SAMPLES
from replay.shard_layout import META_LEN, WRITE_POS
from replay.sync_kernels import (
    cond_broadcast,
    float64_at,
    int64_at,
    mutex_lock_robust,
    mutex_unlock,
    uint8_at,
)
from replay.windows import AHEAD, PAGE, STREAM_BATCH_BYTES, copy_window, mask_row, prefetch_pages

__all__ = [
    "DRAWN",
    "EMPTY",
    "FAILED",
    "LOCKED_COPY_BYTES",
    "STALE",
    "WORDS",
    "draw_transitions",
    "sample_transitions",
    "selector_words",
]

# sample_transitions' status
DRAWN, EMPTY, STALE, FAILED = 0, 1, 2, 3
# selector_words' layout
(W_RNG_NEXT_DOUBLE, W_RNG_STATE, W_CTREE, W_WTREE, W_WTREE_COLS, W_TIMES, W_FILLED, W_WRITTEN, W_SIZE,
 W_PRIORITIZED) = range(10)
WORDS = 10

LOCKED_COPY_BYTES = 4 << 20  # output bytes up to which a batch of transitions is copied under the locks


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
        bases, nf, row_bytes, dst, incarnation, o_keys, o_prob, mask, beta, o_weights,
    )


@nb.njit(cache=True, nogil=True)
def _draw_copy(
    u, ctree, wtree, prioritized, size, filled, times, written, capacity,
    bases, stride, row_bytes, dst, incarnation, o_keys, o_prob, mask, beta, o_weights,
):  # pragma: no cover - numba
    """`draw_transitions` over addresses: shard s's ring of field j at ``bases[s * stride + j]``, the
    slot's field j at ``dst[j]`` (int64 [F])."""
    k = u.shape[0]
    shard = np.empty(k, dtype=np.int64)
    slot = np.empty(k, dtype=np.int64)
    live = draw_items(u, ctree, wtree, prioritized, size, filled, times, True, shard, slot, o_prob)
    if live < 0.5:
        return live
    if o_weights.shape[0] > 0:
        importance_weights_into(o_prob, np.int64(live + 0.5), beta, o_weights)
    nf = row_bytes.shape[0]
    src = np.empty(nf * k, dtype=np.int64)  # field j of row i: the address of its step in the ring
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
    streamed = False
    for j in range(nf):  # constant row sizes copy with a move or two, not a memcpy call each
        rb = row_bytes[j]
        out = uint8_at(dst[j], k * rb)
        if rb == 1:
            _copy_rows(out, src, j * k, k, 1)
        elif rb == 2:
            _copy_rows(out, src, j * k, k, 2)
        elif rb == 4:
            _copy_rows(out, src, j * k, k, 4)
        elif rb == 8:
            _copy_rows(out, src, j * k, k, 8)
        elif rb == 16:
            _copy_rows(out, src, j * k, k, 16)
        elif rb == 32:
            _copy_rows(out, src, j * k, k, 32)
        elif rb >= PAGE:
            stream = k * rb >= STREAM_BATCH_BYTES  # a field's page rows: streamed from 1 MiB
            streamed |= stream
            _copy_pages(out, src, j * k, k, rb, stream)
        else:
            _copy_rows(out, src, j * k, k, rb)
    if streamed:  # the streaming stores reach memory before the batch is handed out
        store_fence()
    return live


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


@nb.njit(cache=True, nogil=True)
def sample_transitions(
    plan, held, repairs, words, dst, incarnation, o_keys, o_prob, mask, beta, o_weights
):  # pragma: no cover - numba
    """`draw_transitions` under every shard mutex, then the sample count, as one call (see the module
    docstring). The caller holds the table lock.

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

    Returns
    -------
    ``(status, live, err, died)``, all int: status `DRAWN` (``live`` items drawable, ``len(o_keys)``
    steps counted as sampled), `EMPTY` (the table is empty: nothing drawn, written or counted),
    `STALE` (a shard's write position is past ``written``: nothing drawn; only with ``held`` False)
    or `FAILED` (a pthread call failed, its errno in ``err``: every mutex this call took is
    released; the sample count is lost only when the control mutex failed, after the draw);
    ``died`` counts the mutexes found with a dead holder.
    """
    s_count = plan[P_SHARDS]
    nf = plan[P_FIELDS]
    capacity = plan[P_CAPACITY]
    size = words[W_SIZE]
    wcols = words[W_WTREE_COLS]
    written = int64_at(words[W_WRITTEN], s_count)
    died = 0
    if not held:
        for s in range(s_count):  # an unlocked read, only a hint: commits to ingest, no lock taken
            meta = int64_at(plan[P_ROW_BYTES + nf + s * (SHARD_WORDS + nf) + 1], META_LEN)
            if meta[WRITE_POS] != written[s]:
                return STALE, 0, 0, died
        for s in range(s_count):
            base = P_ROW_BYTES + nf + s * (SHARD_WORDS + nf)
            rc = mutex_lock_robust(plan[base])
            if rc < 0:
                _unlock_shards(plan, s)
                return FAILED, 0, -rc, died
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
                        return FAILED, 0, -rc, died
                    died += rc
        for s in range(s_count):
            meta = int64_at(plan[P_ROW_BYTES + nf + s * (SHARD_WORDS + nf) + 1], META_LEN)
            if meta[WRITE_POS] != written[s]:
                _unlock_shards(plan, s_count)
                return STALE, 0, 0, died
    u = np.empty(o_keys.shape[0])
    fn, state = words[W_RNG_NEXT_DOUBLE], words[W_RNG_STATE]
    for i in range(u.shape[0]):  # Generator.random's fill: next_double of the bit generator, in order
        u[i] = _call_double(fn, state)
    live = _draw_copy(
        u,
        float64_at(words[W_CTREE], s_count * 2 * size).reshape((s_count, 2 * size)),
        float64_at(words[W_WTREE], s_count * wcols).reshape((s_count, wcols)),
        words[W_PRIORITIZED] != 0,
        size,
        int64_at(words[W_FILLED], s_count),
        int64_at(words[W_TIMES], s_count * capacity).reshape((s_count, capacity)),
        written,
        capacity,
        plan[P_ROW_BYTES + nf + SHARD_WORDS :], SHARD_WORDS + nf, plan[P_ROW_BYTES : P_ROW_BYTES + nf], dst,
        incarnation, o_keys, o_prob, mask, beta, o_weights,
    )
    if not held:
        _unlock_shards(plan, s_count)
    if live < 0.5:
        return EMPTY, 0, 0, died
    n = np.int64(live + 0.5)
    ctl_mutex = plan[P_CTL_MUTEX]
    rc = mutex_lock_robust(ctl_mutex)
    if rc < 0:
        return FAILED, n, -rc, died
    died += rc
    ctl = int64_at(plan[P_CTL], SAMPLES + 1)
    ctl[SAMPLES] += u.shape[0]
    cond_broadcast(plan[P_CTL_COND])
    mutex_unlock(ctl_mutex)
    return DRAWN, n, 0, died

"""The owner's draw of short windows and their copy into a batch, in one numba call under the locks.

`sample_windows` draws a batch of windows of 2 .. `MAX_WINDOW` steps of a `fused` table and copies
them into a staging slot with the table lock (taken in Python) and every shard mutex held, so no
writer can overwrite a ring slot during the copy: the batch needs no staleness check and no redraw.
It runs the lock-free path's own kernels under the locks: `replay.draw_kernels.draw_windows` (the
draw, each window's bounds from `replay.draw_kernels.window_rows`, the one rule) and
`replay.batch_kernels.gather_rows` (the copy, padding zeroed, and the mask), so the batch is the
lock-free path's for the same uniforms. The locks, the ingest check, the uniforms and the sample count
are `replay.locked_draw`'s, as for transitions (`replay.transition_kernel`).

`replay.sampler.WindowSampler` takes this path (through `replay.table.Table.draw_windows_locked`) only
for host batches of `LOCKED_WINDOW_BYTES` of output at most and tables without codec fields; a writer
waits at most that copy.

>>> status, live, err, died = sample_windows(plan, False, repairs, words, dst, incarnation, length, pad,
...                                         meta, keys, prob, mask, 0.4, weights)
"""

from __future__ import annotations

import numba as nb
import numpy as np

from replay.batch_kernels import gather_rows
from replay.commit_kernel import P_CAPACITY, P_FIELDS, P_ROW_BYTES, P_SHARDS, SHARD_WORDS
from replay.draw_kernels import draw_windows, importance_weights_into
from replay.locked_draw import DRAWN, EMPTY, lock_shards, release, selector, uniforms, unlock_shards
from replay.sync_kernels import int64_at, uint8_at
from replay.windows import STREAM_BATCH_BYTES

__all__ = ["LOCKED_WINDOW_BYTES", "MAX_WINDOW", "sample_windows"]

# batches of windows of 2 .. MAX_WINDOW steps of LOCKED_WINDOW_BYTES of output at most are drawn and
# copied under the locks (docs/performance.md)
MAX_WINDOW = 8
LOCKED_WINDOW_BYTES = 2 << 20


def sample_windows(
    plan: np.ndarray,
    held: bool,
    repairs: np.ndarray,
    words: np.ndarray,
    dst: np.ndarray,
    incarnation: int,
    length: int,
    pad: int,
    meta: np.ndarray,
    o_keys: np.ndarray,
    o_prob: np.ndarray,
    mask: np.ndarray,
    beta: float,
    o_weights: np.ndarray,
) -> tuple[int, int, int, int]:
    """Draw ``len(o_keys)`` windows of ``length`` steps under every shard mutex, copy them, then count
    their real steps as sampled (see the module docstring). The caller holds the table lock.

    Parameters
    ----------
    plan, held, repairs, words
        As `replay.transition_kernel.sample_transitions` takes them (`replay.locked_draw`).
    dst : numpy.ndarray, int64 [F]
        The address of the slot's flat bytes of each field (``len(o_keys) * length`` steps a field).
    incarnation : int
        Stamped into the keys (`replay.keys.encode_keys`).
    length, pad : int
        Window length (2 .. `MAX_WINDOW`) and padding, 0 tail or 1 head (`replay.windows.PAD_CODES`).
    meta : numpy.ndarray, int64 [5, B]
        Gets the window table (rows `replay.table.META_FIELDS`).
    o_keys, o_prob : numpy.ndarray, int64 [B], float64 [B]
        Get the keys and the draw probabilities.
    mask : numpy.ndarray, bool [>= B * length]
        Gets the windows' mask (padding False).
    beta : float
        Importance-weight exponent; ``o_weights`` float32 [B] (or empty for none) gets the weights.

    Returns
    -------
    ``(status, live, err, died)`` as `sample_transitions` returns them, the count being the windows' real
    steps. In one call, whatever the bytes: the caller keeps the batch small (`LOCKED_WINDOW_BYTES`).
    Codec fields are not copied.
    """
    return _sample_windows_locked(
        plan, held, repairs, words, dst, incarnation, length, pad, meta, o_keys, o_prob, mask, beta, o_weights
    )


@nb.njit(cache=True, nogil=True)
def _sample_windows_locked(
    plan, held, repairs, words, dst, incarnation, length, pad, meta, o_keys, o_prob, mask, beta, o_weights
):  # pragma: no cover - numba
    """`sample_windows` in one compiled call."""
    s_count = plan[P_SHARDS]
    capacity = plan[P_CAPACITY]
    ctree, wtree, prioritized, size, filled, times, written = selector(words, s_count, capacity)
    status, err, died = lock_shards(plan, held, repairs, written)
    if status != DRAWN:
        return status, 0, err, died
    u = uniforms(words, o_keys.shape[0])
    live, real = _draw_window_copy(
        u, ctree, wtree, prioritized, size, filled, times, written, plan, dst, length, pad, incarnation,
        meta, o_keys, o_prob, mask, beta, o_weights,
    )
    if live < 0.5:
        if not held:
            unlock_shards(plan, s_count)
        return EMPTY, 0, 0, died
    status, err, more = release(plan, held, real)
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

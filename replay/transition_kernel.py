"""The owner's draw of single-step windows (transitions) and their copy into a batch, in one numba call.

`draw_transitions` is what `replay.draw_kernels.draw_windows` followed by
`replay.batch_kernels.gather_rows` compute for windows of one step, fused: the selector's draw as
one table over the shards (`replay.draw_kernels.draw_items`: the same rows, probabilities and use
counts for the same uniforms), each anchor's key, the copy of its step from every field's ring into
the staging slot's flat byte views, and the mask. A window of one step is its anchor whatever the
padding (first = anchor, one real step, offset 0), so the step index and the record ring are not
read at all.

`replay.table.Table.draw_transitions` calls it with the table lock and every shard lock held, so no
writer can overwrite a ring slot during the copy: the batch needs no staleness check and no redraw.
`replay.sampler.WindowSampler` takes this path only for host batches of small transitions
(`LOCKED_COPY_BYTES` of output at most), so a writer waits a few microseconds at most; larger
batches keep the lock-free copy.

>>> live = draw_transitions(u, ctree, wtree, False, size, filled, times, written, capacity,
...                         rings, outs, row_bytes, incarnation, keys, prob, mask, 0.4, weights)
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels import copy_bytes, prefetch_l2
from replay.draw_kernels import draw_items, importance_weights_into
from replay.keys import BACK_BITS, INC_BITS, SHARD_BITS

__all__ = ["LOCKED_COPY_BYTES", "draw_transitions"]

LOCKED_COPY_BYTES = 1 << 18  # output bytes up to which a batch of transitions is copied under the locks


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
    k = u.shape[0]
    shard = np.empty(k, dtype=np.int64)
    slot = np.empty(k, dtype=np.int64)
    live = draw_items(u, ctree, wtree, prioritized, size, filled, times, True, shard, slot, o_prob)
    if live < 0.5:
        return live
    if o_weights.shape[0] > 0:
        importance_weights_into(o_prob, np.int64(live + 0.5), beta, o_weights)
    nf = row_bytes.shape[0]
    for j in range(nf):  # independent reads at random places: ask for all of them first
        rb = row_bytes[j]
        for i in range(k):
            prefetch_l2(rings[shard[i] * nf + j], slot[i] * rb)
    inc_bits = (incarnation % (1 << INC_BITS)) << (SHARD_BITS + BACK_BITS)
    for i in range(k):
        s = shard[i]
        c = slot[i]
        anchor = c + capacity * ((written[s] - 1 - c) // capacity)
        o_keys[i] = (anchor << (SHARD_BITS + BACK_BITS + INC_BITS)) | inc_bits | s
        mask[i] = True
    for j in range(nf):
        rb = row_bytes[j]
        out = outs[j]
        last = -1
        src = rings[j]
        for i in range(k):
            if shard[i] != last:
                last = shard[i]
                src = rings[last * nf + j]
            copy_bytes(out, i * rb, src, slot[i] * rb, rb)
    return live

"""The numba kernel of a shard commit: copy a chunk of steps into the rings and stamp the step index.

`write_steps` is the data half of `replay.shard.ShardStorage.commit` (called with the shard lock
held, after the reserve position is published): it counts the live items the chunk overwrites,
copies the chunk's rows of every field into the rings as one flat byte run each (two when the run
wraps past the ring's end) and writes each slot's record id, commit sequence number and flags.
Arrays in, the overwritten count out.

>>> overwritten = write_steps(rings, srcs, row_bytes, capacity, first, count, steps, record, seq, lo, hi)
"""

from __future__ import annotations

import numba as nb

from graphrl.kernels import copy_bytes

__all__ = ["write_steps"]


@nb.njit(cache=True, nogil=True)
def write_steps(
    rings, srcs, row_bytes, capacity, first, count, steps, record, seq_base, lo, hi
):  # pragma: no cover - numba
    """Commit rows ``[0, count)`` of ``srcs`` at slot ``first`` of ``rings`` (flat uint8, per field).

    ``steps`` (int64 [C, 3]): per slot record id, sequence number, flags. Positions ``lo .. hi - 1``
    are the live ones being overwritten; returns how many of them were items (not holes, not
    removed by ``max_times_sampled``: flag 1).
    """
    overwritten = 0
    for p in range(lo, hi):
        c = p % capacity
        if steps[c, 0] >= 0 and (steps[c, 2] & 1) == 0:
            overwritten += 1
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

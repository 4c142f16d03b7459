"""The owner's batch copy: windows of every shard into a staging slot in one numba call, mask included.

`gather_rows` copies rows ``[lo, hi)`` of a drawn window table (shard, absolute first position,
real steps, offset in the window) out of the rings of all shards into the flat byte views of a
staging slot, zeroes the padding and fills the mask, with the one CPU ring gather
(`replay.windows.copy_window`, `replay.windows.mask_row`) as `replay.windows.gather_fields` uses it
for one shard, without grouping the rows by shard first. The rings come as one sequence indexed
``shard * F + field`` (a tuple for one shard, a numba typed list for more, an empty tuple when every
field has a codec: then only the mask is filled, `replay.chunk_decode` decodes). `BatchCopy` holds those
sequences for a storage and runs the copy on the process's thread team (`graphrl.kernels.parallel_for`)
when the batch is large enough that a second thread pays (chunks of at least ``_CHUNK_BYTES`` of
output), with as many threads as the thread policy gives (`graphrl.threads`).
`replay.sampler.WindowSampler` uses it for host batches.

>>> copy = BatchCopy(storage)
>>> copy.run(shard, first, n, dst, 0, b, flat, mask, length)
"""

from __future__ import annotations

import numba as nb
import numpy as np

from graphrl.kernels import parallel_for, prefetch_l2, store_fence
from graphrl.threads import threads_for
from replay.storage import TrajectoryStorage
from replay.windows import AHEAD, PAGE, STREAM_BATCH_BYTES, copy_window, mask_row, prefetch_pages

__all__ = ["BatchCopy", "gather_rows"]

_CHUNK_BYTES = 1 << 22  # output bytes per chunk of a threaded copy (at least one chunk a thread)
_PARALLEL_BYTES = 2 * _CHUNK_BYTES  # batches of at least this many bytes are copied on the thread team
_PREFETCH_BYTES = 256  # a field's windows of at most this many bytes get their first line prefetched


@nb.njit(cache=True, nogil=True)
def gather_rows(
    rings, outs, row_bytes, capacity, shard, first, n, dst, lo, hi, length, mask, stream
):  # pragma: no cover - numba
    """Copy windows ``lo .. hi - 1`` into ``outs`` (per field, uint8 [R * length * row_bytes[j]]).

    ``rings[s * F + j]``: shard s's field j as flat bytes (an empty tuple and ``outs``, ``row_bytes``
    empty when no field is raw: only the mask is filled); ``first`` absolute positions (the slot is
    ``first % capacity``); ``mask`` (bool [R * length]) gets ``dst <= j < dst + n``. ``stream``:
    streaming stores for runs of `replay.windows.STREAM_PIECE` bytes and more.
    """
    if len(rings) > 0:  # an empty tuple (no raw field): skipped untyped (`replay.commit_kernel.write_steps`)
        nf = row_bytes.shape[0]
        slots = np.empty(hi - lo, dtype=np.int64)
        for b in range(lo, hi):
            slots[b - lo] = first[b] % capacity
        for j in range(nf):  # a field's short runs at random places: ask for all of them before any copy
            rb = row_bytes[j]
            if length * rb <= _PREFETCH_BYTES:
                for b in range(lo, hi):
                    prefetch_l2(rings[shard[b] * nf + j], slots[b - lo] * rb)
        for j in range(nf):
            rb = row_bytes[j]
            out = outs[j]
            last = -1
            src = rings[j]
            ahead = AHEAD if rb >= PAGE else 0
            for b in range(lo, min(lo + ahead, hi)):
                prefetch_pages(rings[shard[b] * nf + j], rb, capacity, slots[b - lo], n[b])
            for b in range(lo, hi):
                if ahead and b + ahead < hi:
                    a = b + ahead
                    prefetch_pages(rings[shard[a] * nf + j], rb, capacity, slots[a - lo], n[a])
                if shard[b] != last:
                    last = shard[b]
                    src = rings[last * nf + j]
                copy_window(
                    out, b * length * rb, src, rb, capacity, slots[b - lo], n[b], dst[b], length, stream
                )
    for b in range(lo, hi):
        mask_row(mask, b * length, n[b], dst[b], length)
    if stream:
        store_fence()


class BatchCopy:
    """`gather_rows` over one storage's shards (see the module docstring).

    Parameters
    ----------
    storage : TrajectoryStorage
        An owner's or an attached storage (only its rings are read).
    threads : int, optional
        Threads that may copy, the caller included; default (None) the thread policy's count for each
        batch (`graphrl.threads.threads_for`: a thread for every ``_CHUNK_BYTES`` of output).
    """

    def __init__(self, storage: TrajectoryStorage, threads: int | None = None) -> None:
        spec = storage.spec
        raw = [n for n in spec if spec[n].codec is None]  # a codec field has no ring (`replay.chunk_decode`)
        self.fields = None if len(raw) == len(spec) else [j for j, n in enumerate(spec) if n in raw]
        flat = [sh.columns[n].reshape(-1).view(np.uint8) for sh in storage.shards for n in raw]
        # an empty tuple when no field is raw (a typed list needs an item to be typed)
        self.rings = tuple(flat) if storage.num_shards == 1 or not flat else nb.typed.List(flat)
        self.row_bytes = np.array([spec[n].row_bytes for n in raw], dtype=np.int64)
        self.step_bytes = int(self.row_bytes.sum())
        self.capacity = storage.capacity
        self.threads = None if threads is None else int(threads)

    def run(
        self,
        shard: np.ndarray,
        first: np.ndarray,
        n: np.ndarray,
        dst: np.ndarray,
        lo: int,
        hi: int,
        flat: tuple[np.ndarray, ...],
        mask: np.ndarray,
        length: int,
    ) -> None:
        """Copy windows ``lo .. hi - 1`` (int64 [B] arrays, rows of the batch) into the slot's
        ``flat`` views (per spec field; a codec field's is left alone) and its flat ``mask`` (bool
        [B * length])."""
        if self.fields is not None:
            flat = tuple(flat[j] for j in self.fields)
        total = (hi - lo) * length * self.step_bytes
        stream = total >= STREAM_BATCH_BYTES
        threads = 1
        if total >= _PARALLEL_BYTES and hi - lo >= 2:
            threads = threads_for(total // 4, _CHUNK_BYTES // 4) if self.threads is None else self.threads
        if threads <= 1:  # one chunk: on this thread
            rings = (self.rings, flat, self.row_bytes, self.capacity)
            gather_rows(*rings, shard, first, n, dst, lo, hi, length, mask, stream)
            return
        chunks = min(hi - lo, max(threads, total // _CHUNK_BYTES), 4 * threads)
        args = (self.rings, flat, self.row_bytes, self.capacity, shard, first, n, dst)
        rows = hi - lo

        def chunk(i: int) -> None:
            a, b = lo + rows * i // chunks, lo + rows * (i + 1) // chunks
            gather_rows(*args, a, b, length, mask, stream)

        parallel_for(chunk, chunks, threads)

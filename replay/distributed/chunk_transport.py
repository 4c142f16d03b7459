"""How a codec field's windows travel: compressed chunks from the shard, decompressed by the learner.

A field with a codec (`replay.spec.FieldSpec` ``codec``) is held by a shard as compressed chunks of
steps (`replay.chunk_codec.ChunkRing`). For the windows a shard draws, `pack_field` (the shard, its
lock held) lists one *job* per run of a window's steps inside one complete chunk, as
`replay.chunk_decode.plan_windows` does for a local sampler, and copies the raw rows of the chunk
still being filled; `gather_chunks` (after the lock) copies each chunk the jobs read once into one
blob of compressed bytes, which the shard puts into Ray's object store. The learner maps the blob
zero-copy and `unpack_field` decompresses the jobs straight into its staging slot with the codec's
compiled entry points (`replay.chunk_decode.decode_jobs`) and copies the raw rows: the actor
compresses, the learner decompresses, and the bytes that travel are the compressed ones.

The shard drops the jobs of windows overwritten during the copy (`FieldPack.take`), as it drops
their windows: a kept window's chunks were intact while they were copied (a chunk's arena bytes are
reused only once all its positions are below the shard's floor, docs/architecture.md#replay-composition).
Each job carries its chunk's index and checksum (`replay.chunk_encode.chunk_checksum`, read from the
chunk table under the lock), and the learner's decode checks the bytes it received against it before
decoding them: a chunk damaged in transit (or in the shard's memory) raises naming the shard, the field
and the chunk, never decodes as other rows; a job or copy record pointing outside its window's row, its
chunk or the tail rows raises too, before any copy.

References
----------
DeepMind Reverb (chunks travel compressed from the server, samplers decompress); numcodecs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from graphrl.kernels import copy_bytes
from replay.chunk_codec import ChunkRing
from replay.chunk_decode import KINDS, ZSTD, decode_jobs

__all__ = ["CODEC_KINDS", "FieldPack", "gather_chunks", "pack_field", "unpack_field"]

CODEC_KINDS = KINDS  # every codec name of `replay.spec.CODECS` -> its `decode_jobs` kind


@dataclass
class FieldPack:
    """One codec field's share of a shard reply: what the learner decodes, and from where.

    Attributes
    ----------
    field : int
        The field's index in the spec.
    name : str
        The field's name.
    shard : int
        The index of the shard that packed it (for messages).
    kind : int
        Codec kind (`CODEC_KINDS`).
    chunk : int
        Steps per chunk.
    jobs : numpy.ndarray, int64 [J, 8]
        Per run of a window's steps in one chunk: blob offset, compressed length, output byte offset
        (from the reply's first window row), first row in the chunk, rows, window, chunk index,
        checksum (`decode_jobs`).
    copies : numpy.ndarray, int64 [M, 4]
        Per run of a window's steps in the open chunk: byte offset in the tail rows, bytes, output
        byte offset, window.
    offsets, sizes : numpy.ndarray, int64 [K]
        Arena offset and length of each chunk of the blob, in blob order (the shard's `gather_chunks`).
    tail : numpy.ndarray, uint8
        The open chunk's raw rows (empty when no window reads them).
    """

    field: int
    name: str
    shard: int
    kind: int
    chunk: int
    jobs: np.ndarray
    copies: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    tail: np.ndarray

    def take(self, keep: np.ndarray, row: np.ndarray, length: int, row_bytes: int) -> FieldPack:
        """The jobs of kept windows only, renumbered: ``keep`` bool [W], ``row`` int64 [W] the new row
        of each kept window; output offsets move with the rows (windows of ``length`` steps)."""
        out = []
        for arr, w in ((self.jobs, 5), (self.copies, 3)):
            a = arr[keep[arr[:, w]]]
            shift = (row[a[:, w]] - a[:, w]) * (length * row_bytes)
            a[:, 2] += shift
            a[:, w] = row[a[:, w]]
            out.append(a)
        jobs, copies = out
        return FieldPack(self.field, self.name, self.shard, self.kind, self.chunk, jobs, copies, self.offsets,
                         self.sizes, self.tail)

    @property
    def blob_bytes(self) -> int:
        """Bytes of the compressed chunks the jobs read."""
        return int(self.sizes.sum())


def pack_field(
    ring: ChunkRing, field: int, kind: int, first: np.ndarray, n: np.ndarray, dst: np.ndarray, length: int,
    shard: int,
) -> FieldPack:
    """The jobs of one codec field for windows ``first``, ``n``, ``dst`` (int64 [W]: absolute first
    position, real steps, offset in the window), each in its own row ``0 .. W - 1`` of ``length`` steps,
    packed by shard ``shard``.

    Call it with the shard lock held (it reads the ring's chunk table and copies its open chunk's
    rows). A step whose chunk is not held (below the floor: a stale window) gets no job; its window
    is dropped by the shard's staleness check.

    Raises
    ------
    RuntimeError
        A live step's chunk is not in the ring's chunk table (a corrupt table).
    """
    c, rb = ring.chunk, int(ring.chunk_bytes // ring.chunk)
    n = np.asarray(n, np.int64)
    first = np.asarray(first, np.int64)
    k0 = first // c
    cnt = np.where(n > 0, (first + n - 1) // c - k0 + 1, 0)
    total = int(cnt.sum())
    win = np.repeat(np.arange(len(first), dtype=np.int64), cnt)
    k = np.repeat(k0, cnt) + (np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    f = first[win]
    lo = np.maximum(f, k * c)
    rows = np.minimum(f + n[win], (k + 1) * c) - lo
    within = lo - k * c
    out = (win * length + dst[win] + lo - f) * rb
    nxt = ring.next_position
    is_open = k == nxt // c
    slot = ring.table[k % ring.slots]
    held = ~is_open & (slot[:, 0] == k)
    lost = ~is_open & ~held & (lo >= max(0, nxt - ring.capacity)) & (lo + rows <= nxt)
    if lost.any():  # live steps whose chunk the table does not name
        raise RuntimeError(
            f"shard {shard}, field {ring.name!r}: chunk {int(k[lost][0])}, which holds live positions, is "
            "not in the chunk table (a corrupt table)"
        )
    uk, inv = np.unique(k[held], return_inverse=True)
    entries = ring.table[uk % ring.slots]
    offsets, sizes = entries[:, 1].copy(), entries[:, 2].copy()
    blob_at = np.cumsum(sizes) - sizes
    jobs = np.stack([blob_at[inv], sizes[inv], out[held], within[held], rows[held], win[held], uk[inv],
                     entries[inv, 3]], axis=1).reshape(-1, 8)
    order = np.argsort(jobs[:, 0], kind="stable")  # jobs of one chunk in a row: decoded once
    copies = np.stack([within[is_open] * rb, rows[is_open] * rb, out[is_open], win[is_open]], axis=1)
    tail = ring.tail.reshape(-1).view(np.uint8).copy() if is_open.any() else np.zeros(0, np.uint8)
    return FieldPack(field, ring.name, shard, kind, c, jobs[order], copies.reshape(-1, 4), offsets, sizes,
                     tail)


@nb.njit(cache=True, nogil=True)
def _gather(arena, offsets, sizes, out):  # pragma: no cover - numba
    at = 0
    for i in range(offsets.shape[0]):
        copy_bytes(out, at, arena, offsets[i], sizes[i])
        at += sizes[i]


def gather_chunks(ring: ChunkRing, pack: FieldPack) -> np.ndarray:
    """The compressed bytes of ``pack``'s chunks, concatenated (uint8 [sum of sizes]); no lock needed
    (the shard's staleness check afterwards drops every window whose chunk was reused meanwhile)."""
    out = np.empty(pack.blob_bytes, np.uint8)
    _gather(ring.arena, pack.offsets, pack.sizes, out)
    return out


@nb.njit(cache=True, nogil=True)
def _copy_rows(tail, copies, base, out):  # pragma: no cover - numba
    for i in range(copies.shape[0]):
        copy_bytes(out, base + copies[i, 2], tail, copies[i, 0], copies[i, 1])


def _check_records(pack: FieldPack, out_bytes: int, row0: int, length: int, row_bytes: int) -> None:
    """Raise RuntimeError naming the shard, the field and the word when a job or copy record of ``pack``
    would write outside its window's row of ``out`` (``out_bytes`` bytes, windows from row ``row0``) or
    read outside its chunk or ``pack.tail``: the compiled copies check nothing."""
    wb = length * row_bytes
    windows = out_bytes // wb - row0  # window rows ``out`` holds from row0 on
    j, c = pack.jobs, pack.copies
    win_j, win_c = j[:, 5], c[:, 3]
    first, rows = j[:, 3], j[:, 4]
    # each check only on records whose earlier checks held (no int64 overflow in the later ones)
    ok_wj = (win_j >= 0) & (win_j < windows)
    ok_first = (first >= 0) & (first < pack.chunk)
    ok_rows = ok_first & (rows >= 1) & (rows <= pack.chunk - first)
    ok_out_j = ~(ok_wj & ok_rows) | ((j[:, 2] % row_bytes == 0) & (j[:, 2] >= win_j * wb)
                                    & (j[:, 2] <= (win_j + 1) * wb - rows * row_bytes))
    ok_wc = (win_c >= 0) & (win_c < windows)
    at, nbytes, tail = c[:, 0], c[:, 1], pack.tail.shape[0]
    ok_at = (at >= 0) & (at % row_bytes == 0) & (at < tail)
    ok_nbytes = ok_at & (nbytes >= row_bytes) & (nbytes % row_bytes == 0) & (nbytes <= tail - at)
    ok_out_c = ~(ok_wc & ok_nbytes) | ((c[:, 2] % row_bytes == 0) & (c[:, 2] >= win_c * wb)
                                      & (c[:, 2] <= (win_c + 1) * wb - nbytes))
    for what, rec, ok in (
        ("window", j, ok_wj), ("first row in the chunk", j, ok_first), ("rows", j, ok_rows),
        ("output byte offset", j, ok_out_j), ("window", c, ok_wc), ("tail byte offset", c, ok_at),
        ("bytes", c, ok_nbytes), ("output byte offset", c, ok_out_c),
    ):
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            kind = f"job {i} (chunk {int(rec[i, 6])})" if rec is j else f"open-chunk copy {i}"
            raise RuntimeError(
                f"shard {pack.shard}, field {pack.name!r}: the {what} of {kind} it shipped is out of "
                f"bounds (record {rec[i].tolist()}; chunks of {pack.chunk} steps of {row_bytes} bytes, "
                f"windows of {length} steps, {windows} window rows from row {row0}, tail of "
                f"{tail} bytes): the record was damaged in transit or in the shard's memory"
            )


def unpack_field(
    pack: FieldPack, blob: np.ndarray, out: np.ndarray, row0: int, length: int, row_bytes: int, dctx: int
) -> None:
    """Decompress ``pack``'s jobs from ``blob`` (its `gather_chunks` bytes, e.g. a zero-copy
    ``ray.get``) and copy its open-chunk rows into ``out`` (the batch's field as flat bytes), windows
    from batch row ``row0`` on. ``dctx``: a zstd context (`replay.chunk_decode.new_zstd_context`) for
    a zstd field, else ignored. Padding is not touched.

    Raises
    ------
    RuntimeError
        A chunk failed its checksum or did not decompress (damaged in transit or in the shard's memory:
        the shard ships only chunks that were intact while it copied them); the message names the
        shard, the field and the chunk. Or a job or copy record would write outside its window's row of
        ``out`` or read outside its chunk or the tail rows (checked before any copy); the message names
        the shard, the field and the record's word.
    ValueError
        A zstd field with ``dctx`` 0 (zstd would read a null context).
    """
    if pack.kind == ZSTD and len(pack.jobs) and not dctx:
        raise ValueError(
            f"field {pack.field}: a zstd field needs dctx, a context of "
            f"replay.chunk_decode.new_zstd_context(), got {dctx!r}"
        )
    _check_records(pack, out.shape[0], row0, length, row_bytes)
    base = row0 * length * row_bytes
    if len(pack.copies):
        _copy_rows(pack.tail, pack.copies, base, out)
    if len(pack.jobs):
        jobs = pack.jobs.copy()
        jobs[:, 2] += base
        if decode_jobs(pack.kind, dctx, blob, jobs, len(jobs), pack.chunk, row_bytes, out, True):
            bad = jobs[jobs[:, 5] < 0]
            raise RuntimeError(
                f"shard {pack.shard}, field {pack.name!r}: compressed chunk {int(bad[0, 6])} it shipped "
                f"failed its checksum or did not decompress ({len(bad)} of {len(jobs)} runs of steps; its "
                "bytes were damaged in transit or in the shard's memory)"
            )

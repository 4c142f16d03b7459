"""ChunkDecode: the codec fields of a batch of windows decompressed into a staging slot, in compiled code.

For each shard, under its lock, `plan_windows` zeroes the windows' padding, copies the steps of the
chunk still being filled (`replay.chunk_codec.ChunkRing`'s raw tail) and lists one job per run of a
window's steps inside one complete chunk (its arena offset and length, where its rows go); after the
lock is released, `decode_jobs` decompresses the jobs with the codec library's own C entry points
(numcodecs' bundled ``LZ4_decompress_safe`` (``_partial``, ``_usingDict``) and ``ZSTD_decompressDCtx``,
called from numba: no Python per chunk). A job covering a whole chunk decompresses straight into the
slot; others go through one scratch chunk, decoded once for consecutive jobs of the same chunk
("lz4dict" chunks decode each step on its own, straight into the slot). A chunk several windows of the
batch read is decoded once (`share_jobs`) and copied from the slot for the others (`copy_shared`); a
field's jobs are decoded in one call on the calling thread. Decoding outside the lock is safe for the
same reason as the raw rings' lock-free copy (docs/architecture.md#replay-composition): a chunk's arena
bytes are reused only once all its positions are below the shard's floor, and the sampler's staleness
check afterwards drops every window with a step below it. Bytes reused meanwhile may fail to decompress
(both decoders bound their reads and writes); `ChunkDecode.run_shard` then checks that each window of a
failed job is below the floor, and raises otherwise. A chunk stored raw is copied. Local samples do not
check chunk checksums: that is one more pass over each sampled chunk, costlier than decoding the one row
an "lz4dict" step needs (docs/performance.md); a chunk is verified where its bytes come from outside the
memory its writer filled, at restore (`replay.chunk_codec.ChunkRing.load_state`) and in transit
(`replay.distributed.chunk_transport`, ``decode_jobs(..., verify=True)``), and by
`replay.chunk_codec.ChunkRing.read` (whole chunks, e.g. the store's ``episodes()``).

>>> decode = ChunkDecode(storage)                           # once per sampler
>>> decode.run(rows, shard, first, n, dst, slot.flat, length)  # then the sampler's staleness check

References
----------
DeepMind Reverb's chunkers; LZ4 block format (lz4.org); Zstandard (RFC 8878); xxHash; numcodecs.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING

import llvmlite.binding as llvm
import numba as nb
import numcodecs.lz4
import numcodecs.zstd
import numpy as np

from graphrl.kernels.copies import copy_bytes, zero_bytes
from replay.chunk_encode import chunk_checksum, stored_raw
from replay.keys import decode_keys, key_anchor
from replay.windows import zero_padding

if TYPE_CHECKING:  # type hints only: the shard's module imports replay.chunk_codec, which imports this one
    from replay.shard import ShardStorage
    from replay.storage import TrajectoryStorage

__all__ = [
    "KINDS", "LZ4DICT", "ChunkDecode", "decode_anchors", "decode_dict_chunk",
    "copy_shared", "decode_jobs", "free_zstd_context", "new_zstd_context", "plan_windows", "share_jobs",
]

LZ4, ZSTD, LZ4DICT = 0, 1, 2  # codec kinds of `decode_jobs`
KINDS = {"lz4": LZ4, "zstd": ZSTD, "lz4dict": LZ4DICT}  # codec name (`replay.spec.CODECS`) -> kind
_LZ4_HEADER = 4  # numcodecs' LZ4 prefixes the block with its decompressed size (4 bytes)
_JOB = 8  # words a job: arena offset, length, output byte offset, first row in the chunk, rows, window,
# chunk index, checksum (`replay.chunk_encode.chunk_checksum`)


def _symbols() -> ctypes.CDLL:
    """Register the decoders of numcodecs' extension modules with the JIT's linker; the zstd library."""
    zstd = ctypes.CDLL(numcodecs.zstd.__file__)
    for lib, names in (
        (ctypes.CDLL(numcodecs.lz4.__file__),
         ("LZ4_decompress_safe", "LZ4_decompress_safe_partial", "LZ4_decompress_safe_usingDict")),
        (zstd, ("ZSTD_decompressDCtx",)),
    ):
        for name in names:
            llvm.add_symbol(name, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
    zstd.ZSTD_createDCtx.restype = ctypes.c_void_p
    zstd.ZSTD_freeDCtx.argtypes = [ctypes.c_void_p]
    return zstd


_ZSTD = _symbols()
_lz4_decompress = nb.types.ExternalFunction(
    "LZ4_decompress_safe", nb.types.int32(nb.types.voidptr, nb.types.voidptr, nb.types.int32, nb.types.int32)
)
_lz4_decompress_partial = nb.types.ExternalFunction(
    "LZ4_decompress_safe_partial",
    nb.types.int32(nb.types.voidptr, nb.types.voidptr, nb.types.int32, nb.types.int32, nb.types.int32),
)
_lz4_decompress_dict = nb.types.ExternalFunction(
    "LZ4_decompress_safe_usingDict",
    nb.types.int32(nb.types.voidptr, nb.types.voidptr, nb.types.int32, nb.types.int32, nb.types.voidptr,
                   nb.types.int32),
)
_zstd_decompress = nb.types.ExternalFunction(
    "ZSTD_decompressDCtx",
    nb.types.uint64(nb.types.uintp, nb.types.voidptr, nb.types.uint64, nb.types.voidptr, nb.types.uint64),
)


def new_zstd_context() -> int:
    """A zstd decompression context (``ZSTD_DCtx *``) for `decode_jobs`; free it with `free_zstd_context`.

    Raises
    ------
    MemoryError
        zstd could not allocate it.
    """
    ctx = _ZSTD.ZSTD_createDCtx()
    if not ctx:
        raise MemoryError("ZSTD_createDCtx returned NULL")
    return int(ctx)


def free_zstd_context(ctx: int) -> None:
    """Free a context of `new_zstd_context` (no decode may use it any more)."""
    _ZSTD.ZSTD_freeDCtx(ctx)


@nb.njit(cache=True, nogil=True)
def _decompress(kind, dctx, arena, off, size, out, at, nbytes):  # pragma: no cover - numba
    """Chunk bytes ``arena[off : off + size]`` (``nbytes`` raw: a chunk that long is stored raw) into
    ``out[at : at + nbytes]``; True when whole."""
    if off < 0 or off + size > arena.shape[0] or at + nbytes > out.shape[0]:
        return False
    if stored_raw(size, nbytes):
        copy_bytes(out, at, arena, off, nbytes)
        return True
    if size <= _LZ4_HEADER:
        return False
    if kind == LZ4:
        got = _lz4_decompress(arena[off + _LZ4_HEADER :].ctypes.data, out[at:].ctypes.data,
                              size - _LZ4_HEADER, nbytes)
        return got == nbytes
    return _zstd_decompress(dctx, out[at:].ctypes.data, nbytes, arena[off:].ctypes.data, size) == nbytes


@nb.njit(cache=True, nogil=True)
def _u32(a, at):  # pragma: no cover - numba
    return np.int64(a[at]) | np.int64(a[at + 1]) << 8 | np.int64(a[at + 2]) << 16 | np.int64(a[at + 3]) << 24


@nb.njit(cache=True, nogil=True)
def _dict_rows(arena, off, size, steps, row_bytes, w, r, out, at):  # pragma: no cover - numba
    """Rows ``w .. w + r - 1`` of the "lz4dict" chunk ``arena[off : off + size]`` (`replay.chunk_encode`:
    the raw key, then LZ4 blocks with it as dictionary; or raw) into ``out[at:]``; True when all decoded."""
    hdr = 4 * steps
    if off < 0 or off + size > arena.shape[0] or at + r * row_bytes > out.shape[0]:
        return False
    if stored_raw(size, steps * row_bytes):
        copy_bytes(out, at, arena, off + w * row_bytes, r * row_bytes)
        return True
    if size < hdr + row_bytes:
        return False
    key = off + hdr
    if _u32(arena, off) != row_bytes:
        return False
    for i in range(w, w + r):
        o = at + (i - w) * row_bytes
        if i == 0:
            copy_bytes(out, o, arena, key, row_bytes)
            continue
        lo, hi = _u32(arena, off + 4 * (i - 1)), _u32(arena, off + 4 * i)
        if lo < row_bytes or hi <= lo or hi > size - hdr:
            return False
        zero_bytes(out, o, row_bytes)  # memset claims the lines unread, so the decode writes cached lines
        got = _lz4_decompress_dict(arena[key + lo :].ctypes.data, out[o:].ctypes.data, hi - lo, row_bytes,
                                   arena[key:].ctypes.data, row_bytes)
        if got != row_bytes:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def decode_dict_chunk(blob, steps, row_bytes, out):  # pragma: no cover - numba
    """A whole "lz4dict" chunk ``blob`` (uint8) of ``steps`` rows into ``out`` (flat uint8); True when
    it decoded (False for bytes that are not such a chunk)."""
    return _dict_rows(blob, 0, blob.shape[0], steps, row_bytes, 0, steps, out, 0)


@nb.njit(cache=True, nogil=True)
def _decompress_prefix(kind, dctx, arena, off, size, scratch, need):  # pragma: no cover - numba
    """At least the first ``need`` bytes of a chunk (``arena[off : off + size]``) into ``scratch`` (one
    chunk's bytes); returns how many bytes it holds, or -1 when they do not decompress. LZ4 stops
    after ``need`` bytes (its partial decode); zstd decodes the whole chunk."""
    nbytes = scratch.shape[0]
    if kind == LZ4 and need < nbytes and not stored_raw(size, nbytes):
        if off < 0 or size <= _LZ4_HEADER or off + size > arena.shape[0]:
            return -1
        got = _lz4_decompress_partial(arena[off + _LZ4_HEADER :].ctypes.data, scratch.ctypes.data,
                                      size - _LZ4_HEADER, need, nbytes)
        return got if got >= need else -1
    return nbytes if _decompress(kind, dctx, arena, off, size, scratch, 0, nbytes) else -1


@nb.njit(cache=True, nogil=True)
def plan_windows(
    table, tail, next_position, floor, chunk, row_bytes, rows, first, n, dst, length, out, jobs
):  # pragma: no cover - numba
    """The locked half of a field's decode for one shard's windows; returns the number of jobs.

    ``table`` int64 [slots, 3] (chunk index, arena offset, length per slot) and ``tail`` (flat bytes
    of the open chunk) are the ring's; ``rows``, ``first``, ``n``, ``dst`` (int64 [W]) give each
    window's batch row, absolute first position, real steps and offset in the window; ``out`` is the
    slot's flat bytes of the field ([B * length * row_bytes]). Padding and steps below ``floor`` (a
    stale window) are zeroed, steps of the open chunk copied from ``tail``, and for each run of steps
    in one complete chunk ``jobs`` (int64 [>= sum(n // chunk + 2), 8]) gets (arena offset, length,
    output byte offset, first row in the chunk, rows, window, chunk index, checksum); offset -1 (a job
    that fails) when the chunk's slot does not name it.
    """
    slots = table.shape[0]
    open_chunk = next_position // chunk
    nj = 0
    for i in range(rows.shape[0]):
        base = rows[i] * length * row_bytes
        d, cnt, p0 = dst[i], n[i], first[i]
        zero_padding(out, base, row_bytes, cnt, d, length)
        p = p0
        while p < p0 + cnt:
            k = p // chunk
            hi = min(p0 + cnt, (k + 1) * chunk)
            o = base + (d + p - p0) * row_bytes
            w = p - k * chunk
            if p < floor or hi > next_position:
                zero_bytes(out, o, (hi - p) * row_bytes)  # a stale window: dropped after the copy
            elif k == open_chunk:
                copy_bytes(out, o, tail, w * row_bytes, (hi - p) * row_bytes)
            else:  # a live chunk its slot does not name (a corrupt table): a job that fails
                s = k % slots
                held = table[s, 0] == k
                jobs[nj, 0] = table[s, 1] if held else -1
                jobs[nj, 1] = table[s, 2]
                jobs[nj, 2] = o
                jobs[nj, 3] = w
                jobs[nj, 4] = hi - p
                jobs[nj, 5] = i
                jobs[nj, 6] = k
                jobs[nj, 7] = table[s, 3]
                nj += 1
            p = hi
    return nj


@nb.njit(cache=True, nogil=True)
def decode_jobs(kind, dctx, arena, jobs, nj, chunk, row_bytes, out, verify):  # pragma: no cover - numba
    """The unlocked half: decompress ``jobs[:nj]`` (`plan_windows`) from ``arena`` into ``out``.

    With ``verify``, each job's chunk bytes are checked against its checksum first (once for
    consecutive jobs of one chunk with equal records). A job of a whole chunk is decompressed in
    place; others through a scratch chunk, decoded once for consecutive jobs of one chunk (LZ4: only
    up to the job's last row); "lz4dict" rows decode one by one, straight into ``out``. A job whose
    bytes fail the checksum or do not decompress (reused meanwhile, or damaged) has its rows zeroed
    and its row ``jobs[j, 5]`` set to -1 - window; returns how many failed.
    """
    chunk_bytes = chunk * row_bytes
    scratch = np.empty(chunk_bytes if chunk > 1 else 0, dtype=np.uint8)
    held = -1  # the arena offset whose chunk the scratch holds (its first ``have`` bytes)
    have = 0
    checked = -1  # the last job whose chunk record (offset, length, index, checksum) held
    failed = 0
    for j in range(nj):
        off, size, o, w, r = jobs[j, 0], jobs[j, 1], jobs[j, 2], jobs[j, 3], jobs[j, 4]
        ok = checked >= 0 and (jobs[checked, 0] == off and jobs[checked, 1] == size
                               and jobs[checked, 6] == jobs[j, 6] and jobs[checked, 7] == jobs[j, 7])
        if not ok:  # the bound as size <= arena - off: off + size may overflow int64
            ok = off >= 0 and size >= 0 and size <= arena.shape[0] - off and (not verify or
                chunk_checksum(arena, off, size, jobs[j, 6]) == jobs[j, 7])
            if ok:
                checked = j
            else:
                checked = held = -1
        if not ok:
            pass
        elif kind == LZ4DICT:  # each row on its own, straight into the output
            ok = _dict_rows(arena, off, size, chunk, row_bytes, w, r, out, o)
        elif r == chunk:
            ok = _decompress(kind, dctx, arena, off, size, out, o, chunk_bytes)
        else:
            need = (w + r) * row_bytes
            ok = held == off and have >= need
            if not ok:
                held = -1
                have = _decompress_prefix(kind, dctx, arena, off, size, scratch, need)
                ok = have >= 0
                if ok:
                    held = off
            if ok:
                copy_bytes(out, o, scratch, w * row_bytes, r * row_bytes)
        if not ok:
            zero_bytes(out, o, r * row_bytes)
            jobs[j, 5] = -1 - jobs[j, 5]
            failed += 1
    return failed


@nb.njit(cache=True, nogil=True)
def _ranges_overlap(jobs, nj):  # pragma: no cover - numba
    """Whether two windows of ``jobs[:nj]`` (listed window by window, chunk indices rising within one)
    read a chunk in common: their chunk ranges, sorted by start, overlap."""
    lo = np.empty(nj, dtype=np.int64)
    hi = np.empty(nj, dtype=np.int64)
    nw = 0
    for j in range(nj):
        if j == 0 or jobs[j, 5] != jobs[j - 1, 5]:
            lo[nw] = jobs[j, 6]
            nw += 1
        hi[nw - 1] = jobs[j, 6]
    order = np.argsort(lo[:nw])
    reach = -1
    for t in range(nw):
        w = order[t]
        if t > 0 and lo[w] <= reach:
            return True
        reach = max(reach, hi[w])
    return False


@nb.njit(cache=True, nogil=True)
def share_jobs(jobs, nj, chunk, copies):  # pragma: no cover - numba
    """Keep one decode per chunk of a batch: compact ``jobs[:nj]`` (`plan_windows`) in place to the jobs
    to decode and list in ``copies`` (int64 [>= nj, 5]) the others, to copy from the slot afterwards
    (`copy_shared`); returns (jobs kept, copies).

    A job is a copy when an earlier job of the batch decodes its chunk whole (``chunk`` rows) from the
    same arena offset (overlapping windows share steps): its copy row is (the whole job's index among
    the kept jobs, output byte offset, first row in the chunk, rows, window). Kept jobs keep their
    order, so a kept whole job precedes its copies. Windows whose chunk ranges do not overlap (the
    common case in a large buffer) are found first, by their ranges alone, and leave ``jobs`` as it is.
    """
    if not _ranges_overlap(jobs, nj):
        return nj, 0
    size = 16
    while size < 2 * nj:
        size *= 2
    slot_chunk = np.full(size, -1, dtype=np.int64)  # open addressing: chunk index -> kept whole job
    slot_job = np.empty(size, dtype=np.int64)
    kept = nc = 0
    for j in range(nj):
        k = jobs[j, 6]
        h = (k * 40503) & (size - 1)
        while slot_chunk[h] != -1 and slot_chunk[h] != k:
            h = (h + 1) & (size - 1)
        if slot_chunk[h] == k and jobs[slot_job[h], 0] == jobs[j, 0]:
            copies[nc, 0] = slot_job[h]
            copies[nc, 1] = jobs[j, 2]
            copies[nc, 2] = jobs[j, 3]
            copies[nc, 3] = jobs[j, 4]
            copies[nc, 4] = jobs[j, 5]
            nc += 1
            continue
        if slot_chunk[h] == -1 and jobs[j, 4] == chunk:
            slot_chunk[h] = k
            slot_job[h] = kept
        if kept != j:
            for w in range(jobs.shape[1]):
                jobs[kept, w] = jobs[j, w]
        kept += 1
    return kept, nc


@nb.njit(cache=True, nogil=True)
def copy_shared(jobs, copies, nc, row_bytes, out):  # pragma: no cover - numba
    """The copies of `share_jobs`, once ``jobs`` are decoded into ``out``: each copy's rows from its
    whole job's rows in ``out``. A copy of a job that failed (``jobs[s, 5] < 0``) fails too: its rows
    zeroed and ``copies[c, 4]`` set to -1 - window; returns how many failed."""
    failed = 0
    for c in range(nc):
        s, o, w, r = copies[c, 0], copies[c, 1], copies[c, 2], copies[c, 3]
        if jobs[s, 5] < 0:
            zero_bytes(out, o, r * row_bytes)
            copies[c, 4] = -1 - copies[c, 4]
            failed += 1
        else:
            copy_bytes(out, o, out, jobs[s, 2] + w * row_bytes, r * row_bytes)
    return failed


@nb.njit(cache=True, nogil=True)
def decode_anchors(
    kind, dctx, table, tail, arena, next_position, chunk, row_bytes, keys, out
):  # pragma: no cover - numba
    """One shard's steps at the anchors of ``keys`` (int64 [B], `replay.keys`) into rows ``0 .. B - 1``
    of ``out`` (flat bytes), plan and decode in one call, the shard lock held (every anchor live).
    Returns the number of steps whose chunk is not held or did not decompress (their rows zeroed)."""
    slots = table.shape[0]
    open_chunk = next_position // chunk
    chunk_bytes = chunk * row_bytes
    scratch = np.empty(chunk_bytes if chunk > 1 else 0, dtype=np.uint8)
    held = -1
    have = 0
    failed = 0
    for i in range(keys.shape[0]):
        p = key_anchor(keys[i])
        k = p // chunk
        w = p - k * chunk
        o = i * row_bytes
        s = k % slots
        if k == open_chunk:
            copy_bytes(out, o, tail, w * row_bytes, row_bytes)
            continue
        off, size = table[s, 1], table[s, 2]
        ok = table[s, 0] == k
        if ok and kind == LZ4DICT:
            ok = _dict_rows(arena, off, size, chunk, row_bytes, w, 1, out, o)
        elif ok and chunk == 1:
            ok = _decompress(kind, dctx, arena, off, size, out, o, row_bytes)
        elif ok:
            if held != off or have < (w + 1) * row_bytes:
                held = -1
                have = _decompress_prefix(kind, dctx, arena, off, size, scratch, (w + 1) * row_bytes)
                ok = have >= 0
                if ok:
                    held = off
            if ok:
                copy_bytes(out, o, scratch, w * row_bytes, row_bytes)
        if not ok:
            zero_bytes(out, o, row_bytes)
            failed += 1
    return failed


class ChunkDecode:
    """The codec fields of a storage's windows into staging slots (see the module docstring).

    Parameters
    ----------
    storage : TrajectoryStorage
        An owner's or an attached storage with at least one codec field.
    """

    def __init__(self, storage: TrajectoryStorage) -> None:
        spec = storage.spec
        self.storage = storage
        self.fields = [(j, n, spec[n].row_bytes, KINDS[spec[n].codec]) for j, n in enumerate(spec)
                       if spec[n].codec is not None]
        self.rings = [  # per shard, per codec field: the ring and its tail as flat bytes
            [(j, rb, kind, sh.chunks[n], sh.chunks[n].tail.reshape(-1).view(np.uint8))
             for j, n, rb, kind in self.fields]
            for sh in storage.shards
        ]
        self._local = threading.local()  # a zstd decompression context per thread
        self._contexts: list[int] = []
        self._lock = threading.Lock()

    def _dctx(self) -> int:
        ctx = getattr(self._local, "dctx", None)
        if ctx is None:
            ctx = new_zstd_context()
            self._local.dctx = ctx
            with self._lock:
                self._contexts.append(ctx)
        return ctx

    def run(self, rows: np.ndarray, shard: np.ndarray, first: np.ndarray, n: np.ndarray, dst: np.ndarray,
            flat: tuple[np.ndarray, ...], length: int) -> None:
        """Decode windows (int64 [W] each: batch row, shard, absolute first position, real steps,
        offset in the window) into the slot's ``flat`` views (per spec field, uint8)."""
        if self.storage.num_shards == 1:
            self.run_shard(0, rows, first, n, dst, flat, length)
            return
        for s in np.unique(shard).tolist():
            sel = shard == s
            self.run_shard(s, rows[sel], first[sel], n[sel], dst[sel], flat, length)

    def run_locked(self, keys: np.ndarray, flat: tuple[np.ndarray, ...]) -> None:
        """Decode windows of one step, row i the anchor of ``keys[i]`` (`replay.keys`), into rows
        ``0 .. len(keys) - 1`` of ``flat``, with every shard lock already held (the fused transition
        draw's ``locked``, `replay.table.Table.draw_transitions`): every position is live.

        Raises
        ------
        RuntimeError
            A chunk did not decompress (its arena bytes are corrupt).
        """
        if self.storage.num_shards == 1:  # plan and decode in one call a field
            sh = self.storage.shards[0]
            for j, rb, kind, ring, tail in self.rings[0]:
                dctx = self._dctx() if kind == ZSTD else 0
                if decode_anchors(kind, dctx, ring.table, tail, ring.arena, ring.next_position, ring.chunk,
                                  rb, keys, flat[j]):
                    raise RuntimeError(
                        f"field {ring.name!r}: a compressed chunk of shard 0 holding a live position did not "
                        "decompress (corrupt arena bytes)"
                    )
            return
        shard, first, _ = decode_keys(keys)
        one, zero = np.ones(keys.size, np.int64), np.zeros(keys.size, np.int64)
        rows = np.arange(keys.size)
        groups = [(0, rows)] if self.storage.num_shards == 1 else [
            (s, rows[shard == s]) for s in np.unique(shard).tolist()
        ]
        for s, sel in groups:
            sh = self.storage.shards[s]
            planned = self._plan(s, sh, sel, first[sel], one[sel], zero[sel], flat, 1)
            self._decode(s, sh, planned, first[sel], flat, locked=True)

    def _plan(self, s: int, sh: ShardStorage, rows: np.ndarray, first: np.ndarray, n: np.ndarray,
              dst: np.ndarray, flat: tuple[np.ndarray, ...], length: int) -> list[tuple]:
        """`plan_windows` of every codec field (the shard's lock held)."""
        planned = []
        floor = sh.floor
        for j, rb, kind, ring, tail in self.rings[s]:
            jobs = np.empty((rows.size * (length // ring.chunk + 2), _JOB), np.int64)
            nj = plan_windows(ring.table, tail, ring.next_position, floor, ring.chunk, rb, rows, first, n,
                              dst, length, flat[j], jobs)
            planned.append((j, ring.name, rb, kind, ring, jobs, nj))
        return planned

    def _decode(self, s: int, sh: ShardStorage, planned: list[tuple], first: np.ndarray,
                flat: tuple[np.ndarray, ...], locked: bool) -> None:
        """`decode_jobs` of what `_plan` listed, a chunk the batch's windows share decoded once
        (`share_jobs`, `copy_shared`); raise for a failed chunk of a window still live."""
        for j, name, rb, kind, ring, jobs, nj in planned:
            if nj == 0:
                continue
            copies = np.empty((nj, 5), np.int64)
            nj, nc = share_jobs(jobs, nj, ring.chunk, copies)
            dctx = self._dctx() if kind == ZSTD else 0  # the copies' sources first, then the copies
            failed = int(decode_jobs(kind, dctx, ring.arena, jobs, nj, ring.chunk, rb, flat[j], False))
            if nc:
                failed += copy_shared(jobs, copies, nc, rb, flat[j])
            if failed:
                windows = np.concatenate((jobs[:nj, 5], copies[:nc, 4]))
                bad = -1 - windows[windows < 0]
                if locked:
                    live = first[bad] >= sh.floor
                else:
                    with sh:
                        live = first[bad] >= sh.floor
                if live.any():
                    raise RuntimeError(
                        f"field {name!r}: a compressed chunk of shard {s} holding live position "
                        f"{int(first[bad][live][0])} did not decompress (corrupt arena bytes)"
                    )

    def run_shard(self, s: int, rows: np.ndarray, first: np.ndarray, n: np.ndarray, dst: np.ndarray,
                  flat: tuple[np.ndarray, ...], length: int) -> None:
        """`run` for windows of shard ``s`` only.

        Raises
        ------
        RuntimeError
            A chunk of a window still live did not decompress (its arena bytes are corrupt).
        """
        sh = self.storage.shards[s]
        with sh:
            planned = self._plan(s, sh, rows, first, n, dst, flat, length)
        self._decode(s, sh, planned, first, flat, locked=False)

    def close(self) -> None:
        """Free the zstd decompression contexts (no decode may run any more)."""
        with self._lock:
            for ctx in self._contexts:
                free_zstd_context(ctx)
            self._contexts.clear()
        self._local = threading.local()

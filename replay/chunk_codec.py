"""ChunkRing: one field of one shard stored as compressed chunks of steps, in memory-manager regions.

The compressed form of a ring ``[capacity, *field_shape]`` (`replay.shard.ShardStorage.columns`) for a
field with a codec (``"lz4"``: numcodecs' LZ4 format, ``"zstd"``: numcodecs' Zstd; the levels are
`replay.chunk_encode`'s).
Positions are the shard's absolute positions; chunk ``k`` holds positions ``[k*C, (k+1)*C)``. Three
regions (the shared tier by default, so that learners in other processes attach them by name):

- a *tail* ``[C, *field_shape]``: the raw rows of the chunk being filled; a partial
  chunk (an episode's tail not yet C steps) stays raw here until the chunk fills, then is compressed;
- an *arena* of ``arena_bytes`` bytes: the compressed chunks, written in chunk order as a circular log;
- a *table* int64 ``[capacity / C, 4]``: per chunk slot the chunk index, arena offset, length and
  checksum (`replay.chunk_encode`: a chunk that does not compress is stored raw, its length the raw
  chunk's bytes), and meta words (the next position the ring expects, the arena's head).

`ChunkRing.write` (the writer's process, shard lock held) copies rows into the tail and compresses
each chunk that fills: the actor compresses. A chunk's arena bytes are reused only once every
position of it is below the shard's floor (``write_pos - capacity``); a chunk that does not fit in the
arena beside the live ones raises `graphrl.memory.MemoryBudgetError` before anything is written (the
store's arena, `replay.chunk_arena.arena_size`, has a chunk's room for the bytes skipped at its end: at
``arena_ratio <= 1`` it never refuses one, as a chunk never takes more than its raw bytes).
A table slot is published by its chunk index, written last (a writer killed mid-commit leaves no slot
naming a chunk it did not finish). `ChunkRing.read` (any process, shard lock held) decompresses the
chunks of the asked positions into the caller's rows, keeping the last decoded chunk (checkpoints, the
Ray shard's put); samplers decode batches with `replay.chunk_decode.ChunkDecode` (compiled, mostly
outside the lock). `ChunkRing.state` / `ChunkRing.load_state` give and
take the live compressed chunks as they are (checkpoints), with the raw tail rows. `ChunkRing.read`
checks a chunk's checksum before decoding it; a `replay.chunk_state.ChunkState` (what `load_state`
takes) checks every chunk's when it is made, once, before anything is stored (samplers do not:
`replay.chunk_decode`).

>>> ring = ChunkRing.create(memory, "obs", (84, 84), np.uint8, "lz4", capacity=1024, chunk=16,
...                         arena_bytes=1 << 20)
>>> ring.write(frames, position)                      # under the shard lock
>>> ring.read(positions, out)                         # out: [len(positions), 84, 84]

References
----------
DeepMind Reverb's chunkers (compressed chunks of steps, decompressed at sample time); numcodecs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np
from numcodecs import LZ4, Zstd

from graphrl.kernels.copies import copy_bytes
from graphrl.memory import MemoryBudgetError, MemoryManager, Region, RegionHandle
from replay.chunk_arena import arena_ratio_for, arena_ratio_of, arena_size
from replay.chunk_decode import decode_dict_chunk
from replay.chunk_encode import ChunkEncode, chunk_checksum, stored_raw
from replay.chunk_state import ChunkState
from replay.spec import CODECS
from replay.sync_kernels import compiler_fence

__all__ = [
    "CODECS", "ChunkRing", "ChunkRingHandle", "arena_ratio_for", "arena_ratio_of", "arena_size", "chunk_fits",
    "chunk_steps_for", "field_chunk", "make_codec", "place_chunks", "store_chunks",
]

# steps per chunk by default, per codec (Atari frames: docs/performance.md, "Compressed fields")
CHUNK_STEPS = {"lz4": 1, "zstd": 1, "lz4dict": 8}
_META = 4  # table words before the chunk slots: next position, arena head
_NEXT, _HEAD = 0, 1
_RECORD = 4  # words a chunk slot: chunk index, arena offset, length, checksum


def make_codec(name: str) -> Any:
    """The numcodecs codec of ``name`` (`CODECS`), which decodes its chunks: LZ4, Zstd level 1, or None
    for ``"lz4dict"`` (its chunks decode with `replay.chunk_decode.decode_dict_chunk`).

    Raises
    ------
    ValueError
        ``name`` is not one of `CODECS`.
    """
    if name == "lz4":
        return LZ4(acceleration=1)
    if name == "zstd":
        return Zstd(level=1)
    if name == "lz4dict":
        return None
    raise ValueError(f"codec must be one of {CODECS} or None, got {name!r}")


def field_chunk(codec: str, chunk: int | None = None) -> int:
    """Steps per chunk of a field of ``codec``: ``chunk`` (`replay.spec.FieldSpec`'s, already checked),
    or the codec's `CHUNK_STEPS` when None."""
    return CHUNK_STEPS[codec] if chunk is None else int(chunk)


def chunk_fits(capacity: int, chunk: int) -> bool:
    """Whether a ring of ``capacity`` steps holds chunks of ``chunk`` steps: a whole number of them, at
    least two (the chunk being filled and at least one complete one)."""
    return chunk >= 1 and capacity % chunk == 0 and capacity >= 2 * chunk


def chunk_steps_for(capacity: int, chunk: int | None = None, name: str = "", codec: str = "lz4") -> int:
    """Steps per chunk of field ``name`` for a ring of ``capacity`` steps (`field_chunk`), checked
    against the capacity (`chunk_fits`).

    Raises
    ------
    ValueError
        ``capacity`` not a multiple of the chunk or below twice it (the message names the field, the
        chunk and the capacity).
    """
    c = field_chunk(codec, chunk)
    if not chunk_fits(capacity, c):
        raise ValueError(
            f"field {name!r}: chunk={c} needs a shard capacity that is a multiple of it and at least "
            f"{2 * c}, got a shard capacity of {capacity}"
        )
    return c


@nb.njit(cache=True, nogil=True)
def place_chunks(table, head, size, oldest, first, sizes, offs):  # pragma: no cover - numba
    """Arena offsets ``offs`` (int64 [n]) for new chunks ``first .. first + n - 1`` of ``sizes`` bytes, in
    an arena of ``size`` bytes whose head is ``head``, beside the live chunks of ``table`` (int64
    [slots, 3]: those from chunk ``oldest`` on, the first with a live position after the write); returns
    the new head, or ``-1 - i`` when chunk i does not fit (``offs[i]`` then holds the live bytes).

    The live chunks occupy the circular byte range from the oldest live chunk's offset to the head (the
    oldest slot still naming its chunk in ``[oldest, first)``); a chunk goes at the head, or at 0 when
    it does not fit before the arena's end. A chunk may end exactly at the oldest live chunk or at the
    arena's end (the head wraps to 0): with live chunks, head == that offset means the arena is full
    (with none, the arena is empty and the head restarts at 0). So chunks of equal size ``s`` (raw,
    incompressible ones) fit whenever the arena holds ``slots`` of them; chunks of sizes up to ``m``
    always fit in an arena of ``(slots + 1) * m`` bytes (the bytes skipped at the arena's end are under
    one chunk: `replay.chunk_arena.arena_size`).
    """
    slots = table.shape[0]
    tail_off = -1
    for k in range(max(oldest, first - slots), first):
        if table[k % slots, 0] == k:
            tail_off = table[k % slots, 1]
            break
    full = tail_off >= 0 and head == tail_off
    if tail_off < 0:
        head = 0
    for i in range(sizes.shape[0]):
        n = sizes[i]
        if tail_off < 0:  # nothing live
            off, ok = 0, n <= size
            tail_off = 0
        elif full:
            off, ok = head, False
        elif head >= tail_off:  # live bytes [tail_off, head): free [head, size) and [0, tail_off)
            off = head if head + n <= size else 0
            ok = head + n <= size or n <= tail_off
        else:  # live bytes wrap: free [head, tail_off)
            off, ok = head, head + n <= tail_off
        if not ok:
            offs[i] = size if full else (head - tail_off) % size
            return -1 - i
        offs[i] = off
        head = off + n
        if head == size:
            head = 0
        full = head == tail_off
    return head


@nb.njit(cache=True, nogil=True)
def store_chunks(arena, table, first, offs, sizes, sums, blob):  # pragma: no cover - numba
    """Copy chunks ``first ..`` (bytes ``blob``, one after another, ``sizes`` each, checksums ``sums``)
    to arena offsets ``offs`` and publish each table slot, its chunk index written last (a writer
    killed here leaves a slot empty or whole, never a chunk index with another chunk's offset)."""
    slots = table.shape[0]
    at = 0
    for i in range(offs.shape[0]):
        n = sizes[i]
        copy_bytes(arena, offs[i], blob, at, n)
        s = (first + i) % slots
        table[s, 0] = -1
        compiler_fence()
        table[s, 1] = offs[i]
        table[s, 2] = n
        table[s, 3] = sums[i]
        compiler_fence()
        table[s, 0] = first + i
        at += n


@dataclass(frozen=True)
class ChunkRingHandle:
    """Picklable names and sizes of a `ChunkRing`'s regions."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    codec: str
    capacity: int
    chunk: int
    table: RegionHandle
    tail: RegionHandle
    arena: RegionHandle


class ChunkRing:
    """A field's steps as compressed chunks (see the module docstring); made by `create` or `attach`.

    Attributes
    ----------
    capacity : int
        Steps of the shard's ring (a multiple of ``chunk``, at least ``2 * chunk``).
    chunk : int
        Steps per chunk C.
    arena_bytes : int
        Bytes of the arena.
    """

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        codec: str,
        capacity: int,
        chunk: int,
        regions: tuple[Region, Region, Region],
        create: bool,
    ) -> None:
        self.name = name
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.codec_name = codec
        self.codec = make_codec(codec)
        self.capacity = capacity
        self.chunk = chunk
        self.slots = capacity // chunk
        self.regions = regions
        table, tail, arena = regions
        raw = table.numpy()
        self.meta = raw[:_META]
        self.table = raw[_META:].reshape(self.slots, _RECORD)
        self.tail = tail.numpy()
        self.arena = arena.numpy()
        self.arena_bytes = int(self.arena.shape[0])
        self.chunk_bytes = chunk * int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self._decoded = np.empty((chunk, *self.shape), dtype=self.dtype)
        self._decoded_id = -1  # the chunk index held in _decoded (its arena offset in _decoded_at)
        self._decoded_at = -1
        self._encoder: ChunkEncode | None = None  # made at the first write (readers never compress)
        if create:
            self.meta[:] = 0
            self.table[:, 0] = -1

    @classmethod
    def create(
        cls,
        memory: MemoryManager,
        name: str,
        shape: Sequence[int],
        dtype: Any,
        codec: str,
        capacity: int,
        chunk: int,
        arena_bytes: int,
        tier: str = "shared",
        owner: str = "replay.chunks",
        fallback: tuple[str, ...] = (),
    ) -> ChunkRing:
        """Allocate the regions of a ring of ``capacity`` steps in chunks of ``chunk``.

        Raises
        ------
        ValueError
            A codec not in `CODECS`, ``chunk < 1``, ``capacity`` not a multiple of ``chunk`` or below
            ``2 * chunk``, or ``arena_bytes < 1``.
        """
        make_codec(codec)
        if not chunk_fits(capacity, chunk):
            raise ValueError(
                f"capacity must be a multiple of chunk and at least 2 * chunk, got capacity={capacity}, "
                f"chunk={chunk}"
            )
        if arena_bytes < 1:
            raise ValueError(f"arena_bytes must be >= 1, got {arena_bytes}")
        made: list[Region] = []
        try:
            for shp, dt in (
                ((_META + _RECORD * (capacity // chunk),), np.int64),
                ((chunk, *shape), np.dtype(dtype)),
                ((int(arena_bytes),), np.uint8),
            ):
                made.append(memory.allocate(shp, dt, tier, owner=owner, fallback=fallback))
        except BaseException:
            for r in made:
                r.free()
            raise
        return cls(name, tuple(shape), np.dtype(dtype), codec, capacity, chunk, tuple(made), create=True)

    @classmethod
    def attach(cls, memory: MemoryManager, handle: ChunkRingHandle) -> ChunkRing:
        """Map a ring made by another process, by its handle."""
        regions = tuple(memory.attach(h) for h in (handle.table, handle.tail, handle.arena))
        return cls(
            handle.name, handle.shape, np.dtype(handle.dtype), handle.codec, handle.capacity, handle.chunk,
            regions, create=False,
        )

    def handle(self) -> ChunkRingHandle:
        """Region names for `attach` (raises ``ValueError`` unless the regions are shared)."""
        t, tl, a = (r.handle() for r in self.regions)
        return ChunkRingHandle(
            self.name, self.shape, self.dtype.name, self.codec_name, self.capacity, self.chunk, t, tl, a
        )

    def free(self) -> None:
        if self._encoder is not None:
            self._encoder.close()
        for r in self.regions:
            if not r.freed:
                r.free()

    @property
    def next_position(self) -> int:
        """The position after the last one written (positions skipped by a jump count as written)."""
        return int(self.meta[_NEXT])

    # -- writing (shard lock held)
    def write(self, rows: np.ndarray, position: int) -> None:
        """Store ``rows`` ``[n, *shape]`` at positions ``[position, position + n)``, n <= capacity.

        ``position`` is at least `next_position` (a larger one skips positions, as a dead writer's
        hole does: their rows are undefined). Chunks that fill are compressed into the arena.

        Raises
        ------
        MemoryBudgetError
            The new chunks do not fit in the arena beside the chunks still live after this write
            (nothing is written): give the field a larger arena.
        """
        self.apply(self.prepare(rows, position))

    def prepare(self, rows: np.ndarray, position: int) -> tuple[Any, ...]:
        """`write`'s compression and placement, changing nothing (raises as `write`); `apply` stores it.

        The chunks that fill are compressed in one `replay.chunk_encode.ChunkEncode.encode` call and
        placed in one `place_chunks` call (no Python per chunk)."""
        n = rows.shape[0]
        c = self.chunk
        end = position + n
        k1 = end // c  # chunks [ka, k1) fill with this write; those wholly below the floor are not stored
        oldest = max(0, end - self.capacity) // c
        ka = max(self.next_position // c, oldest)
        if ka >= k1:
            return rows, position, end, k1, None
        lo, hi = ka * c, k1 * c
        head = min(max(0, position - lo), hi - lo)  # the chunks' rows before ``position``: the tail's
        if head == 0:
            src = np.ascontiguousarray(rows[lo - position : hi - position])
        else:
            src = np.empty((hi - lo, *self.shape), dtype=self.dtype)
            src[:head] = self.tail[np.arange(lo, lo + head) % c]
            if hi > position:  # else every filled chunk lies before ``position`` (a skip past them)
                src[head:] = rows[: hi - position]
        if self._encoder is None:
            self._encoder = ChunkEncode(self.codec_name)
        blob, sizes, sums = self._encoder.encode(src, c, ka)
        offs = np.empty(sizes.size, np.int64)
        got = place_chunks(self.table, int(self.meta[_HEAD]), self.arena_bytes, oldest, ka, sizes, offs)
        if got < 0:
            raise self._full(int(sizes[-1 - got]), int(offs[-1 - got]))
        return rows, position, end, k1, (ka, offs, blob, sizes, sums)

    def apply(self, prepared: tuple[Any, ...]) -> None:
        """Store what `prepare` made (nothing written to the ring in between)."""
        rows, position, end, k1, placed = prepared
        c = self.chunk
        if placed is not None:
            ka, offs, blob, sizes, sums = placed
            store_chunks(self.arena, self.table, ka, offs, sizes, sums, blob)
            self.meta[_HEAD] = (offs[-1] + sizes[-1]) % self.arena_bytes
        if k1 * c > self.meta[_NEXT]:  # the full chunks are readable before the tail is reused (a writer
            self.meta[_NEXT] = k1 * c  # that dies here leaves the earlier positions intact)
        lo = max(position, k1 * c)
        if end > lo:  # the rows of the chunk left partial: raw in the tail
            self.tail[lo - k1 * c : end - k1 * c] = rows[lo - position :]
        self.meta[_NEXT] = end

    def _full(self, asked: int, used: int, chunks: int = 0) -> MemoryBudgetError:
        """The error of an arena too small: a commit's chunk of ``asked`` bytes beside ``used`` live bytes,
        or (``chunks`` > 0) a checkpoint's ``chunks`` live chunks of ``asked`` bytes in all (`load_state`).

        The message states the field's arena_ratio now and the largest one (`arena_ratio_for`) whose arena
        holds ``(slots + 1)`` chunks of ``asked`` bytes, so that a commit of chunks no larger than this one
        is never refused (`arena_size`'s bound), or, for a checkpoint, ``asked`` bytes."""
        arena = self.regions[2]
        row_bytes = self.chunk_bytes // self.chunk
        ratio = arena_ratio_of(self.capacity, row_bytes, self.chunk, self.arena_bytes)
        if chunks:
            what = (f"the checkpoint's {chunks} live chunks take {asked} bytes, more than the arena of "
                    f"{self.arena_bytes} bytes")
            fits = arena_ratio_for(self.capacity, row_bytes, self.chunk, asked)
            holds = "holds them"
        else:
            what = (f"a compressed chunk of {asked} bytes does not fit in the arena of {self.arena_bytes} "
                    f"bytes beside {used} bytes of live chunks")
            fits = arena_ratio_for(self.capacity, row_bytes, self.chunk, (self.slots + 1) * asked)
            holds = f"never refuses chunks of up to {asked} bytes"
        lead = (  # the store, the field and its remedy first; the memory manager's figures after
            f"replay store ({arena.owner}), field {self.name!r}: {what}; lower the field's arena_ratio (now "
            f"{ratio:.3g}: the arena is capacity * row bytes / arena_ratio and one chunk; its raw chunk is "
            f"{self.chunk_bytes} bytes): an arena_ratio of {fits:g} or less {holds}"
        )
        return MemoryBudgetError(
            arena.tier, arena.owner, asked, self.arena_bytes - used, self.arena_bytes, lead=lead
        )

    # -- reading (shard lock held)
    def read(self, positions: np.ndarray, out: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Copy the rows of live ``positions`` (int64 [n], each in ``[floor, next_position)``) into
        ``out`` ``[n, *shape]`` (or into ``out[rows]``, ``rows`` int64 [n]), decompressing each chunk once.

        Raises
        ------
        ValueError
            A position not held (below the floor or not yet written), or a chunk read fails its
            checksum (its arena bytes or record changed; each decoded chunk is verified).
        """
        positions = np.asarray(positions, dtype=np.int64)
        nxt = self.next_position
        floor = max(0, nxt - self.capacity)
        if positions.size and (positions.min() < floor or positions.max() >= nxt):
            raise ValueError(
                f"positions must be in [{floor}, {nxt}) (the live positions of field {self.name!r}), got "
                f"[{int(positions.min())}, {int(positions.max())}]"
            )
        c = self.chunk
        ks = positions // c
        order = np.argsort(ks, kind="stable")
        bounds = np.flatnonzero(np.diff(ks[order])) + 1
        open_chunk = nxt // c
        for group in np.split(order, bounds):
            if group.size == 0:
                continue
            k = int(ks[group[0]])
            within = positions[group] - k * c
            dst = group if rows is None else rows[group]
            if k == open_chunk:
                out[dst] = self.tail[within]
            else:
                out[dst] = self.decoded(k)[within]

    def decoded(self, k: int) -> np.ndarray:
        """Chunk ``k`` (complete, live) decompressed: ``[chunk, *shape]``, valid until the next call.

        Raises
        ------
        ValueError
            Chunk ``k`` is not held, or its bytes fail their checksum (corrupt arena bytes).
        """
        kk, off, n, want = (int(v) for v in self.table[k % self.slots])
        if kk != k:
            raise ValueError(f"field {self.name!r}: chunk {k} is not held (its slot holds chunk {kk})")
        if self._decoded_id != k or self._decoded_at != off:
            if not 0 <= off <= off + n <= self.arena_bytes or chunk_checksum(self.arena, off, n, k) != want:
                raise ValueError(
                    f"field {self.name!r}: chunk {k} fails its checksum (its arena bytes or its record "
                    "changed after it was compressed)"
                )
            self._decode(self.arena[off : off + n])
            self._decoded_id, self._decoded_at = k, off
        return self._decoded

    def _decode(self, data: np.ndarray) -> None:
        """One chunk's bytes into the decoded chunk (raises ``RuntimeError``/``ValueError`` on bad bytes)."""
        if stored_raw(data.size, self.chunk_bytes):
            self._decoded.reshape(-1).view(np.uint8)[:] = data
            return
        if self.codec is not None:
            self.codec.decode(data, out=self._decoded)
            return
        row_bytes = self.chunk_bytes // self.chunk
        if not decode_dict_chunk(data, self.chunk, row_bytes, self._decoded.reshape(-1).view(np.uint8)):
            raise ValueError(f"field {self.name!r}: the bytes are not an lz4dict chunk")

    # -- checkpoints (shard lock held)
    def state(self) -> dict[str, Any]:
        """The live chunks as they are: ``chunks`` int64 [K, 3] (chunk index, length, checksum), ``blob``
        uint8 (their bytes, concatenated), ``tail`` (the raw rows of the open chunk), ``next_position``.

        Raises
        ------
        ValueError
            A complete chunk holding live positions is not in the chunk table (a corrupt table).
        """
        nxt = self.next_position
        floor = max(0, nxt - self.capacity)
        ks = np.arange(floor // self.chunk, nxt // self.chunk)
        rows = self.table[ks % self.slots].reshape(-1, _RECORD)
        missing = np.flatnonzero(rows[:, 0] != ks)
        if missing.size:
            k = int(ks[missing[0]])
            raise ValueError(
                f"field {self.name!r}: chunk {k}, which holds live positions, is not in the chunk table (its "
                f"slot names chunk {int(rows[missing[0], 0])}): the table is corrupt"
            )
        parts = [self.arena[off : off + n] for _, off, n, _ in rows.tolist()]
        chunks = rows[:, [0, 2, 3]].copy()
        blob = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
        return {"chunks": chunks, "blob": blob, "tail": self.tail.copy(),
                "next_position": nxt}

    def load_state(self, state: ChunkState | dict[str, Any]) -> None:
        """Put back what `state` gave (into an empty ring of the same capacity, chunk and codec).

        Every chunk is checked before anything is stored (a refused state leaves the ring as it was):
        its record and checksum by `ChunkState` (made here from a dict; `replay.checkpoint.load` gives
        one already checked), then that it decompresses, its position range and the tail's shape here.

        Raises
        ------
        MemoryBudgetError
            The chunks do not fit in this ring's arena.
        ValueError
            A chunk fails its checksum, its record is malformed, a live chunk is missing, its bytes
            do not decompress to one chunk, or the tail's shape is not the ring's open chunk's (a corrupt
            checkpoint); the message names the field and the chunk or the shapes.
        """
        if not isinstance(state, ChunkState):
            try:
                state = ChunkState.of(state)
            except ValueError as exc:
                raise ValueError(f"field {self.name!r}: the checkpoint's {exc}") from None
        chunks, blob, tail, nxt = state.chunks, state.blob, state.tail, state.next_position
        fault = None
        lo, hi = max(0, nxt - self.capacity) // self.chunk, nxt // self.chunk
        if len(chunks) != hi - lo or len(chunks) and chunks[0, 0] != lo:
            fault = f"chunks are not every live chunk {lo} .. {hi - 1} (it holds {len(chunks)})"
        if fault is None and tail.shape != self.tail.shape:
            fault = f"tail has shape {tail.shape}, expected {self.tail.shape} (the open chunk's raw rows)"
        if fault is not None:
            raise ValueError(f"field {self.name!r}: the checkpoint's {fault}")
        if int(chunks[:, 1].sum()) > self.arena_bytes:
            raise self._full(int(chunks[:, 1].sum()), 0, len(chunks))
        starts = np.cumsum(chunks[:, 1]) - chunks[:, 1]
        for (k, n, _), at in zip(chunks.tolist(), starts.tolist(), strict=True):
            try:
                self._decode(blob[at : at + n])
            except Exception as exc:  # numcodecs raises RuntimeError/ValueError on bad bytes
                raise ValueError(
                    f"field {self.name!r}: chunk {k} of the checkpoint does not decompress: {exc}"
                ) from exc
        self.table[:, 0] = -1
        self.arena[: blob.size] = blob
        slots = chunks[:, 0] % self.slots
        self.table[slots, 1] = starts
        self.table[slots, 2] = chunks[:, 1]
        self.table[slots, 3] = chunks[:, 2]
        self.table[slots, 0] = chunks[:, 0]
        self._decoded_id = -1
        self.tail[...] = tail
        self.meta[_NEXT] = nxt
        self.meta[_HEAD] = blob.size % self.arena_bytes

"""ShardStorage: one shard of a replay store: field rings and the step and episode index, in regions.

A shard of ``capacity`` steps holds, in memory-manager regions (the shared tier by default, so that
actor processes attach them by name):

- per field, a ring ``[capacity, *field_shape]``; a field with a codec, a `replay.chunk_codec.ChunkRing`
  instead (compressed chunks: `ShardStorage.chunks`, written by `ShardStorage.commit` and read by
  `replay.chunk_codec.ChunkRing.read` under the shard lock);
- an *index* region: the shard's robust process-shared mutex, its counters (`WRITE_POS`: steps ever
  committed, `RESERVE_POS`: steps being committed, `N_RECORDS`: episode records ever made), per slot
  the step's episode record id, commit sequence number and flags (int64 ``[capacity, 3]``; flag
  `EXHAUSTED`: removed by ``max_times_sampled``), and a ring of episode records (int64
  ``[capacity, 4]``: id, first position, committed length, flags `OPEN` / `CONTINUATION`).

Positions are absolute: the n-th step committed has position n and lives in slot ``n % capacity``;
the position is the generation stamp of its slot. `ShardStorage.commit` appends one chunk under the
shard lock (the second step of the commit protocol of `replay.storage`; its copy and stamps are
`replay.commit_kernel.write_steps`); `ShardStorage.acquire` repairs
a commit left half-done by a writer that died holding the lock. See docs/architecture.md#keys and
docs/architecture.md#replay-composition.

References
----------
GEAR (Wang et al., ICML 2023): columnar trajectory tables in shared memory written by actors in place.
TorchRL: circular storage with trajectory ids.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrl.kernels import advise_huge_pages
from graphrl.memory import MemoryManager, Region, RegionHandle, Tier
from replay._sync import SLOT_BYTES, SharedMutex
from replay.chunk_codec import ChunkRing, ChunkRingHandle, arena_size, chunk_steps_for
from replay.commit_kernel import count_overwritten, repair_hole, write_steps
from replay.keys import MAX_POSITION
from replay.shard_layout import (
    COMMITS,
    CONTINUATION,
    EXHAUSTED,
    HOLE_END,
    HOLES,
    META_LEN,
    N_RECORDS,
    OPEN,
    OWNER_SHIFT,
    REC_FLAGS,
    REC_ID,
    REC_LENGTH,
    REC_START,
    RESERVE_DELETES,
    RESERVE_POS,
    WRITE_POS,
)
from replay.spec import TrajectorySpec

__all__ = ["ShardHandle", "ShardStorage", "live_parts"]

logger = logging.getLogger(__name__)

# the index region's byte offsets (its words by name: replay.shard_layout)
_META_OFF = SLOT_BYTES
_STEPS_OFF = _META_OFF + 8 * META_LEN


def live_parts(ring: np.ndarray, lo: int, hi: int) -> list[np.ndarray]:
    """Rows of positions [lo, hi) of a ring, in position order: one or two slices (no copy)."""
    cap = ring.shape[0]
    if hi <= lo:
        return [ring[:0]]
    a, b = lo % cap, (hi - 1) % cap + 1
    return [ring[a:b]] if a < b else [ring[a:], ring[:b]]


def _rows(x: Any) -> np.ndarray:
    """A state entry as one array: blocks (a list, from `ShardStorage.state_dict`) or an array-like."""
    return np.concatenate(x) if isinstance(x, list) else np.asarray(x[...])


def _index_bytes(capacity: int) -> int:
    return _STEPS_OFF + 24 * capacity + 32 * capacity


@dataclass(frozen=True)
class ShardHandle:
    """Picklable names of one shard's regions."""

    index: RegionHandle
    columns: tuple[tuple[str, RegionHandle], ...]
    chunks: tuple[tuple[str, ChunkRingHandle], ...] = ()


class ShardStorage:
    """One shard: field rings, the step and episode index, the shard mutex.

    Made by `create` (the store's owner) or `attach` (other processes). All reads of the index that
    must be consistent with the data happen with `lock` held.

    Attributes
    ----------
    shard_id : int
    capacity : int
        Steps of the ring.
    columns : dict of str to numpy.ndarray
        Ring views ``[capacity, *field_shape]`` (zero-copy over the regions) of the raw fields.
    chunks : dict of str to replay.chunk_codec.ChunkRing
        The fields with a codec (read them with `ChunkRing.read`, lock held).
    meta : numpy.ndarray, int64 [16]
        ``write_pos``, ``reserve_pos``, ``n_records``, ``holes``, ``commits``.
    steps : numpy.ndarray, int64 [capacity, 3]
        Per slot: episode record id (-1 for a hole), global commit sequence number, flags
        (``EXHAUSTED``: the sampler removed the item, set under this shard's lock).
    records : numpy.ndarray, int64 [capacity, 4]
        Record ring: id, first position, committed length, flags (OPEN, CONTINUATION).
    count_deletes : callable or None
        Called with ``n`` (shard lock held) when a repair finds that a dead writer's commit overwrote
        ``n`` items: the store counts them as deleted (`replay.control.Control.count_deletes`). None:
        no rate-limiter counters to keep (a shard on its own).
    """

    def __init__(
        self,
        shard_id: int,
        spec: TrajectorySpec,
        capacity: int,
        index: Region,
        columns: Mapping[str, Region],
        create: bool,
        count_deletes: Callable[[int], None] | None = None,
        chunks: Mapping[str, ChunkRing] | None = None,
    ) -> None:
        self.shard_id = shard_id
        self.chunks = dict(chunks or {})
        raw_names = [n for n in spec if n not in self.chunks]
        self.count_deletes = count_deletes
        self.spec = spec
        self.capacity = capacity
        self.index_region = index
        self.column_regions = dict(columns)
        raw = index.numpy()
        self.lock = SharedMutex(raw[:SLOT_BYTES], create=create)
        self.meta = raw[_META_OFF:_STEPS_OFF].view(np.int64)
        self.steps = raw[_STEPS_OFF : _STEPS_OFF + 24 * capacity].view(np.int64).reshape(capacity, 3)
        self.records = (
            raw[_STEPS_OFF + 24 * capacity : _index_bytes(capacity)].view(np.int64).reshape(capacity, 4)
        )
        self.columns = {name: columns[name].numpy() for name in raw_names}
        self._flat_rings = tuple(self.columns[n].reshape(-1).view(np.uint8) for n in raw_names)
        self._row_bytes = np.array([spec[n].row_bytes for n in raw_names], dtype=np.int64)
        if create:
            self.meta[:] = 0
            self.steps[:, 0] = -1
            self.records[:, REC_ID] = -1

    # -- construction
    @classmethod
    def create(
        cls,
        memory: MemoryManager,
        shard_id: int,
        spec: TrajectorySpec,
        capacity: int,
        tier: str = "shared",
        fallback: tuple[str, ...] = (),
        count_deletes: Callable[[int], None] | None = None,
    ) -> ShardStorage:
        """Allocate a shard's regions from ``memory`` (owner ``replay.shard{i}``)."""
        owner = f"replay.shard{shard_id}"
        regions: list[Region] = []
        try:
            index = memory.allocate((_index_bytes(capacity),), "uint8", tier, owner=owner, fallback=fallback)
            regions.append(index)
            cols = {}
            chunks = {}
            for name, f in spec.items():
                if f.codec is not None:
                    chunk = chunk_steps_for(capacity, f.chunk, name, f.codec)
                    arena = arena_size(capacity, f.row_bytes, chunk, f.arena_ratio)
                    chunks[name] = ChunkRing.create(
                        memory, name, f.shape, f.dtype, f.codec, capacity, chunk, arena, tier, owner, fallback
                    )
                    regions.extend(chunks[name].regions)
                    continue
                cols[name] = memory.allocate(
                    (capacity, *f.shape), f.dtype, tier, owner=owner, fallback=fallback
                )
                regions.append(cols[name])
                if cols[name].tier is Tier.HOST:  # huge pages: random rows miss the TLB less
                    ring = cols[name].tensor()
                    advise_huge_pages(ring.data_ptr(), ring.numel() * ring.element_size())
        except BaseException:
            for r in regions:
                r.free()
            raise
        return cls(shard_id, spec, capacity, index, cols, True, count_deletes, chunks)

    @classmethod
    def attach(
        cls,
        memory: MemoryManager,
        shard_id: int,
        spec: TrajectorySpec,
        capacity: int,
        handle: ShardHandle,
        count_deletes: Callable[[int], None] | None = None,
    ) -> ShardStorage:
        """Map a shard made by another process, by its handle's region names."""
        index = memory.attach(handle.index)
        cols = {name: memory.attach(h) for name, h in handle.columns}
        chunks = {name: ChunkRing.attach(memory, h) for name, h in handle.chunks}
        return cls(shard_id, spec, capacity, index, cols, False, count_deletes, chunks)

    def handle(self) -> ShardHandle:
        """Region names for `attach` (raises ``ValueError`` unless the regions are shared)."""
        return ShardHandle(
            self.index_region.handle(),
            tuple((n, r.handle()) for n, r in self.column_regions.items()),
            tuple((n, c.handle()) for n, c in self.chunks.items()),
        )

    def addresses(self) -> tuple[int, ...]:
        """Addresses (in this process) of the mutex, meta, step index, records and each field's ring in
        spec order: a shard's words of a `replay.commit_kernel` plan.

        Returns
        -------
        tuple of int
            ``4 + len(spec)`` byte addresses, valid while the shard's regions are mapped here (0 for a
            field with a codec: it has no ring, and the compiled paths are not used for it).
        """
        raw = self.index_region.numpy()
        base = raw.ctypes.data
        rings = tuple(self.columns[n].ctypes.data if n in self.columns else 0 for n in self.spec)
        return (base, base + _META_OFF, base + _STEPS_OFF, base + _STEPS_OFF + 24 * self.capacity, *rings)

    def report_repair(self, start: int, n: int) -> None:
        """Log the hole of ``n`` steps from position ``start`` that a dead writer's commit left."""
        logger.warning(
            "shard %d: a writer died mid-commit; %d steps at positions [%d, %d) are a hole",
            self.shard_id,
            n,
            start,
            start + n,
        )

    def regions(self) -> list[Region]:
        return [
            self.index_region,
            *self.column_regions.values(),
            *(r for c in self.chunks.values() for r in c.regions),
        ]

    def free(self) -> None:
        for r in self.regions():
            if not r.freed:
                r.free()

    # -- locking
    def acquire(self) -> None:
        """Lock the shard; repair a commit left half-done by a writer that died holding the lock."""
        if self.lock.acquire():
            self._repair()

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> ShardStorage:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _repair(self) -> None:
        hole_at, hole, lost = repair_hole(self.meta, self.steps.reshape(-1), self.capacity)
        if hole:
            self.report_repair(int(hole_at), int(hole))
        if lost and self.count_deletes is not None:  # the items the dead commit overwrote
            self.count_deletes(int(lost))

    # -- reads (lock held)
    @property
    def write_pos(self) -> int:
        return int(self.meta[WRITE_POS])

    @property
    def floor(self) -> int:
        """The oldest live position: ``max(0, write_pos - capacity)``."""
        return max(0, int(self.meta[WRITE_POS]) - self.capacity)

    def live_steps(self) -> int:
        """Steps held: the live positions less the holes among them (dead writers' commits)."""
        wp = int(self.meta[WRITE_POS])
        live = min(wp, self.capacity)
        if self.meta[HOLE_END] <= wp - live:  # the floor passed the newest hole: none is live
            return live
        return int(np.count_nonzero(self.steps[:live, 0] >= 0))  # positions 0.. fill slots 0.. first

    def position_of(self, slots: np.ndarray, upto: int | None = None) -> np.ndarray:
        """The live position held by each slot: the largest position < ``upto`` (default write_pos)."""
        wp = int(self.meta[WRITE_POS]) if upto is None else upto
        slots = np.asarray(slots, dtype=np.int64)
        return slots + self.capacity * ((wp - 1 - slots) // self.capacity)

    def episode_bounds(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First position and committed end of the episode of each (live, non-hole) position."""
        slots = positions % self.capacity
        rec = self.steps[slots, 0]
        r = self.records[rec % self.capacity]  # live positions always find their own record (see module doc)
        return r[:, REC_START].copy(), r[:, REC_START] + r[:, REC_LENGTH]

    def live_records(self) -> np.ndarray:
        """Records with live steps, oldest first: int64 [E, 4] (first position clipped to the floor)."""
        wp = int(self.meta[WRITE_POS])
        if wp == 0:
            return np.zeros((0, 4), dtype=np.int64)
        out = []
        pos = max(0, wp - self.capacity)
        while pos < wp:
            e = int(self.steps[pos % self.capacity, 0])
            if e < 0:  # a hole: skip to the next non-hole slot
                pos += 1
                continue
            r = self.records[e % self.capacity].copy()
            end = int(r[REC_START] + r[REC_LENGTH])
            r[REC_LENGTH] = end - pos
            r[REC_START] = pos
            out.append(r)
            pos = end
        return np.array(out, dtype=np.int64).reshape(-1, 4)

    # -- commit (lock held)
    def commit(
        self,
        data: Mapping[str, np.ndarray],
        count: int,
        seq_base: int,
        record: int | None,
        end: bool,
        pid: int = 0,
    ) -> tuple[int, int]:
        """Append ``count`` steps (rows ``[0, count)`` of ``data``) as one run of positions.

        Parameters
        ----------
        data : mapping of field name to numpy.ndarray [>= count, *field_shape]
        count : int
            Steps, 0 <= count <= capacity (0 only closes ``record``).
        seq_base : int
            Global sequence number of the first step.
        record : int or None
            The episode record to extend (the writer's open episode), or None for a new episode.
        end : bool
            The episode ends with these steps (its record closes).
        pid : int
            The writer's process, stamped on a new record (`release_dead_owners`; 0: unknown).

        Returns
        -------
        record : int
            The record now holding the steps.
        overwritten : int
            Items this commit overwrote (live positions that were neither holes nor already removed
            by ``max_times_sampled``): they leave the table.

        Raises
        ------
        OverflowError
            The shard would reach 2^35 positions (`replay.keys.MAX_POSITION`, the key layout's limit).
        """
        cap = self.capacity
        wp = int(self.meta[WRITE_POS])
        if wp + count >= MAX_POSITION:
            raise OverflowError(
                f"shard {self.shard_id} reached {MAX_POSITION} positions, the key layout's limit"
            )
        recs = self.records
        if record is not None:
            r = recs[record % cap]
            extend = r[REC_ID] == record and r[REC_FLAGS] & OPEN and r[REC_START] + r[REC_LENGTH] == wp
        else:
            extend = False
        if count == 0:
            if record is not None and recs[record % cap, REC_ID] == record and end:
                recs[record % cap, REC_FLAGS] &= ~OPEN
            return (record if record is not None else -1), 0
        # a field with a codec: compressed and placed before anything changes (its arena may be full)
        coded = [(c, c.prepare(data[n][:count], wp)) for n, c in self.chunks.items()]
        if not extend:
            if record is not None and recs[record % cap, REC_ID] == record:
                recs[record % cap, REC_FLAGS] &= ~OPEN  # the old part ends at its last committed step
            new = int(self.meta[N_RECORDS])
            self.meta[N_RECORDS] = new + 1
            flags = OPEN | (CONTINUATION if record is not None else 0) | pid << OWNER_SHIFT
            recs[new % cap] = (new, wp, 0, flags)
            record = new
        lo, hi = max(0, wp - cap), max(0, wp + count - cap)  # live positions this commit overwrites
        self.meta[RESERVE_DELETES] = count_overwritten(self.steps, cap, lo, hi)  # before the reserve
        self.meta[RESERVE_POS] = wp + count
        first = wp % cap
        srcs = tuple(data[name] for name in self.columns)
        if all(a.flags.c_contiguous for a in srcs):  # one kernel: the rows of every field, the index
            flat = tuple(a.reshape(-1).view(np.uint8) for a in srcs)
            rings = (self._flat_rings, flat, self._row_bytes, cap)
            overwritten = write_steps(*rings, first, count, self.steps, record, seq_base, lo, hi)
        else:
            overwritten = self._write_steps(srcs, first, count, record, seq_base, lo, hi)
        for c, prepared in coded:
            c.apply(prepared)
        r = recs[record % cap]
        r[REC_LENGTH] += count
        if end:
            r[REC_FLAGS] &= ~OPEN
        self.meta[WRITE_POS] = wp + count
        self.meta[RESERVE_DELETES] = 0  # after the publish: a repair never sees it cleared while reserved
        self.meta[COMMITS] += 1
        return int(record), int(overwritten)

    def _write_steps(
        self, srcs: tuple[np.ndarray, ...], first: int, count: int, record: int, seq_base: int, lo: int,
        hi: int,
    ) -> int:
        """`replay.commit_kernel.write_steps` for sources that are not contiguous (numpy copies)."""
        cap = self.capacity
        overwritten = 0
        if hi > lo:
            old = self.steps[np.arange(lo, hi) % cap]
            overwritten = int(np.count_nonzero((old[:, 0] >= 0) & ((old[:, 2] & EXHAUSTED) == 0)))
        n1 = min(count, cap - first)
        for ring, src in zip(self.columns.values(), srcs, strict=True):
            _copy_rows(ring, first, src, 0, n1)
            if count > n1:
                _copy_rows(ring, 0, src, n1, count - n1)
        seq = np.arange(seq_base, seq_base + count)
        for a, b, off in ((first, first + n1, 0), (0, count - n1, n1)):  # the run, and its wrapped rest
            if b > a:
                self.steps[a:b, 0] = record
                self.steps[a:b, 1] = seq[off : off + b - a]
                self.steps[a:b, 2] = 0
        return overwritten

    def release_dead_owners(self) -> int:
        """Close the open records whose writer process has died (lock held); return how many.

        A record's flags carry the pid of the process that opened it (`OWNER_SHIFT`); a pid that no
        longer exists (``os.kill(pid, 0)``: no such process) had its writer killed mid-episode. A
        killed process not yet reaped by its parent (a zombie) still counts as alive.
        """
        used = self.records[:, REC_ID] >= 0  # a slot no record has used yet (id -1) holds no flags
        flags = self.records[:, REC_FLAGS]
        rows = np.flatnonzero(used & (flags & OPEN != 0) & (flags >> OWNER_SHIFT != 0))
        if rows.size == 0:
            return 0
        owners = flags[rows] >> OWNER_SHIFT
        dead = [pid for pid in np.unique(owners).tolist() if not _alive(pid)]
        if not dead:
            return 0
        rows = rows[np.isin(owners, dead)]
        self.records[rows, REC_FLAGS] &= ~OPEN
        return int(rows.size)

    # -- checkpoints (lock held)
    def state_dict(self) -> dict[str, Any]:
        """The live steps and records, and the counters: views (blocks of rows), valid while locked.

        ``columns`` (per field) and ``steps`` are lists of row blocks of the live positions
        ``[floor, write_pos)`` in position order; ``records`` the live records (int64 [E, 4]).
        """
        wp, floor = self.write_pos, self.floor
        live = self.live_records()
        recs = self.records[live[:, REC_ID] % self.capacity] if len(live) else np.zeros((0, 4), np.int64)
        recs[:, REC_FLAGS] &= OPEN | CONTINUATION  # not the owners' pids: a restore closes every record
        return {
            "columns": {name: live_parts(ring, floor, wp) for name, ring in self.columns.items()},
            "chunks": {name: c.state() for name, c in self.chunks.items()},
            "steps": live_parts(self.steps, floor, wp),
            "records": recs,
            "write_pos": wp,
            "n_records": int(self.meta[N_RECORDS]),
            "holes": int(self.meta[HOLES]),
            "commits": int(self.meta[COMMITS]),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what `state_dict` gave (arrays or row blocks): every step in the slot it had, every
        record closed (the writers that held the open episodes are gone: docs/architecture.md#checkpoints)."""
        wp = int(state["write_pos"])
        slots = np.arange(max(0, wp - self.capacity), wp) % self.capacity
        with self:
            for name in self.columns:
                self.columns[name][slots] = _rows(state["columns"][name])
            for name, c in self.chunks.items():
                c.load_state(state["chunks"][name])
            self.steps[slots] = _rows(state["steps"])
            recs = _rows(state["records"])
            rows = recs[:, REC_ID] % self.capacity
            self.records[rows] = recs
            self.records[rows, REC_FLAGS] &= ~OPEN
            self.meta[WRITE_POS] = self.meta[RESERVE_POS] = wp
            self.meta[N_RECORDS] = int(state["n_records"])
            self.meta[HOLES] = int(state["holes"])
            self.meta[HOLE_END] = wp if state["holes"] else 0  # a hole may be among the restored steps
            self.meta[RESERVE_DELETES] = 0
            self.meta[COMMITS] = int(state["commits"])


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (this machine's; one that may not be signalled exists too)."""
    if pid == os.getpid() or not 0 < pid < 2**31:
        return True
    try:
        os.kill(pid, 0)  # signal 0: only checks; PermissionError means it exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _copy_rows(ring: np.ndarray, dst: int, src: np.ndarray, start: int, n: int) -> None:
    """``ring[dst:dst+n] = src[start:start+n]`` as one flat byte copy."""
    if n <= 0:
        return
    a = ring[dst : dst + n]
    b = src[start : start + n]
    if a.flags.c_contiguous and b.flags.c_contiguous and a.size:
        np.copyto(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    else:
        a[...] = b

"""Shard storage: column ring buffers and an episode index in shared memory, and the commit protocol.

Layout (DESIGN §4)
------------------
A store of S shards with ``capacity`` steps per shard holds, in memory-manager regions (the shared
tier by default, so that actor processes attach them by name):

- per shard and field, a ring ``[capacity, *field_shape]``;
- per shard, an *index* region: the shard's robust process-shared mutex, its counters (``write_pos``:
  steps ever committed, ``reserve_pos``: steps being committed, ``n_records``: episode records ever
  made), per slot the step's episode record id, commit sequence number and flags (int64
  ``[capacity, 3]``; flag EXHAUSTED: removed by ``max_times_sampled``),
  and a ring of episode records (int64 ``[capacity, 4]``: id, first position, committed length,
  flags);
- one *control* region for the whole store: the store mutex and condition variable, the rate
  limiter's counters, the global commit sequence, and per shard the steps assigned and the episodes
  left open by writers.

Positions and generations
-------------------------
Positions are absolute: the n-th step committed to a shard has position n and lives in slot
``n % capacity``. A position is live while ``position >= write_pos - capacity``; the position itself is
the generation stamp of its slot (generation ``position // capacity``), so a key naming a position
that has since been overwritten is recognised as stale and ignored. Episode record e lives in record
slot ``e % capacity``; a step's record id, checked against the record's stored id, finds its episode.

Concurrency design
------------------
Writers (`replay.writer.TrajectoryWriter`, in any process) stage steps privately and *commit* whole
episodes, or chunks of ``chunk_steps`` steps of long ones, to one shard:

1. Under the store mutex: wait until the rate limiter admits an insert (condition variable, with a
   deadline), pick the shard (an episode's later chunks go to the shard of its first; a new episode
   goes to the shard with the fewest open episodes, then the fewest steps assigned, so shards fill
   evenly) and take a range of global sequence numbers.
2. Under the shard mutex: publish ``reserve_pos``, copy the chunk into the ring (at most two flat
   slices per field, at copy bandwidth), stamp the slots with record id and sequence, extend or create
   the episode record, then publish ``write_pos``. An episode's chunk extends its record only if it
   lands right after it (no other writer committed to the shard in between); otherwise it starts a new
   record flagged as a continuation, and windows never cross the cut.
3. Under the store mutex: count the inserted and overwritten steps and wake waiters.

Steps become visible to samplers at step 2's end. A writer holds the shard mutex only for one chunk's
copy; many writers share a shard safely. The sampler (the store's owner) reads under the shard mutex
only what it needs to choose windows, copies the windows without any lock, and then re-checks
``write_pos`` under the mutex: a window whose oldest step fell below ``write_pos - capacity`` during the
copy may be torn and is drawn again. Because both the writer's copy and the re-check happen under the
same mutex, this holds on any memory model.

Mutexes are robust: if a process dies while holding a shard mutex mid-copy, the next locker finds
``reserve_pos > write_pos``, turns the reserved slots into a hole (no episode, never sampled) and
carries on; nothing else is lost.

References
----------
GEAR (Wang et al., ICML 2023): columnar trajectory tables in shared memory written by actors in place.
DeepMind Reverb: chunked trajectory writers, tables with a rate limiter. TorchRL: storage / writer /
sampler split, circular storage with trajectory ids.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrl.memory import MemoryManager, Region, RegionHandle
from replay._sync import SLOT_BYTES, SharedCondition, SharedMutex
from replay.spec import TrajectorySpec

__all__ = ["Control", "ShardHandle", "ShardStorage"]

logger = logging.getLogger(__name__)

# shard meta fields (int64)
WRITE_POS, RESERVE_POS, N_RECORDS, HOLES, COMMITS = 0, 1, 2, 3, 4
_META_OFF = SLOT_BYTES
_META_LEN = 16
_STEPS_OFF = _META_OFF + 8 * _META_LEN
# record fields (int64) and flags
REC_ID, REC_START, REC_LENGTH, REC_FLAGS = 0, 1, 2, 3
OPEN, CONTINUATION = 1, 2
LOST_RECORD = 1 << 62  # no record has this id (ids count up from 0): a commit to it starts a continuation
# step flags
EXHAUSTED = 1

# control fields (int64) after the rate limiter's four counters
GSEQ, WRITERS = 4, 5
_CTL_FIXED = 8
_CTL_OFF = 2 * SLOT_BYTES

MAX_POSITION = 1 << 39  # key layout: 39 bits of position


def _index_bytes(capacity: int) -> int:
    return _STEPS_OFF + 24 * capacity + 32 * capacity


@dataclass(frozen=True)
class ShardHandle:
    """Picklable names of one shard's regions."""

    index: RegionHandle
    columns: tuple[tuple[str, RegionHandle], ...]


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
        Ring views ``[capacity, *field_shape]`` (zero-copy over the regions).
    meta : numpy.ndarray, int64 [16]
        ``write_pos``, ``reserve_pos``, ``n_records``, ``holes``, ``commits``.
    steps : numpy.ndarray, int64 [capacity, 3]
        Per slot: episode record id (-1 for a hole), global commit sequence number, flags
        (``EXHAUSTED``: the sampler removed the item, set under this shard's lock).
    records : numpy.ndarray, int64 [capacity, 4]
        Record ring: id, first position, committed length, flags (OPEN, CONTINUATION).
    """

    def __init__(
        self,
        shard_id: int,
        spec: TrajectorySpec,
        capacity: int,
        index: Region,
        columns: Mapping[str, Region],
        create: bool,
    ) -> None:
        self.shard_id = shard_id
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
        self.columns = {name: columns[name].numpy() for name in spec}
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
    ) -> ShardStorage:
        """Allocate a shard's regions from ``memory`` (owner ``replay.shard{i}``)."""
        owner = f"replay.shard{shard_id}"
        regions: list[Region] = []
        try:
            index = memory.allocate((_index_bytes(capacity),), "uint8", tier, owner=owner, fallback=fallback)
            regions.append(index)
            cols = {}
            for name, f in spec.items():
                cols[name] = memory.allocate(
                    (capacity, *f.shape), f.dtype, tier, owner=owner, fallback=fallback
                )
                regions.append(cols[name])
        except BaseException:
            for r in regions:
                r.free()
            raise
        return cls(shard_id, spec, capacity, index, cols, create=True)

    @classmethod
    def attach(
        cls, memory: MemoryManager, shard_id: int, spec: TrajectorySpec, capacity: int, handle: ShardHandle
    ) -> ShardStorage:
        """Map a shard made by another process, by its handle's region names."""
        index = memory.attach(handle.index)
        cols = {name: memory.attach(h) for name, h in handle.columns}
        return cls(shard_id, spec, capacity, index, cols, create=False)

    def handle(self) -> ShardHandle:
        """Region names for `attach` (raises ``ValueError`` unless the regions are shared)."""
        return ShardHandle(
            self.index_region.handle(), tuple((n, self.column_regions[n].handle()) for n in self.spec)
        )

    def regions(self) -> list[Region]:
        return [self.index_region, *self.column_regions.values()]

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
        wp, rp = int(self.meta[WRITE_POS]), int(self.meta[RESERVE_POS])
        if rp > wp:
            slots = np.arange(wp, rp) % self.capacity
            self.steps[slots, 0] = -1
            self.meta[HOLES] += rp - wp
            self.meta[WRITE_POS] = rp
            logger.warning(
                "shard %d: a writer died mid-commit; %d steps at positions [%d, %d) are a hole",
                self.shard_id,
                rp - wp,
                wp,
                rp,
            )

    # -- reads (lock held)
    @property
    def write_pos(self) -> int:
        return int(self.meta[WRITE_POS])

    @property
    def floor(self) -> int:
        """The oldest live position: ``max(0, write_pos - capacity)``."""
        return max(0, int(self.meta[WRITE_POS]) - self.capacity)

    def live_steps(self) -> int:
        return min(int(self.meta[WRITE_POS]), self.capacity)

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
        self, data: Mapping[str, np.ndarray], count: int, seq_base: int, record: int | None, end: bool
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
            The shard would pass 2^39 positions (the key layout's limit).
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
        if not extend:
            if record is not None and recs[record % cap, REC_ID] == record:
                recs[record % cap, REC_FLAGS] &= ~OPEN  # the old part ends at its last committed step
            new = int(self.meta[N_RECORDS])
            self.meta[N_RECORDS] = new + 1
            recs[new % cap] = (new, wp, 0, OPEN | (CONTINUATION if record is not None else 0))
            record = new
        lo, hi = max(0, wp - cap), max(0, wp + count - cap)  # live positions this commit overwrites
        overwritten = 0
        if hi > lo:
            old = self.steps[np.arange(lo, hi) % cap]
            overwritten = int(np.count_nonzero((old[:, 0] >= 0) & ((old[:, 2] & EXHAUSTED) == 0)))
        self.meta[RESERVE_POS] = wp + count
        first = wp % cap
        n1 = min(count, cap - first)
        for name, ring in self.columns.items():
            src = data[name]
            _copy_rows(ring, first, src, 0, n1)
            if count > n1:
                _copy_rows(ring, 0, src, n1, count - n1)
        seq = np.arange(seq_base, seq_base + count)
        for a, b, off in ((first, first + n1, 0), (0, count - n1, n1)):  # the run, and its wrapped rest
            if b > a:
                self.steps[a:b, 0] = record
                self.steps[a:b, 1] = seq[off : off + b - a]
                self.steps[a:b, 2] = 0
        r = recs[record % cap]
        r[REC_LENGTH] += count
        if end:
            r[REC_FLAGS] &= ~OPEN
        self.meta[WRITE_POS] = wp + count
        self.meta[COMMITS] += 1
        return int(record), int(overwritten)


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


class Control:
    """The store-wide control block: mutex and condition, rate-limiter counters, sequence, shard loads.

    Attributes
    ----------
    cond : SharedCondition
        Guards everything below; notified on every counter change.
    counters : numpy.ndarray, int64 [4]
        The rate limiter's ``[inserts, samples, deletes, cancelled]``.
    ctl : numpy.ndarray, int64 [8 + 2 S]
        ``ctl[GSEQ]`` next global sequence number; ``ctl[WRITERS]`` writers ever made;
        ``assigned`` (steps per shard) and ``open`` (open episodes per shard) follow.
    """

    def __init__(self, region: Region, num_shards: int, create: bool) -> None:
        self.region = region
        self.num_shards = num_shards
        raw = region.numpy()
        self.mutex = SharedMutex(raw[:SLOT_BYTES], create=create)
        self.cond = SharedCondition(raw[SLOT_BYTES : 2 * SLOT_BYTES], self.mutex, create=create)
        self.ctl = raw[_CTL_OFF : _CTL_OFF + 8 * (_CTL_FIXED + 2 * num_shards)].view(np.int64)
        self.counters = self.ctl[:4]
        self.assigned = self.ctl[_CTL_FIXED : _CTL_FIXED + num_shards]
        self.open = self.ctl[_CTL_FIXED + num_shards : _CTL_FIXED + 2 * num_shards]
        if create:
            self.ctl[:] = 0

    @staticmethod
    def nbytes(num_shards: int) -> int:
        return _CTL_OFF + 8 * (_CTL_FIXED + 2 * num_shards)

    @classmethod
    def create(
        cls, memory: MemoryManager, num_shards: int, tier: str = "shared", fallback: tuple[str, ...] = ()
    ) -> Control:
        region = memory.allocate(
            (cls.nbytes(num_shards),), "uint8", tier, owner="replay.control", fallback=fallback
        )
        return cls(region, num_shards, create=True)

    def choose_shard(self, writer_id: int) -> int:
        """The shard for a new episode (mutex held): fewest open episodes, then fewest steps assigned."""
        s = self.num_shards
        order = (np.arange(s) + writer_id) % s  # rotate ties between writers
        best = min(order, key=lambda i: (int(self.open[i]), int(self.assigned[i])))
        return int(best)

    @property
    def closed(self) -> bool:
        return bool(self.counters[3])

    def free(self) -> None:
        if not self.region.freed:
            self.region.free()


def alloc_from(memory: MemoryManager, owner: str) -> Any:
    """An ``alloc(shape, dtype, name)`` for `replay.selectors.SelectorState` backed by host regions."""

    def alloc(shape: tuple[int, ...], dtype: Any, name: str) -> np.ndarray:
        region = memory.allocate(shape, dtype, "host", owner=owner)
        arr = region.numpy()
        arr[...] = 0
        return arr

    return alloc

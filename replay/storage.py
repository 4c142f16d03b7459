"""TrajectoryStorage: a store's shards and control block, and the commit protocol writers follow.

Held by the store's owner and by processes attaching it by handle; `replay.writer.TrajectoryWriter`
writes to it: `TrajectoryStorage.commit` appends a chunk of staged steps to one shard in three steps:

1. Under the control block's mutex (`replay.control.Control`): wait until the rate limiter admits the insert,
   pick the shard (an episode's later chunks go to the shard of its first; a new episode to the
   shard with the fewest open episodes, then the fewest steps assigned) and take a range of global
   commit sequence numbers. While a checkpoint holds the writers (``QUIESCE``), the commit instead
   lets the mutex go and waits at the writers' turnstile (`TrajectoryStorage.await_checkpoint`),
   holding no lock, then starts over. One deadline (``timeout``) bounds both waits.
2. Under the shard's mutex (`replay.shard.ShardStorage.commit`): publish ``reserve_pos``, copy the
   chunk into the rings, stamp the slots, extend or create the episode record, publish ``write_pos``.
   A chunk extends its record only if it lands right after it; otherwise it starts a record flagged
   as a continuation, and windows never cross the cut.
3. Still under the shard's mutex, under the control mutex: count the steps assigned to the shard, the
   inserted and overwritten steps, and wake waiters; so a checkpoint sees a commit's steps and its
   counts together or neither (``global_seq`` may pass an unfinished commit's numbers: a gap).

A writer's commit runs the three steps as one compiled call (`replay.commit_kernel.commit_chunk`: the
same locks, through `replay.sync_kernels`) when the rate limiter admits it at once; a commit that must
wait, and a caller without a writer's `TrajectoryStorage.sources`, run them in Python. A checkpoint
takes the turnstile, the shard locks in order, then the control mutex (`TrajectoryStorage.quiesced`).

Steps become visible to samplers at step 2's end. A sampler copies windows without a lock and then
re-checks the shard's floor under its mutex (`TrajectoryStorage.stale`); both the writer's copy and
the re-check happen under that mutex, so this holds on any memory model, with no sleeps. Mutexes are
robust: a writer that dies mid-commit leaves a hole that the next locker repairs. See
docs/architecture.md#replay-composition.

>>> storage = TrajectoryStorage.create(spec, capacity, num_shards, limiter, memory, chunk_steps=1024)
>>> handle = storage.handle()                         # in another process:
>>> TrajectoryStorage.attach(handle).commit(buffers, count, None, True, None, writer_id)

References
----------
DeepMind Reverb: chunked trajectory writers, tables with a rate limiter. TorchRL: the storage /
writer / sampler split.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager

import numpy as np

from graphrl.memory import MemoryManager
from replay.commit_kernel import FAILED, OK, OVERFLOW, build_plan, commit_chunk
from replay.control import GSEQ, WRITERS, Control
from replay.keys import MAX_POSITION
from replay.limiter_record import check_picklable
from replay.owner_watch import OwnerWatch, process_identity
from replay.rate_limiter import DELETES, INSERTS, RateLimiter
from replay.shard import ShardStorage
from replay.spec import TrajectorySpec
from replay.storage_records import Episode, StoreHandle

__all__ = ["GSEQ", "WRITERS", "Control", "Episode", "StorageViews", "StoreHandle", "TrajectoryStorage"]

logger = logging.getLogger(__name__)
SWEEP_EVERY_S = 1.0  # new writers look for episodes left open by dead writer processes at most this often
_CLOSED = "the replay store was closed; nothing more can be written"
WAIT_SLICE_S = 1.0  # a writer waiting for a checkpoint checks for a closed store and a dead owner this often


class TrajectoryStorage:
    """A store's shards and control block, shared by its owner and attached processes; commits steps.

    Made by `create` (the owner: it allocates every region) or `attach` (another process, from a
    `StoreHandle`). Writers commit through `commit`; samplers read the shards under their locks.

    Attributes
    ----------
    spec : TrajectorySpec
    capacity : int
        Steps per shard ring.
    control : Control
    shards : list of ShardStorage
    limiter : RateLimiter
        The rate limiter's settings (its counters live in ``control``).
    memory : MemoryManager
    owns_memory : bool
        The memory manager was made for this storage (`close` closes it).
    chunk_steps : int
        Default rows of a writer's staging buffers.
    timeout : float or None
        Default seconds a commit waits for the rate limiter.
    plan : numpy.ndarray, int64, or None
        Addresses and sizes for `replay.commit_kernel.commit_chunk` (None: a rate limiter whose
        admission is its own; commits take the Python steps).
    owner : replay.owner_watch.OwnerWatch
        The owner process (the one that made the regions), watched in an attached process: `commit`
        raises `ValueError` once it has ended (`check_owner`). Its ``process`` (this process's pid,
        a forked child's own) is stamped on the records this process's writers open.
    """

    def __init__(
        self,
        spec: TrajectorySpec,
        capacity: int,
        control: Control,
        shards: list[ShardStorage],
        limiter: RateLimiter,
        memory: MemoryManager,
        owns_memory: bool,
        chunk_steps: int,
        timeout: float | None,
        owner_pid: int = 0,
        owner_identity: str = "",
    ) -> None:
        self.spec = spec
        self.capacity = capacity
        self.control = control
        self.shards = shards
        self.limiter = limiter
        self.memory = memory
        self.owns_memory = owns_memory
        self.chunk_steps = chunk_steps
        self.timeout = timeout
        self.closed = False  # this object's close() ran (its regions are freed or unmapped)
        self.owner = OwnerWatch(owner_pid, owner_identity)
        self._next_sweep = 0.0  # new_writer_id's next release_dead_writers (time.monotonic)
        self.plan = None  # a rate limiter with an admission of its own: commits take the Python steps
        # the compiled commit copies raw rings only: a spec with a codec field commits in Python
        if type(limiter).can_insert is RateLimiter.can_insert and not spec.codec_fields:
            self.plan = build_plan(
                control.addresses(),
                [sh.addresses() for sh in shards],
                [f.row_bytes for f in spec.values()],
                capacity,
                limiter.min_size,
            )

    @property
    def store_closed(self) -> bool:
        """Whether the store is closed: this object's ``close`` ran, or the owner closed the store
        (the rate limiter's cancelled flag in the control block, seen from any process)."""
        return self.closed or self.control.closed

    @property
    def owner_gone(self) -> bool:
        """Whether this (attached) process has found the store's owner process ended (no new check)."""
        return self.owner.known_gone

    def check_owner(self, who: str, count: int) -> None:
        """Raise once the store's owner process has ended (an attached process's view; the owner's own
        storage never raises). Checks at most every `replay.owner_watch.CHECK_EVERY_S` seconds.

        Parameters
        ----------
        who : str
            The object and call, for the message.
        count : int
            Steps the caller could not commit (named in the message).

        Raises
        ------
        ValueError
            The owner has ended (`replay.owner_watch.OwnerWatch.ended`, naming its pid).
        """
        if self.owner.gone():
            raise self.owner.ended(
                who, f"nothing more can be written ({count} steps were not committed); what it held survives "
                "only in its checkpoints",
            )

    @classmethod
    def create(
        cls,
        spec: TrajectorySpec,
        capacity: int,
        num_shards: int,
        limiter: RateLimiter,
        memory: MemoryManager | None,
        chunk_steps: int,
        timeout: float | None,
        tier: str = "shared",
    ) -> TrajectoryStorage:
        """Allocate the control block and ``num_shards`` shards of ``capacity`` steps (default a private
        memory manager, closed with the storage); ``"pinned"`` falls back to host memory."""
        owns = memory is None
        memory = MemoryManager() if memory is None else memory
        fallback = ("host",) if tier == "pinned" else ()
        shards: list[ShardStorage] = []
        control = None
        try:
            control = Control.create(memory, num_shards, tier, fallback)
            for i in range(num_shards):
                shards.append(
                    ShardStorage.create(memory, i, spec, capacity, tier, fallback, control.count_deletes)
                )
        except BaseException:
            for sh in shards:
                sh.free()
            if control is not None:
                control.free()
            if owns:
                memory.close()
            raise
        return cls(spec, capacity, control, shards, limiter, memory, owns, chunk_steps, timeout, os.getpid(),
                   process_identity())

    @classmethod
    def attach(cls, handle: StoreHandle, memory: MemoryManager | None = None) -> TrajectoryStorage:
        """Map the regions named by ``handle`` (default a private memory manager).

        Raises
        ------
        FileNotFoundError
            The owner has closed the store (its regions are gone).
        """
        owns = memory is None
        memory = MemoryManager() if memory is None else memory
        try:
            spec = handle.spec_object()
            control = Control(memory.attach(handle.control), handle.num_shards, create=False)
            shards = [
                ShardStorage.attach(memory, i, spec, handle.capacity, h, control.count_deletes)
                for i, h in enumerate(handle.shards)
            ]
        except BaseException:
            if owns:
                memory.close()
            raise
        return cls(  # the owner's limiter object: a subclass's rule holds here as in the owner
            spec, handle.capacity, control, shards, handle.rate_limiter, memory, owns, handle.chunk_steps,
            handle.timeout, handle.owner_pid, handle.owner_identity,
        )

    def handle(self) -> StoreHandle:
        """The picklable `StoreHandle` for `attach`, carrying the rate limiter object (a subclass's too).

        Raises
        ------
        ValueError
            The regions are not on the shared tier.
        TypeError
            The rate limiter cannot be pickled (`replay.limiter_record.check_picklable`).
        """
        try:
            shards = tuple(sh.handle() for sh in self.shards)
            control = self.control.region.handle()
        except ValueError as exc:
            raise ValueError(
                f"handle() needs a store on the shared tier (ReplayStore(..., tier='shared')): {exc}"
            ) from exc
        spec = tuple((n, tuple(e[0]), *e[1:]) for n, e in self.spec.to_config().items())
        return StoreHandle(
            spec,
            self.capacity,
            self.num_shards,
            control,
            shards,
            check_picklable(self.limiter, "handle()"),
            self.chunk_steps,
            self.timeout,
            self.owner.pid,
            self.owner.identity,
        )

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    # -- the commit protocol
    def new_writer_id(self) -> int:
        """A new writer's number, after `release_dead_writers` when episodes are open (at the first
        writer of this object, then at most every `SWEEP_EVERY_S` seconds: the sweep reads the record
        rings of the shards with open episodes).

        Returns
        -------
        int
            Writers ever made on this store, this one included (1, 2, ...).
        """
        now = time.monotonic()
        if now >= self._next_sweep and self.control.open.any():
            self._next_sweep = now + SWEEP_EVERY_S
            self.release_dead_writers()
        with self.control.cond:
            self.control.ctl[WRITERS] += 1
            return int(self.control.ctl[WRITERS])

    def sources(self, buffers: Mapping[str, np.ndarray]) -> np.ndarray:
        """A writer's staging buffers as `commit`'s ``sources``: int64 ``[rows, address per field]``.

        The buffers (one per field of the spec, ``[rows, *field_shape]``, C-contiguous) must outlive
        every commit given these sources.

        Raises
        ------
        ValueError
            A buffer is missing, not C-contiguous, or not ``[rows, *field_shape]`` of the field's dtype.
        """
        rows = None
        out = [0]
        for name, f in self.spec.items():
            b = buffers.get(name)
            if (
                not isinstance(b, np.ndarray)
                or b.dtype != f.dtype
                or b.shape[1:] != f.shape
                or not b.flags.c_contiguous
                or (rows is not None and b.shape[0] != rows)
            ):
                raise ValueError(
                    f"buffers[{name!r}] must be a C-contiguous numpy array [rows, {f.shape}] of {f.dtype} "
                    f"(rows the same for every field), got {type(b).__name__} "
                    f"{getattr(b, 'shape', '')} {getattr(b, 'dtype', '')}"
                )
            rows = b.shape[0]
            out.append(b.ctypes.data)
        out[0] = rows
        return np.array(out, dtype=np.int64)

    def commit(
        self,
        buffers: Mapping[str, np.ndarray],
        count: int,
        episode: tuple[int, int] | None,
        end: bool,
        timeout: float | None,
        writer_id: int,
        sources: np.ndarray | None = None,
    ) -> tuple[int, int]:
        """Commit rows ``[0, count)`` of ``buffers`` (see the module docstring); return (shard, record).

        ``episode`` is the writer's open ``(shard, record)`` or None for a new episode; ``end`` closes
        it. ``count == 0`` only closes ``episode``. ``sources`` (`sources` of ``buffers``, kept by a
        writer) lets an admissible commit run as one compiled call (`replay.commit_kernel.commit_chunk`,
        the same locks and steps); without it, or when the insert must wait, the steps below run in Python.

        In an attached process the owner is checked first and while waiting (`check_owner`).

        Raises
        ------
        TimeoutError
            Within ``timeout`` seconds the rate limiter did not admit the insert, or a checkpoint
            held the writers (`await_checkpoint`; the two waits share the deadline): nothing stored.
        ValueError
            The store was closed, or (attached) its owner process has ended (nothing stored).
        OverflowError
            The shard would reach 2^35 positions (`replay.keys.MAX_POSITION`, the key layout's limit).
        """
        owner = self.owner
        if owner.active:
            self.check_owner("replay writer", count)
        plan = self.plan
        ctl = self.control
        if sources is not None and plan is not None and 0 < count <= sources[0] and count <= self.capacity:
            shard, record = (-1, -1) if episode is None else episode
            lim = self.limiter
            status, shard, record, overwritten, died, hole_at, hole = commit_chunk(
                plan, sources, count, shard, record, end, writer_id, lim.samples_per_insert, lim.max_diff,
                owner.process,
            )
            if died:
                self._report_dead_holder(shard, died, hole_at, hole)
            if status == OK:
                return shard, record
            if status == OVERFLOW:
                raise OverflowError(f"shard {shard} reached {MAX_POSITION} positions, the key layout's limit")
            if status == FAILED:
                what = errno.errorcode.get(overwritten, overwritten)
                raise OSError(overwritten, f"a replay-store lock call failed: {what}")
            # BLOCKED: the Python steps below wait (for the rate limiter, or at the writers' turnstile)
        if count == 0:
            if episode is None:
                return -1, -1
            if ctl.writers_held:
                self.await_checkpoint("replay writer", count, time.monotonic(), timeout)
            shard, record = episode
            with self.shards[shard] as sh:
                sh.commit(buffers, 0, 0, record, end=True)
            with ctl.cond:
                ctl.open[shard] -= 1
                ctl.cond.notify_all()
            return shard, record
        start = time.monotonic()
        while True:
            left = None if timeout is None else max(0.0, start + timeout - time.monotonic())
            with ctl.cond:
                ok = ctl.cond.wait_for(
                    lambda: ctl.closed or owner.gone() or self.limiter.can_insert(ctl.counters), left
                )
                if ctl.closed:
                    raise ValueError(_CLOSED)
                # a timeout asks afresh: the owner's death, not the ratio, to blame
                if owner.gone(fresh=not ok):
                    waited = time.monotonic() - start
                    self.check_owner(f"replay writer (after {waited:.3g} s of rate-limiter wait)", count)
                if not ok:
                    raise TimeoutError(
                        f"insert waited {time.monotonic() - start:.3g} s (timeout={timeout}): "
                        f"{self.limiter.explain_insert_block(ctl.counters)}; {count} steps stay staged"
                    )
                if not ctl.writers_held:
                    if episode is None:
                        shard = ctl.choose_shard(writer_id)
                        if not end:
                            ctl.open[shard] += 1
                    else:
                        shard = episode[0]
                    seq_base = int(ctl.ctl[GSEQ])
                    ctl.ctl[GSEQ] += count
                    break
            self.await_checkpoint("replay writer", count, start, timeout)  # holding no lock
        with self.shards[shard] as sh:
            record, overwritten = sh.commit(
                buffers, count, seq_base, None if episode is None else episode[1], end, owner.process
            )
            with ctl.cond:  # the shard still locked: a checkpoint sees the steps and their counts together
                ctl.assigned[shard] += count
                ctl.counters[INSERTS] += count
                ctl.counters[DELETES] += overwritten
                if end and episode is not None:
                    ctl.open[shard] -= 1
                ctl.cond.notify_all()
        return shard, record

    def await_checkpoint(self, who: str, count: int, start: float, timeout: float | None) -> None:
        """Wait, holding no lock, while a checkpoint holds the writers (`replay.control.Control.
        pass_turnstile`, in slices of at most `WAIT_SLICE_S` seconds so that signals, a closed store and
        the owner's end are seen): a commit calls it instead of taking a lock while
        ``control.writers_held``.

        The wait counts against the commit's deadline, ``start + timeout`` (``start``: the commit's
        `time.monotonic` when its waits began, the rate limiter's included; ``timeout`` None: no
        deadline, a checkpoint ends or its process dies and the turnstile is recovered, a robust mutex).

        Raises
        ------
        TimeoutError
            The deadline passed with the writers still held (the commit took nothing: the steps stay
            staged, or the episode open).
        ValueError
            The store was closed, or (attached) its owner process has ended while waiting (`check_owner`).
        """
        end = None if timeout is None else start + timeout
        held_since = time.monotonic()
        while True:
            left = WAIT_SLICE_S if end is None else min(WAIT_SLICE_S, max(0.0, end - time.monotonic()))
            if self.control.pass_turnstile(left):
                return
            if self.store_closed:
                raise ValueError(_CLOSED)
            if self.owner.active:
                self.check_owner(f"{who} (waiting for a checkpoint)", count)
            now = time.monotonic()
            if end is not None and now >= end:
                kept = f"{count} steps stay staged" if count else "the episode stays open"
                raise TimeoutError(
                    f"insert waited {now - start:.3g} s (timeout={timeout}): a checkpoint held the writers "
                    f"(the store's turnstile) for the last {now - held_since:.3g} s of it; {kept}"
                )

    @contextmanager
    def quiesced(self) -> Iterator[None]:
        """Hold the store still for a checkpoint: the writers' turnstile (`replay.control.Control.
        hold_writers`: writers stop before their next admission, so a writer committing back to back
        cannot keep the locks from it), then every shard lock in shard order, then the control mutex.
        Everything is let go in reverse order on exit, whatever raised.

        The lock order of the store is: (a table's lock,) the turnstile, shard locks in index order, the
        control mutex; a writer waits at the turnstile holding none of them. A commit admitted before
        the writers were held counts its steps under its shard's mutex (the module docstring, step 3),
        so what is held here is one consistent state: its steps and counts are both in it or neither.
        """
        ctl = self.control
        with ExitStack() as held:
            ctl.hold_writers()
            held.callback(ctl.release_writers)
            for sh in self.shards:
                sh.acquire()
                held.callback(sh.release)
            held.enter_context(ctl.cond)
            yield

    def _report_dead_holder(self, shard: int, died: int, hole_at: int, hole: int) -> None:
        """Log what `commit_chunk` found: mutexes whose holder had died, the hole it repaired."""
        logger.warning("a process died while holding a replay-store lock; recovering it (%d)", died)
        if hole:
            self.shards[shard].report_repair(hole_at, hole)

    def release_dead_writers(self) -> int:
        """Close the episodes left open by writer processes that died, and release their shards' open
        counts (which rank the shards for new episodes); return how many. Runs as each writer is made.

        An episode is found by its open record, stamped with its writer's pid: one whose record the
        ring reused, or whose writer died before its first commit, stays counted until a restore.
        Shards with no open episode are skipped (their record rings are not read).

        Returns
        -------
        int
            Episodes closed, over all shards (each shard's count is also logged as a warning).
        """
        released = 0
        for s, sh in enumerate(self.shards):
            if self.control.open[s] == 0:  # a racy read: an episode opened now has a live writer
                continue
            with sh:
                n = sh.release_dead_owners()
                if n:
                    with self.control.cond:  # the shard lock, then the control mutex, as a checkpoint
                        self.control.open[s] = max(0, int(self.control.open[s]) - n)
                        self.control.cond.notify_all()
            if n:
                logger.warning("shard %d: closed %d episode(s) left open by writer processes that died", s, n)
                released += n
        return released

    def open_episode(self, shard: int) -> None:
        """Count one more episode open on ``shard`` (a writer's continuation record)."""
        with self.control.cond:
            self.control.open[shard] += 1

    # -- reads
    def live_steps(self) -> int:
        total = 0
        for sh in self.shards:
            with sh:
                total += sh.live_steps()
        return total

    def stale(self, shard: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Which windows (shard, first position) lost a step to the writers: bool [B], floors read
        under each shard's lock (call it after copying the windows' steps)."""
        shard = np.asarray(shard)
        out = np.zeros(len(shard), dtype=bool)
        for s in np.unique(shard):
            sh = self.shards[int(s)]
            with sh:
                floor = sh.floor
            sel = shard == s
            out[sel] = np.asarray(first)[sel] < floor
        return out

    def episodes(self, shard: int | None = None) -> list[Episode]:
        """Copies of the live episodes (segments) of one shard or all, oldest first per shard."""
        out = []
        for s in range(self.num_shards) if shard is None else [shard]:
            sh = self.shards[s]
            with sh:
                for rec in sh.live_records():
                    start, n, flags = int(rec[1]), int(rec[2]), int(rec[3])
                    slots = np.arange(start, start + n) % sh.capacity
                    data = {name: ring[slots].copy() for name, ring in sh.columns.items()}
                    for name, c in sh.chunks.items():
                        data[name] = np.empty((n, *self.spec[name].shape), self.spec[name].dtype)
                        c.read(np.arange(start, start + n), data[name])
                    data = {name: data[name] for name in self.spec}
                    out.append(Episode(s, start, n, bool(flags & 1), bool(flags & 2), data))
        return out

    # -- lifetime
    def close(self) -> None:
        """Close the private memory manager, or free (owner) / unmap (attached) the regions."""
        self.closed = True
        self.owner.close()
        if self.owns_memory:
            self.memory.close()
        else:
            for sh in self.shards:
                sh.free()
            self.control.free()


class StorageViews:
    """What a store (the owner's `replay.store.ReplayStore` or an `replay.attach.AttachedStore`) reads
    off its `TrajectoryStorage` (``self.storage``): spec, shards and capacities, the memory manager."""

    storage: TrajectoryStorage

    @property
    def spec(self) -> TrajectorySpec:
        return self.storage.spec

    @property
    def num_shards(self) -> int:
        return self.storage.num_shards

    @property
    def shard_capacity(self) -> int:
        """Steps per shard ring."""
        return self.storage.capacity

    @property
    def capacity_steps(self) -> int:
        return self.storage.capacity * self.storage.num_shards

    @property
    def memory(self) -> MemoryManager:
        return self.storage.memory

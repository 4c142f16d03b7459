"""RayTrajectoryWriter: writes episodes to the Ray replay store from any process of the cluster.

`open_writer(handle, ...)` (what ``store.writer()`` and ``handle.writer()`` call) checks the arguments
and gets the writer's place in the round robin over the store's writers (one round trip to shard 0). The
writer validates steps against the spec and stages them in numpy buffers of ``chunk_steps`` rows
(`replay.staging_steps.StepStager`, as the local writer does), and ships the columns (numpy only) to one
shard per episode (`replay.distributed.routing.least_loaded`), at most ``max_inflight`` shipments in
flight; a shipment's error surfaces at the next call that waits for it. Same methods as
`replay.writer.TrajectoryWriter`; DeepMind Reverb's ``TrajectoryWriter`` (chunking, asynchronous streams
to the server) is the model.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from threading import get_ident
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from graphrl.memory import MemoryBudgetError
from replay._checks import MAX_BATCH, MAX_INT64, check_int, check_timeout
from replay._owner import ThreadOwner
from replay.distributed.errors import ShardError, actor_errors, secs, shard_error
from replay.distributed.routing import least_loaded
from replay.interface import DEFAULT
from replay.staging_steps import StepStager
from replay.writer import end_with_final

if TYPE_CHECKING:
    from replay.distributed.handle import RayStoreHandle

__all__ = ["RayTrajectoryWriter", "open_writer"]

logger = logging.getLogger(__name__)


def open_writer(
    handle: RayStoreHandle,
    chunk_steps: int | None = None,
    timeout: float | None = DEFAULT,
    *,
    shard: int | None = None,
    max_inflight: int = 2,
    store_closed: Callable[[], bool] | None = None,
) -> RayTrajectoryWriter:
    """A new `RayTrajectoryWriter` of the store ``handle`` names (see `RayReplayStore.writer`).

    ``store_closed``: where the writer is made by the store's owner, whether the owner closed it (the
    writer then refuses steps at once instead of at the next shipment).

    Raises
    ------
    ValueError
        Bad ``chunk_steps``, ``shard``, ``max_inflight`` or ``timeout``.
    """
    num_shards = len(handle.shards)
    if chunk_steps is None:
        chunk = handle.chunk_steps
    else:
        chunk = min(check_int("chunk_steps", chunk_steps, 1, MAX_INT64), handle.shard_capacity)
    if shard is not None:
        shard = check_int("shard", shard, 0, num_shards - 1)
    max_inflight = check_int("max_inflight", max_inflight, 0, MAX_BATCH)
    if timeout is not DEFAULT:
        timeout = check_timeout(timeout)
    first = None
    if shard is None and num_shards > 1:  # one round trip: new writers start round robin
        try:
            first = ray.get(handle.shards[0].next_writer.remote(), timeout=handle.timeout)
        except (*actor_errors(), ray.exceptions.GetTimeoutError) as exc:
            logger.debug("no writer number from shard 0 (%s): a random first shard", exc)
    return RayTrajectoryWriter(
        handle, chunk, handle.timeout if timeout is DEFAULT else timeout, shard, max_inflight, first,
        store_closed=store_closed,
    )


class RayTrajectoryWriter:
    """Writes episodes to a Ray-backed store from any process of the cluster; see `RayReplayStore.writer`.

    Same methods as `replay.writer.TrajectoryWriter` (``append``, ``extend``, ``add_episode``,
    ``end_episode``, ``flush``, ``close``, a context manager). Steps are validated against the spec
    here, staged in numpy buffers of ``chunk_steps`` rows, and shipped (numpy columns only) to one
    shard per episode when the episode ends or the buffers fill.

    Shipping is asynchronous: ``end_episode`` (and a full buffer) only *queues* a shipment, up to
    ``max_inflight`` at once. A shipment's error (`ShardError`, `TimeoutError`) is raised by the next
    call that waits for it: a later ``append``/``extend``/``end_episode`` once more than
    ``max_inflight`` are queued, `flush`, `wait`, `close`, or leaving the ``with`` block. `close`
    raises it too (after cleaning up), so an episode reported ended is never dropped silently.

    One writer per thread, as the local writer: the first thread that writes owns it, another thread's
    call raises ``RuntimeError`` naming both (`release_thread` hands it over; an ended owner passes it).

    Attributes
    ----------
    pending : int
        Steps staged here, not yet shipped.
    steps_written : int
        Steps the shards confirmed.
    episodes_written : int
        Episodes ended (and confirmed).
    shard_steps : numpy.ndarray, int64 [S]
        Steps this writer shipped to each shard.
    """

    def __init__(
        self,
        handle: RayStoreHandle,
        chunk_steps: int,
        timeout: float | None,
        shard: int | None,
        max_inflight: int,
        first_shard: int | None = None,
        *,
        store_closed: Callable[[], bool] | None = None,
    ) -> None:
        self._owner = ThreadOwner("RayTrajectoryWriter", "store.writer()")
        self._handle = handle
        self._store_closed = store_closed
        self.spec = handle.spec_object()
        self.chunk_steps = int(chunk_steps)
        self.timeout = timeout
        self.max_inflight = int(max_inflight)
        self._pin = shard
        buffers = {n: np.empty((self.chunk_steps, *f.shape), f.dtype) for n, f in self.spec.items()}
        self._stager = StepStager(self.spec, buffers, self._ship_chunk)
        self.steps_written = 0
        self.episodes_written = 0
        s = len(handle.shards)
        self.shard_steps = np.zeros(s, dtype=np.int64)
        self._offset = (
            int(first_shard) % s if first_shard is not None else int.from_bytes(os.urandom(2), "little") % s
        )
        self._id = int.from_bytes(os.urandom(6), "little") << 16
        self._episodes = 0
        self._episode: tuple[int, int] | None = None  # (shard, key) of the open episode
        self._shipped = 0  # steps of the open episode shipped so far
        # (ref, shard, steps, end, first shipment of its episode, steps of the episode shipped before it)
        self._inflight: deque[tuple[Any, int, int, bool, bool, int]] = deque()
        self._refused = False  # the last shipment (max_inflight=0) was refused by its shard's rate limiter
        self._closed = False

    # -- writing
    def append(self, step: Mapping[str, Any]) -> None:
        """Add one step (see `replay.writer.TrajectoryWriter.append`; raises the same errors)."""
        self._check_open("append")
        self._stager.append(step)

    def extend(self, steps: Mapping[str, Any]) -> None:
        """Add T steps given as columns ``[T, *field_shape]`` (same as T appends)."""
        self._check_open("extend")
        self._stager.extend(steps)

    def end_episode(self, final: Mapping[str, Any] | None = None) -> None:
        """Queue the staged steps for shipping and close the episode (asynchronous: see the class).

        ``final``: the observation after the last step, stored as one more step of the episode, every
        other field zero (`replay.writer.final_step`, as `replay.writer.TrajectoryWriter.end_episode`).

        Raises
        ------
        ValueError, TypeError
            A bad ``final`` (as `replay.writer.final_step`; nothing staged or shipped).
        ShardError
            An earlier shipment this call waited for met a dead shard (its steps are lost), or the
            shard was restarted while this writer's episode was open (its earlier part is lost; the
            rest is stored as a continuation record).
        TimeoutError
            An earlier shipment this call waited for was not admitted by its shard's insert allowance
            (the rate limiter) within ``timeout``; with ``max_inflight=0``, this call's own shipment (its
            steps stay staged and the episode open, as in the local writer: call it again to retry).
        graphrl.memory.MemoryBudgetError
            A codec field's arena on its shard refused an earlier shipment this call waited for (its
            steps are dropped, as in the local writer); the message names the shard and field first.
        """
        self._check_open("end_episode")
        if final is not None:
            end_with_final(self._stager, final, self._episode is not None, self._ship_end)
        elif self._stager.pending or self._episode is not None:
            self._stager.hand_off(self._ship_end)

    def add_episode(self, steps: Mapping[str, Any]) -> None:
        """`extend` then `end_episode`: the same shipments, the short case shipped straight from ``steps``.

        When nothing is staged, no episode is open and ``steps`` holds ``0 < T <= chunk_steps`` steps,
        the one shipment `end_episode` would queue carries the validated columns themselves (no copy
        into the staging buffers; Ray copies them as the shipment is queued, so ``steps`` may be
        reused at once); otherwise it is `extend` + `end_episode`. Either way the shards store what
        `replay.writer.TrajectoryWriter.add_episode` stores in a local store, but for the order: with
        shipments in flight a shard may store two episodes of this writer in either order (its actor
        threads run them at once), so a wrapped ring may keep the older one; ``max_inflight=0`` keeps it.

        Raises
        ------
        ValueError, TypeError, RuntimeError
            As `extend` (nothing of a bad call is staged or shipped).
        ShardError, TimeoutError, graphrl.memory.MemoryBudgetError
            As `end_episode`: an earlier shipment this call waited for failed (this episode is queued);
            with ``max_inflight=0``, a TimeoutError of this episode's shipment leaves it staged.
        """
        self._check_open("add_episode")
        t, cols = self.spec.validate_steps(steps)
        if self._stager.pending or self._episode is not None or not 0 < t <= self.chunk_steps:
            self._stager.extend(cols)
            self.end_episode()
            return
        self._refused = False
        try:
            self._ship_chunk(cols, t, end=True)
        except TimeoutError:
            if self._refused:  # max_inflight=0 and the shard's rate limiter refused it: staged, as locally
                self._stager.extend(cols)
            raise

    def flush(self, timeout: float | None = None) -> None:
        """Ship the staged steps keeping the episode open, and wait for every queued shipment.

        Parameters
        ----------
        timeout : float or None
            Seconds to wait for the shipments in flight (None: until they are stored or fail).

        Raises
        ------
        ShardError, TimeoutError
            The first error of a queued shipment (as `end_episode`); TimeoutError also when the
            shipments were not all stored within ``timeout``.
        """
        self._check_open("flush")
        if self._stager.pending:
            self._stager.hand_off(self._ship_chunk)
        self.wait(timeout)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every shipment in flight is stored (raises the first one's error, as `flush`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._inflight:
            self._resolve(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _choose(self) -> int:
        return self._pin if self._pin is not None else least_loaded(self.shard_steps, self._offset)

    @property
    def pending(self) -> int:
        """Steps staged here, not yet shipped."""
        return self._stager.pending

    def _ship_end(self, columns: dict[str, np.ndarray], count: int) -> None:
        self._ship_chunk(columns, count, end=True)

    def _ship_chunk(self, columns: dict[str, np.ndarray], count: int, end: bool = False) -> None:
        """Queue a shipment of the ``count`` staged rows of ``columns`` (the stager's callback)."""
        first = self._episode is None
        if first:
            shard = self._choose()
            key = self._id | (self._episodes & 0xFFFF)
            self._episodes += 1
            self._shipped = 0
        else:
            shard, key = self._episode
            self.wait()  # chunks of one episode arrive in order
        n = count
        cols = {name: buf[:n] for name, buf in columns.items()}
        actor = self._handle.shards[shard]
        ref = actor.insert.remote(key, cols, end, self.timeout, first)  # Ray copies the arguments now
        self._inflight.append((ref, shard, n, end, first, self._shipped))
        self.shard_steps[shard] += n
        self._shipped += n
        self._episode = None if end else (shard, key)
        if self.max_inflight == 0:  # one at a time: a shipment its shard did not admit stays staged
            try:
                while self._inflight:
                    self._resolve()
            except TimeoutError:
                if any(x[0] is ref for x in self._inflight):  # an older shipment's error: this one is queued
                    self._stager.clear()
                    raise
                self.shard_steps[shard] -= n  # the rate limiter refused it: nothing of it was stored
                self._shipped -= n
                self._episode = None if first else (shard, key)
                self._refused = True  # the rows stay staged (`hand_off`): end_episode retries, as locally
                raise
            except BaseException:
                self._stager.clear()
                raise
            self._stager.clear()
            return
        self._stager.clear()  # the rows are shipped: waiting for older shipments below may raise
        while len(self._inflight) > self.max_inflight:
            self._resolve()

    def _resolve(self, timeout: float | None = None) -> None:
        ref, shard, n, end, _, before = self._inflight[0]
        try:
            stored, lost = ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError as exc:
            raise TimeoutError(
                f"shard {shard}: a shipment of {n} steps was not stored within {secs(timeout)} "
                "(it stays queued: wait, flush or close again)"
            ) from exc
        except actor_errors() as exc:
            # the open episode (if any) stays open: its next shipment goes to the same shard, which
            # then stores it as a continuation (restarted) or fails again (dead); end_episode ends it
            self._inflight.clear()
            raise shard_error(
                shard,
                f"a writer's shipment of {n} steps",
                exc,
                self._handle.max_restarts,
                self._handle.store_id,
            ) from exc
        except MemoryBudgetError as exc:  # a codec field's arena on the shard: its message, not Ray's, first
            self._inflight.popleft()
            if not end:  # the shard ended the open episode at its last stored step: the next steps start
                self._episode = None  # a new one (as the local writer's), not a continuation of it
            cause = getattr(exc, "cause", None)
            if isinstance(cause, MemoryBudgetError):
                raise cause from exc
            raise
        except Exception as exc:  # the shard's TimeoutError (rate limiter) or another error: it is over
            self._inflight.popleft()
            cause = getattr(exc, "cause", None)
            if isinstance(exc, TimeoutError) and isinstance(cause, TimeoutError):
                raise cause from exc  # the shard's message, as the local writer's, not Ray's wrapper
            raise
        self._inflight.popleft()
        self.steps_written += stored
        if end:
            self.episodes_written += 1
        if lost:
            raise ShardError(
                f"shard {shard} was restarted by Ray while this writer's episode was open: the episode's "
                f"earlier part ({before} steps shipped before this shipment) is lost but for what the "
                f"shard's last checkpoint held (it reloaded that); the {stored} steps of this shipment "
                "were stored as a separate record marked continuation=True (windows do not reach back "
                "past its start), not as a whole episode"
            )

    # -- lifetime
    def release_thread(self) -> None:
        """Hand the writer over to the next thread that writes (see `replay.writer.TrajectoryWriter`).

        Raises
        ------
        RuntimeError
            Another thread, still alive, owns this writer.
        """
        self._owner.release()

    def _check_open(self, call: str) -> None:
        if self._owner.ident != get_ident():  # one comparison on the fast path
            self._owner.claim(call)
        if self._closed:
            raise ValueError(f"RayTrajectoryWriter.{call}(): this RayTrajectoryWriter is closed")
        if self._store_closed is not None and self._store_closed():
            raise ValueError(
                f"RayTrajectoryWriter.{call}(): the RayReplayStore this writer writes to is closed, so "
                f"nothing more can be written ({self._stager.pending} staged steps were not shipped)"
            )

    def close(self) -> None:
        """Drop staged steps, end the open episode, wait for every shipment in flight.

        Raises
        ------
        ShardError, TimeoutError
            The first error of a shipment that carried steps (an episode already reported ended
            included), raised after the writer is closed. The zero-step shipment that ends an open
            episode here is best effort (its error is only logged), as in the local writer.
        """
        if self._closed:
            return
        if self._owner.ident != get_ident():
            self._owner.claim("close")
        self._stager.clear()
        first: BaseException | None = None
        try:
            while self._inflight:  # earlier shipments first: their errors are the ones to report
                try:
                    self._resolve()
                except (ShardError, TimeoutError) as exc:
                    first = first or exc
            if self._episode is not None:
                try:
                    self._stager.hand_off(self._ship_end)  # zero steps: only ends the episode (best effort)
                    self.wait()
                except (ShardError, TimeoutError) as exc:
                    logger.debug("writer close: could not end the open episode: %s", exc)
        finally:
            self._closed = True
            self._inflight.clear()
            self._episode = None
        if first is not None:
            raise first

    def __enter__(self) -> RayTrajectoryWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is not None:
            try:
                self.close()
            except (ShardError, TimeoutError) as err:  # the exception in flight is the one to see
                logger.debug("writer close after an exception: %s", err)
            return
        try:
            if not self._closed:
                self.end_episode()
        except BaseException:
            try:
                self.close()
            except (ShardError, TimeoutError) as err:
                logger.debug("writer close: %s", err)
            raise
        self.close()

    def __repr__(self) -> str:
        return f"RayTrajectoryWriter(pending={self.pending}, steps_written={self.steps_written})"


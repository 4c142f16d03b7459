"""TrajectoryWriter: append steps (or whole trajectories) of episodes to a replay store, from any process.

A writer validates each step against the store's `replay.spec.TrajectorySpec` (a bad step raises
and stores nothing), stages steps in private buffers of ``chunk_steps`` rows
(`replay.staging_steps.StepStager`, shared with the Ray writer), and commits them to a shard when
the episode ends or the buffers fill (the commit protocol of `replay.storage`). So:

- ``extend(steps)`` with columns ``[T, ...]`` gives exactly the same store contents as T ``append``
  calls (same commits, same chunk boundaries); ``add_episode(steps)`` as ``extend`` + ``end_episode``
  (whole episodes of numpy columns are committed from them in place, one copy a step);
- steps become visible to samplers when committed: at ``end_episode()``, or ``chunk_steps`` at a time
  for long episodes (each chunk extends the episode when nothing else was committed to its shard in
  between; otherwise the episode continues in a new segment and windows do not cross the cut);
- ``end_episode(final={"obs": frame})`` stores the observation after the last step as one more step
  (every other field zero, `final_step`): what windows need to sample an episode's terminal
  transition (docs/architecture.md#windows, stacked frames);
- a writer that never calls ``end_episode`` uses bounded memory: its buffers hold at most
  ``chunk_steps`` steps, and the shard's ring overwrites the oldest steps of the endless episode.

Commits wait for the rate limiter and for a checkpoint holding the writers (``timeout`` seconds in
all, then ``TimeoutError`` with the steps still staged, so calling ``end_episode`` again retries). A
commit that a codec field's arena refuses (`graphrl.memory.MemoryBudgetError`) drops its steps and ends
the episode at its last committed step: the next steps start a new episode. As a context manager the
writer ends the open episode when the block exits normally; after an exception, staged steps are
dropped.

In a process attached to the store by handle, a writer notices the owner process's death (SIGKILL,
SIGTERM, a crash: the shared regions stay mapped, so writes alone would succeed unread): every commit
(a full chunk, ``flush``, ``end_episode``, ``add_episode``) and every rate-limiter wait asks whether the
owner lives, at most twice a second (`replay.owner_watch.OwnerWatch`), and then raises ``ValueError``
("lost the connection to the store's owner (pid N)", as a learner's), nothing of the commit stored; every
later call raises it too. Steps staged since the last commit are not checked until the next one.

References
----------
DeepMind Reverb's ``TrajectoryWriter`` (append, end_episode, chunking, flush on exit); TorchRL's
``Writer`` / ``extend``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from threading import get_ident
from typing import Any

import numpy as np

from graphrl.memory import MemoryBudgetError
from replay._owner import ThreadOwner
from replay.shard_layout import LOST_RECORD
from replay.spec import TrajectorySpec
from replay.staging_steps import Send, StepStager
from replay.storage import TrajectoryStorage

__all__ = ["TrajectoryWriter", "end_with_final", "final_step"]

logger = logging.getLogger(__name__)


def final_step(spec: TrajectorySpec, final: Mapping[str, Any], has_steps: bool) -> dict[str, np.ndarray]:
    """The step ``end_episode(final=...)`` stores after an episode's last step: ``final``'s fields, zeros.

    The writers' one rule for an episode's final observation (`TrajectoryWriter.end_episode`, the Ray
    writer's, `replay.torchrl.TorchRLWriter`'s ``final_fields``): every field of ``spec`` that
    ``final`` gives, checked as `replay.spec.FieldSpec.check`; every other field zero of its shape and
    dtype (action, reward, done of the placeholder: it is no transition of its own; with
    ``sample(B, 5, pad="head")`` it only ever sits at a window's last index, never at the anchor).

    Parameters
    ----------
    spec : TrajectorySpec
        The store's fields.
    final : mapping of str to array-like
        Some of ``spec``'s fields, each of the field's per-step shape and dtype (``{"obs": frame}``).
    has_steps : bool
        Whether the episode has a step (staged or committed) for ``final`` to follow.

    Returns
    -------
    dict of str to numpy.ndarray
        A whole step, in the spec's field order.

    Raises
    ------
    ValueError
        ``final`` names a field not in ``spec``, gives a wrong shape, is empty, or ``has_steps`` is
        False (an episode of no steps has no observation after its last step).
    TypeError
        ``final`` is not a mapping, or a field has a wrong dtype.

    References
    ----------
    DeepMind Acme's ``EpisodeAdapter`` / Reverb adders: the final observation as one more step with
    zero-padded action and reward.
    """
    if not isinstance(final, Mapping):
        raise TypeError(
            "end_episode(final=...): final must be a mapping of field name -> value, got "
            f"{type(final).__name__}"
        )
    unknown = [n for n in final if n not in spec]
    if unknown or not final:
        raise ValueError(
            f"end_episode(final=...): final must give some of the spec's fields {list(spec)}, got "
            f"{list(final)}" + (f" (unknown {unknown})" if unknown else "")
        )
    if not has_steps:
        raise ValueError(
            f"end_episode(final=...): final (fields {list(final)}) given to an episode with no steps: the "
            "observation after an episode's last step needs a step before it (append the steps first)"
        )
    step = {}
    for name, f in spec.items():
        if name in final:
            try:
                step[name] = f.check(final[name])
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"end_episode(final=...): {exc}") from None
        else:
            step[name] = np.zeros(f.shape, f.dtype)
    return step


def end_with_final(stager: StepStager, final: Mapping[str, Any], episode_open: bool, send: Send) -> None:
    """Stage `final_step` of ``final`` as the episode's last step and hand the rows to ``send``.

    If ``send`` raises and leaves the rows staged (a rate limiter's timeout), the final step is
    unstaged again, so retrying ``end_episode(final=...)`` stores it once. ``episode_open``: whether
    the episode has committed steps (then it has a step even with none staged).

    Raises
    ------
    ValueError, TypeError
        As `final_step` (nothing staged); whatever the stager's ``on_full`` or ``send`` raises.
    """
    stager.hand_off_with(final_step(stager.spec, final, episode_open or stager.pending > 0), send)


class TrajectoryWriter:
    """Writes episodes to a store; get one with `replay.store.ReplayStore.writer`.

    Parameters
    ----------
    storage : replay.storage.TrajectoryStorage
        The store's shards and control block (the writer commits to them).
    chunk_steps : int
        Rows of the private staging buffers, 1 <= chunk_steps <= the shard capacity.
    timeout : float or None
        Seconds a commit waits for the rate limiter and a checkpoint holding the writers, together; None
        waits forever.

    Notes
    -----
    One writer per thread, as Reverb's ``TrajectoryWriter``: the first thread that writes owns the
    writer, and a call of another thread (while the owner is alive) raises ``RuntimeError`` naming both
    threads. A writer made in one thread may be used by one worker thread; the owner hands it over with
    `release_thread`, and a writer whose owner thread has ended passes to the next thread that writes.

    Attributes
    ----------
    pending : int
        Steps staged, not yet committed.
    steps_written : int
        Steps committed by this writer.
    episodes_written : int
        Episodes ended by this writer.
    """

    def __init__(self, storage: TrajectoryStorage, chunk_steps: int, timeout: float | None) -> None:
        self._owner = ThreadOwner("TrajectoryWriter", "store.writer()")
        self._storage = storage
        self.spec = storage.spec
        self.chunk_steps = int(chunk_steps)
        self.timeout = timeout
        self._regions = []
        buffers: dict[str, np.ndarray] = {}
        try:
            for name, f in self.spec.items():
                region = storage.memory.allocate(
                    (self.chunk_steps, *f.shape), f.dtype, "host", owner="replay.writer"
                )
                self._regions.append(region)
                buffers[name] = region.numpy()
        except BaseException:
            self._free()
            raise
        self._stager = StepStager(self.spec, buffers, self._commit_chunk)
        self._sources = storage.sources(buffers)  # the buffers' addresses: commits run as one compiled call
        # column signatures that passed the spec's checks, by field names in the caller's order: per field
        # the staging buffer, the dtype and the per-step shape of numpy columns; `extend` checks a call
        # with the same names against them (type, dtype, shape, common length) instead of the spec's checks
        self._signatures: dict[tuple[str, ...], tuple[tuple[np.ndarray, np.dtype, tuple[int, ...]], ...]] = {}
        self._episode: tuple[int, int] | None = None  # (shard, record) of the episode open in the store
        self.steps_written = 0
        self.episodes_written = 0
        self.writer_id = storage.new_writer_id()
        self._closed = False

    # -- writing
    def append(self, step: Mapping[str, Any]) -> None:
        """Add one step to the current episode.

        Parameters
        ----------
        step : mapping of field name to value
            Every field of the spec, each of the field's per-step shape and dtype.

        Raises
        ------
        ValueError
            A missing or unknown field or a wrong shape (naming the field); the step is not stored.
            Also a closed writer or store.
        TypeError
            A wrong dtype (naming the field); the step is not stored.
        TimeoutError
            The buffers were full and the commit waited ``timeout`` seconds for the rate limiter or a
            checkpoint.
        MemoryBudgetError
            A codec field's arena refused the commit: its steps are dropped, the episode ends (see above).
        RuntimeError
            Another thread owns this writer (nothing is staged): make one writer per thread.
        """
        self._check_open("append")
        self._stager.append(step)

    def extend(self, steps: Mapping[str, Any]) -> None:
        """Add T steps given as columns with a leading time axis ``[T, *field_shape]``: same as T appends.

        Raises
        ------
        ValueError, TypeError
            As `append`, for any column (nothing of the call is stored).
        TimeoutError
            A commit waited ``timeout`` seconds for the rate limiter or a checkpoint (the steps up to it are
            staged or
            committed; the rest are not).
        MemoryBudgetError
            A codec field's arena refused the commit: its steps are dropped, the episode ends (see above).
        RuntimeError
            Another thread owns this writer (nothing is staged): make one writer per thread.
        """
        self._check_open("extend")
        stager = self._stager
        if type(steps) is dict:  # a column signature seen before, fitting the free rows: stage it directly
            known = self._signatures.get(tuple(steps))
            if known is not None:
                t = -1
                for (_, dtype, tail), v in zip(known, steps.values(), strict=True):
                    if type(v) is not np.ndarray or v.dtype != dtype:
                        break
                    shape = v.shape
                    if not shape or shape[1:] != tail or (t >= 0 and shape[0] != t):
                        break
                    t = shape[0]
                else:
                    p = stager.pending
                    if 0 < t <= stager.chunk_steps - p:
                        for (dst, _, _), v in zip(known, steps.values(), strict=True):
                            dst[p : p + t] = v
                        stager.pending = p + t
                        return
            stager.extend(steps)  # the spec's checks (raises on bad input, nothing staged)
            values = list(steps.values())
            if all(type(v) is np.ndarray and v.ndim >= 1 for v in values) and (
                len({v.shape[0] for v in values}) == 1
            ):
                self._signatures[tuple(steps)] = tuple(
                    (stager.columns[k], v.dtype, v.shape[1:]) for k, v in steps.items()
                )
            return
        stager.extend(steps)

    def end_episode(self, final: Mapping[str, Any] | None = None) -> None:
        """Commit the staged steps and close the episode; the next step starts a new one.

        Parameters
        ----------
        final : mapping of field name to value, optional
            The fields of the observation after the episode's last step (``{"obs": last_frame}``),
            stored as one more step of the episode before it closes; every field not given is zero
            (see `final_step`). Windows over an episode then reach its terminal transition: with
            ``sample(B, 5, pad="head")``, ``obs[:, 1:]`` of the window ending at this step is the
            next stack of the last step (docs/architecture.md#windows, stacked frames). This is DeepMind
            Acme's adders' rule (the final observation written with zero-padded action and reward).

        Raises
        ------
        TimeoutError
            The rate limiter did not admit the commit, or a checkpoint held the writers, for ``timeout``
            seconds (steps stay staged, ``final`` does not; retry the same call).
        MemoryBudgetError
            A codec field's arena refused the commit: its steps are dropped, the episode ends (see above).
        ValueError
            ``final`` names an unknown field, has a wrong shape, or is given to an episode with no
            steps (nothing staged nor committed since the last end); nothing is staged or stored.
            Also the writer or the store is closed.
        TypeError
            ``final`` is not a mapping or has a wrong dtype; nothing is staged or stored.
        RuntimeError
            Another thread owns this writer.
        """
        self._check_open("end_episode")
        if final is not None:
            end_with_final(self._stager, final, self._episode is not None, self._commit_end)
            self.episodes_written += 1
        elif self._stager.pending or self._episode is not None:
            self._stager.hand_off(self._commit_end)
            self.episodes_written += 1

    def add_episode(self, steps: Mapping[str, Any]) -> None:
        """`extend` then `end_episode`: the same store contents, committed straight from ``steps``.

        When nothing is staged and ``steps`` holds exactly the spec's fields as C-contiguous numpy
        columns ``[T, *field_shape]`` of its dtypes with ``T <= chunk_steps``, the one commit
        `end_episode` would make reads the caller's columns in place (no copy into the staging
        buffers: one copy a step, as cpprb's ``add``); otherwise it is `extend` + `end_episode`.

        Raises
        ------
        ValueError, TypeError, RuntimeError
            As `extend` and `end_episode` (nothing of a bad call is stored).
        TimeoutError
            As `end_episode`: the steps stay staged; `end_episode` retries.
        MemoryBudgetError
            A codec field's arena refused the commit: its steps are dropped, the episode ends (see above).
        """
        self._check_open("add_episode")
        n = self._direct_rows(steps)
        if n == 0:
            self.extend(steps)
            self.end_episode()
            return
        sources = self._storage.sources(steps)
        try:
            shard, record = self._storage.commit(
                steps, n, self._episode, True, self.timeout, self.writer_id, sources
            )
        except TimeoutError:
            self.extend(steps)  # staged, as end_episode leaves them
            raise
        except MemoryBudgetError:
            self._cut()
            raise
        self.steps_written += n
        self.episodes_written += 1
        self._episode = None

    def _direct_rows(self, steps: Mapping[str, Any]) -> int:
        """T when `add_episode` may commit ``steps`` in place (see there), else 0."""
        if self._stager.pending or type(steps) is not dict or steps.keys() != self.spec.keys():
            return 0
        n = -1
        for name, f in self.spec.items():
            v = steps[name]
            if type(v) is not np.ndarray or v.dtype != f.dtype or v.shape[1:] != f.shape or v.ndim < 1:
                return 0
            if not v.flags.c_contiguous or (n >= 0 and v.shape[0] != n):
                return 0
            n = v.shape[0]
        return n if 0 < n <= self.chunk_steps else 0

    def flush(self) -> None:
        """Commit the staged steps now, keeping the episode open (they become sampleable).

        Raises
        ------
        TimeoutError
            The rate limiter did not admit the commit, or a checkpoint held the writers, for ``timeout``
            seconds (steps stay staged).
        MemoryBudgetError
            A codec field's arena refused the commit: its steps are dropped, the episode ends (see above).
        ValueError
            The writer or the store is closed.
        RuntimeError
            Another thread owns this writer.
        """
        self._check_open("flush")
        if self._stager.pending:
            self._stager.hand_off(self._commit_chunk)

    def begin_continuation(self, shard: int = 0) -> None:
        """Make the next steps a *continuation* record of ``shard``: a segment whose earlier part is lost.

        Windows never reach back past its start (as for a segment cut by another writer's commit, see
        `replay.storage`). The store counts the record as an open episode until `end_episode` (or
        `close`) ends it. For a writer re-playing an episode whose first steps went elsewhere (a
        restarted Ray shard, `replay.distributed`).

        Raises
        ------
        ValueError
            The writer is closed, or holds staged steps or an open episode (end it first).
        RuntimeError
            Another thread owns this writer.
        """
        self._check_open("begin_continuation")
        if self._stager.pending or self._episode is not None:
            raise ValueError(
                "begin_continuation() needs a writer with no staged steps and no open episode: "
                "call end_episode() first"
            )
        if not 0 <= shard < self._storage.num_shards:
            raise ValueError(f"shard must be in [0, {self._storage.num_shards - 1}], got {shard}")
        self._storage.open_episode(shard)
        self._episode = (shard, LOST_RECORD)

    @property
    def pending(self) -> int:
        """Steps staged, not yet committed."""
        return self._stager.pending

    def _commit_chunk(self, columns: dict[str, np.ndarray], count: int, end: bool = False) -> None:
        """Commit the ``count`` staged rows of ``columns`` (the stager frees them once this returns)."""
        try:
            shard, record = self._storage.commit(
                columns, count, self._episode, end, self.timeout, self.writer_id, self._sources
            )
        except MemoryBudgetError:
            self._cut()
            raise
        self.steps_written += count
        self._episode = None if end else (shard, record)

    def _commit_end(self, columns: dict[str, np.ndarray], count: int) -> None:
        self._commit_chunk(columns, count, end=True)

    def _cut(self) -> None:
        """After a commit a codec field's arena refused: drop the staged steps and end the open episode at
        its last committed step (no later step joins it across the dropped ones)."""
        self._stager.clear()
        if self._episode is not None:
            try:
                self._storage.commit(self._stager.columns, 0, self._episode, True, 0.0, self.writer_id)
            except (TimeoutError, ValueError) as exc:
                logger.debug("could not end the open episode: %s", exc)
            self._episode = None

    # -- lifetime
    @property
    def closed(self) -> bool:
        """Whether this writer can no longer write: it was closed, or its store was, or (in an attached
        process) a commit found the store's owner process ended."""
        return self._closed or self._storage.store_closed or self._storage.owner_gone

    def release_thread(self) -> None:
        """Hand the writer over: the calling thread (its owner) gives it up, and the next thread that
        writes owns it (see the class notes). Staged steps and the open episode go with the writer.

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
            raise ValueError(f"TrajectoryWriter.{call}(): this TrajectoryWriter is closed")
        if self._storage.store_closed:
            raise ValueError(
                f"TrajectoryWriter.{call}(): the replay store this writer writes to is closed, so nothing "
                f"more can be written ({self._stager.pending} staged steps were not committed); what it "
                "committed before stays in the store's checkpoints"
            )
        if self._storage.owner_gone:  # found by an earlier commit (`TrajectoryStorage.check_owner`)
            self._storage.check_owner(f"TrajectoryWriter.{call}()", self._stager.pending)

    def close(self) -> None:
        """Drop staged steps, close the open episode in the store (best effort; not once the store is
        closed) and free the buffers; idempotent.

        Raises
        ------
        RuntimeError
            Another thread, still alive, owns this writer (close it there, or after that thread ends).
        """
        if self._closed:
            return
        if self._owner.ident != get_ident():
            self._owner.claim("close")
        self._stager.clear()
        if self._episode is not None and not self._storage.store_closed:
            try:
                self._storage.commit(self._stager.columns, 0, self._episode, True, 0.0, self.writer_id)
            except (TimeoutError, ValueError) as exc:
                logger.debug("could not close the open episode: %s", exc)
            self._episode = None
        self._closed = True
        self._free()
        self._stager.columns = {}  # no view of the freed regions stays

    def _free(self) -> None:
        for r in self._regions:
            if not r.freed:
                r.free()
        self._regions = []

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        try:
            if exc_type is None and not self._closed and (self.pending or not self._storage.store_closed):
                self.end_episode()
        finally:
            self.close()

    def __reduce__(self) -> Any:
        raise TypeError(
            "a TrajectoryWriter cannot be sent to another process (its staging buffers and open episode are "
            "this process's): send store.handle() and write through ReplayStore.attach(handle).writer() there"
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"pending={self.pending}"
        return f"TrajectoryWriter(id={self.writer_id}, {state}, steps_written={self.steps_written})"

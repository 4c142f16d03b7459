"""AttachedStore: the write-only view of a replay store that actor processes get from its handle.

The store's owner (the learner process) creates every region; `replay.store.ReplayStore.handle`
names them in a small picklable `replay.storage.StoreHandle`, and ``ReplayStore.attach(handle)`` in
another process (spawn or fork) maps them into an `AttachedStore`, which writes through `writer` with
no pickling of step data and counts (``len``, `counters`). Sampling, priority updates and checkpoints
stay with the owner (the selector's state lives there): on an attached store they raise ``ValueError``.

>>> handle = store.handle()                               # in the learner
>>> with ReplayStore.attach(handle).writer() as w:        # in an actor process
...     w.append(step); w.end_episode()

References
----------
GEAR (Wang et al., ICML 2023): actors write trajectories into shared memory in place.
"""

from __future__ import annotations

from graphrl.memory import MemoryManager
from replay._checks import check_chunk_steps, check_timeout
from replay.interface import DEFAULT, OwnerOnlyCalls
from replay.rate_limiter import RateLimiterState
from replay.storage import Episode, StorageViews, StoreHandle, TrajectoryStorage
from replay.writer import TrajectoryWriter

__all__ = ["AttachedStore", "StoreHandle"]

class AttachedStore(StorageViews, OwnerOnlyCalls):
    """A store mapped from a `StoreHandle` in another process: it writes and counts, nothing more.

    Parameters
    ----------
    handle : StoreHandle
        From the owner's ``handle()``.
    memory : MemoryManager, optional
        For the writers' staging buffers and the mappings; default a private one.

    Raises
    ------
    FileNotFoundError
        The owner has closed the store (its regions are gone).
    """

    def __init__(self, handle: StoreHandle, memory: MemoryManager | None = None) -> None:
        self.storage = TrajectoryStorage.attach(handle, memory)
        self.rate_limiter = self.storage.limiter
        control = self.storage.control
        self._limiter = RateLimiterState(self.rate_limiter, control.counters, control.cond)
        self.selector = None
        self.max_times_sampled = 0
        self._closed = False

    # -- properties: spec, num_shards, shard_capacity, capacity_steps, memory (StorageViews)

    @property
    def closed(self) -> bool:
        """Whether `close` ran here or the owner closed the store (then nothing more can be written)."""
        return self.storage.store_closed

    def _check_open(self, call: str) -> None:
        what = "len(store)" if call == "__len__" else f"AttachedStore.{call}()"
        if self._closed:
            raise ValueError(f"{what}: this AttachedStore (a ReplayStore attached by handle) is closed")
        if call == "writer" and self.storage.store_closed:
            raise ValueError(
                f"{what}: the store's owner closed the ReplayStore this AttachedStore maps; nothing more "
                "can be written"
            )

    def __len__(self) -> int:
        """Live steps stored, over all shards."""
        self._check_open("__len__")
        return self.storage.live_steps()

    def counters(self) -> dict[str, int]:
        """Rate-limiter counters: ``inserts``, ``samples`` (steps) and ``deletes`` (items)."""
        self._check_open("counters")
        return self._limiter.state()

    def handle(self) -> StoreHandle:
        """The handle this store was attached from (to pass on to further processes)."""
        self._check_open("handle")
        return self.storage.handle()

    def episodes(self, shard: int | None = None) -> list[Episode]:
        """Copies of the live episodes of one shard or all (see `replay.store.ReplayStore.episodes`)."""
        self._check_open("episodes")
        return self.storage.episodes(shard)

    def writer(self, chunk_steps: int | None = None, timeout: float | None = DEFAULT) -> TrajectoryWriter:
        """A new `TrajectoryWriter` (as `replay.store.ReplayStore.writer`)."""
        self._check_open("writer")
        storage = self.storage
        chunk = storage.chunk_steps if chunk_steps is None else check_chunk_steps(
            storage.spec, storage.capacity, chunk_steps
        )
        timeout = storage.timeout if timeout is DEFAULT else check_timeout(timeout)
        return TrajectoryWriter(storage, chunk, timeout)

    # -- what only the owner does

    # -- lifetime
    def close(self) -> None:
        """Unmap the regions (or close the private memory manager); idempotent."""
        if self._closed:
            return
        self._closed = True
        self.storage.close()

    def __enter__(self) -> AttachedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ReplayStore(attached, shards={self.num_shards}, shard_capacity={self.shard_capacity}, "
            f"fields={list(self.spec)})"
        )

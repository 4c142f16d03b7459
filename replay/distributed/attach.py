"""RayAttachedStore: the write-only view of a Ray replay store that Ray tasks and actors get.

``RayReplayStore.attach(handle)`` makes one from a `replay.distributed.handle.RayStoreHandle` (actor
handles and settings, no data), and a `RayReplayStore` passed to a Ray task or actor arrives as one
(it pickles as its handle). It writes (`writer`, a `replay.distributed.writer.RayTrajectoryWriter`)
and counts (``len``, `episodes`); sampling, priority updates, the counters, stats and checkpoints
stay with the store's owner (the client's state lives there): they raise ``ValueError``. The local
store's counterpart is `replay.attach.AttachedStore`.

>>> @ray.remote
... def actor(store):                   # a RayAttachedStore here
...     with store.writer() as w:
...         w.extend(steps); w.end_episode()
"""

from __future__ import annotations

from typing import Any

from replay.distributed.group import ShardGroup
from replay.distributed.handle import RayStoreHandle
from replay.distributed.writer import RayTrajectoryWriter, open_writer
from replay.interface import DEFAULT, OwnerOnlyCalls
from replay.storage import Episode

__all__ = ["RayAttachedStore"]


class RayAttachedStore(OwnerOnlyCalls):
    """A Ray store seen from a handle in another process: it writes and counts, nothing more.

    Parameters
    ----------
    handle : RayStoreHandle
        From the owner's ``store.handle()``.

    Raises
    ------
    TypeError
        ``handle`` is not a `RayStoreHandle`.
    """

    def __init__(self, handle: RayStoreHandle) -> None:
        if not isinstance(handle, RayStoreHandle):
            raise TypeError(f"handle must be a RayStoreHandle (store.handle()), got {type(handle).__name__}")
        self.spec = handle.spec_object()
        self.num_shards = len(handle.shards)
        self.shard_capacity = handle.shard_capacity
        self.chunk_steps = handle.chunk_steps
        self.timeout = handle.timeout
        self.max_restarts = handle.max_restarts
        self._handle = handle
        self._shards = ShardGroup(list(handle.shards), handle.max_restarts)
        self._closed = False

    # -- properties and inspection
    @property
    def capacity_steps(self) -> int:
        return self.shard_capacity * self.num_shards

    @property
    def actors(self) -> list[Any]:
        """The shard actors' handles (index = shard)."""
        return list(self._shards.actors)

    def _check_open(self, call: str) -> None:
        if self._closed:
            what = "len(store)" if call == "__len__" else f"RayAttachedStore.{call}()"
            raise ValueError(f"{what}: this RayAttachedStore (a RayReplayStore attached by handle) is closed")

    def __len__(self) -> int:
        """Live steps stored over all shards."""
        self._check_open("__len__")
        stats = self._shards.call([(s, "stats", (None,)) for s in range(self.num_shards)], "len()")
        return int(sum(st["steps"] for st in stats))

    def episodes(self, shard: int | None = None) -> list[Episode]:
        """Copies of the live episodes of one shard or all (for inspection and tests)."""
        self._check_open("episodes")
        return self._shards.episodes(shard)

    def __repr__(self) -> str:
        return (
            f"RayReplayStore(attached, shards={self.num_shards}, shard_capacity={self.shard_capacity}, "
            f"fields={list(self.spec)})"
        )

    # -- handles and writers
    def handle(self) -> RayStoreHandle:
        """The handle this store was attached from (to pass on to further tasks)."""
        self._check_open("handle")
        return self._handle

    def __reduce__(self) -> tuple:
        return (RayAttachedStore, (self._handle,))

    def writer(
        self,
        chunk_steps: int | None = None,
        timeout: float | None = DEFAULT,
        *,
        shard: int | None = None,
        max_inflight: int = 2,
    ) -> RayTrajectoryWriter:
        """A new `RayTrajectoryWriter` (as `replay.distributed.RayReplayStore.writer`)."""
        self._check_open("writer")
        return open_writer(self._handle, chunk_steps, timeout, shard=shard, max_inflight=max_inflight)

    # -- what only the owner does
    owner_only_text = (
        "runs in the process that made the store; this copy was attached by handle and can only write "
        "(store.writer()) and count (len(store))"
    )

    def stats(self) -> dict[str, Any]:
        """Raises ``ValueError``: the global counters live with the owner."""
        raise self.owner_only("stats")

    def counters(self) -> dict[str, int]:
        """Raises ``ValueError``: the global counters live with the owner."""
        raise self.owner_only("counters")

    def shard_sizes(self) -> list[int]:
        """Raises ``ValueError``: only the owner asks every shard (use ``len``)."""
        raise self.owner_only("shard_sizes")

    # -- lifetime
    def close(self) -> None:
        """Stop writing through this copy (the owner's shards keep running); idempotent."""
        self._closed = True

    def __enter__(self) -> RayAttachedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

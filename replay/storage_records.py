"""The records a replay store's storage hands out: `StoreHandle` (what another process needs to attach the
store) and `Episode` (a copy of one live episode, for inspection). `replay.storage` makes them and
re-exports both; ``replay`` exports them to users.

>>> handle = store.handle()                 # a StoreHandle: pickle it to an actor process
>>> [ep.length for ep in store.episodes()]  # Episodes
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrl.memory import RegionHandle
from replay.rate_limiter import RateLimiter
from replay.shard import ShardHandle
from replay.spec import TrajectorySpec

__all__ = ["Episode", "StoreHandle"]


@dataclass(frozen=True)
class StoreHandle:
    """What another process needs to attach a store: region names and settings, no step data.

    Picklable (a few hundred bytes, plus the rate limiter object); send it to actor processes as an
    argument or through a queue.
    """

    spec: tuple[tuple[Any, ...], ...]  # (name, shape, dtype[, codec, arena_ratio])
    capacity: int
    num_shards: int
    control: RegionHandle
    shards: tuple[ShardHandle, ...]
    rate_limiter: RateLimiter  # the owner's object (a subclass's rule travels with it), picklable
    chunk_steps: int
    timeout: float | None
    owner_pid: int = 0  # the process that made the regions (0: unknown, not watched)
    owner_identity: str = ""  # its replay.owner_watch.process_identity ("": unknown, the pid alone trusted)

    def spec_object(self) -> TrajectorySpec:
        return TrajectorySpec({n: tuple(entry) for n, *entry in self.spec})


@dataclass
class Episode:
    """A live episode (or segment) of one shard, for inspection: `ReplayStore.episodes`.

    Attributes
    ----------
    shard : int
    start : int
        Absolute position of its oldest stored step.
    length : int
        Stored steps.
    open : bool
        Its writer has not ended it (more steps may follow).
    continuation : bool
        It continues an episode whose earlier part is a separate record (a cut windows do not cross).
    data : dict of str to numpy.ndarray
        Copies of its steps ``[length, *field_shape]``.
    """

    shard: int
    start: int
    length: int
    open: bool
    continuation: bool
    data: dict[str, np.ndarray]

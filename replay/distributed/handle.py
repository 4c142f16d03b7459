"""RayStoreHandle: what a Ray task or actor needs to write to a Ray replay store (no step data).

``store.handle()`` makes one; it pickles with Ray (actor handles and settings), and
``handle.writer()`` or ``RayReplayStore.attach(handle).writer()`` writes from any process of the
cluster. A pickled store becomes ``RayReplayStore.attach(handle)`` (a
`replay.distributed.attach.RayAttachedStore`) on arrival.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replay.distributed.writer import RayTrajectoryWriter, open_writer
from replay.spec import TrajectorySpec

__all__ = ["RayStoreHandle"]


@dataclass(frozen=True)
class RayStoreHandle:
    """What a Ray task or actor needs to write to the store: actor handles and settings, no data.

    Picklable by Ray (pass it, or the store itself, as an argument of a remote function).
    """

    spec: tuple[tuple[str, tuple[int, ...], str], ...]
    shards: tuple[Any, ...]
    shard_capacity: int
    chunk_steps: int
    timeout: float | None
    max_restarts: int = 0
    store_id: str = ""

    def spec_object(self) -> TrajectorySpec:
        return TrajectorySpec({n: (shape, dtype) for n, shape, dtype in self.spec})

    def writer(self, **kwargs: Any) -> RayTrajectoryWriter:
        """A `RayTrajectoryWriter` (same keywords as `RayReplayStore.writer`)."""
        return open_writer(self, **kwargs)

"""Trajectory replay for RL learners (DESIGN §4): a sharded, rate-limited store in shared memory.

>>> from replay import ReplayStore, TrajectorySpec, Prioritized, SampleToInsertRatio

See `replay.store` for the user's entry point, `replay.storage` for the layout and the concurrency
design, `replay.windows` for window semantics and `replay.checkpoint` for checkpoints.
"""

from replay.rate_limiter import MinSize, Queue, RateLimiter, SampleToInsertRatio
from replay.selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform
from replay.spec import FieldSpec, TrajectorySpec
from replay.store import Batch, Episode, ReplayStore, StoreHandle
from replay.writer import TrajectoryWriter

__all__ = [
    "Batch",
    "Episode",
    "FieldSpec",
    "Fifo",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "MinSize",
    "Prioritized",
    "Queue",
    "RateLimiter",
    "ReplayStore",
    "SampleToInsertRatio",
    "Selector",
    "StoreHandle",
    "TrajectorySpec",
    "TrajectoryWriter",
    "Uniform",
]

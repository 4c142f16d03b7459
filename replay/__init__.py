"""Trajectory replay for RL learners: a sharded, rate-limited store in shared memory.

>>> from replay import ReplayStore, TrajectorySpec, Prioritized, SampleToInsertRatio

See `replay.store` for the user's entry point and how its parts compose, `replay.storage` for the
commit protocol, `replay.windows` for window semantics and masks, `replay.selectors` (configs),
`replay.selector_state` and `replay.sumtree` for selectors, `replay.keys` for the key layout and
`replay.checkpoint` for checkpoints, `replay.learner` for many learner processes of one store
(``store.learner()``) (docs/architecture.md#replay-composition).
"""

from replay._files import CheckpointError
from replay.attach import AttachedStore
from replay.batch import Batch
from replay.interface import ReplayLearnerBase, ReplayStoreBase
from replay.learner import StoreLearner
from replay.rate_limiter import MinSize, Queue, RateLimiter, SampleToInsertRatio
from replay.selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform
from replay.spec import FieldSpec, TrajectorySpec
from replay.storage import Episode, StoreHandle
from replay.store import ReplayStore
from replay.writer import TrajectoryWriter

__all__ = [
    "AttachedStore",
    "Batch",
    "CheckpointError",
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
    "ReplayLearnerBase",
    "ReplayStore",
    "ReplayStoreBase",
    "SampleToInsertRatio",
    "Selector",
    "StoreHandle",
    "StoreLearner",
    "TrajectorySpec",
    "TrajectoryWriter",
    "Uniform",
]

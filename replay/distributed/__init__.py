"""Replay shards as Ray actors: a client that routes writes, samples globally and checkpoints.

>>> import ray; ray.init(num_cpus=2)                       # or ray.init(address="auto") on a cluster
>>> from replay.distributed import RayReplayStore
>>> store = RayReplayStore(spec, capacity_steps=1_000_000, num_shards=8,
...                        selector=Prioritized(0.6), rate_limiter=SampleToInsertRatio(4.0, 10_000, 1_000))
>>> @ray.remote
... def actor(store):                                      # the store pickles as a write-only handle
...     with store.writer() as w:
...         w.extend(steps); w.end_episode()
>>> batch = store.sample(256, window=64)                   # the same replay.batch.Batch as the local store
>>> store.update_priorities(batch.keys, td_errors); store.checkpoint("ckpt/")
>>> learner = store.learner()                              # picklable: a learner in any Ray process

Each shard is a threaded Ray actor that owns a local one-shard `replay.store.ReplayStore` and runs its
writer, sampling, priority and checkpoint code; the client holds no step data, checks its arguments with
the local store's checks (`replay._checks`) and satisfies the same `replay.interface.ReplayStoreBase`.
Modules, one job each: `client` (`RayReplayStore`), `shard` (`ShardActor`), `writer`
(`RayTrajectoryWriter`: buffers an episode, ships numpy columns to one shard), `handle`
(`RayStoreHandle`: what a remote writer needs), `attach` (`RayAttachedStore`: the write-only view a Ray
task gets), `routing` (which shard gets what: writes, draws, keys, the insert budget), `group`
(`ShardGroup`: parallel calls to the actors, restart recovery), `limiter` (`GlobalLimiter`: the rate
limiter over all shards), `sampler` (`ShardSampler`: a batch as from one table), `transport` (windows as
runs of ring slots through Ray's object store), `staging` (`BatchAssembler`: the batch built from the
replies), `checkpoint` (the manifest over the shards' checkpoints), `errors` (`ShardError`), `options`
(the Ray-only arguments), `learner` (`RayLearner`: one of many learners, each its own client of the
shards). Contracts (one-table sampling, keys, checkpoints, faults, security):
docs/architecture.md#replay-composition.

References
----------
Ray actors, fault tolerance (``max_restarts``) and the object store (zero-copy numpy reads);
TorchRL's ``RayReplayBuffer`` and RLlib's replay actors (a buffer as an actor); DeepMind Reverb's
sharded servers, rate limiters and checkpoints; GEAR (Wang et al., ICML 2023) sharded trajectory
tables.
"""

from replay.distributed.attach import RayAttachedStore
from replay.distributed.client import RayReplayStore
from replay.distributed.errors import ShardError
from replay.distributed.handle import RayStoreHandle
from replay.distributed.learner import RayLearner
from replay.distributed.writer import RayTrajectoryWriter

__all__ = [
    "RayAttachedStore",
    "RayLearner",
    "RayReplayStore",
    "RayStoreHandle",
    "RayTrajectoryWriter",
    "ShardError",
]

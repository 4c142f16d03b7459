"""RayLearner: one of many learners of a Ray replay store, each its own client of the shard actors.

``store.learner()`` (`replay.distributed.RayReplayStore.learner`) gives a small picklable `RayLearner`;
in any process of the cluster that has joined Ray (a Ray task or actor, or a torchrun rank after
``ray.init(address=...)``) it samples, updates priorities and reads stats::

    learner = store.learner()                    # the store's owner; pass it to the learners
    batch = learner.sample(256, window=128, device=f"cuda:{local_rank}")
    learner.update_priorities(batch.keys, td_errors)

Each learner runs the client's own sampling (`replay.distributed.sampler.ShardSampler`: the shards'
masses in one round trip, the split of the batch over the shards by mass, the shards' draws with
their own selectors, the batch assembled from the object store) with its own staging buffers and
its own seed for the split. Sampling is as from one table for every learner, since the split and each
shard's selector are; a priority update goes straight to the shard a key names and is in the masses
and the selector the next draw of any learner reads. Samples count in the store's one
`replay.distributed.limiter.SampleCounter` actor, read with the shards' stats before each draw, so the
rate limiter's samples per insert is global.

A learner never reloads a restarted shard (the owner holds the checkpoint folders): it raises
`replay.distributed.ShardError` saying the shard awaits the owner, whose next call reloads it.

References
----------
Reverb: many sampler clients of one sharded table server; GEAR (Wang et al., ICML 2023):
decentralised trainers sampling shared trajectory memory.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from graphrl.errors import GPUUnavailableError
from graphrl.memory import MemoryManager
from graphrl.process_origin import ProcessOrigin, made_here
from replay._checks import check_beta, check_device, check_keys, check_sample_args, check_timeout
from replay.distributed.group import ShardGroup
from replay.distributed.handle import RayStoreHandle
from replay.distributed.limiter import GlobalLimiter
from replay.distributed.routing import split_keys
from replay.distributed.sampler import ShardSampler
from replay.distributed.staging import BatchAssembler
from replay.interface import DEFAULT, ReplayLearnerBase
from replay.keys import issuer_applies, issuer_windows
from replay.rate_limiter import RateLimiter
from replay.selectors import check_priorities

if TYPE_CHECKING:
    from replay.batch import Batch

__all__ = ["RayLearner", "RayLearnerHandle", "check_ray_device"]


def check_ray_device(device: Any) -> None:
    """The device checks of a Ray store's ``sample`` (before anything is drawn).

    Raises
    ------
    graphrl.GPUUnavailableError
        A CUDA device while CUDA is not available (the Ray store copies batches with ``Batch.to``; numba's
        simulator does not stand in); a ``ValueError`` too.
    ValueError, TypeError
        Not a device (`replay._checks.check_device`).
    """
    if device is None:
        return
    check_device(device)
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():  # numba's simulator
        raise GPUUnavailableError(
            f"device={device!r} but CUDA is not available here (torch.cuda.is_available() is False): "
            "the Ray store copies batches to a GPU with Batch.to; sample with device='cpu' or None"
        )


@dataclass(frozen=True)
class RayLearnerHandle:
    """What a learner needs: the store's `RayStoreHandle`, its sample counter actor and settings."""

    store: RayStoreHandle
    counter: Any
    rate_limiter: RateLimiter  # the store's own object: a subclass's rules hold in every learner
    prioritized: bool
    staging_slots: int
    prefetch: int
    seed: int | None
    priority_limit: float = float("inf")  # the shards' (replay.selectors.priority_limit)
    store_id: int | None = None  # the store's key issuer id: this learner's batches bear it
    lineage: tuple[int, ...] = ()  # the stores it was restored from, oldest first (keys.issuer_windows)


class _Client:
    """A learner's per-process sampling client: shard group, limiter, sampler, staging buffers; ``origin``:
    the process that made it, the only one that uses or closes it (a fork child remakes its own)."""

    def __init__(self, handle: RayLearnerHandle) -> None:
        h = handle.store
        self.origin = ProcessOrigin()
        self.memory = MemoryManager()
        self.shards = ShardGroup(list(h.shards), h.max_restarts, reloads=False)
        self.limiter = GlobalLimiter(handle.rate_limiter, self.shards, handle.counter)
        self.staging = BatchAssembler(
            h.spec_object(), self.memory, handle.staging_slots, h.timeout, handle.prioritized, h.max_restarts
        )
        # one handle broadcast to many processes (torchrun ranks): each process its own split stream
        entropy = None if handle.seed is None else [handle.seed, self.origin.pid]
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
        self.sampler = ShardSampler(
            self.shards, self.limiter, self.staging, rng, handle.prioritized, handle.prefetch
        )
        self.lock = threading.Lock()
        try:
            self.limiter.refresh(None if h.timeout is None else max(h.timeout, 120.0), "RayLearner()")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.sampler.pending = None
        self.staging.close()
        self.memory.close()


class RayLearner(ReplayLearnerBase):
    """A learner's handle on a `replay.distributed.RayReplayStore`: sample, update priorities, stats.

    Made by ``store.learner()``; picklable (it travels as its `RayLearnerHandle`), it builds its client
    on first use in each process (again after a fork). Needs Ray initialised in that process.

    Parameters
    ----------
    handle : RayLearnerHandle
    """

    def __init__(self, handle: RayLearnerHandle) -> None:
        self.handle = handle
        self._client: _Client | None = None
        self._closed = False
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple:
        return (RayLearner, (self.handle,))

    def __repr__(self) -> str:
        h = self.handle.store
        return f"RayLearner(shards={len(h.shards)}, shard_capacity={h.shard_capacity})"

    def _get(self, call: str) -> _Client:
        if self._closed:
            raise ValueError(f"RayLearner.{call}(): this learner is closed")
        with self._lock:
            if self._client is None or not made_here(self._client.origin):
                self._client = _Client(self.handle)
            return self._client

    @property
    def closed(self) -> bool:
        """Whether `close` ran here (the store and its other learners are unaffected)."""
        return self._closed

    def sample(
        self,
        batch_size: int,
        window: int = 1,
        pad: str = "tail",
        timeout: float | None = DEFAULT,
        beta: float = 1.0,
        device: str | torch.device | None = None,
    ) -> Batch:
        """As `replay.distributed.RayReplayStore.sample` (same parameters, `Batch` and errors)."""
        b, length = check_sample_args(batch_size, window, pad)
        beta = check_beta(beta)
        check_ray_device(device)
        client = self._get("sample")
        timeout = self.handle.store.timeout if timeout is DEFAULT else check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with client.lock:
            batch = client.sampler.sample(b, length, pad, beta, deadline, timeout)
        if self.handle.store_id is not None:
            batch.stamp(self.handle.store_id)
        if device is not None and torch.device(device).type != "cpu":
            return batch.to(device)
        return batch

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """As `replay.distributed.RayReplayStore.update_priorities` (routed by the shard in each key)."""
        h = self.handle
        if h.store_id is None:
            applies = True
        else:
            fresh, stale = issuer_windows(h.store_id, h.lineage)
            applies = issuer_applies(keys, fresh, stale, h.store_id)  # raises for another store's keys
        k = check_keys(keys)
        p = check_priorities(priorities, k.size, limit=h.priority_limit)  # before any shard changes
        if not applies:
            return 0  # a stale issuer's keys: none apply
        client = self._get("update_priorities")
        routes = split_keys(k, len(client.shards))
        calls = [(s, "update_priorities", (local, p[rows])) for s, rows, local in routes]
        return int(sum(client.shards.call(calls, "update_priorities()")))

    def counters(self) -> dict[str, int]:
        """Global ``inserts``, ``samples`` (every learner's) and ``deletes``."""
        client = self._get("counters")
        with client.lock:
            client.limiter.refresh(what="counters()")
            i, s, d = client.limiter.counts()
        return {"inserts": i, "samples": s, "deletes": d}

    def stats(self) -> dict[str, Any]:
        """As `replay.distributed.RayReplayStore.stats` (one round trip; global counters)."""
        client = self._get("stats")
        with client.lock:
            stats = client.limiter.refresh(what="stats()")
            inserts, samples, deletes = client.limiter.counts()
        return {
            "steps": int(sum(st["steps"] for st in stats)),
            "live": int(sum(st["live"] for st in stats)),
            "priority_mass": float(sum(st["wmass"] for st in stats)),
            "inserts": inserts,
            "samples": samples,
            "deletes": deletes,
            "shard_steps": [int(st["steps"]) for st in stats],
        }

    def __len__(self) -> int:
        """Live steps stored over all shards."""
        return self.stats()["steps"]

    def close(self) -> None:
        """Free this process's staging buffers of the learner (the store is not affected); idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            client, self._client = self._client, None
        if client is not None and made_here(client.origin):
            client.close()

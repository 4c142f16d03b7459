"""RayReplayStore: a replay store whose shards are Ray actors; the client that routes, samples, checkpoints.

The client holds no step data. It checks its arguments with the local store's checks
(`replay._checks`), makes one `replay.distributed.shard.ShardActor` per shard (called through
`replay.distributed.group.ShardGroup`), hands writers a `RayStoreHandle` (`replay.distributed.writer`),
applies the user's rate limiter with global counters (`replay.distributed.limiter`), samples as from one
table (`replay.distributed.sampler`), routes priority updates by the shard in each key
(`replay.distributed.routing`) and writes checkpoints as one manifest over the shards'
(`replay.distributed.checkpoint`). It satisfies `replay.interface.ReplayStoreBase`, as the local store
does. See docs/architecture.md#replay-composition.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from graphrl.memory import MemoryManager
from replay._checks import (
    check_beta,
    check_int,
    check_keys,
    check_sample_args,
    check_store_args,
    check_timeout,
)
from replay.batch import Batch
from replay.distributed import checkpoint as manifests
from replay.distributed.attach import RayAttachedStore
from replay.distributed.errors import mark_closed
from replay.distributed.group import ShardGroup
from replay.distributed.handle import RayStoreHandle
from replay.distributed.learner import RayLearner, RayLearnerHandle, check_ray_device
from replay.distributed.limiter import GlobalLimiter, SampleCounter
from replay.distributed.options import check_ray_args, check_shard_selector
from replay.distributed.routing import explained_headroom, shard_seed, split_keys
from replay.distributed.sampler import ShardSampler
from replay.distributed.shard import ShardActor
from replay.distributed.staging import BatchAssembler
from replay.distributed.writer import RayTrajectoryWriter, open_writer
from replay.interface import DEFAULT, ReplayStoreBase
from replay.keys import MAX_LINEAGE, issuer_applies, issuer_windows, new_store_id
from replay.limiter_record import limiter_record
from replay.rate_limiter import RateLimiter
from replay.selectors import Selector, check_initial_priority, check_priorities, priority_limit
from replay.spec import TrajectorySpec
from replay.storage import Episode

__all__ = ["RayReplayStore"]

logger = logging.getLogger(__name__)

class RayReplayStore(ReplayStoreBase):
    """A replay store whose shards are Ray actors; same arguments and `Batch` as the local store.

    ``from replay.distributed import RayReplayStore``; needs ``ray.init()`` first.

    Parameters
    ----------
    spec, capacity_steps, num_shards, selector, rate_limiter, max_times_sampled, seed, chunk_steps, timeout,
    staging_slots
        As `replay.store.ReplayStore` (``capacity_steps // num_shards`` steps per shard actor). The
        rate limiter applies to the whole store at the client (`replay.distributed.limiter`). Fifo,
        Lifo, MinHeap and MaxHeap need ``num_shards=1``.
    memory : MemoryManager, optional
        The client's staging buffers come from it (default a private manager).
    tier : str
        Tier of the rings inside each shard actor: ``"host"`` (default), ``"shared"`` or ``"pinned"``.
    max_restarts : int
        Ray restarts a dead shard actor this many times (-1: without limit); a restarted shard
        reloads its last checkpoint. 0 (default): a dead shard stays dead and calls raise `ShardError`.
    actor_options : dict, optional
        Extra ``ray.remote`` options for the shard actors (``num_cpus``, ``resources``,
        ``scheduling_strategy``, ``max_concurrency``...); default ``{"max_concurrency": 32}``.
    prefetch : int
        1: as `sample` returns a batch it already sends the shards the draw of the next one (same
        arguments), so their draw and put overlap the client's copy and the caller's use of the batch, as
        Reverb's samplers keep samples in flight. The prefetched windows are drawn before the
        caller's `update_priorities` for the current batch (priorities one batch stale) and are
        discarded if the next call asks for another shape. 0 (default): every draw sees every update.

    Raises
    ------
    ValueError
        As the local store (bad sizes, a rate limiter that could never admit a sample, a bad tier),
        a deterministic selector with ``num_shards > 1``, bad ``max_restarts`` or ``actor_options``,
        or Ray not initialised (``ray.init()``).
    TypeError
        A spec, selector, rate limiter, memory manager or option of the wrong type.

    Examples
    --------
    >>> store = RayReplayStore(spec, 1_000_000, num_shards=4, max_restarts=1)
    >>> ray.get([actor.remote(store) for _ in range(4)])   # remote writers: store.writer() inside
    >>> batch = store.sample(256, window=64)
    """

    def __init__(
        self,
        spec: TrajectorySpec | Mapping[str, Any],
        capacity_steps: int,
        num_shards: int = 1,
        selector: Selector | None = None,
        rate_limiter: RateLimiter | None = None,
        memory: MemoryManager | None = None,
        *,
        max_times_sampled: int = 0,
        seed: int | None = None,
        chunk_steps: int | None = None,
        tier: str = "host",
        timeout: float | None = 60.0,
        staging_slots: int = 4,
        max_restarts: int = 0,
        actor_options: Mapping[str, Any] | None = None,
        prefetch: int = 0,
        _restore: dict | None = None,
    ) -> None:
        args = check_store_args(
            spec,
            capacity_steps,
            num_shards,
            selector,
            rate_limiter,
            max_times_sampled=max_times_sampled,
            seed=seed,
            chunk_steps=chunk_steps,
            tier=tier,
            timeout=timeout,
            staging_slots=staging_slots,
            memory=memory,
        )
        check_shard_selector(args.selector, args.num_shards)
        max_restarts, options, prefetch = check_ray_args(max_restarts, actor_options, prefetch)
        spec, num_shards, shard_cap, chunk = args.spec, args.num_shards, args.shard_capacity, args.chunk_steps
        selector, rate_limiter, timeout, seed = args.selector, args.rate_limiter, args.timeout, args.seed
        max_times_sampled, staging_slots = args.max_times_sampled, args.staging_slots
        self.spec = spec
        self.num_shards = num_shards
        self.shard_capacity = shard_cap
        self.selector = selector
        self._priority_limit = priority_limit(selector, shard_cap)  # each shard's (its own table)
        check_initial_priority(selector, self._priority_limit)
        self.rate_limiter = rate_limiter
        self.max_times_sampled = max_times_sampled
        self.seed = seed
        self.chunk_steps = chunk
        self.timeout = timeout
        self.tier = args.tier
        self.max_restarts = max_restarts
        self.staging_slots = staging_slots
        self._learners = 0  # learner() handles made (each gets its own seed)
        self._counter: Any = None
        self._closed = False
        self._store_id = uuid.uuid4().hex
        self._lock = threading.RLock()
        restore = _restore or {}
        self.store_id = new_store_id()  # the keys' issuer: this store's batches' keys bear it
        self.lineage = tuple(restore.get("lineage", ()))[-MAX_LINEAGE:]  # the stores it was restored from
        self.fresh, self.stale = issuer_windows(self.store_id, self.lineage)  # whose keys apply, are stale
        rng = np.random.Generator(np.random.PCG64(seed))
        if restore.get("rng"):
            rng.bit_generator.state = restore["rng"]
        folders: dict[int, str] = dict(restore.get("folders", {}))
        first_counts = tuple(int(c) for c in restore.get("counts", (0, 0, 0)))
        first_headroom, first_why = explained_headroom(rate_limiter, first_counts)
        config = {
            "spec": spec.to_config(),
            "capacity": shard_cap,
            "num_shards": num_shards,
            "selector": selector.to_config(),
            "rate_limiter": rate_limiter.to_config(),
            # the shards' allowance until the client pushes one: from the restored counters, if any
            "insert_headroom": first_headroom,
            "insert_counts": first_counts,
            "insert_why": first_why,  # the limiter's own words past that headroom, for a refusal's message
            "max_times_sampled": max_times_sampled,
            "chunk_steps": chunk,
            "tier": args.tier,
            "timeout": timeout,
            "staging_slots": staging_slots,
        }
        self._owns_memory = memory is None
        self._memory = MemoryManager() if memory is None else memory
        prioritized = bool(selector.prioritized)
        staging = BatchAssembler(spec, self._memory, staging_slots, timeout, prioritized, max_restarts)
        self._staging = staging
        actor_cls = ray.remote(ShardActor)
        actors: list[Any] = []
        try:
            for s in range(num_shards):
                cfg = dict(config, seed=shard_seed(seed, s), reseed=bool(restore.get("reseed")))
                actors.append(
                    actor_cls.options(max_restarts=max_restarts, max_task_retries=0, **options).remote(
                        s, cfg, folders.get(s)
                    )
                )
            self._shards = shards = ShardGroup(actors, max_restarts, folders)
            counter = ray.remote(SampleCounter).options(num_cpus=0)
            self._counter = counter.remote(int(restore.get("samples", 0)))
            self._limiter = limiter = GlobalLimiter(rate_limiter, shards, self._counter)
            self._sampler = ShardSampler(shards, limiter, staging, rng, prioritized, prefetch)
            self._refresh(timeout=None if timeout is None else max(timeout, 120.0), what="RayReplayStore()")
        except BaseException:
            self._shards = ShardGroup(actors, max_restarts, folders)
            self._kill()
            raise

    @property
    def prefetch(self) -> int:
        """1: the next draw is sent as a batch is returned (see the class); may be set between samples."""
        return self._sampler.prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        self._sampler.prefetch = check_int("prefetch", value, 0, 1)

    @property
    def last_profile(self) -> dict[str, float]:
        """Seconds of each stage of the last `sample` (stats, remote draw and put, ray.get, copy), and
        ``shard_put_bytes``: the bytes the shards put into the object store for it."""
        return self._sampler.last_profile

    def _refresh(self, timeout: float | None = None, what: str = "a store call") -> list[dict]:
        return self._limiter.refresh(timeout, what)

    # -- properties and inspection
    @property
    def capacity_steps(self) -> int:
        return self.shard_capacity * self.num_shards

    @property
    def actors(self) -> list[Any]:
        """The shard actors' handles (index = shard), e.g. for ``ray.kill`` in fault drills."""
        return list(self._shards.actors)

    @property
    def closed(self) -> bool:
        """Whether `close` ran (every call but ``close`` then raises ``ValueError``)."""
        return self._closed

    def _check_open(self, call: str) -> None:
        if self._closed:
            what = "len(store)" if call == "__len__" else f"RayReplayStore.{call}()"
            raise ValueError(f"{what}: this RayReplayStore is closed")

    def __len__(self) -> int:
        """Live steps stored over all shards."""
        self._check_open("__len__")
        stats = self._shards.call([(s, "stats", (None,)) for s in range(self.num_shards)], "len()")
        self._shards.stats = stats
        return int(sum(st["steps"] for st in stats))

    def shard_sizes(self) -> list[int]:
        """Live steps of each shard (index = shard)."""
        self._check_open("shard_sizes")
        with self._lock:
            return [int(st["steps"]) for st in self._refresh(what="shard_sizes()")]

    def counters(self) -> dict[str, int]:
        """Global rate-limiter counters: ``inserts``, ``samples`` (steps) and ``deletes``."""
        self._check_open("counters")
        with self._lock:
            self._refresh(what="counters()")
            i, s, d = self._limiter.counts()
        return {"inserts": i, "samples": s, "deletes": d}

    def stats(self) -> dict[str, Any]:
        """A snapshot over all shards (one round trip): ``steps``, ``live`` and ``priority_mass`` (sums
        of the shards'; the live count for Uniform), the global rate-limiter counters ``inserts``,
        ``samples``, ``deletes``, and ``shard_steps`` (live steps of each shard)."""
        self._check_open("stats")
        with self._lock:
            stats = self._refresh(what="stats()")
            inserts, samples, deletes = self._limiter.counts()
        return {
            "steps": int(sum(st["steps"] for st in stats)),
            "live": int(sum(st["live"] for st in stats)),
            "priority_mass": float(sum(st["wmass"] for st in stats)),
            "inserts": inserts,
            "samples": samples,
            "deletes": deletes,
            "shard_steps": [int(st["steps"]) for st in stats],
        }

    def episodes(self, shard: int | None = None) -> list[Episode]:
        """Copies of the live episodes of one shard or all (for inspection and tests)."""
        self._check_open("episodes")
        return self._shards.episodes(shard)

    def __repr__(self) -> str:
        return (
            f"RayReplayStore(owner, shards={self.num_shards}, shard_capacity={self.shard_capacity}, "
            f"fields={list(self.spec)})"
        )

    # -- handles and writers
    def handle(self) -> RayStoreHandle:
        """The picklable handle `attach` takes in a Ray task or actor (actor handles and settings)."""
        self._check_open("handle")
        spec = tuple((n, f.shape, f.dtype.name) for n, f in self.spec.items())
        return RayStoreHandle(
            spec,
            tuple(self._shards.actors),
            self.shard_capacity,
            self.chunk_steps,
            self.timeout,
            self.max_restarts,
            self._store_id,
        )

    def learner(self, seed: int | None = None) -> RayLearner:
        """A picklable `replay.distributed.learner.RayLearner`: samples this store from any process of
        the cluster as its own client of the shard actors (its samples count in the one rate limiter).

        ``seed``: of its draws' split over the shards (default derived from the store's seed and the
        learner's number, or fresh entropy for a store without a seed), mixed with the id of each
        process that samples through the handle: one handle broadcast to many ranks gives each rank its
        own stream.
        """
        self._check_open("learner")
        self._learners += 1
        if seed is None and self.seed is not None:
            seed = int(np.random.SeedSequence([self.seed, self._learners]).generate_state(1)[0])
        handle = RayLearnerHandle(
            self.handle(), self._counter, self.rate_limiter,
            bool(self.selector.prioritized), self.staging_slots, self.prefetch, seed,
            self._priority_limit, self.store_id, self.lineage,
        )
        return RayLearner(handle)

    @classmethod
    def attach(cls, handle: RayStoreHandle) -> RayAttachedStore:
        """A write-only view of a store from its handle (what a pickled store becomes in a Ray task):
        a `replay.distributed.attach.RayAttachedStore`, which writes (`writer`) and counts (``len``).

        Raises
        ------
        TypeError
            ``handle`` is not a `RayStoreHandle`.
        """
        return RayAttachedStore(handle)

    def __reduce__(self) -> tuple:
        return (RayAttachedStore, (self.handle(),))

    def writer(
        self,
        chunk_steps: int | None = None,
        timeout: float | None = DEFAULT,
        *,
        shard: int | None = None,
        max_inflight: int = 2,
    ) -> RayTrajectoryWriter:
        """A new `RayTrajectoryWriter` (one per thread, task or actor).

        Parameters
        ----------
        chunk_steps : int, optional
            Staging rows (default the store's ``chunk_steps``), capped at the shard capacity; a longer
            episode ships in chunks, all to the same shard.
        timeout : float or None, optional
            Seconds a shipment waits for its shard's insert allowance; default the store's ``timeout``.
        shard : int, optional
            Send every episode to this shard (default: balance this writer's steps over the shards,
            its first episode going to the next shard in a round robin over the store's writers).
        max_inflight : int
            Shipments in flight before the writer waits for the oldest (>= 0).

        Raises
        ------
        ValueError
            Bad ``chunk_steps``, ``shard`` or ``max_inflight``; a closed store.
        """
        self._check_open("writer")
        return open_writer(
            self.handle(), chunk_steps, timeout, shard=shard, max_inflight=max_inflight,
            store_closed=lambda: self._closed,
        )

    def sample(
        self,
        batch_size: int,
        window: int = 1,
        pad: str = "tail",
        timeout: float | None = DEFAULT,
        beta: float = 1.0,
        device: str | torch.device | None = None,
    ) -> Batch:
        """Draw ``batch_size`` windows of ``window`` steps as from one table over all shards.

        Same parameters, `Batch` and errors as `replay.store.ReplayStore.sample`; also `ShardError`
        when a shard's actor died (naming it). ``batch.keys`` carry the shard in their low 8 bits.
        ``device`` is checked before anything is drawn (as the local store). ``timeout`` bounds the
        wait for the rate limiter and the shards' draws (a shard stops drawing past it); the round
        trip that reads the shards' counters may take up to 5 s beyond a shorter ``timeout`` (so that
        ``timeout=0`` still says why the rate limiter blocks).

        Raises
        ------
        TimeoutError
            The rate limiter did not admit the sample within ``timeout`` (the message says why), a
            shard did not answer, or every staging slot stayed held.
        ValueError
            Bad arguments or a closed store (a copy attached by handle, `RayAttachedStore`, raises it
            too: only the owner samples).
        ShardError
            A shard's actor died (not restarted).
        graphrl.GPUUnavailableError
            ``device`` a CUDA device while CUDA is not available (a ``ValueError`` too).
        """
        self._check_open("sample")
        b, length = check_sample_args(batch_size, window, pad)
        beta = check_beta(beta)
        check_ray_device(device)  # before drawing (a draw counts in the rate limiter), as the local store
        timeout = self.timeout if timeout is DEFAULT else check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            batch = self._sampler.sample(b, length, pad, beta, deadline, timeout).stamp(self.store_id)
        if device is not None and torch.device(device).type != "cpu":
            return batch.to(device)
        return batch

    # -- priorities
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the windows named by ``keys`` (routed by the shard in each key).

        Same parameters, return value and errors as `replay.store.ReplayStore.update_priorities`;
        also `ShardError` when a shard's actor died.
        """
        self._check_open("update_priorities")
        applies = issuer_applies(keys, self.fresh, self.stale, self.store_id)  # raises if foreign
        k = check_keys(keys)
        p = check_priorities(priorities, k.size, limit=self._priority_limit)  # as every shard's
        if not applies:
            return 0  # a stale issuer's keys: none apply
        routes = split_keys(k, self.num_shards)
        calls = [(s, "update_priorities", (local, p[rows])) for s, rows, local in routes]
        with self._lock:
            return int(sum(self._shards.call(calls, "update_priorities()")))

    # -- checkpoints
    def checkpoint(self, path: str | os.PathLike[str]) -> str:
        """Write every shard and the client's state under ``path`` as one checkpoint; return its folder.

        Inserts pause on every shard while it is written (see the module docstring for the layout
        and the atomicity). ``path`` must be visible to every node that runs a shard.

        Raises
        ------
        ShardError
            A shard's actor died (the previous checkpoint stays the latest).
        OSError
            The files could not be written (the previous checkpoint stays the latest).
        """
        self._check_open("checkpoint")
        root = Path(path).absolute()
        root.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._sampler.drop_pending()  # its windows were drawn before the checkpoint
            return str(manifests.write(self._shards, root, self.timeout, self._settings))

    def _settings(self) -> dict[str, Any]:
        """The client's part of a manifest (read once the shards' checkpoints are written)."""
        self._refresh(what="checkpoint()")
        inserts, samples, deletes = self._limiter.counts()
        return {
            "spec": self.spec.to_config(),
            "capacity_steps": self.capacity_steps,
            "selector": self.selector.to_config(),
            "rate_limiter": limiter_record(self.rate_limiter),  # a subclass's class name too
            "max_times_sampled": self.max_times_sampled,
            "chunk_steps": self.chunk_steps,
            "timeout": self.timeout,
            "tier": self.tier,
            "seed": self.seed,
            "store_id": self.store_id,
            "lineage": list(self.lineage),
            "counters": {"inserts": inserts, "samples": samples, "deletes": deletes},
            "rng": self._sampler.rng.bit_generator.state,
        }

    @classmethod
    def restore(
        cls, path: str | os.PathLike[str], memory: MemoryManager | None = None,
        rate_limiter: RateLimiter | None = None, **kwargs: Any,
    ) -> RayReplayStore:
        """A new Ray-backed store (new shard actors) from the latest checkpoint under ``path``.

        Parameters
        ----------
        path : str or path
            The folder given to `checkpoint`.
        memory : MemoryManager, optional
            For the client's staging buffers.
        rate_limiter : RateLimiter, optional
            Needed when the checkpointed store's limiter was a `replay.rate_limiter.RateLimiter`
            subclass (a checkpoint records its settings and class name, not its code): the user's
            limiter, of that class with those settings. A built-in one is rebuilt without it.
        **kwargs
            Keywords to change: ``timeout``, ``seed``, ``staging_slots``, ``tier``, ``max_restarts``,
            ``actor_options``. Without ``seed`` the client's split and each shard's draws continue
            the checkpoint's generator states; with it, they start from that seed.

        Raises
        ------
        FileNotFoundError
            No manifest under ``path``.
        ValueError
            A manifest of another format or version, or an unknown keyword; a subclass's limiter not
            passed, or ``rate_limiter`` not of the checkpoint's class and settings
            (`replay.limiter_record.restored_limiter`).
        """
        root = Path(path).absolute()
        manifest = manifests.read_manifest(root)
        args, options, state = manifests.restore_arguments(root, manifest, kwargs, rate_limiter)
        return cls(*args, memory=memory, _restore=state, **options)

    # -- lifetime
    def _kill(self) -> None:
        self._shards.kill()
        if self._counter is not None:
            ray.kill(self._counter, no_restart=True)
        self._staging.close()
        if self._owns_memory:
            self._memory.close()

    def close(self) -> None:
        """Stop the shard actors (their data is gone: checkpoint first) and free the staging buffers.

        Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        self._sampler.pending = None
        mark_closed(self._store_id)  # remote writers that meet the dead actors say "closed", not "died"
        self._kill()

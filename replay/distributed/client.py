"""RayReplayStore: a replay store whose shards are Ray actors; the client that routes, samples, checkpoints.

The client holds no step data. It makes one `replay.distributed.shard.ShardActor` per shard
(`replay.distributed.group.ShardGroup` calls them), hands writers a `RayStoreHandle`
(`replay.distributed.writer`), applies the user's rate limiter with global counters (shards enforce
it on inserts through allowances, `replay.distributed.routing`), draws a batch as from one table
(`replay.distributed.routing.shares`) and builds it from the shards' ring runs
(`replay.distributed.staging`), and writes checkpoints as one manifest over the shards'
(`replay.distributed.checkpoint`). See docs/architecture.md#replay-composition.
"""

from __future__ import annotations

import logging
import math
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
from replay.distributed import checkpoint as manifests
from replay.distributed.errors import ShardError, actor_errors, mark_closed, secs
from replay.distributed.group import ShardGroup
from replay.distributed.handle import RayStoreHandle
from replay.distributed.options import DEFAULT, SHARD_TIERS, check_int, check_ray_args
from replay.distributed.routing import allowances, headroom, shard_seed, shares, split_calls, split_keys
from replay.distributed.shard import ShardActor
from replay.distributed.staging import BatchAssembler
from replay.distributed.writer import RayTrajectoryWriter, open_writer
from replay.rate_limiter import MinSize, RateLimiter
from replay.selectors import Fifo, Lifo, MinHeap, Selector, Uniform, check_priorities
from replay.spec import TrajectorySpec
from replay.store import MAX_SHARDS, MAX_WINDOW, Batch, Episode, ReplayStore
from replay.windows import PADS

__all__ = ["RayReplayStore"]

logger = logging.getLogger(__name__)

CHUNK_BYTES = 16 * 2**20
STATS_GRACE = 5.0  # seconds a sample's stats round trip may take past a shorter timeout (see stats_timeout)


def stats_timeout(deadline: float | None) -> float | None:
    """Seconds a stats round trip of `sample` may take: what is left of its deadline, but at least
    ``STATS_GRACE`` (a live shard answers in ms; even ``timeout=0`` must learn the counters to say
    why the rate limiter blocks, as the local store does)."""
    return None if deadline is None else max(STATS_GRACE, deadline - time.monotonic())


class RayReplayStore:
    """A replay store whose shards are Ray actors; same arguments and `Batch` as the local store.

    Made by ``ReplayStore(..., backend="ray")`` (or directly). Needs ``ray.init()`` first.

    Parameters
    ----------
    spec, capacity_steps, num_shards, selector, rate_limiter, max_times_sampled, seed, chunk_steps, timeout,
    staging_slots
        As `replay.store.ReplayStore` (``capacity_steps // num_shards`` steps per shard actor). The
        rate limiter applies to the whole store at the client (`replay.distributed.routing`). Fifo,
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
    >>> store = ReplayStore(spec, 1_000_000, num_shards=4, backend="ray", max_restarts=1)
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
        if not isinstance(spec, (TrajectorySpec, Mapping)):
            raise TypeError(f"spec must be a TrajectorySpec or a mapping, got {type(spec).__name__}")
        spec = spec if isinstance(spec, TrajectorySpec) else TrajectorySpec(spec)
        capacity_steps = check_int("capacity_steps", capacity_steps, 1)
        num_shards = check_int("num_shards", num_shards, 1, MAX_SHARDS)
        if capacity_steps < num_shards:
            raise ValueError(
                f"capacity_steps={capacity_steps} must be >= num_shards={num_shards} (>= 1 step a shard)"
            )
        selector = Uniform() if selector is None else selector
        if not isinstance(selector, Selector):
            raise TypeError(f"selector must be a replay.selectors.Selector, got {type(selector).__name__}")
        if isinstance(selector, (Fifo, Lifo, MinHeap)) and num_shards > 1:
            raise ValueError(
                f"selector={selector!r} with num_shards={num_shards}: Fifo, Lifo and the heaps have no "
                "per-shard split that equals one table; use num_shards=1 with backend='ray', or "
                "Uniform / Prioritized"
            )
        rate_limiter = MinSize(1) if rate_limiter is None else rate_limiter
        if not isinstance(rate_limiter, RateLimiter):
            raise TypeError(
                f"rate_limiter must be a replay.rate_limiter.RateLimiter, got {type(rate_limiter).__name__}"
            )
        if tier not in SHARD_TIERS:
            raise ValueError(
                f"tier must be 'host', 'shared' or 'pinned' (the shard actors' rings), got {tier!r}"
            )
        shard_cap = capacity_steps // num_shards
        rate_limiter.check_capacity(shard_cap * num_shards)
        if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)):
            raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
        if timeout is not None and (timeout < 0 or not math.isfinite(timeout)):
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")
        max_times_sampled = check_int("max_times_sampled", max_times_sampled, 0)
        if seed is not None:
            seed = check_int("seed", seed, 0)
        if chunk_steps is None:
            chunk = max(1, min(shard_cap, CHUNK_BYTES // max(1, spec.step_bytes)))
        else:
            if (
                isinstance(chunk_steps, bool)
                or not isinstance(chunk_steps, (int, np.integer))
                or chunk_steps < 1
            ):
                raise ValueError(f"chunk_steps must be an int >= 1, got {chunk_steps!r}")
            chunk = min(int(chunk_steps), shard_cap)
        staging_slots = check_int("staging_slots", staging_slots, 1)
        if memory is not None and not isinstance(memory, MemoryManager):
            raise TypeError(
                f"memory must be a graphrl.memory.MemoryManager or None, got {type(memory).__name__}"
            )
        max_restarts, options, prefetch = check_ray_args(max_restarts, actor_options, prefetch)
        self.spec = spec
        self.num_shards = num_shards
        self.shard_capacity = shard_cap
        self.selector = selector
        self.rate_limiter = rate_limiter
        self.max_times_sampled = max_times_sampled
        self.seed = seed
        self.chunk_steps = chunk
        self.timeout = timeout
        self.tier = tier
        self.max_restarts = max_restarts
        self.prefetch = prefetch
        self.last_profile: dict[str, float] = {}
        self._owner = True
        self._closed = False
        self._store_id = uuid.uuid4().hex
        self._lock = threading.RLock()
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._samples = 0
        self._pending: dict | None = None
        self._prioritized = bool(selector.prioritized)
        restore = _restore or {}
        if restore:
            self._samples = int(restore.get("samples", 0))
            if restore.get("rng"):
                self._rng.bit_generator.state = restore["rng"]
        folders: dict[int, str] = dict(restore.get("folders", {}))
        config = {
            "spec": spec.to_config(),
            "capacity": shard_cap,
            "num_shards": num_shards,
            "selector": selector.to_config(),
            "rate_limiter": rate_limiter.to_config(),
            "max_times_sampled": max_times_sampled,
            "chunk_steps": chunk,
            "tier": tier,
            "timeout": timeout,
            "staging_slots": staging_slots,
        }
        self._owns_memory = memory is None
        self._memory = MemoryManager() if memory is None else memory
        self._staging = BatchAssembler(
            spec, self._memory, staging_slots, timeout, self._prioritized, max_restarts
        )
        actor_cls = ray.remote(ShardActor)
        actors: list[Any] = []
        try:
            for s in range(num_shards):
                cfg = dict(config, seed=shard_seed(seed, s))
                actors.append(
                    actor_cls.options(max_restarts=max_restarts, max_task_retries=0, **options).remote(
                        s, cfg, folders.get(s)
                    )
                )
            self._shards = ShardGroup(actors, max_restarts, folders)
            self._refresh(timeout=None if timeout is None else max(timeout, 120.0), what="RayReplayStore()")
        except BaseException:
            self._shards = ShardGroup(actors, max_restarts, folders)
            self._kill()
            raise

    # -- shard stats and the global rate limiter
    def _allowances(self) -> list[float]:
        return allowances(self.rate_limiter, self._shards.stats, self._samples)

    def _refresh(self, timeout: float | None = None, what: str = "a store call") -> list[dict]:
        """Fresh stats from every shard (pushing each its insert allowance)."""
        allow = self._allowances() if self._shards.stats[0] else [None] * self.num_shards
        return self._shards.refresh(allow, timeout, what)

    def _counts(self) -> tuple[int, int, int]:
        inserts, deletes = self._shards.totals()
        return inserts, self._samples, deletes

    def _limited(self) -> bool:
        """Whether the rate limiter ever holds inserts back (not for MinSize)."""
        return not math.isinf(headroom(self.rate_limiter, 0, 0, 0))

    def _await_sample(self, deadline: float | None, timeout: float | None) -> None:
        """Refresh the counters until the rate limiter admits a sample (blocking calls, no polling)."""
        start = time.monotonic()
        while True:
            counts = self._counts()
            if self.rate_limiter.can_sample(counts):
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"sample waited {secs(time.monotonic() - start)} (timeout={secs(timeout)}): "
                    f"{self.rate_limiter.explain_sample_block(counts)}"
                )
            token = uuid.uuid4().hex
            self._shards.push_allowances(self._allowances())  # let the writers in while we wait
            actors = self._shards.actors
            refs = [
                a.wait_inserts.remote(st["inserts"], token, left)
                for a, st in zip(actors, self._shards.stats, strict=True)
            ]
            ray.wait(refs, num_returns=1, timeout=left)
            for a in actors:
                a.wake.remote(token)
            try:
                ray.get(refs)
            except actor_errors():
                pass  # the refresh below names the shard (or retries a restarted one)
            self._refresh(stats_timeout(deadline), "sample()")

    # -- properties and inspection
    @property
    def capacity_steps(self) -> int:
        return self.shard_capacity * self.num_shards

    @property
    def actors(self) -> list[Any]:
        """The shard actors' handles (index = shard), e.g. for ``ray.kill`` in fault drills."""
        return list(self._shards.actors)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this RayReplayStore is closed")

    def _check_owner(self, what: str) -> None:
        self._check_open()
        if not self._owner:
            raise ValueError(
                f"{what}() runs in the process that made the store; this copy was attached by handle and "
                "can only write (store.writer()) and count (len(store))"
            )

    def __len__(self) -> int:
        """Live steps stored over all shards."""
        self._check_open()
        stats = self._shards.call([(s, "stats", (None,)) for s in range(self.num_shards)], "len()")
        if self._owner:
            self._shards.stats = stats
        return int(sum(st["steps"] for st in stats))

    def shard_sizes(self) -> list[int]:
        """Live steps of each shard (index = shard)."""
        self._check_owner("shard_sizes")
        with self._lock:
            return [int(st["steps"]) for st in self._refresh(what="shard_sizes()")]

    def counters(self) -> dict[str, int]:
        """Global rate-limiter counters: ``inserts``, ``samples`` (steps) and ``deletes``."""
        self._check_owner("counters")
        with self._lock:
            self._refresh(what="counters()")
            i, s, d = self._counts()
        return {"inserts": i, "samples": s, "deletes": d}

    def episodes(self, shard: int | None = None) -> list[Episode]:
        """Copies of the live episodes of one shard or all (for inspection and tests)."""
        self._check_open()
        shards = (
            range(self.num_shards) if shard is None else [check_int("shard", shard, 0, self.num_shards - 1)]
        )
        parts = self._shards.call([(s, "episodes", ()) for s in shards], "episodes()")
        return [e for part in parts for e in part]

    def __repr__(self) -> str:
        role = "owner" if self._owner else "attached"
        return (
            f"RayReplayStore({role}, shards={self.num_shards}, shard_capacity={self.shard_capacity}, "
            f"fields={list(self.spec)})"
        )

    # -- handles and writers
    def handle(self) -> RayStoreHandle:
        """The picklable handle `attach` takes in a Ray task or actor (actor handles and settings)."""
        self._check_open()
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

    @classmethod
    def attach(cls, handle: RayStoreHandle) -> RayReplayStore:
        """A write-only view of a store from its handle (what a pickled store becomes in a Ray task)."""
        if not isinstance(handle, RayStoreHandle):
            raise TypeError(f"handle must be a RayStoreHandle (store.handle()), got {type(handle).__name__}")
        self = cls.__new__(cls)
        self.spec = handle.spec_object()
        self.num_shards = len(handle.shards)
        self.shard_capacity = handle.shard_capacity
        self.chunk_steps = handle.chunk_steps
        self.timeout = handle.timeout
        self.max_restarts = handle.max_restarts
        self._store_id = handle.store_id
        self._shards = ShardGroup(list(handle.shards), handle.max_restarts)
        self._handle = handle
        self._owner = False
        self._closed = False
        return self

    def __reduce__(self) -> tuple:
        return (RayReplayStore.attach, (self.handle(),))

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
        self._check_open()
        handle = self._handle if not self._owner else self.handle()
        return open_writer(handle, chunk_steps, timeout, shard=shard, max_inflight=max_inflight)

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
            Bad arguments, a closed store, or a copy attached by handle.
        ShardError
            A shard's actor died (not restarted).
        """
        self._check_owner("sample")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if (
            isinstance(window, bool)
            or not isinstance(window, (int, np.integer))
            or not 1 <= window <= MAX_WINDOW
        ):
            raise ValueError(f"window must be an int in [1, {MAX_WINDOW}], got {window!r}")
        if pad not in PADS:
            raise ValueError(f"pad must be 'tail' or 'head', got {pad!r}")
        if not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
            raise ValueError(f"beta must be finite and >= 0, got {beta}")
        if device is not None:  # before drawing (a draw counts in the rate limiter), as the local store
            ReplayStore._gather_target(self, device)  # type: ignore[arg-type]  # reads only its argument
            if torch.device(device).type == "cuda" and not torch.cuda.is_available():  # numba's simulator
                raise ValueError(
                    f"device={device!r} but CUDA is not available here (torch.cuda.is_available() is False): "
                    "the Ray store copies batches to a GPU with Batch.to; sample with device=None or 'cpu'"
                )
        timeout = self.timeout if timeout is DEFAULT else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        b, length = int(batch_size), int(window)
        with self._lock:
            t0 = time.perf_counter()
            pending, self._pending = self._pending, None
            if pending is not None and pending["key"] != (b, length, pad):
                self._drop(pending)  # prefetched for other arguments: its draws are discarded
                pending = None
            if pending is None:
                pending = self._issue(b, length, pad, deadline, block=True, timeout=timeout)
            t1 = time.perf_counter()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            replies = self._shards.collect(pending["calls"], pending["refs"], "sample()", left)
            t2 = time.perf_counter()
            self._samples += int(sum(int(rep["n"].sum()) for rep in replies))
            for (s, _, _), rep in zip(pending["calls"], replies, strict=True):
                self._shards.stats[s]["inserts"], self._shards.stats[s]["deletes"] = rep["counts"]
            if self.prefetch:  # the next batch is drawn and shipped while this one is copied and used
                try:
                    self._pending = self._issue(b, length, pad, None, block=False)
                except (ShardError, TimeoutError) as exc:  # surfaces at the next call
                    logger.debug("no prefetch: %s", exc)
            elif self._limited():  # let waiting writers in
                self._shards.push_allowances(self._allowances())
            batch, get_s = self._staging.assemble(pending, replies, beta, left)
            t3 = time.perf_counter()
            slowest = max(replies, key=lambda rep: rep["seconds"][2])["seconds"]
            self.last_profile = {
                "stats_s": t1 - t0 if "stats_s" not in pending else pending["stats_s"],
                "remote_s": t2 - t1,
                "shard_sample_s": slowest[2],
                "shard_draw_s": slowest[0],
                "shard_put_s": slowest[1],
                "transfer_s": max(0.0, (t2 - t1) - slowest[2]),
                "get_s": get_s,
                "copy_s": t3 - t2 - get_s,
                "total_s": t3 - t0,
                "redrawn": float(sum(rep["redrawn"] for rep in replies)),
                "shard_put_faults": float(sum(rep["faults"] for rep in replies)),
            }
        if device is not None and torch.device(device).type != "cpu":
            return batch.to(device)
        return batch

    def _issue(
        self, b: int, length: int, pad: str, deadline: float | None, block: bool, timeout: float | None = None
    ) -> dict | None:
        """Refresh the shards' masses, admit the draw (rate limiter) and send every shard its share.

        Returns the pending draw (calls, refs, shares), or None when ``block`` is False and the rate
        limiter does not admit it now.
        """
        t0 = time.perf_counter()
        self._refresh(stats_timeout(deadline), "sample()")
        if block:
            self._await_sample(deadline, timeout)
        elif not self.rate_limiter.can_sample(self._counts()):
            return None
        stats = self._shards.stats
        live = np.array([st["live"] for st in stats], dtype=np.float64)
        wmass = np.array([st["wmass"] for st in stats], dtype=np.float64)
        mass = wmass if self._prioritized and wmass.sum() > 0 else live
        if mass.sum() <= 0:
            if not block:
                return None
            raise TimeoutError(f"no shard holds a sampleable window (live items per shard: {live.tolist()})")
        share = shares(mass)
        counts = self._rng.multinomial(b, share) if self.num_shards > 1 else np.array([b])
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        allow = self._allowances() if self._limited() else None
        calls = [
            (s, "sample", (k, length, pad, left, None if allow is None else allow[s]))
            for s in range(self.num_shards)
            for k in split_calls(int(counts[s]), self.num_shards)
        ]
        return {
            "key": (b, length, pad),
            "calls": calls,
            "refs": self._shards.submit(calls),
            "share": share,
            "table_size": int(live.sum()),
            "stats_s": time.perf_counter() - t0,
        }

    def _drop(self, pending: dict) -> None:
        """Wait for a prefetched draw that will not be used (so its shards' staging can be reused)."""
        try:
            self._shards.collect(pending["calls"], pending["refs"], "a dropped prefetch", None)
        except (ShardError, TimeoutError) as exc:
            logger.debug("dropped prefetch: %s", exc)

    # -- priorities
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the windows named by ``keys`` (routed by the shard in each key).

        Same parameters, return value and errors as `replay.store.ReplayStore.update_priorities`;
        also `ShardError` when a shard's actor died.
        """
        self._check_owner("update_priorities")
        k = np.asarray(keys.detach().cpu().numpy() if isinstance(keys, torch.Tensor) else keys).reshape(-1)
        if k.size and k.dtype.kind not in "iu":
            raise TypeError(f"keys must be integers (batch.keys), got {k.dtype}")
        k = k.astype(np.int64)
        p = check_priorities(priorities, k.size)
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
        self._check_owner("checkpoint")
        root = Path(path).absolute()
        root.mkdir(parents=True, exist_ok=True)
        with self._lock:
            folder = manifests.new_folder(root)
            all_shards = range(self.num_shards)
            if self._pending is not None:
                self._drop(self._pending)
                self._pending = None
            dirs = [str(folder / manifests.shard_dir(s)) for s in all_shards]
            try:
                self._shards.call([(s, "pause", (self.timeout,)) for s in all_shards], "checkpoint() (pause)")
                done = self._shards.call([(s, "checkpoint", (dirs[s],)) for s in all_shards], "checkpoint()")
                self._refresh(what="checkpoint()")
                inserts, samples, deletes = self._counts()
                manifest = {
                    "num_shards": self.num_shards,
                    "shards": [manifests.shard_dir(s) for s in all_shards],
                    "shard_checkpoints": [os.path.relpath(d, folder) for d in done],
                    "spec": self.spec.to_config(),
                    "capacity_steps": self.capacity_steps,
                    "selector": self.selector.to_config(),
                    "rate_limiter": self.rate_limiter.to_config(),
                    "max_times_sampled": self.max_times_sampled,
                    "chunk_steps": self.chunk_steps,
                    "timeout": self.timeout,
                    "tier": self.tier,
                    "seed": self.seed,
                    "counters": {"inserts": inserts, "samples": samples, "deletes": deletes},
                    "rng": self._rng.bit_generator.state,
                }
            finally:
                for a in self._shards.actors:
                    a.resume.remote()
            manifests.publish(root, folder, manifest)
            self._shards.folders = dict(enumerate(dirs))
        return str(folder)

    @classmethod
    def restore(
        cls, path: str | os.PathLike[str], memory: MemoryManager | None = None, **changes: Any
    ) -> RayReplayStore:
        """A new Ray-backed store (new shard actors) from the latest checkpoint under ``path``.

        Parameters
        ----------
        path : str or path
            The folder given to `checkpoint`.
        memory : MemoryManager, optional
            For the client's staging buffers.
        **changes
            Keywords to change: ``timeout``, ``seed``, ``staging_slots``, ``tier``, ``max_restarts``,
            ``actor_options``.

        Raises
        ------
        FileNotFoundError
            No manifest under ``path``.
        ValueError
            A manifest of another format or version, or an unknown keyword.
        """
        root = Path(path).absolute()
        args, kwargs, state = manifests.restore_arguments(root, manifests.read_manifest(root), changes)
        return cls(*args, memory=memory, _restore=state, **kwargs)

    # -- lifetime
    def _kill(self) -> None:
        self._shards.kill()
        self._staging.close()
        if self._owns_memory:
            self._memory.close()

    def close(self) -> None:
        """Stop the shard actors (their data is gone: checkpoint first) and free the staging buffers.

        A copy attached by handle only stops writing; idempotent.
        """
        if self._closed:
            return
        self._closed = True
        if self._owner:
            self._pending = None
            mark_closed(self._store_id)  # remote writers that meet the dead actors say "closed", not "died"
            self._kill()

    def __enter__(self) -> RayReplayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

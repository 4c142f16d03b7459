"""ReplayStore: shards + selector + rate limiter + writers, the user's entry point (DESIGN §4).

>>> from graphrl.memory import MemoryManager
>>> from replay import ReplayStore, TrajectorySpec, Prioritized, SampleToInsertRatio
>>> mm = MemoryManager()
>>> spec = TrajectorySpec({"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32")})
>>> store = ReplayStore(spec, capacity_steps=100_000, num_shards=4, selector=Prioritized(0.6),
...                     rate_limiter=SampleToInsertRatio(4.0, min_size=1000, error_buffer=10_000), memory=mm)
>>> handle = store.handle()   # small and picklable: region names, spec, settings; no step data
>>> # in an actor process:  with ReplayStore.attach(handle).writer() as w: w.append(step); w.end_episode()
>>> # in the learner:       batch = store.sample(256, window=64); store.update_priorities(batch.keys, td)

Processes and threads
---------------------
The store's owner (the learner process) creates every region; ``handle()`` names them, and
``ReplayStore.attach(handle)`` in another process (spawn or fork) maps them and can write through
`writer` with no pickling of step data. Only the owner samples, updates priorities and checkpoints
(the selector's state lives there); any number of its threads may call `sample` and
`update_priorities` (they are serialised on the selector, while gathers run outside every lock).
See `replay.storage` for the commit and sampling protocol and why it needs no sleeps.

Keys
----
``batch.keys`` (int64) pack a window's shard (8 bits), the distance from its anchor back to its first
real step (16 bits), the store's incarnation (4 bits) and its anchor position (35 bits: 3.4e10 steps a
shard). `update_priorities` applies a priority only if every step the window touched is still stored;
keys of overwritten windows are ignored, never applied to the new occupant of the slot (a generation
check on absolute positions). A restored store (`restore`, or a Ray shard restarted from its checkpoint)
reuses the positions written after the checkpoint, so it counts its incarnation up by one (mod 16):
keys of the previous incarnation apply only to windows that lie wholly below the restored write
position (data the checkpoint held), keys of older ones never; so keys drawn before a restore never
reach data written after it.

Sampling to a GPU (GEAR's zero-copy collect)
--------------------------------------------
``sample(..., device="cuda")`` draws keys on the CPU as always, then a ``numba.cuda`` kernel
(`replay.cuda`) reads each window's bytes in place from the shard rings, which are page-locked and
mapped into the GPU's address space (UVA), straight into a device-resident batch: no CPU-side gather,
no host staging copy. In detail:

- Rings: the first GPU sample registers every shard's rings with CUDA (`MemoryManager.register`,
  ``cudaHostRegister``; counted against the pinned budget under owner ``replay.uva``); rings already on
  the pinned tier are used as they are. `close` unregisters them before the rings are freed.
- Output: device staging pools, one per batch shape and device (owner ``replay.device_staging``, the
  manager's ``device`` tier), with the host pool's hold/release rule: a slot is handed out again only
  after the batch that holds it is released (`Batch.release`, a ``with`` block, or garbage collection).
  The kernels and the mask run on torch's current stream of the device, so work queued on that stream
  that reads a released batch comes before the next gather into its slot; a consumer on another stream
  must synchronise before releasing.
- Staleness: `sample` waits for the kernels to finish, then checks the generations exactly as the CPU
  path does: windows a writer overwrote during the copy are compacted out and drawn again.
- The batch: fields, ``mask`` and ``weights`` on the device; ``keys``, ``probabilities`` and
  ``lengths`` on the CPU (they go back to the store, as with `Batch.to`).
- Without CUDA, ``device="cuda"`` raises ``ValueError``. Under numba's CUDA simulator
  (``NUMBA_ENABLE_CUDASIM=1`` before numba is imported) it runs this same code with CPU tensors standing
  in for device memory (nothing is page-locked and the output pool is on the host tier); tests compare
  those batches byte for byte with the CPU path's.
- Run on a real GPU: nothing yet (no device machine was lent while this was written). Under the
  simulator: equality with the CPU path (1 and 3 shards, wrapped rings, open episodes, head and tail
  padding, reused slots, uniform and prioritized selectors), the redraw of stale windows, the slot
  hold/release rule and the unregistration on close. ``benchmarks/gpu_check.py`` measures and checks the
  path on a GPU.

References
----------
GEAR (Wang et al., ICML 2023): sharded trajectory tables in shared memory, windows gathered into
pinned batches. DeepMind Reverb: tables (selectors, rate limiters, max_times_sampled), writers,
checkpoints. TorchRL: ``ReplayBuffer`` with ``SliceSampler`` (windows within trajectories).
Schaul et al., "Prioritized Experience Replay", ICLR 2016: importance weights
``(N * P(i)) ** -beta / max_j w_j``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import nullcontext as _nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrl.memory import MemoryManager, Region, RegionHandle
from graphrl.tensors import StagingBuffer, StagingPool
from replay._checks import check_chunk_steps, check_device, check_sample_args, check_store_args
from replay.interface import ReplayStoreBase
from replay.keys import INC_BITS, decode_keys, encode_keys, key_incarnations
from replay.layout import BatchLayout
from replay.rate_limiter import (
    CANCELLED,
    DELETES,
    INSERTS,
    RateLimiter,
    RateLimiterState,
    rate_limiter_from_config,
)
from replay.selectors import EXHAUSTED, LIVE, Selector, SelectorState, check_priorities
from replay.spec import TrajectorySpec
from replay.storage import EXHAUSTED as STEP_EXHAUSTED
from replay.storage import GSEQ, WRITERS, Control, ShardHandle, ShardStorage
from replay.windows import gather_fields, window_bounds, window_mask
from replay.writer import TrajectoryWriter

__all__ = ["Batch", "Episode", "ReplayStore", "StoreHandle", "WindowTable", "decode_keys", "encode_keys"]

logger = logging.getLogger(__name__)

_DEFAULT: Any = object()


@dataclass(frozen=True)
class StoreHandle:
    """What another process needs to attach a store: region names and settings, no step data.

    Picklable (a few hundred bytes); send it to actor processes as an argument or through a queue.
    """

    spec: tuple[tuple[str, tuple[int, ...], str], ...]
    capacity: int
    num_shards: int
    control: RegionHandle
    shards: tuple[ShardHandle, ...]
    rate_limiter: tuple[tuple[str, Any], ...]
    chunk_steps: int
    timeout: float | None

    def spec_object(self) -> TrajectorySpec:
        return TrajectorySpec({n: (shape, dtype) for n, shape, dtype in self.spec})


@dataclass(frozen=True)
class WindowTable:
    """Windows drawn by `ReplayStore.draw_windows` and not gathered: where each one's steps lie in its shard.

    Window b's real steps are the positions ``first[b] .. first[b] + n[b] - 1`` of shard ``shard[b]``,
    in ring slots ``(first[b] + j) % capacity`` (one run of slots, or two when it wraps past the ring's
    end); they go to steps ``dst[b] .. dst[b] + n[b] - 1`` of the window, the rest is padding (zeros in a
    `Batch`, see `replay.windows`).

    Attributes
    ----------
    shard, anchor, first, n, dst : numpy.ndarray, int64 [B]
        The shard, the drawn anchor position, and `replay.windows.window_bounds` of each window.
    probabilities : numpy.ndarray, float64 [B]
        Probability with which each anchor was drawn (as ``Batch.probabilities``).
    table_size : int
        N: drawable items when the windows were drawn (as ``Batch.table_size``).
    capacity : int
        Steps per shard ring.
    """

    shard: np.ndarray
    anchor: np.ndarray
    first: np.ndarray
    n: np.ndarray
    dst: np.ndarray
    probabilities: np.ndarray
    table_size: int
    capacity: int
    incarnation: int = 0

    def __len__(self) -> int:
        return len(self.anchor)

    @property
    def keys(self) -> np.ndarray:
        """int64 [B]: the windows' keys (as ``Batch.keys``, for `ReplayStore.update_priorities`)."""
        return encode_keys(self.shard, self.anchor, self.anchor - self.first, self.incarnation)

    @property
    def slots(self) -> np.ndarray:
        """int64 [B]: the ring slot of each window's first real step."""
        return self.first % self.capacity

    def take(self, rows: np.ndarray) -> WindowTable:
        """The windows ``rows`` (an index or a bool mask over B), in that order."""
        return WindowTable(
            self.shard[rows],
            self.anchor[rows],
            self.first[rows],
            self.n[rows],
            self.dst[rows],
            self.probabilities[rows],
            self.table_size,
            self.capacity,
            self.incarnation,
        )


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


# ------------------------------------------------------------------------------------------ core


class _Core:
    """State shared by a store's owner and its attached copies: spec, shards, control, commits."""

    def __init__(
        self,
        spec: TrajectorySpec,
        capacity: int,
        control: Control,
        shards: list[ShardStorage],
        limiter: RateLimiter,
        memory: MemoryManager,
        owns_memory: bool,
        chunk_steps: int,
        timeout: float | None,
    ) -> None:
        self.spec = spec
        self.capacity = capacity
        self.control = control
        self.shards = shards
        self.limiter = limiter
        self.memory = memory
        self.owns_memory = owns_memory
        self.chunk_steps = chunk_steps
        self.timeout = timeout

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def new_writer_id(self) -> int:
        with self.control.cond:
            self.control.ctl[WRITERS] += 1
            return int(self.control.ctl[WRITERS])

    def commit(
        self,
        buffers: Mapping[str, np.ndarray],
        count: int,
        episode: tuple[int, int] | None,
        end: bool,
        timeout: float | None,
        writer_id: int,
    ) -> tuple[int, int]:
        """Commit ``count`` staged steps (see `replay.storage`); return (shard, record)."""
        ctl = self.control
        if count == 0:
            if episode is None:
                return -1, -1
            shard, record = episode
            with self.shards[shard] as sh:
                sh.commit(buffers, 0, 0, record, end=True)
            with ctl.cond:
                ctl.open[shard] -= 1
                ctl.cond.notify_all()
            return shard, record
        start = time.monotonic()
        with ctl.cond:
            ok = ctl.cond.wait_for(lambda: ctl.closed or self.limiter.can_insert(ctl.counters), timeout)
            if ctl.closed:
                raise ValueError("the replay store was closed; nothing more can be written")
            if not ok:
                raise TimeoutError(
                    f"insert waited {time.monotonic() - start:.3g} s (timeout={timeout}): "
                    f"{self.limiter.explain_insert_block(ctl.counters)}; {count} steps stay staged"
                )
            if episode is None:
                shard = ctl.choose_shard(writer_id)
                if not end:
                    ctl.open[shard] += 1
            else:
                shard = episode[0]
            ctl.assigned[shard] += count
            seq_base = int(ctl.ctl[GSEQ])
            ctl.ctl[GSEQ] += count
        with self.shards[shard] as sh:
            record, overwritten = sh.commit(
                buffers, count, seq_base, None if episode is None else episode[1], end
            )
        with ctl.cond:
            ctl.counters[INSERTS] += count
            ctl.counters[DELETES] += overwritten
            if end and episode is not None:
                ctl.open[shard] -= 1
            ctl.cond.notify_all()
        return shard, record

    def open_episode(self, shard: int) -> None:
        """Count one more episode open on ``shard`` (a writer's continuation record, see the writer)."""
        with self.control.cond:
            self.control.open[shard] += 1

    def live_steps(self) -> int:
        total = 0
        for sh in self.shards:
            with sh:
                total += sh.live_steps()
        return total


# ------------------------------------------------------------------------------------------ batch


def _release_buffer(buffer: StagingBuffer, events: list) -> None:
    for ev in events:
        ev.synchronize()
    if not buffer.released:
        buffer.release()


class Batch(Mapping[str, torch.Tensor]):
    """Windows drawn by `ReplayStore.sample`: a mapping of field name to tensor ``[B, L, *field_shape]``.

    The tensors view a reusable staging buffer (pinned with CUDA; on the device for
    ``sample(device="cuda")``, whose ``keys``, ``probabilities`` and ``lengths`` stay on the CPU and whose
    ``mask`` and ``weights`` are on the device). The buffer returns to its pool on
    `release`, at the end of a ``with`` block, or when the batch is garbage-collected; keep the batch
    alive while you use its tensors (or copy them: `to`, ``tensor.clone()``).

    Attributes
    ----------
    mask : torch.Tensor, bool [B, L]
        True for real steps, False for padding (padded values are zero).
    keys : torch.Tensor, int64 [B]
        Window keys for `ReplayStore.update_priorities`.
    probabilities : torch.Tensor, float64 [B]
        Probability with which each window's anchor was drawn (1.0 for Fifo, Lifo and the heaps).
    weights : torch.Tensor, float32 [B]
        Importance weights ``(N * P) ** -beta`` divided by their batch maximum (1 for uniform draws).
    lengths : torch.Tensor, int64 [B]
        Real steps of each window.
    table_size : int
        N: the number of drawable items when the batch was drawn.
    """

    def __init__(
        self,
        fields: dict[str, torch.Tensor],
        mask: torch.Tensor,
        keys: torch.Tensor,
        probabilities: torch.Tensor,
        weights: torch.Tensor,
        lengths: torch.Tensor,
        table_size: int,
        buffer: StagingBuffer | None = None,
    ) -> None:
        self._fields = fields
        self.mask = mask
        self.keys = keys
        self.probabilities = probabilities
        self.weights = weights
        self.lengths = lengths
        self.table_size = table_size
        self._buffer = buffer
        self._events: list = []
        self._finalizer = weakref.finalize(self, _release_buffer, buffer, self._events) if buffer else None

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    @property
    def batch_size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def window(self) -> int:
        return int(self.mask.shape[1])

    def importance_weights(self, beta: float) -> torch.Tensor:
        """``(N * P) ** -beta`` normalised by the batch maximum: float32 [B] (Schaul et al., 2016)."""
        return _weights(self.probabilities.numpy(), self.table_size, beta)

    def release(self) -> None:
        """Return the staging buffer to its pool (its tensors may then be overwritten); idempotent.

        For a batch made by `to`, release the staging buffer of the batch it was copied from
        (after the copy has completed).
        """
        if self._finalizer is not None:
            self._finalizer()
        source = getattr(self, "_source", None)
        if source is not None:
            source.release()

    @property
    def released(self) -> bool:
        return self._finalizer is not None and not self._finalizer.alive

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def to(self, device: str | torch.device, non_blocking: bool = True) -> Batch:
        """A copy of the fields, mask and weights on ``device`` (asynchronous from pinned memory to a GPU).

        ``keys``, ``probabilities`` and ``lengths`` stay on the CPU (they go back to the store). The
        staging buffer is not released before the copy has completed: releasing waits for it.
        """
        device = torch.device(device)
        moved = {n: t.to(device, non_blocking=non_blocking, copy=True) for n, t in self._fields.items()}
        out = Batch(
            moved,
            self.mask.to(device, non_blocking=non_blocking, copy=True),
            self.keys,
            self.probabilities,
            self.weights.to(device, non_blocking=non_blocking, copy=True),
            self.lengths,
            self.table_size,
        )
        if device.type == "cuda" and non_blocking:
            ev = torch.cuda.Event()
            ev.record()
            self._events.append(ev)
        out._source = self  # the copy keeps the staging slot held until it is released or collected
        return out

    def to_tensordict(self) -> Any:
        """The batch as a ``tensordict.TensorDict`` of batch size [B] (fields, mask, keys, ...), for TorchRL.

        Raises
        ------
        ImportError
            The ``tensordict`` package is not installed (``pip install tensordict``).
        """
        try:
            from tensordict import TensorDict
        except ImportError as exc:
            raise ImportError(
                "Batch.to_tensordict() needs the 'tensordict' package: pip install tensordict"
            ) from exc
        data = dict(self._fields)
        data.update(
            mask=self.mask,
            keys=self.keys,
            probabilities=self.probabilities,
            weights=self.weights,
            lengths=self.lengths,
        )
        return TensorDict(data, batch_size=[self.batch_size])

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}: {tuple(t.shape)} {t.dtype}" for n, t in self._fields.items())
        return f"Batch({shapes}; B={self.batch_size}, L={self.window})"


def _weights(prob: np.ndarray, n: int, beta: float) -> torch.Tensor:
    if not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be finite and >= 0, got {beta}")
    if prob.size == 0:
        return torch.zeros(0, dtype=torch.float32)
    w = (max(n, 1) * prob) ** (-beta)
    return torch.from_numpy((w / w.max()).astype(np.float32))


# ------------------------------------------------------------------------------------------ store


class ReplayStore(ReplayStoreBase):
    """A sharded trajectory replay store in memory-manager regions.

    Parameters
    ----------
    spec : TrajectorySpec or mapping
        The fields of a step (a mapping is passed to `TrajectorySpec`).
    capacity_steps : int
        Steps the store holds in all; each of the ``num_shards`` shards holds
        ``capacity_steps // num_shards`` as a ring (the oldest steps are overwritten).
    num_shards : int
        Shards, 1 <= num_shards <= 256. Episodes go whole to one shard; writers spread over shards.
    selector : Selector
        `replay.selectors.Uniform` (default), ``Prioritized``, ``Fifo``, ``Lifo``, ``MinHeap``, ``MaxHeap``.
    rate_limiter : RateLimiter
        ``MinSize(1)`` by default; ``SampleToInsertRatio`` or ``Queue`` (units: steps).
    memory : MemoryManager, optional
        Where every buffer comes from; default a private manager closed with the store.
    max_times_sampled : int
        Remove an item (window anchor) after this many draws; 0 (default) never.
    seed : int, optional
        Seed of the selector's draws.
    chunk_steps : int, optional
        Rows of a writer's private staging buffers (commit granularity of long episodes); default
        about 16 MiB of steps, at most a shard's capacity.
    tier : str
        Tier of the shard regions: ``"shared"`` (default; needed for `handle` / `attach`), ``"host"``
        or ``"pinned"``.
    timeout : float or None
        Default seconds that `sample` and writer commits wait (rate limiter, staging); None forever.
    staging_slots : int
        Batches that may be held at once per batch shape (`graphrl.tensors.StagingPool` slots).
    backend : str
        ``"local"`` (the only value). For shards as Ray actors make a
        `replay.distributed.RayReplayStore` (same arguments, same `Batch`); ``"ray"`` raises
        ``ValueError`` naming it.

    Raises
    ------
    ValueError
        Bad sizes (capacity below the shard count, more than 256 shards), a rate limiter that could
        never admit a sample at this capacity, a bad tier or other argument (`replay._checks`), or
        ``backend`` other than ``"local"``.
    TypeError
        A spec, selector, rate limiter or memory manager of the wrong type.
    MemoryBudgetError
        The regions do not fit the memory manager's budget.
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
        tier: str = "shared",
        timeout: float | None = 60.0,
        staging_slots: int = 4,
        backend: str = "local",
    ) -> None:
        if backend == "ray":
            raise ValueError(
                "ReplayStore(..., backend='ray') is gone: use replay.distributed.RayReplayStore(...) "
                "(same arguments)"
            )
        if backend != "local":
            raise ValueError(
                f"backend must be 'local' (for Ray: replay.distributed.RayReplayStore), got {backend!r}"
            )
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
        spec, num_shards, capacity = args.spec, args.num_shards, args.shard_capacity
        selector, rate_limiter, chunk = args.selector, args.rate_limiter, args.chunk_steps
        timeout = args.timeout
        max_times_sampled, seed, staging_slots = args.max_times_sampled, args.seed, args.staging_slots
        self._owns_memory = memory is None
        memory = MemoryManager() if memory is None else memory
        fallback = ("host",) if tier == "pinned" else ()
        shards: list[ShardStorage] = []
        control = None
        self._selector_regions: list[Region] = []
        try:
            control = Control.create(memory, int(num_shards), tier, fallback)
            for i in range(int(num_shards)):
                shards.append(ShardStorage.create(memory, i, spec, capacity, tier, fallback))
            self._core = _Core(
                spec, capacity, control, shards, rate_limiter, memory, self._owns_memory, chunk, timeout
            )
            self._selector = SelectorState(
                selector, int(num_shards), capacity, max_times_sampled, seed, alloc=self._alloc
            )
        except BaseException:
            for sh in shards:
                sh.free()
            if control is not None:
                control.free()
            for r in self._selector_regions:
                r.free()
            if self._owns_memory:
                memory.close()
            raise
        self._owner = True
        self._owner_pid = os.getpid()
        self.selector = selector
        self.rate_limiter = rate_limiter
        self.max_times_sampled = int(max_times_sampled)
        self._limiter = RateLimiterState(rate_limiter, control.counters, control.cond)
        self._ingested = np.zeros(int(num_shards), dtype=np.int64)
        self._sel_lock = threading.Lock()
        self._prioritized = bool(selector.prioritized)
        self._rings = [tuple(sh.columns[n].reshape(-1).view(np.uint8) for n in spec) for sh in shards]
        self._row_bytes = np.array([f.row_bytes for f in spec.values()], dtype=np.int64)
        self._slot_views: dict[tuple[int, int], tuple] = {}
        self._pool_lock = threading.Lock()
        self._pools: dict[tuple[int, int, str | None], tuple[StagingPool, BatchLayout]] = {}
        self._staging_slots = int(staging_slots)
        self._uva: list[tuple[Any, ...]] | None = None  # per shard, numba views of its rings (GPU path)
        self._uva_regions: list[Region] = []  # rings registered (page-locked) for the GPU path
        self._incarnation = 0  # counted up by restore (see Keys in the module docstring)
        self._restored_at: np.ndarray | None = None  # per shard, the write position restored (int64)
        self._closed = False

    def _alloc(self, shape: tuple[int, ...], dtype: Any, name: str) -> np.ndarray:
        region = self._core.memory.allocate(shape, dtype, "host", owner="replay.selector")
        self._selector_regions.append(region)
        arr = region.numpy()
        arr[...] = 0
        return arr

    # -- properties
    @property
    def spec(self) -> TrajectorySpec:
        return self._core.spec

    @property
    def num_shards(self) -> int:
        return self._core.num_shards

    @property
    def shard_capacity(self) -> int:
        """Steps per shard ring."""
        return self._core.capacity

    @property
    def capacity_steps(self) -> int:
        return self._core.capacity * self._core.num_shards

    @property
    def memory(self) -> MemoryManager:
        return self._core.memory

    def __len__(self) -> int:
        """Live steps stored, over all shards (at most ``capacity_steps``)."""
        self._check_open()
        return self._core.live_steps()

    def counters(self) -> dict[str, int]:
        """Rate-limiter counters: ``inserts``, ``samples`` (steps) and ``deletes`` (items)."""
        return self._limiter.state()

    def selector_mass(self) -> tuple[int, float]:
        """``(live items, priority mass)`` of the selector after ingesting every pending commit.

        The mass is the sum of the live items' priorities raised to alpha for `Prioritized`, the live
        count otherwise. Taken under the selector lock and each shard's lock in turn.

        Raises
        ------
        ValueError
            A closed store, or one attached by handle.
        """
        self._check_owner("selector_mass")
        with self._sel_lock:
            for s, sh in enumerate(self._core.shards):
                with sh:
                    self._ingest(s)
            live = self._selector.live_count()
            mass = float(self._selector.mass().sum()) if self._prioritized else float(live)
        return live, mass

    def stats(self) -> dict[str, Any]:
        """A snapshot: ``steps`` (live steps), ``live`` and ``priority_mass`` (`selector_mass`), the
        rate-limiter counters ``inserts``, ``samples``, ``deletes``, and ``incarnation`` (see Keys)."""
        live, mass = self.selector_mass()
        return {
            "steps": len(self),
            "live": live,
            "priority_mass": mass,
            **self.counters(),
            "incarnation": self._incarnation,
        }

    def __repr__(self) -> str:
        role = "owner" if self._owner else "attached"
        return (
            f"ReplayStore({role}, shards={self.num_shards}, shard_capacity={self.shard_capacity}, "
            f"fields={list(self.spec)})"
        )

    # -- processes
    def handle(self) -> StoreHandle:
        """The picklable handle `attach` takes in another process (region names and settings only).

        Raises
        ------
        ValueError
            The store's regions are not on the shared tier.
        """
        self._check_open()
        try:
            shards = tuple(sh.handle() for sh in self._core.shards)
            control = self._core.control.region.handle()
        except ValueError as exc:
            raise ValueError(
                f"handle() needs a store on the shared tier (ReplayStore(..., tier='shared')): {exc}"
            ) from exc
        spec = tuple((n, f.shape, f.dtype.name) for n, f in self.spec.items())
        return StoreHandle(
            spec,
            self._core.capacity,
            self.num_shards,
            control,
            shards,
            tuple(self.rate_limiter.to_config().items()),
            self._core.chunk_steps,
            self._core.timeout,
        )

    @classmethod
    def attach(cls, handle: StoreHandle, memory: MemoryManager | None = None) -> ReplayStore:
        """Map a store made by another process; the result can write (`writer`) and count (``len``).

        Parameters
        ----------
        handle : StoreHandle
            From the owner's `handle`.
        memory : MemoryManager, optional
            For the writers' staging buffers and the mappings; default a private one.

        Raises
        ------
        FileNotFoundError
            The owner has closed the store (its regions are gone).
        """
        owns = memory is None
        memory = MemoryManager() if memory is None else memory
        try:
            spec = handle.spec_object()
            control = Control(memory.attach(handle.control), handle.num_shards, create=False)
            shards = [
                ShardStorage.attach(memory, i, spec, handle.capacity, h) for i, h in enumerate(handle.shards)
            ]
        except BaseException:
            if owns:
                memory.close()
            raise
        limiter = rate_limiter_from_config(dict(handle.rate_limiter))
        self = cls.__new__(cls)
        self._core = _Core(
            spec, handle.capacity, control, shards, limiter, memory, owns, handle.chunk_steps, handle.timeout
        )
        self._owns_memory = owns
        self._owner = False
        self._owner_pid = None
        self.selector = None
        self.rate_limiter = limiter
        self.max_times_sampled = 0
        self._limiter = RateLimiterState(limiter, control.counters, control.cond)
        self._pools = {}
        self._selector_regions = []
        self._incarnation = 0
        self._restored_at = None
        self._closed = False
        return self

    def writer(self, chunk_steps: int | None = None, timeout: float | None = _DEFAULT) -> TrajectoryWriter:
        """A new `TrajectoryWriter` (use one per thread or process).

        Parameters
        ----------
        chunk_steps : int, optional
            Staging rows (default the store's ``chunk_steps``), capped at the shard capacity.
        timeout : float or None, optional
            Seconds a commit waits for the rate limiter; default the store's ``timeout``.
        """
        self._check_open()
        chunk = (
            self._core.chunk_steps
            if chunk_steps is None
            else check_chunk_steps(self.spec, self._core.capacity, chunk_steps)
        )
        return TrajectoryWriter(self._core, chunk, self._core.timeout if timeout is _DEFAULT else timeout)

    # -- sampling
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this ReplayStore is closed")

    def _check_owner(self, what: str) -> None:
        self._check_open()
        if not self._owner or os.getpid() != self._owner_pid:
            raise ValueError(
                f"{what}() runs in the store's owning process; this store was attached by handle and "
                "can only write (store.writer()) and count (len(store))"
            )

    def _ingest(self, s: int) -> None:
        """Add shard s's newly committed steps to the selector (shard lock held)."""
        sh = self._core.shards[s]
        wp = sh.write_pos
        ing = int(self._ingested[s])
        if wp == ing:
            return
        lo = max(ing, wp - sh.capacity)
        slots = np.arange(lo, wp, dtype=np.int64) % sh.capacity
        valid = sh.steps[slots, 0] >= 0
        self._selector.insert(s, slots, sh.steps[slots, 1], valid)
        self._ingested[s] = wp

    def _pool(
        self, batch: int, window: int, target: torch.device | None = None
    ) -> tuple[StagingPool, BatchLayout]:
        with self._pool_lock:
            return self._pool_locked(batch, window, target)

    def _pool_locked(
        self, batch: int, window: int, target: torch.device | None
    ) -> tuple[StagingPool, BatchLayout]:
        key = (batch, window, None if target is None else str(target))
        entry = self._pools.get(key)
        if entry is None:
            layout = BatchLayout(self.spec, batch, window)
            if target is None:  # host staging: pinned with CUDA, else host
                tier, fallback, owner = "pinned", ("host",), "replay.staging"
            elif target.type == "cuda":  # the GPU gather's output batches
                tier, fallback, owner = "device", (), "replay.device_staging"
            else:  # the simulator: CPU tensors stand in for device memory
                tier, fallback, owner = "host", (), "replay.device_staging"
            with (
                torch.cuda.device(target) if target is not None and target.type == "cuda" else _nullcontext()
            ):
                pool = StagingPool(
                    self._core.memory,
                    (layout.nbytes,),
                    torch.uint8,
                    slots=self._staging_slots,
                    tier=tier,
                    fallback=fallback,
                    owner=owner,
                    timeout=self._core.timeout,
                )
            placed = pool.region.tensor().device
            if target is not None and placed != target:
                pool.close()
                raise ValueError(
                    f"device={str(target)!r}: the memory manager's device tier places memory on {placed}; "
                    f"sample to {placed} or give the MemoryManager device={str(target)!r}"
                )
            pool.region.tensor().zero_()  # touch every page now, not inside the first gathers
            if len(self._pools) >= 4:  # keep a few shapes; older pools close (held buffers stay valid)
                old_pool = self._pools.pop(next(iter(self._pools)))[0]
                self._slot_views = {k: v for k, v in self._slot_views.items() if k[0] != id(old_pool)}
                old_pool.close()
            entry = self._pools[key] = (pool, layout)
        return entry

    def sample(
        self,
        batch_size: int,
        window: int = 1,
        pad: str = "tail",
        timeout: float | None = _DEFAULT,
        beta: float = 1.0,
        device: str | torch.device | None = None,
    ) -> Batch:
        """Draw ``batch_size`` windows of ``window`` steps, as from one table over all shards.

        Parameters
        ----------
        batch_size : int
            B >= 1.
        window : int
            L, 1 <= L <= 65536. Windows anchor at the drawn step (see `replay.windows`); they never
            cross an episode boundary, and shorter ones are padded (zeros) and masked.
        pad : "tail" or "head"
            Tail: the window starts at the anchor. Head: it ends at the anchor.
        timeout : float or None, optional
            Seconds to wait for the rate limiter and a staging buffer; default the store's ``timeout``.
        beta : float
            Importance-weight exponent (PER's beta, >= 0).
        device : str or torch.device, optional
            None or ``"cpu"``: the batch views a host staging slot (pinned with CUDA). A CUDA device
            (``"cuda"``, ``"cuda:1"``): the windows are gathered on that GPU in place from the rings
            into a device staging slot (see "Sampling to a GPU" in the module docstring); the fields,
            ``mask`` and ``weights`` are on the device, ``keys``, ``probabilities`` and ``lengths`` on
            the CPU. Another device type: the host batch is copied there (`Batch.to`), its staging slot
            held until the copy is released or collected.

        Returns
        -------
        Batch
            ``batch[field]``: ``[B, L, *field_shape]``; ``mask`` bool [B, L]; ``keys`` int64 [B];
            ``probabilities`` float64 [B]; ``weights`` float32 [B].

        Raises
        ------
        TimeoutError
            The store held fewer than ``min_size`` steps, or sampling was ahead of inserting, for
            ``timeout`` seconds (the message says which); or every staging slot stayed held.
        ValueError
            Bad arguments; a closed store; a store attached by handle (only the owner samples);
            ``device`` a CUDA device while CUDA is not available (``torch.cuda.is_available()`` is
            False, and numba's simulator is not chosen), or one the memory manager's device tier does
            not place memory on.
        MemoryBudgetError
            The first GPU sample could not register the rings within the pinned budget, or a new
            staging pool does not fit its tier.
        """
        self._check_owner("sample")
        check_sample_args(batch_size, window, pad, beta)
        timeout = self._core.timeout if timeout is _DEFAULT else timeout
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        b, length = int(batch_size), int(window)
        target = check_device(device)
        pool, layout = self._pool(b, length, target)
        buf = pool.acquire(timeout=left())
        try:
            if target is None:
                fields, mask, outs, flat = self._views(pool, layout, buf)

                def gather(rows: np.ndarray, meta: dict[str, np.ndarray]) -> np.ndarray:
                    return self._gather(rows, meta, flat, length)

                def compact(dst: slice, good: np.ndarray) -> None:
                    for arr in outs.values():
                        arr[dst] = arr[good]

            else:
                fields, mask, flat = self._device_views(pool, layout, buf)

                def gather(rows: np.ndarray, meta: dict[str, np.ndarray]) -> np.ndarray:
                    return self._gather_cuda(rows, meta, flat, length, target)

                def compact(dst: slice, good: np.ndarray) -> None:
                    idx = torch.from_numpy(good).to(target)
                    for t in fields.values():
                        t[dst] = t.index_select(0, idx)

            meta = {k: np.zeros(b, dtype=np.int64) for k in ("shard", "anchor", "first", "n", "dst")}
            prob = np.zeros(b)
            done = 0
            table_size = 0
            while done < b:
                self._limiter.await_sample(left())
                got, table_size = self._draw(b - done, length, pad, done, meta, prob)
                if got == 0:
                    continue
                rows = np.arange(done, done + got)
                stale = gather(rows, meta)
                kept = got - int(stale.sum())
                if kept < got:  # windows overwritten during the copy: compact the good rows, redraw the rest
                    good = rows[~stale]
                    compact(slice(done, done + kept), good)
                    for v in meta.values():
                        v[done : done + kept] = v[good]
                    prob[done : done + kept] = prob[good]
                done += kept
            if target is None:
                window_mask(meta["n"], meta["dst"], length, out=mask.numpy())
            else:  # on the device, from the (small) window table
                n_t, dst_t = (torch.from_numpy(meta[k]).to(target) for k in ("n", "dst"))
                j = torch.arange(length, device=target)
                torch.logical_and(j >= dst_t[:, None], j < (dst_t + n_t)[:, None], out=mask)
            back = meta["anchor"] - meta["first"]
            keys = encode_keys(meta["shard"], meta["anchor"], back, self._incarnation)
            self._limiter.sample(int(meta["n"].sum()))
            weights = (
                _weights(prob, table_size, beta) if self._prioritized else torch.ones(b, dtype=torch.float32)
            )
            batch = Batch(
                fields,
                mask,
                torch.from_numpy(keys),
                torch.from_numpy(prob),
                weights if target is None else weights.to(target),
                torch.from_numpy(meta["n"].copy()),
                table_size,
                buf,
            )
        except BaseException:
            buf.release()
            raise
        if target is None and device is not None and torch.device(device).type != "cpu":
            return batch.to(device)
        return batch

    # -- the GPU gather (GEAR's zero-copy collect)
    def _uva_rings(self) -> list[tuple[Any, ...]]:
        """Numba views of every shard's rings for GPU kernels, made (and page-locked) once, lazily.

        Rings already page-locked (the pinned tier) are viewed as they are; others (shared or host
        memory) are registered in place with `MemoryManager.register` (``cudaHostRegister``, mapped:
        UVA), counted against the pinned budget under owner ``replay.uva``, and unregistered by `close`.
        Under the simulator the registration is made the same way (and pins nothing: no CUDA).
        """
        if self._uva is not None:
            return self._uva
        from replay import cuda as rc

        with self._pool_lock:
            if self._uva is None:
                views: list[tuple[Any, ...]] = []
                try:
                    for sh in self._core.shards:
                        per_field = []
                        for name in self.spec:
                            region = sh.column_regions[name]
                            tensor = region.tensor()
                            if not region.is_pinned:
                                reg = self._core.memory.register(tensor, "pinned", owner="replay.uva")
                                self._uva_regions.append(reg)
                                tensor = reg.tensor()
                            per_field.append(rc.device_bytes(tensor))
                        views.append(tuple(per_field))
                except BaseException:
                    self._unregister_rings()
                    raise
                self._uva = views
        return self._uva

    def _unregister_rings(self) -> None:
        self._uva = None
        for r in self._uva_regions:
            if not r.freed:
                r.free()  # cudaHostUnregister, after synchronising the GPUs
        self._uva_regions.clear()

    def _device_views(self, pool: StagingPool, layout: BatchLayout, buf: StagingBuffer) -> tuple:
        """Tensor views and flat numba views (per field) of a device staging slot (made once per slot)."""
        from replay import cuda as rc

        key = (id(pool), buf.slot)
        views = self._slot_views.get(key)
        if views is None:
            fields, mask = layout.views(self.spec, buf.tensor)
            flat = tuple(
                rc.device_bytes(buf.tensor[off : off + nbytes]) for off, nbytes in layout.offsets.values()
            )
            views = self._slot_views[key] = (fields, mask, flat)
        return views

    def _gather_cuda(
        self, rows: np.ndarray, meta: dict[str, np.ndarray], flat: tuple, length: int, target: torch.device
    ) -> np.ndarray:
        """`_gather` on the GPU: launch the kernels, wait for them, then check staleness as `_gather` does."""
        from replay import cuda as rc

        rings = self._uva_rings()
        groups = self._groups(rows, meta)
        cap = self._core.capacity
        with rc.device_context(target):
            stream = rc.launch_stream(target)
            for s, sel in groups:
                rc.gather_fields_cuda(
                    rings[s],
                    flat,
                    self._row_bytes,
                    meta["first"][sel] % cap,
                    meta["n"][sel],
                    meta["dst"][sel],
                    sel,
                    length,
                    stream=stream,
                )
            rc.synchronize(stream)  # the copies must be over before the staleness check
        return self._stale(rows, meta, groups)

    # -- drawing without gathering (replay.distributed's shards copy the ring views themselves)
    def draw_windows(
        self, batch_size: int, window: int = 1, pad: str = "tail", timeout: float | None = _DEFAULT
    ) -> WindowTable:
        """Draw windows as `sample` does (same selector, probabilities and keys) without copying any step.

        The caller reads the windows' steps from `rings` (no lock held), then calls `stale` and drops
        (or draws again) the windows it reports: their bytes may be torn. This is `sample`'s own loop
        with the copy left to the caller; `replay.distributed`'s shard actors use it to put the ring
        bytes straight into Ray's object store. No samples are counted in the rate limiter (it waits,
        as `sample` does, until the limiter admits a sample); ``max_times_sampled`` counts every draw.

        Parameters
        ----------
        batch_size, window, pad, timeout
            As `sample`.

        Returns
        -------
        WindowTable
            ``batch_size`` windows, in the order they were drawn.

        Raises
        ------
        TimeoutError, ValueError
            As `sample`.
        """
        self._check_owner("draw_windows")
        check_sample_args(batch_size, window, pad)
        timeout = self._core.timeout if timeout is _DEFAULT else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        b, length = int(batch_size), int(window)
        meta = {k: np.zeros(b, dtype=np.int64) for k in ("shard", "anchor", "first", "n", "dst")}
        prob = np.zeros(b)
        done = table_size = 0
        while done < b:
            self._limiter.await_sample(None if deadline is None else max(0.0, deadline - time.monotonic()))
            got, table_size = self._draw(b - done, length, pad, done, meta, prob)
            done += got
        return WindowTable(
            meta["shard"],
            meta["anchor"],
            meta["first"],
            meta["n"],
            meta["dst"],
            prob,
            table_size,
            self._core.capacity,
            self._incarnation,
        )

    def stale(self, table: WindowTable) -> np.ndarray:
        """Which windows of ``table`` lost a step to the writers since they were drawn: bool [B].

        Call it *after* copying the windows' steps: a window reported False was intact during the whole
        copy (the writers publish a ring overwrite under the shard lock this reads under, see
        `replay.storage`); one reported True may hold torn bytes and must be dropped.
        """
        self._check_owner("stale")
        stale = np.zeros(len(table), dtype=bool)
        for s in np.unique(table.shard):
            sh = self._core.shards[int(s)]
            with sh:
                floor = sh.floor
            sel = table.shard == s
            stale[sel] = table.first[sel] < floor
        return stale

    def rings(self, shard: int = 0) -> dict[str, np.ndarray]:
        """Read-only views of one shard's rings, ``{field: [shard_capacity, *field_shape]}``.

        Position p of the shard lives in slot ``p % shard_capacity``; writers overwrite slots while you
        read, so check what you copied with `stale`.
        """
        self._check_open()
        out = {}
        for name, ring in self._core.shards[shard].columns.items():
            view = ring.view()
            view.flags.writeable = False
            out[name] = view
        return out

    def _draw(
        self, k: int, length: int, pad: str, row0: int, meta: dict[str, np.ndarray], prob: np.ndarray
    ) -> tuple[int, int]:
        """Draw up to k anchors under every shard lock and compute their windows into rows row0..."""
        shards = self._core.shards
        with self._sel_lock:
            for s, sh in enumerate(shards):  # most of the new steps, one shard locked at a time
                with sh:
                    self._ingest(s)
            for sh in shards:
                sh.acquire()
            try:
                for s in range(len(shards)):
                    self._ingest(s)
                sh_idx, slots, p, removed = self._selector.sample(k)
                if removed:  # tell writers (under the shard locks) which items already left the table
                    gone = self._selector.state[sh_idx, slots] == EXHAUSTED
                    for s, c in zip(sh_idx[gone].tolist(), slots[gone].tolist(), strict=True):
                        shards[s].steps[c, 2] |= STEP_EXHAUSTED
                got = len(sh_idx)
                table_size = self._selector.live_count() + removed
                rows = slice(row0, row0 + got)
                meta["shard"][rows] = sh_idx
                prob[rows] = p
                for s in np.unique(sh_idx):
                    sel = np.flatnonzero(sh_idx == s) + row0
                    sh = shards[int(s)]
                    anchors = sh.position_of(slots[sel - row0])
                    ep_start, ep_end = sh.episode_bounds(anchors)
                    first, n, dst = window_bounds(anchors, ep_start, ep_end, sh.floor, length, pad)
                    meta["anchor"][sel], meta["first"][sel], meta["n"][sel], meta["dst"][sel] = (
                        anchors,
                        first,
                        n,
                        dst,
                    )
            finally:
                for sh in reversed(shards):
                    sh.release()
        if removed:
            self._limiter.delete(removed)
        return got, table_size

    def _views(self, pool: StagingPool, layout: BatchLayout, buf: StagingBuffer) -> tuple:
        """Tensor, numpy and flat-byte views of a staging slot (made once per slot, then reused)."""
        key = (id(pool), buf.slot)
        views = self._slot_views.get(key)
        if views is None:
            fields, mask = layout.views(self.spec, buf.tensor)
            outs = {n: t.numpy() for n, t in fields.items()}
            flat = tuple(outs[n].reshape(-1).view(np.uint8) for n in self.spec)
            views = self._slot_views[key] = (fields, mask, outs, flat)
        return views

    def _groups(self, rows: np.ndarray, meta: dict[str, np.ndarray]) -> list[tuple[int, np.ndarray]]:
        """``rows`` grouped by shard: [(shard, rows of that shard)]."""
        shard = meta["shard"][rows]
        return [(0, rows)] if self.num_shards == 1 else [(int(s), rows[shard == s]) for s in np.unique(shard)]

    def _stale(self, rows: np.ndarray, meta: dict[str, np.ndarray], groups: list) -> np.ndarray:
        """Which windows of ``rows`` lost a step to the writers (below the floor) since they were drawn."""
        stale = np.zeros(len(rows), dtype=bool)
        for s, sel in groups:
            sh = self._core.shards[s]
            with sh:
                floor = sh.floor
            stale[sel - rows[0]] = meta["first"][sel] < floor
        return stale

    def _gather(self, rows: np.ndarray, meta: dict[str, np.ndarray], flat: tuple, length: int) -> np.ndarray:
        """Copy the windows of ``rows`` (no lock held); return which were overwritten meanwhile (bool)."""
        cap = self._core.capacity
        groups = self._groups(rows, meta)
        for s, sel in groups:
            gather_fields(
                self._rings[s],
                flat,
                self._row_bytes,
                cap,
                meta["first"][sel] % cap,
                meta["n"][sel],
                meta["dst"][sel],
                sel,
                length,
            )
        return self._stale(rows, meta, groups)

    # -- priorities
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the windows' anchors named by ``keys``; stale keys are ignored.

        Parameters
        ----------
        keys : torch.Tensor or array, int64 [K]
            From ``batch.keys``.
        priorities : torch.Tensor or array, float [K]
            Finite and >= 0. For repeated keys the last value wins.

        Returns
        -------
        int
            How many updates were applied (the others named windows overwritten, or items removed by
            ``max_times_sampled``, since they were sampled).

        Raises
        ------
        ValueError
            NaN, infinite or negative priorities, a length mismatch, or a key naming a shard the
            store does not have ("shard 7"); nothing is changed. Also a store attached by handle.
        """
        self._check_owner("update_priorities")
        k = np.asarray(keys.detach().cpu().numpy() if isinstance(keys, torch.Tensor) else keys).reshape(-1)
        if k.size and k.dtype.kind not in "iu":
            raise TypeError(f"keys must be integers (batch.keys), got {k.dtype}")
        k = k.astype(np.int64)
        p = check_priorities(priorities, k.size)
        shard, anchor, back = decode_keys(k)
        incarnation = key_incarnations(k)
        bad = (shard >= self.num_shards) | (k < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"key {int(k[i])} names shard {int(shard[i])}, but the store has shards "
                f"0..{self.num_shards - 1}; nothing was changed"
            )
        applied = 0
        cap = self._core.capacity
        with self._sel_lock:
            for s in np.unique(shard):
                s = int(s)
                sel = np.flatnonzero(shard == s)
                sh = self._core.shards[s]
                with sh:
                    self._ingest(s)
                    floor = sh.floor
                slots = anchor[sel] % cap
                ok = (anchor[sel] - back[sel] >= floor) & (anchor[sel] < self._ingested[s])
                inc = incarnation[sel]
                current = inc == self._incarnation
                if self._restored_at is not None:  # the previous incarnation's keys below the restore point
                    prev = (self._incarnation - 1) % (1 << INC_BITS)
                    current |= (inc == prev) & (anchor[sel] < self._restored_at[s])
                ok &= current
                ok &= self._selector.state[s, slots] == LIVE
                self._selector.update(s, slots[ok], p[sel][ok])
                applied += int(ok.sum())
        return applied

    # -- inspection
    def episodes(self, shard: int | None = None) -> list[Episode]:
        """Copies of the live episodes (segments) of one shard or all, oldest first per shard.

        For inspection and tests (it copies every live step). Raises ``ValueError`` on a closed store.
        """
        self._check_open()
        out = []
        shards = range(self.num_shards) if shard is None else [shard]
        for s in shards:
            sh = self._core.shards[s]
            with sh:
                for rec in sh.live_records():
                    start, n, flags = int(rec[1]), int(rec[2]), int(rec[3])
                    slots = np.arange(start, start + n) % sh.capacity
                    data = {name: ring[slots].copy() for name, ring in sh.columns.items()}
                    out.append(Episode(s, start, n, bool(flags & 1), bool(flags & 2), data))
        return out

    # -- checkpoints
    def checkpoint(self, path: str | os.PathLike[str]) -> str:
        """Write a checkpoint under ``path`` atomically (see `replay.checkpoint`); return its folder.

        Data, episode index, selector state (priorities, use counts, RNG), rate-limiter counters and
        generations are saved; steps still staged in writers are not. Writers and samplers wait while
        it is written.

        Raises
        ------
        ValueError
            A closed store, or one attached by handle (only the owner checkpoints).
        OSError
            The files could not be written (the previous checkpoint stays the latest).
        """
        from replay.checkpoint import save

        self._check_owner("checkpoint")
        return save(self, path)

    @classmethod
    def restore(
        cls, path: str | os.PathLike[str], memory: MemoryManager | None = None, **kwargs: Any
    ) -> ReplayStore:
        """A new store holding the latest complete checkpoint under ``path`` (see `replay.checkpoint`).

        Parameters
        ----------
        path : str or path
            The folder given to `checkpoint`.
        memory : MemoryManager, optional
            For the new store's regions (default a private manager).
        **kwargs
            ``ReplayStore`` keywords to change: ``tier``, ``timeout``, ``seed``, ``staging_slots``.

        Raises
        ------
        FileNotFoundError
            No complete checkpoint under ``path``.
        ValueError
            A checkpoint of another format version.
        """
        from replay.checkpoint import load

        return load(path, memory=memory, **kwargs)

    # -- lifetime
    def close(self) -> None:
        """Wake every waiter (they raise ``ValueError``); free (owner) or unmap (attached) the regions.

        Rings registered for the GPU path are unregistered first (after synchronising the GPUs).
        """
        if self._closed:
            return
        self._closed = True
        core = self._core
        if self._owner:
            with core.control.cond:
                core.control.counters[CANCELLED] = 1
                core.control.cond.notify_all()
            for pool, _ in self._pools.values():
                pool.close()
            self._pools.clear()
            self._unregister_rings()  # before the rings themselves go
            for r in self._selector_regions:
                if not r.freed:
                    r.free()
        if core.owns_memory:
            core.memory.close()
        else:
            for sh in core.shards:
                sh.free()
            core.control.free()

    def __enter__(self) -> ReplayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

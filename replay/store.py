"""ReplayStore: the user's entry point, composing storage, table, rate limiter, gather and staging.

>>> from graphrl.memory import MemoryManager
>>> from replay import ReplayStore, TrajectorySpec, Prioritized, SampleToInsertRatio
>>> mm = MemoryManager()
>>> spec = TrajectorySpec({"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32")})
>>> store = ReplayStore(spec, capacity_steps=100_000, num_shards=4, selector=Prioritized(0.6),
...                     rate_limiter=SampleToInsertRatio(4.0, min_size=1000, error_buffer=10_000), memory=mm)
>>> handle = store.handle()   # small and picklable: region names, spec, settings; no step data
>>> # in an actor process:  with ReplayStore.attach(handle).writer() as w: w.append(step); w.end_episode()
>>> # in the learner:       batch = store.sample(256, window=64); store.update_priorities(batch.keys, td)

The parts (docs/architecture.md#replay-composition), as TorchRL composes Storage / Sampler / Writer
and Reverb Table / Selector / RateLimiter:

- `replay.storage.TrajectoryStorage`: the shards (`replay.shard`) and control block in shared
  memory, and the commit protocol `replay.writer.TrajectoryWriter` follows (from any process);
- `replay.table.Table`: the selector's state (`replay.selector_state`) over the shards, the draw of
  windows (`replay.windows`) and the priority updates with their generation checks (`replay.keys`);
- `replay.rate_limiter.RateLimiterState`: inserts and samples balanced through the control block;
- `replay.gather.WindowGather`: the lock-free copy of windows into a staging slot, on the CPU or on a
  GPU in place through UVA (`replay.cuda`); `replay.batch_staging.BatchStaging`: the slots a `Batch` views;
- `replay.attach.AttachedStore`: what `attach` gives actor processes (write-only);
- `replay.checkpoint`: the files of `checkpoint` / `restore`, from each part's ``state_dict()``.

Only the owner (the process that made the store) samples, updates priorities and checkpoints; any
number of its threads may call `sample` and `update_priorities` (serialised on the table, while the
gathers run outside every lock). Other processes sample through ``store.learner()`` (`replay.learner`:
the owner's table serves their draws, they gather themselves).
``sample(..., device="cuda")`` gathers on the GPU straight from the
rings (GEAR's zero-copy collect); under numba's CUDA simulator it runs the same code on CPU tensors.

References
----------
GEAR (Wang et al., ICML 2023): sharded trajectory tables in shared memory, windows gathered into
pinned batches. DeepMind Reverb: tables (selectors, rate limiters, max_times_sampled), writers,
checkpoints. TorchRL: ``ReplayBuffer`` with ``SliceSampler`` (windows within trajectories).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from graphrl.memory import MemoryManager
from graphrl.process_origin import ProcessOrigin, check_made_here
from replay import checkpoint as ckpt
from replay._checks import (
    check_beta,
    check_chunk_steps,
    check_device,
    check_gather_min_bytes,
    check_restore_kwargs,
    check_sample_args,
    check_store_args,
    check_timeout,
)
from replay.attach import AttachedStore
from replay.interface import DEFAULT, ReplayStoreBase
from replay.learner import StoreLearner
from replay.rate_limiter import RateLimiter, RateLimiterState
from replay.sampler import Deadline, WindowSampler
from replay.selectors import Selector
from replay.spec import TrajectorySpec
from replay.storage import StorageViews, StoreHandle, TrajectoryStorage
from replay.store_state import RESTORE_KEYWORDS, load_parts, restore_arguments, snapshot
from replay.table import Table
from replay.table_service import TableService
from replay.writer import TrajectoryWriter

if TYPE_CHECKING:
    from replay.batch import Batch
    from replay.storage import Episode
    from replay.windows import WindowTable

__all__ = ["ReplayStore"]

_PLAIN = (int, float)  # beta types whose checks `sample` remembers per signature

class ReplayStore(StorageViews, ReplayStoreBase):
    """A sharded trajectory replay store in memory-manager regions.

    Parameters
    ----------
    spec : TrajectorySpec or mapping
        The fields of a step (a mapping is passed to `TrajectorySpec`).
    capacity_steps : int
        Steps the store holds in all; each of the ``num_shards`` shards holds
        ``capacity_steps // num_shards`` as a ring (the oldest steps are overwritten). The store holds
        ``num_shards * (capacity_steps // num_shards)`` steps: a remainder is dropped (``capacity_steps=100,
        num_shards=3`` holds 99; ``store.capacity_steps`` says what it holds), so pass a multiple of
        ``num_shards``. With a codec field each shard's share must also be a multiple of the field's
        ``chunk`` and at least two chunks (else ``ValueError``, naming values that work).
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
        Default seconds that `sample` and writer commits wait (rate limiter, staging, a checkpoint holding
        the writers); None forever.
    staging_slots : int
        Batches that may be held at once per batch shape (`graphrl.tensors.StagingPool` slots).
    backend : str
        ``"local"`` (the only value). For shards as Ray actors make a
        `replay.distributed.RayReplayStore` (same arguments, same `Batch`); ``"ray"`` raises
        ``ValueError`` naming it.

    Attributes
    ----------
    storage : replay.storage.TrajectoryStorage
        The shards and the control block (what writers commit to).
    table : replay.table.Table
        The selector's state over the shards (``table.state``: a `replay.selector_state.SelectorState`).
    selector, rate_limiter, max_times_sampled
        The settings, as given.

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
        self.storage = TrajectoryStorage.create(
            args.spec,
            args.shard_capacity,
            args.num_shards,
            args.rate_limiter,
            memory,
            args.chunk_steps,
            args.timeout,
            args.tier,
        )
        try:
            self.table = Table(self.storage, args.selector, args.max_times_sampled, args.seed)
        except BaseException:
            self.storage.close()
            raise
        control = self.storage.control
        self.selector, self.rate_limiter = args.selector, args.rate_limiter
        self.max_times_sampled = args.max_times_sampled
        self._limiter = RateLimiterState(args.rate_limiter, control.counters, control.cond)
        self._sampler = WindowSampler(self.storage, self.table, self._limiter, args.staging_slots)
        self._checkpoint_lock = threading.Lock()  # this store's checkpoint() calls, one at a time
        self._closed = False
        self._origin = ProcessOrigin()  # .copy: a fork of the owner (sample asks it, not os.getpid())
        self._staging_slots, self._service = args.staging_slots, None  # learner()'s TableService
        self._checked: dict[tuple, tuple[int, int]] = {}  # sample signatures already checked
        self._timeout = self.storage.timeout  # the default of `sample`'s (and `_deadline`'s) timeout

    # -- properties: spec, num_shards, shard_capacity, capacity_steps, memory (StorageViews)

    @property
    def store_id(self) -> int:
        """This store's random 64-bit id: its batches' ``keys`` bear it, and `update_priorities` refuses
        keys another store issued (a restored store gets a new id and accepts its checkpoint's keys;
        docs/architecture.md#keys)."""
        return self.table.store_id

    def __len__(self) -> int:
        """Live steps stored, over all shards (at most ``capacity_steps``; dead writers' holes left out)."""
        self._check_open("__len__")
        return self.storage.live_steps()

    def counters(self) -> dict[str, int]:
        """Rate-limiter counters: ``inserts``, ``samples`` (steps) and ``deletes`` (items)."""
        self._check_open("counters")
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
        return self.table.selector_mass()

    def stats(self) -> dict[str, Any]:
        """A snapshot: ``steps`` (live steps), ``live`` and ``priority_mass`` (`selector_mass`), the
        rate-limiter counters ``inserts``, ``samples``, ``deletes``, and ``incarnation`` (see Keys)."""
        live, mass = self.selector_mass()
        return {
            "steps": len(self),
            "live": live,
            "priority_mass": mass,
            **self.counters(),
            "incarnation": self.table.incarnation,
        }

    def __repr__(self) -> str:
        return (
            f"ReplayStore(owner, shards={self.num_shards}, shard_capacity={self.shard_capacity}, "
            f"fields={list(self.spec)})"
        )

    @property
    def closed(self) -> bool:
        """Whether `close` ran (every call but ``close`` then raises ``ValueError``)."""
        return self._closed

    def _check_open(self, call: str) -> None:
        if self._closed:
            what = "len(store)" if call == "__len__" else f"ReplayStore.{call}()"
            raise ValueError(
                f"{what}: this ReplayStore is closed; what it held before close is in the checkpoints "
                "taken before (ReplayStore.restore)"
            )

    def _check_owner(self, what: str) -> None:
        self._check_open(what)
        check_made_here(
            self._origin, f"ReplayStore.{what}()", "ReplayStore",
            f"{what}() runs in the store's owning process; write from here through "
            "ReplayStore.attach(store.handle()) and sample through store.learner()", error=ValueError,
        )

    # -- learners in other processes
    def learner(self) -> StoreLearner:
        """A picklable `replay.learner.StoreLearner` that samples this store from any process of the
        host; the first call starts the `replay.table_service.TableService` (a thread, until `close`).
        Raises ``ValueError`` on a closed or attached store, or regions not on the shared tier."""
        self._check_owner("learner")
        handle = self.storage.handle()
        with self.table.lock:  # concurrent first calls start one service; close takes it under the lock
            self._check_open("learner")
            self._service = service = self._service or TableService(self.table, self._limiter)
        return StoreLearner(service.learner_handle(handle, self._staging_slots))

    # -- processes and writers
    def handle(self) -> StoreHandle:
        """The picklable handle `attach` takes in another process (region names and settings only).

        Raises
        ------
        ValueError
            The store's regions are not on the shared tier.
        """
        self._check_open("handle")
        return self.storage.handle()

    @classmethod
    def attach(cls, handle: StoreHandle, memory: MemoryManager | None = None) -> AttachedStore:
        """Map a store made by another process; the result (a `replay.attach.AttachedStore`) can
        write (`writer`) and count (``len``).

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
        return AttachedStore(handle, memory)

    def writer(self, chunk_steps: int | None = None, timeout: float | None = DEFAULT) -> TrajectoryWriter:
        """A new `TrajectoryWriter` (use one per thread or process).

        Parameters
        ----------
        chunk_steps : int, optional
            Staging rows (default the store's ``chunk_steps``), capped at the shard capacity.
        timeout : float or None, optional
            Seconds a commit waits for the rate limiter and a checkpoint holding the writers, together
            (finite, >= 0; None: forever); default the
            store's ``timeout``.

        Raises
        ------
        TypeError
            ``timeout`` not a number or None (bools included).
        ValueError
            ``timeout`` negative, NaN or infinite; ``chunk_steps`` out of range.
        """
        self._check_open("writer")
        storage = self.storage
        chunk = storage.chunk_steps if chunk_steps is None else check_chunk_steps(
            storage.spec, storage.capacity, chunk_steps
        )
        timeout = storage.timeout if timeout is DEFAULT else check_timeout(timeout)
        return TrajectoryWriter(storage, chunk, timeout)

    # -- sampling
    @property
    def device_gather_min_bytes(self) -> int:
        """Batches for a GPU of at least this many bytes (B * L * bytes of a step) are gathered on the GPU,
        smaller ones on the host and copied up (`replay.sampler.gathers_on_device`); settable (0: always
        on the GPU). Raises ``ValueError`` on a negative or non-integer value."""
        return self._sampler.device_gather_min_bytes

    @device_gather_min_bytes.setter
    def device_gather_min_bytes(self, value: int) -> None:
        self._sampler.device_gather_min_bytes = check_gather_min_bytes(value)

    def sample(
        self,
        batch_size: int,
        window: int = 1,
        pad: str = "tail",
        timeout: float | None = DEFAULT,
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
            into a device staging slot (`replay.gather`); the fields, ``mask`` and ``weights`` are on
            the device, ``keys``, ``probabilities`` and ``lengths`` on the CPU. Another device type:
            the host batch is copied there (`Batch.to`), its staging slot held until the copy is
            released or collected.

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
            ``device`` a CUDA device the memory manager's device tier does not place memory on.
        graphrl.GPUUnavailableError
            ``device`` a CUDA device while CUDA is not available (``torch.cuda.is_available()`` is
            False, and numba's simulator is not chosen); a ``ValueError`` too.
        MemoryBudgetError
            The first GPU sample could not register the rings within the pinned budget, or a new
            staging pool does not fit its tier.
        """
        if self._closed or self._origin.copy:
            self._check_owner("sample")  # raises
        plain = type(batch_size) is int and type(window) is int and type(pad) is str and type(beta) in _PLAIN
        sig = (batch_size, window, pad, type(beta), beta) if plain else None
        checked = self._checked.get(sig) if plain else None
        if checked is None:  # checked once per distinct signature of plain ints, str and float
            checked = (*check_sample_args(batch_size, window, pad), check_beta(beta))
            if plain and len(self._checked) < 64:
                self._checked[sig] = checked
        b, length, beta = checked
        left = self._deadline(timeout)
        if device is None:
            return self._sampler.sample(b, length, pad, beta, None, left)
        target = check_device(device)
        batch = self._sampler.sample(b, length, pad, beta, target, left)
        if target is None and torch.device(device).type != "cpu":
            return batch.to(device)
        return batch

    # -- drawing without gathering (replay.distributed's shards copy the ring views themselves)
    def draw_windows(
        self, batch_size: int, window: int = 1, pad: str = "tail", timeout: float | None = DEFAULT
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
        b, length = check_sample_args(batch_size, window, pad)
        return self._sampler.draw_windows(b, length, pad, self._deadline(timeout))

    def _deadline(self, timeout: float | None) -> Deadline:
        """Seconds left of ``timeout`` (default the store's) from now, as a function (None: forever)."""
        return Deadline(self._timeout if timeout is DEFAULT else check_timeout(timeout))

    def stale(self, table: WindowTable) -> np.ndarray:
        """Which windows of ``table`` lost a step to the writers since they were drawn: bool [B].

        Call it *after* copying the windows' steps: a window reported False was intact during the whole
        copy (the writers publish a ring overwrite under the shard lock this reads under, see
        `replay.storage`); one reported True may hold torn bytes and must be dropped.
        """
        self._check_owner("stale")
        return self.storage.stale(table.shard, table.first)

    def rings(self, shard: int = 0) -> dict[str, np.ndarray]:
        """Read-only views of one shard's rings, ``{field: [shard_capacity, *field_shape]}``.

        Position p of the shard lives in slot ``p % shard_capacity``; writers overwrite slots while you
        read, so check what you copied with `stale`.
        """
        self._check_open("rings")
        if self.spec.codec_fields:
            raise ValueError(
                f"rings(): fields {list(self.spec.codec_fields)} have a codec and no ring (they are stored "
                "as compressed chunks); sample them, or use a spec without codecs"
            )
        out = {}
        for name, ring in self.storage.shards[shard].columns.items():
            view = ring.view()
            view.flags.writeable = False
            out[name] = view
        return out

    # -- priorities and inspection
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the windows' anchors named by ``keys``; stale keys are ignored.

        Parameters
        ----------
        keys : torch.Tensor or array, int64 [K]
            From ``batch.keys``.
        priorities : torch.Tensor or array, float [K]
            Finite and >= 0, of a real dtype (floating, bfloat16 included, or integer). For
            `Prioritized`, ``p ** exponent`` at most the largest float64 / (2 * capacity), so the
            priority mass stays finite. For repeated keys the last value wins.

        Returns
        -------
        int
            How many updates were applied, a key given twice counted twice (the others named windows
            overwritten, or items removed by ``max_times_sampled``, since they were sampled).

        Raises
        ------
        TypeError
            Priorities that are not real numbers (strings, complex, objects); nothing is changed.
        ValueError
            NaN, infinite, negative or too large priorities, a length mismatch, a key naming a
            shard the store does not have ("shard 7"), or keys another store issued ("keys: 8 of 8
            keys were issued by another replay store (store 0x...)"); nothing is changed. Also a
            store attached by handle.
        """
        if self._closed or self._origin.copy:
            self._check_owner("update_priorities")  # raises
        return self.table.update_priorities(keys, priorities)

    def episodes(self, shard: int | None = None) -> list[Episode]:
        """Copies of the live episodes (segments) of one shard or all, oldest first per shard.

        For inspection and tests (it copies every live step). Raises ``ValueError`` on a closed store.
        """
        self._check_open("episodes")
        return self.storage.episodes(shard)

    # -- checkpoints
    def checkpoint(self, path: str | os.PathLike[str]) -> str:
        """Write a checkpoint under ``path`` atomically (see `replay.checkpoint`); return its folder.

        Data, episode index, selector state (priorities, use counts, RNG), rate-limiter counters and
        generations are saved; steps still staged in writers are not. Writers and samplers wait while
        it is written. Concurrent calls (of any threads, and of other stores or processes of this host
        into the same ``path``) run one after the other, each into its own new folder; ``LATEST``
        always names a complete checkpoint (docs/architecture.md#checkpoints). A writer thread of this
        process committing meanwhile slows the checkpoint's file work (each call that releases the GIL
        waits to take it back); writers in other processes, as actors are, do not.

        Raises
        ------
        ValueError
            A closed store, or one attached by handle (only the owner checkpoints).
        OSError
            The files could not be written (the previous checkpoint stays the latest).
        """
        self._check_owner("checkpoint")
        state = snapshot(self.storage, self.table, self.selector, self.rate_limiter, self.max_times_sampled)
        with self._checkpoint_lock:
            return ckpt.save(path, state)  # it takes the root's lock, then the store's (the snapshot)

    @classmethod
    def restore(
        cls, path: str | os.PathLike[str], memory: MemoryManager | None = None,
        rate_limiter: RateLimiter | None = None, **kwargs: Any,
    ) -> ReplayStore:
        """A new store holding the latest complete checkpoint under ``path`` (see `replay.checkpoint`).

        Parameters
        ----------
        path : str or path
            The folder given to `checkpoint`, or one of its ``ckpt-NNNNNN`` folders.
        memory : MemoryManager, optional
            For the new store's regions (default a private manager).
        rate_limiter : RateLimiter, optional
            Needed when the checkpointed store's limiter was a `replay.rate_limiter.RateLimiter`
            subclass (a checkpoint records its settings and class name, not its code): the user's
            limiter, of that class with those settings. A built-in one is rebuilt without it.
        **kwargs
            ``ReplayStore`` keywords to change (`replay.store_state.RESTORE_KEYWORDS`): ``tier``,
            ``timeout``, ``seed``, ``staging_slots``, ``chunk_steps``, ``max_times_sampled``. Without
            ``seed`` the checkpoint's sample stream goes on (the draws it would have made next); with it,
            draws start from it.

        Raises
        ------
        FileNotFoundError
            No complete checkpoint under ``path``.
        ValueError
            A checkpoint of another format version; a keyword the checkpoint fixes (``spec``,
            ``capacity_steps``, ``num_shards``, ``selector``); a subclass's limiter not passed, or
            ``rate_limiter`` not of the checkpoint's class and settings
            (`replay.limiter_record.restored_limiter`).
        replay.CheckpointError
            A damaged checkpoint (a ``ValueError``), found before anything is allocated: the message
            names the checkpoint, the file and the fault, and the older checkpoint that is intact.
        """
        check_restore_kwargs(kwargs, "ReplayStore", RESTORE_KEYWORDS)
        with ckpt.reading(path):  # saves into the root wait: none deletes the folder read (lazily) here
            state = ckpt.load(path)
            args, options = restore_arguments(state, kwargs, rate_limiter)
            store = cls(*args, memory=memory, **options)
            try:
                load_parts(store.storage, store.table, state)
            except BaseException:
                store.close()
                raise
        return store

    # -- lifetime
    def close(self) -> None:
        """Wake every waiter (they raise ``ValueError``); free (owner) or unmap (attached) the regions.

        Rings registered for the GPU path are unregistered first (after synchronising the GPUs).
        """
        if self._closed:
            return
        self._closed = True
        self._limiter.cancel()
        with self.table.lock:
            service, self._service = self._service, None
        if service is not None:  # before the table's regions are freed
            service.stop()
        self._sampler.close()  # the staging pools, and the rings registered for the GPU path
        self.table.close()
        self.storage.close()

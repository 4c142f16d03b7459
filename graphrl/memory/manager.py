"""`MemoryManager`: budgets, places and tracks every large buffer of a process, per tier and per owner.

It composes one `graphrl.memory.resources` resource per tier (the pinned and device ones inside a
`graphrl.memory.pool.PoolResource`) with an `graphrl.memory.accounts.Account` (limit and statistics),
tries fallback tiers in order, finds the tier of a tensor's memory (`MemoryManager.tier_of`), and
frees what is left on ``close``. Its lock is a `graphrl.memory.deferred.DeferringLock`, which also
gives back the regions finalizers freed while it was in the way. See docs/architecture.md#memory-tiers.

References
----------
RMM's memory resources and resource adaptors (limiting, statistics, pool).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing.util
import os
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphrl.memory import cudart, signals
from graphrl.memory.accounts import Account
from graphrl.memory.address_index import AddressIndex
from graphrl.memory.backing import Backing, TensorBacking
from graphrl.memory.deferred import DeferringLock
from graphrl.memory.dtypes import parse_dtype
from graphrl.memory.errors import MemoryBudgetError
from graphrl.memory.owners import reclaim as reclaim_orphans
from graphrl.memory.owners import segment_prefix
from graphrl.memory.pool import POOLED_TIERS, PoolResource, PoolStats
from graphrl.memory.region import Region, RegionHandle
from graphrl.memory.resources import (
    DeviceResource,
    DiskResource,
    HostResource,
    MemoryResource,
    PinnedResource,
    SharedResource,
)
from graphrl.memory.shm import ExitCleanup
from graphrl.memory.sizes import Tier, check_owner, format_size, parse_shape, parse_size, shape_bytes

__all__ = ["MemoryManager", "check_memory"]

logger = logging.getLogger(__name__)


def check_memory(memory: Any) -> MemoryManager | None:
    """A ``memory=`` argument: a `MemoryManager` or None, returned as given (the one check of it).

    Raises
    ------
    TypeError
        Anything else (the message names ``memory`` and the type).
    """
    if memory is not None and not isinstance(memory, MemoryManager):
        raise TypeError(f"memory must be a MemoryManager or None, got {type(memory).__name__}")
    return memory


class MemoryManager:
    """Budgets, places and tracks every large buffer of a process, per tier and per owner.

    Parameters
    ----------
    budgets : mapping of tier (Tier or name) to bytes (int or str such as "8GiB"), optional
        Budget of each tier. A tier left out, or given ``None``, is limited by what the machine has
        (docs/architecture.md#memory-tiers); ``0`` disables a tier.
    spill_dir : str or path, optional
        Folder of the disk tier's zarr arrays (created if missing). Without it the disk tier is
        unavailable.
    device : str or torch.device, optional
        CUDA device of the device tier; default the current CUDA device (host memory without CUDA).
    resources : mapping of tier to MemoryResource, optional
        Replace a tier's allocator (for tests and custom allocators). With ``pool=True`` a pinned or
        device resource given here is wrapped in a `PoolResource` too (one that already is a
        `PoolResource` is used as given).
    pool : bool
        Keep freed pinned and device memory registered for later allocations
        (`graphrl.memory.pool.PoolResource`; counters in ``stats()["pools"]``). Default True; False
        allocates and frees (registers and unregisters) upstream on every call.
    reclaim : bool
        Remove, when created, the shared segments left by graphrl processes that are gone (killed
        with SIGKILL, say), logging each; never those of a live process
        (`graphrl.memory.owners.reclaim`). Default True.

    Raises
    ------
    ValueError
        An unknown tier or an unparsable size in ``budgets``.
    TypeError
        A budget that is neither an int nor a string.

    Examples
    --------
    >>> mm = MemoryManager(budgets={"pinned": "1GiB", "host": "4GiB"})
    >>> with mm.allocate((1024, 128), "float32", "pinned", owner="features", fallback=("host",)) as r:
    ...     r.tensor().zero_().shape
    torch.Size([1024, 128])
    >>> mm.stats()["pinned"]["features"]
    {'bytes': 0, 'peak': 524288, 'regions': 0}
    >>> mm.close()

    References
    ----------
    RMM's memory resources and resource adaptors (limiting, statistics, logging).
    """

    def __init__(
        self,
        budgets: Mapping[Tier | str, int | str | None] | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
        *,
        device: str | torch.device | None = None,
        resources: Mapping[Tier | str, MemoryResource] | None = None,
        reclaim: bool = True,
        pool: bool = True,
    ) -> None:
        self._budgets: dict[Tier, int | None] = {}
        for key, value in (budgets or {}).items():
            tier = Tier.parse(key)
            try:
                self._budgets[tier] = None if value is None else parse_size(value)
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"budgets[{tier.value!r}]: {exc}") from exc
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        if self.spill_dir is not None:
            self.spill_dir.mkdir(parents=True, exist_ok=True)
        if reclaim:
            reclaim_orphans()
        self.shm_prefix = segment_prefix()
        self._prefixes = {os.getpid(): self.shm_prefix}  # a forked child names its segments after itself
        self._cleanup = ExitCleanup()
        signals.track(self._cleanup)
        self._resources: dict[Tier, MemoryResource] = {
            Tier.DEVICE: DeviceResource(device),
            Tier.PINNED: PinnedResource(),
            Tier.SHARED: SharedResource(self._cleanup),
            Tier.HOST: HostResource(),
            Tier.DISK: DiskResource(self.spill_dir, self._cleanup),
        }
        for key, resource in (resources or {}).items():
            self._resources[Tier.parse(key)] = resource
        if pool:
            for tier in POOLED_TIERS:
                if not isinstance(self._resources[tier], PoolResource):
                    self._resources[tier] = PoolResource(self._resources[tier], tier=tier)
        self._pools: dict[Tier, PoolResource] = {
            t: r for t, r in self._resources.items() if isinstance(r, PoolResource) and t in POOLED_TIERS
        }
        # registrations outside a pool: unpooled pinned and device allocations, register()ed buffers
        self._direct: dict[Tier, PoolStats] = {t: PoolStats() for t in POOLED_TIERS}
        self._registered: dict[int, tuple[Tier, int]] = {}  # register()ed regions: tier, bytes
        self._registered_bytes: dict[Tier, int] = {t: 0 for t in Tier}
        self._addresses = AddressIndex()  # live regions' address ranges, for tier_of
        self._accounts: dict[Tier, Account] = {}
        self._live: dict[int, Region] = {}
        self._attached: dict[int, Region] = {}
        self._counter = itertools.count()
        # the lock; ``with self._lock.busy:`` around every call into a resource outside it, whose locks
        # a free takes: a finalizer's free (release_soon) waits for the end of either section
        self._lock = DeferringLock()
        self._closed = False
        self._finalizer = weakref.finalize(self, self._cleanup)
        multiprocessing.util.Finalize(self, self._cleanup, exitpriority=10)

    # -- budgets

    def _account(self, tier: Tier) -> Account:
        """The tier's account, created on first use (measuring the machine's capacity if needed)."""
        account = self._accounts.get(tier)
        if account is None:
            budget = self._budgets.get(tier)
            if budget is None:
                budget = self._resources[tier].capacity()
            account = self._accounts[tier] = Account(budget)
            self._limit_pool(tier)
        return account

    def _limit_pool(self, tier: Tier) -> None:
        """Hold ``tier``'s pool to its budget less the buffers registered in place. Lock held."""
        pool = self._pools.get(tier)
        account = self._accounts.get(tier)
        if pool is not None and account is not None:
            pool.set_limit(max(account.budget - self._registered_bytes[tier], 0))

    def budget(self, tier: Tier | str) -> int:
        """Budget of ``tier`` in bytes (the machine's capacity for a tier given no budget)."""
        tier = Tier.parse(tier)
        with self._lock:
            return self._account(tier).budget

    def free_bytes(self, tier: Tier | str) -> int:
        """Bytes still available on ``tier``: its budget minus the bytes of its live regions."""
        tier = Tier.parse(tier)
        with self._lock:
            return self._account(tier).free

    def usage(self) -> dict[str, dict[str, int]]:
        """Per tier: ``{"budget", "used", "free", "peak", "regions"}`` in bytes (regions: a count).

        Measures the capacity of every tier given no budget (with CUDA this initialises it).
        """
        with self._lock:
            out = {}
            for tier in Tier:
                a = self._account(tier)
                out[tier.value] = {"budget": a.budget, "used": a.used, "free": a.free, "peak": a.peak,
                                   "regions": a.regions}
            return out

    def stats(self) -> dict[str, Any]:
        """Bytes in use, peak bytes and live regions per tier and owner, and the pools' counters.

        Returns
        -------
        dict
            ``{tier_name: {owner: {"bytes": int, "peak": int, "regions": int}}}`` with every tier
            present (``{}`` if unused); an owner stays listed after its regions are freed, with
            ``bytes == 0`` and its peak kept. One more key, ``"pools"``:
            ``{"pinned": {...}, "device": {...}}``, each `graphrl.memory.pool.PoolStats` as ints
            (``registrations``, ``unregistrations``, ``pool_hits``, ``pool_misses``, ``held_bytes``,
            ``idle_bytes``); with ``pool=False`` every allocation is a registration and a miss.
            Iterate tiers with ``for tier in Tier`` (or skip ``"pools"``), not over the keys.
        """
        with self._lock:
            out: dict[str, Any] = {
                tier.value: {
                    owner: {"bytes": u.bytes, "peak": u.peak, "regions": u.regions}
                    for owner, u in (self._accounts[tier].owners.items() if tier in self._accounts else ())
                }
                for tier in Tier
            }
            direct = {t: PoolStats(**s.as_dict()) for t, s in self._direct.items()}
        with self._lock.busy:
            out["pools"] = {
                t.value: (self._pools[t].stats().plus(direct[t]) if t in self._pools else direct[t]).as_dict()
                for t in POOLED_TIERS
            }
        return out

    def regions(self, owner: str | None = None) -> list[Region]:
        """The live regions this manager owns (of ``owner`` only, if given), oldest first."""
        with self._lock:
            return [r for r in self._live.values() if owner is None or r.owner == owner]

    # -- allocation

    def _candidates(self, tier: Tier | str, fallback: Iterable[Tier | str]) -> list[Tier]:
        if isinstance(fallback, (str, Tier)):
            fallback = (fallback,)
        tiers: list[Tier] = []
        for t in (tier, *fallback):
            parsed = Tier.parse(t)
            if parsed not in tiers:
                tiers.append(parsed)
        return tiers

    def allocate(
        self,
        shape: int | tuple[int, ...] | list[int] | torch.Size,
        dtype: Any,
        tier: Tier | str = Tier.HOST,
        *,
        owner: str,
        fallback: Iterable[Tier | str] = (),
    ) -> Region:
        """Allocate a region of ``shape`` and ``dtype`` on ``tier``, or on the first fallback tier with room.

        Parameters
        ----------
        shape : int or sequence of int
            Shape of the region's views; every size >= 0.
        dtype : torch.dtype, numpy dtype or str
            ``torch.float32``, ``np.int64``, ``"bool"``, ``"bfloat16"`` ... (bfloat16 has no numpy
            view and no disk tier).
        tier : Tier or str
            Preferred tier: ``"device"``, ``"pinned"``, ``"shared"``, ``"host"`` (default) or ``"disk"``.
        owner : str
            Who the bytes are for (``"samplers.graph"``, ``"replay.shard3"``); statistics group by it.
        fallback : sequence of Tier or str
            Tiers to try, in order, when ``tier`` has no room. Default none.

        Returns
        -------
        Region
            ``region.tier`` says where it landed.

        Raises
        ------
        MemoryBudgetError
            No tier tried has room (the message and attributes name tier, owner, asked and free bytes).
        ValueError
            A negative size, more than 64 dimensions or a shape spanning more than 2**63 - 1 bytes
            (sizes of 0 counted as 1), an unknown tier, a disk tier without ``spill_dir``, an empty
            owner, or a closed manager.
        TypeError
            An unknown dtype, a bad shape, an owner that is not a string, or bfloat16 on the disk tier.
        """
        shp = parse_shape(shape)
        dt = parse_dtype(dtype)
        parse_shape(shp, dt.itemsize)  # the span in bytes, now that the item size is known
        owner = check_owner(owner)
        tiers = self._candidates(tier, fallback)
        if Tier.DISK in tiers:
            if self.spill_dir is None:
                raise ValueError(
                    "the disk tier needs spill_dir, which this MemoryManager was created without: "
                    "pass MemoryManager(spill_dir='spill/') or drop 'disk' from the tiers"
                )
            if dt.numpy is None:
                raise TypeError(f"dtype {dt.name} cannot be stored on the disk tier (zarr has no {dt.name})")
        nbytes = shape_bytes(shp, dt.itemsize)
        attempts: list[tuple[Tier, int]] = []
        failure: BaseException | None = None
        first: Account | None = None
        for t in tiers:
            with self._lock:
                self._check_open()
                account = self._account(t)
                if first is None:
                    first = account
                if not account.reserve(owner, nbytes):
                    attempts.append((t, account.free))
                    continue
            index = next(self._counter)
            pid = os.getpid()
            prefix = self._prefixes.get(pid) or self._prefixes.setdefault(pid, segment_prefix())
            name = f"{prefix}{index}"
            try:
                with self._lock.busy:
                    backing = self._resources[t].allocate(shp, dt.torch, nbytes, name)
            except (torch.OutOfMemoryError, MemoryError) as exc:
                with self._lock:
                    account.cancel(owner, nbytes)
                    attempts.append((t, account.free))
                logger.warning("tier '%s' could not allocate %s for %r: %s", t, format_size(nbytes), owner,
                               exc)
                failure = exc
                continue
            except BaseException:
                with self._lock:
                    account.cancel(owner, nbytes)
                raise
            with self._lock:
                account.settle(owner, nbytes)
            region = Region(
                shape=shp,
                dtype=dt,
                tier=t,
                owner=owner,
                backing=backing,
                manager=self,
                name=name if t is Tier.SHARED else None,
                path=getattr(backing, "path", None),
            )
            with self._lock:
                direct = self._unpooled(t, nbytes)
                if direct is not None:
                    direct.registrations += 1
                    direct.pool_misses += 1
                    direct.held_bytes += nbytes
                closed = self._closed
                if not closed:
                    self._live[id(region)] = region
                    self._track(region, backing)
            if closed:  # close() ran while we were allocating: its block goes upstream (deallocate)
                region.free()
                raise ValueError("this MemoryManager was closed during the allocation")
            if t is Tier.SHARED:
                signals.install_signal_handlers()  # once per process, from the main thread only
            if t is not tiers[0]:
                logger.info("%s for %r placed on tier '%s' (tried %s)", format_size(nbytes), owner, t,
                            ", ".join(str(a[0]) for a in attempts))
            return region
        assert first is not None
        # an allocator's refusal within the budget (a pool's live blocks) is the reason: it leads the
        # message, before figures that may show the budget free
        lead = f"allocator failed: {failure}" if failure is not None else ""
        free0 = attempts[0][1]
        raise MemoryBudgetError(
            tiers[0], owner, nbytes, free0, first.budget, tuple(attempts), lead=lead
        ) from failure

    def register(
        self, array: np.ndarray | torch.Tensor, tier: Tier | str = Tier.PINNED, *, owner: str
    ) -> Region:
        """Make an existing host buffer a region: page-locked in place with CUDA (``cudaHostRegister``).

        The region views ``array`` (no copy) and counts its bytes against ``tier``'s budget. With
        CUDA and ``tier="pinned"`` the buffer is registered with ``cudaHostRegister`` so GPU kernels
        read it in place through UVA, and unregistered on `Region.free`; without CUDA it stays
        plain memory (``is_pinned == False``). Keep ``array`` unchanged in size while registered.

        Parameters
        ----------
        array : numpy.ndarray or torch.Tensor
            C-contiguous, writable, in host memory; any dtype `allocate` accepts.
        tier : "pinned" or "host"
        owner : str

        Raises
        ------
        ValueError
            Another tier, a non-contiguous, read-only or GPU buffer, or a closed manager.
        TypeError
            ``array`` is neither a numpy array nor a tensor, or has an unsupported dtype.
        MemoryBudgetError
            ``tier`` has no room for it.
        MemoryError
            CUDA could not page-lock the buffer.

        References
        ----------
        PyTorch-Direct (Min et al., PVLDB 2021) and DGL's ``pin_memory_inplace``: UVA reads of
        registered host memory.
        """
        tier = Tier.parse(tier)
        owner = check_owner(owner)
        if tier not in (Tier.PINNED, Tier.HOST):
            raise ValueError(f"register() places buffers on tier 'pinned' or 'host', not '{tier}'")
        if isinstance(array, np.ndarray):
            if not array.flags.writeable:
                raise ValueError("register() needs a writable array")
            dt = parse_dtype(array.dtype)
            if not array.flags.c_contiguous:
                raise ValueError("register() needs a C-contiguous array (np.ascontiguousarray copies one)")
            data = torch.from_numpy(array)
        elif isinstance(array, torch.Tensor):
            dt = parse_dtype(array.dtype)
            if array.device.type != "cpu":
                raise ValueError(f"register() needs host memory, got a tensor on {array.device}")
            if not array.is_contiguous():
                raise ValueError("register() needs a contiguous tensor (.contiguous() copies one)")
            data = array.detach()
        else:
            raise TypeError(f"register() takes a numpy array or a torch tensor, got {type(array).__name__}")
        shp = tuple(data.shape)
        nbytes = shape_bytes(shp, dt.itemsize)
        with self._lock:
            self._check_open()
            account = self._account(tier)
            if not account.reserve(owner, nbytes):
                raise MemoryBudgetError(tier, owner, nbytes, account.free, account.budget)
            self._registered_bytes[tier] += nbytes
            self._limit_pool(tier)  # the pool gives way: pooled and registered bytes within the budget
        pinned = False
        try:
            resource = self._resources[tier]
            base = resource.upstream if isinstance(resource, PoolResource) else resource
            if tier is Tier.PINNED and getattr(base, "cuda", False) and nbytes > 0:
                cudart.host_register(data.data_ptr(), nbytes)
                pinned = True
        except BaseException:
            with self._lock:
                account.cancel(owner, nbytes)
                self._registered_bytes[tier] -= nbytes
                self._limit_pool(tier)
            raise
        with self._lock:
            account.settle(owner, nbytes)
        backing = TensorBacking(data, is_pinned=pinned, registered_ptr=data.data_ptr() if pinned else None)
        region = Region(shape=shp, dtype=dt, tier=tier, owner=owner, backing=backing, manager=self)
        with self._lock:
            self._live[id(region)] = region
            self._registered[id(region)] = (tier, nbytes)
            self._track(region, backing)
            if tier in self._direct:
                self._direct[tier].registrations += 1
        return region

    def attach(self, handle: RegionHandle | str, shape: Any = None, dtype: Any = None) -> Region:
        """`Region.attach`, and unmap the region when this manager closes. Counts against no budget."""
        with self._lock:
            self._check_open()
        region = Region.attach(handle, shape, dtype)
        with self._lock:
            self._attached[id(region)] = region
        return region

    def deallocate(self, region: Region, backing: Backing) -> None:
        """Free ``region``'s memory (its ``backing``, claimed), then return its bytes to the budget.

        Called exactly once per region, by `Region.free` (which hands over the backing it claimed) or
        through `release_soon`; call `Region.free`, not this.
        """
        tier = region.tier
        key = id(region)
        with self._lock:
            registered = self._registered.pop(key, None)
            self._addresses.remove(key)
        try:
            with self._lock.busy:
                if registered is not None:  # a user's buffer: unpin it, nothing to give back
                    ptr = getattr(backing, "registered_ptr", None)
                    if ptr is not None:
                        cudart.host_unregister(ptr)
                        backing.registered_ptr = None  # type: ignore[attr-defined]
                else:
                    self._resources[tier].deallocate(backing)
        finally:
            with self._lock:
                self._accounts[tier].release(region.owner, region.nbytes)
                self._live.pop(key, None)
                if registered is not None:
                    self._registered_bytes[tier] -= region.nbytes
                    self._limit_pool(tier)
                    if tier in self._direct:
                        self._direct[tier].unregistrations += 1
                elif (direct := self._unpooled(tier, region.nbytes)) is not None:
                    direct.unregistrations += 1
                    direct.held_bytes -= region.nbytes
                closed = self._closed
        if closed and registered is None and tier in self._pools:  # close() may have trimmed the pool
            with self._lock.busy:
                self._pools[tier].trim()  # this block goes upstream too, as close() did with the others

    def release_soon(self, region: Region, backing: Backing) -> None:
        """Give back a region a finalizer freed (`Region.free_soon` hands over its backing); never deadlocks.

        `deallocate` now, unless this thread holds the manager's lock (garbage collected inside its
        critical section) or is inside a call into a resource (whose locks are not re-entrant), or
        another thread holds the lock: then at the end of that section, when the lock is released or
        the call returns (`graphrl.memory.deferred.DeferringLock.defer`). ``close`` gives back any still
        waiting.
        """
        self._lock.defer(self.deallocate, region, backing)

    def _unpooled(self, tier: Tier, nbytes: int) -> PoolStats | None:
        """The counters an allocation of ``nbytes`` on ``tier`` outside a pool goes to (a pooled tier
        whose pool is off: each allocation a registration and a miss), or None. Lock held."""
        return self._direct[tier] if tier in self._direct and tier not in self._pools and nbytes else None

    def _track(self, region: Region, backing: Backing) -> None:
        """Index ``region``'s address range for `tier_of` (not disk, not empty). Lock held."""
        if backing.copies or region.nbytes == 0:
            return
        self._addresses.add(id(region), backing.tensor().data_ptr(), region.nbytes, region.tier)

    def tier_of(self, tensor: torch.Tensor) -> Tier | None:
        """The tier of the live region (allocated or registered) that holds ``tensor``'s first byte.

        A view anywhere inside a region counts; a buffer registered inside a region gives the inner
        one's tier. Cheap (a binary search over the live regions' address ranges,
        `graphrl.memory.address_index.AddressIndex`), so it may be asked per copy.

        Parameters
        ----------
        tensor : torch.Tensor
            Any tensor, on any device.

        Returns
        -------
        Tier or None
            None for an empty tensor, memory no live region of this manager holds (freed, attached
            from another process, or foreign), and disk regions (they have no address).

        Raises
        ------
        TypeError
            ``tensor`` is not a torch tensor.
        """
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tier_of() takes a torch.Tensor, got {type(tensor).__name__}")
        if tensor.numel() == 0:
            return None
        with self._lock:
            return self._addresses.tier_at(tensor.data_ptr())

    def trim(self, tier: Tier | str | None = None) -> int:
        """Release the idle blocks of the pinned and device pools (or of ``tier``'s) upstream.

        Returns
        -------
        int
            Bytes released (unregistered, or returned to the device resource).

        Raises
        ------
        ValueError
            An unknown tier.
        """
        tiers = list(self._pools) if tier is None else [Tier.parse(tier)]
        with self._lock.busy:
            return sum(self._pools[t].trim() for t in tiers if t in self._pools)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this MemoryManager is closed")

    # -- lifetime

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Free every region this manager owns and unmap the ones it attached; idempotent.

        Shared segments are unlinked, spill arrays deleted, and the pools' blocks released upstream
        (unregistered). Statistics stay readable.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            regions = list(self._live.values()) + list(self._attached.values())
            self._attached.clear()
        first: BaseException | None = None
        for region in regions:  # every region, even after one fails: the first error is raised after
            if not region.freed:
                try:
                    region.free()
                except ValueError:  # freed by another thread in between
                    logger.debug("%r was freed concurrently with close()", region)
                except Exception as err:  # noqa: BLE001 - raised once every region is freed
                    logger.warning("closing: freeing %r failed: %s", region, err)
                    first = first or err
        self._lock.drain()  # the regions finalizers freed and still waiting
        with self._lock.busy:
            for pool in self._pools.values():  # every pooled block goes back upstream (unregistered)
                try:
                    pool.trim()
                except Exception as err:  # noqa: BLE001 - raised once every pool is released
                    logger.warning("closing: releasing the %s pool failed: %s", pool.tier, err)
                    first = first or err
            self._cleanup()
        if first is not None:
            raise first

    def __enter__(self) -> MemoryManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._live)} live regions"
        return f"MemoryManager({state}, spill_dir={str(self.spill_dir) if self.spill_dir else None!r})"

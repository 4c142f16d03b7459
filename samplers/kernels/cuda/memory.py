"""`CudaMemory`: the memory-manager regions of one GPU sampler (docs/architecture.md#memory-tiers).

A GPU sampler's large buffers come from the ``device`` and ``pinned`` tiers of a
`graphrl.memory.MemoryManager`, so they count against its budgets like the engines' other buffers:

- ``"samplers.graph"``: the graph's copy for the kernels (indptr, indices, edge ids, weights, times and
  the weighted rows' prefix sums and positive counts; `CudaGraph`): ``device`` regions, or ``pinned``
  regions read in place through UVA (a graph whose tensors are pinned already is read where it is);
- ``"samplers.workspace"``: a `CudaWorkspace`'s scratch (``device``) and its page-locked staging and
  read-back buffers (``pinned``);
- ``"samplers.labor"``: LABOR's per-node arrays (``device``; `samplers.kernels.cuda.labor`).

A region that does not fit raises the manager's `graphrl.memory.MemoryBudgetError` (naming the tier and
the owner): no fallback tier. `close` (and garbage collection of the `CudaMemory`) frees every region
it handed out; a private manager (``memory=None``) is closed with it.

The kernels see a region through `kernel_array` (a numba device array: `graphrl.cuda.as_device_array`,
which views a CUDA tensor, a page-locked host tensor through UVA, or under numba's simulator a host
tensor) or `scratch_array` (a torch tensor where torch has CUDA, as `samplers.kernels.cuda.arrays.empty`
hands out, else that numba array): the one switch between a GPU and the simulator stays in
`graphrl.cuda`.

>>> mem = CudaMemory(MemoryManager(budgets={"device": "1GiB"}))
>>> region, arr = mem.copy(indptr, Tier.DEVICE, GRAPH_OWNER)   # arr: what the kernels read
>>> mem.close()                                                  # every region freed
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from graphrl import cuda as gcuda
from graphrl.errors import GPUUnavailableError
from graphrl.memory import MemoryManager, Region, Tier, check_memory
from graphrl.memory.pool import capturing

__all__ = ["GRAPH_OWNER", "LABOR_OWNER", "WORKSPACE_OWNER", "CudaMemory", "host_buffer", "kernel_array",
           "publish", "scratch_array"]

GRAPH_OWNER = "samplers.graph"
"""Owner of a GPU sampler's graph copy and prefix sums."""
WORKSPACE_OWNER = "samplers.workspace"
"""Owner of a `CudaWorkspace`'s scratch and page-locked buffers."""
LABOR_OWNER = "samplers.labor"
"""Owner of LABOR's per-node device arrays."""


def kernel_array(region: Region, n: int | None = None) -> Any:
    """A numba device array over the first ``n`` items of a 1-D region (default all), in place.

    A ``device`` region (a CUDA tensor) is viewed directly, a page-locked ``pinned`` one through UVA;
    under numba's simulator a host tensor stands for both (`graphrl.cuda.as_device_array`).
    """
    arr = gcuda.as_device_array(region.tensor())
    return arr if n is None else arr[:n]


def scratch_array(region: Region) -> Any:
    """A 1-D ``device`` region as the kernels' scratch: the CUDA tensor itself where torch has CUDA (the
    kind `samplers.kernels.cuda.arrays.empty` hands out there), else `kernel_array` (the simulator)."""
    return region.tensor() if gcuda.has_cuda() else kernel_array(region)


def host_buffer(region: Region) -> Any:
    """A 1-D ``pinned`` region as a host staging buffer: the page-locked tensor where torch has CUDA (torch
    copies to and from it asynchronously), else its numpy view (numba's copies under the simulator)."""
    return region.tensor() if gcuda.has_cuda() else region.numpy()


def _kernel_device() -> str:
    """Where the kernels' device memory is: torch's current CUDA device where torch has CUDA, else the host
    (numba's simulator)."""
    return f"cuda:{torch.cuda.current_device()}" if gcuda.has_cuda() else "cpu"


_RETIRED_KEPT = 8  # retired streams kept before the finished ones are queried and forgotten


def publish(tier: Tier) -> None:
    """Make what a build wrote into ``tier`` regions ready on every stream: where torch has CUDA, the
    ``device`` regions' fills (`CudaMemory.filled`: kernels queued on this thread's current stream) are
    waited for here, once at the end of a build (`CudaMemory.publish`), so a sampler's first call on any
    stream (a loader's side stream, which waits for no other) reads them initialised. Copies from host
    arrays (`CudaMemory.copy`) are synchronous already; pinned regions are written by the host. Nothing
    to wait for under numba's simulator."""
    if tier is Tier.DEVICE and gcuda.has_cuda():
        torch.cuda.current_stream().synchronize()


def _free_all(regions: dict[int, Region], private: list[MemoryManager], streams: dict[int, Any],
              retired: dict[int, Any]) -> None:
    """The finalizer of a `CudaMemory`: free its live regions (`Region.free_soon`: safe wherever garbage
    is collected), each reused by the pool only after the work queued on the streams its users ran on
    (events recorded now; no host wait), then close a private manager."""
    after = tuple({**retired, **streams}.values()) or None
    for region in list(regions.values()):
        region.free_soon(after)
    regions.clear()
    for manager in private:
        if not manager.closed:
            manager.close()


class CudaMemory:
    """Where one GPU sampler's buffers come from: regions of a `MemoryManager`'s ``device`` and ``pinned``
    tiers, freed together by `close` or when this object is garbage-collected.

    Parameters
    ----------
    memory : MemoryManager or None
        The manager to allocate from; ``None`` makes a private one at the first allocation (no budgets:
        the machine's GPU memory and RAM), closed by `close`. Its ``device`` tier must be the GPU where
        torch has CUDA, host memory under numba's simulator (``MemoryManager(device="cpu")``).

    Raises
    ------
    TypeError
        ``memory`` is not a `MemoryManager` or None.
    """

    def __init__(self, memory: MemoryManager | None = None) -> None:
        check_memory(memory)
        self.owns = memory is None
        """Whether the manager is private to this object (made at the first allocation, closed by
        `close`)."""
        self._given = memory
        self._private: list[MemoryManager] = []
        self._regions: dict[int, Region] = {}
        self._streams: dict[int, Any] = {}  # by id: the streams the regions' users run on (torch with CUDA)
        self._retired: dict[int, Any] = {}  # by id: streams of closed users, maybe still running
        self._holders: dict[int, weakref.ref] = {}  # by id: objects viewing the regions (`hold`), weakly
        self._closed = False
        self._finalizer = weakref.finalize(self, _free_all, self._regions, self._private, self._streams,
                                           self._retired)

    @property
    def memory(self) -> MemoryManager:
        """The `MemoryManager` the regions come from (a private one is made here on first use).

        Raises
        ------
        GPUUnavailableError
            numba.cuda runs on a GPU but torch has no CUDA: the regions the kernels read are torch
            tensors.
        """
        if self._given is not None:
            return self._given
        if not self._private:
            if not gcuda.SIMULATOR and not gcuda.has_cuda():
                raise GPUUnavailableError(
                    "device='cuda': the GPU kernels read memory-manager regions, which need torch with "
                    "CUDA (torch.cuda.is_available() is False); install a CUDA build of torch, or use "
                    "device='cpu'")
            self._private.append(MemoryManager(device=torch.device(_kernel_device())))
        return self._private[0]

    def allocate(self, n: int, dtype: Any, tier: Tier, owner: str) -> Region:
        """A 1-D region of ``max(n, 1)`` items (an empty array still has an address) on ``tier``.

        Raises
        ------
        MemoryBudgetError
            ``tier`` has no room for it (the message names the tier and ``owner``).
        ValueError
            This object (or its manager) is closed; the manager's ``device`` tier is not where the kernels
            run (host memory on a GPU, or a GPU under numba's simulator).
        """
        self.check_open("this GPU sampler's memory")
        for key in [k for k, r in self._regions.items() if r.freed]:  # freed by their users meanwhile
            del self._regions[key]
        region = self.memory.allocate((max(int(n), 1),), dtype, tier, owner=owner)
        self._regions[id(region)] = region
        want = _kernel_device()
        if tier is Tier.DEVICE and region.device != want:
            where = region.device
            self.release(region)
            hint = "" if gcuda.has_cuda() else " (numba's CUDA simulator runs on the host)"
            raise ValueError(f"memory: the device tier of this MemoryManager is {where}, where the GPU "
                             f"kernels (on {want}) cannot read it; pass MemoryManager(device={want!r}){hint}")
        return region

    def copy(self, values: np.ndarray, tier: Tier, owner: str) -> tuple[Region, Any]:
        """A region on ``tier`` holding a copy of the 1-D host array ``values``, and its `kernel_array`
        (``len(values)`` items; see `allocate` for the errors)."""
        n = int(values.shape[0])
        region = self.allocate(n, values.dtype, tier, owner)
        if n:
            host = np.ascontiguousarray(values)
            region.tensor()[:n].copy_(torch.from_numpy(host if host.flags.writeable else host.copy()))
        return region, kernel_array(region, n)

    def filled(self, n: int, dtype: Any, value: float, tier: Tier, owner: str) -> tuple[Region, Any]:
        """A region on ``tier`` of ``n`` items set to ``value``, and its `kernel_array` (see `allocate`):
        a ``device`` region is set by work queued on this thread's current stream, which the build waits
        for once at its end (`publish`) before other streams read it (a build's call, not a hot path)."""
        region = self.allocate(n, dtype, tier, owner)
        region.tensor().fill_(value.item() if isinstance(value, np.generic) else value)
        return region, kernel_array(region, n)

    def publish(self, tier: Tier) -> None:
        """The end of a build that `filled` ``tier`` regions: the module's `publish` (one wait per build)."""
        publish(tier)

    def hold(self, holder: Any) -> None:
        """Note that ``holder`` keeps views of this object's regions (kernel arrays, scratch, staging
        buffers: a `CudaGraph`, a `CudaWorkspace`, LABOR's arrays); `close` calls its ``drop_views()``
        before freeing the regions, so a closed sampler that is still referenced keeps no pool block
        alive. Held weakly (a holder that dies is forgotten)."""
        key, holders = id(holder), self._holders

        def forget(ref: weakref.ref) -> None:
            if holders.get(key) is ref:
                del holders[key]

        holders[key] = weakref.ref(holder, forget)

    def use_stream(self, stream: Any) -> None:
        """Note that a user of the regions (a `CudaWorkspace`) queues work on ``stream`` (a
        torch.cuda.Stream; None under the simulator: ignored): regions freed later are reused only after
        the work queued on it by then (no host wait)."""
        if stream is not None:
            self._streams[id(stream)] = stream

    def retire_stream(self, stream: Any) -> None:
        """A user on ``stream`` is done (its workspace closed): its queued work still orders later frees,
        until it is done; past 8 retired streams, those whose work is done are forgotten here (queried,
        no host wait; not during a CUDA graph capture on this thread), so the set stays small."""
        if stream is None:
            return
        self._streams.pop(id(stream), None)
        if len(self._retired) >= _RETIRED_KEPT and not capturing():
            # a snapshot (dict.copy: one C call, atomic under the GIL, no lock a finalizer could
            # self-deadlock on): another retire_stream meanwhile (a thread, or a workspace's finalizer
            # run by a query here) changes the dict, not what this loop walks
            for key, kept in self._retired.copy().items():
                if kept.query():
                    self._retired.pop(key, None)
        self._retired[id(stream)] = stream

    @contextlib.contextmanager
    def undo_on_error(self) -> Iterator[None]:
        """Free the regions handed out inside the block when it raises (a build that fails midway leaves
        nothing counted), then re-raise."""
        mark = set(self._regions)
        try:
            yield
        except BaseException:
            for key, region in list(self._regions.items()):
                if key not in mark:
                    self.release(region)
            raise

    def release(self, region: Region, streams: tuple[Any, ...] | None = None, reuse: bool = True) -> None:
        """Free ``region`` (one of this object's) now, unless it was freed already; the pool reuses it
        after the work queued on ``streams`` (default this thread's current stream), or with ``reuse=False``
        gives a device block back upstream (`Region.free`)."""
        self._regions.pop(id(region), None)
        region.free_soon(streams, reuse)

    def regions(self) -> list[Region]:
        """The regions handed out and not freed yet."""
        return [r for r in self._regions.values() if not r.freed]

    @property
    def closed(self) -> bool:
        """True once `close` ran."""
        return self._closed

    def check_open(self, what: str) -> None:
        """Raise ValueError naming ``what`` when this object was closed, or its manager (which freed the
        regions the kernels read).

        Raises
        ------
        ValueError
            Closed, or its manager closed.
        """
        if self._closed:
            raise ValueError(f"{what} is closed; it cannot be used (create a new one)")
        if any(manager.closed for manager in ([self._given] if self._given is not None else self._private)):
            raise ValueError(f"{what}: its MemoryManager was closed, which freed the regions the GPU kernels "
                             "read; build it again on an open manager")

    def close(self) -> None:
        """Drop the views every holder keeps (`hold`: ``drop_views()``), then free every region handed out
        (and close a private manager); idempotent. Arrays a caller took from them stay readable (they
        keep their memory alive) but no longer count against any budget."""
        self._closed = True
        for ref in list(self._holders.values()):
            holder = ref()
            if holder is not None:
                holder.drop_views()
        self._holders.clear()
        self._finalizer()

    def __repr__(self) -> str:
        live = self.regions()
        whose = "private manager" if self.owns else "shared manager"
        return (f"CudaMemory({len(live)} regions, {sum(r.nbytes for r in live)} bytes, {whose}"
                f"{', closed' if self._closed else ''})")

"""Per-sampler scratch on the GPU, and the count of what a sampler's calls cost the host.

A `CudaWorkspace` belongs to one sampler (its layer loop) and one stream. It keeps the scratch arrays
of a layer (row counts, the relabelling hash table, flags, scan offsets) and grows them as needed, so
that a warm sampler allocates no scratch at all; it hands out the arrays a block keeps (`output`,
fresh per call: the caller holds them); it stages host ids through one page-locked buffer
(`device_ids`) and reads sizes back through another (`read`: one copy, one wait). `HostTraffic`
counts each of these steps, so tests and benchmarks can assert how many read-backs and allocations a
call makes (docs/architecture.md#sampling). Scratch arrays are ``device`` regions and the page-locked
buffers ``pinned`` regions of the workspace's `CudaMemory` (owner ``"samplers.workspace"``,
docs/architecture.md#memory-tiers), freed by `close` or with the workspace; the arrays `output` hands
out are the caller's (torch's caching allocator where torch has CUDA).

>>> ws = CudaWorkspace()
>>> counts = ws.scratch("counts", 1024, np.int64)   # reused by the next layer and the next call
>>> (nnz,) = ws.read(total)                          # one page-locked read, one wait
>>> ws.traffic.readbacks
1
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrl.cuda import has_cuda
from graphrl.memory import Region, Tier
from samplers.kernels.cuda.arrays import empty
from samplers.kernels.cuda.device import torch_dtypes
from samplers.kernels.cuda.launch import kernel_stream
from samplers.kernels.cuda.memory import WORKSPACE_OWNER, CudaMemory, host_buffer, scratch_array

__all__ = ["CudaWorkspace", "HostTraffic"]

_GROWTH = 1.5  # a scratch array grows to this many times what was asked, so growth stops early


@dataclass
class HostTraffic:
    """What the GPU path of a sampler cost the host, counted since the workspace was made.

    Attributes
    ----------
    readbacks : int
        Device-to-host reads that wait for the device (each one copy into page-locked memory and one
        wait on the stream).
    scratch_allocations : int
        Scratch arrays allocated or grown (0 per call once the workspace is warm).
    scratch_bytes : int
        Bytes of those scratch arrays (each allocated or grown array's size; a grown one's old array is
        freed).
    output_allocations : int
        Arrays handed out in blocks (fresh per call: the caller keeps them; torch's caching allocator
        where torch has CUDA).
    registrations : int
        Host buffers page-locked for the device (the staging and read-back buffers: once, then grown;
        ``pinned`` regions).
    pinned_copies : int
        Host-to-device copies through a staging buffer (host ids never go from pageable memory).
    chain_overflows : int
        Calls sampled again without chaining after a chained layer overflowed its capacity
        (`samplers.kernels.cuda.layer.ChainOverflow`).
    """

    readbacks: int = 0
    scratch_allocations: int = 0
    scratch_bytes: int = 0
    output_allocations: int = 0
    registrations: int = 0
    pinned_copies: int = 0
    chain_overflows: int = 0

    def snapshot(self) -> HostTraffic:
        """A copy of the counts now (subtract two with `since`)."""
        return HostTraffic(**vars(self))

    def since(self, before: HostTraffic) -> HostTraffic:
        """The counts accumulated after ``before`` (a `snapshot`)."""
        return HostTraffic(**{k: v - getattr(before, k) for k, v in vars(self).items()})


class CudaWorkspace:
    """Scratch arrays, page-locked buffers and `HostTraffic` of one sampler on one stream.

    Scratch arrays may be reused as soon as the work of the stream that used them is ordered before
    the next use: one workspace serves one stream (a sampler keeps one per stream it was called on).

    Parameters
    ----------
    traffic : HostTraffic or None
        The counter to add to (shared by a sampler's workspaces); default a new one.
    memory : CudaMemory or None
        Where the scratch (``device``) and page-locked buffers (``pinned``) come from, owner
        ``"samplers.workspace"`` (a sampler passes its graph's); default a private `CudaMemory`.

    Raises
    ------
    MemoryBudgetError
        (from `scratch`, `device_ids`, `read`) a scratch array or buffer does not fit its tier's budget.
    """

    def __init__(self, traffic: HostTraffic | None = None, memory: CudaMemory | None = None) -> None:
        self.traffic = traffic if traffic is not None else HostTraffic()
        self.memory = CudaMemory() if memory is None else memory
        """The `CudaMemory` of the scratch and page-locked buffers."""
        self._regions: dict[Any, Region] = {}  # by scratch key or buffer name: the region behind it
        self._scratch: dict[tuple[str, str], Any] = {}
        self._host: dict[str, Any] = {}
        self._read_lock = threading.Lock()  # one page-locked read buffer: one read at a time
        self._staged: dict[str, Any] = {}  # torch: per buffer, the event after its last copy (next copy in)
        self._rates: dict[str, float] = {}
        self.stream = torch.cuda.current_stream() if has_cuda() else None
        """The torch.cuda.Stream this workspace serves (None under the simulator): its regions are reused
        by others only after the work queued on it when they are freed (no host wait)."""
        self.memory.use_stream(self.stream)
        self.memory.hold(self)  # its close closes this workspace (`drop_views`)
        self._finalizer = weakref.finalize(self, _free_regions, self._regions, self.memory, self.stream)

    def _replace(self, key: Any, n: int, dtype: Any, tier: Tier) -> Region:
        """A new region of ``n`` items for ``key``, the old one (if any) freed first."""
        old = self._regions.pop(key, None)
        if old is not None:  # outgrown: a device block goes upstream after this stream's queued work
            self.memory.release(old, None if self.stream is None else (self.stream,), reuse=False)
        region = self._regions[key] = self.memory.allocate(n, dtype, tier, WORKSPACE_OWNER)
        return region

    def close(self) -> None:
        """Free the scratch and page-locked buffers' regions (arrays taken from them stay readable but
        no longer count); the workspace allocates them again if used afterwards. Idempotent. No host
        wait: the pool reuses them after the work queued on this workspace's stream."""
        _free_regions(self._regions, self.memory, self.stream)
        self._scratch.clear()
        self._host.clear()

    def drop_views(self) -> None:
        """`close`: `CudaMemory.close` calls it, so a closed sampler's workspaces keep no block alive."""
        self.close()

    def edge_rate(self, name: str) -> float:
        """The most edges per row that the chained layer ``name`` kept in this workspace's calls (0.0 before
        any): a chained layer of fanout -1 sizes its outputs by it (`samplers.kernels.cuda.layer.
        full_capacity`)."""
        return self._rates.get(name, 0.0)

    def observe_rate(self, name: str, rate: float) -> None:
        """Record that the chained layer ``name`` kept ``rate`` edges per row (read back with its chain)."""
        self._rates[name] = max(self._rates.get(name, 0.0), float(rate))

    def scratch(self, name: str, n: int, dtype: Any) -> Any:
        """A device array [n] of ``dtype`` (numpy), uninitialised, reused across layers and calls: the
        scratch array ``name`` (a ``device`` region), grown (and counted) when shorter than ``n``."""
        key = (name, np.dtype(dtype).str)
        buf = self._scratch.get(key)
        if buf is None or buf.shape[0] < n:
            size = max(int(n * _GROWTH), 16)
            buf = self._scratch[key] = scratch_array(self._replace(key, size, dtype, Tier.DEVICE))
            self.traffic.scratch_allocations += 1
            self.traffic.scratch_bytes += size * np.dtype(dtype).itemsize
        return buf[:n]

    def output(self, n: int, dtype: Any) -> Any:
        """A fresh device array [n] of ``dtype`` for a block (the caller keeps it; counted)."""
        self.traffic.output_allocations += 1
        return empty(n, dtype)

    def _pinned(self, name: str, n: int) -> Any:
        """The page-locked host int64 buffer ``name`` of at least ``n`` items (grown and counted): a
        ``pinned`` region's tensor where torch has CUDA, its numpy view under the simulator."""
        buf = self._host.get(name)
        if buf is None or buf.shape[0] < n:
            size = max(int(n * _GROWTH), 16)
            # no host wait for the last copy out of the old buffer: it was queued on this workspace's
            # stream, the free below records an event on that stream after it, and the pool reuses the
            # pinned block only once that event is done (its host waits at reuse, not here)
            self._staged.pop(name, None)
            buf = self._host[name] = host_buffer(self._replace(name, size, np.int64, Tier.PINNED))
            self.traffic.registrations += 1
        return buf

    def read(self, values: Any) -> list[int]:
        """The int64 items of the device array ``values`` [k], read in one copy into page-locked host
        memory and one wait on the current stream (counted as one read-back)."""
        k = int(values.shape[0])
        with self._read_lock:
            host = self._pinned("read", k)[:k]
            if isinstance(values, torch.Tensor):
                host.copy_(values, non_blocking=True)
                torch.cuda.current_stream().synchronize()
                out = host.tolist()
            else:
                stream = kernel_stream()
                values.copy_to_host(host, stream=stream)
                if not isinstance(stream, int):
                    stream.synchronize()
                out = [int(x) for x in host]
            self.traffic.readbacks += 1
        return out

    def device_ids(self, ids: Any, name: str = "ids", keep: bool = False) -> Any:
        """Device ids (int64) or times (int64 or float64, the 8-byte dtypes of seed times): device arrays
        and CUDA tensors as they are; host arrays (numpy, or a CPU tensor outside the simulator) copied in
        their dtype through the page-locked staging buffer ``name`` into the scratch array ``name``
        (valid until this workspace's next use of that name), or with ``keep`` into a fresh `output`
        array (blocks may hold it: a typed chain keeps the seeds of a type that no relation draws from).

        Raises
        ------
        TypeError
            A host array of another dtype (``ids`` of itemsize other than 8).
        """
        if isinstance(ids, torch.Tensor):
            if ids.device.type == "cuda":
                return ids
            if not torch_dtypes():  # the simulator: a host tensor stands for device memory
                from graphrl import cuda as gcuda

                return gcuda.as_device_array(ids.contiguous())
            ids = ids.numpy()
        if not isinstance(ids, np.ndarray):
            return ids
        dtype = np.dtype(np.int64) if ids.dtype.kind in "iub" else ids.dtype
        if dtype.itemsize != 8:
            raise TypeError(f"ids ({name!r}): host items of 8 bytes (int64 or float64), got {ids.dtype}")
        n = int(ids.shape[0])
        out = self.output(n, dtype) if keep and n else self.scratch(name, max(n, 1), dtype)[:n]
        if n:
            staged = self._staged.get(name)
            if staged is not None:
                staged.synchronize()  # the previous copy out of this staging buffer is done
            host = self._pinned(name, n)[:n]  # int64 words, viewed in ``dtype``
            if isinstance(out, torch.Tensor):
                host = host.view(out.dtype)
                host.copy_(torch.from_numpy(np.asarray(ids, dtype=dtype)))
                out.copy_(host, non_blocking=True)
                event = self._staged[name] = torch.cuda.Event()
                event.record()
            else:
                host = host.view(dtype)
                host[:] = ids
                out.copy_to_device(host, stream=kernel_stream())
            self.traffic.pinned_copies += 1
        return out


def _free_regions(regions: dict, memory: CudaMemory, stream: Any) -> None:
    """Free a workspace's regions (its `close`, and its finalizer: `graphrl.memory.Region.free_soon`,
    safe wherever garbage is collected), reused by the pool only after the work queued on the
    workspace's ``stream`` by now (an event recorded on it: no host wait, whichever thread frees), and
    retire that stream from ``memory`` (its graph's regions, freed later, still wait for it)."""
    streams = None if stream is None else (stream,)
    for region in list(regions.values()):
        memory.release(region, streams)
    regions.clear()
    memory.retire_stream(stream)

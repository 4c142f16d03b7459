"""`Transfers`: host<->device copies of one device, asynchronous from and to pinned memory, counted.

Every host-device copy of the staged full-graph path (`samplers.full_graph_stream`) and of
`graphrl.nn.host_linear` goes through one `Transfers`, so one object knows what moved and how:

- ``h2d(dst, src, stream)`` / ``d2h(dst, src, stream)`` copy between a host tensor and a device
  tensor, ``non_blocking`` on ``stream`` with CUDA. The host side should be a region of the memory
  manager's ``pinned`` tier (or memory torch reports pinned): such a copy is asynchronous and runs at
  the PCIe rate. Any other host side is a *pageable* transfer, counted (CUDA stages it through a
  hidden bounce buffer and blocks the host).
- ``stream()`` / ``event()`` / ``use(stream)`` / ``record`` / ``wait_event`` order work on the device
  without the host; ``wait(event)`` is a *host wait*, counted.
- ``counts`` (a `TransferCounts`) holds the totals; ``registrations()`` reads the memory manager's
  pool statistics (host memory page-locked, or device memory taken from the driver, so far).

Without CUDA the device is host memory (the memory manager's device tier, ``device == "cpu"``):
streams and events are stand-ins, copies are synchronous ``copy_``, and every call is counted the
same way, so CPU tests assert the GPU's rules (no pageable transfer, no registration after the first
epoch, one host wait per partition) on the same code path. A host tensor's tier is what decides
"pinned" there (`graphrl.memory.MemoryManager.tier_of`), since nothing is page-locked.

>>> t = Transfers(mm, torch.device("cuda"))                         # doctest: +SKIP
>>> s = t.stream(); done = t.event()                                # doctest: +SKIP
>>> with t.use(s):                                                  # doctest: +SKIP
...     t.h2d(dev_rows, pinned_rows, s); t.record(done, s)
>>> t.wait(done); t.counts.pageable_transfers                       # doctest: +SKIP
0

References
----------
NVIDIA, "CUDA C++ Best Practices Guide", §Pinned Memory and §Asynchronous Transfers and Overlapping
Transfers with Computation; Wang et al., HongTu (SIGMOD 2024): transfers overlapped with compute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from graphrl.memory.sizes import Tier

__all__ = ["TransferCounts", "Transfers"]


@dataclass
class TransferCounts:
    """What a `Transfers` moved since its last reset.

    Attributes
    ----------
    host_to_device_bytes, device_to_host_bytes : int
        Bytes copied each way.
    pinned_transfers : int
        Copies whose host side is pinned memory (asynchronous with CUDA).
    pageable_transfers : int
        Copies whose host side is pageable memory (synchronous with CUDA; the rule is none).
    host_waits : int
        Times the host blocked on the device (`Transfers.wait`).
    """

    host_to_device_bytes: int = 0
    device_to_host_bytes: int = 0
    pinned_transfers: int = 0
    pageable_transfers: int = 0
    host_waits: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _HostStream:
    """The stand-in for a CUDA stream when the device is host memory: work is already ordered."""

    def wait_event(self, event: Any) -> None:
        return None


class _HostEvent:
    """The stand-in for a CUDA event when the device is host memory: always complete."""

    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None


class Transfers:
    """Counted host<->device copies, streams and events for one device (see the module docstring).

    Parameters
    ----------
    memory : MemoryManager
        Decides which host tensors are pinned (``tier_of``) and supplies the pool statistics.
    device : torch.device
        A CUDA device, or ``cpu`` when the device tier is host memory.

    Raises
    ------
    ValueError
        ``device`` is neither CPU nor CUDA.
    """

    def __init__(self, memory: Any, device: torch.device) -> None:
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be a CPU or CUDA device, got {device}")
        self.memory = memory
        self.device = device
        self.cuda = device.type == "cuda"
        self.counts = TransferCounts()

    # -- streams and events

    def stream(self) -> Any:
        """A new side stream on the device (a stand-in without CUDA)."""
        return torch.cuda.Stream(self.device) if self.cuda else _HostStream()

    def current_stream(self) -> Any:
        """Torch's current stream on the device (a stand-in without CUDA)."""
        return torch.cuda.current_stream(self.device) if self.cuda else _HostStream()

    def event(self) -> Any:
        """A new event (a stand-in, always complete, without CUDA)."""
        return torch.cuda.Event() if self.cuda else _HostEvent()

    @contextlib.contextmanager
    def use(self, stream: Any) -> Iterator[None]:
        """Make ``stream`` current for the work inside the block (nothing to do without CUDA)."""
        if self.cuda:
            with torch.cuda.stream(stream):
                yield
        else:
            yield

    @staticmethod
    def record(event: Any, stream: Any) -> None:
        """Record ``event`` on ``stream``: it completes when the stream's earlier work has."""
        event.record(stream)

    @staticmethod
    def wait_event(stream: Any, event: Any) -> None:
        """Make ``stream``'s later work wait for ``event`` (on the device; the host goes on)."""
        stream.wait_event(event)

    def wait(self, event: Any) -> None:
        """Block the host until ``event`` completes (counted in ``host_waits``)."""
        self.counts.host_waits += 1
        event.synchronize()

    # -- copies

    def is_pinned(self, host: torch.Tensor) -> bool:
        """True if ``host`` lies in a pinned-tier region of the memory manager (or, with CUDA, in memory
        torch reports page-locked)."""
        if self.memory.tier_of(host) is Tier.PINNED:
            return True
        return self.cuda and host.is_pinned()

    def _count(self, host: torch.Tensor) -> None:
        if self.is_pinned(host):
            self.counts.pinned_transfers += 1
        else:
            self.counts.pageable_transfers += 1

    def h2d(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)``: host ``src`` to device ``dst``, asynchronous on the current stream with CUDA.

        ``dst`` and ``src`` are tensors of one shape and dtype (any), ``dst`` on the device, ``src`` on the
        host; their bytes count in ``host_to_device_bytes``. Issue it inside ``use(stream)`` to run it on a
        side stream. Raises torch's ``RuntimeError`` for tensors that do not match.
        """
        nbytes = src.numel() * src.element_size()
        self._count(src)
        self.counts.host_to_device_bytes += nbytes
        dst.copy_(src, non_blocking=self.cuda)

    def d2h(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)``: device ``src`` to host ``dst``, asynchronous on the current stream with CUDA.

        Tensors of one shape and dtype, ``dst`` on the host; bytes count in ``device_to_host_bytes``. The
        host may read ``dst`` only after waiting for an event recorded after this copy. Raises torch's
        ``RuntimeError`` for tensors that do not match.
        """
        nbytes = src.numel() * src.element_size()
        self._count(dst)
        self.counts.device_to_host_bytes += nbytes
        dst.copy_(src, non_blocking=self.cuda)

    # -- registrations

    def registrations(self) -> int:
        """Upstream allocations of the memory manager's pinned and device pools so far (page-locking
        host memory, taking device memory from the driver); steady-state work adds none."""
        pools = self.memory.stats()["pools"]
        return sum(int(pools[t]["registrations"]) for t in (Tier.PINNED.value, Tier.DEVICE.value))

    def reset(self) -> TransferCounts:
        """Return the counts so far and start new ones."""
        counts, self.counts = self.counts, TransferCounts()
        return counts

    def __repr__(self) -> str:
        return f"Transfers(device={self.device}, {self.counts})"

"""Count the host's device-to-host read-backs under numba's CUDA simulator, independently of the
library's own counter (`samplers.kernels.cuda.workspace.HostTraffic`): for scripts that tests run in a
subprocess with ``NUMBA_ENABLE_CUDASIM=1`` (the ``simulated`` mark of ``tests/conftest.py``).

A read-back is a ``copy_to_host`` of a simulated device array, or an index that yields a scalar (not a
view), made on the main thread (kernels run in other threads) outside a quiet section. Blocks' conversion
to host tensors (`samplers.layers.cuda_to_torch`, the simulator's stand-in for CUDA tensors) is quiet.
Other simulator calls are counted by name through `HostCopies.counting`. In a script (run from the
repository root)::

    import sys
    sys.path.insert(0, "tests")
    from _cuda_copies import count_host_copies
    copies = count_host_copies()  # once, before sampling
    copies.clear()
    blocks = gpu_sampler.sample(seeds)
    assert copies.readbacks == gpu_sampler.loop.traffic.readbacks
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

READBACK = "readback"
"""The key of `HostCopies.seen` that counts read-backs."""
ALLOCATION = "device_alloc"
"""The key of `HostCopies.seen` that counts the host's device allocations (`HostCopies.device_traffic`)."""
PAGEABLE = "pageable"
"""The key of `HostCopies.seen` that counts pageable copies to the device (`HostCopies.device_traffic`)."""


class HostCopies:
    """Counts of host-side calls by name (``seen``, a ``Counter``); read-backs under `READBACK`."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self._quiet = 0

    @property
    def readbacks(self) -> int:
        """Device-to-host copies and scalar reads made on the host since the last `clear`."""
        return self.seen[READBACK]

    def clear(self) -> None:
        """Reset every count to zero."""
        self.seen.clear()

    def host_side(self) -> bool:
        """Whether a call now is the host's own: on the main thread and outside a quiet section."""
        return threading.current_thread() is threading.main_thread() and not self._quiet

    def counting(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, each host-side call of it counted under ``name``."""

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.host_side():
                self.seen[name] += 1
            return fn(*args, **kwargs)

        return counted

    @contextlib.contextmanager
    def device_traffic(self) -> Iterator[None]:
        """While the block runs, count the host's ``cuda.device_array`` calls under `ALLOCATION`, and its
        ``cuda.to_device`` calls and every host array handed to a kernel (the simulator copies it there and
        back) under `PAGEABLE`; the simulator's functions are restored on leaving."""
        from numba import cuda
        from numba.cuda.simulator import kernel as sim_kernel

        device_array, to_device, wrap_arg = cuda.device_array, cuda.to_device, sim_kernel.wrap_arg

        def counted_arg(value: Any, *args: Any, **kwargs: Any) -> Any:
            self.seen[PAGEABLE] += 1
            return wrap_arg(value, *args, **kwargs)

        cuda.device_array = self.counting(ALLOCATION, device_array)
        cuda.to_device = self.counting(PAGEABLE, to_device)
        sim_kernel.wrap_arg = counted_arg
        try:
            yield
        finally:
            cuda.device_array, cuda.to_device, sim_kernel.wrap_arg = device_array, to_device, wrap_arg

    def quiet(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, nothing counted while it runs."""

        def silenced(*args: Any, **kwargs: Any) -> Any:
            self._quiet += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._quiet -= 1

        return silenced


def count_host_copies() -> HostCopies:
    """Wrap the simulator's ``FakeCUDAArray.copy_to_host`` and ``__getitem__`` (counted under `READBACK`)
    and `samplers.layers.cuda_to_torch` (quiet), once per process.

    Returns
    -------
    HostCopies
        The counts, all zero.

    Raises
    ------
    RuntimeError
        Outside the simulator (``NUMBA_ENABLE_CUDASIM`` unset before numba was imported), or when this
        process already counts (a second wrapping would count every read twice).
    """
    from numba import config

    if not config.ENABLE_CUDASIM:
        raise RuntimeError("count_host_copies needs numba's CUDA simulator: set NUMBA_ENABLE_CUDASIM=1 "
                           "before numba is imported")
    from numba.cuda.simulator.cudadrv import devicearray as fake

    import samplers.layers as layers

    array = fake.FakeCUDAArray
    if getattr(array.copy_to_host, "counts", None) is not None:
        raise RuntimeError("count_host_copies was already called in this process: use the HostCopies it "
                           "returned")
    copies = HostCopies()
    getitem = array.__getitem__

    def scalar_read(self: Any, idx: Any) -> Any:
        out = getitem(self, idx)
        if not isinstance(out, array) and copies.host_side():
            copies.seen[READBACK] += 1
        return out

    copy_to_host = copies.counting(READBACK, array.copy_to_host)
    copy_to_host.counts = copies  # type: ignore[attr-defined]  # marks the class as counted
    array.copy_to_host, array.__getitem__ = copy_to_host, scalar_read
    layers.cuda_to_torch = copies.quiet(layers.cuda_to_torch)
    return copies

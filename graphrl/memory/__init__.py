"""The unified memory manager: every large buffer of both engines, under one budget per tier.

A `MemoryManager` hands out `Region`\\ s on five tiers, fastest first: ``device`` (GPU memory),
``pinned`` (page-locked host memory that GPU kernels read in place through UVA), ``shared`` (POSIX
shared memory that other processes attach by name), ``host`` (plain memory) and ``disk`` (zarr arrays
under ``spill_dir``). The layering follows RMM: one `MemoryResource` per tier allocates and frees
backing memory and knows nothing of budgets; the manager puts a limiting and statistics layer on
each that keeps the budget exactly, per tier and per owner. Nothing ever exceeds a budget silently:
a request that fits no tier tried raises `MemoryBudgetError`. Budgets, fallback, lifetime, the
shared and disk tiers and the no-GPU behaviour: docs/architecture.md#memory-tiers.

>>> from graphrl.memory import MemoryManager
>>> mm = MemoryManager(budgets={"pinned": "1GiB"})
>>> with mm.allocate((1024, 128), "float32", "pinned", owner="features", fallback=("host",)) as r:
...     r.tensor().zero_().shape
torch.Size([1024, 128])
>>> mm.close()

Modules: `sizes` (Tier, parse_size), `dtypes`, `errors`, `shm` (shared-memory segments, exit
cleanup), `cudart` (where a region is pinned for CUDA), `backing`, `resources` (one per tier),
`pool` (PoolResource: freed pinned and device memory kept for reuse, PoolStats), `region` (Region,
RegionHandle), `accounts` (budgets and statistics), `manager` (MemoryManager), `deferred`
(DeferringLock: the manager's lock, which runs the frees finalizers could not do at once), `address_index`
(which live region holds an address: `MemoryManager.tier_of`),
`owners` (segment names that carry their owner; reclaim of segments whose owner is gone),
`signals` (unlink shared memory on SIGTERM and SIGHUP).

References
----------
RMM (RAPIDS Memory Manager): ``device_memory_resource``, limiting, statistics and pool resource adaptors.
GEAR (Wang et al., ICML 2023): trajectory storage in shared and pinned host memory for GPU learners.
Min et al., "Large Graph Convolutional Network Training with GPU-Oriented Data Communication
Architecture" (PyTorch-Direct), PVLDB 14(11), 2021: GPU kernels reading pinned host memory through UVA.
"""

from graphrl.memory.backing import Backing
from graphrl.memory.dtypes import NUMPY_TO_TORCH, TORCH_TO_NUMPY
from graphrl.memory.errors import MemoryBudgetError
from graphrl.memory.manager import MemoryManager, check_memory
from graphrl.memory.pool import PoolResource, PoolStats
from graphrl.memory.region import Region, RegionHandle, free_quietly
from graphrl.memory.resources import (
    DeviceResource,
    DiskResource,
    HostResource,
    MemoryResource,
    PinnedResource,
    SharedResource,
)
from graphrl.memory.signals import install_signal_handlers, unlink_shared_segments
from graphrl.memory.sizes import Tier, parse_size

__all__ = [
    "NUMPY_TO_TORCH",
    "TORCH_TO_NUMPY",
    "Backing",
    "DeviceResource",
    "DiskResource",
    "HostResource",
    "MemoryBudgetError",
    "MemoryManager",
    "MemoryResource",
    "PinnedResource",
    "PoolResource",
    "PoolStats",
    "Region",
    "RegionHandle",
    "SharedResource",
    "Tier",
    "check_memory",
    "free_quietly",
    "install_signal_handlers",
    "parse_size",
    "unlink_shared_segments",
]

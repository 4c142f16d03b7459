"""Sampling and features of a graph partitioned over owners (docs/architecture.md#partitioned-graphs).

`PartitionOwner` serves one part of a partition folder (`graphrl.partition`); `LocalOwners` and
`RayOwners` run the P owners in this process or as Ray actors; `DistNeighborSampler` samples blocks
identical to `NeighborSampler` on the whole graph with one request per owner per layer
(`DistLaborSampler`: LABOR-0, identical to `LaborSampler`); `DistFeatureStore` fetches feature rows
with one request per owner per batch behind a hot-row cache.

>>> owners = RayOwners("parts/")                                     # doctest: +SKIP
>>> sampler = DistNeighborSampler(owners, [15, 10, 5], seed=0)       # doctest: +SKIP
>>> blocks = sampler.sample(torch.tensor([0, 7, 42]))                # doctest: +SKIP
"""

from samplers.distributed.features import DistFeatureStore, FetchStats
from samplers.distributed.labor import DistLaborSampler
from samplers.distributed.owner import PartitionOwner
from samplers.distributed.owners import OWNER_ENV, LocalOwners, OwnerCall, OwnerError, OwnerStats, RayOwners
from samplers.distributed.sampler import DistNeighborSampler, SampleProfile

__all__ = ["OWNER_ENV", "DistFeatureStore", "DistLaborSampler", "DistNeighborSampler", "FetchStats",
           "LocalOwners", "OwnerCall", "OwnerError", "OwnerStats", "PartitionOwner", "RayOwners",
           "SampleProfile"]

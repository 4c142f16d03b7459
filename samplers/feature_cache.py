"""A cache of a feature table's hottest rows near the gather, and the policies that choose them.

`hot_nodes` ranks the nodes by a policy: in-degree (``"degree"``; for the symmetric graphs of our data
sets in-degree equals out-degree), out-degree (``"out_degree"``: how often a node is drawn as an
in-neighbour), or how often a node was an input node in a short pre-sampling pass with a
`NeighborSampler` (``"presample"``, GNNLab's PreSC policy, counted by `presample_counts`); ties go to
the smaller node id. `RowCache` copies those rows of a table into a region with a slot map (row v is
cache row ``slots[v]``, or -1), which the gathers of `samplers.kernels.gather` read: on the device tier
for a GPU gather, and for a CPU gather on the tier `samplers.feature_table.cache_tier_for` names (the
device tier where it is host memory, else plain host memory) (docs/architecture.md#memory-tiers).
`samplers.features.FeatureStore(cache_rows=...)` builds one.

>>> hot = hot_nodes(graph, 100_000, "degree")
>>> cache = RowCache(memory, table, hot, owner="features")
>>> gather_rows(table, ids, out, threads, cache.rows, cache.slots)

References
----------
Yang et al., "GNNLab: A Factored System for Sample-based GNN Training over GPUs", EuroSys 2022:
caching the features of the nodes that a pre-sampling pass visits most (PreSC).
Lin et al., "PaGraph: Scaling GNN Training on Large Graphs via Computation-aware Caching", SoCC 2020:
caching by degree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager, Region, Tier
from samplers._checks import check_seeds
from samplers.neighbor import NeighborSampler

__all__ = ["POLICIES", "RowCache", "hot_nodes", "presample_counts"]

POLICIES = ("degree", "out_degree", "presample")
"""The cache policies `hot_nodes` knows."""


def presample_counts(graph: CSCGraph, fanouts: Any = (10, 10), seeds: Any = None, batches: int = 8,
                     batch_size: int = 1024, seed: int = 0) -> np.ndarray:
    """How often each node is an input node (``blocks[0].src_nodes``) in a short pre-sampling pass.

    Parameters
    ----------
    graph : CSCGraph
    fanouts : sequence of int
        As for `NeighborSampler`, outermost first.
    seeds : torch.Tensor or None, int64, shape [S]
        Nodes to draw seed batches from (without replacement within a batch); default all nodes.
    batches, batch_size : int
        Number and size of the seed batches.
    seed : int
        Seeds the batch draws and the sampler.

    Returns
    -------
    numpy.ndarray, int64, shape [N]

    References
    ----------
    GNNLab (Yang et al., EuroSys 2022): pre-sampling to estimate each vertex's access frequency.
    """
    n = graph.num_nodes
    pool = (np.arange(n, dtype=np.int64) if seeds is None
            else check_seeds(seeds, n, name="presample_seeds"))
    counts = np.zeros(n, dtype=np.int64)
    if pool.size == 0:
        return counts
    rng = np.random.default_rng(seed)
    sampler = NeighborSampler(graph, list(fanouts), seed=seed)
    for _ in range(int(batches)):
        chosen = rng.choice(pool, size=min(int(batch_size), pool.size), replace=False)
        inputs = sampler.sample(torch.from_numpy(chosen))[0].src_nodes.numpy()
        counts += np.bincount(inputs, minlength=n)
    return counts


def hot_nodes(graph: CSCGraph, count: int, policy: str, fanouts: Any = (10, 10), seeds: Any = None,
              batches: int = 8, batch_size: int = 1024, seed: int = 0) -> np.ndarray:
    """The ``count`` hottest nodes under ``policy`` (one of `POLICIES`), hottest first: int64 [count].

    ``"presample"`` ranks by `presample_counts` (its arguments follow ``policy``), then by in-degree;
    every policy breaks the remaining ties by the smaller node id.
    """
    n = graph.num_nodes
    node_ids = np.arange(n, dtype=np.int64)
    in_deg = graph.in_degrees().cpu().numpy()
    if policy == "degree":
        order = np.lexsort((node_ids, -in_deg))
    elif policy == "out_degree":
        out_deg = np.bincount(graph.indices.cpu().numpy(), minlength=n)
        order = np.lexsort((node_ids, -out_deg))
    else:
        counts = presample_counts(graph, fanouts, seeds, batches, batch_size, seed)
        order = np.lexsort((node_ids, -in_deg, -counts))
    return order[:count].astype(np.int64)


class RowCache:
    """Rows ``table[nodes]`` copied into a region on ``tier``, and the slot map that finds them.

    Parameters
    ----------
    memory : MemoryManager
        Gives the cache region (owner ``f"{owner}.cache"``) and the slot map (``f"{owner}.cache_map"``),
        both on ``tier``.
    table : torch.Tensor, shape [N, *row]
        The rows to cache from.
    nodes : numpy.ndarray, int64, shape [C]
        The cached nodes, in slot order (`hot_nodes`).
    owner : str
        Prefix of the owner names.
    before_write : callable (torch.Tensor) -> None, optional
        Called with the cache tensor before the rows are written into it (the store advises huge
        pages there).
    tier : Tier or str
        Tier of both regions, without fallback (default the device tier).

    Attributes
    ----------
    rows : torch.Tensor, shape [C, *row]
        The cached rows.
    slots_tensor : torch.Tensor, int32, shape [N]
        Cache slot of every row, -1 when not cached (on ``tier``).
    slots : numpy.ndarray or None
        The same as a numpy array when the regions are host memory (a CPU gather), else None.
    nodes : torch.Tensor, int64, shape [C]
    tier : str
        Tier of the cache region.
    regions : list[Region]
        The regions it holds (freed by `free`).

    Raises
    ------
    MemoryBudgetError
        The cache or its slot map does not fit ``tier`` (nothing stays allocated).
    """

    def __init__(self, memory: MemoryManager, table: torch.Tensor, nodes: np.ndarray, owner: str,
                 before_write: Callable[[torch.Tensor], None] | None = None,
                 tier: Tier | str = Tier.DEVICE) -> None:
        num_rows, c = int(table.shape[0]), int(nodes.shape[0])
        self.regions: list[Region] = []
        try:
            region = memory.allocate((c, *table.shape[1:]), table.dtype, tier, owner=f"{owner}.cache")
            self.regions.append(region)
            rows = region.tensor()
            if before_write is not None:
                before_write(rows)
            index = torch.from_numpy(nodes)
            _copy_rows(rows, table, index)
            slot_region = memory.allocate((num_rows,), torch.int32, tier, owner=f"{owner}.cache_map")
            self.regions.append(slot_region)
            slots = np.full(num_rows, -1, dtype=np.int32)
            slots[nodes] = np.arange(c, dtype=np.int32)
            slot_region.write(torch.from_numpy(slots))
        except BaseException:
            self.free()
            raise
        self.rows = rows
        self.slots_tensor = slot_region.tensor()
        self.slots = self.slots_tensor.numpy() if self.slots_tensor.device.type == "cpu" else None
        self.nodes = index
        self.tier = region.tier.value

    def refresh(self, table: torch.Tensor) -> None:
        """Copy the cached rows again from ``table`` (after the table changed in place)."""
        _copy_rows(self.rows, table, self.nodes)

    def free(self) -> None:
        """Free the cache and slot-map regions; idempotent (a manager closed first is fine)."""
        for region in self.regions:
            if not region.freed:
                try:
                    region.free()
                except ValueError:  # the manager closed first
                    pass
        self.regions = []


def _copy_rows(rows: torch.Tensor, table: torch.Tensor, index: torch.Tensor) -> None:
    """``rows[:] = table[index]`` with ``index`` (int64, CPU) moved to the table's device."""
    rows.copy_(table[index.to(table.device)] if table.device.type == "cuda" else table[index])

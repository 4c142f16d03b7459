"""`DistFeatureStore`: feature (or label) rows of a partitioned graph, fetched from their owners.

A batch's rows are looked up in a local cache of hot rows first (chosen once: by default the nodes
of highest out-degree, which neighbour sampling draws as sources most often); the misses go to their
owners in one request per owner per batch (`samplers.distributed.owners`). `FetchStats` reports hits,
misses, the requests made and the bytes moved. A static degree-ordered cache follows PaGraph and
GNNLab; the fetch-per-owner plan follows DistDGL's KV store. See docs/architecture.md#partitioned-graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from samplers._checks import check_seeds
from samplers.distributed.assemble import split_by_owner
from samplers.distributed.owners import check_owners

__all__ = ["DistFeatureStore", "FetchStats"]


@dataclass
class FetchStats:
    """Rows served from the cache (``hits``) and fetched (``misses``), requests, and bytes received."""

    hits: int = 0
    misses: int = 0
    requests: int = 0
    bytes_moved: int = 0

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses); 0 before any fetch."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class DistFeatureStore:
    """Rows of ``"features"`` or ``"labels"`` of a partition folder, through its owners.

    Parameters
    ----------
    owners : samplers.distributed.LocalOwners or RayOwners
    name : {"features", "labels"}
    cache_rows : int
        Rows kept locally (>= 0): the ``cache_rows`` nodes of highest out-degree (each owner proposes its
        own, the highest of all are kept), unless ``cache_ids`` is given.
    cache_ids : torch.Tensor or None, int64 [K]
        The nodes to cache instead.

    Raises
    ------
    ValueError
        An unknown ``name`` or one the folder does not hold, a negative ``cache_rows``, bad ``cache_ids``.
    TypeError
        ``owners`` not `LocalOwners` or `RayOwners`.
    """

    def __init__(self, owners, name: str = "features", cache_rows: int = 0, cache_ids=None) -> None:
        check_owners(owners)
        if name not in ("features", "labels"):
            raise ValueError(f"name must be 'features' or 'labels', got {name!r}")
        if owners.book.manifest[name] is None:
            raise ValueError(f"partition folder {owners.folder} holds no {name}")
        if isinstance(cache_rows, bool) or not isinstance(cache_rows, (int, np.integer)) or cache_rows < 0:
            raise ValueError(f"cache_rows must be an int >= 0, got {cache_rows!r}")
        self.owners = owners
        self.name = name
        self.book = owners.book
        self.stats = FetchStats()
        if cache_ids is not None:
            ids = np.unique(check_seeds(cache_ids, self.book.num_nodes, "cache_ids"))
        elif cache_rows:
            ids = self._hottest(int(cache_rows))
        else:
            ids = np.empty(0, dtype=np.int64)
        self.cache_ids = ids
        self.cache = self._fetch(ids) if ids.shape[0] else None
        self.stats = FetchStats()  # the cache's fill is not a batch's traffic

    def _hottest(self, k: int) -> np.ndarray:
        """The k nodes of highest out-degree: each owner's top k, merged (one request per owner)."""
        per = self.owners.call("hot_nodes", {p: (k,) for p in range(self.book.num_parts)})
        ids = np.concatenate([v[0] for v in per.values()])
        deg = np.concatenate([v[1] for v in per.values()])
        top = np.argsort(-deg, kind="stable")[:k]
        return np.sort(ids[top])

    def _fetch(self, ids: np.ndarray) -> np.ndarray:
        order, slices = split_by_owner(ids, self.book.node_part, self.book.num_parts)
        sorted_ids = ids[order]
        res = self.owners.call("rows", {p: (sorted_ids[s], self.name) for p, s in slices.items()})
        first = next(iter(res.values()))
        out = np.empty((ids.shape[0], *first.shape[1:]), dtype=first.dtype)
        for p, s in slices.items():
            out[order[s]] = res[p]
            self.stats.bytes_moved += int(res[p].nbytes) + int(sorted_ids[s].nbytes)
        self.stats.requests += len(slices)
        return out

    def fetch(self, ids) -> torch.Tensor:
        """The rows of ``ids``: [K, F] features or [K] labels, in the folder's dtype.

        Parameters
        ----------
        ids : torch.Tensor, integer, shape [K], in [0, N)

        Raises
        ------
        TypeError, ValueError
            Bad ``ids`` (named, as sampler seeds).
        samplers.distributed.OwnerError
            An owner died or failed.
        """
        ids = check_seeds(ids, self.book.num_nodes, "ids")
        if self.cache is not None:
            pos = np.searchsorted(self.cache_ids, ids)
            last = self.cache_ids.shape[0] - 1
            hit = (pos <= last) & (self.cache_ids[np.minimum(pos, last)] == ids)
        else:
            hit = np.zeros(ids.shape[0], dtype=bool)
        miss = np.flatnonzero(~hit)
        shape = self.book.manifest[self.name]
        dtype, tail = (shape[0], tuple(shape[1])) if self.name == "features" else (shape, ())
        out = np.empty((ids.shape[0], *tail), dtype=np.dtype(dtype))
        if self.cache is not None and hit.any():
            out[hit] = self.cache[pos[hit]]
        if miss.shape[0]:
            out[miss] = self._fetch(ids[miss])
        self.stats.hits += int(ids.shape[0] - miss.shape[0])
        self.stats.misses += int(miss.shape[0])
        return torch.from_numpy(out)

"""`DistNeighborSampler`: neighbour sampling over a partitioned graph, identical to `NeighborSampler`.

Each layer's frontier is split by owner (the partition book, `graphrl.partition.PartitionBook`), sent
as one request per owner per layer (`samplers.distributed.owners`), drawn there by the sampling core
(`samplers.distributed.core`), and put back in frontier order; the trainer relabels the layer as the
whole-graph sampler does. Draws are keyed by (seed, call, layer, global node id) and a row's CSC
positions, which owners keep, so for the same seed the n-th call returns the blocks `NeighborSampler`'s
n-th call returns on the whole graph (uniform or weighted, with or without replacement). A call that
fails (an owner died) does not advance the call counter: after `restart` the same batch comes again.
See docs/architecture.md#partitioned-graphs.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from samplers._checks import check_fanouts, check_seed_and_replace, check_seeds
from samplers.block import Block, Blocks
from samplers.distributed.assemble import scatter_rows, split_by_owner
from samplers.distributed.core import layer_key, relabel_sources
from samplers.distributed.owners import check_owners

__all__ = ["DistNeighborSampler", "SampleProfile"]


@dataclass
class SampleProfile:
    """Where a sampler's calls spent their time (seconds, summed over calls).

    ``wait_s``: waiting for the owners' answers (their kernels, the transfers, the engine's round
    trips); ``assemble_s``: splitting frontiers by owner and putting the answers back in frontier order
    (copies); ``relabel_s``: the relabelling; ``calls``: `DistNeighborSampler.sample` calls.
    """

    wait_s: float = 0.0
    assemble_s: float = 0.0
    relabel_s: float = 0.0
    calls: int = 0


class DistNeighborSampler:
    """Sample blocks from a partitioned graph through its owners.

    Parameters
    ----------
    owners : samplers.distributed.LocalOwners or RayOwners
        The owners of the partition folder.
    fanouts : sequence of int
        As `NeighborSampler` (outermost layer first, -1 takes every in-neighbour).
    replace : bool
        As `NeighborSampler`.
    weighted : bool
        Draw by the edge weights the folder holds (as ``NeighborSampler(weights=True)``).
    seed : int or None
        Seed of the random stream; ``None`` draws one from the OS.

    Notes
    -----
    Requests per call: at most P per layer. Bytes per call: 8 per frontier node sent, 4 per row and 8
    per sampled edge received (below 2^31 nodes and edges; 8 and 16 above). The trainer holds the
    book (4 bytes per node) and a relabelling map (4 bytes per node).
    ``sampled_edges`` counts edges drawn; ``owners.stats`` the requests and bytes.

    Raises
    ------
    TypeError, ValueError
        Bad fanouts or seed (as `NeighborSampler`); ``weighted`` on a folder without weights; ``owners``
        not `LocalOwners` or `RayOwners`.

    Pickling (spawned ``DataLoader`` workers, ``mp.spawn``) keeps the owners, fanouts, seed and call
    counter, so a copy continues the stream; `RayOwners` refuse it (attach by name in each process).

    References
    ----------
    DistDGL (Zheng et al., IA3 2020): sampling requests routed to the partitions owning the frontier.
    """

    def __init__(self, owners, fanouts: Sequence[int], replace: bool = False, weighted: bool = False,
                 seed: int | None = None) -> None:
        check_owners(owners)
        fanouts = check_fanouts("fanouts", fanouts)
        check_seed_and_replace(seed, replace)
        if weighted and not owners.book.manifest["weighted"]:
            raise ValueError(f"weighted=True, but partition folder {owners.folder} holds no edge weights")
        self.owners = owners
        self.book = owners.book
        self.fanouts = [int(k) for k in fanouts]
        self.replace = bool(replace)
        self.weighted = bool(weighted)
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self.sampled_edges = 0
        self._calls = 0
        self.profile = SampleProfile()
        """Time spent per part of a call (`SampleProfile`); ``owners.stats`` has requests and bytes."""
        self._node_map = np.full(self.book.num_nodes, -1, dtype=np.int32)

        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """The sampler without its lock and relabelling map (rebuilt by `__setstate__`)."""
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"], state["_node_map"]
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled sampler (`__getstate__`)."""
        self.__dict__.update(state)
        self._node_map = np.full(self.book.num_nodes, -1, dtype=np.int32)
        self._lock = threading.Lock()

    @property
    def num_layers(self) -> int:
        """Number of layers (blocks per sample)."""
        return len(self.fanouts)

    def sample(self, seeds) -> Blocks:
        """Sample blocks for ``seeds``, outermost layer first (as `NeighborSampler.sample`).

        Parameters
        ----------
        seeds : torch.Tensor, integer, shape [B], in [0, N); duplicates kept

        Returns
        -------
        Blocks
            ``len(fanouts)`` blocks, equal to `NeighborSampler`'s for the same seed and call.

        Raises
        ------
        TypeError, ValueError
            Bad ``seeds`` (as `NeighborSampler.sample`).
        samplers.distributed.OwnerError
            An owner died or failed; the call counter is not advanced.
        TimeoutError
            Owners did not answer within `RayOwners`' ``timeout_s``; the call counter is not advanced.
        """
        dst = check_seeds(seeds, self.book.num_nodes)
        with self._lock:
            blocks = self._sample(dst, self._calls)
            self._calls += 1
            self.profile.calls += 1
            self.sampled_edges += sum(b.num_edges for b in blocks)
        return blocks

    def _request(self, call: int, layer: int) -> tuple:
        """What every owner is asked for one layer, after the frontier: (fanout, replace, key, weighted)."""
        return (self.fanouts[layer], self.replace, layer_key(self.seed, call, layer), self.weighted)

    def _layer(self, dst: np.ndarray, tail: tuple) -> tuple:
        """out_indptr [D + 1], sources [nnz], edge ids [nnz] and edge weights (float32 [nnz] or None) of one
        layer, rows in the order of ``dst``; ``tail`` the request after the frontier (`_request`)."""
        t0 = time.perf_counter()
        order, slices = split_by_owner(dst, self.book.node_part, self.book.num_parts)
        sorted_dst = dst[order]
        requests = {p: (sorted_dst[s], *tail) for p, s in slices.items()}
        t1 = time.perf_counter()
        results = self.owners.call("sample", requests)
        t2 = time.perf_counter()
        self.profile.wait_s += t2 - t1
        counts_sorted = np.zeros(dst.shape[0], dtype=np.int64)
        for p, s in slices.items():
            counts_sorted[s] = results[p][0]
        counts = np.empty_like(counts_sorted)
        counts[order] = counts_sorted
        out_indptr = np.zeros(dst.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=out_indptr[1:])
        nnz = int(out_indptr[-1])
        src = np.empty(nnz, dtype=np.int64)
        eids = np.empty(nnz, dtype=np.int64)
        weighted = any(results[p][3] is not None for p in slices)
        weights = np.empty(nnz, dtype=np.float32) if weighted else None
        for p, s in slices.items():
            c, psrc, peid, pw = results[p]
            scatter_rows(order[s], c, psrc, peid, out_indptr, src, eids, pw, weights)
        self.profile.assemble_s += (t1 - t0) + (time.perf_counter() - t2)
        return out_indptr, src, eids, weights

    def _sample(self, dst: np.ndarray, call: int) -> Blocks:
        blocks = Blocks()
        for layer in range(self.num_layers - 1, -1, -1):
            out_indptr, src, eids, weights = self._layer(dst, self._request(call, layer))
            t0 = time.perf_counter()
            src_nodes, local = relabel_sources(dst, src, self._node_map)
            self.profile.relabel_s += time.perf_counter() - t0
            src_t = torch.from_numpy(src_nodes)
            blocks.append(Block(src_nodes=src_t, dst_nodes=src_t[: dst.shape[0]],
                                indptr=torch.from_numpy(out_indptr), indices=torch.from_numpy(local),
                                edge_ids=torch.from_numpy(eids),
                                edge_weights=None if weights is None else torch.from_numpy(weights)))
            dst = src_nodes
        blocks.reverse()
        return blocks

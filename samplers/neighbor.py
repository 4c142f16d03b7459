"""Multi-layer neighbour sampling into blocks (MFGs), as DGL's NeighborSampler and PyG's NeighborLoader."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence

import numba
import numpy as np
import torch

from graphrl.graph import CSCGraph
from samplers.block import Block
from samplers.kernels import cpu

__all__ = ["NeighborSampler", "check_seeds"]


def check_seeds(seeds, num_nodes: int, name: str = "seeds", bound: str = "num_nodes") -> np.ndarray:
    """Validate a seed tensor at the public boundary and return it as an int64 numpy array.

    Parameters
    ----------
    seeds : torch.Tensor or array-like, integer, shape [B]
        The ids to check.
    num_nodes : int
        Exclusive upper bound of the ids.
    name : str
        Argument name used in error messages.
    bound : str
        Name of the upper bound used in error messages (``"num_edges"`` for edge ids).

    Returns
    -------
    numpy.ndarray, int64, shape [B], contiguous

    Raises
    ------
    TypeError
        ``seeds`` is not an integer tensor or array (a float or bool tensor, for instance).
    ValueError
        ``seeds`` is not 1-D, or holds ids outside [0, num_nodes).
    """
    if isinstance(seeds, torch.Tensor):
        if seeds.dtype.is_floating_point or seeds.dtype.is_complex or seeds.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got dtype {seeds.dtype}")
        arr = seeds.detach().cpu().numpy()
    else:
        arr = np.asarray(seeds)
        if arr.size == 0 and arr.dtype == np.float64:  # np.asarray([]) is float64: treat as empty ids
            arr = arr.astype(np.int64)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.size:
        bad = (arr < 0) | (arr >= num_nodes)
        if bad.any():
            first = int(arr[np.argmax(bad)])
            raise ValueError(f"{name}: {int(bad.sum())} of {arr.size} ids outside [0, {bound}={num_nodes}), "
                             f"first {first}")
    return arr


class NeighborSampler:
    """Sample a fixed number of in-neighbours per node per layer and return DGL-style blocks.

    Parameters
    ----------
    graph : CSCGraph
        The graph; in-edges of a destination are its candidates.
    fanouts : sequence of int
        Neighbours drawn per node, one entry per layer, outermost layer first (as in DGL):
        ``fanouts[-1]`` is drawn for the seeds, ``fanouts[0]`` for the outermost layer. ``-1`` takes
        every in-neighbour.
    replace : bool
        Draw with replacement: a node of in-degree d > 0 contributes exactly k edges (0 when d = 0).
        Without replacement it contributes min(d, k) distinct edges (distinct edge ids: parallel edges
        can both be drawn, no edge twice).
    seed : int or None
        Seed of the sampler's random stream. ``None`` draws one from the OS. The n-th call of
        `sample` with a given seed returns the same blocks on every run and for any thread count.

    Notes
    -----
    Duplicate seeds are *kept*: each occurrence is its own destination row (so output row i belongs to
    ``seeds[i]``); duplicates get identical neighbours, since a row's random stream depends only on
    (seed, call, layer, node id). Sampled sources are deduplicated.

    Threads: each call uses up to ``numba.get_num_threads()`` threads (the caller and helper threads
    that claim chunks of work dynamically; see `samplers.kernels.cpu`); the result does not depend on
    it. A sampler holds scratch memory and serves one `sample` call at a time (concurrent calls from
    several threads are serialised by a lock); to sample in parallel, use one sampler per thread. The
    first call in a process pays numba's compilation (cached on disk afterwards).

    Raises
    ------
    TypeError
        ``graph`` is not a `CSCGraph`; a fanout or ``seed`` is not an int.
    ValueError
        ``fanouts`` is empty or holds a value below -1.

    References
    ----------
    Hamilton, Ying and Leskovec, "Inductive Representation Learning on Large Graphs" (GraphSAGE,
    NeurIPS 2017) for layer-wise neighbour sampling; DGL's message-flow-graph (block) contract for
    the output; Floyd's sampling without replacement, as in pyg-lib's neighbour kernel.

    Examples
    --------
    >>> sampler = NeighborSampler(graph, fanouts=[15, 10, 5], seed=0)
    >>> blocks = sampler.sample(torch.tensor([0, 7, 42]))
    >>> blocks[-1].dst_nodes            # tensor([ 0,  7, 42])
    """

    def __init__(self, graph: CSCGraph, fanouts: Sequence[int], replace: bool = False,
                 seed: int | None = None) -> None:
        if not isinstance(graph, CSCGraph):
            raise TypeError(f"graph must be a CSCGraph, got {type(graph).__name__}")
        fanouts = list(fanouts)
        if not fanouts:
            raise ValueError("fanouts must have at least one layer, got []")
        for i, k in enumerate(fanouts):
            if isinstance(k, bool) or int(k) != k:
                raise TypeError(f"fanouts[{i}] must be an int, got {k!r}")
            if k < -1:
                raise ValueError(f"fanouts[{i}]={k}: a fanout must be >= 0, or -1 for every neighbour")
        if seed is not None and (isinstance(seed, bool) or int(seed) != seed):
            raise TypeError(f"seed must be an int or None, got {seed!r}")
        self.graph = graph
        self.fanouts = [int(k) for k in fanouts]
        self.replace = bool(replace)
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self._calls = 0
        self._indptr = graph.indptr.numpy()
        self._indices = graph.indices.numpy()
        self._edge_ids = None if graph.edge_ids is None else graph.edge_ids.numpy()
        self._workspace = cpu.Workspace(graph.num_nodes, self._indices.dtype)
        self._eid_to_pos: np.ndarray | None = None
        self._lock = threading.Lock()  # the workspace serves one call at a time
        self.sampled_edges = 0
        """Total number of edges sampled by this sampler so far (for throughput reports)."""

    @property
    def num_layers(self) -> int:
        """Number of layers (blocks per sample)."""
        return len(self.fanouts)

    def _excluded_positions(self, exclude_eids) -> cpu.Exclusion | None:
        """Validate graph edge ids and return their CSC positions, sorted and distinct (None if none)."""
        if exclude_eids is None:
            return None
        eids = check_seeds(exclude_eids, self.graph.num_edges, name="exclude_eids", bound="num_edges")
        if eids.size == 0:
            return None
        if self._edge_ids is None:
            pos = eids
        else:
            if self._eid_to_pos is None:  # inverse permutation of edge_ids, built once on first use
                num_edges = self.graph.num_edges
                inv = np.empty(num_edges, dtype=np.int32 if num_edges <= np.iinfo(np.int32).max else np.int64)
                inv[self._edge_ids] = np.arange(num_edges, dtype=inv.dtype)
                self._eid_to_pos = inv
            pos = self._eid_to_pos[eids]
        return cpu.Exclusion(self._indptr, np.unique(pos).astype(np.int64, copy=False))

    def sample(self, seeds, exclude_eids=None) -> list[Block]:
        """Sample blocks for ``seeds``, outermost layer first, never drawing the ``exclude_eids`` edges.

        Parameters
        ----------
        seeds : torch.Tensor, int64 (any integer dtype), shape [B]
            Seed nodes, in [0, num_nodes). May be empty; duplicates are kept (see Notes of the class).
        exclude_eids : torch.Tensor or None, int64 (any integer dtype), shape [X]
            Graph edge ids that no layer may draw (for link prediction: the batch's target edges and
            their reverses). They are removed from the candidates *before* drawing: a node with d
            in-edges of which x are excluded contributes min(d - x, k) edges without replacement, and k
            with replacement when d - x > 0. (DGL 2.1's ``sample_neighbors(exclude_edges=...)`` and its
            ``exclude=`` option draw first and drop excluded edges afterwards, so a node can get fewer;
            with fanout -1 both give the same edges.)
            Duplicates are allowed. The first call with exclusions builds the inverse of the graph's
            edge-id permutation (4 bytes per edge below 2^31 edges), kept for later calls.

        Returns
        -------
        list[Block]
            ``len(fanouts)`` blocks. ``blocks[-1].dst_nodes`` equals ``seeds``;
            ``blocks[i].dst_nodes`` equals ``blocks[i + 1].src_nodes``.

        Raises
        ------
        TypeError
            ``seeds`` or ``exclude_eids`` is not an integer tensor (a float or bool tensor, say).
        ValueError
            ``seeds`` is not 1-D or holds ids outside [0, num_nodes); ``exclude_eids`` is not 1-D or holds
            ids outside [0, num_edges).
        """
        dst = check_seeds(seeds, self.graph.num_nodes)
        threads = numba.get_num_threads()
        with self._lock:
            excluded = self._excluded_positions(exclude_eids)
            call = self._calls
            self._calls += 1
            return self._sample(dst, excluded, call, threads)

    def _sample(self, dst: np.ndarray, excluded: cpu.Exclusion | None, call: int,
                threads: int) -> list[Block]:
        blocks: list[Block] = []
        for layer in range(self.num_layers - 1, -1, -1):
            key = cpu.layer_key(self.seed, call, layer)
            out_indptr, src_nodes, local, eids = cpu.sample_block(
                self._indptr, self._indices, self._edge_ids, dst, self.fanouts[layer], self.replace, key,
                excluded, self._workspace, threads)
            self.sampled_edges += int(local.shape[0])
            src_t = torch.from_numpy(src_nodes)
            blocks.append(Block(src_nodes=src_t, dst_nodes=src_t[: dst.shape[0]],
                                indptr=torch.from_numpy(out_indptr), indices=torch.from_numpy(local),
                                edge_ids=torch.from_numpy(eids)))
            dst = src_nodes
        blocks.reverse()
        return blocks

"""What a sampling mode is: an object that turns one relation's destinations into sampled edges.

A mode owns the plan and choose steps of its rule on both devices (it calls its numba CPU kernels and
its numba.cuda kernels); the layer loop (`samplers.layers`) owns everything around them: keys,
exclusions, relabelling, node types, blocks. `RelationArrays` is one relation's CSC as the modes read
it; `LayerEdges` is what a mode returns for one layer of one relation, before relabelling.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

__all__ = ["LayerEdges", "LayerRequest", "Mode", "RelationArrays"]


@dataclass
class RelationArrays:
    """One relation's CSC of in-edges (a plain graph is one relation), as the modes read it.

    Attributes
    ----------
    indptr : numpy int64 [N_dst + 1]; indices : numpy int32/int64 [E] (source ids within the source
    type); edge_ids : numpy int64 [E] or None (identity)
    num_src : int
        Nodes of the source type (the range of ``indices``).
    weights : numpy float32 [E] or None
        Edge weights in CSC order (finite, >= 0).
    times : numpy int64/float64 [E] or None
        Edge times in CSC order.
    cuda : CudaGraph or None
        The device copy (``device="cuda"``), weights and times included.
    pairs : numpy int32 [2E] or None
        CPU: each position's source and edge id side by side (`samplers._csc.edge_pairs`, 8 bytes per
        edge), which the CPU gather reads in place of ``indices`` and ``edge_ids``; a CPU
        `samplers.layers.LayerLoop` builds them once unless handed in. None: the gather reads ``indices``
        and ``edge_ids``.
    prefix, positive : numpy float64 [E] and int64 [N_dst], or None
        CPU, weighted mode: each row's prefix sums of the weights and positive-weight counts
        (`samplers.kernels.cpu.weight_prefix`, 8 bytes per edge and per row), which its `Mode.prepare`
        builds once unless handed in. The derived arrays (``pairs``, ``prefix``, ``positive``:
        `samplers._csc.DERIVED`) are handed in by a pickled sampler (shared memory,
        `samplers._csc.share_loop`) or by loops over the same rows (`samplers._csc.held_derived`).
    """

    indptr: np.ndarray
    indices: np.ndarray
    edge_ids: np.ndarray | None
    num_src: int
    weights: np.ndarray | None = None
    times: np.ndarray | None = None
    cuda: Any = None
    pairs: np.ndarray | None = None
    prefix: np.ndarray | None = None
    positive: np.ndarray | None = None


@dataclass
class LayerRequest:
    """One layer of one relation: what a mode samples.

    Attributes
    ----------
    dst : numpy int64 [D] (CPU) or a device int64 array [D] (CUDA)
        Destination rows, trusted in range.
    fanout : int
        k >= 0, or -1 for every eligible in-edge.
    key : int
        The relation's layer key (its rows' random streams).
    variate_key : int
        The key of per-source variates shared by every row of the layer (modes that draw per source,
        as LABOR).
    excluded : sorted distinct CSC positions (numpy or device int64 [X]), or None
    dst_times : the rows' times ([D], the edge times' dtype; host or device), or None
    threads : int
        CPU threads that may work on the layer (the caller included).
    next_fanout : int or None
        The fanout of the next layer, whose destinations are this layer's sources (None: the last
        layer). A fused CPU layer may plan that layer while relabelling (`samplers.kernels.cpu.sample_block`).
    """

    dst: Any
    fanout: int
    key: int
    variate_key: int
    excluded: Any = None
    dst_times: Any = None
    threads: int = 1
    next_fanout: int | None = None


@dataclass
class LayerEdges:
    """The sampled in-edges of one layer of one relation, not relabelled.

    Attributes
    ----------
    indptr : int64 [D + 1]; src : [nnz] global source ids (the indices' dtype); edge_ids : int64 [nnz]
    weights : float64 [nnz] or None
        Per-edge weights that the mode asks the model to use (LABOR's importance weights), else None.

    numpy arrays on the CPU, device arrays on CUDA.
    """

    indptr: Any
    src: Any
    edge_ids: Any
    weights: Any = None


class Mode(ABC):
    """A sampling rule: the plan and choose steps of one layer of one relation, on the CPU and on CUDA.

    Subclasses set ``name`` (its key in `samplers.modes.MODES`) and implement `prepare` (per-relation
    state built once: prefix sums, scratch) and `sample_cpu` / `sample_cuda`. Both devices must return
    the same edges for the same request.
    """

    name: ClassVar[str]

    def prepare(self, relation: RelationArrays, device: str) -> Any:
        """Per-relation state built once per sampler (None by default)."""
        return None

    @abstractmethod
    def sample_cpu(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        """One layer of one relation with the numba CPU kernels."""

    def sample_block_cpu(self, relation: RelationArrays, state: Any, request: LayerRequest,
                         workspace: Any) -> tuple | None:
        """A fused CPU layer of a plain graph, sampled and relabelled in one pipelined pass
        (`samplers.kernels.cpu.sample_block`): ``(indptr, src_nodes, local, edge_ids, src_times)``, or
        None (the default) when the mode has none; the loop then samples and relabels apart."""
        return None

    def sample_block_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest,
                          workspace: Any) -> Any:
        """A plain graph's CUDA layer sampled and relabelled through the sampler's workspace
        (`samplers.kernels.cuda.sample_block_cuda`): ``(indptr, src_nodes, local, edge_ids)`` device
        arrays, or a `samplers.kernels.cuda.layer.PendingBlock` when ``request.dst`` is a chain's
        `samplers.kernels.cuda.layer.DeviceRows` (`bounded_cuda` layers: nothing read back); None (the
        default) when the mode has none: the loop then samples and relabels apart."""
        return None

    def sample_edges_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest,
                          workspace: Any, scratch: str = "src") -> Any:
        """A chained layer's sampled edges, not relabelled (a typed graph's chain relabels per source
        type): `samplers.kernels.cuda.layer.BoundedEdges` for ``request.dst`` a chain's
        `samplers.kernels.cuda.layer.DeviceRows`, its sources in the workspace's scratch array ``scratch``.
        Called only where `bounded_cuda` holds.

        Raises
        ------
        NotImplementedError
            The mode does not chain (its `bounded_cuda` is False).
        """
        raise NotImplementedError(f"mode {self.name!r} does not chain on the device (bounded_cuda is False)")

    def bounded_cuda(self, relation: RelationArrays, fanout: int) -> bool:
        """Whether `sample_block_cuda` chains this layer on the device (its outputs sized without a
        read-back: by ``fanout`` per row, or by a capacity that the chain's read-back checks, LABOR's; its
        sizes kept on the device); False by default."""
        return False

    @abstractmethod
    def sample_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        """One layer of one relation with the numba.cuda kernels (device arrays in and out)."""

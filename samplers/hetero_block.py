"""One layer of a heterogeneous sample: DGL's heterogeneous MFG, a local CSC per relation.

`HeteroBlock` follows the block contract of docs/architecture.md#blocks-and-mfgs per node type: the
first ``len(dst_nodes[t])`` sources of type t are the destinations of type t. `HeteroBlock.to_dgl`
makes a ``dgl.create_block`` with one edge type per relation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.hetero_graph import Relation
from samplers.interop import hetero_block_to_dgl

__all__ = ["HeteroBlock"]


@dataclass(frozen=True, eq=False)
class HeteroBlock:
    """One layer of a heterogeneous sample: node lists per type and a local CSC per relation.

    Attributes
    ----------
    src_nodes : dict[str, torch.Tensor], int64
        Source nodes of each type (ids within the type); the first ``len(dst_nodes[t])`` are
        ``dst_nodes[t]``.
    dst_nodes : dict[str, torch.Tensor], int64
        Destination nodes of each type (views of the prefixes of ``src_nodes``).
    indptr : dict[Relation, torch.Tensor], int64, shape [len(dst_nodes[dst_type]) + 1]
    indices : dict[Relation, torch.Tensor], int64
        Local source position, into ``src_nodes[src_type]``, of each sampled edge of the relation.
    edge_ids : dict[Relation, torch.Tensor], int64
        Relation edge id of each sampled edge.
    src_times : dict[str, torch.Tensor] or None, int64 or float64
        Temporal sampling: the time of each source node of each type (a node reached at two times is
        two source nodes); else None.
    edge_weights : dict[Relation, torch.Tensor] or None, float32 [nnz_r]
        Per relation, the weights the model should apply to the sampled edges (`samplers.LaborSampler`,
        as `Block.edge_weights`); else None. ``to_dgl`` stores them as ``edata["edge_weights"]``.

    All tensors are on the device that sampled them (CUDA tensors from a ``device="cuda"`` sampler when
    torch has CUDA).
    """

    src_nodes: dict[str, torch.Tensor]
    dst_nodes: dict[str, torch.Tensor]
    indptr: dict[Relation, torch.Tensor]
    indices: dict[Relation, torch.Tensor]
    edge_ids: dict[Relation, torch.Tensor]
    src_times: dict[str, torch.Tensor] | None = None
    edge_weights: dict[Relation, torch.Tensor] | None = None

    @property
    def dst_times(self) -> dict[str, torch.Tensor] | None:
        """Time of each destination row per type (the prefixes of ``src_times``), or None."""
        if self.src_times is None:
            return None
        return {t: v[: self.dst_nodes[t].shape[0]] for t, v in self.src_times.items()}

    def num_edges(self, relation: Relation | None = None) -> int:
        """Sampled edges of one relation, or of all."""
        if relation is not None:
            return int(self.indices[relation].shape[0])
        return sum(int(t.shape[0]) for t in self.indices.values())

    def edge_dst(self, relation: Relation) -> torch.Tensor:
        """Local destination position of every sampled edge of a relation: int64 [nnz]."""
        ptr = self.indptr[relation]
        rows = torch.arange(ptr.shape[0] - 1, dtype=torch.int64, device=ptr.device)
        return torch.repeat_interleave(rows, ptr[1:] - ptr[:-1])

    def to_dgl(self):
        """This block as a DGL heterogeneous block with one edge type per sampled relation, int64 ids;
        see `samplers.interop.hetero_block_to_dgl` (its Returns and Raises)."""
        return hetero_block_to_dgl(self, list(self.indices))

"""The message-flow graph (MFG, DGL's "block") that samplers hand to GNN layers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Block"]


@dataclass(frozen=True, eq=False)
class Block:
    """One layer's bipartite message-flow graph, in DGL's block contract.

    Destination nodes come first among the source nodes: ``src_nodes[:num_dst_nodes] == dst_nodes``.
    Row ``v`` of the local CSC lists the sampled in-edges of destination ``v``: their sources are the
    local source positions ``indices[indptr[v]:indptr[v + 1]]`` and their graph edge ids are
    ``edge_ids[indptr[v]:indptr[v + 1]]``.

    Attributes
    ----------
    src_nodes : torch.Tensor, int64, shape [S]
        Global ids of the source nodes; the first D are ``dst_nodes``.
    dst_nodes : torch.Tensor, int64, shape [D]
        Global ids of the destination nodes (a view of the prefix of ``src_nodes``).
    indptr : torch.Tensor, int64, shape [D + 1]
        Local CSC row pointer over destinations.
    indices : torch.Tensor, int64, shape [nnz]
        Local source position (into ``src_nodes``) of each sampled edge.
    edge_ids : torch.Tensor, int64, shape [nnz]
        Graph edge id of each sampled edge, aligned with ``indices``.
    """

    src_nodes: torch.Tensor
    dst_nodes: torch.Tensor
    indptr: torch.Tensor
    indices: torch.Tensor
    edge_ids: torch.Tensor

    @property
    def num_src_nodes(self) -> int:
        """S, the number of source nodes."""
        return int(self.src_nodes.shape[0])

    @property
    def num_dst_nodes(self) -> int:
        """D, the number of destination nodes."""
        return int(self.dst_nodes.shape[0])

    @property
    def num_edges(self) -> int:
        """nnz, the number of sampled edges."""
        return int(self.indices.shape[0])

    def in_degrees(self) -> torch.Tensor:
        """Sampled in-degree of every destination: int64, shape [D]."""
        return self.indptr[1:] - self.indptr[:-1]

    def edge_dst(self) -> torch.Tensor:
        """Local destination position of every sampled edge (the COO row): int64, shape [nnz]."""
        return torch.repeat_interleave(torch.arange(self.num_dst_nodes, dtype=torch.int64), self.in_degrees())

    def __repr__(self) -> str:
        return (f"Block(num_src_nodes={self.num_src_nodes}, num_dst_nodes={self.num_dst_nodes}, "
                f"num_edges={self.num_edges})")

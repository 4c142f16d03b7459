"""The message-flow graph (MFG, DGL's "block") that samplers hand to GNN layers.

`Block` is one layer (docs/architecture.md#blocks-and-mfgs); `Blocks` is the list one
`NeighborSampler.sample` call returns. Conversions to and from DGL and PyG live in `samplers.interop`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from samplers.interop import block_to_dgl, blocks_to_pyg, dgl_block_fields, pyg_subgraph_data

__all__ = ["Block", "Blocks"]


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
    src_times : torch.Tensor or None, int64 or float64, shape [S]
        Temporal sampling only: the time each source node carries (a destination's time is the time of
        the seed it serves; a sampled source takes the time of the row that drew it). The same node can
        appear more than once among the sources with different times. ``None`` otherwise.
    edge_weights : torch.Tensor or None, float32, shape [nnz]
        Weights the model should apply to the sampled edges (`samplers.LaborSampler` with importance
        sampling or edge weights: each row's mean is 1, as DGL's ``edata["edge_weights"]``); else None.
    """

    src_nodes: torch.Tensor
    dst_nodes: torch.Tensor
    indptr: torch.Tensor
    indices: torch.Tensor
    edge_ids: torch.Tensor
    src_times: torch.Tensor | None = None
    edge_weights: torch.Tensor | None = None

    @property
    def dst_times(self) -> torch.Tensor | None:
        """Time of each destination row (temporal sampling), the prefix of ``src_times``; else None."""
        return None if self.src_times is None else self.src_times[: self.num_dst_nodes]

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
        rows = torch.arange(self.num_dst_nodes, dtype=torch.int64, device=self.indptr.device)
        return torch.repeat_interleave(rows, self.in_degrees())

    def to_dgl(self):
        """This block as a DGL block (``dgl.create_block``); see `samplers.interop.block_to_dgl`."""
        return block_to_dgl(self)

    @classmethod
    def from_dgl(cls, dgl_block) -> Block:
        """A `Block` from a DGL block; see `samplers.interop.dgl_block_fields` (its Raises included)."""
        return cls(**dgl_block_fields(dgl_block))

    def __repr__(self) -> str:
        return (f"Block(num_src_nodes={self.num_src_nodes}, num_dst_nodes={self.num_dst_nodes}, "
                f"num_edges={self.num_edges})")


class Blocks(list):
    """The blocks of one `NeighborSampler.sample` call (a plain ``list`` of `Block`, outermost first)
    that can also convert themselves to PyG's form with `to_pyg`."""

    def to_pyg(self, input_id: torch.Tensor | None = None):
        """PyG's ``NeighborLoader`` view of these blocks: a ``torch_geometric.data.Data`` when
        torch_geometric is installed, else a `samplers.interop.PygSubgraph`.

        One rule: the type follows whether ``import torch_geometric`` succeeds; both carry the same
        attributes (``edge_index``, ``n_id``, ``e_id``, ``batch_size``, ``num_sampled_nodes``,
        ``num_sampled_edges``, ``num_nodes``; ``input_id`` when given), so code that reads them runs
        on either. A dependency-free result is kept rather than an ImportError because the layout is
        useful without PyG (any model that takes ``edge_index``), and code that needs a real ``Data``
        (a PyG model) cannot run without PyG anyway. See `samplers.interop.blocks_to_pyg` for which rows
        are kept (PyG expands each node once: rows it would not expand are left out).

        Parameters
        ----------
        input_id : torch.Tensor or None, int64, shape [B]
            Index of each seed among the loader's input nodes (``NeighborLoader``'s ``input_id``), where
            the caller knows it; left out of the result when None.

        Returns
        -------
        torch_geometric.data.Data or PygSubgraph

        Raises
        ------
        ValueError
            The blocks are empty or not chained; ``input_id`` is not one id per seed.
        """
        sub = blocks_to_pyg(self)
        if input_id is not None:
            if not isinstance(input_id, torch.Tensor) or input_id.shape != (sub.batch_size,):
                raise ValueError(f"input_id must be a tensor of shape [{sub.batch_size}] (one id per seed), "
                                 f"got {getattr(input_id, 'shape', type(input_id).__name__)}")
            sub = replace(sub, input_id=input_id)
        return pyg_subgraph_data(sub)

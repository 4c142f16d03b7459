"""Blocks to and from DGL, and to PyG's ``edge_index`` form (what `Block.to_dgl`, `Block.from_dgl` and
`Blocks.to_pyg` call).

This module knows blocks only by their fields (docs/architecture.md#blocks-and-mfgs), so `samplers.block`
imports it and never the reverse. DGL: `block_to_dgl` makes a real ``dgl.create_block`` object (DGL
layers such as ``SAGEConv`` and ``GraphConv`` run on it) and `dgl_block_fields` reads one back into the
fields of a `Block` (``Block.from_dgl``). DGL is imported through `graphrl.dglshim.import_dgl` only, and
only when a conversion is asked for.

PyG: `blocks_to_pyg` gives what PyG's ``NeighborLoader`` puts in its ``Data`` batch: ``edge_index``
(row 0 = source, row 1 = target, local ids over ``n_id``), ``n_id``, ``e_id``, ``num_sampled_nodes``
and ``num_sampled_edges`` per hop. PyG (pyg-lib) expands each node once, at the hop after the one that
discovered it; DGL-style blocks sample every destination of every layer. The conversion follows PyG:
hop h takes, from block ``L - h``, the rows of the nodes first discovered at hop h - 1 (the seeds for
hop 1), so a node's edges come from the block of the hop that expands it and nodes reached only from
rows PyG would not expand are left out. With fanout -1 in every layer this is exactly PyG's subgraph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from samplers.block import Block

__all__ = ["PygSubgraph", "block_to_dgl", "blocks_to_pyg", "dgl_block_fields"]


def block_to_dgl(block: Block):
    """Convert a `Block` to a DGL block (``dgl.create_block``) with the same edges in the same order.

    Parameters
    ----------
    block : Block
        The block; its tensors may live on any device (the DGL block is made on that device).

    Returns
    -------
    dgl.DGLGraph
        A block with ``num_src_nodes = S`` and ``num_dst_nodes = D``; edge ``j`` is our edge ``j``
        (source ``block.indices[j]``, destination ``block.edge_dst()[j]``). ``srcdata[dgl.NID]`` and
        ``dstdata[dgl.NID]`` hold the global node ids, ``edata[dgl.EID]`` the graph edge ids, as in the
        blocks of DGL's own samplers.

    Raises
    ------
    ImportError
        DGL is not installed (see `graphrl.dglshim.import_dgl`).

    Examples
    --------
    >>> dgl_blocks = [b.to_dgl() for b in sampler.sample(seeds)]
    >>> h = sage_conv(dgl_blocks[0], x[dgl_blocks[0].srcdata[dgl.NID]])
    """
    from graphrl.dglshim import import_dgl

    dgl = import_dgl()
    dst = torch.repeat_interleave(torch.arange(block.num_dst_nodes, device=block.indptr.device),
                                  block.in_degrees())
    out = dgl.create_block((block.indices, dst), num_src_nodes=block.num_src_nodes,
                           num_dst_nodes=block.num_dst_nodes, idtype=torch.int64,
                           device=block.indices.device)
    out.srcdata[dgl.NID] = block.src_nodes
    out.dstdata[dgl.NID] = block.dst_nodes
    out.edata[dgl.EID] = block.edge_ids
    return out


def dgl_block_fields(dgl_block) -> dict[str, torch.Tensor]:
    """Read a DGL block (one of DGL's samplers' MFGs, or `block_to_dgl`'s output) as a `Block`'s fields.

    Parameters
    ----------
    dgl_block : dgl.DGLGraph
        A block whose first ``num_dst_nodes`` source nodes are its destination nodes (DGL's
        ``to_block`` contract). Global ids come from ``srcdata[dgl.NID]`` / ``dstdata[dgl.NID]`` and
        edge ids from ``edata[dgl.EID]``; without them, local ids and DGL's edge ids are used.

    Returns
    -------
    dict
        ``src_nodes``, ``dst_nodes``, ``indptr``, ``indices``, ``edge_ids`` (``Block(**fields)``); edges
        grouped by destination (a stable sort, so edges of one destination keep DGL's order).

    Raises
    ------
    TypeError
        ``dgl_block`` is not a DGL block.
    ValueError
        Its destination nodes are not the prefix of its source nodes.
    ImportError
        DGL is not installed.
    """
    from graphrl.dglshim import import_dgl

    dgl = import_dgl()
    if not isinstance(dgl_block, dgl.DGLGraph) or not dgl_block.is_block:
        raise TypeError(f"dgl_block must be a DGL block (dgl.create_block / to_block), got "
                        f"{type(dgl_block).__name__}")
    num_src, num_dst = dgl_block.num_src_nodes(), dgl_block.num_dst_nodes()
    src, dst, eid = dgl_block.edges(form="all", order="eid")
    src_nodes = dgl_block.srcdata.get(dgl.NID, torch.arange(num_src)).to(torch.int64)
    dst_nodes = dgl_block.dstdata.get(dgl.NID, torch.arange(num_dst)).to(torch.int64)
    if not torch.equal(src_nodes[:num_dst], dst_nodes):
        raise ValueError("dgl_block: its destination nodes are not the first num_dst_nodes source nodes "
                         "(DGL's to_block contract), so it has no Block form")
    edge_ids = dgl_block.edata.get(dgl.EID, eid).to(torch.int64)
    dst64 = dst.to(torch.int64)
    order = torch.sort(dst64, stable=True).indices
    counts = torch.bincount(dst64, minlength=num_dst)
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(counts, 0, out=indptr[1:])
    return {"src_nodes": src_nodes, "dst_nodes": src_nodes[:num_dst], "indptr": indptr,
            "indices": src.to(torch.int64)[order], "edge_ids": edge_ids[order]}


@dataclass(frozen=True, eq=False)
class PygSubgraph:
    """Sampled subgraph in PyG's ``NeighborLoader`` layout (the attributes of its ``Data`` batch).

    Attributes
    ----------
    edge_index : torch.Tensor, int64, shape [2, nnz]
        Row 0: source (the sampled neighbour), row 1: target (the node that sampled it), both local
        ids into ``n_id``; edges of hop 1 first, then hop 2, and so on.
    n_id : torch.Tensor, int64, shape [n]
        Global node ids; the first ``batch_size`` are the seeds, in order, then the nodes of hop 1 in
        order of discovery, then hop 2, ...
    e_id : torch.Tensor, int64, shape [nnz]
        Graph edge id of each column of ``edge_index``.
    num_sampled_nodes : list[int]
        ``[batch_size, new nodes of hop 1, ..., new nodes of hop L]`` (length L + 1).
    num_sampled_edges : list[int]
        Edges of hop 1, ..., hop L (length L), as PyG's ``trim_to_layer`` expects.
    batch_size : int
        Number of seeds.
    """

    edge_index: torch.Tensor
    n_id: torch.Tensor
    e_id: torch.Tensor
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    batch_size: int

    @property
    def num_nodes(self) -> int:
        """n, the number of nodes of the subgraph."""
        return int(self.n_id.shape[0])


def blocks_to_pyg(blocks: Sequence[Block]) -> PygSubgraph:
    """Convert the blocks of one `NeighborSampler.sample` call to PyG's ``NeighborLoader`` layout.

    Parameters
    ----------
    blocks : sequence of Block
        Outermost first, chained (``blocks[i].dst_nodes == blocks[i + 1].src_nodes``).

    Returns
    -------
    PygSubgraph
        See the module docstring for which rows are kept (PyG expands each node once).

    Raises
    ------
    ValueError
        ``blocks`` is empty or not chained.
    """
    if len(blocks) == 0:
        raise ValueError("blocks must hold at least one block, got none")
    for i in range(len(blocks) - 1):
        if blocks[i].num_dst_nodes != blocks[i + 1].num_src_nodes:
            raise ValueError(f"blocks are not chained: blocks[{i}] has {blocks[i].num_dst_nodes} destination "
                             f"nodes, blocks[{i + 1}] has {blocks[i + 1].num_src_nodes} source nodes")
    device = blocks[0].src_nodes.device
    # One id space for the whole chain: position p of blocks[0].src_nodes is row p of every block that
    # has p among its destinations, and source p of every block that has p among its sources.
    num_layers = len(blocks)
    batch = blocks[-1].num_dst_nodes
    total = blocks[0].num_src_nodes
    newpos = np.full(total, -1, dtype=np.int64)
    newpos[:batch] = np.arange(batch)
    count = batch
    frontier = np.arange(batch, dtype=np.int64)
    num_nodes, num_edges = [batch], []
    src_parts, dst_parts, eid_parts = [], [], []
    for hop in range(1, num_layers + 1):
        block = blocks[num_layers - hop]
        indptr = block.indptr.cpu().numpy()
        starts = indptr[frontier]
        lens = indptr[frontier + 1] - starts
        nnz = int(lens.sum())
        offsets = np.cumsum(lens) - lens
        epos = np.repeat(starts - offsets, lens) + np.arange(nnz, dtype=np.int64)
        src = block.indices.cpu().numpy()[epos]
        unseen = src[newpos[src] < 0]
        uniq, first = np.unique(unseen, return_index=True)
        new = uniq[np.argsort(first, kind="stable")]
        newpos[new] = count + np.arange(new.shape[0], dtype=np.int64)
        count += int(new.shape[0])
        src_parts.append(newpos[src])
        dst_parts.append(newpos[np.repeat(frontier, lens)])
        eid_parts.append(block.edge_ids.cpu().numpy()[epos])
        num_nodes.append(int(new.shape[0]))
        num_edges.append(nnz)
        frontier = new
    order = np.empty(count, dtype=np.int64)
    assigned = np.flatnonzero(newpos >= 0)
    order[newpos[assigned]] = assigned
    n_id = blocks[0].src_nodes[torch.from_numpy(order).to(device)]
    edge_index = torch.from_numpy(np.stack([np.concatenate(src_parts), np.concatenate(dst_parts)])).to(device)
    e_id = torch.from_numpy(np.concatenate(eid_parts)).to(device)
    return PygSubgraph(edge_index=edge_index, n_id=n_id, e_id=e_id, num_sampled_nodes=num_nodes,
                       num_sampled_edges=num_edges, batch_size=batch)

"""Blocks to and from DGL, and to PyG's ``edge_index`` form (what `Block.to_dgl`, `Block.from_dgl` and
`Blocks.to_pyg` call).

This module knows blocks only by their fields (docs/architecture.md#blocks-and-mfgs), so `samplers.block`
imports it and never the reverse. DGL: `block_to_dgl` makes a real ``dgl.create_block`` object (DGL
layers such as ``SAGEConv`` and ``GraphConv`` run on it) and `dgl_block_fields` reads one back into the
fields of a `Block` (``Block.from_dgl``). DGL is imported through `graphrl.dglshim.import_dgl` only, and
only when a conversion is asked for.

PyG: `blocks_to_pyg` gives what PyG's ``NeighborLoader`` puts in its ``Data`` batch: ``edge_index``
(row 0 = source, row 1 = target, local ids over ``n_id``), ``n_id``, ``e_id``, ``batch_size``,
``num_sampled_nodes`` and ``num_sampled_edges`` per hop, as a `PygSubgraph`; `pyg_subgraph_data` makes
that a real ``torch_geometric.data.Data`` when PyG is installed (`Blocks.to_pyg`).
`hetero_blocks_to_pyg` does the same for `HeteroBlock` chains, in the dict layout of PyG's
``HeteroSamplerOutput``. PyG (pyg-lib) expands each node once, at the hop after the one that
discovered it; DGL-style blocks sample every destination of every layer. The conversion
(`expand_once`) follows PyG: hop h takes, from block ``L - h``, the rows of the nodes first discovered
at hop h - 1 (the seeds for hop 1; per relation, in PyG's edge-type order, for heterogeneous blocks),
so a node's edges come from the block of the hop that expands it and nodes reached only from rows PyG
would not expand are left out. With fanout -1 in every layer this is exactly PyG's subgraph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from samplers.block import Block

__all__ = ["PygSubgraph", "block_to_dgl", "blocks_to_pyg", "check_chained", "dgl_block_fields", "expand_once",
           "hetero_block_to_dgl", "hetero_blocks_to_pyg", "pyg_data_class", "pyg_subgraph_data"]


def block_to_dgl(block: Block, idtype: torch.dtype = torch.int64):
    """Convert a `Block` to a DGL block (``dgl.create_block``) with the same edges in the same order.

    Parameters
    ----------
    block : Block
        The block; its tensors may live on any device (the DGL block is made on that device).
    idtype : torch.int64 or torch.int32
        The DGL block's id type; the NID / EID fields are cast to it, as DGL's samplers do on a graph of
        that ``idtype``.

    Returns
    -------
    dgl.DGLGraph
        A block with ``num_src_nodes = S`` and ``num_dst_nodes = D``; edge ``j`` is our edge ``j``
        (source ``block.indices[j]``, destination ``block.edge_dst()[j]``). ``srcdata[dgl.NID]`` and
        ``dstdata[dgl.NID]`` hold the global node ids, ``edata[dgl.EID]`` the graph edge ids, as in the
        blocks of DGL's own samplers; ``edata["edge_weights"]`` holds ``block.edge_weights`` when set
        (as DGL's ``LaborSampler``).

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
                           num_dst_nodes=block.num_dst_nodes, idtype=idtype,
                           device=block.indices.device)
    out.srcdata[dgl.NID] = block.src_nodes.to(idtype)
    out.dstdata[dgl.NID] = block.dst_nodes.to(idtype)
    out.edata[dgl.EID] = block.edge_ids.to(idtype)
    if block.edge_weights is not None:  # LaborSampler's importance weights, DGL's key
        out.edata["edge_weights"] = block.edge_weights
    return out


def hetero_block_to_dgl(block, relations: Sequence, idtype: torch.dtype = torch.int64):
    """Convert a `HeteroBlock` to a heterogeneous DGL block with the same edges in the same order.

    Parameters
    ----------
    block : HeteroBlock
    relations : sequence of (str, str, str)
        Every canonical edge type of the DGL graph sampled (a relation the block did not sample gets
        no edges, as in DGL's blocks).
    idtype : torch.int64 or torch.int32

    Returns
    -------
    dgl.DGLGraph
        A block with ``num_src_nodes`` / ``num_dst_nodes`` per node type; ``srcnodes[t].data[dgl.NID]``,
        ``dstnodes[t].data[dgl.NID]`` and ``edges[r].data[dgl.EID]`` hold the ids within each type and
        relation (edge j of relation r is the block's edge j); ``edges[r].data["edge_weights"]`` holds
        ``block.edge_weights[r]`` where set (`LaborSampler`'s importance weights, DGL's key).

    Raises
    ------
    ImportError
        DGL is not installed.
    """
    from graphrl.dglshim import import_dgl

    dgl = import_dgl()
    device = next(iter(block.src_nodes.values())).device
    data = {}
    for rel in relations:
        if rel in block.indptr:
            data[rel] = (block.indices[rel].to(torch.int64), block.edge_dst(rel))
        else:
            empty = torch.empty(0, dtype=torch.int64, device=device)
            data[rel] = (empty, empty)
    out = dgl.create_block(data, num_src_nodes={t: int(v.shape[0]) for t, v in block.src_nodes.items()},
                           num_dst_nodes={t: int(v.shape[0]) for t, v in block.dst_nodes.items()},
                           idtype=idtype, device=device)
    for t in block.src_nodes:
        out.srcnodes[t].data[dgl.NID] = block.src_nodes[t].to(idtype)
        out.dstnodes[t].data[dgl.NID] = block.dst_nodes[t].to(idtype)
    for rel in relations:
        eids = block.edge_ids.get(rel, torch.empty(0, dtype=torch.int64, device=device))
        out.edges[rel].data[dgl.EID] = eids.to(idtype)
        if block.edge_weights is not None and rel in block.edge_weights:
            out.edges[rel].data["edge_weights"] = block.edge_weights[rel]
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
    """Sampled subgraph in PyG's ``NeighborLoader`` layout (the attributes of its ``Data`` batch), the
    form `Blocks.to_pyg` gives where torch_geometric is not installed.

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
    input_id : torch.Tensor or None, int64, shape [batch_size]
        Index of each seed among the loader's input nodes, where the caller knows it; else None.
    """

    edge_index: torch.Tensor
    n_id: torch.Tensor
    e_id: torch.Tensor
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    batch_size: int
    input_id: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        """n, the number of nodes of the subgraph."""
        return int(self.n_id.shape[0])


def expand_once(layers: Sequence[dict], src_nodes: dict, num_seeds: dict, relations: Sequence) -> tuple:
    """PyG's expand-each-node-once view of a chain of (heterogeneous) layers, per node type and relation.

    Parameters
    ----------
    layers : sequence of dict Relation -> (indptr, indices, edge_ids)
        Hop 1 first (the innermost block first); numpy int arrays of one block's local CSC per relation:
        ``indptr`` over the block's destinations of ``relation[2]``, ``indices`` local positions into
        its sources of ``relation[0]``, ``edge_ids`` the graph edge ids.
    src_nodes : dict str -> torch.Tensor, int64
        Per node type, the sources of the outermost block: the id space of the whole chain (position
        p of type t is row p of every block with p among its destinations of type t).
    num_seeds : dict str -> int
        Per node type, the seeds (the first ``num_seeds[t]`` positions).
    relations : sequence of Relation
        The order in which each hop expands the relations (PyG's ``edge_types`` order).

    Returns
    -------
    tuple
        ``(node, row, col, edge, num_sampled_nodes, num_sampled_edges)``: ``node[t]`` int64 tensor of
        global ids (seeds first, then each hop's new nodes in order of discovery); ``row[r]`` / ``col[r]``
        local ids into ``node[r[0]]`` / ``node[r[2]]``; ``edge[r]`` edge ids; ``num_sampled_nodes[t]``
        L + 1 ints; ``num_sampled_edges[r]`` L ints. Tensors on the device of ``src_nodes``.
    """
    newpos = {t: np.full(int(v.shape[0]), -1, dtype=np.int64) for t, v in src_nodes.items()}
    count = dict(num_seeds)
    frontier = {t: np.arange(count[t], dtype=np.int64) for t in src_nodes}
    for t in src_nodes:
        newpos[t][: count[t]] = frontier[t]
    num_nodes = {t: [count[t]] for t in src_nodes}
    num_edges = {r: [] for r in relations}
    parts = {r: ([], [], []) for r in relations}
    for layer in layers:
        found = {t: [] for t in src_nodes}
        for rel in relations:
            s_type, _, d_type = rel
            if rel not in layer:
                num_edges[rel].append(0)
                continue
            indptr, indices, eids = layer[rel]
            rows = frontier[d_type]
            starts = indptr[rows]
            lens = indptr[rows + 1] - starts
            nnz = int(lens.sum())
            epos = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(nnz, dtype=np.int64)
            src = indices[epos]
            unseen = src[newpos[s_type][src] < 0]
            uniq, first = np.unique(unseen, return_index=True)
            new = uniq[np.argsort(first, kind="stable")]
            newpos[s_type][new] = count[s_type] + np.arange(new.shape[0], dtype=np.int64)
            count[s_type] += int(new.shape[0])
            found[s_type].append(new)
            parts[rel][0].append(newpos[s_type][src])
            parts[rel][1].append(newpos[d_type][np.repeat(rows, lens)])
            parts[rel][2].append(eids[epos])
            num_edges[rel].append(nnz)
        for t in src_nodes:
            frontier[t] = np.concatenate(found[t]) if found[t] else np.empty(0, dtype=np.int64)
            num_nodes[t].append(int(frontier[t].shape[0]))
    node = {}
    for t, ids in src_nodes.items():
        order = np.empty(count[t], dtype=np.int64)
        assigned = np.flatnonzero(newpos[t] >= 0)
        order[newpos[t][assigned]] = assigned
        node[t] = ids[torch.from_numpy(order).to(ids.device)]
    row, col, edge = {}, {}, {}
    for rel, (r_parts, c_parts, e_parts) in parts.items():
        device = src_nodes[rel[0]].device
        for out, chunks in ((row, r_parts), (col, c_parts), (edge, e_parts)):
            flat = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)
            out[rel] = torch.from_numpy(flat.astype(np.int64, copy=False)).to(device)
    return node, row, col, edge, num_nodes, num_edges


def check_chained(blocks: Sequence, num_dst, num_src) -> None:
    """Raise ValueError unless ``blocks`` is non-empty and chained:
    ``num_dst(blocks[i]) == num_src(blocks[i + 1])``."""
    if len(blocks) == 0:
        raise ValueError("blocks must hold at least one block, got none")
    for i in range(len(blocks) - 1):
        if num_dst(blocks[i]) != num_src(blocks[i + 1]):
            raise ValueError(f"blocks are not chained: blocks[{i}] has {num_dst(blocks[i])} destination "
                             f"nodes, blocks[{i + 1}] has {num_src(blocks[i + 1])} source nodes")


_HOMO = ("node", "to", "node")  # the one relation of a homogeneous chain, for `expand_once`


def blocks_to_pyg(blocks: Sequence[Block]) -> PygSubgraph:
    """Convert the blocks of one `NeighborSampler.sample` call to PyG's ``NeighborLoader`` layout.

    Parameters
    ----------
    blocks : sequence of Block
        Outermost first, chained (``blocks[i].dst_nodes == blocks[i + 1].src_nodes``).

    Returns
    -------
    PygSubgraph
        See the module docstring for which rows are kept (PyG expands each node once); ``input_id``
        None.

    Raises
    ------
    ValueError
        ``blocks`` is empty or not chained.
    """
    check_chained(blocks, lambda b: b.num_dst_nodes, lambda b: b.num_src_nodes)
    layers = [{_HOMO: (b.indptr.cpu().numpy(), b.indices.cpu().numpy(), b.edge_ids.cpu().numpy())}
              for b in reversed(blocks)]
    node, row, col, edge, nodes, edges = expand_once(layers, {"node": blocks[0].src_nodes},
                                                     {"node": blocks[-1].num_dst_nodes}, [_HOMO])
    return PygSubgraph(edge_index=torch.stack([row[_HOMO], col[_HOMO]]), n_id=node["node"], e_id=edge[_HOMO],
                       num_sampled_nodes=nodes["node"], num_sampled_edges=edges[_HOMO],
                       batch_size=blocks[-1].num_dst_nodes)


def hetero_blocks_to_pyg(blocks: Sequence, relations: Sequence) -> tuple:
    """Convert the `HeteroBlock` list of one `HeteroNeighborSampler.sample` call to the layout of PyG's
    heterogeneous ``NeighborSampler`` (pyg-lib's ``hetero_neighbor_sample``).

    Each hop expands, relation by relation in ``relations`` order, the nodes of the relation's
    destination type first found at the previous hop (the seeds for hop 1), as pyg-lib does.

    Parameters
    ----------
    blocks : sequence of HeteroBlock
        Outermost first, chained per node type.
    relations : sequence of Relation
        Every relation of the output, in PyG's ``edge_types`` order; a relation the blocks do not
        sample gets no edges.

    Returns
    -------
    tuple
        ``(node, row, col, edge, num_sampled_nodes, num_sampled_edges)`` as `expand_once` (dicts keyed
        by node type / relation, as the fields of PyG's ``HeteroSamplerOutput``).

    Raises
    ------
    ValueError
        ``blocks`` is empty or not chained.
    """
    check_chained(blocks, lambda b: {t: int(v.shape[0]) for t, v in b.dst_nodes.items()},
                  lambda b: {t: int(v.shape[0]) for t, v in b.src_nodes.items()})
    layers = [{rel: (b.indptr[rel].cpu().numpy(), b.indices[rel].cpu().numpy(), b.edge_ids[rel].cpu().numpy())
               for rel in b.indptr} for b in reversed(blocks)]
    seeds = {t: int(v.shape[0]) for t, v in blocks[-1].dst_nodes.items()}
    return expand_once(layers, dict(blocks[0].src_nodes), seeds, list(relations))


def pyg_data_class():
    """``torch_geometric.data.Data``, or None when torch_geometric is not installed."""
    try:
        import torch_geometric
    except ModuleNotFoundError as err:
        if err.name != "torch_geometric":
            raise
        return None
    return torch_geometric.data.Data


def pyg_subgraph_data(sub: PygSubgraph):
    """``sub`` as a ``torch_geometric.data.Data`` with its attributes (``input_id`` only where not None),
    or ``sub`` itself when torch_geometric is not installed (see `samplers.block.Blocks.to_pyg`)."""
    data_cls = pyg_data_class()
    if data_cls is None:
        return sub
    data = data_cls(edge_index=sub.edge_index, n_id=sub.n_id, e_id=sub.e_id)
    data.batch_size = sub.batch_size
    data.num_sampled_nodes = list(sub.num_sampled_nodes)
    data.num_sampled_edges = list(sub.num_sampled_edges)
    if sub.input_id is not None:
        data.input_id = sub.input_id
    return data

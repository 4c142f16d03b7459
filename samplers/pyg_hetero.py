"""`PygSampler` on a ``torch_geometric.data.HeteroData``: our `HeteroNeighborSampler` behind PyG's loaders.

`PygHeteroSampling` holds what `samplers.PygSampler` needs for a heterogeneous graph: the
`HeteroGraph` built from the ``HeteroData`` (one relation per PyG edge type, in ``data.edge_types``
order; edge j of a type is column j of its ``edge_index``), the `HeteroNeighborSampler` that draws the
blocks, and `PygHeteroSampling.sample`, which returns PyG's ``HeteroSamplerOutput`` laid out as PyG's
own heterogeneous ``NeighborSampler`` (pyg-lib's ``hetero_neighbor_sample``) lays it out: ``node``
per node type (seeds first, then each hop's new nodes in order of discovery), ``row`` / ``col`` /
``edge`` per edge type (local source / target ids into ``node[src]`` / ``node[dst]``, edge ids),
``num_sampled_nodes`` per node type (L + 1 ints) and ``num_sampled_edges`` per edge type (L ints).
Each hop expands, edge type by edge type, the nodes found at the previous hop
(`samplers.interop.hetero_blocks_to_pyg`). `check_num_neighbors` checks a homogeneous hop list and
`hetero_num_neighbors` PyG's per-edge-type form (a list for every edge type, or a dict).

Use (through `PygSampler`)::

    sampler = PygSampler(hetero_data, num_neighbors=[10, 5], seed=0)
    loader = NodeLoader(hetero_data, node_sampler=sampler, input_nodes=("user", idx), batch_size=64)

References
----------
PyG's ``NeighborSampler`` for ``HeteroData`` and pyg-lib's ``hetero_neighbor_sample`` (output layout);
DGL's heterogeneous MFGs (how our blocks are drawn, `samplers.hetero`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from samplers._optional import import_pyg
from samplers.hetero import HeteroGraph, HeteroNeighborSampler
from samplers.interop import hetero_blocks_to_pyg

__all__ = ["PygHeteroSampling", "check_num_neighbors", "hetero_num_neighbors"]


def check_num_neighbors(name: str, hops) -> list[int]:
    """A hop list (hop 1 first) checked: a non-empty sequence of ints >= -1, returned as ``list[int]``.

    Raises
    ------
    TypeError
        Not a sequence, or an entry that is not an int.
    ValueError
        Empty, or an entry below -1.
    """
    if isinstance(hops, (str, bytes)) or not isinstance(hops, Sequence):
        raise TypeError(f"{name} must be a sequence of ints such as [15, 10], got {hops!r}")
    out = list(hops)
    if not out:
        raise ValueError(f"{name} must have at least one hop, got []")
    for i, k in enumerate(out):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"{name}[{i}] must be an int, got {k!r}")
        if k < -1:
            raise ValueError(f"{name}[{i}]={k}: must be >= 0, or -1 for every neighbour")
    return [int(k) for k in out]


def hetero_num_neighbors(num_neighbors, edge_types: list) -> dict:
    """PyG's ``num_neighbors`` for a heterogeneous graph as ``{edge_type: [hop 1, ..., hop L]}``.

    Parameters
    ----------
    num_neighbors : sequence of int, or mapping edge type -> sequence of int
        One list for every edge type, or one per edge type (keys ``(src, rel, dst)`` or PyG's
        ``"src__rel__dst"`` strings); every edge type needs one, all of one length (as PyG's
        ``NumNeighbors``).
    edge_types : list of (str, str, str)
        The graph's edge types, in order (the order of the returned dict).

    Raises
    ------
    TypeError, ValueError
        As `check_num_neighbors` per list; an unknown or missing edge type; lists of different lengths.
    """
    if not isinstance(num_neighbors, Mapping):
        hops = check_num_neighbors("num_neighbors", num_neighbors)
        return {et: list(hops) for et in edge_types}
    given = {}
    for key, hops in num_neighbors.items():
        et = tuple(key.split("__")) if isinstance(key, str) else key
        if et not in edge_types:
            raise ValueError(f"num_neighbors: unknown edge type {key!r} (data has {edge_types})")
        given[et] = check_num_neighbors(f"num_neighbors[{et!r}]", hops)
    missing = [et for et in edge_types if et not in given]
    if missing:
        raise ValueError(f"num_neighbors: no number of neighbours for edge types {missing} (a dict must "
                         f"name every edge type, as PyG's NumNeighbors; or pass one list for all)")
    if len({len(v) for v in given.values()}) > 1:
        raise ValueError(f"num_neighbors: every edge type needs the same number of hops, got {given}")
    return {et: given[et] for et in edge_types}


class PygHeteroSampling:
    """Neighbour sampling of a ``HeteroData`` for `samplers.PygSampler`, in PyG's heterogeneous layout.

    Parameters
    ----------
    data : torch_geometric.data.HeteroData
        Every node type with ``num_nodes``; every edge type with ``edge_index`` int64 [2, E_r] (row 0
        source ids of ``src``, row 1 target ids of ``dst``; a node samples its in-edges).
    num_neighbors : sequence of int, or mapping edge type -> sequence of int
        Hop 1 first; see `hetero_num_neighbors`.
    replace : bool
        Draw with replacement.
    seed : int
        Seed of the draws.
    weight_attr : str or None
        An edge attribute (float [E_r]) to draw by, on the edge types that have it (the others draw
        uniformly); ``None`` draws uniformly.

    Raises
    ------
    TypeError, ValueError
        ``num_neighbors`` as `hetero_num_neighbors`; no edge types; a node type without ``num_nodes``,
        an edge type without ``edge_index``; ``weight_attr`` on no edge type; ids out of range
        (`HeteroGraph`).
    """

    def __init__(self, data, num_neighbors, replace: bool, seed: int, weight_attr: str | None) -> None:
        self.node_types, self.edge_types = (list(x) for x in data.metadata())
        """PyG's node and edge types, in ``data.metadata()`` order."""
        if not self.edge_types:
            raise ValueError("data (HeteroData) has no edge types: PygSampler samples a graph's edges")
        self.num_nodes = {}
        """Nodes of each type."""
        for t in self.node_types:
            if data[t].num_nodes is None:
                raise ValueError(f"data[{t!r}] has no num_nodes (set data[{t!r}].num_nodes or node features)")
            self.num_nodes[t] = int(data[t].num_nodes)
        edges, weights = {}, {}
        for et in self.edge_types:
            store = data[et]
            if "edge_index" not in store:
                raise ValueError(f"data[{et!r}] has no edge_index: PygSampler samples a graph's edges")
            edges[et] = (store.edge_index[0], store.edge_index[1])
            if weight_attr is not None and weight_attr in store:
                weights[et] = store[weight_attr]
        if weight_attr is not None and not weights:
            raise ValueError(f"weight_attr={weight_attr!r} names no edge attribute of any edge type of data")
        self.num_neighbors = hetero_num_neighbors(num_neighbors, self.edge_types)
        """``{edge_type: [hop 1, ..., hop L]}``."""
        self.graph = HeteroGraph.from_edges(self.num_nodes, edges, weights=weights or None)
        """Our `HeteroGraph` of ``data`` (relation = PyG edge type)."""
        fanouts = {et: ks[::-1] for et, ks in self.num_neighbors.items()}
        self.sampler = HeteroNeighborSampler(self.graph, fanouts, replace=replace, seed=seed,
                                             weights=True if weights else None)
        """The `HeteroNeighborSampler` that draws the blocks (fanouts outermost first)."""

    def sample(self, seeds: Mapping[str, torch.Tensor]):
        """Sample the multi-hop subgraph of ``seeds`` as PyG's ``HeteroSamplerOutput`` (no metadata).

        Parameters
        ----------
        seeds : mapping str -> torch.Tensor, int64, shape [B_t]
            Seed ids per node type (PyG's loaders seed one type); ``node[t][:B_t]`` of the output.

        Returns
        -------
        torch_geometric.sampler.HeteroSamplerOutput
            See the module docstring; ``batch=None``. Every node type and edge type has an entry.

        Raises
        ------
        TypeError, ValueError
            Seeds of an unknown type or out of range (see `HeteroNeighborSampler.sample`).
        """
        pyg = import_pyg()
        blocks = self.sampler.sample({t: s.to(torch.int64) for t, s in seeds.items()})
        node, row, col, edge, nodes, edges = hetero_blocks_to_pyg(blocks, self.edge_types)
        return pyg.sampler.HeteroSamplerOutput(node=node, row=row, col=col, edge=edge, batch=None,
                                               num_sampled_nodes=nodes, num_sampled_edges=edges)

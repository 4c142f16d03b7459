"""Heterogeneous graphs: node counts per type and one CSC of in-edges per relation.

A relation ``(src_type, name, dst_type)`` stores the in-edges of every ``dst_type`` node from
``src_type`` nodes; ids are per node type (0..num_nodes[type] - 1). `HeteroGraph.from_edges` builds and
validates one from per-relation edge lists; `lastfm_hetero_graph` builds the LastFM data set's.
`samplers.hetero.HeteroNeighborSampler` samples it (docs/architecture.md#graph-storage).

References
----------
DGL's heterogeneous graphs (``dgl.heterograph``: one edge type per relation triple).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from samplers._checks import MAX_NODES, check_int, check_relation_dict
from samplers._csc import csc_weights

__all__ = ["HeteroGraph", "Relation", "lastfm_hetero_graph"]

Relation = tuple[str, str, str]
"""(source node type, relation name, destination node type)."""


def _ids(name: str, value) -> np.ndarray:
    arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr  # in its own dtype: checked in range before the int64 cast (a uint64 id prints as given)


@dataclass(frozen=True, eq=False)
class HeteroGraph:
    """A heterogeneous graph: node counts per type and, per relation, the CSC of its in-edges.

    Attributes
    ----------
    num_nodes : dict[str, int]
        Nodes of each type.
    relations : list[Relation]
        The relations, in a fixed order (the order of sampling and of relabelling).
    indptr : dict[Relation, torch.Tensor], int64, shape [num_nodes[dst_type] + 1]
    indices : dict[Relation, torch.Tensor], int32 or int64, shape [E_r]
        Source node (id within ``src_type``) of the edge at each CSC position.
    edge_ids : dict[Relation, torch.Tensor], int64, shape [E_r]
        Id of the edge at each CSC position: its index in the relation's input edge list.

    Use `from_edges`: it validates once.
    """

    num_nodes: dict[str, int]
    relations: list[Relation]
    indptr: dict[Relation, torch.Tensor]
    indices: dict[Relation, torch.Tensor]
    edge_ids: dict[Relation, torch.Tensor]
    weights: dict[Relation, torch.Tensor] = field(default_factory=dict)
    """float32 [E_r] in CSC order, for the relations built with weights (``weights=True`` samples by
    them)."""

    @classmethod
    def from_edges(cls, num_nodes: Mapping[str, int], edges: Mapping[Relation, tuple],
                   weights: Mapping[Relation, object] | None = None) -> HeteroGraph:
        """Build from per-relation edge lists; edge i of relation r is ``src[i] -> dst[i]``, with id i.

        Parameters
        ----------
        num_nodes : mapping str -> int
            Nodes of each type.
        edges : mapping Relation -> (src, dst)
            Per relation, source ids (of ``src_type``) and destination ids (of ``dst_type``), integer
            arrays or tensors of one length.
        weights : mapping Relation -> torch.Tensor (float, shape [E_r]), or None
            Edge weights of some relations, indexed by relation edge id (finite, >= 0); kept in CSC
            order as float32.

        Returns
        -------
        HeteroGraph
            Within a destination, in-edges keep their input order.

        Raises
        ------
        ValueError
            A relation names an unknown node type, is not a triple, its lengths differ, or an id is out
            of its type's range; a node count outside [0, 2**63 - 1]; ``weights`` names an unknown
            relation, or has the wrong length or a negative, NaN or infinite weight (the message names
            the relation).
        TypeError
            Non-integer ids, or a node count that is not an int (bools and floats included).

        Examples
        --------
        >>> g = HeteroGraph.from_edges({"user": 3, "artist": 2},
        ...     {("user", "listens", "artist"): ([0, 2], [1, 1]),
        ...      ("artist", "heard_by", "user"): ([1, 1], [0, 2])})
        """
        counts = {str(t): check_int(f"num_nodes[{str(t)!r}]", n, 0, MAX_NODES) for t, n in num_nodes.items()}
        rels: list[Relation] = []
        indptr, indices, edge_ids = {}, {}, {}
        for rel, pair in edges.items():
            if not (isinstance(rel, tuple) and len(rel) == 3):
                raise ValueError(f"relation {rel!r} must be a (src_type, name, dst_type) triple")
            s_type, _, d_type = rel
            for t in (s_type, d_type):
                if t not in counts:
                    raise ValueError(f"relation {rel!r}: unknown node type {t!r} "
                                     f"(num_nodes has {sorted(counts)})")
            src, dst = _ids(f"{rel} src", pair[0]), _ids(f"{rel} dst", pair[1])
            if src.shape != dst.shape:
                raise ValueError(f"relation {rel!r}: src and dst lengths differ ({src.size} and {dst.size})")
            for name, ids, n in ((f"{rel} src", src, counts[s_type]), (f"{rel} dst", dst, counts[d_type])):
                bad = (ids < 0) | (ids >= n)
                if bad.any():
                    raise ValueError(f"{name}: {int(bad.sum())} of {ids.size} ids outside [0, {n}), "
                                     f"first {int(ids[np.argmax(bad)])}")
            src, dst = src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)
            order = np.argsort(dst, kind="stable")
            ptr = np.zeros(counts[d_type] + 1, dtype=np.int64)
            np.cumsum(np.bincount(dst, minlength=counts[d_type]), out=ptr[1:])
            idx_dtype = np.int32 if counts[s_type] <= np.iinfo(np.int32).max else np.int64
            rels.append(rel)
            indptr[rel] = torch.from_numpy(ptr)
            indices[rel] = torch.from_numpy(src[order].astype(idx_dtype))
            edge_ids[rel] = torch.from_numpy(order.astype(np.int64))
        w_csc = {}
        for rel, w in check_relation_dict("weights", weights, rels).items():
            w_csc[rel] = torch.from_numpy(csc_weights(f"weights[{rel!r}]", w, int(indices[rel].shape[0]),
                                                      edge_ids[rel].numpy()))
        return cls(num_nodes=counts, relations=rels, indptr=indptr, indices=indices, edge_ids=edge_ids,
                   weights=w_csc)

    @property
    def node_types(self) -> list[str]:
        """The node types, sorted."""
        return sorted(self.num_nodes)

    def num_edges(self, relation: Relation) -> int:
        """Edges of one relation."""
        return int(self.indices[relation].shape[0])


def lastfm_hetero_graph(dataset) -> HeteroGraph:
    """The LastFM data (`graphrl.datasets.load_lastfm`) as a heterogeneous graph.

    Node types ``user`` and ``artist``; relations ``("user", "listens", "artist")`` (training
    interaction i is edge i), ``("artist", "heard_by", "user")`` (its reverse, same ids) and
    ``("user", "friends", "user")`` (edge i is row i of the friendship file).

    Parameters
    ----------
    dataset : InteractionDataset
        From `graphrl.datasets.load_lastfm`.

    Returns
    -------
    HeteroGraph
    """
    users = _ids("train_users", dataset.train_users)
    items = _ids("train_items", dataset.train_items)
    friends = dataset.extra["friends"]
    f_eids = friends.csc_edge_ids().numpy()
    f_src = np.empty(friends.num_edges, dtype=np.int64)
    f_dst = np.empty(friends.num_edges, dtype=np.int64)
    f_src[f_eids] = friends.indices.numpy()
    f_dst[f_eids] = np.repeat(np.arange(friends.num_nodes), friends.in_degrees().numpy())
    return HeteroGraph.from_edges(
        {"user": dataset.num_users, "artist": dataset.num_items},
        {("user", "listens", "artist"): (users, items), ("artist", "heard_by", "user"): (items, users),
         ("user", "friends", "user"): (f_src, f_dst)})

"""Heterogeneous graphs: one CSC per relation, fanouts per relation, one block per layer with a CSC per
relation (DGL's heterogeneous MFGs).

A relation ``(src_type, name, dst_type)`` stores the in-edges of every ``dst_type`` node from
``src_type`` nodes; ids are per node type (0..num_nodes[type] - 1). Sampling a layer draws, for every
relation, from the relation's CSC for the layer's destination nodes of its ``dst_type`` (the same
kernels and rules as `samplers.NeighborSampler`, each relation with its own random stream), then
relabels per node type: the sources of type S are the layer's destinations of type S followed by the
new nodes of type S sampled through any relation, in first-occurrence order (relations taken in the
graph's order). The sources of each type are the next layer's destinations of that type.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from samplers.kernels import cpu
from samplers.kernels.reference import mix
from samplers.neighbor import check_seeds

__all__ = ["HeteroGraph", "HeteroBlock", "HeteroNeighborSampler", "Relation"]

Relation = tuple[str, str, str]
"""(source node type, relation name, destination node type)."""


def _ids(name: str, value) -> np.ndarray:
    arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


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

    @classmethod
    def from_edges(cls, num_nodes: Mapping[str, int], edges: Mapping[Relation, tuple]) -> HeteroGraph:
        """Build from per-relation edge lists; edge i of relation r is ``src[i] -> dst[i]``, with id i.

        Parameters
        ----------
        num_nodes : mapping str -> int
            Nodes of each type.
        edges : mapping Relation -> (src, dst)
            Per relation, source ids (of ``src_type``) and destination ids (of ``dst_type``), integer
            arrays or tensors of one length.

        Returns
        -------
        HeteroGraph
            Within a destination, in-edges keep their input order.

        Raises
        ------
        ValueError
            A relation names an unknown node type, is not a triple, its lengths differ, or an id is out
            of its type's range; a negative node count.
        TypeError
            Non-integer ids.

        Examples
        --------
        >>> g = HeteroGraph.from_edges({"user": 3, "artist": 2},
        ...     {("user", "listens", "artist"): ([0, 2], [1, 1]),
        ...      ("artist", "heard_by", "user"): ([1, 1], [0, 2])})
        """
        counts = {str(t): int(n) for t, n in num_nodes.items()}
        for t, n in counts.items():
            if n < 0:
                raise ValueError(f"num_nodes[{t!r}] must be >= 0, got {n}")
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
            order = np.argsort(dst, kind="stable")
            ptr = np.zeros(counts[d_type] + 1, dtype=np.int64)
            np.cumsum(np.bincount(dst, minlength=counts[d_type]), out=ptr[1:])
            idx_dtype = np.int32 if counts[s_type] <= np.iinfo(np.int32).max else np.int64
            rels.append(rel)
            indptr[rel] = torch.from_numpy(ptr)
            indices[rel] = torch.from_numpy(src[order].astype(idx_dtype))
            edge_ids[rel] = torch.from_numpy(order.astype(np.int64))
        return cls(num_nodes=counts, relations=rels, indptr=indptr, indices=indices, edge_ids=edge_ids)

    @property
    def node_types(self) -> list[str]:
        """The node types, sorted."""
        return sorted(self.num_nodes)

    def num_edges(self, relation: Relation) -> int:
        """Edges of one relation."""
        return int(self.indices[relation].shape[0])


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
    """

    src_nodes: dict[str, torch.Tensor]
    dst_nodes: dict[str, torch.Tensor]
    indptr: dict[Relation, torch.Tensor]
    indices: dict[Relation, torch.Tensor]
    edge_ids: dict[Relation, torch.Tensor]

    def num_edges(self, relation: Relation | None = None) -> int:
        """Sampled edges of one relation, or of all."""
        if relation is not None:
            return int(self.indices[relation].shape[0])
        return sum(int(t.shape[0]) for t in self.indices.values())

    def edge_dst(self, relation: Relation) -> torch.Tensor:
        """Local destination position of every sampled edge of a relation: int64 [nnz]."""
        ptr = self.indptr[relation]
        return torch.repeat_interleave(torch.arange(ptr.shape[0] - 1, dtype=torch.int64), ptr[1:] - ptr[:-1])

    def to_dgl(self):
        """This block as a DGL heterogeneous block (``dgl.create_block`` with one edge type per relation).

        ``srcnodes[t].data[dgl.NID]`` / ``dstnodes[t].data[dgl.NID]`` hold the ids within each type and
        ``edges[r].data[dgl.EID]`` the relation edge ids; edge j of relation r is our edge j.

        Raises
        ------
        ImportError
            DGL is not installed.
        """
        from graphrl.dglshim import import_dgl

        dgl = import_dgl()
        data = {rel: (self.indices[rel], self.edge_dst(rel)) for rel in self.indices}
        out = dgl.create_block(data, num_src_nodes={t: int(v.shape[0]) for t, v in self.src_nodes.items()},
                               num_dst_nodes={t: int(v.shape[0]) for t, v in self.dst_nodes.items()},
                               idtype=torch.int64)
        for t in self.src_nodes:
            out.srcnodes[t].data[dgl.NID] = self.src_nodes[t]
            out.dstnodes[t].data[dgl.NID] = self.dst_nodes[t]
        for rel in self.indices:
            out.edges[rel].data[dgl.EID] = self.edge_ids[rel]
        return out


class HeteroNeighborSampler:
    """Layer-wise neighbour sampling on a `HeteroGraph`, with a fanout per relation and layer.

    Parameters
    ----------
    graph : HeteroGraph
    fanouts : sequence of int, or mapping Relation -> sequence of int
        Per layer, outermost first (as `NeighborSampler`); one list for every relation, or one list per
        relation (all of one length; a relation left out draws nothing). -1 takes every in-edge.
    replace : bool
        Draw with replacement.
    seed : int or None
        Seed of the random stream; each (call, layer, relation) has its own key.

    Raises
    ------
    TypeError
        ``graph`` is not a `HeteroGraph`; a fanout is not an int.
    ValueError
        Fanout lists of different lengths, empty, or with values below -1; an unknown relation.

    References
    ----------
    DGL's heterogeneous MFGs (``dgl.create_block`` with several edge types) and its per-edge-type
    fanouts in ``dgl.dataloading.NeighborSampler``; Schlichtkrull et al., R-GCN (ESWC 2018).

    Examples
    --------
    >>> sampler = HeteroNeighborSampler(g, {("user", "listens", "artist"): [5, 5],
    ...                                     ("artist", "heard_by", "user"): [5, 5],
    ...                                     ("user", "friends", "user"): [3, 3]}, seed=0)
    >>> blocks = sampler.sample({"user": torch.tensor([0, 7])})
    >>> blocks[-1].dst_nodes["user"]   # tensor([0, 7])
    """

    def __init__(self, graph: HeteroGraph, fanouts, replace: bool = False, seed: int | None = None) -> None:
        if not isinstance(graph, HeteroGraph):
            raise TypeError(f"graph must be a HeteroGraph, got {type(graph).__name__}")
        if isinstance(fanouts, Mapping):
            unknown = [r for r in fanouts if r not in graph.relations]
            if unknown:
                raise ValueError(f"fanouts: unknown relations {unknown} (the graph has {graph.relations})")
            per_rel = {rel: list(fanouts[rel]) for rel in graph.relations if rel in fanouts}
        else:
            per_rel = {rel: list(fanouts) for rel in graph.relations}
        lengths = {len(v) for v in per_rel.values()}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"fanouts: every relation needs the same number (>= 1) of layers, got {per_rel}")
        for rel, ks in per_rel.items():
            for i, k in enumerate(ks):
                if isinstance(k, bool) or int(k) != k:
                    raise TypeError(f"fanouts[{rel}][{i}] must be an int, got {k!r}")
                if k < -1:
                    raise ValueError(f"fanouts[{rel}][{i}]={k}: a fanout must be >= 0, or -1 for every "
                                     "neighbour")
        self.graph = graph
        self.fanouts = {rel: [int(k) for k in ks] for rel, ks in per_rel.items()}
        self.num_layers = lengths.pop()
        self.replace = bool(replace)
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self._calls = 0
        self._lock = threading.Lock()
        self._arrays = {rel: (graph.indptr[rel].numpy(), graph.indices[rel].numpy(),
                              graph.edge_ids[rel].numpy()) for rel in self.fanouts}
        self._maps = {t: np.full(n, -1, dtype=np.int32) for t, n in graph.num_nodes.items()}
        self.sampled_edges = 0
        """Total edges sampled so far."""

    def sample(self, seeds: Mapping[str, torch.Tensor]) -> list[HeteroBlock]:
        """Sample ``num_layers`` heterogeneous blocks for the seeds, outermost first.

        Parameters
        ----------
        seeds : mapping str -> torch.Tensor (int64, shape [B_t])
            Seed nodes per node type (ids within the type); types left out have no seeds.

        Returns
        -------
        list[HeteroBlock]
            ``blocks[-1].dst_nodes[t]`` equals ``seeds[t]`` (empty for other types);
            ``blocks[i].dst_nodes[t]`` equals ``blocks[i + 1].src_nodes[t]``.

        Raises
        ------
        ValueError, TypeError
            An unknown node type; seeds not 1-D integer ids within their type's range.
        """
        dst: dict[str, np.ndarray] = {}
        for t in self.graph.num_nodes:
            dst[t] = np.empty(0, dtype=np.int64)
        for t, s in seeds.items():
            if t not in self.graph.num_nodes:
                raise ValueError(f"seeds: unknown node type {t!r} (the graph has {self.graph.node_types})")
            dst[t] = check_seeds(s, self.graph.num_nodes[t], name=f"seeds[{t!r}]", bound=f"num_nodes[{t!r}]")
        with self._lock:
            call = self._calls
            self._calls += 1
            blocks = []
            for layer in range(self.num_layers - 1, -1, -1):
                block = self._layer(dst, call, layer)
                blocks.append(block)
                dst = {t: v.numpy() for t, v in block.src_nodes.items()}
            blocks.reverse()
            return blocks

    def _layer(self, dst: dict[str, np.ndarray], call: int, layer: int) -> HeteroBlock:
        sampled = {}
        for r, rel in enumerate(self.graph.relations):
            if rel not in self.fanouts:
                continue
            indptr, indices, eids = self._arrays[rel]
            key = mix(cpu.layer_key(self.seed, call, layer) ^ (r + 1))
            sampled[rel] = cpu.sample_layer(indptr, indices, eids, dst[rel[2]], self.fanouts[rel][layer],
                                            self.replace, key)
        src_nodes, local = {}, {}
        for t in self.graph.num_nodes:  # relabel per source type over the relations into it, in order
            rels = [rel for rel in sampled if rel[0] == t]
            flat = np.concatenate([sampled[rel][1] for rel in rels]) if rels else np.empty(0, np.int64)
            nodes, loc = cpu.relabel(dst[t], flat, self._maps[t])
            src_nodes[t] = torch.from_numpy(nodes)
            cuts = np.cumsum([0] + [sampled[rel][1].shape[0] for rel in rels])
            for i, rel in enumerate(rels):
                local[rel] = torch.from_numpy(loc[cuts[i]:cuts[i + 1]])
        self.sampled_edges += sum(int(v[1].shape[0]) for v in sampled.values())
        return HeteroBlock(src_nodes=src_nodes,
                           dst_nodes={t: src_nodes[t][: dst[t].shape[0]] for t in src_nodes},
                           indptr={rel: torch.from_numpy(v[0]) for rel, v in sampled.items()},
                           indices=local,
                           edge_ids={rel: torch.from_numpy(v[2]) for rel, v in sampled.items()})


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

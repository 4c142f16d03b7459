"""Heterogeneous graphs: one CSC per relation, fanouts per relation, one block per layer with a CSC per
relation (DGL's heterogeneous MFGs).

A relation ``(src_type, name, dst_type)`` stores the in-edges of every ``dst_type`` node from
``src_type`` nodes; ids are per node type (0..num_nodes[type] - 1). Sampling a layer draws, for every
relation, from the relation's CSC for the layer's destination nodes of its ``dst_type`` (the same
kernels and rules as `samplers.NeighborSampler`, each relation with its own random stream), then
relabels per node type: the sources of type S are the layer's destinations of type S followed by the
new nodes of type S sampled through any relation, in first-occurrence order (relations taken in the
graph's order). The sources of each type are the next layer's destinations of that type.

``device="cuda"`` runs the same steps with the numba.cuda kernels of `samplers.kernels.cuda` (one
`CudaGraph` per relation, each relation drawn by `sample_layer_cuda` with the CPU path's key; the sources
of a type concatenated on the device and relabelled by one GPU hash table), so CPU and GPU give the same
blocks wherever the homogeneous kernels do (uniform draws, fanout -1; see `NeighborSampler`).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numba
import numpy as np
import torch

from samplers.kernels import cpu
from samplers.kernels.reference import mix
from samplers.neighbor import (
    NeighborSampler,
    _cuda_to_torch,
    check_seed_and_replace,
    check_seed_times,
    check_seeds,
    csc_times,
    csc_weights,
    edge_array,
    excluded_positions,
    inverse_permutation,
)

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


def _relation_dict(name: str, value, relations) -> dict:
    """A mapping keyed by relations of the graph (checked), as a dict; None gives {}."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict keyed by relation (src_type, name, dst_type), got "
                        f"{type(value).__name__}")
    unknown = [rel for rel in value if rel not in relations]
    if unknown:
        raise ValueError(f"{name}: unknown relation {unknown[0]!r} (the graph has {list(relations)})")
    return dict(value)


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
            of its type's range; a negative node count; ``weights`` names an unknown relation, or has
            the wrong length or a negative, NaN or infinite weight (the message names the relation).
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
        w_csc = {}
        for rel, w in _relation_dict("weights", weights, rels).items():
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

    All tensors are on the device that sampled them (CUDA tensors from a ``device="cuda"`` sampler when
    torch has CUDA).
    edge_ids : dict[Relation, torch.Tensor], int64
        Relation edge id of each sampled edge.
    src_times : dict[str, torch.Tensor] or None, int64 or float64
        Temporal sampling: the time of each source node of each type (a node reached at two times is
        two source nodes); else None.
    """

    src_nodes: dict[str, torch.Tensor]
    dst_nodes: dict[str, torch.Tensor]
    indptr: dict[Relation, torch.Tensor]
    indices: dict[Relation, torch.Tensor]
    edge_ids: dict[Relation, torch.Tensor]
    src_times: dict[str, torch.Tensor] | None = None

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

    Each relation is sampled by the homogeneous kernels (`samplers.kernels.cpu.sample_layer`, or
    `samplers.kernels.cuda.sample_layer_cuda` on the GPU) with the options of `samplers.NeighborSampler`,
    checked by the same functions: edge weights, excluded edge ids and edge times per relation follow the
    same rules (the reference's masked rules where a relation has weights or times).

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
    weights : None, True, or mapping Relation -> (None, True, or torch.Tensor float [E_r])
        ``None``: uniform draws. ``True``: every sampled relation that has weights in the graph
        (``HeteroGraph.from_edges(weights=...)``) by them, the others uniformly. A dict: per relation
        ``None`` (uniform, as for a relation left out), ``True`` (the graph's weights) or a tensor of
        weights indexed by relation edge id. An edge of weight 0 is never drawn (as `NeighborSampler`).
    edge_times : None, or mapping Relation -> torch.Tensor (integer or float, [E_r])
        Temporal sampling: edge times per relation, indexed by relation edge id; `sample` then needs
        ``seed_times``. A row of time t draws only edges of time <= t; sources inherit the time of the
        row that drew them, and are deduplicated per type by (node, time). A relation left out of the
        dict is static: its edges are eligible at any time. Times are int64 unless some relation has
        float times, then float64 for all (integer times converted).
    device : str or torch.device
        ``"cpu"`` (numba CPU kernels) or ``"cuda"`` (numba.cuda kernels: one `CudaGraph` per sampled
        relation, with its weights and times, each relation drawn by `sample_layer_cuda` with the CPU
        path's key, and the sources of each node type concatenated on the device and relabelled by one
        GPU hash table, by (node, time) when temporal). Same semantics and, as for `NeighborSampler`,
        the same blocks on both (uniform, weighted, fanout -1; temporal rows without replacement can
        differ where GPU ``log`` rounds differently in the last bit); ``cuda:N`` must name the current
        CUDA device. With CUDA, blocks are CUDA tensors when torch has CUDA, else host tensors (numba's
        simulator).
    uva : bool or None
        ``device="cuda"`` only: read the relations' CSCs in place from page-locked host memory (UVA)
        instead of device copies. ``None``: UVA for each relation whose ``indptr`` is a pinned tensor,
        a device copy for the others. ``True`` copies unpinned arrays once into mapped host memory.

    Raises
    ------
    TypeError
        ``graph`` is not a `HeteroGraph`; a fanout is not an int; ``weights`` or ``edge_times`` is not
        a dict (nor None/True for weights), or holds a non-numeric tensor.
    ValueError
        Fanout lists of different lengths, empty, or with values below -1; an unknown relation (in
        ``fanouts``, ``weights`` or ``edge_times``); per relation, weights or times of the wrong
        length, a negative, NaN or infinite weight, a NaN time, ``True`` for a relation without
        weights, ``weights=True`` where no sampled relation has weights (each message names the
        argument and the relation); an unknown ``device``.
    RuntimeError
        ``device="cuda"`` where numba.cuda finds no usable GPU (no silent fallback to the CPU).

    References
    ----------
    DGL's heterogeneous MFGs (``dgl.create_block`` with several edge types) and its per-edge-type
    fanouts in ``dgl.dataloading.NeighborSampler``; Schlichtkrull et al., R-GCN (ESWC 2018); TGL (Zhou
    et al., VLDB 2022) for temporal neighbour sampling.

    Examples
    --------
    >>> sampler = HeteroNeighborSampler(g, {("user", "listens", "artist"): [5, 5],
    ...                                     ("artist", "heard_by", "user"): [5, 5],
    ...                                     ("user", "friends", "user"): [3, 3]}, seed=0)
    >>> blocks = sampler.sample({"user": torch.tensor([0, 7])})
    >>> blocks[-1].dst_nodes["user"]   # tensor([0, 7])
    """

    def __init__(self, graph: HeteroGraph, fanouts, replace: bool = False, seed: int | None = None, *,
                 weights=None, edge_times=None, device="cpu", uva: bool | None = None) -> None:
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
                if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
                    raise TypeError(f"fanouts[{rel}][{i}] must be an int, got {k!r}")
                if k < -1:
                    raise ValueError(f"fanouts[{rel}][{i}]={k}: a fanout must be >= 0, or -1 for every "
                                     "neighbour")
        check_seed_and_replace(seed, replace)
        self.graph = graph
        self.fanouts = {rel: [int(k) for k in ks] for rel, ks in per_rel.items()}
        self.num_layers = lengths.pop()
        self.replace = bool(replace)
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self._calls = 0
        self._lock = threading.Lock()
        self._arrays = {rel: (graph.indptr[rel].numpy(), graph.indices[rel].numpy(),
                              graph.edge_ids[rel].numpy()) for rel in self.fanouts}
        self._weights = self._relation_weights(weights)
        self._times, self.time_dtype = self._relation_times(edge_times)
        self.temporal = edge_times is not None
        """Whether `sample` needs ``seed_times`` (the sampler has edge times)."""
        self._eid_to_pos: dict[Relation, np.ndarray] = {}
        self.sampled_edges = 0
        """Total edges sampled so far."""
        self.device = NeighborSampler._check_device(device)
        self._cuda_graphs: dict[Relation, object] = {}
        if self.device.type == "cuda":
            self._maps: dict[str, np.ndarray] = {}
            self._cuda_graphs = self._build_cuda(uva)
        else:
            self._maps = {t: np.full(n, -1, dtype=np.int32) for t, n in graph.num_nodes.items()}
        # weighted relations without times: per-row prefix sums and positive counts, once (see
        # `samplers.kernels.reference`, "Weighted rows"); the GPU path computes its own on the device
        self._prefix = {rel: cpu.weight_prefix(self._arrays[rel][0], w, threads=numba.get_num_threads())
                        for rel, w in self._weights.items()
                        if rel not in self._times and self.device.type == "cpu"}

    def _build_cuda(self, uva: bool | None) -> dict:
        """One `CudaGraph` per sampled relation (its weights and times included); the relations from one
        source type share an index dtype (int64 where theirs differ), so their sources concatenate."""
        from samplers.kernels import cuda as cuda_kernels  # imports numba.cuda: only when asked for

        cuda_kernels.require_cuda()
        cuda_kernels.check_device_index(self.device)
        g = self.graph
        dtypes: dict[str, set] = {}
        for rel in self.fanouts:
            dtypes.setdefault(rel[0], set()).add(g.indices[rel].dtype)
        out = {}
        for rel in self.fanouts:
            indptr, indices = g.indptr[rel], g.indices[rel]
            if len(dtypes[rel[0]]) > 1:
                indices = indices.to(torch.int64)
            rel_uva = bool(indptr.is_pinned()) if uva is None else bool(uva)
            out[rel] = cuda_kernels.CudaGraph.build(indptr, indices, g.edge_ids[rel], self._weights.get(rel),
                                                    uva=rel_uva, times=self._times.get(rel))
        return out

    def _relation_weights(self, weights) -> dict[Relation, np.ndarray]:
        """Per sampled relation with weights: float32 [E_r] in CSC order."""
        if weights is None or weights is False:
            return {}
        if weights is True:
            spec = {rel: True for rel in self.fanouts if rel in self.graph.weights}
            if not spec:
                raise ValueError("weights=True needs a graph with edge weights on a sampled relation (build "
                                 "it with HeteroGraph.from_edges(..., weights={relation: w})), or pass "
                                 "weights as a dict of tensors per relation")
        else:
            spec = _relation_dict("weights", weights, self.graph.relations)
        out = {}
        for rel, w in spec.items():
            if rel not in self.fanouts or w is None or w is False:
                continue
            if w is True:
                if rel not in self.graph.weights:
                    raise ValueError(f"weights[{rel!r}]=True: the relation has no edge weights (build the "
                                     f"graph with HeteroGraph.from_edges(..., weights={{relation: w}}), or "
                                     f"pass a tensor of shape [{self.graph.num_edges(rel)}])")
                out[rel] = self.graph.weights[rel].numpy()
            else:
                out[rel] = csc_weights(f"weights[{rel!r}]", w, self.graph.num_edges(rel),
                                       self._arrays[rel][2])
        return out

    def _relation_times(self, edge_times) -> tuple[dict[Relation, np.ndarray], np.dtype]:
        """Per sampled relation with times: int64/float64 [E_r] in CSC order, and the common dtype."""
        spec = _relation_dict("edge_times", edge_times, self.graph.relations)
        spec = {rel: t for rel, t in spec.items() if rel in self.fanouts and t is not None}
        raw = {rel: edge_array(f"edge_times[{rel!r}]", t, self.graph.num_edges(rel))
               for rel, t in spec.items()}
        floating = any(np.issubdtype(a.dtype, np.floating) for a in raw.values())
        dtype = np.dtype(np.float64 if floating else np.int64)
        out = {rel: csc_times(f"edge_times[{rel!r}]", a, a.shape[0], self._arrays[rel][2], dtype=dtype)
               for rel, a in raw.items()}
        return out, dtype

    def _excluded(self, exclude_eids) -> dict[Relation, np.ndarray]:
        """Per relation: sorted distinct CSC positions never drawn."""
        out = {}
        for rel, ids in _relation_dict("exclude_eids", exclude_eids, self.graph.relations).items():
            if rel not in self.fanouts:
                continue

            def inverse(rel=rel):
                if rel not in self._eid_to_pos:
                    self._eid_to_pos[rel] = inverse_permutation(self._arrays[rel][2])
                return self._eid_to_pos[rel]

            pos = excluded_positions(f"exclude_eids[{rel!r}]", ids, self.graph.num_edges(rel), inverse)
            if pos is not None:
                out[rel] = pos
        return out

    def _seed_times(self, seed_times, dst: dict[str, np.ndarray], seeded) -> dict[str, np.ndarray] | None:
        if not self.temporal:
            if seed_times is not None:
                raise ValueError("seed_times given, but the sampler has no edge_times (pass edge_times=... "
                                 "to HeteroNeighborSampler for temporal sampling)")
            return None
        if seed_times is None:
            raise ValueError("seed_times is required: the sampler has edge_times (temporal sampling)")
        if not isinstance(seed_times, Mapping):
            raise TypeError(f"seed_times must be a dict keyed by node type, got {type(seed_times).__name__}")
        for t in seed_times:
            if t not in seeded:
                raise ValueError(f"seed_times: node type {t!r} has no seeds (seeds has {sorted(seeded)})")
        times = {}
        for t, ids in dst.items():
            if t in seeded:
                if t not in seed_times:
                    raise ValueError(f"seed_times[{t!r}] is required: seeds has node type {t!r}")
                times[t] = check_seed_times(f"seed_times[{t!r}]", seed_times[t], ids.shape[0],
                                            self.time_dtype)
            else:
                times[t] = np.empty(0, dtype=self.time_dtype)
        return times

    def sample(self, seeds: Mapping[str, torch.Tensor], exclude_eids=None,
               seed_times=None) -> list[HeteroBlock]:
        """Sample ``num_layers`` heterogeneous blocks for the seeds, outermost first.

        Parameters
        ----------
        seeds : mapping str -> torch.Tensor (int64, shape [B_t])
            Seed nodes per node type (ids within the type); types left out have no seeds.
        exclude_eids : mapping Relation -> torch.Tensor (int64, [X_r]), or None
            Relation edge ids that no layer may draw (removed from the candidates before drawing, as
            `NeighborSampler.sample`).
        seed_times : mapping str -> torch.Tensor (integer or float, [B_t]), or None
            Temporal sampling (required iff the sampler has ``edge_times``): the time of each seed, for
            every seeded node type. Float times against integer edge times are floored.

        Returns
        -------
        list[HeteroBlock]
            ``blocks[-1].dst_nodes[t]`` equals ``seeds[t]`` (empty for other types);
            ``blocks[i].dst_nodes[t]`` equals ``blocks[i + 1].src_nodes[t]``.

        Raises
        ------
        ValueError, TypeError
            An unknown node type; seeds not 1-D integer ids within their type's range; an unknown
            relation in ``exclude_eids`` or ids outside [0, E_r); ``seed_times`` missing on a temporal
            sampler, given on another, missing a seeded type, naming a type without seeds, of the wrong
            length, or holding NaN (messages name the argument and the relation or type).
        """
        dst: dict[str, np.ndarray] = {}
        for t in self.graph.num_nodes:
            dst[t] = np.empty(0, dtype=np.int64)
        if not isinstance(seeds, Mapping):
            raise TypeError(f"seeds must be a dict keyed by node type, got {type(seeds).__name__}")
        for t, s in seeds.items():
            if t not in self.graph.num_nodes:
                raise ValueError(f"seeds: unknown node type {t!r} (the graph has {self.graph.node_types})")
            dst[t] = check_seeds(s, self.graph.num_nodes[t], name=f"seeds[{t!r}]", bound=f"num_nodes[{t!r}]")
        times = self._seed_times(seed_times, dst, set(seeds))
        with self._lock:
            excluded = self._excluded(exclude_eids)
            call = self._calls
            self._calls += 1
            if self._cuda_graphs:
                return self._sample_cuda(dst, times, excluded, call)  # on torch's current stream
            blocks = []
            for layer in range(self.num_layers - 1, -1, -1):
                block = self._layer(dst, times, excluded, call, layer)
                blocks.append(block)
                dst = {t: v.numpy() for t, v in block.src_nodes.items()}
                if times is not None:
                    times = {t: v.numpy() for t, v in block.src_times.items()}
            blocks.reverse()
            return blocks

    def _layer(self, dst: dict[str, np.ndarray], times: dict[str, np.ndarray] | None,
               excluded: dict[Relation, np.ndarray], call: int, layer: int) -> HeteroBlock:
        sampled = {}
        for r, rel in enumerate(self.graph.relations):
            if rel not in self.fanouts:
                continue
            indptr, indices, eids = self._arrays[rel]
            key = mix(cpu.layer_key(self.seed, call, layer) ^ (r + 1))
            rel_times = self._times.get(rel)
            prefix, positive = self._prefix.get(rel, (None, None))
            sampled[rel] = cpu.sample_layer(indptr, indices, eids, dst[rel[2]], self.fanouts[rel][layer],
                                            self.replace, key, excluded.get(rel), 1, self._weights.get(rel),
                                            rel_times, None if rel_times is None else times[rel[2]],
                                            prefix=prefix, positive=positive)
        src_nodes, local, src_times = {}, {}, {}
        for t in self.graph.num_nodes:  # relabel per source type over the relations into it, in order
            rels = [rel for rel in sampled if rel[0] == t]
            flat = np.concatenate([sampled[rel][1] for rel in rels]) if rels else np.empty(0, np.int64)
            if times is None:
                nodes, loc = cpu.relabel(dst[t], flat, self._maps[t])
            else:  # a source takes the time of the row (of the relation's destination type) that drew it
                edge_tkeys = [np.repeat(cpu.time_keys(times[rel[2]]), np.diff(sampled[rel][0]))
                              for rel in rels]
                flat_tkeys = np.concatenate(edge_tkeys) if rels else np.empty(0, np.int64)
                nodes, tkeys, loc = cpu.relabel_pairs(dst[t], cpu.time_keys(times[t]), flat, flat_tkeys)
                src_times[t] = torch.from_numpy(cpu.from_time_keys(tkeys, self.time_dtype))
            src_nodes[t] = torch.from_numpy(nodes)
            cuts = np.cumsum([0] + [sampled[rel][1].shape[0] for rel in rels])
            for i, rel in enumerate(rels):
                local[rel] = torch.from_numpy(loc[cuts[i]:cuts[i + 1]])
        self.sampled_edges += sum(int(v[1].shape[0]) for v in sampled.values())
        return HeteroBlock(src_nodes=src_nodes,
                           dst_nodes={t: src_nodes[t][: dst[t].shape[0]] for t in src_nodes},
                           indptr={rel: torch.from_numpy(v[0]) for rel, v in sampled.items()},
                           indices=local,
                           edge_ids={rel: torch.from_numpy(v[2]) for rel, v in sampled.items()},
                           src_times=None if times is None else src_times)


    def _sample_cuda(self, dst: dict[str, np.ndarray], times: dict[str, np.ndarray] | None,
                     excluded: dict[Relation, np.ndarray], call: int) -> list[HeteroBlock]:
        from numba import cuda

        dev_dst = {t: cuda.to_device(v) for t, v in dst.items()}
        # -0.0 -> 0.0 once (inner layers inherit these): equal times, equal relabelling keys
        dev_times = None if times is None else {t: cuda.to_device(v + v.dtype.type(0))
                                                for t, v in times.items()}
        excl = {rel: cuda.to_device(pos) for rel, pos in excluded.items()}
        blocks = []
        for layer in range(self.num_layers - 1, -1, -1):
            block, dev_dst, dev_times = self._layer_cuda(dev_dst, dev_times, excl, call, layer)
            blocks.append(block)
        blocks.reverse()
        return blocks

    def _layer_cuda(self, dst: dict, times: dict | None, excl: dict, call: int, layer: int) -> tuple:
        """One layer on the GPU: (block, next destinations per type, their times or None), device arrays
        for the next layer."""

        from samplers.kernels import cuda as ck

        sampled = {}
        for r, rel in enumerate(self.graph.relations):
            if rel not in self.fanouts:
                continue
            key = mix(cpu.layer_key(self.seed, call, layer) ^ (r + 1))
            row_times = times[rel[2]] if rel in self._times else None
            sampled[rel] = ck.sample_layer_cuda(self._cuda_graphs[rel], dst[rel[2]], self.fanouts[rel][layer],
                                                self.replace, key, rel in self._weights, excl.get(rel),
                                                row_times)
        src_nodes, src_times, local, next_dst, next_times = {}, {}, {}, {}, {}
        for t in self.graph.num_nodes:  # relabel per source type over the relations into it, in order
            rels = [rel for rel in sampled if rel[0] == t]
            parts = [sampled[rel][1] for rel in rels]
            sizes = [int(p.shape[0]) for p in parts]
            flat = ck.concat(parts, parts[0].dtype if parts else np.int64)
            if times is None:
                nodes, loc = ck.relabel_cuda(dst[t], flat)
            else:  # a source takes the time of the row (of the relation's destination type) that drew it
                tkeys = ck.empty(sum(sizes), np.int64)
                at = 0
                for rel, n in zip(rels, sizes, strict=True):
                    ck.edge_time_keys_cuda(sampled[rel][0], times[rel[2]], tkeys[at:at + n])
                    at += n
                nodes, node_times, loc = ck.relabel_pairs_cuda(dst[t], times[t], flat, tkeys)
                next_times[t] = node_times
                src_times[t] = _cuda_to_torch(node_times)
            next_dst[t] = nodes
            src_nodes[t] = _cuda_to_torch(nodes)
            loc_t = _cuda_to_torch(loc)
            at = 0
            for rel, n in zip(rels, sizes, strict=True):
                local[rel] = loc_t[at:at + n]
                at += n
        self.sampled_edges += sum(int(v[1].shape[0]) for v in sampled.values())
        block = HeteroBlock(src_nodes=src_nodes,
                            dst_nodes={t: src_nodes[t][: int(dst[t].shape[0])] for t in src_nodes},
                            indptr={rel: _cuda_to_torch(v[0]) for rel, v in sampled.items()},
                            indices=local,
                            edge_ids={rel: _cuda_to_torch(v[2]) for rel, v in sampled.items()},
                            src_times=None if times is None else src_times)
        return block, next_dst, None if times is None else next_times


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

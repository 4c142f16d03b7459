"""PyG's neighbour-sampling options on our samplers: `PygDraw`, what `samplers.PygSampler` draws with.

`PygDraw` samples a `samplers.pyg_graph.PygGraph` with our `NeighborSampler` (homogeneous) or
`HeteroNeighborSampler` and returns pyg-lib's output fields (``node``, ``row``, ``col``, ``edge``,
``batch``, ``num_sampled_nodes``, ``num_sampled_edges``), each node expanded once, at the hop after
the one that found it (`samplers.interop.expand_once`). PyG's options:

- ``disjoint``: every seed gets its own subgraph (a node reached from two seeds is two nodes);
  ``batch`` gives each node's seed. The core dedups sources by (node, time); each seed is given its
  own time key ``rank * 2**31 + b`` (b: its position, rank: how many distinct edge times are <= its
  time), and the edges keys ``rank * 2**31``, so eligibility is unchanged and (node, key) is (node, b).
  A row's draws are keyed by its node (the core's rule), so seeds that reach a node under the same
  eligible edges draw the same neighbours for it; each seed's subgraph alone follows the sampler's law.
- temporal sampling (``node_time`` / ``edge_time``; always disjoint, as in PyG): a node of seed time t
  draws only edges of time <= t (node-level times: edges whose neighbour's time is <= t);
  ``temporal_strategy="uniform"`` draws among them as without times, ``"last"`` takes the k latest
  (ties: the later CSC position), computed here from every eligible edge of the rows expanded.
- ``subgraph_type="induced"``: the sampled nodes with every edge of the graph among them (as PyG's
  torch-sparse path: ``num_sampled_nodes`` / ``num_sampled_edges`` are None; not with ``disjoint``).
- ``sample_direction="backward"``: nodes sample their out-edges; ``row`` / ``col`` keep the edges'
  own direction, as PyG's.
- ``num_neighbors=[]``: the seeds alone.

References
----------
PyG 2.8's ``NeighborSampler._sample`` and pyg-lib's ``neighbor_sample`` / ``hetero_neighbor_sample``.
"""

from __future__ import annotations

import numpy as np
import torch

from graphrl.graph import CSCGraph
from samplers.hetero import HeteroGraph, HeteroNeighborSampler
from samplers.interop import expand_once
from samplers.neighbor import NeighborSampler
from samplers.pyg_graph import HOMO, PygGraph

__all__ = ["PygDraw", "reverse_edge_type"]

_BATCH = 2**31  # seeds per call the disjoint keys can tell apart
_STATIC = -(2**62)  # key of an edge eligible at any time (a relation without times)


def reverse_edge_type(edge_type: tuple) -> tuple:
    """``(src, rel, dst) -> (dst, rel, src)``, PyG's ``reverse_edge_type``."""
    return (edge_type[-1], edge_type[1], edge_type[0])


class PygDraw:
    """Draw PyG's subgraphs of a `PygGraph` with our samplers (see the module docstring).

    Parameters
    ----------
    graph : PygGraph
        Its weights and edge times are read once, here, into copies; its node times are kept as ``pyg``
        (give a `samplers.pyg_graph.snapshot`, which copies them, when the caller reads them per batch).
    num_neighbors : dict edge type -> list of int
        Hop 1 first, per (forward) edge type, all of one length L (0 allowed).
    replace : bool
    seed : int
    disjoint : bool
        Forced on by times.
    temporal_strategy : {"uniform", "last"}
    induced : bool
    backward : bool
    sampler : Sampler or None
        Draws instead of ours, over its own graph (``graph`` attribute; the caller checks it is
        ``graph``'s): then no graph or sampler is built here.

    Raises
    ------
    ValueError
        ``disjoint`` with ``induced`` (PyG's wording); an unknown ``temporal_strategy``; weights or ids
        the core refuses (`NeighborSampler`, `HeteroNeighborSampler`).
    """

    def __init__(self, graph: PygGraph, num_neighbors: dict, replace: bool, seed: int, disjoint: bool,
                 temporal_strategy: str, induced: bool, backward: bool, sampler=None) -> None:
        if temporal_strategy not in ("uniform", "last"):
            raise ValueError(f"temporal_strategy must be 'uniform' or 'last', got {temporal_strategy!r}")
        self.pyg = graph
        self.temporal = graph.node_time is not None or graph.edge_time is not None
        self.disjoint = bool(disjoint) or self.temporal
        if self.disjoint and induced:
            raise ValueError("'disjoint' sampling not supported for neighbor sampling with "
                             "`subgraph_type='induced'`")
        self.last = self.temporal and temporal_strategy == "last"
        self.induced = bool(induced)
        self.backward = bool(backward)
        self.num_hops = len(next(iter(num_neighbors.values()))) if num_neighbors else 0
        self.relations = {}
        """Sampled relation -> forward edge type (the reverse of each type when backward)."""
        edges, weights, hops = {}, {}, {}
        for et in graph.edge_types:
            rel = reverse_edge_type(et) if backward else et
            src, dst = graph.edges[et]
            self.relations[rel] = et
            edges[rel] = (dst, src) if backward else (src, dst)
            if et in graph.weights:
                weights[rel] = graph.weights[et]
            hops[rel] = list(num_neighbors[et])
        self.times = self._edge_times(edges) if self.temporal else None
        """Per sampled relation, each edge's time (numpy, by our edge id) where it has one."""
        self.perm = {}
        """Per sampled relation with times: our edge id -> the graph's edge id (each neighbourhood in
        time order, as pyg-lib's CSC; a stable sort)."""
        for rel, t in (self.times or {}).items():
            perm = np.argsort(t, kind="stable")
            self.perm[rel] = perm
            self.times[rel] = t[perm]
            index = torch.from_numpy(perm)
            edges[rel] = (edges[rel][0][index], edges[rel][1][index])
            if rel in weights:
                weights[rel] = torch.as_tensor(weights[rel])[index]
        self.uniq = self._uniq()
        keys = self._edge_keys(edges) if self.disjoint else None
        fanouts = {rel: ([-1] * len(ks) if self.last else ks)[::-1] for rel, ks in hops.items()}
        self.hops = hops
        self.sampler = None
        """Our `NeighborSampler` (homogeneous) or `HeteroNeighborSampler`; None with 0 hops; the
        ``sampler`` argument when given."""
        if sampler is not None:
            self.graph, self.sampler = sampler.graph, sampler
        elif graph.hetero:
            self.graph = HeteroGraph.from_edges(graph.num_nodes, edges, weights=weights or None)
            if self.num_hops:
                self.sampler = HeteroNeighborSampler(self.graph, fanouts, replace=replace, seed=seed,
                                                     weights=True if weights else None, edge_times=keys)
        else:
            src, dst = edges[HOMO]
            self.graph = CSCGraph.from_edges(src, dst, graph.num_nodes["node"])
            if self.num_hops:
                self.sampler = NeighborSampler(self.graph, fanouts[HOMO], replace=replace, seed=seed,
                                               weights=weights.get(HOMO),
                                               edge_times=None if keys is None else keys[HOMO])

    def _edge_times(self, edges: dict) -> dict:
        g = self.pyg
        out = {}
        for rel, (src, _) in edges.items():
            et = self.relations[rel]
            if g.edge_time is not None and et in g.edge_time:  # one read (a copy): sorted, ranked after
                out[rel] = torch.as_tensor(g.edge_time[et]).detach().to("cpu", copy=True).numpy()
            elif g.node_time is not None and rel[0] in g.node_time:  # the neighbour's time
                out[rel] = torch.as_tensor(g.node_time[rel[0]]).cpu().numpy()[src.cpu().numpy()]
        return out

    def _uniq(self) -> np.ndarray:
        if not self.times:
            return np.zeros(1, dtype=np.int64)
        parts = list(self.times.values())
        dtype = np.float64 if any(p.dtype.kind == "f" for p in parts) else np.int64
        return np.unique(np.concatenate([p.astype(dtype) for p in parts]))

    def _edge_keys(self, edges: dict) -> dict:
        keys = {}
        for rel, (src, _) in edges.items():
            if self.times is not None and rel in self.times:
                rank = np.searchsorted(self.uniq, self.times[rel].astype(self.uniq.dtype))
                keys[rel] = torch.from_numpy(rank.astype(np.int64) * _BATCH)
            else:
                keys[rel] = torch.full((int(src.shape[0]),), 0 if self.times is None else _STATIC,
                                       dtype=torch.int64)
        return keys

    def seed_keys(self, num: int, seed_time) -> torch.Tensor:
        """The disjoint time keys of ``num`` seeds (int64 [num]), of times ``seed_time`` or none.

        Raises ValueError (``seed_time`` missing with times, not of shape [num], or holding NaN) or
        TypeError (``seed_time`` neither integer nor float)."""
        b = np.arange(num, dtype=np.int64)
        if not self.temporal:
            return torch.from_numpy(b)
        if seed_time is None:
            raise ValueError("temporal sampling needs seed times (input_time, or a node-level time_attr)")
        t = torch.as_tensor(seed_time).cpu().numpy()  # float seed times against integer edge times: exact
        if t.shape != (num,):
            raise ValueError(f"seed_time (input_time / edge_label_time) must have shape [{num}], one time "
                             f"per seed, got {list(t.shape)}")
        if t.dtype.kind not in "iuf":
            raise TypeError(f"seed_time must hold integer or float times, got dtype {t.dtype}")
        if t.dtype.kind == "f" and np.isnan(t).any():
            raise ValueError(f"seed_time holds NaN at positions {np.flatnonzero(np.isnan(t))[:5].tolist()}; "
                             f"a seed without a time cannot be sampled temporally")
        rank = np.searchsorted(self.uniq, t, side="right").astype(np.int64) - 1
        return torch.from_numpy(rank * _BATCH + b)

    def sample(self, seeds: dict, seed_time: dict | None = None) -> dict:
        """Draw one subgraph; ``seeds`` / ``seed_time``: node type -> int64 [B_t] / times [B_t].

        Returns a dict of PyG's ``SamplerOutput`` fields, keyed by node type (``node``, ``batch``,
        ``num_sampled_nodes``) or forward edge type (``row``, ``col``, ``edge``, ``num_sampled_edges``,
        ``edge_weight``: float32 aligned with ``edge``); ``batch`` None unless disjoint, ``edge_weight``
        None unless the blocks carry ``edge_weights`` (a `LaborSampler` given as ``sampler=``).
        """
        seeds = {t: s.to(torch.int64).cpu() for t, s in seeds.items()}
        node_types = self.pyg.node_types
        edge_weight = None
        if self.sampler is None:
            blocks = None
        elif self.pyg.hetero:
            times = None
            if self.disjoint:
                times = {t: self.seed_keys(s.numel(), None if seed_time is None else seed_time.get(t))
                         for t, s in seeds.items()}
            blocks = self.sampler.sample(seeds, seed_times=times)
        else:
            times = self.seed_keys(seeds["node"].numel(), None if seed_time is None else seed_time["node"])
            blocks = self.sampler.sample(seeds["node"], seed_times=times if self.disjoint else None)
        if blocks is None:
            ids = {t: seeds.get(t, torch.empty(0, dtype=torch.int64)) for t in node_types}
            keys = {t: torch.arange(v.numel()) for t, v in ids.items()}
            empty = torch.empty(0, dtype=torch.int64)
            rels = list(self.relations)
            node, row, col, edge = ids, dict.fromkeys(rels, empty), dict.fromkeys(rels, empty), \
                dict.fromkeys(rels, empty)
            nodes, edges = {t: [v.numel()] for t, v in ids.items()}, {r: [] for r in rels}
        else:
            layers, src_nodes, src_keys, num_seeds, eids, weights = self._layers(blocks)
            positions = {t: torch.arange(v.numel()) for t, v in src_nodes.items()}
            rels = list(self.relations)
            pos, row, col, at, nodes, edges = expand_once(layers, positions, num_seeds, rels)
            node = {t: src_nodes[t][p] for t, p in pos.items()}
            keys = None if src_keys is None else {t: src_keys[t][p] for t, p in pos.items()}
            edge = at
            if weights is not None:  # ``at`` are positions into the layers' concatenated edges
                edge = {r: torch.from_numpy(eids[r])[a] for r, a in at.items()}
                edge_weight = {r: torch.from_numpy(weights[r])[a] for r, a in at.items()}
        edge = {r: torch.from_numpy(self.perm[r])[e] if r in self.perm else e for r, e in edge.items()}
        batch = None if not self.disjoint else {t: k & (_BATCH - 1) for t, k in keys.items()}
        if self.induced:
            row, col, edge = self._induced(node)
            nodes = edges = edge_weight = None
        if self.backward:
            row, col = col, row
        forward = self.relations
        return {"node": node, "batch": batch, "num_sampled_nodes": nodes,
                "row": {forward[r]: v for r, v in row.items()},
                "col": {forward[r]: v for r, v in col.items()},
                "edge": {forward[r]: v for r, v in edge.items()},
                "num_sampled_edges": None if edges is None else {forward[r]: v for r, v in edges.items()},
                "edge_weight": None if edge_weight is None else {forward[r]: w
                                                                 for r, w in edge_weight.items()}}

    def _layers(self, blocks) -> tuple:
        """Hop-1-first layers of numpy CSCs per relation (the ``last`` cut applied), the outermost sources
        (ids and disjoint keys) per node type, the seed counts, and, when the blocks carry
        ``edge_weights``, per relation the concatenation of every layer's graph edge ids (int64) and
        weights (float32), the layers' edge "ids" then being positions into it (else None, None and
        the layers hold the graph edge ids)."""
        weighted = getattr(blocks[0], "edge_weights", None) is not None
        if self.pyg.hetero:
            raw = [{rel: (b.indptr[rel], b.indices[rel], b.edge_ids[rel],
                          b.edge_weights[rel] if weighted else None) for rel in b.indptr}
                   for b in reversed(blocks)]
            src_nodes = dict(blocks[0].src_nodes)
            src_keys = None if blocks[0].src_times is None else dict(blocks[0].src_times)
            num_seeds = {t: int(v.shape[0]) for t, v in blocks[-1].dst_nodes.items()}
        else:
            raw = [{HOMO: (b.indptr, b.indices, b.edge_ids, b.edge_weights if weighted else None)}
                   for b in reversed(blocks)]
            src_nodes = {"node": blocks[0].src_nodes}
            src_keys = None if blocks[0].src_times is None else {"node": blocks[0].src_times}
            num_seeds = {"node": blocks[-1].num_dst_nodes}
        layers = []
        eid_parts, weight_parts, sizes = {}, {}, {}
        for hop, layer in enumerate(raw):
            out = {}
            for rel, (indptr, indices, eids, w) in layer.items():
                arrays = (indptr.cpu().numpy(), indices.cpu().numpy(), eids.cpu().numpy())
                if self.last and self.hops[rel][hop] >= 0:  # temporal: never a sampler= with weights
                    arrays = _keep_last(*arrays, self.hops[rel][hop], self.times.get(rel))
                if weighted:
                    nnz, start = int(arrays[2].shape[0]), sizes.get(rel, 0)
                    eid_parts.setdefault(rel, []).append(arrays[2].astype(np.int64, copy=False))
                    weight_parts.setdefault(rel, []).append(w.cpu().numpy())
                    sizes[rel] = start + nnz
                    arrays = (arrays[0], arrays[1], np.arange(start, start + nnz, dtype=np.int64))
                out[rel] = arrays
            layers.append(out)
        if not weighted:
            return layers, src_nodes, src_keys, num_seeds, None, None
        eids = {rel: np.concatenate(eid_parts[rel]) if rel in eid_parts else np.empty(0, dtype=np.int64)
                for rel in self.relations}
        weights = {rel: np.concatenate(weight_parts[rel]) if rel in weight_parts
                   else np.empty(0, dtype=np.float32) for rel in self.relations}
        return layers, src_nodes, src_keys, num_seeds, eids, weights

    def _induced(self, node: dict) -> tuple:
        """Every edge of each sampled relation among ``node`` (local ids), by destination then CSC order."""
        row, col, edge = {}, {}, {}
        for rel in self.relations:
            if self.pyg.hetero:
                indptr, indices, eids = (self.graph.indptr[rel], self.graph.indices[rel],
                                         self.graph.edge_ids[rel])
            else:
                indptr, indices, eids = self.graph.indptr, self.graph.indices, self.graph.csc_edge_ids()
            indptr, indices, eids = indptr.numpy(), indices.numpy(), eids.numpy()
            src_ids, dst_ids = node[rel[0]].numpy(), node[rel[-1]].numpy()
            where = np.full(int(self.pyg.num_nodes[rel[0]]), -1, dtype=np.int64)
            where[src_ids[::-1]] = np.arange(src_ids.shape[0] - 1, -1, -1)  # first occurrence wins
            starts, lens = indptr[dst_ids], indptr[dst_ids + 1] - indptr[dst_ids]
            epos = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
            local_src = where[indices[epos]]
            keep = local_src >= 0
            row[rel] = torch.from_numpy(local_src[keep])
            col[rel] = torch.from_numpy(np.repeat(np.arange(dst_ids.shape[0]), lens)[keep])
            edge[rel] = torch.from_numpy(eids[epos][keep].astype(np.int64))
        return row, col, edge


def _keep_last(indptr: np.ndarray, indices: np.ndarray, eids: np.ndarray, k: int, times) -> tuple:
    """Each row's k latest edges (by ``times[eid]``, ties by CSC position), in CSC order."""
    lens = np.diff(indptr)
    rows = np.repeat(np.arange(lens.shape[0]), lens)
    t = np.zeros(eids.shape[0]) if times is None else times[eids]
    order = np.lexsort((np.arange(eids.shape[0]), t, rows))  # by row, then time, then position
    rank_from_end = np.empty(eids.shape[0], dtype=np.int64)
    ends = indptr[1:][rows[order]]
    rank_from_end[order] = ends - 1 - np.arange(eids.shape[0])
    keep = rank_from_end < k
    new_lens = np.bincount(rows[keep], minlength=lens.shape[0])
    new_indptr = np.zeros_like(indptr)
    np.cumsum(new_lens, out=new_indptr[1:])
    return new_indptr, indices[keep], eids[keep]

"""Typed graphs on the GPU in one launch per kernel and layer: every relation's CSC concatenated into one
(`TypedCsc`), and one work list of (relation, destination row) per layer (`sample_typed_layer`).

`TypedCsc.build` concatenates the relations' CSCs once per sampler: one indptr over (relation,
destination) segments (relation r's rows start at ``row_base[r]``, its edges at ``edge_base[r]``), the
indices in one dtype, edge ids (positions where a relation has none), and with any weighted relation
the weights and their per-row prefix sums. `TypedCsc.relation_graph` is one relation's `CudaGraph`
over the same memory (its own small indptr), for layers a relation cannot take through the fused
path. A layer then launches ``typed_plan`` (each item's output count) once, scans once, reads each
relation's first output back in one copy, and launches ``typed_rows`` (choose and gather) once, whatever
the number of relations; the outputs are split per relation into views. Each item draws with its
relation's key and its node id, through the per-row device functions of the homogeneous kernels
(`...cuda.uniform.uniform_row`, `...cuda.weighted.weighted_row`), so the blocks equal the per-relation
launches' and the CPU's. Uniform relations take the fused path at fanout -1, with replacement, or at
fanouts up to `THREAD_FANOUT_MAX`; weighted relations (without edge times) at every fanout; temporal
and LABOR relations keep their per-relation launches.

>>> csc = TypedCsc.build(indptr, indices, edge_ids, weights, uva=False)
>>> out = sample_typed_layer(csc, frontier, [TypedRequest(rel, 10, key, False)], csc.excluded({}))

References
----------
GraphBolt's ``FusedCSCSamplingGraph`` (DGL): one CSC with per-edge types, sampled in one pass over all
edge types.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import torch
from numba import cuda

from samplers.kernels.cuda.arrays import concat, empty, no_excluded
from samplers.kernels.cuda.device import torch_dtypes
from samplers.kernels.cuda.graph import CudaGraph
from samplers.kernels.cuda.launch import EDGE_THREADS, ROW_THREADS, grid, kernel_stream, launch
from samplers.kernels.cuda.rows import lower_bound, output_count, row_span
from samplers.kernels.cuda.scan import exclusive_scan
from samplers.kernels.cuda.uniform import THREAD_FANOUT_MAX, uniform_row
from samplers.kernels.cuda.weighted import eligible_weighted, weighted_row
from samplers.kernels.reference import SHORT_ROW_MAX

__all__ = ["TypedCsc", "TypedEdges", "TypedRequest", "sample_typed_layer", "typed_plan", "typed_rows"]

WEIGHTED = np.int64(1)
"""Item flag: the relation draws by weight."""
DRAWS = np.int64(2)
"""Item flag: the relation draws with replacement (replace and fanout >= 0)."""


@cuda.jit(device=True)
def _item(item_off, row_base, dst_base, frontier, n_rel, j):  # pragma: no cover - device
    """Work item j: (its relation's slot k, its row in the concatenated CSC, its node id, its row i
    within the relation)."""
    k = lower_bound(item_off, 0, n_rel + 1, j + 1) - 1
    i = j - item_off[k]
    v = frontier[dst_base[k] + i]
    return k, row_base[k] + v, v, i


@cuda.jit
def typed_plan(indptr, weights, positive, frontier, item_off, row_base, dst_base, fanout, flags, excl, counts,
               rel_indptr):  # pragma: no cover - device
    """Each item's output count (a thread per item): uniform rows from the degree, weighted rows from
    the positive count, excluded positions removed; writes the leading 0 of each relation's indptr."""
    n_rel = row_base.shape[0]
    n_items = item_off[n_rel]
    n_excl = excl.shape[0]
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    k = j
    while k < n_rel:
        rel_indptr[item_off[k] + k] = 0
        k += stride
    while j < n_items:
        k, g, _v, _i = _item(item_off, row_base, dst_base, frontier, n_rel, j)
        s, e, a, b = row_span(indptr, excl, n_excl, g)
        if flags[k] & WEIGHTED:
            d = eligible_weighted(weights, positive, excl, a, b, g)
        else:
            d = e - s - (b - a)
        counts[j] = output_count(d, fanout[k], (flags[k] & DRAWS) != 0)
        j += stride


@cuda.jit
def typed_rows(indptr, indices, edge_ids, weights, prefix, positive, frontier, item_off, row_base, dst_base,
               flags, keys, excl, out_indptr, src, eids, rel_indptr):  # pragma: no cover - device
    """Choose and gather every item's outputs (a thread per item) with its relation's key and rule,
    and write each relation's own indptr (rebased to 0) into ``rel_indptr``."""
    sub = cuda.local.array(THREAD_FANOUT_MAX, numba.int64)
    sums = cuda.local.array(SHORT_ROW_MAX, numba.float64)
    n_rel = row_base.shape[0]
    n_items = item_off[n_rel]
    n_excl = excl.shape[0]
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    while j < n_items:
        k, g, v, i = _item(item_off, row_base, dst_base, frontier, n_rel, j)
        o = out_indptr[j]
        c = out_indptr[j + 1] - o
        if c > 0:
            draws = (flags[k] & DRAWS) != 0
            key = np.uint64(keys[k])
            if flags[k] & WEIGHTED:
                weighted_row(indptr, indices, edge_ids, True, weights, prefix, positive, g, v, o, c, draws,
                             key, excl, n_excl, src, eids, sums)
            else:
                uniform_row(indptr, indices, edge_ids, True, g, v, o, c, draws, key, excl, n_excl, src, eids,
                            sub)
        rel_indptr[item_off[k] + k + i + 1] = out_indptr[j + 1] - out_indptr[item_off[k]]
        j += stride


@dataclass
class TypedRequest:
    """One relation's part of a fused layer.

    Attributes
    ----------
    relation : the relation (a key of the `TypedCsc`); fanout : int (k >= 0, or -1)
    key : int
        The relation's layer key (`samplers.layers.LayerLoop.relation_key`).
    replace : bool
        Draw with replacement.
    """

    relation: Any
    fanout: int
    key: int
    replace: bool


def _place(arr: np.ndarray, uva: bool) -> Any:
    """A device copy of a small host array, or (``uva``) a copy in mapped host memory."""
    if uva:
        mapped = cuda.mapped_array(arr.shape, dtype=arr.dtype)
        mapped[...] = arr
        return mapped
    return cuda.to_device(arr)


def _host(arr: Any) -> np.ndarray:
    """A host copy of a numpy array, torch tensor or numba device array."""
    if isinstance(arr, np.ndarray):
        return arr
    if isinstance(arr, torch.Tensor):
        return arr.cpu().numpy()
    return arr.copy_to_host()


@dataclass
class TypedCsc:
    """The relations' CSCs concatenated for the GPU: one `CudaGraph` over (relation, destination) rows.

    Attributes
    ----------
    graph : CudaGraph
        indptr int64 [sum N_r + 1] (positions into the concatenated edges); indices [sum E_r] in one
        dtype; edge_ids int64 [sum E_r]; with any weighted relation weights float32 (1.0 on unweighted
        relations' edges), prefix float64 and positive int64.
    relations : list
        The relations, in the graph's order.
    row_base, edge_base : dict Relation -> int
        First row and first edge of each relation in the concatenation.
    num_rows, num_edges : dict Relation -> int
    weighted : dict Relation -> bool
        Relations drawn by weight.
    indptr : dict Relation -> device int64 [N_r + 1]
        Each relation's own indptr (for `relation_graph`).
    prefix, positive : device float64 and int64 arrays
        ``graph.prefix`` and ``graph.positive``, or 1-element stand-ins without weighted relations (so
        the kernels compile for one signature).
    """

    graph: CudaGraph
    relations: list
    row_base: dict
    edge_base: dict
    num_rows: dict
    num_edges: dict
    weighted: dict
    indptr: dict
    prefix: Any
    positive: Any

    @classmethod
    def build(cls, indptr: Mapping, indices: Mapping, edge_ids: Mapping, weights: Mapping,
              uva: bool = False, index_dtype: Any = None) -> TypedCsc:
        """Concatenate the relations' CSCs (numpy arrays or CPU torch tensors, CSC order) and place them
        for the kernels.

        Parameters
        ----------
        indptr : mapping Relation -> int64 [N_r + 1], in the graph's order
        indices : mapping Relation -> int32/int64 [E_r]; edge_ids : mapping Relation -> int64 [E_r] or None
        weights : mapping Relation -> float32 [E_r] (the weighted relations only)
        uva : bool
            Place the concatenation in mapped host memory (read through UVA) instead of device memory.
        index_dtype : numpy dtype or None
            The indices' dtype (default: the relations' common one, int64 where they differ).

        Raises
        ------
        ValueError
            No relation, or ``weights`` names a relation not in ``indptr``.
        """
        relations = list(indptr)
        if not relations:
            raise ValueError("TypedCsc.build: indptr has no relation")
        unknown = [rel for rel in weights if rel not in indptr]
        if unknown:
            raise ValueError(f"TypedCsc.build: weights names relations not in indptr: {unknown}")
        host = {rel: np.asarray(_host(indptr[rel]), dtype=np.int64) for rel in relations}
        idx = {rel: _host(indices[rel]) for rel in relations}
        if index_dtype is None:
            kinds = {np.dtype(a.dtype) for a in idx.values()}
            index_dtype = kinds.pop() if len(kinds) == 1 else np.dtype(np.int64)
        num_rows = {rel: int(host[rel].shape[0]) - 1 for rel in relations}
        num_edges = {rel: int(host[rel][-1]) for rel in relations}
        row_base, edge_base, rows, edges = {}, {}, 0, 0
        for rel in relations:
            row_base[rel], edge_base[rel] = rows, edges
            rows += num_rows[rel]
            edges += num_edges[rel]
        cat_indptr = np.concatenate([host[rel][:-1] + edge_base[rel] for rel in relations] + [[edges]])
        cat_indices = np.concatenate([np.asarray(idx[rel][:num_edges[rel]], dtype=index_dtype)
                                      for rel in relations])
        cat_eids = np.concatenate([np.arange(num_edges[rel], dtype=np.int64) if edge_ids.get(rel) is None
                                   else np.asarray(_host(edge_ids[rel]), dtype=np.int64)[:num_edges[rel]]
                                   for rel in relations])
        cat_weights = None
        if weights:
            cat_weights = np.concatenate([np.asarray(_host(weights[rel]), dtype=np.float32)[:num_edges[rel]]
                                          if rel in weights else np.ones(num_edges[rel], np.float32)
                                          for rel in relations])
        graph = CudaGraph.build(cat_indptr.astype(np.int64), cat_indices, cat_eids, cat_weights, uva=uva)
        own = {rel: _place(host[rel], uva) for rel in relations}
        weighted = {rel: rel in weights for rel in relations}
        return cls(graph=graph, relations=relations, row_base=row_base, edge_base=edge_base,
                   num_rows=num_rows, num_edges=num_edges, weighted=weighted, indptr=own,
                   prefix=graph.prefix if weights else cuda.to_device(np.zeros(1, np.float64)),
                   positive=graph.positive if weights else cuda.to_device(np.zeros(1, np.int64)))

    def relation_graph(self, rel) -> CudaGraph:
        """Relation ``rel``'s `CudaGraph`: its own indptr, the rest views of the concatenation (no copy)."""
        g = self.graph
        e0, e1 = self.edge_base[rel], self.edge_base[rel] + self.num_edges[rel]
        r0, r1 = self.row_base[rel], self.row_base[rel] + self.num_rows[rel]
        weighted = self.weighted[rel]
        return CudaGraph(indptr=self.indptr[rel], indices=g.indices[e0:e1], edge_ids=g.edge_ids[e0:e1],
                         has_eids=True, weights=g.weights[e0:e1] if weighted else g.weights,
                         weighted=weighted, uva=g.uva, times=g.times, timed=False,
                         prefix=g.prefix[e0:e1] if weighted else None,
                         positive=g.positive[r0:r1] if weighted else None)

    def fits(self, rel, fanout: int, replace: bool) -> bool:
        """Whether relation ``rel`` takes the fused path at ``fanout``: weighted always; uniform at -1,
        with replacement, or at fanouts up to `THREAD_FANOUT_MAX` (its per-thread Floyd subset)."""
        return rel in self.weighted and (self.weighted[rel] or replace or fanout <= THREAD_FANOUT_MAX)

    def excluded(self, excluded: Mapping) -> Any:
        """The excluded positions of every relation in concatenated positions: a device int64 array
        (sorted; ``excluded`` maps relations to sorted CSC positions, host or device arrays, which are
        read on the host once), or the shared empty array."""
        parts = [np.asarray(_host(excluded[rel]), dtype=np.int64) + self.edge_base[rel]
                 for rel in self.relations if excluded.get(rel) is not None]
        parts = [p for p in parts if p.shape[0]]
        if not parts:
            return no_excluded()
        return cuda.to_device(np.concatenate(parts), stream=kernel_stream())


def _to_device(arr: np.ndarray) -> Any:
    """A device copy of a small host int64 array on the launch stream (a torch tensor where torch has
    CUDA)."""
    if torch_dtypes():
        return torch.from_numpy(arr).to("cuda")
    return cuda.to_device(arr, stream=kernel_stream())


def _frontier(parts: list) -> Any:
    """The destination arrays of several node types as one device int64 array."""
    if torch_dtypes() and len(parts) > 1:
        return torch.cat([torch.as_tensor(p, device="cuda") for p in parts])
    if not parts:
        return empty(1, np.int64)
    return concat(parts, np.int64, kernel_stream())


def _read_at(arr: Any, at_device: Any, at_host: np.ndarray) -> np.ndarray:
    """``arr[at]`` on the host (int64)."""
    if isinstance(arr, torch.Tensor):
        return arr[torch.as_tensor(at_device, device=arr.device)].cpu().numpy()
    return arr.copy_to_host()[at_host]


@dataclass
class TypedEdges:
    """One fused layer's sampled edges (device arrays, views of one output per layer).

    Attributes
    ----------
    edges : dict Relation -> (indptr int64 [D_r + 1], src [nnz_r] in the indices' dtype, edge_ids int64
        [nnz_r])
    sources : dict str -> (tuple of Relation, src view)
        Per source type whose relations were requested one after another: those relations and their
        sources joined (one view, no copy), ready for the per-type relabelling.
    """

    edges: dict
    sources: dict


def sample_typed_layer(csc: TypedCsc, frontier: Mapping[str, Any], requests: list[TypedRequest],
                       excluded: Any, launches: Counter | None = None) -> TypedEdges:
    """One layer of several relations in one launch per kernel.

    Parameters
    ----------
    csc : TypedCsc
    frontier : mapping str -> device int64 [D_t]
        The layer's destinations per node type (relation r's rows are those of its destination type,
        ``r[2]``).
    requests : list of TypedRequest
        The relations to sample (each fitting `TypedCsc.fits`); the outputs follow this order, so
        relations of one source type listed one after another have their sources joined in
        `TypedEdges.sources`.
    excluded : device int64 [X]
        `TypedCsc.excluded`'s positions.
    launches : Counter or None
        Counts each launch by name (``"plan"``, ``"scan"``, ``"rows"``).

    Returns
    -------
    TypedEdges
        The edges per relation (each relation's key gives the per-relation launches' edges).
    """
    launches = Counter() if launches is None else launches
    stream = kernel_stream()
    n_rel = len(requests)
    types = list(dict.fromkeys(req.relation[2] for req in requests))
    type_base, at = {}, 0
    for t in types:
        type_base[t] = at
        at += int(frontier[t].shape[0])
    sizes = [int(frontier[req.relation[2]].shape[0]) for req in requests]
    params = np.zeros(6 * n_rel + 1, dtype=np.int64)
    item_off = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    params[:n_rel + 1] = item_off
    for k, req in enumerate(requests):
        rel = req.relation
        draws = req.replace and req.fanout >= 0
        params[n_rel + 1 + k] = csc.row_base[rel]
        params[2 * n_rel + 1 + k] = type_base[rel[2]]
        params[3 * n_rel + 1 + k] = req.fanout
        params[4 * n_rel + 1 + k] = (WEIGHTED if csc.weighted[rel] else 0) | (DRAWS if draws else 0)
    params[5 * n_rel + 1:] = np.array([req.key for req in requests], dtype=np.uint64).view(np.int64)
    dev = _to_device(params)
    d_item_off, d_row_base, d_dst_base, d_fanout, d_flags, d_keys = (
        dev[:n_rel + 1], *(dev[q * n_rel + 1:(q + 1) * n_rel + 1] for q in range(1, 6)))
    flat = _frontier([frontier[t] for t in types if frontier[t].shape[0]])
    n_items = int(item_off[-1])
    g = csc.graph
    positive, prefix = csc.positive, csc.prefix
    counts = empty(max(n_items, 1), np.int64)
    rel_indptr = empty(n_items + n_rel, np.int64)
    launch(typed_plan, (grid(max(n_items, n_rel), EDGE_THREADS), EDGE_THREADS), g.indptr, g.weights, positive,
           flat, d_item_off, d_row_base, d_dst_base, d_fanout, d_flags, excluded, counts, rel_indptr,
           stream=stream)
    launches["plan"] += 1
    out_indptr, _ = exclusive_scan(counts[:n_items], stream, read_total=False)
    launches["scan"] += 1
    # the layer's one read-back: each relation's first output (the last one's end is the total)
    bounds = _read_at(out_indptr, d_item_off, item_off) if n_items else np.zeros(n_rel + 1, np.int64)
    nnz = int(bounds[-1])
    src = empty(nnz, g.indices.dtype)
    eids = empty(nnz, np.int64)
    if n_items:
        launch(typed_rows, (grid(n_items, ROW_THREADS), ROW_THREADS), g.indptr, g.indices, g.edge_ids,
               g.weights, prefix, positive, flat, d_item_off, d_row_base, d_dst_base, d_flags, d_keys,
               excluded, out_indptr, src, eids, rel_indptr, stream=stream)
        launches["rows"] += 1
    out, runs = {}, {}
    for k, req in enumerate(requests):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        out[req.relation] = (rel_indptr[item_off[k] + k:item_off[k + 1] + k + 1], src[lo:hi], eids[lo:hi])
        runs.setdefault(req.relation[0], []).append(k)
    sources = {t: (tuple(requests[k].relation for k in ks), src[int(bounds[ks[0]]):int(bounds[ks[-1] + 1])])
               for t, ks in runs.items() if ks[-1] - ks[0] == len(ks) - 1}
    return TypedEdges(out, sources)

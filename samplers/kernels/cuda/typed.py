"""Typed graphs on the GPU in one launch per kernel and layer: every relation's CSC concatenated into one
(`TypedCsc`), and one work list of (relation, destination row) per layer (`sample_typed_layer`).

`TypedCsc.build` concatenates the relations' CSCs once per sampler: one indptr over (relation,
destination) segments (relation r's rows start at ``row_base[r]``, its edges at ``edge_base[r]``), the
indices in one dtype, edge ids (positions where a relation has none), and with any weighted relation
the weights and their per-row prefix sums. `TypedCsc.relation_graph` is one relation's `CudaGraph`
over the same memory (its own small indptr), for layers sampled relation by relation. A layer then
launches ``typed_plan`` (each item's output count) once, scans once, reads each relation's first output
back in one copy, and launches ``typed_rows`` (choose and gather, a thread per row) once, whatever the
number of relations, and ``typed_choose`` once where a uniform relation takes a warp per row (the plain
layers' rule, `...cuda.uniform.warp_per_row`); the outputs are split per relation into views (the kernels:
`...cuda.typed_kernels`). Each item draws with
its relation's key and its node id, through the per-row device functions of the homogeneous kernels
(`...cuda.uniform.uniform_row`, `...cuda.uniform.choose_row`, `...cuda.weighted.weighted_row`), so the
blocks equal the per-relation launches' and the CPU's. Every uniform and weighted relation (without edge
times) takes the fused path at every fanout; temporal and LABOR relations keep their per-relation
launches (`...cuda.relation_chain` chains them).

When every relation of a layer takes the fused path (`TypedCsc.bounded`), the layer chains on the device
as the plain graph's do (`samplers.kernels.cuda.layer`): `sample_typed_bounded` sizes its outputs by the
upper bound ``D_t * fanout``, at fanout -1 by the plain chain's degree capacity
(`...cuda.bounded.full_capacity`; past it, `ChainOverflow` at the read), keeps every size in the call's
chain, and relabels each source type with the plain chain's `...cuda.relabel.relabel_bounded`; the
chain's record (`start_typed_rows`, `PendingTyped`, `read_typed`: its sizes in one copy) is
`...cuda.typed_chain`.

>>> csc = TypedCsc.build(indptr, indices, edge_ids, weights, uva=False)
>>> out = sample_typed_layer(csc, frontier, [TypedRequest(rel, 10, key, False)], csc.excluded({}))
>>> rows = start_typed_rows(frontier, ws, relations=1, layers=2)
>>> first = sample_typed_bounded(csc, rows, [TypedRequest(rel, 10, key0, False)], excl, ws, at=len(rows))
>>> second = sample_typed_bounded(csc, first.next_rows, [TypedRequest(rel, 5, key1, False)], excl, ws,
...                               at=first.end)
>>> (b1, b2) = read_typed([first, second], ws)          # one read-back for both layers

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

import numpy as np
import torch
from numba import cuda

from graphrl.memory import Tier
from samplers.kernels.cuda.arrays import concat, copy_into, empty, no_excluded
from samplers.kernels.cuda.bounded import DegreeBound, full_capacity
from samplers.kernels.cuda.device import torch_dtypes
from samplers.kernels.cuda.graph import CudaGraph
from samplers.kernels.cuda.launch import EDGE_THREADS, ROW_THREADS, WARP, grid, kernel_stream, launch
from samplers.kernels.cuda.layer import DeviceRows
from samplers.kernels.cuda.memory import GRAPH_OWNER, CudaMemory
from samplers.kernels.cuda.relabel import relabel_bounded
from samplers.kernels.cuda.scan import exclusive_scan
from samplers.kernels.cuda.typed_chain import PendingTyped, source_groups
from samplers.kernels.cuda.typed_kernels import (
    DRAWS,
    WARP_ROWS,
    WEIGHTED,
    typed_choose,
    typed_plan,
    typed_rows,
)
from samplers.kernels.cuda.uniform import warp_per_row

__all__ = ["TypedCsc", "TypedEdges", "TypedRequest", "sample_typed_bounded", "sample_typed_layer",
           "typed_choose", "typed_plan", "typed_rows"]

NO_END = np.int64(np.iinfo(np.int64).max)
"""A relation's output end where its outputs are exact (nothing can pass it)."""


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
    degrees : dict Relation -> `samplers.kernels.cuda.bounded.DegreeBound`
        Each relation's in-degrees: a chained layer of fanout -1 sizes its outputs by them.
    num_nodes : dict str -> int
        The node count of each type given to `build` (a chained layer caps a source type's next rows at
        its count plus the rows' repeats, as the plain chain does); empty where none was given.

    Every array lives in a region of ``graph.memory`` (owner ``"samplers.graph"``: ``device``, or
    ``pinned`` with UVA); ``graph.close()`` frees them.
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
    degrees: dict
    num_nodes: dict

    def __post_init__(self) -> None:
        if self.graph.memory is not None:
            self.graph.memory.hold(self)  # its close drops the arrays (`drop_views`)

    def drop_views(self) -> None:
        """Forget the relations' indptr and the stand-ins (views of the graph's regions); `CudaMemory.close`
        calls it (the graph drops its own)."""
        self.indptr = {}
        self.prefix = self.positive = None

    @classmethod
    def build(cls, indptr: Mapping, indices: Mapping, edge_ids: Mapping, weights: Mapping,
              uva: bool = False, index_dtype: Any = None,
              num_nodes: Mapping[str, int] | None = None, memory: CudaMemory | None = None) -> TypedCsc:
        """Concatenate the relations' CSCs (numpy arrays or CPU torch tensors, CSC order) and place them
        for the kernels.

        Parameters
        ----------
        indptr : mapping Relation -> int64 [N_r + 1], in the graph's order
        indices : mapping Relation -> int32/int64 [E_r]; edge_ids : mapping Relation -> int64 [E_r] or None
        weights : mapping Relation -> float32 [E_r] (the weighted relations only)
        uva : bool
            Place the concatenation in ``pinned`` regions (read through UVA) instead of ``device`` ones.
        index_dtype : numpy dtype or None
            The indices' dtype (default: the relations' common one, int64 where they differ).
        num_nodes : mapping str -> int, or None
            The node count of each type (`num_nodes`).
        memory : CudaMemory or None
            Where the regions come from (`CudaGraph.build`); default a private `CudaMemory`.

        Raises
        ------
        ValueError
            No relation, or ``weights`` names a relation not in ``indptr``.
        MemoryBudgetError
            An array does not fit its tier's budget (what this build placed is freed again).
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
        memory = CudaMemory() if memory is None else memory
        tier = Tier.PINNED if uva else Tier.DEVICE
        with memory.undo_on_error():  # what this build placed goes back
            graph = CudaGraph.build(cat_indptr.astype(np.int64), cat_indices, cat_eids, cat_weights, uva=uva,
                                    memory=memory)
            own = {rel: memory.copy(host[rel], tier, GRAPH_OWNER)[1] for rel in relations}
            prefix, positive = graph.prefix, graph.positive
            if not weights:  # 1-element stand-ins: the kernels compile for one signature
                prefix = memory.filled(1, np.float64, 0, tier, GRAPH_OWNER)[1]
                positive = memory.filled(1, np.int64, 0, tier, GRAPH_OWNER)[1]
                memory.publish(tier)  # their one wait
        weighted = {rel: rel in weights for rel in relations}
        return cls(graph=graph, relations=relations, row_base=row_base, edge_base=edge_base,
                   num_rows=num_rows, num_edges=num_edges, weighted=weighted, indptr=own,
                   prefix=prefix, positive=positive,
                   degrees={rel: DegreeBound.of(host[rel]) for rel in relations},
                   num_nodes={t: int(n) for t, n in (num_nodes or {}).items()})

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
                         positive=g.positive[r0:r1] if weighted else None, memory=g.memory)

    def fits(self, rel, fanout: int, replace: bool) -> bool:
        """Whether relation ``rel`` takes the fused path at ``fanout`` (with ``replace``): every relation
        of the concatenation does, at every fanout (weighted rows a thread per row; uniform rows a thread
        per row, or a warp per row where `samplers.kernels.cuda.uniform.warp_per_row` says so)."""
        return rel in self.weighted

    def bounded(self, rel, fanout: int, replace: bool) -> bool:
        """Whether relation ``rel``'s layer at ``fanout`` chains on the device (`sample_typed_bounded`):
        wherever it `fits` (outputs sized by ``D * fanout``, at fanout -1 by the degree capacity
        `samplers.kernels.cuda.bounded.full_capacity`)."""
        return self.fits(rel, fanout, replace)

    def excluded(self, excluded: Mapping, ws: Any = None) -> Any:
        """The excluded positions of every relation in concatenated positions: a device int64 array
        (sorted; ``excluded`` maps relations to sorted CSC positions, host or device arrays, which are
        read on the host once), or the shared empty array. With a `CudaWorkspace` ``ws`` the array is
        staged through its page-locked buffer ``typed_excluded`` (its scratch: valid until the next call
        of this workspace); without, a fresh device copy."""
        parts = [np.asarray(_host(excluded[rel]), dtype=np.int64) + self.edge_base[rel]
                 for rel in self.relations if excluded.get(rel) is not None]
        parts = [p for p in parts if p.shape[0]]
        if not parts:
            return no_excluded()
        if ws is not None:
            return ws.device_ids(np.concatenate(parts), "typed_excluded")
        return cuda.to_device(np.concatenate(parts), stream=kernel_stream())


def _to_device(arr: np.ndarray) -> Any:
    """A device copy of a small host int64 array on the launch stream (a torch tensor where torch has
    CUDA)."""
    if torch_dtypes():
        return torch.from_numpy(arr).to("cuda")
    return cuda.to_device(arr, stream=kernel_stream())


def _frontier(parts: list, ws: Any = None) -> Any:
    """The destination arrays of several node types as one device int64 array (with ``ws``: copied into
    its scratch array ``typed_flat``, no allocation; a single part as it is)."""
    if ws is not None and len(parts) > 1:
        out, at = ws.scratch("typed_flat", sum(int(p.shape[0]) for p in parts), np.int64), 0
        for part in parts:
            copy_into(out[at:at + int(part.shape[0])], part, kernel_stream())
            at += int(part.shape[0])
        return out
    if ws is not None and not parts:
        return ws.scratch("typed_flat", 1, np.int64)
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


def _plan_and_scan(csc: TypedCsc, frontier: Mapping[str, Any], requests: list[TypedRequest], excluded: Any,
                   launches: Counter, extra: np.ndarray, nrows: Any = None, ws: Any = None,
                   staging: str = "") -> tuple:
    """Launch ``typed_plan`` and scan its counts for ``requests`` over ``frontier`` (exact sizes, or a
    chain's upper bounds with ``nrows``): (item_off host int64 [R + 1], the device parameters, the
    flat frontier, out_indptr device int64 [items + 1], rel_indptr device int64 [items + R]).

    ``extra`` holds the per-relation columns after keys (nrow_at, out_base, scan_base, out_end, size_at
    [3 R]).
    With ``ws`` the parameters go through its page-locked staging buffer ``staging`` (an asynchronous
    copy: a chain's layers each take their own, so none waits for the one before)."""
    n_rel = len(requests)
    types = list(dict.fromkeys(req.relation[2] for req in requests))
    type_base, at = {}, 0
    for t in types:
        type_base[t] = at
        at += int(frontier[t].shape[0])
    sizes = [int(frontier[req.relation[2]].shape[0]) for req in requests]
    item_off = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    cols = np.zeros((5, n_rel), dtype=np.int64)
    for k, req in enumerate(requests):
        rel = req.relation
        draws = req.replace and req.fanout >= 0
        cols[:4, k] = (csc.row_base[rel], type_base[rel[2]], req.fanout,
                       (WEIGHTED if csc.weighted[rel] else 0) | (DRAWS if draws else 0)
                       | (WARP_ROWS if _warp_rows(csc, req) else 0))
    cols[4] = np.array([req.key for req in requests], dtype=np.uint64).view(np.int64)
    host = np.concatenate([item_off, cols.ravel(), extra])
    dev = _to_device(host) if ws is None else ws.device_ids(host, staging)
    params = (dev[:n_rel + 1], *(dev[q * n_rel + 1:(q + 1) * n_rel + 1] for q in range(1, 10)),
              dev[10 * n_rel + 1:13 * n_rel + 1])
    d_item_off, d_row_base, d_dst_base, d_fanout, d_flags, _keys, d_nrow_at = params[:7]
    flat = _frontier([frontier[t] for t in types if frontier[t].shape[0]], ws)
    n_items = int(item_off[-1])
    g = csc.graph
    # with ws (a chain): counts and offsets are scratch; rel_indptr is kept by the blocks (an output)
    counts = empty(max(n_items, 1), np.int64) if ws is None else ws.scratch("typed_counts", max(n_items, 1),
                                                                           np.int64)
    rel_indptr = empty(n_items + n_rel, np.int64) if ws is None else ws.output(n_items + n_rel, np.int64)
    stream = kernel_stream()
    launch(typed_plan, (grid(max(n_items, n_rel), EDGE_THREADS), EDGE_THREADS), g.indptr, g.weights,
           csc.positive, flat, d_item_off, d_row_base, d_dst_base, d_fanout, d_flags, excluded, counts,
           rel_indptr, dev if nrows is None else nrows, d_nrow_at, stream=stream)
    launches["plan"] += 1
    scan_out = None if ws is None else ws.scratch("typed_out_indptr", n_items + 1, np.int64)
    out_indptr, _ = exclusive_scan(counts[:n_items], stream, ws, scan_out, read_total=False)
    launches["scan"] += 1
    return item_off, params, flat, out_indptr, rel_indptr


def _warp_rows(csc: TypedCsc, req: TypedRequest) -> bool:
    """Whether ``req``'s rows take a warp each (`WARP_ROWS`): uniform rows where the plain layers' rule,
    `samplers.kernels.cuda.uniform.warp_per_row`, says so (weighted rows take a thread each)."""
    return not csc.weighted[req.relation] and warp_per_row(req.fanout)


def _launch_rows(csc: TypedCsc, requests: list[TypedRequest], params: tuple, flat: Any, excluded: Any,
                 out_indptr: Any, src: Any, eids: Any, rel_indptr: Any, n_items: int, launches: Counter,
                 sizes: Any, ws: Any = None) -> None:
    """Launch ``typed_rows``, and ``typed_choose`` where a request takes a warp per row (`_warp_rows`; its
    positions in ``ws``'s scratch, or fresh arrays without) (``sizes``: a chain's array, or any int64
    array where no size is written)."""
    (item_off, row_base, dst_base, _fanout, flags, keys, _nrow_at, out_base, scan_base, out_end,
     size_at) = params
    g = csc.graph
    stream = kernel_stream()
    launch(typed_rows, (grid(n_items, ROW_THREADS), ROW_THREADS), g.indptr, g.indices, g.edge_ids, g.weights,
           csc.prefix, csc.positive, flat, item_off, row_base, dst_base, flags, keys, excluded, out_indptr,
           src, eids, rel_indptr, out_base, scan_base, out_end, sizes, size_at, stream=stream)
    launches["rows"] += 1
    if any(_warp_rows(csc, req) for req in requests):
        m = max(int(src.shape[0]), 1)
        pos, aux = (empty(m, np.int64), empty(m, np.int64)) if ws is None else (
            ws.scratch("pos", m, np.int64), ws.scratch("aux", m, np.int64))
        launch(typed_choose, (grid(n_items, 1), WARP), g.indptr, g.indices, g.edge_ids, flat, item_off,
               row_base, dst_base, flags, keys, excluded, out_indptr, out_base, scan_base, out_end, pos, aux,
               src, eids, stream=stream)
        launches["choose"] += 1


def sample_typed_layer(csc: TypedCsc, frontier: Mapping[str, Any], requests: list[TypedRequest],
                       excluded: Any, launches: Counter | None = None, ws: Any = None) -> TypedEdges:
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
    ws : CudaWorkspace or None
        The sampler's workspace: the parameters go through its page-locked staging (no pageable copy),
        scratch and outputs come from it (counted).

    Returns
    -------
    TypedEdges
        The edges per relation (each relation's key gives the per-relation launches' edges).
    """
    launches = Counter() if launches is None else launches
    n_rel = len(requests)
    extra = np.concatenate([np.full(n_rel, -1, np.int64), np.zeros(2 * n_rel, np.int64),
                            np.full(n_rel, NO_END, np.int64), np.full(3 * n_rel, -1, np.int64)])
    item_off, params, flat, out_indptr, rel_indptr = _plan_and_scan(csc, frontier, requests, excluded,
                                                                    launches, extra, ws=ws,
                                                                    staging="typed_params")
    n_items = int(item_off[-1])
    # the layer's one read-back: each relation's first output (the last one's end is the total)
    bounds = _read_at(out_indptr, params[0], item_off) if n_items else np.zeros(n_rel + 1, np.int64)
    nnz = int(bounds[-1])
    out_array = empty if ws is None else ws.output
    src = out_array(nnz, csc.graph.indices.dtype)
    eids = out_array(nnz, np.int64)
    if n_items:
        _launch_rows(csc, requests, params, flat, excluded, out_indptr, src, eids, rel_indptr, n_items,
                     launches, params[0], ws)
    out = {req.relation: (rel_indptr[item_off[k] + k:item_off[k + 1] + k + 1],
                          src[int(bounds[k]):int(bounds[k + 1])], eids[int(bounds[k]):int(bounds[k + 1])])
           for k, req in enumerate(requests)}
    sources = {t: (tuple(requests[k].relation for k in ks), src[int(bounds[ks[0]]):int(bounds[ks[-1] + 1])])
               for t, ks in source_groups(requests).items() if ks[-1] - ks[0] == len(ks) - 1}
    return TypedEdges(out, sources)


def sample_typed_bounded(csc: TypedCsc, rows: Mapping[str, DeviceRows], requests: list[TypedRequest],
                         excluded: Any, ws: Any, at: int, launches: Counter | None = None) -> PendingTyped:
    """One typed layer sampled and relabelled per source type on the device, nothing read back: as
    `sample_typed_layer` (one launch per kernel), then `relabel.relabel_bounded` per source type (the
    plain chain's relabelling), outputs at upper bounds: ``D_t * fanout`` edges per relation, at fanout
    -1 the plain chain's degree capacity (`samplers.kernels.cuda.bounded.full_capacity` over the
    relation's `TypedCsc.degrees`, the rows' repeats and the workspace's edge rate for this layer), past
    which the chain's read raises `samplers.kernels.cuda.layer.ChainOverflow` (rows past their source
    type's region are not written).

    Parameters
    ----------
    csc : TypedCsc
    rows : mapping str -> DeviceRows
        Every node type's destinations (`start_typed_rows`, or the previous layer's
        `PendingTyped.next_rows`), in the graph's type order.
    requests : list of TypedRequest
        One per relation, grouped by source type (`TypedCsc.bounded`).
    excluded : device int64 [X]; ws : CudaWorkspace
    at : int
        The chain's first unused entry (this layer writes R + 3 T entries from there).
    launches : Counter or None

    Returns
    -------
    PendingTyped
        Its ``capacity`` per relation (the read checks each relation's edge count against it) and the
        edge rate name of each relation of fanout -1 (``rates``).
    """
    launches = Counter() if launches is None else launches
    n_rel = len(requests)
    chain = next(iter(rows.values())).chain
    rates = {req.relation: f"typed {req.relation}@{at}" for req in requests if req.fanout < 0}
    bound = [_capacity(csc, rows[req.relation[2]], req, ws, rates) for req in requests]
    groups = source_groups(requests)
    nrow_at = np.array([rows[req.relation[2]].at for req in requests], dtype=np.int64)
    out_base, scan_base, out_end, size_at = (np.zeros(n_rel, np.int64), np.zeros(n_rel, np.int64),
                                             np.zeros(n_rel, np.int64), np.zeros(3 * n_rel, np.int64))
    frontier = {t: r.ids for t, r in rows.items()}
    sizes = [int(frontier[req.relation[2]].shape[0]) for req in requests]
    item_off = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    size_at[:n_rel] = at + np.arange(n_rel)
    triple, base, region = {}, 0, {}
    for i, (t, ks) in enumerate(groups.items()):
        triple[t] = at + n_rel + 3 * i
        region[t] = (base, max(sum(bound[k] for k in ks), 1))
        out_base[ks] = base
        out_end[ks] = base + region[t][1]
        scan_base[ks] = item_off[ks[0]]
        size_at[n_rel + np.array(ks)] = item_off[ks[-1] + 1]
        size_at[2 * n_rel + np.array(ks)] = triple[t]
        base += region[t][1]
    extra = np.concatenate([nrow_at, out_base, scan_base, out_end, size_at])
    item_off, params, flat, out_indptr, rel_indptr = _plan_and_scan(csc, frontier, requests, excluded,
                                                                    launches, extra, chain, ws,
                                                                    f"typed_params_{at}")
    src = ws.scratch("src", base, csc.graph.indices.dtype)
    eids = ws.output(base, np.int64)
    _launch_rows(csc, requests, params, flat, excluded, out_indptr, src, eids, rel_indptr,
                 max(int(item_off[-1]), 1), launches, chain, ws)
    next_rows, local, rel_eids = dict(rows), {}, {}
    for t, (lo, n) in region.items():
        r = rows[t]
        sizes_t = chain[triple[t]:triple[t] + 3]
        nodes, local[t] = relabel_bounded(r.ids, r.count, src[lo:lo + n], sizes_t[:1], ws, sizes_t,
                                          csc.num_nodes.get(t), r.repeats)
        next_rows[t] = DeviceRows(nodes, chain, triple[t] + 2, repeats=r.repeats)
        for k in groups[t]:
            rel_eids[requests[k].relation] = eids[lo:lo + n]
    rel_ip = {req.relation: rel_indptr[item_off[k] + k:item_off[k + 1] + k + 1]
              for k, req in enumerate(requests)}
    return PendingTyped(rows=dict(rows), next_rows=next_rows, relations=[req.relation for req in requests],
                        rel_indptr=rel_ip, eids=rel_eids, local=local,
                        nnz_at={req.relation: at + k for k, req in enumerate(requests)},
                        end=at + n_rel + 3 * len(groups),
                        capacity={req.relation: bound[k] for k, req in enumerate(requests)}, rates=rates)


def _capacity(csc: TypedCsc, rows: DeviceRows, req: TypedRequest, ws: Any, rates: dict) -> int:
    """A chained relation's output capacity over ``rows`` (its destination type's): ``D_t * fanout``, at
    fanout -1 `samplers.kernels.cuda.bounded.full_capacity` (sized by the edge rate ``rates[relation]``)."""
    d_bound = int(rows.ids.shape[0])
    if req.fanout >= 0:
        return d_bound * req.fanout
    return full_capacity(d_bound, csc.degrees[req.relation], True, ws.edge_rate(rates[req.relation]),
                         repeats=rows.repeats)

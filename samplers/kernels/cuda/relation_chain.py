"""Typed layers chained on the device relation by relation: the relations that the concatenated CSC
(`samplers.kernels.cuda.typed`) does not take (temporal, LABOR) or a mix of them and others (its uniform
and weighted relations then chain at every fanout through their modes, as on plain graphs).

Each relation's mode samples its edges at their capacity (`samplers.modes.Mode.sample_edges_cuda`:
``D_t * fanout``, LABOR's capacity), nothing read back; `pack_edges` copies each relation's valid
sources (and each edge's time key, from its row) into its source type's region, after the relations
before it (the running total of the sources written, kept on the device: a relation past its capacity adds
its capacity, so the region has no unwritten entry; the edge ids and LABOR's edge weights stay in the
relation's own outputs), and each source type is relabelled as the plain chain's
layers are (`samplers.kernels.cuda.layer.relabel_rows`: by node, or by (node, time) with times). The
sizes go into the call's chain (`samplers.kernels.cuda.typed_chain.PendingTyped`, read by `read_typed` in one
copy).

>>> rows = start_typed_rows(frontier, ws, relations=len(rels), layers=2, times=seed_times)
>>> first = sample_relations_bounded(rels, lambda k, rel, scratch: mode_edges(...), rows, ws, at=len(rows))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from samplers.kernels.cuda.launch import EDGE_THREADS, grid, kernel_stream, launch
from samplers.kernels.cuda.layer import BoundedEdges, DeviceRows, relabel_rows
from samplers.kernels.cuda.relabel import edge_time_keys_cuda
from samplers.kernels.cuda.typed_chain import PendingTyped, source_groups

__all__ = ["pack_edges", "sample_relations_bounded"]


@cuda.jit
def pack_edges(src, tkey, has_t, nnz, sizes, base_at, end_at, count_at, out_src,
               out_tkey):  # pragma: no cover - device
    """Copy the first ``n = min(nnz[0], len(src))`` sources and, with ``has_t``, their time keys to
    ``out_*`` from ``sizes[base_at]`` (0 where ``base_at < 0``); thread 0 writes the running total of the
    items written, ``base + n``, at ``sizes[end_at]`` and the true count ``nnz[0]`` at ``sizes[count_at]``
    (a count past ``len(src)``, the relation's overflow, is seen there at the read-back). So the running
    total of a source type's region never passes what its relations wrote: the relabelling reads only
    written sources (``out_src``'s first ``sizes[end_at]`` items, no holes after an overflowing relation),
    as the fused layer's group count is the prefix of items written (`...cuda.typed_kernels.typed_rows`).
    Positions past ``out_src``'s end are dropped (not reached: its region holds every relation's
    ``len(src)``)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    base = sizes[base_at] if base_at >= 0 else 0
    n_true = nnz[0]
    n = n_true if n_true < src.shape[0] else src.shape[0]
    if i == 0:
        sizes[end_at] = base + n
        sizes[count_at] = n_true
    while i < n:
        o = base + i
        if o < out_src.shape[0]:
            out_src[o] = src[i]
            if has_t:
                out_tkey[o] = tkey[i]
        i += stride


def sample_relations_bounded(relations: list, sample: Callable[[int, Any, str], BoundedEdges],
                             rows: dict[str, DeviceRows], ws: Any, at: int) -> PendingTyped:
    """One typed layer chained relation by relation (see the module), nothing read back.

    Parameters
    ----------
    relations : list
        Every relation of the layer, grouped by source type (graph order within a type).
    sample : callable (k, relation, scratch name) -> BoundedEdges
        Relation k's edges for its destination type's rows, its sources in the workspace's scratch array
        of the given name (`samplers.modes.Mode.sample_edges_cuda`); with an ``edge_weights`` attribute
        (a LABOR relation's, `samplers.kernels.cuda.labor.LaborEdges`) the block keeps those too.
    rows : dict str -> DeviceRows
        Every node type's rows (with times: temporal sampling, each edge takes its row's time).
    ws : CudaWorkspace; at : int
        The chain's first unused entry (this layer writes 2 R + 3 T entries from there).

    Returns
    -------
    PendingTyped
        Its ``capacity`` per relation (the read-back checks each relation's count against it); each
        relation's edge ids are its own output (``grouped_eids`` False: nothing copied).
    """
    chain = next(iter(rows.values())).chain
    timed = any(r.times is not None for r in rows.values())
    n_rel = len(relations)
    edges, tkeys = [], []
    for k, rel in enumerate(relations):
        e = sample(k, rel, f"src_{k}")
        edges.append(e)
        tk = ws.scratch(f"tkey_{k}", max(int(e.src.shape[0]), 1) if timed else 1, np.int64)
        if timed:
            edge_time_keys_cuda(e.out_indptr, rows[rel[2]].times, tk)
        tkeys.append(tk)
    groups = source_groups(relations)
    size = {t: max(sum(int(edges[k].src.shape[0]) for k in ks), 1) for t, ks in groups.items()}
    total = sum(size.values())
    group_src = ws.scratch("group_src", total, np.int64)
    group_tkey = ws.scratch("group_tkey", total if timed else 1, np.int64)
    stream = kernel_stream()
    next_rows, local, lo = dict(rows), {}, 0
    for i, (t, ks) in enumerate(groups.items()):
        triple = at + 2 * n_rel + 3 * i
        region = slice(lo, lo + size[t])
        prev = -1
        for k in ks:
            e, end_at = edges[k], at + n_rel + k
            m = int(e.src.shape[0])
            launch(pack_edges, (grid(m, EDGE_THREADS), EDGE_THREADS), e.src, tkeys[k], timed, e.nnz, chain,
                   np.int64(prev), np.int64(end_at), np.int64(at + k), group_src[region],
                   group_tkey[region] if timed else group_tkey, stream=stream)
            prev = end_at
        tkey = group_tkey[region] if timed else None
        nodes, times, local[t] = relabel_rows(rows[t], group_src[region], tkey, chain[prev:prev + 1], ws,
                                              chain[triple:triple + 3])
        # (node, time) rows repeat nodes: at most all their entries (a static relation's fanout -1 capacity)
        repeats = rows[t].repeats if times is None else max(int(nodes.shape[0]) - 1, 0)
        next_rows[t] = DeviceRows(nodes, chain, triple + 2, times, repeats)
        lo += size[t]
    weights = {rel: getattr(edges[k], "edge_weights", None) for k, rel in enumerate(relations)}
    return PendingTyped(rows=dict(rows), next_rows=next_rows, relations=list(relations),
                        rel_indptr={rel: edges[k].out_indptr for k, rel in enumerate(relations)},
                        eids={rel: edges[k].eids for k, rel in enumerate(relations)}, local=local,
                        nnz_at={rel: at + k for k, rel in enumerate(relations)},
                        end=at + 2 * n_rel + 3 * len(groups),
                        capacity={rel: int(edges[k].src.shape[0]) for k, rel in enumerate(relations)},
                        grouped_eids=False,
                        edge_weights=weights if any(w is not None for w in weights.values()) else None,
                        rates={rel: edges[k].rate for k, rel in enumerate(relations) if edges[k].rate})

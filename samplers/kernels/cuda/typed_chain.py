"""A typed chain's record on the device: its first rows (`start_typed_rows`), each layer sampled and
relabelled but not read (`PendingTyped`), and the one read-back of all its sizes (`read_typed`); and the
one grouping of a typed layer's relations by source type (`source_groups`). The fused chain
(`samplers.kernels.cuda.typed.sample_typed_bounded`) and the chain relation by relation
(`samplers.kernels.cuda.relation_chain`) both write it.

A chain's sizes are one device int64 array (the workspace's ``layer_sizes``): each node type's row count
first, then per layer each relation's edge count, and per source type its (edges, new sources, next row
count); a layer's `PendingTyped` knows where its entries are.

>>> rows = start_typed_rows(frontier, ws, relations=len(rels), layers=2)
>>> first = sample_typed_bounded(csc, rows, requests0, excl, ws, at=len(rows))
>>> second = sample_typed_bounded(csc, first.next_rows, requests1, excl, ws, at=first.end)
>>> (b1, b2) = read_typed([first, second], ws)          # one read-back for both layers
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from samplers.kernels.cuda.arrays import fill_with
from samplers.kernels.cuda.launch import kernel_stream
from samplers.kernels.cuda.layer import ChainOverflow, DeviceRows

__all__ = ["PendingTyped", "read_typed", "source_groups", "start_typed_rows"]


def source_groups(relations: Sequence) -> dict[Any, list[int]]:
    """The positions of ``relations`` (relations, or anything with a ``relation``) by source type: types
    in first-occurrence order, positions in order. The one grouping of a typed layer's relations: the
    fused layer's joined sources (`sample_typed_layer`), a chained layer's per-type regions
    (`sample_typed_bounded`, `...cuda.relation_chain`)."""
    groups: dict[Any, list[int]] = {}
    for k, rel in enumerate(relations):
        groups.setdefault(getattr(rel, "relation", rel)[0], []).append(k)
    return groups


def start_typed_rows(frontier: Mapping[str, Any], ws: Any, relations: int, layers: int,
                     times: Mapping[str, Any] | None = None) -> dict[str, DeviceRows]:
    """Device int64 ids per node type [D_t] (and their device times, temporal) as the first rows of a
    typed chain of up to ``layers`` layers over ``relations`` relations: their counts written on the
    device (no read-back).

    Returns
    -------
    dict str -> DeviceRows
        Per type (in ``frontier``'s order, type i's count at ``chain[i]``), over one chain: the workspace's
        device int64 [T + layers (2 R + 3 T)] sizes (reused by the next chain of this workspace); each
        type's ``repeats`` D_t - 1 (its seeds may repeat; a layer of fanout -1 sizes its capacity by it).
    """
    n_types = len(frontier)
    chain = ws.scratch("layer_sizes", n_types + layers * (2 * relations + 3 * n_types), np.int64)
    rows = {}
    for i, (t, ids) in enumerate(frontier.items()):
        ids = ws.device_ids(ids, f"ids_{t}")
        count = int(ids.shape[0])
        fill_with(chain[i:i + 1], count, kernel_stream())
        rows[t] = DeviceRows(ids, chain, i, None if times is None else times[t], max(count - 1, 0))
    return rows


@dataclass
class PendingTyped:
    """A typed layer sampled and relabelled on the device, its sizes not read yet (`sample_typed_bounded`).

    Attributes
    ----------
    rows : dict str -> DeviceRows
        The layer's destinations per node type.
    next_rows : dict str -> DeviceRows
        The next layer's destinations: a type's sources (its destinations and new nodes), counted on the
        device; a type that no relation draws from keeps its rows.
    relations : list
        The sampled relations (requests' order).
    rel_indptr, eids : dict Relation -> device int64 [Db_r + 1], [M_r] views at upper bounds
    local : dict str -> device int64 [M_t]: each source type's local ids, its relations one after another
    nnz_at : dict Relation -> int; end : int
        Where each relation's edge count is in the chain; the chain's first unused entry.
    capacity : dict Relation -> int or None
        Each relation's output capacity where it may overflow (a LABOR relation's), else None.
    grouped_eids : bool
        ``eids`` are views of one array per source type, each relation's after the relations before it
        in its type (`sample_typed_bounded`); False: each relation's own array, from its first edge
        (`...cuda.relation_chain`).
    edge_weights : dict Relation -> device float64 [M_r] or None
        Each relation's edge weights from its first edge (a LABOR relation's, `...cuda.labor`), or None.
    rates : dict Relation -> str or None
        The workspace's edge rate name of each capacity-sized relation (fanout -1,
        `samplers.kernels.cuda.bounded.BoundedEdges.rate`): `read_typed` records its edges per row there.
    """

    rows: dict
    next_rows: dict
    relations: list
    rel_indptr: dict
    eids: dict
    local: dict
    nnz_at: dict
    end: int
    capacity: dict | None = None
    grouped_eids: bool = True
    edge_weights: dict | None = None
    rates: dict | None = None

    def finish(self, values: Any) -> tuple[dict, dict, dict, dict, dict, dict | None, dict | None]:
        """Views at the true sizes, ``values`` the chain's entries read back: (src_nodes per type [S_t],
        dst counts per type, indptr [D + 1], local [nnz] and edge ids [nnz] per relation, src_times per
        type [S_t] or None, edge weights [nnz] (float64) per weighting relation or None).

        Raises
        ------
        samplers.kernels.cuda.layer.ChainOverflow
            A relation kept more edges than its capacity, or a type more sources than its next rows'
            length (capped by its node count: `samplers.kernels.cuda.relabel.relabel_bounded`).
        """
        for t, r in self.next_rows.items():
            if int(values[r.at]) > r.ids.shape[0]:
                raise ChainOverflow(f"node type {t!r} has {int(values[r.at])} sources in a chained layer, "
                                    f"past its capacity of {r.ids.shape[0]}: sample the call again without "
                                    "chaining")
        count = {t: int(values[r.at]) for t, r in self.rows.items()}
        src_nodes = {t: r.ids[:int(values[r.at])] for t, r in self.next_rows.items()}
        timed = any(r.times is not None for r in self.next_rows.values())
        src_times = {t: r.times[:int(values[r.at])] for t, r in self.next_rows.items()} if timed else None
        indptr, local, eids, start, weights = {}, {}, {}, {}, {}
        for rel in self.relations:
            n, at = int(values[self.nnz_at[rel]]), start.get(rel[0], 0)
            if self.capacity is not None and n > self.capacity[rel]:
                raise ChainOverflow(f"relation {rel!r} kept {n} edges in a chained layer, past its capacity "
                                    f"of {self.capacity[rel]}: sample the call again without chaining")
            start[rel[0]] = at + n
            indptr[rel] = self.rel_indptr[rel][:count[rel[2]] + 1]
            local[rel] = self.local[rel[0]][at:at + n]
            eids[rel] = self.eids[rel][at:at + n] if self.grouped_eids else self.eids[rel][:n]
            if self.edge_weights is not None and self.edge_weights.get(rel) is not None:
                weights[rel] = self.edge_weights[rel][:n]
        return src_nodes, count, indptr, local, eids, src_times, weights or None


def read_typed(pending: list[PendingTyped], ws: Any) -> list[tuple]:
    """The layers of one typed chain, all their sizes read back in one copy: `PendingTyped.finish` of
    each, in the order given (raises its `samplers.kernels.cuda.layer.ChainOverflow`). A capacity-sized
    relation's edges per row go to the workspace's edge rate first (`PendingTyped.rates`), as
    `samplers.kernels.cuda.layer.read_blocks` does."""
    chain = next(iter(pending[0].rows.values())).chain
    values = ws.read(chain[:pending[-1].end])
    for block in pending:
        for rel, name in (block.rates or {}).items():  # before an overflow raises: the next call sizes by it
            rows = int(values[block.rows[rel[2]].at])
            ws.observe_rate(name, int(values[block.nnz_at[rel]]) / max(rows, 1))
    return [block.finish(values) for block in pending]

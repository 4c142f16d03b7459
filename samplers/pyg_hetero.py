"""PyG's ``num_neighbors`` checked: `check_num_neighbors` (a hop list) and `hetero_num_neighbors` (PyG's
per-edge-type form for a heterogeneous graph: one list for every edge type, or a dict naming each).

`samplers.PygSampler` reads its ``num_neighbors`` through these; the heterogeneous layout of its output
is pyg-lib's ``hetero_neighbor_sample`` one (`samplers.pyg_draw`).

References
----------
PyG's ``NumNeighbors`` (``torch_geometric.sampler.base``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["check_num_neighbors", "hetero_num_neighbors"]


def check_num_neighbors(name: str, hops, allow_empty: bool = False) -> list[int]:
    """A hop list (hop 1 first) checked: a sequence of ints >= -1, returned as ``list[int]``.

    Raises
    ------
    TypeError
        Not a sequence, or an entry that is not an int.
    ValueError
        Empty (unless ``allow_empty``: PyG's ``num_neighbors=[]`` samples the seeds alone), or an entry
        below -1.
    """
    if isinstance(hops, (str, bytes)) or not isinstance(hops, Sequence):
        raise TypeError(f"{name} must be a sequence of ints such as [15, 10], got {hops!r}")
    out = list(hops)
    if not out and not allow_empty:
        raise ValueError(f"{name} must have at least one hop, got []")
    for i, k in enumerate(out):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"{name}[{i}] must be an int, got {k!r}")
        if k < -1:
            raise ValueError(f"{name}[{i}]={k}: must be >= 0, or -1 for every neighbour")
    return [int(k) for k in out]


def hetero_num_neighbors(num_neighbors, edge_types: list, default=None) -> dict:
    """PyG's ``num_neighbors`` for a heterogeneous graph as ``{edge_type: [hop 1, ..., hop L]}``.

    Parameters
    ----------
    num_neighbors : sequence of int, or mapping edge type -> sequence of int
        One list for every edge type, or one per edge type (keys ``(src, rel, dst)`` or PyG's
        ``"src__rel__dst"`` strings); every edge type needs one, all of one length (as PyG's
        ``NumNeighbors``).
    edge_types : list of (str, str, str)
        The graph's edge types, in order (the order of the returned dict).
    default : sequence of int or None
        The list of an edge type a dict leaves out (PyG's ``NumNeighbors(values, default=...)``).

    Raises
    ------
    TypeError, ValueError
        As `check_num_neighbors` per list; an unknown or missing edge type (no ``default``); lists of
        different lengths.
    """
    if not isinstance(num_neighbors, Mapping):
        hops = check_num_neighbors("num_neighbors", num_neighbors, allow_empty=True)
        return {et: list(hops) for et in edge_types}
    given = {}
    for key, hops in num_neighbors.items():
        et = tuple(key.split("__")) if isinstance(key, str) else key
        if et not in edge_types:
            raise ValueError(f"num_neighbors: unknown edge type {key!r} (data has {edge_types})")
        given[et] = check_num_neighbors(f"num_neighbors[{et!r}]", hops, allow_empty=True)
    if default is not None:
        fill = check_num_neighbors("num_neighbors.default", default, allow_empty=True)
        given.update({et: list(fill) for et in edge_types if et not in given})
    missing = [et for et in edge_types if et not in given]
    if missing:
        raise ValueError(f"num_neighbors: no number of neighbours for edge types {missing} (a dict must "
                         f"name every edge type, as PyG's NumNeighbors; or pass one list for all)")
    if len({len(v) for v in given.values()}) > 1:
        raise ValueError(f"num_neighbors: Number of hops must be the same across all edge types, "
                         f"got {given}")
    return {et: given[et] for et in edge_types}

"""Assign every node of a graph to one of P parts: METIS (through pymetis) or streaming LDG.

`assign_parts` returns the owner of each node (int32 [N]); `balance` measures an assignment (nodes and
in-edges per part, edge cut). Parts own destinations with their in-edges, so the load a part carries
is its in-edges: both methods balance ``in_degree + 1`` per part (the ``+ 1`` keeps isolated nodes
from piling up in one part) and minimise the edges whose endpoints lie in different parts, over the
symmetrised graph (an edge cut in either direction costs a remote source in sampling).

``method="metis"`` calls METIS's multilevel k-way partitioning through ``pymetis`` (the optional extra
``graphrl[partition]``); ``method="ldg"`` streams the nodes in a seeded random order and puts each in
the part holding most of its already placed neighbours, weighted by the part's free capacity; ``"auto"``
is METIS when pymetis imports, else LDG.

>>> owner = assign_parts(graph, 4, method="ldg", seed=0)   # int32 [N] in [0, 4)
>>> balance(graph, owner, 4)["edge_cut"]

References
----------
Karypis and Kumar, "A fast and high quality multilevel scheme for partitioning irregular graphs"
(SIAM J. Sci. Comput. 1998), METIS, as DistDGL and PyG's distributed partitioner use it; Stanton and
Kliot, "Streaming graph partitioning for large distributed graphs" (KDD 2012), linear deterministic
greedy (LDG).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import scipy.sparse as sp

from graphrl.graph import CSCGraph

__all__ = ["METHODS", "assign_parts", "balance", "metis_available"]

METHODS = ("auto", "metis", "ldg")
MAX_PARTS = 1 << 15


def metis_available() -> bool:
    """Whether ``pymetis`` imports (``pip install 'graphrl[partition]'``)."""
    try:
        import pymetis  # noqa: F401
    except ImportError:
        return False
    return True


def _symmetric(graph: CSCGraph) -> sp.csr_matrix:
    """The graph as an undirected simple graph (each pair once per direction, no self-loops)."""
    n = graph.num_nodes
    indptr = graph.indptr.numpy()
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    src = graph.indices.numpy().astype(np.int64)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    ones = np.ones(2 * src.shape[0], dtype=np.int8)
    a = sp.csr_matrix((ones, (np.concatenate([src, dst]), np.concatenate([dst, src]))), shape=(n, n))
    a.sum_duplicates()
    a.sort_indices()
    return a


def _loads(graph: CSCGraph) -> np.ndarray:
    """The load of each node: its in-degree + 1 (int64 [N])."""
    return graph.in_degrees().numpy().astype(np.int64) + 1


@nb.njit(cache=True)
def _ldg(order, indptr, indices, load, parts, capacity):  # pragma: no cover - compiled
    """Linear deterministic greedy over ``order``: score = placed neighbours * (1 - part load / capacity)."""
    n = indptr.shape[0] - 1
    owner = np.full(n, -1, dtype=np.int32)
    part_load = np.zeros(parts, dtype=np.float64)
    hits = np.zeros(parts, dtype=np.float64)
    for v in order:
        for j in range(indptr[v], indptr[v + 1]):
            p = owner[indices[j]]
            if p >= 0:
                hits[p] += 1.0
        best = 0
        best_score = -1e300
        for p in range(parts):
            free = 1.0 - part_load[p] / capacity
            score = (hits[p] + 1e-9) * free if free > 0 else -1.0 - part_load[p] / capacity
            if score > best_score:
                best_score = score
                best = p
            hits[p] = 0.0
        owner[v] = best
        part_load[best] += load[v]
    return owner


def _metis(graph: CSCGraph, parts: int, seed: int) -> np.ndarray:
    import pymetis

    a = _symmetric(graph)
    loads = np.minimum(_loads(graph), np.iinfo(np.int32).max)
    options = pymetis.Options(seed=int(seed) % (2**31))
    adjacency = pymetis.CSRAdjacency(a.indptr.astype(np.int64), a.indices.astype(np.int64))
    _, membership = pymetis.part_graph(parts, adjacency, vweights=loads.astype(np.int64), options=options)
    return np.asarray(membership, dtype=np.int32)


def assign_parts(graph: CSCGraph, num_parts: int, method: str = "auto", seed: int = 0) -> np.ndarray:
    """The part that owns each node.

    Parameters
    ----------
    graph : CSCGraph
        The graph (its in-edges go with their destination's part).
    num_parts : int
        P, in [1, 32768].
    method : {"auto", "metis", "ldg"}
        See the module docstring.
    seed : int
        Seed of METIS's randomised coarsening or of LDG's stream order (same seed, same parts).

    Returns
    -------
    np.ndarray, int32, shape [N]
        ``owner[v]`` in [0, P). Every part owns at least one node when N >= P.

    Raises
    ------
    ValueError
        ``num_parts`` outside [1, 32768] or above N; an unknown ``method``; ``method="metis"`` without
        pymetis installed (remedy: ``pip install 'graphrl[partition]'`` or ``method="ldg"``).
    TypeError
        ``graph`` is not a `CSCGraph`.
    """
    if not isinstance(graph, CSCGraph):
        raise TypeError(f"graph must be a CSCGraph, got {type(graph).__name__}")
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)):
        raise TypeError(f"num_parts must be an int, got {type(num_parts).__name__} {num_parts!r}")
    if not 1 <= int(num_parts) <= min(MAX_PARTS, graph.num_nodes):
        raise ValueError(f"num_parts must be in [1, min({MAX_PARTS}, num_nodes={graph.num_nodes})], "
                         f"got {num_parts}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    parts = int(num_parts)
    if method == "metis" and not metis_available():
        raise ValueError("method='metis' needs pymetis: pip install 'graphrl[partition]', "
                         "or use method='ldg'")
    if parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int32)
    if method == "metis" or (method == "auto" and metis_available()):
        owner = _metis(graph, parts, seed)
    else:
        a = _symmetric(graph)
        loads = _loads(graph)
        order = np.random.default_rng(seed).permutation(graph.num_nodes)
        capacity = 1.05 * float(loads.sum()) / parts  # 5 % slack, as METIS's default ufactor allows 3 %
        owner = _ldg(order, a.indptr.astype(np.int64), a.indices.astype(np.int64), loads, parts, capacity)
    _fill_empty_parts(owner, parts)
    return owner


def _fill_empty_parts(owner: np.ndarray, parts: int) -> None:
    """Give every empty part one node of the largest part (METIS can leave a part empty on tiny graphs)."""
    counts = np.bincount(owner, minlength=parts)
    for p in np.flatnonzero(counts == 0):
        big = int(np.argmax(counts))
        v = int(np.flatnonzero(owner == big)[0])
        owner[v] = p
        counts[big] -= 1
        counts[p] += 1


def _imbalance(counts: np.ndarray) -> float:
    """max / mean of per-part counts; 1.0 (balanced) when every part has none."""
    return float(counts.max() / counts.mean()) if counts.max() > 0 else 1.0


def balance(graph: CSCGraph, owner: np.ndarray, num_parts: int) -> dict:
    """How balanced an assignment is, and what it cuts.

    Returns
    -------
    dict
        ``nodes`` and ``edges`` (in-edges owned) per part (lists of int), ``node_imbalance`` and
        ``edge_imbalance`` (max over mean; 1.0 with no edges), ``edge_cut`` (edges whose source lies in
        another part than their destination) and ``cut_fraction`` (edge_cut / E).
    """
    owner = np.asarray(owner)
    deg = graph.in_degrees().numpy()
    nodes = np.bincount(owner, minlength=num_parts)
    edges = np.bincount(owner, weights=deg, minlength=num_parts).astype(np.int64)
    dst_owner = np.repeat(owner, deg)
    cut = int(np.count_nonzero(owner[graph.indices.numpy()] != dst_owner))
    e = max(graph.num_edges, 1)
    return {
        "nodes": nodes.tolist(),
        "edges": edges.tolist(),
        "node_imbalance": _imbalance(nodes),
        "edge_imbalance": _imbalance(edges),
        "edge_cut": cut,
        "cut_fraction": cut / e,
    }

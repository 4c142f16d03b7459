"""The `Sampler` protocol: what loaders and adapters need of a sampler (PyG's ``BaseSampler`` idea).

`NeighborSampler`, `HeteroNeighborSampler`, `LaborSampler` (plain or typed) satisfy it, and so does any
object with these members; `NeighborLoader`, `LinkSampler` / `LinkLoader`, `PygSampler` and
`DglSampler` take one (``sampler=``), over a plain graph or, where they sample typed graphs, a
`samplers.HeteroGraph`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

__all__ = ["Sampler", "check_blocks", "check_same_edges", "check_same_typed_edges", "check_sampler",
           "check_typed_blocks", "edges_by_id"]


@runtime_checkable
class Sampler(Protocol):
    """A multi-layer sampler over one plain graph.

    Attributes
    ----------
    graph : graphrl.graph.CSCGraph
        The graph sampled from (its node and edge ids are the blocks').
    num_layers : int
        Blocks per `sample`.
    sampled_edges : int
        Edges sampled so far (throughput reports).
    """

    graph: Any
    num_layers: int
    sampled_edges: int

    def sample(self, seeds, exclude_eids=None, seed_times=None) -> Any:
        """Blocks (`samplers.Blocks`) for ``seeds`` (int64 [B]), outermost first, never drawing the graph
        edge ids ``exclude_eids``; ``seed_times`` only for temporal samplers."""


def check_sampler(name: str, sampler: Any, typed: bool = False) -> Any:
    """``sampler`` if it follows `Sampler` over a plain graph (or, with ``typed``, over a plain graph or a
    `samplers.HeteroGraph`), else TypeError naming ``name``, the sampler's type and what it lacks
    (members of the protocol, or a graph of another type)."""
    from graphrl.graph import CSCGraph
    from samplers.hetero_graph import HeteroGraph

    want = "a CSCGraph or a HeteroGraph" if typed else "a CSCGraph"
    missing = [m for m in ("graph", "num_layers", "sampled_edges", "sample") if not hasattr(sampler, m)]
    if missing:
        raise TypeError(f"{name} must be a Sampler over {want} (NeighborSampler, LaborSampler, ...): "
                        f"{type(sampler).__name__} has no {', '.join(missing)}")
    if not callable(sampler.sample):
        raise TypeError(f"{name} must be a Sampler over {want}: {type(sampler).__name__}.sample is not "
                        f"callable")
    kinds = (CSCGraph, HeteroGraph) if typed else (CSCGraph,)
    if not isinstance(sampler.graph, kinds):
        raise TypeError(f"{name} must be a Sampler over {want}{'' if typed else ' (a plain graph)'}: the "
                        f"{type(sampler).__name__}'s graph is a {type(sampler.graph).__name__}")
    return sampler


def check_same_typed_edges(name: str, sampler: Any, num_nodes: dict, edges: dict, what: str) -> None:
    """ValueError naming ``name`` unless ``sampler.graph`` (a `samplers.HeteroGraph`) has the node types
    and counts ``num_nodes``, the relations of ``edges`` (matched by canonical triple, in any order: DGL
    sorts ``canonical_etypes``, a `HeteroGraph` keeps its own order), and edge ``j`` of each relation
    ``rel`` is ``edges[rel][0][j] -> edges[rel][1][j]`` (the typed form of `check_same_edges`).

    Parameters
    ----------
    name : str
        The sampler's argument name, for the message.
    sampler : Sampler
        A sampler whose ``graph`` is a `samplers.HeteroGraph`.
    num_nodes : dict str -> int
        Nodes of each type of the caller's graph.
    edges : dict (src type, name, dst type) -> (src, dst), torch.Tensor or numpy.ndarray, integer [E_r] each
        The caller's edges of each relation in edge-id order (PyG: ``data[et].edge_index``; DGL:
        ``g.edges(order="eid", etype=et)``).
    what : str
        The caller's graph in words, for the message.

    Raises
    ------
    ValueError
        Other node types or counts, another set of relations (those of one side only named), another
        edge count of a relation, or the first edge id of a relation whose endpoints differ (with both
        pairs).
    """
    ours = sampler.graph
    if dict(ours.num_nodes) != {t: int(n) for t, n in num_nodes.items()}:
        raise ValueError(f"{name}'s graph has nodes {dict(ours.num_nodes)}, {what} {dict(num_nodes)}")
    if set(ours.relations) != set(edges):
        only_ours = [rel for rel in ours.relations if rel not in edges]
        only_theirs = [rel for rel in edges if rel not in ours.relations]
        raise ValueError(f"{name}'s graph has relations {list(ours.relations)}, {what} {list(edges)}: "
                         f"{only_ours} only in the sampler's, {only_theirs} only in {what} (build the "
                         f"HeteroGraph with the same edge types; their order may differ)")
    for rel, (src, dst) in edges.items():
        src, dst = _int64(src), _int64(dst)
        by_id = edges_by_id(ours, rel)
        if by_id[0].shape[0] != src.shape[0]:
            raise ValueError(f"{name}'s graph has {by_id[0].shape[0]} edges of {rel!r}, {what} "
                             f"{src.shape[0]}")
        _check_pairs(name, by_id, (src, dst), what, f" of {rel!r}", "HeteroGraph.from_edges(num_nodes, "
                     "{edge type: (src, dst)}) each type's edges in edge-id order")


def check_blocks(sampler: Any, blocks: Any, seeds: torch.Tensor) -> Any:
    """``blocks`` if they keep the `Sampler` contract for ``seeds``, as loaders rely on it (labels and link
    indices are positions in ``seeds``), else an error naming the sampler's type.

    The contract: a sequence of ``sampler.num_layers`` blocks, outermost first, whose last block's
    ``dst_nodes`` are ``seeds`` in order (compared where they lie on the host; blocks on a GPU are not
    read back for it).

    Parameters
    ----------
    sampler : Sampler
        The sampler that returned ``blocks`` (its ``num_layers`` and type name are read).
    blocks : list of samplers.Block
        What ``sampler.sample(seeds, ...)`` returned.
    seeds : torch.Tensor, integer [B]
        The seeds it was called with (compared as int64).

    Returns
    -------
    list of samplers.Block
        ``blocks``, unchanged.

    Raises
    ------
    TypeError
        ``blocks`` is not a non-empty sequence of blocks (objects with ``src_nodes`` and ``dst_nodes``).
    ValueError
        Another number of blocks than ``num_layers``, or last destinations other than ``seeds``.
    """
    name = type(sampler).__name__
    if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Sequence) or not blocks or not all(
            hasattr(b, "src_nodes") and hasattr(b, "dst_nodes") for b in blocks):
        got = f"an empty {type(blocks).__name__}" if isinstance(blocks, Sequence) and not blocks \
            else type(blocks).__name__
        raise TypeError(f"{name}.sample must return its blocks (a list of samplers.Block, outermost first), "
                        f"got {got}")
    if len(blocks) != sampler.num_layers:
        raise ValueError(f"{name}.sample returned {len(blocks)} blocks, but its num_layers is "
                         f"{sampler.num_layers}")
    dst = blocks[-1].dst_nodes
    if isinstance(dst, torch.Tensor) and dst.device.type == "cpu":
        want = seeds.reshape(-1).to(torch.int64)
        if tuple(dst.shape) != tuple(want.shape) or not torch.equal(dst.to(torch.int64), want):
            same = min(int(dst.numel()), int(want.numel()))
            diff = torch.nonzero(dst.reshape(-1)[:same].to(torch.int64) != want[:same]).reshape(-1)
            where = (f"first at position {int(diff[0])}: {int(dst.reshape(-1)[diff[0]])} for seed "
                     f"{int(want[diff[0]])}") if diff.numel() else f"{int(dst.numel())} of them"
            raise ValueError(f"{name}.sample broke the Sampler contract: blocks[-1].dst_nodes must be the "
                             f"{int(want.numel())} seeds in order, got {where}")
    return blocks


def check_typed_blocks(sampler: Any, blocks: Any, seeds: Mapping[str, torch.Tensor]) -> Any:
    """`check_blocks` for a typed sampler: also that the blocks are typed (``dst_nodes`` a dict holding every
    seeded type) and that the last block's ``dst_nodes[t]`` are ``seeds[t]`` in order for each seeded type t
    (host blocks; GPU blocks are not read back).

    Parameters
    ----------
    sampler : Sampler
        The sampler that returned ``blocks``.
    blocks : list of samplers.HeteroBlock
        What ``sampler.sample(seeds, ...)`` returned.
    seeds : mapping str -> torch.Tensor, integer [B_t]
        The seeds it was called with, per node type (at least one type).

    Returns
    -------
    list of samplers.HeteroBlock
        ``blocks``, unchanged.

    Raises
    ------
    TypeError
        `check_blocks`'s; blocks that are not typed, or lack a seeded type (named with the sampler's type).
    ValueError
        `check_blocks`'s; last destinations of a type other than its seeds.
    """
    check_blocks(sampler, blocks, next(iter(seeds.values())))
    name = type(sampler).__name__
    dst = blocks[-1].dst_nodes
    if not isinstance(dst, Mapping) or any(t not in dst for t in seeds):
        types = ", ".join(repr(t) for t in seeds)
        missing = [t for t in seeds if t not in dst] if isinstance(dst, Mapping) else []
        got = f"no {missing[0]!r} key" if missing else type(dst).__name__
        kind = "seed types" if len(seeds) > 1 else "seed type"
        raise TypeError(f"{name}.sample must return typed blocks (samplers.HeteroBlock: dst_nodes a dict by "
                        f"node type with the {kind} {types}), got dst_nodes {got}")
    for t, want in seeds.items():
        got = dst[t]
        want = want.reshape(-1).to(torch.int64)
        if isinstance(got, torch.Tensor) and got.device.type == "cpu" and (
                tuple(got.shape) != tuple(want.shape) or not torch.equal(got.to(torch.int64), want)):
            raise ValueError(f"{name}.sample broke the Sampler contract: blocks[-1].dst_nodes[{t!r}] must be "
                             f"the {int(want.numel())} seeds in order")
    return blocks


def edges_by_id(graph, relation=None) -> tuple[np.ndarray, np.ndarray]:
    """(source, destination) of every edge id of a `CSCGraph`, or of ``relation`` of a `samplers.HeteroGraph`
    (ids within their node types), int64 [E] each: edge ``e`` is ``src[e] -> dst[e]``.

    Raises
    ------
    ValueError
        A `samplers.HeteroGraph` without ``relation``.
    """
    if relation is None:
        if isinstance(graph.indptr, Mapping):
            raise ValueError("edges_by_id: a HeteroGraph's edge ids are per relation; give relation=")
        return _by_id(graph.indptr.numpy(), graph.indices.numpy(), graph.csc_edge_ids().numpy())
    return _by_id(graph.indptr[relation].numpy(), graph.indices[relation].numpy(),
                  graph.edge_ids[relation].numpy())


def _by_id(indptr: np.ndarray, indices: np.ndarray, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source, destination) int64 [E] of a CSC's edges (``indptr`` [N + 1], ``indices`` / ``eids`` [E]),
    each at its edge id."""
    src = np.empty(eids.shape[0], dtype=np.int64)
    dst = np.empty(eids.shape[0], dtype=np.int64)
    src[eids] = indices
    dst[eids] = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))
    return src, dst


def _int64(v) -> np.ndarray:
    """A tensor or array of ids as int64 numpy [n] on the host."""
    return np.asarray(v.cpu() if isinstance(v, torch.Tensor) else v, dtype=np.int64).reshape(-1)


def _check_pairs(name: str, ours: tuple, theirs: tuple, what: str, of: str, build: str) -> None:
    """ValueError naming the first edge id whose (source, destination) differs between ``ours`` (the
    sampler's) and ``theirs`` (``what``'s), int64 [E] pairs of equal length; ``of`` / ``build`` word it."""
    (s, d), (src, dst) = ours, theirs
    bad = np.flatnonzero((s != src) | (d != dst))
    if bad.size:
        j = int(bad[0])
        raise ValueError(f"{name}'s graph is not {what}: {bad.size} of {src.shape[0]} edge ids{of} join "
                         f"other nodes, first edge {j}: {s[j]} -> {d[j]} in the sampler's graph, {src[j]} -> "
                         f"{dst[j]} in {what} (build it as {build})")


def check_same_edges(name: str, sampler: Any, src, dst, num_nodes: int, what: str) -> None:
    """ValueError naming ``name`` unless ``sampler.graph`` has ``num_nodes`` nodes and its edge ``j`` is
    ``src[j] -> dst[j]`` for every j (the edge ids the adapters report are the caller's).

    Parameters
    ----------
    src, dst : torch.Tensor or numpy.ndarray, integer [E]
        The caller's edges in edge-id order (PyG: ``edge_index`` columns; DGL: ``g.edges(order="eid")``).
    what : str
        The caller's graph in words, for the message.

    Raises
    ------
    ValueError
        Another node or edge count, or the first edge id whose endpoints differ (with both pairs).
    """
    ours = sampler.graph
    src, dst = _int64(src), _int64(dst)
    if (ours.num_nodes, ours.num_edges) != (int(num_nodes), int(src.shape[0])):
        raise ValueError(f"{name}'s graph has {ours.num_nodes} nodes and {ours.num_edges} edges, {what} "
                         f"{int(num_nodes)} and {int(src.shape[0])}")
    _check_pairs(name, edges_by_id(ours), (src, dst), what, "",
                 "CSCGraph.from_edges(src, dst, num_nodes) with the edges in edge-id order")

"""A `NeighborLoader`'s seeds and labels, checked once: `loader_seeds` and `LoaderSeeds`, and
`group_by_type`, which cuts a batch of seeds of several node types into a dict by type.

Plain graphs take ids or a bool mask, torch's or numpy's (uint8, torch's or numpy's, a mask to torch and
ids to PyG, is refused: `samplers._checks.check_id_dtype`); typed graphs take ``(node type, ids or mask)``
or ``{node type: ids or mask, ...}`` with one type (PyG's ``input_nodes=("paper", idx)``) or several
(DGL's ``DataLoader(g, {"user": u, "artist": a}, sampler)``: the types' ids concatenated in the dict's
order, each batch grouped by type as DGL's ``TensorizedDataset`` groups it). Used by `samplers.loader`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrl.graph import CSCGraph
from samplers._checks import check_seeds
from samplers.hetero_graph import HeteroGraph

__all__ = ["LoaderSeeds", "group_by_type", "loader_seeds"]


@dataclass(frozen=True)
class LoaderSeeds:
    """A loader's checked seeds and labels.

    Attributes
    ----------
    seeds : numpy.ndarray, int64, shape [M]
        Ids within their node type; with several types each type's ids one after the other.
    seed_type : str or None
        The one seed type over a `HeteroGraph`; None over a `CSCGraph` or with several types.
    seed_types : tuple of str
        The seed types in the order given; ``()`` over a `CSCGraph`.
    type_index : numpy.ndarray, int64, shape [M], or None
        ``seed_types[type_index[i]]`` is the type of ``seeds[i]``; None over a `CSCGraph`.
    labels : torch.Tensor, dict str -> torch.Tensor, or None
        [N, ...] (one type: the seed type's); with several types a dict with every seed type's.
    """

    seeds: np.ndarray
    seed_type: str | None
    seed_types: tuple[str, ...]
    type_index: np.ndarray | None
    labels: torch.Tensor | dict[str, torch.Tensor] | None


def loader_seeds(graph: CSCGraph | HeteroGraph, seeds: Any, labels: Any) -> LoaderSeeds:
    """Check a loader's ``seeds`` and ``labels`` against ``graph`` (see `samplers.NeighborLoader` for what
    each may be).

    Raises
    ------
    TypeError
        Seeds neither ids nor a mask (typed: neither a (type, ids) pair nor a dict), or uint8, torch's or
        numpy's (``mask.bool()`` / ``mask.astype(bool)`` for a mask, ``ids.long()`` for ids); labels not a
        tensor (several seed types: not a dict).
    ValueError
        Ids outside [0, N) of their type or a mask of another length; an unknown node type, or none; labels
        with another number of rows than their type's nodes, naming an unknown type, or a dict lacking a seed
        type's (absent or None), with one seed type or several.
    """
    if not isinstance(graph, HeteroGraph):
        ids = _seed_ids(seeds, graph.num_nodes, "seeds", "num_nodes")
        return LoaderSeeds(ids, None, (), None, _check_labels(labels, graph.num_nodes, "num_nodes"))
    pairs = _typed_seeds(graph, seeds)
    types = tuple(t for t, _ in pairs)
    ids = [_seed_ids(v, graph.num_nodes[t], f"seeds[{t!r}]", f"num_nodes[{t!r}]") for t, v in pairs]
    type_index = np.repeat(np.arange(len(ids), dtype=np.int64), [len(v) for v in ids])
    flat = np.concatenate(ids) if len(ids) > 1 else ids[0]
    return LoaderSeeds(flat, types[0] if len(types) == 1 else None, types, type_index,
                       _typed_labels(graph, types, labels))


def group_by_type(seeds: np.ndarray, type_index: np.ndarray, types: tuple[str, ...],
                  positions: np.ndarray) -> dict[str, torch.Tensor]:
    """The seeds at ``positions`` (int64 [B] into ``seeds``) by type: ``{t: int64 [B_t]}`` for every type of
    ``types`` in that order (empty where none), in ``positions`` order within a type (DGL's grouping)."""
    kinds = type_index[positions]
    return {t: torch.from_numpy(seeds[positions[kinds == k]]) for k, t in enumerate(types)}


def _seed_ids(seeds: Any, n: int, name: str, bound: str) -> np.ndarray:
    """``seeds`` (int ids in [0, n) or a bool mask [n]) as int64 ids, checked; ``name`` / ``bound`` word the
    errors (``"seeds"`` / ``"num_nodes"``, or ``"seeds['paper']"`` / ``"num_nodes['paper']"``)."""
    if isinstance(seeds, torch.Tensor) and seeds.dtype == torch.bool or \
            isinstance(seeds, np.ndarray) and seeds.dtype == np.bool_:
        mask = torch.as_tensor(seeds)
        if tuple(mask.shape) != (n,):
            raise ValueError(f"{name} as a mask must have shape [{bound}={n}], got {tuple(mask.shape)}")
        seeds = torch.nonzero(mask).reshape(-1)
    return check_seeds(seeds, n, name=name, bound=bound)


def _typed_seeds(graph: HeteroGraph, seeds: Any) -> list[tuple[str, Any]]:
    """The node types and ids (or masks) of typed seeds, in the order given: ``(type, ids)`` or ``{type: ids,
    ...}`` (one type or several)."""
    if isinstance(seeds, Mapping):
        if not seeds:
            raise ValueError("seeds must name at least one node type, got an empty dict")
        pairs = list(seeds.items())
    elif isinstance(seeds, tuple) and len(seeds) == 2 and isinstance(seeds[0], str):
        pairs = [seeds]
    else:
        raise TypeError(f"seeds over a HeteroGraph must be (node type, ids or mask) or {{node type: ids or "
                        f"mask, ...}}, got {type(seeds).__name__}")
    for t, _ in pairs:
        if t not in graph.num_nodes:
            raise ValueError(f"seeds: unknown node type {t!r} (the graph has {graph.node_types})")
    return pairs


def _check_labels(labels: Any, n: int, at: str, name: str = "labels") -> torch.Tensor | None:
    """``labels`` (a tensor [n, ...] or None) checked; ``at`` / ``name`` word the errors."""
    if labels is None:
        return None
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(labels).__name__}")
    if labels.dim() < 1 or labels.shape[0] != n:
        raise ValueError(f"{name} must have shape [{at}={n}, ...], got {tuple(labels.shape)}")
    return labels


def _known_types(graph: HeteroGraph, labels: Mapping) -> None:
    for t in labels:
        if t not in graph.num_nodes:
            raise ValueError(f"labels: unknown node type {t!r} (the graph has {graph.node_types})")


def _typed_labels(graph: HeteroGraph, types: tuple[str, ...],
                  labels: Any) -> torch.Tensor | dict[str, torch.Tensor] | None:
    """The labels of typed seeds, by one rule for one seed type or several: None; with one seed type its
    tensor [num_nodes[t], ...]; or a dict by node type holding a tensor for every seed type (entries of
    other types unused). A dict whose entry for a seed type is None or absent is refused, never read as no
    labels (that is ``labels=None``), so a batch never lacks labels silently. Returns the seed type's tensor
    with one seed type, a dict of every seed type's with several, or None."""
    if labels is None:
        return None
    if not isinstance(labels, Mapping):
        if len(types) > 1:
            raise TypeError(f"labels must be a dict node type -> tensor (or None) with seeds of several "
                            f"types {list(types)}, got {type(labels).__name__}")
        return _check_labels(labels, graph.num_nodes[types[0]], f"num_nodes[{types[0]!r}]")
    _known_types(graph, labels)
    missing = [t for t in types if labels.get(t) is None]
    if missing:
        have = [t for t, v in labels.items() if v is not None]
        raise ValueError(f"labels has no labels for the seed types {missing} (it has {have}; an entry None "
                         f"is none: give every seed type's labels, or labels=None)")
    checked = {t: _check_labels(labels[t], graph.num_nodes[t], f"num_nodes[{t!r}]", f"labels[{t!r}]")
               for t in types}
    return checked[types[0]] if len(types) == 1 else checked

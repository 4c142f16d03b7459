"""The `Sampler` protocol: what loaders and adapters need of a sampler (PyG's ``BaseSampler`` idea).

`NeighborSampler`, `LaborSampler` (plain graphs) satisfy it, and so does any object with these
members; `NeighborLoader`, `LinkSampler` / `LinkLoader`, `PygSampler` and `DglSampler` take one.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Sampler", "check_sampler"]


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


def check_sampler(name: str, sampler: Any) -> Any:
    """``sampler`` if it follows `Sampler` over a plain graph, else TypeError naming ``name``."""
    from graphrl.graph import CSCGraph

    if not isinstance(sampler, Sampler) or not isinstance(getattr(sampler, "graph", None), CSCGraph):
        raise TypeError(f"{name} must be a Sampler over a CSCGraph (NeighborSampler, LaborSampler, ...), "
                        f"got {type(sampler).__name__}")
    return sampler

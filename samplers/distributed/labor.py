"""`DistLaborSampler`: LABOR-0 over a partitioned graph, identical to `LaborSampler(importance_sampling=0)`.

Layer-neighbour sampling keeps in-edge (u, t) iff the source's variate ``r_u`` (one per source and
layer, keyed by the layer's variate key and u's global id) is below the row's keep probability, which
LABOR-0 computes from the row alone (``min(1, k / d)``, or from its weights). So each owner runs the
core's LABOR mode on its rows and the blocks, edge weights included, equal `LaborSampler`'s on the whole
graph. LABOR-i with i != 0 is not offered: its importance-sampling probabilities are fixed points over
all rows that share a source, across owners, which one request per owner per layer cannot compute.
See docs/architecture.md#partitioned-graphs.
"""

from __future__ import annotations

from collections.abc import Sequence

from samplers.distributed.core import layer_key
from samplers.distributed.sampler import DistNeighborSampler

__all__ = ["DistLaborSampler"]


class DistLaborSampler(DistNeighborSampler):
    """LABOR-0 blocks from a partitioned graph through its owners (as `DistNeighborSampler`).

    Parameters
    ----------
    owners : samplers.distributed.LocalOwners or RayOwners
    fanouts : sequence of int
        k per layer, outermost first; -1 keeps every in-edge.
    weighted : bool
        Non-uniform LABOR by the folder's edge weights (as ``LaborSampler(weights=True)``); blocks then
        carry ``edge_weights`` (float32 [nnz], each row's mean 1).
    layer_dependency : bool
        One set of variates for every layer of a call (DGL's meaning).
    seed : int or None

    Raises
    ------
    TypeError, ValueError
        As `DistNeighborSampler`.

    References
    ----------
    Balin and Catalyurek, "Layer-Neighbor Sampling -- Defusing Neighborhood Explosion in GNNs" (NeurIPS
    2023); DGL's ``LaborSampler``.
    """

    def __init__(self, owners, fanouts: Sequence[int], *, weighted: bool = False,
                 layer_dependency: bool = False, seed: int | None = None) -> None:
        super().__init__(owners, fanouts, replace=False, weighted=weighted, seed=seed)
        self.layer_dependency = bool(layer_dependency)
        self.kind = "labor"

    def _keys(self, call: int, layer: int) -> tuple[int, int]:
        variate_layer = 0 if self.layer_dependency else layer
        return layer_key(self.seed, call, layer), layer_key(self.seed, call, variate_layer)

    def _returns_weights(self) -> bool:
        """Blocks carry ``edge_weights`` (empty ones for an empty frontier) when ``weighted``."""
        return self.weighted

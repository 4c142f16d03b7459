"""Weighted neighbour sampling without edge times: successive weighted draws (A-ES's law), drawn by
rejection over per-row prefix sums computed once per relation (`samplers.kernels.cpu.weighted`,
`samplers.kernels.cuda.weighted`; the reference's "weighted rows")."""

from __future__ import annotations

from typing import Any

from samplers.kernels import cpu
from samplers.modes.base import LayerEdges, LayerRequest, Mode, RelationArrays

__all__ = ["WeightedMode"]


class WeightedMode(Mode):
    """Draws proportional to the relation's edge weights; an edge of weight 0 is never drawn.

    Parameters
    ----------
    replace : bool
        Draw with replacement (each draw w / row sum); without, k successive draws without replacement.
    """

    name = "weighted"

    def __init__(self, replace: bool = False) -> None:
        self.replace = bool(replace)

    def prepare(self, relation: RelationArrays, device: str) -> Any:
        """CPU: the per-row prefix sums and positive counts (`samplers.kernels.cpu.weight_prefix`); the
        GPU's are built with the relation's `CudaGraph`."""
        if device != "cpu":
            return None
        return cpu.weight_prefix(relation.indptr, relation.weights, threads=1)

    def sample_cpu(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        prefix, positive = state
        out_indptr, src, eids = cpu.sample_layer(
            relation.indptr, relation.indices, relation.edge_ids, request.dst, request.fanout, self.replace,
            request.key, request.excluded, request.threads, relation.weights, prefix=prefix,
            positive=positive)
        return LayerEdges(out_indptr, src, eids)

    def sample_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        from samplers.kernels import cuda as ck

        out_indptr, src, eids = ck.sample_layer_cuda(relation.cuda, request.dst, request.fanout, self.replace,
                                                     request.key, True, request.excluded)
        return LayerEdges(out_indptr, src, eids)

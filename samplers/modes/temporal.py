"""Temporal neighbour sampling: a row of time t draws only edges of time <= t, uniformly or by weight
(exponential keys or prefix-sum inversion: `samplers.kernels.cpu.temporal`,
`samplers.kernels.cuda.temporal`); TGL's rule (Zhou et al., VLDB 2022)."""

from __future__ import annotations

from typing import Any

from samplers.kernels import cpu
from samplers.modes.base import LayerEdges, LayerRequest, Mode, RelationArrays

__all__ = ["TemporalMode"]


class TemporalMode(Mode):
    """Draws among the edges at or before each row's time (``LayerRequest.dst_times``), weighted when
    the relation has weights.

    Parameters
    ----------
    replace : bool
        Draw with replacement.
    """

    name = "temporal"

    def __init__(self, replace: bool = False) -> None:
        self.replace = bool(replace)

    def prepare(self, relation: RelationArrays, device: str) -> Any:
        """CPU: the edge times' (and weights') `samplers.kernels.cpu.Masks` for the fused layer; CUDA: the
        relation's `samplers.kernels.cuda.bounded.DegreeBound` (a chained layer of fanout -1 sizes its
        outputs by it)."""
        if device != "cpu":
            from samplers.kernels.cuda.bounded import DegreeBound

            return DegreeBound.of(relation.indptr)
        return cpu.Masks(relation.weights, relation.times, relation.indptr)

    def sample_cpu(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        out_indptr, src, eids = cpu.sample_layer(
            relation.indptr, relation.indices, relation.edge_ids, request.dst, request.fanout, self.replace,
            request.key, request.excluded, request.threads, relation.weights, relation.times,
            request.dst_times, pairs=relation.pairs)
        return LayerEdges(out_indptr, src, eids)

    def sample_block_cpu(self, relation: RelationArrays, state: Any, request: LayerRequest,
                         workspace: Any) -> tuple:
        return cpu.sample_block(relation.indptr, relation.indices, relation.edge_ids, request.dst,
                                request.fanout, self.replace, request.key, request.excluded, workspace,
                                request.threads, state, request.dst_times, pairs=relation.pairs)

    def sample_block_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest,
                          workspace: Any) -> Any:
        """A chained layer (``request.dst`` a `samplers.kernels.cuda.layer.DeviceRows` with times): its
        `samplers.kernels.cuda.layer.PendingBlock`; None otherwise (the loop samples and relabels apart)."""
        from samplers.kernels import cuda as ck
        from samplers.kernels.cuda.layer import DeviceRows

        if not isinstance(request.dst, DeviceRows):
            return None
        return ck.sample_block_cuda(relation.cuda, request.dst, request.fanout, self.replace, request.key,
                                    relation.weights is not None, request.excluded, ws=workspace,
                                    degrees=state)

    def sample_edges_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest,
                          workspace: Any, scratch: str = "src") -> Any:
        from samplers.kernels.cuda.bounded import sample_edges_bounded

        return sample_edges_bounded(relation.cuda, request.dst, request.fanout, self.replace, request.key,
                                    relation.weights is not None, request.excluded, workspace, scratch,
                                    degrees=state)

    def bounded_cuda(self, relation: RelationArrays, fanout: int) -> bool:
        """Every temporal layer chains on the device (masked rows by time, with or without replacement; at
        fanout -1 by a capacity from the degrees: `samplers.kernels.cuda.bounded.bounded_layer`)."""
        from samplers.kernels.cuda.bounded import bounded_layer

        return bounded_layer(relation.cuda, fanout, relation.weights is not None, timed=True)

    def sample_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        from samplers.kernels import cuda as ck

        out_indptr, src, eids = ck.sample_layer_cuda(relation.cuda, request.dst, request.fanout, self.replace,
                                                     request.key, relation.weights is not None,
                                                     request.excluded, request.dst_times)
        return LayerEdges(out_indptr, src, eids)

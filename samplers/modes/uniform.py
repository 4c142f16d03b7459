"""Uniform neighbour sampling: k in-edges per row, with or without replacement (Floyd's algorithm).

The rule of docs/architecture.md#sampling-rules; kernels `samplers.kernels.cpu.uniform` and
`samplers.kernels.cuda.uniform`.
"""

from __future__ import annotations

from typing import Any

from samplers.kernels import cpu
from samplers.modes.base import LayerEdges, LayerRequest, Mode, RelationArrays

__all__ = ["UniformMode"]


class UniformMode(Mode):
    """Uniform draws: min(d, k) distinct in-edges without replacement, k draws with (0 when d = 0).

    Parameters
    ----------
    replace : bool
        Draw with replacement.
    """

    name = "uniform"

    def __init__(self, replace: bool = False) -> None:
        self.replace = bool(replace)

    def prepare(self, relation: RelationArrays, device: str) -> Any:
        """CUDA: the relation's `samplers.kernels.cuda.bounded.DegreeBound` (a chained layer of fanout -1
        sizes its outputs by it); None on the CPU."""
        if device == "cpu":
            return None
        from samplers.kernels.cuda.bounded import DegreeBound

        return DegreeBound.of(relation.indptr)

    def sample_cpu(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        out_indptr, src, eids = cpu.sample_layer(
            relation.indptr, relation.indices, relation.edge_ids, request.dst, request.fanout, self.replace,
            request.key, request.excluded, request.threads, pairs=relation.pairs)
        return LayerEdges(out_indptr, src, eids)

    def sample_block_cpu(self, relation: RelationArrays, state: Any, request: LayerRequest,
                         workspace: Any) -> tuple:
        return cpu.sample_block(relation.indptr, relation.indices, relation.edge_ids, request.dst,
                                request.fanout, self.replace, request.key, request.excluded, workspace,
                                request.threads, None, request.dst_times, pairs=relation.pairs,
                                next_fanout=request.next_fanout)

    def sample_block_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest,
                          workspace: Any) -> tuple:
        from samplers.kernels import cuda as ck

        return ck.sample_block_cuda(relation.cuda, request.dst, request.fanout, self.replace, request.key,
                                    False, request.excluded, ws=workspace, degrees=state)

    def sample_edges_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest,
                          workspace: Any, scratch: str = "src") -> Any:
        from samplers.kernels.cuda.bounded import sample_edges_bounded

        return sample_edges_bounded(relation.cuda, request.dst, request.fanout, self.replace, request.key,
                                    False, request.excluded, workspace, scratch, degrees=state)

    def bounded_cuda(self, relation: RelationArrays, fanout: int) -> bool:
        """Every uniform layer chains on the device: at fanout >= 0 by ``D * fanout``, at -1 by a capacity
        from the degrees (`samplers.kernels.cuda.bounded.bounded_layer`)."""
        from samplers.kernels.cuda.bounded import bounded_layer

        return bounded_layer(relation.cuda, fanout, False)

    def sample_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        from samplers.kernels import cuda as ck

        out_indptr, src, eids = ck.sample_layer_cuda(relation.cuda, request.dst, request.fanout, self.replace,
                                                     request.key, False, request.excluded)
        return LayerEdges(out_indptr, src, eids)

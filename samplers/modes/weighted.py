"""Weighted neighbour sampling without edge times: successive weighted draws (A-ES's law), drawn by
rejection over per-row prefix sums computed once per relation (`samplers.kernels.cpu.weighted`,
`samplers.kernels.cuda.weighted`; the reference's "weighted rows")."""

from __future__ import annotations

from typing import Any

from graphrl.kernels import advise_huge_pages
from graphrl.threads import team_size
from samplers.feature_table import HUGE_TABLE_BYTES
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
        """CPU: the weights' `samplers.kernels.cpu.Masks` with the per-row prefix sums and positive
        counts (``relation.prefix`` and ``positive``: computed here once unless handed in, and kept there),
        on transparent huge pages when an array is `HUGE_TABLE_BYTES` or more (every row reads its own
        random span of them: with 4 KiB pages nearly each one misses the TLB). CUDA: the relation's
        `samplers.kernels.cuda.bounded.DegreeBound` (a chained layer of fanout -1 sizes its outputs by
        it; the GPU's prefix sums are built with the relation's `CudaGraph`)."""
        if device != "cpu":
            from samplers.kernels.cuda.bounded import DegreeBound

            return DegreeBound.of(relation.indptr)
        if relation.prefix is None or relation.positive is None:
            relation.prefix, relation.positive = cpu.weight_prefix(relation.indptr, relation.weights,
                                                                   team_size())
        masks = cpu.Masks(relation.weights, None, prefix=relation.prefix, positive=relation.positive)
        for arr in (masks.prefix, masks.weights, masks.node_count):
            if arr.nbytes >= HUGE_TABLE_BYTES:
                advise_huge_pages(arr.ctypes.data, arr.nbytes, collapse=True)
        return masks

    def sample_cpu(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        prefix, positive = state.prefix, state.node_count
        out_indptr, src, eids = cpu.sample_layer(
            relation.indptr, relation.indices, relation.edge_ids, request.dst, request.fanout, self.replace,
            request.key, request.excluded, request.threads, relation.weights, prefix=prefix,
            positive=positive, pairs=relation.pairs)
        return LayerEdges(out_indptr, src, eids)

    def sample_block_cpu(self, relation: RelationArrays, state: Any, request: LayerRequest,
                         workspace: Any) -> tuple:
        return cpu.sample_block(relation.indptr, relation.indices, relation.edge_ids, request.dst,
                                request.fanout, self.replace, request.key, request.excluded, workspace,
                                request.threads, state, request.dst_times, pairs=relation.pairs,
                                next_fanout=request.next_fanout)

    def sample_block_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest,
                          workspace: Any) -> tuple:
        from samplers.kernels import cuda as ck

        return ck.sample_block_cuda(relation.cuda, request.dst, request.fanout, self.replace, request.key,
                                    True, request.excluded, ws=workspace, degrees=state)

    def sample_edges_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest,
                          workspace: Any, scratch: str = "src") -> Any:
        from samplers.kernels.cuda.bounded import sample_edges_bounded

        return sample_edges_bounded(relation.cuda, request.dst, request.fanout, self.replace, request.key,
                                    True, request.excluded, workspace, scratch, degrees=state)

    def bounded_cuda(self, relation: RelationArrays, fanout: int) -> bool:
        """Every weighted layer chains on the device: at fanout >= 0 by ``D * fanout`` (the graph's prefix
        sums), at -1 by a capacity from the degrees (`samplers.kernels.cuda.bounded.bounded_layer`)."""
        from samplers.kernels.cuda.bounded import bounded_layer

        return bounded_layer(relation.cuda, fanout, True)

    def sample_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        from samplers.kernels import cuda as ck

        out_indptr, src, eids = ck.sample_layer_cuda(relation.cuda, request.dst, request.fanout, self.replace,
                                                     request.key, True, request.excluded)
        return LayerEdges(out_indptr, src, eids)

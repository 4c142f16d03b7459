"""Layer-neighbour sampling (LABOR): one random variate per source and layer, shared by every row.

Row t keeps edge (u, t) iff ``r_u < c_t * f`` with ``f = pi_u`` (importance sampling), the edge weight
(weighted) or 1, and c_t chosen so that t keeps k edges in expectation (LABOR-0: keep probability
``min(1, k / d)``). Rows that share sources share their draws, so a layer reaches fewer distinct
sources than neighbour sampling at the same fanout. Kernels: `samplers.kernels.cpu.labor`,
`samplers.kernels.cuda.labor` (same arithmetic, `samplers.kernels.labor_rows`).

References
----------
Balin and Catalyurek, "Layer-Neighbor Sampling -- Defusing Neighborhood Explosion in GNNs" (NeurIPS
2023); DGL's ``dgl.dataloading.LaborSampler`` and GraphBolt's ``LayerNeighborSampler``.
"""

from __future__ import annotations

from typing import Any

from samplers.kernels.cpu.labor import LaborScratch, labor_layer
from samplers.modes.base import LayerEdges, LayerRequest, Mode, RelationArrays

__all__ = ["LaborMode"]


class LaborMode(Mode):
    """LABOR-i rows (DGL's argument meanings).

    Parameters
    ----------
    importance_sampling : int
        i of LABOR-i: 0 keeps each edge with probability min(1, k / d) (weighted: ``c_t * A``); i > 0
        runs i fixed-point iterations of the importance-sampling probabilities pi; i < 0 iterates until
        the expected number of sources stops shrinking.
    want_weights : bool
        Return each kept edge's weight ``A / p`` (``1 / p`` unweighted), scaled so that each row's mean
        is 1 (DGL's ``edge_weights``).
    """

    name = "labor"

    def __init__(self, importance_sampling: int = 0, want_weights: bool = False) -> None:
        self.importance_sampling = int(importance_sampling)
        self.want_weights = bool(want_weights)

    def prepare(self, relation: RelationArrays, device: str) -> Any:
        """CPU: the importance-sampling scratch over the relation's source ids (None at LABOR-0); CUDA:
        a `samplers.kernels.cuda.labor.LaborCudaState` (that scratch, and the in-degrees' bounds), its device
        arrays from the relation's `CudaGraph`'s memory (owner ``"samplers.labor"``)."""
        if device == "cpu":
            return None if self.importance_sampling == 0 else LaborScratch(relation.num_src)
        from samplers.kernels.cuda.labor import LaborCudaState

        return LaborCudaState.of(relation.indptr, relation.num_src, self.importance_sampling,
                                 None if relation.cuda is None else relation.cuda.memory)

    def sample_cpu(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        out_indptr, src, eids, weights = labor_layer(
            relation.indptr, relation.indices, relation.edge_ids, request.dst, request.fanout,
            request.variate_key, request.excluded, relation.weights, self.importance_sampling,
            self.want_weights, state, request.threads, pairs=relation.pairs)
        return LayerEdges(out_indptr, src, eids, weights)

    def sample_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest) -> LayerEdges:
        from samplers.kernels.cuda.labor import labor_layer_cuda

        out_indptr, src, eids, weights = labor_layer_cuda(
            relation.cuda, request.dst, request.fanout, request.variate_key, request.excluded,
            self.importance_sampling, self.want_weights, state.scratch)
        return LayerEdges(out_indptr, src, eids, weights)

    def bounded_cuda(self, relation: RelationArrays, fanout: int) -> bool:
        """LABOR chains on the device at a fanout >= 0, importance sampling and weights included
        (`samplers.kernels.cuda.labor.chains`)."""
        from samplers.kernels.cuda.labor import chains

        return chains(fanout)

    def sample_block_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest,
                          workspace: Any) -> Any:
        """A chained layer (``request.dst`` a `samplers.kernels.cuda.layer.DeviceRows`): its
        `samplers.kernels.cuda.labor.LaborPendingBlock` (`samplers.kernels.cuda.labor.labor_edges_bounded`,
        with its edge weights); None otherwise (the loop samples and relabels apart)."""
        from dataclasses import fields

        from samplers.kernels.cuda.labor import LaborPendingBlock
        from samplers.kernels.cuda.layer import DeviceRows, relabel_chained

        if not isinstance(request.dst, DeviceRows):
            return None
        edges = self.sample_edges_cuda(relation, state, request, workspace)
        block = relabel_chained(request.dst, edges, workspace, relation.num_src)  # at most N + repeats rows
        return LaborPendingBlock(**{f.name: getattr(block, f.name) for f in fields(block)},
                                 edge_weights=edges.edge_weights)

    def sample_edges_cuda(self, relation: RelationArrays, state: Any, request: LayerRequest,
                          workspace: Any, scratch: str = "src") -> Any:
        """A chained layer's `samplers.kernels.cuda.labor.LaborEdges` (edge weights where wanted)."""
        from samplers.kernels.cuda.labor import labor_edges_bounded

        return labor_edges_bounded(relation.cuda, request.dst, request.fanout, request.variate_key,
                                   request.excluded, workspace, state, self.importance_sampling,
                                   self.want_weights, scratch)

"""Our neighbour sampler behind DGL's own ``DataLoader``: `DglSampler`, a ``dgl.dataloading.Sampler``.

``dgl.dataloading.DataLoader(g, train_nids, DglSampler([15, 10]), batch_size=...)`` yields
``(input_nodes, output_nodes, blocks)`` as with DGL's ``NeighborSampler``: ``blocks`` are real DGL
blocks (``dgl.create_block``, via `samplers.interop.block_to_dgl`) drawn by our
`samplers.NeighborSampler` kernels, outermost first, with ``srcdata[dgl.NID]``, ``dstdata[dgl.NID]``
and ``edata[dgl.EID]`` holding global node and edge ids. ``fanouts`` follow DGL's order: the last
entry is drawn for the seeds.

Use::

    loader = dgl.dataloading.DataLoader(g, train_nids, DglSampler([10, 10], seed=0), batch_size=64)
    for input_nodes, output_nodes, blocks in loader:
        h = model(blocks, g.ndata["feat"][input_nodes])

DGL is imported (through `graphrl.dglshim`) when the first `DglSampler` is built, never by
``import samplers``. Our `CSCGraph` of a DGL graph is built on its first batch and kept for as long as
that DGL graph lives (one per graph). Homogeneous graphs, CPU sampling.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

from graphrl.graph import CSCGraph
from samplers._optional import LazyBase
from samplers.interop import block_to_dgl
from samplers.neighbor import NeighborSampler

__all__ = ["DglSampler"]


class DglSampler(LazyBase):
    """Neighbour sampling for DGL's ``DataLoader``, drawn with our kernels (``dgl.dataloading.Sampler``).

    Parameters
    ----------
    fanouts : sequence of int
        Neighbours drawn per node, one entry per layer, outermost layer first (as DGL's
        ``NeighborSampler``): ``fanouts[-1]`` is drawn for the seeds. ``-1`` takes every in-neighbour.
    replace : bool
        Draw with replacement.
    seed : int
        Seed of the draws; the n-th batch on a given graph is the same on every run.

    Raises
    ------
    ImportError
        DGL is not installed (see `graphrl.dglshim.import_dgl`).
    TypeError, ValueError
        Bad ``fanouts``, ``replace`` or ``seed``, as `NeighborSampler` raises them (checked here, on a
        one-node graph, so the error comes at construction).

    References
    ----------
    Hamilton, Ying and Leskovec, "Inductive Representation Learning on Large Graphs" (GraphSAGE,
    NeurIPS 2017); DGL's ``dgl.dataloading.NeighborSampler`` and its message-flow-graph (block)
    contract for the output.
    """

    @staticmethod
    def optional_base() -> type:
        """DGL's ``dgl.dataloading.Sampler`` (imports DGL through `graphrl.dglshim`)."""
        from graphrl.dglshim import import_dgl

        return import_dgl().dataloading.Sampler

    def __init__(self, fanouts: Sequence[int] = (15, 10), replace: bool = False, seed: int = 0) -> None:
        if seed is None:
            raise TypeError("seed must be an int, got None (DglSampler batches are reproducible)")
        probe = NeighborSampler(CSCGraph.from_edges([], [], 1), fanouts, replace=replace, seed=seed)
        self.fanouts = probe.fanouts
        self.replace = probe.replace
        self.seed = probe.seed
        self.samplers: dict[int, tuple[weakref.ref, NeighborSampler]] = {}
        """Our `NeighborSampler` (and `CSCGraph`) of each DGL graph sampled so far, by ``id(graph)``."""
        self.lock = threading.Lock()

    def sampler_for(self, g) -> NeighborSampler:
        """Our `NeighborSampler` of DGL graph ``g`` (built on first use, kept while ``g`` lives).

        Raises
        ------
        TypeError
            ``g`` is not a homogeneous DGL graph.
        """
        from graphrl.dglshim import import_dgl

        dgl = import_dgl()
        if not isinstance(g, dgl.DGLGraph):
            raise TypeError(f"g must be a dgl.DGLGraph, got {type(g).__name__}")
        if not g.is_homogeneous:
            raise TypeError(f"g must be a homogeneous DGL graph; got node types {g.ntypes} and edge types "
                            f"{g.etypes} (use samplers.HeteroNeighborSampler for heterogeneous graphs)")
        with self.lock:
            entry = self.samplers.get(id(g))
            if entry is not None and entry[0]() is g:
                return entry[1]
            self.samplers = {k: v for k, v in self.samplers.items() if v[0]() is not None}
            src, dst = g.edges(order="eid")
            graph = CSCGraph.from_edges(src.cpu(), dst.cpu(), g.num_nodes())
            sampler = NeighborSampler(graph, self.fanouts, replace=self.replace, seed=self.seed)
            self.samplers[id(g)] = (weakref.ref(g), sampler)
            return sampler

    def sample(self, g, indices):
        """Sample the blocks of one minibatch (DGL's ``DataLoader`` calls this per batch).

        Parameters
        ----------
        g : dgl.DGLGraph
            A homogeneous graph; its edge ids are the blocks' ``edata[dgl.EID]``.
        indices : torch.Tensor, int64 (any integer dtype), shape [B]
            Seed node ids in [0, g.num_nodes()).

        Returns
        -------
        input_nodes : torch.Tensor, int64, shape [S]
            Global ids of the outermost block's source nodes (rows of the input features).
        output_nodes : torch.Tensor, int64, shape [B]
            The seeds, in order.
        blocks : list of dgl.DGLGraph
            ``len(fanouts)`` DGL blocks, outermost first.

        Raises
        ------
        TypeError
            ``g`` is not a homogeneous DGL graph; ``indices`` is not an integer tensor.
        ValueError
            ``indices`` is not 1-D or holds ids outside [0, g.num_nodes()).
        """
        ours = self.sampler_for(g).sample(indices)
        blocks = [block_to_dgl(b) for b in ours]
        return ours[0].src_nodes, ours[-1].dst_nodes, blocks

    def __repr__(self) -> str:
        return f"DglSampler(fanouts={self.fanouts}, replace={self.replace}, seed={self.seed})"

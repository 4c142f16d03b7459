"""Our neighbour sampler behind DGL's own ``DataLoader``: `DglSampler`, a ``dgl.dataloading.Sampler``.

``dgl.dataloading.DataLoader(g, train_nids, DglSampler([15, 10]), batch_size=...)`` yields
``(input_nodes, output_nodes, blocks)`` as with DGL's ``NeighborSampler``: ``blocks`` are real DGL
blocks (``dgl.create_block``, via `samplers.interop.block_to_dgl`) drawn by our
`samplers.NeighborSampler` kernels, outermost first, with ``srcdata[dgl.NID]``, ``dstdata[dgl.NID]``
and ``edata[dgl.EID]`` holding global node and edge ids, and, as DGL's own blocks, every ``g.ndata``
field in ``srcdata`` / ``dstdata`` and every ``g.edata`` field in ``edata`` (rows of the blocks' nodes and
edges); ids and blocks are of ``g.idtype``. ``fanouts`` follow DGL's order: the last entry is drawn for
the seeds. ``prob="w"`` draws by the edge feature ``w`` (an edge of weight 0 is never drawn), and
``dgl.dataloading.as_edge_prediction_sampler(DglSampler(...))`` excludes edges through ``exclude_eids``.

Use::

    loader = dgl.dataloading.DataLoader(g, train_nids, DglSampler([10, 10], seed=0), batch_size=64)
    for input_nodes, output_nodes, blocks in loader:
        h = model(blocks, g.ndata["feat"][input_nodes])

DGL is imported (through `graphrl.dglshim`) when the first `DglSampler` is built, never by
``import samplers``. Our `CSCGraph` of a DGL graph is built on its first batch and kept while that DGL
graph lives and is not changed (see `DglSampler.sampler_for`). Homogeneous graphs, CPU sampling. A
`DglSampler` pickles (``mp.spawn``, DataLoader workers) as a fresh one built with the same arguments
(docs/architecture.md#pyg-and-dgl-loaders).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import torch

from graphrl.graph import CSCGraph
from samplers._optional import LazyBase
from samplers.interop import block_to_dgl
from samplers.neighbor import NeighborSampler
from samplers.protocol import check_sampler

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
    prob : str or None
        Name of an edge feature of the sampled graph (float [E], non-negative) to draw neighbours
        proportionally to, as DGL's ``NeighborSampler(prob=...)``; edges of weight 0 are never drawn.
        None draws uniformly.
    sampler : Sampler or None
        A `samplers.Sampler` (a `LaborSampler`, say) over the `CSCGraph` of the DGL graph that will be
        sampled (built as ``CSCGraph.from_edges(*g.edges(order="eid"), g.num_nodes())``, so the edge ids
        agree); it then draws every batch and ``fanouts``, ``replace`` and ``prob`` are not used. None:
        a `NeighborSampler` per DGL graph, built on first use.

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

    def __init__(self, fanouts: Sequence[int] = (15, 10), replace: bool = False, seed: int = 0,
                 prob: str | None = None, *, sampler=None) -> None:
        if seed is None:
            raise TypeError("seed must be an int, got None (DglSampler batches are reproducible)")
        probe = NeighborSampler(CSCGraph.from_edges([], [], 1), fanouts, replace=replace, seed=seed)
        self.fanouts = probe.fanouts
        self.replace = probe.replace
        self.seed = probe.seed
        if prob is not None and not isinstance(prob, str):
            raise TypeError(f"prob must be the name of an edge feature (str) or None, got {prob!r}")
        self.prob = prob
        self.fixed = None if sampler is None else check_sampler("sampler", sampler)
        """The `Sampler` given to the constructor, or None."""
        self.output_device = None
        """None: blocks stay on the sampled graph's device (read by DGL's ``EdgePredictionSampler``)."""
        self.samplers: dict[int, tuple[tuple, NeighborSampler]] = {}
        """Our `NeighborSampler` (and `CSCGraph`) of each DGL graph sampled so far, by ``id(graph)``, with
        the state it was built from (see `sampler_for`)."""
        self.lock = threading.Lock()

    def sampler_for(self, g) -> NeighborSampler:
        """Our `NeighborSampler` of DGL graph ``g`` (built on first use, kept while ``g`` lives unchanged);
        the constructor's ``sampler`` instead when one was given.

        The cached sampler is rebuilt when ``g`` changed since: its number of nodes or edges differs, or
        its structure object is a new one (DGL's ``add_nodes`` / ``add_edges`` / ``remove_edges`` /
        ``remove_nodes`` all replace it, so every in-place change made through DGL's API is seen), or
        ``g.edata[prob]`` is another tensor. Not seen: weights changed in place inside the same tensor
        (``g.edata["w"][i] = 0``; assign a new tensor instead), and changes made to DGL's C++ graph
        object behind DGL's Python API.

        Raises
        ------
        TypeError
            ``g`` is not a homogeneous DGL graph.
        ValueError
            ``prob`` names no edge feature of ``g``, or its weights are not [E] non-negative numbers; a
            ``sampler`` given to the constructor samples a graph of another size.
        """
        from graphrl.dglshim import import_dgl

        dgl = import_dgl()
        if not isinstance(g, dgl.DGLGraph):
            raise TypeError(f"g must be a dgl.DGLGraph, got {type(g).__name__}")
        if not g.is_homogeneous:
            raise TypeError(f"g must be a homogeneous DGL graph; got node types {g.ntypes} and edge types "
                            f"{g.etypes} (use samplers.HeteroNeighborSampler for heterogeneous graphs)")
        if self.fixed is not None:
            ours = self.fixed.graph
            if (g.num_nodes(), g.num_edges()) != (ours.num_nodes, ours.num_edges):
                raise ValueError(f"g has {g.num_nodes()} nodes and {g.num_edges()} edges, the sampler's "
                                 f"graph {ours.num_nodes} and {ours.num_edges}")
            return self.fixed
        weights = None
        if self.prob is not None:
            if self.prob not in g.edata:
                raise ValueError(f"prob={self.prob!r} names no edge feature of g "
                                 f"(edge features: {sorted(g.edata.keys())})")
            weights = g.edata[self.prob]
        # DGL has no public change signal; its in-place mutations each assign a new structure object to
        # DGLGraph._graph (dgl/heterograph.py, DGL 2.1), so a weak reference to it tells a changed graph
        structure = g._graph
        with self.lock:
            entry = self.samplers.get(id(g))
            if entry is not None and self._unchanged(entry[0], g, structure, weights):
                return entry[1]
            self.samplers = {k: v for k, v in self.samplers.items() if v[0][0]() is not None}
            src, dst = g.edges(order="eid")
            graph = CSCGraph.from_edges(src.cpu(), dst.cpu(), g.num_nodes())
            sampler = NeighborSampler(graph, self.fanouts, replace=self.replace, seed=self.seed,
                                      weights=None if weights is None else weights.detach().cpu())
            state = (weakref.ref(g), weakref.ref(structure), g.num_nodes(), g.num_edges(),
                     None if weights is None else weakref.ref(weights))
            self.samplers[id(g)] = (state, sampler)
            return sampler

    @staticmethod
    def _unchanged(state: tuple, g, structure, weights) -> bool:
        """Whether ``g`` is the graph a cached sampler was built from, unchanged since (see `sampler_for`)."""
        graph_ref, structure_ref, num_nodes, num_edges, weights_ref = state
        same_weights = weights is None if weights_ref is None else weights_ref() is weights
        return (graph_ref() is g and structure_ref() is structure and g.num_nodes() == num_nodes
                and g.num_edges() == num_edges and same_weights)

    def sample(self, g, indices, exclude_eids=None):
        """Sample the blocks of one minibatch (DGL's ``DataLoader`` calls this per batch).

        Parameters
        ----------
        g : dgl.DGLGraph
            A homogeneous graph; its edge ids are the blocks' ``edata[dgl.EID]``.
        indices : torch.Tensor, int64 (any integer dtype), shape [B]
            Seed node ids in [0, g.num_nodes()).
        exclude_eids : torch.Tensor or None, integer, shape [X]
            Edge ids of ``g`` never drawn (what ``dgl.dataloading.as_edge_prediction_sampler`` passes
            for ``exclude="self"`` and the like).

        Returns
        -------
        input_nodes : torch.Tensor, ``g.idtype``, shape [S]
            Global ids of the outermost block's source nodes (rows of the input features).
        output_nodes : torch.Tensor, ``g.idtype``, shape [B]
            The seeds, in order.
        blocks : list of dgl.DGLGraph
            ``len(fanouts)`` DGL blocks of ``g.idtype``, outermost first, carrying ``g.ndata`` rows in
            ``srcdata`` / ``dstdata`` and ``g.edata`` rows in ``edata`` (as DGL's own blocks).

        Raises
        ------
        TypeError
            ``g`` is not a homogeneous DGL graph; ``indices`` is not an integer tensor.
        ValueError
            ``indices`` is not 1-D or holds ids outside [0, g.num_nodes()); ``exclude_eids`` holds ids
            outside [0, g.num_edges()).
        """
        sampler = self.sampler_for(g)
        if exclude_eids is not None:
            exclude_eids = torch.as_tensor(exclude_eids).cpu()
        ours = sampler.sample(indices.cpu() if isinstance(indices, torch.Tensor) else indices,
                              exclude_eids=exclude_eids)
        blocks = [self._with_features(g, block_to_dgl(b, g.idtype), b) for b in ours]
        return ours[0].src_nodes.to(g.idtype), ours[-1].dst_nodes.to(g.idtype), blocks

    @staticmethod
    def _with_features(g, out, block):
        """Copy ``g.ndata`` / ``g.edata`` rows of ``block``'s nodes and edges into DGL block ``out``."""
        for name, value in g.ndata.items():
            if name not in out.srcdata:  # NID stays the block's own global ids
                out.srcdata[name] = value[block.src_nodes.to(value.device, torch.int64)]
                out.dstdata[name] = value[block.dst_nodes.to(value.device, torch.int64)]
        for name, value in g.edata.items():
            if name not in out.edata:
                out.edata[name] = value[block.edge_ids.to(value.device, torch.int64)]
        return out

    def __getstate__(self) -> dict:
        """The sampler's settings for pickling (``mp.spawn``, DataLoader workers): its lock and its cache
        of per-graph samplers are left out and rebuilt empty by `__setstate__`.

        A copy therefore behaves as a fresh ``DglSampler`` built with the same arguments: its first batch
        on a graph is the original's first batch on that graph, whatever the original drew since (the
        cache is keyed by the graph object, which a pickled graph is not; DGL's own samplers keep no
        per-graph state either).
        """
        state = self.__dict__.copy()
        del state["lock"]
        state["samplers"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled sampler with a new lock and an empty cache (see `__getstate__`)."""
        self.__dict__.update(state)
        self.samplers = {}
        self.lock = threading.Lock()

    def __reduce__(self):
        """Pickle through the front class (`samplers._optional.restore`), then `__setstate__`."""
        restore, (front, _) = super().__reduce__()
        return restore, (front, {}), self.__getstate__()

    def __repr__(self) -> str:
        return (f"DglSampler(fanouts={self.fanouts}, replace={self.replace}, seed={self.seed}, "
                f"prob={self.prob!r})")

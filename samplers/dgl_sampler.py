"""Our neighbour sampler behind DGL's own ``DataLoader``: `DglSampler`, a ``dgl.dataloading.Sampler``.

``dgl.dataloading.DataLoader(g, train_nids, DglSampler([15, 10]), batch_size=...)`` yields
``(input_nodes, output_nodes, blocks)`` as with DGL's ``NeighborSampler``: ``blocks`` are real DGL
blocks (``dgl.create_block``, via `samplers.interop.block_to_dgl` / `hetero_block_to_dgl`) drawn by our
`samplers.NeighborSampler` kernels (`samplers.HeteroNeighborSampler` on a heterograph), outermost first,
with ``srcdata[dgl.NID]``, ``dstdata[dgl.NID]`` and ``edata[dgl.EID]`` holding global node and edge ids,
and, as DGL's own blocks, every node feature in ``srcdata`` / ``dstdata`` and every edge feature in
``edata`` (rows of the blocks' nodes and edges); ids and blocks are of ``g.idtype``. ``fanouts`` follow
DGL's order (the last entry is drawn for the seeds); an entry may be a dict per edge type (name or
canonical triple; an edge type left out of every layer draws nothing), normalised as our typed samplers'
(`samplers._checks.check_relation_fanouts`). ``prob="w"`` draws by the edge feature ``w`` (an
edge of weight 0 is never drawn), ``mask="m"`` only among edges whose feature ``m`` is true (per edge
type on a heterograph; an edge type without the feature draws uniformly).
``dgl.dataloading.as_edge_prediction_sampler(DglSampler(...))`` excludes edges through ``exclude_eids``;
ids that name no edge are ignored, as DGL ignores them.

Use::

    loader = dgl.dataloading.DataLoader(g, train_nids, DglSampler([10, 10], seed=0), batch_size=64)
    for input_nodes, output_nodes, blocks in loader:
        h = model(blocks, g.ndata["feat"][input_nodes])

DGL is imported (through `graphrl.dglshim`) when the first `DglSampler` is built, never by
``import samplers``. Our graph of a DGL graph is built on its first batch and kept while that DGL graph
lives and is not changed (see `DglSampler.sampler_for`). CPU sampling. A `DglSampler` pickles
(``mp.spawn``, DataLoader workers) as a fresh one built with the same arguments
(docs/architecture.md#pyg-and-dgl-loaders). In a torch ``DataLoader`` worker the draws' seed is the
user's seed mixed with the worker's ``torch.initial_seed()``, so workers and epochs draw differently.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from graphrl.graph import CSCGraph
from samplers._checks import (
    check_id_dtype,
    check_layer_fanouts,
    check_relation_fanouts,
    check_seed_and_replace,
)
from samplers._optional import LazyBase
from samplers._stamp import TensorStamp
from samplers.hetero import HeteroGraph, HeteroNeighborSampler
from samplers.interop import block_to_dgl, hetero_block_to_dgl
from samplers.kernels.rng import mixed_seed
from samplers.neighbor import NeighborSampler
from samplers.protocol import check_same_edges, check_same_typed_edges, check_sampler

__all__ = ["DglSampler"]


@dataclass
class CachedSampler:
    """What `DglSampler.sampler_for` keeps per DGL graph: the graph's state when ``sampler`` was built,
    our graph of it and the sampler.

    Attributes
    ----------
    graph_ref, structure_ref : weakref.ref
        The DGL graph and its structure object.
    num_nodes, num_edges : int
        Its totals then.
    stamps : tuple of (TensorStamp or None)
        Per canonical edge type, the ``prob`` / ``mask`` column's stamp (None: no such column).
    graph : CSCGraph or HeteroGraph
        Our graph of the DGL graph, kept across rebuilds for new weights.
    sampler : NeighborSampler or HeteroNeighborSampler
        The sampler drawing its batches.
    generation : int
        How many times the sampler was rebuilt over ``graph`` for new weights.
    """

    graph_ref: weakref.ref
    structure_ref: weakref.ref
    num_nodes: int
    num_edges: int
    stamps: tuple
    graph: CSCGraph | HeteroGraph
    sampler: NeighborSampler | HeteroNeighborSampler
    generation: int

    def same_graph(self, g, structure) -> bool:
        """Whether ``g`` (with structure object ``structure``) is the graph stamped, unchanged in shape."""
        return (self.graph_ref() is g and self.structure_ref() is structure
                and (g.num_nodes(), g.num_edges()) == (self.num_nodes, self.num_edges))

    def same_sources(self, sources: tuple) -> bool:
        """Whether the ``prob`` / ``mask`` columns ``sources`` (per edge type, None where absent) are the
        stamped tensors, unwritten since."""
        return len(sources) == len(self.stamps) and all(
            s is None if t is None else t.matches(s) for t, s in zip(self.stamps, sources, strict=True))


class DglSampler(LazyBase):
    """Neighbour sampling for DGL's ``DataLoader``, drawn with our kernels (``dgl.dataloading.Sampler``).

    Parameters
    ----------
    fanouts : sequence of int, or sequence of dict (edge type -> int)
        Neighbours drawn per node, one entry per layer, outermost layer first (as DGL's
        ``NeighborSampler``): ``fanouts[-1]`` is drawn for the seeds. ``-1`` takes every in-neighbour.
        A dict gives each edge type (canonical triple, or a name one edge type of ``g`` has) its own
        fanout, DGL's ``[{etype: k}, ...]``; an edge type left out of every layer draws nothing, one
        given in some layers must be given in all (0 draws none).
    replace : bool
        Draw with replacement.
    seed : int
        Seed of the draws; the n-th batch on a given graph is the same on every run (outside workers).
    prob : str or None
        Name of an edge feature of the sampled graph (float [E], non-negative) to draw neighbours
        proportionally to, as DGL's ``NeighborSampler(prob=...)``; edges of weight 0 are never drawn.
    mask : str or None
        Name of a boolean edge feature: only edges where it is true are drawn (DGL's ``mask``).
    sampler : Sampler or None
        A `samplers.Sampler` (a `LaborSampler`, say) over the graph of the DGL graph that will be
        sampled: for a homogeneous one, the `CSCGraph` built as ``CSCGraph.from_edges(*g.edges(
        order="eid"), g.num_nodes())``; for a heterograph, the `HeteroGraph` built as
        ``HeteroGraph.from_edges({t: g.num_nodes(t)}, {et: g.edges(order="eid", etype=et)})`` over
        ``g.ntypes`` and ``g.canonical_etypes``, in any order (relations are matched by canonical triple:
        DGL sorts them, a `HeteroGraph` keeps its own order), so the edge ids of each relation agree
        (checked edge by edge once per graph); it then draws every batch (``fanouts``, ``replace``,
        ``prob``, ``mask`` are not used; in a DataLoader worker its seed is mixed as above). Blocks'
        ``edge_weights`` come as ``edata["edge_weights"]``. None: our samplers per DGL graph.

    Raises
    ------
    ImportError
        DGL is not installed (see `graphrl.dglshim.import_dgl`).
    TypeError, ValueError
        Bad ``fanouts``, ``replace`` or ``seed``, as `NeighborSampler` raises them (checked here, so the
        error comes at construction; a dict's edge types are resolved against each graph sampled);
        ``prob`` / ``mask`` not a str; both given (DGL's rule).

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

    def __init__(self, fanouts: Sequence = (15, 10), replace: bool = False, seed: int = 0,
                 prob: str | None = None, mask: str | None = None, *, sampler=None) -> None:
        if seed is None:
            raise TypeError("seed must be an int, got None (DglSampler batches are reproducible)")
        self.fanouts = check_layer_fanouts("fanouts", fanouts)
        check_seed_and_replace(seed, replace)
        self.replace = bool(replace)
        self.seed = int(seed)
        for name, value in (("prob", prob), ("mask", mask)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be the name of an edge feature (str) or None, got {value!r}")
        if prob is not None and mask is not None:
            raise ValueError(f"prob={prob!r} and mask={mask!r}: give at most one (as DGL)")
        self.prob = prob
        self.mask = mask
        self.fixed = None if sampler is None else check_sampler("sampler", sampler, typed=True)
        """The ``sampler`` given to the constructor, or None."""
        self.fixed_typed = sampler is not None and isinstance(sampler.graph, HeteroGraph)
        """Whether ``fixed`` samples a `HeteroGraph` (blocks of a heterograph)."""
        self.fixed_checked = None
        """Weak references to the DGL graph (and its structure object) whose edges were last checked
        against ``fixed``'s graph, or None."""
        self.output_device = None
        """None: blocks stay on the sampled graph's device (read by DGL's ``EdgePredictionSampler``)."""
        self.samplers: dict[int, CachedSampler] = {}
        """Our sampler of each DGL graph sampled so far, by ``id(graph)``, with the state it was built
        from (see `sampler_for`)."""
        self.lock = threading.Lock()

    def _draw_seed(self) -> int:
        """The user's seed, mixed with the worker's ``torch.initial_seed()`` inside a DataLoader worker."""
        if torch.utils.data.get_worker_info() is None:
            return self.seed
        base = torch.initial_seed()
        return mixed_seed(self.seed, base)

    def _weights(self, frame, name: str) -> torch.Tensor | None:
        """An edge frame's ``prob`` / ``mask`` feature as draw weights (None: uniform)."""
        column = self.prob if self.prob is not None else self.mask
        if column is None or column not in frame:
            return None
        value = frame[column].detach().cpu()
        return value.to(torch.float32) if self.mask is not None else value

    def _layer_fanouts(self, g) -> dict:
        """Per canonical edge type of ``g``, the fanouts of every layer (outermost first), by
        `samplers._checks.check_relation_fanouts` (ValueError for an edge type ``g`` lacks or an ambiguous
        name, as DGL refuses them; a relation missing from some layers' dicts)."""
        return check_relation_fanouts(self.fanouts, g.canonical_etypes)

    def sampler_for(self, g):
        """Our `NeighborSampler` (`HeteroNeighborSampler` for a heterograph) of DGL graph ``g``, built
        on first use and kept while ``g`` lives unchanged.

        The cached sampler is rebuilt when ``g`` changed since: its number of nodes or edges differs, or
        its structure object is a new one (DGL's ``add_nodes`` / ``add_edges`` / ``remove_edges`` /
        ``remove_nodes`` all replace it); its draw weights alone (our graph of ``g`` is kept) when a
        ``prob`` / ``mask`` feature is another tensor or was written in place (``g.edata["p"][:8] = 0``:
        `samplers._stamp.TensorStamp`, torch's version counter), so the next batch draws as DGL's own
        sampler would. Such a rebuilt sampler draws from the seed mixed with the number of rebuilds, not
        repeating the previous one's random stream. Not seen: writes torch does not count (through
        ``.data`` or a numpy view of the feature).

        Raises
        ------
        TypeError
            ``g`` is not a DGL graph.
        ValueError
            ``prob`` / ``mask`` names no edge feature of ``g`` (of any edge type), or its weights are
            not [E] non-negative numbers; ``g`` is not the graph of the constructor's ``sampler`` (another
            size, or an edge id joining other nodes: checked edge by edge once per graph).
        """
        from graphrl.dglshim import import_dgl

        dgl = import_dgl()
        if not isinstance(g, dgl.DGLGraph):
            raise TypeError(f"g must be a dgl.DGLGraph, got {type(g).__name__}")
        # DGL has no public change signal; its in-place mutations each assign a new structure object to
        # DGLGraph._graph (dgl/heterograph.py, DGL 2.1), so a weak reference to it tells a changed graph
        structure = g._graph
        if self.fixed is not None:
            ours = self.fixed.graph
            if not self.fixed_typed and (not g.is_homogeneous or (g.num_nodes(), g.num_edges())
                                         != (ours.num_nodes, ours.num_edges)):
                raise ValueError(f"g ({g.num_nodes()} nodes, {g.num_edges()} edges, edge types {g.etypes}) "
                                 f"is not the graph of the sampler ({ours.num_nodes} nodes, {ours.num_edges} "
                                 f"edges)")
            checked = self.fixed_checked  # edge by edge, once per DGL graph and structure
            if checked is None or checked[0]() is not g or checked[1]() is not structure:
                if self.fixed_typed:
                    edges = {rel: g.edges(order="eid", etype=rel) for rel in g.canonical_etypes}
                    check_same_typed_edges("sampler", self.fixed, {t: g.num_nodes(t) for t in g.ntypes},
                                           edges, "g")
                else:
                    check_same_edges("sampler", self.fixed, *g.edges(order="eid"), g.num_nodes(), "g")
                self.fixed_checked = (weakref.ref(g), weakref.ref(structure))
            if torch.utils.data.get_worker_info() is not None:
                self.fixed.seed = self._draw_seed()
            return self.fixed
        column = self.prob if self.prob is not None else self.mask
        frames = {rel: g.edges[rel].data for rel in g.canonical_etypes}
        if column is not None and not any(column in f for f in frames.values()):
            name = "prob" if self.prob is not None else "mask"
            raise ValueError(f"{name}={column!r} names no edge feature of g "
                             f"(edge features: {sorted({k for f in frames.values() for k in f.keys()})})")
        sources = tuple(None if column is None or column not in f else f[column] for f in frames.values())
        seed = self._draw_seed()
        with self.lock:
            entry = self.samplers.get(id(g))
            if entry is not None and entry.same_graph(g, structure):
                if entry.same_sources(sources):
                    # a worker's mixed seed: the kernels' keys derive from it
                    entry.sampler.seed = self._generation_seed(seed, entry.generation)
                    return entry.sampler
                # a weight or mask column replaced or written in place: new draw weights, same graph
                graph, generation = entry.graph, entry.generation + 1
            else:
                self.samplers = {k: v for k, v in self.samplers.items() if v.graph_ref() is not None}
                graph, generation = self._graph_of(g), 0
            weights = {rel: self._weights(f, column) for rel, f in frames.items()}
            sampler = self._build(g, graph, weights, self._generation_seed(seed, generation))
            self.samplers[id(g)] = CachedSampler(
                weakref.ref(g), weakref.ref(structure), g.num_nodes(), g.num_edges(),
                tuple(None if s is None else TensorStamp.of(s) for s in sources), graph, sampler, generation)
            return sampler

    def _homogeneous(self, g) -> bool:
        """Whether ``g`` is drawn by a `NeighborSampler` (one edge type, plain fanouts)."""
        return g.is_homogeneous and not any(isinstance(f, Mapping) for f in self.fanouts)

    def _graph_of(self, g) -> CSCGraph | HeteroGraph:
        """Our graph of DGL graph ``g``: a `CSCGraph` (`_homogeneous`), else a `HeteroGraph`."""
        if self._homogeneous(g):
            src, dst = g.edges(order="eid")
            return CSCGraph.from_edges(src.cpu(), dst.cpu(), g.num_nodes())
        edges = {}
        for rel in g.canonical_etypes:
            src, dst = g.edges(order="eid", etype=rel)
            edges[rel] = (src.cpu().to(torch.int64), dst.cpu().to(torch.int64))
        return HeteroGraph.from_edges({t: g.num_nodes(t) for t in g.ntypes}, edges)

    def _build(self, g, graph: CSCGraph | HeteroGraph, weights: dict, seed: int):
        """Our sampler over ``graph`` (`_graph_of`) drawing by ``weights`` (per canonical edge type)."""
        if isinstance(graph, CSCGraph):
            (w,) = weights.values()
            return NeighborSampler(graph, self.fanouts, replace=self.replace, seed=seed, weights=w)
        given = {rel: w for rel, w in weights.items() if w is not None}
        return HeteroNeighborSampler(graph, self._layer_fanouts(g), replace=self.replace, seed=seed,
                                     weights=given or None)

    @staticmethod
    def _generation_seed(seed: int, generation: int) -> int:
        """The draws' seed of the ``generation``-th sampler built over one graph (0: ``seed`` itself), so
        that a sampler rebuilt for new weights does not repeat the random stream of the one before."""
        if generation == 0:
            return seed
        return mixed_seed(seed, generation)

    def sample(self, g, indices, exclude_eids=None):
        """Sample the blocks of one minibatch (DGL's ``DataLoader`` calls this per batch).

        Parameters
        ----------
        g : dgl.DGLGraph
            The graph; its edge ids are the blocks' ``edata[dgl.EID]``.
        indices : torch.Tensor, integer, shape [B]; or dict node type -> such a tensor (heterograph)
            Seed node ids in [0, g.num_nodes(type)).
        exclude_eids : torch.Tensor [X], dict edge type -> torch.Tensor, or None
            Edge ids of ``g`` never drawn (what ``dgl.dataloading.as_edge_prediction_sampler`` passes for
            ``exclude="self"`` and the like); ids outside [0, num_edges) are ignored, as in DGL; a dict
            when ``g`` has several edge types.

        Returns
        -------
        input_nodes : torch.Tensor, ``g.idtype``, shape [S] (dict per node type when g has several)
            Global ids of the outermost block's source nodes (rows of the input features).
        output_nodes : torch.Tensor, ``g.idtype``, shape [B] (a dict when ``indices`` is one, as DGL)
            The seeds, in order.
        blocks : list of dgl.DGLGraph
            ``len(fanouts)`` DGL blocks of ``g.idtype``, outermost first, carrying node features in
            ``srcdata`` / ``dstdata`` and edge features in ``edata`` (as DGL's own blocks).

        Raises
        ------
        TypeError
            ``g`` is not a DGL graph; ``indices`` is not an integer tensor (a dict on a heterograph), or is
            uint8, torch's or numpy's (`samplers._checks.check_id_dtype`);
            ``exclude_eids`` not a dict on a graph of several edge types (DGL's rule).
        ValueError
            ``indices`` is not 1-D or holds ids outside [0, g.num_nodes()); a ``fanouts`` dict naming an
            edge type ``g`` lacks, or a name several of its edge types share; a relation missing from
            some layers' dicts.
        """
        for t, v in indices.items() if isinstance(indices, Mapping) else [(None, indices)]:
            if isinstance(v, (torch.Tensor, np.ndarray)):  # uint8: a mask to torch, refused
                check_id_dtype("indices" if t is None else f"indices[{t!r}]", v.dtype)
        sampler = self.sampler_for(g)
        if isinstance(sampler, NeighborSampler) or sampler is self.fixed and not self.fixed_typed:
            if isinstance(indices, Mapping):
                (indices,) = indices.values()
            excl = None
            if exclude_eids is not None:
                if isinstance(exclude_eids, Mapping):
                    exclude_eids = torch.cat([torch.as_tensor(v).cpu() for v in exclude_eids.values()])
                excl = self._existing(exclude_eids, g.num_edges())
            ours = sampler.sample(indices.cpu() if isinstance(indices, torch.Tensor) else indices,
                                  exclude_eids=excl)
            blocks = [self._with_features(g, block_to_dgl(b, g.idtype), b) for b in ours]
            return ours[0].src_nodes.to(g.idtype), ours[-1].dst_nodes.to(g.idtype), blocks
        typed = isinstance(indices, Mapping)
        if not typed:
            if len(g.ntypes) != 1:
                raise TypeError(f"indices must be a dict keyed by node type on a heterograph with node types "
                                f"{g.ntypes}, got {type(indices).__name__}")
            indices = {g.ntypes[0]: indices}
        seeds = {t: torch.as_tensor(v).cpu() for t, v in indices.items()}
        excl = None
        if exclude_eids is not None:
            if not isinstance(exclude_eids, Mapping):
                if len(g.canonical_etypes) != 1:
                    raise TypeError(f"exclude_eids must be a dict keyed by edge type on a heterograph with "
                                    f"edge types {g.canonical_etypes}, got {type(exclude_eids).__name__}")
                exclude_eids = {g.canonical_etypes[0]: exclude_eids}
            excl = {g.to_canonical_etype(k): self._existing(v, g.num_edges(k))
                    for k, v in exclude_eids.items()}
        ours = sampler.sample(seeds, exclude_eids=excl)
        blocks = [self._with_hetero_features(g, hetero_block_to_dgl(b, g.canonical_etypes, g.idtype), b)
                  for b in ours]
        cast = g.idtype
        inputs = {t: v.to(cast) for t, v in ours[0].src_nodes.items()}
        outputs = {t: v.to(cast) for t, v in ours[-1].dst_nodes.items()}
        # as DGL's: input_nodes is a tensor when g has one node type, output_nodes as the seeds were given
        return (inputs[g.ntypes[0]] if len(g.ntypes) == 1 else inputs,
                outputs if typed else outputs[g.ntypes[0]], blocks)

    @staticmethod
    def _existing(ids, num_edges: int) -> torch.Tensor:
        """The ids of ``ids`` in [0, num_edges), int64 on the CPU (DGL ignores ids naming no edge)."""
        ids = torch.as_tensor(ids).cpu().to(torch.int64).reshape(-1)
        return ids[(ids >= 0) & (ids < num_edges)]

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

    @staticmethod
    def _with_hetero_features(g, out, block):
        """The heterogeneous `_with_features`: per node type and per edge type."""
        for t in g.ntypes:
            for name, value in g.nodes[t].data.items():
                if name not in out.srcnodes[t].data:
                    out.srcnodes[t].data[name] = value[block.src_nodes[t].to(value.device, torch.int64)]
                    out.dstnodes[t].data[name] = value[block.dst_nodes[t].to(value.device, torch.int64)]
        for rel in g.canonical_etypes:
            if rel not in block.edge_ids:
                continue
            for name, value in g.edges[rel].data.items():
                if name not in out.edges[rel].data:
                    out.edges[rel].data[name] = value[block.edge_ids[rel].to(value.device, torch.int64)]
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
        state["fixed_checked"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled sampler with a new lock and an empty cache (see `__getstate__`)."""
        state.setdefault("mask", None)
        state.setdefault("fixed_checked", None)
        self.__dict__.update(state)
        self.samplers = {}
        self.lock = threading.Lock()

    def __reduce__(self):
        """Pickle through the front class (`samplers._optional.restore`), then `__setstate__`."""
        restore, (front, _) = super().__reduce__()
        return restore, (front, {}), self.__getstate__()

    def __repr__(self) -> str:
        return (f"DglSampler(fanouts={self.fanouts}, replace={self.replace}, seed={self.seed}, "
                f"prob={self.prob!r}, mask={self.mask!r})")

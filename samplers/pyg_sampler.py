"""Our neighbour sampler behind PyG's own loaders: `PygSampler`, a ``torch_geometric.sampler.BaseSampler``.

PyG's ``NodeLoader`` and ``LinkLoader`` take any ``BaseSampler``; `PygSampler` draws with our
`samplers.NeighborSampler` / `samplers.HeteroNeighborSampler` kernels (`samplers.pyg_draw.PygDraw`) and
returns PyG's ``SamplerOutput`` / ``HeteroSamplerOutput`` laid out as PyG's own ``NeighborSampler``
(pyg-lib) lays it out, so the batches carry the fields of ``NeighborLoader`` / ``LinkNeighborLoader``:
``n_id`` (seeds first, then each hop's new nodes in order of discovery), ``e_id``, ``edge_index`` (row 0
the sampled neighbour, row 1 the node that drew it, local ids), ``batch`` (disjoint), ``batch_size``,
``input_id``, ``seed_time``, ``num_sampled_nodes``, ``num_sampled_edges`` and, for links,
``edge_label_index`` / ``edge_label`` / ``edge_label_time`` (binary negatives) or ``src_index`` /
``dst_pos_index`` / ``dst_neg_index`` (triplet negatives). It takes PyG's inputs (``Data``,
``HeteroData``, ``(FeatureStore, GraphStore)``, `samplers.pyg_graph`) and PyG's options: ``disjoint``,
``time_attr`` with ``temporal_strategy`` ``"uniform"`` / ``"last"`` (node or edge times),
``subgraph_type`` ``"directional"`` / ``"bidirectional"`` / ``"induced"``, ``sample_direction``
``"backward"``, ``weight_attr``, ``num_neighbors=[]`` and graphs without edges (`samplers.pyg_draw`
says how each is drawn).

Use::

    from torch_geometric.loader import NodeLoader
    sampler = PygSampler(data, num_neighbors=[15, 10], seed=0)
    loader = NodeLoader(data, node_sampler=sampler, input_nodes=data.train_mask, batch_size=128)
    for batch in loader:
        out = model(batch.x, batch.edge_index)[: batch.batch_size]

PyG is imported when the first `PygSampler` is built, never by ``import samplers``.
Negatives are drawn from the sampler's own seeded generator, not from global RNG state (with node times,
PyG's rule: a negative's time is <= its link's, redrawn up to 5 times, then the earliest node; PyG's redraws
also reject a time equal to the link's, ours keep it, as its first draw does). Inside a
torch ``DataLoader`` worker (``num_workers > 0``) the draws' seed is the user's seed mixed with the
worker's ``torch.initial_seed()`` (distinct per worker and per epoch), so workers and epochs differ, as
PyG's own sampler's do; pass ``generator=torch.Generator().manual_seed(s)`` to the loader for
reproducible runs. With ``num_workers=0`` the n-th batch of a seed is fixed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from samplers._checks import check_id_dtype
from samplers._optional import LazyBase, import_pyg
from samplers.hetero_graph import HeteroGraph
from samplers.kernels.rng import mixed_seed
from samplers.protocol import check_same_edges, check_same_typed_edges, check_sampler
from samplers.pyg_draw import PygDraw
from samplers.pyg_graph import HOMO, PygGraph, SourceStamps, read_pyg_graph, snapshot, weights_named
from samplers.pyg_hetero import check_num_neighbors, hetero_num_neighbors

__all__ = ["PygSampler"]

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: decorrelates the negative stream from the kernels'
_SUBGRAPH_TYPES = ("directional", "bidirectional", "induced")


def _option(name: str, value, allowed: tuple) -> str:
    value = getattr(value, "value", value)  # PyG's SubgraphType enum
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


class PygSampler(LazyBase):
    """Neighbour sampling for PyG loaders, drawn with our kernels (``torch_geometric.sampler.BaseSampler``).

    Parameters
    ----------
    data : Data, HeteroData or (FeatureStore, GraphStore)
        The graph: ``edge_index`` int64 [2, E] per edge type (row 0 source, row 1 target; a node samples
        its in-edges, PyG's default ``flow="source_to_target"``) and ``num_nodes`` per node type. Edge
        ``j`` keeps id ``j`` (the batches' ``e_id`` index ``edge_index`` columns directly). A ``Data``
        without ``edge_index`` has no edges.
    num_neighbors : sequence of int, or (heterogeneous) mapping edge type -> sequence of int
        Neighbours drawn per node at each hop, *hop 1 first* (PyG's order); ``-1`` takes every
        neighbour; ``[]`` samples the seeds alone. Heterogeneous: one list for every edge type or one
        per edge type (every edge type named, or the rest given by PyG's ``NumNeighbors(values,
        default=...)``; forward edge types also with ``sample_direction="backward"``).
    replace : bool
        Draw with replacement.
    seed : int
        Seed of the neighbour draws and of the negatives; the n-th batch of a given seed is the same on
        every run (``num_workers=0``). In a ``DataLoader`` worker it is mixed with the worker's
        ``torch.initial_seed()``.
    weight_attr : str or None
        An edge attribute (float [E]) to draw neighbours proportionally to, as PyG's ``weight_attr``.
        Drawn from a copy in CSC order, as are ``time_attr``'s times. An in-place write to the weights or
        times (``data.w[:8] = 0``) is seen by the next batch: it rebuilds the draw from one new read of
        them (`samplers._stamp.TensorStamp`, torch's version counter, as `DglSampler` does), so each batch
        draws from one snapshot: its seeds' own node-level times, its neighbours' and its negatives' times
        and its weights are those of one moment. Not seen: writes through ``.data`` or a numpy view, and a
        new tensor assigned to ``data``'s attribute (PyG's sampler keeps the old one too). PyG 2.8's own
        ``NeighborSampler`` differs: it permutes copies of the weights and edge times at construction
        (in-place writes not seen) and sorts by node time there (writes then break its binary search).
    subgraph_type : {"directional", "bidirectional", "induced"}
        As PyG (``SubgraphType`` values accepted).
    disjoint : bool
        Every seed its own subgraph (``batch`` says whose); forced on by ``time_attr``.
    temporal_strategy : {"uniform", "last"}
    time_attr : str or None
        A node-level or edge-level attribute of times (integer or float): a node of seed time t draws
        only edges of time <= t (node-level: neighbours of time <= t). Seed times come from the loader
        (``input_time``, ``edge_label_time``) or, node-level, from the seeds' own times.
    sample_direction : {"forward", "backward"}
        ``"backward"``: nodes sample their out-edges (not with ``time_attr``, as in PyG).
    sampler : Sampler or None
        A `samplers.Sampler` (a `LaborSampler`, say) that draws the blocks instead of our neighbour
        sampler (``num_neighbors`` and ``replace`` then unused): for a ``Data``, one built on
        ``CSCGraph.from_edges(edge_index[0], edge_index[1], num_nodes)``; for a ``HeteroData``, one on
        ``HeteroGraph.from_edges({type: num_nodes}, {edge_type: (edge_index[0], edge_index[1])})`` (the
        data's node types and edge types; their order need not match, relations are matched by name),
        so edge j of each edge type is column j (checked edge by edge once, here). Directional forward
        sampling, neither disjoint nor temporal. Blocks' ``edge_weights`` (a `LaborSampler` with
        ``importance_sampling`` or ``weights``) come as the
        output's ``edge_weight`` (float32 [nnz] aligned with ``edge``; per edge type for ``HeteroData``;
        None without them); `keep_edge_weight` carries them into a loader's batches as
        ``batch.edge_weight`` aligned with ``e_id``.

    Raises
    ------
    ImportError
        torch_geometric is not installed.
    TypeError
        ``data`` is none of the accepted inputs; ``num_neighbors`` not a sequence of ints (or a dict of
        them); ``seed`` not an int.
    ValueError
        A bad ``edge_index``; ``num_neighbors`` with a value below -1, or (heterogeneous) naming an
        unknown edge type or leaving one out; ``weight_attr`` or ``time_attr`` naming nothing usable
        (PyG's wording for the latter); an unknown ``subgraph_type``, ``temporal_strategy`` or
        ``sample_direction``; ``disjoint`` with ``"induced"``; a ``sampler`` whose graph is not ``data``'s
        (another size, or an edge id joining other nodes) or with options it cannot serve (typed graph,
        induced, backward, disjoint, times, ``weight_attr``: weight the ``sampler`` itself; a typed one
        for a ``Data`` or a plain one for a ``HeteroData``).
    NotImplementedError
        ``sample_direction="backward"`` with ``time_attr`` (PyG's wording).

    References
    ----------
    Hamilton, Ying and Leskovec, "Inductive Representation Learning on Large Graphs" (GraphSAGE,
    NeurIPS 2017); PyG 2.8's ``NeighborSampler``, ``node_sample`` and ``edge_sample`` and pyg-lib's
    ``neighbor_sample`` / ``hetero_neighbor_sample`` for the options and output layouts.

    Examples
    --------
    >>> loader = LinkLoader(data, link_sampler=PygSampler(data, [10, 5]), edge_label_index=ei,
    ...                     neg_sampling=NegativeSampling("binary"), batch_size=256)
    >>> temporal = NodeLoader(data, node_sampler=PygSampler(data, [10, 5], time_attr="time"),
    ...                       input_nodes=idx, input_time=t, batch_size=64)
    """

    @staticmethod
    def optional_base() -> type:
        """PyG's ``BaseSampler`` (imports torch_geometric)."""
        return import_pyg().sampler.BaseSampler

    def __init__(self, data, num_neighbors: Sequence[int] = (15, 10), replace: bool = False,
                 seed: int = 0, weight_attr: str | None = None, *, subgraph_type="directional",
                 disjoint: bool = False, temporal_strategy: str = "uniform", time_attr: str | None = None,
                 sample_direction: str = "forward", sampler=None) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.subgraph_type = _option("subgraph_type", subgraph_type, _SUBGRAPH_TYPES)
        self.sample_direction = _option("sample_direction", sample_direction, ("forward", "backward"))
        if self.sample_direction == "backward" and time_attr is not None:
            raise NotImplementedError("Temporal Sampling not yet supported for backward sampling")
        self.replace = bool(replace)
        self.seed = int(seed)
        self.negatives = torch.Generator().manual_seed((self.seed ^ _MIX) % 2**63)
        """Generator of the negatives of `sample_from_edges`."""
        self.worker_seed = None
        """The ``torch.initial_seed()`` of the DataLoader worker the draws were last reseeded for; None
        outside workers."""
        graph = read_pyg_graph(data, time_attr, weight_attr)
        self.is_hetero = graph.hetero
        """Whether batches are ``HeteroData`` (a ``HeteroData`` or a store with edge types)."""
        pyg = import_pyg()
        is_num = isinstance(num_neighbors, pyg.sampler.base.NumNeighbors)
        values = num_neighbors.values if is_num else num_neighbors
        if graph.hetero:
            hops = hetero_num_neighbors(values, graph.edge_types, num_neighbors.default if is_num else None)
        else:
            hops = {HOMO: check_num_neighbors("num_neighbors", values, allow_empty=True)}
        self.num_neighbors = hops if graph.hetero else hops[HOMO]
        """Hop 1 first; ``{edge_type: [...]}`` for a heterogeneous graph."""
        if sampler is not None:
            check_sampler("sampler", sampler, typed=True)
        self.source: PygGraph = graph
        """What was read from ``data``: the user's weight and time tensors, whose in-place writes the next
        batch sees (`_current_draw`)."""
        self.stamps: SourceStamps | None = SourceStamps.of(graph)
        """``source``'s tensors when ``draw`` was built from them (None: to stamp, as after unpickling a
        current draw)."""
        self.generation = 0
        """How many times ``draw`` was rebuilt for new weights or times."""
        self.draw_options = (hops, bool(disjoint), temporal_strategy)
        """The `PygDraw` arguments a rebuild reuses: fanouts per edge type, disjoint, temporal strategy."""
        with weights_named(graph):
            self.draw = PygDraw(snapshot(graph), hops, self.replace, self.seed, disjoint, temporal_strategy,
                                self.subgraph_type == "induced", self.sample_direction == "backward", sampler)
        """The `samplers.pyg_draw.PygDraw` that draws the subgraphs (rebuilt by `_current_draw`)."""
        self.num_nodes = graph.num_nodes if graph.hetero else graph.num_nodes["node"]
        """N, the number of nodes (a dict per node type for a heterogeneous graph)."""
        homo = not graph.hetero
        self.node_time = graph.node_time["node"] if homo and graph.node_time else graph.node_time
        """Node-level times (PyG's attribute), or None."""
        self.edge_time = graph.edge_time[HOMO] if homo and graph.edge_time else graph.edge_time
        """Edge-level times (PyG's attribute), or None."""
        self.graph = self.draw.graph
        """Our `CSCGraph` (or `HeteroGraph`) of ``data``, reversed for ``sample_direction="backward"``;
        the ``sampler``'s graph when given (checked below to be ``data``'s)."""
        self.sampler = self.draw.sampler
        """The `NeighborSampler` / `HeteroNeighborSampler` that draws (fanouts outermost first); None
        with ``num_neighbors=[]``; the ``sampler`` argument when given."""
        if sampler is not None:
            if self.disjoint or self.draw.temporal or self.subgraph_type != "directional" \
                    or self.sample_direction != "forward":
                raise ValueError("sampler= serves a graph sampled directionally forward, neither disjoint "
                                 "nor temporal")
            if weight_attr is not None:
                raise ValueError(f"weight_attr={weight_attr!r} with sampler=: the sampler draws by its own "
                                 f"weights (e.g. LaborSampler(..., weights=data[{weight_attr!r}]))")
            if isinstance(sampler.graph, HeteroGraph) != graph.hetero:
                raise ValueError(f"sampler= over a {type(sampler.graph).__name__} for "
                                 f"{'heterogeneous' if graph.hetero else 'homogeneous'} data (a HeteroData "
                                 f"takes a sampler over a HeteroGraph, a Data one over a CSCGraph)")
            if graph.hetero:
                check_same_typed_edges("sampler", sampler, graph.num_nodes, graph.edges,
                                       "data's graph (edge j of each type = its edge_index[:, j])")
            else:
                check_same_edges("sampler", sampler, *graph.edges[HOMO], graph.num_nodes["node"],
                                 "data's graph (edge j = edge_index[:, j])")

    @property
    def disjoint(self) -> bool:
        """Whether every seed gets its own subgraph (always with times, as in PyG)."""
        return self.draw.disjoint

    @property
    def is_temporal(self) -> bool:
        """Whether the sampler has node or edge times."""
        return self.draw.temporal

    @property
    def edge_permutation(self):
        """None: batches' edge ids are ``edge_index`` columns (no permutation to undo)."""
        return None

    def sample_nodes(self, seeds, seed_time=None):
        """Sample the multi-hop subgraph of ``seeds`` as a ``SamplerOutput`` (no metadata).

        Parameters
        ----------
        seeds : torch.Tensor, int64, shape [B] (heterogeneous: mapping node type -> such a tensor)
            Seed node ids in [0, N); they are ``node[:B]`` of the output, in order.
        seed_time : torch.Tensor [B] (or a mapping like ``seeds``) or None
            Seed times (temporal sampling); None takes the seeds' node-level times.

        Returns
        -------
        torch_geometric.sampler.SamplerOutput or HeteroSamplerOutput
            ``node`` int64 [n] (global ids, seeds first), ``row``/``col`` int64 [nnz] (local source /
            target of each edge), ``edge`` int64 [nnz] (edge ids), ``batch`` int64 [n] (disjoint) or
            None, ``num_sampled_nodes`` (L + 1 ints), ``num_sampled_edges`` (L ints), both None for
            ``"induced"``; per node type / edge type for a heterogeneous graph. Attribute ``edge_weight``:
            float32 [nnz] aligned with ``edge`` (per edge type) where a ``sampler=``'s blocks carry
            ``edge_weights``, else None.

        Raises
        ------
        TypeError, ValueError
            ``seeds`` is not a 1-D integer tensor of ids in [0, N) (see `NeighborSampler.sample`), or is
            uint8, torch's or numpy's (`check_id_dtype`; PyG's ``NodeLoader`` makes a numpy uint8 mask
            int64 ids first: give it a bool mask or a tensor); temporal sampling without seed times.
        """
        return self._sample_nodes(self._current_draw(), seeds, seed_time)

    def _current_draw(self) -> PygDraw:
        """The draw of this batch: ``draw``, rebuilt first (as at construction, from one read of each
        tensor) when a weight or time tensor of ``source`` was written in place since it was built.

        Raises
        ------
        ValueError
            The weights written are not a sampler's (negative, NaN, infinite): raised at every batch until
            they are, the draw built before kept."""
        if self.stamps is None:  # unpickled: its draw is that of the tensors it came with
            self.stamps = SourceStamps.of(self.source)
        if self.stamps.matches(self.source):
            return self.draw
        stamps = SourceStamps.of(self.source)  # before the reads: a write during them is seen next batch
        (hops, disjoint, strategy), seed = self.draw_options, self._draw_seed(self.generation + 1)
        with weights_named(self.source):
            draw = PygDraw(snapshot(self.source), hops, self.replace, seed, disjoint, strategy,
                           self.subgraph_type == "induced", self.sample_direction == "backward")
        self.draw, self.graph, self.sampler = draw, draw.graph, draw.sampler
        self.stamps, self.generation = stamps, self.generation + 1
        return draw

    def _draw_seed(self, generation: int) -> int:
        """The draws' seed: the user's (mixed with the worker's ``torch.initial_seed()`` in a DataLoader
        worker), mixed with ``generation``, the draw's rebuilds, once rebuilt (a rebuilt draw does not
        repeat the random stream of the one before)."""
        seed = self.seed if self.worker_seed is None else mixed_seed(self.seed, self.worker_seed)
        return seed if generation == 0 else mixed_seed(seed, generation)

    def _sample_nodes(self, draw: PygDraw, seeds, seed_time):
        """`sample_nodes` with ``draw`` (the batch's one snapshot, `_current_draw`)."""
        pyg = import_pyg()
        if not self.is_hetero:
            seeds = {"node": seeds}
            seed_time = None if seed_time is None else {"node": seed_time}
        for t, s in seeds.items():  # before the draw casts them to int64: uint8 (torch's, numpy's) is refused
            if isinstance(s, (torch.Tensor, np.ndarray)):
                check_id_dtype("seeds" if not self.is_hetero else f"seeds[{t!r}]", s.dtype)
        if self.is_temporal:
            seed_time = self._seed_times(draw, seeds, seed_time)
        got = draw.sample(seeds, seed_time)
        weight = got.pop("edge_weight")
        if self.is_hetero:
            out = pyg.sampler.HeteroSamplerOutput(**got)
        else:
            key = {"node": "node", "batch": "node", "num_sampled_nodes": "node"}
            out = pyg.sampler.SamplerOutput(**{name: None if value is None else value[key.get(name, HOMO)]
                                               for name, value in got.items()})
            weight = None if weight is None else weight[HOMO]
        if self.subgraph_type == "bidirectional":
            out = out.to_bidirectional(keep_orig_edges=False)
        out.edge_weight = weight  # sampler= only, which is directional: aligned with out.edge
        return out

    @staticmethod
    def _seed_times(draw: PygDraw, seeds: dict, seed_time: dict | None) -> dict:
        """Seed times per seeded type: given, or the seeds' node-level times (pyg-lib's default), those of
        ``draw``'s snapshot."""
        out = {}
        node_time = draw.pyg.node_time
        for t, s in seeds.items():
            if seed_time is not None and seed_time.get(t) is not None:
                out[t] = seed_time[t]
            elif node_time is not None and t in node_time:
                out[t] = node_time[t][s.to(torch.int64)]
            else:
                raise ValueError("temporal sampling with edge-level times needs seed times (input_time or "
                                 "edge_label_time)")
        return out

    def sample_from_nodes(self, index, **kwargs):
        """PyG's node-sampling entry point (``NodeLoader`` calls it per batch).

        Parameters
        ----------
        index : torch_geometric.sampler.NodeSamplerInput
            ``node`` int64 [B] seed ids, ``input_id`` int64 [B], ``time`` [B] or None, ``input_type``
            (heterogeneous) the seeds' node type.

        Returns
        -------
        torch_geometric.sampler.SamplerOutput or HeteroSamplerOutput
            As `sample_nodes`, with ``metadata = (input_id, time)`` as PyG's ``node_sample`` sets it.

        Raises
        ------
        ValueError
            Seed times without ``time_attr``; a node type for a homogeneous graph or none for a
            heterogeneous one.
        """
        self._check_input(index)
        self._reseed_in_worker()
        if self.is_hetero:
            out = self.sample_nodes({index.input_type: index.node},
                                    None if index.time is None else {index.input_type: index.time})
        else:
            out = self.sample_nodes(index.node, index.time)
        out.metadata = (index.input_id, index.time)
        return out

    def sample_from_edges(self, index, neg_sampling=None):
        """PyG's link-sampling entry point (``LinkLoader`` calls it per batch), as PyG's ``edge_sample``.

        Non-disjoint: the sources and targets of the batch's links (and negatives) are made unique
        (sorted, as ``torch.unique``; per side when the edge type joins two node types) and sampled as
        seeds. Disjoint: every endpoint is its own seed, ``batch`` taken modulo the number of links.

        Parameters
        ----------
        index : torch_geometric.sampler.EdgeSamplerInput
            ``row``/``col`` int64 [P] link endpoints, ``input_id`` int64 [P], ``label`` [P] or None,
            ``time`` [P] or None (``edge_label_time``), ``input_type`` the edge type (heterogeneous).
        neg_sampling : torch_geometric.sampler.NegativeSampling or None
            ``"binary"``: ``ceil(P * amount)`` random (src, dst) pairs labelled 0; ``"triplet"``:
            ``amount`` random destinations per link. Drawn uniformly, or by ``src_weight`` /
            ``dst_weight``, from this sampler's generator (false negatives are not filtered, as in PyG).

        Returns
        -------
        torch_geometric.sampler.SamplerOutput or HeteroSamplerOutput
            Binary or none: ``metadata = (input_id, edge_label_index [2, P + Q], edge_label [P + Q],
            edge_label_time or None)``; triplet: ``metadata = (input_id, src_index [P], dst_pos_index [P],
            dst_neg_index [P] or [P, amount], src_time or None)``; indices are positions in ``node``.

        Raises
        ------
        TypeError
            ``row`` / ``col`` of dtype torch.uint8 (`samplers._checks.check_id_dtype`).
        ValueError
            Times without ``time_attr``, an edge type for a homogeneous graph or none for a
            heterogeneous one; labels with triplet negatives; an endpoint outside [0, N).
        """
        self._check_input(index)
        self._reseed_in_worker()
        draw = self._current_draw()  # one snapshot for the negatives' times and the subgraph
        rel = index.input_type
        if not self.is_hetero:
            num_src = num_dst = self.num_nodes
            src_nt = dst_nt = "node"
        else:
            src_nt, dst_nt = rel[0], rel[-1]
            num_src, num_dst = self.num_nodes[src_nt], self.num_nodes[dst_nt]
        node_time = draw.pyg.node_time or {}
        check_id_dtype("index.row", index.row.dtype)
        check_id_dtype("index.col", index.col.dtype)
        src, dst, label = index.row.to(torch.int64), index.col.to(torch.int64), index.label
        src_time = dst_time = edge_time = index.time
        num_pos = int(src.numel())
        triplet = neg_sampling is not None and neg_sampling.is_triplet()
        if neg_sampling is not None and neg_sampling.is_binary():
            num_neg = math.ceil(num_pos * neg_sampling.amount)
            src = torch.cat([src, self._negatives(neg_sampling, "src", num_src, num_pos, src_time,
                                                  node_time.get(src_nt))])
            dst = torch.cat([dst, self._negatives(neg_sampling, "dst", num_dst, num_pos, dst_time,
                                                  node_time.get(dst_nt))])
            if label is None:
                label = torch.ones(num_pos)
            label = torch.cat([label, label.new_zeros((num_neg, *label.shape[1:]))])
            if edge_time is not None:
                src_time = dst_time = edge_time.repeat(1 + math.ceil(neg_sampling.amount))[:num_pos + num_neg]
        elif triplet:
            if label is not None:
                raise ValueError("edge_label must be None with triplet negative sampling (as in PyG)")
            dst = torch.cat([dst, self._negatives(neg_sampling, "dst", num_dst, num_pos, dst_time,
                                                  node_time.get(dst_nt))])
            if edge_time is not None:
                dst_time = edge_time.repeat(1 + neg_sampling.amount)
        disjoint = self.disjoint
        two_types = src_nt != dst_nt
        if two_types:
            if not disjoint:
                src, inv_src = src.unique(return_inverse=True)
                dst, inv_dst = dst.unique(return_inverse=True)
            seeds = {src_nt: src, dst_nt: dst}
            times = None if edge_time is None else {src_nt: src_time, dst_nt: dst_time}
        else:
            seed = torch.cat([src, dst])
            if not disjoint:
                seed, inverse = seed.unique(return_inverse=True)
                inv_src, inv_dst = inverse[:src.numel()], inverse[src.numel():]
            seeds = {src_nt: seed}
            times = None if edge_time is None else {src_nt: torch.cat([src_time, dst_time])}
        out = self._sample_nodes(draw, seeds if self.is_hetero else seeds["node"],
                                 times if self.is_hetero or times is None else times["node"])
        if disjoint:
            if self.is_hetero:
                out.batch = {k: b % num_pos for k, b in out.batch.items()}
            else:
                out.batch = out.batch % num_pos
        if not triplet:
            if not disjoint:
                label_index = torch.stack([inv_src, inv_dst])
            elif two_types:
                label_index = torch.arange(src.numel()).repeat(2).view(2, -1)
            else:
                label_index = torch.arange(2 * src.numel()).view(2, -1)
            out.metadata = (index.input_id, label_index, label, src_time)
            return out
        if not disjoint:
            src_index, dst_pos, dst_neg = inv_src, inv_dst[:num_pos], inv_dst[num_pos:]
        else:
            src_index = torch.arange(num_pos)
            offset = 0 if two_types else num_pos
            dst_pos = torch.arange(offset, offset + num_pos)
            dst_neg = torch.arange(offset + num_pos, offset + dst.numel()).view(-1, num_pos).t()
        dst_neg = dst_neg.reshape(num_pos, -1).squeeze(-1)
        out.metadata = (index.input_id, src_index, dst_pos, dst_neg, src_time)
        return out

    @staticmethod
    def keep_edge_weight(loader):
        """``loader`` (a PyG ``NodeLoader`` / ``LinkLoader`` over a `PygSampler`) made to carry each
        output's ``edge_weight`` into its batches: ``batch.edge_weight`` (``batch[edge_type].edge_weight``
        for ``HeteroData``), float32 [nnz] aligned with ``e_id`` / ``edge_index``, set before the loader's
        ``transform`` (which it moves into the hook: call this before iterating) and replacing a graph
        attribute of that name; nothing is set where the output has none. PyG's loaders copy only the
        output fields they know, hence this hook (it wraps the loader's ``filter_fn``, in workers too).
        Calling it again changes nothing. Returns ``loader``.

        Raises
        ------
        TypeError
            ``loader`` has no ``node_sampler`` / ``link_sampler`` that is a `PygSampler`."""
        sampler = getattr(loader, "node_sampler", None) or getattr(loader, "link_sampler", None)
        if not isinstance(sampler, PygSampler):
            raise TypeError(f"loader={type(loader).__name__} samples with {type(sampler).__name__}, not a "
                            f"PygSampler (keep_edge_weight serves a loader over a PygSampler)")
        if not isinstance(vars(loader).get("filter_fn"), _EdgeWeightFilter):
            loader.filter_fn = _EdgeWeightFilter(loader, loader.transform)
            loader.transform = None
        return loader

    def _reseed_in_worker(self) -> None:
        """In a torch ``DataLoader`` worker, seed the draws from the user's seed and the worker's
        ``torch.initial_seed()`` (new per worker and per epoch); outside workers, change nothing."""
        if torch.utils.data.get_worker_info() is None:
            return
        base = torch.initial_seed()
        if base == self.worker_seed:
            return
        self.worker_seed = base
        if self.sampler is not None:  # the kernels' per-call keys derive from the sampler's seed
            self.sampler.seed = self._draw_seed(self.generation)
        self.negatives = torch.Generator().manual_seed((self._draw_seed(0) ^ _MIX) % 2**63)

    def _negatives(self, neg_sampling, endpoint: str, num_nodes: int, num_pos: int, seed_time,
                   node_time) -> torch.Tensor:
        """``ceil(num_pos * amount)`` node ids in [0, num_nodes) drawn uniformly or by the endpoint's
        weight from `negatives`; with seed and node times, PyG's ``neg_sample`` rule (module docs)."""
        count = math.ceil(num_pos * neg_sampling.amount)
        weight = neg_sampling.src_weight if endpoint == "src" else neg_sampling.dst_weight
        if weight is not None:
            if weight.numel() != num_nodes:
                raise ValueError(f"neg_sampling.{endpoint}_weight must have one weight per node "
                                 f"({num_nodes}), got {weight.numel()}")
            weight = weight.detach().to(torch.float32, copy=True)  # one read for every redraw below

        def draw(n: int) -> torch.Tensor:
            if weight is None:
                return torch.randint(num_nodes, (n,), generator=self.negatives)
            return torch.multinomial(weight, n, replacement=True, generator=self.negatives)

        if seed_time is None or node_time is None:
            return draw(count)
        rounds = math.ceil(neg_sampling.amount)
        limit = seed_time.view(1, -1).expand(rounds, -1)
        out = draw(rounds * num_pos).view(rounds, num_pos)
        bad = node_time[out] > limit
        for _ in range(5):
            if not bool(bad.any()):
                break
            out[bad] = draw(int(bad.sum()))
            bad = bad & (node_time[out] > limit)
        out[bad] = node_time.argmin()
        return out.view(-1)[:count]

    def _check_input(self, index) -> None:
        if getattr(index, "time", None) is not None and not self.is_temporal:
            raise ValueError("the loader passed seed times (input_time / edge_label_time) but the sampler "
                             "has no time_attr")
        input_type = getattr(index, "input_type", None)
        if not self.is_hetero and input_type is not None:
            raise ValueError(f"PygSampler on a homogeneous graph samples homogeneous graphs; "
                             f"got input_type={input_type!r}")
        if self.is_hetero and input_type is None:
            raise ValueError("PygSampler on a heterogeneous graph needs typed inputs, e.g. "
                             "input_nodes=('user', idx) or edge_label_index=(edge_type, index)")

    def __reduce__(self):
        """Pickle (``spawn`` DataLoader workers) through the front class (`samplers._optional.restore`),
        without the stamps (weak references): a copy whose draw was current stamps its own tensors at its
        first batch, one whose tensors were written since its draw was built rebuilds it then."""
        restore, (front, state) = super().__reduce__()
        current = self.stamps is None or self.stamps.matches(self.source)
        state["stamps"] = None if current else SourceStamps()
        return restore, (front, state)

    def __repr__(self) -> str:
        return (f"PygSampler(num_nodes={self.num_nodes}, num_neighbors={self.num_neighbors}, "
                f"replace={self.replace}, seed={self.seed}, disjoint={self.disjoint}, "
                f"subgraph_type={self.subgraph_type!r})")


class _EdgeWeightFilter:
    """A loader's ``filter_fn`` that adds the output's ``edge_weight`` to the batch (`keep_edge_weight`);
    a plain object holding the loader and its ``transform`` (applied after the weights are set), so the
    loader pickles into spawned workers."""

    def __init__(self, loader, transform) -> None:
        self.loader = loader
        self.transform = transform

    def __call__(self, out):
        data = type(self.loader).filter_fn(self.loader, out)
        weight = getattr(out, "edge_weight", None)
        if isinstance(weight, dict):
            for edge_type, w in weight.items():
                data[edge_type].edge_weight = w
        elif weight is not None:
            data.edge_weight = weight
        return data if self.transform is None else self.transform(data)

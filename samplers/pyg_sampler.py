"""Our neighbour sampler behind PyG's own loaders: `PygSampler`, a ``torch_geometric.sampler.BaseSampler``.

PyG's ``NodeLoader`` and ``LinkLoader`` take any ``BaseSampler``; `PygSampler` draws with our
`samplers.NeighborSampler` kernels and returns PyG's ``SamplerOutput`` laid out as PyG's own
``NeighborSampler`` (pyg-lib) lays it out, so the batches carry the same fields as those of
``NeighborLoader`` / ``LinkNeighborLoader``: ``n_id`` (seeds first, then each hop's new nodes in order
of discovery), ``e_id``, ``edge_index`` (row 0 the sampled neighbour, row 1 the node that drew it,
local ids), ``batch_size``, ``input_id``, ``num_sampled_nodes``, ``num_sampled_edges`` and, for links,
``edge_label_index`` / ``edge_label`` (binary negatives) or ``src_index`` / ``dst_pos_index`` /
``dst_neg_index`` (triplet negatives). Each node is expanded once, at the hop after the one that
found it, as in pyg-lib (see `samplers.interop.blocks_to_pyg`). A ``HeteroData`` is sampled by our
`samplers.HeteroNeighborSampler` (`samplers.pyg_hetero`) into PyG's ``HeteroSamplerOutput``, so the
loaders yield ``HeteroData`` batches as ``NeighborLoader`` does (``num_neighbors`` a list for every
edge type or a dict per edge type; ``input_nodes=("user", idx)``).

Use::

    from torch_geometric.loader import NodeLoader
    sampler = PygSampler(data, num_neighbors=[15, 10], seed=0)
    loader = NodeLoader(data, node_sampler=sampler, input_nodes=data.train_mask, batch_size=128)
    for batch in loader:
        out = model(batch.x, batch.edge_index)[: batch.batch_size]

PyG is imported when the first `PygSampler` is built, never by ``import samplers``. No temporal
sampling.
Negatives are drawn from the sampler's own seeded generator, not from global RNG state. Inside a torch
``DataLoader`` worker (``num_workers > 0``) the draws' seed is the user's seed mixed with the worker's
``torch.initial_seed()`` (distinct per worker and per epoch), so workers and epochs differ and results
depend on the loader's seeding, as PyG's own sampler's do; pass ``generator=torch.Generator().manual_seed(s)``
to the loader for reproducible runs. With ``num_workers=0`` the n-th batch of a seed is fixed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from graphrl.graph import CSCGraph
from samplers._optional import LazyBase, import_pyg
from samplers.interop import blocks_to_pyg
from samplers.neighbor import NeighborSampler
from samplers.pyg_hetero import PygHeteroSampling, check_num_neighbors

__all__ = ["PygSampler"]

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: decorrelates the negative stream from the kernels'


class PygSampler(LazyBase):
    """Neighbour sampling for PyG loaders, drawn with our kernels (``torch_geometric.sampler.BaseSampler``).

    Parameters
    ----------
    data : torch_geometric.data.Data or torch_geometric.data.HeteroData
        The graph: ``edge_index`` int64 [2, E] (row 0 source, row 1 target; a node samples its in-edges,
        PyG's default ``flow="source_to_target"``) and ``num_nodes``, per edge type and node type for a
        ``HeteroData``. Edge ``j`` keeps id ``j`` (the batches' ``e_id`` index ``edge_index`` columns
        directly).
    num_neighbors : sequence of int, or (HeteroData) mapping edge type -> sequence of int
        Neighbours drawn per node at each hop, *hop 1 first* (PyG's order, the reverse of
        `NeighborSampler`'s ``fanouts``); ``-1`` takes every in-neighbour. For a ``HeteroData``, one
        list for every edge type or one per edge type (every edge type named, as PyG's
        ``NumNeighbors``).
    replace : bool
        Draw with replacement.
    seed : int
        Seed of the neighbour draws and of the negatives; the n-th batch of a given seed is the same on
        every run (``num_workers=0``). In a ``DataLoader`` worker it is mixed with the worker's
        ``torch.initial_seed()`` (see `worker_seed`).
    weight_attr : str or None
        Name of an edge attribute of ``data`` (float [E]) to draw neighbours proportionally to, as
        PyG's ``weight_attr`` (``HeteroData``: on the edge types that have it); ``None`` draws uniformly.

    Raises
    ------
    ImportError
        torch_geometric is not installed.
    TypeError
        ``data`` is neither a ``Data`` nor a ``HeteroData``, ``num_neighbors`` is not a sequence of
        ints (or a dict of them), ``seed`` is not an int.
    ValueError
        ``data`` has no ``edge_index`` (an edge type without one) or one not shaped [2, E];
        ``num_neighbors`` is empty or holds
        a value below -1, or (HeteroData) names an unknown edge type or leaves one out;
        ``weight_attr`` names no edge attribute of ``data``.

    References
    ----------
    Hamilton, Ying and Leskovec, "Inductive Representation Learning on Large Graphs" (GraphSAGE,
    NeurIPS 2017); PyG's ``NeighborSampler`` and pyg-lib's ``neighbor_sample`` /
    ``hetero_neighbor_sample`` for the output layout and the binary/triplet negative-sampling layouts
    of ``edge_sample``.

    Examples
    --------
    >>> loader = LinkLoader(data, link_sampler=PygSampler(data, [10, 5]), edge_label_index=ei,
    ...                     neg_sampling=NegativeSampling("binary"), batch_size=256)
    >>> hetero = NodeLoader(hetero_data, node_sampler=PygSampler(hetero_data, [10, 5]),
    ...                     input_nodes=("user", idx), batch_size=64)   # HeteroData batches
    """

    @staticmethod
    def optional_base() -> type:
        """PyG's ``BaseSampler`` (imports torch_geometric)."""
        return import_pyg().sampler.BaseSampler

    def __init__(self, data, num_neighbors: Sequence[int] = (15, 10), replace: bool = False,
                 seed: int = 0, weight_attr: str | None = None) -> None:
        pyg = import_pyg()
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.replace = bool(replace)
        self.seed = int(seed)
        self.negatives = torch.Generator().manual_seed((self.seed ^ _MIX) % 2**63)
        """Generator of the negatives of `sample_from_edges`."""
        self.worker_seed = None
        """The ``torch.initial_seed()`` of the DataLoader worker the draws were last reseeded for; None
        outside workers."""
        self.hetero = None
        """The `samplers.pyg_hetero.PygHeteroSampling` of a ``HeteroData``; None for a ``Data``."""
        if isinstance(data, pyg.data.HeteroData):
            self.hetero = PygHeteroSampling(data, num_neighbors, self.replace, self.seed, weight_attr)
            self.num_nodes = self.hetero.num_nodes
            self.graph = self.hetero.graph
            self.num_neighbors = self.hetero.num_neighbors
            self.sampler = self.hetero.sampler
            return
        if not isinstance(data, pyg.data.Data):
            raise TypeError(f"data must be a torch_geometric.data.Data or HeteroData, "
                            f"got {type(data).__name__}")
        if data.edge_index is None:
            raise ValueError("data has no edge_index: PygSampler samples a graph's edges")
        edge_index = data.edge_index
        if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
            shape = tuple(edge_index.shape) if isinstance(edge_index, torch.Tensor) else type(edge_index)
            raise ValueError(f"data.edge_index must be a [2, E] tensor (row 0 source, row 1 target), "
                             f"got shape {shape}")
        hops = check_num_neighbors("num_neighbors", num_neighbors)
        weights = None
        if weight_attr is not None:
            known = isinstance(weight_attr, str) and weight_attr in data
            if not known or not data.is_edge_attr(weight_attr):
                raise ValueError(f"weight_attr={weight_attr!r} names no edge attribute of data "
                                 f"(edge attributes: {sorted(data.edge_attrs())})")
            weights = data[weight_attr]
        self.num_nodes = int(data.num_nodes)
        """N, the number of nodes of ``data`` (a dict per node type for a ``HeteroData``)."""
        self.graph = CSCGraph.from_edges(edge_index[0], edge_index[1], self.num_nodes)
        """Our `CSCGraph` of ``data`` (edge ``j`` is column ``j`` of ``data.edge_index``); a `HeteroGraph`
        for a ``HeteroData``."""
        self.num_neighbors = hops
        """Hop 1 first; ``{edge_type: [...]}`` for a ``HeteroData``."""
        self.sampler = NeighborSampler(self.graph, fanouts=self.num_neighbors[::-1], replace=self.replace,
                                       weights=weights, seed=self.seed)
        """The `NeighborSampler` that draws the blocks (fanouts outermost first); the
        `HeteroNeighborSampler` for a ``HeteroData``."""

    @property
    def edge_permutation(self):
        """None: batches' edge ids are ``data.edge_index`` columns (no permutation to undo)."""
        return None

    def sample_nodes(self, seeds: torch.Tensor):
        """Sample the multi-hop subgraph of ``seeds`` as a ``SamplerOutput`` (no metadata).

        Parameters
        ----------
        seeds : torch.Tensor, int64, shape [B] (HeteroData: mapping node type -> such a tensor)
            Seed node ids in [0, N); they are ``node[:B]`` of the output, in order.

        Returns
        -------
        torch_geometric.sampler.SamplerOutput or HeteroSamplerOutput
            ``node`` int64 [n] (global ids, seeds first), ``row``/``col`` int64 [nnz] (local source /
            target of each edge), ``edge`` int64 [nnz] (edge ids), ``batch=None``,
            ``num_sampled_nodes`` (L + 1 ints), ``num_sampled_edges`` (L ints); for a ``HeteroData``,
            the same per node type / edge type (`samplers.pyg_hetero.PygHeteroSampling.sample`).

        Raises
        ------
        TypeError, ValueError
            ``seeds`` is not a 1-D integer tensor of ids in [0, N) (see `NeighborSampler.sample`).
        """
        if self.hetero is not None:
            return self.hetero.sample(seeds)
        pyg = import_pyg()
        sub = blocks_to_pyg(self.sampler.sample(seeds))
        return pyg.sampler.SamplerOutput(
            node=sub.n_id, row=sub.edge_index[0], col=sub.edge_index[1], edge=sub.e_id, batch=None,
            num_sampled_nodes=sub.num_sampled_nodes, num_sampled_edges=sub.num_sampled_edges)

    def sample_from_nodes(self, index, **kwargs):
        """PyG's node-sampling entry point (``NodeLoader`` calls it per batch).

        Parameters
        ----------
        index : torch_geometric.sampler.NodeSamplerInput
            ``node`` int64 [B] seed ids, ``input_id`` int64 [B] their example indices; ``input_type``
            their node type for a ``HeteroData`` (None for a ``Data``).

        Returns
        -------
        torch_geometric.sampler.SamplerOutput
            As `sample_nodes`, with ``metadata = (input_id, time)`` as PyG's ``node_sample`` sets it.

        Raises
        ------
        ValueError
            ``index`` carries seed times (temporal sampling is not supported), or a node type for a
            ``Data`` / none for a ``HeteroData``.
        """
        self._check_input(index)
        self._reseed_in_worker()
        out = self.sample_nodes(index.node if self.hetero is None else {index.input_type: index.node})
        out.metadata = (index.input_id, index.time)
        return out

    def sample_from_edges(self, index, neg_sampling=None):
        """PyG's link-sampling entry point (``LinkLoader`` calls it per batch).

        The sources and targets of the batch's links (and negatives) are merged, made unique (sorted, as
        ``torch.unique``) and sampled as seeds; ``metadata`` follows PyG's ``edge_sample`` for
        non-disjoint sampling. On a ``HeteroData`` (``index.input_type`` an edge type) the seeds are of
        the edge type's source and destination types: merged when they are one type, else made unique
        per side, as in PyG.

        Parameters
        ----------
        index : torch_geometric.sampler.EdgeSamplerInput
            ``row``/``col`` int64 [P] link endpoints, ``input_id`` int64 [P], ``label`` [P] or None.
        neg_sampling : torch_geometric.sampler.NegativeSampling or None
            ``"binary"``: ``ceil(P * amount)`` random (src, dst) pairs labelled 0; ``"triplet"``:
            ``amount`` random destinations per link. Drawn uniformly, or by ``src_weight`` /
            ``dst_weight``, from this sampler's generator (false negatives are not filtered, as in PyG).

        Returns
        -------
        torch_geometric.sampler.SamplerOutput or HeteroSamplerOutput
            Binary or none: ``metadata = (input_id, edge_label_index [2, P + Q], edge_label [P + Q],
            None)``; triplet: ``metadata = (input_id, src_index [P], dst_pos_index [P],
            dst_neg_index [P] or [P, amount], None)``; indices are positions in ``node`` (in
            ``node[src_type]`` / ``node[dst_type]`` for a ``HeteroData``).

        Raises
        ------
        ValueError
            Seed times in ``index``, an edge type for a ``Data`` or none for a ``HeteroData``; labels
            given with triplet negatives; an endpoint outside [0, N).
        """
        self._check_input(index)
        self._reseed_in_worker()
        rel = index.input_type
        if self.hetero is None:
            num_src = num_dst = self.num_nodes
        else:
            num_src, num_dst = self.num_nodes[rel[0]], self.num_nodes[rel[-1]]
        src, dst, label = index.row.to(torch.int64), index.col.to(torch.int64), index.label
        num_pos = int(src.numel())
        triplet = neg_sampling is not None and neg_sampling.is_triplet()
        if neg_sampling is not None and neg_sampling.is_binary():
            num_neg = math.ceil(num_pos * neg_sampling.amount)
            src = torch.cat([src, self._negatives(neg_sampling.src_weight, num_src, num_neg, "src_weight")])
            dst = torch.cat([dst, self._negatives(neg_sampling.dst_weight, num_dst, num_neg, "dst_weight")])
            if label is None:
                label = torch.ones(num_pos)
            label = torch.cat([label, label.new_zeros((num_neg, *label.shape[1:]))])
        elif triplet:
            if label is not None:
                raise ValueError("edge_label must be None with triplet negative sampling (as in PyG)")
            num_neg = math.ceil(num_pos * neg_sampling.amount)
            dst = torch.cat([dst, self._negatives(neg_sampling.dst_weight, num_dst, num_neg, "dst_weight")])
        if rel is not None and rel[0] != rel[-1]:  # two node types: each side its own unique seeds
            src_seeds, inv_src = src.unique(return_inverse=True)
            dst_seeds, inv_dst = dst.unique(return_inverse=True)
            out = self.sample_nodes({rel[0]: src_seeds, rel[-1]: dst_seeds})
        else:
            seeds, inverse = torch.cat([src, dst]).unique(return_inverse=True)
            out = self.sample_nodes(seeds if rel is None else {rel[0]: seeds})
            inv_src, inv_dst = inverse[:src.numel()], inverse[src.numel():]
        if triplet:
            dst_neg = inv_dst[num_pos:].view(num_pos, -1).squeeze(-1)
            out.metadata = (index.input_id, inv_src, inv_dst[:num_pos], dst_neg, None)
        else:
            out.metadata = (index.input_id, torch.stack([inv_src, inv_dst]), label, None)
        return out

    def _reseed_in_worker(self) -> None:
        """In a torch ``DataLoader`` worker, seed the draws from the user's seed and the worker's
        ``torch.initial_seed()`` (new per worker and per epoch); outside workers, change nothing."""
        if torch.utils.data.get_worker_info() is None:
            return
        base = torch.initial_seed()
        if base == self.worker_seed:
            return
        self.worker_seed = base
        mixed = int(np.random.SeedSequence([self.seed, base % 2**64]).generate_state(1, np.uint64)[0]) >> 1
        self.sampler.seed = mixed  # the kernels' per-call keys derive from NeighborSampler.seed
        self.negatives = torch.Generator().manual_seed((mixed ^ _MIX) % 2**63)

    def _negatives(self, weight, num_nodes: int, count: int, name: str) -> torch.Tensor:
        """``count`` node ids in [0, num_nodes) drawn uniformly, or by ``weight`` (float [num_nodes]),
        from `negatives`."""
        if weight is None:
            return torch.randint(num_nodes, (count,), generator=self.negatives)
        if weight.numel() != num_nodes:
            raise ValueError(f"neg_sampling.{name} must have one weight per node ({num_nodes}), "
                             f"got {weight.numel()}")
        return torch.multinomial(weight.float(), count, replacement=True, generator=self.negatives)

    def _check_input(self, index) -> None:
        if getattr(index, "time", None) is not None:
            raise ValueError("PygSampler does not support temporal sampling: the loader passed seed "
                             "times (input_time / edge_label_time)")
        input_type = getattr(index, "input_type", None)
        if self.hetero is None and input_type is not None:
            raise ValueError(f"PygSampler on a Data samples homogeneous graphs; "
                             f"got input_type={input_type!r}")
        if self.hetero is not None and input_type is None:
            raise ValueError("PygSampler on a HeteroData needs typed inputs, e.g. input_nodes=('user', idx) "
                             "or edge_label_index=(edge_type, index)")

    def __repr__(self) -> str:
        return (f"PygSampler(num_nodes={self.num_nodes}, num_neighbors={self.num_neighbors}, "
                f"replace={self.replace}, seed={self.seed})")

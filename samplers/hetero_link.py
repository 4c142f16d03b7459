"""Typed link prediction: seed edges of one relation of a `HeteroGraph`, negatives of the destination type,
typed blocks.

`HeteroLinkSampler` is `LinkSampler` over a `HeteroGraph`, as PyG's ``LinkNeighborLoader(hetero_data,
edge_label_index=(("user", "to", "artist"), idx), neg_sampling=...)`` and DGL's
``as_edge_prediction_sampler`` on a heterograph (both are `samplers.link_pairs.SeedEdgeSampler` s, which
hold the pairs, epochs, negatives, length and throughput; this module adds the typed checks and blocks):
positive pairs (src of ``edge_type[0]``, dst of ``edge_type[2]``), negatives among the destination type's
nodes by `samplers.link_pairs.PairNegatives` (the plain sampler's rule and stream), the seed edges (and
their reverses in a reverse relation) excluded from the candidates, and the blocks of ``{src_type: ...,
dst_type: ...}`` from a typed sampler (`HeteroNeighborSampler`, a typed `LaborSampler`, any `Sampler` over
the graph returning `HeteroBlock` s). Each batch is a `HeteroLinkBatch`; `samplers.LinkLoader` prefetches
them with features per node type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from samplers._checks import check_id_range, id_vector
from samplers.hetero_block import HeteroBlock
from samplers.hetero_graph import HeteroGraph, Relation
from samplers.link_pairs import (
    BatchEnds,
    PairNegatives,
    SeedEdgeBatch,
    SeedEdgeSampler,
    check_target_edges,
    reverse_vector,
    target_vector,
)
from samplers.protocol import Sampler, check_sampler, check_typed_blocks, edges_by_id

__all__ = ["HeteroLinkBatch", "HeteroLinkSampler"]


class _RelationEnds:
    """``src_type`` and ``dst_type`` of an object's ``edge_type`` (a batch's, a sampler's)."""

    edge_type: Relation

    @property
    def src_type(self) -> str:
        """The sources' node type, ``edge_type[0]``."""
        return self.edge_type[0]

    @property
    def dst_type(self) -> str:
        """The destinations' (and negatives') node type, ``edge_type[2]``."""
        return self.edge_type[2]


@dataclass(frozen=True, eq=False)
class HeteroLinkBatch(_RelationEnds, SeedEdgeBatch):
    """One typed link minibatch: B positive edges of ``edge_type``, k negatives each, and typed blocks.

    The fields are `LinkBatch`'s (so one BPR step reads either), typed: ``users`` are sources of
    ``edge_type[0]``, the items destinations of ``edge_type[2]``, ids within their type.

    Attributes
    ----------
    edge_type : Relation
        The seed edges' relation (src type, name, dst type).
    users : torch.Tensor, int64, shape [B]
        Source ids (of the source type).
    pos_items : torch.Tensor, int64, shape [B]
        Destination ids (of the destination type); ``users[b] -> pos_items[b]`` is a positive pair.
    neg_items : torch.Tensor, int64, shape [B, k]
        Negative destination ids, in [0, num_nodes[dst_type]); none is a positive of ``users[b]``.
    blocks : list[HeteroBlock]
        Typed blocks of the seeds (outermost first); ``blocks[-1].dst_nodes`` are `seeds`.
    user_index : torch.Tensor, int64, shape [B]
        Positions of ``users`` in ``blocks[-1].dst_nodes[src_type]``.
    pos_index : torch.Tensor, int64, shape [B]
        Positions of ``pos_items`` in ``blocks[-1].dst_nodes[dst_type]``.
    neg_index : torch.Tensor, int64, shape [B, k]
        Positions of ``neg_items`` in ``blocks[-1].dst_nodes[dst_type]``.
    pair_ids : torch.Tensor, int64, shape [B]
        Index of each positive pair in the sampler's input arrays.
    excluded_eids : dict[Relation, torch.Tensor] or None, int64 [X_r] each
        Relation edge ids removed from the blocks' candidates (the targets in ``edge_type`` and, with
        ``exclude="reverse"``, their reverses in the reverse relation); None when nothing was excluded.
    """

    edge_type: Relation
    users: torch.Tensor
    pos_items: torch.Tensor
    neg_items: torch.Tensor
    blocks: list[HeteroBlock]
    user_index: torch.Tensor
    pos_index: torch.Tensor
    neg_index: torch.Tensor
    pair_ids: torch.Tensor
    excluded_eids: dict[Relation, torch.Tensor] | None = None

    @property
    def seeds(self) -> dict[str, torch.Tensor]:
        """The unique seeds per node type, ``blocks[-1].dst_nodes``: int64 [S_t] each (sorted)."""
        return self.blocks[-1].dst_nodes

    @property
    def num_sampled_edges(self) -> int:
        """Edges in all blocks together, every relation."""
        return sum(b.num_edges() for b in self.blocks)


def _relation(name: str, value, graph: HeteroGraph) -> Relation:
    """``value`` if it is one of the graph's relations, else ValueError naming ``name`` and the relations."""
    rel = tuple(value) if isinstance(value, (tuple, list)) else value
    if rel not in graph.relations:
        raise ValueError(f"{name}: unknown relation {value!r} (the graph has {graph.relations})")
    return rel


class HeteroLinkSampler(_RelationEnds, SeedEdgeSampler[HeteroLinkBatch]):
    """Minibatches of positive edges of one relation of a `HeteroGraph`, k negatives each, and typed blocks.

    Each epoch visits every positive pair once, in a seeded random order (input order with
    ``shuffle=False``), cut into batches of ``batch_size``: `LinkSampler`'s epochs, with its negative rule
    and stream over the destination type, ``item_range = (0, num_nodes[dst_type])`` (the same ``seed`` and
    pairs give the negatives a `LinkSampler` gives over a bipartite graph whose items are those nodes,
    offset). For a batch it draws ``num_negatives`` destinations per pair that are not positives of its
    source (uniform, or by in-degree in ``edge_type`` to the power 0.75; only the given pairs are avoided,
    not every edge of the graph, and on a relation whose both ends are one node type a source can be drawn
    as its own negative, as with PyG's negatives and unlike DGL's ``GlobalUniform``, which excludes
    self-pairs by default: `samplers.link_pairs.PairNegatives.draw`), takes the unique seeds per node
    type (sources and destinations and negatives merged when the types are the same, as PyG's
    ``edge_sample``), and samples ``sampler.sample({src_type: ..., dst_type: ...})``, optionally with the
    batch's target edges (and their reverses) excluded from the candidates.

    Parameters
    ----------
    sampler : Sampler over a `HeteroGraph`
        A `HeteroNeighborSampler`, a typed `LaborSampler`, or any `samplers.Sampler` whose graph is a
        `HeteroGraph` and whose ``sample`` returns `HeteroBlock` s.
    edge_type : Relation
        The seed edges' relation ``(src_type, name, dst_type)``, one of ``sampler.graph.relations``.
    src : torch.Tensor or array-like, integer, shape [M]
        Source of each positive pair, in [0, num_nodes[src_type]).
    dst : torch.Tensor or array-like, integer, shape [M]
        Destination of each positive pair, in [0, num_nodes[dst_type]).
    batch_size : int
        Pairs per batch, >= 1.
    num_negatives : int
        k, negatives per pair, >= 1.
    negative : {"uniform", "degree"}
        Uniform over the destination type's nodes, or proportional to their in-degree in ``edge_type`` to
        the power 0.75 (nodes of in-degree 0 are then never drawn).
    exclude : {None, "self", "reverse"}
        Remove from the blocks' candidates nothing, the batch's target edges of ``edge_type``, or those and
        their reverses in ``reverse_edge_type`` (DGL's ``exclude="reverse_types"``). By edge id.
    target_eids : torch.Tensor or array-like or None, integer, shape [M]
        Edge id (in ``edge_type``) of each pair's edge; checked against the pairs. Required when
        ``exclude`` is set.
    reverse_edge_type : Relation or None
        The reverse relation ``(dst_type, name, src_type)``; required for ``exclude="reverse"``.
    reverse_eids : torch.Tensor or array-like or None, integer, shape [E] (the edges of ``edge_type``)
        For every edge of ``edge_type``, the id of its reverse in ``reverse_edge_type``; None: the same id
        (as `lastfm_hetero_graph` builds, and DGL's ``reverse_etypes`` assume). Checked as `LinkSampler`'s
        (`samplers.link_pairs.reverse_vector`): every edge's reverse joins its endpoints swapped; parallel
        edges may share one reverse (DGL's rule), in a relation that is its own reverse too.
    shuffle, drop_last : bool
        Fresh random order each epoch; drop the last, shorter batch.
    seed : int or None
        Seed of the order and negatives stream; None draws one from the OS. The blocks also depend on
        ``sampler``'s seed.

    Attributes
    ----------
    sampled_edges : int
        Edges in all blocks sampled so far.
    sample_seconds : float
        Wall time spent sampling batches so far (negatives, unique, neighbour sampling).

    Raises
    ------
    TypeError
        ``sampler`` is not a `Sampler`, or samples a `CSCGraph` (use `LinkSampler`); an id array holds
        non-integers; an int argument is not an int; typed-blocks contract broken at `sample` time.
    ValueError
        ``edge_type`` or ``reverse_edge_type`` not a relation of the graph, or a reverse relation whose
        types are not ``edge_type``'s swapped; mismatched lengths; ids out of their type's range (edge ids
        out of their relation's); ``batch_size`` outside [1, `samplers.MAX_BATCH`], ``num_negatives``
        outside [1, `samplers.MAX_FANOUT`]; ``seed`` outside [0, 2**64); an unknown ``exclude`` or
        ``negative``; ``exclude`` without ``target_eids`` (or without ``reverse_edge_type`` for
        "reverse"); ``reverse_eids`` None where the two relations' edge counts differ; a target edge that
        is not its pair's edge; an edge whose reverse is not the edge reversed (``reverse_eids`` given or
        None); a source whose
        positives cover every destination (with ``negative="degree"``: every one of in-degree > 0).

    References
    ----------
    PyG's ``LinkNeighborLoader`` on ``HeteroData`` (``edge_label_index=(edge_type, index)``,
    ``neg_sampling``); DGL's ``as_edge_prediction_sampler(exclude="reverse_types", reverse_etypes=...,
    negative_sampler=Uniform(k))``; Rendle et al., BPR (UAI 2009).

    Examples
    --------
    >>> graph = lastfm_hetero_graph(ds)
    >>> listens, heard = ("user", "listens", "artist"), ("artist", "heard_by", "user")
    >>> link = HeteroLinkSampler(HeteroNeighborSampler(graph, [10, 10], seed=0), listens, ds.train_users,
    ...                          ds.train_items, batch_size=1024, exclude="reverse",
    ...                          target_eids=torch.arange(len(ds.train_users)), reverse_edge_type=heard,
    ...                          seed=0)
    >>> for batch in link:                      # HeteroLinkBatch
    ...     h = model(batch.blocks)             # {"user": [S_user, d], "artist": [S_artist, d]}
    ...     u, p = h["user"][batch.user_index], h["artist"][batch.pos_index]
    """

    src_arg = "src"
    dst_arg = "dst"

    def __init__(self, sampler: Sampler, edge_type: Relation, src, dst, *, batch_size: int = 2048,
                 num_negatives: int = 1, negative: str = "uniform", exclude: str | None = None,
                 target_eids=None, reverse_edge_type: Relation | None = None, reverse_eids=None,
                 shuffle: bool = True, drop_last: bool = False, seed: int | None = None) -> None:
        check_sampler("sampler", sampler, typed=True)
        graph = sampler.graph
        if not isinstance(graph, HeteroGraph):
            raise TypeError(f"sampler must be a Sampler over a HeteroGraph: the {type(sampler).__name__}'s "
                            f"graph is a {type(graph).__name__} (use LinkSampler for a plain graph)")
        self.edge_type = rel = _relation("edge_type", edge_type, graph)
        super().__init__(sampler, batch_size=batch_size, num_negatives=num_negatives, negative=negative,
                         exclude=exclude, shuffle=shuffle, drop_last=drop_last, seed=seed)
        s_type, _, d_type = rel
        n_src, n_dst = graph.num_nodes[s_type], graph.num_nodes[d_type]

        u, i = id_vector("src", src), id_vector("dst", dst)
        if u.shape != i.shape:
            raise ValueError(f"src and dst must have the same length, got {u.size} and {i.size}")
        check_id_range("src", u, 0, n_src, f"num_nodes[{s_type!r}]={n_src}")
        check_id_range("dst", i, 0, n_dst, f"num_nodes[{d_type!r}]={n_dst}")
        if n_dst == 0:
            raise ValueError(f"edge_type {rel!r}: the destination type {d_type!r} has no nodes, so no "
                             f"negative can be drawn")

        self.reverse_edge_type: Relation | None = None
        if reverse_edge_type is not None:
            rev = _relation("reverse_edge_type", reverse_edge_type, graph)
            if (rev[0], rev[2]) != (d_type, s_type):
                raise ValueError(f"reverse_edge_type {rev!r} must run from {d_type!r} to {s_type!r} (the "
                                 f"reverse of edge_type {rel!r})")
            self.reverse_edge_type = rev
        self._target = None
        edges = edges_by_id(graph, rel) if target_eids is not None or reverse_edge_type is not None else None
        if target_eids is not None:
            e = graph.num_edges(rel)
            t = target_vector(target_eids, u.size, e, f"num_edges({rel!r})={e}")
            check_target_edges("target_eids", edges, u, i, t)
            self._target = t
        self._reverse = self._reverse_ids(graph, reverse_eids, edges)
        if exclude is not None and self._target is None:
            raise ValueError(f"exclude={exclude!r} needs target_eids (the edge id in {rel!r} of each pair)")
        if exclude == "reverse" and self.reverse_edge_type is None:
            raise ValueError("exclude='reverse' needs reverse_edge_type (the relation holding the reverse "
                             "edges, e.g. ('artist', 'heard_by', 'user'))")

        deg = np.diff(graph.indptr[rel].numpy()) if negative == "degree" else None
        rule = PairNegatives(u, i, n_src, (0, n_dst), negative, deg, src_arg="src",
                             src_name=f"{s_type!r} node", dst_noun=f"{d_type!r} node",
                             dst_where=f"(the destinations of {rel!r})")
        self._set_pairs(u, i, rule, n_src, f"num_nodes[{s_type!r}]={n_src}")

    def _reverse_ids(self, graph: HeteroGraph, reverse_eids,
                     edges: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray | None:
        """The reverse edge id of every edge of ``edge_type`` (None without a reverse relation), checked by
        `samplers.link_pairs.reverse_vector` (``edges``: ``edge_type``'s endpoints by edge id, given where
        there is a reverse relation); ``reverse_eids`` None means the same ids in both relations."""
        rel, rev = self.edge_type, self.reverse_edge_type
        if rev is None:
            if reverse_eids is not None:
                raise ValueError("reverse_eids given without reverse_edge_type (the relation they index)")
            return None
        e, e_rev = graph.num_edges(rel), graph.num_edges(rev)
        name = "reverse_eids"
        if reverse_eids is None:
            if e != e_rev:
                raise ValueError(f"reverse_eids is required: {rel!r} has {e} edges and {rev!r} {e_rev}, so "
                                 f"edge ids cannot be the same in both")
            reverse_eids, name = np.arange(e, dtype=np.int64), "reverse_eids (None: the same edge ids)"
        return reverse_vector(reverse_eids, edges, edges if rev == rel else edges_by_id(graph, rev),
                              f"num_edges({rev!r})={e_rev}", of=f" of {rel!r}", name=name)

    def _excluded(self, ids: np.ndarray) -> dict[Relation, torch.Tensor] | None:
        """The relation edge ids a batch excludes (None without ``exclude``)."""
        if self.exclude is None:
            return None
        reverse = self.exclude == "reverse"
        b = ids.size
        t = np.empty(2 * b if reverse else b, dtype=np.int64)  # targets, then their reverses
        np.take(self._target, ids, out=t[:b], mode="clip")  # checked ids: "clip" only skips a buffer
        if not reverse:
            return {self.edge_type: torch.from_numpy(t)}
        np.take(self._reverse, t[:b], out=t[b:], mode="clip")
        if self.reverse_edge_type == self.edge_type:  # one relation: targets and reverses in one tensor
            return {self.edge_type: torch.from_numpy(t)}
        return {self.edge_type: torch.from_numpy(t[:b]), self.reverse_edge_type: torch.from_numpy(t[b:])}

    def _batch(self, ids: np.ndarray, ends: BatchEnds) -> HeteroLinkBatch:
        """The `HeteroLinkBatch` of pairs ``ids``: unique seeds per node type (one `torch.unique` of
        ``ends.every`` where both ends are one type, else of the sources and of the destinations), their
        typed blocks (the targets, and their reverses, excluded as set up), positions in the seeds."""
        b, k = ends.batch_size, ends.num_negatives
        s_type, d_type = self.src_type, self.dst_type
        if s_type == d_type:
            merged, inverse = torch.unique(ends.every, return_inverse=True)
            seeds = {s_type: merged}
            user_index, dst_index = inverse[:b], inverse[b:]
        else:
            src_seeds, user_index = torch.unique(ends.src, return_inverse=True)
            dst_seeds, dst_index = torch.unique(ends.destinations, return_inverse=True)
            seeds = {s_type: src_seeds, d_type: dst_seeds}
        excluded = self._excluded(ids)
        if excluded is None:
            blocks = self.sampler.sample(seeds)
        else:
            blocks = self.sampler.sample(seeds, exclude_eids=excluded)
        check_typed_blocks(self.sampler, blocks, seeds)  # the index tensors are positions in ``seeds``
        return HeteroLinkBatch(edge_type=self.edge_type, users=ends.src, pos_items=ends.dst,
                               neg_items=ends.neg, blocks=blocks, user_index=user_index,
                               pos_index=dst_index[:b], neg_index=dst_index[b:].reshape(b, k),
                               pair_ids=torch.from_numpy(ids), excluded_eids=excluded)

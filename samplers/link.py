"""Link-prediction minibatches for BPR: positive edges, uniform or degree-biased negatives, sampled blocks.

The sampler knows only graphs (as PyG's link samplers do): the positive pairs come in as node-id
arrays, negatives are drawn from a node-id range, and the blocks come from a `samplers.Sampler` (a
`NeighborSampler`, a `LaborSampler`, ...) run on the batch's unique seed nodes. Data sets and models
live above it. The pairs, epochs, negatives, length and throughput are `samplers.link_pairs`'
`SeedEdgeSampler`'s, which `LinkSampler` extends with its pair checks and how a batch's seeds become
blocks; `samplers.hetero_link`'s `HeteroLinkSampler` is the typed form (seed edges of one relation of a
`HeteroGraph`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch

from graphrl.graph import CSCGraph
from samplers._checks import check_id_range, id_vector
from samplers.block import Block
from samplers.link_pairs import (
    DEGREE_EXPONENT,
    BatchEnds,
    PairNegatives,
    SeedEdgeBatch,
    SeedEdgeSampler,
    check_target_edges,
    reverse_vector,
    target_vector,
)
from samplers.protocol import Sampler, check_blocks, check_sampler, edges_by_id

__all__ = ["DEGREE_EXPONENT", "LinkBatch", "LinkSampler", "bipartite_reverse_eids"]


def bipartite_reverse_eids(num_interactions: int) -> torch.Tensor:
    """Reverse edge id of every edge of a `CSCGraph.bipartite` graph.

    Interaction ``i`` is edge ``i`` (user -> item) and edge ``i + M`` (item -> user), so the reverse of
    edge ``e`` is ``(e + M) % (2 M)``.

    Parameters
    ----------
    num_interactions : int
        M, the number of interactions the graph was built from.

    Returns
    -------
    torch.Tensor, int64, shape [2 M]
        ``reverse[e]`` is the id of the reverse of edge ``e``.

    Raises
    ------
    ValueError
        ``num_interactions`` is negative.
    """
    if isinstance(num_interactions, bool) or not isinstance(num_interactions, (int, np.integer)) \
            or num_interactions < 0:
        raise ValueError(f"num_interactions must be a non-negative int, got {num_interactions!r}")
    m = int(num_interactions)
    return (torch.arange(2 * m, dtype=torch.int64) + m) % max(2 * m, 1)


@dataclass(frozen=True, eq=False)
class LinkBatch(SeedEdgeBatch):
    """One BPR minibatch: B positive (user, item) pairs, k negatives each, and the blocks of their nodes.

    ``users``, ``pos_items`` and ``neg_items`` are views of one int64 buffer (`samplers.link_pairs.BatchEnds`,
    whose unique is ``seeds``); pickling or sharing one of them carries the whole [B * (2 + k)] buffer.

    Attributes
    ----------
    users : torch.Tensor, int64, shape [B]
        User node ids.
    pos_items : torch.Tensor, int64, shape [B]
        Positive item node ids (``users[b] -> pos_items[b]`` is a training edge).
    neg_items : torch.Tensor, int64, shape [B, k]
        Negative item node ids; none is a training positive of ``users[b]``.
    blocks : list[Block]
        Blocks of the unique seed nodes (outermost first); ``blocks[-1].dst_nodes`` are the seeds.
    user_index, pos_index : torch.Tensor, int64, shape [B]
        Positions of ``users`` / ``pos_items`` in ``blocks[-1].dst_nodes``.
    neg_index : torch.Tensor, int64, shape [B, k]
        Positions of ``neg_items`` in ``blocks[-1].dst_nodes``.
    pair_ids : torch.Tensor, int64, shape [B]
        Index of each positive pair in the sampler's input arrays.
    excluded_eids : torch.Tensor or None, int64, shape [X]
        Edge ids removed from the blocks' candidates (the targets and, with ``exclude="reverse"``,
        their reverses); ``None`` when nothing was excluded.
    """

    users: torch.Tensor
    pos_items: torch.Tensor
    neg_items: torch.Tensor
    blocks: list[Block]
    user_index: torch.Tensor
    pos_index: torch.Tensor
    neg_index: torch.Tensor
    pair_ids: torch.Tensor
    excluded_eids: torch.Tensor | None = None

    @property
    def seeds(self) -> torch.Tensor:
        """The unique seed nodes, ``blocks[-1].dst_nodes``: int64, shape [S]."""
        return self.blocks[-1].dst_nodes

    @property
    def num_sampled_edges(self) -> int:
        """Edges in all blocks together."""
        return sum(b.num_edges for b in self.blocks)


def _item_range_from_graph(graph: CSCGraph) -> tuple[int, int]:
    if graph.node_type is None:
        raise ValueError("item_range is required: the graph has no node_type to find the item nodes "
                         "(pass item_range=(first_item_node, last_item_node + 1))")
    items = np.flatnonzero(graph.node_type.numpy() == 1)
    if items.size == 0 or items[-1] - items[0] + 1 != items.size:
        raise ValueError("item_range is required: the graph's item nodes (node_type == 1) are absent or not "
                         "one contiguous range")
    return int(items[0]), int(items[-1]) + 1


class LinkSampler(SeedEdgeSampler[LinkBatch]):
    """Minibatches of positive edges with k negatives each (uniform or degree-biased), plus blocks for all
    their nodes.

    Each epoch visits every positive pair exactly once, in a seeded random order (or in input order with
    ``shuffle=False``). For every pair ``(u, i)`` it draws ``num_negatives`` items from ``item_range``
    that are not positives of ``u``: uniformly, or with probability proportional to the item's
    in-degree in the graph to the power 0.75 (``negative="degree"``), conditioned on not being a
    positive of ``u`` (rejection against a sorted key array of all pairs, vectorised; a user's allowed
    items are enumerated exactly, with the same weights, if rejection keeps failing). Negatives avoid
    only the given pairs, not every edge of the graph, and where ``item_range`` holds users' ids too a user
    can be drawn as its own negative (as PyG's negatives; DGL's ``GlobalUniform`` excludes self-pairs and
    every edge: `samplers.link_pairs.PairNegatives.draw`). It then
    samples blocks for the unique nodes of the batch (``torch.unique``) with the given sampler,
    optionally removing the batch's target edges (and their reverses) from the candidates, so that a
    model cannot read the answer off the graph.

    Parameters
    ----------
    sampler : Sampler (`samplers.protocol`: a `NeighborSampler`, a `LaborSampler`, ...)
        Samples the blocks; its graph is the graph the pairs live in.
    users : torch.Tensor or array-like, integer, shape [M]
        Source node of each positive pair (the user), in [0, N).
    items : torch.Tensor or array-like, integer, shape [M]
        Destination node of each positive pair (the item's *node* id), in ``item_range``.
    batch_size : int
        Pairs per batch, >= 1.
    num_negatives : int
        k, negatives per pair, >= 1.
    item_range : tuple[int, int] or None
        Negatives are node ids in ``[lo, hi)``. ``None``: the contiguous range of nodes with
        ``graph.node_type == 1`` (as `CSCGraph.bipartite` makes).
    negative : {"uniform", "degree"}
        How negatives are drawn: uniformly over ``item_range``, or with probability proportional to
        ``in_degree ** 0.75`` (word2vec's unigram^0.75 noise distribution, as PinSage's popular
        negatives); items of in-degree 0 are then never drawn.
    exclude : {None, "self", "reverse"}
        Remove from the blocks' candidates nothing, the batch's target edges, or the target edges and
        their reverses (as DGL's ``exclude="reverse_id"``). By edge id: a parallel edge of the same
        (user, item) pair (a duplicated interaction) stays a candidate, as in DGL.
    target_eids : torch.Tensor or array-like or None, integer, shape [M]
        Edge id of each pair's edge (for `CSCGraph.bipartite`, pair i is edge i). Required when
        ``exclude`` is set.
    reverse_eids : torch.Tensor or array-like or None, integer, shape [E]
        Reverse edge id of every edge (see `bipartite_reverse_eids`). Required for ``exclude="reverse"``.
        Checked (`samplers.link_pairs.reverse_vector`, `HeteroLinkSampler`'s rule): edge ``reverse[e]`` is
        edge ``e`` with its endpoints swapped, so every edge needs a reverse edge; parallel edges may share
        one (as DGL's ``exclude="reverse_id"``), the map need not be its own inverse.
    shuffle : bool
        Visit pairs in a fresh random order each epoch.
    drop_last : bool
        Drop the last batch of an epoch when it has fewer than ``batch_size`` pairs.
    seed : int or None
        Seed of the sampler's own stream (order and negatives); ``None`` draws one from the OS. The
        blocks also depend on ``sampler``'s seed.

    Attributes
    ----------
    sampled_edges : int
        Edges in all blocks sampled so far.
    sample_seconds : float
        Wall time spent in `sample` so far (negatives, unique, neighbour sampling).

    Raises
    ------
    TypeError
        ``sampler`` is not a `Sampler` over a `CSCGraph`; an id array holds non-integers; an int argument
        is not an int.
    ValueError
        Mismatched lengths; ids out of range (users in [0, N), items in ``item_range``, edge ids in
        [0, E)); ``batch_size`` outside [1, `samplers.MAX_BATCH`] or ``num_negatives`` outside [1,
        `samplers.MAX_FANOUT`]; ``seed`` outside [0, 2**64); an unknown ``exclude`` or ``negative``;
        ``exclude`` without ``target_eids`` (or without ``reverse_eids`` for "reverse"); a user whose
        positives cover the whole item range (with ``negative="degree"``: every item of in-degree > 0),
        so that no negative exists; a ``target_eids`` entry whose edge is not the pair's; a
        ``reverse_eids`` of another length than E, with an id outside [0, E), or an entry whose edge is not
        the edge reversed.

    References
    ----------
    Rendle, Freudenthaler, Gantner and Schmidt-Thieme, "BPR: Bayesian Personalized Ranking from
    Implicit Feedback" (UAI 2009) for (user, positive, negative) triples with uniform negatives;
    Ying et al., "Graph Convolutional Neural Networks for Web-Scale Recommender Systems" (PinSage,
    KDD 2018) for training a recommender on sampled neighbourhoods and degree-biased negatives;
    Mikolov et al., "Distributed Representations of Words and Phrases" (NeurIPS 2013) for the 0.75
    exponent of the noise distribution; DGL's
    ``as_edge_prediction_sampler(exclude="reverse_id")`` for target-edge exclusion.

    Examples
    --------
    >>> graph = CSCGraph.bipartite(users, items, num_users, num_items)
    >>> link = LinkSampler(NeighborSampler(graph, [10, 10], seed=0), users, items + num_users,
    ...                    batch_size=2048, exclude="reverse", target_eids=torch.arange(len(users)),
    ...                    reverse_eids=bipartite_reverse_eids(len(users)), seed=0)
    >>> for batch in link:              # one epoch
    ...     emb = model(batch.blocks)   # [S, d] for batch.seeds
    ...     u, p, n = emb[batch.user_index], emb[batch.pos_index], emb[batch.neg_index]
    """

    def __init__(self, sampler: Sampler, users, items, *, batch_size: int = 2048,
                 num_negatives: int = 1, item_range: tuple[int, int] | None = None,
                 negative: str = "uniform", exclude: str | None = None, target_eids=None, reverse_eids=None,
                 shuffle: bool = True, drop_last: bool = False, seed: int | None = None) -> None:
        check_sampler("sampler", sampler)
        super().__init__(sampler, batch_size=batch_size, num_negatives=num_negatives, negative=negative,
                         exclude=exclude, shuffle=shuffle, drop_last=drop_last, seed=seed)
        graph = sampler.graph
        n = graph.num_nodes
        u = id_vector("users", users)
        i = id_vector("items", items)
        if u.shape != i.shape:
            raise ValueError(f"users and items must have the same length, got {u.size} and {i.size}")
        if item_range is None:
            lo, hi = _item_range_from_graph(graph)
        else:
            try:
                lo, hi = (operator.index(x) for x in item_range)
                if any(isinstance(x, (bool, np.bool_)) for x in item_range):
                    raise TypeError
            except (TypeError, ValueError):
                raise TypeError(f"item_range must be a pair of ints (lo, hi), got {item_range!r}") from None
            if not 0 <= lo < hi <= n:
                raise ValueError(f"item_range=({lo}, {hi}) must satisfy 0 <= lo < hi <= num_nodes={n}")
        check_id_range("users", u, 0, n, f"num_nodes={n}")
        check_id_range("items", i, lo, hi, "item_range")
        self.item_range = (lo, hi)

        self._target = None
        self._reverse = None
        edges = edges_by_id(graph) if target_eids is not None or reverse_eids is not None else None
        if target_eids is not None:
            self._target = target_vector(target_eids, u.size, graph.num_edges, f"num_edges={graph.num_edges}")
        if reverse_eids is not None:
            self._reverse = reverse_vector(reverse_eids, edges, edges, f"num_edges={graph.num_edges}")
        if exclude is not None and self._target is None:
            raise ValueError(f"exclude={exclude!r} needs target_eids (the edge id of each pair)")
        if exclude == "reverse" and self._reverse is None:
            raise ValueError("exclude='reverse' needs reverse_eids (e.g. bipartite_reverse_eids(M))")
        if self._target is not None:
            check_target_edges("target_eids", edges, u, i, self._target)

        deg = graph.in_degrees().numpy()[lo:hi] if negative == "degree" else None
        self._set_pairs(u, i, PairNegatives(u, i, n, (lo, hi), negative, deg,
                                            dst_where=f"of item_range=({lo}, {hi})"), n, f"num_nodes={n}")

    def _batch(self, ids: np.ndarray, ends: BatchEnds) -> LinkBatch:
        """The `LinkBatch` of pairs ``ids``: unique seeds of users, positives and negatives (one
        `torch.unique` of ``ends.every``), their blocks (the targets, and their reverses, excluded as set
        up), positions in the seeds."""
        b, k = ends.batch_size, ends.num_negatives
        seeds, inverse = torch.unique(ends.every, return_inverse=True)
        excluded = None
        if self.exclude is not None:
            b_t = b if self.exclude == "self" else 2 * b
            t = np.empty(b_t, dtype=np.int64)  # targets, then their reverses
            np.take(self._target, ids, out=t[:b], mode="clip")  # checked ids: "clip" only skips a buffer
            if self.exclude == "reverse":
                np.take(self._reverse, t[:b], out=t[b:], mode="clip")
            excluded = torch.from_numpy(t)
            blocks = self.sampler.sample(seeds, exclude_eids=excluded)
        else:
            blocks = self.sampler.sample(seeds)
        check_blocks(self.sampler, blocks, seeds)  # the index tensors are positions in ``seeds``
        return LinkBatch(users=ends.src, pos_items=ends.dst, neg_items=ends.neg, blocks=blocks,
                         user_index=inverse[:b], pos_index=inverse[b:2 * b],
                         neg_index=inverse[2 * b:].reshape(b, k), pair_ids=torch.from_numpy(ids),
                         excluded_eids=excluded)

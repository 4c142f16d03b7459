"""Positive pairs and their negatives for link prediction: the rules `LinkSampler` and `HeteroLinkSampler`
share.

`SeedEdgeSampler` is their base: the checked arguments, the positive pairs, the seeded stream, epochs
(`samplers.epochs`), negatives, `is_positive`, length and throughput; a subclass checks its own pairs and
says how a batch's seeds become blocks and its batch record (``_batch``), as PyG's ``LinkLoader`` runs any
sampler's ``sample_from_edges`` and GraphBolt subclasses its sampler per mode.

`PairNegatives` holds a sampler's positive (source, destination) pairs as sorted keys and draws negatives
for sources from a destination range: uniformly, or by destination in-degree to the power 0.75, never a
positive of the source (vectorised rejection against the keys; a source's allowed destinations enumerated
exactly, with the same weights, when rejection keeps failing). The caller owns the random stream and passes
it in, so one seeded generator orders its epochs and draws its negatives. Over a plain graph the
destinations are a node-id range (the items of a bipartite graph); over a `HeteroGraph` they are every node
of the destination type, ``[0, num_nodes[dst_type])``. A negative avoids only the sampler's own positive
pairs, not every edge of the graph, and may be its source itself where sources and destinations share ids
(`PairNegatives.draw`). `target_vector`, `check_target_edges` and
`reverse_vector` check the target and reverse edge ids both samplers take (their other id arrays go through
`samplers._checks`' `id_vector` and `check_id_range`, the samplers' one reading and range rule of ids).

References
----------
Rendle et al., "BPR: Bayesian Personalized Ranking from Implicit Feedback" (UAI 2009) for uniform negatives;
Mikolov et al., "Distributed Representations of Words and Phrases" (NeurIPS 2013) for the 0.75 exponent;
Ying et al., PinSage (KDD 2018) for degree-biased negatives.
"""

from __future__ import annotations

import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch

from samplers._checks import MAX_BATCH, MAX_FANOUT, check_id_range, check_int, check_seed, id_array, id_vector
from samplers.epochs import epoch_batches, num_batches
from samplers.protocol import Sampler

__all__ = ["DEGREE_EXPONENT", "EXCLUDE_MODES", "NEGATIVE_MODES", "BatchEnds", "PairNegatives",
           "SeedEdgeBatch", "SeedEdgeSampler", "check_target_edges", "reverse_vector", "target_vector"]

BatchT = TypeVar("BatchT")
"""A seed-edge sampler's batch record (`LinkBatch`, `HeteroLinkBatch`)."""

EXCLUDE_MODES = (None, "self", "reverse")
"""What a link sampler removes from the blocks' candidates: nothing, the targets, the targets and reverses."""
NEGATIVE_MODES = ("uniform", "degree")
"""How negatives are drawn."""
DEGREE_EXPONENT = 0.75
"""Degree-biased negatives draw destination i with probability proportional to degree(i) ** 0.75."""
_MAX_REJECTION_ROUNDS = 64


def target_vector(value, num_pairs: int, num_edges: int, what: str) -> np.ndarray:
    """A link sampler's ``target_eids``, the edge id of each positive pair, checked.

    Parameters
    ----------
    value : torch.Tensor or array-like, integer, shape [M]
        The caller's ``target_eids``.
    num_pairs : int
        M, the positive pairs.
    num_edges : int
        Edges of the relation the ids index (the ids lie in ``[0, num_edges)``).
    what : str
        The bound in words, for the message (``"num_edges=1620970"``).

    Returns
    -------
    numpy.ndarray, int64, shape [M], C-contiguous

    Raises
    ------
    TypeError
        Not integers (`samplers._checks.id_vector`).
    ValueError
        Not 1-D, another length than M, or an id outside ``[0, num_edges)``; each message names
        ``target_eids`` and the bad length or the first bad id.
    """
    t = id_vector("target_eids", value)
    if t.shape != (num_pairs,):
        raise ValueError(f"target_eids must have one edge id per pair ([{num_pairs}]), got [{t.size}]")
    check_id_range("target_eids", t, 0, num_edges, what)
    return t


def check_target_edges(name: str, edges: tuple[np.ndarray, np.ndarray], src: np.ndarray, dst: np.ndarray,
                       target: np.ndarray) -> None:
    """Raise unless edge ``target[j]`` is ``src[j] -> dst[j]`` for every pair j.

    Parameters
    ----------
    name : str
        The argument the edge ids came in (``"target_eids"``), for the message.
    edges : (numpy.ndarray, numpy.ndarray), int64 [E] each
        Source and destination of every edge id of the graph (or relation) the ids index, as
        `samplers.protocol.edges_by_id` gives them.
    src, dst : numpy.ndarray, int64 [M]
        The pairs.
    target : numpy.ndarray, int64 [M]
        Their edge ids, in [0, E) (checked before, `target_vector`).

    Raises
    ------
    ValueError
        An edge id whose edge is not its pair's; the message names ``name``, the count and the first pair with
        both ends of its edge and of the pair.
    """
    if target.size == 0:
        return
    s, d = edges[0][target], edges[1][target]
    bad = (s != src) | (d != dst)
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(f"{name}: {int(bad.sum())} of {target.size} edge ids are not their pair's edge, "
                         f"first pair {j}: edge {int(target[j])} is {int(s[j])}->{int(d[j])}, "
                         f"pair is {int(src[j])}->{int(dst[j])}")


def reverse_vector(value, edges: tuple[np.ndarray, np.ndarray], reverse_edges: tuple[np.ndarray, np.ndarray],
                   what: str, *, of: str = "", name: str = "reverse_eids") -> np.ndarray:
    """A link sampler's ``reverse_eids``, the id of every seed-relation edge's reverse, checked: the one rule
    of `LinkSampler` and `HeteroLinkSampler` (DGL's ``exclude="reverse_id"`` / ``"reverse_types"`` maps).

    What exclusion needs, and no more: reverse exclusion removes ``reverse[t]`` for each target ``t``, by
    edge id, so each entry must be an edge id joining ``t``'s endpoints swapped. The map need not be its own
    inverse: parallel edges may share one reverse (two ``0 -> 1`` edges both mapped to one ``1 -> 0`` edge,
    which DGL's ``exclude="reverse_id"`` accepts), and the reverse of a reverse may be another parallel copy;
    an excluded reverse is still an edge between the target's endpoints, and the other parallel copies stay
    candidates as a parallel edge of a target does (exclusion is by edge id).

    Parameters
    ----------
    value : torch.Tensor or array-like, integer, shape [E]
        ``reverse[e]`` is the reverse of edge ``e``: an edge id of the graph holding the reverses.
    edges : (numpy.ndarray, numpy.ndarray), int64 [E] each
        Source and destination of every edge of the graph (or relation) the seed edges are in
        (`samplers.protocol.edges_by_id`).
    reverse_edges : (numpy.ndarray, numpy.ndarray), int64 [E_r] each
        The same for the graph (or relation) holding the reverses: ``edges`` itself for a plain graph.
    what : str
        The reverse ids' bound in words (``"num_edges=1620970"``), for the messages.
    of, name : str
        Words for the messages: the seed relation (``" of ('user', 'listens', 'artist')"``) and the argument.

    Returns
    -------
    numpy.ndarray, int64, shape [E], C-contiguous

    Raises
    ------
    TypeError
        Not integers (`samplers._checks.id_vector`).
    ValueError
        Not 1-D or not one id per edge; an id outside ``[0, E_r)``; an edge whose reverse does not join its
        endpoints swapped (a graph edge without a reverse edge cannot be mapped). Each names ``name`` and the
        first bad edge and value.
    """
    r = id_vector(name, value)
    e = edges[0].shape[0]
    if r.shape != (e,):
        raise ValueError(f"{name} must have one entry per edge{of} ([{e}]), got [{r.size}]")
    check_id_range(name, r, 0, reverse_edges[0].shape[0], what)
    s, d = edges
    # the reverse's source must be the edge's destination and its destination the edge's source
    bad = np.take(reverse_edges[0], r) != d
    bad |= np.take(reverse_edges[1], r) != s
    if bad.any():
        j = int(np.argmax(bad))
        rs, rd = int(reverse_edges[0][r[j]]), int(reverse_edges[1][r[j]])
        a, b = int(s[j]), int(d[j])
        raise ValueError(f"{name}: {int(np.count_nonzero(bad))} of {e} edges{of} have a reverse that is not "
                         f"the edge reversed, first edge {j} ({a}->{b}): {name}[{j}]={int(r[j])} is "
                         f"{rs}->{rd}, not {b}->{a}")
    return r


class PairNegatives:
    """The positive pairs of a link sampler and its negative rule.

    Parameters
    ----------
    src : numpy.ndarray, int64 [M]
        Source of each positive pair, in [0, num_src) (checked by the caller).
    dst : numpy.ndarray, int64 [M]
        Destination of each positive pair, in ``dst_range`` (checked by the caller).
    num_src : int
        Sources that may be asked for negatives: [0, num_src).
    dst_range : tuple[int, int]
        Negatives are ids in ``[lo, hi)``.
    negative : {"uniform", "degree"}
        Uniform over ``dst_range``, or proportional to ``in_degree ** 0.75`` (destinations of in-degree 0 are
        then never drawn).
    in_degree : numpy.ndarray, integer [hi - lo], or None
        In-degree of each destination of the range (required for ``negative="degree"``).
    src_arg, src_name, dst_noun, dst_where : str
        Words for the messages: the sources' argument and noun (``"users"``, ``"user node"``), the
        destinations' noun and where they lie (``"item"``, ``"of item_range=(lo, hi)"``).

    Raises
    ------
    ValueError
        A source whose positives cover the whole range (with ``negative="degree"``: every destination of
        in-degree > 0), or no destination of in-degree > 0, so that no negative can be drawn.
    """

    def __init__(self, src: np.ndarray, dst: np.ndarray, num_src: int, dst_range: tuple[int, int],
                 negative: str = "uniform", in_degree: np.ndarray | None = None, *,
                 src_arg: str = "users", src_name: str = "user node", dst_noun: str = "item",
                 dst_where: str = "of item_range") -> None:
        lo, hi = dst_range
        self.dst_range = (int(lo), int(hi))
        self.negative = negative
        span = hi - lo
        keys = np.unique(src * span + (dst - lo))
        self._keys = keys
        self._span = span
        counts = np.bincount(keys // span, minlength=num_src)
        if (counts >= span).any():
            bad = int(np.argmax(counts >= span))
            raise ValueError(f"{src_arg}: {src_name} {bad} has all {span} {dst_noun}s {dst_where} as "
                             "positives, so no negative can be drawn for it")
        self._cdf = None
        self._weight = None
        if negative == "degree":
            weight = np.asarray(in_degree, dtype=np.float64) ** DEGREE_EXPONENT
            if not (weight > 0).any():
                raise ValueError(f"negative='degree': every {dst_noun} {dst_where} has in-degree 0, so no "
                                 "negative can be drawn")
            self._weight = weight
            self._cdf = np.cumsum(weight)
            # a source whose positives hold every destination of positive degree has no negative either
            mass = np.bincount(keys // span, weights=weight[keys % span] > 0, minlength=num_src)
            if (mass >= np.count_nonzero(weight)).any():
                bad = int(np.argmax(mass >= np.count_nonzero(weight)))
                raise ValueError(f"{src_arg}: {src_name} {bad} has every {dst_noun} of positive in-degree "
                                 "as a positive, so no degree-biased negative can be drawn for it")

    def is_positive(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Whether each (src, dst) pair is a positive pair: bool, the shape of ``src`` (int64 arrays of one
        shape; destinations outside the range are never positive)."""
        lo, hi = self.dst_range
        inside = (dst >= lo) & (dst < hi)
        q = src * self._span + (np.clip(dst, lo, hi - 1) - lo)
        pos = np.searchsorted(self._keys, q)
        if self._keys.size == 0:
            return np.zeros_like(inside)
        return (self._keys[np.minimum(pos, self._keys.size - 1)] == q) & inside

    def _draw(self, rng: np.random.Generator, size) -> np.ndarray:
        """Destinations from the negative distribution, ignoring positives."""
        lo, hi = self.dst_range
        if self._cdf is None:
            return rng.integers(lo, hi, size=size, dtype=np.int64)
        x = rng.random(size) * self._cdf[-1]
        idx = np.searchsorted(self._cdf, x, side="right")  # first destination whose cdf exceeds x
        return lo + np.minimum(idx, self._cdf.size - 1)

    def draw(self, rng: np.random.Generator, src: np.ndarray, k: int,
             out: np.ndarray | None = None) -> np.ndarray:
        """``k`` negatives for each source: int64 [len(src), k] in the range, none a positive of its source.

        What a negative avoids is the positive pairs this rule holds (the sampler's ``users`` / ``items``, or
        ``src`` / ``dst``) and nothing else:

        - not every edge of the graph: an edge that is not among the pairs (a held-out or test interaction
          left in the graph, an edge of another relation) can be drawn as a negative;
        - not the source itself: where the destinations' ids are the sources' too (a relation whose both
          ends are one node type, such as ``("user", "friends", "user")``, or an ``item_range`` covering
          the sources of a plain graph), source ``u`` can be drawn as its own negative ``(u, u)``, unless
          ``(u, u)`` is a positive pair: with uniform negatives, each of ``u``'s draws is ``u`` with
          probability ``1 / (hi - lo - p_u)``, ``p_u`` the positives of ``u``.

        DGL's ``GlobalUniform`` excludes both: self-pairs by default (``exclude_self_loops=True``) and every
        edge of the relation in the graph. DGL's ``Uniform`` (``PerSourceUniform``) and PyG's
        ``LinkNeighborLoader`` (``neg_sampling``) exclude neither, nor the positive pairs. A caller who needs
        self-pairs or other edges excluded filters the returned negatives (`SeedEdgeSampler.is_positive`
        tests the pairs).

        Parameters
        ----------
        rng : numpy.random.Generator
            The caller's stream (advanced).
        src : numpy.ndarray, int64 [B]
            Sources in [0, num_src) (checked by the caller).
        k : int
            Negatives per source, >= 1.
        out : numpy.ndarray, int64 [B, k], C-contiguous, or None
            Where to write them (not overlapping ``src``); None allocates.

        Returns
        -------
        numpy.ndarray, int64 [B, k]
            ``out`` (or a new array), the same draws either way.
        """
        lo, _ = self.dst_range
        if out is None:
            out = self._draw(rng, (src.size, k))
        else:
            out[...] = self._draw(rng, (src.size, k))
        uu = np.repeat(src, k).reshape(src.size, k)
        bad = np.flatnonzero(self.is_positive(uu.ravel(), out.ravel()))
        flat = out.reshape(-1)
        rounds = 0
        while bad.size:
            rounds += 1
            if rounds > _MAX_REJECTION_ROUNDS:
                # Sources with almost every destination positive: draw from their allowed ones explicitly.
                for j in bad:
                    user = int(uu.flat[j])
                    a = np.searchsorted(self._keys, user * self._span)
                    b = np.searchsorted(self._keys, (user + 1) * self._span)
                    allowed = np.setdiff1d(np.arange(self._span), self._keys[a:b] - user * self._span)
                    if self._cdf is None:
                        flat[j] = lo + int(allowed[rng.integers(allowed.size)])
                    else:
                        cdf = np.cumsum(self._weight[allowed])
                        pick = np.searchsorted(cdf, rng.random() * cdf[-1], side="right")
                        flat[j] = lo + int(allowed[min(pick, allowed.size - 1)])
                break
            flat[bad] = self._draw(rng, bad.size)
            still = self.is_positive(uu.ravel()[bad], flat[bad])
            bad = bad[still]
        return out


@dataclass(frozen=True)
class BatchEnds:
    """A link batch's pair ends and negatives in one int64 buffer, so that its seeds are one `torch.unique`
    of the buffer (or of its destinations), never a concatenation; the batch's fields are views of it.

    Attributes
    ----------
    every : torch.Tensor, int64, shape [B * (2 + k)], CPU, contiguous
        Sources [B], destinations [B], then the negatives [B, k] row by row.
    batch_size : int
        B, the pairs.
    num_negatives : int
        k, negatives per pair.
    """

    every: torch.Tensor
    batch_size: int
    num_negatives: int

    @property
    def src(self) -> torch.Tensor:
        """Sources, int64 [B] (a view of ``every``)."""
        return self.every[:self.batch_size]

    @property
    def dst(self) -> torch.Tensor:
        """Positive destinations, int64 [B] (a view)."""
        return self.every[self.batch_size:2 * self.batch_size]

    @property
    def neg(self) -> torch.Tensor:
        """Negatives, int64 [B, k] (a view)."""
        return self.every[2 * self.batch_size:].view(self.batch_size, self.num_negatives)

    @property
    def destinations(self) -> torch.Tensor:
        """Positives then negatives, int64 [B * (1 + k)] (a view)."""
        return self.every[self.batch_size:]


class SeedEdgeBatch:
    """Sizes of a link batch record (`LinkBatch`, `HeteroLinkBatch`), from its ``users`` (int64 [B]) and
    ``neg_items`` (int64 [B, k]) fields."""

    users: torch.Tensor
    neg_items: torch.Tensor

    @property
    def batch_size(self) -> int:
        """B, the number of positive pairs."""
        return int(self.users.shape[0])

    @property
    def num_negatives(self) -> int:
        """k, negatives per positive."""
        return int(self.neg_items.shape[1])


class SeedEdgeSampler(ABC, Generic[BatchT]):
    """Base of the link samplers: minibatches of positive (source, destination) pairs, k negatives each.

    Holds what `LinkSampler` and `HeteroLinkSampler` share: ``batch_size``, ``num_negatives``,
    ``negative``, ``exclude``, ``shuffle``, ``drop_last``, ``seed`` (checked here), the pairs ``users`` /
    ``items`` and their `PairNegatives` rule (set by the subclass through `_set_pairs`), one seeded stream
    for the epochs' order and the negatives, and the counters ``sampled_edges`` / ``sample_seconds``. A
    subclass validates its pairs, calls `_set_pairs`, and implements ``_batch(ids, ends)``: the batch record
    of pairs ``ids`` whose ends and negatives are `BatchEnds` ``ends`` (its seeds' blocks, index tensors;
    anything with ``num_sampled_edges``).
    The names ``src_arg`` / ``dst_arg`` (``"users"`` / ``"items"``) are the arguments' names in messages.

    Raises
    ------
    TypeError
        An int argument is not an int.
    ValueError
        ``batch_size`` outside [1, `samplers.MAX_BATCH`], ``num_negatives`` outside [1,
        `samplers.MAX_FANOUT`]; ``seed`` outside [0, 2**64); an unknown ``exclude`` or ``negative``.
    """

    src_arg = "users"
    dst_arg = "items"

    def __init__(self, sampler: Sampler, *, batch_size: int, num_negatives: int, negative: str,
                 exclude: str | None, shuffle: bool, drop_last: bool, seed: int | None) -> None:
        self.sampler = sampler
        self.batch_size = check_int("batch_size", batch_size, 1, MAX_BATCH)
        self.num_negatives = check_int("num_negatives", num_negatives, 1, MAX_FANOUT)
        check_seed("seed", seed, allow_none=True)
        if exclude not in EXCLUDE_MODES:
            raise ValueError(f"exclude must be one of {EXCLUDE_MODES}, got {exclude!r}")
        if negative not in NEGATIVE_MODES:
            raise ValueError(f"negative must be one of {NEGATIVE_MODES}, got {negative!r}")
        self.negative = negative
        self.exclude = exclude
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self.sampled_edges = 0
        self.sample_seconds = 0.0

    def _set_pairs(self, src: np.ndarray, dst: np.ndarray, rule: PairNegatives, num_src: int,
                   src_bound: str) -> None:
        """Store the checked pairs (int64 [M] each), their negative rule, and the sources' range
        ``[0, num_src)`` (``src_bound`` names it in messages: ``"num_nodes=70839"``)."""
        self.users, self.items = src, dst
        self._negative_rule = rule
        self._num_src, self._src_bound = num_src, src_bound

    # ------------------------------------------------------------------ sizes
    @property
    def num_pairs(self) -> int:
        """M, positive pairs per epoch."""
        return int(self.users.shape[0])

    def __len__(self) -> int:
        """Batches per epoch (`samplers.epochs.num_batches`)."""
        return num_batches(self.num_pairs, self.batch_size, self.drop_last)

    @property
    def sampled_edges_per_second(self) -> float:
        """``sampled_edges / sample_seconds`` (0.0 before the first batch)."""
        return self.sampled_edges / self.sample_seconds if self.sample_seconds > 0 else 0.0

    # --------------------------------------------------------------- sampling
    def is_positive(self, src, dst) -> torch.Tensor:
        """Whether each (source, destination) pair is one of the sampler's positive pairs.

        Parameters
        ----------
        src, dst : torch.Tensor or array-like, integer, same shape
            Source and destination ids (node ids of a plain graph; ids within their type of a typed one);
            destinations outside the negatives' range are never positive.

        Returns
        -------
        torch.Tensor, bool, same shape as ``src``

        Raises
        ------
        TypeError
            ``src`` or ``dst`` not integers.
        ValueError
            Shapes that differ.
        """
        a, b = self.src_arg, self.dst_arg
        u, it = id_array(a, src), id_array(b, dst)
        if u.shape != it.shape:
            raise ValueError(f"{a} and {b} must have the same shape, got {u.shape} and {it.shape}")
        return torch.from_numpy(self._negative_rule.is_positive(u, it))

    def negatives(self, src) -> torch.Tensor:
        """Draw ``num_negatives`` non-positive destinations for each source, uniform or degree-biased as the
        sampler is set up (advances the sampler's stream).

        Parameters
        ----------
        src : torch.Tensor or array-like, integer, shape [B]
            Source ids.

        Returns
        -------
        torch.Tensor, int64, shape [B, k]
            Destination ids in the negatives' range; ``out[b, j]`` is not a positive of ``src[b]``, but may
            be an edge of the graph outside the pairs, or ``src[b]`` itself where sources and destinations
            are one node type (`PairNegatives.draw`).

        Raises
        ------
        TypeError
            ``src`` not integers.
        ValueError
            ``src`` not 1-D, or holding ids outside the sources' range.
        """
        u = id_vector(self.src_arg, src)
        check_id_range(self.src_arg, u, 0, self._num_src, self._src_bound)
        return torch.from_numpy(self._negative_rule.draw(self._rng, u, self.num_negatives))

    def sample(self, pair_ids) -> BatchT:
        """Build the batch of the given positive pairs: negatives, unique seeds, blocks, index tensors.

        Parameters
        ----------
        pair_ids : torch.Tensor or array-like, integer, shape [B]
            Indices into the sampler's ``users`` / ``items`` arrays.

        Returns
        -------
        The subclass's batch record (`LinkBatch`, `HeteroLinkBatch`).

        Raises
        ------
        TypeError, ValueError
            ``pair_ids`` is not a 1-D integer array in [0, M); the sampler broke its blocks' contract
            (`samplers.protocol`).
        """
        ids = id_vector("pair_ids", pair_ids)
        check_id_range("pair_ids", ids, 0, self.num_pairs, f"num_pairs={self.num_pairs}")
        return self._sample(ids)

    def __iter__(self) -> Iterator[BatchT]:
        """One epoch of batches: every pair exactly once (the last batch may be short unless drop_last)."""
        for ids in epoch_batches(self._rng, self.num_pairs, self.batch_size, self.shuffle, self.drop_last):
            yield self._sample(ids)

    def _sample(self, ids: np.ndarray) -> BatchT:
        """The batch of checked pair ids: their ends and negatives from the stream in one buffer
        (`BatchEnds`), then the subclass's ``_batch``."""
        t0 = time.perf_counter()
        b, k = ids.size, self.num_negatives
        every = np.empty(b * (2 + k), dtype=np.int64)
        np.take(self.users, ids, out=every[:b], mode="clip")  # ids are checked: "clip" only skips a buffer
        np.take(self.items, ids, out=every[b:2 * b], mode="clip")
        self._negative_rule.draw(self._rng, every[:b], k, out=every[2 * b:].reshape(b, k))
        batch = self._batch(ids, BatchEnds(torch.from_numpy(every), b, k))
        self.sampled_edges += batch.num_sampled_edges
        self.sample_seconds += time.perf_counter() - t0
        return batch

    @abstractmethod
    def _batch(self, ids: np.ndarray, ends: BatchEnds) -> BatchT:
        """The batch record of pairs ``ids`` (int64 [B]) with their sources, destinations and negatives
        ``ends``: its seeds, their blocks, the index tensors."""

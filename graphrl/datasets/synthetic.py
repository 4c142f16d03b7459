"""Seeded synthetic graphs for benchmarks and for running without the real data.

Both generators draw power-law ranks from the continuous density ``p(x) ~ x^-a`` on ``[1, n + 1)``,
floored (a truncated Zipf law of exponent ``a``): rank ``k`` (0-based) has probability
``(F(k + 2) - F(k + 1)) / (F(n + 1) - F(1))`` with ``F(x) = x^(1-a) / (1-a)`` (``ln x`` for ``a = 1``),
see `powerlaw_rank_probabilities`. Ranks are mapped to ids through a seeded random permutation, so the
hubs are scattered over the id range rather than sitting at ids 0, 1, 2, ... A Zipf exponent ``a``
gives counts (degrees) whose own distribution has tail ``P(d) ~ d^-(1 + 1/a)``: ``a = 0.8`` gives
2.25, in the range of real social and citation graphs.
"""

from __future__ import annotations

import operator
import warnings

import numpy as np
import torch

from graphrl.datasets.base import InteractionDataset
from graphrl.graph import CSCGraph

__all__ = ["synthetic_graph", "synthetic_bipartite", "synthetic_communities", "powerlaw_rank_probabilities"]

DEFAULT_EXPONENT = 0.8


_INT64_MAX = 2**63 - 1  # node ids, edge counts and pair keys are int64


def _count(name: str, value, minimum: int = 0, maximum: int | None = _INT64_MAX) -> int:
    try:
        if isinstance(value, bool | np.bool_):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    if maximum is not None and n > maximum:
        raise ValueError(f"{name} must be <= {maximum} (2**63 - 1: ids and counts are int64), got {n}")
    return n


def _real(name: str, value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}") from None


def _check_exponent(exponent, name: str = "exponent") -> float:
    a = _real(name, exponent)
    if not np.isfinite(a) or a < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {exponent!r}")
    return a


def _antiderivative(x: np.ndarray | float, a: float):
    return np.log(x) if a == 1.0 else np.power(x, 1.0 - a) / (1.0 - a)


def powerlaw_rank_probabilities(n: int, exponent: float = DEFAULT_EXPONENT) -> np.ndarray:
    """Probability of each rank 0..n-1 under the generators' truncated power law.

    Parameters
    ----------
    n : int
        Number of ranks (nodes, items or users).
    exponent : float
        Zipf exponent ``a >= 0`` (0 gives the uniform law).

    Returns
    -------
    numpy.ndarray, float64, shape [n]
        Non-increasing, sums to 1. ``num_edges * p[0]`` is the expected in-degree of the largest hub
        of `synthetic_graph`.

    Raises
    ------
    ValueError, TypeError
        ``n`` is not a positive integer, or ``exponent`` is negative or not finite.
    """
    n = _count("n", n, 1)
    a = _check_exponent(exponent)
    edges = _antiderivative(np.arange(1, n + 2, dtype=np.float64), a)
    mass = np.diff(edges)
    return mass / mass.sum()


def _powerlaw_ranks(rng: np.random.Generator, n: int, size: int, a: float) -> np.ndarray:
    """``size`` ranks in [0, n) by inverse-CDF sampling of the truncated power law (vectorised)."""
    u = rng.random(size)
    if a == 1.0:
        x = np.power(float(n + 1), u)
    else:
        b = 1.0 - a
        x = np.power(u * (float(n + 1) ** b - 1.0) + 1.0, 1.0 / b)
    ranks = x.astype(np.int64)  # floor, x >= 1
    ranks -= 1
    np.clip(ranks, 0, n - 1, out=ranks)  # guards the u -> 1 rounding edge
    return ranks


def synthetic_graph(num_nodes: int, num_edges: int, in_degree: str = "uniform", seed: int = 0,
                    exponent: float = DEFAULT_EXPONENT) -> CSCGraph:
    """A random directed graph for sampler benchmarks, uniform or with power-law in-degrees.

    Sources are uniform over all nodes. Destinations are uniform (``in_degree="uniform"``, an
    Erdos-Renyi-like multigraph) or drawn from the truncated Zipf law of ``exponent`` over a random
    permutation of the nodes (``"powerlaw"``). Parallel edges and self-loops are kept, as a sampler
    must handle them. With the defaults, 1M nodes / 20M edges give hubs with about 2 x 10^5
    in-edges (``num_edges * powerlaw_rank_probabilities(num_nodes)[0]``; seed 0: 200,271), 25 nodes
    above 2 x 10^4, and a median in-degree of 8.

    Parameters
    ----------
    num_nodes : int
        N >= 1.
    num_edges : int
        E >= 0.
    in_degree : {"uniform", "powerlaw"}
        Distribution of destinations.
    seed : int
        Seed of `numpy.random.default_rng`; the same seed gives the same graph.
    exponent : float
        Zipf exponent of the destinations for ``"powerlaw"`` (>= 0; 0.8 by default, 1.0 is Zipf's law).

    Returns
    -------
    CSCGraph
        N nodes, E edges, edge ``i`` = ``src[i] -> dst[i]`` in draw order, int32 indices.

    Raises
    ------
    ValueError
        A negative count, ``num_nodes = 0``, an unknown ``in_degree``, or a bad ``exponent``.
    TypeError
        A count or ``seed`` that is not an integer.

    References
    ----------
    Zipf-distributed in-degrees as in the power-law synthetic graphs of sampler benchmarks
    (e.g. gSampler, SOSP 2023); Clauset, Shalizi and Newman, "Power-law distributions in empirical
    data", SIAM Review 2009 (continuous approximation of the discrete law).

    Examples
    --------
    >>> g = synthetic_graph(1_000_000, 20_000_000, "powerlaw", seed=0)   # ~2 s  # doctest: +SKIP
    >>> int(g.in_degrees().max())                                          # doctest: +SKIP
    200271
    """
    num_nodes = _count("num_nodes", num_nodes, 1)
    num_edges = _count("num_edges", num_edges, 0)
    seed = _count("seed", seed, 0, maximum=None)
    a = _check_exponent(exponent)
    if in_degree not in ("uniform", "powerlaw"):
        raise ValueError(f"in_degree must be 'uniform' or 'powerlaw', got {in_degree!r}")
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges, dtype=np.int64)
    if in_degree == "uniform":
        dst = rng.integers(0, num_nodes, num_edges, dtype=np.int64)
    else:
        ranks = _powerlaw_ranks(rng, num_nodes, num_edges, a)
        perm = rng.permutation(num_nodes)
        dst = perm[ranks]
        del ranks
    return CSCGraph.from_edges(src, dst, num_nodes)


def _draw_new_pairs(rng, taken: np.ndarray, need: int, draw, num_items: int) -> np.ndarray:
    """Keys ``user * num_items + item`` of up to ``need`` new distinct pairs not in sorted ``taken``."""
    users, items = draw(rng)
    keys = users * num_items + items
    pos = np.searchsorted(taken, keys)
    pos[pos == taken.size] = 0
    fresh = keys[taken[pos] != keys] if taken.size else keys
    order = np.argsort(fresh, kind="stable")
    sorted_keys = fresh[order]
    is_first = np.ones(sorted_keys.size, dtype=bool)
    is_first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    first = np.sort(order[is_first])  # keep draw order among the distinct new keys
    return fresh[first[:need]]


def synthetic_bipartite(num_users: int, num_items: int, num_interactions: int, seed: int = 0,
                        test_fraction: float = 0.2, exponent: float = DEFAULT_EXPONENT) -> InteractionDataset:
    """A user-item data set with power-law item popularity and user activity, split per user.

    Used by benchmarks and by the demo when the real data is missing. Every user first gets one item
    (drawn by popularity); the other ``num_interactions - num_users`` pairs draw the user by activity
    and the item by popularity (both truncated Zipf laws of ``exponent`` over permuted ids), rejecting
    pairs already present, until exactly ``num_interactions`` distinct pairs exist. Each user's
    ``n`` interactions are then split at random: ``floor(n * test_fraction)`` to test, the rest (at
    least one) to train, as in the per-user 80/20 splits of NGCF and LightGCN.

    Parameters
    ----------
    num_users, num_items : int
        U >= 1 and I >= 1.
    num_interactions : int
        M distinct (user, item) pairs, ``U <= M <= U * I / 2`` (the density cap keeps rejection cheap).
    seed : int
        Seed of `numpy.random.default_rng`; the same arguments give the same data.
    test_fraction : float
        Share of each user's interactions held out, in [0, 1).
    exponent : float
        Zipf exponent of both item popularity and user activity (>= 0; 0 = uniform).

    Returns
    -------
    InteractionDataset
        ``name="synthetic"``; train and test pairs int64, each sorted by (user, item), disjoint, no
        duplicates, every user with >= 1 training item; ``graph`` the bipartite training graph;
        ``extra`` holds ``seed``, ``exponent`` and ``test_fraction``.

    Raises
    ------
    ValueError
        Counts out of range (including ``num_interactions`` outside ``[U, U * I / 2]``),
        ``test_fraction`` outside [0, 1), or a bad ``exponent``.
    TypeError
        A count or ``seed`` that is not an integer.

    References
    ----------
    Power-law popularity and activity of implicit-feedback data (e.g. the Gowalla and Yelp2018
    statistics in He et al., "LightGCN", SIGIR 2020); per-user hold-out as in Wang et al., "NGCF",
    SIGIR 2019.

    Examples
    --------
    >>> ds = synthetic_bipartite(2000, 3000, 40_000, seed=1)
    >>> ds.num_train + ds.num_test
    40000
    """
    num_users = _count("num_users", num_users, 1)
    num_items = _count("num_items", num_items, 1)
    num_interactions = _count("num_interactions", num_interactions, 0)
    seed = _count("seed", seed, 0, maximum=None)
    a = _check_exponent(exponent)
    if num_users * num_items > _INT64_MAX:
        raise ValueError(f"num_users * num_items = {num_users * num_items} must be <= 2**63 - 1 (user-item "
                         "pairs are int64 keys)")
    if not (0.0 <= _real("test_fraction", test_fraction) < 1.0):
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    cap = num_users * num_items // 2
    if not num_users <= num_interactions <= max(cap, num_users):
        raise ValueError(f"num_interactions must be in [num_users={num_users}, num_users * num_items / 2="
                         f"{max(cap, num_users)}] (one item per user at least, density at most 1/2), "
                         f"got {num_interactions}")
    rng = np.random.default_rng(seed)
    user_of_rank = rng.permutation(num_users)
    item_of_rank = rng.permutation(num_items)

    first_items = item_of_rank[_powerlaw_ranks(rng, num_items, num_users, a)]
    taken = np.arange(num_users, dtype=np.int64) * num_items + first_items
    taken.sort()
    need = num_interactions - num_users
    accept = 1.0
    rounds = 0
    while need > 0:
        rounds += 1
        size = int(need / max(accept, 0.05) * 1.1) + 64
        if rounds <= 30:
            def draw(r, size=size):
                return (user_of_rank[_powerlaw_ranks(r, num_users, size, a)],
                        item_of_rank[_powerlaw_ranks(r, num_items, size, a)])
        else:  # saturated heavy users: finish with uniform pairs (acceptance >= 1/2 under the cap)
            def draw(r, size=size):
                return r.integers(0, num_users, size), r.integers(0, num_items, size)
        new = _draw_new_pairs(rng, taken, need, draw, num_items)
        accept = max(new.size / size, 1e-3)
        taken = np.sort(np.concatenate([taken, new]))  # new keys are distinct and not in taken
        need -= new.size
    if rounds > 30:
        warnings.warn("synthetic_bipartite: the power law saturated its heaviest users; some pairs were "
                      "drawn uniformly", RuntimeWarning, stacklevel=2)

    return _split_per_user(rng, taken, num_users, num_items, float(test_fraction), "synthetic",
                           {"seed": seed, "exponent": a, "test_fraction": float(test_fraction)})


def _split_per_user(rng, keys: np.ndarray, num_users: int, num_items: int, test_fraction: float, name: str,
                    extra: dict) -> InteractionDataset:
    """Split sorted distinct keys ``user * num_items + item`` per user at random: ``floor(n * f)`` to test."""
    users = keys // num_items
    items = keys % num_items
    # order each user's pairs by a random key, the first floor(n * f) are test
    key = rng.random(users.size)
    order = np.lexsort((key, users))
    users_o = users[order]
    counts = np.bincount(users, minlength=num_users)
    starts = np.zeros(num_users, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    rank_in_user = np.arange(users.size) - np.repeat(starts, counts)
    n_test = np.floor(counts * test_fraction).astype(np.int64)
    is_test = np.empty(users.size, dtype=bool)
    is_test[order] = rank_in_user < n_test[users_o]
    tr_u, tr_i = users[~is_test], items[~is_test]  # keys are sorted, so (user, item) order holds
    te_u, te_i = users[is_test], items[is_test]
    graph = CSCGraph.bipartite(tr_u, tr_i, num_users, num_items)
    return InteractionDataset(
        name=name,
        num_users=num_users,
        num_items=num_items,
        train_users=torch.from_numpy(np.ascontiguousarray(tr_u)),
        train_items=torch.from_numpy(np.ascontiguousarray(tr_i)),
        test_users=torch.from_numpy(np.ascontiguousarray(te_u)),
        test_items=torch.from_numpy(np.ascontiguousarray(te_i)),
        graph=graph,
        extra=extra,
    )


def _ranks_below(rng: np.random.Generator, n: np.ndarray, a: float) -> np.ndarray:
    """One rank in ``[0, n[j])`` per entry of ``n`` (int64 >= 1) under the truncated power law."""
    u = rng.random(n.size)
    top = n.astype(np.float64) + 1.0
    if a == 1.0:
        x = np.power(top, u)
    else:
        b = 1.0 - a
        x = np.power(u * (np.power(top, b) - 1.0) + 1.0, 1.0 / b)
    ranks = x.astype(np.int64) - 1
    np.clip(ranks, 0, n - 1, out=ranks)
    return ranks


def synthetic_communities(num_users: int, num_items: int, num_interactions: int, num_communities: int = 64,
                          affinity: float = 0.8, seed: int = 0, test_fraction: float = 0.2,
                          min_degree: int = 10, user_exponent: float = 0.3,
                          item_exponent: float = DEFAULT_EXPONENT) -> InteractionDataset:
    """A user-item data set with power-law degrees and planted communities, split per user.

    Users and items are dealt round-robin into ``num_communities`` communities over random
    permutations (sizes differ by at most one). User u's degree is ``min_degree`` plus its share of
    the other ``M - U * min_degree`` interactions under the truncated Zipf law of ``user_exponent``
    (over permuted ids); each item has a global popularity rank (a random permutation). Each of u's
    interactions picks, with probability ``affinity``, an item of u's community by the Zipf law of
    ``item_exponent`` over that community's items in popularity order, else an item of the whole
    catalogue by the same law; repeats are drawn again for the same user until every user has
    exactly its degree of distinct items (uniform items after 30 rounds, for a saturated user). The
    share of interactions inside the user's community is about ``affinity + (1 - affinity) / C``
    (a little less where repeats inside a small community are drawn again), against ``1 / C`` for
    random pairs. Each user's n interactions are then split at random:
    ``floor(n * test_fraction)`` to test (at least one when ``min_degree * test_fraction >= 1``).

    Parameters
    ----------
    num_users, num_items : int
        U >= 1 and I >= 1.
    num_interactions : int
        M distinct pairs, ``U * min_degree <= M``; no user may need more than ``I / 2`` items.
    num_communities : int
        C, in ``[1, min(U, I)]``.
    affinity : float
        Probability that an interaction stays in the user's community, in [0, 1].
    seed : int
        Seed of `numpy.random.default_rng`; the same arguments give the same data.
    test_fraction : float
        Share of each user's interactions held out, in [0, 1).
    min_degree : int
        Interactions of every user (>= 1).
    user_exponent, item_exponent : float
        Zipf exponents of user activity and item popularity (>= 0; 0 = uniform).

    Returns
    -------
    InteractionDataset
        ``name="synthetic-communities"``; train and test pairs int64, sorted by (user, item), disjoint,
        no duplicates; ``graph`` the bipartite training graph; ``extra`` holds the arguments and
        ``user_community`` (int64 [U]) and ``item_community`` (int64 [I]), torch tensors.

    Raises
    ------
    ValueError
        Counts out of range, ``affinity`` outside [0, 1], ``test_fraction`` outside [0, 1), a bad
        exponent, or a user whose degree would pass ``I / 2``.
    TypeError
        A count or ``seed`` that is not an integer; a fraction or exponent that is not a number.

    References
    ----------
    Planted-partition (stochastic block) models, Holland, Laskey and Leinhardt, Social Networks 1983;
    degree-corrected blocks, Karrer and Newman, Phys. Rev. E 2011; per-user hold-out as in NGCF.
    """
    num_users = _count("num_users", num_users, 1)
    num_items = _count("num_items", num_items, 1)
    num_interactions = _count("num_interactions", num_interactions, 0)
    num_communities = _count("num_communities", num_communities, 1)
    min_degree = _count("min_degree", min_degree, 1)
    seed = _count("seed", seed, 0, maximum=None)
    a_user = _check_exponent(user_exponent, "user_exponent")
    a_item = _check_exponent(item_exponent, "item_exponent")
    if num_users * num_items > _INT64_MAX:
        raise ValueError(f"num_users * num_items = {num_users * num_items} must be <= 2**63 - 1 (user-item "
                         "pairs are int64 keys)")
    if num_communities > min(num_users, num_items):
        raise ValueError(f"num_communities must be <= min(num_users, num_items) = "
                         f"{min(num_users, num_items)}, got {num_communities}")
    if not 0.0 <= _real("affinity", affinity) <= 1.0:
        raise ValueError(f"affinity must be in [0, 1], got {affinity!r}")
    if not 0.0 <= _real("test_fraction", test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    if num_interactions < num_users * min_degree:
        raise ValueError(f"num_interactions must be >= num_users * min_degree = {num_users * min_degree}, "
                         f"got {num_interactions}")
    rng = np.random.default_rng(seed)
    user_of_rank = rng.permutation(num_users)
    item_of_rank = rng.permutation(num_items)
    user_comm = rng.permutation(num_users) % num_communities
    item_comm = rng.permutation(num_items) % num_communities
    extra_pairs = num_interactions - num_users * min_degree
    degree = min_degree + np.bincount(user_of_rank[_powerlaw_ranks(rng, num_users, extra_pairs, a_user)],
                                      minlength=num_users)
    if degree.max() > num_items // 2:
        raise ValueError(f"a user would need {int(degree.max())} items, more than num_items / 2 = "
                         f"{num_items // 2}: lower num_interactions or user_exponent, or raise num_items")
    popularity = np.empty(num_items, dtype=np.int64)
    popularity[item_of_rank] = np.arange(num_items)
    by_community = np.lexsort((popularity, item_comm))  # each community's items, most popular first
    size = np.bincount(item_comm, minlength=num_communities)
    start = np.zeros(num_communities, dtype=np.int64)
    np.cumsum(size[:-1], out=start[1:])
    need, taken, rounds = degree.astype(np.int64), np.empty(0, dtype=np.int64), 0
    while need.any():
        rounds += 1
        users = np.repeat(np.arange(num_users, dtype=np.int64), need)
        if rounds <= 30:
            inside = rng.random(users.size) < float(affinity)
            items = np.empty(users.size, dtype=np.int64)
            c = user_comm[users[inside]]
            items[inside] = by_community[start[c] + _ranks_below(rng, size[c], a_item)]
            items[~inside] = item_of_rank[_powerlaw_ranks(rng, num_items, int((~inside).sum()), a_item)]
        else:  # saturated users: finish with uniform items (their degree is at most I / 2)
            items = rng.integers(0, num_items, users.size)
        keys = np.unique(users * num_items + items)
        if taken.size:
            keys = keys[~np.isin(keys, taken, assume_unique=True)]
        need -= np.bincount(keys // num_items, minlength=num_users)
        taken = np.sort(np.concatenate([taken, keys]))
    extra = {"seed": seed, "num_communities": num_communities, "affinity": float(affinity),
             "min_degree": min_degree, "user_exponent": a_user, "item_exponent": a_item,
             "test_fraction": float(test_fraction),
             "user_community": torch.from_numpy(user_comm.astype(np.int64)),
             "item_community": torch.from_numpy(item_comm.astype(np.int64))}
    return _split_per_user(rng, taken, num_users, num_items, float(test_fraction), "synthetic-communities",
                           extra)

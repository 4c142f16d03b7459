"""LinkSampler: negatives, epoch coverage, target-edge exclusion, seeding, argument checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.graph import CSCGraph
from samplers import LinkBatch, LinkSampler, NeighborSampler, bipartite_reverse_eids
from samplers.protocol import edges_by_id


def random_interactions(num_users: int, num_items: int, density: float, seed: int):
    """Distinct (user, item) pairs, every user with at least one item and at least one non-item."""
    rng = np.random.default_rng(seed)
    mask = rng.random((num_users, num_items)) < density
    mask[np.arange(num_users), rng.integers(0, num_items, num_users)] = True
    mask[np.arange(num_users), rng.integers(0, num_items, num_users)] = False
    users, items = np.nonzero(mask)
    perm = rng.permutation(users.size)
    return users[perm].astype(np.int64), items[perm].astype(np.int64)


def make(num_users=30, num_items=20, density=0.3, seed=0, fanouts=(-1,), **kwargs):
    users, items = random_interactions(num_users, num_items, density, seed)
    graph = CSCGraph.bipartite(users, items, num_users, num_items)
    m = users.size
    kwargs.setdefault("batch_size", 16)
    link = LinkSampler(NeighborSampler(graph, list(fanouts), seed=seed), users, items + num_users,
                       target_eids=torch.arange(m), reverse_eids=bipartite_reverse_eids(m), seed=seed,
                       **kwargs)
    return graph, users, items, link


def positives_of(users: np.ndarray, item_nodes: np.ndarray) -> set[tuple[int, int]]:
    return set(zip(users.tolist(), item_nodes.tolist(), strict=True))


def check_batch_contract(batch: LinkBatch) -> None:
    seeds = batch.seeds
    assert torch.equal(seeds[batch.user_index], batch.users)
    assert torch.equal(seeds[batch.pos_index], batch.pos_items)
    assert torch.equal(seeds[batch.neg_index], batch.neg_items)
    assert torch.equal(seeds, torch.unique(seeds))
    for t in (batch.users, batch.pos_items, batch.neg_items, batch.user_index, batch.neg_index):
        assert t.dtype == torch.int64


def test_bipartite_reverse_eids_matches_the_graph():
    users, items = random_interactions(7, 9, 0.4, 3)
    graph = CSCGraph.bipartite(users, items, 7, 9)
    rev = bipartite_reverse_eids(users.size)
    eids = graph.csc_edge_ids().numpy()
    dst = np.repeat(np.arange(graph.num_nodes), graph.in_degrees().numpy())
    src = graph.indices.numpy().astype(np.int64)
    endpoints = np.empty((graph.num_edges, 2), dtype=np.int64)
    endpoints[eids] = np.stack([src, dst], 1)
    assert np.array_equal(endpoints[rev.numpy()], endpoints[:, ::-1])
    assert bipartite_reverse_eids(0).numel() == 0
    with pytest.raises(ValueError, match="num_interactions"):
        bipartite_reverse_eids(-1)


@settings(max_examples=25, deadline=None)
@given(num_users=st.integers(1, 12), num_items=st.integers(2, 12), density=st.floats(0.0, 0.95),
       k=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_negatives_are_never_training_positives(num_users, num_items, density, k, seed):
    users, items, link = make(num_users, num_items, density, seed, num_negatives=k, batch_size=7)[1:]
    positives = positives_of(users, items + num_users)
    for batch in link:
        check_batch_contract(batch)
        assert batch.neg_items.shape == (batch.batch_size, k)
        assert ((batch.neg_items >= num_users) & (batch.neg_items < num_users + num_items)).all()
        for u, negs in zip(batch.users.tolist(), batch.neg_items.tolist(), strict=True):
            assert not any((u, n) in positives for n in negs)


def test_negatives_of_a_user_with_one_free_item_use_the_exact_fallback():
    # User 0 has every item but item 3: all its negatives must be item 3 (rejection alone would spin).
    num_items = 200
    users = np.concatenate([np.zeros(num_items - 1, np.int64), [1]])
    items = np.concatenate([np.setdiff1d(np.arange(num_items), [3]), [0]])
    graph = CSCGraph.bipartite(users, items, 2, num_items)
    link = LinkSampler(NeighborSampler(graph, [2], seed=0), users, items + 2, num_negatives=5, batch_size=64,
                       seed=0)
    negs = link.negatives(torch.zeros(50, dtype=torch.int64))
    assert (negs == 3 + 2).all()


def test_negatives_are_uniform_over_non_positives():
    graph, users, items, link = make(4, 10, 0.5, 1, num_negatives=1)
    u = int(users[0])
    allowed = sorted(set(range(4, 14)) - {int(i) + 4 for uu, i in zip(users, items, strict=True) if uu == u})
    draws = link.negatives(torch.full((20000,), u, dtype=torch.int64)).numpy().ravel()
    counts = np.bincount(draws - 4, minlength=10)[np.array(allowed) - 4]
    assert set(np.unique(draws).tolist()) == set(allowed)
    expected = draws.size / len(allowed)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 30  # df <= 9: p < 1e-3 would need chi2 > 27.9


def _skewed_interactions(num_users: int, num_items: int, seed: int, draws: int = 6000):
    """Distinct pairs with skewed item degrees (item j chosen with probability ~ 1 / (j + 1))."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, num_items + 1)
    pairs = {(int(u), int(i)) for u, i in zip(rng.integers(0, num_users, draws),
                                              rng.choice(num_items, draws, p=p / p.sum()), strict=True)}
    users, items = (np.array(x, dtype=np.int64) for x in zip(*sorted(pairs), strict=True))
    return users, items


def test_degree_negatives_follow_degree_to_the_075_and_skip_positives():
    from scipy.stats import chisquare

    num_users, num_items = 300, 40
    users, items = _skewed_interactions(num_users, num_items, 0)
    items[items == num_items - 1] = num_items - 2  # the last item gets in-degree 0: never drawn
    keep = np.unique(users * num_items + items, return_index=True)[1]
    users, items = users[keep], items[keep]
    graph = CSCGraph.bipartite(users, items, num_users, num_items)
    link = LinkSampler(NeighborSampler(graph, [2], seed=0), users, items + num_users, negative="degree",
                       num_negatives=4, seed=1)
    deg = graph.in_degrees().numpy()[num_users:].astype(np.float64)
    assert deg[-1] == 0 and deg.max() > 5 * deg[deg > 0].min()
    u = int(np.bincount(users).argmin())  # a user with few positives
    pos = set((items[users == u]).tolist())
    draws = link.negatives(torch.full((10000,), u, dtype=torch.int64)).numpy().ravel() - num_users
    counts = np.bincount(draws, minlength=num_items)
    allowed = np.array([i for i in range(num_items) if i not in pos and deg[i] > 0])
    assert counts.sum() == counts[allowed].sum()  # no positive, no item of degree 0
    expected = deg[allowed] ** 0.75 / (deg[allowed] ** 0.75).sum() * draws.size
    assert chisquare(counts[allowed], expected).pvalue > 1e-4
    # uniform negatives on the same graph are not degree-biased
    uniform = LinkSampler(NeighborSampler(graph, [2], seed=0), users, items + num_users, num_negatives=4,
                          seed=1)
    udraws = uniform.negatives(torch.full((10000,), u, dtype=torch.int64)).numpy().ravel() - num_users
    ucounts = np.bincount(udraws, minlength=num_items)[allowed]
    assert chisquare(ucounts, expected / expected.sum() * ucounts.sum()).pvalue < 1e-6


def test_degree_negatives_in_batches_with_exclusion():
    num_users, num_items = 60, 25
    users, items = _skewed_interactions(num_users, num_items, 3, draws=500)
    graph = CSCGraph.bipartite(users, items, num_users, num_items)
    m = users.size
    link = LinkSampler(NeighborSampler(graph, [3, 3], seed=0), users, items + num_users, negative="degree",
                       num_negatives=3, batch_size=50, exclude="reverse", target_eids=torch.arange(m),
                       reverse_eids=bipartite_reverse_eids(m), seed=2)
    positives = positives_of(users, items + num_users)
    for batch in link:
        check_batch_contract(batch)
        for u, negs in zip(batch.users.tolist(), batch.neg_items.tolist(), strict=True):
            assert not any((u, n) in positives for n in negs)
        targets = batch.pair_ids.numpy()
        assert not (set(targets.tolist()) | set((targets + m).tolist())) & all_block_eids(batch)


def test_degree_negatives_fallback_and_errors():
    # user 0 has every item but item 3 (degree 1 through user 1): its negatives are all item 3
    num_items = 100
    users = np.concatenate([np.zeros(num_items - 1, np.int64), [1]])
    items = np.concatenate([np.setdiff1d(np.arange(num_items), [3]), [3]])
    graph = CSCGraph.bipartite(users, items, 2, num_items)
    link = LinkSampler(NeighborSampler(graph, [2], seed=0), users, items + 2, negative="degree", seed=0)
    assert (link.negatives(torch.zeros(40, dtype=torch.int64)) == 3 + 2).all()
    with pytest.raises(ValueError, match="negative must be one of"):
        LinkSampler(NeighborSampler(graph, [2], seed=0), users, items + 2, negative="popular")
    # user 0 holds every item of positive degree (item 3 now has degree 0): no degree-biased negative
    users, items = users[:-1], items[:-1]
    graph = CSCGraph.bipartite(users, items, 2, num_items)
    with pytest.raises(ValueError, match="every item of positive in-degree"):
        LinkSampler(NeighborSampler(graph, [2], seed=0), users, items + 2, negative="degree")
    LinkSampler(NeighborSampler(graph, [2], seed=0), users, items + 2)  # uniform: item 3 is a negative


def test_every_interaction_once_per_epoch():
    _, users, items, link = make(25, 15, 0.4, 2, batch_size=13)
    m = users.size
    for _ in range(2):  # two epochs, two different orders
        batches = list(link)
        assert len(batches) == len(link) == -(-m // 13)
        ids = torch.cat([b.pair_ids for b in batches]).numpy()
        assert np.array_equal(np.sort(ids), np.arange(m))
        got = sorted(zip(torch.cat([b.users for b in batches]).tolist(),
                         torch.cat([b.pos_items for b in batches]).tolist(), strict=True))
        assert got == sorted(positives_of(users, items + 25))
    link.drop_last = True
    assert len(link) == m // 13
    assert sum(b.batch_size for b in link) == (m // 13) * 13


def test_no_shuffle_keeps_input_order():
    _, users, items, link = make(10, 10, 0.3, 4, batch_size=5, shuffle=False)
    ids = torch.cat([b.pair_ids for b in link])
    assert torch.equal(ids, torch.arange(users.size))


def all_block_eids(batch: LinkBatch) -> set[int]:
    return set(torch.cat([b.edge_ids for b in batch.blocks]).tolist())


@pytest.mark.parametrize("fanouts", [(-1,), (-1, -1), (2, 3)])
def test_excluded_targets_and_reverses_never_in_blocks(fanouts):
    graph, users, items, _ = make(12, 10, 0.4, 5)
    m = users.size
    rev = bipartite_reverse_eids(m)

    def sampler(exclude):
        return LinkSampler(NeighborSampler(graph, list(fanouts), seed=1), users, items + 12, batch_size=6,
                           exclude=exclude, target_eids=torch.arange(m), reverse_eids=rev, seed=3)

    leaked = 0
    for batch in sampler(None):  # without exclusion the targets do show up: the test can fail
        targets = set(batch.pair_ids.tolist())
        leaked += len(targets & all_block_eids(batch))
    assert leaked > 0
    for batch in sampler("reverse"):
        targets = batch.pair_ids.numpy()
        forbidden = set(targets.tolist()) | set((targets + m).tolist())
        assert not forbidden & all_block_eids(batch)
        assert set(batch.excluded_eids.tolist()) == forbidden
    only_self = 0
    for batch in sampler("self"):
        targets = set(batch.pair_ids.tolist())
        assert not targets & all_block_eids(batch)
        only_self += len({t + m for t in targets} & all_block_eids(batch))
    if fanouts[-1] == -1:
        assert only_self > 0  # "self" keeps the reverse edges


def test_exclusion_on_gowalla(data_root):
    from graphrl.datasets import load_gowalla

    ds = load_gowalla(data_root)
    m = ds.num_train
    link = LinkSampler(NeighborSampler(ds.graph, [10, 10], seed=0), ds.train_users,
                       ds.train_items + ds.num_users, batch_size=1024, num_negatives=2, exclude="reverse",
                       target_eids=torch.arange(m), reverse_eids=bipartite_reverse_eids(m), seed=0)
    assert link.item_range == (ds.num_users, ds.num_nodes)
    it = iter(link)
    for _ in range(3):
        batch = next(it)
        check_batch_contract(batch)
        t = batch.pair_ids
        forbidden = torch.cat([t, t + m])
        for block in batch.blocks:
            assert not torch.isin(block.edge_ids, forbidden).any()
        assert not link.is_positive(batch.users.unsqueeze(1).expand(-1, 2), batch.neg_items).any()
        assert link.is_positive(batch.users, batch.pos_items).all()


def batch_signature(batch: LinkBatch):
    return [batch.users, batch.pos_items, batch.neg_items, batch.user_index, batch.neg_index,
            *[t for b in batch.blocks for t in (b.src_nodes, b.indptr, b.indices, b.edge_ids)]]


def test_same_seed_same_batches_other_seed_other_batches():
    users, items = random_interactions(20, 15, 0.4, 6)
    graph = CSCGraph.bipartite(users, items, 20, 15)
    m = users.size

    def run(seed):
        link = LinkSampler(NeighborSampler(graph, [3, 2], seed=6), users, items + 20, batch_size=16,
                           num_negatives=3, exclude="reverse", target_eids=torch.arange(m),
                           reverse_eids=bipartite_reverse_eids(m), seed=seed)
        return [batch_signature(b) for _ in range(2) for b in link]

    a, b, c = run(7), run(7), run(8)
    assert all(torch.equal(x, y) for ba, bb in zip(a, b, strict=True) for x, y in zip(ba, bb, strict=True))
    assert not all(torch.equal(x, y) for ba, bc in zip(a, c, strict=True) for x, y in zip(ba[:3], bc[:3],
                                                                                         strict=True))


def test_sample_given_pairs_and_stats():
    _, users, items, link = make(10, 12, 0.3, 8, num_negatives=2)
    batch = link.sample(torch.tensor([0, 2, 2]))
    assert batch.users.tolist() == users[[0, 2, 2]].tolist()
    assert batch.pos_items.tolist() == (items[[0, 2, 2]] + 10).tolist()
    assert batch.num_negatives == 2
    assert link.sampled_edges == batch.num_sampled_edges > 0
    assert link.sample_seconds > 0 and link.sampled_edges_per_second > 0
    with pytest.raises(ValueError, match="pair_ids"):
        link.sample(torch.tensor([users.size]))


def test_bad_arguments_name_the_argument():
    users, items = random_interactions(5, 6, 0.4, 9)
    graph = CSCGraph.bipartite(users, items, 5, 6)
    ns = NeighborSampler(graph, [2], seed=0)
    u, i = torch.from_numpy(users), torch.from_numpy(items + 5)
    m = users.size
    cases = [
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(num_negatives=0), ValueError, "num_negatives"),
        (dict(batch_size=2.5), TypeError, "batch_size"),
        (dict(exclude="both"), ValueError, "exclude"),
        (dict(exclude="self"), ValueError, "target_eids"),
        (dict(exclude="reverse", target_eids=torch.arange(m)), ValueError, "reverse_eids"),
        (dict(target_eids=torch.arange(m) + 1), ValueError, "target_eids"),
        (dict(target_eids=torch.arange(m - 1)), ValueError, "target_eids"),
        (dict(reverse_eids=torch.arange(3)), ValueError, "reverse_eids"),
        (dict(item_range=(0, 3)), ValueError, "items"),
        (dict(item_range=(5, 99)), ValueError, "item_range"),
        (dict(seed=-1), ValueError, "seed"),
    ]
    for kwargs, exc, name in cases:
        with pytest.raises(exc, match=name):
            LinkSampler(ns, u, i, **kwargs)
    with pytest.raises(TypeError, match="sampler"):
        LinkSampler(graph, u, i)
    with pytest.raises(TypeError, match="users"):
        LinkSampler(ns, u.float(), i)
    with pytest.raises(ValueError, match="same length"):
        LinkSampler(ns, u[:-1], i)
    with pytest.raises(ValueError, match="users"):
        LinkSampler(ns, torch.full_like(u, 99), i)
    # A user who has every item: no negative exists.
    full = CSCGraph.bipartite([0, 0, 1], [0, 1, 0], 2, 2)
    with pytest.raises(ValueError, match="all 2 items"):
        LinkSampler(NeighborSampler(full, [1]), [0, 0, 1], [2, 3, 2])
    # No node types: the item range must be given.
    plain = CSCGraph.from_edges([0, 1], [2, 2], 3)
    with pytest.raises(ValueError, match="item_range"):
        LinkSampler(NeighborSampler(plain, [1]), [0, 1], [2, 2])
    assert LinkSampler(NeighborSampler(plain, [1]), [0, 1], [2, 2], item_range=(1, 3)).num_pairs == 2
    numpy_range = LinkSampler(NeighborSampler(plain, [1]), [0, 1], [2, 2], item_range=(np.int64(1), 3))
    assert numpy_range.item_range == (1, 3)
    for rng in ((1, 2.9), (1.0, 3), (True, 3)):  # never truncated to a range the user did not give
        with pytest.raises(TypeError, match="item_range must be a pair of ints"):
            LinkSampler(NeighborSampler(plain, [1]), [0, 1], [2, 2], item_range=rng)
    # negatives() and is_positive() check their ids as the constructor does
    ls = LinkSampler(ns, u, i, seed=0)
    for bad in ([-1], [99]):
        with pytest.raises(ValueError, match=r"users: 1 of 1 ids outside \[0, 11\)"):
            ls.negatives(torch.tensor(bad))
    with pytest.raises(TypeError, match="users must be an integer tensor"):
        ls.negatives(torch.tensor([0.5]))
    fresh = LinkSampler(ns, u, i, seed=0)  # a refused call draws nothing: the streams agree
    assert torch.equal(ls.negatives(u[:4]), fresh.negatives(u[:4]))
    with pytest.raises(TypeError, match="items must be an integer tensor"):
        ls.is_positive(torch.tensor([0]), torch.tensor([5.7]))
    with pytest.raises(ValueError, match="same shape"):
        ls.is_positive(torch.tensor([0, 1]), torch.tensor([5]))
    pos = ls.is_positive(u.reshape(-1, 1), i.reshape(-1, 1))  # any shape, as documented
    assert pos.shape == (m, 1) and bool(pos.all())


def test_id_arrays_are_read_by_the_samplers_one_id_rule():
    """users / items / pair ids go through samplers._checks (as seeds do): a tensor whose values cannot be
    read, 2-D ids and uint64 ids past int64 are refused naming the argument and the value."""
    users, items = random_interactions(5, 6, 0.4, 9)
    graph = CSCGraph.bipartite(users, items, 5, 6)
    ns = NeighborSampler(graph, [2], seed=0)
    u, i = torch.from_numpy(users), torch.from_numpy(items + 5)
    with pytest.raises(ValueError, match=r"users is on device 'meta', which the sampler cannot read"):
        LinkSampler(ns, u.to("meta"), i)
    with pytest.raises(ValueError, match=r"items must be 1-D, got shape \(1, \d+\)"):
        LinkSampler(ns, u, i.reshape(1, -1))
    link = LinkSampler(ns, u, i, seed=0)
    with pytest.raises(ValueError, match=rf"pair_ids: 1 of 1 ids above 2\*\*63 - 1 .*first {2**64 - 1}"):
        link.sample(np.array([2**64 - 1], dtype=np.uint64))
    with pytest.raises(ValueError, match=rf"pair_ids: 1 of 2 ids outside \[0, {users.size}\) "
                                         rf"\(num_pairs={users.size}\), first {users.size}"):
        link.sample([0, users.size])


def test_bad_reverse_eids_are_named_with_the_bad_value():
    """reverse_eids is checked whole (samplers.link_pairs.reverse_vector, HeteroLinkSampler's rule): one id
    per edge, in range, each the edge reversed (the map need not be its own inverse: see the parallel-edge
    test below)."""
    users, items = random_interactions(6, 5, 0.4, 2)
    graph = CSCGraph.bipartite(users, items, 6, 5)
    ns = NeighborSampler(graph, [2], seed=0)
    m = users.size
    e = 2 * m
    rev = bipartite_reverse_eids(m)
    u, i = torch.from_numpy(users), torch.from_numpy(items + 6)

    def make(r):
        return LinkSampler(ns, u, i, exclude="reverse", target_eids=torch.arange(m), reverse_eids=r, seed=0)

    assert torch.equal(torch.from_numpy(make(rev)._reverse), rev)  # the graph's own map passes
    with pytest.raises(ValueError, match=rf"reverse_eids must have one entry per edge \(\[{e}\]\), got "
                                         rf"\[{e - 1}\]"):
        make(rev[:-1])
    out_of_range = rev.clone()
    out_of_range[3] = e + 4
    with pytest.raises(ValueError, match=rf"reverse_eids: 1 of {e} ids outside \[0, {e}\) \(num_edges={e}\), "
                                         rf"first {e + 4}"):
        make(out_of_range)
    not_swapped = rev.clone()
    not_swapped[0] = m + 1  # edge 0 is user 0 -> its item; edge m + 1 is pair 1 reversed
    a, b = int(users[0]), int(items[0]) + 6
    c, d = int(items[1]) + 6, int(users[1])
    with pytest.raises(ValueError, match=rf"reverse_eids: 1 of {e} edges have a reverse that is not the "
                                         rf"edge reversed, first edge 0 \({a}->{b}\): reverse_eids\[0\]="
                                         rf"{m + 1} is {c}->{d}, not {b}->{a}"):
        make(not_swapped)
    self_map = torch.arange(e)  # every edge its own reverse: no edge of a bipartite graph is
    with pytest.raises(ValueError, match=rf"reverse_eids: {e} of {e} edges have a reverse"):
        make(self_map)
    with pytest.raises(TypeError, match="reverse_eids must be an integer tensor, got dtype torch.float32"):
        make(rev.float())
    with pytest.raises(ValueError, match=r"reverse_eids must be 1-D"):
        make(rev.reshape(2, -1))
    # a parallel (duplicated) interaction: the copies may have a reverse each, or share one (DGL's rule)
    dup = CSCGraph.bipartite([0, 0], [0, 0], 1, 2)  # edges 0, 1: 0 -> 1; edges 2, 3: 1 -> 0
    for r in ([2, 3, 0, 1], [2, 2, 0, 1], [2, 2, 1, 0]):
        ok = LinkSampler(NeighborSampler(dup, [1]), [0, 0], [1, 1], reverse_eids=r)
        assert ok._reverse.tolist() == r
    with pytest.raises(ValueError, match=r"reverse_eids: 1 of 4 edges have a reverse that is not the edge "
                                         r"reversed, first edge 1 \(0->1\): reverse_eids\[1\]=0 is 0->1, "
                                         r"not 1->0"):
        LinkSampler(NeighborSampler(dup, [1]), [0, 0], [1, 1], reverse_eids=[2, 0, 0, 1])


@pytest.mark.parametrize("exclude", [None, "self", "reverse"])
def test_parallel_edges_sharing_one_reverse_as_dgls_reverse_id(exclude):
    """Two parallel 0 -> 1 edges share one 1 -> 0 reverse (a map DGL's exclude="reverse_id" accepts, not
    its own inverse): accepted with every exclude mode, and reverse exclusion removes each target and the
    reverse it maps to, by edge id: the other parallel copy stays a candidate (as a parallel edge of a
    target always does) and no edge between other nodes is removed."""
    graph = CSCGraph.from_edges(torch.tensor([0, 0, 1, 2, 3]), torch.tensor([1, 1, 0, 3, 2]), 4)
    src, dst = edges_by_id(graph)
    first = {}
    for e, (a, b) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
        first.setdefault((a, b), e)
    rev = [first[(b, a)] for a, b in zip(src.tolist(), dst.tolist(), strict=True)]
    copies = [e for e in range(5) if (src[e], dst[e]) == (0, 1)]
    back = first[(1, 0)]
    assert len(copies) == 2 and rev[copies[0]] == rev[copies[1]] == back and rev[back] == copies[0]
    link = LinkSampler(NeighborSampler(graph, [-1], seed=0), [0, 0], [1, 1], item_range=(0, 4),
                       batch_size=1, shuffle=False, exclude=exclude,
                       target_eids=None if exclude is None else copies, reverse_eids=rev, seed=0)
    for j, batch in enumerate(link):
        target, other = copies[j], copies[1 - j]
        seen = all_block_eids(batch)
        assert other in seen  # node 1 is a seed: with fanout -1 its other in-edge is always read
        if exclude is None:
            assert batch.excluded_eids is None and {target, back} <= seen
        elif exclude == "self":
            assert batch.excluded_eids.tolist() == [target] and target not in seen and back in seen
        else:
            assert batch.excluded_eids.tolist() == [target, back] and not {target, back} & seen


@pytest.mark.parametrize("exclude", [None, "self", "reverse"])
def test_batch_fields_are_the_pairs_their_unique_and_their_excluded_edges(exclude):
    """The one-buffer batch (samplers.link_pairs.BatchEnds) against a reference built by hand: the pairs'
    ends, seeds the unique of ends and negatives, exclusions the targets then their reverses."""
    graph, users, items, link = make(num_users=25, num_items=18, seed=4, exclude=exclude, num_negatives=3)
    rev = bipartite_reverse_eids(users.size).numpy()
    for batch in link:
        ids = batch.pair_ids.numpy()
        assert np.array_equal(batch.users.numpy(), users[ids])
        assert np.array_equal(batch.pos_items.numpy(), items[ids] + 25)
        every = torch.cat([batch.users, batch.pos_items, batch.neg_items.reshape(-1)])
        assert torch.equal(batch.seeds, torch.unique(every))
        if exclude is None:
            assert batch.excluded_eids is None
        else:
            want = ids if exclude == "self" else np.concatenate([ids, rev[ids]])
            assert np.array_equal(batch.excluded_eids.numpy(), want)
        check_batch_contract(batch)

"""HeteroLinkSampler and LinkLoader over it (LastFM users and artists: real data): seed edges of one
relation, negatives of the destination type by the plain LinkSampler's rule and stream (equal to a
LinkSampler over the same pairs as a bipartite graph), never a positive, uniform by chi-square; the seed
edges (and their reverses) absent from the typed blocks, exactly; batches equal to calling the typed sampler
itself (HeteroNeighborSampler and typed LaborSampler), through the loader with features per node type too;
bad input named by argument and value."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
import torch
from _typed_blocks import same_blocks
from scipy.stats import chisquare

from graphrl.graph import CSCGraph
from samplers import (
    HeteroLinkBatch,
    HeteroLinkSampler,
    HeteroNeighborSampler,
    LaborSampler,
    LinkLoader,
    LinkSampler,
    LoadedHeteroLinkBatch,
    NeighborSampler,
)
from samplers.hetero_graph import HeteroGraph, lastfm_hetero_graph
from samplers.protocol import edges_by_id

LISTENS, HEARD = ("user", "listens", "artist"), ("artist", "heard_by", "user")
FRIENDS = ("user", "friends", "user")
FANOUTS = {LISTENS: [4, 3], HEARD: [3, 2], FRIENDS: [2, 2]}


@pytest.fixture(scope="module")
def lastfm(data_root):
    """LastFM as a HeteroGraph, its training pairs (listens edge i is pair i) and synthetic features per
    node type (the data has none)."""
    from graphrl.datasets import load_lastfm

    ds = load_lastfm(data_root)
    graph = lastfm_hetero_graph(ds)
    users = np.asarray(ds.train_users, dtype=np.int64)
    items = np.asarray(ds.train_items, dtype=np.int64)
    gen = torch.Generator().manual_seed(0)
    x = {"user": torch.randn(graph.num_nodes["user"], 5, generator=gen),
         "artist": torch.randn(graph.num_nodes["artist"], 3, generator=gen)}
    return graph, users, items, x


def typed_link(graph: HeteroGraph, users, items, sampler=None, **kw) -> HeteroLinkSampler:
    kw.setdefault("batch_size", 512)
    kw.setdefault("seed", 1)
    sampler = sampler if sampler is not None else HeteroNeighborSampler(graph, FANOUTS, seed=2)
    return HeteroLinkSampler(sampler, LISTENS, users, items, **kw)


def check_contract(batch: HeteroLinkBatch) -> None:
    s, d = batch.src_type, batch.dst_type
    seeds = batch.seeds
    assert torch.equal(seeds[s][batch.user_index], batch.users)
    assert torch.equal(seeds[d][batch.pos_index], batch.pos_items)
    assert torch.equal(seeds[d][batch.neg_index], batch.neg_items)
    for t in seeds:
        assert torch.equal(seeds[t], torch.unique(seeds[t]))
    assert batch.neg_items.shape == (batch.batch_size, batch.num_negatives)


# ------------------------------------------------------------------------------------------- negatives
@pytest.mark.parametrize("negative", ["uniform", "degree"])
def test_negatives_are_the_plain_rule_over_the_destination_type(lastfm, negative):
    """Same pairs, seed and batch size: the typed sampler's order and negatives are a LinkSampler's over the
    bipartite graph of the same interactions (artists offset by the user count); all in range, none a
    positive."""
    graph, users, items, _ = lastfm
    nu, na = graph.num_nodes["user"], graph.num_nodes["artist"]
    typed = typed_link(graph, users, items, num_negatives=3, negative=negative, seed=7)
    bip = CSCGraph.bipartite(users, items, nu, na)
    plain = LinkSampler(NeighborSampler(bip, [1], seed=0), users, items + nu, batch_size=512, num_negatives=3,
                        negative=negative, seed=7)
    positive = set((users * na + items).tolist())
    for a, b in itertools.islice(zip(typed, plain, strict=True), 4):
        assert torch.equal(a.pair_ids, b.pair_ids) and torch.equal(a.users, b.users)
        assert torch.equal(a.neg_items, b.neg_items - nu)
        neg = a.neg_items.numpy()
        assert neg.min() >= 0 and neg.max() < na
        keys = (a.users.numpy()[:, None] * na + neg).ravel()
        assert not positive.intersection(keys.tolist())
        assert not typed.is_positive(a.users[:, None].expand_as(a.neg_items), a.neg_items).any()
        check_contract(a)
    assert typed.is_positive(users[:20], items[:20]).all()


def test_negatives_are_uniform_over_the_destination_type(lastfm):
    graph, users, items, _ = lastfm
    na = graph.num_nodes["artist"]
    link = typed_link(graph, users, items, num_negatives=4, seed=3)
    u = int(np.bincount(users, minlength=graph.num_nodes["user"]).argmax())  # the user with most positives
    pos = np.unique(items[users == u])
    draws = link.negatives(torch.full((50_000,), u, dtype=torch.int64)).numpy().ravel()
    counts = np.bincount(draws, minlength=na)
    assert counts[pos].sum() == 0 and draws.min() >= 0 and draws.max() < na
    allowed = np.setdiff1d(np.arange(na), pos)
    assert chisquare(counts[allowed]).pvalue > 1e-4  # uniform over the allowed artists
    # the test can fail: degree-biased negatives of the same user are not uniform
    biased = typed_link(graph, users, items, num_negatives=4, negative="degree", seed=3)
    bdraws = biased.negatives(torch.full((50_000,), u, dtype=torch.int64)).numpy().ravel()
    assert chisquare(np.bincount(bdraws, minlength=na)[allowed]).pvalue < 1e-6


# ------------------------------------------------------------------------------------------- exclusion
def in_edges(graph: HeteroGraph, rel, dst: torch.Tensor) -> set[int]:
    """Edge ids of every in-edge of the nodes ``dst`` in ``rel``."""
    ptr, eids = graph.indptr[rel].numpy(), graph.edge_ids[rel].numpy()
    return {int(e) for v in dst.tolist() for e in eids[ptr[v]:ptr[v + 1]]}


def test_edges_by_id_of_a_relation_are_its_pairs(lastfm):
    """The endpoints the target and reverse checks read (protocol.edges_by_id of a relation): listens edge i
    is training pair i, heard_by edge i its reverse, by lastfm_hetero_graph's construction."""
    graph, users, items, _ = lastfm
    s, d = edges_by_id(graph, LISTENS)
    assert np.array_equal(s, users) and np.array_equal(d, items)
    s, d = edges_by_id(graph, HEARD)
    assert np.array_equal(s, items) and np.array_equal(d, users)
    with pytest.raises(ValueError, match="per relation; give relation="):
        edges_by_id(graph)


@pytest.mark.parametrize("exclude", ["self", "reverse"])
def test_excluded_seed_edges_are_absent_from_every_block_and_nothing_else_is(lastfm, exclude):
    graph, users, items, _ = lastfm
    m = users.size
    fanouts = {LISTENS: [-1, -1], HEARD: [-1, -1], FRIENDS: [1, 1]}  # every in-edge of the typed relations
    kw = dict(batch_size=256, num_negatives=2, target_eids=torch.arange(m), seed=5)
    if exclude == "reverse":
        kw["reverse_edge_type"] = HEARD
    sampler = HeteroNeighborSampler(graph, fanouts, seed=0)
    link = typed_link(graph, users, items, sampler, exclude=exclude, **kw)
    for batch in itertools.islice(link, 3):
        check_contract(batch)
        targets = set(batch.pair_ids.tolist())  # listens edge i is pair i, heard_by edge i its reverse
        assert set(batch.excluded_eids) == ({LISTENS, HEARD} if exclude == "reverse" else {LISTENS})
        assert set(batch.excluded_eids[LISTENS].tolist()) == targets
        for block in batch.blocks:
            assert not targets & set(block.edge_ids[LISTENS].tolist())
            if exclude == "reverse":
                assert not targets & set(block.edge_ids[HEARD].tolist())
        last = batch.blocks[-1]  # the seeds' layer, fanout -1: every in-edge but the excluded ones
        listens = in_edges(graph, LISTENS, last.dst_nodes["artist"])
        assert set(last.edge_ids[LISTENS].tolist()) == listens - targets
        heard = in_edges(graph, HEARD, last.dst_nodes["user"])
        assert targets & heard  # the reverses are candidates of the seed users
        want = heard - targets if exclude == "reverse" else heard
        assert set(last.edge_ids[HEARD].tolist()) == want


# ------------------------------------------------------------------------------------------- batches
@pytest.mark.parametrize("kind", ["neighbor", "labor"])
def test_batches_equal_calling_the_typed_sampler_directly(lastfm, kind):
    graph, users, items, _ = lastfm

    def sampler():
        if kind == "labor":
            return LaborSampler(graph, FANOUTS, seed=4, importance_sampling=1)
        return HeteroNeighborSampler(graph, FANOUTS, seed=4)

    link = typed_link(graph, users, items, sampler(), num_negatives=2, exclude="reverse",
                      target_eids=torch.arange(users.size), reverse_edge_type=HEARD, seed=6)
    twin = sampler()  # called with the batch's seeds in the link sampler's order: the same per-call keys
    for batch in itertools.islice(link, 3):
        check_contract(batch)
        assert set(batch.seeds) == {"user", "artist"}
        same_blocks(batch.blocks, twin.sample(batch.seeds, exclude_eids=batch.excluded_eids))
    assert link.sampled_edges > 0 and link.sample_seconds > 0


@pytest.mark.parametrize("exclude", ["self", "reverse"])
def test_one_node_type_merges_sources_and_destinations(lastfm, exclude):
    """user -friends-> user: one seed set (as PyG's edge_sample), the unique of sources, positives and
    negatives; negatives among users, not friends; with "reverse" (friends is its own reverse relation) the
    targets then their reverses excluded in one tensor."""
    graph, _, _, _ = lastfm
    src, dst = edges_by_id(graph, FRIENDS)
    key = src * graph.num_nodes["user"] + dst
    order = np.argsort(key)
    rev = order[np.searchsorted(key[order], dst * graph.num_nodes["user"] + src)]  # friendship is mutual
    assert np.array_equal(src[rev], dst) and np.array_equal(dst[rev], src)
    extra = dict(reverse_edge_type=FRIENDS, reverse_eids=rev) if exclude == "reverse" else {}
    link = HeteroLinkSampler(HeteroNeighborSampler(graph, FANOUTS, seed=0), FRIENDS, src, dst, batch_size=300,
                             num_negatives=2, exclude=exclude, target_eids=np.arange(src.size), seed=0,
                             **extra)
    friends = set(key.tolist())
    twin = HeteroNeighborSampler(graph, FANOUTS, seed=0)
    for batch in itertools.islice(link, 2):
        check_contract(batch)
        assert set(batch.seeds) == {"user"} or batch.seeds["artist"].numel() == 0
        every = torch.cat([batch.users, batch.pos_items, batch.neg_items.reshape(-1)])
        assert torch.equal(batch.seeds["user"], torch.unique(every))
        assert torch.equal(batch.users, torch.from_numpy(src[batch.pair_ids.numpy()]))
        assert torch.equal(batch.pos_items, torch.from_numpy(dst[batch.pair_ids.numpy()]))
        t = batch.pair_ids.numpy()
        want = np.concatenate([t, rev[t]]) if exclude == "reverse" else t
        assert list(batch.excluded_eids) == [FRIENDS]
        assert np.array_equal(batch.excluded_eids[FRIENDS].numpy(), want)
        keys = (batch.users[:, None] * graph.num_nodes["user"] + batch.neg_items).reshape(-1).tolist()
        assert not friends.intersection(keys)
        want = twin.sample({"user": batch.seeds["user"]}, exclude_eids=batch.excluded_eids)
        same_blocks(batch.blocks, want)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_link_loader_gives_the_samplers_batches_with_features_per_type(lastfm, prefetch):
    graph, users, items, x = lastfm
    users, items = users[:8192], items[:8192]  # listens edges 0..8191: eight batches
    kw = dict(num_negatives=2, exclude="self", target_eids=np.arange(users.size), seed=8, batch_size=1024)
    loader = LinkLoader(typed_link(graph, users, items, HeteroNeighborSampler(graph, FANOUTS, seed=1), **kw),
                        features=x, prefetch=prefetch)
    twin = typed_link(graph, users, items, HeteroNeighborSampler(graph, FANOUTS, seed=1), **kw)
    assert loader.typed and len(loader) == len(twin) == 8
    n = 0
    for i, (got, want) in enumerate(zip(loader, twin, strict=True)):
        assert isinstance(got, LoadedHeteroLinkBatch) and got.index == i
        for name in ("users", "pos_items", "neg_items", "user_index", "pos_index", "neg_index", "pair_ids"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        same_blocks(got.blocks, want.blocks)
        assert got.input_nodes is got.blocks[0].src_nodes and set(got.input_features) == set(x)
        for t, table in x.items():
            assert torch.equal(got.input_features[t], table[got.input_nodes[t]])
        n += 1
    assert n == len(loader) and loader.sampled_edges == twin.sampled_edges
    copy = pickle.loads(pickle.dumps(loader))  # the next epoch: the same batches
    for a, b in itertools.islice(zip(copy, loader, strict=True), 2):
        assert torch.equal(a.neg_items, b.neg_items)
        assert all(torch.equal(a.input_features[t], b.input_features[t]) for t in x)
    copy.close()
    loader.close()
    with pytest.raises(ValueError, match="closed"):
        iter(loader)


# ------------------------------------------------------------------------------------------- bad input
def test_bad_inputs_raise_naming_the_argument_and_value(lastfm):
    graph, users, items, x = lastfm
    nu, na = graph.num_nodes["user"], graph.num_nodes["artist"]
    m = users.size
    hs = HeteroNeighborSampler(graph, [1], seed=0)
    u, i = torch.from_numpy(users), torch.from_numpy(items)

    def make(**kw):
        args = dict(sampler=hs, edge_type=LISTENS, src=u, dst=i)
        args.update(kw)
        return HeteroLinkSampler(args.pop("sampler"), args.pop("edge_type"), args.pop("src"), args.pop("dst"),
                                 **args)

    bad_src = u.clone()
    bad_src[3] = nu
    shifted = np.roll(np.arange(m), 1)
    cases = [
        (dict(edge_type=("user", "likes", "artist")), ValueError, r"edge_type: unknown relation \('user', "
                                                                  r"'likes', 'artist'\)"),
        (dict(src=bad_src), ValueError,
         rf"src: 1 of {m} ids outside \[0, {nu}\) \(num_nodes\['user'\]={nu}\), first {nu}"),
        (dict(dst=i + na), ValueError, rf"dst: {m} of {m} ids outside \[0, {na}\) \(num_nodes\['artist'\]"),
        (dict(dst=i.float()), TypeError, "dst must be an integer tensor, got dtype torch.float32"),
        (dict(dst=i[:-1]), ValueError, rf"src and dst must have the same length, got {m} and {m - 1}"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(num_negatives=0), ValueError, "num_negatives"),
        (dict(negative="popular"), ValueError, "negative must be one of"),
        (dict(exclude="both"), ValueError, "exclude must be one of"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(exclude="self"), ValueError, r"exclude='self' needs target_eids"),
        (dict(exclude="reverse", target_eids=np.arange(m)), ValueError, "exclude='reverse' needs "
                                                                         "reverse_edge_type"),
        (dict(target_eids=np.arange(m - 1)), ValueError,
         rf"target_eids must have one edge id per pair \(\[{m}\]\)"),
        (dict(target_eids=np.arange(m) + 1), ValueError, r"target_eids: .* outside \[0, "),
        (dict(target_eids=shifted), ValueError,
         r"target_eids: \d+ of \d+ edge ids are not their pair's edge"),
        (dict(reverse_edge_type=FRIENDS), ValueError, r"reverse_edge_type \('user', 'friends', 'user'\) must "
                                                      r"run from 'artist' to 'user'"),
        (dict(reverse_eids=np.arange(m)), ValueError, "reverse_eids given without reverse_edge_type"),
        (dict(reverse_edge_type=HEARD, target_eids=np.arange(m), reverse_eids=shifted), ValueError,
         rf"reverse_eids: {m} of {m} edges of \('user', 'listens', 'artist'\) have a reverse that is not the "
         rf"edge reversed, first edge 0 \({users[0]}->{items[0]}\): reverse_eids\[0\]={m - 1} is "
         rf"{items[-1]}->{users[-1]}, not {items[0]}->{users[0]}"),
        (dict(reverse_edge_type=HEARD, reverse_eids=shifted), ValueError,  # checked without targets too
         r"reverse_eids: \d+ of \d+ edges of .* have a reverse that is not the edge reversed"),
        (dict(reverse_edge_type=HEARD, reverse_eids=np.arange(m) + 1), ValueError,
         rf"reverse_eids: 1 of {m} ids outside \[0, {m}\) \(num_edges\(\('artist', 'heard_by', "
         rf"'user'\)\)={m}\), first {m}"),
        (dict(reverse_edge_type=HEARD, reverse_eids=np.arange(3)), ValueError,
         rf"reverse_eids must have one entry per edge of .* \(\[{m}\]\), got \[3\]"),
    ]
    for kwargs, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            make(**kwargs)
    with pytest.raises(TypeError, match=r"sampler must be a Sampler over a HeteroGraph: the "
                                        r"NeighborSampler's graph is a CSCGraph \(use LinkSampler"):
        make(sampler=NeighborSampler(CSCGraph.bipartite(users, items, nu, na), [1], seed=0))
    with pytest.raises(TypeError, match="sampler must be a Sampler over a CSCGraph"):
        LinkSampler(hs, u, i, item_range=(0, na))
    link = make()
    with pytest.raises(ValueError, match=rf"pair_ids: 1 of 2 ids outside \[0, {m}\)"):
        link.sample([0, m])
    with pytest.raises(ValueError, match=rf"src: 1 of 1 ids outside \[0, {nu}\)"):
        link.negatives([nu])
    # a source with every destination as a positive: no negative exists
    tiny = HeteroGraph.from_edges({"u": 2, "a": 2}, {("u", "r", "a"): ([0, 0, 1], [0, 1, 0])})
    with pytest.raises(ValueError, match=r"src: 'u' node 0 has all 2 'a' nodes .* as positives"):
        HeteroLinkSampler(HeteroNeighborSampler(tiny, [1]), ("u", "r", "a"), [0, 0, 1], [0, 1, 0])
    # a relation that is its own reverse: each edge's reverse is the edge reversed (LinkSampler's rule), and
    # parallel edges may share one, so a reverse's reverse need not be the edge (DGL's rule);
    # reverse_eids=None (the same ids) is checked as a given map is
    f = ("u", "f", "u")
    sym = HeteroGraph.from_edges({"u": 2}, {f: ([0, 1, 0], [1, 0, 1])})  # edge 2 parallels edge 0

    def own_reverse(r):
        return HeteroLinkSampler(HeteroNeighborSampler(sym, [1]), f, [0, 1, 0], [1, 0, 1],
                                 reverse_edge_type=f, reverse_eids=r)

    assert own_reverse([1, 0, 1])._reverse.tolist() == [1, 0, 1]  # edges 0 and 2 share reverse 1
    with pytest.raises(ValueError, match=r"reverse_eids \(None: the same edge ids\): 3 of 3 edges of "
                                         r"\('u', 'f', 'u'\) have a reverse that is not the edge reversed, "
                                         r"first edge 0 \(0->1\)"):
        own_reverse(None)
    with pytest.raises(ValueError, match=r"reverse_eids: 1 of 3 edges of .* first edge 2 \(0->1\): "
                                         r"reverse_eids\[2\]=2 is 0->1, not 1->0"):
        own_reverse([1, 0, 2])
    # the loader: features by node type, checked
    with pytest.raises(TypeError, match="features must be a dict node type"):
        LinkLoader(link, features=x["user"])
    with pytest.raises(ValueError, match=r"features: unknown node type 'item'"):
        LinkLoader(link, features={"item": x["user"]})
    with pytest.raises(ValueError, match=rf"features\['artist'\] has {nu} rows but the graph has {na} "
                                         rf"'artist'"):
        LinkLoader(link, features={"artist": x["user"]})
    with pytest.raises(TypeError, match="link_sampler must be a LinkSampler or a HeteroLinkSampler, got "
                                        "HeteroNeighborSampler"):
        LinkLoader(hs)


def test_a_source_can_be_its_own_negative_and_an_edge_outside_the_pairs_a_negative():
    """What PairNegatives.draw documents: negatives avoid only the given pairs, so on a relation whose ends
    are one node type a source is its own negative with probability 1 / (num_nodes - its positives) per
    uniform draw (PyG's negatives; DGL's GlobalUniform would exclude it), and an edge of the graph that is
    not among the pairs can be drawn; each source's draws are uniform over the rest (chi-square)."""
    f = ("u", "f", "u")
    graph = HeteroGraph.from_edges({"u": 5}, {f: ([0, 0, 1, 0], [1, 2, 3, 4])})  # edge 0 -> 4: not a pair
    link = HeteroLinkSampler(HeteroNeighborSampler(graph, [1], seed=0), f, [0, 0, 1], [1, 2, 3],
                             num_negatives=1, seed=0)
    draws = 6000
    neg = link.negatives(np.repeat([0, 1], draws)).reshape(2, draws).numpy()
    for row, allowed in ((neg[0], [0, 3, 4]), (neg[1], [0, 1, 2, 4])):
        counts = np.bincount(row, minlength=5)
        assert set(np.flatnonzero(counts).tolist()) == set(allowed)  # the source itself among them
        assert chisquare(counts[allowed]).pvalue > 1e-4

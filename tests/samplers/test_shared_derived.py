"""A CPU sampler's derived per-edge arrays (the gather's (source, edge id) pairs, the weighted rows'
prefix sums: `samplers._csc.DERIVED`) are built once per host: a `NeighborSampler`,
`HeteroNeighborSampler` or `LaborSampler` pickled by torch's multiprocessing pickler carries them (and its
weights) in shared memory and its copy attaches them, building nothing again and sampling the same blocks;
a bad state is refused; a partition owner's loops share one copy."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.multiprocessing.reductions  # noqa: F401  (registers the shared-memory reductions)

import samplers.kernels.cpu
import samplers.labor
import samplers.layers
from graphrl.graph import CSCGraph
from graphrl.partition import write_partitions
from samplers import HeteroNeighborSampler, LaborSampler, NeighborSampler
from samplers._csc import edge_pairs
from samplers.distributed.owner import PartitionOwner
from samplers.hetero_graph import HeteroGraph
from samplers.kernels.cpu import weight_prefix
from samplers.layers import PLAIN_RELATION

N, E = 90, 700
SEEDS = [torch.arange(0, 15), torch.tensor([4, 8, 8, 60]), torch.arange(20, 88, 3)]


def graph() -> CSCGraph:
    rng = np.random.default_rng(7)
    src, dst = (torch.from_numpy(rng.integers(0, N, E)) for _ in range(2))
    return CSCGraph.from_edges(src, dst, N)


def weights() -> torch.Tensor:
    w = torch.rand(E, generator=torch.Generator().manual_seed(1))
    w[::5] = 0  # zero weights are never drawn
    return w


@pytest.fixture
def builds(monkeypatch) -> dict:
    """Counts the derived arrays built in this process (pairs, prefix sums) from now on."""
    count = {"pairs": 0, "prefix": 0}

    def pairs(*args):
        count["pairs"] += 1
        return edge_pairs(*args)

    def prefix(*args):
        count["prefix"] += 1
        return weight_prefix(*args)

    monkeypatch.setattr(samplers.layers, "edge_pairs", pairs)
    monkeypatch.setattr(samplers.kernels.cpu, "weight_prefix", prefix)
    return count


def shared(arr: np.ndarray) -> bool:
    """Whether a numpy array is a view of a tensor in shared memory."""
    base = arr.base
    return isinstance(base, torch.Tensor) and base.is_shared() and base.data_ptr() == arr.ctypes.data


def same_blocks(a, b) -> bool:
    names = ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids")
    return len(a) == len(b) and all(torch.equal(getattr(x, n), getattr(y, n))
                                    for x, y in zip(a, b, strict=True) for n in names)


@pytest.mark.parametrize("weighted", [False, True])
def test_a_copy_attaches_the_shared_derived_arrays_and_samples_the_same_blocks(weighted, builds):
    kw = {"weights": weights()} if weighted else {}
    s = NeighborSampler(graph(), [5, 3], seed=3, **kw)
    ref = NeighborSampler(graph(), [5, 3], seed=3, **kw)  # never pickled: private arrays
    assert builds == {"pairs": 2, "prefix": 2 if weighted else 0}
    s.sample(SEEDS[0]), ref.sample(SEEDS[0])
    rel = s.loop.relations[PLAIN_RELATION]
    want = {name: getattr(rel, name).copy() for name in ("pairs", "prefix", "positive")
            if getattr(rel, name) is not None}
    assert set(want) == ({"pairs", "prefix", "positive"} if weighted else {"pairs"})
    buf = ForkingPickler.dumps(s)  # moves them into shared memory, once
    copy = pickle.loads(buf)
    again = pickle.loads(ForkingPickler.dumps(s))  # a second worker: the same memory, not another copy
    assert builds == {"pairs": 2, "prefix": 2 if weighted else 0}  # nothing built again
    for name, arr in want.items():
        mine, theirs, third = (getattr(x.loop.relations[PLAIN_RELATION], name) for x in (s, copy, again))
        assert all(shared(a) for a in (mine, theirs, third)), name
        assert theirs.base.data_ptr() == mine.ctypes.data == third.ctypes.data, name
        assert np.array_equal(theirs, arr) and theirs.dtype == arr.dtype, name
    for seeds in SEEDS:
        b = ref.sample(seeds)
        assert same_blocks(s.sample(seeds), b) and same_blocks(copy.sample(seeds), b)
        assert same_blocks(again.sample(seeds), b)


def test_a_state_whose_derived_arrays_do_not_fit_is_refused():
    s = NeighborSampler(graph(), [4], seed=1, weights=weights())
    for name, bad, match in [("pairs", lambda t: t[:-2], r"_shared\['pairs'\].*shape \(1400,\)"),
                             ("prefix", lambda t: t.float(), r"_shared\['prefix'\].*torch.float64"),
                             ("positive", lambda t: t[1:], r"_shared\['positive'\].*for 700 edges and 90")]:
        state = s.__getstate__()
        arrays = state["_shared"][PLAIN_RELATION]
        state["_shared"] = {PLAIN_RELATION: dict(arrays, **{name: bad(arrays[name])})}
        with pytest.raises(ValueError, match=match):
            NeighborSampler.__new__(NeighborSampler).__setstate__(state)
    state = s.__getstate__()
    state["_shared"][PLAIN_RELATION]["extra"] = state["_shared"][PLAIN_RELATION]["prefix"]
    with pytest.raises(ValueError, match="unknown derived array 'extra'"):
        NeighborSampler.__new__(NeighborSampler).__setstate__(state)
    state = s.__getstate__()
    state["_shared"][PLAIN_RELATION]["weights"] = state["_shared"][PLAIN_RELATION]["weights"][::2]
    with pytest.raises(ValueError, match=r"_shared\[.*\]\['weights'\]: expected a contiguous CPU tensor"):
        NeighborSampler.__new__(NeighborSampler).__setstate__(state)


def test_pairs_of_another_graph_are_refused():
    s = NeighborSampler(graph(), [4], seed=1)
    other = NeighborSampler(graph(), [4], seed=1)
    pairs = other.loop.relations[PLAIN_RELATION].pairs
    moved = np.roll(pairs.reshape(-1, 2), 1, axis=0).ravel()  # right shape and dtype, shifted by one edge
    want = int(s.graph.indices[0]), int(s.graph.edge_ids[0])
    assert tuple(moved[:2]) != want  # so position 0 alone differs from the graph
    state = s.__getstate__()
    state["_shared"] = {PLAIN_RELATION: {"pairs": torch.from_numpy(moved)}}
    with pytest.raises(ValueError, match=rf"_shared\['pairs'\]: position 0 holds .* where the graph has "
                                         rf"source {want[0]} and edge id {want[1]}: pairs of another graph"):
        NeighborSampler.__new__(NeighborSampler).__setstate__(state)
    state["_shared"] = {PLAIN_RELATION: {"pairs": torch.from_numpy(pairs.copy())}}  # the same graph's
    copy = NeighborSampler.__new__(NeighborSampler)
    copy.__setstate__(state)
    assert np.array_equal(copy.loop.relations[PLAIN_RELATION].pairs, pairs)
    bare = NeighborSampler(CSCGraph(s.graph.indptr, s.graph.indices), [4])  # no edge ids: no pairs taken
    assert bare.loop.relations[PLAIN_RELATION].pairs is None
    state = dict(bare.__getstate__(), _shared={PLAIN_RELATION: {"pairs": torch.from_numpy(pairs.copy())}})
    with pytest.raises(ValueError, match="has no edge ids, so it takes no pairs"):
        NeighborSampler.__new__(NeighborSampler).__setstate__(state)


def test_a_hetero_copy_attaches_each_relations_arrays(builds):
    rng = np.random.default_rng(2)
    u, a = rng.integers(0, 30, 200), rng.integers(0, 20, 200)
    f1, f2 = rng.integers(0, 30, 90), rng.integers(0, 30, 90)
    g = HeteroGraph.from_edges({"user": 30, "artist": 20},
                               {("user", "listens", "artist"): (u, a), ("artist", "heard_by", "user"): (a, u),
                                ("user", "friends", "user"): (f1, f2)},
                               weights={("user", "friends", "user"): torch.rand(90)})
    fanouts = {rel: [3, 2] for rel in g.relations}
    s, ref = (HeteroNeighborSampler(g, fanouts, seed=6, weights=True) for _ in range(2))
    built = dict(builds)
    assert built == {"pairs": 6, "prefix": 2}
    copy = pickle.loads(ForkingPickler.dumps(s))
    assert builds == built
    for rel in g.relations:
        mine, theirs = s._loop.relations[rel], copy._loop.relations[rel]
        assert shared(theirs.pairs) and theirs.pairs.ctypes.data == mine.pairs.ctypes.data
        assert (theirs.prefix is not None) == (rel == ("user", "friends", "user"))
    seeds = {"user": torch.tensor([0, 3, 7]), "artist": torch.tensor([1, 2])}
    for _ in range(2):
        want = ref.sample(seeds)
        for got in (s.sample(seeds), copy.sample(seeds)):
            assert repr(got) == repr(want)
            assert all(torch.equal(x.edge_ids[r], y.edge_ids[r]) for x, y in zip(got, want, strict=True)
                       for r in x.edge_ids)


def labor_graph(kind: str):
    if kind == "plain":
        return graph()
    rng = np.random.default_rng(3)
    u, a, f = rng.integers(0, 30, 200), rng.integers(0, 20, 200), rng.integers(0, 30, (2, 90))
    return HeteroGraph.from_edges({"user": 30, "artist": 20},
                                  {("user", "listens", "artist"): (u, a),
                                   ("artist", "heard_by", "user"): (a, u),
                                   ("user", "friends", "user"): (f[0], f[1])})


@pytest.mark.parametrize("kind,weighted", [("plain", False), ("plain", True), ("typed", True)])
def test_a_labor_copy_attaches_the_shared_pairs_and_weights(kind, weighted, builds, monkeypatch):
    g, ref_g = labor_graph(kind), labor_graph(kind)
    if not weighted:
        kw = {}
    elif kind == "plain":
        kw = {"weights": weights()}
    else:
        kw = {"weights": {rel: torch.rand(g.num_edges(rel), generator=torch.Generator().manual_seed(r))
                          for r, rel in enumerate(g.relations)}}
    seeds = SEEDS if kind == "plain" else [{"user": torch.tensor([0, 3, 7]), "artist": torch.tensor([1, 2])},
                                           {"user": torch.arange(30)}]
    s = LaborSampler(g, [4, 3], importance_sampling=1, seed=4, **kw)
    ref = LaborSampler(ref_g, [4, 3], importance_sampling=1, seed=4, **kw)  # never pickled
    rels = list(s.loop.relations)
    assert builds["pairs"] == 2 * len(rels)
    csc = {"weights": 0}

    def counted(*args, **kwargs):
        csc["weights"] += 1
        return samplers.labor.csc_weights(*args, **kwargs)

    monkeypatch.setattr(samplers.labor, "csc_weights", counted)
    s.sample(seeds[0]), ref.sample(seeds[0])
    want = {rel: (s.loop.relations[rel].pairs.copy(), s.loop.relations[rel].weights) for rel in rels}
    before = g.indptr.data_ptr() if kind == "plain" else None
    copy = pickle.loads(ForkingPickler.dumps(s))  # moves the pairs and weights into shared memory, once
    again = pickle.loads(ForkingPickler.dumps(s))
    assert builds["pairs"] == 2 * len(rels) and csc["weights"] == 0  # nothing built again
    if kind == "plain":
        assert g.indptr.data_ptr() != before  # the graph moved: the original must retake its views
        torch.empty(10 * (N + E), dtype=torch.int64).fill_(-7)  # likely reuses the freed blocks
    for rel, (pairs, w) in want.items():
        mine, theirs, third = (x.loop.relations[rel] for x in (s, copy, again))
        assert all(shared(x.pairs) for x in (mine, theirs, third)), rel
        assert theirs.pairs.ctypes.data == mine.pairs.ctypes.data == third.pairs.ctypes.data, rel
        assert np.array_equal(theirs.pairs, pairs), rel
        assert (w is None) == (not weighted)
        if weighted:
            assert shared(mine.weights) and theirs.weights.ctypes.data == mine.weights.ctypes.data
            assert np.array_equal(theirs.weights, w) and theirs.weights.dtype == np.float32
    assert copy.sampled_edges == s.sampled_edges > 0
    names = ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids", "edge_weights")
    for batch in seeds:
        want_blocks = ref.sample(batch)
        for got in (s.sample(batch), copy.sample(batch), again.sample(batch)):
            assert len(got) == len(want_blocks)
            for x, y in zip(got, want_blocks, strict=True):
                for n in names:
                    a, b = getattr(x, n), getattr(y, n)
                    if isinstance(a, dict):
                        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), n
                    else:
                        assert torch.equal(a, b), n


def test_a_labor_state_whose_pairs_do_not_fit_is_refused():
    s = LaborSampler(graph(), [4], seed=1)
    state = s.__getstate__()
    state["_shared"] = {PLAIN_RELATION: {"pairs": state["_shared"][PLAIN_RELATION]["pairs"][:-2]}}
    with pytest.raises(ValueError, match=r"_shared\['pairs'\].*shape \(1400,\)"):
        LaborSampler.__new__(LaborSampler).__setstate__(state)


def _child(rank: int, sampler: NeighborSampler, out: str) -> None:
    """In a spawned process: whether the sampler's derived arrays are shared, and its blocks."""
    rel = sampler.loop.relations[PLAIN_RELATION]
    torch.save({"shared": [shared(rel.pairs), shared(rel.prefix), shared(rel.positive)],
                "blocks": [[(b.src_nodes, b.indices, b.edge_ids) for b in sampler.sample(s)] for s in SEEDS]},
               out)


def test_a_process_made_by_mp_spawn_attaches_the_shared_arrays(tmp_path):
    s = NeighborSampler(graph(), [5, 3], seed=8, weights=weights())
    ref = NeighborSampler(graph(), [5, 3], seed=8, weights=weights())
    out = str(tmp_path / "child.pt")
    mp.spawn(_child, args=(s, out), nprocs=1, join=True)
    got = torch.load(out)
    assert got["shared"] == [True, True, True]
    assert shared(s.loop.relations[PLAIN_RELATION].pairs)  # the parent reads the one shared copy too
    for seeds, child in zip(SEEDS, got["blocks"], strict=True):
        want = ref.sample(seeds)
        assert all(torch.equal(x, y) for b, c in zip(want, child, strict=True)
                   for x, y in zip((b.src_nodes, b.indices, b.edge_ids), c, strict=True))


def test_a_partition_owners_loops_share_one_copy(tmp_path, builds):
    g = CSCGraph.from_edges(*(torch.from_numpy(np.random.default_rng(4).integers(0, N, E)) for _ in range(2)),
                            N, weights=weights())
    write_partitions(g, tmp_path / "parts", 2, method="ldg", seed=0)
    owner = PartitionOwner(str(tmp_path / "parts"), 0)
    rows = owner.partition.owned[:20].astype(np.int64)
    bounds, keys = np.array([0, 20]), np.array([12345], dtype=np.uint64)
    replies = {}
    for kind, weighted, replace in [("neighbor", False, False), ("neighbor", True, False),
                                    ("neighbor", True, True), ("labor", True, False)]:
        replies[kind, weighted, replace] = owner.sample_rows(rows, bounds, 4, replace, keys, weighted, kind)
    assert builds == {"pairs": 1, "prefix": 1}
    rels = [loop.relations[("node", "edge", "node")] for loop in owner._loops.values()]
    assert len(rels) == 4 and len({r.pairs.ctypes.data for r in rels}) == 1
    assert rels[1].prefix is rels[2].prefix is not None
    alone = PartitionOwner(str(tmp_path / "parts"), 0)  # a fresh owner per loop: nothing handed over
    for mode, (packed, w) in replies.items():
        alone._loops.clear(), alone._derived.clear()
        want, want_w = alone.sample_rows(rows, bounds, 4, mode[2], keys, mode[1], mode[0])
        assert np.array_equal(packed, want) and (w is None) == (want_w is None)
        assert w is None or np.array_equal(w, want_w)

"""A CPU sampler's derived per-edge arrays (the gather's (source, edge id) pairs, the weighted rows'
prefix sums: `samplers._csc.DERIVED`) are built once per host: a sampler pickled by torch's
multiprocessing pickler carries them in shared memory and its copy attaches them, building nothing
again and sampling the same blocks; a bad state is refused; a partition owner's loops share one copy."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.multiprocessing.reductions  # noqa: F401  (registers the shared-memory reductions)

import samplers.kernels.cpu
import samplers.layers
from graphrl.graph import CSCGraph
from graphrl.partition import write_partitions
from samplers import HeteroNeighborSampler, NeighborSampler
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
    for name, bad, match in [("pairs", lambda t: t[:-2], r"_derived\['pairs'\].*shape \(1400,\)"),
                             ("prefix", lambda t: t.float(), r"_derived\['prefix'\].*torch.float64"),
                             ("positive", lambda t: t[1:], r"_derived\['positive'\].*for 700 edges and 90")]:
        state = s.__getstate__()
        state["_derived"] = dict(state["_derived"], **{name: bad(state["_derived"][name])})
        with pytest.raises(ValueError, match=match):
            NeighborSampler.__new__(NeighborSampler).__setstate__(state)
    state = s.__getstate__()
    state["_derived"]["extra"] = state["_derived"]["prefix"]
    with pytest.raises(ValueError, match="unknown derived array 'extra'"):
        NeighborSampler.__new__(NeighborSampler).__setstate__(state)


def test_pairs_of_another_graph_are_refused():
    s = NeighborSampler(graph(), [4], seed=1)
    other = NeighborSampler(graph(), [4], seed=1)
    pairs = other.loop.relations[PLAIN_RELATION].pairs
    moved = np.roll(pairs.reshape(-1, 2), 1, axis=0).ravel()  # right shape and dtype, shifted by one edge
    want = int(s.graph.indices[0]), int(s.graph.edge_ids[0])
    assert tuple(moved[:2]) != want  # so position 0 alone differs from the graph
    state = s.__getstate__()
    state["_derived"] = {"pairs": torch.from_numpy(moved)}
    with pytest.raises(ValueError, match=rf"_derived\['pairs'\]: position 0 holds .* where the graph has "
                                         rf"source {want[0]} and edge id {want[1]}: pairs of another graph"):
        NeighborSampler.__new__(NeighborSampler).__setstate__(state)
    state["_derived"] = {"pairs": torch.from_numpy(pairs.copy())}  # the same graph's: attached
    copy = NeighborSampler.__new__(NeighborSampler)
    copy.__setstate__(state)
    assert np.array_equal(copy.loop.relations[PLAIN_RELATION].pairs, pairs)
    bare = NeighborSampler(CSCGraph(s.graph.indptr, s.graph.indices), [4])  # no edge ids: no pairs taken
    assert bare.loop.relations[PLAIN_RELATION].pairs is None
    state = dict(bare.__getstate__(), _derived={"pairs": torch.from_numpy(pairs.copy())})
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

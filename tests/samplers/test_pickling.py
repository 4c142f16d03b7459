"""Samplers pickle and sample in another process (issue 30): ``pickle``, ``torch.multiprocessing.spawn``
and a torch ``DataLoader`` with spawned workers.

A copy is the original with its state: its next batch is the original's next batch (DglSampler, whose
state is a per-graph cache, starts as a fresh DglSampler). Locks and caches are rebuilt in the copy,
and the original keeps working after torch's multiprocessing pickler moved the graph's tensors into
shared memory."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.multiprocessing.reductions  # noqa: F401  (registers the shared-memory reductions)

from graphrl.graph import CSCGraph
from samplers import (
    HeteroNeighborSampler,
    LinkSampler,
    NeighborLoader,
    NeighborSampler,
    bipartite_reverse_eids,
)
from samplers.hetero_graph import HeteroGraph

N, E = 80, 600
FANOUTS = [4, 3]


def edges(seed: int = 3):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, N, E)), torch.from_numpy(rng.integers(0, N, E))


def graph() -> CSCGraph:
    src, dst = edges()
    return CSCGraph.from_edges(src, dst, N)


def same_blocks(a, b) -> bool:
    names = ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids")
    return len(a) == len(b) and all(torch.equal(getattr(x, n), getattr(y, n))
                                    for x, y in zip(a, b, strict=True) for n in names)


def same_hetero_blocks(a, b) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        for name in ("src_nodes", "dst_nodes"):
            gx, gy = getattr(x, name), getattr(y, name)
            if gx.keys() != gy.keys() or not all(torch.equal(gx[t], gy[t]) for t in gx):
                return False
        if repr(x) != repr(y):
            return False
    return True


SEEDS = [torch.arange(0, 12), torch.tensor([5, 9, 9, 40]), torch.arange(30, 70, 3)]


@pytest.mark.parametrize("kind", ["uniform", "replace", "weighted", "temporal"])
def test_neighbor_sampler_copy_continues_the_originals_stream(kind):
    g = graph()
    kw = {"replace": kind == "replace"}
    if kind == "weighted":
        kw["weights"] = torch.rand(E, generator=torch.Generator().manual_seed(0))
    if kind == "temporal":
        kw["edge_times"] = torch.arange(E) % 17
    s = NeighborSampler(g, FANOUTS, seed=11, **kw)
    times = (lambda x: torch.full(x.shape, 9)) if kind == "temporal" else (lambda x: None)
    s.sample(SEEDS[0], seed_times=times(SEEDS[0]))  # the copy takes the call counter with it
    copy = pickle.loads(pickle.dumps(s))
    assert copy._lock is not s._lock and copy.loop.workspace is not s.loop.workspace
    for seeds in SEEDS:
        want = s.sample(seeds, seed_times=times(seeds))
        assert same_blocks(copy.sample(seeds, seed_times=times(seeds)), want)
    fresh, twin = (NeighborSampler(g, FANOUTS, seed=11, **kw) for _ in range(2))
    fresh_copy = pickle.loads(pickle.dumps(twin))
    for seeds in SEEDS:
        assert same_blocks(fresh_copy.sample(seeds, seed_times=times(seeds)),
                           fresh.sample(seeds, seed_times=times(seeds)))


def test_neighbor_sampler_copy_rebuilds_caches_and_excludes_edges():
    g = graph()
    s = NeighborSampler(g, FANOUTS, seed=2)
    s.sample(SEEDS[0], exclude_eids=torch.arange(50))  # builds the inverse edge-id map
    state = s.__getstate__()
    assert not {"_lock", "loop", "_eid_to_pos", "_indptr"} & set(state)
    copy = pickle.loads(pickle.dumps(s))
    assert copy._eid_to_pos is None
    assert same_blocks(copy.sample(SEEDS[1], exclude_eids=torch.arange(50)),
                       s.sample(SEEDS[1], exclude_eids=torch.arange(50)))


def test_the_original_survives_torchs_shared_memory_pickler():
    """ForkingPickler (mp.spawn's arguments) moves the graph's tensors into shared memory and frees the
    old blocks: the original must not keep sampling from numpy views of freed memory."""
    g, ref_g = graph(), graph()
    s = NeighborSampler(g, FANOUTS, seed=5)
    ref = NeighborSampler(ref_g, FANOUTS, seed=5)
    before = g.indptr.data_ptr()
    ForkingPickler.dumps(s)
    assert g.indptr.data_ptr() != before and g.indptr.is_shared()  # the storage moved
    torch.empty(10 * (N + E), dtype=torch.int64).fill_(-7)  # likely reuses the freed blocks
    for seeds in SEEDS:
        assert same_blocks(s.sample(seeds), ref.sample(seeds))


def hetero_graph() -> HeteroGraph:
    rng = np.random.default_rng(1)
    u, a = rng.integers(0, 30, 200), rng.integers(0, 20, 200)
    f1, f2 = rng.integers(0, 30, 90), rng.integers(0, 30, 90)
    return HeteroGraph.from_edges({"user": 30, "artist": 20},
                                  {("user", "listens", "artist"): (u, a),
                                   ("artist", "heard_by", "user"): (a, u),
                                   ("user", "friends", "user"): (f1, f2)},
                                  weights={("user", "friends", "user"): torch.rand(90)})


@pytest.mark.parametrize("weighted", [False, True])
def test_hetero_sampler_copy_continues_the_originals_stream(weighted):
    g = hetero_graph()
    s = HeteroNeighborSampler(g, {rel: [3, 2] for rel in g.relations}, seed=4,
                              weights=True if weighted else None)
    seeds = {"user": torch.tensor([0, 3, 7]), "artist": torch.tensor([1, 2])}
    s.sample(seeds)
    copy = pickle.loads(pickle.dumps(s))
    assert copy._lock is not s._lock
    for _ in range(3):
        a, b = copy.sample(seeds), s.sample(seeds)
        assert same_hetero_blocks(a, b)
        assert all(torch.equal(x.edge_ids[r], y.edge_ids[r]) for x, y in zip(a, b, strict=True)
                   for r in x.edge_ids)


def test_link_sampler_and_neighbor_loader_copies_continue():
    rng = np.random.default_rng(0)
    mask = rng.random((20, 15)) < 0.3
    mask[np.arange(20), rng.integers(0, 15, 20)] = True
    mask[np.arange(20), rng.integers(0, 15, 20)] = False
    users, items = np.nonzero(mask)
    g = CSCGraph.bipartite(users, items, 20, 15)
    m = users.size
    link = LinkSampler(NeighborSampler(g, [-1], seed=0), users, items + 20, batch_size=8,
                       target_eids=torch.arange(m), reverse_eids=bipartite_reverse_eids(m), exclude="reverse",
                       seed=0)
    next(iter(link))
    copy = pickle.loads(pickle.dumps(link))
    for x, y in zip(copy, link, strict=True):
        assert torch.equal(x.neg_items, y.neg_items) and same_blocks(x.blocks, y.blocks)
    loader = NeighborLoader(graph(), torch.arange(N), FANOUTS, batch_size=16, seed=3)
    list(loader)
    again = pickle.loads(pickle.dumps(loader))
    for x, y in zip(again, loader, strict=True):  # the next epoch: same order, same blocks
        assert torch.equal(x.seeds, y.seeds) and same_blocks(x.blocks, y.blocks)
    it = iter(loader)  # a live iterator (its prefetch thread sampling) is left behind, not copied
    next(it)
    live = pickle.loads(pickle.dumps(loader))
    assert len(list(live)) == len(loader)
    for each in (loader, again, live):
        each.close()


# ---------------------------------------------------------------------------------------------------
# Adapters (PyG, DGL)


def dgl_or_skip():
    from graphrl.dglshim import dgl_available, import_dgl

    if not dgl_available():
        pytest.skip("DGL not installed (install the 'dgl' extra)")
    return import_dgl()


def dgl_blocks_equal(a, b, dgl) -> bool:
    ia, oa, ba = a
    ib, ob, bb = b
    if not (torch.equal(ia, ib) and torch.equal(oa, ob)) or len(ba) != len(bb):
        return False
    for x, y in zip(ba, bb, strict=True):
        if not all(torch.equal(p, q) for p, q in zip(x.edges(), y.edges(), strict=True)):
            return False
        if not torch.equal(x.edata[dgl.EID], y.edata[dgl.EID]):
            return False
    return True


def test_dgl_sampler_pickles_as_a_fresh_sampler():
    dgl = dgl_or_skip()
    from samplers import DglSampler

    src, dst = edges()
    g = dgl.graph((src, dst), num_nodes=N)
    g.edata["w"] = torch.rand(E)
    s = DglSampler(FANOUTS, seed=7, prob="w")
    first = s.sample(g, SEEDS[0])
    s.sample(g, SEEDS[1])
    copy = pickle.loads(pickle.dumps(s))
    assert isinstance(copy, DglSampler) and isinstance(copy, dgl.dataloading.Sampler)
    assert copy.samplers == {} and copy.lock is not s.lock
    assert (copy.fanouts, copy.replace, copy.seed, copy.prob) == (s.fanouts, s.replace, s.seed, s.prob)
    assert dgl_blocks_equal(copy.sample(g, SEEDS[0]), first, dgl)  # its first batch on g, as a fresh one
    g2 = pickle.loads(pickle.dumps(g))
    fresh = DglSampler(FANOUTS, seed=7, prob="w")
    fresh_copy = pickle.loads(pickle.dumps(fresh))
    for seeds in SEEDS:
        assert dgl_blocks_equal(fresh_copy.sample(g2, seeds), fresh.sample(g, seeds), dgl)


def test_pyg_samplers_copies_continue():
    pyg = pytest.importorskip("torch_geometric", reason="needs the pyg extra")
    from samplers import PygSampler

    src, dst = edges()
    data = pyg.data.Data(edge_index=torch.stack([src, dst]), num_nodes=N)
    s = PygSampler(data, [3, 2], seed=1)
    s.sample_nodes(SEEDS[0])
    copy = pickle.loads(pickle.dumps(s))
    for seeds in SEEDS:
        a, b = copy.sample_nodes(seeds), s.sample_nodes(seeds)
        assert torch.equal(a.node, b.node) and torch.equal(a.row, b.row) and torch.equal(a.edge, b.edge)
    assert torch.equal(torch.randint(N, (8,), generator=copy.negatives),
                       torch.randint(N, (8,), generator=s.negatives))
    hetero = pyg.data.HeteroData()
    hetero["user"].num_nodes, hetero["item"].num_nodes = 30, 20
    rng = np.random.default_rng(2)
    u, i = torch.from_numpy(rng.integers(0, 30, 150)), torch.from_numpy(rng.integers(0, 20, 150))
    hetero["user", "buys", "item"].edge_index = torch.stack([u, i])
    hetero["item", "rev_buys", "user"].edge_index = torch.stack([i, u])
    hs = PygSampler(hetero, [3, 2], seed=2)
    hs.sample_nodes({"user": torch.arange(5)})
    hcopy = pickle.loads(pickle.dumps(hs))
    for _ in range(2):
        a, b = hcopy.sample_nodes({"user": torch.arange(8)}), hs.sample_nodes({"user": torch.arange(8)})
        assert all(torch.equal(a.node[t], b.node[t]) for t in b.node)
        assert all(torch.equal(a.edge[r], b.edge[r]) for r in b.edge)


# ---------------------------------------------------------------------------------------------------
# Other processes: torch.multiprocessing.spawn and a DataLoader's spawned workers


def _child(rank: int, sampler, dgl_sampler, src, dst, out: str) -> None:
    """Sample in a spawned process; results go back through a file."""
    result = {"ours": [[(b.src_nodes, b.indices, b.edge_ids) for b in sampler.sample(s)] for s in SEEDS]}
    if dgl_sampler is not None:
        from graphrl.dglshim import import_dgl

        dgl = import_dgl()
        g = dgl.graph((src, dst), num_nodes=N)
        result["dgl"] = [(i, o, [(*b.edges(), b.edata[dgl.EID]) for b in blocks])
                         for i, o, blocks in (dgl_sampler.sample(g, s) for s in SEEDS)]
    torch.save(result, out)


def test_samplers_sample_in_a_process_made_by_mp_spawn(tmp_path):
    from graphrl.dglshim import dgl_available

    src, dst = edges()
    g = CSCGraph.from_edges(src, dst, N)
    s = NeighborSampler(g, FANOUTS, seed=9)
    s.sample(SEEDS[2])
    dgl_sampler = None
    if dgl_available():
        from samplers import DglSampler

        dgl_sampler = DglSampler(FANOUTS, seed=9)
    ref = pickle.loads(pickle.dumps(s))  # what the child continues from
    parent_ref = pickle.loads(pickle.dumps(s))  # and the parent
    out = str(tmp_path / "child.pt")
    mp.spawn(_child, args=(s, dgl_sampler, src, dst, out), nprocs=1, join=True)
    got = torch.load(out)
    for seeds, child in zip(SEEDS, got["ours"], strict=True):
        want = ref.sample(seeds)
        assert all(torch.equal(x, y) for b, c in zip(want, child, strict=True)
                   for x, y in zip((b.src_nodes, b.indices, b.edge_ids), c, strict=True))
    assert g.indptr.is_shared()  # mp.spawn moved the parent's graph into shared memory
    for seeds in SEEDS:  # and the parent's sampler still samples right
        assert same_blocks(s.sample(seeds), parent_ref.sample(seeds))
    if dgl_sampler is not None:
        from graphrl.dglshim import import_dgl

        dgl = import_dgl()
        gd = dgl.graph((src, dst), num_nodes=N)
        for seeds, (i, o, blocks) in zip(SEEDS, got["dgl"], strict=True):
            wi, wo, wb = dgl_sampler.sample(gd, seeds)
            assert torch.equal(i, wi) and torch.equal(o, wo)
            for b, c in zip(wb, blocks, strict=True):
                assert all(torch.equal(x, y) for x, y in zip((*b.edges(), b.edata[dgl.EID]), c, strict=True))


class SampledDataset(torch.utils.data.Dataset):
    """Batch i of a dataset is the blocks of SEEDS[i], drawn by its own copy of the sampler."""

    def __init__(self, sampler: NeighborSampler) -> None:
        self.sampler = sampler

    def __len__(self) -> int:
        return len(SEEDS)

    def __getitem__(self, i: int):
        blocks = self.sampler.sample(SEEDS[i])
        return [(b.src_nodes, b.indices, b.edge_ids) for b in blocks]


def test_a_dataloader_with_two_spawned_workers_samples_with_copies():
    s = NeighborSampler(graph(), FANOUTS, seed=13)
    loader = torch.utils.data.DataLoader(SampledDataset(s), batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn", shuffle=False)
    got = list(loader)
    # worker w gets items w, w + 2, ...: each a copy of the sampler as it was, counting its own calls
    ref = [pickle.loads(pickle.dumps(s)) for _ in range(2)]
    for i, (seeds, child) in enumerate(zip(SEEDS, got, strict=True)):
        want = ref[i % 2].sample(seeds)
        assert all(torch.equal(x, y) for b, c in zip(want, child, strict=True)
                   for x, y in zip((b.src_nodes, b.indices, b.edge_ids), c, strict=True))

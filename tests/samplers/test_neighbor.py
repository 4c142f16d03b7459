"""NeighborSampler: the block contract, every edge case of issue 2, exclusion, determinism, uniformity,
equality with the reference kernels, DGL agreement, and real Gowalla data."""

from __future__ import annotations

import itertools
import threading
from collections import Counter

import numba
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from graphrl.graph import CSCGraph
from samplers.block import Block
from samplers.kernels import cpu
from samplers.kernels import reference as ref
from samplers.neighbor import NeighborSampler

MAX_THREADS = numba.config.NUMBA_NUM_THREADS


# ----------------------------------------------------------------------------------------- helpers
def edge_endpoints(graph: CSCGraph) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of every edge, indexed by edge id."""
    eids = graph.csc_edge_ids().numpy()
    src = np.empty(graph.num_edges, dtype=np.int64)
    dst = np.empty(graph.num_edges, dtype=np.int64)
    src[eids] = graph.indices.numpy()
    dst[eids] = np.repeat(np.arange(graph.num_nodes), graph.in_degrees().numpy())
    return src, dst


def check_blocks(graph: CSCGraph, blocks: list[Block], seeds, fanouts, replace=False, excluded=()):
    """Every invariant of the block contract and the sampled counts; returns nothing, asserts all."""
    seeds = torch.as_tensor(seeds, dtype=torch.int64)
    src_of, dst_of = edge_endpoints(graph)
    excluded = set(int(e) for e in excluded)
    in_deg = graph.in_degrees().numpy()
    x_per_node = np.zeros(graph.num_nodes, dtype=np.int64)
    for e in excluded:
        x_per_node[dst_of[e]] += 1
    assert len(blocks) == len(fanouts)
    assert torch.equal(blocks[-1].dst_nodes, seeds)
    for i, (block, k) in enumerate(zip(blocks, fanouts, strict=True)):
        for t in (block.src_nodes, block.dst_nodes, block.indptr, block.indices, block.edge_ids):
            assert t.dtype == torch.int64 and t.dim() == 1
        d, s = block.num_dst_nodes, block.num_src_nodes
        assert torch.equal(block.src_nodes[:d], block.dst_nodes)
        if i + 1 < len(blocks):
            assert torch.equal(block.dst_nodes, blocks[i + 1].src_nodes)
        assert block.indptr.shape == (d + 1,) and int(block.indptr[0]) == 0
        assert int(block.indptr[-1]) == block.num_edges == block.edge_ids.shape[0]
        assert bool((block.indptr[1:] >= block.indptr[:-1]).all())
        if block.num_edges:
            assert int(block.indices.min()) >= 0 and int(block.indices.max()) < s
            assert int(block.edge_ids.min()) >= 0 and int(block.edge_ids.max()) < graph.num_edges
        # sources: each new node once, local ids point at the edge's real source
        assert len(set(block.src_nodes[d:].tolist())) == s - d
        assert not set(block.src_nodes[d:].tolist()) & set(block.dst_nodes.tolist())
        eids = block.edge_ids.numpy()
        assert np.array_equal(block.src_nodes.numpy()[block.indices.numpy()], src_of[eids])
        assert np.array_equal(block.dst_nodes.numpy()[block.edge_dst().numpy()], dst_of[eids])
        assert not excluded & set(eids.tolist())
        # counts: min(d - x, k) without replacement, k with replacement when d - x > 0
        avail = in_deg[block.dst_nodes.numpy()] - x_per_node[block.dst_nodes.numpy()]
        if k == -1:
            want = avail
        elif replace:
            want = np.where(avail > 0, k, 0)
        else:
            want = np.minimum(avail, k)
        assert np.array_equal(block.in_degrees().numpy(), want)
        if not replace:
            for v in range(d):
                row = eids[int(block.indptr[v]):int(block.indptr[v + 1])]
                assert len(set(row.tolist())) == row.size


def blocks_equal(a: list[Block], b: list[Block]) -> bool:
    return all(
        torch.equal(x.src_nodes, y.src_nodes) and torch.equal(x.indptr, y.indptr)
        and torch.equal(x.indices, y.indices) and torch.equal(x.edge_ids, y.edge_ids)
        and (x.src_times is None) == (y.src_times is None)
        and (x.src_times is None or torch.equal(x.src_times, y.src_times))
        for x, y in zip(a, b, strict=True)
    )


def reference_blocks(graph: CSCGraph, seeds, fanouts, replace, seed, call=0, exclude_eids=None, weights=None,
                     edge_times=None, seed_times=None):
    """The blocks the spec in `samplers.kernels.reference` prescribes (``weights`` and ``edge_times``
    indexed by edge id, as `NeighborSampler` takes them)."""
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
    edge_ids = None if graph.edge_ids is None else graph.edge_ids.numpy()
    csc_eids = graph.csc_edge_ids().numpy()
    excluded = None
    if exclude_eids is not None and len(exclude_eids):
        pos_of = np.empty(graph.num_edges, dtype=np.int64)
        pos_of[csc_eids] = np.arange(graph.num_edges)
        excluded = np.unique(pos_of[np.asarray(exclude_eids, dtype=np.int64)])
    w = None if weights is None else np.asarray(weights, dtype=np.float64)[csc_eids].astype(np.float32)
    t = None if edge_times is None else np.asarray(edge_times)[csc_eids]
    times = None if seed_times is None else np.asarray(seed_times)
    dst = np.asarray(seeds, dtype=np.int64)
    out = []
    for layer in range(len(fanouts) - 1, -1, -1):
        key = ref.layer_key(seed, call, layer)
        out_indptr, src, eids = ref.sample_layer(indptr, indices, edge_ids, dst, fanouts[layer], replace, key,
                                                 excluded, w, t, times)
        src_times = None
        if t is None:
            src_nodes, local = ref.relabel(dst, src)
        else:
            src_nodes, src_times, local = ref.relabel_temporal(dst, times, out_indptr, src)
        out.append(Block(torch.from_numpy(src_nodes), torch.from_numpy(src_nodes[:dst.size]),
                         torch.from_numpy(out_indptr), torch.from_numpy(local), torch.from_numpy(eids),
                         None if src_times is None else torch.from_numpy(src_times)))
        dst = src_nodes
        times = src_times
    return out[::-1]


@pytest.fixture
def small_graph() -> CSCGraph:
    """8 nodes: node 0 has in-edges from 1, 2, 3 (eids 0, 1, 2); node 1 from 0 and 2 (eids 3, 4); node 2
    from 0 (eid 5); node 3 from 4, 5, 6, 7 (eids 6..9); nodes 4..7 have in-degree 0."""
    src = [1, 2, 3, 0, 2, 0, 4, 5, 6, 7]
    dst = [0, 0, 0, 1, 1, 2, 3, 3, 3, 3]
    return CSCGraph.from_edges(src, dst, 8)


@pytest.fixture
def random_graph() -> CSCGraph:
    rng = np.random.default_rng(7)
    n, e = 300, 6000
    return CSCGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)


@pytest.fixture
def num_threads():
    """Restore numba's thread count after a test that changes it."""
    before = numba.get_num_threads()
    yield
    numba.set_num_threads(before)


# ------------------------------------------------------------------------------------ the contract
def test_blocks_follow_the_contract_on_a_hand_graph(small_graph):
    sampler = NeighborSampler(small_graph, [2, 2], seed=0)
    blocks = sampler.sample(torch.tensor([0, 3]))
    check_blocks(small_graph, blocks, [0, 3], [2, 2])
    last = blocks[-1]
    assert last.in_degrees().tolist() == [2, 2]
    assert set(last.edge_ids[:2].tolist()) <= {0, 1, 2}
    assert set(last.edge_ids[2:].tolist()) <= {6, 7, 8, 9}
    assert repr(last).startswith("Block(num_src_nodes=")


def test_in_degree_zero_destinations_without_replacement(small_graph):
    for fanout in (0, 1, 3, 10, -1):
        blocks = NeighborSampler(small_graph, [fanout], seed=1).sample(torch.tensor([4, 0, 5, 7]))
        b = blocks[0]
        assert b.in_degrees().tolist() == [0, {0: 0, 1: 1, 3: 3, 10: 3, -1: 3}[fanout], 0, 0]
        assert b.src_nodes[:4].tolist() == [4, 0, 5, 7]
        if b.num_edges:
            assert int(b.indices.min()) >= 0 and int(b.edge_ids.min()) >= 0


def test_in_degree_zero_destinations_with_replacement(small_graph):
    blocks = NeighborSampler(small_graph, [5], replace=True, seed=1).sample(torch.tensor([4, 0, 5]))
    b = blocks[0]
    assert b.in_degrees().tolist() == [0, 5, 0]
    assert set(b.edge_ids.tolist()) <= {0, 1, 2}
    assert int(b.indices.min()) >= 0 and int(b.indices.max()) < b.num_src_nodes
    check_blocks(small_graph, blocks, [4, 0, 5], [5], replace=True)


def test_fanout_minus_one_takes_every_in_edge(small_graph):
    blocks = NeighborSampler(small_graph, [-1, -1], seed=2).sample(torch.tensor([0, 3]))
    last = blocks[-1]
    assert last.edge_ids.tolist() == [0, 1, 2, 6, 7, 8, 9]  # CSC order within each row
    assert last.src_nodes.tolist() == [0, 3, 1, 2, 4, 5, 6, 7]
    assert last.indices.tolist() == [2, 3, 1, 4, 5, 6, 7]  # source 3 is destination 1
    # outer layer: in-edges of all of 0, 3, 1, 2, 4, 5, 6, 7
    assert sorted(blocks[0].edge_ids.tolist()) == list(range(10))
    check_blocks(small_graph, blocks, [0, 3], [-1, -1])


def test_fanout_above_degree_without_replacement_takes_each_edge_once(small_graph):
    b = NeighborSampler(small_graph, [50], seed=3).sample(torch.tensor([3, 0, 1]))[0]
    assert b.edge_ids.tolist() == [6, 7, 8, 9, 0, 1, 2, 3, 4]


def test_all_seeds_of_degree_zero_give_empty_blocks(small_graph):
    for replace in (False, True):
        blocks = NeighborSampler(small_graph, [3, 2], replace=replace, seed=4).sample(torch.tensor([4, 5, 6]))
        for b in blocks:
            assert b.num_edges == 0 and b.indices.shape == (0,) and b.edge_ids.shape == (0,)
            assert b.indptr.tolist() == [0, 0, 0, 0]
            assert b.src_nodes.tolist() == [4, 5, 6] and b.dst_nodes.tolist() == [4, 5, 6]
            assert b.indices.dtype == b.edge_ids.dtype == b.indptr.dtype == torch.int64


def test_empty_seed_tensor_gives_empty_blocks(small_graph):
    sampler = NeighborSampler(small_graph, [3, -1], seed=5)
    for seeds in (torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int32), []):
        blocks = sampler.sample(seeds)
        assert len(blocks) == 2
        for b in blocks:
            assert b.num_src_nodes == b.num_dst_nodes == b.num_edges == 0
            assert b.indptr.tolist() == [0]
            for t in (b.src_nodes, b.dst_nodes, b.indptr, b.indices, b.edge_ids):
                assert t.dtype == torch.int64
    assert sampler.sampled_edges == 0


def test_duplicate_seeds_are_kept_with_identical_rows(small_graph):
    seeds = torch.tensor([0, 3, 0, 0, 3])
    blocks = NeighborSampler(small_graph, [2, 2], seed=6).sample(seeds)
    last = blocks[-1]
    assert last.dst_nodes.tolist() == [0, 3, 0, 0, 3]
    rows = [last.edge_ids[int(last.indptr[v]):int(last.indptr[v + 1])].tolist() for v in range(5)]
    assert rows[0] == rows[2] == rows[3] and rows[1] == rows[4]
    # duplicates map to the first occurrence's local id when they are sources
    b = NeighborSampler(small_graph, [-1], seed=6).sample(torch.tensor([2, 2, 0]))[0]
    assert b.src_nodes.tolist() == [2, 2, 0, 1, 3]
    assert b.indices.tolist() == [2, 2, 3, 0, 4]  # rows: 2 <- 0; 2 <- 0; 0 <- 1, 2, 3
    check_blocks(small_graph, blocks, seeds, [2, 2])


def test_multigraph_without_replacement_never_draws_an_edge_twice():
    # node 0 has five parallel in-edges from 1 and three from 2
    src = [1, 1, 1, 1, 1, 2, 2, 2]
    graph = CSCGraph.from_edges(src, [0] * 8, 3)
    for fanout in (2, 3, 5, 7, 8, 20):
        for seed in range(20):
            eids = NeighborSampler(graph, [fanout], seed=seed).sample(torch.tensor([0]))[0].edge_ids.tolist()
            assert len(eids) == min(fanout, 8) and len(set(eids)) == len(eids)
    # every parallel edge can be drawn, not only one per source
    drawn = set()
    for seed in range(50):
        drawn |= set(NeighborSampler(graph, [3], seed=seed).sample(torch.tensor([0]))[0].edge_ids.tolist())
    assert drawn == set(range(8))


# ------------------------------------------------------------------------------------------- errors
def test_seeds_out_of_range_raise_value_error_naming_seeds(small_graph):
    sampler = NeighborSampler(small_graph, [2], seed=0)
    with pytest.raises(ValueError, match=r"seeds: 2 of 3 ids outside \[0, num_nodes=8\), first 8"):
        sampler.sample(torch.tensor([0, 8, 9]))
    with pytest.raises(ValueError, match="seeds.*first -1"):
        sampler.sample(torch.tensor([-1]))
    with pytest.raises(ValueError, match="seeds must be 1-D"):
        sampler.sample(torch.tensor([[0, 1]]))


def test_float_or_bool_seeds_raise_type_error_naming_seeds(small_graph):
    sampler = NeighborSampler(small_graph, [2], seed=0)
    for bad in (torch.tensor([0.0, 1.0]), torch.tensor([True]), np.array([0.5])):
        with pytest.raises(TypeError, match="seeds"):
            sampler.sample(bad)


def test_bad_fanouts_raise_naming_fanouts(small_graph):
    with pytest.raises(ValueError, match=r"fanouts\[1\]=-2"):
        NeighborSampler(small_graph, [3, -2])
    with pytest.raises(ValueError, match="fanouts"):
        NeighborSampler(small_graph, [])
    with pytest.raises(TypeError, match=r"fanouts\[0\]"):
        NeighborSampler(small_graph, [2.5])
    with pytest.raises(TypeError, match="graph"):
        NeighborSampler("not a graph", [2])
    with pytest.raises(TypeError, match="seed"):
        NeighborSampler(small_graph, [2], seed=1.5)


def test_bad_exclude_eids_raise_naming_exclude_eids(small_graph):
    sampler = NeighborSampler(small_graph, [2], seed=0)
    with pytest.raises(ValueError, match=r"exclude_eids: 1 of 2 ids outside \[0, num_edges=10\), first 10"):
        sampler.sample(torch.tensor([0]), exclude_eids=torch.tensor([3, 10]))
    with pytest.raises(ValueError, match="exclude_eids"):
        sampler.sample(torch.tensor([0]), exclude_eids=torch.tensor([-1]))
    with pytest.raises(TypeError, match="exclude_eids"):
        sampler.sample(torch.tensor([0]), exclude_eids=torch.tensor([1.0]))


# ---------------------------------------------------------------------------------------- exclusion
def test_exclusion_by_hand(small_graph):
    sampler = NeighborSampler(small_graph, [2], seed=0)
    # node 0: in-edges 0, 1, 2; excluding 0 and 2 leaves edge 1 only
    b = sampler.sample(torch.tensor([0]), exclude_eids=torch.tensor([0, 2]))[0]
    assert b.edge_ids.tolist() == [1] and b.src_nodes.tolist() == [0, 2]
    # node 3: in-edges 6..9, exclude 7 and 8 (and duplicates of them) -> exactly 6 and 9 with fanout 2
    b = sampler.sample(torch.tensor([3]), exclude_eids=torch.tensor([8, 7, 8, 7]))[0]
    assert b.edge_ids.tolist() == [6, 9] and b.src_nodes.tolist() == [3, 4, 7]
    # everything excluded: no edges, with or without replacement, any fanout
    for replace, fanout in itertools.product((False, True), (1, 5, -1)):
        s = NeighborSampler(small_graph, [fanout], replace=replace, seed=1)
        b = s.sample(torch.tensor([0, 1]), exclude_eids=torch.tensor([0, 1, 2, 3, 4]))[0]
        assert b.num_edges == 0 and b.indptr.tolist() == [0, 0, 0]
    # with replacement, only non-excluded edges are drawn, k of them
    s = NeighborSampler(small_graph, [6], replace=True, seed=2)
    b = s.sample(torch.tensor([3]), exclude_eids=torch.tensor([6, 9]))[0]
    assert b.num_edges == 6 and set(b.edge_ids.tolist()) <= {7, 8}


def test_exclusion_applies_to_every_layer(small_graph):
    # seeds [2]: layer 1 takes 0 -> 2 (edge 5); layer 0 then samples node 0's and node 2's in-edges
    sampler = NeighborSampler(small_graph, [-1, -1], seed=0)
    blocks = sampler.sample(torch.tensor([2]), exclude_eids=torch.tensor([1]))
    assert blocks[1].edge_ids.tolist() == [5]
    assert blocks[0].dst_nodes.tolist() == [2, 0]
    assert blocks[0].edge_ids.tolist() == [5, 0, 2]
    check_blocks(small_graph, blocks, [2], [-1, -1], excluded=[1])


def test_exclusion_count_rule_min_d_minus_x_k(random_graph):
    rng = np.random.default_rng(0)
    seeds = torch.from_numpy(rng.integers(0, random_graph.num_nodes, 200))
    excluded = torch.from_numpy(rng.integers(0, random_graph.num_edges, 2500))
    for replace, fanouts in ((False, [3, 15]), (False, [-1, 25]), (True, [4, 8])):
        sampler = NeighborSampler(random_graph, fanouts, replace=replace, seed=5)
        blocks = sampler.sample(seeds, exclude_eids=excluded)
        check_blocks(random_graph, blocks, seeds, fanouts, replace=replace, excluded=excluded.tolist())
        assert blocks_equal(blocks, reference_blocks(random_graph, seeds, fanouts, replace, 5, 0,
                                                     excluded.numpy()))


def test_exclusion_on_rows_at_bitmap_word_edges():
    # rows 0, 63, 64, 127, 128, 199 have 30 in-edges each; exclude some edges of each of them
    n = 200
    rows = np.array([0, 63, 64, 127, 128, 199])
    dst = np.repeat(rows, 30)
    src = np.arange(dst.size) % n
    graph = CSCGraph.from_edges(src, dst, n)
    excluded = np.concatenate([np.arange(30 * i, 30 * i + 3 + 4 * i) for i in range(rows.size)])
    seeds = torch.from_numpy(np.concatenate([rows, rows + 1]).clip(max=n - 1))
    for replace, fanout in ((False, 10), (False, 25), (True, 7), (False, -1)):
        sampler = NeighborSampler(graph, [fanout], replace=replace, seed=4)
        blocks = sampler.sample(seeds, exclude_eids=torch.from_numpy(excluded))
        check_blocks(graph, blocks, seeds, [fanout], replace=replace, excluded=excluded.tolist())
        assert blocks_equal(blocks, reference_blocks(graph, seeds.numpy(), [fanout], replace, 4, 0, excluded))


def test_rows_without_excluded_edges_sample_as_without_exclusion(random_graph):
    seeds = torch.arange(0, 300, 3)
    in_edges_of = edge_endpoints(random_graph)[1]
    # exclude edges whose destination is not a seed: the seeds' rows must be unchanged
    excluded = torch.from_numpy(np.flatnonzero(in_edges_of % 3 != 0))
    a = NeighborSampler(random_graph, [7], seed=9).sample(seeds)[0]
    b = NeighborSampler(random_graph, [7], seed=9).sample(seeds, exclude_eids=excluded)[0]
    assert torch.equal(a.edge_ids, b.edge_ids) and torch.equal(a.indices, b.indices)


# ---------------------------------------------------------------------------------------- seeding
def test_same_seed_same_blocks_across_runs_and_different_seed_differs(random_graph):
    seeds = torch.arange(0, 300, 5)
    runs = []
    for _ in range(2):
        sampler = NeighborSampler(random_graph, [10, 5], seed=123)
        runs.append([sampler.sample(seeds) for _ in range(3)])
    for a, b in zip(runs[0], runs[1], strict=True):
        assert blocks_equal(a, b)
    # successive calls differ, and another seed differs
    assert not blocks_equal(runs[0][0], runs[0][1])
    other = NeighborSampler(random_graph, [10, 5], seed=124).sample(seeds)
    assert not blocks_equal(runs[0][0], other)


@pytest.mark.skipif(MAX_THREADS < 2, reason="needs NUMBA_NUM_THREADS >= 2")
def test_same_seed_same_blocks_across_thread_counts(num_threads):
    rng = np.random.default_rng(1)
    n, e = 20_000, 600_000  # big enough for several chunks per layer
    graph = CSCGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    seeds = torch.from_numpy(rng.integers(0, n, 1024))
    excluded = torch.from_numpy(rng.integers(0, e, 4096))
    results = {}
    for threads in (1, 2, 1, 2):
        numba.set_num_threads(threads)
        for replace in (False, True):
            sampler = NeighborSampler(graph, [15, 10, 5], replace=replace, seed=77)
            blocks = [sampler.sample(seeds), sampler.sample(seeds, exclude_eids=excluded)]
            assert blocks[0][0].num_edges > 2 * cpu.CHUNK_EDGES
            if replace in results:
                for a, b in zip(results[replace], blocks, strict=True):
                    assert blocks_equal(a, b)
            results[replace] = blocks


def test_concurrent_samplers_in_threads_match_sequential(random_graph):
    seeds = [torch.arange(i, 300, 7) for i in range(7)]
    want = [NeighborSampler(random_graph, [8, 4], seed=i).sample(s) for i, s in enumerate(seeds)]
    got: dict[int, list[Block]] = {}

    def work(i):
        got[i] = NeighborSampler(random_graph, [8, 4], seed=i).sample(seeds[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(7):
        assert blocks_equal(got[i], want[i])


def test_one_sampler_called_from_threads_serialises_calls(random_graph):
    seeds = torch.arange(0, 300, 2)
    reference = NeighborSampler(random_graph, [9, 9], seed=8)
    want = [reference.sample(seeds) for _ in range(6)]
    shared = NeighborSampler(random_graph, [9, 9], seed=8)
    got: list[list[Block]] = []
    lock = threading.Lock()

    def work():
        blocks = shared.sample(seeds)
        with lock:
            got.append(blocks)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # each call is some call n of the sequential stream, every n exactly once
    matched = sorted(next(n for n in range(6) if blocks_equal(g, want[n])) for g in got)
    assert matched == list(range(6))


def test_sampled_edges_is_a_running_count(random_graph):
    sampler = NeighborSampler(random_graph, [5, 3], seed=0)
    total = 0
    for i in range(4):
        blocks = sampler.sample(torch.arange(i, 300, 11), exclude_eids=torch.tensor([0, 1, 2]))
        total += sum(b.num_edges for b in blocks)
        assert sampler.sampled_edges == total
    assert total > 0


def test_node_map_generation_wraps_without_changing_results(random_graph):
    seeds = torch.arange(0, 300, 4)
    sampler = NeighborSampler(random_graph, [6, 6], seed=3)
    want = sampler.sample(seeds)
    sampler = NeighborSampler(random_graph, [6, 6], seed=3)
    ws = sampler.loop.workspace
    ws.node_map[:] = np.iinfo(np.int32).max - 10  # looks "valid" unless the map is cleared on wrap
    ws.base = np.iinfo(np.int32).max - 10
    got = sampler.sample(seeds)
    assert blocks_equal(want, got)
    assert ws.base < 10**6


# ------------------------------------------------------------------------------------- uniformity
def _star_rows(num_rows: int, degree: int) -> CSCGraph:
    """num_rows destinations 0..num_rows-1, each with `degree` in-edges from distinct sources."""
    dst = np.repeat(np.arange(num_rows), degree)
    src = num_rows + np.tile(np.arange(degree), num_rows)
    return CSCGraph.from_edges(src, dst, num_rows + degree)


@pytest.mark.parametrize(("degree", "fanout", "replace"), [
    (40, 5, False),     # Floyd with a 64-bit mask
    (20, 15, False),    # mask, complement (Floyd draws the 5 left out)
    (64, 40, False),    # mask at the 64-bit boundary, complement
    (200, 10, False),   # Floyd with a bitmap of chosen slots
    (150, 100, False),  # bitmap, complement of 50
    (400, 150, False),  # bitmap, 150 draws
    (90, 7, True),      # with replacement
])
def test_each_neighbour_is_drawn_equally_often(degree, fanout, replace):
    rows = 4000
    graph = _star_rows(rows, degree)
    sampler = NeighborSampler(graph, [fanout], replace=replace, seed=2024)
    counts = np.zeros(degree, dtype=np.int64)
    for _ in range(3):
        b = sampler.sample(torch.arange(rows))[0]
        assert b.num_edges == rows * fanout
        counts += np.bincount(b.edge_ids.numpy() % degree, minlength=degree)
    assert counts.sum() == 3 * rows * fanout
    assert chisquare(counts).pvalue > 1e-4


@pytest.mark.parametrize(("fanout", "path"), [(10, "scan"), (100, "hash"), (3000, "complement")])
def test_rows_above_4096_in_edges_are_uniform_and_equal_the_reference(fanout, path):
    degree, rows = 5000, 60
    graph = _star_rows(rows, degree)
    sampler = NeighborSampler(graph, [fanout], seed=99)
    counts = np.zeros(50, dtype=np.int64)  # positions binned by 100
    for call in range(8):
        b = sampler.sample(torch.arange(rows))[0]
        rel = b.edge_ids.numpy() % degree
        assert np.array_equal(np.sort(rel.reshape(rows, fanout), axis=1), rel.reshape(rows, fanout))
        assert all(len(set(r)) == fanout for r in rel.reshape(rows, fanout).tolist())
        counts += np.bincount(rel // 100, minlength=50)
        if call == 0:
            assert blocks_equal([b], reference_blocks(graph, np.arange(rows), [fanout], False, 99, 0))
    assert chisquare(counts).pvalue > 1e-4


@pytest.mark.parametrize(("degree", "fanout"), [(6, 3), (5, 3), (5, 2)])
def test_every_subset_is_equally_likely(degree, fanout):
    rows = 20_000
    graph = _star_rows(rows, degree)
    b = NeighborSampler(graph, [fanout], seed=11).sample(torch.arange(rows))[0]
    eids = b.edge_ids.numpy().reshape(rows, fanout) % degree
    subsets = Counter(map(tuple, eids.tolist()))
    assert set(subsets) == set(itertools.combinations(range(degree), fanout))  # sorted, all present
    assert chisquare(list(subsets.values())).pvalue > 1e-4


# ---------------------------------------------------------------------- kernels against the reference
@st.composite
def graphs_and_requests(draw):
    n = draw(st.integers(1, 40))
    e = draw(st.integers(0, 400))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    # skewed destinations so that some rows have degree > 64
    dst = np.minimum(rng.geometric(draw(st.sampled_from([0.05, 0.3, 0.9])), e) - 1, n - 1)
    graph = CSCGraph.from_edges(rng.integers(0, n, e), dst, n)
    seeds = rng.integers(0, n, draw(st.integers(0, 12)))
    fanouts = draw(st.lists(st.sampled_from([-1, 0, 1, 2, 5, 20, 40, 70, 150]), min_size=1, max_size=3))
    replace = draw(st.booleans())
    excluded = rng.integers(0, e, draw(st.integers(0, e))) if e and draw(st.booleans()) else None
    return graph, seeds, fanouts, replace, excluded, seed % 1000


@settings(max_examples=120, deadline=None)
@given(graphs_and_requests())
def test_cpu_kernels_equal_the_reference_and_blocks_are_valid(case):
    graph, seeds, fanouts, replace, excluded, seed = case
    sampler = NeighborSampler(graph, fanouts, replace=replace, seed=seed)
    for call in range(2):
        ex = None if excluded is None else torch.from_numpy(excluded)
        blocks = sampler.sample(torch.from_numpy(seeds), exclude_eids=ex)
        assert blocks_equal(blocks, reference_blocks(graph, seeds, fanouts, replace, seed, call, excluded))
        check_blocks(graph, blocks, seeds, fanouts, replace=replace,
                     excluded=() if excluded is None else excluded.tolist())


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(0, 200), st.integers(0, 2**31), st.booleans())
def test_array_kernels_equal_the_reference(n, e, seed, identity_eids):
    rng = np.random.default_rng(seed)
    graph = CSCGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
    edge_ids = None if identity_eids else graph.edge_ids.numpy()
    dst = rng.integers(0, n, 15)
    excluded = np.unique(rng.integers(0, e, e // 4)) if e else None
    for fanout, replace in ((3, False), (3, True), (-1, False), (25, False)):
        key = ref.layer_key(seed, 1, 0)
        want = ref.sample_layer(indptr, indices, edge_ids, dst, fanout, replace, key, excluded)
        got = cpu.sample_layer(indptr, indices, edge_ids, dst, fanout, replace, key, excluded)
        for w, g in zip(want, got, strict=True):
            assert np.array_equal(w, g) and g.dtype == np.int64
        node_map = np.full(n, -1, dtype=np.int32)
        for w, g in zip(ref.relabel(dst, want[1]), cpu.relabel(dst, got[1], node_map), strict=True):
            assert np.array_equal(w, g)
        assert (node_map == -1).all()


def test_reference_draw_is_the_high_word_of_the_product():
    rng = ref._RowRNG(ref.layer_key(1, 2, 3), 4)
    state = rng.state
    for n in (1, 7, 64, 10**6, 2**40):
        state = (state + ref.GOLDEN) & ref.MASK64
        assert rng.draw(n) == (ref.mix(state) * n) >> 64 < n


def test_helper_errors_reach_the_caller():
    def fail(i):
        if i == 3:
            raise RuntimeError("chunk 3 failed")

    with pytest.raises(RuntimeError, match="chunk 3 failed"):
        cpu.parallel_chunks(fail, 8, helpers=1)
    cpu.parallel_chunks(lambda i: None, 8, helpers=1)  # the team is usable afterwards


# ---------------------------------------------------------------------------------------------- DGL
dgl_mark = pytest.mark.dgl


def test_dglshim_stubs_graphbolt_and_selects_pytorch(dgl):
    import os
    import sys

    assert os.environ["DGLBACKEND"] == "pytorch"
    assert "graphrl.dglshim" in (sys.modules["dgl.graphbolt"].__doc__ or "")
    assert hasattr(dgl.dataloading, "NeighborSampler")


def test_dglshim_names_the_extra_when_dgl_is_missing(monkeypatch):
    import sys

    from graphrl import dglshim

    monkeypatch.setitem(sys.modules, "dgl", None)  # makes `import dgl` fail as if not installed
    with pytest.raises(ImportError, match="'dgl' extra"):
        dglshim.import_dgl()
    assert not dglshim.dgl_available()


def to_dgl_graph(dgl, graph: CSCGraph):
    src, dst = edge_endpoints(graph)
    return dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=graph.num_nodes)


@dgl_mark
def test_full_neighbour_blocks_have_dgl_edge_sets(dgl, random_graph):
    g = to_dgl_graph(dgl, random_graph)
    seeds = torch.tensor([5, 17, 3, 250, 99])
    ours = NeighborSampler(random_graph, [-1, -1], seed=0).sample(seeds)
    _, _, theirs = dgl.dataloading.MultiLayerFullNeighborSampler(2).sample_blocks(g, seeds)
    assert ours[-1].dst_nodes.tolist() == theirs[-1].dstdata[dgl.NID].tolist() == seeds.tolist()
    for a, b in zip(ours, theirs, strict=True):  # DGL orders the new source nodes differently
        assert set(a.src_nodes.tolist()) == set(b.srcdata[dgl.NID].tolist())
        assert set(a.dst_nodes.tolist()) == set(b.dstdata[dgl.NID].tolist())
        assert sorted(a.edge_ids.tolist()) == sorted(b.edata[dgl.EID].tolist())
        assert a.num_edges == b.num_edges()


@dgl_mark
def test_exclusion_agrees_with_dgl_for_full_neighbourhoods_and_removes_before_drawing(dgl, random_graph):
    g = to_dgl_graph(dgl, random_graph)
    rng = np.random.default_rng(3)
    seeds = torch.from_numpy(np.unique(rng.integers(0, 300, 40)))
    excluded = torch.from_numpy(rng.integers(0, random_graph.num_edges, 1500))
    ours = NeighborSampler(random_graph, [-1], seed=0).sample(seeds, exclude_eids=excluded)[0]
    theirs = dgl.sampling.sample_neighbors(g, seeds, -1, exclude_edges=excluded)
    assert sorted(ours.edge_ids.tolist()) == sorted(theirs.edata[dgl.EID].tolist())
    # With a fanout we differ on purpose: DGL 2.1 draws k edges and then drops the excluded ones, so
    # a node gets fewer than min(d - x, k); we remove them before drawing and always give min(d - x, k).
    ours = NeighborSampler(random_graph, [12], seed=0).sample(seeds, exclude_eids=excluded)[0]
    theirs = dgl.sampling.sample_neighbors(g, seeds, 12, exclude_edges=excluded)
    assert not set(theirs.edata[dgl.EID].tolist()) & set(excluded.tolist())
    _, their_dst = theirs.edges()
    their_counts = torch.bincount(their_dst, minlength=random_graph.num_nodes)[seeds]
    in_deg = random_graph.in_degrees()[seeds]
    x = torch.bincount(torch.from_numpy(edge_endpoints(random_graph)[1])[torch.unique(excluded)],
                       minlength=random_graph.num_nodes)[seeds]
    assert torch.equal(ours.in_degrees(), torch.minimum(in_deg - x, torch.tensor(12)))
    assert bool((their_counts <= ours.in_degrees()).all()) and bool((their_counts < ours.in_degrees()).any())


# ------------------------------------------------------------------------------------- real data
@pytest.fixture(scope="module")
def gowalla(data_root):
    from graphrl.datasets import load_gowalla

    return load_gowalla(data_root)


def test_gowalla_blocks_and_target_exclusion(gowalla):
    graph = gowalla.graph
    assert (graph.num_nodes, graph.num_edges) == (70_839, 1_620_256)
    m = gowalla.num_train
    rng = np.random.default_rng(0)
    batch = rng.choice(m, 512, replace=False)
    users = gowalla.train_users[batch]
    items = gowalla.train_items[batch] + gowalla.num_users
    seeds = torch.unique(torch.cat([users, items]))
    targets = torch.from_numpy(np.concatenate([batch, batch + m]))  # both directions of each positive
    sampler = NeighborSampler(graph, [15, 10, 5], seed=1)
    blocks = sampler.sample(seeds, exclude_eids=targets)
    check_blocks(graph, blocks, seeds, [15, 10, 5], excluded=targets.tolist())
    # node types alternate along edges of a bipartite graph
    node_type = graph.node_type
    for b in blocks:
        assert bool((node_type[b.src_nodes[b.indices]] != node_type[b.dst_nodes[b.edge_dst()]]).all())
    assert sampler.sampled_edges == sum(b.num_edges for b in blocks)
    # the user with the most items (811) is a high-degree row: 15 of 811 distinct edges
    top = int(torch.argmax(graph.in_degrees()[: gowalla.num_users]))
    assert int(graph.in_degrees()[top]) == 811
    b = NeighborSampler(graph, [15], seed=2).sample(torch.tensor([top]))[0]
    assert b.num_edges == 15 and len(set(b.edge_ids.tolist())) == 15


# ---------------------------------------------------------------------------------- int64 indices
def test_int64_indices_give_the_same_blocks_as_int32():
    rng = np.random.default_rng(21)
    n, e = 200, 5000
    src, dst = rng.integers(0, n, e), np.minimum(rng.geometric(0.02, e) - 1, n - 1)
    g32 = CSCGraph.from_edges(src, dst, n)
    g64 = CSCGraph.from_edges(src, dst, n, index_dtype=torch.int64)
    assert g32.indices.dtype == torch.int32 and g64.indices.dtype == torch.int64
    seeds = torch.from_numpy(rng.integers(0, n, 64))
    excluded = torch.from_numpy(rng.integers(0, e, 300))
    weights = torch.from_numpy(rng.random(e) * (rng.random(e) < 0.8))
    for replace, fanouts, w in ((False, [-1, 5], None), (False, [20, 3], None), (True, [4, 4], None),
                                (False, [10, 2], weights), (True, [3, 3], weights)):
        for ex in (None, excluded):
            a, b = (NeighborSampler(g, fanouts, replace=replace, weights=w, seed=5)
                    .sample(seeds, exclude_eids=ex) for g in (g32, g64))
            assert blocks_equal(a, b)
    with pytest.raises(ValueError, match="index_dtype"):
        CSCGraph.from_edges(src, dst, n, index_dtype=torch.int16)
    assert CSCGraph.bipartite([0, 1], [1, 0], 2, 2, index_dtype=torch.int64).indices.dtype == torch.int64

"""The CPU gather's (source, edge id) pairs (`samplers._csc.edge_pairs`): their layout, when they are
built, and that every CPU mode samples the same edges with them as without (the graph's own
``indices`` and ``edge_ids``, the path kept for graphs of 2**31 edges or more)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import samplers._csc as csc
from graphrl.graph import CSCGraph
from samplers.hetero import HeteroNeighborSampler
from samplers.hetero_graph import HeteroGraph
from samplers.kernels.cpu.uniform import gather_edges
from samplers.labor import LaborSampler
from samplers.neighbor import NeighborSampler

_NONE_I64 = np.empty(0, dtype=np.int64)
_NONE_I32 = np.empty(0, dtype=np.int32)


def _graph(seed: int = 0, n: int = 400, e: int = 6000) -> CSCGraph:
    rng = np.random.default_rng(seed)
    dst = np.minimum((rng.pareto(1.3, e) * 20).astype(np.int64), n - 1)  # a few rows of high degree
    return CSCGraph.from_edges(torch.from_numpy(rng.integers(0, n, e)), torch.from_numpy(dst), n)


def _flat(blocks) -> list[np.ndarray]:
    """Every tensor of a sample, in a fixed order (plain or typed blocks)."""
    out = []
    for b in blocks:
        for name in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids", "edge_weights", "src_times"):
            value = getattr(b, name, None)
            if isinstance(value, dict):
                out += [value[k].numpy() for k in sorted(value, key=repr)]
            elif value is not None:
                out.append(value.numpy())
    return out


def test_pairs_interleave_sources_and_edge_ids():
    g = _graph()
    pairs = csc.edge_pairs(g.indices.numpy(), g.edge_ids.numpy(), g.num_nodes)
    assert pairs.dtype == np.int32 and pairs.shape == (2 * g.num_edges,)
    np.testing.assert_array_equal(pairs[0::2], g.indices.numpy())
    np.testing.assert_array_equal(pairs[1::2], g.edge_ids.numpy())
    # int64 indices pack the same values
    again = csc.edge_pairs(g.indices.numpy().astype(np.int64), g.edge_ids.numpy(), g.num_nodes)
    np.testing.assert_array_equal(again, pairs)


def test_no_pairs_without_edge_ids_or_beyond_int32(monkeypatch):
    g = _graph()
    idx, eids = g.indices.numpy(), g.edge_ids.numpy()
    assert csc.edge_pairs(idx, None, g.num_nodes) is None  # ids are positions: indices alone suffice
    assert csc.edge_pairs(idx, eids, csc.PAIR_LIMIT + 1) is None  # source ids beyond int32
    assert csc.edge_pairs(idx, eids, csc.PAIR_LIMIT) is not None
    monkeypatch.setattr(csc, "PAIR_LIMIT", g.num_edges)  # as a graph of 2**31 edges
    assert csc.edge_pairs(idx, eids, g.num_nodes) is None
    monkeypatch.setattr(csc, "PAIR_LIMIT", g.num_edges + 1)
    assert csc.edge_pairs(idx, eids, g.num_nodes) is not None


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 300), st.integers(0, 200), st.integers(0, 2**32 - 1), st.booleans())
def test_gather_reads_pairs_as_the_two_arrays(num, count, seed, wide):
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, 2**31 - 1, num).astype(np.int64 if wide else np.int32)
    edge_ids = rng.permutation(num).astype(np.int64)
    pos = rng.integers(0, num, count).astype(np.int64)
    pairs = csc.edge_pairs(indices, edge_ids, 2**31)
    want_src, want_eid = np.empty(count, indices.dtype), pos.copy()
    gather_edges(indices, edge_ids, True, _NONE_I32, False, want_eid, want_src, 0, count)
    got_src, got_eid = np.empty(count, indices.dtype), pos.copy()
    gather_edges(indices, _NONE_I64, False, pairs, True, got_eid, got_src, 0, count)
    np.testing.assert_array_equal(got_src, indices[pos])
    np.testing.assert_array_equal(got_eid, edge_ids[pos])
    np.testing.assert_array_equal(got_src, want_src)
    np.testing.assert_array_equal(got_eid, want_eid)


def _plain_samplers(g: CSCGraph) -> dict:
    rng = np.random.default_rng(1)
    w = torch.from_numpy(rng.random(g.num_edges).astype(np.float32))
    t = torch.from_numpy(rng.integers(0, 50, g.num_edges))
    return {
        "uniform": NeighborSampler(g, [8, 3], seed=2),
        "replace": NeighborSampler(g, [8, 3], replace=True, seed=2),
        "weighted": NeighborSampler(g, [8, -1], weights=w, seed=2),
        "temporal": NeighborSampler(g, [8, 3], edge_times=t, seed=2),
        "temporal weighted": NeighborSampler(g, [8, 3], weights=w, edge_times=t, seed=2),
        "labor-1": LaborSampler(g, [8, 3], importance_sampling=1, weights=w, seed=2),
    }


@pytest.mark.parametrize("threads", [1, 2])
def test_every_cpu_mode_samples_the_same_edges_with_and_without_pairs(monkeypatch, threads):
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        _same_edges_with_and_without_pairs(monkeypatch)
    finally:
        numba.set_num_threads(before)


def _same_edges_with_and_without_pairs(monkeypatch) -> None:
    g = _graph(3)
    packed = _plain_samplers(g)
    monkeypatch.setattr(csc, "PAIR_LIMIT", g.num_edges)  # the path of graphs of 2**31 edges or more
    plain = _plain_samplers(g)
    rng = np.random.default_rng(4)
    seeds = torch.from_numpy(rng.integers(0, g.num_nodes, 300))
    excl = torch.from_numpy(rng.integers(0, g.num_edges, 500))
    times = torch.from_numpy(rng.integers(0, 60, 300))
    for name, sampler in packed.items():
        assert sampler.loop.relations[next(iter(sampler.loop.relations))].pairs is not None, name
        assert plain[name].loop.relations[next(iter(plain[name].loop.relations))].pairs is None, name
        kw = {"seed_times": times} if "temporal" in name else {}
        for ex in (None, excl):
            a = _flat(sampler.sample(seeds, exclude_eids=ex, **kw))
            b = _flat(plain[name].sample(seeds, exclude_eids=ex, **kw))
            assert len(a) == len(b) and a, name
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y, err_msg=name)


def test_typed_graphs_sample_the_same_edges_with_and_without_pairs(monkeypatch):
    rng = np.random.default_rng(5)
    rels = {("u", "clicks", "i"): (300, 200, 3000), ("i", "rev", "u"): (200, 300, 3000)}
    edges = {rel: (rng.integers(0, a, e), rng.integers(0, b, e)) for rel, (a, b, e) in rels.items()}
    hg = HeteroGraph.from_edges({"u": 300, "i": 200}, edges)
    seeds = {"u": torch.arange(0, 300, 3), "i": torch.arange(0, 200, 4)}
    excl = {("u", "clicks", "i"): torch.arange(0, 3000, 5)}
    packed = HeteroNeighborSampler(hg, [6, 2], seed=9).sample(seeds, exclude_eids=excl)
    monkeypatch.setattr(csc, "PAIR_LIMIT", 3000)
    plain = HeteroNeighborSampler(hg, [6, 2], seed=9).sample(seeds, exclude_eids=excl)
    a, b = _flat(packed), _flat(plain)
    assert len(a) == len(b) and a
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)

"""CSCGraph: exact layouts on small graphs, builders against scipy/networkx, validation errors."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import graphrl.graph as graph_mod
from graphrl.graph import CSCGraph


def rows(g: CSCGraph) -> list[tuple[list[int], list[int]]]:
    """(sources, edge ids) of every destination, in CSC order."""
    ip, ind, eid = g.indptr.numpy(), g.indices.numpy(), g.csc_edge_ids().numpy()
    return [(ind[ip[v]:ip[v + 1]].tolist(), eid[ip[v]:ip[v + 1]].tolist()) for v in range(g.num_nodes)]


@pytest.fixture(params=["argsort", "numba"])
def path(request, monkeypatch):
    """Run a test through both grouping paths of from_edges (numpy argsort and numba counting sort)."""
    monkeypatch.setattr(graph_mod, "_SCATTER_MIN_EDGES", 1 << 62 if request.param == "argsort" else 0)
    return request.param


# ------------------------------------------------------------------------------------------ from_edges
def test_from_edges_exact_layout(path):
    #        e0  e1  e2  e3  e4  e5
    src = [0, 2, 1, 2, 0, 3]
    dst = [1, 1, 0, 2, 1, 1]
    g = CSCGraph.from_edges(src, dst, 4)
    assert g.num_nodes == 4 and g.num_edges == 6
    assert g.indptr.tolist() == [0, 1, 5, 6, 6]
    # in-edges of node 1 are e0, e1, e4, e5 in input order, with their sources
    assert rows(g) == [([1], [2]), ([0, 2, 0, 3], [0, 1, 4, 5]), ([2], [3]), ([], [])]
    assert g.in_degrees().tolist() == [1, 4, 1, 0]
    assert g.indptr.dtype == torch.int64
    assert g.indices.dtype == torch.int32
    assert g.edge_ids.dtype == torch.int64


def test_from_edges_matches_scipy_csc(path):
    rng = np.random.default_rng(3)
    n = 60
    pairs = rng.choice(n * n, size=700, replace=False)  # distinct edges: scipy would sum duplicates
    src, dst = pairs // n, pairs % n
    g = CSCGraph.from_edges(src, dst, n)
    ref = sp.csc_matrix((np.ones(src.size), (src, dst)), shape=(n, n))
    ref.sort_indices()
    assert np.array_equal(g.indptr.numpy(), ref.indptr)
    for v in range(n):
        lo, hi = ref.indptr[v], ref.indptr[v + 1]
        assert sorted(g.indices[lo:hi].tolist()) == ref.indices[lo:hi].tolist()


def test_from_edges_multigraph_counts_match_scipy_sum(path):
    src = np.array([0, 0, 0, 1, 2, 2])
    dst = np.array([1, 1, 1, 1, 2, 0])
    g = CSCGraph.from_edges(src, dst, 3)
    ref = sp.csc_matrix((np.ones(6), (src, dst)), shape=(3, 3)).toarray()  # duplicates summed
    mine = np.zeros((3, 3))
    d = np.repeat(np.arange(3), g.in_degrees().numpy())
    np.add.at(mine, (g.indices.numpy(), d), 1)
    assert np.array_equal(mine, ref)
    assert rows(g)[1] == ([0, 0, 0, 1], [0, 1, 2, 3])  # parallel edges kept, each with its own id


def test_from_edges_weights_follow_edges(path):
    src = [2, 0, 1, 0]
    dst = [0, 1, 0, 0]
    w = np.array([0.5, 1.5, 0.0, 2.0])
    g = CSCGraph.from_edges(src, dst, 3, weights=w)
    assert g.weights.dtype == torch.float32
    assert g.weights.tolist() == [0.5, 0.0, 2.0, 1.5]  # row 0: e0, e2, e3; row 1: e1
    assert np.array_equal(g.weights.numpy(), w.astype(np.float32)[g.edge_ids.numpy()])


def test_numba_and_argsort_paths_agree_on_a_large_input(monkeypatch):
    rng = np.random.default_rng(0)
    n, e = 5000, 300_000
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    w = rng.random(e)
    out = {}
    for name, threshold in (("argsort", 1 << 62), ("numba", 0)):
        monkeypatch.setattr(graph_mod, "_SCATTER_MIN_EDGES", threshold)
        out[name] = CSCGraph.from_edges(src, dst, n, weights=w)
    a, b = out["argsort"], out["numba"]
    for field in ("indptr", "indices", "edge_ids", "weights"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert np.array_equal(b.edge_ids.numpy(), np.argsort(dst, kind="stable"))


def test_from_edges_accepts_tensors_and_int32():
    g = CSCGraph.from_edges(torch.tensor([1, 0], dtype=torch.int32), np.array([0, 1], dtype=np.int32),
                            torch.tensor(2))
    assert rows(g) == [([1], [0]), ([0], [1])]


def test_empty_graphs():
    g = CSCGraph.from_edges([], [], 3)
    assert g.num_nodes == 3 and g.num_edges == 0
    assert g.indptr.tolist() == [0, 0, 0, 0] and g.in_degrees().tolist() == [0, 0, 0]
    g0 = CSCGraph.from_edges(np.empty(0, np.int64), np.empty(0, np.int64), 0)
    assert g0.num_nodes == 0 and g0.indptr.tolist() == [0]
    g.validate()
    g0.validate()


def test_in_degrees_match_networkx_and_numpy():
    rng = np.random.default_rng(7)
    n = 40
    src, dst = rng.integers(0, n, 300), rng.integers(0, n, 300)
    g = CSCGraph.from_edges(src, dst, n)
    ref = nx.MultiDiGraph()
    ref.add_nodes_from(range(n))
    ref.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    assert g.in_degrees().tolist() == [ref.in_degree(v) for v in range(n)]
    assert np.array_equal(g.in_degrees().numpy(), np.bincount(dst, minlength=n))
    assert g.in_degrees().dtype == torch.int64


def test_csc_edge_ids_identity_when_absent():
    g = CSCGraph(indptr=torch.tensor([0, 1, 2]), indices=torch.tensor([1, 0], dtype=torch.int32)).validate()
    assert g.csc_edge_ids().tolist() == [0, 1]


# ------------------------------------------------------------------------------------------ from_scipy
def test_from_scipy_entry_u_v_is_edge_u_to_v_and_edge_ids_follow_coo():
    #   rows = sources, columns = destinations
    m = sp.csr_matrix(np.array([[0, 3, 0],
                                [0, 0, 0],
                                [5, 7, 0]], dtype=np.float64))
    g = CSCGraph.from_scipy(m, weighted=True)
    coo = m.tocoo()  # entries in order: (0,1,3) (2,0,5) (2,1,7)
    assert list(zip(coo.row.tolist(), coo.col.tolist(), strict=True)) == [(0, 1), (2, 0), (2, 1)]
    assert rows(g) == [([2], [1]), ([0, 2], [0, 2]), ([], [])]
    assert g.weights.tolist() == [5.0, 3.0, 7.0]
    assert CSCGraph.from_scipy(m).weights is None


def test_from_scipy_csc_input_uses_its_own_coo_order():
    dense = np.array([[0, 1, 1], [1, 0, 0], [0, 1, 0]])
    m = sp.csc_matrix(dense)
    g = CSCGraph.from_scipy(m)
    coo = m.tocoo()
    eid = g.edge_ids.numpy()
    d = np.repeat(np.arange(3), g.in_degrees().numpy())
    assert np.array_equal(coo.row[eid], g.indices.numpy())
    assert np.array_equal(coo.col[eid], d)


def test_from_scipy_errors():
    with pytest.raises(ValueError, match="square"):
        CSCGraph.from_scipy(sp.csr_matrix(np.ones((2, 3))))
    with pytest.raises(TypeError, match="matrix"):
        CSCGraph.from_scipy(np.ones((2, 2)))
    with pytest.raises(ValueError, match="weights"):
        CSCGraph.from_scipy(sp.csr_matrix(np.array([[0.0, -1.0], [0.0, 0.0]])), weighted=True)


# ------------------------------------------------------------------------------------------- bipartite
def test_bipartite_both_directions_reverse_offset_and_node_type(path):
    users = np.array([0, 1, 1, 2])
    items = np.array([1, 0, 1, 1])
    num_users, num_items, m = 3, 2, 4
    g = CSCGraph.bipartite(users, items, num_users, num_items, weights=[1.0, 2.0, 3.0, 4.0])
    assert g.num_nodes == 5 and g.num_edges == 8
    assert g.node_type.tolist() == [0, 0, 0, 1, 1]
    assert g.node_type.dtype == torch.int8
    ip, ind, eid = g.indptr.numpy(), g.indices.numpy(), g.edge_ids.numpy()
    dst = np.repeat(np.arange(5), np.diff(ip))
    expected_src = np.concatenate([users, items + num_users])
    expected_dst = np.concatenate([items + num_users, users])
    assert np.array_equal(ind, expected_src[eid]) and np.array_equal(dst, expected_dst[eid])
    # edge e and (e + M) % 2M are reverses of each other
    pos_of = np.empty(2 * m, dtype=np.int64)
    pos_of[eid] = np.arange(2 * m)
    for e in range(2 * m):
        p, q = pos_of[e], pos_of[(e + m) % (2 * m)]
        assert (ind[p], dst[p]) == (dst[q], ind[q])
    assert np.array_equal(g.weights.numpy(), np.tile([1.0, 2.0, 3.0, 4.0], 2)[eid])
    # item 1 (node 4) has in-edges from users 0, 1, 2 in interaction order; user 1 from items 0, 1
    assert rows(g)[4] == ([0, 1, 2], [0, 2, 3])
    assert rows(g)[1] == ([3, 4], [5, 6])
    assert g.in_degrees().tolist() == [1, 2, 1, 1, 3]


def test_bipartite_errors():
    with pytest.raises(ValueError, match="items"):
        CSCGraph.bipartite([0], [2], 1, 2)
    with pytest.raises(ValueError, match="users"):
        CSCGraph.bipartite([-1], [0], 1, 2)
    with pytest.raises(ValueError, match="same length"):
        CSCGraph.bipartite([0, 0], [0], 1, 2)
    with pytest.raises(TypeError, match="num_items"):
        CSCGraph.bipartite([0], [0], 1, 2.5)
    with pytest.raises(ValueError, match="num_users"):
        CSCGraph.bipartite([], [], -1, 2)


# ---------------------------------------------------------------------------------------- validation
def test_from_edges_out_of_range_ids_name_the_argument():
    with pytest.raises(ValueError, match=r"src: 1 of 3 node ids outside \[0, num_nodes=3\), first 3"):
        CSCGraph.from_edges([0, 3, 1], [0, 0, 0], 3)
    with pytest.raises(ValueError, match=r"dst: 2 of 3 .* first -1"):
        CSCGraph.from_edges([0, 1, 1], [-1, 0, -2], 3)


def test_from_edges_type_errors_name_the_argument():
    with pytest.raises(TypeError, match="src must hold integers.*float"):
        CSCGraph.from_edges([0.0, 1.0], [0, 1], 2)
    with pytest.raises(TypeError, match="dst must hold integers.*bool"):
        CSCGraph.from_edges([0, 1], np.array([True, False]), 2)
    with pytest.raises(TypeError, match="num_nodes"):
        CSCGraph.from_edges([0], [0], 2.0)
    with pytest.raises(TypeError, match="num_nodes"):
        CSCGraph.from_edges([0], [0], None)
    with pytest.raises(ValueError, match="num_nodes"):
        CSCGraph.from_edges([], [], -1)
    with pytest.raises(ValueError, match="same length"):
        CSCGraph.from_edges([0, 1], [0], 2)
    with pytest.raises(ValueError, match="src must be 1-D"):
        CSCGraph.from_edges([[0, 1]], [[0, 1]], 2)


@pytest.mark.parametrize("bad, word", [(-1.0, "-1.0"), (np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_from_edges_bad_weights(bad, word):
    msg = rf"weights: 1 of 3 weights are negative, NaN or infinite, first {word}"
    with pytest.raises(ValueError, match=msg):
        CSCGraph.from_edges([0, 1, 0], [1, 0, 0], 2, weights=[1.0, bad, 0.0])


def test_from_edges_weight_shape_and_type():
    with pytest.raises(ValueError, match=r"weights must have shape \[2\]"):
        CSCGraph.from_edges([0, 1], [1, 0], 2, weights=[1.0])
    with pytest.raises(TypeError, match="weights must be numeric"):
        CSCGraph.from_edges([0, 1], [1, 0], 2, weights=np.array(["a", "b"]))
    with pytest.raises(ValueError, match="node_type"):
        CSCGraph.from_edges([0, 1], [1, 0], 2, node_type=[0, 1, 1])


def _raw(indptr, indices, **kw):
    return CSCGraph(indptr=torch.tensor(indptr, dtype=torch.int64),
                    indices=torch.tensor(indices, dtype=torch.int32), **kw)


def test_validate_rejects_broken_csc():
    with pytest.raises(ValueError, match=r"non-decreasing, but indptr\[2\]=1 < indptr\[1\]=2"):
        _raw([0, 2, 1, 3], [0, 1, 2]).validate()
    with pytest.raises(ValueError, match="start at 0"):
        _raw([1, 2, 3], [0, 1]).validate()
    with pytest.raises(ValueError, match=r"indptr\[-1\]=2 must equal len\(indices\)=3"):
        _raw([0, 1, 2], [0, 1, 1]).validate()
    with pytest.raises(ValueError, match="indices: 1 of 2 node ids outside"):
        _raw([0, 1, 2], [0, 2]).validate()
    with pytest.raises(TypeError, match="indptr must be a 1-D int64"):
        CSCGraph(indptr=torch.tensor([0, 1], dtype=torch.int32), indices=torch.tensor([0])).validate()
    with pytest.raises(TypeError, match="indices must be"):
        CSCGraph(indptr=torch.tensor([0, 1]), indices=torch.tensor([0.0])).validate()
    with pytest.raises(ValueError, match="weights"):
        _raw([0, 1, 2], [0, 1], weights=torch.tensor([1.0, float("nan")])).validate()
    with pytest.raises(ValueError, match="edge_ids must have shape"):
        _raw([0, 1, 2], [0, 1], edge_ids=torch.tensor([0])).validate()
    with pytest.raises(ValueError, match="node_type must have shape"):
        _raw([0, 1, 2], [0, 1], node_type=torch.zeros(3, dtype=torch.int8)).validate()
    ok = _raw([0, 0, 2], [0, 1])
    assert ok.validate() is ok


# ------------------------------------------------------------------------------------------ property
@st.composite
def edge_lists(draw):
    n = draw(st.integers(1, 40))
    e = draw(st.integers(0, 150))
    ids = st.lists(st.integers(0, n - 1), min_size=e, max_size=e)
    return n, np.array(draw(ids), dtype=np.int64), np.array(draw(ids), dtype=np.int64)


@settings(max_examples=150, deadline=None)
@given(edge_lists())
def test_property_csc_positions_reproduce_input_edges(data):
    n, src, dst = data
    graphs = []
    for threshold in (1 << 62, 0):  # argsort path, numba path
        old = graph_mod._SCATTER_MIN_EDGES
        graph_mod._SCATTER_MIN_EDGES = threshold
        try:
            graphs.append(CSCGraph.from_edges(src, dst, n))
        finally:
            graph_mod._SCATTER_MIN_EDGES = old
    for g in graphs:
        g.validate()
        ip, ind, eid = g.indptr.numpy(), g.indices.numpy(), g.edge_ids.numpy()
        assert sorted(eid.tolist()) == list(range(src.size))  # a permutation of the input edges
        for v in range(n):
            row = eid[ip[v]:ip[v + 1]]
            assert np.all(np.diff(row) > 0)  # input order within a destination
            assert np.array_equal(ind[ip[v]:ip[v + 1]], src[row])
            assert np.all(dst[row] == v)
    for f in ("indptr", "indices", "edge_ids"):
        assert torch.equal(getattr(graphs[0], f), getattr(graphs[1], f)), f


# ------------------------------------------------------------------------------- memory-manager regions
from graphrl.memory import MemoryBudgetError, MemoryManager  # noqa: E402

_ARRAYS = ("indptr", "indices", "edge_ids", "weights")


def _same_graph(a: CSCGraph, b: CSCGraph) -> None:
    for name in (*_ARRAYS, "node_type"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), name


def test_from_edges_in_memory_regions_views_them_and_matches_the_plain_build(path):
    rng = np.random.default_rng(1)
    src, dst, w = rng.integers(0, 50, 400), rng.integers(0, 50, 400), rng.random(400)
    with MemoryManager() as mm:
        g = CSCGraph.from_edges(src, dst, 50, weights=w, memory=mm)
        _same_graph(g, CSCGraph.from_edges(src, dst, 50, weights=w))
        assert g.placement() == {name: "device" for name in _ARRAYS}  # device tier: host memory without CUDA
        by_owner = {r.owner: r for r in g.regions}
        for name in _ARRAYS:
            region = by_owner[f"graph.{name}"]
            assert getattr(g, name).data_ptr() == region.data_ptr()  # a view, not a copy
            assert region.nbytes == getattr(g, name).numel() * getattr(g, name).element_size()
        stats = mm.stats()["device"]
        assert stats["graph.indices"] == {"bytes": 400 * 4, "peak": 400 * 4, "regions": 1}
        assert "tiers=device" in repr(g)
        g.validate()
        g.free()
        g.free()  # idempotent
        assert all(r.freed for r in g.regions)
        assert mm.stats()["device"]["graph.indptr"]["bytes"] == 0 and mm.regions() == []


def test_graph_falls_back_to_the_next_tier_when_the_device_budget_is_too_small():
    # indptr (51 x 8 = 408 bytes) fits the device budget; indices, edge ids and weights do not
    with MemoryManager(budgets={"device": 500}) as mm:
        g = CSCGraph.from_edges(np.arange(200) % 50, np.arange(200)[::-1] % 50, 50, weights=np.ones(200),
                                memory=mm)
        assert g.placement() == {"indptr": "device", "indices": "pinned", "edge_ids": "pinned",
                                 "weights": "pinned"}
        assert mm.usage()["device"]["used"] == 408


def test_graph_too_large_for_every_tier_raises_and_frees_what_it_allocated():
    budgets = {"device": 1500, "pinned": 1500, "host": 1500}
    with MemoryManager(budgets=budgets) as mm:
        with pytest.raises(MemoryBudgetError) as info:
            CSCGraph.from_edges(np.zeros(300, np.int64), np.zeros(300, np.int64), 10, memory=mm)
        assert info.value.owner == "graph.edge_ids"  # 2400 bytes, after indptr and indices (88 + 1200)
        assert mm.regions() == []
        assert all(u["used"] == 0 for u in mm.usage().values())
        # without fallback tiers the device budget is the only one
        with pytest.raises(MemoryBudgetError, match="tier 'device'"):
            CSCGraph.from_edges(np.zeros(300, np.int64), np.zeros(300, np.int64), 10, memory=mm, fallback=())


def test_bipartite_scipy_and_to_memory_place_every_array():
    users, items = np.array([0, 0, 1, 2]), np.array([1, 0, 1, 1])
    with MemoryManager() as mm:
        g = CSCGraph.bipartite(users, items, 3, 2, weights=np.ones(4), memory=mm, tier="pinned")
        _same_graph(g, CSCGraph.bipartite(users, items, 3, 2, weights=np.ones(4)))
        assert g.placement() == {**{n: "pinned" for n in _ARRAYS}, "node_type": "pinned"}
        m = sp.coo_matrix((np.ones(3), ([0, 1, 2], [1, 2, 0])), shape=(3, 3))
        gs = CSCGraph.from_scipy(m, weighted=True, memory=mm, tier="host")
        _same_graph(gs, CSCGraph.from_scipy(m, weighted=True))
        assert set(gs.placement().values()) == {"host"}
        plain = CSCGraph.bipartite(users, items, 3, 2)
        moved = plain.to_memory(mm)
        _same_graph(moved, plain)
        assert moved.indices.data_ptr() != plain.indices.data_ptr() and plain.regions == ()
        assert set(moved.placement()) == {"indptr", "indices", "edge_ids", "node_type"}


def test_memory_argument_type_errors():
    with pytest.raises(TypeError, match="memory must be a MemoryManager"):
        CSCGraph.from_edges([0], [1], 2, memory="host")
    with pytest.raises(TypeError, match="memory must be a MemoryManager"):
        CSCGraph.from_edges([0], [1], 2).to_memory(None)
    with MemoryManager() as mm, pytest.raises(ValueError, match="unknown tier"):
        CSCGraph.from_edges([0], [1], 2, memory=mm, tier="gpu")


def test_uint64_ids_beyond_int64_are_rejected_with_their_value():
    big = np.array([2**63 + 5], dtype=np.uint64)
    with pytest.raises(ValueError, match="src: id 9223372036854775813 does not fit int64"):
        CSCGraph.from_edges(big, np.array([0], dtype=np.uint64), 10)


def test_bipartite_weights_are_checked_per_interaction():
    users, items = np.array([0, 1, 2]), np.array([0, 1, 2])
    with pytest.raises(ValueError, match=r"shape \[3\] \(one per interaction\), got \(2,\)"):
        CSCGraph.bipartite(users, items, 3, 3, weights=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="1 of 3 weights are negative, NaN or infinite"):
        CSCGraph.bipartite(users, items, 3, 3, weights=np.array([1.0, -2.0, 3.0]))
    g = CSCGraph.bipartite(users, items, 3, 3, weights=np.array([1.0, 2.0, 3.0]))
    expected = np.array([1.0, 2.0, 3.0, 1.0, 2.0, 3.0])  # edge e and its reverse e + 3 share a weight
    assert g.weights.numpy().tolist() == expected[g.edge_ids.numpy()].tolist()


@pytest.mark.parametrize("types, first", [([0, 1, 300], 300), ([0, -1, 3], -1)])
def test_node_type_outside_int8_range_is_rejected_not_wrapped(types, first):
    with pytest.raises(ValueError, match=rf"node_type: 1 of 3 types outside \[0, 127\], first {first}"):
        CSCGraph.from_edges([0, 1], [1, 2], 3, node_type=types)
    with pytest.raises(TypeError, match="node_type must hold integers"):
        CSCGraph.from_edges([0, 1], [1, 2], 3, node_type=[0, 1.5, 3])

"""PygSampler: our kernels behind PyG's NodeLoader / LinkLoader, batches laid out as NeighborLoader's."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from samplers import NeighborSampler, PygSampler
from samplers.interop import blocks_to_pyg

pyg = pytest.importorskip("torch_geometric", reason="torch_geometric not installed (install the 'pyg' extra)")
from torch_geometric.data import Data, HeteroData  # noqa: E402
from torch_geometric.loader import LinkLoader, NodeLoader  # noqa: E402
from torch_geometric.sampler import BaseSampler, NegativeSampling  # noqa: E402
from torch_geometric.sampler.utils import to_csc  # noqa: E402
from torch_geometric.utils import k_hop_subgraph  # noqa: E402

pytestmark = pytest.mark.pyg


def coo(graph: CSCGraph) -> torch.Tensor:
    """``edge_index`` int64 [2, E] of a CSCGraph, column j = edge id j."""
    dst = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.in_degrees())
    out = torch.empty(2, graph.num_edges, dtype=torch.int64)
    out[:, graph.csc_edge_ids().long()] = torch.stack([graph.indices.long(), dst])
    return out


@pytest.fixture(scope="module")
def small() -> Data:
    """A hand-made graph (PyG order: row 0 source, row 1 target), sorted by (target, source) so that our
    CSC rows and PyG's ``to_csc`` rows list neighbours in the same order."""
    pairs = [(0, 1), (2, 1), (3, 1), (1, 0), (4, 0), (0, 2), (5, 2), (6, 2), (1, 3), (7, 3), (2, 4),
             (8, 4), (3, 5), (9, 5), (4, 6), (0, 7), (5, 8), (6, 9), (7, 9), (8, 9)]
    ei = torch.tensor(sorted(pairs, key=lambda p: (p[1], p[0]))).t().contiguous()
    return Data(edge_index=ei, num_nodes=10, x=torch.arange(10.0).view(-1, 1))


@pytest.fixture(scope="module")
def rand() -> Data:
    rng = np.random.default_rng(7)
    n, e = 80, 400
    ei = torch.from_numpy(np.stack([rng.integers(0, n, e), rng.integers(0, n, e)]))
    ei = torch.unique(ei, dim=1)  # no parallel edges
    order = torch.argsort(ei[1] * n + ei[0])  # PyG's CSC order: by target, then source
    return Data(edge_index=ei[:, order].contiguous(), num_nodes=n)


def check_layout(data: Data, batch, seeds: torch.Tensor, num_neighbors: list[int]) -> None:
    """The NeighborLoader contract: seeds first, every edge a graph edge, hop counts consistent."""
    n_id, (row, col), e_id = batch.n_id, batch.edge_index, batch.e_id
    assert torch.equal(n_id[: seeds.numel()], seeds)
    assert n_id.unique().numel() == n_id.numel()
    assert torch.equal(data.edge_index[:, e_id], torch.stack([n_id[row], n_id[col]]))
    hops = len(num_neighbors)
    assert sum(batch.num_sampled_nodes) == n_id.numel() and len(batch.num_sampled_nodes) == hops + 1
    assert sum(batch.num_sampled_edges) == e_id.numel() and len(batch.num_sampled_edges) == hops
    starts = np.cumsum([0, *batch.num_sampled_nodes])
    estart = np.cumsum([0, *batch.num_sampled_edges])
    deg = torch.bincount(data.edge_index[1], minlength=data.num_nodes)
    for hop, k in enumerate(num_neighbors):  # hop h's edges enter the nodes found at hop h - 1
        tgt = col[estart[hop]:estart[hop + 1]]
        assert bool(((tgt >= starts[hop]) & (tgt < starts[hop + 1])).all())
        src = row[estart[hop]:estart[hop + 1]]
        assert bool((src < starts[hop + 2]).all())
        got = torch.bincount(tgt - int(starts[hop]), minlength=int(starts[hop + 1] - starts[hop]))
        full = deg[n_id[starts[hop]:starts[hop + 1]]]
        assert torch.equal(got, full if k < 0 else torch.minimum(full, torch.tensor(k)))


def pyglib_full_reference(data: Data, seeds: torch.Tensor, hops: int):
    """pyg-lib's neighbour sampling with fanout -1 at every hop, written out on PyG's own CSC (``to_csc``
    with ``is_sorted=True``, as ``NeighborLoader(..., is_sorted=True)`` builds it, so that rows keep input
    order; unsorted, PyG's unstable sort fixes no order within a row): each hop expands the nodes found
    by the previous one, in order, each row in CSC order."""
    colptr, row, perm = to_csc(data, is_sorted=True)
    eid = perm if perm is not None else torch.arange(row.numel())
    nodes, where = [int(s) for s in seeds], {}
    for i, s in enumerate(nodes):
        where.setdefault(s, i)
    rows, cols, edges, counts, ecounts = [], [], [], [len(nodes)], []
    frontier = range(len(nodes))
    for _ in range(hops):
        new, m = [], 0
        for v in frontier:
            for p in range(int(colptr[nodes[v]]), int(colptr[nodes[v] + 1])):
                u = int(row[p])
                if u not in where:
                    where[u] = len(nodes)
                    nodes.append(u)
                    new.append(where[u])
                rows.append(where[u])
                cols.append(v)
                edges.append(int(eid[p]))
                m += 1
        counts.append(len(new))
        ecounts.append(m)
        frontier = new
    t = torch.tensor
    return t(nodes), t([rows, cols], dtype=torch.int64), t(edges, dtype=torch.int64), counts, ecounts


# ------------------------------------------------------------------------------------------- structure
def test_is_a_pyg_base_sampler_built_on_our_graph(small):
    s = PygSampler(small, [2, 2], seed=0)
    assert isinstance(s, BaseSampler) and isinstance(s, PygSampler)
    assert s.sampler.fanouts == [2, 2] and s.edge_permutation is None
    assert torch.equal(coo(s.graph), small.edge_index)


@pytest.mark.parametrize("num_neighbors,replace", [([2, 2], False), ([1, 3], False), ([2, 1, 2], True)])
def test_batches_equal_our_blocks_in_pyg_layout(small, num_neighbors, replace):
    seeds = torch.tensor([9, 2, 5])
    s = PygSampler(small, num_neighbors, replace=replace, seed=11)
    graph = CSCGraph.from_edges(small.edge_index[0], small.edge_index[1], small.num_nodes)
    ours = NeighborSampler(graph, num_neighbors[::-1], replace=replace, seed=11)
    loader = NodeLoader(small, node_sampler=s, input_nodes=seeds, batch_size=3)
    for _ in range(3):  # successive calls advance both streams alike
        batch = next(iter(loader))
        sub = blocks_to_pyg(ours.sample(seeds))
        assert torch.equal(batch.n_id, sub.n_id) and torch.equal(batch.edge_index, sub.edge_index)
        assert torch.equal(batch.e_id, sub.e_id)
        assert batch.num_sampled_nodes == sub.num_sampled_nodes
        assert batch.num_sampled_edges == sub.num_sampled_edges
        assert batch.batch_size == 3 and torch.equal(batch.input_id, torch.arange(3))
        assert torch.equal(batch.x.view(-1), batch.n_id.float())  # features gathered by n_id
        if not replace:
            check_layout(small, batch, seeds, num_neighbors)


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_fanout_minus_one_is_pygs_full_neighbourhood(rand, hops):
    seeds = torch.tensor([3, 41, 17, 3 + 60])
    loader = NodeLoader(rand, node_sampler=PygSampler(rand, [-1] * hops), input_nodes=seeds, batch_size=4)
    batch = next(iter(loader))
    n_id, edge_index, e_id, counts, ecounts = pyglib_full_reference(rand, seeds, hops)
    assert torch.equal(batch.n_id, n_id) and torch.equal(batch.edge_index, edge_index)
    assert torch.equal(batch.e_id, e_id)
    assert batch.num_sampled_nodes == counts and batch.num_sampled_edges == ecounts
    check_layout(rand, batch, seeds, [-1] * hops)
    # and PyG's own k-hop utility agrees on the node set and on the edges into the inner hops
    subset, _, _, _ = k_hop_subgraph(seeds, hops, rand.edge_index, num_nodes=rand.num_nodes)
    assert torch.equal(torch.sort(batch.n_id).values, subset)
    inner, _, _, _ = k_hop_subgraph(seeds, hops - 1, rand.edge_index, num_nodes=rand.num_nodes)
    into_inner = torch.isin(rand.edge_index[1], inner).nonzero().view(-1)
    assert torch.equal(torch.sort(batch.e_id).values, into_inner)


def test_same_seed_same_batches_and_no_global_rng(rand):
    def run(seed, global_seed):
        torch.manual_seed(global_seed)
        s = PygSampler(rand, [3, 2], seed=seed)
        ll = LinkLoader(rand, link_sampler=s, edge_label_index=rand.edge_index[:, :40],
                        neg_sampling=NegativeSampling("binary"), batch_size=16)
        return [(b.n_id, b.edge_index, b.edge_label_index) for b in ll]

    a, b, c = run(5, 0), run(5, 123), run(6, 0)
    assert all(torch.equal(x, y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))
    assert not all(torch.equal(p[0], q[0]) for p, q in zip(a, c, strict=True))


# ----------------------------------------------------------------------------------------------- links
def test_link_loader_binary_negatives(rand):
    pos = rand.edge_index[:, 10:30]
    ll = LinkLoader(rand, link_sampler=PygSampler(rand, [3, 2], seed=1), edge_label_index=pos,
                    neg_sampling=NegativeSampling("binary", amount=2), batch_size=8)
    batches = list(ll)
    assert [b.input_id.numel() for b in batches] == [8, 8, 4]
    for b in batches:
        p = b.input_id.numel()
        assert b.edge_label_index.shape == (2, 3 * p)
        assert torch.equal(b.edge_label, torch.cat([torch.ones(p), torch.zeros(2 * p)]))
        glob = b.n_id[b.edge_label_index]
        assert torch.equal(glob[:, :p], pos[:, b.input_id])
        seeds = torch.unique(glob)  # the seeds are the sorted unique endpoints, as in PyG
        assert torch.equal(b.n_id[: seeds.numel()], seeds)
        check_layout(rand, b, seeds, [3, 2])


def test_link_loader_triplet_negatives_and_labels(rand):
    pos = rand.edge_index[:, :12]
    ll = LinkLoader(rand, link_sampler=PygSampler(rand, [2], seed=2), edge_label_index=pos,
                    neg_sampling=NegativeSampling("triplet", amount=3), batch_size=6)
    for b in ll:
        assert b.src_index.shape == (6,) and b.dst_pos_index.shape == (6,) and b.dst_neg_index.shape == (6, 3)
        assert torch.equal(b.n_id[b.src_index], pos[0, b.input_id])
        assert torch.equal(b.n_id[b.dst_pos_index], pos[1, b.input_id])
    labelled = LinkLoader(rand, link_sampler=PygSampler(rand, [2]), edge_label_index=pos,
                          edge_label=torch.arange(12.0), batch_size=4)
    b = next(iter(labelled))
    assert torch.equal(b.edge_label, torch.arange(4.0))
    assert torch.equal(b.n_id[b.edge_label_index], pos[:, :4])


# ---------------------------------------------------------------------------------------------- errors
def test_bad_input_raises_naming_the_argument(small):
    with pytest.raises(ValueError, match="neither node nor edge types"):
        PygSampler(HeteroData(), [2])
    with pytest.raises(TypeError, match="data must be"):
        PygSampler(small.edge_index, [2])
    with pytest.raises(TypeError, match="num_neighbors"):
        PygSampler(small, 5)
    with pytest.raises(ValueError, match=r"num_neighbors\[1\]=-2"):
        PygSampler(small, [2, -2])
    with pytest.raises(TypeError, match="seed"):
        PygSampler(small, [2], seed=1.5)
    with pytest.raises(ValueError, match="weight_attr='w'"):
        PygSampler(small, [2], weight_attr="w")
    loader = NodeLoader(small, node_sampler=PygSampler(small, [2]), input_nodes=torch.tensor([0]),
                        input_time=torch.tensor([3]), batch_size=1)
    with pytest.raises(ValueError, match="has no time_attr"):
        next(iter(loader))


def test_import_samplers_imports_neither_pyg_nor_dgl():
    code = ("import sys, samplers; assert samplers.PygSampler and samplers.DglSampler; "
            "print(sorted(m for m in ('torch_geometric', 'dgl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------- Cora, GraphSAGE
def train_sage(data: Data, train_idx: torch.Tensor, num_neighbors: list[int], epochs: int) -> float:
    """Train PyG's GraphSAGE on ``train_idx`` in minibatches through NodeLoader + PygSampler (``[-1, -1]``:
    full neighbourhoods). Returns the test accuracy of full-graph inference."""
    from torch_geometric.nn import GraphSAGE

    torch.manual_seed(0)
    model = GraphSAGE(data.num_features, 64, num_layers=2, out_channels=int(data.y.max()) + 1, dropout=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    loader = NodeLoader(data, node_sampler=PygSampler(data, num_neighbors, seed=0), input_nodes=train_idx,
                        batch_size=35, shuffle=True, generator=torch.Generator().manual_seed(0))
    for _ in range(epochs):
        model.train()
        for b in loader:
            opt.zero_grad()
            out = model(b.x, b.edge_index)[: b.batch_size]
            torch.nn.functional.cross_entropy(out, b.y[: b.batch_size]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(data.x, data.edge_index).argmax(-1)
    return float((pred[data.test_mask] == data.y[data.test_mask]).float().mean())


MARGIN = 0.03  # sampled [10, 10] may trail full neighbourhoods by at most 3 points of test accuracy


@pytest.mark.slow
def test_graphsage_on_cora_through_node_loader_matches_full_neighbourhoods(data_root):
    from graphrl.datasets import load_planetoid

    cora = load_planetoid("cora", data_root)
    data = Data(x=cora.features, edge_index=coo(cora.graph), y=cora.labels, test_mask=cora.test_mask,
                num_nodes=cora.num_nodes)
    train_idx = cora.train_mask.nonzero().view(-1)
    t0 = time.perf_counter()
    full = train_sage(data, train_idx, [-1, -1], epochs=15)
    sampled = train_sage(data, train_idx, [10, 10], epochs=15)
    elapsed = time.perf_counter() - t0
    print(f"Cora GraphSAGE test accuracy, NodeLoader+PygSampler: [-1,-1] {full:.3f}, [10,10] {sampled:.3f} "
          f"({elapsed:.1f} s)")
    assert full >= 0.74
    assert sampled >= full - MARGIN


def _worker_graph() -> Data:
    gen = torch.Generator().manual_seed(3)
    return Data(edge_index=torch.randint(0, 500, (2, 3000), generator=gen), num_nodes=500)


def _same(a: list, b: list) -> bool:
    """Whether two (nested) lists of tensors are equal element by element."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def _link_negatives(data: Data, generator=None) -> list[list[torch.Tensor]]:
    """Global ids of the binary negatives of every batch, for two epochs of a 2-worker LinkLoader.

    Workers are forked explicitly: importing torchrl (another test file) sets the process's default start
    method to spawn."""
    loader = LinkLoader(data, link_sampler=PygSampler(data, [3], seed=0),
                        edge_label_index=data.edge_index[:, :256], batch_size=64,
                        neg_sampling=NegativeSampling("binary"), num_workers=2, generator=generator,
                        multiprocessing_context="fork")
    return [[b.n_id[b.edge_label_index[:, 64:]] for b in loader] for _ in range(2)]


def test_link_loader_workers_draw_distinct_negatives_per_worker_and_epoch():
    data = _worker_graph()
    epochs = _link_negatives(data)
    first, second = epochs
    assert len(first) == 4
    assert not torch.equal(first[0], first[1])  # batch 0 from worker 0, batch 1 from worker 1
    assert not _same(first, second)
    assert not torch.equal(first[0], second[0])
    fixed = [_link_negatives(data, torch.Generator().manual_seed(0)) for _ in range(2)]
    assert _same(*fixed)


def _node_batches(data: Data, generator=None) -> list[list[torch.Tensor]]:
    seeds = torch.arange(32).repeat(4)  # every batch the same seeds: only the draws can differ
    loader = NodeLoader(data, node_sampler=PygSampler(data, [3, 3], seed=0), input_nodes=seeds, batch_size=32,
                        num_workers=2, generator=generator, multiprocessing_context="fork")
    return [[b.n_id for b in loader] for _ in range(2)]


def test_node_loader_workers_differ_per_worker_and_epoch_and_follow_the_loader_generator():
    data = _worker_graph()
    first, second = _node_batches(data)
    assert not torch.equal(first[0], first[1])
    assert not torch.equal(first[0], second[0])
    a, b = (_node_batches(data, torch.Generator().manual_seed(0)) for _ in range(2))
    assert _same(a, b)


def test_bad_edge_index_shape_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"edge_index.*\(1, 3\)"):
        PygSampler(Data(edge_index=torch.tensor([[0, 1, 2]]), num_nodes=3), [2])


def test_samplers_pickle_without_their_lock():
    import pickle

    data = _worker_graph()
    pickle.loads(pickle.dumps(PygSampler(data, [3, 3], seed=0)))  # a spawned worker gets such a copy
    graph = CSCGraph.from_edges(data.edge_index[0], data.edge_index[1], num_nodes=data.num_nodes)
    inner = NeighborSampler(graph, [2], seed=1)
    again = pickle.loads(pickle.dumps(inner))
    seeds = torch.arange(16)
    torch.testing.assert_close(inner.sample(seeds)[0].indices, again.sample(seeds)[0].indices)

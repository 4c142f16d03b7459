"""The one dtype rule of ids (`samplers._checks.check_id_dtype`): a torch.uint8 tensor is refused wherever a
sampler or loader takes ids (torch indexing reads it as a mask, PyG as ids); other integer dtypes are ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from samplers import LaborSampler, LinkSampler, NeighborLoader, NeighborSampler
from samplers._checks import check_id_dtype, check_seeds, id_array
from samplers.hetero_graph import HeteroGraph

N = 40


@pytest.fixture(scope="module")
def graph() -> CSCGraph:
    rng = np.random.default_rng(3)
    src, dst = rng.integers(0, N, 300), rng.integers(0, N, 300)
    return CSCGraph.from_edges(torch.from_numpy(src), torch.from_numpy(dst), N)


REMEDY = r"seeds has dtype torch\.uint8.*pass seeds\.bool\(\) for a mask, or seeds\.long\(\) for ids"


def test_loader_refuses_a_uint8_mask_and_names_the_remedy(graph):
    mask = torch.zeros(N, dtype=torch.bool)
    mask[[2, 5, 7]] = True
    with pytest.raises(TypeError, match=REMEDY):
        NeighborLoader(graph, mask.to(torch.uint8), [2], batch_size=4, seed=0)
    assert NeighborLoader(graph, mask, [2], batch_size=4, seed=0).num_seeds == 3  # the bool mask: 3 seeds
    typed = HeteroGraph.from_edges({"n": N}, {("n", "to", "n"): (torch.arange(N), torch.arange(N).roll(1))})
    with pytest.raises(TypeError, match=r"seeds\['n'\] has dtype torch\.uint8.*seeds\['n'\]\.bool\(\)"):
        NeighborLoader(typed, {"n": mask.to(torch.uint8)}, [2], batch_size=4, seed=0)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64])
def test_other_integer_dtypes_are_ids(graph, dtype):
    ids = torch.tensor([0, 3, 9, 27])
    want = NeighborSampler(graph, [3, 2], seed=5).sample(ids)
    got = NeighborSampler(graph, [3, 2], seed=5).sample(ids.to(dtype))
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a.src_nodes, b.src_nodes) and torch.equal(a.edge_ids, b.edge_ids)
    loader = NeighborLoader(graph, ids.to(dtype), [2], batch_size=4, seed=0)
    assert loader.num_seeds == 4 and sorted(loader.seeds.tolist()) == [0, 3, 9, 27]
    assert check_seeds(ids.to(dtype), N).tolist() == [0, 3, 9, 27]


def test_samplers_and_helpers_refuse_uint8(graph):
    seeds = torch.tensor([1, 0, 1], dtype=torch.uint8)
    with pytest.raises(TypeError, match=REMEDY):
        NeighborSampler(graph, [2], seed=0).sample(seeds)
    with pytest.raises(TypeError, match=REMEDY):
        LaborSampler(graph, [2], seed=0).sample(seeds)
    with pytest.raises(TypeError, match=r"ids has dtype torch\.uint8"):
        id_array("ids", seeds)
    with pytest.raises(TypeError, match=r"x must be an integer tensor, got dtype torch\.float32"):
        check_id_dtype("x", torch.float32)
    check_id_dtype("x", torch.int8)  # passes
    # numpy's uint8 is refused too (train_mask.numpy().astype(np.uint8)): test_seed_dtypes_numpy.py
    with pytest.raises(TypeError, match=r"seeds has dtype numpy\.uint8"):
        check_seeds(np.array([1, 0, 1], dtype=np.uint8), N)


def test_link_sampler_refuses_uint8_pair_ids(graph):
    users, items = torch.arange(10), torch.arange(10, 20)
    link = LinkSampler(NeighborSampler(graph, [2], seed=0), users, items, batch_size=4, item_range=(10, 20),
                       seed=0)
    with pytest.raises(TypeError, match=r"pair_ids has dtype torch\.uint8"):
        link.sample(torch.tensor([0, 1], dtype=torch.uint8))
    assert link.sample(torch.tensor([0, 1], dtype=torch.int16)) is not None


def test_pyg_sampler_refuses_uint8_seeds():
    pytest.importorskip("torch_geometric", reason="torch_geometric not installed (install the 'pyg' extra)")
    from torch_geometric.data import Data

    from samplers import PygSampler

    data = Data(edge_index=torch.stack([torch.arange(N), torch.arange(N).roll(1)]), num_nodes=N)
    sampler = PygSampler(data, [2], seed=0)
    with pytest.raises(TypeError, match=REMEDY):
        sampler.sample_nodes(torch.tensor([1, 2], dtype=torch.uint8))
    out = sampler.sample_nodes(torch.tensor([1, 2], dtype=torch.int32))
    assert out.node[:2].tolist() == [1, 2]

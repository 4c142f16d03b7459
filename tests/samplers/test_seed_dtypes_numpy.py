"""numpy seeds follow the one dtype rule of ids (`samplers._checks.check_id_dtype`) at every entry point: a
numpy uint8 array is refused as a torch.uint8 tensor is (``train_mask.numpy().astype(np.uint8)`` gave Cora's
2,708 nodes as ids 0 and 1 instead of its 140 training nodes), bool masks (numpy's and torch's) give the
training nodes where masks are taken, and every other integer dtype gives the int64 ids' seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrl.graph import CSCGraph
from samplers import (
    DglSampler,
    HeteroLinkSampler,
    HeteroNeighborSampler,
    LaborSampler,
    LinkLoader,
    LinkSampler,
    NeighborLoader,
    NeighborSampler,
)
from samplers._checks import check_id_dtype, check_seeds, id_array, id_vector
from samplers.hetero_graph import HeteroGraph

N = 40


def numpy_uint8(name: str) -> str:
    """The refusal's message for a numpy uint8 ``name``: the argument, the dtype and both remedies."""
    n = name.replace("[", r"\[").replace("]", r"\]")
    return (rf"^{n} has dtype numpy\.uint8, read as a mask by torch indexing but as ids by PyG: pass "
            rf"{n}\.astype\(bool\) for a mask, or {n}\.astype\(numpy\.int64\) for ids$")


@pytest.fixture(scope="module")
def graph() -> CSCGraph:
    rng = np.random.default_rng(11)
    src, dst = rng.integers(0, N, 300), rng.integers(0, N, 300)
    return CSCGraph.from_edges(torch.from_numpy(src), torch.from_numpy(dst), N)


@pytest.fixture(scope="module")
def typed() -> HeteroGraph:
    ring = (torch.arange(N), torch.arange(N).roll(1))
    return HeteroGraph.from_edges({"u": N, "i": N}, {("u", "to", "i"): ring, ("i", "by", "u"): ring})


@pytest.fixture(scope="module")
def cora(data_root):
    from graphrl.datasets import load_planetoid

    return load_planetoid("cora", data_root)


MASK = np.zeros(N, dtype=bool)
MASK[[1, 4, 9, 30]] = True


def test_the_rule_refuses_numpy_uint8_naming_argument_and_dtype():
    with pytest.raises(TypeError, match=numpy_uint8("x")):
        check_id_dtype("x", np.uint8)
    with pytest.raises(TypeError, match=numpy_uint8("x")):
        check_id_dtype("x", np.dtype("uint8"))
    with pytest.raises(TypeError, match=r"^x must hold integers, got dtype float32$"):
        check_id_dtype("x", np.float32)
    with pytest.raises(TypeError, match=r"^x must hold integers, got dtype bool$"):
        check_id_dtype("x", np.bool_)
    for dtype in (np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64):
        check_id_dtype("x", dtype)  # passes
    ids = MASK.astype(np.uint8)
    for call in (lambda: check_seeds(ids, N), lambda: id_array("seeds", ids),
                 lambda: id_vector("seeds", ids)):
        with pytest.raises(TypeError, match=numpy_uint8("seeds")):
            call()


def test_samplers_refuse_numpy_uint8_seeds(graph, typed):
    ids = MASK.astype(np.uint8)
    with pytest.raises(TypeError, match=numpy_uint8("seeds")):
        NeighborSampler(graph, [3, 2], seed=0).sample(ids)
    with pytest.raises(TypeError, match=numpy_uint8("seeds")):
        LaborSampler(graph, [3, 2], seed=0).sample(ids)
    with pytest.raises(TypeError, match=numpy_uint8("seeds['i']")):
        HeteroNeighborSampler(typed, [2], seed=0).sample({"u": np.arange(3), "i": ids})
    with pytest.raises(TypeError, match=numpy_uint8("seeds['u']")):
        LaborSampler(typed, [2], seed=0).sample({"u": ids})
    with pytest.raises(TypeError, match=numpy_uint8("exclude_eids")):
        NeighborSampler(graph, [2], seed=0).sample(np.arange(3), exclude_eids=np.array([0, 1], np.uint8))


def test_loaders_refuse_numpy_uint8_seeds(graph, typed):
    ids = MASK.astype(np.uint8)
    with pytest.raises(TypeError, match=numpy_uint8("seeds")):
        NeighborLoader(graph, ids, [2], batch_size=4, seed=0)
    with pytest.raises(TypeError, match=numpy_uint8("seeds['u']")):
        NeighborLoader(typed, ("u", ids), [2], batch_size=4, seed=0)
    with pytest.raises(TypeError, match=numpy_uint8("seeds['i']")):  # dict seeds of several types
        NeighborLoader(typed, {"u": np.arange(3), "i": ids}, [2], batch_size=4, seed=0)


def test_link_samplers_and_loaders_refuse_numpy_uint8_pairs(graph, typed):
    users, items = np.arange(10), np.arange(10, 20)
    sampler = NeighborSampler(graph, [2], seed=0)
    for name, args in (("users", (users.astype(np.uint8), items)),
                       ("items", (users, items.astype(np.uint8)))):
        with pytest.raises(TypeError, match=numpy_uint8(name)):
            LinkSampler(sampler, *args, batch_size=4, item_range=(10, 20), seed=0)
    link = LinkSampler(sampler, users, items, batch_size=4, item_range=(10, 20), seed=0)
    with pytest.raises(TypeError, match=numpy_uint8("pair_ids")):
        link.sample(np.array([0, 1], dtype=np.uint8))
    with pytest.raises(TypeError, match=numpy_uint8("target_eids")):
        LinkSampler(sampler, users, items, batch_size=4, item_range=(10, 20), seed=0, exclude="self",
                    target_eids=np.arange(10, dtype=np.uint8))
    hetero = HeteroNeighborSampler(typed, [2], seed=0)
    with pytest.raises(TypeError, match=numpy_uint8("dst")):
        HeteroLinkSampler(hetero, ("u", "to", "i"), np.arange(5), np.arange(5, dtype=np.uint8), batch_size=2,
                          seed=0)
    loader = LinkLoader(link)  # the loader takes the link sampler's checked pairs; its batches as link's
    assert len(loader) == len(link) == 3


@pytest.mark.parametrize("mask", [torch.from_numpy(MASK), MASK], ids=["torch_bool", "numpy_bool"])
def test_bool_masks_are_masks_where_masks_are_taken(graph, typed, mask):
    loader = NeighborLoader(graph, mask, [2], batch_size=4, shuffle=False, seed=0)
    assert loader.seeds.tolist() == [1, 4, 9, 30]
    loader = NeighborLoader(typed, {"u": mask}, [2], batch_size=4, shuffle=False, seed=0)
    assert loader.seeds.tolist() == [1, 4, 9, 30]
    with pytest.raises(TypeError, match=r"^seeds must (be an integer tensor|hold integers), got dtype"):
        NeighborSampler(graph, [2], seed=0).sample(mask)  # a sampler's seeds are ids, never a mask


@pytest.mark.parametrize("mask_of", [lambda m: m, lambda m: m.numpy()], ids=["torch_bool", "numpy_bool"])
def test_cora_train_masks_give_the_140_training_nodes(cora, mask_of):
    mask = cora.train_mask
    assert mask.dtype == torch.bool
    want = torch.nonzero(mask).reshape(-1)
    assert want.numel() == 140
    loader = NeighborLoader(cora.graph, mask_of(mask), [5, 5], batch_size=64, shuffle=False, seed=0)
    assert torch.equal(torch.cat([b.seeds for b in loader]), want)
    with pytest.raises(TypeError, match=numpy_uint8("seeds")):
        NeighborLoader(cora.graph, mask.numpy().astype(np.uint8), [5, 5], batch_size=64, seed=0)


ID_DTYPES = [np.int16, np.int32, np.int64, np.uint16, np.uint32, torch.int16, torch.int32, torch.int64]
if hasattr(torch, "uint16"):
    ID_DTYPES += [torch.uint16, torch.uint32]


def as_ids(ids: np.ndarray, dtype):
    return torch.from_numpy(ids).to(dtype) if isinstance(dtype, torch.dtype) else ids.astype(dtype)


@pytest.mark.parametrize("dtype", ID_DTYPES, ids=str)
def test_other_integer_dtypes_give_the_int64_seeds(graph, typed, dtype):
    ids = np.array([0, 3, 9, 27, 39], dtype=np.int64)
    want = NeighborSampler(graph, [3, 2], seed=5).sample(ids)
    got = NeighborSampler(graph, [3, 2], seed=5).sample(as_ids(ids, dtype))
    for a, b in zip(want, got, strict=True):
        for name in ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    want_l = [b.seeds for b in NeighborLoader(graph, ids, [2], batch_size=2, shuffle=False, seed=0)]
    got_l = [b.seeds for b in NeighborLoader(graph, as_ids(ids, dtype), [2], batch_size=2, shuffle=False,
                                             seed=0)]
    assert len(got_l) == 3 and all(torch.equal(a, b) for a, b in zip(want_l, got_l, strict=True))
    assert all(b.dtype == torch.int64 for b in got_l)
    loader = NeighborLoader(typed, {"i": as_ids(ids, dtype)}, [2], batch_size=5, shuffle=False, seed=0)
    assert loader.seeds.tolist() == ids.tolist()
    users, items = np.arange(10), np.arange(10, 20)
    link = LinkSampler(NeighborSampler(graph, [2], seed=0), as_ids(users, dtype), as_ids(items, dtype),
                       batch_size=4, item_range=(10, 20), seed=0)
    batch = link.sample(as_ids(np.array([2, 7]), dtype))
    assert batch.users.tolist() == [2, 7] and batch.pos_items.tolist() == [12, 17]
    assert batch.pair_ids.tolist() == [2, 7]


def test_dgl_sampler_refuses_numpy_and_torch_uint8_indices(dgl):
    src, dst = torch.arange(N), torch.arange(N).roll(1)
    g = dgl.graph((src, dst), num_nodes=N)
    sampler = DglSampler([2], seed=0)
    for bad in (MASK.astype(np.uint8), torch.from_numpy(MASK.astype(np.uint8))):
        with pytest.raises(TypeError, match=r"^indices has dtype (numpy|torch)\.uint8"):
            sampler.sample(g, bad)
    _, out, _ = sampler.sample(g, np.array([1, 4], dtype=np.int32))
    assert out.tolist() == [1, 4]
    hg = dgl.heterograph({("u", "to", "i"): (src, dst), ("i", "by", "u"): (dst, src)})
    with pytest.raises(TypeError, match=numpy_uint8("indices['i']")):
        sampler.sample(hg, {"i": MASK.astype(np.uint8)})


def test_pyg_sampler_refuses_numpy_uint8_seeds():
    pytest.importorskip("torch_geometric", reason="torch_geometric not installed (install the 'pyg' extra)")
    from torch_geometric.data import Data

    from samplers import PygSampler

    data = Data(edge_index=torch.stack([torch.arange(N), torch.arange(N).roll(1)]), num_nodes=N)
    with pytest.raises(TypeError, match=numpy_uint8("seeds")):
        PygSampler(data, [2], seed=0).sample_nodes(np.array([1, 2], dtype=np.uint8))

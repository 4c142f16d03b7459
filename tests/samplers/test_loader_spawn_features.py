"""A loader with features goes to spawned DataLoader workers (its dataset holds it): each worker's batches
carry the rows of their input nodes, exactly, with and without ``memory=``. The store's pickled rows are
one shared copy it holds, so the handle torch's multiprocessing pickler sends stays valid until a worker
opens it (a copy made per pickle was freed first: the workers died, "DataLoader worker exited
unexpectedly")."""

from __future__ import annotations

import pickle

import pytest
import torch

from graphrl.datasets import load_planetoid
from graphrl.memory import MemoryManager
from samplers import NeighborLoader
from samplers.features import FeatureStore


class EpochDataset(torch.utils.data.Dataset):
    """Item i is one epoch of the worker's copy of the loader: (input nodes, input features) per batch."""

    def __init__(self, loader: NeighborLoader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(b.input_nodes.clone(), b.input_features.clone()) for b in self.loader]


@pytest.fixture(scope="module")
def cora(data_root):
    return load_planetoid("cora", data_root)


@pytest.mark.parametrize("managed", [False, True], ids=["memory=None", "memory=MemoryManager"])
def test_spawned_workers_gather_exact_features(cora, managed):
    mm = MemoryManager() if managed else None
    loader = NeighborLoader(cora.graph, torch.arange(140), [10, 5], batch_size=32, features=cora.features,
                            memory=mm, seed=0)
    try:
        dl = torch.utils.data.DataLoader(EpochDataset(loader), batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn", timeout=120)
        epochs = list(dl)
        assert len(epochs) == 4
        for epoch in epochs:
            assert len(epoch) == 5  # ceil(140 / 32)
            assert sum(int(nodes.numel()) for nodes, _ in epoch) > 140
            for nodes, feats in epoch:
                assert feats.dtype == cora.features.dtype
                assert torch.equal(feats, cora.features[nodes])  # a fresh gather of the same rows
        # the loader still works in the parent, and a second round of workers gets the same copy
        for b in loader:
            assert torch.equal(b.input_features, cora.features[b.input_nodes])
        assert len(list(dl)) == 4
    finally:
        loader.close()
        if mm is not None:
            mm.close()


def test_the_pickled_copy_is_made_once_and_dropped_by_close_and_refresh():
    x = torch.randn(40, 3)
    store = FeatureStore(x)
    a, b = pickle.dumps(store), pickle.dumps(store)
    assert a == b  # the same rows, one copy
    first = pickle.loads(a)
    assert torch.equal(first.gather(torch.arange(40)), x)
    old = x[:1].clone()
    x[0] = 7.0  # changed in place: the kept copy has the old rows until refresh_cache
    assert torch.equal(pickle.loads(pickle.dumps(store)).gather(torch.tensor([0])), old)
    store.refresh_cache()
    assert torch.equal(pickle.loads(pickle.dumps(store)).gather(torch.tensor([0])), torch.full((1, 3), 7.0))
    store.close()
    with pytest.raises(ValueError, match="closed"):
        pickle.dumps(store)

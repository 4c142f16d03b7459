"""FeatureStore pickles (mp.spawn arguments, DataLoader workers) as a new store over the same rows; a store
with a cache, or a closed one, is refused by name."""

from __future__ import annotations

import pickle

import pytest
import torch

from graphrl.graph import CSCGraph
from samplers.features import FeatureStore


def test_a_copy_gathers_the_same_rows_and_leaves_the_original_working():
    x = torch.randn(50, 4)
    store = FeatureStore(x, staging_slots=3)
    copy = pickle.loads(pickle.dumps(store))
    ids = torch.tensor([7, 0, 49, 7])
    assert torch.equal(copy.gather(ids), x[ids]) and torch.equal(store.gather(ids), x[ids])
    assert copy.device == store.device and copy.owner == store.owner and copy.row_shape == (4,)
    copy.close()
    assert torch.equal(store.gather(ids), x[ids])
    store.close()
    with pytest.raises(ValueError):
        pickle.dumps(store)


def test_a_store_with_a_cache_is_refused_by_name():
    graph = CSCGraph.from_edges(torch.arange(1, 20), torch.zeros(19, dtype=torch.int64), 20)
    with FeatureStore(torch.randn(20, 2), cache_rows=5, graph=graph) as store:
        with pytest.raises(TypeError, match="FeatureStore with a cache cannot be pickled"):
            pickle.dumps(store)

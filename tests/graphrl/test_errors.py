"""`graphrl.errors.GPUUnavailableError`: one type for "no GPU", catchable as RuntimeError and ValueError."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphrl
from graphrl import CSCGraph, GPUUnavailableError
from graphrl.errors import GPUUnavailableError as FromModule


def _graph() -> CSCGraph:
    return CSCGraph.from_edges(np.array([1, 2]), np.array([0, 0]), 3)


def test_one_type_exported_from_the_core():
    assert FromModule is GPUUnavailableError is graphrl.GPUUnavailableError
    assert "GPUUnavailableError" in graphrl.__all__
    assert issubclass(GPUUnavailableError, RuntimeError) and issubclass(GPUUnavailableError, ValueError)


@pytest.mark.parametrize("base", [RuntimeError, ValueError, GPUUnavailableError])
def test_existing_except_clauses_keep_catching_it(base):
    with pytest.raises(base, match="device='cuda'"):
        raise GPUUnavailableError("device='cuda' needs a GPU; use device='cpu'")
    try:
        raise GPUUnavailableError("x")
    except base as err:
        assert isinstance(err, GPUUnavailableError)


def _numba_gpu() -> bool:
    from numba import cuda

    return bool(cuda.is_available())


def test_samplers_raise_it_for_device_cuda_without_a_gpu():
    if _numba_gpu():
        pytest.skip("a CUDA device (or numba's simulator) is present")
    from samplers import HeteroGraph, HeteroNeighborSampler, NeighborSampler

    with pytest.raises(GPUUnavailableError, match=r"device='cuda' needs a CUDA GPU.*use device='cpu'"):
        NeighborSampler(_graph(), [2], device="cuda")
    hg = HeteroGraph.from_edges({"user": 3, "item": 2}, {("user", "clicks", "item"): ([0, 1, 2], [0, 0, 1])})
    with pytest.raises(GPUUnavailableError, match=r"device='cuda' needs a CUDA GPU.*use device='cpu'"):
        HeteroNeighborSampler(hg, [2], device="cuda")
    # the old types still catch it
    with pytest.raises(RuntimeError):
        NeighborSampler(_graph(), [2], device="cuda")


def test_feature_store_raises_it_for_device_cuda_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    from samplers import FeatureStore

    with pytest.raises(GPUUnavailableError, match=r"device='cuda' but CUDA is not available.*device='cpu'"):
        FeatureStore(torch.zeros(3, 2), device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):  # the old type still catches it
        FeatureStore(torch.zeros(3, 2), device="cuda")

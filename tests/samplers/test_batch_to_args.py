"""A batch's ``to`` takes a device: a dtype (first or second argument) raises TypeError naming the argument
and saying what to convert instead; a wrong type or an unknown device name is refused by name. On the same
device nothing is copied: the moved batch shares the staging view."""

from __future__ import annotations

import pytest
import torch

from graphrl.graph import CSCGraph
from samplers import NeighborLoader

N = 40


@pytest.fixture
def batch():
    src = torch.arange(N).repeat_interleave(2)
    dst = (src * 5 + torch.arange(2 * N) % 2 + 1) % N
    x = torch.randn(N, 3)
    loader = NeighborLoader(CSCGraph.from_edges(src.numpy(), dst.numpy(), N), torch.arange(N), [2],
                            batch_size=8, features=x, seed=0, prefetch=0)
    b = next(iter(loader))
    yield b
    loader.close()


@pytest.mark.parametrize("args", [(torch.float64,), ("cpu", torch.float64),
                                  (torch.device("cpu"), torch.half)])
def test_a_dtype_is_refused_by_name(batch, args):
    name = "device" if isinstance(args[0], torch.dtype) else "non_blocking"
    want = rf"to\(\) takes a device, got {name}=torch\.\w+: dtype conversion of a batch is not supported"
    with pytest.raises(TypeError, match=want + r"; convert batch\.input_features"):
        batch.to(*args)


def test_wrong_types_and_names_are_refused(batch):
    with pytest.raises(TypeError, match="non_blocking must be a bool, got int"):
        batch.to("cpu", 1)
    with pytest.raises(TypeError, match="device must be a str, int or torch.device, got float"):
        batch.to(1.5)
    with pytest.raises(ValueError, match="device='gpu7' is not a device"):
        batch.to("gpu7")


def test_the_same_device_shares_the_staging_view(batch):
    moved = batch.to("cpu")
    assert moved.input_features is batch.input_features  # not a copy
    assert torch.equal(moved.seeds, batch.seeds) and moved.ready is None

"""PygSampler names its ``weight_attr`` tensor when its weights are bad, at the build and after an in-place
write (the draw is rebuilt at the next batch)."""

from __future__ import annotations

import pytest
import torch

pyg = pytest.importorskip("torch_geometric")

from torch_geometric.data import Data  # noqa: E402
from torch_geometric.sampler import NodeSamplerInput  # noqa: E402

from samplers import PygSampler  # noqa: E402

EDGES = torch.tensor([[1, 2, 3, 0], [0, 0, 0, 3]])


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_weights_name_the_attribute(bad):
    w = torch.tensor([bad, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"data\['w'\] \(weight_attr='w'\): weights: 1 of 4"):
        PygSampler(Data(edge_index=EDGES, num_nodes=5, w=w), [2], weight_attr="w", seed=0)
    data = Data(edge_index=EDGES, num_nodes=5, w=torch.ones(4))
    sampler = PygSampler(data, [2], weight_attr="w", seed=0)
    seeds = NodeSamplerInput(input_id=None, node=torch.tensor([0]))
    assert sampler.sample_from_nodes(seeds).edge.numel() == 2
    data.w.copy_(w)
    with pytest.raises(ValueError, match=r"data\['w'\] \(weight_attr='w'\): weights: 1 of 4"):
        sampler.sample_from_nodes(seeds)
    data.w.fill_(1.0)  # fixed: the next batch draws again
    assert sampler.sample_from_nodes(seeds).edge.numel() == 2

"""Minibatch and full-graph data for GNN trainers: neighbour sampling into blocks, link sampling."""

from samplers.block import Block
from samplers.neighbor import NeighborSampler

__all__ = ["Block", "NeighborSampler"]

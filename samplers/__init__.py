"""Minibatch and full-graph data for GNN trainers: neighbour sampling into blocks, link sampling."""

from samplers.block import Block
from samplers.full_graph import FullGraph
from samplers.link import LinkBatch, LinkSampler, bipartite_reverse_eids
from samplers.neighbor import NeighborSampler

__all__ = ["Block", "FullGraph", "LinkBatch", "LinkSampler", "NeighborSampler", "bipartite_reverse_eids"]

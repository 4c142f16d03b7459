"""Minibatch and full-graph data for GNN trainers: neighbour sampling into blocks, link sampling."""

from samplers._checks import MAX_BATCH, MAX_FANOUT
from samplers.batches import (
    HeteroNodeBatch,
    LoadedHeteroLinkBatch,
    LoadedLinkBatch,
    MultiTypeNodeBatch,
    NodeBatch,
)
from samplers.block import Block, Blocks
from samplers.dgl_sampler import DglSampler  # imports dgl only when one is built
from samplers.distributed import DistFeatureStore, DistLaborSampler, DistNeighborSampler  # ray: when used
from samplers.features import FeatureStore
from samplers.full_graph import FullGraph
from samplers.hetero import HeteroBlock, HeteroGraph, HeteroNeighborSampler
from samplers.hetero_link import HeteroLinkBatch, HeteroLinkSampler
from samplers.interop import PygSubgraph
from samplers.labor import LaborSampler
from samplers.link import LinkBatch, LinkSampler, bipartite_reverse_eids
from samplers.loader import LinkLoader, NeighborLoader
from samplers.neighbor import NeighborSampler
from samplers.protocol import Sampler
from samplers.pyg_sampler import PygSampler  # imports torch_geometric only when one is built

__all__ = ["MAX_BATCH", "MAX_FANOUT", "Block", "Blocks", "DglSampler", "DistFeatureStore", "DistLaborSampler",
           "DistNeighborSampler", "FeatureStore", "FullGraph", "HeteroBlock", "HeteroGraph",
           "HeteroLinkBatch", "HeteroLinkSampler", "HeteroNeighborSampler", "HeteroNodeBatch", "LaborSampler",
           "LinkBatch", "LinkLoader", "LinkSampler", "LoadedHeteroLinkBatch", "LoadedLinkBatch",
           "MultiTypeNodeBatch", "NeighborLoader", "NeighborSampler", "NodeBatch", "PygSampler",
           "PygSubgraph", "Sampler", "bipartite_reverse_eids"]

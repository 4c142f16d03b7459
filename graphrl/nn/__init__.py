"""GNN layers and models that consume sampled blocks (MFGs) or run layer-wise over the full graph."""

from graphrl.nn.gcn import GCN, GraphConv
from graphrl.nn.lightgcn import LightGCN, block_propagate, block_weights
from graphrl.nn.spmm import csr_spmm

__all__ = ["GCN", "GraphConv", "LightGCN", "block_propagate", "block_weights", "csr_spmm"]

"""GNN layers and models that consume sampled blocks (MFGs) or run layer-wise over the full graph, and a
causal transformer Q-network for sequence replay."""

from graphrl.nn.gcn import GCN, GraphConv
from graphrl.nn.lightgcn import LightGCN, block_propagate, block_weights
from graphrl.nn.spmm import csr_spmm
from graphrl.nn.transformer_q import CausalBlock, TransformerQNetwork

__all__ = [
    "CausalBlock",
    "GCN",
    "GraphConv",
    "LightGCN",
    "TransformerQNetwork",
    "block_propagate",
    "block_weights",
    "csr_spmm",
]

"""GNN layers and models that consume sampled blocks (MFGs) or run layer-wise over the full graph, graph
filters for recommendation, and a causal transformer Q-network for sequence replay."""

from graphrl.nn.gcn import GCN, GraphConv
from graphrl.nn.graph_filter import GFCF
from graphrl.nn.host_linear import host_linear
from graphrl.nn.lightgcn import LightGCN, block_propagate, block_weights
from graphrl.nn.sage import GraphSAGE, SAGEConv
from graphrl.nn.spmm import csr_spmm
from graphrl.nn.sym_adjacency import SymNormAdjacency
from graphrl.nn.transformer_q import CausalBlock, TransformerQNetwork

__all__ = [
    "CausalBlock",
    "GCN",
    "GFCF",
    "GraphConv",
    "GraphSAGE",
    "LightGCN",
    "SAGEConv",
    "SymNormAdjacency",
    "TransformerQNetwork",
    "block_propagate",
    "block_weights",
    "csr_spmm",
    "host_linear",
]

"""LightGCN on sampled blocks (training) and layer by layer over the full graph (inference)."""

from __future__ import annotations

import torch
from torch import nn

from graphrl.graph import CSCGraph
from graphrl.nn.spmm import csr_spmm
from graphrl.nn.sym_adjacency import SymNormAdjacency
from samplers.block import Block
from samplers.neighbor import NeighborSampler

__all__ = ["LightGCN", "block_propagate", "block_weights"]


def block_weights(block: Block, deg_in: torch.Tensor, deg_out: torch.Tensor) -> torch.Tensor:
    """Weight of every sampled edge (u -> v) of a block in LightGCN's estimator.

    The weight is ``sqrt(d_v) / (k_v * sqrt(d_out(u)))`` (see `block_propagate`).

    Parameters
    ----------
    block : Block
    deg_in, deg_out : torch.Tensor, float, shape [N]
        Full-graph in- and out-degrees (clamped to >= 1).

    Returns
    -------
    torch.Tensor, dtype of ``deg_in``, shape [nnz], aligned with ``block.indices``.
    """
    d_v = deg_in[block.dst_nodes].clamp(min=1)
    k_v = block.in_degrees().to(d_v.dtype).clamp(min=1)
    scale_dst = d_v.rsqrt() * (d_v / k_v)  # == d_v^-1/2 exactly when k_v == d_v
    scale_src = deg_out[block.src_nodes].clamp(min=1).rsqrt()
    return torch.repeat_interleave(scale_dst, block.in_degrees()) * scale_src[block.indices]


def block_propagate(block: Block, h_src: torch.Tensor, deg_in: torch.Tensor,
                    deg_out: torch.Tensor) -> torch.Tensor:
    """One LightGCN propagation step over a block: an unbiased estimate of ``D^-1/2 A D^-1/2 h`` at its dst.

    For destination v with full-graph in-degree d_v and k_v sampled in-edges (u -> v)::

        out[v] = (d_v / k_v) * sum_{sampled u} h[u] / sqrt(d_out(u) * d_v)

    Drawing k_v of d_v in-edges uniformly without replacement includes each with probability
    k_v / d_v, so the sum is unbiased for LightGCN's full sum; with every in-edge (fanout -1) it is
    the exact propagation. Destinations with no sampled edge get zeros.

    Parameters
    ----------
    block : Block
        D destinations, S sources, nnz sampled edges.
    h_src : torch.Tensor, float32 or float64, shape [S, d]
        Representations of the block's source nodes (row j belongs to ``block.src_nodes[j]``).
    deg_in, deg_out : torch.Tensor, float, shape [N]
        Full-graph in- and out-degree of every node (clamped to >= 1 where used).

    Returns
    -------
    torch.Tensor, dtype of ``h_src``, shape [D, d]
        Representations of the block's destinations; differentiable in ``h_src``.
    """
    w = block_weights(block, deg_in.to(h_src.dtype), deg_out.to(h_src.dtype))
    return csr_spmm(block.indptr, block.indices, w, h_src)


class LightGCN(nn.Module):
    """LightGCN: ID embeddings smoothed over the user-item graph, without weights or nonlinearities.

    The final representation of a node is the mean of its layer-0 (own embedding) to layer-L
    representations, where layer l+1 = ``D^-1/2 A D^-1/2`` layer l. In training, `forward` runs on
    sampled blocks (one block per layer, outermost first) and estimates each layer without bias
    (see `block_propagate`); `inference` computes the exact propagation for all nodes layer by layer.

    Parameters
    ----------
    num_nodes : int
        N, users and items together (users ``0..U-1``, items ``U..U+I-1``).
    num_layers : int
        L >= 1 propagation layers; `forward` wants exactly L blocks.
    deg_in, deg_out : torch.Tensor, integer or float, shape [N]
        Full-graph in- and out-degrees (equal for the symmetric user-item graph). Use `from_graph`.
    embedding_dim : int
        d, the embedding size (64 in the paper).
    init_std : float
        Standard deviation of the normal initialisation (0.1, as the authors' code).
    seed : int or None
        Seed of the initialisation's own generator; ``None`` uses torch's default generator.
    node_bias : bool
        Add a learned scalar per node, ``bias`` (float32 [N], zeros): a recommender scores
        ``s(u, i) + bias[i]``, the item's popularity term that a cosine score cannot express (the trainer
        uses it for items only; SimpleX and matrix factorisation with biases, Koren et al., IEEE Computer
        2009). ``None`` without.

    Raises
    ------
    ValueError
        ``num_nodes``, ``num_layers`` or ``embedding_dim`` < 1; degree vectors of the wrong shape.

    References
    ----------
    He, Deng, Wang, Li, Zhang and Wang, "LightGCN: Simplifying and Powering Graph Convolution Network
    for Recommendation" (SIGIR 2020). Sampled, rescaled propagation as in the node-wise estimators of
    GraphSAGE (Hamilton et al., NeurIPS 2017) and VR-GCN (Chen et al., ICML 2018); layer-wise full-graph
    inference as in DGL's GraphSAGE example.

    Examples
    --------
    >>> model = LightGCN.from_graph(graph, num_layers=2, embedding_dim=64)
    >>> blocks = NeighborSampler(graph, [10, 10], seed=0).sample(seeds)
    >>> out, emb0 = model(blocks, return_embeddings=True)   # [len(seeds), 64] each
    >>> all_nodes = model.inference(graph)                  # [N, 64], exact
    """

    def __init__(self, num_nodes: int, num_layers: int, deg_in: torch.Tensor, deg_out: torch.Tensor,
                 embedding_dim: int = 64, init_std: float = 0.1, seed: int | None = None,
                 node_bias: bool = False) -> None:
        super().__init__()
        for name, value in (("num_nodes", num_nodes), ("num_layers", num_layers),
                            ("embedding_dim", embedding_dim)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name, deg in (("deg_in", deg_in), ("deg_out", deg_out)):
            if tuple(deg.shape) != (num_nodes,):
                raise ValueError(f"{name} must have shape [num_nodes={num_nodes}], got {tuple(deg.shape)}")
        self.num_nodes = int(num_nodes)
        self.num_layers = int(num_layers)
        self.embedding_dim = int(embedding_dim)
        # _weight skips nn.Embedding's own initialisation, which would draw from torch's global generator.
        self.embedding = nn.Embedding(self.num_nodes, self.embedding_dim,
                                      _weight=torch.empty(self.num_nodes, self.embedding_dim))
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        nn.init.normal_(self.embedding.weight, std=init_std, generator=gen)
        self.register_buffer("deg_in", deg_in.to(torch.float32), persistent=False)
        self.register_buffer("deg_out", deg_out.to(torch.float32), persistent=False)
        self.register_parameter("bias", nn.Parameter(torch.zeros(self.num_nodes)) if node_bias else None)

    @classmethod
    def from_graph(cls, graph: CSCGraph, num_layers: int, embedding_dim: int = 64,
                   init_std: float = 0.1, seed: int | None = None, node_bias: bool = False) -> LightGCN:
        """Build a model for ``graph``, taking its in- and out-degrees.

        Parameters
        ----------
        graph : CSCGraph
            The training graph (for a user-item graph: both directions, `CSCGraph.bipartite`).
        num_layers, embedding_dim, init_std, seed, node_bias
            As in the class.

        Returns
        -------
        LightGCN
        """
        deg_in = graph.in_degrees()
        deg_out = torch.bincount(graph.indices.to(torch.int64), minlength=graph.num_nodes)
        return cls(graph.num_nodes, num_layers, deg_in, deg_out, embedding_dim, init_std, seed, node_bias)

    def forward(self, blocks: list[Block], return_embeddings: bool = False):
        """Final representations of ``blocks[-1].dst_nodes`` from sampled blocks.

        Parameters
        ----------
        blocks : list[Block]
            ``num_layers`` blocks, outermost first (as `NeighborSampler.sample` returns them).
        return_embeddings : bool
            Also return the layer-0 embeddings of the seeds (for LightGCN's L2 regulariser).

        Returns
        -------
        torch.Tensor, float32, shape [S, d]
            Mean of layers 0..L of each seed. With ``return_embeddings``, a pair
            ``(final [S, d], layer0 [S, d])``.

        Raises
        ------
        ValueError
            ``len(blocks) != num_layers``.
        """
        if len(blocks) != self.num_layers:
            raise ValueError(f"blocks: the model has {self.num_layers} layers, got {len(blocks)} blocks")
        s = blocks[-1].num_dst_nodes
        weight = self.embedding.weight
        emb0 = torch.index_select(weight, 0, blocks[-1].dst_nodes)  # deterministic backward
        # The first layer reads the embedding table in place (global source ids), without a gather.
        first = blocks[0]
        w = block_weights(first, self.deg_in.to(weight.dtype), self.deg_out.to(weight.dtype))
        h = csr_spmm(first.indptr, first.src_nodes[first.indices], w, weight)
        total = emb0 + h[:s]
        for block in blocks[1:]:
            h = block_propagate(block, h, self.deg_in, self.deg_out)
            total = total + h[:s]
        out = total / (self.num_layers + 1)
        return (out, emb0) if return_embeddings else out

    def propagate(self, adj: SymNormAdjacency) -> torch.Tensor:
        """Exact LightGCN representations of all nodes over the full graph, differentiable.

        ``mean(e0, A~ e0, ..., A~^L e0)`` with ``A~ = D^-1/2 A D^-1/2`` of the training graph (LightGCN's
        own full-graph propagation, full degrees): L sparse products forward and L backward (the
        transposed products, the same matrix for the symmetric user-item graph).

        Parameters
        ----------
        adj : SymNormAdjacency
            Of the graph the model was built for (`SymNormAdjacency.from_graph`).

        Returns
        -------
        torch.Tensor, float32, shape [N, d]

        Raises
        ------
        ValueError
            ``adj`` has a different node count.
        """
        if adj.num_nodes != self.num_nodes:
            raise ValueError(f"adj has {adj.num_nodes} nodes, the model {self.num_nodes}")
        h = self.embedding.weight
        total = h
        for _ in range(self.num_layers):
            h = adj(h)
            total = total + h
        return total / (self.num_layers + 1)

    @torch.no_grad()
    def inference(self, graph: CSCGraph, batch_size: int = 16384) -> torch.Tensor:
        """Exact LightGCN representations of all nodes, computed layer by layer over node batches.

        Each layer visits the destinations in batches of ``batch_size``, takes *every* in-edge with a
        one-layer `NeighborSampler` (fanout -1) and propagates the previous layer's full table, as DGL's
        layer-wise inference does; memory is bounded by one batch's edges plus two [N, d] tables.

        Parameters
        ----------
        graph : CSCGraph
            The graph the model was built for.
        batch_size : int
            Destination nodes per step.

        Returns
        -------
        torch.Tensor, float32, shape [N, d]
            Mean of layers 0..L for every node.

        Raises
        ------
        ValueError
            The graph's node count differs from the model's, or ``batch_size`` < 1.
        """
        if graph.num_nodes != self.num_nodes:
            raise ValueError(f"graph has {graph.num_nodes} nodes, the model {self.num_nodes}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        sampler = NeighborSampler(graph, [-1], seed=0)
        h = self.embedding.weight.detach()
        total = h.clone()
        for _ in range(self.num_layers):
            nxt = torch.empty_like(h)
            for start in range(0, self.num_nodes, batch_size):
                seeds = torch.arange(start, min(start + batch_size, self.num_nodes), dtype=torch.int64)
                (block,) = sampler.sample(seeds)
                nxt[start:start + seeds.shape[0]] = block_propagate(block, h[block.src_nodes], self.deg_in,
                                                                    self.deg_out)
            h = nxt
            total += h
        return total / (self.num_layers + 1)

"""LightGCN's exact full-graph propagation: the symmetric-normalised adjacency as a differentiable operator.

`SymNormAdjacency` holds ``A~ = D^-1/2 A D^-1/2`` of a graph (no self-loops; D the full degrees, LightGCN's
normalisation) as a scipy CSR matrix and multiplies it with dense [N, d] tables under autograd. The
backward product is ``A~^T g``; for a symmetric graph (a user-item graph with both directions, as
`CSCGraph.bipartite` builds it) that is the same matrix, so forward and backward run the same kernel.

Usage::

    adj = SymNormAdjacency.from_graph(dataset.graph)
    h1 = adj(embedding.weight)          # [N, d], differentiable
    model.propagate(adj)                # LightGCN's mean-of-layers readout for all nodes

The products run in scipy's sparse kernels (one thread); on a tensor that is not on the CPU they run as a
torch sparse CSR product on its device.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from graphrl.graph import CSCGraph

__all__ = ["SymNormAdjacency"]


class _Product(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, adj):
        ctx.adj = adj
        return adj.multiply(h.detach())

    @staticmethod
    def backward(ctx, grad):
        return ctx.adj.multiply(grad.contiguous(), transpose=True), None


class SymNormAdjacency:
    """``D^-1/2 A D^-1/2`` of a graph, as a differentiable linear operator on [N, d] tables.

    Parameters
    ----------
    matrix : scipy.sparse.csr_matrix, float32, shape [N, N]
        The normalised adjacency (row v: v's in-edges). Use `from_graph`.

    Raises
    ------
    ValueError
        ``matrix`` is not square.

    References
    ----------
    He et al., "LightGCN" (SIGIR 2020), eq. 3: ``e^(k+1) = D^-1/2 A D^-1/2 e^(k)``; Kipf and Welling,
    "Semi-Supervised Classification with Graph Convolutional Networks" (ICLR 2017) for the normalisation.
    """

    def __init__(self, matrix: sp.csr_matrix) -> None:
        if matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"matrix must be square, got shape {matrix.shape}")
        self.matrix = sp.csr_matrix(matrix, dtype=np.float32)
        self.matrix.sort_indices()
        diff = self.matrix - self.matrix.T
        self.symmetric = bool(abs(diff).max() <= 1e-6) if diff.nnz else True
        self.transposed = self.matrix if self.symmetric else sp.csr_matrix(self.matrix.T)
        self._torch: dict[tuple[str, bool], torch.Tensor] = {}

    @classmethod
    def from_graph(cls, graph: CSCGraph) -> SymNormAdjacency:
        """Build ``D_in^-1/2 A D_out^-1/2`` of ``graph`` (edge u -> v is entry (v, u)); degree 0 rows stay 0.

        For the symmetric user-item graph both degrees are the node degrees, LightGCN's normalisation.

        Parameters
        ----------
        graph : CSCGraph
            Edge weights, if any, are ignored (LightGCN's adjacency is binary).

        Returns
        -------
        SymNormAdjacency
        """
        indptr = graph.indptr.numpy().astype(np.int64)
        indices = graph.indices.numpy().astype(np.int64)
        n = graph.num_nodes
        a = sp.csr_matrix((np.ones(indices.size, np.float32), indices, indptr), shape=(n, n))
        deg_in = np.diff(indptr).astype(np.float64)
        deg_out = np.bincount(indices, minlength=n).astype(np.float64)
        s_in = np.where(deg_in > 0, 1.0 / np.sqrt(np.maximum(deg_in, 1.0)), 0.0)
        s_out = np.where(deg_out > 0, 1.0 / np.sqrt(np.maximum(deg_out, 1.0)), 0.0)
        return cls(sp.diags(s_in) @ a @ sp.diags(s_out))

    @property
    def num_nodes(self) -> int:
        """N."""
        return int(self.matrix.shape[0])

    @property
    def nnz(self) -> int:
        """Stored entries of the matrix."""
        return int(self.matrix.nnz)

    def multiply(self, h: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        """``A~ h`` (or ``A~^T h``) without autograd.

        Parameters
        ----------
        h : torch.Tensor, float32 or float64, shape [N, d]
        transpose : bool

        Returns
        -------
        torch.Tensor, dtype and device of ``h``, shape [N, d]

        Raises
        ------
        ValueError
            ``h`` is not 2-D with N rows.
        """
        if h.dim() != 2 or h.shape[0] != self.num_nodes:
            raise ValueError(f"h must have shape [{self.num_nodes}, d], got {tuple(h.shape)}")
        mat = self.transposed if transpose else self.matrix
        if h.device.type != "cpu":
            key = (str(h.device), transpose)
            if key not in self._torch:
                coo = mat.tocoo()
                self._torch[key] = torch.sparse_coo_tensor(
                    np.vstack([coo.row, coo.col]), coo.data, size=mat.shape).to_sparse_csr().to(h.device)
            return torch.sparse.mm(self._torch[key].to(h.dtype), h)
        return torch.from_numpy(np.asarray(mat @ h.contiguous().numpy(), dtype=h.numpy().dtype))

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """``A~ h``, differentiable in ``h`` (the backward is ``A~^T grad``).

        Parameters
        ----------
        h : torch.Tensor, float32 or float64, shape [N, d]

        Returns
        -------
        torch.Tensor, dtype of ``h``, shape [N, d]
        """
        if h.dim() != 2 or h.shape[0] != self.num_nodes:
            raise ValueError(f"h must have shape [{self.num_nodes}, d], got {tuple(h.shape)}")
        return _Product.apply(h, self)

    def __repr__(self) -> str:
        return f"SymNormAdjacency(num_nodes={self.num_nodes}, nnz={self.nnz}, symmetric={self.symmetric})"

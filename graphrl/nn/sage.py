"""GraphSAGE with the mean aggregator over the full graph, propagating through `FullGraph`.

`SAGEConv` computes ``x W_self + mean_{u -> v} x_u W_neigh + b``; the mean over in-neighbours is
`FullGraph`'s ``normalization="left"`` without self-loops (``D_in^-1 A``), so build the graph
operator as ``FullGraph(graph, normalization="left", add_self_loops=False, ...)``. `GraphSAGE` stacks
them with ReLU and dropout as `graphrl.nn.gcn.GCN` does (same options: host vertex data with device
weights, per-layer keep/recompute). Matches DGL's ``SAGEConv(aggregator_type="mean")`` and PyG's
``SAGEConv`` (mean, ``root_weight=True``).

References
----------
Hamilton, Ying and Leskovec, "Inductive Representation Learning on Large Graphs", NeurIPS 2017.
"""

from __future__ import annotations

import torch
from torch import nn

from graphrl.nn.gcn import GCN, glorot_, linear
from samplers.full_graph import FullGraph

__all__ = ["GraphSAGE", "SAGEConv"]


class SAGEConv(nn.Module):
    """One GraphSAGE-mean layer: ``x W_self + (D_in^-1 A x) W_neigh + b``.

    Parameters
    ----------
    in_dim, out_dim : int
        Feature widths, >= 1.
    bias : bool
        Add a learnt bias (zeros at first).
    generator : torch.Generator or None
        Source of the Glorot initialisation.

    Raises
    ------
    ValueError
        A width < 1; in `forward`, a `FullGraph` that is not the in-neighbour mean.
    """

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if in_dim < 1 or out_dim < 1:
            raise ValueError(f"in_dim and out_dim must be >= 1, got {in_dim} and {out_dim}")
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        self.weight_self = nn.Parameter(glorot_(torch.empty(self.in_dim, self.out_dim), generator))
        self.weight_neigh = nn.Parameter(glorot_(torch.empty(self.in_dim, self.out_dim), generator))
        self.bias = nn.Parameter(torch.zeros(self.out_dim)) if bias else None

    def forward(self, fg: FullGraph, x: torch.Tensor) -> torch.Tensor:
        """``x W_self + mean_neighbours(x) W_neigh + b``.

        Parameters
        ----------
        fg : FullGraph
            N nodes, ``normalization="left"``, ``add_self_loops=False``.
        x : torch.Tensor, float32, shape [N, in_dim], dense or sparse COO

        Returns
        -------
        torch.Tensor, float32, shape [N, out_dim], on ``x``'s device
        """
        if fg.normalization != "left" or fg.add_self_loops:
            raise ValueError("SAGEConv needs the in-neighbour mean: FullGraph(graph, normalization='left', "
                             f"add_self_loops=False), got normalization={fg.normalization!r}, "
                             f"add_self_loops={fg.add_self_loops}")
        if self.in_dim > self.out_dim:  # aggregate at the narrower width
            neigh = fg.propagate(linear(x, self.weight_neigh))
        else:
            neigh = linear(fg.propagate(x.to_dense() if x.is_sparse else x), self.weight_neigh)
        return linear(x, self.weight_self, self.bias) + neigh

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, bias={self.bias is not None}"


class GraphSAGE(GCN):
    """A multi-layer GraphSAGE-mean model: `SAGEConv` layers, ReLU between, dropout before each.

    Parameters are those of `graphrl.nn.gcn.GCN` (``in_dim``, ``hidden``, ``out_dim``, ``layers``,
    ``dropout``, ``bias``, ``seed``, ``recompute``); ``forward(fg, x)`` needs ``fg`` built with
    ``normalization="left", add_self_loops=False``.

    Raises
    ------
    ValueError
        As `GCN`.

    References
    ----------
    Hamilton et al., NeurIPS 2017; DGL's ``examples/pytorch/graphsage`` (full-graph training).
    """

    def __init__(self, in_dim: int, hidden: int = 16, *, out_dim: int, layers: int = 2, dropout: float = 0.5,
                 bias: bool = True, seed: int | None = None, recompute: str = "auto") -> None:
        super().__init__(in_dim, hidden, out_dim=out_dim, layers=layers, dropout=dropout, bias=bias,
                         seed=seed, recompute=recompute)
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.convs = nn.ModuleList(SAGEConv(a, b, bias=bias, generator=self.generator)
                                   for a, b in zip(dims[:-1], dims[1:], strict=True))

"""Kipf and Welling's graph convolutional network over the full graph, propagating through `FullGraph`.

`GraphConv` is one layer, `GCN` the model (`graphrl.nn.sage` builds GraphSAGE-mean on the same model).
Vertex data may stay on the host while the weights sit on a GPU (``model.to("cuda")`` with a staged
`FullGraph`, HongTu's setting): the dense products then stream row chunks through the weights' device
(`graphrl.nn.host_linear`), and each layer keeps its activations on the host or recomputes them in
the backward pass, as the memory budget allows (`graphrl.nn.recompute`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from graphrl.nn.host_linear import host_linear
from graphrl.nn.recompute import intermediate_plan, run_layer
from graphrl.nn.spmm import csr_spmm
from samplers.full_graph import FullGraph

__all__ = ["GCN", "GraphConv", "glorot_", "linear"]


def glorot_(weight: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Fill ``weight`` [fan_in, fan_out] in place from U(-a, a), ``a = sqrt(6 / (fan_in + fan_out))``.

    Glorot and Bengio's uniform initialisation, as in Kipf and Welling's ``glorot`` (and PyG's).

    Returns
    -------
    torch.Tensor
        ``weight``.
    """
    fan_in, fan_out = weight.shape[0], weight.shape[-1]
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        weight.uniform_(-bound, bound, generator=generator)
    return weight


def _dropout(x: torch.Tensor, p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Inverted dropout; on a sparse COO ``x`` only the stored values are dropped (Kipf's sparse_dropout)."""
    if p <= 0.0:
        return x
    if x.is_sparse:
        x = x.coalesce()
        values = x.values()
        keep = torch.rand(values.shape, generator=generator, dtype=values.dtype) >= p
        return torch.sparse_coo_tensor(x.indices(), values * keep / (1.0 - p), x.shape, is_coalesced=True,
                                       check_invariants=False)
    keep = torch.rand(x.shape, generator=generator, dtype=x.dtype) >= p
    return x * keep / (1.0 - p)


def _matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight``; a sparse COO ``x`` goes through the numba CSR kernel (faster than torch's)."""
    if not x.is_sparse:
        return x @ weight
    x = x.coalesce()
    rows, cols = x.indices()
    indptr = torch.zeros(x.shape[0] + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(rows, minlength=x.shape[0]), 0, out=indptr[1:])
    return csr_spmm(indptr, cols, x.values(), weight)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight (+ bias)`` on ``x``'s device: host rows stream through a device ``weight`` in chunks.

    Parameters
    ----------
    x : torch.Tensor, float32, shape [N, F], dense or sparse COO
    weight : torch.Tensor, float32, shape [F, C]; bias : torch.Tensor, shape [C], or None

    Returns
    -------
    torch.Tensor, float32, shape [N, C], on ``x``'s device
    """
    if weight.device != x.device:
        return host_linear(x, weight, bias)
    out = _matmul(x, weight)
    return out if bias is None else out + bias


class GraphConv(nn.Module):
    """One GCN layer: ``P @ (x W) + b`` with P the normalised adjacency of a `FullGraph`.

    Multiplies by W before propagating when that narrows the features (``in_dim > out_dim``), else
    after (as DGL's ``GraphConv``): the propagation is the costly part and runs at the smaller width.

    Parameters
    ----------
    in_dim, out_dim : int
        Feature widths, >= 1.
    bias : bool
        Add a learnt bias (zeros at first).
    generator : torch.Generator or None
        Source of the Glorot initialisation (None: torch's global generator).

    Raises
    ------
    ValueError
        A width < 1.
    """

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if in_dim < 1 or out_dim < 1:
            raise ValueError(f"in_dim and out_dim must be >= 1, got {in_dim} and {out_dim}")
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        self.weight = nn.Parameter(glorot_(torch.empty(self.in_dim, self.out_dim), generator))
        self.bias = nn.Parameter(torch.zeros(self.out_dim)) if bias else None

    def forward(self, fg: FullGraph, x: torch.Tensor) -> torch.Tensor:
        """``P @ x @ W + b``.

        Parameters
        ----------
        fg : FullGraph
            N nodes.
        x : torch.Tensor, float, shape [N, in_dim], dense or sparse COO

        Returns
        -------
        torch.Tensor, shape [N, out_dim]
        """
        if self.weight.device != x.device or fg.staged:  # host vertex data, device weights
            t = fg.transfers  # the staged path's counted, pinned copies (the device may be host memory)
            t = t if t is not None and torch.device(t.device) == self.weight.device else None
            if self.in_dim > self.out_dim:
                out = fg.propagate(host_linear(x, self.weight, transfers=t))
                return out.add_(self.bias.to(out.device)) if self.bias is not None else out
            return host_linear(fg.propagate(x.to_dense() if x.is_sparse else x), self.weight, self.bias,
                               transfers=t)
        if self.in_dim > self.out_dim:
            out = fg.propagate(_matmul(x, self.weight))  # a fresh tensor that nothing saved: add in place
            return out.add_(self.bias) if self.bias is not None else out
        h = fg.propagate(x.to_dense() if x.is_sparse else x)
        return torch.addmm(self.bias, h, self.weight) if self.bias is not None else h @ self.weight

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, bias={self.bias is not None}"


class GCN(nn.Module):
    """A multi-layer GCN: ``layers`` `GraphConv` layers, ReLU between them, dropout before each.

    ``forward(fg, x)`` returns the logits ``P relu(... relu(P x W1 + b1) ...) W_L + b_L``; in training
    mode, dropout with probability ``dropout`` is applied to the input features and to every hidden
    representation (Kipf and Welling's model; the paper's Cora/CiteSeer setting is 2 layers, 16
    hidden units, dropout 0.5).

    Parameters
    ----------
    in_dim : int
        Input feature width F.
    hidden : int
        Hidden width (every hidden layer).
    out_dim : int
        Output width (the number of classes), keyword-only.
    layers : int
        Number of graph convolutions, >= 1.
    dropout : float
        Dropout probability in [0, 1).
    bias : bool
        Learnt biases (PyG's ``GCNConv`` default; Kipf and Welling's code has none).
    seed : int or None
        Seeds the Glorot initialisation and the dropout masks (a private `torch.Generator`); None
        draws from torch's global generator.
    recompute : {"auto", "keep", "recompute"}
        Per layer, keep the activations its backward pass needs on the host, or recompute them
        (`graphrl.nn.recompute`; ``"auto"`` decides by the vertex tier's free bytes).

    Raises
    ------
    ValueError
        ``layers < 1``, a width < 1, ``dropout`` outside [0, 1), or an unknown ``recompute``.

    References
    ----------
    Kipf and Welling, "Semi-Supervised Classification with Graph Convolutional Networks", ICLR 2017;
    PyG's ``examples/gcn.py``.

    Examples
    --------
    >>> model = GCN(1433, hidden=16, out_dim=7, layers=2, dropout=0.5, seed=0)   # doctest: +SKIP
    >>> logits = model(fg, features)                                            # doctest: +SKIP
    """

    def __init__(self, in_dim: int, hidden: int = 16, *, out_dim: int, layers: int = 2, dropout: float = 0.5,
                 bias: bool = True, seed: int | None = None, recompute: str = "auto") -> None:
        super().__init__()
        if recompute not in ("auto", "keep", "recompute"):
            raise ValueError(f"recompute must be 'auto', 'keep' or 'recompute', got {recompute!r}")
        self.recompute = recompute
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.convs = nn.ModuleList(GraphConv(a, b, bias=bias, generator=self.generator)
                                   for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.dropout = float(dropout)

    def forward(self, fg: FullGraph, x: torch.Tensor) -> torch.Tensor:
        """Logits of every node.

        Parameters
        ----------
        fg : FullGraph
            N nodes.
        x : torch.Tensor, float32, shape [N, in_dim]
            Dense, or sparse COO (bag-of-words features: dropout then touches only the stored values,
            as Kipf and Welling's ``sparse_dropout``, and the first product is sparse).

        Returns
        -------
        torch.Tensor, float32, shape [N, out_dim]
        """
        h = x
        widths = [conv.out_dim for conv in self.convs]
        choices = (intermediate_plan(fg, widths, self.recompute) if self.training and torch.is_grad_enabled()
                   else ["keep"] * len(widths))
        for i, conv in enumerate(self.convs):
            if self.training:
                h = _dropout(h, self.dropout, self.generator)  # outside the recomputed part: drawn once
            h = run_layer(_conv_relu, choices[i], conv, fg, h, i + 1 < len(self.convs))
        return h


def _conv_relu(conv: nn.Module, fg: FullGraph, h: torch.Tensor, relu: bool) -> torch.Tensor:
    out = conv(fg, h)
    return torch.relu_(out) if relu else out  # in place: the layer's output is fresh and unsaved

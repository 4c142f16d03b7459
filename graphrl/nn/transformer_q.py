"""A small causal transformer Q-network over windows of observations, for sequence replay.

The network reads a window ``[B, L, obs_dim]`` of consecutive observations of one episode and returns
Q-values ``[B, L, num_actions]``; the output at step t depends only on steps 0..t of the window
(causal self-attention), so one forward pass gives every step's Q-values, as the learner needs for
TD targets over a sampled window, and an actor acting at step t feeds the last few observations and
reads the output at the last real position.

References
----------
Vaswani et al., "Attention Is All You Need", NeurIPS 2017 (pre-norm blocks as in GPT-2);
Kapturowski et al., "Recurrent Experience Replay in Distributed Reinforcement Learning" (R2D2),
ICLR 2019: Q-networks with memory trained on replayed sequences; Parisotto et al., "Stabilizing
Transformers for Reinforcement Learning", ICML 2020.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CausalBlock", "TransformerQNetwork"]


class CausalBlock(nn.Module):
    """One transformer block: causal multi-head self-attention, then a GELU MLP, each residual.

    Parameters
    ----------
    d_model : int
        Width of the residual stream.
    num_heads : int
        Attention heads; must divide ``d_model``.
    d_ff : int
        Hidden width of the MLP.
    layer_norm : bool
        Pre-norm (LayerNorm before attention and MLP, as GPT-2) or none (identity).

    Raises
    ------
    ValueError
        ``num_heads`` does not divide ``d_model``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, layer_norm: bool = False) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        self.num_heads = num_heads
        self.ln1 = nn.LayerNorm(d_model) if layer_norm else nn.Identity()
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model) if layer_norm else nn.Identity()
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the block.

        Parameters
        ----------
        x : torch.Tensor, float32, shape [B, L, d_model]
        attn_mask : torch.Tensor, bool, shape [B, 1, L, L], optional
            True where query i may attend to key j (already causal); None: plain causal attention.

        Returns
        -------
        torch.Tensor, float32, shape [B, L, d_model]
        """
        b, length, d = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).view(b, length, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        if attn_mask is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, length, d))
        return x + self.mlp(self.ln2(x))


class TransformerQNetwork(nn.Module):
    """Q-values for every step of a window of observations, each from that step and the steps before it.

    Observations are embedded by a linear layer, a learned embedding of the position in the window is
    added, ``num_layers`` causal blocks follow, and a linear head gives one Q-value per action.

    There is no layer normalisation by default. LayerNorm makes a token's features nearly invariant
    to the scale of its embedding, and a 4-number CartPole state is embedded linearly, so the
    network loses how far the pole leans (``layer_norm=True`` learned CartPole far less reliably with
    DQN: docs/performance.md, "Trainers and benchmarks").

    Parameters
    ----------
    obs_dim : int
        Size of a (flat) observation.
    num_actions : int
        Discrete actions.
    window : int
        Longest window L the network accepts (positions 0..L-1 have embeddings).
    d_model : int
        Width (32-64 is plenty for CartPole).
    num_layers : int
        Transformer blocks.
    num_heads : int
        Attention heads per block.
    d_ff : int, optional
        MLP width; default ``2 * d_model``.
    layer_norm : bool
        Pre-norm blocks and a final LayerNorm (off by default: see above).
    seed : int, optional
        Seed of the initial weights (a private generator; global RNG state is not read).

    Raises
    ------
    ValueError
        A size below 1, or ``num_heads`` not dividing ``d_model``.

    References
    ----------
    R2D2 (Kapturowski et al., ICLR 2019) for Q-learning on replayed sequences; GPT-2-style pre-norm
    causal blocks (Radford et al., 2019).

    Examples
    --------
    >>> net = TransformerQNetwork(obs_dim=4, num_actions=2, window=16, seed=0)
    >>> net(torch.zeros(8, 16, 4)).shape
    torch.Size([8, 16, 2])
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        window: int,
        d_model: int = 64,
        num_layers: int = 1,
        num_heads: int = 2,
        d_ff: int | None = None,
        layer_norm: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("obs_dim", obs_dim), ("num_actions", num_actions), ("window", window),
                            ("d_model", d_model), ("num_layers", num_layers), ("num_heads", num_heads)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.obs_dim, self.num_actions, self.window = int(obs_dim), int(num_actions), int(window)
        self.embed = nn.Linear(obs_dim, d_model)
        self.pos = nn.Parameter(torch.zeros(window, d_model))
        self.blocks = nn.ModuleList(
            CausalBlock(d_model, num_heads, d_ff or 2 * d_model, layer_norm) for _ in range(num_layers)
        )
        self.ln_f = nn.LayerNorm(d_model) if layer_norm else nn.Identity()
        self.head = nn.Linear(d_model, num_actions)
        self._init(seed)

    @torch.no_grad()
    def _init(self, seed: int | None) -> None:
        gen = torch.Generator()
        if seed is None:
            gen.seed()  # a fresh nondeterministic seed for this generator only (global state untouched)
        else:
            gen.manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:  # LayerNorm gains
                p.fill_(1.0)
            elif name == "pos":
                p.normal_(0.0, 0.02, generator=gen)
            else:
                bound = 1.0 / math.sqrt(p.shape[1])
                p.uniform_(-bound, bound, generator=gen)

    def forward(self, obs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Q-values of every step of the windows.

        Parameters
        ----------
        obs : torch.Tensor, float32, shape [B, L, obs_dim] (L <= ``window``)
            Windows of observations; padding (zeros or anything) may follow the real steps (tail
            padding) without any mask, since no real step attends to a later one.
        mask : torch.Tensor, bool, shape [B, L], optional
            True for real steps. Needed only when padding precedes real steps (head padding): keys
            at padded positions are then hidden from every query (each position still sees itself,
            so padded rows stay finite; their outputs are meaningless).

        Returns
        -------
        torch.Tensor, float32, shape [B, L, num_actions]

        Raises
        ------
        ValueError
            A window longer than ``window`` or a wrong observation size.
        """
        if obs.dim() != 3 or obs.shape[2] != self.obs_dim or obs.shape[1] > self.window:
            raise ValueError(
                f"obs must have shape [B, L <= {self.window}, {self.obs_dim}], got {tuple(obs.shape)}"
            )
        length = obs.shape[1]
        x = self.embed(obs) + self.pos[:length]
        attn = None
        if mask is not None:
            causal = torch.ones(length, length, dtype=torch.bool, device=obs.device).tril()
            eye = torch.eye(length, dtype=torch.bool, device=obs.device)
            attn = (causal & mask[:, None, :]) | eye  # [B, L(query), L(key)]
            attn = attn[:, None]
        for block in self.blocks:
            x = block(x, attn)
        return self.head(self.ln_f(x))

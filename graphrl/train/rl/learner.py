"""The DQN learner: online and target networks, Adam, double-DQN n-step targets over replayed windows.

`DQNLearner.update` takes one sampled batch of windows (a `replay.Batch`, or a mapping with the same
fields) and returns `UpdateStats`: the loss and the windows' new priorities, which the caller writes
back with ``store.update_priorities``. The targets and the loss are those of
`graphrl.train.rl.targets`.

References
----------
Mnih et al., Nature 2015 (DQN, target network); van Hasselt et al., AAAI 2016 (Double DQN); Schaul et
al., ICLR 2016 (PER importance weights); Kapturowski et al., ICLR 2019 (R2D2: targets inside sequences).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphrl.train.rl.targets import dqn_loss, n_step_targets, window_priorities

__all__ = ["DQNLearner", "UpdateStats"]


@dataclass
class UpdateStats:
    """What one learner update did.

    Attributes
    ----------
    loss : float
    priorities : torch.Tensor, float64, shape [B]
        New priorities of the windows (`window_priorities`).
    td : torch.Tensor, float32, shape [B, L]
        TD errors (0 where no target).
    valid : torch.Tensor, bool, shape [B, L]
    mean_q : float
        Mean Q(s_t, a_t) over valid steps.
    """

    loss: float
    priorities: torch.Tensor
    td: torch.Tensor
    valid: torch.Tensor
    mean_q: float


class DQNLearner:
    """Double DQN with n-step targets over replayed windows, a target network and Adam.

    Parameters
    ----------
    network : torch.nn.Module
        Maps ``obs [B, L, obs_dim]`` to Q-values ``[B, L, num_actions]``, causally (step t sees steps
        <= t), e.g. `graphrl.nn.TransformerQNetwork`.
    lr : float
    gamma : float
    n_step : int
    target_update : int
        Updates between target-network copies.
    max_grad_norm : float
    priority_eta, priority_eps : float
        See `window_priorities`.

    Attributes
    ----------
    network, target : torch.nn.Module
    updates : int
        Updates done.

    References
    ----------
    DQN (Mnih et al., Nature 2015); Double DQN (van Hasselt et al., AAAI 2016); PER (Schaul et al.,
    ICLR 2016); R2D2 (Kapturowski et al., ICLR 2019).

    Examples
    --------
    >>> learner = DQNLearner(TransformerQNetwork(4, 2, window=8, seed=0))
    >>> with store.sample(32, window=8, pad="tail", beta=0.4) as batch:   # doctest: +SKIP
    ...     stats = learner.update(batch)
    ...     store.update_priorities(batch.keys, stats.priorities)
    """

    def __init__(
        self,
        network: nn.Module,
        lr: float = 1e-3,
        gamma: float = 0.99,
        n_step: int = 3,
        target_update: int = 100,
        max_grad_norm: float = 10.0,
        priority_eta: float = 0.9,
        priority_eps: float = 1e-3,
    ) -> None:
        self.network = network
        self.target = copy.deepcopy(network)
        for p in self.target.parameters():
            p.requires_grad_(False)
        self.optimizer = torch.optim.Adam(network.parameters(), lr=lr)
        self.gamma, self.n_step = float(gamma), int(n_step)
        self.target_update = int(target_update)
        self.max_grad_norm = float(max_grad_norm)
        self.priority_eta, self.priority_eps = float(priority_eta), float(priority_eps)
        self.updates = 0

    def targets(self, obs: torch.Tensor, q: torch.Tensor, reward: torch.Tensor, done: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Double-DQN n-step targets: ``V_t = Q_target(s_t, argmax_a Q_online(s_t, a))`` in `n_step_targets`.

        Parameters
        ----------
        obs : torch.Tensor, float32, shape [B, L, obs_dim]
        q : torch.Tensor, float32, shape [B, L, A]
            The online network's Q-values of ``obs``.
        reward, done, mask : torch.Tensor, shape [B, L]

        Returns
        -------
        target : torch.Tensor, float32, shape [B, L]
        valid : torch.Tensor, bool, shape [B, L]
        """
        with torch.no_grad():
            q_target = self.target(obs)
            best = q.detach().argmax(-1, keepdim=True)
            bootstrap = q_target.gather(-1, best).squeeze(-1)
            return n_step_targets(reward, done, mask, bootstrap, self.gamma, self.n_step)

    def update(self, batch: Any) -> UpdateStats:
        """One gradient step on a batch of windows.

        Parameters
        ----------
        batch : replay.Batch or mapping
            ``obs`` float32 [B, L, obs_dim], ``action`` int64 [B, L], ``reward`` float32 [B, L],
            ``done`` bool [B, L], with attributes ``mask`` bool [B, L] and ``weights`` float32 [B]
            (importance weights; a mapping may carry ``mask`` and ``weights`` as keys instead).

        Returns
        -------
        UpdateStats
        """
        mask = batch.mask if hasattr(batch, "mask") else batch["mask"]
        weights = batch.weights if hasattr(batch, "weights") else batch["weights"]
        obs, action = batch["obs"], batch["action"]
        q = self.network(obs)
        q_taken = q.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        target, valid = self.targets(obs, q, batch["reward"], batch["done"], mask)
        loss, td = dqn_loss(q_taken, target, valid, weights.float())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.network.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        if self.updates % self.target_update == 0:
            self.sync_target()
        priorities = window_priorities(td.abs(), valid, self.priority_eta, self.priority_eps)
        n_valid = int(valid.sum())
        mean_q = float(torch.where(valid, q_taken.detach(), 0.0).sum()) / max(n_valid, 1)
        return UpdateStats(float(loss.detach()), priorities, td, valid, mean_q)

    def set_learning_rate(self, lr: float) -> None:
        """Set the optimiser's learning rate (`run_rl` anneals it over the budget)."""
        for group in self.optimizer.param_groups:
            group["lr"] = float(lr)

    def sync_target(self) -> None:
        """Copy the online network's weights into the target network."""
        self.target.load_state_dict(self.network.state_dict())

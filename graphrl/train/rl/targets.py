"""What the DQN learner optimises: n-step TD targets inside replayed windows, window priorities, the loss.

`n_step_targets` gives every step of a batch of windows ``[B, L]`` its n-step target, cut at episode
ends and at the end of the window (R2D2's targets, computed inside each replayed sequence);
`window_priorities` a window's new priority, ``eta * max + (1 - eta) * mean`` of ``|TD|`` over its
valid steps, plus ``eps`` (R2D2); `dqn_loss` the importance-weighted Huber loss over the valid steps.
All three take and return torch tensors and hold no state.

References
----------
Sutton and Barto, "Reinforcement Learning: An Introduction" (2018), §7.1 (n-step returns); Mnih et
al., Nature 2015 (DQN's Huber loss); Schaul et al., "Prioritized Experience Replay", ICLR 2016;
Kapturowski et al., "Recurrent Experience Replay in Distributed Reinforcement Learning" (R2D2), ICLR 2019.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["dqn_loss", "n_step_targets", "window_priorities"]


def _shift(x: torch.Tensor, k: int, fill: float | bool) -> torch.Tensor:
    """``y[:, t] = x[:, t + k]`` where ``t + k < L``, else ``fill``."""
    if k == 0:
        return x
    out = torch.full_like(x, fill)
    if k < x.shape[1]:
        out[:, : x.shape[1] - k] = x[:, k:]
    return out


def n_step_targets(
    reward: torch.Tensor,
    done: torch.Tensor,
    mask: torch.Tensor,
    bootstrap: torch.Tensor,
    gamma: float,
    n: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """n-step TD targets for every step of a batch of windows, computed inside each window.

    For step t the target uses the longest horizon h <= n the window allows::

        y_t = sum_{j<h} gamma^j r_{t+j}                      if the episode terminates at t+h-1
        y_t = sum_{j<h} gamma^j r_{t+j} + gamma^h V_{t+h}    if step t+h is a real step of the window

    The sum stops at a terminal step; a horizon is shortened where the window ends or padding
    begins. Step t has no target (``valid`` False) when it is padding, or when its episode was cut
    (time limit, window end) right after it without terminating.

    Parameters
    ----------
    reward : torch.Tensor, float32, shape [B, L]
        r_t.
    done : torch.Tensor, bool, shape [B, L]
        The episode terminated after step t (no bootstrap past it).
    mask : torch.Tensor, bool, shape [B, L]
        True for real steps (padding may follow or precede them).
    bootstrap : torch.Tensor, float32, shape [B, L]
        V_t, the value of state s_t (e.g. ``Q_target(s_t, argmax_a Q_online(s_t, a))``).
    gamma : float
        Discount in [0, 1].
    n : int
        Largest horizon, >= 1.

    Returns
    -------
    target : torch.Tensor, float32, shape [B, L]
        y_t (0 where not valid).
    valid : torch.Tensor, bool, shape [B, L]

    Raises
    ------
    ValueError
        ``n < 1`` or mismatched shapes.

    References
    ----------
    Sutton and Barto, "Reinforcement Learning: An Introduction" (2018), §7.1 (n-step returns);
    R2D2 (Kapturowski et al., ICLR 2019): n-step double-Q targets inside replayed sequences.

    Examples
    --------
    One window of 3 steps, the episode terminating at the second, n = 2, gamma = 0.5::

        reward [[1, 2, 0]], done [[F, T, F]], mask [[T, T, F]]
        -> target [[1 + 0.5 * 2, 2, 0]], valid [[T, T, F]]
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not reward.shape == done.shape == mask.shape == bootstrap.shape or reward.dim() != 2:
        raise ValueError(
            f"reward, done, mask and bootstrap must share one [B, L] shape, got {tuple(reward.shape)}, "
            f"{tuple(done.shape)}, {tuple(mask.shape)}, {tuple(bootstrap.shape)}"
        )
    reward = reward.float()
    bootstrap = bootstrap.float()
    done = done.bool()
    mask = mask.bool()
    ret = torch.zeros_like(reward)
    target = torch.zeros_like(reward)
    valid = torch.zeros_like(mask)
    running = mask.clone()  # still summing rewards: steps t..t+k real, no terminal yet
    disc = 1.0
    for k in range(n):
        running &= _shift(mask, k, False)
        ret = ret + torch.where(running, disc * _shift(reward, k, 0.0), 0.0)
        disc *= gamma
        terminal = running & _shift(done, k, False)
        target = torch.where(terminal, ret, target)
        valid |= terminal
        running &= ~terminal
        boot = running & _shift(mask, k + 1, False)
        target = torch.where(boot, ret + disc * _shift(bootstrap, k + 1, 0.0), target)
        valid |= boot
    return target, valid


def window_priorities(td_abs: torch.Tensor, valid: torch.Tensor, eta: float = 0.9, eps: float = 1e-3
                      ) -> torch.Tensor:
    """New priority of each window: ``eta * max|TD| + (1 - eta) * mean|TD| + eps`` over its valid steps.

    Parameters
    ----------
    td_abs : torch.Tensor, float, shape [B, L]
        Absolute TD errors.
    valid : torch.Tensor, bool, shape [B, L]
        Steps with a target (others are ignored).
    eta : float
        1 gives ``max|TD| + eps``; 0 gives ``mean|TD| + eps``.
    eps : float
        Floor, >= 0 (a window without valid steps gets ``eps``).

    Returns
    -------
    torch.Tensor, float64, shape [B]

    References
    ----------
    R2D2 (Kapturowski et al., ICLR 2019), eta = 0.9; PER (Schaul et al., ICLR 2016), ``|delta| + eps``.
    """
    td = torch.where(valid, td_abs.double(), 0.0)
    count = valid.sum(1)
    mean = td.sum(1) / count.clamp(min=1)
    return eta * td.max(1).values + (1.0 - eta) * mean + eps


def dqn_loss(q_taken: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance-weighted Huber loss: ``sum_bt w_b * huber(q_bt - y_bt) * valid_bt / sum_bt valid_bt``.

    Parameters
    ----------
    q_taken : torch.Tensor, float32, shape [B, L]
        Q(s_t, a_t) of the online network (with gradient).
    target : torch.Tensor, float32, shape [B, L]
        TD targets (no gradient).
    valid : torch.Tensor, bool, shape [B, L]
    weights : torch.Tensor, float32, shape [B]
        Importance weights of the windows (``batch.weights``; ones for uniform replay).

    Returns
    -------
    loss : torch.Tensor, float32, scalar
    td : torch.Tensor, float32, shape [B, L]
        ``q_taken - target`` (detached; 0 where not valid).

    References
    ----------
    DQN (Mnih et al., Nature 2015): Huber loss on TD errors; PER (Schaul et al., ICLR 2016): the
    loss of a sample scaled by its importance weight ``(N * P) ** -beta / max w``.
    """
    td = torch.where(valid, q_taken - target, 0.0)
    per_step = F.smooth_l1_loss(td, torch.zeros_like(td), reduction="none")
    loss = (weights[:, None] * per_step).sum() / valid.sum().clamp(min=1)
    return loss, td.detach()

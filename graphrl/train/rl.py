"""Distributed DQN on replayed windows: actor processes, a prioritised replay store and a transformer learner.

The pieces, smallest first (each usable alone; `run_rl` wires them together, as ``graphrl demo --task
rl`` and ``examples/rl_cartpole_transformer.py`` do):

- `n_step_targets`: n-step TD targets over windows ``[B, L]`` with a padding mask, cut at episode ends
  and at the end of the window (R2D2's targets, computed inside each replayed sequence);
- `window_priorities`: a window's new priority from its TD errors, ``eta * max + (1 - eta) * mean`` of
  ``|TD|`` over its valid steps, plus ``eps`` (R2D2);
- `dqn_loss`: importance-weighted Huber loss over the valid steps of a batch;
- `DQNLearner`: online and target `graphrl.nn.TransformerQNetwork`, Adam, double-DQN bootstrap, target
  syncs; ``update(batch)`` returns the loss and the windows' new priorities;
- `SharedWeights`: the learner's flat parameter vector in a shared-memory region of the
  `graphrl.memory.MemoryManager`, with a version counter (a seqlock), which actors poll cheaply;
- `run_actor`: an actor process: gymnasium environments, epsilon-greedy on the latest weights,
  steps written through ``ReplayStore.attach(handle).writer()``;
- `run_rl`: the store (``Prioritized`` selector, ``SampleToInsertRatio`` limiter), the actors
  (multiprocessing, spawn) and the learner loop under a wall-clock budget.

A stored step t holds ``obs`` (s_t), ``action`` (a_t), ``reward`` (r_t) and ``done`` (the episode
terminated after a_t). A truncated episode (time limit) ends with ``done == False`` and no next step,
so its last step has no target and is left out of the loss rather than treated as terminal.

References
----------
Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015 (DQN, target
network); van Hasselt et al., "Deep Reinforcement Learning with Double Q-learning", AAAI 2016;
Schaul et al., "Prioritized Experience Replay", ICLR 2016 (proportional priorities, importance
weights); Horgan et al., "Distributed Prioritized Experience Replay" (Ape-X), ICLR 2018 (actors and
one learner around a replay table); Kapturowski et al., "Recurrent Experience Replay in Distributed
Reinforcement Learning" (R2D2), ICLR 2019 (sequence replay, n-step targets in the window, mixed
max/mean priorities); GEAR (Wang et al., ICML 2023) for the shared-memory trajectory store.
"""

from __future__ import annotations

import copy
import logging
import math
import multiprocessing as mp
import queue as queue_mod
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from graphrl.memory import MemoryManager, Region, RegionHandle
from graphrl.nn.transformer_q import TransformerQNetwork
from replay import Prioritized, ReplayStore, SampleToInsertRatio, TrajectorySpec

__all__ = [
    "DQNLearner",
    "RLConfig",
    "RLReport",
    "SharedWeights",
    "UpdateStats",
    "dqn_loss",
    "epsilon_at",
    "make_q_network",
    "moving_average",
    "n_step_targets",
    "run_actor",
    "run_rl",
    "trajectory_spec",
    "window_priorities",
]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------ config


@dataclass
class RLConfig:
    """Settings of a distributed DQN run (`run_rl`); the defaults learn CartPole-v1 in about two minutes.

    Attributes
    ----------
    env_id : str
        A gymnasium environment with a flat ``Box`` observation and a ``Discrete`` action space.
    minutes : float
        Wall-clock budget of the whole run (actor start-up included).
    num_actors : int
        Actor processes (spawned).
    envs_per_actor : int
        Environments each actor steps in lockstep (their Q-values come from one batched forward).
    window : int
        L: steps per replayed window (and the actors' context length).
    batch_size : int
        Windows per learner update.
    d_model, num_layers, num_heads : int
        Transformer size.
    lr, lr_end : float
        Adam learning rate, annealed linearly from ``lr`` to ``lr_end`` over the budget (late
        updates then refine rather than undo a good policy).
    gamma : float
        Discount (0.98: CartPole's failures are felt within ~50 steps, and smaller values steady DQN).
    n_step : int
        TD horizon inside a window.
    target_update : int
        Learner updates between copies of the online network into the target network.
    max_grad_norm : float
        Gradient clipping (L2 norm).
    samples_per_insert : float
        Replay ratio: sampled steps (real steps of the drawn windows) per inserted step.
    min_size : int
        Steps stored before the learner starts.
    error_buffer : float or None
        Rate-limiter slack in sampled steps; default ``samples_per_insert * min_size``.
    capacity_steps : int
        Replay capacity (steps), over ``num_shards`` shards.
    num_shards : int
    chunk_steps : int
        Rows of each actor writer's staging buffer: longer episodes are committed in parts.
    priority_exponent : float
        PER's alpha.
    beta_start, beta_end : float
        PER's importance-weight exponent, annealed linearly over the budget.
    priority_eta : float
        Mix of max and mean |TD| in a window's priority (R2D2: 0.9).
    priority_eps : float
        Added to every priority, so no window starves.
    eps_start, eps_end : float
        Epsilon-greedy exploration, annealed linearly over ``eps_steps`` environment steps (all actors).
    eps_steps : int
    refresh_episodes : int
        Actors load the latest weights every this many finished episodes (each actor counts its own).
    publish_every : int
        Learner updates between publications of the weights.
    avg_episodes : int
        Episodes in the moving average of the return.
    target_return : float or None
        Stop early once the moving average of ``avg_episodes`` returns reaches it (e.g. 195, the
        threshold at which CartPole-v0 counts as solved over 100 episodes).
    seed : int
    learner_threads : int
        torch threads of the learner (actors use one each).
    """

    env_id: str = "CartPole-v1"
    minutes: float = 2.0
    num_actors: int = 2
    envs_per_actor: int = 4
    window: int = 8
    batch_size: int = 32
    d_model: int = 64
    num_layers: int = 1
    num_heads: int = 2
    lr: float = 1e-3
    lr_end: float = 1e-4
    gamma: float = 0.98
    n_step: int = 3
    target_update: int = 100
    max_grad_norm: float = 10.0
    samples_per_insert: float = 16.0
    min_size: int = 1000
    error_buffer: float | None = None
    capacity_steps: int = 1_000_000
    num_shards: int = 2
    chunk_steps: int = 512
    priority_exponent: float = 0.6
    beta_start: float = 0.4
    beta_end: float = 1.0
    priority_eta: float = 0.9
    priority_eps: float = 1e-3
    eps_start: float = 1.0
    eps_end: float = 0.02
    eps_steps: int = 10_000
    refresh_episodes: int = 1
    publish_every: int = 10
    avg_episodes: int = 100
    target_return: float | None = None
    seed: int = 0
    learner_threads: int = 1

    def validate(self) -> None:
        """Check the settings.

        Raises
        ------
        ValueError
            A size below 1, a probability or discount outside [0, 1], a budget <= 0 (the message
            names the setting).
        """
        for name in ("num_actors", "envs_per_actor", "window", "batch_size", "d_model", "num_layers",
                     "num_heads", "n_step", "target_update", "min_size", "capacity_steps", "num_shards",
                     "refresh_episodes", "publish_every", "chunk_steps", "avg_episodes", "eps_steps",
                     "learner_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RLConfig.{name} must be an int >= 1, got {value!r}")
        for name in ("gamma", "eps_start", "eps_end", "priority_eta", "beta_start", "beta_end"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"RLConfig.{name} must be in [0, 1], got {value!r}")
        for name in ("minutes", "lr", "lr_end", "samples_per_insert", "max_grad_norm"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"RLConfig.{name} must be finite and > 0, got {value!r}")
        if self.priority_eps < 0 or self.priority_exponent < 0:
            raise ValueError("RLConfig.priority_eps and priority_exponent must be >= 0")
        if self.min_size > self.capacity_steps:
            raise ValueError(
                f"RLConfig.min_size={self.min_size} exceeds capacity_steps={self.capacity_steps}"
            )


def trajectory_spec(obs_dim: int) -> TrajectorySpec:
    """Fields of a step: ``obs`` float32 [obs_dim], ``action`` int64, ``reward`` float32, ``done`` bool."""
    return TrajectorySpec({"obs": ((obs_dim,), "float32"), "action": ((), "int64"),
                           "reward": ((), "float32"), "done": ((), "bool")})


def make_q_network(config: RLConfig, obs_dim: int, num_actions: int, seed: int | None = None
                   ) -> TransformerQNetwork:
    """The `TransformerQNetwork` of ``config`` (learner and actors build the same one)."""
    return TransformerQNetwork(obs_dim, num_actions, config.window, d_model=config.d_model,
                               num_layers=config.num_layers, num_heads=config.num_heads, seed=seed)


def epsilon_at(step: int, start: float, end: float, steps: int) -> float:
    """Linearly annealed exploration rate: ``start`` at step 0, ``end`` from ``steps`` on."""
    frac = min(max(step, 0) / max(steps, 1), 1.0)
    return start + frac * (end - start)


def moving_average(values: list[float] | np.ndarray, n: int) -> float:
    """Mean of the last ``n`` values (of all of them when fewer); NaN when there are none."""
    if len(values) == 0:
        return float("nan")
    return float(np.mean(np.asarray(values[-n:], dtype=np.float64)))


# ------------------------------------------------------------------------------------------ targets


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


# ------------------------------------------------------------------------------------------ learner


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


# ------------------------------------------------------------------------------------------ weights


@dataclass(frozen=True)
class SharedWeightsHandle:
    """Picklable names of a `SharedWeights` pair of regions."""

    params: RegionHandle
    version: RegionHandle


class SharedWeights:
    """A network's flat parameter vector in shared memory, with a version counter other processes poll.

    The learner `publish`-es (a seqlock: the version is odd while the vector is written); actors
    `pull` only when the version changed, and retry later if it changed during their copy, so they
    never load a torn vector. A pull costs one copy of the parameters (about 40 KB for the default
    CartPole network); no pickling, no queue.

    Parameters
    ----------
    params : graphrl.memory.Region
        float32 [P], shared tier.
    version : graphrl.memory.Region
        int64 [1], shared tier.

    Use `create` (learner) and `attach` (actors), not the constructor.

    Examples
    --------
    >>> weights = SharedWeights.create(mm, net); weights.publish(net)       # learner
    >>> theirs = SharedWeights.attach(weights.handle()); theirs.pull(net2)  # actor  # doctest: +SKIP
    True
    """

    def __init__(self, params: Region, version: Region) -> None:
        self._params, self._version = params, version
        self.params = params.tensor()
        self.version = version.numpy()
        self.seen = -1

    @classmethod
    def create(cls, memory: MemoryManager, network: nn.Module) -> SharedWeights:
        """Allocate the regions for ``network``'s parameters (version 0: nothing published yet).

        Raises
        ------
        graphrl.memory.MemoryBudgetError
            The shared tier's budget has no room.
        """
        count = sum(p.numel() for p in network.parameters())
        params = memory.allocate((count,), torch.float32, "shared", owner="train.rl.weights")
        version = memory.allocate((1,), torch.int64, "shared", owner="train.rl.weights")
        version.numpy()[0] = 0
        return cls(params, version)

    def handle(self) -> SharedWeightsHandle:
        """What `attach` needs in another process."""
        return SharedWeightsHandle(self._params.handle(), self._version.handle())

    @classmethod
    def attach(cls, handle: SharedWeightsHandle) -> SharedWeights:
        """Map the regions named by ``handle`` (from the learner's `handle`).

        Raises
        ------
        FileNotFoundError
            The learner has freed them.
        """
        return cls(Region.attach(handle.params), Region.attach(handle.version))

    def publish(self, network: nn.Module) -> int:
        """Write ``network``'s parameters; return the new (even) version.

        Raises
        ------
        ValueError
            The network's parameter count differs from the regions'.
        """
        flat = nn.utils.parameters_to_vector([p.detach() for p in network.parameters()])
        if flat.numel() != self.params.numel():
            raise ValueError(
                f"network has {flat.numel()} parameters, the shared vector {self.params.numel()}"
            )
        v = int(self.version[0])
        self.version[0] = v + 1
        self.params.copy_(flat)
        self.version[0] = v + 2
        return v + 2

    def pull(self, network: nn.Module) -> bool:
        """Load the latest published parameters into ``network`` if they changed; return whether it did."""
        v1 = int(self.version[0])
        if v1 == self.seen or v1 == 0 or v1 % 2:
            return False
        flat = self.params.clone()
        if int(self.version[0]) != v1:  # the learner wrote meanwhile: try again next time
            return False
        with torch.no_grad():
            nn.utils.vector_to_parameters(flat, network.parameters())
        self.seen = v1
        return True

    def close(self) -> None:
        """Free (learner) or unmap (actors) the regions."""
        for r in (self._params, self._version):
            if not r.freed:
                r.free()


# ------------------------------------------------------------------------------------------ actors


def _env_spaces(env_id: str) -> tuple[int, int]:
    import gymnasium as gym

    env = gym.make(env_id)
    try:
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(act_space, gym.spaces.Discrete) or len(obs_space.shape or ()) != 1:
            raise ValueError(
                f"env_id={env_id!r}: need a flat Box observation and Discrete actions, got "
                f"{obs_space} and {act_space}"
            )
        return int(obs_space.shape[0]), int(act_space.n)
    finally:
        env.close()


def run_actor(
    actor_id: int,
    store_handle: Any,
    weights_handle: SharedWeightsHandle,
    config: RLConfig,
    stop: Any,
    results: Any,
) -> None:
    """An actor process: step ``config.envs_per_actor`` environments epsilon-greedily, write their episodes.

    Each environment's current context (its last ``config.window`` observations, left-aligned) goes
    through one batched forward of the latest published network; step t's Q-values are read at the
    context's last real position. Every step is appended to that environment's writer; a finished
    episode is committed with ``end_episode`` and its return sent to ``results`` as
    ``("episode", actor_id, return, length)``. The weights are refreshed every
    ``config.refresh_episodes`` episodes. Returns when ``stop`` is set (or the store is closed); an
    error is sent as ``("error", actor_id, traceback_text)``.

    Parameters
    ----------
    actor_id : int
        0-based; seeds its environments and exploration.
    store_handle : replay.StoreHandle
        From ``store.handle()``.
    weights_handle : SharedWeightsHandle
    config : RLConfig
    stop : multiprocessing.Event
    results : multiprocessing.Queue
    """
    store = weights = None
    writers: list = []
    try:
        import gymnasium as gym

        torch.set_num_threads(1)
        store = ReplayStore.attach(store_handle)
        weights = SharedWeights.attach(weights_handle)
        num_envs, length = config.envs_per_actor, config.window
        envs = [gym.make(config.env_id) for _ in range(num_envs)]
        obs_dim = int(envs[0].observation_space.shape[0])
        num_actions = int(envs[0].action_space.n)
        net = make_q_network(config, obs_dim, num_actions)
        net.eval()
        while not weights.pull(net):  # the learner publishes before starting actors
            if stop.is_set():
                return
            time.sleep(0.01)
        writers = [store.writer(chunk_steps=config.chunk_steps) for _ in range(num_envs)]
        rng = np.random.default_rng([config.seed, actor_id])
        context = np.zeros((num_envs, length, obs_dim), dtype=np.float32)
        t = np.zeros(num_envs, dtype=np.int64)
        ep_return = np.zeros(num_envs)
        obs = []
        for i, env in enumerate(envs):
            o, _ = env.reset(seed=config.seed * 10_000 + actor_id * num_envs + i)
            env.action_space.seed(config.seed * 10_000 + actor_id * num_envs + i)
            obs.append(np.asarray(o, dtype=np.float32))
            context[i, 0] = obs[i]
        steps = episodes = 0
        rows = np.arange(num_envs)
        context_t = torch.from_numpy(context)
        while not stop.is_set():
            eps = epsilon_at(steps * config.num_actors, config.eps_start, config.eps_end, config.eps_steps)
            with torch.no_grad():
                q = net(context_t)[rows, np.minimum(t, length - 1)]
            greedy = q.argmax(-1).numpy()
            explore = rng.random(num_envs) < eps
            actions = np.where(explore, rng.integers(num_actions, size=num_envs), greedy)
            for i, env in enumerate(envs):
                a = int(actions[i])
                o, r, terminated, truncated, _ = env.step(a)
                writers[i].append({"obs": obs[i], "action": a, "reward": float(r), "done": bool(terminated)})
                ep_return[i] += r
                steps += 1
                obs[i] = np.asarray(o, dtype=np.float32)
                if terminated or truncated:
                    writers[i].end_episode()
                    results.put(("episode", actor_id, float(ep_return[i]), int(t[i]) + 1))
                    episodes += 1
                    if episodes % config.refresh_episodes == 0:
                        weights.pull(net)
                    o, _ = env.reset()
                    obs[i] = np.asarray(o, dtype=np.float32)
                    t[i], ep_return[i] = 0, 0.0
                    context[i] = 0.0
                    context[i, 0] = obs[i]
                else:
                    t[i] += 1
                    if t[i] < length:
                        context[i, t[i]] = obs[i]
                    else:
                        context[i, :-1] = context[i, 1:]
                        context[i, -1] = obs[i]
    except (ValueError, TimeoutError, FileNotFoundError) as err:
        if not stop.is_set():  # a closed store or a rate-limit timeout at shutdown is the normal way out
            results.put(("error", actor_id, traceback.format_exc()))
        else:
            log.debug("actor %d stopping: %s", actor_id, err)
    except BaseException:
        results.put(("error", actor_id, traceback.format_exc()))
    finally:
        for w in writers:
            w.close()
        if weights is not None:
            weights.close()
        if store is not None:
            store.close()


# ------------------------------------------------------------------------------------------ the run


@dataclass
class RLReport:
    """What `run_rl` did.

    Attributes
    ----------
    returns : list of float
        Return of every finished episode, in the order the learner received them.
    moving_average : float
        Mean return of the last ``config.avg_episodes`` episodes at the end (NaN with none).
    best_moving_average : float
        Its highest value during the run (over full windows of ``avg_episodes`` once there are that many).
    episodes : int
    env_steps : int
        Steps inserted into the store.
    updates : int
        Learner updates.
    windows_sampled : int
        Windows drawn (updates x batch size).
    seconds : float
        Wall time of the run (actor start-up included).
    learn_seconds : float
        Wall time from the first update to the end.
    stopped_by : str
        ``"time"`` or ``"target_return"``.
    losses : list of float
        Loss of every update.
    config : dict
        The settings.
    """

    returns: list[float]
    moving_average: float
    best_moving_average: float
    episodes: int
    env_steps: int
    updates: int
    windows_sampled: int
    seconds: float
    learn_seconds: float
    stopped_by: str
    losses: list[float] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    @property
    def inserted_steps_per_s(self) -> float:
        """Environment steps inserted per second of the run."""
        return self.env_steps / max(self.seconds, 1e-9)

    @property
    def windows_per_s(self) -> float:
        """Windows sampled per second of learning."""
        return self.windows_sampled / max(self.learn_seconds, 1e-9)


def run_rl(config: RLConfig | None = None, progress: bool = True) -> RLReport:
    """Train a transformer Q-network with distributed prioritised DQN for ``config.minutes``.

    Spawns ``config.num_actors`` `run_actor` processes writing to a shared-memory `replay.ReplayStore`
    (``Prioritized`` selector, ``SampleToInsertRatio`` rate limiter); the calling process is the
    learner: it samples windows (``pad="tail"``, importance exponent annealed from ``beta_start`` to
    ``beta_end``), updates a `DQNLearner`, writes back priorities and publishes the weights every
    ``publish_every`` updates. A tqdm bar shows the moving-average return.

    Parameters
    ----------
    config : RLConfig, optional
        Default ``RLConfig()`` (CartPole-v1, two actors, two minutes).
    progress : bool
        Show the progress bar.

    Returns
    -------
    RLReport

    Raises
    ------
    ValueError
        Bad settings, or an environment without flat observations and discrete actions.
    RuntimeError
        An actor failed (its traceback is in the message) or every actor exited early.

    References
    ----------
    Ape-X (Horgan et al., ICLR 2018) and R2D2 (Kapturowski et al., ICLR 2019): actors, one learner
    and a prioritised replay table; Reverb's rate limiters; GEAR (ICML 2023) for shared-memory
    trajectory storage.
    """
    config = RLConfig() if config is None else config
    config.validate()
    t_start = time.perf_counter()
    deadline = t_start + 60.0 * config.minutes
    obs_dim, num_actions = _env_spaces(config.env_id)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.learner_threads)
    net = make_q_network(config, obs_dim, num_actions, seed=config.seed)
    learner = DQNLearner(net, lr=config.lr, gamma=config.gamma, n_step=config.n_step,
                         target_update=config.target_update, max_grad_norm=config.max_grad_norm,
                         priority_eta=config.priority_eta, priority_eps=config.priority_eps)
    spi = config.samples_per_insert
    error_buffer = config.error_buffer if config.error_buffer is not None else max(
        spi * config.min_size, 2 * spi * config.batch_size * config.window)
    memory = MemoryManager()
    store = weights = None
    ctx = mp.get_context("spawn")
    procs: list = []
    results = ctx.Queue()
    stop = ctx.Event()
    returns: list[float] = []
    losses: list[float] = []
    best = float("-inf")
    stopped_by = "time"
    t_learn = None
    bar = None
    try:
        store = ReplayStore(
            trajectory_spec(obs_dim), capacity_steps=config.capacity_steps, num_shards=config.num_shards,
            selector=Prioritized(exponent=config.priority_exponent),
            rate_limiter=SampleToInsertRatio(spi, min_size=config.min_size, error_buffer=error_buffer),
            memory=memory, seed=config.seed, timeout=30.0,
        )
        weights = SharedWeights.create(memory, net)
        weights.publish(net)
        handle = store.handle()
        for i in range(config.num_actors):
            p = ctx.Process(target=run_actor, args=(i, handle, weights.handle(), config, stop, results),
                            name=f"graphrl-actor-{i}", daemon=True)
            p.start()
            procs.append(p)
        budget = 60.0 * config.minutes
        bar = tqdm(total=round(budget), unit="s", desc="rl", disable=not progress, leave=True,
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s{postfix}")

        def drain() -> None:
            nonlocal best
            while True:
                try:
                    msg = results.get_nowait()
                except queue_mod.Empty:
                    return
                if msg[0] == "error":
                    raise RuntimeError(f"actor {msg[1]} failed:\n{msg[2]}")
                returns.append(msg[2])
                if len(returns) >= min(config.avg_episodes, 10):
                    best = max(best, moving_average(returns, config.avg_episodes))

        last_bar = time.perf_counter()
        while time.perf_counter() < deadline:
            drain()
            if (config.target_return is not None and len(returns) >= config.avg_episodes
                    and moving_average(returns, config.avg_episodes) >= config.target_return):
                stopped_by = "target_return"
                break
            frac = min(1.0, (time.perf_counter() - t_start) / budget)
            beta = config.beta_start + frac * (config.beta_end - config.beta_start)
            learner.set_learning_rate(config.lr + frac * (config.lr_end - config.lr))
            try:
                batch = store.sample(config.batch_size, window=config.window, pad="tail",
                                     timeout=min(1.0, max(0.01, deadline - time.perf_counter())), beta=beta)
            except TimeoutError:
                if not any(p.is_alive() for p in procs):
                    drain()
                    raise RuntimeError("every actor process exited before the budget was spent") from None
                continue
            if t_learn is None:
                t_learn = time.perf_counter()
            with batch:
                stats = learner.update(batch)
                store.update_priorities(batch.keys, stats.priorities)
            losses.append(stats.loss)
            if learner.updates % 250 == 0:
                log.debug("%.1f s: updates %d, loss %.4f, mean Q %.3f, return(avg%d) %.1f of %d episodes, %s",
                          time.perf_counter() - t_start, learner.updates, stats.loss, stats.mean_q,
                          config.avg_episodes, moving_average(returns, config.avg_episodes), len(returns),
                          store.counters())
            if learner.updates % config.publish_every == 0:
                weights.publish(net)
            now = time.perf_counter()
            if now - last_bar >= 0.5:
                bar.n = min(bar.total, now - t_start)
                bar.set_postfix_str(
                    f"return(avg{config.avg_episodes})={moving_average(returns, config.avg_episodes):.1f} "
                    f"episodes={len(returns)} updates={learner.updates} loss={stats.loss:.3f}", refresh=False)
                bar.refresh()
                last_bar = now
    finally:
        stop.set()
        if bar is not None:
            bar.close()
        counters = store.counters() if store is not None else {"inserts": 0}
        if store is not None:
            store.close()  # wakes actors blocked on the rate limiter (they see a closed store and exit)
        for p in procs:
            p.join(timeout=10.0)
            if p.is_alive():
                log.warning("actor %s did not stop within 10 s; terminating it", p.name)
                p.terminate()
                p.join(timeout=5.0)
        if weights is not None:
            weights.close()
        memory.close()
        torch.set_num_threads(threads)
    while True:  # episodes finished while stopping
        try:
            msg = results.get(timeout=0.05)
        except queue_mod.Empty:
            break
        if msg[0] == "episode":
            returns.append(msg[2])
    end = time.perf_counter()
    if len(returns) >= config.avg_episodes:
        best = max(best, moving_average(returns, config.avg_episodes))
    return RLReport(
        returns=returns,
        moving_average=moving_average(returns, config.avg_episodes),
        best_moving_average=best if math.isfinite(best) else float("nan"),
        episodes=len(returns),
        env_steps=int(counters["inserts"]),
        updates=learner.updates,
        windows_sampled=learner.updates * config.batch_size,
        seconds=end - t_start,
        learn_seconds=end - t_learn if t_learn is not None else 0.0,
        stopped_by=stopped_by,
        losses=losses,
        config=asdict(config),
    )

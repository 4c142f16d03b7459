"""The settings of a distributed DQN run, and what learner and actors build from them alike.

`RLConfig` holds every setting of `graphrl.train.rl.run_rl` (with `RLConfig.validate`);
`trajectory_spec` is the replay step layout the actors write and the learner samples;
`make_q_network` builds the same `graphrl.nn.TransformerQNetwork` in the learner and in every actor.

>>> config = RLConfig(minutes=1.0, num_actors=3)
>>> config.validate()
>>> net = make_q_network(config, obs_dim=4, num_actions=2, seed=0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphrl.nn.transformer_q import TransformerQNetwork
from replay import TrajectorySpec

__all__ = ["RLConfig", "make_q_network", "trajectory_spec"]


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

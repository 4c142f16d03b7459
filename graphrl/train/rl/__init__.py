"""Distributed DQN on replayed windows: actor processes, a prioritised replay store and a transformer learner.

The pieces, one module each (each usable alone; `run_rl` wires them together, as ``graphrl demo --task
rl`` and ``examples/rl_cartpole_transformer.py`` do):

- `config`: `RLConfig` (every setting, `RLConfig.validate`), `trajectory_spec` (the step layout:
  ``obs``, ``action``, ``reward``, ``done``), `make_q_network` (the same network in learner and actors);
- `targets`: `n_step_targets` (n-step TD targets inside windows ``[B, L]``, cut at episode ends and at
  the window's end), `window_priorities` (R2D2's mixed max/mean ``|TD|``), `dqn_loss` (importance-
  weighted Huber loss over the valid steps);
- `learner`: `DQNLearner` (online and target `graphrl.nn.TransformerQNetwork`, Adam, double-DQN
  bootstrap, target syncs; ``update(batch)`` returns `UpdateStats` with the windows' new priorities);
- `shared_weights`: `SharedWeights`, the learner's flat parameter vector in a shared-memory region of
  the `graphrl.memory.MemoryManager` with a seqlock version counter, which actors poll cheaply;
- `actors`: `run_actor`, an actor process (gymnasium environments, epsilon-greedy on the latest
  weights, steps written through ``ReplayStore.attach(handle).writer()``), and `epsilon_at`;
- `run`: `run_rl` (the store with a ``Prioritized`` selector and a ``SampleToInsertRatio`` limiter,
  the actors spawned with multiprocessing, the learner loop under a wall-clock budget), `RLReport`,
  `moving_average`.

A truncated episode (time limit) ends with ``done == False`` and no next step, so its last step has
no target and is left out of the loss rather than treated as terminal.

>>> from graphrl.train.rl import RLConfig, run_rl
>>> report = run_rl(RLConfig(minutes=2.0, target_return=195))   # doctest: +SKIP

References
----------
Mnih et al., Nature 2015 (DQN); van Hasselt et al., AAAI 2016 (Double DQN); Schaul et al., ICLR 2016
(PER); Horgan et al., ICLR 2018 (Ape-X: actors and one learner around a replay table); Kapturowski et
al., ICLR 2019 (R2D2: sequence replay, n-step targets in the window, mixed max/mean priorities); GEAR
(Wang et al., ICML 2023) for the shared-memory trajectory store.
"""

from graphrl.train.rl.actors import epsilon_at, run_actor
from graphrl.train.rl.config import RLConfig, make_q_network, trajectory_spec
from graphrl.train.rl.learner import DQNLearner, UpdateStats
from graphrl.train.rl.run import RLReport, moving_average, run_rl
from graphrl.train.rl.shared_weights import SharedWeights, SharedWeightsHandle
from graphrl.train.rl.targets import dqn_loss, n_step_targets, window_priorities

__all__ = [
    "DQNLearner",
    "RLConfig",
    "RLReport",
    "SharedWeights",
    "SharedWeightsHandle",
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

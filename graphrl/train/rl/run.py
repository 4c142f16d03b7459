"""The distributed DQN run: a shared-memory replay store, actor processes and the learner loop.

`run_rl` creates the `replay.ReplayStore` (``Prioritized`` selector, ``SampleToInsertRatio`` rate
limiter) and the `SharedWeights`, spawns `run_actor` processes (multiprocessing, spawn), and runs the
learner (`DQNLearner`) in the calling process under a wall-clock budget; it returns an `RLReport`.
`moving_average` is the return statistic the run, the CLI and the example report.

>>> report = run_rl(RLConfig(minutes=1.0, target_return=195))   # doctest: +SKIP
>>> report.moving_average, report.stopped_by                    # doctest: +SKIP

References
----------
Horgan et al., "Distributed Prioritized Experience Replay" (Ape-X), ICLR 2018, and Kapturowski et al.
(R2D2), ICLR 2019: actors, one learner and a prioritised replay table; Reverb's rate limiters; GEAR
(Wang et al., ICML 2023) for shared-memory trajectory storage.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import queue as queue_mod
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from graphrl.memory import MemoryManager
from graphrl.train.rl.actors import run_actor
from graphrl.train.rl.config import RLConfig, make_q_network, trajectory_spec
from graphrl.train.rl.learner import DQNLearner
from graphrl.train.rl.shared_weights import SharedWeights
from replay import Prioritized, ReplayStore, SampleToInsertRatio

__all__ = ["RLReport", "moving_average", "run_rl"]

log = logging.getLogger(__name__)


def moving_average(values: list[float] | np.ndarray, n: int) -> float:
    """Mean of the last ``n`` values (of all of them when fewer); NaN when there are none."""
    if len(values) == 0:
        return float("nan")
    return float(np.mean(np.asarray(values[-n:], dtype=np.float64)))


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


def run_rl(config: RLConfig | None = None, progress: bool = True,
           on_episode: Callable[[float], None] | None = None) -> RLReport:
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
    on_episode : callable or None
        Called with each finished episode's return as the learner receives it (e.g. to keep the
        returns of a run that a signal interrupts: a `KeyboardInterrupt` stops the actors, releases
        the shared memory and propagates).

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
                if on_episode is not None:
                    on_episode(msg[2])
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

"""An actor process of the distributed DQN run: environments, epsilon-greedy on shared weights, replay writes.

`run_actor` is the target of each actor process `graphrl.train.rl.run_rl` spawns: it attaches to
the replay store and to the `SharedWeights` by handle, steps ``config.envs_per_actor`` gymnasium
environments in lockstep (one batched forward of the latest published network), and writes every
step through ``ReplayStore.attach(handle).writer()``. `epsilon_at` is its exploration schedule.

A stored step t holds ``obs`` (s_t), ``action`` (a_t), ``reward`` (r_t) and ``done`` (the episode
terminated after a_t). A truncated episode (time limit) ends with ``done == False`` and no next step.

References
----------
Horgan et al., "Distributed Prioritized Experience Replay" (Ape-X), ICLR 2018: actors around one
replay table; GEAR (Wang et al., ICML 2023): actors writing trajectories into shared memory.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import traceback
from typing import Any

import numpy as np
import torch

from graphrl.train.rl.config import RLConfig, make_q_network
from graphrl.train.rl.shared_weights import SharedWeights, SharedWeightsHandle
from replay import ReplayStore

__all__ = ["epsilon_at", "run_actor"]

log = logging.getLogger(__name__)


def epsilon_at(step: int, start: float, end: float, steps: int) -> float:
    """Linearly annealed exploration rate: ``start`` at step 0, ``end`` from ``steps`` on."""
    frac = min(max(step, 0) / max(steps, 1), 1.0)
    return start + frac * (end - start)


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
    error is sent as ``("error", actor_id, traceback_text)``. SIGINT is ignored: a Ctrl-C reaches the
    terminal's whole process group, and the learner, which gets it too, stops the actors through ``stop``.

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
    if threading.current_thread() is threading.main_thread():  # signals are the main thread's
        signal.signal(signal.SIGINT, signal.SIG_IGN)
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

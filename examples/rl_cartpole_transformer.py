"""Distributed DQN with a causal transformer Q-network on CartPole-v1, fed by graphrl's replay store.

    python examples/rl_cartpole_transformer.py            # 3 minutes on 2 cores
    python examples/rl_cartpole_transformer.py --minutes 1 --actors 3

What happens, top to bottom:

1. The learner (this process) creates a `replay.ReplayStore` in shared memory: a ``Prioritized``
   selector (PER) and a ``SampleToInsertRatio`` rate limiter that keeps each stored step replayed
   about ``samples_per_insert`` times, so fast actors cannot outrun the learner (nor the reverse).
2. It puts the Q-network's parameters in a shared-memory region (`graphrl.train.rl.SharedWeights`: a
   flat float32 vector plus a version counter) and spawns actor processes.
3. Each actor attaches to the store by handle, steps a few CartPole environments epsilon-greedily with
   the latest weights (refreshed after every finished episode), and writes every step with
   ``writer.append``; ``writer.end_episode()`` commits an episode. No step data is pickled.
4. The learner samples windows of consecutive steps (never crossing an episode's end; short ones are
   padded and masked), computes n-step double-DQN targets inside each window, weighs the loss by the
   importance weights of the prioritised draw, writes the windows' new priorities back, and publishes
   its weights every few updates.

A random policy averages about 22 steps per episode; the 100-episode moving average rises well above
150 within the default budget, and the run stops once it reaches 195 (CartPole-v0's "solved"; pass
``--target-return 0`` to use the whole budget: the score can wobble later, as DQN's does on CartPole).

References: DQN (Mnih et al., Nature 2015); Double DQN (van Hasselt et al., AAAI 2016); PER (Schaul
et al., ICLR 2016); Ape-X (Horgan et al., ICLR 2018); R2D2 (Kapturowski et al., ICLR 2019) for
sequence replay; GEAR (Wang et al., ICML 2023) for the shared-memory trajectory store; CleanRL's
single-file style.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import time

import gymnasium as gym
import numpy as np
import torch
from tqdm import tqdm

from graphrl.memory import MemoryManager
from graphrl.nn import TransformerQNetwork
from graphrl.train.rl import DQNLearner, SharedWeights, epsilon_at, moving_average
from replay import Prioritized, ReplayStore, SampleToInsertRatio, TrajectorySpec


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=3.0, help="wall-clock budget, actor start-up included")
    p.add_argument("--actors", type=int, default=2, help="actor processes")
    p.add_argument("--envs-per-actor", type=int, default=4, help="CartPole copies stepped in lockstep")
    p.add_argument("--window", type=int, default=8, help="steps per replayed window (and actor context)")
    p.add_argument("--batch-size", type=int, default=32, help="windows per update")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3, help="Adam, annealed linearly to --lr-end")
    p.add_argument("--lr-end", type=float, default=1e-4)
    p.add_argument("--gamma", type=float, default=0.98)
    p.add_argument("--n-step", type=int, default=3)
    p.add_argument("--target-update", type=int, default=100, help="updates between target-network copies")
    p.add_argument("--samples-per-insert", type=float, default=16.0, help="replay ratio (steps)")
    p.add_argument("--min-size", type=int, default=1000, help="steps stored before learning starts")
    p.add_argument("--capacity", type=int, default=1_000_000, help="replay capacity (steps)")
    p.add_argument("--eps-steps", type=int, default=10_000, help="env steps to anneal epsilon 1 -> 0.02")
    p.add_argument("--target-return", type=float, default=195.0,
                   help="stop once the 100-episode average return reaches it (CartPole-v0's 'solved'); "
                        "0: never")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


# ------------------------------------------------------------------------------------------ actor


def actor(actor_id: int, store_handle, weights_handle, args, stop, results) -> None:
    """An actor process: epsilon-greedy CartPole episodes written into the replay store."""
    torch.set_num_threads(1)  # actors and the learner share 2 cores
    store = ReplayStore.attach(store_handle)  # maps the shared-memory shards by name
    weights = SharedWeights.attach(weights_handle)
    net = TransformerQNetwork(4, 2, window=args.window, d_model=args.d_model, num_layers=args.layers)
    while not weights.pull(net):  # the learner published version 1 before starting us
        time.sleep(0.01)
    n, length = args.envs_per_actor, args.window
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    writers = [store.writer(chunk_steps=512) for _ in range(n)]  # one open episode per environment
    rng = np.random.default_rng([args.seed, actor_id])
    # context[i]: the last `window` observations of env i's episode, left-aligned; t[i]: its step count
    context = np.zeros((n, length, 4), dtype=np.float32)
    t = np.zeros(n, dtype=np.int64)
    returns = np.zeros(n)
    obs = [envs[i].reset(seed=args.seed * 10_000 + actor_id * n + i)[0] for i in range(n)]
    context[:, 0] = obs
    steps = 0
    try:
        while not stop.is_set():
            eps = epsilon_at(steps * args.actors, 1.0, 0.02, args.eps_steps)
            with torch.no_grad():  # one forward for all envs; Q at each context's last real step
                q = net(torch.from_numpy(context))[np.arange(n), np.minimum(t, length - 1)]
            actions = np.where(rng.random(n) < eps, rng.integers(2, size=n), q.argmax(-1).numpy())
            for i, env in enumerate(envs):
                a = int(actions[i])
                next_obs, r, terminated, truncated, _ = env.step(a)
                # step t: s_t, a_t, r_t and whether the episode terminated after a_t (not a time limit)
                writers[i].append({"obs": obs[i], "action": a, "reward": float(r), "done": bool(terminated)})
                returns[i] += r
                steps += 1
                obs[i] = next_obs
                if terminated or truncated:
                    writers[i].end_episode()  # commit: the episode becomes sampleable
                    results.put(float(returns[i]))
                    weights.pull(net)  # refresh the policy after every episode (cheap when unchanged)
                    obs[i], _ = env.reset()
                    t[i], returns[i] = 0, 0.0
                    context[i] = 0.0
                    context[i, 0] = obs[i]
                else:
                    t[i] += 1
                    if t[i] < length:
                        context[i, t[i]] = obs[i]
                    else:  # slide the context by one step
                        context[i, :-1] = context[i, 1:]
                        context[i, -1] = obs[i]
    except (ValueError, TimeoutError):  # the learner closed the store (or stopped sampling) at the end
        pass
    finally:
        for w in writers:
            w.close()
        weights.close()
        store.close()


# ------------------------------------------------------------------------------------------ learner


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    budget = 60.0 * args.minutes
    mm = MemoryManager()
    spec = TrajectorySpec({"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
                           "done": ((), "bool")})
    spi = args.samples_per_insert
    store = ReplayStore(spec, capacity_steps=args.capacity, num_shards=2, selector=Prioritized(exponent=0.6),
                        rate_limiter=SampleToInsertRatio(samples_per_insert=spi, min_size=args.min_size,
                                                         error_buffer=spi * args.min_size),
                        memory=mm, seed=args.seed)
    net = TransformerQNetwork(4, 2, window=args.window, d_model=args.d_model, num_layers=args.layers,
                              seed=args.seed)
    learner = DQNLearner(net, lr=args.lr, gamma=args.gamma, n_step=args.n_step,
                         target_update=args.target_update)
    weights = SharedWeights.create(mm, net)
    weights.publish(net)

    ctx = mp.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=actor, args=(i, store.handle(), weights.handle(), args, stop, results),
                         daemon=True) for i in range(args.actors)]
    for p in procs:
        p.start()

    returns: list[float] = []
    best = 0.0
    bar = tqdm(total=round(budget), unit="s", bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s{postfix}")
    t_learn = None
    solved = False
    while (now := time.perf_counter()) - t_start < budget and not solved:
        frac = (now - t_start) / budget
        try:  # windows of `window` steps starting at prioritised anchors, padded at the tail
            batch = store.sample(args.batch_size, window=args.window, pad="tail", timeout=1.0,
                                 beta=0.4 + 0.6 * frac)
        except TimeoutError:  # still below min_size (actors starting), or ahead of the actors
            continue
        t_learn = t_learn or time.perf_counter()
        learner.set_learning_rate(args.lr + frac * (args.lr_end - args.lr))
        with batch:  # batch["obs"]: [B, L, 4]; batch.mask: [B, L]; batch.weights: importance weights
            stats = learner.update(batch)
            store.update_priorities(batch.keys, stats.priorities)  # R2D2's max/mean mix of |TD|
        if learner.updates % 10 == 0:
            weights.publish(net)
        while True:
            try:
                returns.append(results.get_nowait())
            except queue.Empty:
                break
        if len(returns) >= 100:
            best = max(best, moving_average(returns, 100))
            solved = 0 < args.target_return <= moving_average(returns, 100)
        if learner.updates % 50 == 0:
            bar.n = min(bar.total, time.perf_counter() - t_start)
            bar.set_postfix_str(f"return(avg100)={moving_average(returns, 100):.1f} episodes={len(returns)} "
                                f"updates={learner.updates} loss={stats.loss:.3f}")

    stop.set()
    bar.close()
    inserted = store.counters()["inserts"]
    store.close()  # wakes any actor blocked on the rate limiter; it sees a closed store and exits
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.terminate()
    weights.close()
    mm.close()

    seconds = time.perf_counter() - t_start
    learn_seconds = time.perf_counter() - (t_learn or t_start)
    stopped = f" (stopped at a 100-episode average of {args.target_return:g})" if solved else ""
    print(f"{len(returns):,} episodes, {inserted:,} env steps, {learner.updates:,} updates in "
          f"{seconds:.1f} s{stopped}")
    print(f"return, moving average of 100 episodes: {moving_average(returns, 100):.1f} at the end, best "
          f"{best:.1f}; first 100 episodes {moving_average(returns[:100], 100):.1f} (random ~22)")
    print(f"throughput: {inserted / seconds:,.0f} steps/s inserted, "
          f"{learner.updates * args.batch_size / learn_seconds:,.0f} windows/s sampled")


if __name__ == "__main__":
    main()

"""Data-parallel sequence learners on one replay store: DDP ranks each sample their own windows.

    torchrun --nproc_per_node=2 examples/ddp_sequence_learner.py --window 128   # long context: learns
    torchrun --nproc_per_node=2 examples/ddp_sequence_learner.py --window 3     # short: cannot
    python examples/ddp_sequence_learner.py                                     # one rank, no torchrun

The task is POPGym's RepeatPreviousEasy (Morad et al., ICLR 2023): a card is dealt each step (the
observation is its suit) and the agent must name the suit of the card dealt 3 steps before (the 4th
most recent card); an episode is 51 steps and its return is in [-1, 1] (random play: about -0.5).
A policy that sees fewer than 4 cards cannot do better than chance, so ``--window 3`` must fail and a
long window can reach 1.0. Top to bottom:

1. Rank 0 makes a `replay.ReplayStore` in shared memory (a ``SampleToInsertRatio`` rate limiter keeps
   each step replayed about ``--samples-per-insert`` times), the Q-network's weights in shared memory
   (`graphrl.train.rl.SharedWeights`), and spawns ``--actors`` actor processes; it broadcasts
   ``store.learner()`` to the other ranks with ``torch.distributed.broadcast_object_list``.
2. Each actor steps ``--envs`` environments epsilon-greedily with the latest weights (the network
   sees the last ``--window`` cards) and writes every step through a `replay.TrajectoryWriter`; its
   first environment plays greedily, and those returns are the curve this example reports.
3. Every rank samples its own batch of windows (``learner.sample``: the draw from the store's one
   table, the gather from the shared rings into the rank's own staging slot, on its GPU with CUDA),
   computes Q-learning targets in each window (``--gamma 0`` by default: the cards dealt do not depend
   on the actions, so the value of a history is its immediate reward) and steps a causal transformer
   (`graphrl.nn.TransformerQNetwork`, 4 layers, d_model 256, context ``--window``) wrapped in
   ``DistributedDataParallel`` (gloo on CPU, NCCL with one rank per GPU). Rank 0 publishes weights.

Reported: windows/s into the model (all ranks), each rank's share of time waiting on replay (the
rate limiter included), and the greedy return curve, written to ``--out`` (JSON per window, and a
plot of every curve there: run both windows to see both).

References: DQN (Mnih et al., 2015), R2D2 (Kapturowski et al., 2019) for replayed sequences, GEAR
(Wang et al., ICML 2023) for trainers sampling shared trajectory memory, POPGym (Morad et al., 2023),
CleanRL's single-file style.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import click
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from graphrl.memory import MemoryManager
from graphrl.nn import TransformerQNetwork
from graphrl.train.rl import SharedWeights, epsilon_at, moving_average
from replay import ReplayStore, SampleToInsertRatio, TrajectorySpec, Uniform

SUITS = 4
SPEC = TrajectorySpec({"obs": ((), "int64"), "action": ((), "int64"), "reward": ((), "float32")})


def make_net(cfg: dict) -> TransformerQNetwork:
    return TransformerQNetwork(
        SUITS, SUITS, window=cfg["window"], d_model=cfg["d_model"], num_layers=cfg["layers"],
        num_heads=cfg["heads"], layer_norm=True, seed=cfg["seed"],
    )


def one_hot(obs: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(obs.clamp(0, SUITS - 1), SUITS).float()


# ------------------------------------------------------------------------------------------- actors
def actor(actor_id: int, store_handle, weights_handle, cfg: dict, stop, results) -> None:
    """Epsilon-greedy RepeatPreviousEasy episodes written into the store (env 0 plays greedily)."""
    from popgym.envs.repeat_previous import RepeatPreviousEasy

    torch.set_num_threads(1)
    store = ReplayStore.attach(store_handle)
    weights = SharedWeights.attach(weights_handle)
    net = make_net(cfg)
    weights.pull(net)  # rank 0 published version 1 before starting us
    n, length = cfg["envs"], cfg["window"]
    envs = [RepeatPreviousEasy() for _ in range(n)]
    writers = [store.writer(chunk_steps=64) for _ in range(n)]
    rng = np.random.default_rng([cfg["seed"], actor_id])
    history = [[env.reset(seed=cfg["seed"] * 1000 + actor_id * n + i)[0]] for i, env in enumerate(envs)]
    returns = np.zeros(n)
    steps = 0
    try:
        while not stop.is_set():
            eps = epsilon_at(steps * cfg["actors"], 1.0, 0.05, cfg["eps_steps"])
            ctx = [h[-length:] for h in history]
            longest = max(len(c) for c in ctx)
            obs = torch.zeros(n, longest, dtype=torch.int64)
            for i, c in enumerate(ctx):  # left-aligned (tail padding): no mask needed
                obs[i, : len(c)] = torch.tensor(c)
            with torch.no_grad():
                q = net(one_hot(obs))[torch.arange(n), torch.tensor([len(c) - 1 for c in ctx])]
            greedy = q.argmax(-1).numpy()
            explore = rng.random(n) < eps
            explore[0] = False  # env 0: the greedy policy's return curve
            actions = np.where(explore, rng.integers(SUITS, size=n), greedy)
            for i, env in enumerate(envs):
                a = int(actions[i])
                next_obs, r, terminated, truncated, _ = env.step(a)
                writers[i].append({"obs": history[i][-1], "action": a, "reward": float(r)})
                returns[i] += r
                steps += 1
                if terminated or truncated:
                    writers[i].end_episode()
                    if i == 0:
                        results.put((time.time(), float(returns[i]), steps * cfg["actors"]))
                    weights.pull(net)
                    history[i] = [env.reset()[0]]
                    returns[i] = 0.0
                else:
                    history[i].append(int(next_obs))
    except (ValueError, TimeoutError):  # the store closed (or stopped taking steps) at the end
        pass
    finally:
        for w in writers:
            w.close()
        weights.close()
        store.close()


# ----------------------------------------------------------------------------------------- learners
def q_loss(net, batch, gamma: float, scale: float) -> torch.Tensor:
    """Mean squared TD error over the real steps of the windows (tail padding: real steps first)."""
    n = int(batch.lengths.max())
    mask = batch.mask[:, :n]
    q = net(one_hot(batch["obs"][:, :n]))  # [B, n, 4]
    q_taken = q.gather(-1, batch["action"][:, :n, None]).squeeze(-1)
    target = batch["reward"][:, :n] * scale
    if gamma > 0:  # bootstrap from the next step of the window where there is one
        nxt = torch.zeros_like(target)
        nxt[:, :-1] = q[:, 1:].detach().max(-1).values * mask[:, 1:]
        target = target + gamma * nxt
    err = (q_taken - target) ** 2 * mask
    return err.sum() / mask.sum()


@click.command()
@click.option("--minutes", default=7.0, show_default=True, help="Training budget (after the store fills).")
@click.option("--window", default=128, show_default=True, help="Context of the network and of the windows.")
@click.option("--batch-size", default=8, show_default=True, help="Windows per rank per update.")
@click.option("--d-model", default=256, show_default=True)
@click.option("--layers", default=4, show_default=True)
@click.option("--heads", default=4, show_default=True)
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--gamma", default=0.0, show_default=True, help="Discount (0: the cards ignore the actions).")
@click.option("--actors", default=1, show_default=True, help="Actor processes (spawned by rank 0).")
@click.option("--envs", default=8, show_default=True, help="Environments per actor.")
@click.option("--eps-steps", default=20_000, show_default=True, help="Steps of epsilon 1 -> 0.05.")
@click.option("--samples-per-insert", default=8.0, show_default=True)
@click.option("--min-size", default=1_000, show_default=True, help="Steps stored before sampling starts.")
@click.option("--publish-every", default=5, show_default=True, help="Updates between weight publications.")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", default="runs/ddp_sequence_learner", show_default=True)
def main(minutes, window, batch_size, d_model, layers, heads, lr, gamma, actors, envs, eps_steps,
         samples_per_insert, min_size, publish_every, seed, out) -> None:
    """Train a causal transformer with DDP ranks that each sample the same replay store."""
    torch.set_num_threads(1)
    if importlib.util.find_spec("popgym") is None:  # else the actors die at once and the learners wait
        raise click.UsageError("this example needs POPGym: pip install -e '.[memory]'")
    if "RANK" not in os.environ:  # plain `python`: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT="29517")
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = dict(window=window, d_model=d_model, layers=layers, heads=heads, seed=seed, envs=envs,
               actors=actors, eps_steps=eps_steps)
    net = make_net(cfg)
    mm = store = weights = None
    procs, stop, results = [], None, None
    if rank == 0:  # the owner: store, weights, actors
        mm = MemoryManager()
        limiter = SampleToInsertRatio(samples_per_insert, min_size, samples_per_insert * min_size * 4)
        store = ReplayStore(SPEC, 200_000, num_shards=4, selector=Uniform(), rate_limiter=limiter,
                            memory=mm, timeout=600, seed=seed)
        weights = SharedWeights.create(mm, net)
        weights.publish(net)
        ctx = mp.get_context("spawn")
        stop, results = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=actor, args=(i, store.handle(), weights.handle(), cfg, stop, results))
                 for i in range(actors)]
        for p in procs:
            p.start()
    box = [store.learner() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)  # every rank gets the picklable learner handle
    learner = box[0]
    model = DistributedDataParallel(net.to(device), device_ids=[local_rank] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    scale = 51.0 - 4.0  # rewards are +-1/47: train on +-1
    curve: list[tuple[float, float, int]] = []
    wait_s = windows = updates = 0
    t_train = None
    stop_flag = torch.zeros(1)
    while True:
        t0 = time.monotonic()
        with learner.sample(batch_size, window=window, device=device if cuda else None) as batch:
            t1 = time.monotonic()
            if t_train is None:
                t_train = t1  # the clock starts once the store holds min_size steps
            loss = q_loss(model, batch, gamma, scale)
            opt.zero_grad()
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
        wait_s += t1 - t0 if updates else 0.0
        windows += batch_size
        updates += 1
        if rank == 0:
            if updates % publish_every == 0:
                weights.publish(net)
            while not results.empty():
                curve.append(results.get())
            if updates % 25 == 0:
                rets = [r for _, r, _ in curve]
                print(f"update {updates:5d}  loss {loss.item():.4f}  greedy return (last 20) "
                      f"{moving_average(rets, 20):+.3f}  episodes {len(rets)}  "
                      f"{time.monotonic() - t_train:.0f} s", flush=True)
            stop_flag[0] = float(time.monotonic() - t_train > minutes * 60)
        dist.broadcast(stop_flag, src=0)
        if stop_flag[0]:
            break
    elapsed = time.monotonic() - t_train
    totals = torch.tensor([windows, wait_s, elapsed], dtype=torch.float64)
    shares = [torch.zeros(3, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(shares, totals)
    if rank == 0:
        while not results.empty():
            curve.append(results.get())
        all_windows = sum(float(s[0]) for s in shares)
        waits = [float(s[1]) / float(s[2]) for s in shares]
        rets = [r for _, r, _ in curve]
        summary = {
            "window": window, "ranks": world, "updates_per_rank": updates, "train_seconds": elapsed,
            "windows_per_s": all_windows / elapsed, "replay_wait_share": waits,
            "final_greedy_return_last20": moving_average(rets, 20), "episodes": len(rets),
            "load_average_1min": os.getloadavg()[0], "store": store.stats(),
            "curve": [(t - curve[0][0] if curve else 0.0, r, s) for t, r, s in curve],
        }
        print(f"\nwindow {window}: {summary['windows_per_s']:.1f} windows/s into the model over {world} "
              f"rank(s); replay wait share per rank {[f'{w:.0%}' for w in waits]}; greedy return (last 20 "
              f"episodes) {summary['final_greedy_return_last20']:+.3f} after {elapsed:.0f} s; "
              f"load {summary['load_average_1min']:.1f}")
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"curve-w{window}.json").write_text(json.dumps(summary, indent=1))
        plot(folder)
        stop.set()
        store.close()  # an actor waiting on the rate limiter wakes (ValueError) and ends
        for p in procs:
            p.join(60)
        weights.close()
        mm.close()
    learner.close()
    dist.destroy_process_group()


def plot(folder: Path) -> None:
    """Every curve-w*.json under ``folder`` as greedy return against actor steps, to returns.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for f in sorted(folder.glob("curve-w*.json")):
        s = json.loads(f.read_text())
        steps = [c[2] for c in s["curve"]]
        rets = [c[1] for c in s["curve"]]
        smooth = [moving_average(rets[: i + 1], 20) for i in range(len(rets))]
        ax.plot(steps, smooth, label=f"window {s['window']}")
    ax.axhline(-0.5, color="gray", ls=":", label="random play")
    ax.set_xlabel("actor steps")
    ax.set_ylabel("greedy return (mean of 20 episodes)")
    ax.set_title("RepeatPreviousEasy, DDP learners on one replay store")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "returns.png", dpi=100)
    print(f"wrote {folder / 'returns.png'}")


if __name__ == "__main__":
    main()

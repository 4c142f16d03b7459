"""A recommender on a graph that needs the sampler: 10x Gowalla, where exact propagation does not fit.

The graph is `synthetic_communities` (power-law user and item degrees, planted communities, held-out
test edges per user), 10x Gowalla at ``--scale 1``: 300,000 users, 410,000 items, 10.3M interactions
(Gowalla: 29,858 / 40,981 / 1.03M). A `MemoryManager` gets a device-tier budget (``--device-budget``).
A step's *device working set* is what a GPU step would hold at once: the graph structure it reads
(exact: the normalised adjacency's CSR arrays; sampled: the step's blocks), copied into device-tier
regions, and per propagation layer an output table and its gradient (``[D_k, d]`` float32; exact:
``D_k = N``), reserved. The exact step's working set is asked of the manager first and refused
(`MemoryBudgetError`). Training then runs the library's sampled recommender step (`RecommenderSteps`
with ``RecommendConfig(propagation="sampled")``: LightGCN's readout over `NeighborSampler` blocks,
sampled softmax, item bias) with every step's blocks staged through the device tier; the graph and
the embedding table with Adam's moments are regions of the ``pinned`` tier (read in place, as
PinSage's and UVA samplers do; without CUDA plain host memory). Evaluation is exact on the host:
recall@20 / NDCG@20 over ``--eval-users`` random users with test items, against the popularity
baseline on the same users. Prints the budget, throughput, quality and the manager's peak per tier.

    python examples/large_recommender.py                        # 10x Gowalla, about 10 minutes on 2 cores
    python examples/large_recommender.py --scale 0.05 --minutes 0.5 --eval-users 2000   # a quick look
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import replace

import click
import numpy as np
import torch
from tqdm.auto import tqdm

from graphrl.cli_options import check_size, int_list
from graphrl.datasets.synthetic import synthetic_communities
from graphrl.interrupts import Interrupted, interrupts
from graphrl.memory import MemoryBudgetError, MemoryManager, Region, Tier, free_quietly
from graphrl.train.link_prediction import evaluate_popularity
from graphrl.train.metrics import csr_from_pairs, evaluate_ranking
from graphrl.train.rec_step import RecommenderSteps
from graphrl.train.recommend import RecommendConfig, score_table
from samplers.block import Block

GOWALLA = {"users": 29_858, "items": 40_981, "interactions": 1_027_370}  # ../shared/data/README.md


def mib(nbytes: int) -> str:
    """``nbytes`` in MiB, one decimal."""
    return f"{nbytes / 2**20:,.1f} MiB"


def free_all(regions: list[Region]) -> None:
    """Free every region of ``regions`` (those already freed are skipped)."""
    for region in regions:
        free_quietly(region)


def stage(memory: MemoryManager, owner: str, structure: list[torch.Tensor],
          tables: list[tuple[int, int]]) -> tuple[list[Region], list[torch.Tensor]]:
    """Copy ``structure`` into device-tier regions and reserve one float32 region per table shape.

    Returns the regions and the staged copies of ``structure``. Raises `MemoryBudgetError` (after
    freeing what it placed) when the device tier has no room: no fallback tier is allowed.
    """
    regions: list[Region] = []
    try:
        for t in structure:
            region = memory.allocate(tuple(t.shape), t.dtype, Tier.DEVICE, owner=f"{owner}.structure")
            region.tensor().copy_(t)
            regions.append(region)
        for shape in tables:
            regions.append(memory.allocate(shape, torch.float32, Tier.DEVICE, owner=f"{owner}.tables"))
    except MemoryBudgetError:
        free_all(regions)
        raise
    return regions, [r.tensor() for r in regions[:len(structure)]]


def exact_working_set(run: RecommenderSteps) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
    """The exact step's structure (the normalised adjacency's CSR arrays) and tables (2 per layer, [N, d])."""
    m = run.adj.matrix
    structure = [torch.from_numpy(m.indptr), torch.from_numpy(m.indices), torch.from_numpy(m.data)]
    shape = (run.model.num_nodes, run.config.embedding_dim)
    return structure, [shape] * (2 * run.config.num_layers)


class StagedSampler:
    """Wraps a sampler: each call's blocks are copied into device-tier regions (freed at the next call),
    with an output table and its gradient reserved per block ([D_k, d] float32)."""

    def __init__(self, sampler, memory: MemoryManager, dim: int) -> None:
        self.sampler, self.memory, self.dim = sampler, memory, dim
        self.regions: list[Region] = []

    def sample(self, seeds: torch.Tensor) -> list[Block]:
        free_all(self.regions)
        blocks = self.sampler.sample(seeds)
        structure = [t for b in blocks for t in (b.src_nodes, b.indptr, b.indices, b.edge_ids)]
        tables = [(b.num_dst_nodes, self.dim) for b in blocks for _ in range(2)]
        self.regions, staged = stage(self.memory, "sampled", structure, tables)
        out = []
        for k, b in enumerate(blocks):
            src, indptr, indices, edge_ids = staged[4 * k:4 * k + 4]
            out.append(Block(src_nodes=src, dst_nodes=src[:b.num_dst_nodes], indptr=indptr, indices=indices,
                             edge_ids=edge_ids))
        return out


def parse_fanouts(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    """``--fanouts`` as a tuple: comma-separated integers (`graphrl.cli_options.int_list`) checked by
    `RecommendConfig` (a usage error names the option)."""
    fanouts = tuple(int_list(value, None))
    try:
        RecommendConfig(loss="softmax", propagation="sampled", fanouts=fanouts)
    except ValueError as err:
        raise click.BadParameter(f"{value!r}: {err}", ctx, param) from None
    return fanouts


@click.command()
@click.option("--scale", type=click.FloatRange(min=0.001), default=1.0, show_default=True,
              help="Graph size as a multiple of 10x Gowalla (300k users, 410k items, 10.3M interactions).")
@click.option("--communities", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--affinity", type=click.FloatRange(0, 1), default=0.8, show_default=True,
              help="Share of a user's interactions drawn inside its community.")
@click.option("--device-budget", default="512MiB", show_default=True, callback=check_size,
              help="The device tier's budget.")
@click.option("--fanouts", default="10,10,10", show_default=True, callback=parse_fanouts,
              help="Per layer, outermost first.")
@click.option("--batch-size", type=click.IntRange(min=1), default=2048, show_default=True,
              help="(user, item) pairs a step.")
@click.option("--negatives", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Uniform negatives shared by a step's batch.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.01, show_default=True)
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=6.0, show_default=True,
              help="Training-time budget (generation and evaluation not counted).")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Most steps (default: the minutes).")
@click.option("--eval-users", type=click.IntRange(min=1), default=5_000, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
def main(**options) -> None:
    """Build the graph, show exact propagation refused, train on sampled blocks, evaluate.

    SIGINT / SIGTERM stop it with exit status 130 / 143 (nothing is saved: the example writes no files).
    """
    with interrupts():
        try:
            run_example(**options)
        except Interrupted as err:
            click.echo(f"interrupted by {err.name}: nothing saved (this example writes no files)", err=True)
            raise click.exceptions.Exit(err.exit_code) from None


def run_example(scale: float, communities: int, affinity: float, device_budget: str, fanouts: tuple[int, ...],
                batch_size: int, negatives: int, lr: float, minutes: float, steps: int | None,
                eval_users: int, seed: int) -> None:
    """`main`'s run: see the module docstring."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    users, items = round(10 * GOWALLA["users"] * scale), round(10 * GOWALLA["items"] * scale)
    try:
        ds = synthetic_communities(users, items, round(10 * GOWALLA["interactions"] * scale),
                                   num_communities=communities, affinity=affinity, seed=seed)
    except ValueError as err:  # e.g. more communities than users at this scale
        raise click.UsageError(f"--communities / --scale: {err}") from None
    click.echo(f"graph: {users:,} users, {items:,} items, {ds.num_train:,} train / {ds.num_test:,} test "
               f"interactions ({ds.num_train / 810_128:.1f}x Gowalla's train), {communities} communities; "
               f"generated in {time.perf_counter() - t0:.1f} s")

    mm = MemoryManager(budgets={"device": device_budget}, device="cpu")
    ds = replace(ds, graph=ds.graph.to_memory(mm, Tier.PINNED, fallback=(Tier.HOST,)))
    config = RecommendConfig(loss="softmax", propagation="sampled",
                             fanouts=fanouts, batch_size=batch_size,
                             num_negatives=negatives, temperature=0.12, lr=lr, item_bias=True, seed=seed)
    run = RecommenderSteps(ds, config)
    click.echo(f"device budget {mib(mm.budget(Tier.DEVICE))}")
    structure, tables = exact_working_set(run)
    need = sum(t.nbytes for t in structure) + sum(4 * a * b for a, b in tables)
    with MemoryManager(budgets={"device": device_budget}, device="cpu") as probe:
        try:
            regions, _ = stage(probe, "exact", structure, tables)
            free_all(regions)
            click.echo(f"exact propagation FITS the budget ({mib(need)}): this graph does not need "
                       "the sampler; raise --scale or lower --device-budget")
        except MemoryBudgetError as err:
            click.echo(f"exact propagation refused ({mib(need)} in all): {err}")

    run.sampler = StagedSampler(run.sampler, mm, config.embedding_dim)
    params = [mm.register(p.data, Tier.PINNED, owner="model") for p in run.model.parameters()]
    budget_s, max_steps = minutes * 60.0, steps or 10**9
    train_s, cpu_s = 0.0, 0.0
    bar = tqdm(total=max_steps if steps else None, unit="step", dynamic_ncols=True)
    while run.steps < max_steps and train_s < budget_s:
        t1, c1 = time.perf_counter(), time.process_time()
        try:
            loss = run.step(lr)
        except MemoryBudgetError as err:
            bar.close()
            free_all(run.sampler.regions + params)
            mm.close()
            raise click.ClickException(f"a sampled step does not fit --device-budget {device_budget}: "
                                       f"{err}") from None
        train_s += time.perf_counter() - t1
        cpu_s += time.process_time() - c1
        if run.steps == 1:  # Adam's moments exist from the first step on
            params += [mm.register(s, Tier.PINNED, owner="adam") for st in run.optimizer.state.values()
                       for s in st.values() if s.dim() > 0]
        bar.update()
        bar.set_postfix(loss=f"{loss:.3f}")
    bar.close()
    free_all(run.sampler.regions)

    t2 = time.perf_counter()
    run.model.eval()
    user_t, item_t = score_table(run.model, run.adj, ds.num_users, True, config.temperature)
    test_users, test_items = ds.test_users.numpy(), ds.test_items.numpy()
    rng = np.random.default_rng(seed)
    chosen = rng.choice(np.unique(test_users), min(eval_users, np.unique(test_users).size), replace=False)
    keep = np.isin(test_users, chosen)
    test = csr_from_pairs(test_users[keep], test_items[keep], ds.num_users)
    train = run.train_csr
    ours = evaluate_ranking(lambda u: user_t[u] @ item_t, train, test, k=20, batch_size=256,
                            copy_scores=False)
    popular = evaluate_popularity(train, test, ds.num_items, k=20, batch_size=256)
    eval_s = time.perf_counter() - t2

    click.echo(f"trained {run.steps} steps in {train_s:.1f} s ({cpu_s:.0f} CPU s, "
               f"{cpu_s / run.steps:.2f} CPU s a step): {run.steps / train_s:.3f} steps/s, "
               f"{run.sampled_edges / train_s:,.0f} sampled edges per training second; the sampler drew "
               f"{run.sampled_edges:,} edges in {run.sample_seconds:.1f} s "
               f"({run.sampled_edges / max(run.sample_seconds, 1e-9):,.0f} edges/s)")
    click.echo(f"test ({ours.num_users:,} random users): recall@20 {ours.recall:.4f}  "
               f"NDCG@20 {ours.ndcg:.4f}; "
               f"popularity recall@20 {popular.recall:.4f}  NDCG@20 {popular.ndcg:.4f} "
               f"({ours.recall / max(popular.recall, 1e-12):.1f}x); evaluation {eval_s:.1f} s")
    for tier, u in mm.usage().items():
        if u["peak"]:
            owners = {o: mib(s["peak"]) for o, s in mm.stats()[tier].items()}
            click.echo(f"memory peak {tier}: {mib(u['peak'])} of {mib(u['budget'])} {owners}")
    free_all(params)
    mm.close()
    click.echo(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB; total "
               f"{time.perf_counter() - t0:.0f} s; 1-min load {load0:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

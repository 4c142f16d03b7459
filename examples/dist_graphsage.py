"""GraphSAGE on a graph partitioned over Ray owners, trained data parallel with torch.distributed.

The 1M-node / 20M-edge power-law graph (`graphrl.datasets.synthetic_graph`) with seeded features and
labels is split into ``--parts`` parts (a sealed partition folder, `graphrl.partition`); each part is
served by a Ray actor (`samplers.distributed.RayOwners`). Every trainer rank samples its batches with
`DistNeighborSampler.sample_many` (one request per owner per layer for ``--per-request`` batches) and
reads features and labels through `DistFeatureStore` (one request per owner per batch, a hot-row
cache): no rank holds the graph or its features. DDP averages the gradients. ``--sampler local`` is the
single-machine run: every rank holds the whole graph and samples it with `NeighborSampler`. For the same
``--seed`` the two runs sample the same blocks and read the same rows, so they print the same losses and
the same test accuracy.

    torchrun --nproc_per_node=2 examples/dist_graphsage.py                   # 4 owners, 2 trainers
    torchrun --nproc_per_node=2 examples/dist_graphsage.py --sampler local   # single machine, same seed
    python examples/dist_graphsage.py --size 100000,2000000 --steps 20       # one rank, a smaller graph

Labels: ``argmax((x_v + mean of x over v's in-neighbours) @ W)`` for seeded Gaussian features ``x`` and
a seeded ``W``, so a one-hop model can learn them and a model of ``x_v`` alone cannot. Rank 0 writes
the partition folder (``--folder``; reused when it exists and holds this graph) and starts a local
Ray cluster in namespace ``graphrl``; the other ranks join it. On several hosts, start a Ray cluster
first (README, "Scaling out") and pass ``--ray-address auto``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from itertools import islice

import click
import numpy as np
import scipy.sparse as sp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from graphrl.datasets import synthetic_graph
from graphrl.partition import PartitionError, graph_fingerprint, verify, write_partitions
from graphrl.train.ddp import DistributedBatchSampler, init_distributed, shutdown_distributed, wrap_model
from samplers import NeighborSampler
from samplers.distributed import DistFeatureStore, DistNeighborSampler, RayOwners


def make_data(n: int, e: int, dim: int, classes: int, seed: int):
    """The graph, features [N, dim] float32 and labels [N] int64 (see the module docstring)."""
    graph = synthetic_graph(n, e, "powerlaw", seed=seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    indptr = graph.indptr.numpy()
    ones = np.ones(graph.num_edges, dtype=np.float32)
    a = sp.csr_matrix((ones, graph.indices.numpy(), indptr), shape=(n, n))  # row v: v's in-neighbours
    mean = (a @ x) / np.maximum(np.diff(indptr), 1)[:, None].astype(np.float32)
    w = rng.standard_normal((dim, classes), dtype=np.float32)
    y = np.argmax((x + mean) @ w, axis=1).astype(np.int64)
    return graph, torch.from_numpy(x), torch.from_numpy(y)


def blocks_of(sampler, batches: list[torch.Tensor], per_request: int) -> Iterator:
    """Each batch's blocks in turn: `DistNeighborSampler.sample_many` (``per_request`` batches a request to
    each owner, two such groups in flight) or one `NeighborSampler.sample` call a batch; the same blocks
    either way."""
    if isinstance(sampler, DistNeighborSampler):
        return sampler.sample_many(batches, batches_per_request=per_request, in_flight=2)
    return map(sampler.sample, batches)


class SAGE(nn.Module):
    """GraphSAGE-mean on blocks: h_dst = W_self h_dst + W_neigh mean(h_src over sampled in-edges)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.self_lin = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.neigh_lin = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in zip(dims[:-1], dims[1:],
                                                                                    strict=True))

    def forward(self, blocks, h: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(blocks):
            d = block.num_dst_nodes
            agg = torch.zeros(d, h.shape[1]).index_add_(0, block.edge_dst(), h[block.indices])
            agg = agg / block.in_degrees().clamp(min=1).unsqueeze(1).to(h.dtype)
            h = self.self_lin[i](h[:d]) + self.neigh_lin[i](agg)
            if i < len(blocks) - 1:
                h = F.relu(h)
        return h


@click.command()
@click.option("--size", default="1000000,20000000", show_default=True, help="NODES,EDGES of the graph.")
@click.option("--parts", type=click.IntRange(min=1), default=4, show_default=True,
              help="Partitions (owners).")
@click.option("--method", type=click.Choice(["auto", "metis", "ldg"]), default="ldg", show_default=True,
              help="Partitioner (auto: METIS when pymetis is installed).")
@click.option("--sampler", "mode", type=click.Choice(["dist", "local"]), default="dist", show_default=True,
              help="dist: Ray owners; local: every rank holds the graph (the single-machine run).")
@click.option("--fanouts", default="10,5", show_default=True, help="Neighbours per layer, outermost first.")
@click.option("--batch-size", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Seed nodes per step on each rank.")
@click.option("--steps", type=click.IntRange(min=1), default=30, show_default=True, help="Steps per rank.")
@click.option("--eval-nodes", type=click.IntRange(min=1), default=8192, show_default=True,
              help="Test nodes evaluated (split over the ranks).")
@click.option("--dim", type=click.IntRange(min=1), default=32, show_default=True, help="Feature columns.")
@click.option("--classes", type=click.IntRange(min=2), default=8, show_default=True)
@click.option("--hidden", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.01, show_default=True)
@click.option("--cache-rows", type=click.IntRange(min=0), default=50_000, show_default=True,
              help="Hot feature rows each rank caches (dist).")
@click.option("--per-request", type=click.IntRange(min=1), default=32, show_default=True,
              help="Batches a request of sample_many (benchmarks/dist_sampler.py's default).")
@click.option("--folder", default=None, help="Partition folder (default: under the temporary folder).")
@click.option("--ray-address", default=None, help="Join this Ray cluster (default: rank 0 starts one).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
def main(size, parts, method, mode, fanouts, batch_size, steps, eval_nodes, dim, classes, hidden, lr,
         cache_rows, per_request, folder, ray_address, seed) -> None:
    """Train GraphSAGE on a partitioned graph (launch with torchrun) and print the test accuracy."""
    t_start = time.perf_counter()
    n, e = (int(x) for x in size.split(","))
    fan = [int(x) for x in fanouts.split(",")]

    # 1. Join the job (gloo on CPUs); split the cores between the ranks.
    ctx = init_distributed(device="cpu")
    echo = click.echo if ctx.is_main else (lambda *a, **kw: None)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.local_world_size))
    rng = np.random.default_rng(seed + 2)
    order = rng.permutation(n)  # the same split on every rank: 80 % train, the rest test
    train_nodes, test_nodes = torch.from_numpy(order[: int(0.8 * n)]), torch.from_numpy(order[int(0.8 * n):])

    # 2. The data. local: every rank builds the graph, features and labels. dist: rank 0 writes the
    #    partition folder once, starts the owners; every rank reaches them through Ray.
    folder = folder or os.path.join(tempfile.gettempdir(), f"graphrl-dist-graphsage-{n}-{e}-{parts}-{seed}")
    if mode == "local":
        graph, x, y = make_data(n, e, dim, classes, seed)
        sampler = NeighborSampler(graph, fan, seed=seed + ctx.rank)
        eval_sampler = NeighborSampler(graph, fan, seed=seed + 1000 + ctx.rank)
        features, labels = (lambda ids: x[ids]), (lambda ids: y[ids])
        echo(f"local: {graph} and its features on every rank ({time.perf_counter() - t_start:.1f} s)")
    else:
        if ctx.rank == 0:
            import ray

            graph, x, y = make_data(n, e, dim, classes, seed)
            try:
                verify(folder, expect=graph_fingerprint(graph))
                echo(f"partition folder {folder} verified: reused")
            except PartitionError:
                t0 = time.perf_counter()
                body = write_partitions(graph, folder, parts, method=method, seed=seed, features=x, labels=y)
                b = body["balance"]
                echo(f"partitioned with {body['method']} in {time.perf_counter() - t0:.1f} s: edges per part "
                     f"{b['edges']}, edge cut {100 * b['cut_fraction']:.1f} %")
            del graph, x, y
            ray.init(address=ray_address or "local", namespace="graphrl", include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
            owners = RayOwners(folder, name="dist_graphsage", threads=1)
            address = [ray.get_runtime_context().gcs_address, os.environ.get("RAY_AUTH_MODE")]
        else:
            address = [None, None]
        dist.broadcast_object_list(address, src=0)
        if ctx.rank != 0:
            if address[1]:  # joining by address needs the mode (read when ray is imported); the token is
                os.environ["RAY_AUTH_MODE"] = address[1]  # this host's ~/.ray/auth_token
            import ray

            ray.init(address=ray_address or address[0], namespace="graphrl", log_to_driver=False,
                     configure_logging=False)
            owners = RayOwners.attach(folder, "dist_graphsage")
        sampler = DistNeighborSampler(owners, fan, seed=seed + ctx.rank)
        eval_sampler = DistNeighborSampler(owners, fan, seed=seed + 1000 + ctx.rank)
        store = DistFeatureStore(owners, cache_rows=cache_rows)
        label_store = DistFeatureStore(owners, "labels")
        features, labels = store.fetch, label_store.fetch
        echo(f"dist: {parts} Ray owners of {folder} ({time.perf_counter() - t_start:.1f} s)")

    # 3. The model, wrapped in DDP (rank 0's parameters go to every rank).
    model = wrap_model(SAGE(dim, hidden, classes, len(fan), seed), ctx)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    batches = DistributedBatchSampler(train_nodes.numel(), batch_size, rank=ctx.rank,
                                      world_size=ctx.world_size, seed=seed)

    # 4. Train: sample, read the rows, step; DDP averages the gradients.
    t_train = time.perf_counter()
    sample_s, losses, step = 0.0, [], 0
    while step < steps:
        epoch = [train_nodes[idx] for idx in islice(batches, steps - step)]
        stream = blocks_of(sampler, epoch, per_request)
        for seeds in epoch:
            t0 = time.perf_counter()
            blocks = next(stream)
            h, target = features(blocks[0].src_nodes), labels(seeds)
            sample_s += time.perf_counter() - t0
            loss = F.cross_entropy(model(blocks, h), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
    echo(f"trained {steps} steps in {time.perf_counter() - t_train:.1f} s ({sample_s:.1f} s sampling and "
         f"reading rows on rank 0); loss {losses[0]:.6f} -> {losses[-1]:.6f}")

    # 5. Evaluate: each rank takes every W-th of the first --eval-nodes test nodes; one all-reduce.
    model.eval()
    correct = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        mine = test_nodes[:eval_nodes][ctx.rank:: ctx.world_size]
        chunks = [mine[lo: lo + batch_size] for lo in range(0, mine.numel(), batch_size)]
        for seeds, blocks in zip(chunks, blocks_of(eval_sampler, chunks, per_request), strict=True):
            pred = model.module(blocks, features(blocks[0].src_nodes)).argmax(1)
            correct += torch.tensor([float((pred == labels(seeds)).sum()), float(seeds.numel())],
                                    dtype=torch.float64)
    dist.all_reduce(correct)
    echo(f"test accuracy {correct[0] / correct[1]:.6f} on {int(correct[1])} nodes ({mode}, seed {seed})")
    if mode == "dist":
        s = sampler.owners.stats
        echo(f"rank 0: {s.requests} owner requests, {s.bytes_received / 2**20:.1f} MiB received; feature "
             f"cache hit rate {store.stats.hit_rate:.3f}")
    echo(f"total wall time {time.perf_counter() - t_start:.1f} s")

    # 6. Leave: every rank is done with the owners before rank 0 (whose cluster holds them) exits.
    dist.barrier()
    if mode == "dist" and ctx.rank == 0:
        owners.close()
    shutdown_distributed()


if __name__ == "__main__":
    main()

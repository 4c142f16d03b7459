"""Data-parallel LightGCN on Gowalla with torch.distributed: one graph copy per machine, seeds split by rank.

Each process (rank) trains a DistributedDataParallel copy of the model on its own share of the
training (user, item) pairs; DDP averages the gradients, so W ranks with batches of B pairs train like
one process with batches of W * B. The graph is built once per machine, by local rank 0, in shared
memory (the memory manager's ``shared`` tier); the other local ranks attach it by name instead of
loading their own copy. At the end the ranks evaluate recall@20 / NDCG@20 together (exact full-graph
inference, all-item ranking, each rank ranking a share of the test users) and rank 0 prints them.
With ``--device auto`` (default) each rank trains on GPU <local rank> with NCCL when CUDA is
available, else on the CPU with gloo; the sampler and the evaluation run on the CPU either way.

    torchrun --nproc_per_node=2 examples/ddp_recommender.py                # 2 ranks on this machine
    torchrun --nproc_per_node=2 examples/ddp_recommender.py --minutes 3 --batch-size 2048
    python examples/ddp_recommender.py                                     # one rank, no torchrun
    torchrun --nproc_per_node=4 examples/ddp_recommender.py --device cuda  # 4 GPUs, NCCL

Across machines, start the same command on every host (see README, "Scaling out"):

    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=HOST0 --master_port=29500 \\
        examples/ddp_recommender.py
"""

from __future__ import annotations

import os
import time

import click
import numba
import torch
import torch.distributed as dist

from graphrl.cli_options import int_list
from graphrl.datasets import load_gowalla
from graphrl.memory import MemoryManager
from graphrl.nn import LightGCN
from graphrl.train import evaluate_model, evaluate_popularity
from graphrl.train.ddp import (
    DistributedBatchSampler,
    evaluate_ddp,
    init_distributed,
    share_graph,
    shutdown_distributed,
    train_bpr_ddp,
    wrap_model,
)
from samplers import LinkSampler, NeighborSampler

PAPER = {"recall": 0.1830, "ndcg": 0.1554}  # LightGCN (He et al., SIGIR 2020), 3 layers, full graph


def parse_fanouts(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    """``"10,10"`` -> ``[10, 10]``: comma-separated ints (`graphrl.cli_options.int_list`), each >= 0 or -1
    (all); else a usage error."""
    fan = int_list(value, None)
    if any(k < -1 for k in fan):
        raise click.BadParameter(f"{value!r}: each fanout must be >= 0, or -1 for all neighbours", ctx, param)
    return fan


@click.command()
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=1.5, show_default=True,
              help="Training budget (the ranks stop together at the first step past it). The clock starts "
                   "after one warm-up step, which compiles the numba kernels (tens of seconds the first "
                   "time).")
@click.option("--epochs", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Also stop after this many epochs.")
@click.option("--batch-size", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Positive pairs per step on each rank (the global batch is world size times this).")
@click.option("--fanouts", default="10,10", show_default=True, callback=parse_fanouts,
              help="Neighbours per layer, comma-separated, outermost first (one model layer each; -1 = all).")
@click.option("--negatives", type=click.IntRange(min=1), default=1, show_default=True,
              help="Uniform negatives per positive pair.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.02, show_default=True,
              help="Adam learning rate.")
@click.option("--reg", type=click.FloatRange(min=0), default=1e-4, show_default=True,
              help="L2 weight on the layer-0 embeddings (LightGCN's decay).")
@click.option("--dim", "embedding_dim", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--prefetch", type=click.IntRange(min=0), default=1, show_default=True,
              help="Batches each rank samples ahead in a background thread.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Model initialisation and the pair permutation; rank r's sampler streams use seed + r.")
@click.option("--k", type=click.IntRange(min=1), default=20, show_default=True, help="K of recall@K, NDCG@K.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads per rank for torch and the numba kernels (default: cores / local ranks).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Training device: cuda (GPU <local rank>, NCCL), cpu (gloo), or auto: cuda when "
                   "available. Sampling and evaluation run on the CPU.")
@click.option("--data-root", type=click.Path(file_okay=False), default=None,
              help="Folder holding gowalla/ (default: $GRAPHRL_DATA).")
def main(minutes: float, epochs: float | None, batch_size: int, fanouts: list[int], negatives: int, lr: float,
         reg: float, embedding_dim: int, prefetch: int, seed: int, k: int, threads: int | None,
         device: str, data_root: str | None) -> None:
    """Train LightGCN on Gowalla with DDP (launch with torchrun) and print recall@K / NDCG@K from rank 0."""
    t_start = time.perf_counter()
    fan = fanouts  # parsed and checked by parse_fanouts

    # 1. Join the job. torchrun's environment says who we are; NCCL on GPUs, gloo on CPUs.
    if device == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter("CUDA is not available here (torch.cuda.is_available() is False, torch "
                                 f"{torch.__version__}): use --device cpu or auto", param_hint="'--device'")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())  # NCCL, GPU <local rank>
    ctx = init_distributed(backend="nccl") if use_cuda else init_distributed(device="cpu")
    echo = click.echo if ctx.is_main else (lambda *a, **kw: None)
    threads = threads or max(1, (os.cpu_count() or 1) // ctx.local_world_size)
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    echo(f"{ctx.world_size} rank(s), {ctx.local_world_size} on this machine, backend {ctx.backend}, "
         f"device {ctx.device}, {threads} thread(s) each")

    # 2. One graph per machine: local rank 0 loads Gowalla into the shared tier, the others attach.
    #    The training pairs and the per-user train/test item lists for evaluation travel the same way.
    memory = MemoryManager()

    def build():
        ds = load_gowalla(data_root)
        train_indptr, train_items = ds.user_item_csr("train")
        test_indptr, test_items = ds.user_item_csr("test")
        return ds.graph, {"users": ds.train_users, "items": ds.train_items + ds.num_users,
                          "train_indptr": train_indptr, "train_items": train_items,
                          "test_indptr": test_indptr, "test_items": test_items,
                          "num_users": ds.num_users, "num_items": ds.num_items}

    shared = share_graph(build, memory, ctx)  # the loader's private copy is garbage once build returns
    graph, num_users, num_items = shared.graph, shared.meta["num_users"], shared.meta["num_items"]
    arrays = {name: t.numpy() for name, t in shared.tensors.items()}
    echo(f"data: gowalla, {num_users:,} users, {num_items:,} items, "
         f"{shared.tensors['users'].numel():,} train pairs; {graph} "
         f"(ready in {time.perf_counter() - t_start:.1f} s)")
    # What the memory managers hold on the shared tier, per machine: one copy, however many ranks.
    owned = [None] * ctx.world_size
    dist.all_gather_object(owned, (ctx.node, sum(u["bytes"] for u in memory.stats()["shared"].values())))
    for node in sorted({n for n, _ in owned}):
        sizes = [b for n, b in owned if n == node]
        echo(f"shared tier on {node}: {sum(sizes) / 2**20:.1f} MiB for {len(sizes)} ranks "
             f"({sum(b > 0 for b in sizes)} owner, the others attached)")

    # 3. This rank's share of the pairs, its own negatives and neighbours; all pairs define positives.
    link = LinkSampler(NeighborSampler(graph, fan, seed=seed + ctx.rank), shared.tensors["users"],
                       shared.tensors["items"], batch_size=batch_size, num_negatives=negatives,
                       item_range=(num_users, num_users + num_items), seed=seed + ctx.rank + 1)
    batches = DistributedBatchSampler(link.num_pairs, batch_size, rank=ctx.rank, world_size=ctx.world_size,
                                      seed=seed)

    # 4. The single-process model, wrapped in DDP (rank 0's initial parameters go to every rank), on the
    #    training device; each step moves its CPU-sampled batch there.
    model = LightGCN.from_graph(graph, num_layers=len(fan), embedding_dim=embedding_dim, seed=seed)
    ddp = wrap_model(model, ctx)
    echo(f"model: LightGCN, {len(fan)} layers, dim {embedding_dim}; fanouts {fan}; batch {batch_size} per "
         f"rank ({batch_size * ctx.world_size} global), {len(batches)} steps per epoch; lr {lr:g}; "
         f"budget {minutes:g} min" + (f" or {epochs:g} epoch(s)" if epochs else ""))

    # 5. Train: every rank samples its batch, DDP averages the gradients, the ranks stop together.
    stats = train_bpr_ddp(ddp, link, batches, epochs=epochs, minutes=minutes, lr=lr, reg=reg,
                          prefetch=prefetch, progress=ctx.is_main)
    edges = torch.tensor([float(stats.sampled_edges), stats.sample_seconds], dtype=torch.float64,
                         device=ctx.device)  # NCCL reduces GPU tensors only
    dist.all_reduce(edges)
    edges = edges.cpu()
    last = stats.losses[-min(len(stats.losses), 50):]
    echo(f"trained {stats.seconds:.1f} s: {stats.steps:,} steps, {stats.epochs:.2f} epochs, stopped by "
         f"{stats.stopped_by}; BPR loss {stats.losses[0]:.4f} -> {sum(last) / len(last):.4f} (mean of last "
         f"{len(last)}); sampled {edges[0]:,.0f} edges on all ranks, "
         f"{edges[0] / max(edges[1], 1e-9) * ctx.world_size:,.0f} edges/s together")

    # 6. Evaluate on the test split: each rank ranks every W-th test user, one all-reduce combines them.
    #    Exact inference and ranking run on the CPU.
    t_eval = time.perf_counter()
    model.cpu()
    train_csr = (arrays["train_indptr"], arrays["train_items"])
    test_csr = (arrays["test_indptr"], arrays["test_items"])
    test = evaluate_ddp(lambda t: evaluate_model(model, graph, num_users, train_csr, t, k=k), test_csr)
    pop = evaluate_ddp(lambda t: evaluate_popularity(train_csr, t, num_items, k=k), test_csr)
    echo(f"test recall@{k}: {test.recall:.4f}  NDCG@{k}: {test.ndcg:.4f}  ({test.num_users:,} users with "
         f"test items; LightGCN paper: recall@20 {PAPER['recall']}, NDCG@20 {PAPER['ndcg']})")
    echo(f"popularity baseline recall@{k}: {pop.recall:.4f}  NDCG@{k}: {pop.ndcg:.4f}")
    echo(f"evaluation {time.perf_counter() - t_eval:.1f} s; "
         f"total wall time {time.perf_counter() - t_start:.1f} s")

    # 7. Leave: the owner's manager unlinks the shared segments; attached ranks only unmap.
    del link
    memory.close()
    shutdown_distributed()


if __name__ == "__main__":
    main()

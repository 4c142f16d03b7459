"""Full-graph GCN on Cora or CiteSeer, as in Kipf and Welling (ICLR 2017), over several seeds.

The paper's setting: the Planetoid split (20 labelled nodes per class, 500 validation, 1,000 test
nodes), row-normalised bag-of-words features, 2 layers, 16 hidden units, dropout 0.5, Adam with
learning rate 0.01, weight decay 5e-4 on the first layer, 200 epochs. The paper reports 81.5 %
test accuracy on Cora and 70.3 % on CiteSeer. Each propagation runs through `FullGraph`, destination
partition by partition under a device budget (``--device-budget``; the device tier is host memory
without a GPU). ``--device cuda`` is HongTu's setting: the weights on the GPU, the vertex data on the
host, partitions streamed through the device with a cache of rows several partitions read
(``--no-dedup`` to compare); it prints the host-device bytes of the last seed (``fg.traffic()``).
``--model sage`` trains GraphSAGE-mean instead. Training runs on ``threads_for(nodes x hidden)`` threads, the
thread policy's rule for small work (`graphrl.threads`: one on Cora and CiteSeer); ``--threads`` chooses.

    python examples/full_graph_gcn.py --dataset cora --seeds 10
    python examples/full_graph_gcn.py --dataset citeseer --seeds 10 --device-budget 256KiB
    python examples/full_graph_gcn.py --dataset cora --device cuda --device-budget 128KiB
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import click
import torch

from graphrl.datasets import load_planetoid
from graphrl.memory import MemoryManager
from graphrl.nn.gcn import GCN
from graphrl.nn.sage import GraphSAGE
from graphrl.threads import limit, threads_for
from graphrl.train import row_normalize, train_full_graph
from samplers import FullGraph

PAPER = {"cora": 81.5, "citeseer": 70.3}


@click.command()
@click.option("--dataset", type=click.Choice(["cora", "citeseer"]), default="cora", show_default=True)
@click.option("--seeds", type=click.IntRange(min=1), default=10, show_default=True,
              help="Runs with seeds 0..seeds-1 (initialisation and dropout).")
@click.option("--epochs", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--hidden", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--dropout", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.5, show_default=True)
@click.option("--lr", type=float, default=0.01, show_default=True)
@click.option("--weight-decay", type=float, default=5e-4, show_default=True,
              help="L2 on the first layer (the paper's choice).")
@click.option("--early-stopping", type=click.IntRange(min=1), default=None,
              help="Kipf and Welling's window on the validation loss (off by default, as in PyG's example).")
@click.option("--device-budget", default=None,
              help="Device-tier budget of the memory manager, e.g. '256KiB' (default: unlimited).")
@click.option("--partition-bytes", default="256MiB", show_default=True,
              help="Most bytes of one partition's working set.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: weights on the GPU, vertex data on the host, FullGraph's staged path.")
@click.option("--dedup/--no-dedup", default=True, show_default=True,
              help="With --device cuda: the device cache of rows that several partitions read.")
@click.option("--model", "model_name", type=click.Choice(["gcn", "sage"]), default="gcn", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads for torch and the numba kernels while training (default: graphrl.threads' rule "
                   "for small work, threads_for(nodes x hidden): 1 on Cora and CiteSeer, whose per-node "
                   "operations are too small to gain from a fork-join).")
@click.option("--data-root", type=click.Path(file_okay=False), default=None,
              help="Folder holding cora_citeseer/ (default: $GRAPHRL_DATA, else ../shared/data).")
def main(dataset: str, seeds: int, epochs: int, hidden: int, layers: int, dropout: float, lr: float,
         weight_decay: float, early_stopping: int | None, device_budget: str | None, partition_bytes: str,
         device: str, dedup: bool, model_name: str, threads: int | None, data_root: str | None) -> None:
    """Train a GCN on DATASET with SEEDS seeds and print the test accuracy, mean +- std."""
    if data_root is None and not os.environ.get("GRAPHRL_DATA"):
        data_root = str(Path(__file__).resolve().parents[2] / "shared" / "data")
    ds = load_planetoid(dataset, data_root)
    features = row_normalize(ds.features).to_sparse()  # sparse: dropout and X W touch the non-zeros
    click.echo(f"{ds.name}: {ds.num_nodes:,} nodes, {ds.graph.num_edges:,} directed edges, "
               f"{ds.num_features:,} features, {ds.num_classes} classes; "
               f"train/val/test {int(ds.train_mask.sum())}/{int(ds.val_mask.sum())}/"
               f"{int(ds.test_mask.sum())}")

    # Each step is a loop of torch operations over nodes x hidden values (and our propagation kernels):
    # the thread policy's rule for small work picks the count, as graphrl demo's node classification does.
    threads = threads if threads is not None else threads_for(ds.num_nodes * hidden)
    click.echo(f"threads: {threads} (torch, numba and graphrl's kernels; --threads to choose)")
    budgets = {"device": device_budget} if device_budget else None
    on_gpu = device == "cuda" and torch.cuda.is_available()
    norm = ("sym", True) if model_name == "gcn" else ("left", False)  # SAGE: the in-neighbour mean
    with limit(threads), MemoryManager(budgets=budgets, device="cuda" if on_gpu else "cpu") as mm, \
            FullGraph(ds.graph, normalization=norm[0], add_self_loops=norm[1], memory=mm,
                      partition_bytes=partition_bytes, device=device,
                      dedup=dedup if device == "cuda" else None) as fg:
        click.echo(f"{fg}; partitions at width {hidden}: {fg.num_partitions(hidden)}")
        accs = []
        start = time.perf_counter()
        for seed in range(seeds):
            cls = GCN if model_name == "gcn" else GraphSAGE
            model = cls(ds.num_features, hidden, out_dim=ds.num_classes, layers=layers, dropout=dropout,
                        seed=seed)
            if on_gpu:
                model = model.to("cuda")
            fg.traffic(reset=True)
            result = train_full_graph(model, fg, features, ds.labels, ds.train_mask, epochs=epochs, lr=lr,
                                      weight_decay=weight_decay, val_mask=ds.val_mask, test_mask=ds.test_mask,
                                      early_stopping=early_stopping)
            accs.append(100.0 * result.test_acc)
            click.echo(f"seed {seed}: test accuracy {accs[-1]:.1f} %  (val {100 * result.val_acc:.1f} %, "
                       f"{result.epochs} epochs, {1000 * result.step_seconds:.1f} ms/step)")
        peak = mm.stats()["device"].get("samplers.full_graph", {}).get("peak", 0)
        t = fg.traffic()
        if t["staged"]:
            click.echo(f"last seed, staged (dedup {'on' if t['dedup'] else 'off'}): host-to-device "
                       f"{t['host_to_device_bytes'] / 2**20:,.1f} MiB, device-to-host "
                       f"{t['device_to_host_bytes'] / 2**20:,.1f} MiB, served by the dedup cache "
                       f"{t['dedup_hit_bytes'] / 2**20:,.1f} MiB; up to {t['partitions']} partitions")
    mean = statistics.fmean(accs)
    std = statistics.pstdev(accs) if len(accs) > 1 else 0.0
    click.echo(f"{ds.name} test accuracy over {seeds} seeds: {mean:.1f} +- {std:.1f} % "
               f"(paper {PAPER[dataset]} %; {time.perf_counter() - start:.1f} s; "
               f"device-tier peak {peak:,} bytes)")


if __name__ == "__main__":
    main()

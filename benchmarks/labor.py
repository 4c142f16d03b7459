"""LABOR against neighbour sampling, in one process: distinct vertices per layer, and GraphSAGE accuracy.

Part ``vertices``: on the Gowalla training graph (both directions) and the power-law graph of 1M nodes /
20M edges (`graphrl.datasets.synthetic.synthetic_graph`), the same batches of random seeds (1024 by
default) go through `samplers.NeighborSampler` and `samplers.LaborSampler` (LABOR-0, LABOR-1, LABOR-0
with layer dependency) with fanouts [15, 10, 5]; the metric is the mean number of source nodes of each
block (the vertices whose features a layer reads), reported as the ratio LABOR / neighbour per layer
(outermost first), with each sampler's sampled edges per second beside it.

Part ``cora``: GraphSAGE-mean (two layers on blocks, weighted by ``Block.edge_weights`` where LABOR
gives them) trained on Cora's 140 training nodes through `samplers.NeighborLoader`, once with a
`NeighborSampler` and once with a `LaborSampler` ([10, 10]), several seeds each; test accuracy on full
in-neighbourhoods (fanout -1). The claim checked: LABOR within 1 point of neighbour sampling.

Run ``python benchmarks/labor.py --help``; results go to ``benchmarks/results/labor.json``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click
import numpy as np
import torch
import torch.nn.functional as F
from _report import machine, write_result
from torch import nn

from graphrl.datasets import load_gowalla, load_planetoid
from graphrl.datasets.synthetic import synthetic_graph
from graphrl.graph import CSCGraph
from samplers import LaborSampler, NeighborLoader, NeighborSampler

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "labor.json"
VARIANTS = {"labor-0": {}, "labor-1": {"importance_sampling": 1},
            "labor-0 layer-dep": {"layer_dependency": True}}


def mean_sources(sampler, batches: list[torch.Tensor]) -> tuple[np.ndarray, float]:
    """Mean source nodes per block (outermost first) over the batches, and sampled edges per second."""
    counts = []
    edges = 0
    start = time.perf_counter()
    for seeds in batches:
        blocks = sampler.sample(seeds)
        counts.append([b.num_src_nodes for b in blocks])
        edges += sum(b.num_edges for b in blocks)
    return np.mean(counts, axis=0), edges / (time.perf_counter() - start)


def vertices_rows(label: str, graph: CSCGraph, fanouts: list[int], batch_size: int, num_batches: int,
                  seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    batches = [torch.from_numpy(rng.integers(0, graph.num_nodes, batch_size)) for _ in range(num_batches)]
    base = NeighborSampler(graph, fanouts, seed=seed)
    mean_sources(base, batches[:2])  # compile
    ns, ns_rate = mean_sources(base, batches)
    rows = []
    for name, kw in VARIANTS.items():
        ours = LaborSampler(graph, fanouts, seed=seed, **kw)
        mean_sources(ours, batches[:2])
        lab, rate = mean_sources(ours, batches)
        rows.append({"case": f"{label} {fanouts} b{batch_size} {name}",
                     "metric": "source_nodes_ratio_per_layer", "ours": [float(x) for x in lab],
                     "baseline": "NeighborSampler",
                     "baseline_value": [float(x) for x in ns], "ratio": [float(x) for x in lab / ns],
                     "ours_edges_per_s": rate, "baseline_edges_per_s": ns_rate})
    return rows


class SAGE(nn.Module):
    """GraphSAGE-mean on blocks; the mean is weighted by ``edge_weights`` when a block has them."""

    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.self_lin = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.neigh_lin = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in zip(dims[:-1], dims[1:],
                                                                                    strict=True))

    def forward(self, blocks, h: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(blocks):
            d = block.num_dst_nodes
            msg = h[block.indices]
            if block.edge_weights is not None:
                msg = msg * block.edge_weights.unsqueeze(1)
            agg = torch.zeros(d, h.shape[1]).index_add_(0, block.edge_dst(), msg)
            agg = agg / block.in_degrees().clamp(min=1).unsqueeze(1).to(h.dtype)
            h = self.self_lin[i](h[:d]) + self.neigh_lin[i](agg)
            if i < len(blocks) - 1:
                h = F.dropout(F.relu(h), 0.5, self.training)
        return h


def cora_accuracy(data, sampler_kind: str, fanouts: list[int], epochs: int, seed: int) -> float:
    torch.manual_seed(seed)
    g = data.graph
    if sampler_kind == "labor":
        sampler = LaborSampler(g, fanouts, seed=seed)
    else:
        sampler = NeighborSampler(g, fanouts, seed=seed)
    loader = NeighborLoader(g, data.train_mask, batch_size=32, features=data.features, labels=data.labels,
                            seed=seed, prefetch=0, sampler=sampler)
    model = SAGE([data.features.shape[1], 64, data.num_classes])
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        for batch in loader:
            loss = F.cross_entropy(model(batch.blocks, batch.input_features), batch.labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    test = torch.nonzero(data.test_mask).reshape(-1)
    blocks = NeighborSampler(g, [-1] * len(fanouts), seed=0).sample(test)
    with torch.no_grad():
        pred = model(blocks, data.features[blocks[0].src_nodes]).argmax(1)
    return float((pred == data.labels[test]).float().mean())


@click.command()
@click.option("--parts", default="vertices,cora", show_default=True, help="Comma-separated: vertices, cora.")
@click.option("--graphs", default="gowalla,powerlaw", show_default=True, help="Graphs of part vertices.")
@click.option("--num-nodes", default=1_000_000, show_default=True)
@click.option("--num-edges", default=20_000_000, show_default=True)
@click.option("--fanouts", default="15,10,5", show_default=True, help="Fanouts of part vertices.")
@click.option("--batch-size", default=1024, show_default=True)
@click.option("--batches", "num_batches", default=10, show_default=True)
@click.option("--epochs", default=30, show_default=True, help="Cora training epochs per run.")
@click.option("--runs", default=5, show_default=True, help="Cora seeds per sampler.")
@click.option("--seed", default=0, show_default=True)
@click.option("--output", default=str(RESULTS), show_default=True, type=click.Path(dir_okay=False))
def main(parts: str, graphs: str, num_nodes: int, num_edges: int, fanouts: str, batch_size: int,
         num_batches: int, epochs: int, runs: int, seed: int, output: str) -> None:
    """Distinct vertices per layer (LABOR / neighbour) and GraphSAGE test accuracy on Cora."""
    os.environ.setdefault("GRAPHRL_DATA", str(REPO.parent / "shared" / "data"))
    rows = []
    part_list = {p.strip() for p in parts.split(",") if p.strip()}
    if "vertices" in part_list:
        fans = [int(k) for k in fanouts.split(",")]
        for name in (g.strip() for g in graphs.split(",") if g.strip()):
            if name == "gowalla":
                graph = load_gowalla().graph
                label = f"gowalla {graph.num_nodes:,}/{graph.num_edges:,}"
            else:
                graph = synthetic_graph(num_nodes, num_edges, name, seed=seed)
                label = f"{name} {num_nodes:,}/{num_edges:,}"
            rows += vertices_rows(label, graph, fans, batch_size, num_batches, seed)
        click.echo(f"{'case':<62} {'sources per layer, LABOR / neighbour':>38}  M edges/s (ours, ns)")
        for row in rows:
            ratios = " ".join(f"{r:.3f}" for r in row["ratio"])
            click.echo(f"{row['case']:<62} {ratios:>38}  {row['ours_edges_per_s'] / 1e6:.1f}, "
                       f"{row['baseline_edges_per_s'] / 1e6:.1f}")
    if "cora" in part_list:
        data = load_planetoid("cora")
        acc = {kind: [cora_accuracy(data, kind, [10, 10], epochs, seed + r) for r in range(runs)]
               for kind in ("neighbor", "labor")}
        ours, base = float(np.mean(acc["labor"])), float(np.mean(acc["neighbor"]))
        rows.append({"case": f"cora GraphSAGE [10, 10] b32 {epochs} epochs, {runs} seeds",
                     "metric": "test_accuracy", "ours": ours, "baseline": "NeighborSampler",
                     "baseline_value": base, "ratio": ours / base, "ours_runs": acc["labor"],
                     "baseline_runs": acc["neighbor"]})
        click.echo(f"cora test accuracy: LABOR {ours:.4f} (runs {acc['labor']}), neighbour {base:.4f} "
                   f"(runs {acc['neighbor']}); difference {100 * (ours - base):+.2f} points")
    write_result("labor", rows, machine(), output)


if __name__ == "__main__":
    main()

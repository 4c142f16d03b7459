"""The ``graphrl partition`` command: split a graph into P parts and write a sealed partition folder.

    graphrl partition parts/ --dataset cora --parts 4                  # features and labels go along
    graphrl partition parts/ --dataset synthetic --size 1000000,20000000 --parts 4 --method ldg

It prints the method used (METIS through pymetis when installed, else streaming LDG), the balance:
nodes and in-edges per part, their imbalance (max / mean) and the edge cut, and the graph's fingerprint
(keep it: trainers that do not hold the graph check the folder with ``expect=``). The folder is read by
`graphrl.partition.load_partition` and `samplers.distributed` (docs/architecture.md#partitioned-graphs).
This module prints (through click); library code only logs.
"""

from __future__ import annotations

import time

import click

from graphrl.cli_options import int_list

__all__ = ["partition"]


def _size(ctx: click.Context, param: click.Parameter, text: str) -> tuple[int, int]:
    nodes, edges = int_list(text, None, count=2, names="NODES,EDGES (two integers)")
    if nodes < 1 or edges < 0:
        raise click.BadParameter(f"expected NODES >= 1 and EDGES >= 0, got {text!r}")
    return nodes, edges


@click.command()
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--dataset", type=click.Choice(["synthetic", "cora", "citeseer"]), default="synthetic",
              show_default=True, help="synthetic: the power-law graph of graphrl.datasets.synthetic_graph "
              "(no features); cora/citeseer: with their features and labels (needs $GRAPHRL_DATA).")
@click.option("--size", default="1000000,20000000", show_default=True, callback=_size,
              help="NODES,EDGES of the synthetic graph.")
@click.option("--parts", type=click.IntRange(min=1), default=4, show_default=True, help="Number of parts P.")
@click.option("--method", type=click.Choice(["auto", "metis", "ldg"]), default="auto", show_default=True,
              help="auto: METIS when pymetis is installed (pip install 'graphrl[partition]'), else LDG.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the graph and of the partitioner.")
@click.option("--data-root", type=click.Path(file_okay=False), default=None,
              help="Folder holding cora_citeseer/ (default: $GRAPHRL_DATA).")
def partition(out: str, dataset: str, size: tuple[int, int], parts: int, method: str, seed: int,
              data_root: str | None) -> None:
    """Partition a graph into PARTS parts and write them to the new folder OUT."""
    from graphrl.cli_checks import new_folder
    from graphrl.partition import write_partitions

    new_folder(out, "OUT")  # before the graph is made or loaded

    features = labels = None
    if dataset == "synthetic":
        from graphrl.datasets import synthetic_graph

        graph = synthetic_graph(size[0], size[1], "powerlaw", seed=seed)
    else:
        from graphrl.datasets import load_planetoid

        try:
            data = load_planetoid(dataset, data_root)
        except FileNotFoundError as err:
            raise click.ClickException(f"{err} (here: --data-root)") from None
        graph, features, labels = data.graph, data.features, data.labels
    t0 = time.perf_counter()
    try:
        body = write_partitions(graph, out, parts, method=method, seed=seed, features=features, labels=labels)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    b = body["balance"]
    click.echo(f"{graph.num_nodes} nodes, {graph.num_edges} edges -> {parts} parts with {body['method']} in "
               f"{time.perf_counter() - t0:.1f} s, written to {out}")
    click.echo(f"nodes per part: {b['nodes']} (imbalance {b['node_imbalance']:.3f})")
    click.echo(f"edges per part: {b['edges']} (imbalance {b['edge_imbalance']:.3f})")
    click.echo(f"edge cut: {b['edge_cut']} ({100 * b['cut_fraction']:.1f} % of edges)")
    click.echo(f"graph fingerprint (expect= of LocalOwners / RayOwners): {body['fingerprint']}")

"""``graphrl demo --task recommend``: the measured recipe in a fixed budget, exact or on sampled blocks.

The recipe is `graphrl train recommend`'s with an item bias and a spectral start: LightGCN (3 layers, dim
64), the softmax over all items for 2048 users a step, cosine scores over temperature 0.12 plus a learned
item bias, layer-0 embeddings started from the normalised training matrix's top singular vectors; a 5 %
validation split is carved from train as in the training command and the test split is ranked once at the
end. ``propagation="exact"`` propagates over the whole graph at every step; ``"sampled"`` computes the
step's users and all items from `samplers.NeighborSampler` blocks (``fanouts``, the full-degree estimator)
and prints the sampler's share of the step time. Evaluation is exact either way.

Usage (from the demo command)::

    demo_recommend(load_gowalla(), minutes=1.5, epochs=None, seed=0, propagation="sampled")
"""

from __future__ import annotations

import time
from dataclasses import replace

import click

__all__ = ["demo_recommend"]


def demo_recommend(ds, minutes: float, epochs: float | None, seed: int, lr: float = 2e-2,
                   embedding_dim: int = 64, curves=None, propagation: str = "exact",
                   fanouts: tuple[int, ...] = (10, 10, 10)) -> None:
    """Train the recipe on ``ds`` (`InteractionDataset`) for ``minutes`` and print the test ranking.

    Parameters
    ----------
    ds : InteractionDataset
    minutes : float
        Training budget (the factorisation of the spectral start counts; loading and evaluation do not).
    epochs : float or None
        Also stop after this many epochs.
    seed : int
        Seeds the validation split, the start and the batch order.
    lr : float
        Adam's learning rate.
    embedding_dim : int
    curves : DemoCurves or None
        When given, the test ranking is also evaluated after every epoch (outside the budget) and recorded.
    propagation : {"exact", "sampled"}
    fanouts : tuple[int, ...]
        ``"sampled"``: in-edges per node and layer (3 layers), outermost first; -1 takes all.

    Raises
    ------
    click.UsageError
        A bad setting or a diverging loss.
    """
    from graphrl.cli_train import RECIPE_TEMPERATURE
    from graphrl.datasets.validation import holdout_validation
    from graphrl.nn.sym_adjacency import SymNormAdjacency
    from graphrl.train.link_prediction import evaluate_popularity
    from graphrl.train.metrics import evaluate_ranking, merge_csr
    from graphrl.train.recommend import RecommendConfig, score_table, train_recommender

    split = holdout_validation(ds, fraction=0.05, seed=seed)
    train_csr, val_csr = split.dataset.user_item_csr("train"), split.validation_csr()
    test_csr, test_mask = ds.user_item_csr("test"), merge_csr(train_csr, val_csr)
    try:
        config = RecommendConfig(loss="full-softmax", init="spectral", item_bias=True, lr=lr,
                                 temperature=RECIPE_TEMPERATURE, embedding_dim=embedding_dim, minutes=minutes,
                                 epochs=1000.0 if epochs is None else epochs,
                                 eval_every=1.0 if curves is not None else 1000.0, patience=1000, seed=seed,
                                 propagation=propagation, fanouts=tuple(fanouts))
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    how = ("exact propagation" if propagation == "exact" else
           f"sampled blocks (NeighborSampler, fanouts {list(fanouts)}, full-degree estimator)")
    click.echo(f"model: LightGCN, 3 layers, dim {embedding_dim}, {how}; softmax over all "
               f"{ds.num_items:,} items, 2048 users a step, cosine / {config.temperature:g} + item bias, "
               f"spectral start, lr {lr:g}; validation: 5 % of train; budget {minutes:g} min"
               + (f" or {epochs:g} epoch(s)" if epochs else ""))
    seconds = _compile_kernels(split.dataset, config)
    click.echo(f"compiling kernels (cached after the first run): {seconds:.1f} s")
    on_eval = None
    if curves is not None:
        adj = SymNormAdjacency.from_graph(split.dataset.graph)

        def on_eval(entry: dict, model) -> None:
            users, items_t = score_table(model, adj, ds.num_users, True, config.temperature)
            test = evaluate_ranking(lambda u: users[u] @ items_t, test_mask, test_csr, k=config.k)
            curves.recommend_epoch(entry["epoch"], test, ds.name)
    try:
        report = train_recommender(split, config, progress=True, on_eval=on_eval)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    t0 = time.perf_counter()
    popularity = evaluate_popularity(test_mask, test_csr, ds.num_items, k=config.k)
    k = config.k
    click.echo(f"trained {report.train_seconds:.1f} s ({report.train_cpu_seconds:.0f} CPU s): "
               f"{report.steps:,} steps, {report.epochs:.2f} epochs, stopped by {report.stopped_by}; "
               f"softmax loss {report.curve[-1]['loss']:.4f} (mean since the previous evaluation)")
    if report.sampled_edges:
        click.echo(f"sampler throughput: {report.sampled_edges / report.sample_seconds:,.0f} sampled edges/s "
                   f"({report.sampled_edges:,} edges in {report.sample_seconds:.1f} s of sampling, "
                   f"{100 * report.sample_seconds / report.train_seconds:.1f} % of the training time)")
    click.echo(f"test recall@{k}: {report.final_test.recall:.4f}  NDCG@{k}: {report.final_test.ndcg:.4f}  "
               f"({report.final_test.num_users:,} users with test items); validation recall@{k} "
               f"{report.curve[-1]['val_recall']:.4f}")
    click.echo(f"popularity baseline recall@{k}: {popularity.recall:.4f}  NDCG@{k}: {popularity.ndcg:.4f}")
    if ds.name == "gowalla":
        click.echo(f"LightGCN's paper (about 1000 epochs): recall@{k} 0.1830  NDCG@{k} 0.1554")
    if curves is not None:
        curves.recommend_final(report.epochs, report.final_test, popularity, ds.name)
    click.echo(f"evaluation {report.eval_seconds + time.perf_counter() - t0:.1f} s")


def _compile_kernels(dataset, config) -> float:
    """Before the budget's clock: one training step of ``config`` on a small synthetic set (normal start)
    and, for ``propagation="sampled"``, one sample of every node of ``dataset``'s graph.

    The step's numba kernels (the sampler's, the sparse products') compile at their first call, which on
    a fresh clone (no numba cache beside the sources) is most of the first step's time; here they compile,
    or load from the cache, outside the training budget. The sampler's layers choose their kernels by size,
    so its sample runs on the graph the steps sample (a sampler of its own: the run's draws are unchanged).
    Returns the wall seconds it took.
    """
    import torch

    from graphrl.datasets import synthetic_bipartite
    from graphrl.train.rec_step import RecommenderSteps
    from samplers import NeighborSampler

    t0 = time.perf_counter()
    small = synthetic_bipartite(2048, 2048, 24_000, seed=config.seed)
    RecommenderSteps(small, replace(config, init="normal")).step(config.lr)
    if config.propagation == "sampled":
        graph = dataset.graph
        NeighborSampler(graph, list(config.fanouts), seed=config.seed).sample(torch.arange(graph.num_nodes))
    return time.perf_counter() - t0

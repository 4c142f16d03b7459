"""BPR training of a recommender on sampled blocks, and its full-ranking evaluation."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager
from graphrl.nn.lightgcn import LightGCN
from graphrl.train.metrics import RankingResult, evaluate_ranking, popularity_scores
from graphrl.train.progress import TrainingBar
from samplers.link import LinkBatch, LinkSampler, bipartite_reverse_eids
from samplers.loader import LinkLoader
from samplers.neighbor import NeighborSampler

__all__ = ["LinkPredictionConfig", "LinkPredictionReport", "TrainStats", "bpr_batch_loss", "bpr_loss",
           "bpr_step", "evaluate_model", "evaluate_popularity", "l2_penalty", "run_link_prediction",
           "train_bpr"]

log = logging.getLogger(__name__)


def bpr_loss(pos_scores: torch.Tensor, neg_scores: torch.Tensor) -> torch.Tensor:
    """BPR loss: the mean of ``-log sigmoid(pos - neg)`` over all (positive, negative) pairs.

    Parameters
    ----------
    pos_scores : torch.Tensor, float, shape [B]
        Score of each positive pair.
    neg_scores : torch.Tensor, float, shape [B, k]
        Scores of its k negatives.

    Returns
    -------
    torch.Tensor, float, scalar

    References
    ----------
    Rendle et al., "BPR: Bayesian Personalized Ranking from Implicit Feedback" (UAI 2009).
    """
    return F.softplus(neg_scores - pos_scores.unsqueeze(1)).mean()


def l2_penalty(*embeddings: torch.Tensor, batch_size: int) -> torch.Tensor:
    """LightGCN's regulariser: half the squared L2 norm of the given layer-0 embeddings, per batch pair.

    Parameters
    ----------
    *embeddings : torch.Tensor, float, shape [B, d] or [B, k, d]
        Layer-0 embeddings of the batch's users, positives and negatives (with repetition).
    batch_size : int
        B.

    Returns
    -------
    torch.Tensor, float, scalar
        ``sum(||e||^2) / 2 / B``.
    """
    return sum(e.pow(2).sum() for e in embeddings) / 2.0 / max(batch_size, 1)


@dataclass
class TrainStats:
    """What a training run did.

    Attributes
    ----------
    steps : int
        Optimiser steps taken.
    epochs : float
        Epochs completed (fractional when stopped mid-epoch).
    seconds : float
        Wall time of the loop, seconds.
    losses : list[float]
        BPR loss (without the L2 term) of every step.
    sampled_edges : int
        Edges in all blocks of the run.
    sample_seconds : float
        Wall time spent in the link sampler (negatives and neighbour sampling), seconds.
    stopped_by : str
        "epochs" or "minutes".
    """

    steps: int = 0
    epochs: float = 0.0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    sampled_edges: int = 0
    sample_seconds: float = 0.0
    stopped_by: str = "epochs"

    @property
    def sampled_edges_per_s(self) -> float:
        """The sampler's throughput: sampled edges per second of sampling time."""
        return self.sampled_edges / self.sample_seconds if self.sample_seconds > 0 else 0.0

    @property
    def end_to_end_edges_per_s(self) -> float:
        """Sampled edges per second of the whole loop (sampling, forward, backward, update)."""
        return self.sampled_edges / self.seconds if self.seconds > 0 else 0.0


def bpr_batch_loss(model: torch.nn.Module, batch: LinkBatch,
                   reg: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward half of a BPR step: the batch's BPR loss and BPR + ``reg`` * `l2_penalty`.

    Scores ``<user, item>`` by dot product of the model's outputs for the batch's seeds. Both terms are
    means over the batch's B pairs, so under `torch.nn.parallel.DistributedDataParallel` (which
    averages gradients over ranks) a step on equal-sized rank batches equals a step on their union.

    Parameters
    ----------
    model : torch.nn.Module
        A `LightGCN`, or anything callable as ``model(blocks, return_embeddings=True) -> (out [S, d],
        layer0 [S, d])``, e.g. a DDP wrapper of one.
    batch : LinkBatch
        B pairs, k negatives each, and the blocks of their unique nodes.
    reg : float
        Weight of the L2 penalty.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        Differentiable scalars: the BPR loss (without the L2 term) and the total loss to minimise.
    """
    out, emb0 = model(batch.blocks, return_embeddings=True)
    b, k = batch.neg_index.shape
    # index_select, not out[idx]: the backward of advanced indexing (index_put_ with accumulate) sums
    # repeated rows in a thread-dependent order on CPU, which made runs differ in the last bits.
    idx = torch.cat([batch.user_index, batch.pos_index, batch.neg_index.reshape(-1)])
    rows = torch.index_select(out, 0, idx)
    u, p, n = rows[:b], rows[b:2 * b], rows[2 * b:].reshape(b, k, -1)
    pos = (u * p).sum(-1)
    neg = (u.unsqueeze(1) * n).sum(-1)
    loss = bpr_loss(pos, neg)
    penalty = l2_penalty(torch.index_select(emb0, 0, idx), batch_size=b)
    return loss, loss + reg * penalty


def bpr_step(model: torch.nn.Module, batch: LinkBatch, optimizer: torch.optim.Optimizer,
             reg: float = 1e-4) -> tuple[float, float]:
    """One optimiser step of BPR + ``reg`` * `l2_penalty` on one batch (what `train_bpr` does per batch).

    `bpr_batch_loss`, then backward and ``optimizer.step()``. A non-finite loss skips the update (the
    gradients are cleared) and is returned for the caller to act on. Under DDP a rank that skips its
    backward would leave the others waiting in the gradient all-reduce: there, let the ranks agree on
    the loss first, as `graphrl.train.ddp.train_bpr_ddp` does.

    Parameters
    ----------
    model : torch.nn.Module
        A `LightGCN`, or anything callable as ``model(blocks, return_embeddings=True) -> (out [S, d],
        layer0 [S, d])``.
    batch : LinkBatch
        B pairs, k negatives each, and the blocks of their unique nodes.
    optimizer : torch.optim.Optimizer
        Over ``model``'s parameters.
    reg : float
        Weight of the L2 penalty.

    Returns
    -------
    tuple[float, float]
        The BPR loss (without the L2 term) and the total loss that was minimised.
    """
    loss, total = bpr_batch_loss(model, batch, reg)
    optimizer.zero_grad(set_to_none=True)
    total_value = float(total.detach())
    if math.isfinite(total_value):
        total.backward()
        optimizer.step()
    return float(loss.detach()), total_value


def train_bpr(model: LightGCN, link_sampler: LinkSampler | LinkLoader, *, epochs: float | None = None,
              minutes: float | None = None, lr: float = 1e-3, reg: float = 1e-4,
              optimizer: torch.optim.Optimizer | None = None, progress: bool = False,
              on_epoch: Callable[[int, LightGCN], None] | None = None) -> TrainStats:
    """Train ``model`` with BPR on ``link_sampler``'s batches until an epoch count or a wall-clock budget.

    Each step: sample a batch (pairs, negatives, blocks), compute the seeds' representations on the
    blocks, score ``<user, item>`` by dot product, minimise BPR + ``reg`` * `l2_penalty` of the layer-0
    embeddings with Adam.

    Parameters
    ----------
    model : LightGCN
        Or any module with ``model(blocks, return_embeddings=True) -> (out [S, d], layer0 [S, d])``.
    link_sampler : LinkSampler or LinkLoader
        Yields the batches; one pass over it is an epoch. A `LinkLoader` samples the next batches in a
        background thread while this loop trains (leaving an epoch early stops its thread).
    epochs : float or None
        Stop after this many epochs (a fraction stops mid-epoch).
    minutes : float or None
        Stop when the loop's wall time reaches this many minutes (checked after every step).
    lr : float
        Adam's learning rate (ignored when ``optimizer`` is given).
    reg : float
        Weight of the L2 penalty (LightGCN's ``decay``, 1e-4).
    optimizer : torch.optim.Optimizer or None
        Defaults to ``Adam(model.parameters(), lr)``.
    progress : bool
        Show a tqdm bar (loss and the sampler's sampled edges/s) on stderr.
    on_epoch : callable or None
        Called as ``on_epoch(epoch, model)`` after each full epoch (1-based), e.g. to evaluate the model;
        its wall time is left out of ``minutes`` and of ``stats.seconds``, so training is the same with it
        or without it. It must leave the model's parameters as they were.

    Returns
    -------
    TrainStats

    Raises
    ------
    ValueError
        Neither ``epochs`` nor ``minutes`` given, or one is not positive; a non-finite loss.
    """
    if epochs is None and minutes is None:
        raise ValueError("give epochs, minutes or both: training needs a stopping rule")
    if epochs is not None and not epochs > 0:
        raise ValueError(f"epochs must be > 0, got {epochs}")
    if minutes is not None and not minutes > 0:
        raise ValueError(f"minutes must be > 0, got {minutes}")
    opt = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    per_epoch = len(link_sampler)
    max_steps = math.ceil(epochs * per_epoch) if epochs is not None else None
    budget = minutes * 60.0 if minutes is not None else math.inf
    stats = TrainStats()
    edges0, secs0 = link_sampler.sampled_edges, link_sampler.sample_seconds
    model.train()
    bar = TrainingBar(max_steps, budget, progress, unit="batch")
    start = time.perf_counter()
    last = start
    done = False
    while not done:
        for batch in link_sampler:
            loss_value, total = bpr_step(model, batch, opt, reg)
            if not math.isfinite(total):
                raise ValueError(f"loss became {total} at step {stats.steps}: lower lr (now {lr})")
            stats.steps += 1
            stats.losses.append(loss_value)
            if on_epoch is not None and stats.steps % per_epoch == 0:
                t_pause = time.perf_counter()
                on_epoch(stats.steps // per_epoch, model)
                model.train()
                start += time.perf_counter() - t_pause
            elapsed = time.perf_counter() - start
            if progress:
                rate = (link_sampler.sampled_edges - edges0) / max(link_sampler.sample_seconds - secs0, 1e-9)
                now = time.perf_counter()
                bar.advance(now - last, loss=f"{loss_value:.4f}", epoch=f"{stats.steps / per_epoch:.2f}",
                            edges_per_s=f"{rate:.3g}")
                last = now
            if max_steps is not None and stats.steps >= max_steps:
                stats.stopped_by, done = "epochs", True
                break
            if elapsed >= budget:
                stats.stopped_by, done = "minutes", True
                break
        if per_epoch == 0:
            break
    bar.close()
    stats.seconds = time.perf_counter() - start
    stats.epochs = stats.steps / per_epoch if per_epoch else 0.0
    stats.sampled_edges = link_sampler.sampled_edges - edges0
    stats.sample_seconds = link_sampler.sample_seconds - secs0
    log.info("trained %d steps (%.2f epochs) in %.1f s, stopped by %s; sampler %.3g edges/s",
             stats.steps, stats.epochs, stats.seconds, stats.stopped_by, stats.sampled_edges_per_s)
    return stats


def evaluate_model(model: LightGCN, graph: CSCGraph, num_users: int, train: tuple[np.ndarray, np.ndarray],
                   test: tuple[np.ndarray, np.ndarray], k: int = 20, batch_size: int = 1024) -> RankingResult:
    """Recall@K and NDCG@K of a LightGCN on a user-item graph, from its exact layer-wise inference.

    Parameters
    ----------
    model : LightGCN
        Trained on ``graph``.
    graph : CSCGraph
        Users ``0..U-1``, items ``U..N-1``.
    num_users : int
        U.
    train, test : tuple[np.ndarray, np.ndarray]
        Per-user item CSR ``(indptr [U + 1], item ids in [0, I))``, as
        `graphrl.datasets.InteractionDataset.user_item_csr` returns.
    k, batch_size : int
        As in `evaluate_ranking`.

    Returns
    -------
    RankingResult
    """
    model.eval()
    emb = model.inference(graph)
    users, items = emb[:num_users], emb[num_users:]
    items_t = items.t().contiguous()
    return evaluate_ranking(lambda u: users[u] @ items_t, train, test, k=k, batch_size=batch_size,
                            copy_scores=False)


def evaluate_popularity(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                        num_items: int, k: int = 20, batch_size: int = 1024) -> RankingResult:
    """The popularity baseline: the K most-interacted training items each user has not interacted with.

    Parameters
    ----------
    train, test : tuple[np.ndarray, np.ndarray]
        Per-user item CSR ``(indptr [U + 1], item ids in [0, I))``.
    num_items : int
        I.
    k, batch_size : int
        As in `evaluate_ranking`.

    Returns
    -------
    RankingResult
        On Gowalla: recall@20 0.0416, NDCG@20 0.0317 (`../shared/data/README.md`).
    """
    pop = popularity_scores(train[1], num_items)
    return evaluate_ranking(lambda u: pop.expand(u.shape[0], -1), train, test, k=k, batch_size=batch_size)


@dataclass(frozen=True)
class LinkPredictionConfig:
    """Settings of `run_link_prediction` (the defaults are the demo's, tuned for ~3 minutes on 2 cores).

    Attributes
    ----------
    fanouts : tuple[int, ...]
        Neighbours per layer, outermost first; the model gets one layer per entry.
    batch_size : int
        Positive pairs per step.
    num_negatives : int
        Uniform negatives per positive.
    embedding_dim : int
    lr : float
        Adam's learning rate.
    reg : float
        L2 weight on the layer-0 embeddings (LightGCN's decay).
    minutes, epochs : float or None
        Training stops at whichever comes first (at least one must be set).
    exclude : {None, "self", "reverse"}
        Target-edge exclusion of the `LinkSampler`.
    seed : int
        Seeds the model's initialisation and both samplers.
    k : int
        K of recall@K / NDCG@K.
    prefetch : int
        Batches the `LinkLoader`'s background thread keeps ready (0: sample in the training loop).
    """

    fanouts: tuple[int, ...] = (10, 10)
    batch_size: int = 8192
    num_negatives: int = 1
    embedding_dim: int = 64
    lr: float = 0.02
    reg: float = 1e-4
    minutes: float | None = 3.0
    epochs: float | None = None
    exclude: str | None = None
    seed: int = 0
    k: int = 20
    prefetch: int = 1


@dataclass
class LinkPredictionReport:
    """What `run_link_prediction` measured.

    Attributes
    ----------
    train : TrainStats
    test : RankingResult
        The trained model on the test split.
    popularity : RankingResult
        The popularity baseline on the test split.
    eval_seconds : float
        Wall time of both evaluations.
    model : LightGCN
        The trained model.
    memory : dict
        ``MemoryManager.stats()`` after evaluation (per tier and owner: bytes, peak, regions).
    """

    train: TrainStats
    test: RankingResult
    popularity: RankingResult
    eval_seconds: float
    model: LightGCN
    memory: dict = field(default_factory=dict)


def run_link_prediction(dataset, config: LinkPredictionConfig = LinkPredictionConfig(),
                        progress: bool = False, memory: MemoryManager | None = None,
                        on_epoch: Callable[[int, RankingResult], None] | None = None) -> LinkPredictionReport:
    """Train a LightGCN with BPR on sampled blocks of a user-item data set, then evaluate it and popularity.

    Places ``dataset.graph`` in regions of a `MemoryManager` (tier "pinned", else "host": the CPU
    sampler reads it there, and GPU kernels could read it in place), builds a `NeighborSampler`
    (``config.fanouts``) on it and a `LinkSampler` over the training interactions (items as node ids
    ``num_users + item``; pair i is edge i, its reverse edge i + M, as `CSCGraph.bipartite` numbers
    them), trains with `train_bpr` on a `LinkLoader` (the next batches are sampled in a background
    thread while the model trains), and evaluates recall@K / NDCG@K with exact layer-wise inference
    (`evaluate_model`) and the popularity baseline.

    Parameters
    ----------
    dataset : graphrl.datasets.InteractionDataset
        Users ``0..U-1``, items ``U..U+I-1`` in ``dataset.graph``.
    config : LinkPredictionConfig
    progress : bool
        Show tqdm bars.
    memory : MemoryManager or None
        Where the graph lives; ``None``: a manager of this call, closed at its end.
    on_epoch : callable or None
        Called as ``on_epoch(epoch, result)`` after each full training epoch with the model's test
        recall/NDCG then (`evaluate_model`; the evaluations' time does not count against
        ``config.minutes``).

    Returns
    -------
    LinkPredictionReport
        ``report.memory`` holds the manager's statistics after evaluation.

    Raises
    ------
    ValueError
        A bad setting (from the samplers, the model or `train_bpr`).
    MemoryBudgetError
        The graph does not fit ``memory``'s pinned or host budget.
    """
    own = memory is None
    mm = MemoryManager() if own else memory
    try:
        return _run_link_prediction(dataset, config, progress, mm, on_epoch)
    finally:
        if own:
            mm.close()


def _run_link_prediction(dataset, config: LinkPredictionConfig, progress: bool, mm: MemoryManager,
                         on_epoch: Callable[[int, RankingResult], None] | None) -> LinkPredictionReport:
    graph = dataset.graph.to_memory(mm, tier="pinned", fallback=("host",))
    u = dataset.train_users
    m = int(u.shape[0])
    neighbor = NeighborSampler(graph, list(config.fanouts), seed=config.seed)
    link = LinkSampler(neighbor, u, dataset.train_items + dataset.num_users, batch_size=config.batch_size,
                       num_negatives=config.num_negatives,
                       item_range=(dataset.num_users, dataset.num_users + dataset.num_items),
                       exclude=config.exclude, target_eids=torch.arange(m, dtype=torch.int64),
                       reverse_eids=bipartite_reverse_eids(m), seed=config.seed + 1)
    model = LightGCN.from_graph(graph, num_layers=len(config.fanouts), embedding_dim=config.embedding_dim,
                                seed=config.seed)
    loader = LinkLoader(link, prefetch=config.prefetch, memory=mm)
    epoch_eval = None
    if on_epoch is not None:
        csrs = dataset.user_item_csr("train"), dataset.user_item_csr("test")

        def epoch_eval(epoch: int, trained: LightGCN) -> None:
            on_epoch(epoch, evaluate_model(trained, graph, dataset.num_users, *csrs, k=config.k))
    try:
        stats = train_bpr(model, loader, epochs=config.epochs, minutes=config.minutes, lr=config.lr,
                          reg=config.reg, progress=progress, on_epoch=epoch_eval)
    finally:
        loader.close()
    t0 = time.perf_counter()
    train_csr = dataset.user_item_csr("train")
    test_csr = dataset.user_item_csr("test")
    test = evaluate_model(model, graph, dataset.num_users, train_csr, test_csr, k=config.k)
    pop = evaluate_popularity(train_csr, test_csr, dataset.num_items, k=config.k)
    return LinkPredictionReport(train=stats, test=test, popularity=pop,
                                eval_seconds=time.perf_counter() - t0, model=model, memory=mm.stats())

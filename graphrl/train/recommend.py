"""Full-graph LightGCN training with validation, plateau LR decay, early stopping and the best model kept.

`train_recommender` trains a `LightGCN` on a user-item data set with LightGCN's exact propagation
(`SymNormAdjacency`, full degrees) at every step, a BPR or sampled-softmax loss, and Adam. Every
``eval_every`` epochs it ranks all items for the validation users (`graphrl.datasets.holdout_validation`,
training items masked); the best validation recall@K keeps a copy of the weights; after ``lr_patience``
evaluations without improvement the learning rate is multiplied by ``lr_decay`` (and, with
``restore_on_decay``, the best weights are reloaded); after ``patience`` evaluations without improvement,
or at the epoch/minute budget, training ends and the best weights are restored. The test split is read
only at the end (training and validation items masked), for the best and for the final weights. With
``refit=True`` a fresh model is then trained on all training interactions (validation included) for the
validation-selected number of steps at the same learning rates, and tested too (`RecommenderSteps` is the
step both runs take).

Usage::

    split = holdout_validation(load_gowalla(), fraction=0.05, seed=0)
    report = train_recommender(split, RecommendConfig(minutes=60, schedule="cosine"), refit=True)
    report.best_test.recall, report.curve      # curve: one dict per evaluation
    report.refit_test.recall                   # the refit on all training interactions

The time budget counts training steps only; evaluations are timed separately (``report.eval_seconds``).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from graphrl.datasets.validation import ValidationSplit
from graphrl.nn.lightgcn import LightGCN
from graphrl.nn.sym_adjacency import SymNormAdjacency
from graphrl.train.metrics import RankingResult, evaluate_ranking, merge_csr
from graphrl.train.progress import TrainingBar
from graphrl.train.rec_step import RecommenderSteps

__all__ = ["RecommendConfig", "RecommendReport", "score_table", "train_recommender"]

log = logging.getLogger(__name__)
LOSSES = ("softmax", "full-softmax", "bpr")
INITS = ("normal", "spectral")
SCHEDULES = ("plateau", "cosine")
PROPAGATIONS = ("exact", "sampled")
SAMPLERS = ("neighbor", "labor")


@dataclass(frozen=True)
class RecommendConfig:
    """Settings of `train_recommender`.

    Attributes
    ----------
    loss : {"softmax", "full-softmax", "bpr"}
        Sampled softmax with ``num_negatives`` uniform negatives shared by the batch (cosine scores over
        ``temperature``); softmax over all items for a batch of users (``batch_size`` users per step,
        an epoch is one pass over the users; `full_softmax_loss`); or BPR with one uniform negative per
        pair (dot-product scores).
    num_negatives : int
        Softmax only: negatives per batch.
    temperature : float
        Softmax only.
    num_layers, embedding_dim : int
        LightGCN's L (3) and d (64).
    batch_size : int
        (user, positive item) pairs per step, drawn without replacement within an epoch.
    lr : float
        Adam's initial learning rate.
    reg : float
        LightGCN's L2 weight: ``reg * sum ||e0||^2 / 2 / B`` over the batch's layer-0 embeddings
        (users, positives and negatives).
    epochs : float
        Most epochs.
    minutes : float or None
        Training-time budget (evaluations not counted; a refit's time comes on top); ``None``: epochs
        only.
    eval_every : float
        Epochs between validation evaluations (a fraction evaluates within an epoch).
    patience : int
        Evaluations without a new best validation recall before stopping.
    lr_patience : int
        Evaluations without a new best before the learning rate decays.
    lr_decay : float
        Factor of each decay, in (0, 1].
    min_lr : float
        The learning rate never decays below this.
    restore_on_decay : bool
        Reload the best weights (and reset Adam's moments) when the learning rate decays.
    k : int
        K of recall@K / NDCG@K; model selection uses validation recall@K.
    seed : int
        Seeds the initialisation, the batch order and the negatives.
    init : {"normal", "spectral"}
        Layer-0 embeddings drawn from N(0, 0.1^2) (LightGCN's), or the top singular vectors of the
        normalised training matrix at the same mean row norm (`graphrl.nn.spectral_init`); the
        factorisation's time counts as training time.
    schedule : {"plateau", "cosine"}
        ``plateau``: the learning rate decays by ``lr_decay`` after ``lr_patience`` evaluations without a
        new best; ``cosine``: it follows a half cosine from ``lr`` to ``min_lr`` over the budget, the
        budget's progress being the larger of the share of ``epochs`` done and of ``minutes`` used by
        the steps themselves (the spectral start's time counts against ``minutes``, not as progress, so
        a run whose epochs end first is the same on any machine)
        (Loshchilov and Hutter, "SGDR", ICLR 2017, one cycle); no plateau decay then.
    item_bias : bool
        Learn a score per item added to every user's score (``LightGCN(node_bias=True)``), started at the
        centred ``log(1 + training degree)`` (the popularity-only softmax's maximum-likelihood bias) and
        not regularised; it enters the loss and the ranking.
    propagation : {"exact", "sampled"}
        How a training step computes the representations its loss reads: LightGCN's exact propagation
        over the whole graph, or the mean-of-layers readout over blocks that `samplers.NeighborSampler`
        draws for the step's nodes with ``fanouts`` (full-degree estimator, `graphrl.nn.lightgcn`).
        Evaluation is exact either way.
    fanouts : tuple[int, ...]
        ``propagation="sampled"``: in-edges drawn per node and layer, outermost first, one per layer
        (-1: all).
    sampler : {"neighbor", "labor"}
        ``propagation="sampled"``: blocks from `samplers.NeighborSampler` (``fanouts`` edges per node
        without replacement) or `samplers.LaborSampler` (LABOR-0: ``fanouts`` edges per node in
        expectation, one variate per source so destinations share sources); the estimator is the
        same full-degree one, with each node's sampled count.
    """

    loss: str = "full-softmax"
    num_negatives: int = 1024
    temperature: float = 0.1
    num_layers: int = 3
    embedding_dim: int = 64
    batch_size: int = 2048
    lr: float = 2e-2
    reg: float = 1e-4
    epochs: float = 1000.0
    minutes: float | None = 60.0
    eval_every: float = 2.0
    patience: int = 6
    lr_patience: int = 2
    lr_decay: float = 0.5
    min_lr: float = 1e-4
    restore_on_decay: bool = True
    k: int = 20
    seed: int = 0
    init: str = "normal"
    schedule: str = "plateau"
    item_bias: bool = False
    propagation: str = "exact"
    fanouts: tuple[int, ...] = (10, 10, 10)
    sampler: str = "neighbor"

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.propagation not in PROPAGATIONS:
            raise ValueError(f"propagation must be one of {PROPAGATIONS}, got {self.propagation!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.propagation == "sampled" and (len(self.fanouts) != self.num_layers
                                              or any(int(k) != k or k < -1 or k == 0 for k in self.fanouts)):
            raise ValueError(f"fanouts must give one int >= 1 (or -1: all) per layer ({self.num_layers}), "
                             f"got {self.fanouts!r}")
        for name in ("num_negatives", "num_layers", "embedding_dim", "batch_size", "patience", "lr_patience",
                     "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("temperature", "lr", "epochs", "eval_every"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.minutes is not None and not self.minutes > 0:
            raise ValueError(f"minutes must be > 0 or None, got {self.minutes!r}")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"lr_decay must lie in (0, 1], got {self.lr_decay!r}")
        if self.reg < 0 or self.min_lr < 0:
            raise ValueError(f"reg and min_lr must be >= 0, got {self.reg!r} and {self.min_lr!r}")


@dataclass
class RecommendReport:
    """What `train_recommender` did and measured.

    Attributes
    ----------
    model : LightGCN
        With the best validation weights restored.
    curve : list[dict]
        One entry per evaluation: ``epoch``, ``step``, ``train_seconds``, ``lr``, ``loss`` (mean since
        the previous evaluation), ``val_recall``, ``val_ndcg``, ``best`` (a new best).
    best_epoch : float
        Epoch of the best validation recall.
    best_val : RankingResult
    best_test, final_test : RankingResult
        Test ranking (training and validation items masked) of the best and of the last weights.
    epochs : float
    steps : int
    train_seconds, eval_seconds : float
        Wall time of the training steps and of all evaluations, seconds.
    train_cpu_seconds : float
        CPU time of this process during the training steps (all its threads), seconds: with other work
        on the machine, ``train_cpu_seconds / train_seconds`` is the share of cores training had.
    stopped_by : str
        "patience", "epochs" or "minutes".
    config : dict
    best_step : int
        Steps taken when the best validation recall was reached.
    refit_test : RankingResult or None
        With ``refit=True``: test ranking of a fresh model trained on *all* training interactions (the
        validation ones too) for ``best_step`` steps at the selection run's learning rates; else None.
    refit_model : LightGCN or None
    refit_seconds, refit_cpu_seconds : float
        Wall and CPU time of the refit's training (0 without it).
    sample_seconds : float
        ``propagation="sampled"``: wall time the selection run spent drawing blocks (0 for exact).
    sampled_edges : int
        Edges in the selection run's blocks (0 for exact).
    """

    model: LightGCN
    curve: list[dict]
    best_epoch: float
    best_val: RankingResult
    best_test: RankingResult
    final_test: RankingResult
    epochs: float
    steps: int
    train_seconds: float
    eval_seconds: float
    stopped_by: str
    train_cpu_seconds: float = 0.0
    config: dict = field(default_factory=dict)
    best_step: int = 0
    refit_test: RankingResult | None = None
    refit_model: LightGCN | None = None
    refit_seconds: float = 0.0
    refit_cpu_seconds: float = 0.0
    sample_seconds: float = 0.0
    sampled_edges: int = 0


def score_table(model: LightGCN, adj: SymNormAdjacency, num_users: int, cosine: bool,
                temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """User and item tables whose products are the model's scores: ``([U, d'], [d', I])``.

    With ``cosine`` both are L2-normalised (the softmax loss's score), else raw (the dot product, BPR's).
    With the model's ``bias``, users get a column of ones and items a row of their biases (d' = d + 1):
    the product is the training logit, ``cos(u, i) / temperature + bias[i]`` with ``cosine`` (users divided
    by ``temperature``), ``<u, i> + bias[i]`` without (``temperature`` unused, as in `bpr_pair_loss`).

    Raises
    ------
    ValueError
        ``num_users`` not in [1, N) or ``temperature`` <= 0.
    """
    if not 1 <= num_users < model.num_nodes:
        raise ValueError(f"num_users must lie in [1, {model.num_nodes}), got {num_users}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    with torch.no_grad():
        z = model.propagate(adj)
        if cosine:
            z = F.normalize(z, dim=1)
        users, items = z[:num_users], z[num_users:]
        if model.bias is not None:
            scale = 1.0 / temperature if cosine else 1.0
            users = torch.cat([users * scale, users.new_ones(num_users, 1)], dim=1)
            items = torch.cat([items, model.bias[num_users:].detach().unsqueeze(1)], dim=1)
    return users, items.t().contiguous()


def _evaluate(model, adj, num_users, cosine, masked, target, k, temperature=1.0) -> RankingResult:
    users, items_t = score_table(model, adj, num_users, cosine, temperature)
    return evaluate_ranking(lambda u: users[u] @ items_t, masked, target, k=k, copy_scores=False)


def train_recommender(split: ValidationSplit, config: RecommendConfig = RecommendConfig(),
                      progress: bool = False,
                      on_eval: Callable[[dict, LightGCN], None] | None = None,
                      refit: bool = False) -> RecommendReport:
    """Train LightGCN with full-graph propagation and early stopping on the validation split.

    Parameters
    ----------
    split : ValidationSplit
        ``split.dataset`` trains (its graph has no validation edge); ``split.val_*`` selects the model;
        ``split.dataset.test_*`` is evaluated once at the end.
    config : RecommendConfig
    progress : bool
        Show a tqdm bar.
    on_eval : callable or None
        Called as ``on_eval(entry, model)`` after each evaluation, with the new curve entry and the model
        being trained (e.g. to log, or to checkpoint); it should leave the model's parameters alone.
    refit : bool
        After selection, train a fresh model on ``split.source`` (all training interactions, the
        validation ones included) for the validation-selected number of steps, replaying the selection
        run's learning rates, and test it (``report.refit_test``): the validation split chooses when to
        stop, the final model does not lose its interactions. Needs ``schedule="cosine"``.

    Returns
    -------
    RecommendReport

    Raises
    ------
    ValueError
        A non-finite loss (lower ``lr``); ``k`` > the number of items; ``init="spectral"`` with
        ``embedding_dim`` >= min(users, items); ``refit`` without ``split.source`` or with the plateau
        schedule; a validation split with no interaction.

    References
    ----------
    He et al., "LightGCN" (SIGIR 2020); Prechelt, "Early Stopping - But When?" (1998) for patience-based
    stopping on a validation set.
    """
    ds = split.dataset
    cfg = config
    if cfg.k > ds.num_items:
        raise ValueError(f"k must lie in [1, num_items={ds.num_items}], got {cfg.k}")
    if refit and (split.source is None or cfg.schedule != "cosine"):
        raise ValueError("refit=True needs split.source (holdout_validation sets it) and schedule='cosine' "
                         f"(its learning rates are replayed), got source "
                         f"{'None' if split.source is None else 'set'} and schedule={cfg.schedule!r}")
    if split.val_users.numel() == 0:
        raise ValueError("the validation split holds no interaction (a larger validation fraction, or users "
                         "with longer histories): nothing could select the model")
    run = RecommenderSteps(ds, cfg)
    model, adj = run.model, run.adj
    cosine = run.cosine
    per_epoch = run.per_epoch
    train_csr = run.train_csr
    val_csr = split.validation_csr()
    test_mask = merge_csr(train_csr, val_csr)
    test_csr = ds.user_item_csr("test")
    budget = cfg.minutes * 60.0 if cfg.minutes is not None else math.inf
    max_steps = max(1, math.floor(cfg.epochs * per_epoch + 1e-9))  # epochs is a maximum (at least one step)
    eval_steps = max(1, round(cfg.eval_every * per_epoch))
    curve: list[dict] = []
    best = (-math.inf, None, 0.0, None, 0)  # recall, state, epoch, result, step
    since_best = since_decay = 0
    steps, train_s, eval_s, losses, cpu_s = 0, run.init_seconds, 0.0, [], run.init_cpu_seconds
    step_s = 0.0  # the steps' own time: the cosine schedule's clock (the init's time is not progress)
    last_eval = 0
    stopped_by = "epochs"
    lr = cfg.lr
    lrs: list[float] = []
    bar = TrainingBar(max_steps, budget, progress, unit="step")
    while steps < max_steps:
        t0, c0 = time.perf_counter(), time.process_time()
        if cfg.schedule == "cosine":
            lr = _cosine_lr(cfg, min(1.0, max(steps / max_steps, step_s / budget)))
        losses.append(run.step(lr))
        lrs.append(lr)
        steps += 1
        step_s += time.perf_counter() - t0
        train_s += time.perf_counter() - t0
        cpu_s += time.process_time() - c0
        bar.advance(time.perf_counter() - t0, loss=f"{losses[-1]:.4f}", epoch=f"{steps / per_epoch:.2f}",
                    lr=f"{lr:.2g}")
        out_of_time = train_s >= budget
        if steps % eval_steps and steps < max_steps and not out_of_time:
            continue
        t1 = time.perf_counter()
        model.eval()
        val = _evaluate(model, adj, ds.num_users, cosine, train_csr, val_csr, cfg.k, cfg.temperature)
        model.train()
        eval_s += time.perf_counter() - t1
        improved = val.recall > best[0]
        entry = {"epoch": steps / per_epoch, "step": steps, "train_seconds": train_s,
                 "train_cpu_seconds": cpu_s, "lr": lr,
                 "loss": float(np.mean(losses[last_eval:])), "val_recall": val.recall, "val_ndcg": val.ndcg,
                 "best": improved}
        curve.append(entry)
        last_eval = steps
        log.info("epoch %.2f: val recall@%d %.4f ndcg %.4f (lr %.3g)", entry["epoch"], cfg.k, val.recall,
                 val.ndcg, lr)
        if improved:
            best = (val.recall, copy.deepcopy(model.state_dict()), entry["epoch"], val, steps)
            since_best = since_decay = 0
        else:
            since_best += 1
            since_decay += 1
        if on_eval is not None:
            on_eval(entry, model)
        if out_of_time:
            stopped_by = "minutes"
            break
        if since_best >= cfg.patience:
            stopped_by = "patience"
            break
        if cfg.schedule == "plateau" and since_decay >= cfg.lr_patience and lr > cfg.min_lr:
            lr = max(lr * cfg.lr_decay, cfg.min_lr)
            since_decay = 0
            if cfg.restore_on_decay:
                model.load_state_dict(best[1])
                run.reset_optimizer(lr)
    bar.close()
    model.eval()
    t1 = time.perf_counter()
    final_test = _evaluate(model, adj, ds.num_users, cosine, test_mask, test_csr, cfg.k, cfg.temperature)
    if best[1] is not None:
        model.load_state_dict(best[1])
    best_test = _evaluate(model, adj, ds.num_users, cosine, test_mask, test_csr, cfg.k, cfg.temperature)
    eval_s += time.perf_counter() - t1
    report = RecommendReport(model=model, curve=curve, best_epoch=best[2], best_val=best[3],
                             best_test=best_test, final_test=final_test, epochs=steps / per_epoch,
                             steps=steps,
                             train_seconds=train_s, eval_seconds=eval_s, stopped_by=stopped_by,
                             train_cpu_seconds=cpu_s, config=asdict(cfg), best_step=best[4],
                             sample_seconds=run.sample_seconds, sampled_edges=run.sampled_edges)
    if refit and best[4] > 0:
        _refit(report, split.source, cfg, lrs[:best[4]], test_csr, progress)
    return report


def _cosine_lr(cfg: RecommendConfig, progress: float) -> float:
    """A half cosine from ``cfg.lr`` (progress 0) to ``cfg.min_lr`` (progress 1)."""
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _refit(report: RecommendReport, source, cfg: RecommendConfig, lrs: list[float], test_csr,
           progress: bool) -> None:
    """Train a fresh model on all of ``source``'s training interactions with the selection run's first
    ``len(lrs)`` learning rates (the validation-selected number of steps) and test it; fills the report's
    ``refit_*`` fields."""
    t0, c0 = time.perf_counter(), time.process_time()
    run = RecommenderSteps(source, cfg)
    for lr in tqdm(lrs, disable=not progress, unit="step", dynamic_ncols=True, desc="refit"):
        run.step(lr)
    report.refit_seconds = time.perf_counter() - t0
    report.refit_cpu_seconds = time.process_time() - c0
    run.model.eval()
    t1 = time.perf_counter()
    report.refit_test = _evaluate(run.model, run.adj, source.num_users, run.cosine, run.train_csr, test_csr,
                                  cfg.k, cfg.temperature)
    report.eval_seconds += time.perf_counter() - t1
    report.refit_model = run.model

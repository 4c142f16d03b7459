"""One training step of full-graph LightGCN: the batch order, the loss, the L2 term and Adam.

`RecommenderSteps` holds what a training run of `graphrl.train.recommend.train_recommender` advances:
the model (initialised as the config says), LightGCN's normalised adjacency of the training graph, Adam,
and the seeded batch order. Each `step(lr)` propagates over the whole graph, takes the next batch, and
makes one Adam step at learning rate ``lr``. The same config and data set give the same steps: the
selection run and a refit on the full training set (`train_recommender(refit=True)`) both use it.

Usage::

    steps = RecommenderSteps(dataset, config)
    for lr in schedule:
        loss = steps.step(lr)          # the batch's loss without the L2 term (float)
    steps.model, steps.adj, steps.epoch
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from graphrl.datasets.base import InteractionDataset
from graphrl.nn.lightgcn import LightGCN
from graphrl.nn.spectral_init import spectral_embeddings
from graphrl.nn.sym_adjacency import SymNormAdjacency
from graphrl.train.metrics import concat_ranges
from graphrl.train.rec_losses import bpr_pair_loss, full_softmax_loss, sampled_softmax_loss
from samplers import LaborSampler, NeighborSampler

__all__ = ["RecommenderSteps"]


class RecommenderSteps:
    """Model, adjacency, optimiser and batch order of one full-graph LightGCN run.

    Parameters
    ----------
    dataset : InteractionDataset
        Its training interactions and graph are trained on; its test split is not read.
    config : RecommendConfig
        ``loss``, ``num_negatives``, ``temperature``, ``num_layers``, ``embedding_dim``, ``batch_size``,
        ``lr`` (Adam's initial rate), ``reg``, ``seed``, ``init``, ``item_bias``, ``propagation`` and
        ``fanouts`` and ``sampler`` are read.

    Attributes
    ----------
    model : LightGCN
    adj : SymNormAdjacency
        LightGCN's ``D^-1/2 A D^-1/2`` of the training graph (full degrees).
    train_csr : tuple of numpy.ndarray
        The training items per user: ``(indptr int64 [U + 1], items int64 [M])``.
    per_epoch : int
        Steps per epoch: a pass over the users with a training item (full softmax) or over the pairs.
    steps : int
        Steps taken.
    init_seconds, init_cpu_seconds : float
        Wall and CPU time of the spectral initialisation (0 for ``init="normal"``).
    sampler : NeighborSampler, LaborSampler or None
        ``propagation="sampled"``: draws each step's blocks (seeded by ``config.seed``).
    sample_seconds : float
        Wall time spent drawing blocks so far.
    sampled_edges : int
        Edges in all blocks drawn so far.

    Raises
    ------
    ValueError
        ``init="spectral"`` with ``embedding_dim`` >= min(users, items).
    """

    def __init__(self, dataset: InteractionDataset, config) -> None:
        ds, cfg = dataset, config
        self.dataset, self.config = ds, cfg
        self._rng = np.random.default_rng(cfg.seed + 1)
        self.adj = SymNormAdjacency.from_graph(ds.graph)
        self.model = LightGCN.from_graph(ds.graph, num_layers=cfg.num_layers, embedding_dim=cfg.embedding_dim,
                                         seed=cfg.seed, node_bias=cfg.item_bias)
        self.train_csr = ds.user_item_csr("train")
        if cfg.item_bias:
            log_pop = np.log1p(np.bincount(self.train_csr[1], minlength=ds.num_items)).astype(np.float32)
            with torch.no_grad():
                self.model.bias[ds.num_users:] = torch.from_numpy(log_pop - log_pop.mean())
        self.init_seconds = self.init_cpu_seconds = 0.0
        if cfg.init == "spectral":
            if cfg.embedding_dim >= min(ds.num_users, ds.num_items):
                raise ValueError(f"init='spectral' needs embedding_dim < min(num_users, num_items) = "
                                 f"{min(ds.num_users, ds.num_items)}, got {cfg.embedding_dim}: use a smaller "
                                 "dim or init='normal'")
            t0, c0 = time.perf_counter(), time.process_time()
            table = spectral_embeddings(self.train_csr, ds.num_items, cfg.embedding_dim, seed=cfg.seed)
            with torch.no_grad():
                self.model.embedding.weight.copy_(torch.from_numpy(table))
            self.init_seconds, self.init_cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.cosine = cfg.loss != "bpr"
        self._per_user = cfg.loss == "full-softmax"
        self._u_all = ds.train_users.numpy()
        self._i_all = ds.train_items.numpy() + ds.num_users
        self._active = np.flatnonzero(np.diff(self.train_csr[0]) > 0)  # users with a training item
        self._m = self._active.size if self._per_user else self._u_all.size
        self.batch = min(cfg.batch_size, self._m)
        self.per_epoch = self._m // self.batch
        self._perm, self._pos = self._rng.permutation(self._m), 0
        self.steps = 0
        kind = LaborSampler if cfg.sampler == "labor" else NeighborSampler
        self.sampler = (kind(ds.graph, list(cfg.fanouts), seed=cfg.seed)
                        if cfg.propagation == "sampled" else None)
        self.sample_seconds, self.sampled_edges = 0.0, 0
        self.model.train()

    @property
    def epoch(self) -> float:
        """Epochs done: ``steps / per_epoch``."""
        return self.steps / self.per_epoch

    def reset_optimizer(self, lr: float) -> None:
        """A fresh Adam (no moments) at ``lr``: after the caller reloaded weights."""
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)

    def _representations(self, nodes: np.ndarray) -> torch.Tensor:
        """[N, d] representations of which the rows of ``nodes`` (int64) are this step's LightGCN output.

        Exact: the whole graph's propagation. Sampled: blocks for the distinct ``nodes`` (seeds, sorted),
        the model's readout over them scattered into an otherwise zero [N, d] table (rows outside
        ``nodes`` are never read), so the loss code is the same for both.
        """
        if self.sampler is None:
            return self.model.propagate(self.adj)
        seeds = torch.from_numpy(np.unique(nodes))
        t0 = time.perf_counter()
        blocks = self.sampler.sample(seeds)
        self.sample_seconds += time.perf_counter() - t0
        self.sampled_edges += sum(int(bl.indices.numel()) for bl in blocks)
        out = self.model(blocks)
        return out.new_zeros(self.model.num_nodes, out.shape[1]).index_copy(0, seeds, out)

    def step(self, lr: float) -> float:
        """One Adam step at learning rate ``lr`` on the next batch; returns the batch's loss (no L2 term).

        Raises
        ------
        ValueError
            The loss (with the L2 term) is not finite: lower ``lr``.
        """
        ds, cfg, model, b = self.dataset, self.config, self.model, self.batch
        if self._pos + b > self._m:
            self._perm, self._pos = self._rng.permutation(self._m), 0
        idx = self._perm[self._pos:self._pos + b]
        self._pos += b
        e0 = model.embedding.weight
        if self._per_user:
            users_np = self._active[idx]
            z = self._representations(np.concatenate([users_np, np.arange(ds.num_users, model.num_nodes)]))
            indptr, cols_np = self.train_csr
            counts = indptr[users_np + 1] - indptr[users_np]
            rows = torch.from_numpy(np.repeat(np.arange(b), counts))
            cols = torch.from_numpy(cols_np[concat_ranges(indptr[users_np], indptr[users_np + 1])])
            users = torch.from_numpy(users_np)
            item_bias = model.bias[ds.num_users:] if cfg.item_bias else None
            loss = full_softmax_loss(z[users], z[ds.num_users:], rows, cols, cfg.temperature,
                                     item_bias=item_bias)
            penalty = (e0[users].pow(2).sum() * (rows.numel() / b)
                       + e0[cols + ds.num_users].pow(2).sum()) / 2.0 / rows.numel()
        else:
            sel = torch.from_numpy(idx)
            users, items = torch.from_numpy(self._u_all)[sel], torch.from_numpy(self._i_all)[sel]
            n_neg = cfg.num_negatives if self.cosine else b
            neg = torch.from_numpy(self._rng.integers(0, ds.num_items, n_neg) + ds.num_users)
            z = self._representations(torch.cat([users, items, neg]).numpy())
            biases = (model.bias[items], model.bias[neg]) if cfg.item_bias else (None, None)
            if self.cosine:
                loss = sampled_softmax_loss(z[users], z[items], z[neg], cfg.temperature, pos_bias=biases[0],
                                            neg_bias=biases[1])
            else:
                loss = bpr_pair_loss(z[users], z[items], z[neg], *biases)
            penalty = (e0[users].pow(2).sum() + e0[items].pow(2).sum() + e0[neg].pow(2).sum()) / 2.0 / b
        total = loss + cfg.reg * penalty
        value = float(total.detach())
        if not math.isfinite(value):
            raise ValueError(f"loss became {value} at step {self.steps}: lower lr (now {lr:g})")
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.steps += 1
        return float(loss.detach())

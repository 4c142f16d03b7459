"""Full-graph node classification: train a model on every node's features through a `FullGraph`.

The protocol follows Kipf and Welling (ICLR 2017) and PyG's ``examples/gcn.py``: row-normalised
features (`row_normalize`), full-batch Adam (lr 0.01) on the cross-entropy of the training nodes, L2
weight decay 5e-4 on the *first layer only* (the paper's ``weight_decay * l2_loss`` of the first
layer's weights; Adam's ``weight_decay=w`` adds ``w * theta`` to the gradient, the gradient of
``w/2 ||theta||^2``, so the two agree), 200 epochs, and the test accuracy of the model after the last
epoch. Kipf and Welling also stop early when the validation loss exceeds the mean of the previous 10
(``early_stopping=10``); it is off by default, as in PyG's example, and rarely triggers within 200
epochs on Cora and CiteSeer. With ``device="cuda"`` (`run_node_classification`) the weights go to the
GPU while the vertex data stays on the host, streamed through a staged `FullGraph` (HongTu's setting).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from graphrl.datasets import load_planetoid
from graphrl.memory import MemoryManager
from graphrl.nn.gcn import GCN
from graphrl.nn.sage import GraphSAGE
from samplers.full_graph import FullGraph

__all__ = [
    "NodeClassificationReport",
    "NodeClassificationResult",
    "accuracy",
    "row_normalize",
    "run_node_classification",
    "train_full_graph",
]

logger = logging.getLogger(__name__)
MODELS = {"gcn": GCN, "sage": GraphSAGE}


@dataclass
class NodeClassificationResult:
    """What `train_full_graph` measured.

    Attributes
    ----------
    test_acc, val_acc : float or None
        Accuracy (0-1) of the final model on the test / validation nodes (None without the mask).
    train_acc : float
        Accuracy of the final model on the training nodes.
    best_val_acc : float or None
        Best validation accuracy over the epochs (evaluated after each epoch when ``val_mask`` is given).
    test_acc_at_best_val : float or None
        Test accuracy at the epoch of ``best_val_acc`` (PyG's example reports this one).
    epochs : int
        Epochs run.
    stopped_early : bool
        The early-stopping rule ended training before ``epochs``.
    losses : list of float
        Training loss of every epoch.
    seconds : float
        Wall time of training (evaluation included).
    step_seconds : float
        Mean wall time of one training step (forward, backward, optimizer step).
    """

    test_acc: float | None
    val_acc: float | None
    train_acc: float
    best_val_acc: float | None
    test_acc_at_best_val: float | None
    epochs: int
    stopped_early: bool
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    step_seconds: float = 0.0


def row_normalize(features: torch.Tensor) -> torch.Tensor:
    """Divide each row by its sum (rows summing to 0 stay 0), as Kipf and Welling's ``preprocess_features``.

    Parameters
    ----------
    features : torch.Tensor, float, shape [N, F], non-negative

    Returns
    -------
    torch.Tensor, same dtype and shape (a new tensor)
    """
    sums = features.sum(1, keepdim=True)
    return features / torch.where(sums == 0, torch.ones_like(sums), sums)


def accuracy(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of the nodes of ``mask`` whose arg-max logit is their label (0.0 for an empty mask)."""
    count = int(mask.sum())
    if count == 0:
        return 0.0
    return float((logits[mask].argmax(1) == labels[mask]).sum()) / count


def _check_mask(name: str, mask: torch.Tensor | None, n: int, labels: torch.Tensor) -> None:
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (n,):
        what = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a bool tensor of shape [{n}], got {what}")
    bad = labels[mask] < 0
    if bad.any():
        raise ValueError(f"{name} holds {int(bad.sum())} nodes without a label (label -1), "
                         f"first {int(mask.nonzero()[bad.nonzero()[0]].item())}")


def train_full_graph(model: nn.Module, fg: FullGraph, features: torch.Tensor, labels: torch.Tensor,
                     train_mask: torch.Tensor, epochs: int = 200, lr: float = 0.01,
                     weight_decay: float = 5e-4,
                     val_mask: torch.Tensor | None = None, test_mask: torch.Tensor | None = None,
                     decay: str = "first", early_stopping: int | None = None,
                     on_epoch: Callable[[int, dict], None] | None = None) -> NodeClassificationResult:
    """Train ``model(fg, features)`` full-batch with Adam on the cross-entropy of the training nodes.

    Parameters
    ----------
    model : torch.nn.Module
        Called as ``model(fg, features)`` -> logits [N, C]; a model with ``convs`` (like `GCN`) gets
        weight decay on ``convs[0]`` only when ``decay="first"``.
    fg : FullGraph
        The graph's normalised adjacency (N nodes).
    features : torch.Tensor, float32, shape [N, F]
        Input features, dense or sparse COO (row-normalise them first to follow the paper:
        `row_normalize`; sparse bag-of-words features make dropout and the first product cheap).
    labels : torch.Tensor, int64, shape [N]
        Class of each node (-1 allowed outside the masks).
    train_mask, val_mask, test_mask : torch.Tensor, bool, shape [N]
        The split; ``val_mask`` and ``test_mask`` are optional.
    epochs : int
        Training epochs (full-batch steps), >= 1.
    lr : float
        Adam's learning rate.
    weight_decay : float
        L2 coefficient (Adam's ``weight_decay``).
    decay : {"first", "all"}
        Decay the first layer's parameters only (the paper, PyG's example) or every parameter.
    early_stopping : int or None
        Kipf and Welling's rule: stop once the validation loss exceeds the mean of the previous
        ``early_stopping`` epochs' (needs ``val_mask``). None: run every epoch.
    on_epoch : callable or None
        Called as ``on_epoch(epoch, values)`` after each epoch (1-based) with ``values`` = ``{"loss",
        "train_acc", "val_acc", "test_acc"}`` (accuracies 0-1 from the evaluation pass after the step,
        None for a missing mask; needs ``val_mask``). Observation only: it does not change training.

    Returns
    -------
    NodeClassificationResult

    Raises
    ------
    ValueError
        Mismatched shapes, a mask that is not bool [N] or covers unlabelled nodes, ``epochs < 1``, an
        unknown ``decay``, ``early_stopping`` without ``val_mask``, or ``decay="first"`` for a model
        without ``convs``.

    References
    ----------
    Kipf and Welling, ICLR 2017 (``train.py``: Adam, lr 0.01, weight decay 5e-4 on the first layer, 200
    epochs, early stopping window 10); PyG ``examples/gcn.py``.
    """
    n = fg.num_nodes
    if features.dim() != 2 or features.shape[0] != n:
        raise ValueError(f"features must have shape [num_nodes={n}, F], got {tuple(features.shape)}")
    if labels.dim() != 1 or labels.shape[0] != n:
        raise ValueError(f"labels must have shape [num_nodes={n}], got {tuple(labels.shape)}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if decay not in ("first", "all"):
        raise ValueError(f"decay must be 'first' or 'all', got {decay!r}")
    if early_stopping is not None and val_mask is None:
        raise ValueError("early_stopping needs val_mask (the rule watches the validation loss)")
    for name, mask in (("train_mask", train_mask), ("val_mask", val_mask), ("test_mask", test_mask)):
        _check_mask(name, mask, n, labels)
    if decay == "first":
        convs = getattr(model, "convs", None)
        if not convs:
            raise ValueError("decay='first' needs a model with a 'convs' list of layers (like GCN); "
                             "use decay='all' for other models")
        first = list(convs[0].parameters())
        ids = {id(p) for p in first}
        rest = [p for p in model.parameters() if id(p) not in ids]
        groups = [{"params": first, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    else:
        groups = [{"params": list(model.parameters()), "weight_decay": weight_decay}]
    optimizer = torch.optim.Adam(groups, lr=lr)

    losses: list[float] = []
    val_losses: list[float] = []
    best_val = best_test = None
    stopped = False
    step_time = 0.0
    start = time.perf_counter()
    epoch = 0
    for epoch in range(1, epochs + 1):  # noqa: B007 - the last value is reported
        t0 = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        logits = model(fg, features)
        loss = F.cross_entropy(logits[train_mask], labels[train_mask])
        loss.backward()
        optimizer.step()
        step_time += time.perf_counter() - t0
        losses.append(loss.item())
        if val_mask is not None:
            model.eval()
            with torch.no_grad():
                logits = model(fg, features)
            val_loss = float(F.cross_entropy(logits[val_mask], labels[val_mask]))
            val_acc = accuracy(logits, labels, val_mask)
            if on_epoch is not None:
                on_epoch(epoch, {"loss": losses[-1], "train_acc": accuracy(logits, labels, train_mask),
                                 "val_acc": val_acc, "test_acc": accuracy(logits, labels, test_mask)
                                 if test_mask is not None else None})
            if best_val is None or val_acc > best_val:
                best_val = val_acc
                best_test = accuracy(logits, labels, test_mask) if test_mask is not None else None
            if (early_stopping is not None and len(val_losses) >= early_stopping
                    and val_loss > sum(val_losses[-early_stopping:]) / early_stopping):
                val_losses.append(val_loss)
                stopped = True
                break
            val_losses.append(val_loss)
    model.eval()
    with torch.no_grad():
        logits = model(fg, features)
    return NodeClassificationResult(
        test_acc=accuracy(logits, labels, test_mask) if test_mask is not None else None,
        val_acc=accuracy(logits, labels, val_mask) if val_mask is not None else None,
        train_acc=accuracy(logits, labels, train_mask),
        best_val_acc=best_val,
        test_acc_at_best_val=best_test,
        epochs=epoch,
        stopped_early=stopped,
        losses=losses,
        seconds=time.perf_counter() - start,
        step_seconds=step_time / max(epoch, 1),
    )


@dataclass
class NodeClassificationReport:
    """What `run_node_classification` measured over its seeds.

    Attributes
    ----------
    dataset : str
    num_nodes, num_edges, num_features, num_classes : int
    results : list of NodeClassificationResult
        One per seed, in seed order.
    test_accs : list of float
        Test accuracy (0-1) of each seed.
    mean, std : float
        Mean and population standard deviation of ``test_accs``.
    partitions : int
        Partitions of a propagation at the hidden width.
    device_peak_bytes : int
        Peak of FullGraph's working set on the memory manager's device tier.
    seconds : float
        Wall time of all seeds (loading excluded).
    traffic : dict
        `FullGraph.traffic` of the last seed's training and evaluation passes (all zeros on the host
        path); ``traffic["per_epoch_host_to_device_bytes"]`` divides its host-to-device bytes by the
        epochs.
    """

    dataset: str
    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    results: list[NodeClassificationResult]
    test_accs: list[float]
    mean: float
    std: float
    partitions: int
    device_peak_bytes: int
    seconds: float
    traffic: dict = field(default_factory=dict)


def run_node_classification(dataset: str = "cora", seeds: int = 1, epochs: int = 200, hidden: int = 16,
                            layers: int = 2, dropout: float = 0.5, lr: float = 0.01,
                            weight_decay: float = 5e-4, early_stopping: int | None = None,
                            device_budget: int | str | None = None, partition_bytes: int | str = "256MiB",
                            root: str | os.PathLike | None = None, first_seed: int = 0, model: str = "gcn",
                            device: str = "cpu", dedup: bool | None = None,
                            on_seed: Callable[[int, NodeClassificationResult], None] | None = None,
                            on_epoch: Callable[[int, int, dict], None] | None = None
                            ) -> NodeClassificationReport:
    """Train Kipf and Welling's GCN (or GraphSAGE-mean) on Cora or CiteSeer once per seed: the paper's setup.

    Loads the Planetoid split, row-normalises the features (kept sparse), builds a `FullGraph` under a
    `MemoryManager` whose device budget is ``device_budget``, and runs `train_full_graph` per seed.

    Parameters
    ----------
    dataset : {"cora", "citeseer"}
    seeds : int
        Number of runs (>= 1); run ``i`` seeds the model's initialisation and dropout with
        ``first_seed + i``.
    epochs, hidden, layers, dropout, lr, weight_decay, early_stopping
        As in `GCN` and `train_full_graph` (defaults: the paper's).
    device_budget : int, str or None
        The device tier's budget (None: unlimited).
    partition_bytes : int or str
        FullGraph's per-partition cap.
    root : path or None
        Data folder holding ``cora_citeseer/`` (default ``$GRAPHRL_DATA``).
    first_seed : int
        Seed of the first run.
    model : {"gcn", "sage"}
        `GCN` over ``D^-1/2 (A + I) D^-1/2``, or `GraphSAGE` (mean) over ``D_in^-1 A``.
    device : {"cpu", "cuda"}
        ``"cuda"``: weights on the GPU, vertex data on the host, a staged `FullGraph` (``dedup`` True
        unless given). Without CUDA it says so once and runs the same staged path on host memory.
    dedup : bool or None
        `FullGraph`'s ``dedup`` (None on the CPU: the zero-copy host path).
    on_seed : callable or None
        Called as ``on_seed(seed, result)`` after each seed (progress output).
    on_epoch : callable or None
        Called as ``on_epoch(seed, epoch, values)`` after each epoch (`train_full_graph`'s values).

    Returns
    -------
    NodeClassificationReport

    Raises
    ------
    ValueError
        An unknown data set, model or device, or ``seeds < 1`` (and `train_full_graph`'s errors).
    FileNotFoundError
        The Planetoid files are missing.
    MemoryBudgetError
        One partition cannot fit ``device_budget``.

    References
    ----------
    Kipf and Welling, ICLR 2017, Table 2: 81.5 % on Cora, 70.3 % on CiteSeer.
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, got {model!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    on_gpu = device == "cuda" and torch.cuda.is_available()
    fg_device, fg_dedup = device, dedup
    if device == "cuda" and not on_gpu:  # said once here: FullGraph gets the equivalent CPU arguments
        logger.warning("device='cuda' without CUDA: the model stays on the CPU; FullGraph runs its staged "
                       "path on host memory and counts the transfers")
        fg_device, fg_dedup = "cpu", True if dedup is None else dedup
    ds = load_planetoid(dataset, root)
    features = row_normalize(ds.features).to_sparse()
    if on_gpu:
        features = features.coalesce()
        features = torch.sparse_coo_tensor(features.indices().pin_memory(), features.values().pin_memory(),
                                           features.shape, is_coalesced=True)
    results: list[NodeClassificationResult] = []
    start = time.perf_counter()
    budgets = {"device": device_budget} if device_budget is not None else None
    norm = {"gcn": ("sym", True), "sage": ("left", False)}[model]
    traffic: dict = {}
    with MemoryManager(budgets=budgets, device="cuda" if on_gpu else "cpu") as mm, \
            FullGraph(ds.graph, normalization=norm[0], add_self_loops=norm[1], memory=mm,
                      partition_bytes=partition_bytes, device=fg_device, dedup=fg_dedup) as fg:
        partitions = fg.num_partitions(hidden)
        for seed in range(first_seed, first_seed + seeds):
            net = MODELS[model](ds.num_features, hidden, out_dim=ds.num_classes, layers=layers,
                                dropout=dropout, seed=seed)
            if on_gpu:
                net = net.to("cuda")
            fg.traffic(reset=True)
            result = train_full_graph(net, fg, features, ds.labels, ds.train_mask, epochs=epochs, lr=lr,
                                      weight_decay=weight_decay, val_mask=ds.val_mask,
                                      test_mask=ds.test_mask, early_stopping=early_stopping,
                                      on_epoch=None if on_epoch is None
                                      else lambda e, v, seed=seed: on_epoch(seed, e, v))
            results.append(result)
            traffic = fg.traffic()
            traffic["per_epoch_host_to_device_bytes"] = traffic["host_to_device_bytes"] / result.epochs
            if on_seed is not None:
                on_seed(seed, result)
        peak = mm.stats()["device"].get("samplers.full_graph", {}).get("peak", 0)
    accs = [r.test_acc for r in results]
    return NodeClassificationReport(
        dataset=ds.name, num_nodes=ds.num_nodes, num_edges=ds.graph.num_edges, num_features=ds.num_features,
        num_classes=ds.num_classes, results=results, test_accs=accs, mean=statistics.fmean(accs),
        std=statistics.pstdev(accs) if len(accs) > 1 else 0.0, partitions=partitions,
        device_peak_bytes=peak, seconds=time.perf_counter() - start, traffic=traffic)

"""Data-parallel BPR training: the model in ``DistributedDataParallel``, one agreed step, the training loop.

`wrap_model` puts the single-process model on the training device inside ``DistributedDataParallel``;
`ddp_bpr_step` is the BPR step of `graphrl.train.link_prediction` (`bpr_batch_loss`) with the ranks
agreeing, in one small all-reduce before the backward pass, on a non-finite loss (every rank raises)
and on a wall-clock stop; `train_bpr_ddp` is the loop over a `DistributedBatchSampler`, sampling the
next batches in a background thread.

Why the union step matches: BPR and LightGCN's L2 term are both means over a batch's B pairs. DDP
averages the gradients of the W ranks, so W rank batches of equal size B give the gradient of the
mean loss over their W * B pairs: the gradient of one process's step on the union batch (with the
same negatives and, for exactness, deterministic blocks such as fanout -1).

Devices: the samplers run on the CPU over the shared graph; `ddp_bpr_step` moves each batch (its
blocks and index tensors) to the model's device, where `graphrl.nn.csr_spmm` takes its torch path
for non-CPU tensors. So a CUDA rank (NCCL) trains with the same code as a CPU rank (gloo).

References
----------
Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training" (VLDB 2020);
Rendle et al., "BPR: Bayesian Personalized Ranking from Implicit Feedback" (UAI 2009).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from graphrl.train.ddp.batch_sampler import DistributedBatchSampler
from graphrl.train.ddp.process_group import DistContext
from graphrl.train.link_prediction import TrainStats, bpr_batch_loss
from samplers.link import LinkBatch, LinkSampler

__all__ = ["ddp_bpr_step", "train_bpr_ddp", "wrap_model"]

log = logging.getLogger(__name__)

# "no buffer sync before each forward": forward_sync_buffers from torch 2.13, broadcast_buffers before
_NO_BUFFER_SYNC = ("forward_sync_buffers"
                   if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
                   else "broadcast_buffers")


def wrap_model(model: torch.nn.Module, ctx: DistContext | None = None,
               **ddp_kwargs: Any) -> DistributedDataParallel:
    """Move ``model`` to the training device and wrap it in ``DistributedDataParallel``.

    DDP broadcasts rank 0's parameters (and buffers) at construction, so every rank starts from the
    same model. Buffers are not synchronised again before every forward (``forward_sync_buffers=False``,
    ``broadcast_buffers=False`` before torch 2.13): LightGCN's degree buffers never change. Keywords go
    to DDP and override these defaults.

    Parameters
    ----------
    model : torch.nn.Module
    ctx : DistContext or None
        From `init_distributed` (None: the CPU).
    **ddp_kwargs
        E.g. ``bucket_cap_mb``, ``gradient_as_bucket_view``.

    Returns
    -------
    torch.nn.parallel.DistributedDataParallel
        ``.module`` is ``model``.

    Raises
    ------
    ValueError
        No process group exists (call `init_distributed` first).
    """
    if not dist.is_initialized():
        raise ValueError("wrap_model needs a process group: call init_distributed() first")
    device = ctx.device if ctx is not None else torch.device("cpu")
    model = model.to(device)
    kwargs: dict[str, Any] = {_NO_BUFFER_SYNC: False}
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index if device.index is not None else torch.cuda.current_device()]
    kwargs.update(ddp_kwargs)
    return DistributedDataParallel(model, **kwargs)


def _model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _batch_to(batch: LinkBatch, device: torch.device) -> LinkBatch:
    """``batch`` with its tensors and blocks on ``device`` (the same object when they are there already)."""
    if batch.users.device == device:
        return batch

    def move(value: Any) -> Any:
        return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value

    blocks = [dataclasses.replace(b, **{f.name: move(getattr(b, f.name)) for f in dataclasses.fields(b)})
              for b in batch.blocks]
    fields = {f.name: move(getattr(batch, f.name)) for f in dataclasses.fields(batch) if f.name != "blocks"}
    return dataclasses.replace(batch, blocks=type(batch.blocks)(blocks), **fields)


def ddp_bpr_step(model: torch.nn.Module, batch: LinkBatch, optimizer: torch.optim.Optimizer,
                 reg: float = 1e-4, *, stop: bool = False,
                 group: dist.ProcessGroup | None = None) -> tuple[float, bool]:
    """One data-parallel BPR step: `bpr_batch_loss` on this rank's batch, agreement, backward, update.

    The batch is moved to the model's device first (a no-op on the CPU). Before the backward pass
    the ranks all-reduce three numbers: whether their loss is finite, whether
    they want to stop (``stop``), and their loss. If any rank's loss is non-finite, every rank raises
    (none updates), instead of one rank leaving the others waiting in DDP's gradient all-reduce. The
    gradient is then averaged over ranks by DDP, so with equal-sized rank batches the step equals a
    single-process step on their union.

    Parameters
    ----------
    model : torch.nn.Module
        The DDP-wrapped model (`wrap_model`); a plain module in a one-process group.
    batch : LinkBatch
        This rank's batch (the same size on every rank).
    optimizer : torch.optim.Optimizer
        Over the model's parameters.
    reg : float
        Weight of the L2 penalty.
    stop : bool
        This rank asks to stop after this step (e.g. its clock ran out).
    group : torch.distributed.ProcessGroup or None
        Default: the world.

    Returns
    -------
    tuple[float, bool]
        The BPR loss averaged over the ranks, and whether any rank asked to stop.

    Raises
    ------
    ValueError
        Some rank's loss is NaN or infinite (raised on every rank, before any update).
    """
    batch = _batch_to(batch, _model_device(model))
    loss, total = bpr_batch_loss(model, batch, reg)
    total_value = float(total.detach())
    finite = math.isfinite(total_value)
    loss_value = float(loss.detach()) if finite else 0.0
    flags = torch.tensor([0.0 if finite else 1.0, 1.0 if stop else 0.0, loss_value], dtype=torch.float64,
                         device=_model_device(model))
    world = 1
    if dist.is_initialized():
        dist.all_reduce(flags, group=group)
        world = dist.get_world_size(group)
    bad, stops, loss_sum = flags.tolist()
    if bad > 0:
        raise ValueError(f"loss became non-finite on {int(bad)} of {world} ranks (here: {total_value}): "
                         "lower the learning rate")
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    optimizer.step()
    return loss_sum / world, stops > 0


def _batch_stream(batches: DistributedBatchSampler, start_epoch: int) -> Iterator[torch.Tensor]:
    epoch = start_epoch
    while True:
        batches.set_epoch(epoch)
        yield from batches
        epoch += 1


def train_bpr_ddp(model: torch.nn.Module, link_sampler: LinkSampler, batches: DistributedBatchSampler, *,
                  epochs: float | None = None, minutes: float | None = None, max_steps: int | None = None,
                  lr: float = 1e-3, reg: float = 1e-4, optimizer: torch.optim.Optimizer | None = None,
                  prefetch: int = 1, start_epoch: int = 0, progress: bool = False, warmup_steps: int = 1,
                  group: dist.ProcessGroup | None = None) -> TrainStats:
    """Data-parallel `graphrl.train.train_bpr`: every rank trains on its share of the positive pairs.

    Each step, this rank samples the batch of its next pair indices from ``batches`` with
    ``link_sampler.sample`` (negatives are drawn against *all* the sampler's pairs, as in one process),
    and takes a `ddp_bpr_step`. A background thread samples the next ``prefetch`` batches while this
    one trains. The ranks stop together: after a number of steps that is the same everywhere
    (``epochs``, ``max_steps``), or when any rank's wall clock reaches ``minutes``, which they agree on in
    the step's all-reduce. The clock for ``minutes`` starts after ``warmup_steps`` steps: the first
    step compiles the numba kernels of the sampler and of `graphrl.nn.csr_spmm` (tens of seconds on a
    cold cache, more on a loaded machine), which would otherwise eat a short budget. Any other
    exception on one rank (a sampler error, say) leaves the others waiting in their next collective
    until ``torchrun`` stops them, which it does when a rank fails, or until the process group's
    timeout.

    Parameters
    ----------
    model : torch.nn.Module
        The DDP-wrapped model (`wrap_model`).
    link_sampler : LinkSampler
        Over all training pairs (build it with a rank-dependent ``seed`` so that the ranks draw
        different negatives and neighbours).
    batches : DistributedBatchSampler
        This rank's batches of ``range(link_sampler.num_pairs)``.
    epochs : float or None
        Stop after ``ceil(epochs * len(batches))`` steps.
    minutes : float or None
        Stop after the first step at which some rank's clock, started after the warm-up steps, has run
        this many minutes (so at least ``warmup_steps + 1`` steps run).
    max_steps : int or None
        Stop after this many steps.
    lr : float
        Adam's learning rate (ignored when ``optimizer`` is given).
    reg : float
        Weight of the L2 penalty.
    optimizer : torch.optim.Optimizer or None
        Defaults to ``Adam(model.parameters(), lr)``.
    prefetch : int
        Batches sampled ahead in a background thread (0: sample in the loop).
    start_epoch : int
        Epoch number of the first batch (the permutation's ``set_epoch``).
    progress : bool
        A tqdm bar (show it on one rank only).
    warmup_steps : int
        Steps (trained as usual) before the clock for ``minutes`` starts; 0 starts it at once.
    group : torch.distributed.ProcessGroup or None
        Default: the world.

    Returns
    -------
    TrainStats
        ``losses`` are averaged over the ranks; ``sampled_edges`` and ``sample_seconds`` are this
        rank's; ``stopped_by`` is "epochs", "steps" (``max_steps``) or "minutes"; ``seconds`` is the
        whole loop, warm-up included.

    Raises
    ------
    ValueError
        No stopping rule, or one that is not positive; ``batches`` covers another range than the
        sampler's pairs or has no batch per epoch; ``prefetch`` or ``warmup_steps`` < 0; a non-finite
        loss on any rank.
    """
    if epochs is None and minutes is None and max_steps is None:
        raise ValueError("give epochs, minutes or max_steps: training needs a stopping rule")
    for name, value in (("epochs", epochs), ("minutes", minutes), ("max_steps", max_steps)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    if batches.num_items != link_sampler.num_pairs:
        raise ValueError(f"batches covers {batches.num_items} indices but link_sampler has "
                         f"{link_sampler.num_pairs} pairs")
    per_epoch = len(batches)
    if per_epoch == 0:
        raise ValueError(f"batches has no batch per epoch ({batches.num_per_rank} indices per rank, "
                         f"batch_size={batches.batch_size}, drop_last=True): lower batch_size")
    if prefetch < 0:
        raise ValueError(f"prefetch must be >= 0, got {prefetch}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    limits = [s for s in (math.ceil(epochs * per_epoch) if epochs is not None else None, max_steps) if s]
    steps_cap = min(limits) if limits else None
    budget = minutes * 60.0 if minutes is not None else math.inf
    opt = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    stats = TrainStats()
    edges0, secs0 = link_sampler.sampled_edges, link_sampler.sample_seconds
    ids = _batch_stream(batches, start_epoch)
    pool = ThreadPoolExecutor(1, thread_name_prefix="graphrl-ddp-sampler") if prefetch else None
    pending: deque[Future] = deque()
    bar = tqdm(total=steps_cap, disable=not progress, unit="batch", dynamic_ncols=True, desc="train")
    model.train()
    start = time.perf_counter()
    clock = start if warmup_steps == 0 else None  # the budget's clock starts after the warm-up steps
    try:
        if pool is not None:
            for _ in range(prefetch):
                pending.append(pool.submit(link_sampler.sample, next(ids)))
        while True:
            if pool is not None:
                batch = pending.popleft().result()
                pending.append(pool.submit(link_sampler.sample, next(ids)))
            else:
                batch = link_sampler.sample(next(ids))
            out_of_time = clock is not None and time.perf_counter() - clock >= budget
            loss, stop = ddp_bpr_step(model, batch, opt, reg, stop=out_of_time, group=group)
            stats.steps += 1
            if clock is None and stats.steps >= warmup_steps:
                clock = time.perf_counter()
            stats.losses.append(loss)
            if progress:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", epoch=f"{stats.steps / per_epoch:.2f}", refresh=False)
            if steps_cap is not None and stats.steps >= steps_cap:
                stats.stopped_by = "epochs" if epochs is not None and stats.steps >= epochs * per_epoch \
                    else "steps"
                break
            if stop:
                stats.stopped_by = "minutes"
                break
    finally:
        bar.close()
        for fut in pending:
            fut.cancel()
        if pool is not None:
            pool.shutdown(wait=True)
    stats.seconds = time.perf_counter() - start
    stats.epochs = stats.steps / per_epoch
    stats.sampled_edges = link_sampler.sampled_edges - edges0
    stats.sample_seconds = link_sampler.sample_seconds - secs0
    log.info("rank trained %d steps (%.2f epochs) in %.1f s, stopped by %s", stats.steps, stats.epochs,
             stats.seconds, stats.stopped_by)
    return stats

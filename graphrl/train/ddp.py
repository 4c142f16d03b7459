"""Data-parallel GNN training with ``torch.distributed``: one graph copy per machine, seeds split by rank.

Launch with ``torchrun`` (``torchrun --nproc_per_node=2 examples/ddp_recommender.py``), as DGL and PyG
users do; nothing here opens sockets or manages a cluster. The pieces:

`init_distributed`
    Joins the process group that ``torchrun`` describes in the environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``). The backend follows the
    training device: NCCL for ``cuda:<local rank>``, gloo for the CPU; either is overridable. Without
    ``torchrun`` it makes a one-process group, so the same script also runs as plain ``python``.
`share_graph`
    Local rank 0 of each machine builds the CSC graph (and any other arrays, e.g. the training pairs)
    in `graphrl.memory.MemoryManager` regions on the ``shared`` tier; the other local ranks attach them
    by name (`MemoryManager.attach`), so a machine holds one copy however many ranks it runs. Region
    handles travel through ``all_gather_object``; a barrier makes sure every rank has attached, and
    then the owner unlinks the segments' names (`Region.unlink`): the mappings stay valid on every
    local rank, and nothing is left in ``/dev/shm`` however the job ends (``kill -9``, ``torchrun``
    tearing the job down with SIGTERM, Ctrl-C). Arrays must be dense: sparse tensors are rejected.
`DistributedBatchSampler`
    This rank's batches of an index range: ``torch.utils.data.DistributedSampler``'s split (the same
    seeded permutation on every rank, rank r takes positions r, r + W, ...) cut into batches. Every rank
    gets the same number of batches of the same sizes, so collectives never wait for a rank that has
    run out, and a DDP step on equal-sized rank batches equals a step on their union.
`wrap_model`, `ddp_bpr_step`, `train_bpr_ddp`
    ``DistributedDataParallel`` around the single-process model, and the BPR step of
    `graphrl.train.link_prediction` (`bpr_batch_loss`) with the ranks agreeing, in one small all-reduce
    before the backward pass, on a non-finite loss (every rank raises) and on a wall-clock stop.
`evaluate_ddp`
    Full-ranking recall@K / NDCG@K with the test users split over the ranks (each ranks its share with
    the single-process `evaluate_model` or `evaluate_popularity`), combined by one all-reduce.

The drop/pad rule
-----------------
As ``DistributedSampler``: with ``drop_last=False`` (default) the shuffled index list is padded by
repeating its first ``ceil(M / W) * W - M`` entries, so each of the W ranks gets ``ceil(M / W)`` indices
and the last batch of an epoch may be short (equally short on every rank); an epoch then visits every
index at least once and (when M >= W) fewer than W of them twice. With ``drop_last=True`` the last
``M mod W`` indices of the permutation (different ones each epoch) are dropped, each rank gets
``floor(M / W)`` and a short final batch is dropped too: every batch has ``batch_size`` indices and
no index is visited twice. When W divides M the shares are an exact partition either way.

Why the union step matches
--------------------------
BPR and LightGCN's L2 term are both means over a batch's B pairs. DDP averages the gradients of the
W ranks, so W rank batches of equal size B give the gradient of the mean loss over their W * B pairs:
the gradient of one process's step on the union batch (with the same negatives and, for exactness,
deterministic blocks such as fanout -1). The tests check it to float64 round-off.

Devices
-------
The samplers run on the CPU over the shared graph; `ddp_bpr_step` moves each batch (its blocks and
index tensors) to the model's device, where `graphrl.nn.csr_spmm` takes its torch path for non-CPU
tensors. So a CUDA rank (NCCL) trains with the same code as a CPU rank (gloo). Exact evaluation
(`LightGCN.inference` and the metrics) runs on the CPU: evaluate a CPU model.

References
----------
Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training" (VLDB 2020) for
DDP; ``torch.utils.data.DistributedSampler`` for the seed split; DGL's and PyG's multi-GPU examples,
which share one graph per machine between the trainer processes.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import logging
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler
from tqdm.auto import tqdm

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager, Region, Tier
from graphrl.train.link_prediction import TrainStats, bpr_batch_loss
from graphrl.train.metrics import RankingResult
from samplers.link import LinkBatch, LinkSampler

__all__ = [
    "DistContext",
    "DistributedBatchSampler",
    "SharedGraph",
    "ddp_bpr_step",
    "evaluate_ddp",
    "init_distributed",
    "share_graph",
    "shutdown_distributed",
    "train_bpr_ddp",
    "wrap_model",
]

log = logging.getLogger(__name__)

_BACKENDS = ("gloo", "nccl")
# "no buffer sync before each forward": forward_sync_buffers from torch 2.13, broadcast_buffers before
_NO_BUFFER_SYNC = ("forward_sync_buffers"
                   if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
                   else "broadcast_buffers")


# --------------------------------------------------------------------------------------------------
# Process group


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job.

    Attributes
    ----------
    rank, world_size : int
        Global rank and number of processes.
    local_rank, local_world_size : int
        Rank among the processes of this machine, and their number.
    node : str
        Names this machine's group of local ranks (host name and ``torchrun``'s ``GROUP_RANK``): ranks
        with the same ``node`` share one graph copy.
    backend : str
        "gloo" or "nccl".
    device : torch.device
        The training device: ``cuda:<local_rank>`` with NCCL, else the CPU.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: str
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the rank that logs, evaluates and prints)."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an integer") from None


def _node_name() -> str:
    return f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '0')}"


def init_distributed(backend: str | None = None, device: str | torch.device | None = None, *,
                     timeout_s: float = 600.0) -> DistContext:
    """Join the process group described by ``torchrun``'s environment (or make a one-process group).

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (defaults without them:
    rank 0 of 1, and local = global, i.e. one machine) and rendezvouses through ``env://``
    (``MASTER_ADDR``, ``MASTER_PORT``). Without ``RANK`` in the environment it makes a one-process
    group in memory (no network), so a ``torchrun`` script also runs as plain ``python``. If the
    default group already exists, it is reused.

    Parameters
    ----------
    backend : {"gloo", "nccl"} or None
        None: NCCL when the training device is CUDA, gloo otherwise.
    device : str, torch.device or None
        Training device. None: ``cuda:<LOCAL_RANK>`` when CUDA is available and ``backend`` is not
        "gloo", else "cpu". A CUDA device becomes the current device.
    timeout_s : float
        How long a collective may wait for the other ranks before failing, seconds.

    Returns
    -------
    DistContext

    Raises
    ------
    ValueError
        An unknown backend; NCCL with a CPU device or without NCCL in this torch build; an environment
        variable that is not an integer; a rank outside ``[0, WORLD_SIZE)``.

    Examples
    --------
    >>> ctx = init_distributed()              # doctest: +SKIP
    >>> ctx.rank, ctx.world_size, ctx.backend  # doctest: +SKIP
    (0, 2, 'gloo')
    """
    if backend is not None and backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS} or None (by device), got {backend!r}")
    torchrun = "RANK" in os.environ
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} must be in [0, WORLD_SIZE={world})")
    if not 0 <= local_rank < local_world:
        raise ValueError(f"LOCAL_RANK={local_rank} must be in [0, LOCAL_WORLD_SIZE={local_world})")
    if device is None:
        cuda = torch.cuda.is_available() and backend != "gloo"
        dev = torch.device(f"cuda:{local_rank % max(torch.cuda.device_count(), 1)}" if cuda else "cpu")
    else:
        dev = torch.device(device)
    if backend is None:
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend == "nccl":
        if dev.type != "cuda":
            raise ValueError(f"backend='nccl' needs a CUDA device, got device={str(dev)!r}: use gloo on CPUs")
        if not dist.is_nccl_available():
            raise ValueError("backend='nccl': this torch build has no NCCL; use backend='gloo'")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if dist.is_initialized():
        backend = str(dist.get_backend())
        rank, world = dist.get_rank(), dist.get_world_size()
    elif torchrun:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=timeout_s))
    ctx = DistContext(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                      node=_node_name(), backend=backend, device=dev)
    log.info("rank %d of %d (local %d of %d on %s), backend %s, device %s", ctx.rank, ctx.world_size,
             ctx.local_rank, ctx.local_world_size, ctx.node, ctx.backend, ctx.device)
    return ctx


def shutdown_distributed() -> None:
    """Leave the process group (``destroy_process_group``) if one exists; idempotent."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _context() -> DistContext:
    if not dist.is_initialized():
        return DistContext(0, 1, 0, 1, _node_name(), "gloo", torch.device("cpu"))
    rank, world = dist.get_rank(), dist.get_world_size()
    return DistContext(rank, world, _env_int("LOCAL_RANK", rank), _env_int("LOCAL_WORLD_SIZE", world),
                       _node_name(), str(dist.get_backend()), torch.device("cpu"))


# --------------------------------------------------------------------------------------------------
# One graph copy per machine


@dataclass(eq=False)
class SharedGraph:
    """A graph (and arrays) in shared memory, as `share_graph` returns it on every local rank.

    Attributes
    ----------
    graph : CSCGraph
        Views of the shared regions (zero-copy on every local rank).
    tensors : dict[str, torch.Tensor]
        The other arrays ``build`` returned, also views of shared regions.
    meta : dict[str, Any]
        The other (non-array) values ``build`` returned, unpickled on each rank.
    owner : bool
        True on the local rank that built and owns the regions (its memory manager frees them when it
        closes; the budget counts them there); False where they were attached.
    regions : tuple[Region, ...]
        Every region behind ``graph`` and ``tensors`` in this process (created or attached).
    """

    graph: CSCGraph
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    owner: bool
    regions: tuple[Region, ...] = field(default=(), repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        """The shared-memory names of the regions (the same on every local rank).

        `share_graph` unlinks them once every local rank has attached (unless ``unlink=False``), so
        after it returns they are no longer in ``/dev/shm`` and cannot be attached again.
        """
        return tuple(r.name for r in self.regions if r.name is not None)


def _to_tensor(name: str, value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided:
            raise TypeError(
                f"build's array {name!r} is a sparse tensor (layout {value.layout}, shape "
                f"{tuple(value.shape)}): share_graph shares dense arrays only. Pass its dense parts under "
                f"their own names instead, e.g. {name}_indices=t.coalesce().indices() and "
                f"{name}_values=t.coalesce().values() (COO; CSR: t.crow_indices(), t.col_indices(), "
                "t.values()) with the shape as a value, and rebuild it on each rank with "
                "torch.sparse_coo_tensor / torch.sparse_csr_tensor; or pass t.to_dense()")
        return value.detach().cpu().contiguous()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    return None


def _own(build: Callable[[], Any], memory: MemoryManager) -> tuple[SharedGraph, dict[str, Any]]:
    """Run ``build`` and place its arrays on the shared tier of ``memory``; return the graph and handles."""
    built = build()
    graph, extra = built if isinstance(built, tuple) else (built, {})
    if not isinstance(graph, CSCGraph):
        raise TypeError(f"build must return a CSCGraph or (CSCGraph, mapping), got {type(graph).__name__}")
    if not isinstance(extra, Mapping):
        raise TypeError(f"build's second value must be a mapping of names to arrays or values, "
                        f"got {type(extra).__name__}")
    converted = {name: _to_tensor(name, value) for name, value in extra.items()}  # rejects sparse up front
    mine = {id(r) for r in memory.regions()}
    if graph.regions and all(r.tier is Tier.SHARED and id(r) in mine for r in graph.regions):
        shared = graph  # built straight into this manager's shared tier: no copy
    else:
        shared = graph.to_memory(memory, tier=Tier.SHARED, fallback=())
    regions = list(shared.regions)
    tensors, meta, handles = {}, {}, {}
    try:
        for name, value in extra.items():
            tensor = converted[name]
            if tensor is None:
                meta[name] = value
                continue
            region = memory.allocate(tuple(tensor.shape), tensor.dtype, Tier.SHARED, owner=f"ddp.{name}")
            regions.append(region)
            region.write(tensor)
            tensors[name] = region.tensor()
            handles[name] = region.handle()
    except BaseException:
        for region in regions[len(shared.regions):]:
            region.free()
        if shared is not graph:
            shared.free()
        raise
    graph_handles = {r.owner.removeprefix("graph."): r.handle() for r in shared.regions}
    payload = {"graph": graph_handles, "tensors": handles, "meta": meta}
    return SharedGraph(shared, tensors, meta, True, tuple(regions)), payload


def _attach(payload: dict[str, Any], memory: MemoryManager) -> SharedGraph:
    regions: list[Region] = []
    try:
        arrays: dict[str, torch.Tensor] = {}
        for name, handle in payload["graph"].items():
            region = memory.attach(handle)
            regions.append(region)
            arrays[name] = region.tensor()
        graph = CSCGraph(**arrays, regions=tuple(regions))
        tensors = {}
        for name, handle in payload["tensors"].items():
            region = memory.attach(handle)
            regions.append(region)
            tensors[name] = region.tensor()
    except BaseException:
        for region in regions:
            region.free()
        raise
    return SharedGraph(graph, tensors, dict(payload["meta"]), False, tuple(regions))


def share_graph(build: Callable[[], CSCGraph | tuple[CSCGraph, Mapping[str, Any]]], memory: MemoryManager,
                ctx: DistContext | None = None, *, group: dist.ProcessGroup | None = None,
                unlink: bool = True) -> SharedGraph:
    """One copy of a graph per machine: local rank 0 builds it on the shared tier, the others attach.

    On local rank 0 of each machine ``build()`` runs and its graph is copied into regions of ``memory``
    on the ``shared`` tier (no copy when it already lives there, built with ``memory=memory,
    tier="shared"``); dense array values (tensors, numpy arrays) of the mapping it may return go to
    shared regions too (owner ``"ddp.<name>"``), other values travel by pickle. Sparse tensors (COO,
    CSR, CSC, BSR, BSC) are not supported: pass their index and value arrays as separate entries (see
    Raises). The other local ranks never call ``build``: they attach the regions by name
    (`MemoryManager.attach`: no bytes against their budgets, no copy). The handles are exchanged with
    one ``all_gather_object`` over ``group``; a barrier then makes sure every rank has attached. Every
    rank of ``group`` must call this function (it is a collective).

    Once every rank has attached (after the barrier), the owner unlinks the segments' names
    (`graphrl.memory.Region.unlink`): every local rank keeps its mapping, the kernel frees the memory
    when the last rank unmaps it, and nothing is left in ``/dev/shm`` even when ranks are killed by a
    signal (``kill -9``, ``torchrun`` stopping the job with SIGTERM, Ctrl-C). The flip side: no other
    process can attach the regions by name afterwards (e.g. a DataLoader worker started later, which
    gets the regions by pickling); pass ``unlink=False`` for that, and the owner's ``memory`` then
    unlinks them when it frees them or closes (at the latest at a normal exit). The bytes count
    against the owner's shared-tier budget until it frees them or closes, either way.

    Parameters
    ----------
    build : callable
        ``build() -> CSCGraph`` or ``(CSCGraph, {name: tensor, ndarray or picklable value})``; runs
        only on local rank 0.
    memory : MemoryManager
        This process's manager (owner of the regions on local rank 0; holder of the attachments).
    ctx : DistContext or None
        From `init_distributed`; None reads the default group (one process when none exists).
    group : torch.distributed.ProcessGroup or None
        The ranks taking part (default: the world).
    unlink : bool
        Unlink the segments' names once every local rank has attached (default). False keeps them
        attachable by name until the owner frees them.

    Returns
    -------
    SharedGraph
        The same graph, arrays and values on every rank of a machine, over the same memory.

    Raises
    ------
    TypeError
        ``build`` returned something other than a CSCGraph (with an optional mapping), or a sparse
        tensor among its arrays (the message names it; pass ``t.indices()`` / ``t.values()`` or
        ``t.crow_indices()`` / ``t.col_indices()`` / ``t.values()`` as separate entries, or
        ``t.to_dense()``). Raised on the owner; the other ranks raise RuntimeError quoting it.
    MemoryBudgetError
        The owner's shared tier has no room (raised on the owner).
    RuntimeError
        On the other ranks of a machine whose local rank 0 failed (the message quotes its error), or
        when a machine has no local rank 0 (``LOCAL_RANK`` not set by the launcher).

    Examples
    --------
    >>> def build():                                                # doctest: +SKIP
    ...     ds = load_gowalla()
    ...     return ds.graph, {"users": ds.train_users, "num_users": ds.num_users}
    >>> shared = share_graph(build, memory, ctx)                    # doctest: +SKIP
    >>> sampler = NeighborSampler(shared.graph, [10, 10], seed=ctx.rank)  # doctest: +SKIP
    """
    ctx = ctx or _context()
    mine: SharedGraph | None = None
    error: BaseException | None = None
    payload: Any = None
    if ctx.local_rank == 0:
        try:
            mine, handles = _own(build, memory)
            payload = ("ok", handles)
        except BaseException as exc:  # tell the other ranks instead of leaving them in the collective
            error = exc
            payload = ("error", f"{type(exc).__name__}: {exc}")
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world == 1:
        if error is not None:
            raise error
        assert mine is not None
        if unlink:
            _unlink(mine)
        return mine
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (ctx.node, ctx.local_rank, ctx.rank, payload), group=group)
    if error is not None:
        raise error
    if mine is None:
        source = [g for g in gathered if g[0] == ctx.node and g[1] == 0]
        if len(source) != 1:
            raise RuntimeError(f"share_graph: rank {ctx.rank} on {ctx.node!r} found {len(source)} local "
                               "rank 0 processes on its machine (expected 1): launch with torchrun, which "
                               "sets LOCAL_RANK and GROUP_RANK")
        _, _, owner_rank, (status, body) = source[0]
        if status != "ok":
            raise RuntimeError(f"share_graph: local rank 0 (rank {owner_rank}) of {ctx.node!r} could not "
                               f"build the shared graph: {body}")
        mine = _attach(body, memory)
    dist.barrier(group=group)  # every local rank has attached: the names are no longer needed
    if unlink and mine.owner:
        _unlink(mine)
    return mine


def _unlink(shared: SharedGraph) -> None:
    for region in shared.regions:
        region.unlink()
    log.debug("unlinked %d shared segments (still mapped on every local rank)", len(shared.regions))


# --------------------------------------------------------------------------------------------------
# Seeds split by rank


class DistributedBatchSampler:
    """This rank's batches of ``range(num_items)``: `torch.utils.data.DistributedSampler`'s split, batched.

    Each epoch, every rank draws the same permutation (seeded by ``seed + epoch``; call `set_epoch`),
    pads or trims it to a multiple of ``world_size`` (see the module's drop/pad rule) and takes
    positions ``rank, rank + world_size, ...``; the shares are disjoint up to the padding. The share is
    cut into batches of ``batch_size`` in order. Every rank has the same number of batches, of the
    same sizes.

    Parameters
    ----------
    num_items : int
        M, e.g. the number of training pairs of a `LinkSampler`.
    batch_size : int
        Indices per batch on this rank (the global batch is ``world_size`` times larger).
    rank, world_size : int
        This rank and the number of ranks.
    shuffle : bool
        A fresh permutation each epoch (else ``0..M-1`` in order).
    seed : int
        Seed of the permutation; must be the same on every rank.
    drop_last : bool
        False: pad to ``ceil(M / W)`` per rank and keep a short last batch. True: trim to
        ``floor(M / W)`` per rank and drop a short last batch.

    Raises
    ------
    ValueError
        ``num_items`` < 1, ``batch_size`` < 1, ``world_size`` < 1, or ``rank`` outside
        ``[0, world_size)``.

    References
    ----------
    ``torch.utils.data.DistributedSampler`` (whose split this is) and ``BatchSampler``.

    Examples
    --------
    >>> batches = DistributedBatchSampler(link.num_pairs, 4096, rank=ctx.rank, world_size=ctx.world_size)
    >>> batches.set_epoch(3)
    >>> for ids in batches:          # int64 tensors of pair indices
    ...     batch = link.sample(ids)
    """

    def __init__(self, num_items: int, batch_size: int, *, rank: int, world_size: int, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        for name, value, low in (("num_items", num_items, 1), ("batch_size", batch_size, 1),
                                 ("world_size", world_size, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
        self.num_items = int(num_items)
        self.batch_size = int(batch_size)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self._split = DistributedSampler(range(self.num_items), num_replicas=self.world_size, rank=self.rank,
                                         shuffle=bool(shuffle), seed=int(seed), drop_last=self.drop_last)
        self.epoch = 0

    @property
    def num_per_rank(self) -> int:
        """Indices this rank visits per epoch, before dropping a short batch."""
        return len(self._split)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation (call with the same value on every rank)."""
        self.epoch = int(epoch)
        self._split.set_epoch(self.epoch)

    def indices(self) -> torch.Tensor:
        """This rank's share of the current epoch, in visiting order: int64, shape [num_per_rank]."""
        return torch.tensor(list(iter(self._split)), dtype=torch.int64)

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        n, b = self.num_per_rank, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[torch.Tensor]:
        """The current epoch's batches: int64 index tensors of shape [batch_size] (the last may be short)."""
        share = self.indices()
        for i in range(len(self)):
            yield share[i * self.batch_size:(i + 1) * self.batch_size]


# --------------------------------------------------------------------------------------------------
# DDP training


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


def evaluate_ddp(evaluate: Callable[[tuple[np.ndarray, np.ndarray]], RankingResult],
                 test: tuple[np.ndarray, np.ndarray], *,
                 group: dist.ProcessGroup | None = None) -> RankingResult:
    """Recall@K / NDCG@K over all test users, each rank ranking every W-th of them.

    Rank r keeps the test items of users ``users[r::W]`` (``users``: those with >= 1 test item, in id
    order) and calls ``evaluate`` with that reduced test split, so the single-process metric code (which
    skips users without test items) ranks only its share; the per-rank sums are then all-reduced. The
    result equals the single-process evaluation up to the order of floating-point sums. Every rank of
    ``group`` must call it (a collective).

    Parameters
    ----------
    evaluate : callable
        ``evaluate(test_share) -> RankingResult``, e.g. ``lambda t: evaluate_model(model, graph,
        num_users, train, t, k=20)`` or ``lambda t: evaluate_popularity(train, t, num_items)``.
    test : tuple[np.ndarray, np.ndarray]
        The whole test split as per-user CSR ``(indptr int64 [U + 1], item ids int64 [M])``.
    group : torch.distributed.ProcessGroup or None
        Default: the world (one process when no group exists).

    Returns
    -------
    RankingResult
        Means over all users with test items; ``num_users`` counts them all.

    Examples
    --------
    >>> evaluate_ddp(lambda t: evaluate_model(ddp.module, graph, U, train, t), test)  # doctest: +SKIP
    """
    indptr, items = (np.asarray(a) for a in test)
    rank, world = (dist.get_rank(group), dist.get_world_size(group)) if dist.is_initialized() else (0, 1)
    counts = np.diff(indptr)
    keep = np.zeros(counts.size, dtype=bool)
    keep[np.flatnonzero(counts > 0)[rank::world]] = True
    share_counts = np.where(keep, counts, 0)
    share_indptr = np.zeros_like(indptr)
    np.cumsum(share_counts, out=share_indptr[1:])
    share = (share_indptr, items[np.repeat(keep, counts)])
    result = evaluate(share)
    sums = torch.tensor([result.recall * result.num_users, result.ndcg * result.num_users, result.num_users],
                        dtype=torch.float64)
    if world > 1:
        if dist.get_backend(group) == "nccl":
            sums = sums.cuda()
        dist.all_reduce(sums, group=group)
    recall_sum, ndcg_sum, n = sums.tolist()
    return RankingResult(recall=recall_sum / n if n else 0.0, ndcg=ndcg_sum / n if n else 0.0, k=result.k,
                         num_users=int(round(n)))

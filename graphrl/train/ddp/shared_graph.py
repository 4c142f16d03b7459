"""One graph copy per machine: local rank 0 builds it in shared memory, the other local ranks attach it.

`share_graph` runs ``build()`` on local rank 0 of each machine and places its CSC graph (and any other
dense arrays, e.g. the training pairs) in `graphrl.memory.MemoryManager` regions on the ``shared``
tier (``/dev/shm``); the other local ranks attach them by name (`MemoryManager.attach`), so a machine
holds one copy however many ranks it runs. Region handles travel through ``all_gather_object``; a
barrier makes sure every rank has attached, and then the owner unlinks the segments' names
(`Region.unlink`): the mappings stay valid on every local rank, and nothing is left in ``/dev/shm``
however the job ends (``kill -9``, ``torchrun`` tearing the job down with SIGTERM, Ctrl-C). Arrays
must be dense: sparse tensors are rejected. It returns a `SharedGraph`.

>>> shared = share_graph(lambda: load_gowalla().graph, memory, ctx)   # doctest: +SKIP
>>> sampler = NeighborSampler(shared.graph, [10, 10], seed=ctx.rank)  # doctest: +SKIP

References
----------
DGL's and PyG's multi-GPU examples, which share one graph per machine between the trainer processes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager, Region, Tier
from graphrl.train.ddp.process_group import DistContext, current_context

__all__ = ["SharedGraph", "share_graph"]

log = logging.getLogger(__name__)


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
    ctx = ctx or current_context()
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

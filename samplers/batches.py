"""The loaders' batch records: what `NeighborLoader` and `LinkLoader` deliver.

`NodeBatch` / `HeteroNodeBatch` / `MultiTypeNodeBatch` (node classification: plain, typed with seeds of one
node type, typed with seeds of several) and `LoadedLinkBatch` /
`LoadedHeteroLinkBatch` (a link sampler's `LinkBatch` / `HeteroLinkBatch` plus features) each carry their
blocks, ``input_features`` of ``input_nodes`` (``blocks[0].src_nodes``) in a reusable staging buffer, and
``release()``, which gives that buffer back at once (`samplers.loader`'s module docstring has the staging
reuse rule: in host memory a batch's features are never overwritten while a tensor views them; in device
memory they stay valid until the next batch is fetched). ``batch.to(device, non_blocking=True)`` copies
every tensor of a batch to a device; the staging buffer it copies from is not handed out again before the
copies complete (an event recorded after them, `copy_event`; `graphrl.tensors.StagingBuffer.hold_until`),
however the batch is then released or dropped. A tensor already on the device is kept, not copied:
``batch.to("cpu")`` of a CPU batch shares its ``input_features`` staging view (see `_Staged.to`). ``to``
takes a device only (a dtype raises TypeError). Import them from `samplers`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

import torch

from graphrl.stream_order import copy_event
from samplers.block import Block
from samplers.hetero_block import HeteroBlock
from samplers.hetero_link import HeteroLinkBatch
from samplers.link import LinkBatch
from samplers.prefetch import BatchLease

__all__ = ["HeteroNodeBatch", "LoadedHeteroLinkBatch", "LoadedLinkBatch", "MultiTypeNodeBatch", "NodeBatch",
           "copy_event"]


def _moved(value: Any, device: torch.device, non_blocking: bool) -> Any:
    """``value`` with every tensor in it (in dicts, lists and dataclass fields, such as blocks) on
    ``device``; other values as they are."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, Mapping):
        return {k: _moved(v, device, non_blocking) for k, v in value.items()}
    if isinstance(value, list):
        return type(value)(_moved(v, device, non_blocking) for v in value)  # a `Blocks` stays one
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _moved(getattr(value, f.name), device, non_blocking)
                                             for f in dataclasses.fields(value) if f.init})
    return value


class _Staged:
    """A loader batch's ``input_nodes`` and ``release``, from its ``blocks`` and staging lease."""

    blocks: list[Block] | list[HeteroBlock]
    _lease: BatchLease

    @property
    def input_nodes(self) -> torch.Tensor | dict[str, torch.Tensor]:
        """Nodes whose features the first layer reads, ``blocks[0].src_nodes``: int64 [S] (a dict by node
        type, int64 [S_t] each, for typed blocks)."""
        return self.blocks[0].src_nodes

    def release(self) -> None:
        """Give the staging buffer(s) back now (``input_features`` may then be overwritten); idempotent."""
        self._lease.release()

    def release_when_unused(self) -> None:
        """Give the staging buffer(s) back once no tensor views them (the batch's ``input_features``, a
        tensor taken from it, their views): what the loader does when it moves on; idempotent."""
        self._lease.release_when_unused()

    def to(self, device: str | torch.device, non_blocking: bool = False) -> Self:
        """The batch on ``device``: a batch of this type whose tensors (seeds, labels, ``input_features``,
        the blocks', per node type too) are copied there (``Tensor.to``: one already there is kept). Its
        ``release`` does nothing and ``ready`` is None.

        A tensor already on ``device`` is not copied: the new batch shares it. So ``batch.to("cpu")`` of a
        CPU batch is not a copy that holds no staging buffer: its ``input_features`` is the same view of
        the original batch's staging buffer, under that batch's lease (``batch.release()`` lets the
        buffer be overwritten at once; else the loader's staging reuse rule, see `samplers.loader`).
        Clone what you keep.

        With ``non_blocking=True`` to a CUDA device the copies from the pinned staging buffer run after
        the call returns; an event recorded after them (`copy_event`) keeps this batch's buffer from
        being handed out again until they complete, however this batch is released or dropped
        (`graphrl.tensors.StagingBuffer.hold_until`), so ``x = batch.to("cuda", non_blocking=True)``
        then dropping ``batch`` is safe. A bare ``batch.input_features.to("cuda", non_blocking=True)``
        is not (docs/architecture.md#memory-tiers): clone the features or synchronize first.

        Parameters
        ----------
        device : str, int or torch.device
        non_blocking : bool
            As ``Tensor.to``'s.

        Raises
        ------
        TypeError
            ``device`` or ``non_blocking`` is a ``torch.dtype`` (a batch's dtype is not converted: convert
            ``batch.input_features``), or either has another wrong type.
        ValueError
            ``device`` names no device torch knows (``torch.device`` refuses it).
        """
        device = _check_to_args(device, non_blocking)
        names = {f.name for f in dataclasses.fields(self) if f.init}  # type: ignore[arg-type]
        moved = {n: _moved(getattr(self, n), device, non_blocking) for n in names - {"_lease", "ready"}}
        event = copy_event(device, non_blocking)
        if event is not None:
            self._lease.hold_until(event)
        if "ready" in names:
            moved["ready"] = None
        return dataclasses.replace(self, **moved, _lease=BatchLease())  # type: ignore[type-var]


def _check_to_args(device: Any, non_blocking: Any) -> torch.device:
    """`_Staged.to`'s arguments checked: the device, or TypeError naming the argument."""
    for name, value in (("device", device), ("non_blocking", non_blocking)):
        if isinstance(value, torch.dtype):
            raise TypeError(f"to() takes a device, got {name}={value}: dtype conversion of a batch is not "
                            f"supported; convert batch.input_features (batch.input_features.to({value}))")
    if not isinstance(non_blocking, bool):
        raise TypeError(f"non_blocking must be a bool, got {type(non_blocking).__name__}")
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"device must be a str, int or torch.device, got {type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device={device!r} is not a device: {err}") from err


@dataclass(eq=False)
class NodeBatch(_Staged):
    """One node-classification minibatch.

    Attributes
    ----------
    index : int
        Position of the batch in its epoch (0, 1, ...).
    seeds : torch.Tensor, int64, shape [B]
        Seed nodes, ``blocks[-1].dst_nodes``.
    blocks : list[Block]
        As `NeighborSampler.sample` returns them, outermost first.
    input_features : torch.Tensor or None, shape [S, *row]
        Features of ``input_nodes``, a view of a reusable staging buffer, never overwritten while viewed
        (device memory: valid until the next batch is fetched; see the module docstring). None without
        a feature store.
    labels : torch.Tensor or None, shape [B, ...]
        ``labels[seeds]`` (a fresh tensor). None without labels.
    ready : torch.cuda.Event or None
        With a CUDA sampler: recorded after the batch's sampling on the loader's side stream (the
        loader makes the caller's stream wait for it before handing the batch out); else None.
    """

    index: int
    seeds: torch.Tensor
    blocks: list[Block]
    input_features: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    _lease: BatchLease = dataclasses.field(default_factory=BatchLease, repr=False)
    ready: Any = dataclasses.field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        """B."""
        return int(self.seeds.shape[0])


@dataclass(eq=False)
class HeteroNodeBatch(_Staged):
    """One node-classification minibatch of a typed graph: `NodeBatch`'s fields, typed.

    The seeds are of one node type (PyG's ``input_nodes=("paper", idx)``); blocks, input nodes and input
    features are per node type (PyG's ``batch[t].n_id`` / ``batch[t].x``, DGL's ``input_nodes`` dict and
    ``blocks[0].srcdata``); labels are the seeds' (PyG's ``batch["paper"].y[:batch_size]``).

    Attributes
    ----------
    index : int
        Position of the batch in its epoch (0, 1, ...).
    seed_type : str
        The node type of the seeds.
    seeds : torch.Tensor, int64, shape [B]
        Seed nodes (ids within ``seed_type``), ``blocks[-1].dst_nodes[seed_type]``; DGL's
        ``output_nodes`` is ``{seed_type: seeds}``.
    blocks : list[HeteroBlock]
        As the typed sampler returns them, outermost first.
    input_features : dict[str, torch.Tensor] or None
        For each node type with features, the rows of ``input_nodes[t]``, shape [S_t, *row_t] (every
        such type, [0, *row_t] where the batch reads none), each a view of a reusable staging buffer:
        never overwritten while viewed (device memory: valid until the next batch is fetched; see the
        module docstring). None without features.
    labels : torch.Tensor or None, shape [B, ...]
        ``labels[seeds]`` of the seed type (a fresh tensor). None without labels.
    ready : torch.cuda.Event or None
        As `NodeBatch.ready`.
    """

    index: int
    seed_type: str
    seeds: torch.Tensor
    blocks: list[HeteroBlock]
    input_features: dict[str, torch.Tensor] | None = None
    labels: torch.Tensor | None = None
    _lease: BatchLease = dataclasses.field(default_factory=BatchLease, repr=False)
    ready: Any = dataclasses.field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        """B."""
        return int(self.seeds.shape[0])


@dataclass(eq=False)
class MultiTypeNodeBatch(_Staged):
    """One node-classification minibatch of a typed graph with seeds of several node types (DGL's
    ``DataLoader(g, {"user": u, "artist": a}, sampler)``): `HeteroNodeBatch`'s fields with seeds and labels
    per type.

    Attributes
    ----------
    index : int
        Position of the batch in its epoch (0, 1, ...).
    seeds : dict[str, torch.Tensor], int64, shape [B_t] each
        The batch's seeds of each seed type of the loader (in the loader's ``seed_types`` order; a type the
        batch has none of maps to an empty tensor), in batch order within a type;
        ``blocks[-1].dst_nodes[t]``. DGL's ``output_nodes``.
    blocks : list[HeteroBlock]
        ``sampler.sample(seeds)``'s, outermost first.
    input_features : dict[str, torch.Tensor] or None
        As `HeteroNodeBatch.input_features` (rows of ``input_nodes[t]`` for every featured type, views of
        reusable staging buffers, never overwritten while viewed). None without features.
    labels : dict[str, torch.Tensor] or None
        ``labels[t][seeds[t]]`` for every seed type, shape [B_t, ...] (fresh tensors). None without labels.
    ready : torch.cuda.Event or None
        As `NodeBatch.ready`.
    """

    index: int
    seeds: dict[str, torch.Tensor]
    blocks: list[HeteroBlock]
    input_features: dict[str, torch.Tensor] | None = None
    labels: dict[str, torch.Tensor] | None = None
    _lease: BatchLease = dataclasses.field(default_factory=BatchLease, repr=False)
    ready: Any = dataclasses.field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        """B, the seeds of all types (sum of B_t)."""
        return sum(int(v.shape[0]) for v in self.seeds.values())


@dataclass(frozen=True, eq=False)
class LoadedLinkBatch(_Staged, LinkBatch):
    """A `LinkBatch` from a `LinkLoader`: the same fields, plus features of its input nodes.

    Attributes
    ----------
    index : int
        Position of the batch in its epoch.
    input_features : torch.Tensor or None, shape [S, *row]
        Features of ``blocks[0].src_nodes``, a view of a reusable staging buffer, never overwritten while
        viewed (device memory: valid until the next batch is fetched; see the module docstring). None
        without a feature store.
    """

    index: int = 0
    input_features: torch.Tensor | None = None
    _lease: BatchLease = dataclasses.field(default_factory=BatchLease, repr=False)


@dataclass(frozen=True, eq=False)
class LoadedHeteroLinkBatch(_Staged, HeteroLinkBatch):
    """A `HeteroLinkBatch` from a `LinkLoader` over a `HeteroLinkSampler`: the same fields, plus features of
    its input nodes per node type.

    Attributes
    ----------
    index : int
        Position of the batch in its epoch.
    input_features : dict[str, torch.Tensor] or None
        For each node type with features, the rows of ``input_nodes[t]``, shape [S_t, *row_t] ([0, *row_t]
        where the batch reads none), each a view of a reusable staging buffer, never overwritten while
        viewed (device memory: valid until the next batch is fetched; see the module docstring). None
        without features.
    """

    index: int = 0
    input_features: dict[str, torch.Tensor] | None = None
    _lease: BatchLease = dataclasses.field(default_factory=BatchLease, repr=False)

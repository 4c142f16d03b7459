"""Minibatch loaders: iteration, batching and prefetch around the samplers (PyG's loader style).

A loader cuts seeds into batches and keeps the next batches ready; the sampling is the samplers', the
feature gather the `FeatureStore`'s, the batch records `samplers.batches`', the seed checks
`samplers.loader_seeds`'. Over a `HeteroGraph`, `NeighborLoader` gives `HeteroNodeBatch` es for seeds of one
node type (PyG's ``NeighborLoader(hetero_data, input_nodes=("paper", idx))``) and `MultiTypeNodeBatch` es
for several (DGL's ``DataLoader(g, {"user": u, "artist": a}, sampler)``); `LinkLoader` over a
`HeteroLinkSampler` gives `LoadedHeteroLinkBatch` es. The batches in flight are `samplers.prefetch`'s.

Prefetch
--------
With ``prefetch=p >= 1`` a background thread samples batch i+1 (and gathers its input features)
while the caller trains on batch i: up to ``p`` finished batches wait in a queue and the thread may
be working on one more. The samplers' and the gather's numba kernels release the GIL, so the thread
runs beside torch's work in the caller. Batches come out in order and are the same as with
``prefetch=0`` (everything in the caller's thread) for the same seeds: each sampler is called only
by the one thread, in batch order. An exception in the thread is raised in the caller at the batch
where it happened (the batches before it are delivered first). Leaving a loop early (``break``, an
exception), calling ``close()`` on the iterator, or dropping it stops the thread and frees its
batches; starting a new epoch (``iter(loader)``) closes the loader's previous iterator. A stopped
epoch may have sampled up to ``p + 1`` batches it never delivered, which advances the samplers'
random streams.

The staging reuse rule
----------------------
``batch.input_features`` views one of `staging_slots` reusable buffers per store (pinned host memory
with CUDA, host memory without, device memory for a GPU gather): no fresh tensor per batch in a plain
loop. **In host memory a batch's features are never overwritten while a tensor views them**: when the
iterator moves on, a batch's buffer returns only once nothing views it (the batch, ``x =
batch.input_features``, views of it), so kept batches (``list(loader)``, an evaluation cache) stay
right. When kept batches hold every buffer, a batch gets a buffer of its own (same tier, counted
against the budget, freed with its last tensor; no room raises `MemoryBudgetError`): iterating never
waits for the user. ``batch.release()`` gives the buffer back at once (its features may then be
overwritten). **Device memory (a GPU gather) keeps the older rule** (views not countable): valid until
the next batch (docs/architecture.md#pyg-and-dgl-loaders). Seeds, blocks, labels are fresh tensors.

Threads: numba's threading layer must be thread-safe for kernels to run in two threads at once
(``omp``, ``tbb``; not ``workqueue``); ours use their own helper threads, so this matters only to
other parallel numba code running in the caller at the same time.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager
from samplers._checks import MAX_BATCH, check_int, check_open, check_prefetch, check_seed
from samplers.batches import (
    HeteroNodeBatch,
    LoadedHeteroLinkBatch,
    LoadedLinkBatch,
    MultiTypeNodeBatch,
    NodeBatch,
)
from samplers.epochs import epoch_order, num_batches
from samplers.features import FeatureStore
from samplers.hetero import HeteroNeighborSampler
from samplers.hetero_graph import HeteroGraph
from samplers.hetero_link import HeteroLinkBatch, HeteroLinkSampler
from samplers.link import LinkBatch, LinkSampler
from samplers.loader_memory import check_memory, check_sampler_memory, check_store_memory
from samplers.loader_seeds import group_by_type, loader_seeds
from samplers.neighbor import NeighborSampler
from samplers.prefetch import BatchIterator, BatchLease, InFlight
from samplers.protocol import Sampler, check_blocks, check_sampler, check_typed_blocks
from samplers.staging import RowStaging, StagingLease

__all__ = ["LinkLoader", "NeighborLoader", "staging_slots"]


def staging_slots(prefetch: int) -> int:
    """Staging buffers a loader with ``prefetch`` leases per store: one per batch queued, one being
    prepared, the batch returned by ``next()`` and the batch before it, which a ``for`` loop's variable
    still holds while ``next()`` runs (without prefetch only the last two)."""
    return prefetch + 3 if prefetch > 0 else 2


# --------------------------------------------------------------------------------------------------
# What both loaders share


class _Loader:
    """What both loaders share: the prefetch setting, the feature stores and their staging buffers, one
    live iterator."""

    _name = "graphrl-loader"

    def __init__(self, features: Any, prefetch: int, num_rows: int | Mapping[str, int],
                 memory: MemoryManager | None = None) -> None:
        """``num_rows``: the graph's node count (``features`` one store or tensor), or its node counts
        per type (``features`` a dict of them, a `HeteroGraph`); ``memory``: `samplers.loader_memory`."""
        self.prefetch = check_prefetch(prefetch)
        self.memory = memory
        """The `MemoryManager` given as ``memory=`` (None: each store made here has a private one)."""
        self.closed = False  # True once `close` ran: iterating then raises ValueError
        self._owned: list[FeatureStore] = []  # stores made here from tensors: closed by `close`
        self._staging: RowStaging | None = None
        self._typed_staging: dict[str, RowStaging] = {}
        self._iterator: weakref.ref[BatchIterator] | None = None
        self._lock = threading.Lock()
        self.features: FeatureStore | dict[str, FeatureStore] | None = None
        try:
            if features is None:
                pass
            elif not isinstance(num_rows, Mapping):
                self.features = self._store("features", features, num_rows, "the graph has {n} nodes")
            elif not isinstance(features, Mapping):
                raise TypeError(f"features must be a dict node type -> FeatureStore or tensor for a "
                                f"HeteroGraph, got {type(features).__name__}")
            else:
                self.features = {}
                for t, value in features.items():
                    if t not in num_rows:
                        raise ValueError(f"features: unknown node type {t!r} (the graph has "
                                         f"{sorted(num_rows)})")
                    self.features[t] = self._store(f"features[{t!r}]", value, num_rows[t],
                                                   f"the graph has {{n}} {t!r} nodes")
        except BaseException:
            self._close_owned()
            raise

    def _store(self, name: str, value: Any, n: int, has: str) -> FeatureStore:
        """``value`` as a `FeatureStore` of ``n`` rows (a tensor or array is wrapped, without a cache)."""
        if isinstance(value, (torch.Tensor, np.ndarray)):
            if value.ndim >= 1 and value.shape[0] != n:
                raise ValueError(f"{name} has {value.shape[0]} rows but {has.format(n=n)}")
            store = FeatureStore(value, memory=self.memory)
            self._owned.append(store)
            return store
        if not isinstance(value, FeatureStore):
            raise TypeError(f"{name} must be a FeatureStore, a tensor or None, got {type(value).__name__}")
        if value.num_rows != n:
            raise ValueError(f"{name} has {value.num_rows} rows but {has.format(n=n)}")
        check_store_memory(name, value, self.memory)
        return value

    def _close_owned(self) -> None:
        owned, self._owned = self._owned, []
        for store in owned:
            store.close()

    def _lease_rows(self, store: FeatureStore, staging: RowStaging,
                    ids: torch.Tensor) -> tuple[torch.Tensor, StagingLease]:
        lease = staging.acquire(int(ids.shape[0]))
        try:
            return store.gather_into(ids, lease.tensor), lease  # a CUDA sampler's ids too
        except BaseException:
            lease.release()
            raise

    def _gather(self, input_nodes: torch.Tensor) -> tuple[torch.Tensor | None, BatchLease]:
        """Rows of ``input_nodes`` from the one store, in a staging buffer (None without features)."""
        if self.features is None:
            return None, BatchLease()
        if self._staging is None:
            self._staging = self.features.staging(slots=staging_slots(self.prefetch))
        feats, lease = self._lease_rows(self.features, self._staging, input_nodes)
        return feats, BatchLease(lease)

    def _gather_typed(self, input_nodes: Mapping[str, torch.Tensor]) -> tuple[dict | None, BatchLease]:
        """Rows of ``input_nodes[t]`` from the store of every type t with features, each in a staging
        buffer of its type (None without features)."""
        if self.features is None:
            return None, BatchLease()
        feats, leases = {}, []
        try:
            for t, store in self.features.items():
                ids = input_nodes.get(t)
                if ids is None:
                    ids = torch.empty(0, dtype=torch.int64)
                if t not in self._typed_staging:
                    self._typed_staging[t] = store.staging(slots=staging_slots(self.prefetch))
                feats[t], lease = self._lease_rows(store, self._typed_staging[t], ids)
                leases.append(lease)
        except BaseException:
            for lease in leases:
                lease.release()
            raise
        return feats, BatchLease(*leases)

    @property
    def own_buffers(self) -> int:
        """Staging buffers of their own alive now: batches made while kept batches held every pooled buffer
        (see the staging reuse rule in the module docstring); each goes with its last tensor."""
        stagings = [self._staging, *self._typed_staging.values()]
        return sum(s.own_buffers for s in stagings if s is not None)

    def check_open(self) -> None:
        """Raise ValueError if this loader (or a `FeatureStore` it gathers from) is closed."""
        check_open(self.closed, f"this {type(self).__name__}")
        if isinstance(self.features, dict):
            for t, store in self.features.items():
                check_open(store.closed, f"the FeatureStore of node type {t!r} of this {type(self).__name__}")
        elif self.features is not None:
            check_open(self.features.closed, f"the FeatureStore of this {type(self).__name__}")

    def _start(self, produce: Callable[[int], Any], count: int,
               deliver: Callable[[Any], Any] | None = None) -> BatchIterator:
        with self._lock:
            previous = self._iterator() if self._iterator is not None else None
            if previous is not None:
                previous.close()
            it = BatchIterator(produce, count, self.prefetch, self._name, deliver)
            self._iterator = weakref.ref(it)
            return it

    def close(self) -> None:
        """Close the live iterator (if any), free the staging buffers and the `FeatureStore` the loader
        made from a features tensor; idempotent. A later ``iter(loader)`` raises ValueError, and so does
        the live iterator's ``next()`` while its epoch had batches left (from any thread: a shortened epoch
        is not a normal end); batches already handed out keep their blocks, and their input features stay
        readable."""
        with self._lock:
            self.closed = True
            previous = self._iterator() if self._iterator is not None else None
            self._iterator = None
        if previous is not None:
            previous.abort()  # its next() raises: an epoch cut short is not a normal end
        stagings = [self._staging, *self._typed_staging.values()]
        self._staging, self._typed_staging = None, {}
        for staging in stagings:
            if staging is not None:
                staging.close()
        self._close_owned()

    def __getstate__(self) -> dict:
        """The loader's state for pickling (``mp.spawn``, a ``DataLoader`` worker's dataset): its lock, its
        live iterator, its staging buffers and its side stream are left out and rebuilt empty by
        `__setstate__`; the sampler and the shuffling generator keep their state, so a copy's next epoch
        is the original's next epoch. Features pickle as their `FeatureStore` does (a store of its own
        manager in the new process, over a shared copy of the rows the original keeps), so the copy has
        no ``memory``.
        """
        state = self.__dict__.copy()
        for name in ("_lock", "_iterator", "_staging", "_typed_staging"):
            del state[name]
        state.pop("_flight", None)
        state["memory"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled loader with a new lock, no live iterator, no staging buffers and no side
        stream."""
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._iterator = None
        self._staging = None
        self._typed_staging = {}
        self._flight = None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------
# Node classification


class NeighborLoader(_Loader):
    """Minibatches of seed nodes with their sampled blocks, input features and labels.

    Each epoch (each ``iter(loader)``) visits every seed once, in a fresh seeded random order (input
    order with ``shuffle=False``), cut into batches of ``batch_size``. Batch i holds the blocks that
    ``sampler`` draws for its seeds (by default a `NeighborSampler` of ``fanouts``, ``replace``; any
    `samplers.Sampler` of the same graph, such as a `LaborSampler`), the features of the first
    block's source nodes gathered by ``features`` into a reusable staging buffer, and the seeds'
    labels. See the module docstring for prefetching and for how long ``input_features`` stay valid.

    Over a `HeteroGraph` (PyG's ``NeighborLoader(hetero_data, input_nodes=("paper", idx))``, DGL's
    ``DataLoader(g, {"paper": idx}, sampler)``) the seeds are of one node type, the sampler is typed
    (by default a `HeteroNeighborSampler` of ``fanouts``: one list for every relation or a dict per
    relation; or ``sampler=`` a typed `LaborSampler`, `HeteroNeighborSampler` or any `Sampler` over
    ``graph`` returning `HeteroBlock` s), ``features`` is a dict by node type, and each batch is a
    `HeteroNodeBatch`: ``sampler.sample({seed_type: seeds})``'s blocks, the rows of each featured type's
    source nodes of the first block, and the seeds' labels. Order, prefetch and staging are the same.

    Seeds of several node types (DGL's ``DataLoader(g, {"user": idx_u, "artist": idx_a}, sampler)``) are
    visited as DGL visits them: the types' ids concatenated in the dict's order, shuffled together and cut
    into batches of ``batch_size`` seeds of any types; each batch is a `MultiTypeNodeBatch` whose seeds are
    grouped by type (in batch order within a type, every seed type present, empty where the batch has
    none), its blocks ``sampler.sample(batch.seeds)``'s and its labels a dict by seed type.

    Parameters
    ----------
    graph : CSCGraph or HeteroGraph
        The graph to sample from.
    seeds : torch.Tensor or array-like, int64 [M] node ids, or bool [N] mask
        The training nodes. Over a `HeteroGraph`: ``(node_type, ids or mask)`` or ``{node_type: ids or
        mask, ...}`` with one or several types (ids within the type, a mask of length
        ``graph.num_nodes[node_type]``).
    fanouts : sequence of int, mapping Relation -> sequence of int (HeteroGraph), or None
        As for `NeighborSampler` (`HeteroNeighborSampler`), outermost layer first (None when ``sampler``
        is given).
    batch_size : int
        Seeds per batch, >= 1 (required).
    features : FeatureStore, torch.Tensor, dict str -> (FeatureStore or torch.Tensor), or None
        Node features, [N, *row] (a tensor is wrapped in a `FeatureStore` without a cache). Over a
        `HeteroGraph` a dict by node type, each [num_nodes[t], *row_t]; types left out get no features.
    labels : torch.Tensor, dict str -> torch.Tensor (HeteroGraph), or None
        Per-node labels, [N, ...]; a batch gets ``labels[seeds]``. Over a `HeteroGraph` the seed type's,
        [num_nodes[seed_type], ...], or a dict by node type holding it (the other types are unused); with
        seeds of several types a dict holding each seed type's, [num_nodes[t], ...].
    shuffle : bool
        Shuffle the seeds every epoch.
    drop_last : bool
        Drop the last, shorter batch.
    seed : int or None
        Seeds the order and the default sampler (not a given ``sampler``, which keeps its own seed);
        ``None`` draws one from the OS. Same seed, same batches (whatever ``prefetch`` is).
    prefetch : int
        Batches the background thread keeps ready (0: no thread, everything in the caller).
    replace : bool
        Sample with replacement (the default sampler).
    sampler : Sampler or None
        The sampler behind the batches (`samplers.protocol.Sampler` over ``graph``); None builds a
        `NeighborSampler(graph, fanouts, replace=replace, seed=seed, memory=memory)` (a
        `HeteroNeighborSampler` over a `HeteroGraph`).
    memory : graphrl.memory.MemoryManager or None
        One budget for all the loader allocates or builds (`samplers.loader_memory`): the `FeatureStore`
        made from a features tensor and the default sampler come from it; a given ``sampler`` on
        ``device="cuda"`` and a given `FeatureStore` must use it. None: a private one per store made here.

    Attributes
    ----------
    sampler : Sampler
        The sampler behind the batches.
    seed_type : str or None
        The seeds' node type over a `HeteroGraph`; None over a `CSCGraph` or with several seed types.
    seed_types : tuple of str
        The seed node types in the order given (one for one type); ``()`` over a `CSCGraph`.
    seeds : numpy.ndarray, int64, shape [M]
        The seeds (ids within their type; with several types, each type's ids one after the other in
        ``seed_types`` order).
    seed_type_index : numpy.ndarray, int64, shape [M], or None
        ``seed_types[seed_type_index[i]]`` is the type of ``seeds[i]`` (over a `HeteroGraph`).

    Raises
    ------
    TypeError
        ``graph`` is neither a `CSCGraph` nor a `HeteroGraph`; ``seeds`` is not integer or bool (typed:
        neither a (type, ids) pair nor a dict); ``features`` or ``labels`` of the wrong type (typed: not
        a dict of stores or tensors; with several seed types, labels not a dict); a non-int
        ``batch_size``, ``prefetch`` or ``seed``; ``sampler`` is not a `Sampler` (over a `CSCGraph`: a
        sampler of a `HeteroGraph`), or ``batch_size`` is missing; a typed sampler whose blocks are not
        typed; ``memory`` is not a `MemoryManager`.
    ValueError
        Seeds outside [0, N) (typed: outside the type's [0, num_nodes[t])) or a mask of another length;
        typed seeds naming an unknown node type, or none; ``features`` or ``labels`` naming an
        unknown node type, or with another number of rows than their type's nodes (labels: of each seed
        type, which a dict must hold); ``batch_size`` outside [1, `samplers.MAX_BATCH`]; ``prefetch``
        outside [0, `samplers.MAX_BATCH`]; ``seed`` outside [0, 2**64); bad fanouts (from the default
        sampler); both or neither of ``fanouts`` and ``sampler``; a ``sampler`` of another graph, or with
        ``replace=True``; with ``memory``, a GPU ``sampler`` or a `FeatureStore` of another (or a private)
        manager. Each message names the argument and the bad value.

    References
    ----------
    PyG's ``NeighborLoader`` (``input_nodes=(node_type, idx)`` on ``HeteroData``) and DGL's ``DataLoader``
    with a ``NeighborSampler`` (the same batches: seeds, blocks, input features, labels).

    Examples
    --------
    >>> loader = NeighborLoader(graph, train_nodes, [15, 10], batch_size=1024, features=feats,
    ...                         labels=y, seed=0)
    >>> for batch in loader:
    ...     logits = model(batch.blocks, batch.input_features)   # kept batches' features stay right
    ...     loss = F.cross_entropy(logits, batch.labels)
    >>> typed = NeighborLoader(hetero_graph, ("user", train_users), batch_size=256, seed=0,
    ...                        sampler=LaborSampler(hetero_graph, [10, 10], seed=0),
    ...                        features={"user": x_user, "artist": x_artist}, labels=y_user)
    >>> batch = next(iter(typed))   # HeteroNodeBatch: batch.input_features["artist"], batch.labels
    >>> mixed = NeighborLoader(hetero_graph, {"user": users, "artist": artists}, [10, 10], batch_size=256,
    ...                        labels={"user": y_user, "artist": y_artist}, seed=0)
    >>> batch = next(iter(mixed))   # MultiTypeNodeBatch: batch.seeds["artist"], batch.labels["artist"]
    """

    _name = "graphrl-neighbor-loader"

    def __init__(self, graph: CSCGraph | HeteroGraph, seeds: Any, fanouts: Any = None,
                 batch_size: int | None = None, features: Any = None,
                 labels: torch.Tensor | Mapping[str, torch.Tensor] | None = None, shuffle: bool = True,
                 drop_last: bool = False, seed: int | None = None, prefetch: int = 1, *,
                 replace: bool = False, sampler: Sampler | None = None,
                 memory: MemoryManager | None = None) -> None:
        typed = isinstance(graph, HeteroGraph)
        if not typed and not isinstance(graph, CSCGraph):
            raise TypeError(f"graph must be a CSCGraph or a HeteroGraph, got {type(graph).__name__}")
        if batch_size is None:
            raise TypeError("batch_size is required")
        if (fanouts is None) == (sampler is None):
            raise ValueError("give fanouts (a NeighborSampler is built) or sampler, not both or neither")
        if sampler is not None:
            check_sampler("sampler", sampler, typed=typed)
            if sampler.graph is not graph:
                raise ValueError("sampler samples another graph than graph")
            if replace:
                raise ValueError(f"replace={replace!r} with sampler=: replace is for the default "
                                 f"NeighborSampler; build the sampler with it")
        check_sampler_memory("sampler", sampler, check_memory(memory))
        self.batch_size = check_int("batch_size", batch_size, 1, MAX_BATCH)
        check_seed("seed", seed, allow_none=True)
        chosen = loader_seeds(graph, seeds, labels)
        self.seed_type, self.seed_types = chosen.seed_type, chosen.seed_types
        self.seeds, self.seed_type_index, labels = chosen.seeds, chosen.type_index, chosen.labels
        self.graph = graph
        self.labels = labels
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        if sampler is None:
            kind = HeteroNeighborSampler if typed else NeighborSampler
            sampler = kind(graph, fanouts, replace=replace, seed=self.seed, memory=memory)
        self.sampler = sampler
        self._flight: InFlight | None = None
        super().__init__(features, prefetch, dict(graph.num_nodes) if typed else graph.num_nodes, memory)

    @property
    def num_seeds(self) -> int:
        """M, seeds per epoch."""
        return int(self.seeds.shape[0])

    def __len__(self) -> int:
        """Batches per epoch (`samplers.epochs.num_batches`)."""
        return num_batches(self.num_seeds, self.batch_size, self.drop_last)

    def __iter__(self) -> BatchIterator:
        """One epoch of `NodeBatch` es (`HeteroNodeBatch` es over a `HeteroGraph`, `MultiTypeNodeBatch` es
        with seeds of several types); closes this loader's previous iterator; ValueError once closed."""
        self.check_open()
        if self.seed_types and self.seed_type is None:
            return self._iter_multi()
        order = self.seeds[epoch_order(self._rng, self.num_seeds, self.shuffle)]
        b, t = self.batch_size, self.seed_type

        if self._flight is None:
            self._flight = InFlight.for_sampler(self.sampler)  # one side stream for every epoch
        flight = self._flight

        def produce(i: int) -> NodeBatch | HeteroNodeBatch:
            seeds = torch.from_numpy(order[i * b:(i + 1) * b])
            with flight.side():
                if t is None:
                    blocks = check_blocks(self.sampler, self.sampler.sample(seeds), seeds)
                else:
                    blocks = check_typed_blocks(self.sampler, self.sampler.sample({t: seeds}), {t: seeds})
                ready = flight.mark()
            labels = None
            if self.labels is not None:
                labels = torch.index_select(self.labels, 0, seeds.to(self.labels.device))
            if t is None:
                feats, lease = self._gather(blocks[0].src_nodes)
                return NodeBatch(index=i, seeds=blocks[-1].dst_nodes, blocks=blocks, input_features=feats,
                                 labels=labels, _lease=lease, ready=ready)
            feats, lease = self._gather_typed(blocks[0].src_nodes)
            return HeteroNodeBatch(index=i, seed_type=t, seeds=blocks[-1].dst_nodes[t], blocks=blocks,
                                   input_features=feats, labels=labels, _lease=lease, ready=ready)

        return self._start(produce, len(self), flight.deliver if flight.stream is not None else None)

    def _iter_multi(self) -> BatchIterator:
        """`__iter__` with seeds of several types: DGL's order (positions in `seeds`, shuffled together),
        each batch's seeds grouped by type."""
        order = epoch_order(self._rng, self.num_seeds, self.shuffle)
        b, types = self.batch_size, self.seed_types
        if self._flight is None:
            self._flight = InFlight.for_sampler(self.sampler)
        flight = self._flight

        def produce(i: int) -> MultiTypeNodeBatch:
            seeds = group_by_type(self.seeds, self.seed_type_index, types, order[i * b:(i + 1) * b])
            with flight.side():
                blocks = check_typed_blocks(self.sampler, self.sampler.sample(seeds), seeds)
                ready = flight.mark()
            labels = None
            if self.labels is not None:
                labels = {t: torch.index_select(y, 0, seeds[t].to(y.device)) for t, y in self.labels.items()}
            feats, lease = self._gather_typed(blocks[0].src_nodes)
            return MultiTypeNodeBatch(index=i, seeds={t: blocks[-1].dst_nodes[t] for t in types},
                                      blocks=blocks, input_features=feats, labels=labels, _lease=lease,
                                      ready=ready)

        return self._start(produce, len(self), flight.deliver if flight.stream is not None else None)


# --------------------------------------------------------------------------------------------------
# Link prediction


class LinkLoader(_Loader):
    """BPR minibatches of a `LinkSampler` (or a `HeteroLinkSampler`), prepared ahead in a background thread,
    with optional features.

    An epoch is one pass of ``link_sampler`` (its batching, order and negatives: the same batches as
    iterating the sampler itself), each batch a `LoadedLinkBatch` (a `LinkBatch` plus
    ``input_features`` of ``blocks[0].src_nodes``). Over a `HeteroLinkSampler` (typed link prediction, as
    PyG's ``LinkNeighborLoader(hetero_data, edge_label_index=(edge_type, idx))``) each batch is a
    `LoadedHeteroLinkBatch` and ``features`` a dict by node type, gathered for every featured type of
    the first block's sources. See the module docstring for prefetching and for how long
    ``input_features`` stay valid.

    Parameters
    ----------
    link_sampler : LinkSampler or HeteroLinkSampler
        Batches, negatives and blocks.
    features : FeatureStore, torch.Tensor, dict str -> (FeatureStore or torch.Tensor), or None
        Node features, [N, *row]; over a `HeteroLinkSampler` a dict by node type, each
        [num_nodes[t], *row_t] (types left out get none); None for models that embed node ids (LightGCN).
    prefetch : int
        Batches the background thread keeps ready (0: no thread).
    memory : graphrl.memory.MemoryManager or None
        As `NeighborLoader`'s: the `FeatureStore` made from a features tensor comes from it;
        ``link_sampler``'s sampler on ``device="cuda"`` and a given `FeatureStore` must use it.

    Attributes
    ----------
    sampled_edges, sample_seconds : int, float
        The link sampler's counters (edges in all blocks so far; wall time spent sampling, which
        overlaps training when prefetching).

    Raises
    ------
    TypeError
        ``link_sampler`` is neither a `LinkSampler` nor a `HeteroLinkSampler`; ``features`` of the wrong
        type (typed: not a dict); a non-int ``prefetch``; ``memory`` is not a `MemoryManager`.
    ValueError
        ``prefetch`` outside [0, `samplers.MAX_BATCH`]; features with another number of rows than the
        graph has nodes (typed: than their type has, or naming an unknown node type); with ``memory``, a
        GPU sampler or a `FeatureStore` of another (or a private) manager.

    Examples
    --------
    >>> loader = LinkLoader(LinkSampler(NeighborSampler(graph, [10, 10], seed=0), users, items,
    ...                                 batch_size=8192, seed=1), prefetch=1)
    >>> for batch in loader:
    ...     loss = bpr(model(batch.blocks), batch.user_index, batch.pos_index, batch.neg_index)
    >>> typed = LinkLoader(HeteroLinkSampler(HeteroNeighborSampler(hetero, [10, 10], seed=0),
    ...                                      ("user", "listens", "artist"), users, artists, seed=1),
    ...                    features={"user": x_user, "artist": x_artist})
    >>> batch = next(iter(typed))   # LoadedHeteroLinkBatch: batch.input_features["artist"]
    """

    _name = "graphrl-link-loader"

    def __init__(self, link_sampler: LinkSampler | HeteroLinkSampler, features: Any = None,
                 prefetch: int = 1, *, memory: MemoryManager | None = None) -> None:
        if not isinstance(link_sampler, (LinkSampler, HeteroLinkSampler)):
            raise TypeError(f"link_sampler must be a LinkSampler or a HeteroLinkSampler, got "
                            f"{type(link_sampler).__name__}")
        check_sampler_memory("link_sampler.sampler", link_sampler.sampler, check_memory(memory))
        graph = link_sampler.sampler.graph
        typed = isinstance(link_sampler, HeteroLinkSampler)
        super().__init__(features, prefetch, dict(graph.num_nodes) if typed else graph.num_nodes, memory)
        self.link_sampler = link_sampler
        self.typed = typed

    @property
    def sampled_edges(self) -> int:
        """Edges in all blocks the link sampler drew so far."""
        return self.link_sampler.sampled_edges

    @property
    def sample_seconds(self) -> float:
        """Wall time the link sampler spent sampling so far, seconds."""
        return self.link_sampler.sample_seconds

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.link_sampler)

    def __iter__(self) -> BatchIterator:
        """One epoch of `LoadedLinkBatch` es (`LoadedHeteroLinkBatch` es over a `HeteroLinkSampler`); closes
        this loader's previous iterator; ValueError once closed."""
        self.check_open()
        epoch = iter(self.link_sampler)
        typed = self.typed
        kind, loaded = (HeteroLinkBatch, LoadedHeteroLinkBatch) if typed else (LinkBatch, LoadedLinkBatch)
        gather = self._gather_typed if typed else self._gather
        names = [f.name for f in dataclasses.fields(kind)]

        def produce(i: int) -> LoadedLinkBatch | LoadedHeteroLinkBatch:
            batch = next(epoch)
            feats, lease = gather(batch.blocks[0].src_nodes)
            fields = {k: getattr(batch, k) for k in names}
            return loaded(**fields, index=i, input_features=feats, _lease=lease)

        return self._start(produce, len(self))

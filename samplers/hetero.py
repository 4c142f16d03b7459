"""Neighbour sampling on heterogeneous graphs: fanouts per relation, one `HeteroBlock` per layer.

Sampling a layer draws, for every relation, from the relation's CSC for the layer's destinations of
its ``dst_type`` (the kernels and rules of `samplers.NeighborSampler`, each relation with its own
random stream), then relabels per node type: the sources of type S are the layer's destinations of
type S followed by the new nodes of type S drawn through any relation, in first-occurrence order
(relations in the graph's order); they are the next layer's destinations of type S. ``device="cuda"``
runs the same steps on the GPU (`samplers.kernels.cuda`), with the same blocks wherever the
homogeneous kernels agree; the uniform and weighted relations of a layer are drawn together, one launch
per kernel over all of them, from their CSCs concatenated once (`samplers.kernels.cuda.typed`, as
GraphBolt's ``FusedCSCSamplingGraph``; `HeteroNeighborSampler.launches` counts them). Every relation's GPU
graph, the concatenation and the workspaces are regions of one `graphrl.memory.MemoryManager` (``memory=``,
`samplers.kernels.cuda.memory.CudaMemory`; docs/architecture.md#memory-tiers). The steps are
`samplers.layers.LayerLoop`'s, with a mode per relation (`samplers.modes`: temporal with edge times,
weighted with weights, else uniform). `HeteroGraph`, `HeteroBlock` and `lastfm_hetero_graph` are
re-exported.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from graphrl.memory import MemoryManager, check_memory
from graphrl.threads import team_size
from samplers._checks import (
    check_device,
    check_open,
    check_relation_dict,
    check_relation_fanouts,
    check_seed_and_replace,
    check_seed_times,
    check_seeds,
    edge_array,
    require_gpu,
)
from samplers._csc import (
    attach_derived,
    csc_times,
    csc_weights,
    excluded_positions,
    inverse_permutation,
    pickle_loop,
    unpickle_loop,
)
from samplers.hetero_block import HeteroBlock
from samplers.hetero_graph import HeteroGraph, Relation, lastfm_hetero_graph
from samplers.layers import LayerLoop
from samplers.modes import RelationArrays, TemporalMode, UniformMode, WeightedMode

__all__ = ["HeteroBlock", "HeteroGraph", "HeteroNeighborSampler", "Relation", "lastfm_hetero_graph"]


class HeteroNeighborSampler:
    """Layer-wise neighbour sampling on a `HeteroGraph`, with a fanout per relation and layer.

    Each relation is sampled by the homogeneous kernels with the options of `samplers.NeighborSampler`,
    checked by the same functions and following the same rules (docs/architecture.md#sampling-rules).
    Memory, on the CPU: each sampled relation's (source, edge id) pairs for the gather (int32, 8 bytes
    per edge, none at 2**31 edges or more; `samplers._csc.edge_pairs`) and each weighted relation's
    prefix sums (8 bytes per edge and per row), beside the graph; pickled, shared once per host
    (`__getstate__`).

    Parameters
    ----------
    graph : HeteroGraph
    fanouts : sequence of int, mapping Relation -> sequence of int, or sequence of mapping Relation -> int
        Per layer, outermost first (as `NeighborSampler`); one list for every relation, one list per
        relation (all of one length; a relation left out draws nothing), or DGL's one dict per layer
        ``[{etype: k}, ...]``; a relation is a canonical triple or a name only it has ("listens")
        (`samplers._checks.check_relation_fanouts`). -1 takes every in-edge.
    replace : bool
        Draw with replacement.
    seed : int or None
        Seed of the random stream; each (call, layer, relation) has its own key.
    weights : None, True, or mapping Relation -> (None, True, or torch.Tensor float [E_r])
        ``None``: uniform draws. ``True``: every sampled relation that has weights in the graph
        (``HeteroGraph.from_edges(weights=...)``) by them, the others uniformly. A dict: per relation
        ``None`` (uniform, as for a relation left out), ``True`` (the graph's weights) or a tensor of
        weights indexed by relation edge id. An edge of weight 0 is never drawn (as `NeighborSampler`).
    edge_times : None, or mapping Relation -> torch.Tensor (integer or float, [E_r])
        Temporal sampling: edge times per relation, indexed by relation edge id; `sample` then needs
        ``seed_times``. A row of time t draws only edges of time <= t; sources inherit the time of the
        row that drew them, and are deduplicated per type by (node, time). A relation left out of the
        dict is static: its edges are eligible at any time. Times are int64 unless some relation has
        float times, then float64 for all (integer times converted).
    device : str or torch.device
        ``"cpu"`` or ``"cuda"`` (see the module docstring): same semantics and, as for
        `NeighborSampler`, the same blocks on both (uniform, weighted, fanout -1; temporal rows without
        replacement can differ where GPU ``log`` rounds differently in the last bit); ``cuda:N`` must
        name the current CUDA device. Blocks are CUDA tensors when torch has CUDA, else host tensors
        (numba's simulator).
    uva : bool or None
        ``device="cuda"`` only: read the relations' CSCs from page-locked host memory (UVA) instead of
        device copies. ``None``: UVA for the uniform and weighted relations' concatenated CSC when
        every one of their ``indptr`` is a pinned tensor, and for each temporal relation whose
        ``indptr`` is; device copies otherwise. A temporal relation's pinned tensors are read in place;
        the concatenation (and with ``True`` any unpinned array) is a copy in ``pinned`` regions.
    memory : graphrl.memory.MemoryManager or None
        ``device="cuda"`` only: the one manager whose tiers hold every relation's GPU buffers
        (docs/architecture.md#memory-tiers), so one budget governs them all: the uniform and weighted
        relations' concatenated CSC and its prefix sums, and each temporal relation's graph, on the
        ``device`` tier (``pinned`` with UVA; owner ``"samplers.graph"``); the workspace's scratch on
        ``device`` and its staging buffers on ``pinned`` (``"samplers.workspace"``). ``None``: a private
        manager without budgets. Freed by `close` or when the sampler is garbage-collected.

    Raises
    ------
    TypeError
        ``graph`` is not a `HeteroGraph`; a fanout is not an int; ``weights`` or ``edge_times`` is not
        a dict (nor None/True for weights), or holds a non-numeric tensor; ``memory`` is not a
        `MemoryManager`.
    MemoryBudgetError
        ``device="cuda"``: a relation's graph copy does not fit its tier's budget (the message names the
        tier and ``"samplers.graph"``; what the sampler placed before it is freed again, no fallback tier).
    ValueError
        Fanout lists of different lengths, empty, or with values below -1 or above
        `samplers.MAX_FANOUT` (2**31 - 1); an unknown relation (in
        ``fanouts``, ``weights`` or ``edge_times``); per relation, weights or times of the wrong
        length, a negative, NaN or infinite weight, a NaN time, ``True`` for a relation without
        weights, ``weights=True`` where no sampled relation has weights (each message names the
        argument and the relation); an unknown ``device``.
    GPUUnavailableError
        ``device="cuda"`` where numba.cuda finds no usable GPU (no silent fallback to the CPU); a
        ``RuntimeError`` and a ``ValueError`` (`graphrl.GPUUnavailableError`).

    References
    ----------
    DGL's heterogeneous MFGs (``dgl.create_block`` with several edge types) and its per-edge-type
    fanouts in ``dgl.dataloading.NeighborSampler``; Schlichtkrull et al., R-GCN (ESWC 2018); TGL (Zhou
    et al., VLDB 2022) for temporal neighbour sampling.

    Examples
    --------
    >>> sampler = HeteroNeighborSampler(g, {("user", "listens", "artist"): [5, 5],
    ...                                     ("artist", "heard_by", "user"): [5, 5],
    ...                                     ("user", "friends", "user"): [3, 3]}, seed=0)
    >>> blocks = sampler.sample({"user": torch.tensor([0, 7])})
    >>> blocks[-1].dst_nodes["user"]   # tensor([0, 7])
    """

    def __init__(self, graph: HeteroGraph, fanouts, replace: bool = False, seed: int | None = None, *,
                 weights=None, edge_times=None, device="cpu", uva: bool | None = None,
                 memory: MemoryManager | None = None) -> None:
        if not isinstance(graph, HeteroGraph):
            raise TypeError(f"graph must be a HeteroGraph, got {type(graph).__name__}")
        check_memory(memory)
        self.fanouts = check_relation_fanouts(fanouts, graph.relations)
        check_seed_and_replace(seed, replace)
        self.graph = graph
        self.num_layers = len(next(iter(self.fanouts.values())))
        self.replace = bool(replace)
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self._calls = 0
        self._lock = threading.Lock()
        self._arrays = {rel: (graph.indptr[rel].numpy(), graph.indices[rel].numpy(),
                              graph.edge_ids[rel].numpy()) for rel in self.fanouts}
        self._weights = self._relation_weights(weights)
        self._times, self.time_dtype = self._relation_times(edge_times)
        self.temporal = edge_times is not None
        """Whether `sample` needs ``seed_times`` (the sampler has edge times)."""
        self._eid_to_pos: dict[Relation, np.ndarray] = {}
        self.sampled_edges = 0
        """Total edges sampled so far."""
        self.device = check_device(device)
        self._cuda_graphs: dict[Relation, object] = {}
        self._closed = False
        self.typed_csc = None
        """CUDA: the `samplers.kernels.cuda.typed.TypedCsc` of the uniform and weighted relations (sampled
        in one launch per kernel and layer); None on the CPU or without such relations."""
        self.cuda_memory = None
        """``device="cuda"``: the `samplers.kernels.cuda.memory.CudaMemory` of every relation's regions
        (one for the sampler); None on the CPU."""
        if self.device.type == "cuda":
            try:  # the regions placed before a failure go back (and a private manager is closed)
                self._cuda_graphs = self._build_cuda(uva, memory)
            except BaseException:
                self.close()
                raise
        self._loop = self._build_loop()

    @property
    def launches(self) -> dict[str, int]:
        """Kernel launches of the fused typed path so far (CUDA), by kernel: ``"plan"``, ``"scan"``,
        ``"rows"`` and ``"choose"`` (uniform rows a warp each: fanout -1 or above the thread-per-row subset,
        without replacement), each at most once per layer whatever the number of relations; empty on the
        CPU."""
        return dict(self._loop.launches)

    @property
    def traffic(self) -> Any:
        """CUDA: the `samplers.kernels.cuda.workspace.HostTraffic` of this sampler's chained layers
        (read-backs, allocations, copies); None on the CPU."""
        return self._loop.traffic

    def _mode_kind(self, rel: Relation) -> type:
        """The mode of a sampled relation: temporal with times, weighted with weights, else uniform."""
        if rel in self._times:
            return TemporalMode
        if rel in self._weights:
            return WeightedMode
        return UniformMode

    def _build_loop(self, derived: dict | None = None) -> LayerLoop:
        """The layer loop over the sampled relations: each relation's mode (temporal with times, weighted
        with weights, else uniform) and arrays; its scratch (relabelling maps) and, on the CPU, each
        relation's gather pairs and weighted prefix sums (8 bytes per edge each) are built once here,
        unless ``derived`` (`__getstate__`'s shared tensors by relation) hands the latter in."""
        arrays, modes = {}, {}
        derived = derived or {}
        for rel, (indptr, indices, eids) in self._arrays.items():
            arrays[rel] = RelationArrays(indptr, indices, eids, self.graph.num_nodes[rel[0]],
                                         weights=self._weights.get(rel), times=self._times.get(rel),
                                         cuda=self._cuda_graphs.get(rel),
                                         **attach_derived(f"_shared[{rel!r}]", derived.get(rel), indices,
                                                          eids, indptr.shape[0] - 1))
            modes[rel] = self._mode_kind(rel)(self.replace)
        index = {rel: r for r, rel in enumerate(self.graph.relations)}
        return LayerLoop(arrays, self.graph.num_nodes, modes, self.device.type, typed=True,
                         relation_index=index, typed_csc=self.typed_csc)

    def _refresh_views(self) -> None:
        """(Re)take the numpy views of the graph's tensors when their memory moved: torch's
        multiprocessing pickler (``mp.spawn`` arguments, a spawned worker's dataset) moves a CPU tensor
        into shared memory and frees the old block, so every `sample` checks the views."""
        g = self.graph
        for rel, (indptr, indices, eids) in self._arrays.items():
            if (indptr.ctypes.data != g.indptr[rel].data_ptr()
                    or indices.ctypes.data != g.indices[rel].data_ptr()
                    or eids.ctypes.data != g.edge_ids[rel].data_ptr()):
                self._arrays[rel] = (g.indptr[rel].numpy(), g.indices[rel].numpy(), g.edge_ids[rel].numpy())
                arr = self._loop.relations[rel]
                arr.indptr, arr.indices, arr.edge_ids = self._arrays[rel]

    def _build_cuda(self, uva: bool | None, memory: MemoryManager | None) -> dict:
        """One `CudaGraph` per sampled relation (its weights and times included). The uniform and
        weighted relations are concatenated into one `TypedCsc` (``typed_csc``; their graphs are
        views of it), sampled in one launch per kernel and layer; temporal relations get their own. Every
        relation shares one index dtype (int64 where theirs differ), so sources concatenate. With ``uva``
        None, the concatenation is read through UVA when every one of its relations' indptr is pinned
        (it is then a copy in ``pinned`` regions). Every region comes from ``cuda_memory``, made here
        over ``memory`` (the workspaces take theirs from the graphs':
        `samplers.layers.LayerLoop.cuda_workspace`)."""
        from samplers.kernels import cuda as cuda_kernels  # imports numba.cuda: only when asked for
        from samplers.kernels.cuda.typed import TypedCsc

        require_gpu(self.device)
        cuda_kernels.check_device_index(self.device)
        self.cuda_memory = mem = cuda_kernels.CudaMemory(memory)
        g = self.graph
        dtypes = {g.indices[rel].dtype for rel in self.fanouts}
        dtype = next(iter(dtypes)) if len(dtypes) == 1 else torch.int64
        fused = [rel for rel in self.fanouts if self._mode_kind(rel) is not TemporalMode]
        out = {}
        if fused:
            fused_uva = all(g.indptr[rel].is_pinned() for rel in fused) if uva is None else bool(uva)
            weights = {rel: self._weights[rel] for rel in fused if rel in self._weights}
            self.typed_csc = TypedCsc.build({rel: self._arrays[rel][0] for rel in fused},
                                             {rel: g.indices[rel].to(dtype) for rel in fused},
                                             {rel: self._arrays[rel][2] for rel in fused}, weights,
                                             uva=fused_uva, num_nodes=g.num_nodes, memory=mem)
            out = {rel: self.typed_csc.relation_graph(rel) for rel in fused}
        for rel in self.fanouts:
            if rel in out:
                continue
            indptr = g.indptr[rel]
            rel_uva = bool(indptr.is_pinned()) if uva is None else bool(uva)
            out[rel] = cuda_kernels.CudaGraph.build(indptr, g.indices[rel].to(dtype), g.edge_ids[rel],
                                                    self._weights.get(rel), uva=rel_uva,
                                                    times=self._times.get(rel), memory=mem)
        return {rel: out[rel] for rel in self.fanouts}

    def __getstate__(self) -> dict:
        """The sampler's state for pickling (``mp.spawn``, spawned ``DataLoader`` workers), without what
        a process rebuilds.

        Kept: the graph (its tensors by value; torch's multiprocessing pickler shares them through
        shared memory), fanouts, seed, the call counter, ``sampled_edges``, weights and times (as tensors,
        shared the same way), and each relation's derived arrays (the gather's pairs and the weighted
        prefix sums, 8 bytes per edge each: moved into shared memory at the first pickling, so processes
        attach one copy per host, `samplers._csc.share_loop`; the weights and times likewise:
        `samplers._csc.pickle_loop`). Rebuilt by `__setstate__`, not copied: the lock, the numpy views of
        the graph, the relabelling maps and the inverse edge-id maps. A copy continues the original's
        random stream (its next `sample` returns what the original's next would).

        Raises
        ------
        TypeError
            The sampler runs on ``device="cuda"`` (build one in each process).
        """
        if self._cuda_graphs:
            raise TypeError("a HeteroNeighborSampler on device='cuda' cannot be pickled: build one in each "
                            "process")
        with self._lock:  # a consistent snapshot while another thread samples
            state = self.__dict__.copy()
            state["_shared"], inputs = pickle_loop(self._loop)  # kept alive with the loop
            self._weights, self._times = inputs["weights"], inputs["times"]
        for name in ("_lock", "_arrays", "_loop", "_eid_to_pos", "_weights", "_times"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled sampler, rebuilding its lock, views, maps and caches (see `__getstate__`).

        Raises
        ------
        ValueError
            A relation's derived arrays do not fit its graph (`samplers._csc.attach_derived`).
        """
        state = dict(state)
        inputs, derived = unpickle_loop(state.pop("_shared"))
        self.__dict__.update(state)
        self._weights, self._times = inputs["weights"], inputs["times"]
        self._lock = threading.Lock()
        g = self.graph
        self._arrays = {rel: (g.indptr[rel].numpy(), g.indices[rel].numpy(), g.edge_ids[rel].numpy())
                        for rel in self.fanouts}
        self._loop = self._build_loop(derived)
        self._eid_to_pos = {}

    def _relation_weights(self, weights) -> dict[Relation, np.ndarray]:
        """Per sampled relation with weights: float32 [E_r] in CSC order."""
        if weights is None or weights is False:
            return {}
        if weights is True:
            spec = {rel: True for rel in self.fanouts if rel in self.graph.weights}
            if not spec:
                raise ValueError("weights=True needs a graph with edge weights on a sampled relation (build "
                                 "it with HeteroGraph.from_edges(..., weights={relation: w})), or pass "
                                 "weights as a dict of tensors per relation")
        else:
            spec = check_relation_dict("weights", weights, self.graph.relations)
        out = {}
        for rel, w in spec.items():
            if rel not in self.fanouts or w is None or w is False:
                continue
            if w is True:
                if rel not in self.graph.weights:
                    raise ValueError(f"weights[{rel!r}]=True: the relation has no edge weights (build the "
                                     f"graph with HeteroGraph.from_edges(..., weights={{relation: w}}), or "
                                     f"pass a tensor of shape [{self.graph.num_edges(rel)}])")
                out[rel] = self.graph.weights[rel].numpy().astype(np.float32, copy=True)  # never a view
            else:
                out[rel] = csc_weights(f"weights[{rel!r}]", w, self.graph.num_edges(rel),
                                       self._arrays[rel][2])
        return out

    def _relation_times(self, edge_times) -> tuple[dict[Relation, np.ndarray], np.dtype]:
        """Per sampled relation with times: int64/float64 [E_r] in CSC order, and the common dtype."""
        spec = check_relation_dict("edge_times", edge_times, self.graph.relations)
        spec = {rel: t for rel, t in spec.items() if rel in self.fanouts and t is not None}
        raw = {rel: edge_array(f"edge_times[{rel!r}]", t, self.graph.num_edges(rel))
               for rel, t in spec.items()}
        floating = any(np.issubdtype(a.dtype, np.floating) for a in raw.values())
        dtype = np.dtype(np.float64 if floating else np.int64)
        out = {rel: csc_times(f"edge_times[{rel!r}]", a, a.shape[0], self._arrays[rel][2], dtype=dtype)
               for rel, a in raw.items()}
        return out, dtype

    def _excluded(self, exclude_eids) -> dict[Relation, np.ndarray]:
        """Per relation: sorted distinct CSC positions never drawn."""
        out = {}
        for rel, ids in check_relation_dict("exclude_eids", exclude_eids, self.graph.relations).items():
            if rel not in self.fanouts:
                continue

            def inverse(rel=rel):
                if rel not in self._eid_to_pos:
                    self._eid_to_pos[rel] = inverse_permutation(self._arrays[rel][2])
                return self._eid_to_pos[rel]

            pos = excluded_positions(f"exclude_eids[{rel!r}]", ids, self.graph.num_edges(rel), inverse)
            if pos is not None:
                out[rel] = pos
        return out

    def _seed_times(self, seed_times, dst: dict[str, np.ndarray], seeded) -> dict[str, np.ndarray] | None:
        if not self.temporal:
            if seed_times is not None:
                raise ValueError("seed_times given, but the sampler has no edge_times (pass edge_times=... "
                                 "to HeteroNeighborSampler for temporal sampling)")
            return None
        if seed_times is None:
            raise ValueError("seed_times is required: the sampler has edge_times (temporal sampling)")
        if not isinstance(seed_times, Mapping):
            raise TypeError(f"seed_times must be a dict keyed by node type, got {type(seed_times).__name__}")
        for t in seed_times:
            if t not in seeded:
                raise ValueError(f"seed_times: node type {t!r} has no seeds (seeds has {sorted(seeded)})")
        times = {}
        for t, ids in dst.items():
            if t in seeded:
                if t not in seed_times:
                    raise ValueError(f"seed_times[{t!r}] is required: seeds has node type {t!r}")
                times[t] = check_seed_times(f"seed_times[{t!r}]", seed_times[t], ids.shape[0],
                                            self.time_dtype)
            else:
                times[t] = np.empty(0, dtype=self.time_dtype)
        return times

    def sample(self, seeds: Mapping[str, torch.Tensor], exclude_eids=None,
               seed_times=None) -> list[HeteroBlock]:
        """Sample ``num_layers`` heterogeneous blocks for the seeds, outermost first.

        Parameters
        ----------
        seeds : mapping str -> torch.Tensor (int64, shape [B_t])
            Seed nodes per node type (ids within the type); types left out have no seeds.
        exclude_eids : mapping Relation -> torch.Tensor (int64, [X_r]), or None
            Relation edge ids that no layer may draw (removed from the candidates before drawing, as
            `NeighborSampler.sample`).
        seed_times : mapping str -> torch.Tensor (integer or float, [B_t]), or None
            Temporal sampling (required iff the sampler has ``edge_times``): the time of each seed, for
            every seeded node type. Float times against integer edge times are floored.

        Returns
        -------
        list[HeteroBlock]
            ``blocks[-1].dst_nodes[t]`` equals ``seeds[t]`` (empty for other types);
            ``blocks[i].dst_nodes[t]`` equals ``blocks[i + 1].src_nodes[t]``.

        Raises
        ------
        ValueError, TypeError
            An unknown node type; seeds not 1-D integer ids within their type's range; an unknown
            relation in ``exclude_eids`` or ids outside [0, E_r); ``seed_times`` missing on a temporal
            sampler, given on another, missing a seeded type, naming a type without seeds, of the wrong
            length, or holding NaN (messages name the argument and the relation or type); the sampler
            was closed (or, on CUDA, the manager of its regions).
        MemoryBudgetError
            On CUDA, the workspace's scratch or staging buffers do not fit their tier's budget.
        """
        check_open(self._closed, "this HeteroNeighborSampler")
        if self.cuda_memory is not None:
            self.cuda_memory.check_open("this HeteroNeighborSampler's GPU memory")
        dst: dict[str, np.ndarray] = {}
        for t in self.graph.num_nodes:
            dst[t] = np.empty(0, dtype=np.int64)
        if not isinstance(seeds, Mapping):
            raise TypeError(f"seeds must be a dict keyed by node type, got {type(seeds).__name__}")
        for t, s in seeds.items():
            if t not in self.graph.num_nodes:
                raise ValueError(f"seeds: unknown node type {t!r} (the graph has {self.graph.node_types})")
            dst[t] = check_seeds(s, self.graph.num_nodes[t], name=f"seeds[{t!r}]", bound=f"num_nodes[{t!r}]")
        times = self._seed_times(seed_times, dst, set(seeds))
        with self._lock:
            self._refresh_views()
            excluded = self._excluded(exclude_eids)
            call = self._calls
            self._calls += 1
            if self._cuda_graphs:  # host arrays go through the workspace's page-locked staging buffers
                ws = self._loop.cuda_workspace()
                dst = {t: ws.device_ids(v, f"ids_{t}", keep=True) for t, v in dst.items()}
                # -0.0 -> 0.0 once (inner layers inherit these): equal times, equal relabelling keys
                times = None if times is None else {
                    t: ws.device_ids(v + v.dtype.type(0), f"times_{t}", keep=True) for t, v in times.items()}
            before = self._loop.sampled_edges
            layers = self._loop.run(dst, self.fanouts, self.seed, call, excluded=excluded, seed_times=times,
                                    threads=team_size() if not self._cuda_graphs else 1)
            self.sampled_edges += self._loop.sampled_edges - before
            return [HeteroBlock(src_nodes=x.src_nodes, dst_nodes=x.dst_nodes, indptr=x.indptr,
                                indices=x.indices, edge_ids=x.edge_ids, src_times=x.src_times)
                    for x in layers]

    def close(self) -> None:
        """Free the sampler's memory-manager regions (``device="cuda"``: every relation's graph copy and
        prefix sums, the workspaces' buffers) and close a private manager; `sample` then raises ValueError.
        Idempotent; a CPU sampler holds no regions (this only marks it closed)."""
        self._closed = True
        if self.cuda_memory is not None:
            self.cuda_memory.close()

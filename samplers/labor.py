"""`LaborSampler`: layer-neighbour sampling (LABOR) into blocks, on plain and typed graphs, CPU and CUDA.

The sampler is the layer loop (`samplers.layers`) with `samplers.modes.LaborMode` on every relation;
its blocks follow `NeighborSampler`'s contract (outermost first, destinations first among the
sources), plus ``edge_weights`` where DGL's ``LaborSampler`` gives them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager, check_memory
from graphrl.threads import team_size
from samplers._checks import (
    check_bool,
    check_device,
    check_fanouts,
    check_int,
    check_open,
    check_regions,
    check_relation_dict,
    check_relation_fanouts,
    check_seed,
    check_seeds,
    require_gpu,
)
from samplers._csc import (
    attach_derived,
    csc_weights,
    excluded_positions,
    inverse_permutation,
    pickle_loop,
    unpickle_loop,
)
from samplers.block import Blocks
from samplers.hetero_block import HeteroBlock
from samplers.hetero_graph import HeteroGraph
from samplers.layers import PLAIN_NODE, PLAIN_RELATION, LayerLoop, plain_blocks
from samplers.modes import LaborMode, RelationArrays

__all__ = ["LaborSampler"]


class LaborSampler:
    """Layer-neighbour sampling (LABOR-i): k sources per destination in expectation, drawn with one
    random variate per source and layer, so destinations share their sampled sources.

    Row t keeps in-edge (u, t) iff ``r_u < c_t * f`` (`samplers.modes.labor`): LABOR-0 keeps each edge
    with probability ``min(1, k / d)`` (d the row's eligible in-degree); with weights, probability
    ``min(1, c_t * A)`` with c_t solved so that the estimator's variance is that of k draws.

    Parameters
    ----------
    graph : CSCGraph or HeteroGraph
    fanouts : sequence of int, or (HeteroGraph) mapping Relation -> sequence of int
        k per layer, outermost first (as `NeighborSampler`); -1 keeps every in-edge. On a
        `HeteroGraph` one list serves every relation, or one list per relation (others draw nothing), or
        DGL's one dict per layer ``[{etype: k}, ...]``, a relation a canonical triple or a name only it has
        (`samplers._checks.check_relation_fanouts`).
    importance_sampling : int
        DGL's meaning: i of LABOR-i; 0 uniform variates, i > 0 runs i fixed-point iterations of the
        importance-sampling probabilities pi (fewer sources for the same variance), i < 0 iterates
        until the expected source count converges.
    layer_dependency : bool
        Reuse the variates of one layer for every layer of a call (fewer sources; DGL's meaning).
    weights : None, True, torch.Tensor [E] (plain graph) or mapping Relation -> those (HeteroGraph)
        Non-uniform LABOR (DGL's ``prob``): ``True`` takes the graph's weights, a tensor is indexed by
        edge id. An edge of weight 0 is never kept.
    seed : int
        Seed of the variates; call n of `sample` with a given seed returns the same blocks on every run,
        on either device.
    device : str or torch.device
        ``"cpu"`` or ``"cuda"`` (same blocks for a seed; on CUDA, layers of fanout >= 0 chain on the
        device, importance sampling's fixed point included: one read-back a call).
    uva : bool or None
        CUDA: read the graph from page-locked host memory (as `NeighborSampler`).
    memory : graphrl.memory.MemoryManager or None
        CUDA only: the manager whose tiers hold the sampler's GPU buffers (as `NeighborSampler`: the
        graph's copy, ``"samplers.graph"``, and the workspace's buffers, ``"samplers.workspace"``) and
        LABOR's per-node arrays on the ``device`` tier (``"samplers.labor"``: with importance sampling,
        16 bytes per source id of each relation). ``None``: a private manager without budgets. Freed by
        `close` or when the sampler is garbage-collected.

    Notes
    -----
    Blocks carry ``edge_weights`` (float32 [nnz], each row's mean 1: multiply messages by them and
    take the mean) when ``weights`` is given or ``importance_sampling != 0``, as DGL's
    ``edata["edge_weights"]``; else None. Variates of a typed graph are per source type, shared by
    every relation out of it (DGL's one seed for all edge types); pi and c_t are per relation.

    Memory: a CPU sampler keeps each relation's sources and edge ids side by side for its gather (int32,
    8 bytes per edge, `samplers._csc.edge_pairs`; none on a graph without edge ids) and the weights in
    CSC order (float32, 4 bytes per edge). Pickled (spawned loader workers, ``mp.spawn``), those arrays
    are shared like the graph's tensors, once per host per sampler (`__getstate__`).

    Raises
    ------
    TypeError
        ``graph`` of another type; a non-int fanout, seed or ``importance_sampling``; ``memory`` not a
        `MemoryManager`.
    MemoryBudgetError
        CUDA: a buffer does not fit its tier's budget (the message names the tier and the owner).
    ValueError
        Bad fanouts (as `NeighborSampler`), ``seed`` outside [0, 2**64), bad weights (length, sign,
        NaN), ``weights=True`` without graph weights, an unknown relation or device.
    GPUUnavailableError
        ``device="cuda"`` without a usable GPU.

    References
    ----------
    Balin and Catalyurek, "Layer-Neighbor Sampling -- Defusing Neighborhood Explosion in GNNs" (NeurIPS
    2023); DGL's ``dgl.dataloading.LaborSampler``.

    Examples
    --------
    >>> sampler = LaborSampler(graph, [15, 10, 5], seed=0)
    >>> blocks = sampler.sample(torch.tensor([0, 7, 42]))   # as NeighborSampler.sample
    """

    def __init__(self, graph: CSCGraph | HeteroGraph, fanouts, *, importance_sampling: int = 0,
                 layer_dependency: bool = False, weights=None, seed: int = 0, device="cpu",
                 uva: bool | None = None, memory: MemoryManager | None = None) -> None:
        self.importance_sampling = check_int("importance_sampling", importance_sampling, -(2**31), 2**31 - 1)
        self.layer_dependency = check_bool("layer_dependency", layer_dependency)
        self.seed = check_seed("seed", seed)
        self.device = check_device(device)
        check_memory(memory)
        self._memory = memory
        self.cuda_memory = None
        """CUDA: the `samplers.kernels.cuda.memory.CudaMemory` of the sampler's regions."""
        self._closed = False
        self.graph = graph
        self.typed = isinstance(graph, HeteroGraph)
        if self.typed:
            self._fanouts = check_relation_fanouts(fanouts, graph.relations)
            self.fanouts = self._fanouts
            self._weights = self._typed_weights(graph, weights)
        elif isinstance(graph, CSCGraph):
            check_regions(graph.regions, "graph")
            graph.validate()
            self.fanouts = check_fanouts("fanouts", fanouts)
            self._fanouts = {PLAIN_RELATION: self.fanouts}
            w = self._plain_weights(graph, weights)
            self._weights = {} if w is None else {PLAIN_RELATION: w}
        else:
            raise TypeError(f"graph must be a CSCGraph or a HeteroGraph, got {type(graph).__name__}")
        self.weighted = bool(self._weights)
        """Whether kept edges follow edge weights."""
        self.num_layers = len(next(iter(self._fanouts.values())))
        """Blocks per sample."""
        try:  # CUDA: the regions placed before a failure go back
            loop = self._build_loop(uva)
        except BaseException:
            self.close()
            raise
        self.loop = loop
        """The `samplers.layers.LayerLoop` running `samplers.modes.LaborMode` on every relation."""
        self._eid_to_pos: dict = {}
        self._calls = 0
        self._lock = threading.Lock()

    def _graph_tensors(self) -> dict:
        """By sampled relation (the graph's order): its indptr, indices and edge ids (None: the
        positions) as the graph holds them, and its number of source nodes."""
        g = self.graph
        if not self.typed:
            return {PLAIN_RELATION: (g.indptr, g.indices, g.edge_ids, g.num_nodes)}
        return {rel: (g.indptr[rel], g.indices[rel], g.edge_ids[rel], g.num_nodes[rel[0]])
                for rel in g.relations if rel in self._fanouts}

    def _build_loop(self, uva: bool | None = None, derived: dict | None = None) -> LayerLoop:
        """The layer loop with `samplers.modes.LaborMode` on every sampled relation; on the CPU each
        relation's gather pairs are built here (8 bytes per edge) unless ``derived`` (`__getstate__`'s
        shared tensors by relation, `samplers._csc.attach_derived`) hands them in."""
        arrays = {}
        for rel, (indptr, indices, eids, num_src) in self._graph_tensors().items():
            eids = None if eids is None else eids.numpy()
            name = "_shared" if not self.typed else f"_shared[{rel!r}]"
            arrays[rel] = RelationArrays(indptr.numpy(), indices.numpy(), eids, num_src,
                                         weights=self._weights.get(rel),
                                         **attach_derived(name, (derived or {}).get(rel), indices.numpy(),
                                                          eids, indptr.shape[0] - 1))
        if self.device.type == "cuda":
            self._place_on_cuda(arrays, uva)
        want = self.weighted or self.importance_sampling != 0
        mode = LaborMode(self.importance_sampling, want_weights=want)
        num_nodes = dict(self.graph.num_nodes) if self.typed else {PLAIN_NODE: self.graph.num_nodes}
        index = {rel: r for r, rel in enumerate(self.graph.relations)} if self.typed else None
        return LayerLoop(arrays, num_nodes, {rel: mode for rel in arrays}, self.device.type,
                         typed=self.typed, relation_index=index)

    def _refresh_views(self) -> None:
        """(Re)take the loop's numpy views of the graph's tensors where their memory moved: torch's
        multiprocessing pickler (``mp.spawn`` arguments, a spawned worker's dataset) moves a CPU tensor
        into shared memory and frees the old block, so every CPU `sample` checks the views."""
        for rel, (indptr, indices, eids, _) in self._graph_tensors().items():
            arr = self.loop.relations[rel]
            if (arr.indptr.ctypes.data != indptr.data_ptr() or arr.indices.ctypes.data != indices.data_ptr()
                    or eids is not None and arr.edge_ids.ctypes.data != eids.data_ptr()):
                arr.indptr, arr.indices = indptr.numpy(), indices.numpy()
                arr.edge_ids = None if eids is None else eids.numpy()

    def __getstate__(self) -> dict:
        """The sampler's state for pickling (``mp.spawn``, spawned ``DataLoader`` workers), without what
        a process rebuilds.

        Kept: the graph (its tensors by value; torch's multiprocessing pickler shares them through
        shared memory), fanouts, seed, the call counter, ``sampled_edges``, and each relation's weights
        (CSC order) and gather pairs: moved into shared memory at the first pickling, so processes attach
        one copy per host (`samplers._csc.pickle_loop`). Rebuilt by `__setstate__`: the lock, the loop
        (around the shared arrays: nothing is computed again) and the inverse edge-id maps. A copy
        continues the original's random stream (its next `sample` returns what the original's next
        would).

        Raises
        ------
        TypeError
            The sampler runs on ``device="cuda"`` (build one in each process).
        """
        if self.device.type == "cuda":
            raise TypeError("a LaborSampler on device='cuda' cannot be pickled: build one in each process")
        with self._lock:  # a consistent snapshot while another thread samples
            state = self.__dict__.copy()
            state["_shared"], inputs = pickle_loop(self.loop)  # kept alive with the loop
            state["sampled_edges"] = self.loop.sampled_edges
            self._weights = inputs["weights"]
        for name in ("_lock", "loop", "_eid_to_pos", "_weights", "_memory"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled sampler around the shared arrays, rebuilding its lock, loop and caches (see
        `__getstate__`).

        Raises
        ------
        ValueError
            A relation's pairs do not fit its graph (`samplers._csc.attach_derived`).
        """
        state = dict(state)
        inputs, derived = unpickle_loop(state.pop("_shared"))
        sampled = state.pop("sampled_edges")
        self.__dict__.update(state)
        self._weights = inputs["weights"]
        self._memory = None
        self._lock = threading.Lock()
        self.loop = self._build_loop(derived=derived)
        self.loop.sampled_edges = sampled
        self._eid_to_pos = {}

    @property
    def sampled_edges(self) -> int:
        """Edges sampled so far (all blocks of all calls)."""
        return self.loop.sampled_edges

    def _place_on_cuda(self, arrays: dict, uva: bool | None) -> None:
        from samplers.kernels import cuda as ck

        require_gpu(self.device)
        ck.check_device_index(self.device)
        g = self.graph
        self.cuda_memory = ck.CudaMemory(self._memory)
        for rel, arr in arrays.items():
            if self.typed:
                indptr, indices, eids = g.indptr[rel], g.indices[rel], g.edge_ids[rel]
            else:
                indptr, indices, eids = g.indptr, g.indices, g.edge_ids
            use_uva = bool(indptr.is_pinned()) if uva is None else bool(uva)
            arr.cuda = ck.CudaGraph.build(indptr, indices, eids, arr.weights, uva=use_uva,
                                          memory=self.cuda_memory)

    @staticmethod
    def _plain_weights(graph: CSCGraph, weights) -> np.ndarray | None:
        if weights is None or weights is False:
            return None
        if weights is True:
            if graph.weights is None:
                raise ValueError("weights=True needs a graph with edge weights, or pass weights as a tensor "
                                 "[E]")
            return graph.weights.numpy().astype(np.float32, copy=True)
        return csc_weights("weights", weights, graph.num_edges, graph.csc_edge_ids().numpy())

    def _typed_weights(self, graph: HeteroGraph, weights) -> dict:
        if weights is None or weights is False:
            return {}
        if weights is True:
            spec = {rel: True for rel in self._fanouts if rel in graph.weights}
            if not spec:
                raise ValueError("weights=True needs a graph with edge weights on a sampled relation")
        else:
            spec = check_relation_dict("weights", weights, graph.relations)
        out = {}
        for rel, w in spec.items():
            if rel not in self._fanouts or w is None or w is False:
                continue
            if w is True:
                if rel not in graph.weights:
                    raise ValueError(f"weights[{rel!r}]=True: the relation has no edge weights")
                out[rel] = graph.weights[rel].numpy().astype(np.float32, copy=True)
            else:
                out[rel] = csc_weights(f"weights[{rel!r}]", w, graph.num_edges(rel),
                                       graph.edge_ids[rel].numpy())
        return out

    def _excluded(self, exclude_eids) -> dict:
        """Per relation: sorted distinct CSC positions never kept (host arrays)."""
        if exclude_eids is None:
            return {}
        if not self.typed:
            exclude_eids = {PLAIN_RELATION: exclude_eids}
            rels = [PLAIN_RELATION]
        else:
            exclude_eids = check_relation_dict("exclude_eids", exclude_eids, self.graph.relations)
            rels = self.graph.relations
        out = {}
        for rel, ids in exclude_eids.items():
            if rel not in self.loop.relations or rel not in rels:
                continue
            arr = self.loop.relations[rel]

            def inverse(rel=rel, arr=arr):
                if arr.edge_ids is None:
                    return None
                if rel not in self._eid_to_pos:
                    self._eid_to_pos[rel] = inverse_permutation(arr.edge_ids)
                return self._eid_to_pos[rel]

            name = "exclude_eids" if not self.typed else f"exclude_eids[{rel!r}]"
            pos = excluded_positions(name, ids, int(arr.indices.shape[0]), inverse)
            if pos is not None:
                out[rel] = pos
        return out

    def _seeds(self, seeds) -> dict:
        if not self.typed:
            return {PLAIN_NODE: check_seeds(seeds, self.graph.num_nodes)}  # copies a tensor to the host
        if not isinstance(seeds, Mapping):
            raise TypeError(f"seeds must be a dict keyed by node type, got {type(seeds).__name__}")
        out = {t: np.empty(0, dtype=np.int64) for t in self.graph.num_nodes}
        for t, s in seeds.items():
            if t not in self.graph.num_nodes:
                raise ValueError(f"seeds: unknown node type {t!r} (the graph has {self.graph.node_types})")
            out[t] = check_seeds(s, self.graph.num_nodes[t], name=f"seeds[{t!r}]", bound=f"num_nodes[{t!r}]")
        return out

    def sample(self, seeds, exclude_eids=None, seed_times=None) -> Blocks | list[HeteroBlock]:
        """Sample blocks for ``seeds``, outermost layer first.

        Parameters
        ----------
        seeds : torch.Tensor int64 [B] (plain graph) or mapping str -> such a tensor (HeteroGraph)
            Seed nodes; duplicates are kept (each its own row; they keep identical sources).
        exclude_eids : torch.Tensor int64 [X], or mapping Relation -> such (HeteroGraph), or None
            Edge ids never kept (removed from the candidates before c_t is computed).
        seed_times : None
            LABOR has no temporal form; anything else raises ValueError.

        Returns
        -------
        Blocks (plain graph) or list[HeteroBlock] (HeteroGraph)
            As `NeighborSampler.sample` / `HeteroNeighborSampler.sample`, with ``edge_weights`` (see the
            class Notes).

        Raises
        ------
        TypeError, ValueError
            Seeds or exclusions as `NeighborSampler.sample` raises them; ``seed_times`` given; the sampler
            (or, on CUDA, the manager of its regions) was closed.
        MemoryBudgetError
            CUDA: the workspace's buffers do not fit their tier's budget.
        """
        check_open(self._closed, "this LaborSampler")
        if self.cuda_memory is not None:
            self.cuda_memory.check_open("this LaborSampler's GPU memory")
        if seed_times is not None:
            raise ValueError("seed_times given, but LaborSampler has no temporal sampling (use "
                             "NeighborSampler(edge_times=...))")
        dst = self._seeds(seeds)
        with self._lock:
            if self.device.type == "cpu":
                self._refresh_views()
            excluded = self._excluded(exclude_eids)
            call = self._calls
            self._calls += 1
            if self.device.type == "cuda":  # host arrays go through the workspace's page-locked staging
                ws = self.loop.cuda_workspace()
                dst = {t: ws.device_ids(v, f"ids_{t}", keep=self.typed) for t, v in dst.items()}
                excluded = {rel: ws.device_ids(v, f"excluded_{rel}") for rel, v in excluded.items()}
            layers = self.loop.run(dst, self._fanouts, self.seed, call, excluded=excluded,
                                    threads=team_size() if self.device.type == "cpu" else 1,
                                    layer_dependency=self.layer_dependency)
        if self.typed:
            return [HeteroBlock(src_nodes=x.src_nodes, dst_nodes=x.dst_nodes, indptr=x.indptr,
                                indices=x.indices, edge_ids=x.edge_ids, edge_weights=x.edge_weights)
                    for x in layers]
        return plain_blocks(layers)

    def close(self) -> None:
        """Free the sampler's memory-manager regions (CUDA: graph copies, workspace buffers, LABOR's
        per-node arrays) and close a private manager; `sample` then raises ValueError. Idempotent."""
        self._closed = True
        if self.cuda_memory is not None:
            self.cuda_memory.close()

    def __repr__(self) -> str:
        return (f"LaborSampler(fanouts={self.fanouts}, importance_sampling={self.importance_sampling}, "
                f"layer_dependency={self.layer_dependency}, weighted={self.weighted}, seed={self.seed}, "
                f"device={str(self.device)!r})")

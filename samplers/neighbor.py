"""Multi-layer neighbour sampling into blocks (MFGs), as DGL's NeighborSampler and PyG's NeighborLoader."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence

import numpy as np
import torch

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager, check_memory
from graphrl.threads import team_size
from samplers._checks import (
    check_device,
    check_fanouts,
    check_id_dtype,
    check_open,
    check_regions,
    check_seed_and_replace,
    check_seed_times,
    check_seeds,
    require_gpu,
)
from samplers._csc import (
    attach_derived,
    blocks_dst_count,
    csc_times,
    csc_weights,
    excluded_positions,
    inverse_permutation,
    pickle_loop,
    unpickle_loop,
)
from samplers.block import Blocks
from samplers.kernels import cpu
from samplers.layers import PLAIN_NODE, PLAIN_RELATION, LayerLoop, plain_blocks
from samplers.modes import RelationArrays, TemporalMode, UniformMode, WeightedMode

__all__ = ["NeighborSampler"]


class NeighborSampler:
    """Sample a fixed number of in-neighbours per node per layer and return DGL-style blocks.

    Parameters
    ----------
    graph : CSCGraph
        The graph; in-edges of a destination are its candidates.
    fanouts : sequence of int
        Neighbours drawn per node, one entry per layer, outermost layer first (as in DGL):
        ``fanouts[-1]`` is drawn for the seeds, ``fanouts[0]`` for the outermost layer. ``-1`` takes
        every in-neighbour.
    replace : bool
        Draw with replacement: a node of in-degree d > 0 contributes exactly k edges (0 when d = 0).
        Without replacement it contributes min(d, k) distinct edges (distinct edge ids: parallel edges
        can both be drawn, no edge twice).
    weights : None, True, or torch.Tensor (float or integer, shape [E]; held as float32)
        ``None``: uniform draws. ``True``: the graph's own edge weights. A tensor: one weight per edge,
        indexed by *edge id* (as DGL's ``prob`` edge feature). Without replacement, a node's k edges
        are k successive weighted draws without replacement (each proportional to the weights of the
        edges not drawn yet: the law of A-ES exponential keys); with replacement, each draw picks an edge
        with probability w / (row sum). Without edge times, draws are made by rejection over per-row
        prefix sums of the weights computed once here (float64, 8 bytes per edge, plus 8 bytes per node
        for each node's count of positive weights), so a row costs O(k log d) rather than O(d); rows of
        at most 64 edges where k exceeds a third of d draw over running sums instead (no rejection): see
        "Weighted rows" in `samplers.kernels.reference`. An edge of weight 0 is never drawn, so a node's
        d counts only its positive-weight edges: a node with fewer than k of them gives exactly those, a
        node whose weights are all 0 draws nothing. Weights are stored as float32 in CSC order (a copy, 4
        bytes per edge), so later edits of ``weights`` are not seen: build a new sampler (`DglSampler`
        does when its ``prob`` / ``mask`` column is written, `PygSampler` its ``weight_attr`` / times).
    edge_times : torch.Tensor or None, integer or float, shape [E]
        Temporal sampling: the time of each edge, indexed by edge id. `sample` then needs
        ``seed_times`` and a row of time t draws only edges of time <= t (see `sample`). Integer
        times are kept as int64, float times as float64 (a copy in CSC order).
    seed : int or None
        Seed of the sampler's random stream. ``None`` draws one from the OS. The n-th call of
        `sample` with a given seed returns the same blocks on every run and for any thread count.
    device : str or torch.device
        ``"cpu"`` (numba CPU kernels) or ``"cuda"`` (numba.cuda kernels, `samplers.kernels.cuda`: a
        thread per destination row for the usual fanouts, relabelling through a GPU hash table); ``cuda:N``
        must name the current CUDA device (else ValueError). Same semantics on both; the same seed gives
        the same blocks on both (uniform draws with or without replacement, fanout -1, weighted rows),
        except that temporal rows without replacement draw exponential keys, where GPU ``log`` can round
        differently in the last bit. With CUDA, blocks are CUDA tensors when torch has CUDA, else
        host tensors. Temporal sampling runs on both (same rules; relabelling by (node, time) through
        a GPU hash table on CUDA).
    uva : bool or None
        ``device="cuda"`` only: read the graph in place from page-locked host memory (UVA) instead of
        a device copy, for graphs larger than the device budget. ``None``: UVA when the graph's
        ``indptr`` is a pinned tensor (a `graphrl.memory` region on the ``pinned`` tier), else a
        device copy. ``True`` with unpinned arrays copies them once into ``pinned`` regions.
    memory : graphrl.memory.MemoryManager or None
        ``device="cuda"`` only: the manager whose tiers hold the sampler's GPU buffers
        (docs/architecture.md#memory-tiers): the graph's copy and the weighted rows' prefix sums on the
        ``device`` tier (``pinned`` with UVA; owner ``"samplers.graph"``), the workspace's scratch on
        ``device`` and its staging buffers on ``pinned`` (``"samplers.workspace"``). ``None``: a private
        manager without budgets. Freed by `close` or when the sampler is garbage-collected.

    Notes
    -----
    Duplicate seeds are *kept*: each occurrence is its own destination row (so output row i belongs to
    ``seeds[i]``); duplicates get identical neighbours, since a row's random stream depends only on
    (seed, call, layer, node id). Sampled sources are deduplicated.

    Threads: each call uses up to `graphrl.threads.team_size` threads (the caller and helper threads
    that claim chunks of work dynamically; see `samplers.kernels.cpu`); the result does not depend on
    it. A sampler holds scratch memory and serves one `sample` call at a time (concurrent calls from
    several threads are serialised by a lock); to sample in parallel, use one sampler per thread. The
    first call in a process pays numba's compilation (cached on disk afterwards). Memory: a CPU sampler
    keeps each edge's source and edge id side by side for its gather (int32, 8 bytes per edge,
    `samplers._csc.edge_pairs`), except on graphs without edge ids or of 2**31 edges or more; pickled
    (spawned loader workers, ``mp.spawn``), those pairs and the weighted prefix sums are shared like the
    graph's tensors: once per host per sampler (`__getstate__`).

    Raises
    ------
    TypeError
        ``graph`` is not a `CSCGraph`; a fanout or ``seed`` is not an int; ``weights`` or
        ``edge_times`` is not numeric.
    ValueError
        ``fanouts`` is empty or holds a value below -1 or above `samplers.MAX_FANOUT` (2**31 - 1);
        ``seed`` outside [0, 2**64); ``weights`` has the wrong length or holds a
        negative, NaN or infinite value, or is ``True`` on a graph without weights; ``edge_times`` has
        the wrong length or holds NaN; an unknown ``device``, or ``cuda:N`` other than the current CUDA
        device.
    GPUUnavailableError
        ``device="cuda"`` where numba.cuda finds no usable GPU (no silent fallback to the CPU); a
        ``RuntimeError`` and a ``ValueError`` (`graphrl.GPUUnavailableError`).

    References
    ----------
    Hamilton, Ying and Leskovec, "Inductive Representation Learning on Large Graphs" (GraphSAGE,
    NeurIPS 2017) for layer-wise neighbour sampling; DGL's message-flow-graph (block) contract for
    the output; Floyd's sampling without replacement, as in pyg-lib's neighbour kernel; Efraimidis and
    Spirakis, "Weighted random sampling with a reservoir" (IPL 2006, A-ES exponential keys), as in
    GraphBolt, for weighted draws with edge times, and for the law that weighted draws without times
    follow (successive weighted sampling, drawn by rejection over prefix sums with an exact fallback);
    TGL (Zhou et al., VLDB 2022) for temporal neighbour sampling.

    Examples
    --------
    >>> sampler = NeighborSampler(graph, fanouts=[15, 10, 5], seed=0)
    >>> blocks = sampler.sample(torch.tensor([0, 7, 42]))
    >>> blocks[-1].dst_nodes            # tensor([ 0,  7, 42])
    """

    def __init__(self, graph: CSCGraph, fanouts: Sequence[int], replace: bool = False, weights=None,
                 seed: int | None = None, *, edge_times=None, device="cpu", uva: bool | None = None,
                 memory: MemoryManager | None = None) -> None:
        if not isinstance(graph, CSCGraph):
            raise TypeError(f"graph must be a CSCGraph, got {type(graph).__name__}")
        check_regions(graph.regions, "graph")
        graph.validate()  # once per graph: kernels trust indptr/indices/edge_ids from here on
        fanouts = check_fanouts("fanouts", fanouts)
        check_seed_and_replace(seed, replace)
        self.graph = graph
        self.fanouts = [int(k) for k in fanouts]
        self.replace = bool(replace)
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self._calls = 0
        self._indptr = graph.indptr.numpy()
        self._indices = graph.indices.numpy()
        self._edge_ids = None if graph.edge_ids is None else graph.edge_ids.numpy()
        self._view_ptrs = self._graph_ptrs()
        self._weights = self._csc_weights(graph, weights)
        self._times = self._csc_times(graph, edge_times)
        self.weighted = self._weights is not None
        """Whether draws follow edge weights."""
        self.temporal = self._times is not None
        """Whether `sample` needs ``seed_times`` (the sampler has edge times)."""
        self.device = check_device(device)
        check_memory(memory)
        self._cuda_graph = None
        self.cuda_memory = None
        """``device="cuda"``: the `samplers.kernels.cuda.memory.CudaMemory` of the sampler's regions."""
        if self.device.type == "cuda":
            from samplers.kernels import cuda as cuda_kernels  # imports numba.cuda: only when asked for

            require_gpu(self.device)
            cuda_kernels.check_device_index(self.device)
            if uva is None:
                uva = bool(graph.indptr.is_pinned()) if graph.indptr.device.type == "cpu" else False
            self.cuda_memory = cuda_kernels.CudaMemory(memory)
            self._cuda_graph = cuda_kernels.CudaGraph.build(graph.indptr, graph.indices, graph.edge_ids,
                                                            self._weights, uva=bool(uva), times=self._times,
                                                            memory=self.cuda_memory)
        self.loop = self._build_loop()
        """The `samplers.layers.LayerLoop` that runs the sampler's mode (`samplers.modes`: temporal with
        edge times, weighted with weights, else uniform) on the graph, one relation."""
        self._eid_to_pos: np.ndarray | None = None
        self._lock = threading.Lock()  # the workspace serves one call at a time
        self.sampled_edges = 0
        """Total number of edges sampled by this sampler so far (for throughput reports)."""
        self._closed = False

    def __getstate__(self) -> dict:
        """The sampler's state for pickling (``mp.spawn``, spawned ``DataLoader`` workers), without what
        a process rebuilds.

        Kept: the graph (its tensors by value; torch's multiprocessing pickler shares them through
        shared memory), fanouts, seed, the call counter and ``sampled_edges``, and the weights and times
        (as tensors, shared the same way), and the derived arrays (the gather's pairs, 8 bytes per edge,
        and the weighted rows' prefix sums, 8 per edge and per node: moved into shared memory at the first
        pickling, so processes attach one copy per host, `samplers._csc.share_loop`; the weights and
        times likewise: `samplers._csc.pickle_loop`). Not kept, rebuilt by `__setstate__`: the lock,
        the numpy views of the graph, the workspace and the inverse edge-id map. A copy therefore
        continues the original's random stream: its next `sample` returns what the
        original's next `sample` would (see docs/architecture.md#pyg-and-dgl-loaders).

        Raises
        ------
        TypeError
            The sampler runs on ``device="cuda"`` (build one in each process).
        """
        if self._cuda_graph is not None:
            raise TypeError("a NeighborSampler on device='cuda' cannot be pickled: build one in each process")
        with self._lock:  # a consistent snapshot while another thread samples
            state = self.__dict__.copy()
            state["_shared"], inputs = pickle_loop(self.loop)  # kept alive with the loop
            self._weights, self._times = (inputs[name].get(PLAIN_RELATION) for name in ("weights", "times"))
        for name in ("_lock", "_indptr", "_indices", "_edge_ids", "_view_ptrs", "loop", "_eid_to_pos",
                     "_weights", "_times"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled sampler; its lock, views, workspace and caches are rebuilt (`__getstate__`).

        Raises
        ------
        ValueError
            The derived arrays do not fit the graph (`samplers._csc.attach_derived`).
        """
        state = dict(state)
        inputs, derived = unpickle_loop(state.pop("_shared"))
        self.__dict__.update(state)
        self._weights, self._times = (inputs[name].get(PLAIN_RELATION) for name in ("weights", "times"))
        self._lock = threading.Lock()
        self._indptr = self._indices = self._edge_ids = self._view_ptrs = None
        self._refresh_views()
        self.loop = self._build_loop(derived.get(PLAIN_RELATION))
        self._eid_to_pos = None

    def _refresh_views(self) -> None:
        """(Re)take the numpy views of the graph's tensors when their memory moved.

        Pickling a CPU tensor with torch's multiprocessing pickler (``mp.spawn`` arguments, a spawned
        worker's dataset) moves its storage into shared memory and frees the old block, which would
        leave views taken before pointing at freed memory; every `sample` therefore checks the views.
        """
        g = self.graph
        ptrs = self._graph_ptrs()
        if ptrs != self._view_ptrs:
            self._view_ptrs = ptrs
            self._indptr = g.indptr.numpy()
            self._indices = g.indices.numpy()
            self._edge_ids = None if g.edge_ids is None else g.edge_ids.numpy()
            if "loop" in self.__dict__:
                arr = self.loop.relations[PLAIN_RELATION]
                arr.indptr, arr.indices, arr.edge_ids = self._indptr, self._indices, self._edge_ids

    def _graph_ptrs(self) -> tuple:
        """The addresses of the graph's indptr, indices and edge ids (None without edge ids)."""
        g = self.graph
        eids = None if g.edge_ids is None else g.edge_ids.data_ptr()
        return g.indptr.data_ptr(), g.indices.data_ptr(), eids

    def _build_loop(self, derived: dict | None = None) -> LayerLoop:
        """The layer loop over the graph as one relation, with the sampler's mode; a CPU loop computes
        the gather's pairs and the weighted rows' prefix sums here, once (8 bytes per edge, and 8 per
        edge and per node), unless ``derived`` (`__getstate__`'s shared tensors) hands them in."""
        mode = UniformMode
        if self.temporal:
            mode = TemporalMode
        elif self.weighted:
            mode = WeightedMode
        g = self.graph
        arrays = RelationArrays(self._indptr, self._indices, self._edge_ids, g.num_nodes,
                                weights=self._weights, times=self._times, cuda=self._cuda_graph,
                                **attach_derived("_shared", derived, self._indices, self._edge_ids,
                                                 g.num_nodes))
        return LayerLoop({PLAIN_RELATION: arrays}, {PLAIN_NODE: self.graph.num_nodes},
                         {PLAIN_RELATION: mode(self.replace)}, self.device.type, typed=False)

    def _csc_weights(self, graph: CSCGraph, weights) -> np.ndarray | None:
        """The sampling weights in CSC order (float32), or None for uniform draws."""
        if weights is None or weights is False:
            return None
        if weights is True:
            if graph.weights is None:
                raise ValueError("weights=True needs a graph with edge weights (build it with weights=...), "
                                 "or pass weights as a tensor of shape [E]")
            return graph.weights.numpy().astype(np.float32, copy=True)  # a copy: never a view of the graph
        return csc_weights("weights", weights, graph.num_edges, graph.csc_edge_ids().numpy())

    def _csc_times(self, graph: CSCGraph, edge_times) -> np.ndarray | None:
        """Edge times in CSC order (int64 or float64), or None."""
        if edge_times is None:
            return None
        return csc_times("edge_times", edge_times, graph.num_edges, graph.csc_edge_ids().numpy())

    def _check_seed_times(self, seed_times, num_seeds: int) -> np.ndarray | None:
        if not self.temporal:
            if seed_times is not None:
                raise ValueError("seed_times given, but the sampler has no edge_times (pass edge_times=... "
                                 "to NeighborSampler for temporal sampling)")
            return None
        if seed_times is None:
            raise ValueError("seed_times is required: the sampler has edge_times (temporal sampling)")
        return check_seed_times("seed_times", seed_times, num_seeds, self._times.dtype)

    @property
    def num_layers(self) -> int:
        """Number of layers (blocks per sample)."""
        return len(self.fanouts)

    def _inverse_edge_ids(self) -> np.ndarray | None:
        """CSC position of every edge id (built once, on first use), or None when ids are positions."""
        if self._edge_ids is None:
            return None
        if self._eid_to_pos is None:
            self._eid_to_pos = inverse_permutation(self._edge_ids)
        return self._eid_to_pos

    def _excluded_positions(self, exclude_eids) -> cpu.Exclusion | None:
        """Validate graph edge ids and return their CSC positions, sorted and distinct (None if none)."""
        pos = excluded_positions("exclude_eids", exclude_eids, self.graph.num_edges, self._inverse_edge_ids)
        return None if pos is None else cpu.Exclusion(self._indptr, pos)

    def sample(self, seeds, exclude_eids=None, seed_times=None) -> Blocks:
        """Sample blocks for ``seeds``, outermost layer first, never drawing the ``exclude_eids`` edges.

        Parameters
        ----------
        seeds : torch.Tensor, int64 (any integer dtype), shape [B]
            Seed nodes, in [0, num_nodes). May be empty; duplicates are kept (see Notes of the class).
        exclude_eids : torch.Tensor or None, int64 (any integer dtype), shape [X]
            Graph edge ids that no layer may draw (for link prediction: the batch's target edges and
            their reverses). They are removed from the candidates *before* drawing: a node with d
            in-edges of which x are excluded contributes min(d - x, k) edges without replacement, and k
            with replacement when d - x > 0. (DGL 2.1's ``sample_neighbors(exclude_edges=...)`` and its
            ``exclude=`` option draw first and drop excluded edges afterwards, so a node can get fewer;
            with fanout -1 both give the same edges.)
            Duplicates are allowed. The first call with exclusions builds the inverse of the graph's
            edge-id permutation (4 bytes per edge below 2^31 edges), kept for later calls.
        seed_times : torch.Tensor or None, integer or float, shape [B]
            Temporal sampling (required iff the sampler has ``edge_times``): the time of each seed. A
            seed's row draws only edges of time <= its time, and every row of an inner layer inherits
            the time of the seed it serves: a sampled source takes the time of the row that drew it.
            Sources are deduplicated by (node, time), not by node, so a node reached from seeds with
            different times is several source nodes (and several rows of the next layer), each seeing
            only its own past; ``Block.src_times`` holds the times. Float times against integer edge
            times are floored.

        Returns
        -------
        Blocks
            A list of ``len(fanouts)`` blocks. ``blocks[-1].dst_nodes`` equals ``seeds``;
            ``blocks[i].dst_nodes`` equals ``blocks[i + 1].src_nodes``. ``blocks.to_pyg()`` converts
            them to PyG's ``edge_index`` form.

        Raises
        ------
        TypeError
            ``seeds`` or ``exclude_eids`` is not an integer tensor (a float or bool tensor, say).
        ValueError
            ``seeds`` is not 1-D or holds ids outside [0, num_nodes); ``exclude_eids`` is not 1-D or holds
            ids outside [0, num_edges); ``seed_times`` is missing on a temporal sampler, given on another,
            of the wrong length, or holds NaN; the graph's memory-manager regions were freed (its
            manager was closed, or ``graph.free()`` ran); the sampler was closed (or, on CUDA, the
            manager of its regions).
        MemoryBudgetError
            On CUDA, the workspace's scratch or staging buffers do not fit their tier's budget.
        """
        check_open(self._closed, "this NeighborSampler")
        check_regions(self.graph.regions, "this sampler's graph")
        if self.cuda_memory is not None:
            self.cuda_memory.check_open("this NeighborSampler's GPU memory")
        if self._cuda_graph is not None:
            return self._sample_cuda(seeds, exclude_eids, seed_times)
        dst = check_seeds(seeds, self.graph.num_nodes)
        times = None if seed_times is None and not self.temporal else \
            self._check_seed_times(seed_times, dst.shape[0])
        threads = team_size()
        with self._lock:
            self._refresh_views()
            excluded = None if exclude_eids is None else self._excluded_positions(exclude_eids)
            call = self._calls
            self._calls += 1
            return self._run(dst, excluded, call, threads, times)

    def close(self) -> None:
        """Free the sampler's memory-manager regions (``device="cuda"``: its graph copy, prefix sums and
        workspace buffers) and close a private manager; `sample` then raises ValueError. Idempotent; a
        CPU sampler holds no regions (this only marks it closed)."""
        self._closed = True
        if self.cuda_memory is not None:
            self.cuda_memory.close()

    def _sample_cuda(self, seeds, exclude_eids, seed_times) -> Blocks:
        if isinstance(seeds, torch.Tensor) and seeds.device.type == "cuda":
            check_id_dtype("seeds", seeds.dtype)
            if seeds.dim() != 1:
                raise ValueError(f"seeds must be 1-D, got shape {tuple(seeds.shape)}")
            dst = seeds.to(torch.int64).contiguous()
            if dst.numel():  # one read-back of (min, max)
                lo, hi = self.loop.cuda_workspace().read(torch.stack(torch.aminmax(dst)))
                if lo < 0 or hi >= self.graph.num_nodes:
                    check_seeds(seeds.cpu(), self.graph.num_nodes)  # raises, quoting the ids in their dtype
        else:
            dst = check_seeds(seeds, self.graph.num_nodes)
        times = self._check_seed_times(seed_times, blocks_dst_count(dst))
        with self._lock:  # kernels launch on torch's current stream (docs/architecture.md#the-stream-rule)
            self._refresh_views()
            excluded = self._excluded_positions(exclude_eids)
            excl = None if excluded is None else excluded.positions  # sorted CSC positions
            ws = self.loop.cuda_workspace()  # host arrays go through its page-locked staging buffers
            if times is not None:  # -0.0 -> 0.0 once (inner layers inherit these): equal times, equal keys
                times = ws.device_ids(times + times.dtype.type(0), "seed_times")
            if excl is not None:
                excl = ws.device_ids(excl, "excluded")
            dst = ws.device_ids(dst)
            call = self._calls
            self._calls += 1
            return self._run(dst, excl, call, 1, times)

    def _run(self, dst, excluded, call: int, threads: int, times=None) -> Blocks:
        """Every layer through the loop (host arrays on the CPU, device arrays on CUDA)."""
        before = self.loop.sampled_edges
        layers = self.loop.run({PLAIN_NODE: dst}, {PLAIN_RELATION: self.fanouts}, self.seed, call,
                               excluded=None if excluded is None else {PLAIN_RELATION: excluded},
                               seed_times=None if times is None else {PLAIN_NODE: times}, threads=threads)
        self.sampled_edges += self.loop.sampled_edges - before
        return plain_blocks(layers)

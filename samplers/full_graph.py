"""Full-graph propagation with the normalised adjacency, partitioned under a memory budget.

After HongTu (SIGMOD 2024): vertex data (features, activations, gradients) lives in host memory; the
normalised adjacency is split into destination partitions, and one propagation streams the partitions
through the device one at a time, so the device memory a propagation needs is bounded by one partition
(``partition_bytes``, and the memory manager's device budget), not by the graph. Gradients are exact:
the backward pass is the transposed propagation, partitioned the same way.

The *host* path (the default on the CPU) reads source rows in place from the host vertex data
(zero-copy); a partition's working set on the device tier holds its rows of the matrix and its output
rows, so the number of partitions follows from ``partition_bytes`` and the feature width: the cut and
the run are `samplers.full_graph_host`; the normalised adjacency is built by
`samplers.full_graph_adjacency`.

The *staged* path (``device="cuda"``, or ``dedup=True/False`` on the CPU) moves data as HongTu does:
each partition's distinct source rows are gathered into a device buffer, multiply-read rows once per
propagation into a device cache (``dedup``), outputs copied back; plans in `samplers.full_graph_plan`,
execution and byte counts in `samplers.full_graph_stream`, reported by `FullGraph.traffic`. Without
CUDA the same code runs on the host-memory device tier and counts every logical transfer.
See docs/architecture.md#full-graph-propagation.
"""

from __future__ import annotations

import logging
import numbers
import threading
import weakref

import numpy as np
import torch

from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager, Region, Tier, check_memory, free_quietly, parse_size
from graphrl.memory.transfers import Transfers
from graphrl.threads import team_size
from samplers._checks import check_bool, check_open, check_share
from samplers.full_graph_adjacency import Operator, build_operators
from samplers.full_graph_host import HostExecutor
from samplers.full_graph_plan import (
    DEFAULT_CACHE_SHARE,
    PartitionPlan,
    PlanCache,
    locality_order,
    plan_propagation,
)
from samplers.full_graph_stream import CallTraffic, StagedExecutor

__all__ = ["FullGraph", "NORMALIZATIONS"]

logger = logging.getLogger(__name__)

NORMALIZATIONS = ("sym", "left", "right", "none")
OWNER = "samplers.full_graph"  # device-tier working set
OWNER_ADJ = "samplers.full_graph.adjacency"  # host-tier normalised adjacency (and its transpose)
OWNER_VERTEX = "samplers.full_graph.vertex"  # outputs of propagate (and gradients): pinned when staged
_MAX_PLANS = 8  # plans kept (each holds a reordered copy of the matrix's columns and weights)


class _Propagate(torch.autograd.Function):
    """``P @ h`` (or ``P^T @ h``), partitioned; the backward pass is the other one, also partitioned."""

    @staticmethod
    def forward(ctx, h, fg, transpose):
        ctx.fg = fg
        ctx.transpose = transpose
        return fg.multiply(h, transpose)

    @staticmethod
    def backward(ctx, grad_out):
        return _Propagate.apply(grad_out.contiguous(), ctx.fg, not ctx.transpose), None, None


class FullGraph:
    """The normalised adjacency of a graph, propagated partition by partition under a memory budget.

    ``propagate(h)`` computes ``P @ h`` with, for ``normalization="sym"`` and ``add_self_loops=True``,
    ``P = D_in^-1/2 (A + I) D_out^-1/2``, where ``A[v, u]`` is the number (or total weight) of edges
    ``u -> v`` and the degrees count the self-loops: ``D_in = diag((A + I) 1)``,
    ``D_out = diag(1^T (A + I))``. For an undirected graph (both directions stored) ``D_in = D_out = D``
    and ``P = D^-1/2 (A + I) D^-1/2``, Kipf and Welling's renormalised adjacency; for a directed graph
    this is DGL's ``GraphConv(norm="both")`` (PyG's ``gcn_norm`` uses in-degrees on both sides).
    Self-loops are added to every node, also where the graph has one already (``A + I``, as
    ``dgl.add_self_loop``; PyG's ``add_remaining_self_loops`` would replace them instead).

    Parameters
    ----------
    graph : CSCGraph
        N nodes; its ``weights`` (if any) are the values of A.
    normalization : {"sym", "left", "right", "none"}
        ``"sym"``: ``D_in^-1/2 Â D_out^-1/2``; ``"left"``: ``D_in^-1 Â`` (rows sum to 1: the mean of the
        in-neighbours, DGL's ``norm="right"``); ``"right"``: ``Â D_out^-1`` (DGL's ``norm="left"``);
        ``"none"``: ``Â``. Here ``Â = A + I`` or ``A``. A zero degree gives a zero scale.
    add_self_loops : bool
        Use ``A + I`` (default) or ``A``.
    memory : MemoryManager or None
        Where every buffer comes from: the partitions' working set from the ``device`` tier, the
        normalised adjacency from the ``pinned`` tier with CUDA, else ``host``; the outputs of
        `propagate`, the staging buffers and the partitions' local CSRs of the staged path from the
        ``pinned`` tier (falling back to ``host``). None creates a private manager (closed by `close`).
    partition_bytes : int, str or None
        Most bytes of one partition's working set (``"256MiB"``; see `graphrl.memory.parse_size`): on
        the host path the whole working set, on the staged path one of its two slots (local CSR,
        streamed sources, output rows), the dedup cache taking what the slots leave of the device
        tier. The working set of every call is also kept within the device tier's free bytes. None:
        limited by the device tier only (on the staged path, a slot takes at most half of it).
    device : str, torch.device or None
        Where partitions are computed: None or ``"cpu"`` (host kernels), or ``"cuda"`` (the staged path
        on the memory manager's device tier; without CUDA it runs on host memory, with a warning, and
        counts the same transfers).
    dedup : bool or None
        The staged path with (True) or without (False, every partition moves all it reads) the device
        cache of multiply-read source rows. None: True for CUDA, else the zero-copy host path.
    cache_share : float
        With ``dedup``, the largest share of the device budget that planning sets aside for the most-read
        source rows before cutting partitions, in [0, 1) (0: only the plan without a set-aside).
    reorder : {"rcm", "none"}
        Staged path: order destination rows by reverse Cuthill-McKee before cutting partitions.
    partitions : int or None
        Staged path: cut this many partitions (at most N, one row each), balanced by edges and bytes (a
        `MemoryBudgetError` if they do not fit the device budget); None: as few as the budget allows.

    Attributes
    ----------
    num_nodes, num_entries : int
        N and the non-zeros of P (edges plus N self-loops).
    symmetric : bool
        P equals its transpose (entries and order), so the backward pass reuses P's storage.
    last_partitions : int
        Partitions of the last propagation (forward or backward).
    device : torch.device
    dedup : bool or None
    staged : bool
        The staged (HongTu) path runs the propagations (``dedup`` is not None).

    Raises
    ------
    TypeError
        ``graph`` is not a `CSCGraph`, ``memory`` is not a `MemoryManager`, or ``dedup`` is not a
        bool or None.
    ValueError
        An unknown ``normalization``, or a bad ``partition_bytes``.
    ValueError
        A ``device`` that is neither CPU nor CUDA, a ``memory`` whose device tier does not match
        ``device`` (a GPU tier for the host path, host memory for CUDA while CUDA is available), a
        bad ``cache_share``, ``reorder`` or ``partitions`` (or ``partitions`` on the host path).
    MemoryBudgetError
        The host tier has no room for the normalised adjacency.

    References
    ----------
    Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024 (host-resident
    vertex data, partitions streamed through the device); Kipf and Welling, "Semi-Supervised
    Classification with Graph Convolutional Networks", ICLR 2017 (renormalisation trick).

    Examples
    --------
    >>> mm = MemoryManager(budgets={"device": "64MiB"}, device="cpu")        # doctest: +SKIP
    >>> fg = FullGraph(graph, memory=mm, partition_bytes="16MiB")           # doctest: +SKIP
    >>> out = fg.propagate(h)            # P @ h, differentiable in h        # doctest: +SKIP
    >>> mm.stats()["device"]["samplers.full_graph"]["peak"] <= 16 * 2**20  # doctest: +SKIP
    True
    >>> mm = MemoryManager(budgets={"device": "2GiB"})                        # doctest: +SKIP
    >>> fg = FullGraph(graph, memory=mm, device="cuda", dedup=True)          # doctest: +SKIP
    >>> out = fg.propagate(h)            # h on the host; partitions stream   # doctest: +SKIP
    >>> fg.traffic()["host_to_device_bytes"]                                 # doctest: +SKIP
    """

    def __init__(self, graph: CSCGraph, normalization: str = "sym", add_self_loops: bool = True,
                 memory: MemoryManager | None = None, partition_bytes: int | str | None = "256MiB",
                 device: str | torch.device | None = None, dedup: bool | None = None,
                 cache_share: float = DEFAULT_CACHE_SHARE, reorder: str = "rcm",
                 partitions: int | None = None) -> None:
        if not isinstance(graph, CSCGraph):
            raise TypeError(f"graph must be a CSCGraph, got {type(graph).__name__}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {', '.join(map(repr, NORMALIZATIONS))}, "
                             f"got {normalization!r}")
        check_memory(memory)
        try:
            self.device = torch.device("cpu" if device is None else device)
        except (RuntimeError, TypeError) as err:  # torch's own message does not name the argument
            raise ValueError(f"device must be 'cpu' or 'cuda', got {str(device)!r}") from err
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {str(device)!r}")
        cache_share = check_share("cache_share", cache_share)
        add_self_loops = check_bool("add_self_loops", add_self_loops)
        if reorder not in ("rcm", "none"):
            raise ValueError(f"reorder must be 'rcm' or 'none', got {reorder!r}")
        if dedup is not None and not isinstance(dedup, bool):
            raise TypeError(f"dedup must be True, False or None, got {type(dedup).__name__}")
        self.dedup = True if dedup is None and self.device.type == "cuda" else dedup
        self.staged = self.dedup is not None
        self.cache_share, self.reorder = float(cache_share), reorder
        if partitions is not None and (isinstance(partitions, bool)
                                       or not isinstance(partitions, numbers.Integral) or partitions < 1):
            raise ValueError(f"partitions must be a positive int or None, got {partitions!r}")
        if partitions is not None and not self.staged:
            raise ValueError("partitions applies to the staged path: pass dedup=True or False (or "
                             "device='cuda'); the host path's partitions follow partition_bytes")
        self.num_parts = None if partitions is None else int(partitions)
        self.partition_bytes = partition_bytes
        self._own_memory = memory is None
        on_gpu = self.device.type == "cuda" and torch.cuda.is_available()
        if memory is None:  # a private manager, its device tier where the partitions run
            memory = MemoryManager(device=self.device if on_gpu else "cpu")
        self.memory = memory
        probe = self.memory.allocate(0, torch.uint8, Tier.DEVICE, owner=OWNER)
        on = probe.device
        probe.free()
        self._check_tier(str(on))
        self.normalization, self.add_self_loops = normalization, bool(add_self_loops)
        self.num_nodes = graph.num_nodes
        self._host_tier = Tier.PINNED if torch.cuda.is_available() else Tier.HOST
        self._lock = threading.Lock()
        self._host = HostExecutor(self.memory, OWNER)  # the host path's working set
        self.last_partitions = 0
        self._closed = False
        self._order: np.ndarray | None = None
        self._plans: dict[tuple, PartitionPlan] = {}
        self._plan_caches: dict[bool, PlanCache] = {}  # per direction: work its plans share (nnz x 12 B)
        self._calls: list[CallTraffic] = []
        self._intermediate: list[str] = []
        self._executor = StagedExecutor(self.memory, OWNER) if self.staged else None
        self._registrations0 = self._executor.transfers.registrations() if self._executor is not None else 0
        self._forward, self._backward = build_operators(graph, normalization, self.add_self_loops,
                                                        self._alloc, OWNER_ADJ)
        self.symmetric = self._backward is self._forward
        self.num_entries = self._forward.nnz
        self._finalizer = weakref.finalize(self, _free_all, self._forward, self._backward, self._host,
                                           self._executor, self.memory if self._own_memory else None)

    def _check_tier(self, on: str) -> None:
        if not self.staged and not on.startswith("cpu"):
            raise ValueError(f"memory: the device tier is {on}, but the host path (device='cpu', dedup=None) "
                             "computes in host memory; pass device='cuda' for the staged GPU path, or "
                             "MemoryManager(device='cpu')")
        if self.staged and self.device.type == "cpu" and not on.startswith("cpu"):
            raise ValueError(f"memory: the device tier is {on} but device='cpu'; pass device='cuda'")
        if self.device.type == "cuda" and on.startswith("cpu"):
            if torch.cuda.is_available():
                raise ValueError("memory: the device tier is host memory while CUDA is available; pass "
                                 "MemoryManager(device='cuda') for device='cuda'")
            logger.warning("FullGraph(device='cuda') without CUDA: partitions stream through the device tier "
                           "in host memory; every host-device transfer is still counted in traffic()")

    # ------------------------------------------------------------------ construction
    def _alloc(self, shape, dtype, owner: str) -> Region:
        return self.memory.allocate(shape, dtype, self._host_tier, owner=owner,
                                    fallback=(Tier.HOST,) if self._host_tier is Tier.PINNED else ())

    # ------------------------------------------------------------------ planning
    @property
    def partition_bytes(self) -> int | None:
        """Most bytes of one partition's working set (None: the device tier's free bytes); settable.

        Set to an int (bytes), a size string (``"256MiB"``, `graphrl.memory.parse_size`) or None; a
        value that does not parse is a `ValueError` or `TypeError`, one <= 0 a `ValueError`, each
        naming ``partition_bytes``.
        """
        return self._partition_bytes

    @partition_bytes.setter
    def partition_bytes(self, value: int | str | None) -> None:
        try:
            size = None if value is None else parse_size(value)
        except (ValueError, TypeError) as err:  # parse_size's message does not name the argument
            raise type(err)(f"partition_bytes: {err}") from err
        if size is not None and size <= 0:
            raise ValueError(f"partition_bytes must be > 0, got {value!r}")
        self._partition_bytes = size

    def _device_room(self) -> int:
        """The device tier's free bytes, counting the working set this FullGraph holds as free."""
        free = self.memory.free_bytes(Tier.DEVICE) + self._host.working_bytes
        if self._executor is not None:
            free += self._executor.working_bytes
        return free

    def _cap(self) -> int:
        """Bytes a working set may take now: partition_bytes and the device tier's room (ours included)."""
        free = self._device_room()
        return free if self.partition_bytes is None else min(self.partition_bytes, free)

    def _bounds(self, op: Operator, width: int, itemsize: int, cap: int) -> np.ndarray:
        which = "destination" if op is self._forward else "source"
        return self._host.bounds(op, width, itemsize, cap, which, self.partition_bytes)

    def partitions(self, width: int, dtype: torch.dtype = torch.float32,
                   transpose: bool = False) -> np.ndarray:
        """Row boundaries of the partitions a propagation of ``width`` features would use now.

        Parameters
        ----------
        width : int
            Feature width d (columns of ``h``).
        dtype : torch.dtype
            float32 or float64 (the itemsize counts).
        transpose : bool
            The backward (transposed) propagation's partitions, over source rows.

        Returns
        -------
        numpy.ndarray, int64, shape [P + 1]
            ``0 = b[0] < b[1] < ... < b[P] = N``; partition i covers rows ``b[i] .. b[i+1]-1`` (on the
            staged path: rows ``order[b[i]:b[i+1]]``, see `order`; a hub row split over several
            partitions is counted in each of them, so there ``b[P]`` is N plus the extra pieces).

        Raises
        ------
        MemoryBudgetError
            One row alone needs more than the partition budget (the message says how much would do).
        """
        op = self._backward if transpose else self._forward
        if self.staged:
            plan = self.plan(width, dtype, transpose)
            return np.cumsum([0] + [p.rows.shape[0] for p in plan.parts]).astype(np.int64)
        return self._bounds(op, int(width), torch.empty(0, dtype=dtype).element_size(), self._cap())

    def num_partitions(self, width: int, dtype: torch.dtype = torch.float32, transpose: bool = False) -> int:
        """Number of partitions of a propagation of ``width`` features (see `partitions`)."""
        return int(self.partitions(width, dtype, transpose).shape[0] - 1)

    @property
    def order(self) -> np.ndarray:
        """Staged path: destination rows in the order partitions cut them (int64 [N]; see ``reorder``)."""
        if self._order is None:
            n = self.num_nodes
            bwd = self._backward  # P^T in CSR (csr_transpose's row order), so the search skips building it
            self._order = (locality_order(self._forward.indptr, self._forward.indices, n,
                                          transpose=(bwd.indptr, bwd.indices))
                           if self.reorder == "rcm" else np.arange(n, dtype=np.int64))
        return self._order

    def plan(self, width: int, dtype: torch.dtype = torch.float32, transpose: bool = False) -> PartitionPlan:
        """The staged path's plan (partitions, local CSRs, dedup cache) for ``width`` features now.

        Plans are kept per (direction, width, itemsize, device room, slot), one direction when P is
        symmetric: a training loop plans each layer's width once. Work plans of one direction share
        (its entries in plan order, read counts) is kept in a `samplers.full_graph_plan.PlanCache`
        (about 12 bytes per entry) until `close`.

        Parameters
        ----------
        width : int
            Feature width d (columns of the vertex data).
        dtype : torch.dtype
            The vertex data's dtype (its itemsize counts).
        transpose : bool
            The backward propagation's plan (``P^T``; P's when P is symmetric).

        Returns
        -------
        samplers.full_graph_plan.PartitionPlan

        Raises
        ------
        ValueError
            Not the staged path (``dedup`` None on the CPU).
        MemoryBudgetError
            Not even one entry of a row fits half the device budget, or ``partitions`` ranges do not fit.
        """
        if not self.staged:
            raise ValueError("plan() needs the staged path: FullGraph(..., dedup=True or False) or "
                             "device='cuda'")
        itemsize = torch.empty(0, dtype=dtype).element_size()
        budget = self._device_room()
        slot = self.partition_bytes  # one slot; the cache takes what two leave of the device tier
        if slot is not None and slot >= budget // 2:
            slot = None
        transpose = bool(transpose) and not self.symmetric  # P^T is P: the same plan serves both
        key = (transpose, int(width), itemsize, budget, slot)
        plan = self._plans.get(key)
        if plan is None:
            op = self._backward if transpose else self._forward
            cache = self._plan_caches.get(transpose)
            if cache is None:
                cache = self._plan_caches[transpose] = PlanCache()
            plan = plan_propagation(op.indptr, op.indices, op.weights, self.order, int(width), itemsize,
                                    budget, bool(self.dedup), self.cache_share, OWNER, self.num_parts,
                                    slot_bytes=slot, cache=cache)
            if len(self._plans) >= _MAX_PLANS:  # the oldest first (a budget that moved, say)
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
        return plan

    def traffic(self, reset: bool = False) -> dict:
        """Host-device bytes the staged propagations moved since the last reset.

        Parameters
        ----------
        reset : bool
            Start counting afresh after this report (calls, transfer counts and registrations).

        Returns
        -------
        dict
            Totals ``host_to_device_bytes``, ``vertex_host_to_device_bytes``,
            ``structure_host_to_device_bytes``, ``device_to_host_bytes``, ``dedup_hit_bytes`` (vertex
            bytes read from the device cache, every read: the saving over ``dedup=False`` at the same
            partitions is this minus the cache's load, ``cache_rows`` x d x itemsize per call),
            ``calls``, ``partitions`` (the most of one call), ``max_device_bytes`` (largest working
            set); ``dedup``, ``device``; ``per_call``, a list of `samplers.full_graph_stream.CallTraffic`
            dicts (direction, width, partitions, bytes, cache rows, pageable transfers, host waits);
            ``intermediate``, the per-layer keep/recompute choices last noted (`note_intermediates`).
            The GPU rules, counted over every copy of `transfers` (the propagations', and
            `graphrl.nn.host_linear`'s when given it): ``registrations`` (host memory page-locked or
            device memory taken by the memory manager's pools since the last reset; none in a steady
            state), ``pageable_transfers`` (copies whose host side was not pinned; none),
            ``pinned_transfers`` and ``host_waits`` (times the host blocked on the device; at most one
            per partition). The zero-copy host path moves nothing: zeros and ``staged`` False.
        """
        transfers = self.transfers
        with self._lock:  # propagations append under it: a reset loses none
            calls = [c.as_dict() for c in self._calls]
            counts = transfers.counts.as_dict() if transfers is not None else {}
            registrations = transfers.registrations() - self._registrations0 if transfers is not None else 0
            if reset:
                self._calls = []
                if transfers is not None:
                    transfers.reset()
                    self._registrations0 += registrations
        keys = ("host_to_device_bytes", "vertex_host_to_device_bytes", "structure_host_to_device_bytes",
                "device_to_host_bytes", "dedup_hit_bytes")
        out = {k: sum(c[k] for c in calls) for k in keys}
        out.update(registrations=registrations, pageable_transfers=counts.get("pageable_transfers", 0),
                   pinned_transfers=counts.get("pinned_transfers", 0), host_waits=counts.get("host_waits", 0))
        out["partitions"] = max((c["partitions"] for c in calls), default=0)
        out.update(calls=len(calls), max_device_bytes=max((c["device_bytes"] for c in calls), default=0),
                   staged=self.staged, dedup=self.dedup, device=str(self.device), per_call=calls,
                   intermediate=list(self._intermediate))
        return out

    @property
    def vertex_tier(self) -> Tier:
        """The memory tier of the vertex data `propagate` returns: pinned on the staged path (also
        without CUDA, where the pinned tier is plain host memory, so the same transfers are counted);
        on the host path pinned with CUDA, host without. A full pinned tier falls back to host."""
        return Tier.PINNED if self.staged else self._host_tier

    @property
    def transfers(self) -> Transfers | None:
        """The staged path's `graphrl.memory.transfers.Transfers` (None on the host path): every
        host-device copy of the propagations, and of `graphrl.nn.host_linear` given it, is counted there."""
        return self._executor.transfers if self._executor is not None else None

    def note_intermediates(self, choices: list[str]) -> None:
        """Record a model's per-layer choice (``"keep"`` on the host or ``"recompute"``) for `traffic`."""
        self._intermediate = list(choices)

    # ------------------------------------------------------------------ propagation
    def propagate(self, h: torch.Tensor) -> torch.Tensor:
        """``P @ h``, partition by partition; differentiable in ``h`` (the backward is ``P^T @ grad``).

        Parameters
        ----------
        h : torch.Tensor, float32 or float64, shape [N, d], on the CPU (host vertex data)

        Returns
        -------
        torch.Tensor, dtype of ``h``, shape [N, d]
            A view of a memory-manager region (owner ``samplers.full_graph.vertex``), freed when the
            tensor is garbage collected.

        Raises
        ------
        TypeError
            ``h`` is not a float32/float64 tensor.
        ValueError
            ``h`` is not [N, d] on the CPU, or this FullGraph (or its memory manager) is closed.
        MemoryBudgetError
            One partition cannot fit the partition budget, or the host tier has no room for the output.
        """
        self._check_input(h)
        return _Propagate.apply(h, self, False)

    __call__ = propagate

    def _check_open(self) -> None:
        check_open(self._closed, "this FullGraph")
        check_open(self.memory.closed, "the MemoryManager of this FullGraph")

    def _check_input(self, h: torch.Tensor) -> None:
        self._check_open()
        if not isinstance(h, torch.Tensor) or h.dtype not in (torch.float32, torch.float64):
            what = h.dtype if isinstance(h, torch.Tensor) else type(h).__name__
            raise TypeError(f"h must be a float32 or float64 tensor, got {what}")
        if h.dim() != 2 or h.shape[0] != self.num_nodes:
            raise ValueError(f"h must have shape [num_nodes={self.num_nodes}, d], got {tuple(h.shape)}")
        if h.device.type != "cpu":
            raise ValueError(f"h must be host (CPU) vertex data, got a tensor on {h.device}")

    def multiply(self, h: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        """``P @ h`` (or ``P^T @ h``), partition by partition, outside autograd (what `propagate` runs).

        Parameters
        ----------
        h : torch.Tensor, float32 or float64, shape [N, d], on the CPU; trusted (`propagate` checks it)
        transpose : bool
            Multiply by ``P^T`` (the backward pass of `propagate`).

        Returns
        -------
        torch.Tensor, dtype of ``h``, shape [N, d]
            As `propagate`.

        Raises
        ------
        ValueError
            This FullGraph (or its memory manager) is closed.
        MemoryBudgetError
            As `propagate`.
        """
        op = self._backward if transpose else self._forward
        h = h.detach()
        if not h.is_contiguous():
            h = h.contiguous()
        if self.staged:
            return self._multiply_staged(h, transpose)
        n, d = h.shape
        with self._lock:
            self._check_open()
            cap = self._cap()
            bounds = self._bounds(op, d, h.element_size(), cap) if n else np.zeros(1, np.int64)
            region = self._alloc((n, d), h.dtype, OWNER_VERTEX)
            out = region.tensor()
            weakref.finalize(out, free_quietly, region)
            if n == 0:
                return out
            self._host.run(op, bounds, h, out, cap, team_size())
            self.last_partitions = bounds.shape[0] - 1
        return out

    def _multiply_staged(self, h: torch.Tensor, transpose: bool) -> torch.Tensor:
        n, d = h.shape
        with self._lock:
            self._check_open()
            # pinned, from the manager's pool (no registration once an epoch has run): host_linear and
            # the next layer's copies read it without a pageable transfer
            region = self.memory.allocate((n, d), h.dtype, self.vertex_tier, owner=OWNER_VERTEX,
                                          fallback=(Tier.HOST,))
            out = region.tensor()
            weakref.finalize(out, free_quietly, region)
            if n == 0 or d == 0:
                return out
            plan = self.plan(d, h.dtype, transpose)
            traffic = self._executor.multiply(plan, h, out, "backward" if transpose else "forward")
            self._calls.append(traffic)
            self.last_partitions = plan.num_partitions
        return out

    # ------------------------------------------------------------------ lifetime
    def release(self) -> None:
        """Free the device-tier working set now (the next propagation allocates it again)."""
        with self._lock:
            self._host.release()
            if self._executor is not None:
                self._executor.release()

    def close(self) -> None:
        """Free the working set and the normalised adjacency (and a private manager); idempotent.

        Tensors returned by `propagate` stay valid.
        """
        with self._lock:
            self._closed = True
            self._plans.clear()  # their pinned local CSRs go with them
            self._plan_caches.clear()
        self._finalizer()

    def __enter__(self) -> FullGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"FullGraph(num_nodes={self.num_nodes}, num_entries={self.num_entries}, "
                f"normalization={self.normalization!r}, add_self_loops={self.add_self_loops}, "
                f"partition_bytes={self.partition_bytes}, symmetric={self.symmetric})")


def _free_all(fwd: Operator, bwd: Operator, host: HostExecutor, executor: StagedExecutor | None,
              own: MemoryManager | None) -> None:
    """The finalizer of a `FullGraph`: free its working sets and adjacency (and close a private manager)."""
    host.release()
    if executor is not None and not executor.memory.closed:
        executor.release()
    for op in (fwd, bwd):
        for r in op.regions:
            free_quietly(r)
    if own is not None:
        own.close()

"""Node features for minibatches: a row table in a memory-manager region, gathered by node id.

`FeatureStore` holds the table, gathers rows into reusable staging buffers (`samplers.staging`) with
the kernels of `samplers.kernels.gather`, and reads the hottest rows from a `samplers.feature_cache`
cache when asked (docs/architecture.md#memory-tiers).

Placement and huge pages
------------------------
The store serves one device, ``"cpu"`` unless asked for ``"cuda"``, on every machine. Its table,
cache and staging tiers follow that device and where the manager's device tier lives, never whether
the machine has CUDA (`samplers.feature_table`): a GPU gather uses the device tier (table, then
pinned); a CPU gather uses the device tier only where it is host memory (no CUDA, or
``MemoryManager(device="cpu")``), else host then pinned memory for the table and host memory for the
cache. A CPU gather puts a host table of 32 MiB or more on transparent huge pages. A GPU gather reads
the rows in place, from GPU memory or from pinned host memory through UVA, and launches on torch's
current stream (docs/architecture.md#the-stream-rule).

Same rows everywhere: a CPU store gives the same rows, hits and budget errors with and without CUDA
for the same manager settings. What differs with a default ``MemoryManager()``, whose device tier is
GPU memory with CUDA and host memory without: a CPU store's table and cache land on "host" instead
of "device" and count against those budgets, and the "pinned" tier is page-locked memory.

Staging reuse
-------------
``gather(ids)`` without ``out`` returns a view of one of the store's ``staging_slots`` staging
buffers, handed out round-robin. After ``staging_slots`` further calls of ``gather`` without ``out`` a
result's buffer is given back when unused: in host memory it is reused only once no tensor views it
(a result the caller keeps stays right; a later gather gets a buffer of its own meanwhile,
`samplers.staging.RowStaging`); in device memory (a GPU gather) it may be overwritten then, so
``.clone()`` a result kept longer. `FeatureStore.staging` gives a loader its own buffers (see
`samplers.loader`).

References
----------
Min et al., PyTorch-Direct (PVLDB 14(11), 2021): GPU gathers from pinned host memory through UVA.
Yang et al., GNNLab (EuroSys 2022) and Lin et al., PaGraph (SoCC 2020): caching hot rows.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any

import numba as nb
import numpy as np
import torch

from graphrl.errors import GPUUnavailableError
from graphrl.graph import CSCGraph
from graphrl.memory import MemoryManager, Region, Tier, check_memory
from samplers._checks import (
    MAX_BATCH,
    MAX_FANOUT,
    check_device,
    check_int,
    check_open,
    check_seed,
    check_seeds,
)
from samplers.feature_cache import POLICIES, RowCache, hot_nodes, presample_counts
from samplers.feature_table import (
    advise_huge_table,
    cache_tier_for,
    device_tier_is_host,
    place_table,
    staging_tiers,
)
from samplers.kernels.gather import gather_rows, gather_rows_cuda, word_view
from samplers.staging import RowStaging, StagingLease

__all__ = ["FeatureStore", "RowStaging", "StagingLease", "gather_rows", "gather_rows_cuda"]

logger = logging.getLogger(__name__)

def _as_table(x: Any) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        if x.dtype.byteorder == ">":
            raise TypeError(f"x must be in native byte order, got dtype {x.dtype}")
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor or numpy array [num_rows, ...], got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError(f"x must have a row dimension (shape [num_rows, ...]), got shape {tuple(x.shape)}")
    if x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"x must be a real numeric tensor, got dtype {x.dtype}")
    return x.detach()


class FeatureStore:
    """Rows of node features in a memory-manager region, gathered by node id into staging buffers.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray, numeric, shape [N, *row]
        Row v holds node v's features (float32 [N, D] typically).
    memory : MemoryManager or None
        Where the table, the cache and the staging buffers live. The table is copied into a region
        (owner ``f"{owner}.table"``) on the first tier that fits of those the gather reads (see the
        module docstring). ``None``: the table is ``x`` itself (no copy; made contiguous if needed) and
        the cache and staging come from a private ``MemoryManager(device=device)``.
    cache_rows : int
        Rows to cache (clipped to N) on the device tier, or in host memory for a CPU gather over a GPU
        device tier; 0 for no cache. Ignored (logged) when the table itself is on the device tier.
        The cache holds copies: after the table changes in place
        (``x`` itself with ``memory=None``, or `table`), call `refresh_cache` before the next gather,
        or the cached rows read back their old values.
    cache_policy : {"degree", "out_degree", "presample"}
        How hot rows are chosen (see `samplers.feature_cache`); ties go to the smaller node id.
    graph : CSCGraph or None
        Required with a cache: the graph the ids are nodes of (N nodes).
    device : str or torch.device or None
        Where `gather` writes rows: ``"cpu"`` (the numba CPU gather into host or pinned staging) or
        ``"cuda"`` (the numba.cuda gather into device staging). Default ``"cpu"`` on every machine,
        as for `NeighborSampler` and `FullGraph`: pass ``device="cuda"`` for GPU rows.
    tier : Tier or str or None
        Tier of the table; default as in the module docstring.
    fallback : sequence of Tier or str or None
        Tiers tried after ``tier``; default as in the module docstring.
    owner : str
        Prefix of the owner names in the manager's statistics.
    staging_slots : int
        Buffers for gathers without ``out`` (see "Staging reuse" in the module docstring).
    threads : int or None
        Threads of a CPU gather (default ``numba.get_num_threads()``).
    huge_pages : bool
        For a CPU gather, put a host table of 32 MiB or more on transparent huge pages (2 MiB) where
        Linux allows (see `samplers.feature_table`); the contents never change.
    presample_fanouts : sequence of int
        Fanouts of the pre-sampling pass (``cache_policy="presample"``), outermost first.
    presample_seeds : torch.Tensor or None, int64, shape [S]
        Seed nodes to draw pre-sampling batches from (the training nodes); default every node.
    presample_batches : int
        Batches in the pre-sampling pass.
    presample_batch_size : int
        Seeds per pre-sampling batch.
    seed : int
        Seed of the pre-sampling pass.

    Attributes
    ----------
    table : torch.Tensor or None, shape [N, *row]
        The rows (a view of the table region, or ``x``); None after `close`.
    table_tier : str
        Tier of the table ("host" for ``x`` itself on the CPU).
    cache_nodes : torch.Tensor, int64, shape [C]
        Cached node ids, in cache-slot order (empty without a cache).

    Raises
    ------
    TypeError
        ``x`` is not a real numeric tensor or array; ``memory`` is not a `MemoryManager`; ``graph`` is
        not a `CSCGraph`.
    TypeError
        An int argument (``cache_rows``, ``staging_slots``, ``threads``, ``presample_*``, ``seed``) that
        is not an int (bools included).
    ValueError
        A negative ``cache_rows``; ``staging_slots``, ``threads`` or ``presample_batch_size`` < 1 or
        above `samplers.MAX_BATCH`; ``presample_batches`` < 0; a presample fanout outside [-1,
        `samplers.MAX_FANOUT`]; ``seed`` outside [0, 2**64); an unknown ``cache_policy``; a cache
        without ``graph``, or a graph of another size; a device other than cpu/cuda; ``device="cuda"``
        with a ``memory`` whose device tier is host memory.
    GPUUnavailableError
        ``device="cuda"`` where torch finds no CUDA (a ``ValueError`` and a ``RuntimeError``).
    MemoryBudgetError
        The table fits no tier tried, or the cache does not fit its tier (lower ``cache_rows``).

    References
    ----------
    PyTorch-Direct (PVLDB 2021) for the zero-copy GPU gather; GNNLab (EuroSys 2022) for pre-sampling
    based caching; PaGraph (SoCC 2020) for degree-based caching.

    Examples
    --------
    >>> mm = MemoryManager(budgets={"device": "8GiB"})
    >>> feats = FeatureStore(x, memory=mm, cache_rows=100_000, graph=graph, device="cuda")
    >>> rows = feats.gather(torch.tensor([3, 1, 4]))  # a staging view, reused once unused
    >>> feats.stats()["hit_rate"]
    """

    def __init__(self, x: Any, memory: MemoryManager | None = None, cache_rows: int = 0,
                 cache_policy: str = "degree", graph: CSCGraph | None = None, *,
                 device: str | torch.device | None = None, tier: Tier | str | None = None,
                 fallback: Any = None, owner: str = "features", staging_slots: int = 2,
                 threads: int | None = None, huge_pages: bool = True, presample_fanouts: Any = (10, 10),
                 presample_seeds: Any = None, presample_batches: int = 8, presample_batch_size: int = 1024,
                 seed: int = 0) -> None:
        x = _as_table(x)
        check_memory(memory)
        cache_rows = check_int("cache_rows", cache_rows, 0)  # any count: clipped to the rows below
        staging_slots = check_int("staging_slots", staging_slots, 1, MAX_BATCH)
        if threads is not None:
            threads = check_int("threads", threads, 1, MAX_BATCH)
        presample_batches = check_int("presample_batches", presample_batches, 0, MAX_BATCH)
        presample_batch_size = check_int("presample_batch_size", presample_batch_size, 1, MAX_BATCH)
        seed = check_seed("seed", seed)
        if cache_policy == "presample" and cache_rows:
            if isinstance(presample_fanouts, (str, bytes)) or not hasattr(presample_fanouts, "__iter__"):
                raise TypeError(f"presample_fanouts must be a sequence of ints, got {presample_fanouts!r}")
            for i, k in enumerate(presample_fanouts):
                check_int(f"presample_fanouts[{i}]", k, -1, MAX_FANOUT)
        if cache_policy not in POLICIES:
            raise ValueError(f"cache_policy must be one of {POLICIES}, got {cache_policy!r}")
        if graph is not None and not isinstance(graph, CSCGraph):
            raise TypeError(f"graph must be a CSCGraph or None, got {type(graph).__name__}")
        num_rows = int(x.shape[0])
        if graph is not None and graph.num_nodes != num_rows:
            raise ValueError(f"graph has {graph.num_nodes} nodes but x has {num_rows} rows: one row per node")
        if cache_rows and graph is None:
            raise ValueError(f"cache_policy={cache_policy!r} needs graph= to choose the hot rows")
        dev = check_device(device) if device is not None else torch.device("cpu")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise GPUUnavailableError(f"device={str(device)!r} but CUDA is not available (torch.cuda."
                                      "is_available() is False): use device='cpu'")

        self.device = dev
        self.owner = owner
        self.cache_policy = cache_policy
        self.threads = int(threads) if threads is not None else nb.get_num_threads()
        self.huge_pages = bool(huge_pages)
        self.row_shape = tuple(x.shape[1:])
        self.dtype = x.dtype
        self._own_memory = memory is None
        self.closed = False
        """True once `close` ran: gathers then raise ValueError."""
        self.memory = memory if memory is not None else MemoryManager(device=dev)
        self._regions: list[Region] = []
        self._cache: RowCache | None = None
        self._cache_tier: str | None = None
        self._staging: RowStaging | None = None
        self._lock = threading.Lock()
        self._gathers = self._rows_out = self._hits = 0
        self._seconds = 0.0
        self._dev_hits = None
        self._pickled: torch.Tensor | None = None
        self._num_rows = num_rows
        try:
            cache_rows = min(int(cache_rows), num_rows)
            # where the device tier lives decides the tiers, not torch.cuda.is_available(): a private
            # manager's device tier is `dev` itself; a given one is asked when it matters
            if memory is None:
                host_device_tier = dev.type == "cpu"
            elif dev.type == "cuda" or tier is None or cache_rows:
                host_device_tier = device_tier_is_host(memory, owner)
            else:
                host_device_tier = False  # not consulted: the tier is given and there is no cache
            if dev.type == "cuda" and host_device_tier:
                raise ValueError("memory: its device tier is host memory (MemoryManager(device='cpu')), "
                                 "which a GPU gather's cache and staging cannot use; pass "
                                 "MemoryManager(device='cuda') for device='cuda', or device='cpu'")
            self.table, self.table_tier = place_table(x, memory, self.memory, owner, dev, tier, fallback,
                                                      self.huge_pages, host_device_tier, self._regions)
            self.cache_nodes = torch.empty(0, dtype=torch.int64)
            if cache_rows and self.table_tier == Tier.DEVICE.value:
                logger.info("the feature table is on the device tier: no cache needed (cache_rows ignored)")
            elif cache_rows:
                assert graph is not None
                hot = hot_nodes(graph, cache_rows, cache_policy, presample_fanouts, presample_seeds,
                                presample_batches, presample_batch_size, seed)
                # a CPU gather's cache is host memory: huge pages as for the table
                self._cache = RowCache(self.memory, self.table, hot, owner,
                                       lambda t: advise_huge_table(t, self.huge_pages, dev),
                                       tier=cache_tier_for(dev, host_device_tier))
                self.cache_nodes = self._cache.nodes
                self._cache_tier = self._cache.tier
            self._staging = RowStaging(self.memory, self.row_shape, self.dtype, max(1, int(staging_slots)),
                                       *staging_tiers(dev), owner=f"{owner}.staging")
            self._held: deque[StagingLease] = deque()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def presample_counts(graph: CSCGraph, fanouts: Any = (10, 10), seeds: Any = None, batches: int = 8,
                         batch_size: int = 1024, seed: int = 0) -> np.ndarray:
        """How often each node is an input node in a short pre-sampling pass: int64 [N].

        See `samplers.feature_cache.presample_counts` (parameters, References).
        """
        return presample_counts(graph, fanouts, seeds, batches, batch_size, seed)

    # ------------------------------------------------------------------ sizes
    @property
    def num_rows(self) -> int:
        """N."""
        return self._num_rows

    @property
    def row_bytes(self) -> int:
        """Bytes of one row."""
        return math.prod(self.row_shape) * self.dtype.itemsize

    @property
    def cache_rows(self) -> int:
        """Rows in the cache (0 without one)."""
        return int(self.cache_nodes.shape[0])

    @property
    def cache_tier(self) -> str | None:
        """Tier of the cache (None without one)."""
        return self._cache_tier

    def __len__(self) -> int:
        return self.num_rows

    def __reduce__(self):
        """Pickle (``mp.spawn``, DataLoader workers) as a new store over a copy of the rows, with the same
        device, owner, staging slots, threads and huge-page setting and its own memory manager (the copy
        leaves this store's regions untouched; its tier is the new manager's choice).

        The copy is one CPU tensor in shared memory (``N * row_bytes`` of ``/dev/shm``, outside the
        budgets), made at the first pickle and held by the store until `close` or `refresh_cache`, so the
        handle torch's multiprocessing pickler sends stays valid until a spawn child opens it.

        Raises
        ------
        TypeError
            The store has a cache (its hot rows come from a graph and a policy: build the store in each
            process).
        ValueError
            The store is closed.
        """
        self._check_open()
        if self._cache is not None:
            raise TypeError("a FeatureStore with a cache cannot be pickled: build one in each process "
                            "(its hot rows come from the graph and the cache policy)")
        assert self._staging is not None  # open
        settings = {"device": self.device, "owner": self.owner, "staging_slots": self._staging.slots,
                    "threads": self.threads, "huge_pages": self.huge_pages}
        with self._lock:  # one copy, kept: one made per pickle was freed before a spawn child opened it
            if self._pickled is None:
                self._pickled = self.table.detach().to("cpu", copy=True).share_memory_()
            return _rebuild_store, (self._pickled, settings)

    def __repr__(self) -> str:
        return (f"FeatureStore(rows={self.num_rows}, row_shape={self.row_shape}, dtype={self.dtype}, "
                f"table_tier={self.table_tier}, cache_rows={self.cache_rows}, device={self.device.type})")

    # ------------------------------------------------------------------ gather
    def staging(self, slots: int = 2, rows: int = 0) -> RowStaging:
        """New staging buffers for this store's rows, from its manager: the pinned tier (then host) for
        a CPU gather (page-locked with CUDA, plain host memory without), the device tier for a GPU
        gather.

        Parameters
        ----------
        slots : int
            Buffers (leases that may be held at once).
        rows : int
            Rows per buffer to start with (it grows on demand).

        Returns
        -------
        RowStaging
            Its owner name is ``f"{owner}.staging"``; close it when done.

        Raises
        ------
        ValueError
            The store (or its memory manager) is closed.
        """
        self._check_open()
        return RowStaging(self.memory, self.row_shape, self.dtype, slots, *staging_tiers(self.device),
                          owner=f"{self.owner}.staging", rows=rows)

    def check_ids(self, ids: Any) -> np.ndarray:
        """Validate row ids at the public boundary; return them as a contiguous int64 numpy array.

        Raises
        ------
        TypeError
            ``ids`` is not an integer tensor or array.
        ValueError
            ``ids`` is not 1-D, or holds ids outside [0, num_rows) (the message names ``ids``, counts
            them and quotes the first).
        """
        return check_seeds(ids, self.num_rows, name="ids", bound="num_rows")

    def gather(self, ids: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``x[ids]``, written into a staging buffer or into ``out``.

        Parameters
        ----------
        ids : torch.Tensor or array-like, integer, shape [B]
            Row (node) ids in [0, N); duplicates allowed.
        out : torch.Tensor or None, shape [>= B, *row], the table's dtype, contiguous
            Where to write (on the CPU for a CPU gather, on the GPU for a GPU gather). ``None``: the
            next of the store's staging buffers: in host memory never overwritten while a tensor views
            it; in device memory valid until ``staging_slots`` more gathers without ``out`` (see the
            module docstring).

        Returns
        -------
        torch.Tensor, shape [B, *row]
            ``out[:B]`` or a staging view: no fresh allocation in steady state.

        Raises
        ------
        TypeError
            ``ids`` is not integer; ``out`` is not a tensor of the table's dtype.
        ValueError
            ``ids`` is not 1-D or holds ids outside [0, num_rows); ``out`` has the wrong shape, is
            not contiguous or is on the wrong device; the store (or its memory manager) is closed.
        """
        self._check_open()
        arr = self.check_ids(ids)
        if out is None:
            lease = self._lease(arr.shape[0])
            return self.gather_into(arr, lease.tensor)
        self._check_out(out, arr.shape[0])
        return self.gather_into(arr, out)

    def refresh_cache(self) -> None:
        """Copy the cached rows again from `table`: call it after changing the table in place (an
        optimizer step on an embedding table given as ``x`` with ``memory=None``), not while a gather
        runs or a pickle. A GPU copy runs on torch's current stream. It drops the copy kept for pickling
        (`__reduce__`): the next pickle copies the changed rows.

        Raises
        ------
        ValueError
            The store is closed.
        """
        self._check_open()
        self._pickled = None  # the next pickle copies the changed rows
        if self._cache is not None:
            self._cache.refresh(self.table)

    def _check_open(self) -> None:
        check_open(self.closed, "this FeatureStore")
        check_open(self.memory.closed, "the MemoryManager of this FeatureStore")

    def _lease(self, rows: int) -> StagingLease:
        with self._lock:
            held, staging = self._held, self._staging
            check_open(staging is None, "this FeatureStore")  # closed since the caller's check
            assert staging is not None
            if len(held) >= staging.slots:
                held.popleft().release_when_unused()  # a result the caller kept is not overwritten
            lease = staging.acquire(rows)
            held.append(lease)
            return lease

    def _check_out(self, out: Any, rows: int) -> None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype != self.dtype:
            raise TypeError(f"out must have the table's dtype {self.dtype}, got {out.dtype}")
        if tuple(out.shape[1:]) != self.row_shape or out.shape[0] < rows:
            raise ValueError(f"out must have shape [>= {rows}, {', '.join(map(str, self.row_shape))}], "
                             f"got {tuple(out.shape)}")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")
        if out.device.type != self.device.type:
            raise ValueError(f"out must be on {self.device.type} for this store, got {out.device}")

    def gather_into(self, ids: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        """`gather` without checks, for loaders whose ids come from a sampler (trusted in range).

        Parameters
        ----------
        ids : numpy.ndarray or torch.Tensor, int64, shape [B], every id in [0, N)
            On any device: a host store reads CUDA ids back (one copy), a CUDA store copies host ids up.
        out : torch.Tensor, shape [>= B, *row], contiguous, on the gather's device

        Returns
        -------
        torch.Tensor
            ``out[:B]``.

        Raises
        ------
        ValueError
            The store (or its memory manager) is closed.
        """
        self._check_open()
        t0 = time.perf_counter()
        b = int(ids.shape[0])
        if self.device.type == "cuda":
            hits = self._gather_cuda(ids, out)
        else:
            ids_np = ids.cpu().numpy() if isinstance(ids, torch.Tensor) else ids
            ids_np = np.ascontiguousarray(ids_np, dtype=np.int64)
            cache = self._cache
            hits = gather_rows(self.table, ids_np, out, self.threads, None if cache is None else cache.rows,
                               None if cache is None else cache.slots)
        dt = time.perf_counter() - t0
        with self._lock:
            self._gathers += 1
            self._rows_out += b
            self._hits += hits
            self._seconds += dt
        return out[:b]

    def _gather_cuda(self, ids: Any, out: torch.Tensor) -> int:  # pragma: no cover - needs a GPU
        from graphrl import cuda as gcuda  # imports numba.cuda: only for a GPU gather

        dev = out.device
        ids_t = torch.as_tensor(ids).to(dev, torch.int64, non_blocking=True)
        if self._dev_hits is None:
            self._dev_hits = torch.zeros(1, dtype=torch.int64, device=dev)
            self._table_words = word_view(self.table)
            if self._cache is not None:
                self._cache_words = word_view(self._cache.rows)
                self._slots_dev = gcuda.as_device_array(self._cache.slots_tensor)
        b = int(ids_t.shape[0])
        if b:
            cached = self._cache is not None
            gather_rows_cuda(self._table_words, gcuda.as_device_array(ids_t), word_view(out[:b]),
                             cache=self._cache_words if cached else None,
                             slots=self._slots_dev if cached else None,
                             hits=gcuda.as_device_array(self._dev_hits), stream=gcuda.launch_stream(dev))
        return 0  # device-side hits are read by stats()

    # ------------------------------------------------------------------ statistics
    def stats(self) -> dict[str, Any]:
        """Gather statistics and placement, as plain data.

        Returns
        -------
        dict
            ``rows``, ``row_bytes``, ``dtype``, ``device``, ``table_tier``, ``cache_rows``,
            ``cache_tier`` (None without a cache), ``cache_policy``, ``gathers`` (calls),
            ``gathered_rows``, ``cache_hits`` (rows read from the cache), ``hit_rate``
            (``cache_hits / gathered_rows``, 0.0 before any gather), ``gathered_bytes``,
            ``gather_seconds`` (wall time inside gathers; a GPU gather is asynchronous) and
            ``gather_bytes_per_s``.
        """
        with self._lock:
            gathers, rows, hits, secs = self._gathers, self._rows_out, self._hits, self._seconds
        if self._dev_hits is not None:  # pragma: no cover - needs a GPU
            hits += int(self._dev_hits.item())
        nbytes = rows * self.row_bytes
        return {
            "rows": self.num_rows, "row_bytes": self.row_bytes,
            "dtype": str(self.dtype).removeprefix("torch."), "device": self.device.type,
            "table_tier": self.table_tier, "cache_rows": self.cache_rows,
            "cache_tier": self.cache_tier if self.cache_rows else None,
            "cache_policy": self.cache_policy if self.cache_rows else None,
            "gathers": gathers, "gathered_rows": rows, "cache_hits": hits,
            "hit_rate": hits / rows if rows else 0.0, "gathered_bytes": nbytes, "gather_seconds": secs,
            "gather_bytes_per_s": nbytes / secs if secs > 0 else 0.0,
        }

    def reset_stats(self) -> None:
        """Zero the gather counters (placement is kept)."""
        with self._lock:
            self._gathers = self._rows_out = self._hits = 0
            self._seconds = 0.0
        if self._dev_hits is not None:  # pragma: no cover - needs a GPU
            self._dev_hits.zero_()

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Free the table, cache and staging regions (and a private manager); idempotent.

        The store drops its references to them (`table` becomes None): their blocks return to the pools
        once unviewed. Rows or a ``table`` kept from before stay readable, count against no budget
        (``usage()`` says 0) yet hold their blocks (a pool refusing for them names its live blocks); ``x``
        used in place is the caller's. Statistics stay readable; gathers, `staging`, pickles raise ValueError.
        """
        self.closed = True
        staging = getattr(self, "_staging", None)
        if staging is not None:
            held, self._held = getattr(self, "_held", deque()), deque()
            for lease in held:  # its slot returns once unused: a closed pool frees once all are back
                lease.release_when_unused()
            staging.close()
            self._staging = None
        cache = getattr(self, "_cache", None)
        if cache is not None:
            cache.free()
            self._cache = None  # its rows' view: the block can return
        for region in getattr(self, "_regions", ()):
            if not region.freed:
                try:
                    region.free()
                except ValueError:  # the manager closed first
                    pass
        self._regions = []
        self.table = self._pickled = None  # type: ignore[assignment]  # the region's view: the block returns
        self._table_words = self._cache_words = self._slots_dev = None
        if getattr(self, "_own_memory", False):
            self.memory.close()

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rebuild_store(table: torch.Tensor, settings: dict) -> FeatureStore:
    """A pickled `FeatureStore` in its new process (see `FeatureStore.__reduce__`)."""
    return FeatureStore(table, **settings)

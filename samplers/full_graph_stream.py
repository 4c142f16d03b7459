"""Run a `samplers.full_graph_plan.PartitionPlan` on a device, counting every host-device byte.

`StagedExecutor.multiply(plan, h, out)` computes ``out = M @ h`` the HongTu way: the dedup cache's
source rows are gathered from the host vertex data ``h`` into the device buffer once, then for each
partition its streamed source rows and its local CSR are copied into its slot (double-buffered:
partition k uses slot ``k % 2``), the slot's SpMM runs on the device, and its output rows are copied
back and scattered into ``out`` on the host. Every logical transfer is counted in a `CallTraffic`.

One code path for both kinds of device. The working set is one region of the memory manager's
``device`` tier (so its peak is the manager's statistic). Source rows are gathered on the host into
pinned staging buffers (``pinned`` tier), every host-device copy goes through a
`graphrl.memory.transfers.Transfers` on a copy stream (host to device), a compute stream and a
copy-back stream, with events, so that the copies of partition k+1 overlap the product of partition
k and the host waits once per partition. Buffers are kept across calls: a steady-state epoch
allocates, registers and copies from pageable memory nothing (docs/architecture.md#full-graph-propagation).

- with CUDA the working set is GPU memory and the product is torch's CSR ``sparse.mm``;
- without CUDA the device tier is host memory, streams and events are stand-ins, the copies are
  synchronous and counted the same way, and the product is the numba CSR kernel
  (`graphrl.kernels.spmm.csr_spmm_parallel`: chunks of rows claimed by the kernel team).

The host-side gathers and scatters are numba kernels too, serial below `graphrl.threads.SERIAL_WORK`,
and on the CPU the copies run inside `graphrl.threads.serial_torch`: no per-partition OpenMP
fork-join, which a busy machine can stretch from microseconds to a time slice (`graphrl.threads`).

References
----------
Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024.
"""

from __future__ import annotations

import dataclasses
import weakref
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numba as nb
import numpy as np
import torch

from graphrl.kernels import parallel_for
from graphrl.kernels.spmm import csr_spmm_parallel
from graphrl.memory import MemoryManager, Region, Tier, free_quietly
from graphrl.memory.transfers import Transfers
from graphrl.threads import serial_torch, threads_for
from samplers.full_graph_bytes import align
from samplers.full_graph_plan import PartitionPlan, PlanPart
from samplers.kernels.gather import gather_rows

__all__ = ["CallTraffic", "StagedExecutor"]


@dataclass
class CallTraffic:
    """Bytes one staged propagation moved (logical transfers; on CPU, counted copies).

    Attributes
    ----------
    direction : str
        ``"forward"`` (``P @ h``) or ``"backward"`` (``P^T @ g``).
    width : int
        Feature width d.
    partitions : int
    host_to_device_bytes : int
        Vertex rows (cache and streamed) plus partition structure (local CSR) moved to the device.
    vertex_host_to_device_bytes, structure_host_to_device_bytes : int
        The two parts of ``host_to_device_bytes``.
    device_to_host_bytes : int
        Output rows moved back.
    dedup_hit_bytes : int
        Vertex bytes partitions read from the device cache, every read counted (the first included:
        the saving over moving every read is this minus the cache's load, ``cache_rows`` rows).
    cache_rows : int
        Rows in the dedup cache.
    device_bytes : int
        The working set (cache and both slots) on the device tier.
    pageable_transfers : int
        Copies of this call whose host side was not pinned memory (the rule is none).
    host_waits : int
        Times this call's host blocked on the device (one per partition).
    """

    direction: str
    width: int
    partitions: int
    host_to_device_bytes: int = 0
    vertex_host_to_device_bytes: int = 0
    structure_host_to_device_bytes: int = 0
    device_to_host_bytes: int = 0
    dedup_hit_bytes: int = 0
    cache_rows: int = 0
    device_bytes: int = 0
    pageable_transfers: int = 0
    host_waits: int = 0

    def as_dict(self) -> dict:
        """The fields as a plain dict (ints and strings: JSON-ready)."""
        return asdict(self)


def _views(buf: torch.Tensor, plan: PartitionPlan, dtype: torch.dtype, width: int):
    """The source rows [C + 2 S, d] of the working set and the two slot arenas (uint8)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    src_rows = len(plan.cache) + 2 * plan.max_stream
    src = buf[:src_rows * width * itemsize].view(dtype).view(src_rows, width)
    base = plan.src_bytes
    arenas = [buf[base + s * plan.arena_bytes:base + (s + 1) * plan.arena_bytes] for s in range(2)]
    return src, arenas


def _part_views(arena: torch.Tensor, plan: PartitionPlan, part, dtype: torch.dtype, width: int):
    """A partition's indptr (int64), cols (int32), weights (float32) and output rows in its arena."""
    r, e = part.rows.shape[0], part.cols.shape[0]
    o_ptr, o_cols, o_w, o_out = plan.arena_offsets(part)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return (arena[o_ptr:o_ptr + 8 * (r + 1)].view(torch.int64),
            arena[o_cols:o_cols + 4 * e].view(torch.int32),
            arena[o_w:o_w + 4 * e].view(torch.float32),
            arena[o_out:o_out + r * width * itemsize].view(dtype).view(r, width))


class StagedExecutor:
    """Streams the partitions of a plan through the memory manager's device tier.

    One code path for both kinds of device: every host-device copy goes through a
    `graphrl.memory.transfers.Transfers` (asynchronous from and to ``pinned``-tier regions, counted),
    on three streams (host to device, compute, device to host) ordered by events; without CUDA the
    streams and events are stand-ins and the copies synchronous, so the same calls are counted.

    Buffers, each held across calls and grown only when a larger plan needs more (so a steady-state
    epoch allocates nothing): the device working set (``device`` tier, owner ``owner``); per slot a
    pinned gather buffer of streamed source rows and a pinned return buffer of output rows, and one
    pinned buffer of the dedup cache's rows (owner ``owner + ".staging"``); per plan, its partitions'
    local CSRs copied once into one pinned region (owner ``owner + ".structure"``, freed with the plan).

    Parameters
    ----------
    memory : MemoryManager
        Where the working set (``device`` tier) and the staging buffers (``pinned``) come from.
    owner : str
        The working set's owner in ``memory``'s statistics (``owner + ".staging"`` and
        ``owner + ".structure"`` for the pinned buffers).
    """

    def __init__(self, memory: MemoryManager, owner: str) -> None:
        self.memory = memory
        self.owner = owner
        probe = memory.allocate(0, torch.uint8, Tier.DEVICE, owner=owner)
        self.device = probe.device if isinstance(probe.device, torch.device) else torch.device(probe.device)
        probe.free()
        self.cuda = self.device.type == "cuda"
        self.transfers = Transfers(memory, self.device)
        self._work: Region | None = None
        self._staging: dict[str, Region] = {}
        t = self.transfers
        self._copy_stream, self._compute_stream, self._back_stream = t.stream(), t.stream(), t.stream()
        self._loaded = [t.event() for _ in range(2)]
        self._computed = [t.event() for _ in range(2)]
        self._returned = [t.event() for _ in range(2)]
        self._start = t.event()

    def _working_set(self, nbytes: int) -> torch.Tensor:
        work = self._work
        if work is not None and not work.freed and work.nbytes >= nbytes:
            return work.tensor()
        if work is not None and not work.freed:
            work.free()
        self._work = self.memory.allocate(nbytes, torch.uint8, Tier.DEVICE, owner=self.owner)
        return self._work.tensor()

    @property
    def working_bytes(self) -> int:
        """Bytes of the working set held on the device tier now (0 when released)."""
        return self._work.nbytes if self._work is not None and not self._work.freed else 0

    def release(self) -> None:
        """Free the working set and staging buffers (the next call allocates them again)."""
        for region in ([self._work] if self._work is not None else []) + list(self._staging.values()):
            free_quietly(region)
        self._work = None
        self._staging = {}

    def _stage(self, name: str, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        """The pinned staging buffer ``name`` as ``[rows, width]`` of ``dtype``, grown when too small."""
        itemsize = torch.empty(0, dtype=dtype).element_size()
        need = max(rows, 1) * width * itemsize
        region = self._staging.get(name)
        if region is None or region.freed or region.nbytes < need:
            if region is not None:
                free_quietly(region)
            region = self.memory.allocate(need, torch.uint8, Tier.PINNED, owner=self.owner + ".staging",
                                          fallback=(Tier.HOST,))
            self._staging[name] = region
        return region.tensor()[:need].view(dtype).view(-1, width)

    def _structure(self, plan: PartitionPlan) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The plan's local CSRs in one pinned region, made on first use and freed with the plan.

        The parts' ``indptr``, ``cols`` and ``weights`` then view that region (no second copy is kept).
        """
        if plan.parts and plan.parts[0].pinned is not None:
            return [p.pinned for p in plan.parts]
        offsets, total = [], 0
        for p in plan.parts:
            o = []
            for a in (p.indptr, p.cols, p.weights):
                o.append(total)
                total = align(total + a.nbytes)
            offsets.append(o)
        region = self.memory.allocate(max(total, 1), torch.uint8, Tier.PINNED,
                                      owner=self.owner + ".structure", fallback=(Tier.HOST,))
        raw = region.tensor()
        for p, o in zip(plan.parts, offsets, strict=True):
            views = []
            for a, off in zip((p.indptr, p.cols, p.weights), o, strict=True):
                v = raw[off:off + a.nbytes].view(_TORCH_OF[a.dtype.str]) if a.nbytes else torch.from_numpy(a)
                if a.nbytes:
                    v.copy_(torch.from_numpy(a))
                views.append(v)
            p.pinned = tuple(views)
            p.indptr, p.cols, p.weights = (v.numpy() for v in views)
        weakref.finalize(plan, free_quietly, region)
        return [p.pinned for p in plan.parts]

    def multiply(self, plan: PartitionPlan, h: torch.Tensor, out: torch.Tensor,
                 direction: str = "forward") -> CallTraffic:
        """``out[rows of each part] = (M @ h)[rows]`` for the plan's matrix M; returns what moved.

        Parameters
        ----------
        plan : PartitionPlan
            Planned for ``h``'s width and itemsize.
        h : torch.Tensor, float32 or float64, shape [N, d], contiguous, on the host
        out : torch.Tensor, dtype of ``h``, shape [N, d], on the host
        direction : str
            Recorded in the returned traffic.

        Returns
        -------
        CallTraffic
            Logical bytes, and the pageable transfers and host waits this call made.

        Raises
        ------
        MemoryBudgetError
            The device tier has no room for ``plan.device_bytes`` (planned for more room than is free).
        """
        d = h.shape[1]
        itemsize = h.element_size()
        traffic = CallTraffic(direction, d, plan.num_partitions, cache_rows=int(len(plan.cache)),
                              device_bytes=plan.device_bytes)
        c = len(plan.cache)
        row_bytes = d * itemsize
        t = traffic
        for part in plan.parts:
            t.dedup_hit_bytes += part.cache_reads * row_bytes
            t.vertex_host_to_device_bytes += part.stream.shape[0] * row_bytes
            t.structure_host_to_device_bytes += part.indptr.nbytes + part.cols.nbytes + part.weights.nbytes
            t.device_to_host_bytes += part.rows.shape[0] * row_bytes
        t.vertex_host_to_device_bytes += c * row_bytes
        t.host_to_device_bytes = t.vertex_host_to_device_bytes + t.structure_host_to_device_bytes
        before = dataclasses.replace(self.transfers.counts)
        with nullcontext() if self.cuda else serial_torch():  # the host copies: small, many
            self._run(plan, h, out)
        after = self.transfers.counts
        t.pageable_transfers = after.pageable_transfers - before.pageable_transfers
        t.host_waits = after.host_waits - before.host_waits
        return traffic

    def _spmm(self, indptr, cols, weights, src, out_rows) -> None:
        """``out_rows = CSR(indptr, cols, weights) @ src`` on the device (torch on CUDA, else numba)."""
        r = out_rows.shape[0]
        if self.cuda:  # pragma: no cover - needs CUDA
            # torch wants row pointer and columns of one dtype: int32 (a partition has < 2**31 entries)
            mat = torch.sparse_csr_tensor(indptr.to(torch.int32), cols, weights.to(src.dtype),
                                          size=(r, src.shape[0]))
            out_rows.copy_(torch.sparse.mm(mat, src))
            return
        # the kernel team's row chunks, each row summed in entry order (bitwise the serial product)
        csr_spmm_parallel(indptr.numpy(), cols.numpy(), weights.numpy(), src.numpy(), out_rows.numpy())

    def _run(self, plan: PartitionPlan, h: torch.Tensor, out: torch.Tensor) -> None:
        """Copy, compute and copy-back streams with events: the copies of partition k+1 overlap the
        product of partition k.

        Slot s's buffers are reused by partition k+2 only after partition k's output is back on the
        host (one host wait per partition; its event implies k's loads and product finished, and so did
        the cache's load, issued earlier on the copy stream).
        """
        tr = self.transfers
        copy, compute, back = self._copy_stream, self._compute_stream, self._back_stream
        loaded, computed, returned = self._loaded, self._computed, self._returned
        d, c = h.shape[1], len(plan.cache)
        buf = self._working_set(plan.device_bytes)
        src, arenas = _views(buf, plan, h.dtype, d)
        structure = self._structure(plan)
        gathers = [self._stage(f"gather{s}", plan.max_stream, d, h.dtype) for s in range(2)]
        backs = [self._stage(f"back{s}", plan.max_rows, d, h.dtype) for s in range(2)]
        # the copy stream starts after the caller's work on the current stream (which may have used the
        # working set's memory before the allocator handed it to us)
        tr.record(self._start, tr.current_stream())
        tr.wait_event(copy, self._start)
        _zero_split(plan, out)
        if c:
            cache_rows = self._stage("cache", c, d, h.dtype)[:c]
            _gather(h, plan.cache, cache_rows)
            with tr.use(copy):
                tr.h2d(src[:c], cache_rows)
        pending: list[tuple[int, PlanPart]] = []

        def drain(slot: int) -> None:
            for i, (s, part) in enumerate(pending):
                if s == slot:
                    tr.wait(returned[s])
                    _scatter(part, out, backs[s][:part.rows.shape[0]])
                    pending.pop(i)
                    return

        for part, (p_indptr, p_cols, p_weights) in zip(plan.parts, structure, strict=True):
            s = part.slot
            drain(s)  # the slot's previous output is on the host, its staging buffers free again
            indptr, cols, weights, out_rows = _part_views(arenas[s], plan, part, h.dtype, d)
            r, e, n_s = part.rows.shape[0], part.cols.shape[0], part.stream.shape[0]
            lo = c + s * plan.max_stream
            if n_s:
                _gather(h, part.stream, gathers[s][:n_s])
            with tr.use(copy):
                tr.wait_event(copy, computed[s])  # the slot's previous product has read its buffers
                if n_s:
                    tr.h2d(src[lo:lo + n_s], gathers[s][:n_s])
                tr.h2d(indptr[:r + 1], p_indptr)
                if e:
                    tr.h2d(cols[:e], p_cols)
                    tr.h2d(weights[:e], p_weights)
                tr.record(loaded[s], copy)
            with tr.use(compute):
                tr.wait_event(compute, loaded[s])
                self._spmm(indptr[:r + 1], cols[:e], weights[:e], src, out_rows[:r])
                tr.record(computed[s], compute)
            with tr.use(back):
                tr.wait_event(back, computed[s])
                tr.d2h(backs[s][:r], out_rows[:r])
                tr.record(returned[s], back)
            pending.append((s, part))
        while pending:
            drain(pending[0][0])


_TORCH_OF = {np.dtype(np.int64).str: torch.int64, np.dtype(np.int32).str: torch.int32,
             np.dtype(np.float32).str: torch.float32, np.dtype(np.float64).str: torch.float64}


_NUMBA_FLOATS = (torch.float32, torch.float64)
_NO_ADD = np.zeros(0, dtype=np.bool_)


def _gather(h: torch.Tensor, ids: np.ndarray, out: torch.Tensor) -> None:
    """``out[:len(ids)] = h[ids]`` (host tensors; ``ids`` int64), serial unless the rows are many."""
    gather_rows(h, ids, out, threads=threads_for(ids.shape[0] * h.shape[1] * h.element_size() // 4))


@nb.njit(nogil=True, cache=True)
def _zero_rows(out, rows):  # pragma: no cover - compiled
    for i in range(rows.shape[0]):
        out[rows[i], :] = 0


@nb.njit(nogil=True, cache=True)
def _scatter_rows(out, rows, add, src, lo, hi):  # pragma: no cover - compiled
    """``out[rows[i]] = src[i]`` (``+=`` where ``add[i]``; ``add`` empty: none) for i in [lo, hi)."""
    d = out.shape[1]
    adds = add.shape[0] > 0
    for i in range(lo, hi):
        r = rows[i]
        if adds and add[i]:
            for j in range(d):
                out[r, j] += src[i, j]
        else:
            for j in range(d):
                out[r, j] = src[i, j]


def _zero_split(plan: PartitionPlan, out: torch.Tensor) -> None:
    """Zero the output rows that split partitions add their pieces to."""
    if plan.split_rows.shape[0]:
        if out.dtype in _NUMBA_FLOATS:
            _zero_rows(out.numpy(), plan.split_rows)
        else:
            out.index_fill_(0, torch.from_numpy(plan.split_rows), 0)


def _scatter(part, out: torch.Tensor, rows_out: torch.Tensor) -> None:
    """Write a partition's output rows into the host output (pieces of split rows are added).

    Rows of a partition are distinct, so chunks of them may run on several threads; an added piece
    lands on a zeroed row or on the previous partitions' sum, in partition order (bitwise as
    ``index_add_``)."""
    if out.dtype not in _NUMBA_FLOATS:  # float16 / bfloat16 on the CUDA path: torch's ops
        _scatter_torch(part, out, rows_out)
        return
    r, d = part.rows.shape[0], out.shape[1]
    args = (out.numpy(), part.rows, _NO_ADD if part.add is None else part.add, rows_out.numpy())
    threads = threads_for(r * d)
    if threads == 1:
        _scatter_rows(*args, 0, r)
        return
    step = -(-r // (4 * threads))
    parallel_for(lambda i: _scatter_rows(*args, i * step, min(r, (i + 1) * step)), -(-r // step), threads)


def _scatter_torch(part, out: torch.Tensor, rows_out: torch.Tensor) -> None:
    rows = torch.from_numpy(part.rows)
    if part.add is None:
        out.index_copy_(0, rows, rows_out)
        return
    add = torch.from_numpy(part.add)
    out.index_copy_(0, rows[~add], rows_out[~add])
    out.index_add_(0, rows[add], rows_out[add])

"""Run a `samplers.full_graph_plan.PartitionPlan` on a device, counting every host-device byte.

`StagedExecutor.multiply(plan, h, out)` computes ``out = M @ h`` the HongTu way: the dedup cache's
source rows are gathered from the host vertex data ``h`` into the device buffer once, then for each
partition its streamed source rows and its local CSR are copied into its slot (double-buffered:
partition k uses slot ``k % 2``), the slot's SpMM runs on the device, and its output rows are copied
back and scattered into ``out`` on the host. Every logical transfer is counted in a `CallTraffic`.

One code path for both kinds of device. The working set is one region of the memory manager's
``device`` tier (so its peak is the manager's statistic):

- without CUDA the device is host memory: copies are counted ``copy_``/``index_select`` into the
  region, and the SpMM is the numba CSR kernel (`graphrl.kernels.spmm.csr_spmm_parallel`);
- with CUDA the region is GPU memory: rows are gathered on the host into pinned staging buffers
  (one per slot, ``pinned`` tier), copied asynchronously on a copy stream, multiplied on a compute
  stream with torch's CSR ``sparse.mm``, and copied back on a third stream through pinned staging
  buffers, with events so that the copies of partition k+1 overlap the product of partition k.

References
----------
Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numba as nb
import torch

from graphrl.kernels.spmm import SERIAL_WORK, csr_spmm_parallel, csr_spmm_serial
from graphrl.memory import MemoryManager, Region, Tier
from samplers.full_graph_plan import PartitionPlan

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

    def as_dict(self) -> dict:
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

    Parameters
    ----------
    memory : MemoryManager
        Its ``device`` tier holds the working set (owner ``owner``); with CUDA its ``pinned`` tier
        holds the staging buffers (owner ``owner + ".staging"``).
    owner : str

    Raises
    ------
    ValueError
        (from `multiply`) Tensors of the wrong shape or device.
    """

    def __init__(self, memory: MemoryManager, owner: str) -> None:
        self.memory = memory
        self.owner = owner
        probe = memory.allocate(0, torch.uint8, Tier.DEVICE, owner=owner)
        self.device = probe.device if isinstance(probe.device, torch.device) else torch.device(probe.device)
        probe.free()
        self.cuda = self.device.type == "cuda"
        self._work: Region | None = None
        self._staging: list[Region] = []
        if self.cuda:  # pragma: no cover - needs CUDA
            self._copy_stream = torch.cuda.Stream(self.device)  # host -> device
            self._compute_stream = torch.cuda.Stream(self.device)
            self._back_stream = torch.cuda.Stream(self.device)  # device -> host (its own copy engine)

    def _working_set(self, nbytes: int) -> torch.Tensor:
        work = self._work
        if work is not None and not work.freed and work.nbytes == nbytes:
            return work.tensor()
        self.release()
        self._work = self.memory.allocate(nbytes, torch.uint8, Tier.DEVICE, owner=self.owner)
        return self._work.tensor()

    @property
    def working_bytes(self) -> int:
        """Bytes of the working set held on the device tier now (0 when released)."""
        return self._work.nbytes if self._work is not None and not self._work.freed else 0

    def release(self) -> None:
        """Free the working set and staging buffers (the next call allocates them again)."""
        for region in ([self._work] if self._work is not None else []) + self._staging:
            if not region.freed:
                region.free()
        self._work = None
        self._staging = []

    def multiply(self, plan: PartitionPlan, h: torch.Tensor, out: torch.Tensor,
                 direction: str = "forward") -> CallTraffic:
        """``out[rows of each part] = (M @ h)[rows]`` for the plan's matrix M; returns what moved.

        Parameters
        ----------
        plan : PartitionPlan
            Planned for ``h``'s width and itemsize.
        h : torch.Tensor, float32 or float64, shape [N, d], contiguous, on the host
        out : torch.Tensor, dtype of ``h``, shape [N, d], on the host (pinned with CUDA for overlap)
        direction : str
            Recorded in the returned traffic.

        Returns
        -------
        CallTraffic
        """
        d = h.shape[1]
        itemsize = h.element_size()
        traffic = CallTraffic(direction, d, plan.num_partitions, cache_rows=int(len(plan.cache)),
                              device_bytes=plan.device_bytes)
        buf = self._working_set(plan.device_bytes)
        src, arenas = _views(buf, plan, h.dtype, d)
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
        if self.cuda:  # pragma: no cover - needs CUDA
            self._multiply_cuda(plan, h, out, src, arenas, c)
        else:
            self._multiply_host(plan, h, out, src, arenas, c)
        return traffic

    def _multiply_host(self, plan, h, out, src, arenas, c) -> None:
        """The device is host memory: counted copies into the working set, the numba CSR kernel."""
        _zero_split(plan, out)
        if c:
            torch.index_select(h, 0, torch.from_numpy(plan.cache), out=src[:c])
        threads = nb.get_num_threads()
        for part in plan.parts:
            indptr, cols, weights, out_rows = _part_views(arenas[part.slot], plan, part, h.dtype, h.shape[1])
            r, e, s = part.rows.shape[0], part.cols.shape[0], part.stream.shape[0]
            lo = c + part.slot * plan.max_stream
            if s:
                torch.index_select(h, 0, torch.from_numpy(part.stream), out=src[lo:lo + s])
            indptr[:r + 1].copy_(torch.from_numpy(part.indptr))
            cols[:e].copy_(torch.from_numpy(part.cols))
            weights[:e].copy_(torch.from_numpy(part.weights))
            o = out_rows[:r]
            kernel = csr_spmm_parallel if threads > 1 and e * h.shape[1] > SERIAL_WORK else csr_spmm_serial
            kernel(indptr[:r + 1].numpy(), cols[:e].numpy(), weights[:e].numpy(), src.numpy(), o.numpy())
            _scatter(part, out, o)

    def _stage(self, slot: int, rows: int, width: int,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Pinned staging buffers of a slot: gathered source rows and returned output rows."""
        while len(self._staging) <= slot:
            self._staging.append(None)  # type: ignore[arg-type]
        region = self._staging[slot]
        itemsize = torch.empty(0, dtype=dtype).element_size()
        need = 2 * max(rows, 1) * width * itemsize
        if region is None or region.freed or region.nbytes < need:
            if region is not None and not region.freed:
                region.free()
            region = self.memory.allocate(need, torch.uint8, Tier.PINNED, owner=self.owner + ".staging")
            self._staging[slot] = region
        t = region.tensor()
        half = need // 2
        return (t[:half].view(dtype).view(-1, width), t[half:need].view(dtype).view(-1, width))

    def _multiply_cuda(self, plan, h, out, src, arenas, c) -> None:  # pragma: no cover - needs CUDA
        """Copy, compute and copy-back streams with events: copies of partition k+1 overlap the product of k.

        Slot s's buffers are reused by partition k+2 only after partition k's output is back on the
        host (``drain``: its event implies k's loads and product finished too).
        """
        copy, compute, back_stream = self._copy_stream, self._compute_stream, self._back_stream
        d = h.shape[1]
        rows_max = max(plan.max_stream, plan.max_rows, c)
        stages = [self._stage(s, rows_max, d, h.dtype) for s in range(2)]
        loaded = [torch.cuda.Event() for _ in range(2)]
        computed = [torch.cuda.Event() for _ in range(2)]
        returned = [torch.cuda.Event() for _ in range(2)]
        copy.wait_stream(torch.cuda.current_stream(self.device))
        _zero_split(plan, out)
        if c:
            gather, _ = stages[0]
            torch.index_select(h, 0, torch.from_numpy(plan.cache), out=gather[:c])
            with torch.cuda.stream(copy):
                src[:c].copy_(gather[:c], non_blocking=True)
            cache_done = torch.cuda.Event()
            cache_done.record(copy)
            cache_done.synchronize()  # the staging buffer is reused below
        pending: list[tuple[int, object]] = []

        def drain(slot: int) -> None:
            for i, (s, part) in enumerate(pending):
                if s == slot:
                    returned[s].synchronize()
                    _, back = stages[s]
                    _scatter(part, out, back[:part.rows.shape[0]])
                    pending.pop(i)
                    return

        for part in plan.parts:
            s = part.slot
            drain(s)  # the slot's previous output is on the host, its staging buffer free again
            indptr, cols, weights, out_rows = _part_views(arenas[s], plan, part, h.dtype, d)
            gather, back = stages[s]
            r, e, n_s = part.rows.shape[0], part.cols.shape[0], part.stream.shape[0]
            lo = c + s * plan.max_stream
            if n_s:
                torch.index_select(h, 0, torch.from_numpy(part.stream), out=gather[:n_s])
            with torch.cuda.stream(copy):
                copy.wait_event(computed[s])  # the slot's previous product has read its buffers
                if n_s:
                    src[lo:lo + n_s].copy_(gather[:n_s], non_blocking=True)
                p_indptr, p_cols, p_weights = _pinned_structure(part)
                indptr[:r + 1].copy_(p_indptr, non_blocking=True)
                cols[:e].copy_(p_cols, non_blocking=True)
                weights[:e].copy_(p_weights, non_blocking=True)
                loaded[s].record(copy)
            with torch.cuda.stream(compute):
                compute.wait_event(loaded[s])
                # torch wants row pointer and columns of one dtype: int32 (a partition has < 2**31 entries)
                mat = torch.sparse_csr_tensor(indptr[:r + 1].to(torch.int32), cols[:e],
                                              weights[:e].to(h.dtype), size=(r, src.shape[0]))
                out_rows[:r].copy_(torch.sparse.mm(mat, src))
                computed[s].record(compute)
            with torch.cuda.stream(back_stream):
                back_stream.wait_event(computed[s])
                back[:r].copy_(out_rows[:r], non_blocking=True)
                returned[s].record(back_stream)
            pending.append((s, part))
        while pending:
            drain(pending[0][0])



def _pinned_structure(part) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # pragma: no cover - CUDA
    """The part's local CSR as pinned host tensors (made once, kept on the part for later calls)."""
    if part.pinned is None:
        part.pinned = tuple(torch.from_numpy(a).pin_memory() for a in (part.indptr, part.cols, part.weights))
    return part.pinned


def _zero_split(plan: PartitionPlan, out: torch.Tensor) -> None:
    """Zero the output rows that split partitions add their pieces to."""
    if plan.split_rows.shape[0]:
        out.index_fill_(0, torch.from_numpy(plan.split_rows), 0)


def _scatter(part, out: torch.Tensor, rows_out: torch.Tensor) -> None:
    """Write a partition's output rows into the host output (pieces of split rows are added)."""
    rows = torch.from_numpy(part.rows)
    if part.add is None:
        out.index_copy_(0, rows, rows_out)
        return
    add = torch.from_numpy(part.add)
    out.index_copy_(0, rows[~add], rows_out[~add])
    out.index_add_(0, rows[add], rows_out[add])

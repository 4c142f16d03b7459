"""The host path of a `samplers.full_graph.FullGraph`: zero-copy partitions of P within a byte cap.

A propagation ``out = M @ h`` (M: the normalised adjacency or its transpose, an `Operator` in CSR by
destination row) reads source rows in place from the host vertex data ``h`` (zero-copy, as a GPU kernel
reads pinned memory through UVA; docs/architecture.md#memory-tiers), so a partition's working set holds
only its rows of M and its output rows, and its size does not depend on how many distinct sources it
touches. `greedy_bounds` cuts the rows into maximal consecutive partitions whose working set fits a cap:
a partition of r rows and e entries needs ``8 (r + 1) + (s + 4) e + r d b`` bytes (s: index size, b:
feature itemsize) plus ``SLACK`` (192) bytes of alignment. `HostExecutor` holds that working set (one
region of the memory manager's ``device`` tier, reused by every partition) and runs the partitions
through `graphrl.kernels.spmm.spmm_partition` (numba: parallel over chunks of destination rows, each
row summed in a fixed order, so results are bitwise the same for any number of threads).

The staged path (data moved the way a GPU needs it) plans with `samplers.full_graph_plan` and runs with
`samplers.full_graph_stream`. See docs/architecture.md#full-graph-propagation.

References
----------
Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024 (host-resident
vertex data, partitions streamed through the device).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch

from graphrl.kernels.spmm import spmm_partition
from graphrl.memory import MemoryBudgetError, MemoryManager, Region, Tier, free_quietly
from samplers.full_graph_adjacency import Operator
from samplers.full_graph_bytes import ALIGN, csr_offsets

__all__ = ["SLACK", "HostExecutor", "greedy_bounds", "working_set_layout"]

SLACK = 3 * ALIGN  # alignment padding of the four arrays of a partition's working set


@nb.njit(nogil=True, cache=True)
def greedy_bounds(indptr, edge_bytes, row_bytes, cap):  # pragma: no cover - compiled
    """Cut rows into maximal consecutive partitions of cost <= cap.

    Parameters
    ----------
    indptr : numpy.ndarray, int64, shape [N + 1]
        Row pointer of the matrix.
    edge_bytes, row_bytes, cap : int
        Bytes per entry (index and float32 weight), per row (row pointer entry and output row) and the
        most bytes of one partition's working set (``8 + SLACK`` of it fixed).

    Returns
    -------
    (numpy.ndarray, int64, shape [P + 1], int)
        ``(bounds, -1)``, ``0 = bounds[0] < ... < bounds[P] = N``; or ``(empty, r)`` when row r alone
        exceeds ``cap``.
    """
    n = indptr.shape[0] - 1
    bounds = np.empty(n + 1, np.int64)
    bounds[0] = 0
    k = 0
    r0 = 0
    while r0 < n:
        cost = 8 + SLACK  # the row pointer's extra entry and the alignment
        r = r0
        while r < n:
            c = row_bytes + edge_bytes * (indptr[r + 1] - indptr[r])
            if cost + c > cap:
                break
            cost += c
            r += 1
        if r == r0:
            return bounds[:0], r0
        k += 1
        bounds[k] = r
        r0 = r
    return bounds[: k + 1], -1


def working_set_layout(rows: int, entries: int, index_bytes: int,
                       row_bytes: int) -> tuple[int, int, int, int]:
    """Byte offsets of a partition's indices, weights and output rows in the working set, and its size.

    The staged path's layout (`samplers.full_graph_bytes.csr_offsets`), its end not padded: nothing
    follows the output rows.

    Parameters
    ----------
    rows, entries : int
        The partition's rows and entries.
    index_bytes, row_bytes : int
        Bytes of one column index (4 or 8) and of one output row (width x itemsize).

    Returns
    -------
    (int, int, int, int)
        Offsets (bytes) of the indices, the float32 weights and the output rows (the int64 row pointer
        is at 0), and the working set's size in bytes (at least 1).
    """
    _, o_ind, o_w, o_out, end = csr_offsets(rows, entries, index_bytes, row_bytes)
    return o_ind, o_w, o_out, max(end, 1)


class HostExecutor:
    """Runs the host path's partitions of an `Operator` through one working set on the device tier.

    The working set is one region of ``memory``'s ``device`` tier (owner ``owner``), kept across calls
    and allocated again only when a call needs more than it holds or it exceeds that call's cap.

    Parameters
    ----------
    memory : MemoryManager
    owner : str
        The working set's owner in ``memory``'s statistics.
    """

    def __init__(self, memory: MemoryManager, owner: str) -> None:
        self.memory = memory
        self.owner = owner
        self._work: Region | None = None

    @property
    def working_bytes(self) -> int:
        """Bytes of the working set held on the device tier now (0 when released)."""
        return self._work.nbytes if self._work is not None and not self._work.freed else 0

    def release(self) -> None:
        """Free the working set now (the next `run` allocates it again)."""
        if self._work is not None:
            free_quietly(self._work)
            self._work = None

    def bounds(self, op: Operator, width: int, itemsize: int, cap: int, which: str = "destination",
               partition_bytes: int | None = None) -> np.ndarray:
        """Row boundaries of the partitions of ``op`` for ``width`` features of ``itemsize`` bytes.

        Parameters
        ----------
        op : Operator
            The matrix (N rows).
        width, itemsize : int
            Feature width d and bytes per feature.
        cap : int
            Most bytes of one partition's working set.
        which : str
            What a row of ``op`` is (``"destination"`` or ``"source"``), for the error message.
        partition_bytes : int or None
            The caller's setting, named in the error message.

        Returns
        -------
        numpy.ndarray, int64, shape [P + 1]
            ``0 = b[0] < b[1] < ... < b[P] = N`` (`greedy_bounds`).

        Raises
        ------
        MemoryBudgetError
            One row alone needs more than ``cap`` (the message says how much would do).
        """
        edge_bytes = op.indices.dtype.itemsize + 4
        row_bytes = 8 + width * itemsize
        bounds, bad = greedy_bounds(op.indptr, np.int64(edge_bytes), np.int64(row_bytes), np.int64(cap))
        if bad >= 0:
            degrees = np.diff(op.indptr)
            need = 16 + SLACK + row_bytes + edge_bytes * int(degrees.max())
            mm = self.memory
            raise MemoryBudgetError(  # the tier's free bytes (partition_bytes is in the note)
                Tier.DEVICE, self.owner, need, mm.free_bytes(Tier.DEVICE), mm.budget(Tier.DEVICE),
                note=f"one partition cannot fit: {which} row {int(bad)} ({int(degrees[bad])} entries) at "
                     f"feature width {width} x {itemsize} B needs more than the {cap} bytes allowed "
                     f"(partition_bytes={partition_bytes}, device tier free bytes included); "
                     f"partition_bytes and free device memory of at least {need} bytes fit every row "
                     "at this width")
        return bounds

    def _working_set(self, nbytes: int, cap: int) -> np.ndarray:
        ws = self._work
        if ws is not None and (ws.nbytes < nbytes or ws.nbytes > cap):
            self.release()
            ws = None
        if ws is None:
            try:
                ws = self.memory.allocate(nbytes, torch.uint8, Tier.DEVICE, owner=self.owner)
            except MemoryBudgetError as err:
                raise MemoryBudgetError(
                    err.tier, err.owner, err.asked, err.free, err.budget, err.attempts,
                    note=f"the largest partition needs {nbytes} bytes of the device tier; free device "
                         "memory or raise its budget by the shortfall, or lower partition_bytes") from err
            self._work = ws
        return ws.numpy()

    def run(self, op: Operator, bounds: np.ndarray, h: torch.Tensor, out: torch.Tensor, cap: int,
            threads: int) -> None:
        """``out = op @ h``, partition by partition (``bounds``), through the working set.

        Parameters
        ----------
        op : Operator
            The matrix (N x N).
        bounds : numpy.ndarray, int64, shape [P + 1]
            Partition boundaries (`bounds`), at least one partition.
        h : torch.Tensor, float32 or float64, shape [N, d], contiguous, on the CPU
        out : torch.Tensor, dtype of ``h``, shape [N, d], contiguous, on the CPU
        cap : int
            Most bytes of the working set (a larger one held is freed first).
        threads : int
            Threads of the product.

        Raises
        ------
        MemoryBudgetError
            The device tier has no room for the largest partition's working set.
        """
        d, itemsize = h.shape[1], h.element_size()
        row_bytes = d * itemsize
        index_bytes = op.indices.dtype.itemsize
        np_dtype = h.numpy().dtype

        def layout(i: int) -> tuple[int, int, int, int]:
            r0, r1 = int(bounds[i]), int(bounds[i + 1])
            return working_set_layout(r1 - r0, int(op.indptr[r1] - op.indptr[r0]), index_bytes, row_bytes)

        buf = self._working_set(max(layout(i)[-1] for i in range(bounds.shape[0] - 1)), cap)
        h_np, out_np = h.numpy(), out.numpy()
        for i in range(bounds.shape[0] - 1):
            r0, r1 = int(bounds[i]), int(bounds[i + 1])
            o_ind, o_w, o_out, _ = layout(i)
            rows, e = r1 - r0, int(op.indptr[r1] - op.indptr[r0])
            ws_indptr = buf[:8 * (rows + 1)].view(np.int64)
            ws_indices = buf[o_ind:o_ind + e * index_bytes].view(op.indices.dtype)
            ws_weights = buf[o_w:o_w + 4 * e].view(np.float32)
            ws_out = buf[o_out:o_out + rows * row_bytes].view(np_dtype).reshape(rows, d)
            spmm_partition(op.indptr, op.indices, op.weights, h_np, out_np, r0, r1, ws_indptr,
                           ws_indices, ws_weights, ws_out, threads)

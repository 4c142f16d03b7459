"""Per-edge arrays in CSC order, and the arrays a sampling step hands over, for the samplers.

`csc_weights` and `csc_times` check a tensor given by edge id and put it in CSC order (the order the
kernels read); `edge_pairs` packs each edge's source and edge id side by side for the CPU gather;
`excluded_positions` turns excluded edge ids into sorted CSC positions through
`inverse_permutation` of the graph's edge ids; `blocks_dst_count` and `cuda_to_torch` turn a layer's
output (numpy, torch or numba device arrays) into what a block holds. See
docs/architecture.md#graph-storage for the CSC layout and docs/architecture.md#sampling-rules for
what exclusion, weights and times mean.
"""

from __future__ import annotations

import numpy as np
import torch

from graphrl.kernels import advise_huge_pages
from samplers._checks import check_int64_range, check_seeds, edge_array

__all__ = ["PAIR_HUGE_BYTES", "PAIR_LIMIT", "blocks_dst_count", "csc_times", "csc_weights", "cuda_to_torch",
           "edge_pairs", "excluded_positions", "inverse_permutation"]

PAIR_LIMIT = 1 << 31
"""`edge_pairs` packs relations of fewer edges than this and at most this many source nodes (int32 ids)."""
PAIR_HUGE_BYTES = 32 << 20
"""`edge_pairs` puts pair arrays of at least this many bytes on transparent huge pages (read at random: on
4 KiB pages nearly every read of a large array misses the TLB)."""


def edge_pairs(indices: np.ndarray, edge_ids: np.ndarray | None, num_src: int) -> np.ndarray | None:
    """Each CSC position's source and edge id side by side, ``[src_0, eid_0, src_1, eid_1, ...]``, for the
    CPU gather.

    The CPU kernels' gather (`samplers.kernels.cpu.uniform.gather_edges`) reads the source and the edge
    id of every chosen position, at random: from this one array that is one cache line per edge, where
    ``indices`` and ``edge_ids`` cost two (docs/performance.md, "Why Gowalla's margin is smaller"). It is
    a copy: 8 bytes per edge beside the graph's own arrays, which stay as they are.

    Parameters
    ----------
    indices : numpy.ndarray, int32 or int64, shape [E]
        Source of each CSC position, in [0, num_src).
    edge_ids : numpy.ndarray or None, int64, shape [E]
        Edge id of each CSC position, in [0, E); None when ids are the positions.
    num_src : int
        Nodes of the source type.

    Returns
    -------
    numpy.ndarray, int32, shape [2E], or None
        None when the gather gains nothing from it: edge ids are the positions (the gather then reads
        ``indices`` alone), or ``E`` or ``num_src`` reaches `PAIR_LIMIT` (2**31: int32 cannot hold
        the ids; the gather then reads ``indices`` and ``edge_ids``).
    """
    num = int(indices.shape[0])
    if edge_ids is None or num >= PAIR_LIMIT or int(num_src) > PAIR_LIMIT:
        return None
    pairs = np.empty(2 * num, dtype=np.int32)
    if pairs.nbytes >= PAIR_HUGE_BYTES:
        advise_huge_pages(pairs.ctypes.data, pairs.nbytes)  # before the first write: faulted in huge
    pairs[0::2] = indices
    pairs[1::2] = edge_ids
    return pairs


def csc_weights(name: str, weights, num_edges: int, csc_eids: np.ndarray) -> np.ndarray:
    """Sampling weights given by edge id, checked and put in CSC order: float32 [E].

    Parameters
    ----------
    name : str
        Argument name for messages (``"weights"``, or ``"weights[('user', 'clicks', 'item')]"``).
    weights : torch.Tensor or array-like, float or integer, shape [E]
        One weight per edge, indexed by edge id.
    num_edges : int
    csc_eids : numpy.ndarray, int64, shape [E]
        The edge id at each CSC position.

    Raises
    ------
    ValueError
        Wrong shape; a negative, NaN or infinite weight; a weight float32 cannot hold (above 3.4e38, or
        positive below 1.4e-45: it would become inf or 0).
    TypeError
        Not numeric.
    """
    arr = edge_array(name, weights, num_edges).astype(np.float64, copy=False)
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        first = float(arr[np.argmax(bad)])
        raise ValueError(f"{name}: {int(bad.sum())} of {arr.size} weights are negative, NaN or "
                         f"infinite, first {first}; weights must be finite and >= 0")
    with np.errstate(over="ignore", under="ignore"):
        single = arr.astype(np.float32)
    lost = ~np.isfinite(single) | ((single == 0) & (arr > 0))  # beyond float32, or below its smallest
    if lost.any():
        first = float(arr[np.argmax(lost)])
        raise ValueError(f"{name}: {int(lost.sum())} of {arr.size} weights do not fit float32 (the kernels' "
                         f"weight type), first {first}; rescale them into [1.4e-45, 3.4e38] (only ratios "
                         "within a row matter)")
    return np.ascontiguousarray(single[csc_eids])


def csc_times(name: str, edge_times, num_edges: int, csc_eids: np.ndarray, dtype=None) -> np.ndarray:
    """Edge times given by edge id, checked and put in CSC order: int64 for integer times, float64 for
    float times (or ``dtype`` when given).

    Raises
    ------
    ValueError
        Wrong shape; a NaN time; an unsigned integer time above 2**63 - 1 (integer times are int64).
    TypeError
        Not numeric.
    """
    arr = edge_array(name, edge_times, num_edges)
    if np.issubdtype(arr.dtype, np.floating) or arr.size == 0 and arr.dtype == np.float64:
        arr = arr.astype(np.float64, copy=False)
        if np.isnan(arr).any():
            raise ValueError(f"{name}: {int(np.isnan(arr).sum())} of {arr.size} times are NaN")
    else:
        check_int64_range(name, arr, "times")
        arr = arr.astype(np.int64, copy=False)
    if dtype is not None:
        arr = arr.astype(dtype, copy=False)
    return np.ascontiguousarray(arr[csc_eids])


def excluded_positions(name: str, exclude_eids, num_edges: int, eid_to_pos) -> np.ndarray | None:
    """Edge ids to exclude, checked, as sorted distinct CSC positions (None when there are none).

    Parameters
    ----------
    eid_to_pos : callable () -> numpy.ndarray or None
        Returns the inverse of the edge-id permutation (None: edge ids are CSC positions); called only
        when there are edges to exclude.

    Raises
    ------
    ValueError, TypeError
        As `check_seeds`, for ids outside [0, num_edges).
    """
    if exclude_eids is None:
        return None
    eids = check_seeds(exclude_eids, num_edges, name=name, bound="num_edges")
    if eids.size == 0:
        return None
    inv = eid_to_pos()
    pos = eids if inv is None else inv[eids]
    return np.unique(pos).astype(np.int64, copy=False)


def inverse_permutation(perm: np.ndarray) -> np.ndarray:
    """The inverse of a permutation of 0..E-1 (int32 below 2^31 entries, else int64)."""
    num = perm.shape[0]
    inv = np.empty(num, dtype=np.int32 if num <= np.iinfo(np.int32).max else np.int64)
    inv[perm] = np.arange(num, dtype=inv.dtype)
    return inv


def blocks_dst_count(dst) -> int:
    """Length of a 1-D id array (numpy, torch or numba device array)."""
    return int(dst.shape[0])


def cuda_to_torch(arr) -> torch.Tensor:
    """A numba device array as a torch tensor: a zero-copy CUDA tensor when torch has CUDA, else a host
    copy (the CUDA simulator, or a CPU-only torch build)."""
    if torch.cuda.is_available():
        return torch.as_tensor(arr, device="cuda")
    return torch.from_numpy(np.ascontiguousarray(arr.copy_to_host()))

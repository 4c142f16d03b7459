"""Per-edge arrays in CSC order, and the arrays a sampling step hands over, for the samplers.

`csc_weights` and `csc_times` check a tensor given by edge id and put it in CSC order (the order the
kernels read); `edge_pairs` packs each edge's source and edge id side by side for the CPU gather;
`share_loop` and `attach_derived` carry a CPU loop's weights, times and derived arrays (`DERIVED`: those
pairs and the weighted rows' prefix sums) through pickling in shared memory, built once per host
(`pickle_loop` and `unpickle_loop`: a sampler's `__getstate__` and `__setstate__` steps), and
`held_derived` hands them to another loop over the same rows; `excluded_positions` turns excluded edge
ids into sorted CSC positions through `inverse_permutation` of the graph's edge ids; `blocks_dst_count`
and `cuda_to_torch` turn a layer's output (numpy, torch or numba device arrays) into what a block holds.
See docs/architecture.md#graph-storage for the CSC layout and docs/architecture.md#sampling-rules for
what exclusion, weights and times mean.
"""

from __future__ import annotations

import numpy as np
import torch

from graphrl.kernels import advise_huge_pages
from samplers._checks import check_int64_range, check_seeds, edge_array
from samplers.feature_table import HUGE_TABLE_BYTES

__all__ = ["DERIVED", "INPUTS", "PAIR_LIMIT", "SHARED", "attach_derived", "blocks_dst_count",
           "csc_times", "csc_weights", "cuda_to_torch", "edge_pairs", "excluded_positions", "held_derived",
           "inverse_permutation", "pickle_loop", "share_loop", "unpickle_loop"]

PAIR_LIMIT = 1 << 31
"""`edge_pairs` packs relations of fewer edges than this and at most this many source nodes (int32 ids)."""


def edge_pairs(indices: np.ndarray, edge_ids: np.ndarray | None, num_src: int) -> np.ndarray | None:
    """Each CSC position's source and edge id side by side, ``[src_0, eid_0, src_1, eid_1, ...]``, for the
    CPU gather.

    The CPU kernels' gather (`samplers.kernels.cpu.uniform.gather_edges`) reads the source and the edge
    id of every chosen position, at random: from this one array that is one cache line per edge, where
    ``indices`` and ``edge_ids`` cost two (docs/performance.md, "Why Gowalla's margin is smaller"). It is
    a copy: 8 bytes per edge beside the graph's own arrays, which stay as they are; on transparent huge
    pages from `samplers.feature_table.HUGE_TABLE_BYTES` (32 MiB) up.

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
        ``indices`` alone), or ``E`` reaches `PAIR_LIMIT` or ``num_src`` exceeds it (2**31: int32
        cannot hold the ids; the gather then reads ``indices`` and ``edge_ids``).
    """
    num = int(indices.shape[0])
    if edge_ids is None or num >= PAIR_LIMIT or int(num_src) > PAIR_LIMIT:
        return None
    pairs = np.empty(2 * num, dtype=np.int32)
    if pairs.nbytes >= HUGE_TABLE_BYTES:  # read at random: on 4 KiB pages nearly every read misses the TLB
        advise_huge_pages(pairs.ctypes.data, pairs.nbytes)  # before the first write: faulted in huge
    pairs[0::2] = indices
    pairs[1::2] = edge_ids
    return pairs


DERIVED = {"pairs": (torch.int32, 2, 0), "prefix": (torch.float64, 1, 0), "positive": (torch.int64, 0, 1)}
"""A CPU relation's arrays derived from its CSC (fields of `samplers.modes.RelationArrays`), each with
its dtype and length ``a * E + b * N_dst``: ``pairs`` (`edge_pairs`, int32 [2E]), the weighted rows'
prefix sums ``prefix`` (float64 [E]) and positive counts ``positive`` (int64 [N_dst])
(`samplers.kernels.cpu.weight_prefix`)."""


def held_derived(relation) -> dict[str, np.ndarray]:
    """The `DERIVED` arrays a `samplers.modes.RelationArrays` holds (those built), by name: handed to
    another relation over the same rows (``RelationArrays(..., **held)``), it builds none of them again."""
    return {name: getattr(relation, name) for name in DERIVED if getattr(relation, name) is not None}


SHARED = ("weights", "times", *DERIVED)
"""What `share_loop` puts in shared memory: a CPU relation's weights, times and `DERIVED` arrays."""


def share_loop(loop) -> dict:
    """A CPU layer loop's per-edge arrays (each relation's `SHARED`: weights, times, `DERIVED`) as tensors
    in shared memory, by relation and name, for a sampler's pickled state: unpickled by torch's
    multiprocessing pickler (a spawned ``DataLoader`` worker, ``mp.spawn``), they attach that memory,
    and `attach_derived` hands the derived ones to the new sampler's relations.

    The first call moves each array into shared memory, points the relation at the shared copy and
    prepares the modes' states again over it (`samplers.modes.Mode.prepare`; nothing is recomputed), so
    this process's private copies are freed; later calls, here or in a process that unpickled the
    sampler, return the same memory. A sampler's pairs therefore take 8 bytes per edge, and its prefix
    sums 8 per edge and per row, once per host, however many processes sample with it (on 4 KiB pages:
    shared memory gets no transparent huge pages). The tensors stay alive with the loop, as a spawned
    process's start needs (it is handed their file descriptors after the pickling).

    Parameters
    ----------
    loop : samplers.layers.LayerLoop
        A CPU loop: its ``relations`` (`samplers.modes.RelationArrays`), ``modes`` and ``states``.
    """
    out, moved = {}, False
    for rel, relation in loop.relations.items():
        out[rel] = {}
        for name in SHARED:
            arr = getattr(relation, name)
            if arr is None:
                continue
            base = arr.base
            if not (isinstance(base, torch.Tensor) and base.is_shared() and base.data_ptr() == arr.ctypes.data
                    and base.numel() == arr.size and base.is_contiguous()):
                base = torch.from_numpy(np.ascontiguousarray(arr)).share_memory_()
                setattr(relation, name, base.numpy())
                moved = True
            out[rel][name] = base
    if moved:
        loop.states = {rel: loop.modes[rel].prepare(arr, "cpu") for rel, arr in loop.relations.items()}
    return out


INPUTS = ("weights", "times")
"""The sampler's own per-edge arrays among `SHARED` (the others are `DERIVED` from the CSC)."""


def pickle_loop(loop) -> tuple[dict, dict[str, dict]]:
    """A CPU sampler's `__getstate__` step: `share_loop` of its layer loop, and where the sampler's own
    weights and times must point from now on.

    Returns
    -------
    shared : dict
        By relation, name -> tensor in shared memory (`SHARED`); the pickled state holds it as is, and
        `unpickle_loop` takes it apart in the copy.
    inputs : dict
        ``{"weights": {relation: numpy}, "times": {relation: numpy}}`` (`INPUTS`; relations that hold
        them): the loop's views of the shared copies. The sampler replaces its own references with these,
        so this process keeps no private copy (the weights and times are shared like the graph's tensors).
    """
    shared = share_loop(loop)
    inputs = {name: {rel: getattr(arr, name) for rel, arr in loop.relations.items()
                     if getattr(arr, name) is not None} for name in INPUTS}
    return shared, inputs


def unpickle_loop(shared: dict) -> tuple[dict[str, dict], dict]:
    """A CPU sampler's `__setstate__` step: `pickle_loop`'s ``shared`` (unpickled) taken apart into the
    sampler's weights and times and each relation's derived tensors.

    Returns
    -------
    inputs : dict
        ``{"weights": {relation: numpy}, "times": {relation: numpy}}``: views of the shared memory (no
        copy), as `pickle_loop` returns them.
    derived : dict
        By relation, name -> tensor: the rest, for `attach_derived` (which checks them against the graph).

    Raises
    ------
    ValueError
        A weight or time array that is not a contiguous CPU tensor.
    """
    inputs: dict[str, dict] = {name: {} for name in INPUTS}
    derived = {}
    for rel, tensors in shared.items():
        rest = dict(tensors)
        for name in INPUTS:
            tensor = rest.pop(name, None)
            if tensor is None:
                continue
            if (not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu"
                    or not tensor.is_contiguous()):
                raise ValueError(f"_shared[{rel!r}][{name!r}]: expected a contiguous CPU tensor, got "
                                 f"{type(tensor).__name__}")
            inputs[name][rel] = tensor.numpy()
        derived[rel] = rest
    return inputs, derived


def attach_derived(name: str, shared, indices: np.ndarray, edge_ids: np.ndarray | None,
                   num_dst: int) -> dict[str, np.ndarray]:
    """`share_loop`'s derived tensors of one relation (unpickled) checked, as numpy views by name (no
    copy): the keyword arguments of `samplers.modes.RelationArrays` for a relation of ``num_dst`` rows
    whose CSC holds ``indices`` and ``edge_ids`` ([E] each; None: ids are the positions), whose loop then
    builds none of them. ``shared`` None (or empty): nothing handed in. Checked: each array's dtype and
    length, and the pairs against ``indices`` and ``edge_ids`` at 64 positions spread over the CSC.

    Raises
    ------
    ValueError
        ``shared`` holds a name outside `DERIVED`, an array that is not a contiguous CPU tensor of its
        dtype and length, or pairs where the graph has no edge ids or that differ from its CSC at a
        probed position (a state that does not belong to this graph).
    """
    num_edges = int(indices.shape[0])
    out = {}
    for key, tensor in (shared or {}).items():
        if key not in DERIVED:
            raise ValueError(f"{name}: unknown derived array {key!r}, expected one of {sorted(DERIVED)}")
        dtype, per_edge, per_row = DERIVED[key]
        length = per_edge * num_edges + per_row * int(num_dst)
        if (not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or tensor.dtype != dtype
                or tuple(tensor.shape) != (length,) or not tensor.is_contiguous()):
            got = (f"{tensor.dtype} {tuple(tensor.shape)} on {tensor.device}"
                   if isinstance(tensor, torch.Tensor) else type(tensor).__name__)
            raise ValueError(f"{name}[{key!r}]: expected a contiguous CPU {dtype} tensor of shape "
                             f"({length},) for {num_edges} edges and {num_dst} rows, got {got}")
        out[key] = tensor.numpy()
    if "pairs" in out:
        _check_pairs(f"{name}['pairs']", out["pairs"], indices, edge_ids)
    return out


_PAIR_PROBES = 64  # positions, spread over the CSC, where attach_derived compares pairs with the graph


def _check_pairs(name: str, pairs: np.ndarray, indices: np.ndarray, edge_ids: np.ndarray | None) -> None:
    """Raise ValueError unless ``pairs`` could be `edge_pairs` of this CSC (probed, not read whole)."""
    if edge_ids is None:
        raise ValueError(f"{name}: the graph has no edge ids, so it takes no pairs (edge_pairs builds none)")
    num = indices.shape[0]
    at = np.unique(np.linspace(0, num - 1, min(num, _PAIR_PROBES)).astype(np.int64))
    bad = (pairs[2 * at] != indices[at]) | (pairs[2 * at + 1] != edge_ids[at])
    if bad.any():
        pos = int(at[np.argmax(bad)])
        raise ValueError(f"{name}: position {pos} holds ({pairs[2 * pos]}, {pairs[2 * pos + 1]}) where "
                         f"the graph has source {indices[pos]} and edge id {edge_ids[pos]}: pairs of another "
                         "graph")


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

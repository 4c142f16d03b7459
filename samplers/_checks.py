"""Argument checks the samplers share, at their public boundary (kernels trust what passes them).

`check_seeds` (node or edge ids), `id_array` / `id_vector` (ids of any shape / 1-D, unbounded but for int64),
`check_id_dtype` / `check_id_range` (the one dtype / range rule of ids), `check_seed_times`,
`check_int64_range`, `edge_array` (a per-edge tensor), `check_seed_and_replace`, `check_seed`, `check_device`,
`require_gpu`, `check_int`, `check_fanouts`, `check_layer_fanouts`, `check_prefetch`, `check_open`,
`check_regions`, `check_relation_dict` and `check_relation_fanouts` raise the project's errors
(docs/architecture.md#errors): ``TypeError`` for a bad type, ``ValueError`` for a bad value,
`graphrl.GPUUnavailableError` for a GPU asked for and absent, each message naming the argument, summarising
the bad values and, where there is one, the remedy.

Bounds of the integers that reach a kernel: `MAX_FANOUT` (a fanout, a number of negatives) and
`MAX_BATCH` (seeds per batch) are 2**31 - 1, the largest local id of a block (the kernels relabel to
int32), so that a layer's edge count (batch x fanout < 2**62) never overflows the kernels' int64
offsets; an RNG ``seed`` is a uint64 (`SEED_LIMIT` = 2**64, exclusive).

>>> dst = check_seeds(seeds, graph.num_nodes)          # int64 numpy [B], or raises
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from graphrl.errors import GPUUnavailableError

__all__ = ["MAX_BATCH", "MAX_FANOUT", "MAX_NODES", "SEED_LIMIT", "check_device", "check_fanouts",
           "check_id_dtype", "check_id_range", "check_int", "check_int64_range", "check_layer_fanouts",
           "check_open", "check_prefetch", "check_regions", "check_relation_dict", "check_relation_fanouts",
           "check_seed", "check_seed_and_replace", "check_seed_times", "check_seeds", "edge_array",
           "id_array", "id_vector", "require_gpu"]

MAX_FANOUT = 2**31 - 1
"""Largest fanout (and number of negatives per pair): the largest int32 local id of a block."""
MAX_BATCH = 2**31 - 1
"""Most seeds (destination rows) per batch: the kernels relabel them to int32 local ids."""
SEED_LIMIT = 2**64
"""RNG seeds are in [0, SEED_LIMIT): the kernels derive their streams from a uint64 (splitmix64)."""
MAX_NODES = 2**63 - 1
"""Most nodes of a graph (of a node type): node ids and ``indptr`` are int64."""


def _host_ids(name: str, value) -> np.ndarray:
    """``value`` (a tensor or array-like of integer ids, any shape) as a host numpy array in its own integer
    dtype (not yet cast: a uint64 id is compared and reported as given); an empty ``np.asarray([])``
    (float64) counts as empty ids. TypeError for non-integers, ValueError for a device whose values cannot be
    read, each naming ``name`` (`check_id_dtype`)."""
    if isinstance(value, torch.Tensor):
        check_id_dtype(name, value.dtype)
        if value.device.type == "cpu":
            return value.numpy()  # integers carry no grad
        try:
            return value.cpu().numpy()
        except (NotImplementedError, RuntimeError) as err:  # meta tensors hold no values to read
            raise ValueError(f"{name} is on device {str(value.device)!r}, which the sampler cannot read "
                             f"({type(err).__name__}: {str(err).splitlines()[0][:120]}); give {name} on "
                             f"the CPU or a CUDA device") from None
    arr = np.asarray(value)
    if arr.size == 0 and arr.dtype == np.float64:  # np.asarray([]) is float64: treat as empty ids
        return arr.astype(np.int64)
    check_id_dtype(name, arr.dtype)
    return arr


def check_id_dtype(name: str, dtype: torch.dtype | np.dtype) -> None:
    """The dtype rule of every id tensor or array a sampler takes: TypeError naming ``name`` and the dtype
    unless an integer dtype other than uint8, torch's or numpy's: torch indexing reads uint8 as a mask, PyG
    as ids, so ``train_mask.numpy().astype(numpy.uint8)`` would be ids 0 and 1. The message gives remedies."""
    if isinstance(dtype, torch.dtype):
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got dtype {dtype}")
        shown, fixes, uint8 = str(dtype), (f"{name}.bool()", f"{name}.long()"), dtype == torch.uint8
    elif not np.issubdtype(dtype := np.dtype(dtype), np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {dtype}")
    else:
        shown, fixes = f"numpy.{dtype}", (f"{name}.astype(bool)", f"{name}.astype(numpy.int64)")
        uint8 = dtype == np.uint8
    if uint8:
        raise TypeError(f"{name} has dtype {shown}, read as a mask by torch indexing but as ids by PyG: "
                        f"pass {fixes[0]} for a mask, or {fixes[1]} for ids")


def check_id_range(name: str, arr: np.ndarray, lo: int, hi: int, what: str | None = None, *,
                   interval: str | None = None) -> None:
    """Raise unless every id of ``arr`` lies in ``[lo, hi)``, compared in the ids' own dtype (the one range
    rule of node, edge and pair ids: `check_seeds`, the link samplers).

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    arr : numpy.ndarray, integer, any shape
        The ids (a uint64 id above 2**63 - 1 is reported as given, not as its int64 wrap).
    lo, hi : int
        The ids' range, ``[lo, hi)``.
    what : str or None
        The bound in words, after the interval: ``"num_nodes=70839"`` gives ``[0, 70839) (num_nodes=70839)``.
    interval : str or None
        The interval in words instead (``"[0, num_nodes=70839)"``, `check_seeds`' wording).

    Raises
    ------
    ValueError
        An id outside the range: ``"{name}: 3 of 1024 ids outside [0, 70839) (num_nodes=70839), first
        70840"``.
    """
    if arr.size == 0 or (arr.min() >= lo and arr.max() < hi):
        return
    if interval is None:
        interval = f"[{lo}, {hi})" + (f" ({what})" if what else "")
    bad = (arr < lo) | (arr >= hi)
    raise ValueError(f"{name}: {int(bad.sum())} of {arr.size} ids outside {interval}, "
                     f"first {int(arr.reshape(-1)[np.argmax(bad.reshape(-1))])}")


def id_array(name: str, value) -> np.ndarray:
    """Integer ids of any shape (a tensor on any readable device, or array-like) as a contiguous int64 numpy
    array, unbounded but for int64 (`is_positive`'s pairs, any shape).

    Parameters
    ----------
    name : str
        The argument's name, for the messages.
    value : torch.Tensor or array-like, integer, any shape

    Returns
    -------
    numpy.ndarray, int64, the shape of ``value``, C-contiguous

    Raises
    ------
    TypeError
        Not integers (a float or bool tensor or array), or uint8 (`check_id_dtype`).
    ValueError
        A uint64 id above 2**63 - 1 (quoted as given, before the int64 cast would wrap it); a tensor on a
        device whose values cannot be read (``"meta"``).
    """
    arr = _host_ids(name, value)
    check_int64_range(name, arr.reshape(-1))
    return np.ascontiguousarray(arr, dtype=np.int64)


def id_vector(name: str, value) -> np.ndarray:
    """`id_array` of 1-D ids: int64 numpy [n], C-contiguous.

    Parameters
    ----------
    name : str
        The argument's name, for the messages.
    value : torch.Tensor or array-like, integer, shape [n]

    Returns
    -------
    numpy.ndarray, int64, shape [n], C-contiguous

    Raises
    ------
    TypeError
        `id_array`'s: not integers.
    ValueError
        `id_array`'s; ``value`` not 1-D.
    """
    arr = id_array(name, value)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    return arr


def check_seeds(seeds, num_nodes: int, name: str = "seeds", bound: str = "num_nodes") -> np.ndarray:
    """Validate a seed tensor at the public boundary and return it as an int64 numpy array.

    Parameters
    ----------
    seeds : torch.Tensor or array-like, integer, shape [B]
        The ids to check.
    num_nodes : int
        Exclusive upper bound of the ids.
    name : str
        Argument name used in error messages.
    bound : str
        Name of the upper bound used in error messages (``"num_edges"`` for edge ids).

    Returns
    -------
    numpy.ndarray, int64, shape [B], contiguous

    Raises
    ------
    TypeError
        ``seeds`` is not an integer tensor or array (float, bool, or uint8: `check_id_dtype`).
    ValueError
        ``seeds`` is not 1-D, or holds ids outside [0, num_nodes) (`check_id_range`, in the ids' own dtype:
        a uint64 id is reported as given), or lies on a device whose values cannot be read (``"meta"``).
    """
    arr = _host_ids(name, seeds)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    check_id_range(name, arr, 0, num_nodes, interval=f"[0, {bound}={num_nodes})")
    return np.ascontiguousarray(arr, dtype=np.int64)


def edge_array(name: str, value, num_edges: int) -> np.ndarray:
    """A per-edge tensor indexed by edge id, as a numpy array of shape [E] (checked).

    Raises
    ------
    ValueError
        Not of shape [num_edges]; the message names ``name``.
    TypeError
        Not numeric.
    """
    arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if arr.shape != (num_edges,):
        raise ValueError(f"{name} must have shape [{num_edges}] (one per edge, indexed by edge id), "
                         f"got {tuple(arr.shape)}")
    if arr.size and not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name} must be a numeric tensor, got dtype {arr.dtype}")
    return arr


def check_seed_and_replace(seed, replace) -> None:
    """The samplers' checks of ``seed`` (an int in [0, 2**64) or None) and ``replace`` (a bool).

    Raises
    ------
    TypeError
        ``seed`` not an int (bools, floats and strings included) or ``replace`` not a bool.
    ValueError
        ``seed`` outside [0, 2**64).
    """
    check_seed("seed", seed, allow_none=True)
    if not isinstance(replace, (bool, np.bool_)):
        raise TypeError(f"replace must be a bool, got {replace!r}")


def check_seed(name: str, value, allow_none: bool = False) -> int | None:
    """An RNG seed: an int in [0, 2**64) (`SEED_LIMIT`; bools rejected), as a Python int; None passes
    through where ``allow_none`` (an argument whose None means "unseeded").

    Raises
    ------
    TypeError
        Not an int (bools, floats and strings included), or None without ``allow_none``; the message
        offers None only where it is accepted.
    ValueError
        Outside [0, 2**64).
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        allowed = "an int or None" if allow_none else "an int"
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    value = int(value)
    if not 0 <= value < SEED_LIMIT:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return value


def check_seed_times(name: str, seed_times, num_seeds: int, dtype) -> np.ndarray:
    """Seed times as an array of the edge times' ``dtype`` (int64 or float64); float times against
    integer edge times are floored (``t_edge <= t`` iff ``t_edge <= floor(t)``), and unsigned or float
    times at or above 2**63 (``inf`` too) clamped to 2**63 - 1 (such a time sees every edge).

    Raises
    ------
    ValueError
        Not of shape [num_seeds]; a NaN time; against integer edge times, a float time below -2**63
        (``-inf`` too), which no int64 time can stand for (an edge at -2**63 would be seen).
    TypeError
        Not numeric.
    """
    if isinstance(seed_times, torch.Tensor):
        arr = seed_times.detach().cpu().numpy()
    else:
        arr = np.asarray(seed_times)
    if arr.shape != (num_seeds,):
        raise ValueError(f"{name} must have one time per seed ([{num_seeds}]), got {tuple(arr.shape)}")
    if arr.size and not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name} must be a numeric tensor, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if np.isnan(arr).any():
            raise ValueError(f"{name}: {int(np.isnan(arr).sum())} of {arr.size} times are NaN")
        if np.dtype(dtype) == np.int64:
            t = np.floor(arr.astype(np.float64))
            low = t < -(2.0**63)
            if low.any():
                raise ValueError(
                    f"{name}: {int(low.sum())} of {arr.size} times are below -2**63, first "
                    f"{float(arr[np.argmax(low)])!r}: the edge times are int64, and every int64 time sees an "
                    "edge at -2**63, so such a time cannot be kept; give times >= -2**63"
                )
            out = np.full(t.shape, np.iinfo(np.int64).max)  # at or past 2**63: sees every edge
            fits = t < 2.0**63
            out[fits] = t[fits].astype(np.int64)
            return out
    elif arr.dtype.kind == "u" and np.dtype(dtype) == np.int64:
        # a time past every int64 edge time sees every edge: clamp, never wrap negative
        return np.minimum(arr, np.uint64(np.iinfo(np.int64).max)).astype(np.int64)
    return np.ascontiguousarray(arr, dtype=dtype)


def check_int64_range(name: str, arr: np.ndarray, what: str = "ids") -> None:
    """Refuse unsigned values above 2**63 - 1 before an int64 cast would wrap them negative.

    Raises
    ------
    ValueError
        An unsigned ``arr`` holding a value above 2**63 - 1; the message quotes the value as given.
    """
    if arr.dtype.kind == "u" and arr.size:
        bad = arr > np.iinfo(np.int64).max
        if bad.any():
            raise ValueError(f"{name}: {int(bad.sum())} of {arr.size} {what} above 2**63 - 1 ({what} are "
                             f"int64), first {int(arr[np.argmax(bad)])}")


def check_device(device) -> torch.device:
    """A sampler's ``device`` argument as a `torch.device` of type cpu or cuda.

    Raises
    ------
    ValueError
        Not a device, or a device of another type.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return dev


def require_gpu(device: torch.device, name: str = "device") -> None:
    """Raise unless numba.cuda can run the kernels for ``device`` (a CUDA `torch.device`).

    Raises
    ------
    GPUUnavailableError
        No usable CUDA device (no GPU or driver, and not numba's simulator); the message names the
        argument and its value and the remedy (``device='cpu'``).
    """
    from numba import cuda  # imports numba.cuda: only when a GPU is asked for

    if not cuda.is_available():
        raise GPUUnavailableError(f"{name}={str(device)!r} needs a CUDA GPU with a working driver, and "
                                  "numba.cuda finds none here (numba.cuda.is_available() is False); use "
                                  f"{name}='cpu' (same semantics)")


def check_int(name: str, value, minimum: int, maximum: int | None = None) -> int:
    """An int argument in [minimum, maximum] (bools rejected), as an int.

    Raises
    ------
    TypeError
        Not an int.
    ValueError
        Below ``minimum`` or above ``maximum``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_share(name: str, value) -> float:
    """A share in [0, 1) as a float. Raises TypeError naming ``name`` for a value that is not a real number
    (a bool, None, a string), ValueError for one outside [0, 1) or NaN."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float in [0, 1), got {value!r}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


def check_bool(name: str, value) -> bool:
    """``value`` as a bool; TypeError naming ``name`` unless it is a bool (numpy's included)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_prefetch(prefetch) -> int:
    """A loader's ``prefetch`` (batches queued ahead, a staging buffer each): an int in [0, MAX_BATCH].

    Raises
    ------
    TypeError
        Not an int (bools included).
    ValueError
        Outside [0, MAX_BATCH].
    """
    if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)):
        raise TypeError(f"prefetch must be an int >= 0, got {prefetch!r}")
    if not 0 <= prefetch <= MAX_BATCH:
        raise ValueError(f"prefetch must be an int >= 0 and <= {MAX_BATCH}, got {prefetch!r}")
    return int(prefetch)


def check_fanouts(name: str, fanouts) -> list[int]:
    """Fanouts of one sampler, outermost layer first: each -1 (every neighbour) or in [0, MAX_FANOUT].

    Raises
    ------
    TypeError
        ``fanouts`` is not a sequence, or holds a value that is not an int (bools included).
    ValueError
        ``fanouts`` is empty, or holds a value below -1 or above `MAX_FANOUT`.
    """
    if isinstance(fanouts, (str, bytes)) or not isinstance(fanouts, Sequence):
        raise TypeError(f"{name} must be a sequence of ints such as [15, 10, 5], got {fanouts!r}")
    fanouts = list(fanouts)
    if not fanouts:
        raise ValueError(f"{name} must have at least one layer, got []")
    return [_fanout(f"{name}[{i}]", k) for i, k in enumerate(fanouts)]


def _fanout(name: str, k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {k!r}")
    k = int(k)
    if k < -1:
        raise ValueError(f"{name}={k}: a fanout must be >= 0, or -1 for every neighbour")
    if k > MAX_FANOUT:
        raise ValueError(f"{name}={k}: a fanout must be <= {MAX_FANOUT} (2**31 - 1, the largest local id "
                         "of a block), or -1 for every neighbour")
    return k


def check_regions(regions, what: str) -> None:
    """Raise ValueError when one of ``regions`` (memory-manager regions an object reads) was freed.

    A region is freed by its `graphrl.memory.MemoryManager`'s ``close`` (or the owner's ``free``): its
    bytes no longer count against any budget, and a pinned region is no longer registered for the GPU,
    so an object that still read it would exceed the budget silently or fault on the GPU.

    Raises
    ------
    ValueError
        A freed region; the message names ``what``, the region's owner and the remedy.
    """
    freed = [region.owner for region in regions if region.freed]
    if freed:
        raise ValueError(f"{what} reads memory-manager regions that were freed ({', '.join(freed)}): their "
                         "MemoryManager was closed or the graph freed; build them again on an open manager")


def check_open(closed: bool, what: str) -> None:
    """Raise ValueError naming ``what`` when ``closed`` (use after close)."""
    if closed:
        raise ValueError(f"{what} is closed; it cannot be used (create a new one)")


def check_relation_dict(name: str, value, relations) -> dict:
    """A mapping keyed by relations of a heterogeneous graph (checked), as a dict; None gives {}.

    Raises
    ------
    TypeError
        Not a mapping.
    ValueError
        A key that is not one of ``relations``.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict keyed by relation (src_type, name, dst_type), got "
                        f"{type(value).__name__}")
    unknown = [rel for rel in value if rel not in relations]
    if unknown:
        raise ValueError(f"{name}: unknown relation {unknown[0]!r} (the graph has {list(relations)})")
    return dict(value)


def check_layer_fanouts(name: str, fanouts) -> list:
    """The graph-independent check of a typed sampler's ``fanouts``: a sequence of ints (every relation),
    or DGL's per-layer form, a sequence of dicts ``{edge type: int}`` (an edge type a canonical triple or a
    bare name), outermost layer first; returned as a list of ints or of dicts. `check_relation_fanouts`
    resolves the edge types against a graph.

    Raises
    ------
    TypeError
        Not a sequence; dicts mixed with ints; a key that is neither a str nor a 3-tuple; a fanout that is
        not an int.
    ValueError
        No layer; a fanout below -1 or above `MAX_FANOUT`.
    """
    if isinstance(fanouts, (str, bytes)) or not isinstance(fanouts, Sequence):
        raise TypeError(f"{name} must be a sequence of ints such as [15, 10], or of per-layer dicts "
                        f"{{edge type: int}} (DGL's form), got {fanouts!r}")
    fanouts = list(fanouts)
    if not any(isinstance(f, Mapping) for f in fanouts):
        return check_fanouts(name, fanouts)
    if not all(isinstance(f, Mapping) for f in fanouts):
        raise TypeError(f"{name} mixes per-layer dicts and ints: {fanouts!r} (give every layer as a dict "
                        f"{{edge type: int}}, or every layer as an int)")
    out = []
    for i, layer in enumerate(fanouts):
        for key in layer:
            if not (isinstance(key, str) or (isinstance(key, tuple) and len(key) == 3)):
                raise TypeError(f"{name}[{i}]: edge type {key!r} must be a name (str) or a canonical "
                                f"(src_type, name, dst_type) triple")
        out.append({key: _fanout(f"{name}[{i}][{key!r}]", k) for key, k in layer.items()})
    return out


def _resolve_relation(name: str, key, relations: Sequence):
    """The relation of ``relations`` that ``key`` names: itself, or the one relation whose name (middle of
    the triple) is ``key``; ValueError naming ``name`` and ``key`` for an unknown or ambiguous one."""
    if key in relations:
        return key
    matches = [rel for rel in relations if isinstance(key, str) and rel[1] == key]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"{name}: edge type name {key!r} is ambiguous, relations {matches} share it (give "
                         f"the canonical (src_type, name, dst_type) triple)")
    raise ValueError(f"{name}: unknown relations [{key!r}] (the graph has {list(relations)})")


def _resolve_keys(name: str, mapping: Mapping, relations: Sequence) -> dict:
    """``mapping`` re-keyed by canonical relation (`_resolve_relation`); ValueError when two keys name one
    relation (a triple and its name)."""
    unknown = [key for key in mapping if key not in relations
               and not any(isinstance(key, str) and rel[1] == key for rel in relations)]
    if unknown:
        raise ValueError(f"{name}: unknown relations {unknown} (the graph has {list(relations)})")
    out: dict = {}
    for key, value in mapping.items():
        rel = _resolve_relation(name, key, relations)
        if rel in out:
            raise ValueError(f"{name}: relation {rel!r} is given twice (as {rel!r} or its name {rel[1]!r})")
        out[rel] = value
    return out


def check_relation_fanouts(fanouts, relations, name: str = "fanouts") -> dict:
    """Per-relation fanouts of a heterogeneous sampler, checked, as ``{relation: [int, ...]}`` (the one
    normaliser of typed fanouts: `HeteroNeighborSampler`, `LaborSampler`, `DglSampler`).

    Parameters
    ----------
    fanouts : sequence of int; mapping edge type -> sequence of int; or sequence of mapping edge type -> int
        Outermost layer first. One list for every relation; one list per relation (ours); or DGL's form,
        one dict per layer ``[{etype: k}, ...]``. An edge type is a canonical (src_type, name, dst_type)
        triple or, where one relation has that name, its bare name ("listens"). A relation left out (of
        every layer) draws nothing; in DGL's form a relation given must be in every layer's dict.
    relations : sequence of relations
        The graph's relations, in order (the order of the returned dict).
    name : str
        The argument's name, for the messages.

    Raises
    ------
    TypeError
        Not one of the forms above; a fanout that is not an int.
    ValueError
        An unknown or ambiguous edge type, or one given twice; lists of different lengths, or empty; in
        DGL's form, a relation missing from some layers' dicts; a fanout below -1 or above `MAX_FANOUT`.
    """
    relations = list(relations)
    if isinstance(fanouts, Mapping):
        per_rel = {rel: ks for rel, ks in _resolve_keys(name, fanouts, relations).items()}
        for rel, ks in per_rel.items():
            if isinstance(ks, (str, bytes)) or not isinstance(ks, Sequence):
                raise TypeError(f"{name}[{rel!r}] must be a sequence of ints (one per layer), got {ks!r}")
        per_rel = {rel: list(per_rel[rel]) for rel in relations if rel in per_rel}
    else:
        layers = check_layer_fanouts(name, fanouts)
        if layers and isinstance(layers[0], Mapping):
            resolved = [_resolve_keys(f"{name}[{i}]", layer, relations) for i, layer in enumerate(layers)]
            given = [rel for rel in relations if any(rel in layer for layer in resolved)]
            for i, layer in enumerate(resolved):
                missing = [rel for rel in given if rel not in layer]
                if missing:
                    raise ValueError(f"{name}[{i}] has no fanout for {missing[0]!r}, which other layers give "
                                     f"(give every layer a fanout for each relation it samples; 0 draws "
                                     f"none)")
            per_rel = {rel: [layer[rel] for layer in resolved] for rel in given}
        else:
            per_rel = {rel: list(layers) for rel in relations}
    lengths = {len(v) for v in per_rel.values()}
    if len(lengths) > 1 or 0 in lengths:
        raise ValueError(f"{name}: every relation needs the same number (>= 1) of layers, got {per_rel}")
    if not per_rel:
        raise ValueError(f"{name}: no relation to sample (got {fanouts!r})")
    return {rel: [_fanout(f"{name}[{rel!r}][{i}]", k) for i, k in enumerate(ks)]
            for rel, ks in per_rel.items()}

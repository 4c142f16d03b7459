"""Argument checks the samplers share, at their public boundary (kernels trust what passes them).

`check_seeds` (node or edge ids), `check_seed_times`, `edge_array` (a per-edge tensor),
`check_seed_and_replace`, `check_device`, `check_int`, `check_relation_dict` and
`check_relation_fanouts` raise the project's errors (docs/architecture.md#errors): ``TypeError`` for a
bad type, ``ValueError`` for a bad value, each message naming the argument, summarising the bad values
and, where there is one, the remedy.

>>> dst = check_seeds(seeds, graph.num_nodes)          # int64 numpy [B], or raises
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

__all__ = ["check_device", "check_int", "check_relation_dict", "check_relation_fanouts",
           "check_seed_and_replace", "check_seed_times", "check_seeds", "edge_array"]


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
        ``seeds`` is not an integer tensor or array (a float or bool tensor, for instance).
    ValueError
        ``seeds`` is not 1-D, or holds ids outside [0, num_nodes).
    """
    if isinstance(seeds, torch.Tensor):
        if seeds.dtype.is_floating_point or seeds.dtype.is_complex or seeds.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got dtype {seeds.dtype}")
        arr = seeds.detach().cpu().numpy()
    else:
        arr = np.asarray(seeds)
        if arr.size == 0 and arr.dtype == np.float64:  # np.asarray([]) is float64: treat as empty ids
            arr = arr.astype(np.int64)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.size:
        bad = (arr < 0) | (arr >= num_nodes)
        if bad.any():
            first = int(arr[np.argmax(bad)])
            raise ValueError(f"{name}: {int(bad.sum())} of {arr.size} ids outside [0, {bound}={num_nodes}), "
                             f"first {first}")
    return arr


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
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise TypeError(f"seed must be an int or None, got {seed!r}")
    if seed is not None and not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    if not isinstance(replace, (bool, np.bool_)):
        raise TypeError(f"replace must be a bool, got {replace!r}")


def check_seed_times(name: str, seed_times, num_seeds: int, dtype) -> np.ndarray:
    """Seed times as an array of the edge times' ``dtype`` (int64 or float64); float times against
    integer edge times are floored (``t_edge <= t`` iff ``t_edge <= floor(t)``).

    Raises
    ------
    ValueError
        Not of shape [num_seeds]; a NaN time.
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
            return np.clip(np.floor(arr), -9.2e18, 9.2e18).astype(np.int64)
    return np.ascontiguousarray(arr, dtype=dtype)


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


def check_int(name: str, value, minimum: int) -> int:
    """An int argument of at least ``minimum`` (bools rejected), as an int.

    Raises
    ------
    TypeError
        Not an int.
    ValueError
        Below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


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


def check_relation_fanouts(fanouts, relations) -> dict:
    """Per-relation fanouts of a heterogeneous sampler, checked, as ``{relation: [int, ...]}``.

    Parameters
    ----------
    fanouts : sequence of int, or mapping relation -> sequence of int
        One list for every relation, or one list per relation (relations left out draw nothing).
    relations : sequence of relations
        The graph's relations, in order (the order of the returned dict).

    Raises
    ------
    TypeError
        A fanout that is not an int.
    ValueError
        An unknown relation; lists of different lengths, or empty; a fanout below -1.
    """
    if isinstance(fanouts, Mapping):
        unknown = [r for r in fanouts if r not in relations]
        if unknown:
            raise ValueError(f"fanouts: unknown relations {unknown} (the graph has {relations})")
        per_rel = {rel: list(fanouts[rel]) for rel in relations if rel in fanouts}
    else:
        per_rel = {rel: list(fanouts) for rel in relations}
    lengths = {len(v) for v in per_rel.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"fanouts: every relation needs the same number (>= 1) of layers, got {per_rel}")
    for rel, ks in per_rel.items():
        for i, k in enumerate(ks):
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
                raise TypeError(f"fanouts[{rel}][{i}] must be an int, got {k!r}")
            if k < -1:
                raise ValueError(f"fanouts[{rel}][{i}]={k}: a fanout must be >= 0, or -1 for every neighbour")
    return {rel: [int(k) for k in ks] for rel, ks in per_rel.items()}

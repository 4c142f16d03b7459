"""Argument checks both replay stores (local and Ray) share; each raises naming the argument.

>>> args = check_store_args(spec, 100_000, 4, Prioritized(0.6), None, seed=0)
>>> b, length = check_sample_args(256, 64, "tail")
>>> beta = check_beta(torch.tensor(0.4))  # 0.4000000059604645, a float
>>> target = check_device("cuda:0")     # None: the host path
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrl.errors import GPUUnavailableError
from graphrl.memory import MemoryManager
from replay.chunk_codec import chunk_fits, field_chunk
from replay.keys import MAX_SHARDS, MAX_WINDOW, POS_BITS
from replay.rate_limiter import MinSize, RateLimiter
from replay.selectors import Selector, Uniform
from replay.spec import TrajectorySpec
from replay.windows import PADS

__all__ = [
    "CHUNK_BYTES",
    "MAX_BATCH",
    "MAX_INT64",
    "MAX_SHARD_CAPACITY",
    "SEED_LIMIT",
    "StoreArgs",
    "TIERS",
    "check_beta",
    "check_chunk_steps",
    "check_device",
    "check_int",
    "check_keys",
    "check_restore_kwargs",
    "check_timeout",
    "check_sample_args",
    "check_store_args",
]

logger = logging.getLogger(__name__)

CHUNK_BYTES = 16 * 2**20  # default writer staging: about this many bytes of steps
TIERS = ("shared", "host", "pinned")
MAX_BATCH = 2**31 - 1  # windows a batch (or staging slots a shape) holds, as the samplers' MAX_BATCH
MAX_INT64 = 2**63 - 1  # counts kept in int64 (use counts, rate-limiter counters, positions)
MAX_SHARD_CAPACITY = 2**POS_BITS  # a key holds a shard position in POS_BITS bits (replay.keys)
SEED_LIMIT = 2**64  # seeds are 0 .. 2**64 - 1 (a uint64)
_warned: set[str] = set()  # "sim": warned once that the simulator stands in for an available GPU


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi]`` (no upper bound if ``hi`` is None).

    Raises
    ------
    TypeError
        Not an int (bools are not ints here).
    ValueError
        Out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {rng}, got {value}")
    return int(value)


def check_gather_min_bytes(value: Any) -> int:
    """``value`` as ``device_gather_min_bytes`` (bytes, an int >= 0; see `replay.sampler.gathers_on_device`).

    Raises
    ------
    ValueError
        Not an int (bools are not), or negative.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"device_gather_min_bytes must be an int >= 0, got {value!r}")
    return int(value)


def check_keys(keys: Any) -> np.ndarray:
    """``keys`` (``batch.keys``: a tensor or array of 64-bit ints, or Python ints) as int64 [K], each >= 0.

    A key packs the anchor's position above bit 28 (`replay.keys.encode_keys`), so a key cast to a
    narrower integer type names another window (int32: the anchor's low bits, often step 0's): such
    keys are refused, not cast back. Values are compared as given before the int64 cast, so a uint64
    key 2**64 - 1 is quoted as 18446744073709551615, never as its int64 wrap -1.

    Raises
    ------
    TypeError
        Not integers, or integers of fewer than 64 bits (int8 .. int32, uint8 .. uint32: the message
        names ``keys`` and the dtype).
    ValueError
        A negative key, or one above 2**63 - 1 (the message names the first).
    """
    k = np.asarray(keys.detach().cpu().numpy() if isinstance(keys, torch.Tensor) else keys).reshape(-1)
    if k.size and k.dtype.kind not in "iu":
        raise TypeError(f"keys must be integers (batch.keys), got {k.dtype}")
    if k.size and k.dtype.itemsize != 8:
        raise TypeError(
            f"keys must be 64-bit integers (batch.keys, int64), got {k.dtype}: a key cast to fewer bits "
            "names another window; nothing was changed"
        )
    if k.size and k.dtype.kind == "u" and k.max() > np.iinfo(np.int64).max:
        raise ValueError(
            f"key {int(k.max())} is above 2**63 - 1: keys are the int64 values of batch.keys; "
            "nothing was changed"
        )
    k = k.astype(np.int64)
    negative = k < 0
    if negative.any():
        i = int(np.flatnonzero(negative)[0])
        raise ValueError(
            f"key {int(k[i])} is negative: keys are the >= 0 int64 values of batch.keys; nothing was changed"
        )
    return k


FROM_CHECKPOINT = ("spec", "capacity_steps", "num_shards", "selector", "rate_limiter")


def check_timeout(timeout: Any) -> float | None:
    """A timeout in seconds: a finite number >= 0, or None (wait forever).

    Raises
    ------
    TypeError
        Not a number (bools included) or None.
    ValueError
        Negative, NaN or infinite.
    """
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)):
        raise TypeError(
            f"timeout must be a number of seconds or None, got {type(timeout).__name__} {timeout!r}"
        )
    if timeout is not None and (timeout < 0 or not math.isfinite(timeout)):
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")
    return timeout


def check_restore_kwargs(kwargs: Mapping[str, Any], store: str, may_change: Any) -> None:
    """Refuse a ``restore(path, **kwargs)`` keyword the checkpoint fixes (``spec``, sizes, selector...).

    Raises
    ------
    ValueError
        A keyword of `FROM_CHECKPOINT` (the message says it comes from the checkpoint and which
        keywords ``restore`` may change).
    """
    fixed = [name for name in FROM_CHECKPOINT if name in kwargs]
    if fixed:
        raise ValueError(
            f"{store}.restore(path, {fixed[0]}=...): {fixed[0]} comes from the checkpoint and cannot be "
            f"changed; restore may change {', '.join(may_change)}"
        )
    unknown = sorted(name for name in kwargs if name not in may_change)
    if unknown:
        raise TypeError(
            f"{store}.restore(path, {unknown[0]}=...): unknown keyword; restore may change "
            f"{', '.join(may_change)}"
        )


def check_chunk_steps(spec: TrajectorySpec, shard_capacity: int, chunk_steps: Any) -> int:
    """Writer staging rows: ``chunk_steps`` capped at the shard capacity; None: about 16 MiB of steps.

    Raises
    ------
    TypeError
        Not an int (bools included).
    ValueError
        Not in [1, 2**63 - 1].
    """
    if chunk_steps is None:
        return max(1, min(shard_capacity, CHUNK_BYTES // max(1, spec.step_bytes)))
    return min(check_int("chunk_steps", chunk_steps, 1, MAX_INT64), shard_capacity)


def check_codec_capacity(spec: TrajectorySpec, capacity_steps: int, num_shards: int) -> None:
    """Each shard's share of ``capacity_steps`` (``capacity_steps // num_shards``) must hold whole chunks of
    every codec field: a multiple of its chunk (`replay.chunk_codec.field_chunk`), at least two of them
    (`replay.chunk_codec.chunk_fits`, the rule the shards apply).

    Raises
    ------
    ValueError
        It does not: the message names the field, its chunk, the share and the ``capacity_steps`` values
        that work for every codec field (the nearest below and above the one given).
    """
    share = capacity_steps // num_shards
    chunks = {n: field_chunk(spec[n].codec, spec[n].chunk) for n in spec.codec_fields}
    bad = [n for n, c in chunks.items() if not chunk_fits(share, c)]
    if not bad:
        return
    unit = math.lcm(*chunks.values())  # a share that is a multiple of every chunk
    least = -(-2 * max(chunks.values()) // unit) * unit
    step = num_shards * unit
    below = capacity_steps // step * step
    above = max(below + step, least * num_shards)
    near = f"{below} or {above}" if below >= least * num_shards else f"{above}"
    name, c = bad[0], chunks[bad[0]]
    raise ValueError(
        f"field {name!r}: chunk={c} needs each shard's capacity, capacity_steps // num_shards = "
        f"{capacity_steps} // {num_shards} = {share}, to be a multiple of {c} and at least {2 * c}: pass "
        f"capacity_steps a multiple of {step} (num_shards * {unit}, every codec field's chunks) of at least "
        f"{least * num_shards}, e.g. {near}"
    )


@dataclass(frozen=True)
class StoreArgs:
    """A store constructor's arguments, checked and normalised by `check_store_args`."""

    spec: TrajectorySpec
    num_shards: int
    shard_capacity: int
    selector: Selector
    rate_limiter: RateLimiter
    max_times_sampled: int
    seed: int | None
    chunk_steps: int
    tier: str
    timeout: float | None
    staging_slots: int

    @property
    def capacity_steps(self) -> int:
        return self.shard_capacity * self.num_shards


def check_store_args(
    spec: Any,
    capacity_steps: Any,
    num_shards: Any,
    selector: Any,
    rate_limiter: Any,
    *,
    max_times_sampled: Any = 0,
    seed: Any = None,
    chunk_steps: Any = None,
    tier: Any = "shared",
    timeout: Any = 60.0,
    staging_slots: Any = 4,
    memory: Any = None,
) -> StoreArgs:
    """The checks of a store constructor's arguments (both backends); return them normalised.

    ``selector`` None is ``Uniform()``, ``rate_limiter`` None is ``MinSize(1)``; ``chunk_steps`` as
    `check_chunk_steps`; each shard holds ``capacity_steps // num_shards`` steps.

    Raises
    ------
    TypeError
        A spec, selector, rate limiter, memory manager, timeout or int argument of the wrong type.
    ValueError
        Bad sizes (capacity below the shard count, more than 256 shards, more than 2**35 steps a
        shard; a codec field's chunk not dividing each shard's share, `check_codec_capacity`), a rate
        limiter that could never admit a sample at this capacity, a bad tier, timeout,
        chunk_steps, seed (0 .. 2**64 - 1), staging_slots (1 .. 2**31 - 1) or max_times_sampled.
    """
    if not isinstance(spec, (TrajectorySpec, Mapping)):
        raise TypeError(f"spec must be a TrajectorySpec or a mapping, got {type(spec).__name__}")
    spec = spec if isinstance(spec, TrajectorySpec) else TrajectorySpec(spec)
    capacity_steps = check_int("capacity_steps", capacity_steps, 1, MAX_INT64)
    num_shards = check_int("num_shards", num_shards, 1, MAX_SHARDS)
    if capacity_steps < num_shards:
        raise ValueError(
            f"capacity_steps={capacity_steps} must be >= num_shards={num_shards} (>= 1 step a shard)"
        )
    if capacity_steps // num_shards > MAX_SHARD_CAPACITY:
        raise ValueError(
            f"capacity_steps={capacity_steps} over num_shards={num_shards} gives shards of "
            f"{capacity_steps // num_shards} steps, more than {MAX_SHARD_CAPACITY} (2**{POS_BITS}, the "
            "positions a key holds): use more shards or a smaller capacity"
        )
    selector = Uniform() if selector is None else selector
    if not isinstance(selector, Selector):
        raise TypeError(f"selector must be a replay.selectors.Selector, got {type(selector).__name__}")
    rate_limiter = MinSize(1) if rate_limiter is None else rate_limiter
    if not isinstance(rate_limiter, RateLimiter):
        raise TypeError(
            f"rate_limiter must be a replay.rate_limiter.RateLimiter, got {type(rate_limiter).__name__}"
        )
    if tier not in TIERS:
        raise ValueError(
            f"tier must be 'shared' (writers in other processes), 'host' or 'pinned', got {tier!r}: "
            "the rings must be host memory the writers can view"
        )
    shard_capacity = capacity_steps // num_shards
    check_codec_capacity(spec, capacity_steps, num_shards)
    rate_limiter.check_capacity(shard_capacity * num_shards)
    check_timeout(timeout)
    max_times_sampled = check_int("max_times_sampled", max_times_sampled, 0, MAX_INT64)
    if seed is not None:
        seed = check_int("seed", seed, 0, SEED_LIMIT - 1)
    chunk = check_chunk_steps(spec, shard_capacity, chunk_steps)
    staging_slots = check_int("staging_slots", staging_slots, 1, MAX_BATCH)
    if memory is not None and not isinstance(memory, MemoryManager):
        raise TypeError(f"memory must be a graphrl.memory.MemoryManager or None, got {type(memory).__name__}")
    return StoreArgs(
        spec,
        num_shards,
        shard_capacity,
        selector,
        rate_limiter,
        max_times_sampled,
        seed,
        chunk,
        tier,
        None if timeout is None else float(timeout),
        staging_slots,
    )


def check_sample_args(batch_size: Any, window: Any, pad: Any) -> tuple[int, int]:
    """The checks of ``sample(batch_size, window, pad)``: return ``(B, L)`` as ints (``beta``: `check_beta`).

    Raises
    ------
    TypeError
        ``batch_size`` or ``window`` not an int (bools included).
    ValueError
        ``batch_size`` not in [1, 2**31 - 1], ``window`` not in [1, 65536], or ``pad`` neither
        ``"tail"`` nor ``"head"``.
    """
    batch_size = check_int("batch_size", batch_size, 1, MAX_BATCH)
    window = check_int("window", window, 1, MAX_WINDOW)
    if pad not in PADS:
        raise ValueError(f"pad must be 'tail' or 'head', got {pad!r}")
    return batch_size, window


def check_beta(beta: Any) -> float:
    """``sample(beta=...)``, PER's importance-weight exponent, as a float: finite and >= 0.

    Python and numpy ints and floats are taken, and 0-d tensors or arrays of an integer or floating
    dtype (``float(beta)``: a CUDA tensor is read once); bools are not numbers here.

    Parameters
    ----------
    beta : int, float, numpy scalar, or 0-d torch.Tensor / numpy.ndarray of an integer or float dtype
        The exponent (unitless).

    Returns
    -------
    float
        ``float(beta)``, finite and >= 0.

    Raises
    ------
    TypeError
        Not a real number: a str, a bool, a complex number, a tensor or array of more than one element
        or of a bool or complex dtype.
    ValueError
        NaN, infinite or negative.
    """
    if isinstance(beta, torch.Tensor):
        real = beta.ndim == 0 and not beta.is_complex() and beta.dtype != torch.bool
        what = f"a tensor of shape {tuple(beta.shape)} and dtype {beta.dtype}"
    elif isinstance(beta, np.ndarray):
        real = beta.ndim == 0 and beta.dtype.kind in "iuf"
        what = f"an array of shape {beta.shape} and dtype {beta.dtype}"
    else:
        real = isinstance(beta, (int, float, np.integer, np.floating)) and not isinstance(beta, bool)
        what = f"{type(beta).__name__} {beta!r}"
    if not real:
        raise TypeError(f"beta must be a real number >= 0 (an int, a float or a 0-d tensor), got {what}")
    value = float(beta)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"beta must be finite and >= 0, got {value}")
    return value


def check_device(device: Any) -> torch.device | None:
    """Where a GPU gather writes for ``sample(device=...)``: None for the host path.

    None, ``"cpu"`` or another non-CUDA device give None (the host batch; a non-CPU device gets it
    copied there). A CUDA device gives that device (index filled in). Under numba's CUDA simulator
    (``NUMBA_ENABLE_CUDASIM=1``) a CUDA device gives ``torch.device("cpu")``: the GPU path runs with
    CPU tensors standing in for device memory (warned once if CUDA is in fact available).

    Raises
    ------
    graphrl.GPUUnavailableError
        A CUDA device while CUDA is not available (and the simulator is not chosen); a ``RuntimeError``
        and a ``ValueError``.
    ValueError
        Not a device; a device index the machine does not have.
    """
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device must be None, 'cpu' or a CUDA device such as 'cuda:0', got {device!r}"
        ) from exc
    if dev.type != "cuda":
        return None  # 'cpu'; another device type gets the host batch copied there (Batch.to)
    import numba

    if numba.config.ENABLE_CUDASIM:  # numba's CUDA simulator: the same path, CPU tensors as device memory
        if torch.cuda.is_available() and "sim" not in _warned:
            _warned.add("sim")
            logger.warning(
                "NUMBA_ENABLE_CUDASIM=1: sample(device=%r) runs the GPU gather in numba's simulator and "
                "returns CPU tensors, although CUDA is available",
                device,
            )
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise GPUUnavailableError(
            f"device={device!r} but CUDA is not available here (torch.cuda.is_available() is False): "
            "sample with device='cpu' or None (or set NUMBA_ENABLE_CUDASIM=1 before numba is imported "
            "to run the GPU path in numba's CUDA simulator)"
        )
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev

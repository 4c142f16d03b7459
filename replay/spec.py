"""TrajectorySpec: the named fields of one step, with per-step shapes and dtypes.

See docs/architecture.md#replay-composition.

A step is a mapping ``{field name: value}`` with exactly the spec's fields. Validation is strict and
happens before anything is stored, so a bad step leaves no partial trace:

- a missing or unknown field name raises ``ValueError`` naming it;
- a value whose shape differs from the field's shape raises ``ValueError`` naming the field (no
  broadcasting);
- a numpy array, numpy scalar or torch tensor whose dtype differs from the field's raises
  ``TypeError`` naming the field and both dtypes (no silent casts). Plain Python scalars are accepted
  when lossless for the field's kind: ``bool`` for bool fields, ``int`` for integer fields (range
  checked) and float fields, ``float`` for float fields (rounded to the field's precision, as gym
  rewards are; a finite value beyond the field's range raises ``ValueError``, never stores inf).

References
----------
DeepMind Reverb's signatures (``tf.TensorSpec`` per column); TorchRL's ``TensorSpec`` / ``Composite``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrl.memory import NUMPY_TO_TORCH, TORCH_TO_NUMPY
from graphrl.memory.dtypes import parse_dtype

__all__ = ["FieldSpec", "TrajectorySpec"]

_RESERVED = frozenset({"mask", "keys", "probabilities", "weights", "lengths"})


def _parse_dtype(dtype: Any, name: str) -> np.dtype:
    try:  # the core's one table of dtypes (None, unknown names, big-endian and object dtypes refused)
        parsed = parse_dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"field {name!r}: {exc}") from None
    if parsed.numpy is None:
        raise TypeError(f"field {name!r}: dtype {parsed.torch} is not supported (it has no numpy equivalent)")
    return parsed.numpy


CODECS = ("lz4", "zstd", "lz4dict")


@dataclass(frozen=True)
class FieldSpec:
    """One field of a step.

    Attributes
    ----------
    name : str
    shape : tuple of int
        Per-step shape (``()`` for scalars; an int or a list of ints is taken as that tuple).
    dtype : numpy.dtype
        Given as a numpy dtype or type, a torch dtype or a name (``"uint8"``); kept as a numpy dtype.
    codec : str or None
        None (default): the field's steps are stored raw. ``"lz4"`` (numcodecs' LZ4 format, compressed
        by its bundled LZ4 HC, level 2), ``"zstd"`` (numcodecs Zstd, level 1) or ``"lz4dict"`` (each
        chunk's first step raw, the others LZ4 with it as dictionary: `replay.chunk_encode`): stored
        as compressed chunks of steps (`replay.chunk_codec.ChunkRing`), compressed by the writer at
        commit and decompressed into the batch at sample time; for large, redundant steps (pixels).
    arena_ratio : float
        For a codec field, raw bytes of the shard's ring per byte of its compressed arena (> 0; the
        arena holds ``capacity * row_bytes / arena_ratio`` bytes per shard, and one chunk of
        ``chunk * row_bytes / max(1, arena_ratio)`` more for the bytes its circular log skips at its
        end: `replay.chunk_codec.arena_size`). Data that compresses less
        than ``arena_ratio`` fills the arena before the ring wraps: a writer's commit then raises
        `graphrl.memory.MemoryBudgetError` (that commit's steps dropped), at run time, not here. Choose it
        below the ratio your busiest data reaches with the codec and chunk (measure raw bytes / compressed
        bytes of sample chunks, or for Atari frames ``benchmarks/replay_codecs.py``'s ``ratio``), with
        headroom (e.g. 0.75 of it). A commit is never refused while every chunk compresses by at least
        ``max(1, arena_ratio)``, so ``arena_ratio <= 1`` never fills (a chunk takes at most its raw bytes,
        whatever the mix of sizes) but saves no memory. Default 4.0: frames with large static areas.
        Unused when raw.
    chunk : int or None
        For a codec field, steps per compressed chunk: a sampled step decompresses its whole chunk
        (``"lz4dict"``: the step alone), so short chunks sample faster and long ones compress better
        (docs/performance.md, "Compressed fields"). The shard capacity must be a multiple of it and at
        least twice it. None (default): the codec's `replay.chunk_codec.CHUNK_STEPS` (one step; eight
        for ``"lz4dict"``). Unused when raw.

    Raises
    ------
    ValueError
        ``codec`` not None or one of `CODECS`, a codec on a zero-size shape, ``arena_ratio`` not a
        positive finite number, or ``chunk`` not None or a positive int (the message names the argument
        and the value); a negative size in ``shape``.
    TypeError
        ``shape`` not an int or a sequence of ints; an unknown or unsupported ``dtype``.

    Examples
    --------
    >>> spec = TrajectorySpec({"obs": FieldSpec("obs", (3, 84, 84), "uint8", codec="lz4"),
    ...                        "action": ((), "int64")})
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    codec: str | None = None
    arena_ratio: float = 4.0
    chunk: int | None = None

    def __post_init__(self) -> None:
        shape = self.shape
        if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
            shape = (int(shape),)
        if not isinstance(shape, (tuple, list, torch.Size)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape
        ):
            raise TypeError(f"field {self.name!r}: shape must be a tuple of ints, got {shape!r}")
        if any(d < 0 for d in shape):
            raise ValueError(f"field {self.name!r}: shape {tuple(shape)} has a negative size")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        object.__setattr__(self, "dtype", _parse_dtype(self.dtype, self.name))
        if self.codec is not None and self.codec not in CODECS:
            raise ValueError(
                f"field {self.name!r}: codec must be None, 'lz4', 'zstd' or 'lz4dict', got {self.codec!r}"
            )
        if self.codec is not None and 0 in tuple(self.shape):
            raise ValueError(  # its chunks would be codec headers only, and never fit the empty arena
                f"field {self.name!r}: codec {self.codec!r} on a field of shape {tuple(self.shape)} (zero "
                "size, nothing to compress): drop the codec"
            )
        r = self.arena_ratio
        real = isinstance(r, (int, float, np.integer, np.floating)) and not isinstance(r, (bool, np.bool_))
        if not real or not (0 < r < math.inf):
            raise ValueError(f"field {self.name!r}: arena_ratio must be a positive number, got {r!r}")
        object.__setattr__(self, "arena_ratio", float(r))  # numpy scalars too: plain JSON in to_config
        c = self.chunk
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1):
            raise ValueError(f"field {self.name!r}: chunk must be None or a positive int, got {c!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return NUMPY_TO_TORCH[self.dtype]

    @property
    def row_bytes(self) -> int:
        """Bytes of one step of this field."""
        return math.prod(self.shape) * self.dtype.itemsize

    def check(self, value: Any, leading: tuple[int, ...] = ()) -> np.ndarray:
        """Return ``value`` as a numpy array of shape ``leading + shape`` and this dtype, or raise.

        Raises
        ------
        TypeError
            A dtype other than this field's (arrays, tensors, numpy scalars), or a Python scalar of
            the wrong kind, or an object that is not array-like.
        ValueError
            A shape other than ``leading + shape``, or a Python int out of the field's range.
        """
        want = leading + self.shape
        if isinstance(value, torch.Tensor):
            npd = TORCH_TO_NUMPY.get(value.dtype)
            if npd != self.dtype:
                raise TypeError(
                    f"field {self.name!r}: expected dtype {self.dtype}, got tensor of {value.dtype}"
                )
            arr = value.detach().cpu().numpy()
        elif isinstance(value, (np.ndarray, np.generic)):
            if value.dtype != self.dtype:
                raise TypeError(f"field {self.name!r}: expected dtype {self.dtype}, got {value.dtype}")
            arr = np.asarray(value)
        elif isinstance(value, (bool, int, float)) and not leading:
            arr = self._scalar(value)
        else:
            raise TypeError(
                f"field {self.name!r}: expected a numpy array or torch tensor of {self.dtype} with shape "
                f"{want}, got {type(value).__name__}"
            )
        if arr.shape != want:
            raise ValueError(f"field {self.name!r}: expected shape {want}, got {arr.shape}")
        return arr

    def _scalar(self, value: bool | int | float) -> np.ndarray:
        kind = self.dtype.kind
        if isinstance(value, bool):
            ok = kind == "b"
        elif isinstance(value, int):
            ok = kind in "iuf"
            if ok and kind in "iu":
                info = np.iinfo(self.dtype)
                if not info.min <= value <= info.max:
                    raise ValueError(f"field {self.name!r}: {value} is out of range for {self.dtype}")
        else:
            ok = kind == "f"
        if not ok:
            raise TypeError(
                f"field {self.name!r}: expected {self.dtype}, got Python {type(value).__name__} {value!r}"
            )
        if kind != "f":
            return np.asarray(value, dtype=self.dtype)
        try:
            with np.errstate(over="ignore"):
                arr = np.asarray(value, dtype=self.dtype)
            overflow = not np.isfinite(arr) and (isinstance(value, int) or math.isfinite(value))
        except OverflowError:  # an int beyond float64
            overflow = True
        if overflow:
            raise ValueError(
                f"field {self.name!r}: {value!r} overflows {self.dtype} (largest finite value "
                f"{float(np.finfo(self.dtype).max)})"
            )
        return arr


def _entry(f: FieldSpec) -> list:
    """A field as plain data: [shape, dtype name] or, with a codec, [shape, dtype, codec, arena_ratio]
    and the chunk when one is set."""
    out: list = [list(f.shape), f.dtype.name]
    if f.codec is None:
        return out
    return [*out, f.codec, f.arena_ratio] + ([] if f.chunk is None else [int(f.chunk)])


class TrajectorySpec(Mapping[str, FieldSpec]):
    """The named fields of a step: name -> (per-step shape, dtype), in a fixed order.

    Parameters
    ----------
    fields : mapping of str to (shape, dtype), (shape, dtype, codec[, arena_ratio[, chunk]]) or FieldSpec
        ``shape`` an int or tuple of ints (``()`` for scalars), ``dtype`` a numpy or torch dtype or its
        name, ``codec``, ``arena_ratio`` and ``chunk`` as `FieldSpec`'s.
        Names are non-empty strings other than the batch's own attributes (``mask``, ``keys``,
        ``probabilities``, ``weights``, ``lengths``).

    Raises
    ------
    ValueError
        No fields, a bad or reserved name, a `FieldSpec` under another name than its own, a negative
        size, or a bad codec.
    TypeError
        A malformed entry or an unsupported dtype (bfloat16 has no numpy view).

    Examples
    --------
    >>> spec = TrajectorySpec({"obs": ((4,), "float32"), "action": ((), "int64")})
    >>> spec["obs"].shape, spec.step_bytes
    ((4,), 24)
    """

    def __init__(self, fields: Mapping[str, tuple[Any, Any]]) -> None:
        if not isinstance(fields, Mapping):
            raise TypeError(
                f"fields must be a mapping of name -> (shape, dtype), got {type(fields).__name__}"
            )
        if not fields:
            raise ValueError("a TrajectorySpec needs at least one field")
        parsed: dict[str, FieldSpec] = {}
        for name, entry in fields.items():
            if not isinstance(name, str) or not name or not name.isidentifier():
                raise ValueError(f"field names must be identifiers, got {name!r}")
            if name in _RESERVED:
                raise ValueError(f"field name {name!r} is reserved for the batch ({sorted(_RESERVED)})")
            codec, ratio, chunk = None, FieldSpec.arena_ratio, None
            if isinstance(entry, FieldSpec):
                if entry.name != name:
                    raise ValueError(f"field {name!r}: its FieldSpec is named {entry.name!r} "
                                     f"(name it {name!r})")
                codec, ratio, chunk = entry.codec, entry.arena_ratio, entry.chunk
                entry = (entry.shape, entry.dtype)
            elif isinstance(entry, (tuple, list)) and len(entry) in (3, 4, 5):
                codec, *rest = entry[2:]
                ratio = rest[0] if rest else ratio
                chunk = rest[1] if len(rest) > 1 else None
                entry = entry[:2]
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise TypeError(
                    f"field {name!r}: expected (shape, dtype) or (shape, dtype, codec), got {entry!r}"
                )
            parsed[name] = FieldSpec(name, *entry, codec, ratio, chunk)
        self._fields = parsed

    # -- Mapping
    def __getitem__(self, name: str) -> FieldSpec:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TrajectorySpec) and list(self.values()) == list(other.values())

    def __hash__(self) -> int:
        return hash(tuple(self._fields.values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n!r}: {tuple(_entry(f))}" for n, f in self._fields.items())
        return f"TrajectorySpec({{{inner}}})"

    @property
    def step_bytes(self) -> int:
        """Bytes of one step over all fields."""
        return sum(f.row_bytes for f in self._fields.values())

    def to_config(self) -> dict[str, list]:
        """Plain data (JSON-able) that `from_config` turns back into an equal spec."""
        return {n: _entry(f) for n, f in self._fields.items()}

    @property
    def codec_fields(self) -> tuple[str, ...]:
        """Names of the fields stored compressed (a codec set), in spec order."""
        return tuple(n for n, f in self._fields.items() if f.codec is not None)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TrajectorySpec:
        return cls({n: (tuple(v[0]), *v[1:]) for n, v in config.items()})

    # -- validation
    def _names(self, step: Any, what: str) -> None:
        if not isinstance(step, Mapping):
            raise TypeError(f"{what} must be a mapping of field name -> value, got {type(step).__name__}")
        missing = [n for n in self._fields if n not in step]
        unknown = [n for n in step if n not in self._fields]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing field(s) {missing}")
            if unknown:
                parts.append(f"unknown field(s) {unknown}")
            raise ValueError(f"{what}: {' and '.join(parts)}; the spec's fields are {list(self._fields)}")

    def validate_step(self, step: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Check one step; return its fields as numpy arrays of the spec's shapes and dtypes.

        Parameters
        ----------
        step : mapping of str to array-like
            Every field of the spec, no other; each value of the field's shape and dtype.

        Returns
        -------
        dict of str to numpy.ndarray
            In the spec's field order.

        Raises
        ------
        ValueError
            A missing or unknown field, a wrong shape (the message names the field).
        TypeError
            A wrong dtype, a wrong kind of Python scalar, or ``step`` not a mapping.
        """
        self._names(step, "step")
        return {n: f.check(step[n]) for n, f in self._fields.items()}

    def validate_steps(self, steps: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        """Check columns with a leading time axis ``[T, *shape]``; return ``T`` and the arrays.

        Raises
        ------
        ValueError
            A missing or unknown field, columns of different lengths, a wrong per-step shape.
        TypeError
            A wrong dtype or a value that is not an array or tensor.
        """
        self._names(steps, "steps")
        lengths = {}
        for n in self._fields:
            v = steps[n]
            shape = tuple(v.shape) if isinstance(v, (np.ndarray, torch.Tensor)) else None
            if shape is None or len(shape) < 1:
                raise TypeError(
                    f"field {n!r}: extend() takes arrays with a leading time axis [T, ...], "
                    f"got {type(v).__name__}" + (f" of shape {shape}" if shape is not None else "")
                )
            lengths[n] = shape[0]
        if len(set(lengths.values())) != 1:
            raise ValueError(f"steps: all fields need the same number of steps T, got {lengths}")
        t = next(iter(lengths.values()))
        return t, {n: f.check(steps[n], (t,)) for n, f in self._fields.items()}

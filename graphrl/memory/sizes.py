"""Memory tiers and byte counts: `Tier`, `parse_size`, `format_size`, `shape_bytes`, shape and owner checks.

Budgets are bytes per tier, given as ints or strings with IEC units (``"8GiB"``, ``"512MiB"``: powers
of 1024) or SI units (``"1.5GB"``, ``"100kB"``: powers of 1000); `parse_size` reads them and
`format_size` writes them back for messages. See docs/architecture.md#memory-tiers.
"""

from __future__ import annotations

import enum
import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np
import torch

__all__ = ["Tier", "check_owner", "format_size", "parse_shape", "parse_size", "shape_bytes"]


class Tier(enum.Enum):
    """A memory tier, fastest first: DEVICE, PINNED, SHARED, HOST, DISK."""

    DEVICE = "device"
    PINNED = "pinned"
    SHARED = "shared"
    HOST = "host"
    DISK = "disk"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: Tier | str) -> Tier:
        """Return the tier named by ``value`` (a `Tier` or its name, any case).

        Raises
        ------
        ValueError
            ``value`` names no tier.
        TypeError
            ``value`` is neither a `Tier` nor a string.
        """
        if isinstance(value, Tier):
            return value
        if not isinstance(value, str):
            raise TypeError(f"tier must be a Tier or a string, got {type(value).__name__} {value!r}")
        tier = cls._value2member_map_.get(value.strip().lower())
        if tier is None:
            names = ", ".join(t.value for t in cls)
            raise ValueError(f"unknown tier {value!r}: expected one of {names}")
        return tier  # type: ignore[return-value]


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Return a byte count from an int or a string such as ``"8GiB"``, ``"512 MiB"`` or ``"1.5GB"``.

    Units (case-insensitive): ``B``; SI ``kB MB GB TB PB`` (powers of 1000); IEC ``KiB MiB GiB TiB PiB``
    (powers of 1024); no unit means bytes. Fractions are allowed and rounded down to whole bytes.

    Parameters
    ----------
    value : int or str
        A non-negative byte count, or a string as above.

    Returns
    -------
    int
        Bytes.

    Raises
    ------
    ValueError
        A negative count, or a string that is not a number with a known unit (the message quotes it).
    TypeError
        ``value`` is neither an int nor a string (bools and floats are rejected).
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, str)):
        raise TypeError(f"a size must be an int (bytes) or a string like '8GiB', got {type(value).__name__}")
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            raise ValueError(
                f"cannot parse size {value!r}: expected a number and a unit in B, kB, MB, GB, TB, PB "
                "(powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024), e.g. '8GiB'"
            )
        try:
            return int(Decimal(match.group(1)) * unit)
        except InvalidOperation as exc:  # the regular expression makes this unreachable; be explicit
            raise ValueError(f"cannot parse size {value!r}") from exc
    size = int(value)
    if size < 0:
        raise ValueError(f"a size must be >= 0 bytes, got {size}")
    return size


def format_size(nbytes: int) -> str:
    """``1536`` -> ``'1.5 KiB (1536 bytes)'``."""
    size, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            break
        size /= 1024
    human = f"{nbytes} B" if unit == "B" else f"{size:.1f} {unit}"
    return human if unit == "B" else f"{human} ({nbytes} bytes)"


MAX_DIMS = 64  # numpy's limit (NPY_MAXDIMS), within torch's
MAX_EXTENT = 2**63 - 1  # bytes a tensor or array can span: sizes and strides are int64


def parse_shape(shape: Any, itemsize: int = 1) -> tuple[int, ...]:
    """``shape`` as a tuple of ints >= 0, at most 64 of them, spanning at most 2**63 - 1 bytes.

    The span counts a size 0 as 1 (strides must fit int64 even when the region is empty).

    Raises
    ------
    TypeError
        Not an int or a sequence of ints (bools are refused).
    ValueError
        A negative size, more than 64 dimensions, or a span past 2**63 - 1 bytes.
    """
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list, torch.Size)):
        raise TypeError(f"shape must be an int or a sequence of ints, got {type(shape).__name__}")
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"shape {tuple(shape)} must hold ints, got {type(d).__name__} {d!r}")
        if d < 0:
            raise ValueError(f"shape {tuple(int(x) for x in shape)} has a negative size {int(d)}")
        dims.append(int(d))
    if len(dims) > MAX_DIMS:
        raise ValueError(f"shape has {len(dims)} dimensions, more than the {MAX_DIMS} numpy and torch allow")
    span = itemsize
    for d in dims:
        span *= max(d, 1)
    if span > MAX_EXTENT:
        raise ValueError(f"shape {tuple(dims)} of {itemsize}-byte items spans {span} bytes (sizes of 0 "
                         f"counted as 1), more than a tensor can address (2**63 - 1)")
    return tuple(dims)


def shape_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    """``prod(shape) * itemsize``: the bytes a region, or a registered buffer, of ``shape`` counts against
    its tier's budget (``Region.nbytes``). A size 0 gives 0 bytes (unlike `parse_shape`'s span, which
    counts it as 1). ``shape`` is trusted: check it with `parse_shape` first.

    >>> shape_bytes((3, 4), 8)
    96
    """
    return math.prod(shape) * itemsize


def check_owner(owner: Any) -> str:
    """``owner`` as given: TypeError when not a string, ValueError when empty."""
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a non-empty string such as 'samplers.graph', got {owner!r}")
    if not owner:
        raise ValueError("owner must be a non-empty string such as 'samplers.graph', got ''")
    return owner

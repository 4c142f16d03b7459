"""Element types a region can hold: one table of torch <-> numpy dtypes for the core and both engines.

`parse_dtype` turns a torch dtype, a numpy dtype or a name (``"float32"``, ``"torch.int64"``,
``"bfloat16"``) into a `DType` with both forms (``numpy`` is None for torch-only bfloat16);
`TORCH_TO_NUMPY` and `NUMPY_TO_TORCH` map between the two.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["DType", "NUMPY_TO_TORCH", "TORCH_TO_NUMPY", "parse_dtype", "to_numpy"]


# The dtypes that have both a torch and a numpy form (one table for the core and both engines).
TORCH_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
NUMPY_TO_TORCH = {v: k for k, v in TORCH_TO_NUMPY.items()}
_TORCH_ONLY = {"bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class DType:
    torch: torch.dtype
    numpy: np.dtype | None  # None for torch-only dtypes (bfloat16)
    name: str

    @property
    def itemsize(self) -> int:
        return self.torch.itemsize


def parse_dtype(dtype: Any) -> DType:
    """Normalise a torch dtype, numpy dtype or name (``"float32"``, ``"torch.int64"``) to `DType`."""
    if dtype is None or isinstance(dtype, (str, torch.dtype, np.dtype, type)):
        return _parse_dtype_cached(dtype)
    return _parse_dtype_uncached(dtype)


@functools.lru_cache(maxsize=256)
def _parse_dtype_cached(dtype: Any) -> DType:
    return _parse_dtype_uncached(dtype)


def _parse_dtype_uncached(dtype: Any) -> DType:
    supported = "bool, (u)int8/16/32/64, float16/32/64, bfloat16, complex64/128"
    if isinstance(dtype, torch.dtype):
        if dtype in TORCH_TO_NUMPY:
            npd = TORCH_TO_NUMPY[dtype]
            return DType(dtype, npd, npd.name)
        if dtype in _TORCH_ONLY.values():
            return DType(dtype, None, str(dtype).removeprefix("torch."))
        raise TypeError(f"dtype {dtype} is not supported: use one of {supported}")
    if dtype is None:
        raise TypeError(f"dtype must be given: one of {supported}")
    if isinstance(dtype, str):
        name = dtype.strip().removeprefix("torch.")
        if name in _TORCH_ONLY:
            return DType(_TORCH_ONLY[name], None, name)
        dtype = name
    try:
        npd = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"unknown dtype {dtype!r}: use one of {supported}") from exc
    if npd not in NUMPY_TO_TORCH:
        raise TypeError(f"dtype {dtype!r} ({npd.str}) is not supported: use one of {supported}, native order")
    return DType(NUMPY_TO_TORCH[npd], npd, npd.name)


def to_numpy(value: Any, dtype: np.dtype) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=dtype)

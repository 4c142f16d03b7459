"""The memory behind a region, as a resource returns it: the `Backing` protocol and its three kinds.

`TensorBacking` holds a torch tensor (host, pinned, device and registered regions), `ShmBacking` a
tensor over a POSIX shared-memory segment, `ZarrBacking` a zarr array on disk (its views are copies).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from graphrl.memory.dtypes import to_numpy
from graphrl.memory.shm import ShmSegment
from graphrl.process_origin import ProcessOrigin

__all__ = ["Backing", "ShmBacking", "TensorBacking", "ZarrBacking"]


class Backing(Protocol):
    """The memory behind one region, as a `MemoryResource` returns it.

    ``tensor()`` and ``numpy()`` return views (or copies where ``copies`` is true: disk);
    ``write(value)`` copies ``value`` (broadcast to the region's shape) into it.
    """

    device: str
    is_pinned: bool
    copies: bool

    def tensor(self) -> torch.Tensor: ...

    def numpy(self) -> np.ndarray: ...

    def write(self, value: Any) -> None: ...


class TensorBacking:
    """Memory held by a torch tensor (host, pinned, device, shared and registered regions)."""

    copies = False

    def __init__(self, data: torch.Tensor, is_pinned: bool, registered_ptr: int | None = None) -> None:
        self.data = data
        self.is_pinned = is_pinned
        self.device = str(data.device)
        self.registered_ptr = registered_ptr  # set when cudaHostRegister pinned a user's buffer

    def tensor(self) -> torch.Tensor:
        return self.data.detach()

    def numpy(self) -> np.ndarray:
        if self.data.device.type != "cpu":
            raise ValueError(
                f"numpy() cannot view memory on {self.data.device}: "
                "use region.tensor().cpu().numpy() to copy it"
            )
        return self.data.detach().numpy()

    def write(self, value: Any) -> None:
        src = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
        self.data.copy_(src)


class ShmBacking(TensorBacking):
    def __init__(self, segment: ShmSegment, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> None:
        assert segment.buf is not None
        raw = torch.from_numpy(np.frombuffer(segment.buf, dtype=np.uint8, count=nbytes))
        super().__init__(raw.view(dtype).view(shape), is_pinned=False)
        self.segment = segment


class ZarrBacking:
    """A zarr array on disk; ``origin``: the creating process's `graphrl.process_origin.ProcessOrigin`, the
    only process that deletes the array (None: never; a fork child holds a copy, which never does)."""

    copies = True
    is_pinned = False
    device = "cpu"

    def __init__(self, array: Any, path: Path, dtype: np.dtype, origin: ProcessOrigin | None = None) -> None:
        self.array = array
        self.path = path
        self.np_dtype = dtype
        self.origin = origin  # only the process that made it deletes the array (None: never)

    def numpy(self) -> np.ndarray:
        out = np.asarray(self.array[...], dtype=self.np_dtype, order="C")  # keeps 0-d arrays 0-d
        return out if out.flags.writeable else out.copy()

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.numpy())

    def write(self, value: Any) -> None:
        self.array[...] = np.broadcast_to(to_numpy(value, self.np_dtype), self.array.shape)

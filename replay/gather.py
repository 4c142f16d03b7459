"""WindowGather: copy drawn windows from a storage's shard rings into a staging slot (CPU or GPU).

The copy runs without any lock (the writers go on committing); afterwards
`replay.storage.TrajectoryStorage.stale` tells which windows lost a step meanwhile, and the store
drops and redraws those (docs/architecture.md#replay-composition). On the CPU each shard's windows
go through `replay.windows.gather_fields` (flat byte slices). On a GPU (GEAR's zero-copy collect) the
first gather registers every shard's rings with CUDA (`graphrl.memory.MemoryManager.register`,
``cudaHostRegister``, owner ``replay.uva``; rings already pinned are used as they are), and
`replay.cuda.gather_fields_cuda` reads them in place through UVA on `graphrl.cuda.launch_stream`
(torch's current stream, docs/architecture.md#the-stream-rule); `WindowGather.to_device` waits for
the kernels before it returns. `WindowGather.close` unregisters the rings. Fields with a codec
(`replay.chunk_codec.ChunkRing`) are decompressed into the slot on the host by
`replay.chunk_decode.ChunkDecode` (positions already below the floor are left zero: their windows
are stale and redrawn); the sampler gathers a batch with such fields on the host and copies it to a
GPU.

>>> gather = WindowGather(storage)
>>> gather.to_host(rows, meta, slot.flat, length)            # then storage.stale(...)
>>> gather.to_device(rows, meta, slot.flat, length, torch.device("cuda:0"))
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from graphrl import cuda as gc
from graphrl.memory import Region
from replay.chunk_decode import ChunkDecode
from replay.storage import TrajectoryStorage
from replay.windows import gather_fields

__all__ = ["WindowGather"]


class WindowGather:
    """The CPU and GPU copies of windows out of a storage's rings (see the module docstring)."""

    def __init__(self, storage: TrajectoryStorage) -> None:
        self.storage = storage
        spec = storage.spec
        self.coded = [(j, n) for j, n in enumerate(spec) if spec[n].codec is not None]
        self.decode = ChunkDecode(storage) if self.coded else None
        self.raw = [j for j, n in enumerate(spec) if spec[n].codec is None]  # field indices with a ring
        raw_names = [n for n in spec if spec[n].codec is None]
        self.rings = [
            tuple(sh.columns[n].reshape(-1).view(np.uint8) for n in raw_names) for sh in storage.shards
        ]
        self.row_bytes = np.array([spec[n].row_bytes for n in raw_names], dtype=np.int64)
        self._lock = threading.Lock()
        self._uva: list[tuple[Any, ...]] | None = None  # per shard, numba views of its rings
        self._uva_regions: list[Region] = []  # rings registered (page-locked) for the GPU path

    def groups(self, rows: np.ndarray, shard: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``rows`` grouped by shard (``shard[rows]``): [(shard, rows of that shard)]."""
        if self.storage.num_shards == 1:
            return [(0, rows)]
        sh = shard[rows]
        return [(int(s), rows[sh == s]) for s in np.unique(sh)]

    def to_host(self, rows: np.ndarray, meta: dict[str, np.ndarray], flat: tuple, length: int) -> None:
        """Copy the windows ``rows`` of ``meta`` (`replay.table.META_FIELDS`) into host flat views."""
        cap = self.storage.capacity
        raw_flat = flat if not self.coded else tuple(flat[j] for j in self.raw)
        for s, sel in self.groups(rows, meta["shard"]):
            if self.decode is not None:
                win = (meta[k][sel] for k in ("first", "n", "dst"))
                self.decode.run_shard(s, sel, *win, flat, length)
            gather_fields(
                self.rings[s],
                raw_flat,
                self.row_bytes,
                cap,
                meta["first"][sel] % cap,
                meta["n"][sel],
                meta["dst"][sel],
                sel,
                length,
            )

    def to_device(
        self, rows: np.ndarray, meta: dict[str, np.ndarray], flat: tuple, length: int, target: torch.device
    ) -> None:
        """`to_host` on the GPU ``target``: launch the kernels and wait for them."""
        from replay import cuda as rc  # numba.cuda only on the GPU path

        rings = self._uva_rings()
        cap = self.storage.capacity
        with gc.device_context(target):
            stream = gc.launch_stream(target)
            for s, sel in self.groups(rows, meta["shard"]):
                rc.gather_fields_cuda(
                    rings[s],
                    flat,
                    self.row_bytes,
                    meta["first"][sel] % cap,
                    meta["n"][sel],
                    meta["dst"][sel],
                    sel,
                    length,
                    stream=stream,
                )
            gc.synchronize(stream)  # the copies must be over before the staleness check

    def _uva_rings(self) -> list[tuple[Any, ...]]:
        """Numba views of every shard's rings for the kernels, made (and page-locked) once, lazily.

        Rings already page-locked (the pinned tier) are viewed as they are; others (shared or host
        memory) are registered in place, counted against the pinned budget under owner
        ``replay.uva``. Under the simulator the registration is made the same way (pinning nothing).
        """
        if self._uva is not None:
            return self._uva
        from replay import cuda as rc

        with self._lock:
            if self._uva is None:
                views: list[tuple[Any, ...]] = []
                try:
                    for sh in self.storage.shards:
                        per_field = []
                        for name in self.storage.spec:
                            region = sh.column_regions[name]
                            tensor = region.tensor()
                            if not region.is_pinned:
                                reg = self.storage.memory.register(tensor, "pinned", owner="replay.uva")
                                self._uva_regions.append(reg)
                                tensor = reg.tensor()
                            per_field.append(rc.flat_bytes(tensor))
                        views.append(tuple(per_field))
                except BaseException:
                    self.close()
                    raise
                self._uva = views
        return self._uva

    def close(self) -> None:
        """Unregister the rings registered for the GPU path (after synchronising the GPUs); free the
        codec fields' decoder."""
        if self.decode is not None:
            self.decode.close()
        self._uva = None
        for r in self._uva_regions:
            if not r.freed:
                r.free()  # cudaHostUnregister
        self._uva_regions.clear()

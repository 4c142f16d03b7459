"""The zarr group of a replay checkpoint from a store's state: `write_state`, over `write_array`.

`replay.checkpoint.save` calls `write_state` (in the process it forks for the file work) with a new zarr
v3 group and the state a store's snapshot gives (`replay.store_state.snapshot`); `replay.checkpoint`
describes the layout and reads it back. Arrays are uncompressed, written a whole chunk of `CHUNK_BYTES`
at a time (docs/performance.md, "Checkpoint memory"); codec fields' compressed chunks are written as they
are. See docs/architecture.md#checkpoints.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["CHUNK_BYTES", "PER_ITEM", "write_array", "write_state"]

CHUNK_BYTES = 4 * 2**20  # bytes of a zarr chunk of a checkpoint array (the last one shorter)
PER_ITEM = ("priority", "times_sampled", "state")  # the selector's per-item arrays of a shard


def write_array(group: Any, name: str, parts: list[np.ndarray], shape: tuple[int, ...], dtype: Any) -> None:
    """Create ``group[name]`` of ``shape`` and fill it from ``parts`` concatenated along axis 0.

    Written one chunk at a time, each a C-contiguous array: a row block of one part as it is, else the
    rows copied into one buffer of this call (a chunk across two parts, a strided or other-dtype part).
    zarr stores a whole chunk given so as it is; handed a range of several chunks, it allocates a
    buffer per chunk in its own threads, whose glibc arenas keep the memory (docs/performance.md,
    "Checkpoint memory").

    Raises
    ------
    ValueError
        ``parts`` hold other than ``shape[0]`` rows.
    """
    dtype = np.dtype(dtype)
    n = shape[0]
    parts = [p for p in parts if len(p)]
    if sum(len(p) for p in parts) != n:
        raise ValueError(f"checkpoint array {name!r}: parts hold {sum(len(p) for p in parts)} rows, "
                         f"shape {shape} needs {n}")
    row = math.prod(shape[1:]) * dtype.itemsize
    chunk0 = max(1, min(n, CHUNK_BYTES // max(1, row))) if n else 1
    arr = group.create_array(
        name,
        shape=shape,
        dtype=dtype,
        chunks=(chunk0, *(max(1, d) for d in shape[1:])),
        compressors=None,
        fill_value=np.zeros((), dtype=dtype).item(),
    )
    buf: np.ndarray | None = None
    i = offset = 0  # row ``lo`` is row ``offset`` of ``parts[i]``
    for lo in range(0, n, chunk0):
        rows = min(chunk0, n - lo)
        block = parts[i][offset : offset + rows]
        if len(block) == rows and block.dtype == dtype and block.flags.c_contiguous:
            offset += rows
        else:
            if buf is None:
                buf = np.empty((chunk0, *shape[1:]), dtype=dtype)
            block, filled = buf[:rows], 0
            while filled < rows:
                if offset == len(parts[i]):
                    i, offset = i + 1, 0
                take = min(rows - filled, len(parts[i]) - offset)
                block[filled : filled + take] = parts[i][offset : offset + take]
                filled, offset = filled + take, offset + take
        if offset == len(parts[i]) and i + 1 < len(parts):
            i, offset = i + 1, 0
        arr[lo : lo + rows] = block


def write_state(group: Any, state: dict[str, Any], version: int) -> None:
    """Write a store's state (`replay.store_state.snapshot`) into the zarr ``group`` of a checkpoint: per
    shard every field's rows (a codec field's compressed chunks, as they are, and the rows of the chunk
    being filled), ``steps``, ``records`` and the selector's per-item arrays; the rest in its attrs
    (``replay``, with format ``version``). Layout: `replay.checkpoint`'s module docstring."""
    config = state["config"]
    spec = config["spec"]  # {field: [shape, dtype]} or, with a codec, [shape, dtype, codec, arena_ratio]
    table = state["table"]
    meta = []
    for s, shard in enumerate(state["shards"]):
        g = group.require_group(f"shard{s}")
        n = sum(len(p) for p in shard["steps"])
        for name, (shape, dtype, *codec) in spec.items():
            if codec:  # the compressed chunks as they are, and the raw rows of the chunk being filled
                c = shard["chunks"][name]
                write_array(g, f"{name}.chunks", [c["chunks"]], c["chunks"].shape, np.int64)
                write_array(g, f"{name}.blob", [c["blob"]], c["blob"].shape, np.uint8)
                write_array(g, f"{name}.tail", [c["tail"]], c["tail"].shape, dtype)
            else:
                write_array(g, name, shard["columns"][name], (n, *shape), dtype)
        write_array(g, "steps", shard["steps"], (n, 3), np.int64)
        write_array(g, "records", [shard["records"]], shard["records"].shape, np.int64)
        for name in PER_ITEM:
            parts = table["shards"][s][name]
            write_array(g, name, parts, (n,), parts[0].dtype)
        meta.append({k: shard[k] for k in ("write_pos", "n_records", "holes", "commits")})
        meta[-1]["chunk_next"] = {n: int(c["next_position"]) for n, c in shard.get("chunks", {}).items()}
    group.attrs["replay"] = {
        "version": version,
        **config,
        **state["control"],
        "shards": meta,
        "max_priority": table["max_priority"],
        "rng": table["rng"],
        "incarnation": table["incarnation"],
        "store_id": table["store_id"],
        "lineage": table["lineage"],
    }

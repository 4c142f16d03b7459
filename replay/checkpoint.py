"""Checkpoint files of a ReplayStore with zarr: data, episode index, selector state, counters.

Layout of a checkpoint folder ``path/``::

    path/LATEST              name of the newest complete checkpoint (replaced atomically)
    path/ckpt-000007/        a zarr v3 group (uncompressed):
        attrs                settings (spec, capacity, shards, selector, rate limiter, ...), rate-limiter
                             counters, global sequence and shard loads, per-shard meta (write_pos,
                             n_records, holes), selector max priority and RNG state
        shard{i}/{field}     live steps of shard i in position order, [n_live, *field_shape]
        shard{i}/steps       their record id, commit sequence and flags, int64 [n_live, 3]
        shard{i}/records     live episode records, int64 [E, 4]
        shard{i}/priority, times_sampled, state   the selector's per-item state, [n_live]

Positions are absolute, so a restored store puts every step back in the slot it had: keys drawn
before the checkpoint stay valid (or stale) exactly as before, and the generation stamps round-trip.

Atomicity: a checkpoint is written into ``path/.tmp-*``, renamed to ``path/ckpt-NNNNNN`` (one rename),
and only then named in ``LATEST`` (written to a temporary file, fsync'd and ``os.replace``d). A
process killed at any point leaves ``LATEST`` naming the previous complete checkpoint; leftovers are
removed by the next checkpoint. Older checkpoints are deleted once the new one is named.

The state comes from each part's ``state_dict()`` (`replay.storage.Control`,
`replay.shard.ShardStorage`, `replay.table.Table`); `save` takes it from a context manager that holds
the store quiescent while the arrays are written (`replay.store.ReplayStore.checkpoint`: the selector,
every shard and the control block locked, as Reverb's tables are). `load` returns the same state,
arrays read lazily, for `replay.store.ReplayStore.restore` to hand to each part's
``load_state_dict()``. See docs/architecture.md#checkpoints.

References
----------
DeepMind Reverb's checkpointing (tables, items, rate-limiter counters); zarr v3.
"""

from __future__ import annotations

import math
import os
import shutil
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from replay._files import fsync_dir

__all__ = ["VERSION", "fsync_dir", "load", "save"]

VERSION = 1
_CHUNK_BYTES = 16 * 2**20
_PER_ITEM = ("priority", "times_sampled", "state")


def _write_array(group: Any, name: str, parts: list[np.ndarray], shape: tuple[int, ...], dtype: Any) -> None:
    """Create ``group[name]`` of ``shape`` and fill it from ``parts`` concatenated along axis 0."""
    row = math.prod(shape[1:]) * np.dtype(dtype).itemsize
    chunk0 = max(1, min(shape[0], _CHUNK_BYTES // max(1, row))) if shape[0] else 1
    arr = group.create_array(
        name,
        shape=shape,
        dtype=dtype,
        chunks=(chunk0, *(max(1, d) for d in shape[1:])),
        compressors=None,
        fill_value=np.zeros((), dtype=dtype).item(),
    )
    start = 0
    for p in parts:
        if len(p):
            arr[start : start + len(p)] = p
        start += len(p)


def _latest(path: Path) -> Path:
    marker = path / "LATEST"
    if not marker.is_file() and (path / "MANIFEST.json").is_file():  # replay.distributed's layout
        raise ValueError(
            f"{path} holds a Ray-backed store's checkpoint (MANIFEST.json, no LATEST): "
            "use replay.distributed.RayReplayStore.restore(path)"
        )
    if not marker.is_file():
        raise FileNotFoundError(f"no complete replay checkpoint under {path} (no LATEST file)")
    name = marker.read_text().strip()
    folder = path / name
    if not name.startswith("ckpt-") or not folder.is_dir():
        raise FileNotFoundError(f"{marker} names {name!r}, which is not a checkpoint folder under {path}")
    return folder


def _write_state(group: Any, state: dict[str, Any]) -> None:
    """The zarr group of a checkpoint from a store's state (see the module docstring)."""
    config = state["config"]
    spec = config["spec"]  # {field: [shape, dtype]}
    table = state["table"]
    meta = []
    for s, shard in enumerate(state["shards"]):
        g = group.require_group(f"shard{s}")
        n = sum(len(p) for p in shard["steps"])
        for name, (shape, dtype) in spec.items():
            _write_array(g, name, shard["columns"][name], (n, *shape), dtype)
        _write_array(g, "steps", shard["steps"], (n, 3), np.int64)
        _write_array(g, "records", [shard["records"]], shard["records"].shape, np.int64)
        for name in _PER_ITEM:
            parts = table["shards"][s][name]
            _write_array(g, name, parts, (n,), parts[0].dtype)
        meta.append({k: shard[k] for k in ("write_pos", "n_records", "holes", "commits")})
    group.attrs["replay"] = {
        "version": VERSION,
        **config,
        **state["control"],
        "shards": meta,
        "max_priority": table["max_priority"],
        "rng": table["rng"],
        "incarnation": table["incarnation"],
    }


def save(path: str | os.PathLike[str], snapshot: AbstractContextManager[dict[str, Any]]) -> str:
    """Write a store's state to a new checkpoint under ``path`` atomically; return its folder.

    Parameters
    ----------
    path : str or path
        Checkpoint root (created if missing); previous checkpoints in it are replaced.
    snapshot : context manager
        Entered, it yields the store's state ``{"config", "control", "shards", "table"}`` (each
        part's ``state_dict()``, arrays as row blocks) and keeps it unchanged until exited.

    Returns
    -------
    str
        The new ``path/ckpt-NNNNNN`` folder.

    Raises
    ------
    OSError
        The files cannot be written (the previous checkpoint stays the latest).
    """
    import zarr
    from zarr.storage import LocalStore

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a checkpoint that was killed
        shutil.rmtree(stale, ignore_errors=True)
    try:
        number = int(_latest(root).name.split("-")[1]) + 1
    except (FileNotFoundError, ValueError, IndexError):
        number = 0
    tmp = root / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with snapshot as state:
        _write_state(zarr.open_group(LocalStore(tmp), mode="w", zarr_format=3), state)
    for dirpath, _, _ in os.walk(tmp):
        fsync_dir(Path(dirpath))
    final = root / f"ckpt-{number:06d}"
    if final.exists():  # a folder left by a checkpoint killed between rename and LATEST
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(root)
    marker_tmp = root / f".tmp-LATEST-{uuid.uuid4().hex[:8]}"
    with open(marker_tmp, "w") as fh:
        fh.write(final.name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(marker_tmp, root / "LATEST")
    fsync_dir(root)
    for old in root.glob("ckpt-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return str(final)


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state saved in the latest complete checkpoint under ``path``, as `save` was given it.

    ``config`` and ``control`` are plain data; per shard, ``shards[s]`` (for
    `replay.shard.ShardStorage.load_state_dict`) and ``table["shards"][s]`` hold zarr arrays, read
    when indexed (``[...]``).

    Raises
    ------
    FileNotFoundError
        No complete checkpoint under ``path``.
    ValueError
        A checkpoint of another format version, or a Ray-backed store's checkpoint.
    """
    import zarr
    from zarr.storage import LocalStore

    folder = _latest(Path(path))
    group = zarr.open_group(LocalStore(folder, read_only=True), mode="r")
    attrs = dict(group.attrs["replay"])
    if attrs.get("version") != VERSION:
        raise ValueError(f"{folder}: checkpoint format version {attrs.get('version')}, expected {VERSION}")
    config_keys = (
        "spec",
        "capacity",
        "num_shards",
        "selector",
        "rate_limiter",
        "max_times_sampled",
        "chunk_steps",
        "timeout",
    )
    config = {k: attrs[k] for k in config_keys}
    shards, per_item = [], []
    for s, m in enumerate(attrs["shards"]):
        g = group[f"shard{s}"]
        shards.append(
            {
                "columns": {name: g[name] for name in config["spec"]},
                "steps": g["steps"],
                "records": g["records"],
                **{k: int(m[k]) for k in ("write_pos", "n_records", "holes", "commits")},
            }
        )
        per_item.append({name: g[name] for name in _PER_ITEM})
    return {
        "config": config,
        "control": {k: attrs[k] for k in ("counters", "global_seq", "writers", "assigned")},
        "shards": shards,
        "table": {
            "shards": per_item,
            "max_priority": attrs["max_priority"],
            "rng": attrs["rng"],
            "incarnation": int(attrs.get("incarnation", 0)),
        },
    }

"""Checkpoint and restore a ReplayStore with zarr: data, episode index, selector state, counters (DESIGN §4).

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

While a checkpoint is written the store is quiescent: the selector, every shard and the control
block are locked (writers in other processes and samplers wait), as Reverb's tables are. Steps still
staged in writers (not committed) are not part of the checkpoint; episodes left open stay open.

References
----------
DeepMind Reverb's checkpointing (tables, items, rate-limiter counters); zarr v3.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from replay._files import fsync_dir
from replay.rate_limiter import rate_limiter_from_config
from replay.selectors import selector_from_config
from replay.spec import TrajectorySpec
from replay.storage import COMMITS, GSEQ, HOLES, N_RECORDS, REC_ID, RESERVE_POS, WRITE_POS, WRITERS

if TYPE_CHECKING:
    from replay.store import ReplayStore

__all__ = ["fsync_dir", "load", "save"]

VERSION = 1
_CHUNK_BYTES = 16 * 2**20


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


def _live_parts(ring: np.ndarray, lo: int, hi: int) -> list[np.ndarray]:
    """Rows of positions [lo, hi) of a ring, in position order: one or two slices (no copy)."""
    cap = ring.shape[0]
    if hi <= lo:
        return [ring[:0]]
    a, b = lo % cap, (hi - 1) % cap + 1
    return [ring[a:b]] if a < b else [ring[a:], ring[:b]]


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


def save(store: ReplayStore, path: str | os.PathLike[str]) -> str:
    """Write ``store`` to a new checkpoint under ``path`` atomically; return the checkpoint's folder.

    Parameters
    ----------
    store : ReplayStore
        The owning store.
    path : str or path
        Checkpoint root (created if missing); previous checkpoints in it are replaced.

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
    core = store._core
    shards = core.shards
    with store._sel_lock:
        for sh in shards:
            sh.acquire()
        try:
            core.control.cond.acquire()
            try:
                for s in range(len(shards)):
                    store._ingest(s)
                group = zarr.open_group(LocalStore(tmp), mode="w", zarr_format=3)
                sel = store._selector
                meta = []
                for s, sh in enumerate(shards):
                    wp, floor = sh.write_pos, sh.floor
                    n = wp - floor
                    g = group.require_group(f"shard{s}")
                    for name, f in core.spec.items():
                        _write_array(
                            g, name, _live_parts(sh.columns[name], floor, wp), (n, *f.shape), f.dtype
                        )
                    _write_array(g, "steps", _live_parts(sh.steps, floor, wp), (n, 3), np.int64)
                    live = sh.live_records()
                    recs = (
                        sh.records[live[:, REC_ID] % sh.capacity] if len(live) else np.zeros((0, 4), np.int64)
                    )
                    _write_array(g, "records", [recs], recs.shape, np.int64)
                    for name, arr in (
                        ("priority", sel.priority),
                        ("times_sampled", sel.times),
                        ("state", sel.state),
                    ):
                        _write_array(g, name, _live_parts(arr[s], floor, wp), (n,), arr.dtype)
                    meta.append(
                        {
                            "write_pos": wp,
                            "n_records": int(sh.meta[N_RECORDS]),
                            "holes": int(sh.meta[HOLES]),
                            "commits": int(sh.meta[COMMITS]),
                        }
                    )
                ctl = core.control
                group.attrs["replay"] = {
                    "version": VERSION,
                    "spec": core.spec.to_config(),
                    "capacity": core.capacity,
                    "num_shards": len(shards),
                    "selector": store.selector.to_config(),
                    "rate_limiter": store.rate_limiter.to_config(),
                    "max_times_sampled": store.max_times_sampled,
                    "chunk_steps": core.chunk_steps,
                    "timeout": core.timeout,
                    "counters": {
                        "inserts": int(ctl.counters[0]),
                        "samples": int(ctl.counters[1]),
                        "deletes": int(ctl.counters[2]),
                    },
                    "global_seq": int(ctl.ctl[GSEQ]),
                    "writers": int(ctl.ctl[WRITERS]),
                    "assigned": [int(x) for x in ctl.assigned],
                    "shards": meta,
                    "max_priority": sel.max_priority,
                    "rng": json.dumps(sel.rng.bit_generator.state),
                    "incarnation": store._incarnation,
                }
            finally:
                core.control.cond.release()
        finally:
            for sh in reversed(shards):
                sh.release()
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


def load(path: str | os.PathLike[str], memory: Any = None, **overrides: Any) -> ReplayStore:
    """A new store (the caller owns it) holding the latest complete checkpoint under ``path``.

    Parameters
    ----------
    path : str or path
        The checkpoint root given to `save`.
    memory : MemoryManager, optional
        For the new store's regions.
    **overrides
        ``ReplayStore`` keywords to change (``tier``, ``timeout``, ``seed``, ``staging_slots``).

    Raises
    ------
    FileNotFoundError
        No complete checkpoint under ``path``.
    ValueError
        A checkpoint of another format version.
    """
    import zarr
    from zarr.storage import LocalStore

    from replay.keys import INC_BITS
    from replay.store import ReplayStore

    folder = _latest(Path(path))
    group = zarr.open_group(LocalStore(folder, read_only=True), mode="r")
    cfg = dict(group.attrs["replay"])
    if cfg.get("version") != VERSION:
        raise ValueError(f"{folder}: checkpoint format version {cfg.get('version')}, expected {VERSION}")
    spec = TrajectorySpec.from_config(cfg["spec"])
    cap, num_shards = int(cfg["capacity"]), int(cfg["num_shards"])
    kwargs = {
        "max_times_sampled": int(cfg["max_times_sampled"]),
        "chunk_steps": int(cfg["chunk_steps"]),
        "timeout": cfg["timeout"],
    }
    kwargs.update(overrides)
    store = ReplayStore(
        spec,
        cap * num_shards,
        num_shards,
        selector=selector_from_config(cfg["selector"]),
        rate_limiter=rate_limiter_from_config(cfg["rate_limiter"]),
        memory=memory,
        **kwargs,
    )
    try:
        core = store._core
        sel = store._selector
        state = {
            "priority": np.zeros((num_shards, cap)),
            "times_sampled": np.zeros((num_shards, cap), np.int64),
            "state": np.zeros((num_shards, cap), np.uint8),
            "seq": np.zeros((num_shards, cap), np.int64),
            "max_priority": float(cfg["max_priority"]),
            "rng": json.loads(cfg["rng"]),
        }
        for s, sh in enumerate(core.shards):
            m = cfg["shards"][s]
            wp = int(m["write_pos"])
            floor = max(0, wp - cap)
            slots = np.arange(floor, wp) % cap
            g = group[f"shard{s}"]
            with sh:
                for name in spec:
                    sh.columns[name][slots] = g[name][...]
                sh.steps[slots] = g["steps"][...]
                recs = g["records"][...]
                sh.records[recs[:, REC_ID] % cap] = recs
                sh.meta[WRITE_POS] = sh.meta[RESERVE_POS] = wp
                sh.meta[N_RECORDS] = int(m["n_records"])
                sh.meta[HOLES] = int(m["holes"])
                sh.meta[COMMITS] = int(m["commits"])
            for name in ("priority", "times_sampled", "state"):
                state[name][s, slots] = g[name][...]
            state["seq"][s, slots] = sh.steps[slots, 1]
            store._ingested[s] = wp
        sel.load_state_dict(state)
        ctl = core.control
        with ctl.cond:
            c = cfg["counters"]
            ctl.counters[0], ctl.counters[1], ctl.counters[2] = (
                int(c["inserts"]),
                int(c["samples"]),
                int(c["deletes"]),
            )
            ctl.ctl[GSEQ] = int(cfg["global_seq"])
            ctl.ctl[WRITERS] = int(cfg["writers"])
            ctl.assigned[:] = cfg["assigned"]
            ctl.open[:] = 0  # the writers of the checkpointed store are gone
            ctl.cond.notify_all()
        # positions written after the checkpoint will be reused: keys drawn before now must not apply
        store._incarnation = (int(cfg.get("incarnation", 0)) + 1) % (1 << INC_BITS)
        store._restored_at = np.array([int(m["write_pos"]) for m in cfg["shards"]], dtype=np.int64)
    except BaseException:
        store.close()
        raise
    return store

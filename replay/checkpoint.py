"""Checkpoint files of a ReplayStore with zarr: data, episode index, selector state, counters.

Layout of a checkpoint folder ``path/``::

    path/LATEST              "ckpt-000007 <sha256 of its INTEGRITY.json>" (replaced atomically)
    path/ckpt-000006/        the previous checkpoint (kept: restorable by its own path)
    path/ckpt-000007/        a zarr v3 group (uncompressed):
        INTEGRITY.json       the manifest: size and sha256 of every other file of the folder, and the
                             counts that tie the parts together (`replay.checkpoint_invariants`), sealed
                             with the sha256 of its own content (`replay._files.seal`)
        attrs                settings (spec, capacity, shards, selector, rate limiter, ...), rate-limiter
                             counters, sequence, shard loads and meta, selector max priority and RNG,
                             incarnation, store id and lineage (the issuers of keys it accepts)
        shard{i}/{field}     live steps of shard i in position order, [n_live, *field_shape]
        shard{i}/steps       their record id, commit sequence and flags, int64 [n_live, 3]
        shard{i}/records     live episode records, int64 [E, 4]
        shard{i}/priority, times_sampled, state   the selector's per-item state, [n_live]

Positions are absolute, so a restored store puts every step back in the slot it had: keys drawn
before the checkpoint stay valid (or stale) exactly as before, and the generation stamps round-trip.

Atomicity: a checkpoint is written into ``path/.tmp-*``, sealed, fsync'd, renamed to
``path/ckpt-NNNNNN`` (one rename), and only then named in ``LATEST`` (a temporary file, fsync'd and
``os.replace``d). A process killed at any point leaves ``LATEST`` naming the previous complete
checkpoint; leftovers are removed by the next one (temporaries only of processes that have ended),
which keeps the checkpoint it replaces and deletes the older ones. Concurrent saves into one root
are serialised on a ``flock`` of the root folder (`root_lock`), each into its own new number.

Integrity: `load` verifies every file (none missing, truncated, altered, or unexpected), the manifest
against ``LATEST``, the counts and the episode index's invariants, all before a store is sized from
it, and raises `CheckpointError` (a ``ValueError``) naming the checkpoint, the file and the fault,
and the older checkpoint that is intact, if any. `save` takes the state from a context manager that
holds the store quiescent (`replay.store.ReplayStore.checkpoint`); `load` gives it back for each
part's ``load_state_dict()``. See docs/architecture.md#checkpoints.

References
----------
DeepMind Reverb's checkpointing (tables, items, rate-limiter counters); zarr v3; content-addressed
manifests of file checksums, as in git's trees and OCI image manifests.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np

from replay._files import CheckpointError, check_files, file_table, fsync_dir, seal, unseal
from replay.checkpoint_invariants import check_state, expected_counts
from replay.chunk_state import ChunkState

__all__ = [
    "INTEGRITY",
    "VERSION",
    "CheckpointError",
    "fsync_dir",
    "latest",
    "load",
    "reading",
    "root_lock",
    "save",
    "verify",
]

logger = logging.getLogger(__name__)

VERSION = 3  # 3: a codec field's chunk records carry their checksum (`replay.chunk_state.chunk_state_fault`)
FORMAT = "graphrl.replay"
INTEGRITY = "INTEGRITY.json"
_CHUNK_BYTES = 4 * 2**20
_PER_ITEM = ("priority", "times_sampled", "state")
_CONFIG_KEYS = (
    "spec",
    "capacity",
    "num_shards",
    "selector",
    "rate_limiter",
    "max_times_sampled",
    "chunk_steps",
    "timeout",
)


def _write_array(group: Any, name: str, parts: list[np.ndarray], shape: tuple[int, ...], dtype: Any) -> None:
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
    chunk0 = max(1, min(n, _CHUNK_BYTES // max(1, row))) if n else 1
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


def _number(name: str) -> int:
    """``ckpt-000007`` -> 7 (ValueError for any other name)."""
    head, _, digits = name.partition("-")
    if head != "ckpt" or len(digits) != 6 or not digits.isdigit():
        raise ValueError(name)
    return int(digits)


def _folders(root: Path) -> list[Path]:
    """The ``ckpt-NNNNNN`` folders under ``root``, newest first."""
    found = []
    for p in root.glob("ckpt-*"):
        try:
            found.append((_number(p.name), p))
        except ValueError:
            continue
    return [p for _, p in sorted(found, reverse=True) if p.is_dir()]


def _read_latest(root: Path) -> tuple[str, str]:
    """``LATEST``'s checkpoint name and manifest digest (CheckpointError if it is damaged)."""
    marker = root / "LATEST"
    raw = marker.read_bytes()[:4096]
    words = raw.decode("ascii", errors="replace").split()
    old = root / words[0] if len(words) == 1 else None
    if old is not None and (old / "zarr.json").is_file() and not (old / INTEGRITY).exists():
        raise CheckpointError(
            f"checkpoint {old} has no {INTEGRITY}: it was written by format version 1, which "
            "recorded no checksums, and cannot be verified",
            str(old),
            (INTEGRITY,),
        )
    if len(words) != 2 or len(words[1]) != 64:
        raise CheckpointError(
            f"checkpoint root {root}: LATEST is damaged (truncated or altered: {raw[:80]!r}); "
            "it must name a checkpoint and its manifest's sha256",
            str(root),
            ("LATEST",),
        )
    try:
        _number(words[0])
    except ValueError:
        raise CheckpointError(
            f"checkpoint root {root}: LATEST names {words[0]!r}, which is not a checkpoint name",
            str(root),
            ("LATEST",),
        ) from None
    return words[0], words[1]


def verify(folder: str | os.PathLike[str], digest: str | None = None) -> dict[str, Any]:
    """Verify one checkpoint folder's files against its manifest; return the manifest.

    Parameters
    ----------
    folder : str or path
        A ``ckpt-NNNNNN`` folder.
    digest : str, optional
        The manifest's sha256 that ``LATEST`` recorded (checked when given).

    Raises
    ------
    CheckpointError
        The manifest is missing, altered or of another checkpoint, or a file is missing, truncated,
        grown, altered or unexpected (every such file is named).
    """
    folder = Path(folder)
    name = str(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {name} is missing (no such folder)", name)
    body, got = unseal(folder / INTEGRITY, name)
    if body.get("format") != FORMAT or body.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {name}: {INTEGRITY} is of format {body.get('format')!r} version "
            f"{body.get('version')}, expected {FORMAT!r} version {VERSION}"
            + (" (an older format: its compressed chunks carry no checksums, so this version cannot verify "
               "or restore it)" if body.get("format") == FORMAT and body.get("version") == 2 else ""),
            name,
            (INTEGRITY,),
        )
    if body.get("checkpoint") != folder.name:
        raise CheckpointError(
            f"checkpoint {name}: {INTEGRITY} is the manifest of {body.get('checkpoint')!r} (folders swapped)",
            name,
            (INTEGRITY,),
        )
    if digest is not None and got != digest:
        raise CheckpointError(
            f"checkpoint {name}: {INTEGRITY} is not the manifest LATEST recorded (sha256 {got[:12]}..., "
            f"LATEST says {digest[:12]}...): the folder was replaced",
            name,
            (INTEGRITY,),
        )
    if not isinstance(body.get("files"), dict) or not isinstance(body.get("counts"), dict):
        raise CheckpointError(f"checkpoint {name}: {INTEGRITY} lacks files or counts", name, (INTEGRITY,))
    problems = check_files(folder, body["files"], skip=(INTEGRITY,))
    if problems:
        more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        raise CheckpointError(
            f"checkpoint {name} is damaged: " + "; ".join(problems[:8]) + more,
            name,
            tuple(p.split(": ", 1)[0] for p in problems),
        )
    return body


def _intact_older(root: Path, skip: Path | None) -> str | None:
    """The newest checkpoint folder under ``root`` other than ``skip`` whose files verify."""
    for folder in _folders(root):
        if skip is not None and folder == skip:
            continue
        try:
            verify(folder)
        except CheckpointError:
            continue
        return str(folder)
    return None


def _with_intact(err: CheckpointError, root: Path, skip: Path | None) -> CheckpointError:
    """``err`` naming the newest intact checkpoint but ``skip`` ("older" only beside a damaged ``skip``)."""
    found = _intact_older(root, skip)
    which = f"the older checkpoint {found}" if skip else f"checkpoint {found} (the newest that verifies)"
    hint = f"; {which} is intact: ReplayStore.restore({found!r}) restores it" if found else (
        f"; no {'older ' if skip else ''}intact checkpoint under {root}")
    return CheckpointError(str(err) + hint, err.checkpoint, err.files, found)


def latest(path: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """The checkpoint folder `load` reads for ``path`` (a root with ``LATEST``, or a ``ckpt-NNNNNN``
    folder itself) and the manifest digest ``LATEST`` recorded (None for a folder given directly).

    Raises
    ------
    FileNotFoundError
        No checkpoint at all under ``path``.
    ValueError
        ``path`` holds a Ray-backed store's checkpoint.
    CheckpointError
        ``LATEST`` is missing (checkpoint folders are there), damaged, or names no folder.
    """
    root = Path(path)
    if (root / "LATEST").is_file():
        try:
            name, digest = _read_latest(root)
        except CheckpointError as e:
            raise _with_intact(e, root, None) from None
        return root / name, digest
    if (root / INTEGRITY).is_file() or ((root / "zarr.json").is_file() and root.name.startswith("ckpt-")):
        return root, None
    if (root / "MANIFEST.json").is_file():  # replay.distributed's layout
        raise ValueError(
            f"{root} holds a Ray-backed store's checkpoint (MANIFEST.json, no LATEST): "
            "use replay.distributed.RayReplayStore.restore(path)"
        )
    if _folders(root):
        err = CheckpointError(f"checkpoint root {root}: LATEST is missing", str(root), ("LATEST",))
        raise _with_intact(err, root, None)
    raise FileNotFoundError(f"no complete replay checkpoint under {root} (no LATEST file)")


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale_temporaries(root: Path) -> list[Path]:
    """The ``.tmp-<pid>-*`` folders and ``.tmp-LATEST-<pid>-*`` files under ``root`` whose process has
    ended (a checkpoint killed part way); those of live processes (a checkpoint in progress) and names
    without a pid are left alone."""
    stale = []
    for p in root.glob(".tmp-*"):
        parts = p.name.split("-")  # ['.tmp', pid, hex] or ['.tmp', 'LATEST', pid, hex]
        pid = parts[2] if len(parts) == 4 and parts[1] == "LATEST" else parts[1] if len(parts) == 3 else ""
        if pid.isdigit() and not _pid_alive(int(pid)):
            stale.append(p)
    return stale


@contextmanager
def root_lock(root: Path, shared: bool = False) -> Iterator[None]:
    """Hold a ``flock`` on the checkpoint root folder itself (no lock file is left behind).

    Every `save` into ``root`` holds it exclusively, so saves of any threads, stores and processes of
    this host into one root run one after the other. A restore holds it shared (`reading`) while it
    reads, so no save deletes the folder it reads. A file system that refuses ``flock`` on a folder (some
    network file systems) gets no cross-process lock: the store's own lock still serialises the
    calls of one store (`replay.store.ReplayStore.checkpoint`).
    """
    fd = os.open(root, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        except OSError as exc:  # EBADF / ENOLCK / EOPNOTSUPP on file systems without folder locks
            logger.debug("checkpoint root %s: no flock (%s); others' saves not serialised", root, exc)
        yield
    finally:
        with suppress(OSError):  # by name: a process forked meanwhile (a DataLoader worker) holds a copy of
            fcntl.flock(fd, fcntl.LOCK_UN)  # ``fd``, and closing ours alone would leave the root locked
        os.close(fd)


@contextmanager
def reading(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the lock of the root of the checkpoint ``path`` names (`latest`), shared, for the block: a
    restore reads its columns lazily after `load`, and a save's retention waits instead of deleting the
    folder under it (zarr would read the missing chunks as zeros).

    Raises
    ------
    FileNotFoundError, ValueError, CheckpointError
        As `latest`.
    """
    folder, _ = latest(path)
    with root_lock(folder.parent, shared=True):
        yield


def save(path: str | os.PathLike[str], snapshot: AbstractContextManager[dict[str, Any]]) -> str:
    """Write a store's state to a new checkpoint under ``path`` atomically; return its folder.

    Concurrent saves into one root (threads, stores or processes of one host) are serialised on a lock
    of the root folder (`root_lock`): each gets its own ``ckpt-NNNNNN`` (one more than both the number
    ``LATEST`` names and the newest folder there), and ``LATEST`` always names a complete checkpoint.
    A save removes only the temporary files of processes that have ended, never one in progress.

    Parameters
    ----------
    path : str or path
        Checkpoint root (created if missing). The checkpoint ``LATEST`` named stays (the previous
        one); older ones are deleted once the new one is named.
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
        The files cannot be written (the previous checkpoint stays the latest; this call's temporary
        folder is removed).
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    with root_lock(root):
        for stale in _stale_temporaries(root):  # left by a checkpoint that was killed
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
        tmp = root / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            return _save_locked(root, tmp, snapshot)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _save_locked(root: Path, tmp: Path, snapshot: AbstractContextManager[dict[str, Any]]) -> str:
    """`save` under the root's lock: write ``tmp``, seal, rename to a new number, name it in LATEST."""
    import zarr
    from zarr.storage import LocalStore

    folders = _folders(root)
    newest = _number(folders[0].name) if folders else -1  # a folder renamed but never named counts
    try:
        previous: str | None = _read_latest(root)[0]
        number = max(_number(previous), newest) + 1
    except (OSError, CheckpointError):  # no LATEST, or a damaged one: keep the newest folder there is
        previous = folders[0].name if folders else None
        number = newest + 1
    final = root / f"ckpt-{number:06d}"
    with snapshot as state:
        group = zarr.open_group(LocalStore(tmp), mode="w", zarr_format=3)
        _write_state(group, state)
        counts = expected_counts(state)
    body = {"format": FORMAT, "version": VERSION, "checkpoint": final.name, "counts": counts}
    digest = seal(tmp / INTEGRITY, {**body, "files": file_table(tmp)})
    for dirpath, _, _ in os.walk(tmp):
        fsync_dir(Path(dirpath))
    os.rename(tmp, final)  # a new number: nothing of another checkpoint is replaced
    marker_tmp = root / f".tmp-LATEST-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        fsync_dir(root)
        with open(marker_tmp, "w") as fh:
            fh.write(f"{final.name} {digest}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(marker_tmp, root / "LATEST")
    except BaseException:  # a full disk, a signal: the folder LATEST never named goes, with the marker
        marker_tmp.unlink(missing_ok=True)
        try:
            named = _read_latest(root)[0] == final.name
        except (OSError, CheckpointError):
            named = False
        if not named:
            shutil.rmtree(final, ignore_errors=True)
        raise
    fsync_dir(root)
    for old in _folders(root):
        if old.name not in (final.name, previous):
            shutil.rmtree(old, ignore_errors=True)
    return str(final)


def _write_state(group: Any, state: dict[str, Any]) -> None:
    """The zarr group of a checkpoint from a store's state (see the module docstring)."""
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
                _write_array(g, f"{name}.chunks", [c["chunks"]], c["chunks"].shape, np.int64)
                _write_array(g, f"{name}.blob", [c["blob"]], c["blob"].shape, np.uint8)
                _write_array(g, f"{name}.tail", [c["tail"]], c["tail"].shape, dtype)
            else:
                _write_array(g, name, shard["columns"][name], (n, *shape), dtype)
        _write_array(g, "steps", shard["steps"], (n, 3), np.int64)
        _write_array(g, "records", [shard["records"]], shard["records"].shape, np.int64)
        for name in _PER_ITEM:
            parts = table["shards"][s][name]
            _write_array(g, name, parts, (n,), parts[0].dtype)
        meta.append({k: shard[k] for k in ("write_pos", "n_records", "holes", "commits")})
        meta[-1]["chunk_next"] = {n: int(c["next_position"]) for n, c in shard.get("chunks", {}).items()}
    group.attrs["replay"] = {
        "version": VERSION,
        **config,
        **state["control"],
        "shards": meta,
        "max_priority": table["max_priority"],
        "rng": table["rng"],
        "incarnation": table["incarnation"],
        "store_id": table["store_id"],
        "lineage": table["lineage"],
    }


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state saved in the latest complete checkpoint under ``path`` (or in the checkpoint folder
    ``path``), as `save` was given it, verified.

    ``config`` and ``control`` are plain data; ``shards[s]`` (`replay.shard.ShardStorage.load_state_dict`)
    holds ``steps`` and ``records`` as numpy arrays, field columns as zarr arrays (read when indexed,
    ``[...]``), codec fields' chunks as checked `replay.chunk_state.ChunkState`; ``table["shards"][s]`` numpy.
    Every file is verified against the manifest before anything is read, and the state against the
    manifest's counts and the episode index's invariants before it is returned.

    Raises
    ------
    FileNotFoundError
        No checkpoint under ``path``.
    ValueError
        A Ray-backed store's checkpoint.
    CheckpointError
        A damaged checkpoint (see `verify` and `replay.checkpoint_invariants.check_state`); the message
        names the older checkpoint that is intact, if any.
    """
    folder, digest = latest(path)
    root = folder.parent
    try:
        manifest = verify(folder, digest)
        state = _read_state(folder)
        check_state(str(folder), manifest["counts"], state)
        _check_chunks(str(folder), state)
    except CheckpointError as e:
        raise _with_intact(e, root, folder) from None
    return state


def _check_chunks(name: str, state: dict[str, Any]) -> None:
    """Check every codec field's chunks against their records' checksums (chunks changed in memory before
    the seal, which the manifest cannot see): each becomes a `replay.chunk_state.ChunkState`, checked once."""
    for s, shard in enumerate(state["shards"]):
        for field, c in shard["chunks"].items():
            try:
                shard["chunks"][field] = ChunkState.of(c)
            except ValueError as exc:
                raise CheckpointError(
                    f"checkpoint {name}: shard{s}/{field}.blob (field {field!r}): {exc}",
                    name,
                    (f"shard{s}/{field}.blob", f"shard{s}/{field}.chunks"),
                ) from None


def _read_state(folder: Path) -> dict[str, Any]:
    """The state of a verified checkpoint folder (index and selector arrays read, columns lazy)."""
    import zarr
    from zarr.storage import LocalStore

    name = str(folder)
    try:
        group = zarr.open_group(LocalStore(folder, read_only=True), mode="r")
        attrs = dict(group.attrs["replay"])
        if attrs.get("version") != VERSION:
            raise CheckpointError(
                f"checkpoint {name}: format version {attrs.get('version')}, expected {VERSION}",
                name,
                ("zarr.json",),
            )
        config = {k: attrs[k] for k in _CONFIG_KEYS}
        shards, per_item = [], []
        for s, m in enumerate(attrs["shards"][: int(config["num_shards"])]):
            g = group[f"shard{s}"]
            shards.append(
                {
                    "columns": {n: g[n] for n, e in config["spec"].items() if len(e) == 2},
                    "chunks": {
                        n: {
                            "chunks": np.asarray(g[f"{n}.chunks"][...]),
                            "blob": np.asarray(g[f"{n}.blob"][...]),
                            "tail": np.asarray(g[f"{n}.tail"][...]),
                            "next_position": int(m["chunk_next"][n]),
                        }
                        for n, e in config["spec"].items()
                        if len(e) > 2
                    },
                    "steps": np.asarray(g["steps"][...]),
                    "records": np.asarray(g["records"][...]),
                    **{k: int(m[k]) for k in ("write_pos", "n_records", "holes", "commits")},
                }
            )
            per_item.append({n: np.asarray(g[n][...]) for n in _PER_ITEM})
        return {
            "config": config,
            "control": {k: attrs[k] for k in ("counters", "global_seq", "writers", "assigned")},
            "shards": shards,
            "table": {
                "shards": per_item,
                "max_priority": float(attrs["max_priority"]),
                "rng": attrs["rng"],
                "incarnation": int(attrs.get("incarnation", 0)),
                "store_id": attrs.get("store_id"),  # absent in checkpoints made before store ids
                "lineage": attrs.get("lineage", []),
            },
        }
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - any fault of a verified folder's metadata is the checkpoint's
        raise CheckpointError(f"checkpoint {name}: its zarr metadata is inconsistent: {e!r}", name) from None

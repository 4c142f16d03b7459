"""The Ray replay store's checkpoint manifest: one folder of shard checkpoints, named atomically.

Layout under the user's ``path``::

    MANIFEST.json            {"format": "graphrl.replay.ray", "version": 1, "checkpoint": "ckpt-000003",
                              "shards": ["shard-000", ...], spec, settings, counters, the client's rng}
    ckpt-000003/shard-000/   each shard's local checkpoint (`replay.checkpoint`)

`write` pauses inserts on every shard, has each write its local checkpoint into the next
``ckpt-NNNNNN`` folder (`new_folder`) and resumes them; `publish` fsyncs it,
writes the manifest to a temporary file (fsync'd, ``os.replace``'d, the folder fsync'd) and deletes the
older folders, so a checkpoint interrupted part way leaves the previous one named and whole.
`read_manifest` and `restore_arguments` are the way back (`RayReplayStore.restore`). On a cluster of
several machines ``path`` must be a file system every node sees (NFS, a mounted bucket). Reverb's
checkpoints (one manifest naming the tables' files) are the model; see docs/architecture.md#checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay._files import fsync_dir
from replay.rate_limiter import rate_limiter_from_config
from replay.selectors import selector_from_config
from replay.spec import TrajectorySpec

if TYPE_CHECKING:
    from replay.distributed.group import ShardGroup

__all__ = [
    "FORMAT",
    "MANIFEST",
    "RESTORE_KEYWORDS",
    "VERSION",
    "new_folder",
    "publish",
    "read_manifest",
    "restore_arguments",
    "shard_dir",
    "write",
]

MANIFEST = "MANIFEST.json"
FORMAT = "graphrl.replay.ray"
VERSION = 1
RESTORE_KEYWORDS = ("timeout", "seed", "staging_slots", "tier", "max_restarts", "actor_options", "prefetch")
SETTINGS = ("max_times_sampled", "chunk_steps", "timeout", "tier", "seed")  # kept in the manifest


def shard_dir(s: int) -> str:
    """Shard ``s``'s folder in a checkpoint (``shard-003``)."""
    return f"shard-{s:03d}"


def new_folder(root: Path) -> Path:
    """The next checkpoint's folder under ``root`` (``ckpt-NNNNNN``, one past the manifest's), emptied."""
    try:
        number = int(json.loads((root / MANIFEST).read_text())["checkpoint"].split("-")[1]) + 1
    except (FileNotFoundError, ValueError, KeyError, IndexError):
        number = 0
    folder = root / f"ckpt-{number:06d}"
    if folder.exists():
        shutil.rmtree(folder)
    return folder


def write(
    shards: ShardGroup, root: Path, timeout: float | None, settings: Callable[[], dict[str, Any]]
) -> Path:
    """Write one checkpoint of every shard under ``root`` and name it in the manifest; return its folder.

    Inserts pause on every shard (waiting up to ``timeout`` for shipments in progress) while each
    writes its local checkpoint into ``ckpt-NNNNNN/shard-III/``; ``settings()`` (the client's state:
    spec, settings, counters, rng) is read before inserts resume; then `publish`. The shards' folders
    become what a restarted shard reloads (``shards.folders``).

    Raises
    ------
    ShardError
        A shard's actor died (the previous checkpoint stays the latest).
    OSError
        The files could not be written (the previous checkpoint stays the latest).
    """
    folder = new_folder(root)
    every = range(len(shards))
    dirs = [str(folder / shard_dir(s)) for s in every]
    try:
        shards.call([(s, "pause", (timeout,)) for s in every], "checkpoint() (pause)")
        done = shards.call([(s, "checkpoint", (dirs[s],)) for s in every], "checkpoint()")
        manifest = {
            "num_shards": len(shards),
            "shards": [shard_dir(s) for s in every],
            "shard_checkpoints": [os.path.relpath(d, folder) for d in done],
            **settings(),
        }
    finally:
        for a in shards.actors:
            a.resume.remote()
    publish(root, folder, manifest)
    shards.folders = dict(enumerate(dirs))
    return folder


def publish(root: Path, folder: Path, manifest: dict[str, Any]) -> None:
    """Make ``folder`` (its shards written) the latest checkpoint: fsync, name it atomically, prune.

    Raises
    ------
    OSError
        The files could not be written (the previous checkpoint stays the latest).
    """
    for dirpath, _, _ in os.walk(folder):
        fsync_dir(Path(dirpath))
    manifest = {"format": FORMAT, "version": VERSION, "checkpoint": folder.name, **manifest}
    tmp = root / f".tmp-{MANIFEST}-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w") as fh:
        fh.write(json.dumps(manifest, indent=1) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / MANIFEST)
    fsync_dir(root)
    for old in root.glob("ckpt-*"):
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(f".tmp-{MANIFEST}-*"):
        stale.unlink(missing_ok=True)


def read_manifest(root: Path) -> dict[str, Any]:
    """The latest manifest under ``root``.

    Raises
    ------
    FileNotFoundError
        No manifest under ``root``.
    ValueError
        A manifest of another format or version.
    """
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no Ray replay checkpoint under {root} ({MANIFEST} is missing)") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(
            f"{root / MANIFEST}: format {manifest.get('format')!r} version {manifest.get('version')}, "
            f"expected {FORMAT!r} version {VERSION}"
        )
    return manifest


def restore_arguments(
    root: Path, manifest: dict[str, Any], changes: dict[str, Any]
) -> tuple[tuple, dict[str, Any], dict[str, Any]]:
    """The store's positional and keyword arguments from a manifest (``changes`` applied), and the
    client state to restore (``samples``, ``rng``, ``folders``: each shard's checkpoint).

    Raises
    ------
    ValueError
        A keyword of ``changes`` that `RayReplayStore.restore` may not change.
    """
    unknown = sorted(set(changes) - set(RESTORE_KEYWORDS))
    if unknown:
        raise ValueError(f"restore() does not take {unknown[0]!r}; it may change {sorted(RESTORE_KEYWORDS)}")
    folder = root / manifest["checkpoint"]
    kwargs: dict[str, Any] = {name: manifest[name] for name in SETTINGS}
    kwargs.update(changes)
    kwargs["selector"] = selector_from_config(manifest["selector"])
    kwargs["rate_limiter"] = rate_limiter_from_config(manifest["rate_limiter"])
    state = {
        "samples": manifest["counters"]["samples"],
        "rng": manifest["rng"],
        "folders": {s: str(folder / d) for s, d in enumerate(manifest["shards"])},
    }
    spec = TrajectorySpec.from_config(manifest["spec"])
    return (spec, int(manifest["capacity_steps"]), int(manifest["num_shards"])), kwargs, state

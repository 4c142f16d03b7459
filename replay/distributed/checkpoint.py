"""The Ray replay store's checkpoint manifest: one folder of shard checkpoints, named atomically.

Layout under the user's ``path``::

    MANIFEST.json            {"format": "graphrl.replay.ray", "version": 2, "checkpoint": "ckpt-000003",
                              "shards": ["shard-000", ...], "shard_digests": [...], "shard_steps": [...],
                              spec, settings, counters, the client's rng, "sha256": of the rest}
    ckpt-000002/             the previous checkpoint (kept; restorable by its own path)
    ckpt-000003/MANIFEST.json  the same manifest (what a restore of this folder by its path reads)
    ckpt-000003/shard-000/   each shard's local checkpoint (`replay.checkpoint`)

`write` pauses inserts on every shard, has each write its local checkpoint into the next
``ckpt-NNNNNN`` folder (`new_folder`) and resumes them; `publish` fsyncs it, seals the manifest (the
sha256 of each shard's local manifest, its steps, and the manifest's own sha256), writes it into the
folder and to a temporary file (fsync'd, ``os.replace``'d to ``MANIFEST.json``, the root fsync'd) and
deletes the folders older than the one it replaces, so a checkpoint interrupted part way leaves the
previous one named and whole. `read_manifest` verifies the manifest, the folder's entries and every
shard's local checkpoint (`replay.checkpoint.verify`) before any actor is made, and raises
`replay.CheckpointError` naming the checkpoint, the file and the older checkpoint that is intact;
`restore_arguments` turns it into the store's arguments (`RayReplayStore.restore`). On a cluster of
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

from replay._checks import check_restore_kwargs
from replay._files import CheckpointError, fsync_dir, seal, unseal
from replay.checkpoint import INTEGRITY, latest, verify
from replay.limiter_record import restored_limiter
from replay.rate_limiter import RateLimiter
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
VERSION = 2
RESTORE_KEYWORDS = ("timeout", "seed", "staging_slots", "tier", "max_restarts", "actor_options", "prefetch")
SETTINGS = ("max_times_sampled", "chunk_steps", "timeout", "tier", "seed")  # kept in the manifest


def shard_dir(s: int) -> str:
    """Shard ``s``'s folder in a checkpoint (``shard-003``)."""
    return f"shard-{s:03d}"


def _number(name: str) -> int | None:
    head, _, digits = name.partition("-")
    return int(digits) if head == "ckpt" and len(digits) == 6 and digits.isdigit() else None


def new_folder(root: Path) -> Path:
    """The next checkpoint's folder under ``root`` (``ckpt-NNNNNN``, one past the newest), emptied."""
    numbers = [n for p in root.glob("ckpt-*") if (n := _number(p.name)) is not None]
    try:
        numbers.append(int(json.loads((root / MANIFEST).read_text())["checkpoint"].split("-")[1]))
    except (OSError, ValueError, KeyError, IndexError, AttributeError, TypeError):
        pass
    folder = root / f"ckpt-{max(numbers, default=-1) + 1:06d}"
    if folder.exists():
        shutil.rmtree(folder)
    return folder


def _shard_seals(folder: Path, shards: list[str]) -> tuple[list[str], list[int]]:
    """Each shard's local manifest digest (as its ``LATEST`` records it) and its steps."""
    digests, steps = [], []
    for d in shards:
        ckpt, digest = latest(folder / d)
        body, _ = unseal(ckpt / INTEGRITY, str(ckpt))  # just written: its files are not hashed again
        digests.append(digest)
        steps.append(int(body["counts"]["steps"]))
    return digests, steps


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
    """Make ``folder`` (its shards written) the latest checkpoint: fsync, seal, name it atomically, prune.

    The checkpoint the manifest named before stays (the previous one); older folders are deleted.

    Raises
    ------
    OSError
        The files could not be written (the previous checkpoint stays the latest).
    """
    try:
        previous = json.loads((root / MANIFEST).read_text()).get("checkpoint")
    except (OSError, ValueError, AttributeError):
        previous = None
    digests, steps = _shard_seals(folder, list(manifest["shards"]))
    body = {"format": FORMAT, "version": VERSION, "checkpoint": folder.name, **manifest}
    if "spec" in manifest:  # the spec's field order (the sealed JSON sorts keys; a shard's rows follow it)
        body["fields"] = list(manifest["spec"])
    body.update(shard_digests=digests, shard_steps=steps)
    seal(folder / MANIFEST, body)
    for dirpath, _, _ in os.walk(folder):
        fsync_dir(Path(dirpath))
    tmp = root / f".tmp-{MANIFEST}-{uuid.uuid4().hex[:8]}"
    seal(tmp, body)
    os.replace(tmp, root / MANIFEST)
    fsync_dir(root)
    for old in root.glob("ckpt-*"):
        if old.name not in (folder.name, previous):
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(f".tmp-{MANIFEST}-*"):
        stale.unlink(missing_ok=True)


def _verify(root: Path, manifest: dict[str, Any]) -> None:
    """Check a manifest's checkpoint folder: its entries, each shard's local checkpoint and digest."""
    folder = root / str(manifest.get("checkpoint")) if root.name != manifest.get("checkpoint") else root
    name = str(folder)
    shards = manifest.get("shards")
    digests, steps = manifest.get("shard_digests"), manifest.get("shard_steps")
    if not isinstance(shards, list) or not isinstance(digests, list) or not isinstance(steps, list):
        raise CheckpointError(f"checkpoint {name}: {MANIFEST} lacks its shards' seals", name, (MANIFEST,))
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {name} is missing (no such folder)", name)
    if len(shards) != int(manifest.get("num_shards", -1)) or not len(shards) == len(digests) == len(steps):
        raise CheckpointError(f"checkpoint {name}: {MANIFEST} lists shards inconsistently", name, (MANIFEST,))
    found = {p.name for p in folder.iterdir()} - {MANIFEST}
    extra, missing = sorted(found - set(shards)), sorted(set(shards) - found)
    if extra or missing:
        what = [f"{d}: unexpected" for d in extra] + [f"{d}: missing" for d in missing]
        message = f"checkpoint {name} is damaged: " + "; ".join(what)
        raise CheckpointError(message, name, tuple(extra + missing))
    for d, digest, n in zip(shards, digests, steps, strict=True):
        try:
            ckpt, recorded = latest(folder / d)
            if recorded != digest:
                raise CheckpointError(
                    f"checkpoint {folder / d}: LATEST names a manifest other than the one {MANIFEST} sealed",
                    str(folder / d),
                    ("LATEST",),
                )
            counts = verify(ckpt, digest)["counts"]
        except CheckpointError as e:
            raise CheckpointError(
                f"checkpoint {name}: shard {d}: {e}", name, tuple(f"{d}/{f}" for f in e.files) or (d,)
            ) from None
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {name}: shard {d}: {e}", name, (d,)) from None
        if int(counts["steps"]) != n:
            raise CheckpointError(
                f"checkpoint {name}: shard {d} holds {counts['steps']} steps, {MANIFEST} says {n}", name, (d,)
            )


def _intact_older(root: Path, skip: str | None) -> str | None:
    numbered = [(n, p) for p in root.glob("ckpt-*") if (n := _number(p.name)) is not None]
    for _, folder in sorted(numbered, reverse=True):
        if folder.name == skip:
            continue
        try:
            body, _ = unseal(folder / MANIFEST, str(folder))
            if body.get("checkpoint") == folder.name:
                _verify(folder, body)
                return str(folder)
        except (CheckpointError, OSError, ValueError):
            continue
    return None


def read_manifest(root: Path) -> dict[str, Any]:
    """The latest manifest under ``root`` (or that of the checkpoint folder ``root``), verified.

    Raises
    ------
    FileNotFoundError
        No manifest under ``root``.
    ValueError
        A manifest of another format or version.
    CheckpointError
        A damaged manifest, checkpoint folder or shard checkpoint (the message names the checkpoint, the
        file and the older checkpoint that is intact, if any).
    """
    if not (root / MANIFEST).is_file():
        if any(_number(p.name) is not None for p in root.glob("ckpt-*")):
            err = CheckpointError(f"checkpoint root {root}: {MANIFEST} is missing", str(root), (MANIFEST,))
            raise _with_intact(err, root, None)
        raise FileNotFoundError(f"no Ray replay checkpoint under {root} ({MANIFEST} is missing)")
    base = root.parent if _number(root.name) is not None else root
    try:
        manifest, _ = unseal(root / MANIFEST, str(root))
    except CheckpointError as e:  # the manifest itself: the folder it named may well be intact
        raise _with_intact(e, base, root.name if base != root else None) from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(
            f"{root / MANIFEST}: format {manifest.get('format')!r} version {manifest.get('version')}, "
            f"expected {FORMAT!r} version {VERSION}"
        )
    try:
        _verify(root, manifest)
    except CheckpointError as e:
        raise _with_intact(e, base, root.name if base != root else manifest.get("checkpoint")) from None
    return manifest


def _with_intact(err: CheckpointError, root: Path, skip: str | None) -> CheckpointError:
    older = _intact_older(root, skip)
    hint = (
        f"; the older checkpoint {older} is intact: RayReplayStore.restore({older!r}) restores it"
        if older
        else f"; no older intact checkpoint under {root}"
    )
    return CheckpointError(str(err) + hint, err.checkpoint, err.files, older)


def _lineage(manifest: dict[str, Any]) -> list[int]:
    """The key issuers a store restored from ``manifest`` accepts: the checkpointed store's lineage and
    its own id (none for a manifest made before store ids).

    Raises
    ------
    CheckpointError
        An id that is not an integer in ``[0, 2**64)``.
    """
    ids = list(manifest.get("lineage", [])) + ([manifest["store_id"]] if "store_id" in manifest else [])
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < 2**64:
            name = str(manifest.get("checkpoint"))
            raise CheckpointError(f"checkpoint {name}: {MANIFEST}: store id {i!r} is not in [0, 2**64)", name)
    return ids


def restore_arguments(
    root: Path, manifest: dict[str, Any], changes: dict[str, Any], rate_limiter: RateLimiter | None = None
) -> tuple[tuple, dict[str, Any], dict[str, Any]]:
    """The store's positional and keyword arguments from a manifest (``changes`` applied), and the
    client state to restore (``samples``; ``counts``: the checkpoint's inserts, samples and deletes, whose
    insert headroom is the shards' first allowance; ``rng``, ``folders``: each shard's checkpoint, ``reseed``:
    ``seed`` is among ``changes``, so the client and the shards draw from it, not from the checkpoint's
    generator states). The rate limiter: a built-in one rebuilt from the manifest's settings, or
    ``rate_limiter`` checked against them (`replay.limiter_record.restored_limiter`).

    Raises
    ------
    ValueError
        A keyword of ``changes`` that `RayReplayStore.restore` may not change; a manifest naming a
        rate limiter subclass and no ``rate_limiter``, or one not of its class and settings.
    """
    check_restore_kwargs(changes, "RayReplayStore", RESTORE_KEYWORDS)
    unknown = sorted(set(changes) - set(RESTORE_KEYWORDS))
    if unknown:
        raise ValueError(f"restore() does not take {unknown[0]!r}; it may change {sorted(RESTORE_KEYWORDS)}")
    folder = root if root.name == manifest["checkpoint"] else root / manifest["checkpoint"]
    kwargs: dict[str, Any] = {name: manifest[name] for name in SETTINGS}
    kwargs.update(changes)
    kwargs["selector"] = selector_from_config(manifest["selector"])
    kwargs["rate_limiter"] = restored_limiter(
        manifest["rate_limiter"], rate_limiter, "RayReplayStore.restore"
    )
    state = {  # a new seed starts new sample streams; else the checkpoint's continue
        "samples": manifest["counters"]["samples"],
        "counts": tuple(int(manifest["counters"][k]) for k in ("inserts", "samples", "deletes")),
        "rng": None if "seed" in changes else manifest["rng"],
        "reseed": "seed" in changes,
        "folders": {s: str(folder / d) for s, d in enumerate(manifest["shards"])},
        "lineage": _lineage(manifest),
    }
    config = manifest["spec"]
    spec = TrajectorySpec.from_config({n: config[n] for n in manifest.get("fields", config)})
    return (spec, int(manifest["capacity_steps"]), int(manifest["num_shards"])), kwargs, state

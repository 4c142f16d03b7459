"""The Ray store's checkpoint manifest (replay.distributed.checkpoint) without a cluster: the shards'
local checkpoints are written by local one-shard stores, as the shard actors write them; a damaged
manifest, shard folder or shard file is refused with CheckpointError naming it and the older intact
checkpoint."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from graphrl.memory import MemoryManager  # noqa: E402
from replay import CheckpointError, ReplayStore, TrajectorySpec  # noqa: E402
from replay.distributed.checkpoint import (  # noqa: E402
    MANIFEST,
    new_folder,
    publish,
    read_manifest,
    restore_arguments,
)

SPEC = TrajectorySpec({"x": ((2,), "float32")})


def checkpoint(root, mm, stores):
    """What `replay.distributed.checkpoint.write` does, with local stores for the shard actors."""
    folder = new_folder(root)
    shards = [f"shard-{s:03d}" for s in range(len(stores))]
    done = [st.checkpoint(folder / d) for st, d in zip(stores, shards, strict=True)]
    manifest = {
        "num_shards": len(stores),
        "shards": shards,
        "shard_checkpoints": [os.path.relpath(d, folder) for d in done],
        "spec": SPEC.to_config(),
        "capacity_steps": 64,
        "selector": {"kind": "uniform"},
        "rate_limiter": {"kind": "min_size", "min_size": 1},
        "max_times_sampled": 0,
        "chunk_steps": 16,
        "timeout": None,
        "tier": "shared",
        "seed": 0,
        "counters": {"inserts": 0, "samples": 0, "deletes": 0},
        "rng": {},
    }
    publish(root, folder, manifest)
    return folder


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "ray"
    root.mkdir()
    with MemoryManager() as mm:
        stores = [ReplayStore(SPEC, 32, memory=mm, seed=s) for s in range(2)]
        for rounds in range(2):
            for s, st in enumerate(stores):
                with st.writer() as w:
                    w.extend({"x": np.full((5 + s + rounds, 2), s, np.float32)})
                    w.end_episode()
            checkpoint(root, mm, stores)
        for st in stores:
            st.close()
    assert sorted(os.listdir(root)) == [MANIFEST, "ckpt-000000", "ckpt-000001"]
    return root


def test_restore_arguments_take_changes_and_refuse_what_the_checkpoint_fixes(root, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert new_folder(empty).name == "ckpt-000000"
    with pytest.raises(FileNotFoundError, match="MANIFEST.json is missing"):
        read_manifest(empty)
    manifest = read_manifest(root)
    args, kwargs, _ = restore_arguments(root, manifest, {"timeout": 9.0})
    assert args[1:] == (64, 2) and list(args[0]) == ["x"]
    assert kwargs["timeout"] == 9.0 and kwargs["seed"] == 0 and not kwargs["selector"].prioritized
    with pytest.raises(ValueError, match="capacity_steps comes from the checkpoint"):
        restore_arguments(root, manifest, {"capacity_steps": 5})
    # a new seed replaces the checkpoint's generator states (client and shards); none keeps them
    _, kwargs, state = restore_arguments(root, manifest, {"seed": 11})
    assert kwargs["seed"] == 11 and state["rng"] is None and state["reseed"] is True
    _, kwargs, state = restore_arguments(root, manifest, {})
    assert kwargs["seed"] == 0 and state["rng"] == manifest["rng"] and state["reseed"] is False


def test_a_sealed_manifest_reads_back_and_names_every_shard(root):
    manifest = read_manifest(root)
    assert manifest["checkpoint"] == "ckpt-000001" and manifest["shard_steps"] == [11, 13]
    _, _, state = restore_arguments(root, manifest, {})
    assert state["folders"] == {s: str(root / "ckpt-000001" / f"shard-{s:03d}") for s in range(2)}
    older = read_manifest(root / "ckpt-000000")  # an older checkpoint, by its own path
    _, _, state = restore_arguments(root / "ckpt-000000", older, {})
    assert state["folders"][1] == str(root / "ckpt-000000" / "shard-001")


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("flip manifest", MANIFEST),
        ("truncate manifest", MANIFEST),
        ("delete manifest", MANIFEST),
        ("flip a shard's chunk", "shard-001/"),
        ("delete a shard folder", "shard-000"),
        ("swap the shard folders", "shard-00"),
        ("stray entry", "stray"),
        ("a shard's LATEST altered", "LATEST"),
    ],
)
def test_a_damaged_ray_checkpoint_is_refused_and_the_older_one_named(root, damage, named):
    folder = root / "ckpt-000001"
    if damage == "flip manifest":
        text = (root / MANIFEST).read_text()
        (root / MANIFEST).write_text(text.replace('"seed": 0', '"seed": 1'))
    elif damage == "truncate manifest":
        os.truncate(root / MANIFEST, os.path.getsize(root / MANIFEST) // 2)
    elif damage == "delete manifest":
        (root / MANIFEST).unlink()
    elif damage == "flip a shard's chunk":
        chunk = next(p for p in (folder / "shard-001").rglob("c/*") if p.is_file())
        chunk.write_bytes(bytes(b ^ 1 for b in chunk.read_bytes()))
    elif damage == "delete a shard folder":
        shutil.rmtree(folder / "shard-000")
    elif damage == "swap the shard folders":
        os.rename(folder / "shard-000", folder / "tmp")
        os.rename(folder / "shard-001", folder / "shard-000")
        os.rename(folder / "tmp", folder / "shard-001")
    elif damage == "stray entry":
        (folder / "stray").write_text("x")
    elif damage == "a shard's LATEST altered":
        latest = folder / "shard-000" / "LATEST"
        name, digest = latest.read_text().split()
        latest.write_text(f"{name} {digest[::-1]}\n")
    with pytest.raises(CheckpointError) as info:
        read_manifest(root)
    assert named in str(info.value) and str(root) in str(info.value)
    intact = "ckpt-000001" if damage.endswith("manifest") else "ckpt-000000"  # the folder's own copy
    assert info.value.intact == str(root / intact) and f"{intact} is intact" in str(info.value)
    assert read_manifest(root / "ckpt-000000")["checkpoint"] == "ckpt-000000"
    assert json.loads((root / "ckpt-000000" / MANIFEST).read_text())["checkpoint"] == "ckpt-000000"


def test_restore_keeps_the_specs_field_order(tmp_path):
    # the sealed manifest's JSON sorts keys: a spec {"sid", "obs"} came back as {"obs", "sid"} and the
    # restored client read the shards' rows (laid out sid then obs) as garbage (obs bytes in sid)
    spec = TrajectorySpec({"sid": ((), "int64"), "obs": ((2, 2), "uint8", "lz4", 0.5, 2), "a": ((), "bool")})
    root = tmp_path / "ray"
    root.mkdir()
    folder = new_folder(root)
    folder.mkdir()
    manifest = {"num_shards": 0, "shards": [], "shard_checkpoints": [], "spec": spec.to_config(),
                "capacity_steps": 8, "selector": {"kind": "uniform"},
                "rate_limiter": {"kind": "min_size", "min_size": 1}, "max_times_sampled": 0,
                "chunk_steps": 4, "timeout": None, "tier": "shared", "seed": 0,
                "counters": {"inserts": 0, "samples": 0, "deletes": 0}, "rng": {}}
    publish(root, folder, manifest)
    assert list(json.loads((root / MANIFEST).read_text())["spec"]) == ["a", "obs", "sid"]  # sorted
    args, _, _ = restore_arguments(root, read_manifest(root), {})
    assert list(args[0]) == ["sid", "obs", "a"] and args[0] == spec

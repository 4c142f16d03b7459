"""Checkpoint integrity: damage every file of a real checkpoint in turn (delete, truncate to 0 and to half,
flip a byte, swap two files of the same size, add a stray file) and check that every restore either
refuses with CheckpointError naming that file, or gives back exactly the stored data; a damaged latest
checkpoint names the older one that is intact."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager
from replay import CheckpointError, Prioritized, ReplayStore, TrajectorySpec

SPEC = TrajectorySpec({"obs": ((3,), "float32"), "act": ((), "int64"), "img": ((2, 2), "uint8")})
LATEST = "ckpt-000001"


def steps(start: int, n: int) -> dict[str, np.ndarray]:
    pos = np.arange(start, start + n)
    return {
        "obs": (pos[:, None] * 0.25 + np.arange(3)).astype(np.float32),
        "act": pos.astype(np.int64),
        "img": ((pos[:, None, None] * 3 + np.arange(4).reshape(2, 2)) % 251).astype(np.uint8),
    }


def write(store: ReplayStore, start: int, lengths) -> int:
    w = store.writer()
    for n in lengths:
        w.extend(steps(start, n))
        w.end_episode()
        start += n
    w.close()
    return start


def contents(store: ReplayStore) -> dict:
    """Every field of every episode, the selector's per-item state and the counters."""
    store.selector_mass()  # ingest committed steps
    sel = store.table.state
    live = sel.state != 0
    return {
        "episodes": [
            (e.shard, e.start, e.length, e.open, e.continuation, {k: v.tolist() for k, v in e.data.items()})
            for e in store.episodes()
        ],
        "priority": sel.priority[live].tolist(),
        "times": sel.times[live].tolist(),
        "state": sel.state.tolist(),
        "counters": store.counters(),
        "meta": [sh.meta.tolist() for sh in store.storage.shards],
        "max_priority": sel.max_priority,
    }


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A checkpoint root with an older checkpoint (ckpt-000000) and the latest (ckpt-000001)."""
    root = tmp_path_factory.mktemp("pristine") / "ckpt"
    with MemoryManager() as mm:
        store = ReplayStore(
            SPEC, 48, num_shards=2, selector=Prioritized(0.8), memory=mm, seed=3, chunk_steps=5
        )
        pos = write(store, 0, [4, 7, 3, 9])
        store.checkpoint(root)
        older = contents(store)
        write(store, pos, [6, 2, 8, 5, 11])  # the ring wraps
        b = store.sample(12, window=3)
        store.update_priorities(b.keys, np.linspace(0.1, 4.0, 12))
        store.checkpoint(root)
        latest = contents(store)
        store.close()
    assert sorted(os.listdir(root)) == ["LATEST", "ckpt-000000", LATEST]
    return root, latest, older


def files_of(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def restore_or_refuse(root: Path, expected: dict, named: list[str]) -> CheckpointError | None:
    """Restore ``root``: it must give back ``expected`` exactly (None), or raise CheckpointError naming
    the checkpoint and one of ``named`` (returned)."""
    with MemoryManager() as mm:
        try:
            store = ReplayStore.restore(root, memory=mm)
        except CheckpointError as e:
            assert any(n in str(e) for n in named), (named, str(e))
            assert str(root) in str(e)
            return e
        try:
            assert contents(store) == expected
            store.sample(4, window=2)  # a restored store works
        finally:
            store.close()
    return None


def damage_cases(folder: Path):
    """(description, damage(folder), files it touches) for every file of a checkpoint folder."""
    files = files_of(folder)

    def delete(rel):
        return lambda f: (f / rel).unlink()

    def truncate(rel, half):
        return lambda f: os.truncate(f / rel, os.path.getsize(f / rel) // 2 if half else 0)

    def flip(rel):
        def go(f):
            data = bytearray((f / rel).read_bytes())
            data[len(data) // 2] ^= 0xFF
            (f / rel).write_bytes(bytes(data))

        return go

    for rel in files:
        yield f"delete {rel}", delete(rel), [rel]
        yield f"truncate {rel} to 0", truncate(rel, False), [rel]
        yield f"truncate {rel} to half", truncate(rel, True), [rel]
        yield f"flip a byte of {rel}", flip(rel), [rel]
    by_size = defaultdict(list)
    for rel in files:
        by_size[os.path.getsize(folder / rel)].append(rel)
    for group in by_size.values():
        for a, b in itertools.combinations(group, 2):

            def swap(f, a=a, b=b):
                tmp = f / "swap.tmp"
                os.rename(f / a, tmp)
                os.rename(f / b, f / a)
                os.rename(tmp, f / b)

            yield f"swap {a} and {b}", swap, [a, b]
    for where in ("", "shard0/", "shard1/priority/c/"):
        yield f"stray file in {where or '.'}", lambda f, w=where: (f / w / "stray").write_bytes(b"x"), [
            f"{where}stray"
        ]


@pytest.mark.slow
def test_every_damage_of_the_latest_checkpoint_is_refused_by_name_or_harmless(pristine, tmp_path):
    root0, latest, older = pristine
    outcomes = defaultdict(int)
    root = tmp_path / "ckpt"  # one copy, damaged and mended in place case after case
    shutil.copytree(root0, root)
    stored = {rel: (root0 / rel).read_bytes() for rel in files_of(root0)}
    for i, (what, damage, named) in enumerate(damage_cases(root0 / LATEST)):
        damage(root / LATEST)
        same_bytes = len(named) == 2 and (root0 / LATEST / named[0]).read_bytes() == (
            root0 / LATEST / named[1]
        ).read_bytes()
        err = restore_or_refuse(root, latest, named)
        outcomes["intact" if err is None else "refused"] += 1
        assert (err is None) == same_bytes, what  # only a swap of two equal files changes nothing
        if err is not None:  # the older checkpoint is untouched and named
            assert err.intact == str(root / "ckpt-000000") and "ckpt-000000 is intact" in str(err), what
            if i % 25 == 0:
                assert restore_or_refuse(Path(err.intact), older, []) is None
        for rel in named:  # mend: the touched files as stored, a stray file gone
            path = root / LATEST / rel
            if f"{LATEST}/{rel}" in stored:
                path.write_bytes(stored[f"{LATEST}/{rel}"])
            else:
                path.unlink()
        assert {rel: (root / rel).read_bytes() for rel in files_of(root)} == stored, what  # as copied
    assert outcomes["refused"] > 150, dict(outcomes)


@pytest.mark.parametrize(
    "what",
    ["delete", "empty", "half", "other name", "bad digest", "stray in root", "folder swap", "shard swap"],
)
def test_damage_to_latest_and_to_the_layout(pristine, tmp_path, what):
    root0, latest, older = pristine
    root = tmp_path / "ckpt"
    shutil.copytree(root0, root)
    marker = root / "LATEST"
    text = marker.read_text()
    if what == "delete":
        marker.unlink()
    elif what == "empty":
        marker.write_text("")
    elif what == "half":
        marker.write_text(text[: len(text) // 2])
    elif what == "other name":  # names the older folder, with the latest's digest
        marker.write_text(text.replace(LATEST, "ckpt-000000"))
    elif what == "bad digest":
        marker.write_text(text[:-3] + ("0" if text[-3] != "0" else "1") + text[-2:])
    elif what == "stray in root":  # not part of any checkpoint: ignored
        (root / "notes.txt").write_text("x")
    elif what == "folder swap":
        os.rename(root / LATEST, root / "tmp")
        os.rename(root / "ckpt-000000", root / LATEST)
        os.rename(root / "tmp", root / "ckpt-000000")
    elif what == "shard swap":
        os.rename(root / LATEST / "shard0", root / LATEST / "tmp")
        os.rename(root / LATEST / "shard1", root / LATEST / "shard0")
        os.rename(root / LATEST / "tmp", root / LATEST / "shard1")
    named = {"folder swap": ["INTEGRITY.json"], "shard swap": ["shard0/", "shard1/"]}.get(what, ["LATEST"])
    err = restore_or_refuse(root, latest, named)
    assert (err is None) == (what == "stray in root")
    if err is not None and what != "folder swap":
        assert err.intact is not None and "is intact" in str(err)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 10**6), where=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255))
def test_any_changed_byte_of_any_file_is_refused_or_harmless(pristine, tmp_path, which, where, mask):
    root0, latest, _ = pristine
    root = tmp_path / "ckpt"  # one copy for every example (tmp_path is shared): damaged and mended in place
    if not root.exists():
        shutil.copytree(root0, root)
    stored = {rel: (root0 / rel).read_bytes() for rel in files_of(root0)}
    assert {rel: (root / rel).read_bytes() for rel in files_of(root)} == stored  # as copied
    folder = root / LATEST
    files = files_of(folder)
    rel = files[which % len(files)]
    data = bytearray(stored[f"{LATEST}/{rel}"])
    if data:
        data[int(where * len(data))] ^= mask
        (folder / rel).write_bytes(bytes(data))
    try:
        restore_or_refuse(root, latest, [rel])
    finally:
        (folder / rel).write_bytes(stored[f"{LATEST}/{rel}"])  # mend


_CHILD = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    from graphrl.memory import MemoryManager
    from replay import CheckpointError, ReplayStore
    for root in sys.argv[1:]:  # one interpreter for every case: each start imports torch
        with MemoryManager() as mm:
            try:
                store = ReplayStore.restore(root, memory=mm)
            except CheckpointError as e:
                print("REFUSED", root, repr(str(e)), flush=True)  # the message names the file
                continue
            store.episodes(); store.sample(4, window=2); store.close()
            print("RESTORED", root, flush=True)
    """
)


def test_damaged_episode_index_cannot_crash_or_exhaust_memory(pristine, tmp_path):
    # these used to restore, then crash the interpreter or allocate until the kernel killed it:
    # run them in a child with a memory limit, so that a regression cannot take the test run down
    root0, _, _ = pristine
    cases = list(itertools.product(["delete", "zeros"], ["shard0/records/c/0/0", "shard1/steps/c/0/0"]))
    roots = []
    for how, rel in cases:
        root = tmp_path / f"{how}-{rel.replace('/', '-')}"
        shutil.copytree(root0, root)
        target = root / LATEST / rel
        if how == "delete":
            target.unlink()
        else:
            target.write_bytes(bytes(os.path.getsize(target)))
        roots.append(str(root))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, *roots], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == len(cases), out.stdout
    for line, root, (how, rel) in zip(lines, roots, cases, strict=True):
        assert line.startswith(f"REFUSED {root} ") and rel in line, (how, rel, line)


def test_a_checkpoint_folder_restores_by_its_own_path(pristine):
    root0, latest, older = pristine
    assert restore_or_refuse(root0 / "ckpt-000000", older, []) is None
    assert restore_or_refuse(root0 / LATEST, latest, []) is None
    assert restore_or_refuse(root0, latest, []) is None


def _corrupt(state: dict, how: str) -> None:
    sh, items = state["shards"][0], state["table"]["shards"][0]
    recs, steps_ = sh["records"], sh["steps"]
    if how == "negative length":
        recs[0, 2] = -5
    elif how == "start beyond the ring":
        recs[-1, 1] = sh["write_pos"] + 3
    elif how == "ids not increasing":
        recs[[0, 1]] = recs[[1, 0]]
    elif how == "step names no record":
        steps_[len(steps_) // 2, 0] = 10**6
    elif how == "step outside its record":
        steps_[0, 0] = recs[-1, 0]
    elif how == "write_pos not the manifest's":
        sh["write_pos"] += 1
    elif how == "sequence beyond the global one":
        steps_[-1, 1] = state["control"]["global_seq"] + 7
    elif how == "NaN priority":
        items["priority"][0] = np.nan
    elif how == "unknown selector state":
        items["state"][0] = 9
    elif how == "negative counter":
        state["control"]["counters"]["inserts"] = -1


@pytest.mark.parametrize(
    "how",
    [
        "negative length",
        "start beyond the ring",
        "ids not increasing",
        "step names no record",
        "step outside its record",
        "write_pos not the manifest's",
        "sequence beyond the global one",
        "NaN priority",
        "unknown selector state",
        "negative counter",
    ],
)
def test_episode_index_invariants_are_checked_not_trusted(pristine, how):
    # checksums catch damage on disk; the invariants catch a state that is wrong however it came about
    from replay.checkpoint import load, verify
    from replay.checkpoint_invariants import check_state

    root0, _, _ = pristine
    folder = root0 / LATEST
    counts = verify(folder)["counts"]
    state = load(folder)
    check_state(str(folder), counts, state)  # the good state passes
    _corrupt(state, how)
    with pytest.raises(CheckpointError, match=str(folder)):
        check_state(str(folder), counts, state)


def test_a_new_checkpoint_over_a_damaged_latest_keeps_the_newest_older_one(pristine, tmp_path):
    root0, _, _ = pristine
    root = tmp_path / "ckpt"
    shutil.copytree(root0, root)
    (root / "LATEST").write_text("garbage")
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 16, memory=mm)
        write(store, 0, [3])
        folder = store.checkpoint(root)
        expected = contents(store)
        store.close()
    assert Path(folder).name == "ckpt-000002"
    assert sorted(os.listdir(root)) == ["LATEST", LATEST, "ckpt-000002"]
    assert restore_or_refuse(root, expected, []) is None

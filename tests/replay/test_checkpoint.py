"""Checkpoints: everything round-trips (data, index, priorities, counters, generations, RNG), restored
stores sample at once, and a checkpoint killed part way leaves the previous one loadable."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, SampleToInsertRatio, TrajectorySpec
from replay.keys import decode_keys, encode_keys, key_incarnations

SPEC = TrajectorySpec({"pos": ((), "int64"), "img": ((3, 4, 4), "uint8"), "r": ((), "float32")})
# "img" as lz4 chunks, "r" as zstd chunks: checkpoints hold their compressed chunks as they are
CODEC_SPEC = TrajectorySpec(
    {"pos": ((), "int64"), "img": ((3, 4, 4), "uint8", "lz4", 0.5), "r": ((), "float32", "zstd", 0.2)}
)


def steps(start: int, n: int) -> dict[str, np.ndarray]:
    pos = np.arange(start, start + n, dtype=np.int64)
    img = ((pos[:, None, None, None] * 7 + np.arange(48).reshape(3, 4, 4)) % 251).astype(np.uint8)
    return {"pos": pos, "img": img, "r": (pos * 0.5).astype(np.float32)}


def build(mm, rounds: int = 3, spec: TrajectorySpec = SPEC) -> ReplayStore:
    """A prioritized 2-shard store that wrapped, with an open episode, exhausted items and counters."""
    store = ReplayStore(
        spec,
        capacity_steps=60,
        num_shards=2,
        selector=Prioritized(0.7),
        memory=mm,
        rate_limiter=SampleToInsertRatio(2.0, min_size=10, error_buffer=500),
        max_times_sampled=3,
        seed=5,
        chunk_steps=7,
    )
    w = store.writer()
    pos = 0
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        for n in rng.integers(1, 12, 6):
            w.extend(steps(pos, int(n)))
            w.end_episode()
            pos += int(n)
        b = store.sample(16, window=4)
        store.update_priorities(b.keys, rng.uniform(0, 3, 16))
    w.extend(steps(pos, 9))  # an open episode: 7 steps committed, 2 staged (not in checkpoints)
    return store


def snapshot(store: ReplayStore) -> dict:
    store.selector_mass()  # the selector learns of committed steps lazily: ingest them now
    sel = store.table.state
    eps = [
        (e.shard, e.start, e.length, e.open, e.continuation, {k: v.copy() for k, v in e.data.items()})
        for e in store.episodes()
    ]
    live = sel.state != 0
    return {
        "episodes": eps,
        "counters": store.counters(),
        "priority": sel.priority[live].copy(),
        "times": sel.times[live].copy(),
        "state": sel.state.copy(),
        "seq": sel.seq[live].copy(),
        "meta": [sh.meta.copy() for sh in store.storage.shards],
        "len": len(store),
        "max_priority": sel.max_priority,
    }


def same(a: dict, b: dict) -> None:
    """``b`` (a restored store's snapshot) holds what ``a`` does, with every episode closed."""
    assert a["counters"] == b["counters"] and a["len"] == b["len"] and a["max_priority"] == b["max_priority"]
    for k in ("priority", "times", "state", "seq"):
        assert np.array_equal(a[k], b[k]), k
    for x, y in zip(a["meta"], b["meta"], strict=True):
        assert np.array_equal(x, y)
    assert len(a["episodes"]) == len(b["episodes"])
    assert not any(eb[3] for eb in b["episodes"])  # restoring closes the episodes writers left open
    for ea, eb in zip(a["episodes"], b["episodes"], strict=True):
        assert ea[:3] + ea[4:5] == eb[:3] + eb[4:5]
        assert all(np.array_equal(ea[5][k], eb[5][k]) for k in SPEC)


@pytest.mark.parametrize("spec", [SPEC, CODEC_SPEC], ids=["raw", "codec"])
def test_round_trip_of_data_index_priorities_counters_generations_and_rng(tmp_path, spec):
    with MemoryManager() as mm:
        store = build(mm, spec=spec)
        old_batch = store.sample(32, window=4, pad="head")  # keys from before the checkpoint
        before = snapshot(store)
        folder = store.checkpoint(tmp_path / "ckpt")
        assert os.path.basename(folder) == "ckpt-000000"
        restored = ReplayStore.restore(tmp_path / "ckpt", memory=mm)
        same(before, snapshot(restored))
        # same draws afterwards (selector RNG round-trips), same windows
        a, b = store.sample(64, window=5), restored.sample(64, window=5)
        # same windows; the keys differ only in the incarnation the restored store counted up
        pairs = zip(decode_keys(a.keys), decode_keys(b.keys), strict=True)
        assert all(np.array_equal(x, y) for x, y in pairs)
        assert (key_incarnations(a.keys) == 0).all() and (key_incarnations(b.keys) == 1).all()
        assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in SPEC)
        assert np.array_equal(a.mask.numpy(), b.mask.numpy()) and np.allclose(a.weights, b.weights)
        # generations: overwrite the same positions in both; old keys are stale in both alike
        for s in (store, restored):
            w = s.writer()
            w.extend(steps(1000, 20))
            w.end_episode()
        new = np.random.default_rng(1).uniform(0, 5, 32)
        assert store.update_priorities(old_batch.keys, new) == restored.update_priorities(old_batch.keys, new)
        shard, anchor, back = decode_keys(old_batch.keys.numpy())
        floors = np.array([sh.floor for sh in store.storage.shards])
        assert (anchor - back < floors[shard]).any()  # some of the old keys did go stale
        same(snapshot(store), snapshot(restored))
        restored.close()
        store.close()


def test_restore_then_sample_at_once_does_not_block(tmp_path):
    with MemoryManager() as mm:
        store = build(mm, rounds=2)
        store.checkpoint(tmp_path)
        restored = ReplayStore.restore(tmp_path, memory=mm, timeout=0.0)
        assert restored.counters() == store.counters()
        batch = restored.sample(8, window=3, timeout=0)  # no wait: counters and data came back together
        assert batch.batch_size == 8
        restored.close()
        store.close()


def test_missing_checkpoint_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="LATEST"):
        ReplayStore.restore(tmp_path / "nothing")


def checkpoint_and_die(root: str, kill_at: str) -> None:  # runs in a forked process
    import replay.checkpoint as ckpt

    with MemoryManager() as mm:
        store = build(mm, rounds=1)
        store.checkpoint(root)  # complete
        w = store.writer()
        w.extend(steps(5000, 30))
        w.end_episode()
        if kill_at == "mid-write":
            real = ckpt._write_array
            calls = [0]

            def write_then_die(*args, **kwargs):
                calls[0] += 1
                if calls[0] == 4:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)

            ckpt._write_array = write_then_die
        else:  # after the rename, before LATEST names the new folder

            def die(*args, **kwargs):
                os.kill(os.getpid(), signal.SIGKILL)

            ckpt.os.replace = die
        store.checkpoint(root)


@pytest.mark.parametrize("kill_at", ["mid-write", "before-latest"])
def test_a_checkpoint_killed_part_way_leaves_the_previous_one_loadable(tmp_path, kill_at):
    root = str(tmp_path / "ckpt")
    proc = mp.get_context("fork").Process(target=checkpoint_and_die, args=(root, kill_at))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    for leaked in Path("/dev/shm").glob(f"graphrl_{proc.pid}_*"):  # a killed process cannot unlink its own
        leaked.unlink(missing_ok=True)  # a sweeper of dead owners may have removed it first
    with MemoryManager() as mm:
        expected = snapshot(build(mm, rounds=1))
        restored = ReplayStore.restore(root, memory=mm)
        same(expected, snapshot(restored))
        assert not any(5000 in e.data["pos"] for e in restored.episodes())
        restored.checkpoint(root)  # the next checkpoint cleans the leftovers
        left = sorted(os.listdir(root))
        assert left == ["LATEST", "ckpt-000000", "ckpt-000001"]  # the one it replaced is kept
        restored.close()


def test_keys_drawn_after_a_checkpoint_never_reach_data_written_after_the_restore(tmp_path):
    # The checkpoint holds episode A; B is written and sampled, then lost (restore from the checkpoint);
    # C is written after the restore into the very positions B had. B's keys must be ignored, A's kept.
    spec = {"x": ((), "int64")}
    with MemoryManager() as mm:
        store = ReplayStore(spec, capacity_steps=1000, selector=Prioritized(1.0), seed=0, memory=mm)

        def episode(s, value, n=10):
            with s.writer() as w:
                w.extend({"x": np.full(n, value)})
                w.end_episode()

        episode(store, 1)  # A: positions 0..9
        store.checkpoint(tmp_path)
        episode(store, 2)  # B: positions 10..19
        b_keys = store.sample(64, window=1).keys
        a_keys = encode_keys([0] * 10, np.arange(10), [0] * 10)  # drawn before the restore, data in it
        b_keys = b_keys[decode_keys(b_keys)[1] >= 10][:8]
        assert len(b_keys) > 0
        restored = ReplayStore.restore(tmp_path, memory=mm)
        episode(restored, 3)  # C: positions 10..19 again
        assert restored.update_priorities(b_keys, np.full(len(b_keys), 1000.0)) == 0
        assert restored.update_priorities(a_keys, np.full(10, 2.0)) == 10
        # the priority mass is A's 10 x 2 plus C's 10 at the max priority seen (1), not B's 1000s
        xs = restored.sample(4000, window=1)["x"].numpy().ravel()
        assert 0.55 < (xs == 1).mean() < 0.78  # A: 20 / 30 of the mass
        assert set(np.unique(xs)) == {1, 3}
        # a second restore: keys two incarnations old apply nowhere
        restored.checkpoint(tmp_path / "again")
        again = ReplayStore.restore(tmp_path / "again", memory=mm)
        assert again.update_priorities(a_keys, np.full(10, 2.0)) == 0
        for s in (again, restored, store):
            s.close()


def test_restore_with_a_seed_draws_from_that_seed_and_without_continues_the_stream(tmp_path):
    spec = TrajectorySpec({"i": ((), "int64")})

    def filled(seed: int) -> ReplayStore:
        s = ReplayStore(spec, 100, 2, memory=mm, seed=seed)
        with s.writer() as w:
            for e in range(4):
                w.extend({"i": np.arange(25 * e, 25 * e + 25)})
                w.end_episode()
        return s

    def draws(s: ReplayStore) -> list[int]:
        with s.sample(64, 1) as b:
            return b["i"].numpy().ravel().tolist()

    with MemoryManager() as mm:
        store = filled(0)
        store.checkpoint(tmp_path)
        a, a2, b, cont = (ReplayStore.restore(tmp_path, memory=mm, **kw) for kw in ({"seed": 5}, {"seed": 5},
                                                                                    {"seed": 6}, {}))
        fresh = filled(5)  # the same steps, seed 5, never checkpointed
        stream_a = draws(a)
        assert stream_a == draws(a2) == draws(fresh)  # restore(seed=5) draws as a store seeded 5 does
        assert stream_a != draws(b)
        assert draws(cont) == draws(store)  # no seed: the checkpoint's stream goes on
        for s in (a, a2, b, cont, fresh, store):
            s.close()

"""RayReplayStore: shards as Ray actors on a local cluster of this machine.

Routing (whole episodes, balanced), one-table distributions across shards (chi-square, uniform and
prioritized), priorities through keys, batches equal to a reference gather byte for byte (wrapped
rings, head and tail padding) and the redraw of windows overwritten between the draw and the put,
checkpoint / restore, a shard killed with and without restarts, writers in Ray tasks, argument
checks. Four stores (eight shard actors) in all: each actor is a process that imports torch, so the
tests share them in file order.
"""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest
import torch
from scipy import stats

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

import replay.distributed.shard as shard_module  # noqa: E402
from replay import Fifo, MinSize, Prioritized, ReplayStore, SampleToInsertRatio, TrajectorySpec, Uniform  # noqa: E402
from replay.batch import importance_weights  # noqa: E402
from replay.checkpoint import CheckpointError  # noqa: E402
from replay.distributed import RayReplayStore, ShardError  # noqa: E402
from replay.distributed.shard import ShardActor  # noqa: E402
from replay.distributed.transport import place  # noqa: E402
from replay.interface import ReplayStoreBase  # noqa: E402
from replay.keys import decode_keys, key_incarnations  # noqa: E402

# the Ray task below travels by value: the workers cannot import this test file by name
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPEC = TrajectorySpec({"id": ((), "int64"), "obs": ((2,), "float32")})


def episode(first: int, n: int) -> dict[str, np.ndarray]:
    """n steps whose ids run first, first+1, ... (obs repeats the id, so the data can be checked)."""
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 2, axis=1).astype(np.float32)}


def shard_config(spec: TrajectorySpec) -> dict:
    """The configuration of a one-shard, 100-step `ShardActor` run in this process (uniform, seed 5)."""
    return {
        "spec": spec.to_config(),
        "capacity": 100,
        "num_shards": 1,
        "selector": Uniform().to_config(),
        "rate_limiter": MinSize(1).to_config(),
        "insert_headroom": float("inf"),
        "insert_counts": (0, 0, 0),
        "max_times_sampled": 0,
        "chunk_steps": 100,
        "tier": "host",
        "timeout": 10.0,
        "staging_slots": 1,
        "seed": 5,
    }


def live_ids(store) -> dict[int, int]:
    """id -> shard of every live step (asserting each episode lies whole and in order in one shard)."""
    out = {}
    for e in store.episodes():
        ids = e.data["id"]
        assert np.array_equal(ids, np.arange(ids[0], ids[0] + len(ids))), "an episode was split or reordered"
        assert np.array_equal(e.data["obs"][:, 0], ids.astype(np.float32))
        for i in ids.tolist():
            assert i not in out, f"id {i} stored twice"
            out[i] = e.shard
    return out


def draw_counts(
    store, draws: int, batch: int = 256
) -> tuple[dict[int, int], dict[int, float], dict[int, int]]:
    """Counts of ids over ``draws`` one-step windows; the probability and key reported for each id."""
    counts: dict[int, int] = {}
    prob: dict[int, float] = {}
    keys: dict[int, int] = {}
    for _ in range(draws // batch):
        with store.sample(batch, window=1, timeout=60) as b:
            assert b.mask.all()
            for i, p, k in zip(
                b["id"][:, 0].tolist(), b.probabilities.tolist(), b.keys.tolist(), strict=True
            ):
                counts[i] = counts.get(i, 0) + 1
                prob[i] = p
                keys[i] = k
    return counts, prob, keys


def until_dead(actor):
    """A call that returns only when the shard actor dies (it waits for an insert nobody makes)."""
    inserts = ray.get(actor.stats.remote())["inserts"]
    return actor.wait_inserts.remote(inserts, "never woken", 300)


@pytest.fixture(scope="module")
def prio(cluster):
    store = RayReplayStore(SPEC, 4000, num_shards=2, selector=Prioritized(0.6), seed=7)
    yield store
    store.close()


@pytest.fixture(scope="module")
def uniform(cluster):
    store = RayReplayStore(SPEC, 4000, num_shards=2, selector=Uniform(), seed=3, max_restarts=1)
    yield store
    store.close()


# ------------------------------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"num_shards": 0}, ValueError, "num_shards"),
        ({"num_shards": 300}, ValueError, "num_shards"),
        ({"num_shards": 2.0}, TypeError, "num_shards"),
        ({"capacity_steps": 1, "num_shards": 2}, ValueError, "capacity_steps"),
        ({"selector": "uniform"}, TypeError, "selector"),
        ({"selector": Fifo(), "num_shards": 2}, ValueError, "num_shards"),
        ({"rate_limiter": 3}, TypeError, "rate_limiter"),
        ({"rate_limiter": SampleToInsertRatio(1.0, 5000, 10)}, ValueError, "min_size"),
        ({"tier": "disk"}, ValueError, "tier"),
        ({"timeout": -1}, ValueError, "timeout"),
        ({"chunk_steps": 0}, ValueError, "chunk_steps"),
        ({"max_times_sampled": -1}, ValueError, "max_times_sampled"),
        ({"seed": "x"}, TypeError, "seed"),
        ({"staging_slots": 0}, ValueError, "staging_slots"),
        ({"max_restarts": -2}, ValueError, "max_restarts"),
        ({"max_restarts": True}, TypeError, "max_restarts"),
        ({"actor_options": {"max_restarts": 3}}, ValueError, "max_restarts"),
        ({"actor_options": ["num_cpus"]}, TypeError, "actor_options"),
        ({"memory": "mm"}, TypeError, "memory"),
        ({"prefetch": 2}, ValueError, "prefetch"),
        ({"no_such_option": 1}, TypeError, "no_such_option"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, exc, name):
    args = {"capacity_steps": 1000, "num_shards": 2, **kwargs}
    with pytest.raises(exc, match=name):
        RayReplayStore(SPEC, **args)  # checked before any actor starts (no cluster needed)


# ------------------------------------------------------------------------------------------ routing


def test_writes_go_whole_to_one_shard_balanced(prio):
    assert isinstance(prio, RayReplayStore)
    lengths = [5, 17, 9, 30, 12, 8, 21, 14, 11, 6]
    with prio.writer(chunk_steps=8) as w:  # episodes longer than a chunk ship in pieces, to one shard
        first = 0
        for n in lengths:
            w.extend(episode(first, n))
            w.end_episode()
            first += 1000
        for step in range(3):  # and step by step
            w.append({"id": np.int64(first + step), "obs": np.full(2, first + step, np.float32)})
        w.end_episode()
        lengths.append(3)
    assert w.steps_written == sum(lengths) and w.episodes_written == len(lengths)
    where = live_ids(prio)
    assert len(where) == sum(lengths) == len(prio)
    sizes = prio.shard_sizes()
    assert sum(sizes) == sum(lengths)
    assert abs(sizes[0] - sizes[1]) <= max(lengths)  # one writer balances its own steps
    assert list(sizes) == w.shard_steps.tolist()
    assert isinstance(prio, ReplayStoreBase)  # the one interface both stores satisfy
    st = prio.stats()
    assert st["shard_steps"] == sizes and st["steps"] == sum(lengths) == st["inserts"]
    assert st["samples"] == 0 and st["live"] > 0 and st["priority_mass"] > 0


def test_independent_writers_of_one_episode_each_fill_the_shards_evenly(prio):
    # each writer comes from its own attached copy (what a pickled store becomes in a Ray task): they
    # share nothing but the shard actors; their first episodes go round robin over the shards
    before = prio.shard_sizes()
    for t in range(10):
        with RayReplayStore.attach(prio.handle()).writer() as w:
            w.extend(episode(70_000 + 100 * t, 20))
    after = prio.shard_sizes()
    assert [a - b for a, b in zip(after, before, strict=True)] == [100, 100]
    live_ids(prio)


def test_sample_returns_the_local_batch_type_with_shard_keys(prio):
    from replay.batch import Batch

    b = prio.sample(32, window=8, pad="head")
    assert isinstance(b, Batch)
    assert b["id"].shape == (32, 8) and b["obs"].shape == (32, 8, 2) and b.mask.shape == (32, 8)
    ids, mask = b["id"].numpy(), b.mask.numpy()
    for row, m in zip(ids, mask, strict=True):  # head padding: real steps end the window, consecutive ids
        real = row[m]
        assert m[-1] and len(real) >= 1 and np.array_equal(real, np.arange(real[0], real[0] + len(real)))
        assert (row[~m] == 0).all()
    assert torch.equal(b.lengths, b.mask.sum(1))
    shards = (b.keys & 255).numpy()
    where = live_ids(prio)
    assert all(where[int(i)] == s for i, s in zip(ids[:, -1], shards, strict=True))
    td = pytest.importorskip("tensordict")
    assert isinstance(b.to_tensordict(), td.TensorDict)
    b.release()


def test_chi_square_one_table_then_priorities_through_keys(prio):
    # shard 0 gets extra steps, so the shards differ in size and mass
    with prio.writer(shard=0) as w:
        w.extend(episode(50_000, 40))
    where = live_ids(prio)
    ids = np.array(sorted(where))
    counts, prob, keys = draw_counts(prio, 256 * 48)
    obs = np.array([counts.get(int(i), 0) for i in ids])
    assert stats.chisquare(obs).pvalue > 1e-3  # every step equally likely (all priorities equal)
    assert np.allclose(list(prob.values()), 1 / len(ids))
    # priorities through the keys of every step seen (all of them, at ~100 draws each)
    assert set(keys) == set(ids.tolist())
    pri = {int(i): 0.5 + (int(i) % 7) for i in ids}
    k = np.array([keys[i] for i in ids])
    assert prio.update_priorities(torch.from_numpy(k), np.array([pri[i] for i in ids])) == len(ids)
    weight = np.array([pri[int(i)] ** 0.6 for i in ids])
    counts, prob, _ = draw_counts(prio, 256 * 48)
    obs = np.array([counts.get(int(i), 0) for i in ids])
    assert stats.chisquare(obs, weight / weight.sum() * obs.sum()).pvalue > 1e-3
    expect = {int(i): w / weight.sum() for i, w in zip(ids, weight, strict=True)}
    assert all(abs(p - expect[i]) < 1e-9 for i, p in prob.items())
    # per shard: drawn in proportion to priority mass
    mass = np.zeros(2)
    drawn = np.zeros(2)
    for i, w in zip(ids, weight, strict=True):
        mass[where[int(i)]] += w
        drawn[where[int(i)]] += counts.get(int(i), 0)
    assert stats.chisquare(drawn, mass / mass.sum() * drawn.sum()).pvalue > 1e-3


def every_key(store, ids: list[int]) -> dict[int, int]:
    """id -> key of every id in ``ids`` (one-step windows drawn until each was seen)."""
    keys: dict[int, int] = {}
    for _ in range(400):
        with store.sample(256, window=1, timeout=60) as b:
            keys.update(zip(b["id"][:, 0].tolist(), b.keys.tolist(), strict=True))
        if len(keys) == len(ids):
            return keys
    raise AssertionError(f"{len(ids) - len(keys)} ids never drawn")


def test_importance_weights_are_the_local_stores_for_the_same_table(prio):
    # the same steps and priorities in a local store: the same probabilities, and both stores' weights
    # are replay.batch.importance_weights of them (global table size, the same edge cases)
    beta, pri_of = 0.4, lambda i: 1.0 + (i % 5)
    ids = sorted(live_ids(prio))
    keys = every_key(prio, ids)
    assert prio.update_priorities(np.array([keys[i] for i in ids]), [pri_of(i) for i in ids]) == len(ids)
    with ReplayStore(SPEC, 4000, num_shards=2, selector=Prioritized(0.6), seed=7, tier="host") as local:
        with local.writer() as w:
            for e in prio.episodes():
                w.extend(e.data)
                w.end_episode()
        local_keys = every_key(local, ids)
        local.update_priorities(np.array([local_keys[i] for i in ids]), [pri_of(i) for i in ids])
        prob = {}
        for store in (prio, local):
            with store.sample(256, window=1, beta=beta) as b:
                p = b.probabilities.numpy()
                assert b.table_size == len(ids)
                assert torch.equal(b.weights, importance_weights(p, b.table_size, beta))
                prob[store] = dict(zip(b["id"][:, 0].tolist(), p.tolist(), strict=True))
    common = sorted(set(prob[prio]) & set(prob[local]))
    assert len(common) > 10
    p_ray, p_local = (np.array([prob[st][i] for i in common]) for st in (prio, local))
    assert np.allclose(p_ray, p_local, rtol=1e-9, atol=0)
    w_ray, w_local = (importance_weights(p, len(ids), beta) for p in (p_ray, p_local))
    assert torch.allclose(w_ray, w_local)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_sample_to_cuda_without_cuda_raises_before_drawing(prio):
    samples = prio.counters()["samples"]
    with pytest.raises(ValueError, match=r"device='cuda'.*CUDA is not available"):
        prio.sample(4, window=2, device="cuda")
    assert prio.counters()["samples"] == samples  # nothing was drawn (or counted)


@pytest.mark.parametrize(("timeout", "exc"), [("1", TypeError), (-1, ValueError), (float("nan"), ValueError),
                                             (True, TypeError)])
def test_sample_and_writer_check_their_timeout_before_drawing(prio, timeout, exc):
    samples = prio.counters()["samples"]
    with pytest.raises(exc, match=r"timeout must be"):
        prio.sample(4, window=1, timeout=timeout)
    with pytest.raises(exc, match=r"timeout must be"):
        prio.writer(timeout=timeout)
    assert prio.counters()["samples"] == samples  # nothing was drawn (or counted)


def test_update_priorities_checks_keys_and_values(prio):
    b = prio.sample(4, window=1)
    with pytest.raises(ValueError, match="shard 7"):
        prio.update_priorities(b.keys | 7, np.ones(4))
    with pytest.raises(ValueError, match="NaN|finite"):
        prio.update_priorities(b.keys, np.array([1.0, np.nan, 1.0, 1.0]))
    with pytest.raises(TypeError, match="keys"):
        prio.update_priorities(np.ones(4), np.ones(4))
    for kwargs, name in (
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 4, "window": 0}, "window"),
        ({"batch_size": 4, "pad": "middle"}, "pad"),
        ({"batch_size": 4, "beta": -1.0}, "beta"),
    ):
        with pytest.raises(ValueError, match=name):
            prio.sample(**kwargs)
    with pytest.raises(ValueError, match="chunk_steps"):
        prio.writer(chunk_steps=0)
    with pytest.raises(ValueError, match="shard"):
        prio.writer(shard=2)
    w = prio.writer()
    with pytest.raises(ValueError, match="'obs'"):
        w.append({"id": np.int64(1), "obs": np.zeros(3, np.float32)})
    w.close()


# ------------------------------------------------------------------------------------------ bytes

# several fields of different sizes; an image of 768 bytes a step, so runs of 2 steps or more stream
BYTES = TrajectorySpec(
    {"id": ((), "int64"), "img": ((3, 16, 16), "uint8"), "r": ((), "float32"), "done": ((), "bool")}
)


def byte_steps(first: int, n: int) -> dict[str, np.ndarray]:
    """n steps whose every field is a function of the step's id (first, first+1, ...)."""
    ids = np.arange(first, first + n, dtype=np.int64)
    img = (ids[:, None, None, None] * 7 + np.arange(768).reshape(3, 16, 16)) % 251
    return {"id": ids, "img": img.astype(np.uint8), "r": (ids * 0.5).astype(np.float32), "done": ids % 3 == 0}


def reference_batch(episodes, keys, lengths, window: int, pad: str) -> dict[str, np.ndarray]:
    """What a gather of these windows gives: real steps from the live episodes, zero padding, the mask."""
    data = {}
    for e in episodes:
        for j in range(e.length):
            data[(e.shard, e.start + j)] = {name: col[j] for name, col in e.data.items()}
    shard, anchor, back = decode_keys(np.asarray(keys))
    out = {name: np.zeros((len(keys), window, *f.shape), f.dtype) for name, f in BYTES.items()}
    out["mask"] = np.zeros((len(keys), window), bool)
    for b, (s, a, k, n) in enumerate(
        zip(shard.tolist(), anchor.tolist(), back.tolist(), lengths, strict=True)
    ):
        first, dst = a - k, (0 if pad == "tail" else window - int(n))
        for j in range(int(n)):
            for name, v in data[(s, first + j)].items():
                out[name][b, dst + j] = v
            out["mask"][b, dst + j] = True
    return out


def test_batches_equal_a_reference_gather_byte_for_byte(cluster):
    # one shard of 100 steps, 163 written: the ring has wrapped, an episode straddles its end (positions
    # 85..115 sit in slots 85..99 and 0..15) and the oldest live episode lost its head (floor 63)
    with RayReplayStore(BYTES, 100, num_shards=1, seed=11) as store:
        with store.writer(chunk_steps=16) as w:
            first = 0
            for n in (13, 40, 7, 25, 31, 18, 29):
                w.extend(byte_steps(first, n))
                w.end_episode()
                first += n
        episodes = store.episodes()
        assert sum(e.length for e in episodes) == 100
        wrapped = padded = 0
        for pad in ("tail", "head", "tail", "head"):  # the staging slot is reused: stale bytes must not show
            with store.sample(64, window=16, pad=pad) as b:  # 64 >= 16: two halves drawn in parallel
                want = reference_batch(episodes, b.keys.numpy(), b.lengths.numpy(), 16, pad)
                for name in BYTES:
                    assert b[name].numpy().tobytes() == want[name].tobytes(), (name, pad)
                assert np.array_equal(b.mask.numpy(), want["mask"])
                _, anchor, back = decode_keys(b.keys.numpy())
                wrapped += int(((anchor - back) % 100 + b.lengths.numpy() > 100).sum())
                padded += int((b.lengths < 16).sum())
                assert np.allclose(b.probabilities.numpy(), 1 / 100)
        assert wrapped > 0 and padded > 0
        handle = store.handle()
    # a remote writer (a copy attached by handle) of a store its owner closed is told so
    w = RayReplayStore.attach(handle).writer()
    w.extend(byte_steps(0, 3))
    w.end_episode()
    with pytest.raises(ShardError, match="shard 0: the store was closed by its owner") as err:
        w.close()
    assert "died" not in str(err.value) and "restore" not in str(err.value)


def test_a_window_overwritten_between_the_draw_and_the_put_is_redrawn(cluster):
    # the shard's code in this process; a writer overwrites the ring's oldest 30 slots right after the
    # draw (the before_put hook), before the bytes are put: the windows starting there are redrawn
    config = shard_config(BYTES)
    shard = ShardActor(0, config, None)
    try:
        shard.insert(1, byte_steps(0, 100), True, 10.0)  # positions 0..99
        drawn = []

        def overwrite(table):
            if not drawn:
                drawn.append(table)
                shard.insert(2, byte_steps(1000, 30), True, 10.0)  # positions 100..129: floor 30

        shard.before_put = overwrite
        shard.store.table.incarnation = 3  # as after two restores: every key, redrawn ones too, carries it
        rep = shard.sample(32, 8, "tail", 10.0, None)
        assert (key_incarnations(rep["keys"]) == 3).all()
        stale = int((drawn[0].first < 30).sum())
        assert 0 < stale < 32 and rep["redrawn"] == stale and len(rep["parts"]) == 2
        assert len(rep["keys"]) == 32
        _, anchor, back = decode_keys(rep["keys"])
        assert ((anchor - back) >= 30).all()  # no kept window starts below the floor
        # the kept windows of the first draw come first, in order, then the redrawn ones
        kept = drawn[0].keys[drawn[0].first >= 30]
        assert np.array_equal(rep["keys"][: len(kept)], kept)
        want = reference_batch(shard.store.episodes(), rep["keys"], rep["n"], 8, "tail")
        for stream in (False, True):
            out = {name: np.full((32, 8, *f.shape), 0xAB, f.dtype) for name, f in BYTES.items()}
            mask = np.zeros((32, 8), bool)
            flat = tuple(out[name].reshape(-1).view(np.uint8) for name in BYTES)
            pieces = [ray.get(part[0]) for part in rep["parts"]]
            row_bytes = np.array([f.row_bytes for f in BYTES.values()], np.int64)
            place(rep, pieces, flat, mask, row_bytes, 0, 8, stream)
            for name in BYTES:
                assert out[name].tobytes() == want[name].tobytes(), (name, stream)
            assert np.array_equal(mask, want["mask"])
    finally:
        shard.close()


def test_a_shard_stops_drawing_a_large_batch_past_the_callers_deadline(cluster, monkeypatch):
    # the shard's code in this process; draws go DRAW_CHUNK windows at a time and the deadline is
    # checked between them: timeout=0 stops after the first chunk, with no limit all chunks come back
    config = shard_config(SPEC)
    monkeypatch.setattr(shard_module, "DRAW_CHUNK", 16)
    shard = ShardActor(0, config, None)
    try:
        shard.insert(1, episode(0, 100), True, 10.0)
        drawn = []
        shard.before_put = drawn.append
        with pytest.raises(TimeoutError, match=r"shard 0: sample of 48 windows passed the caller's deadline"):
            shard.sample(48, 4, "tail", 0.0, None)
        assert [len(t) for t in drawn] == [16]
        drawn.clear()
        rep = shard.sample(40, 4, "tail", None, None)
        assert [len(t) for t in drawn] == [16, 16, 8] and len(rep["keys"]) == 40 and len(rep["parts"]) == 3
    finally:
        shard.close()


def test_a_shard_restore_continues_the_checkpoints_stream_unless_given_a_new_seed(cluster, tmp_path):
    # the shard's code in this process, restored from a one-shard store's checkpoint: without reseed
    # (RayReplayStore.restore without seed) it draws what the checkpointed store draws next; with it,
    # what a store seeded with the shard's seed (5) and the same steps draws
    def filled(seed: int) -> ReplayStore:
        s = ReplayStore(SPEC, 100, 1, selector=Uniform(), memory=None, seed=seed, tier="host")
        with s.writer() as w:
            w.extend(episode(0, 100))
            w.end_episode()
        return s

    def anchors(keys) -> np.ndarray:
        return decode_keys(np.asarray(keys))[1]

    src, fresh = filled(9), filled(5)
    try:
        src.checkpoint(tmp_path)
        with src.sample(32, 1) as b:
            nxt = anchors(b.keys.numpy())
        with fresh.sample(32, 1) as b:
            seeded = anchors(b.keys.numpy())
        assert not np.array_equal(nxt, seeded)
        for reseed, expected in ((False, nxt), (True, seeded)):
            shard = ShardActor(0, dict(shard_config(SPEC), reseed=reseed), str(tmp_path))
            try:
                assert np.array_equal(anchors(shard.sample(32, 1, "tail", 10.0, None)["keys"]), expected)
            finally:
                shard.close()
    finally:
        src.close()
        fresh.close()


# ------------------------------------------------------------------------------------------ checkpoints


@pytest.mark.slow
def test_checkpoint_restore_round_trip_then_a_dead_shard_is_named(prio, tmp_path):
    with prio.writer() as w:  # data of its own, so the test also passes run alone
        for first in (900_000, 900_100):
            w.extend(episode(first, 40))
            w.end_episode()
    before = {e.start: e for e in prio.episodes()}
    counters = prio.counters()
    b = prio.sample(16, window=1)
    keys = b.keys.clone()
    b.release()
    folder = prio.checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "MANIFEST.json").is_file() and folder.endswith("ckpt-000000")
    folder = prio.checkpoint(tmp_path / "ckpt")  # the second replaces the first, which is kept
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == ["MANIFEST.json", "ckpt-000000", "ckpt-000001"]
    damaged = tmp_path / "damaged"  # a copy whose latest checkpoint lost a chunk of shard 1's episode index
    shutil.copytree(tmp_path / "ckpt", damaged)
    chunk = next((damaged / "ckpt-000001" / "shard-001").glob("ckpt-*/shard0/records/c/*/*"))
    chunk.unlink()
    with pytest.raises(CheckpointError, match=r"shard-001.*records/c/.*missing.*ckpt-000000 is intact"):
        RayReplayStore.restore(damaged)
    with pytest.raises(ValueError, match=r"Ray-backed store's checkpoint.*RayReplayStore\.restore\(path\)"):
        ReplayStore.restore(tmp_path / "ckpt")
    restored = RayReplayStore.restore(tmp_path / "ckpt", timeout=60, prefetch=1)
    try:
        after = {e.start: e for e in restored.episodes()}
        assert before.keys() == after.keys()
        for s, e in before.items():
            assert e.shard == after[s].shard and np.array_equal(e.data["id"], after[s].data["id"])
        assert restored.counters() == prio.counters() == {**counters, "samples": counters["samples"] + 16}
        assert restored.update_priorities(keys, np.full(16, 2.0)) == 16  # keys stay valid
        for window in (4, 4, 2, 4):  # prefetched draws: used when the shape repeats, dropped when not
            with restored.sample(8, window=window) as rb:
                assert rb["id"].shape == (8, window) and rb.mask[:, 0].all()
                assert restored.update_priorities(rb.keys, np.ones(8)) == 8
        # a shard killed without restarts: the next call names it
        victim = restored.actors[1]
        pending = until_dead(victim)
        ray.kill(victim)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(pending)
        with pytest.raises(ShardError, match="shard 1"):
            restored.sample(8, window=1)
        with pytest.raises(ShardError, match="shard 1"):
            len(restored)
    finally:
        restored.close()
    with pytest.raises(FileNotFoundError):
        RayReplayStore.restore(tmp_path / "nothing")


# ------------------------------------------------------------------------------------------ Ray tasks


@ray.remote
def actor_task(store, first: int, episodes: int, n: int) -> tuple[int, int]:
    """An RL actor on any node: the store arrives as a write-only copy; store.writer() as on one machine."""
    with store.writer() as w:
        for e in range(episodes):
            w.extend(episode(first + 1000 * e, n + e))
            w.end_episode()
    return w.steps_written, w.episodes_written


@pytest.mark.slow
def test_writers_in_ray_tasks_lose_nothing(uniform):
    got = ray.get([actor_task.remote(uniform, 100_000 * (t + 1), 6, 10 + t) for t in range(4)])
    want = [(sum(10 + t + e for e in range(6)), 6) for t in range(4)]
    assert got == want
    where = live_ids(uniform)
    assert len(where) == sum(s for s, _ in want) == len(uniform) == uniform.counters()["inserts"]
    sizes = uniform.shard_sizes()
    assert min(sizes) > 0.3 * sum(sizes)


def test_uniform_chi_square_across_unequal_shards(uniform):
    with uniform.writer(shard=1) as w:
        w.extend(episode(900_000, 150))
    ids = np.array(sorted(live_ids(uniform)))
    counts, prob, _ = draw_counts(uniform, 256 * 40)
    obs = np.array([counts.get(int(i), 0) for i in ids])
    assert stats.chisquare(obs).pvalue > 1e-3
    assert np.allclose(list(prob.values()), 1 / len(ids))


# ------------------------------------------------------------------------------------------ faults


def test_killed_shard_restarts_from_its_checkpoint_and_the_store_keeps_serving(uniform, tmp_path):
    uniform.checkpoint(tmp_path / "ckpt")
    at_checkpoint = uniform.shard_sizes()
    with uniform.writer(shard=1) as w:  # lost with the actor: written after the checkpoint
        w.extend(episode(2_000_000, 25))
    with uniform.writer(shard=0) as w:  # shard 0 lives on: kept
        w.extend(episode(3_000_000, 7))
    assert uniform.shard_sizes() == [at_checkpoint[0] + 7, at_checkpoint[1] + 25]
    victim = uniform.actors[1]
    pending = until_dead(victim)
    ray.kill(victim, no_restart=False)
    with pytest.raises((ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)):
        ray.get(pending)
    assert uniform.shard_sizes() == [at_checkpoint[0] + 7, at_checkpoint[1]]  # waits for the restart
    with uniform.writer(shard=1) as w:  # written after the restart: kept
        w.extend(episode(4_000_000, 11))
    assert uniform.shard_sizes() == [at_checkpoint[0] + 7, at_checkpoint[1] + 11]
    where = live_ids(uniform)
    assert 2_000_000 not in where and 4_000_010 in where and 3_000_006 in where
    with uniform.sample(64, window=4) as b:
        assert b.mask[:, 0].all()
        assert uniform.update_priorities(b.keys, np.ones(64)) == 64


def test_an_episode_open_across_a_shard_restart_is_not_stored_as_a_whole_episode(uniform, tmp_path):
    uniform.checkpoint(tmp_path / "ckpt")
    w = uniform.writer(shard=0, chunk_steps=5)
    w.extend(episode(5_000_000, 10))
    w.flush()  # two chunks of the open episode stored, then lost with the actor
    assert w.steps_written == 10
    victim = uniform.actors[0]
    pending = until_dead(victim)
    ray.kill(victim, no_restart=False)
    with pytest.raises((ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)):
        ray.get(pending)
    uniform.shard_sizes()  # the client finds the restarted shard and has it reload the checkpoint
    w.extend(episode(5_000_010, 5))
    with pytest.raises(ShardError, match=r"shard 0 was restarted.*earlier part \(10 steps") as err:
        w.end_episode()
        w.flush()
    assert "continuation=True" in str(err.value)
    w.close()  # the error was raised already: nothing more to report
    fragment = [e for e in uniform.episodes() if 5_000_000 <= e.data["id"][0] < 5_000_100]
    assert len(fragment) == 1 and fragment[0].length == 5 and fragment[0].continuation
    assert fragment[0].data["id"][0] == 5_000_010 and not fragment[0].open


def test_writer_errors_surface_at_flush_close_and_exit(uniform):
    # shard 0 was restarted once (max_restarts=1): killed again, it stays dead
    victim = uniform.actors[0]
    pending = until_dead(victim)
    ray.kill(victim, no_restart=False)
    with pytest.raises((ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)):
        ray.get(pending)
    w = uniform.writer(shard=0)
    w.extend(episode(6_000_000, 4))
    w.end_episode()  # only queued: no error yet
    with pytest.raises(ShardError, match=r"shard 0: .*max_restarts=1") as err:
        w.close()
    assert "max_restarts=0" not in str(err.value) and w.steps_written == 0
    w = uniform.writer(shard=0)
    w.extend(episode(6_000_100, 4))
    with pytest.raises(ShardError, match="shard 0"):
        w.flush(timeout=60)
    w.close()
    with pytest.raises(ShardError, match="shard 0"):
        with uniform.writer(shard=0) as w:
            w.extend(episode(6_000_200, 4))
    with pytest.raises(KeyError):  # an exception in flight is the one raised
        with uniform.writer(shard=0) as w:
            w.extend(episode(6_000_300, 4))
            w.end_episode()
            raise KeyError("mine")


# ------------------------------------------------------------------------------------------ rate limiter


@pytest.mark.slow
def test_rate_limiter_applies_to_the_whole_store(cluster):
    # diff = inserts - samples must stay in [-20, 60]; sampling starts at 20 steps
    limiter = SampleToInsertRatio(1.0, min_size=20, error_buffer=40)
    selector = Prioritized(1.0)  # so that priorities of 1e308 would overflow a shard's mass (below)
    with RayReplayStore(
        SPEC, 1000, num_shards=2, rate_limiter=limiter, seed=1, selector=selector
    ) as store:
        with pytest.raises(TimeoutError, match=r"sample waited .* \(timeout=0\.2 s\): .*min_size=20") as err:
            store.sample(4, window=1, timeout=0.2)
        assert "stats" not in str(err.value)
        with pytest.raises(TimeoutError, match=r"\(timeout=0 s\): .*min_size=20"):
            store.sample(4, window=1, timeout=0)
        w = store.writer(shard=0, timeout=0.2)
        w.extend(episode(0, 20))
        w.end_episode()
        w.wait()  # in this order (a threaded actor may run two calls in any order)
        w.extend(episode(100, 40))  # admitted below this shard's allowance (30 of the 60), then charged
        w.end_episode()
        w.wait()
        w.extend(episode(200, 5))
        with pytest.raises(TimeoutError, match="inserting is ahead of sampling"):
            w.end_episode()
            w.wait()
        w.close()
        w = store.writer(shard=0, timeout=0.2)
        w.extend(episode(250, 5))
        w.end_episode()  # queued; the shard's allowance refuses it, and close says so
        with pytest.raises(TimeoutError, match="inserting is ahead of sampling"):
            w.close()
        assert w.steps_written == 0
        with store.sample(8, window=1) as b:  # 8 sampled steps admit 8 more inserts
            assert b.lengths.sum() == 8
            # priorities whose mass would overflow: refused as by the local store, nothing changed
            with pytest.raises(ValueError, match=r"priorities: 8 of 8 are too large \(first: 1e\+308"):
                store.update_priorities(b.keys, np.full(8, 1e308))
            # the largest a shard of 500 items takes (new items get the max): the masses stay finite
            assert store.update_priorities(b.keys, np.full(8, np.finfo(np.float64).max / 1000)) == 8
            with pytest.raises(ValueError, match="too large"):  # a learner checks the same limit
                store.learner().update_priorities(b.keys, np.full(8, 1e308))
        w = store.writer(shard=1, timeout=30)
        w.extend(episode(300, 5))
        w.end_episode()
        w.wait()
        assert store.counters() == {"inserts": 65, "samples": 8, "deletes": 0}
        # samples may run ahead of inserts by 20: 65 + 20 = 85 sampled steps at most
        for _ in range(7):  # the local store's weights
            with store.sample(11, window=1) as b, np.errstate(divide="ignore", invalid="ignore"):
                want = importance_weights(b.probabilities.numpy(), b.table_size, 1.0)
                torch.testing.assert_close(b.weights, want, equal_nan=True, rtol=0, atol=0)
        assert store.counters()["samples"] == 85
        with pytest.raises(TimeoutError, match="sampling is ahead of inserting"):
            store.sample(1, window=1, timeout=0.2)


def test_close_returns_only_once_every_shard_actor_is_dead(cluster):
    # ray.kill only asks: close() waits until Ray reports each actor dead, so a call any process makes
    # after close() returned (a remote writer's shipment) fails instead of storing steps nobody reads
    store = RayReplayStore(BYTES, 64, num_shards=3, seed=2)
    actors = store.actors
    assert [ray.get(a.ping.remote()) for a in actors]  # alive before
    store.close()
    for a in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(a.ping.remote(), timeout=30)


def test_an_initial_priority_whose_mass_would_overflow_is_refused(cluster):
    with pytest.raises(ValueError, match=r"initial_priority=1e\+308 is too large for this store"):
        RayReplayStore(BYTES, 64, num_shards=2, selector=Prioritized(1.0, initial_priority=1e308))
    limit = (np.finfo(np.float64).max / 64) ** 0.5  # each shard's table holds 32 slots
    selector = Prioritized(2.0, initial_priority=limit * 0.99)
    with RayReplayStore(BYTES, 64, num_shards=2, selector=selector) as store:
        with store.writer() as w:
            w.extend(byte_steps(0, 8))
            w.end_episode()
        with store.sample(16, window=1) as b:  # every item at the initial priority: drawn alike
            assert np.allclose(b.probabilities.numpy(), 1 / 8)

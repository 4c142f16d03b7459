"""ReplayStore in one process: exact windows against a model, keys and stale updates, sharded
distributions (chi-square), rate limiting, bounded memory (batches and staging: test_batch.py)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from _forked import run_in_fork
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from graphrl.memory import MemoryManager
from replay import (
    Fifo,
    Lifo,
    MaxHeap,
    MinSize,
    Prioritized,
    ReplayStore,
    SampleToInsertRatio,
    TrajectorySpec,
    Uniform,
)
from replay.keys import decode_keys, encode_keys

SPEC = TrajectorySpec(
    {"pos": ((), "int64"), "ep": ((), "int32"), "obs": ((2, 3), "float32"), "done": ((), "bool")}
)


def cols(ep: int, start: int, n: int) -> dict[str, np.ndarray]:
    """Steps whose content is derived from their global append index (pos) and episode."""
    pos = np.arange(start, start + n, dtype=np.int64)
    obs = (pos[:, None, None] * 10 + np.arange(6).reshape(2, 3)).astype(np.float32)
    done = np.zeros(n, dtype=bool)
    return {"pos": pos, "ep": np.full(n, ep, np.int32), "obs": obs, "done": done}


def rows(c: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    n = len(c["pos"])
    return [{k: v[i] for k, v in c.items()} for i in range(n)]


def make(mm, capacity=64, shards=1, spec=None, **kw):
    kw.setdefault("timeout", 5.0)
    return ReplayStore(spec or SPEC, capacity_steps=capacity, num_shards=shards, memory=mm, **kw)


# ------------------------------------------------------------------------------ exact windows


class Model:
    """One writer, one shard: positions follow append order; a commit happens when the writer's
    staging is full and another step comes, or at end_episode (so committed = appended - pending)."""

    def __init__(self, capacity: int, chunk: int) -> None:
        self.capacity, self.chunk = capacity, chunk
        self.ep_of: list[int] = []  # episode of each appended step
        self.pending = 0
        self.committed = 0

    def append(self, ep: int) -> None:
        if self.pending == self.chunk:
            self.committed += self.pending
            self.pending = 0
        self.ep_of.append(ep)
        self.pending += 1

    def end(self) -> None:
        self.committed += self.pending
        self.pending = 0

    def window(self, anchor: int, length: int, pad: str) -> list[int]:
        ep = self.ep_of[anchor]
        floor = max(0, self.committed - self.capacity)
        start = max(self.ep_of.index(ep), floor)
        end = min(len(self.ep_of) - self.ep_of[::-1].index(ep), self.committed)
        if pad == "tail":
            return list(range(anchor, min(anchor + length, end)))
        return list(range(max(start, anchor - length + 1), anchor + 1))


# the same spec with "obs" stored as lz4 chunks (arena 4x the raw ring: chunks of one step grow)
CODEC_SPEC = TrajectorySpec(
    {**{n: (f.shape, f.dtype) for n, f in SPEC.items()}, "obs": ((2, 3), "float32", "lz4", 0.25)}
)
WINDOW_CASES = dict(
    chunk=st.integers(1, 24),
    episodes=st.lists(st.integers(1, 15), min_size=1, max_size=10),
    end_last=st.booleans(),
    length=st.integers(1, 9),
    pad=st.sampled_from(["tail", "head"]),
    use_extend=st.booleans(),
)


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 24), **WINDOW_CASES)
def test_windows_match_a_model_after_wrap_around_with_the_cursor_inside_an_episode(
    capacity, chunk, episodes, end_last, length, pad, use_extend
):
    check_windows_against_model(SPEC, capacity, chunk, episodes, end_last, length, pad, use_extend)


@settings(max_examples=15, deadline=None)
@given(capacity=st.integers(2, 24), **WINDOW_CASES)
def test_windows_of_a_compressed_field_match_the_model(capacity, chunk, episodes, end_last, length, pad,
                                                       use_extend):
    check_windows_against_model(CODEC_SPEC, capacity, chunk, episodes, end_last, length, pad, use_extend)


def check_windows_against_model(spec, capacity, chunk, episodes, end_last, length, pad, use_extend):
    with MemoryManager() as mm:
        store = ReplayStore(spec, capacity, 1, memory=mm, chunk_steps=chunk, seed=0, timeout=2.0, tier="host")
        chunk = store.writer().chunk_steps
        model = Model(capacity, chunk)
        w = store.writer(chunk_steps=chunk)
        pos = 0
        for i, n in enumerate(episodes):
            c = cols(i, pos, n)
            if use_extend:
                w.extend(c)
            else:
                for r in rows(c):
                    w.append(r)
            for _ in range(n):
                model.append(i)
            pos += n
            if i < len(episodes) - 1 or end_last:
                w.end_episode()
                model.end()
        assert len(store) == min(model.committed, capacity)
        if model.committed == 0:
            with pytest.raises(TimeoutError, match="min_size"):
                store.sample(4, length, pad, timeout=0.01)
            return
        batch = store.sample(64, length, pad)
        shard, anchor, back = decode_keys(batch.keys.numpy())
        assert (shard == 0).all()
        for b in range(64):
            expect = model.window(int(anchor[b]), length, pad)
            real = batch["pos"][b][batch.mask[b]].tolist()
            assert real == expect, (int(anchor[b]), real, expect)
            assert int(back[b]) == anchor[b] - expect[0]
            assert batch.lengths[b] == len(expect)
            m = batch.mask[b].numpy()
            assert m.sum() == len(expect)
            assert m[: len(expect)].all() if pad == "tail" else m[length - len(expect) :].all()
            assert (batch["ep"][b][batch.mask[b]] == model.ep_of[expect[0]]).all()
            assert torch.equal(
                batch["obs"][b][batch.mask[b]], torch.from_numpy(cols(0, expect[0], len(expect))["obs"])
            )
            assert (batch["obs"][b][~batch.mask[b]] == 0).all() and (
                batch["pos"][b][~batch.mask[b]] == 0
            ).all()
        batch.release()
        store.close()


def test_hand_made_episodes_give_exact_windows(mm):
    store = make(mm, capacity=10, tier="host")
    w = store.writer()
    w.extend(cols(0, 0, 4))
    w.end_episode()
    w.extend(cols(1, 4, 3))
    w.end_episode()
    store.update_priorities(encode_keys([0] * 7, np.arange(7), [0] * 7), np.ones(7))
    b = store.sample(200, window=3, pad="tail")
    seen = {}
    for k, p, m in zip(b.keys.tolist(), b["pos"].tolist(), b.mask.tolist(), strict=True):
        seen[decode_keys(np.array([k]))[1][0]] = (p, m)
    assert seen[0] == ([0, 1, 2], [True] * 3)
    assert seen[2] == ([2, 3, 0], [True, True, False])
    assert seen[3] == ([3, 0, 0], [True, False, False])
    assert seen[4] == ([4, 5, 6], [True] * 3)
    assert seen[6] == ([6, 0, 0], [True, False, False])
    h = store.sample(200, window=3, pad="head")
    seen = {int(decode_keys(h.keys[i : i + 1].numpy())[1][0]): h["pos"][i].tolist() for i in range(200)}
    assert seen[0] == [0, 0, 0] and seen[1] == [0, 0, 1] and seen[4] == [0, 0, 4] and seen[6] == [4, 5, 6]


def test_extend_equals_appends_including_chunk_boundaries(mm):
    a, b = make(mm, capacity=40, chunk_steps=3), make(mm, capacity=40, chunk_steps=3)
    wa, wb = a.writer(), b.writer()
    for i, n in enumerate([5, 1, 3, 7]):
        c = cols(i, 10 * i, n)
        wa.extend(c)
        for r in rows(c):
            wb.append(r)
        if i != 3:
            wa.end_episode()
            wb.end_episode()
    ea, eb = a.episodes(), b.episodes()
    assert [(e.start, e.length, e.open) for e in ea] == [(e.start, e.length, e.open) for e in eb]
    for x, y in zip(ea, eb, strict=True):
        assert all(np.array_equal(x.data[k], y.data[k]) for k in SPEC)
    assert len(a) == len(b) == 5 + 1 + 3 + 6  # 7 steps of the open episode: 6 committed in chunks, 1 staged
    assert wa.pending == wb.pending == 1


@pytest.mark.parametrize(
    ("bad", "exc", "field"),
    [
        ({"obs": np.zeros((3, 2), np.float32)}, ValueError, "obs"),
        ({"pos": np.int32(1)}, TypeError, "pos"),
        ({"ep": 1.5}, TypeError, "ep"),
    ],
)
def test_a_bad_step_names_the_field_and_stores_nothing(mm, bad, exc, field):
    store = make(mm)
    w = store.writer()
    w.append(rows(cols(0, 0, 1))[0])
    good = rows(cols(0, 1, 1))[0]
    with pytest.raises(exc, match=f"field '{field}'"):
        w.append({**good, **bad})
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['extra'\]"):
        w.append({**good, "extra": 1})
    assert w.pending == 1
    bad_cols = {**cols(0, 1, 3), "obs": np.zeros((3, 2, 3), np.float64)}
    with pytest.raises(TypeError, match="field 'obs'"):
        w.extend(bad_cols)
    assert w.pending == 1
    w.end_episode()
    assert len(store) == 1 and store.episodes()[0].data["pos"].tolist() == [0]


# ------------------------------------------------------------------------------ keys and priorities


def test_stale_priority_updates_are_ignored_after_overwrite(mm):
    store = make(mm, capacity=8, selector=Prioritized(), tier="host", seed=2)
    w = store.writer()
    w.extend(cols(0, 0, 6))
    w.end_episode()
    tail = store.sample(16, window=2)
    head = store.sample(16, window=4, pad="head")
    w.extend(cols(1, 6, 4))  # positions 6..9 overwrite 0 and 1: the floor becomes 2
    w.end_episode()
    _, ta, tb = decode_keys(tail.keys.numpy())
    _, ha, hb = decode_keys(head.keys.numpy())
    assert (tb == 0).all()
    assert store.update_priorities(tail.keys, np.full(16, 9.0)) == int((ta >= 2).sum())
    # a head window that touched position 0 or 1 is stale even when its anchor is still stored
    head_ok = ha - hb >= 2
    assert (~head_ok & (ha >= 2)).any()  # exercised: anchor live, head gone
    assert store.update_priorities(head.keys, np.full(16, 3.0)) == int(head_ok.sum())
    expected = np.ones(10)  # by position; new items came in at the max priority seen then (1.0)
    expected[ta[ta >= 2]] = 9.0
    expected[ha[head_ok]] = 3.0
    prio = store.table.state.priority[0]
    for q in range(2, 10):
        assert prio[q % 8] == expected[q], q


def test_nan_negative_inf_priorities_raise_and_change_nothing(mm):
    store = make(mm, selector=Prioritized())
    w = store.writer()
    w.extend(cols(0, 0, 10))
    w.end_episode()
    b = store.sample(4, window=2)
    before = store.table.state.priority.copy()
    for bad in (np.nan, -1.0, np.inf):
        with pytest.raises(ValueError, match="NaN, infinite or negative"):
            store.update_priorities(b.keys, [1.0, 2.0, bad, 3.0])
    assert np.array_equal(before, store.table.state.priority)


def test_keys_naming_a_missing_shard_are_rejected_naming_it(mm):
    store = make(mm, capacity=40, shards=4)
    with pytest.raises(ValueError, match="shard 7"):
        store.update_priorities(encode_keys([7], [0], [0]), [1.0])
    with pytest.raises(TypeError, match="integers"):
        store.update_priorities(np.array([0.5]), [1.0])


def test_all_zero_priorities_sample_uniformly(mm):
    store = make(mm, capacity=64, shards=2, selector=Prioritized(), seed=1)
    w = store.writer()
    for i in range(4):
        w.extend(cols(i, 5 * i, 5))
        w.end_episode()
    keys = [
        encode_keys([e.shard] * e.length, np.arange(e.start, e.start + e.length), [0] * e.length)
        for e in store.episodes()
    ]
    keys = np.concatenate(keys)
    assert store.update_priorities(keys, np.zeros(20)) == 20
    counts = np.zeros(20)
    for _ in range(20):
        b = store.sample(200)
        np.add.at(counts, b["pos"][:, 0].numpy(), 1)
        assert np.allclose(b.probabilities.numpy(), 1 / 20)
    assert stats.chisquare(counts).pvalue > 1e-3


# ------------------------------------------------------------------------------ sharded distributions


def fill_shards(store, lengths):
    w = store.writer()
    pos = 0
    for i, n in enumerate(lengths):
        w.extend(cols(i, pos, n))
        w.end_episode()
        pos += n
    return pos


def test_uniform_over_all_shards_chi_square(mm):
    store = make(mm, capacity=400, shards=4, seed=3)
    total = fill_shards(store, [3, 17, 5, 40, 9, 1, 22, 8, 30])  # uneven shard loads
    loads = [sum(e.length for e in store.episodes(s)) for s in range(4)]
    assert sum(loads) == total and len(set(loads)) > 1
    counts = np.zeros(total)
    for _ in range(60):
        np.add.at(counts, store.sample(500)["pos"][:, 0].numpy(), 1)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_prioritized_over_all_shards_is_one_table_chi_square(mm):
    store = make(mm, capacity=400, shards=3, selector=Prioritized(exponent=0.8), seed=4)
    total = fill_shards(store, [10, 25, 4, 31, 12, 6])
    rng = np.random.default_rng(0)
    prio = rng.uniform(0.1, 4.0, total)
    for e in store.episodes():
        pos = e.data["pos"]
        store.update_priorities(
            encode_keys([e.shard] * e.length, np.arange(e.start, e.start + e.length), [0] * e.length),
            prio[pos],
        )
    expected = prio**0.8 / (prio**0.8).sum()
    counts = np.zeros(total)
    for _ in range(100):
        b = store.sample(500, beta=0.5)
        p = b["pos"][:, 0].numpy()
        np.add.at(counts, p, 1)
        assert np.allclose(b.probabilities.numpy(), expected[p])
        w = (total * expected[p]) ** -0.5
        assert np.allclose(b.weights.numpy(), w / w.max(), rtol=1e-5)
    assert stats.chisquare(counts, expected * counts.sum()).pvalue > 1e-3


def test_fifo_lifo_and_heaps_across_shards(mm):
    store = make(mm, capacity=40, shards=3, selector=Fifo(), max_times_sampled=1)
    fill_shards(store, [2, 3, 1, 2])
    got = [int(store.sample(1)["pos"][0, 0]) for _ in range(8)]
    assert got == list(range(8))
    with pytest.raises(TimeoutError, match="min_size"):
        store.sample(1, timeout=0.01)
    lifo = make(mm, capacity=40, shards=2, selector=Lifo(), max_times_sampled=1)
    fill_shards(lifo, [2, 2, 2])
    assert lifo.sample(6)["pos"][:, 0].tolist() == [5, 4, 3, 2, 1, 0]
    heap = make(mm, capacity=40, shards=2, selector=MaxHeap())
    fill_shards(heap, [3, 3])
    keys = np.concatenate(
        [
            encode_keys([e.shard] * e.length, np.arange(e.start, e.start + e.length), [0] * e.length)
            for e in heap.episodes()
        ]
    )
    pos = np.concatenate([e.data["pos"] for e in heap.episodes()])
    heap.update_priorities(keys, (pos == 4) * 5.0 + 1.0)
    assert heap.sample(3)["pos"][:, 0].tolist() == [4, 4, 4]


@pytest.mark.parametrize("codec", [False, True], ids=["raw", "codec"])
def test_max_times_sampled_removes_items_and_counts_deletes(mm, codec):
    store = make(mm, capacity=40, shards=2, max_times_sampled=2, seed=0, spec=CODEC_SPEC if codec else None)
    fill_shards(store, [5, 5])
    b = store.sample(20)
    _, anchors, _ = decode_keys(b.keys.numpy())
    assert np.bincount(b["pos"][:, 0].numpy(), minlength=10).tolist() == [2] * 10
    assert store.counters()["deletes"] == 10
    with pytest.raises(TimeoutError):
        store.sample(1, timeout=0.01)
    fill_shards(store, [3])
    assert store.sample(1)["pos"][0, 0] >= 0


def test_a_timed_out_queue_sample_drops_no_item(mm):
    """With max_times_sampled a draw removes items: a batch that cannot be drawn whole waits and
    times out before drawing, so the items stay (they used to be drawn, removed and lost)."""
    store = make(mm, capacity=40, selector=Fifo(), max_times_sampled=1, rate_limiter=MinSize(1))
    fill_shards(store, [3])
    with pytest.raises(TimeoutError, match="holds 3 sampleable items and this batch needs 7"):
        store.sample(7, timeout=0.05)
    assert store.counters()["deletes"] == 0 and store.counters()["samples"] == 0 and len(store) == 3
    fill_shards(store, [4])
    assert sorted(store.sample(7)["pos"][:, 0].tolist()) == [0, 0, 1, 1, 2, 2, 3]  # both episodes, each once
    assert store.counters()["deletes"] == 7


# ------------------------------------------------------------------------------ rate limiting


def test_empty_and_below_min_size_time_out_and_never_hang(mm):
    store = make(mm, rate_limiter=MinSize(5))
    with pytest.raises(TimeoutError, match="0 sampleable steps, fewer than min_size=5"):
        store.sample(2, timeout=0.05)
    fill_shards(store, [4])
    with pytest.raises(TimeoutError, match="4 sampleable steps"):
        store.sample(2, timeout=0)
    fill_shards(store, [1])
    assert store.sample(2).batch_size == 2


@pytest.mark.parametrize("codec", [False, True], ids=["raw", "codec"])
def test_sample_to_insert_ratio_counts_steps(mm, codec):
    store = make(
        mm, capacity=200, rate_limiter=SampleToInsertRatio(1.0, min_size=10, error_buffer=(-5.0, 30.0)),
        spec=CODEC_SPEC if codec else None,
    )
    w = store.writer(timeout=0.05)
    w.extend(cols(0, 0, 10))
    w.end_episode()
    b = store.sample(3, window=4)  # charges the real steps of the windows
    assert store.counters()["samples"] == int(b.lengths.sum())
    while True:  # sample until the limiter blocks: samples may not pass inserts + 5
        try:
            store.sample(1, window=1, timeout=0)
        except TimeoutError as exc:
            assert "sampling is ahead of inserting" in str(exc)
            break
    assert store.counters()["samples"] <= 10 + 5 + 1
    # inserts blocked once inserts - samples > 30 (the writer's staged steps stay staged)
    for i in range(200):
        try:
            w.extend(cols(1 + i, 100 + i, 1))
            w.end_episode()
        except TimeoutError as exc:
            assert "inserting is ahead of sampling" in str(exc) and "stay staged" in str(exc)
            break
    else:
        pytest.fail("the rate limiter never blocked the writer")
    assert w.pending == 1
    store.sample(40, window=1)
    w.end_episode()  # retry succeeds
    assert w.pending == 0


def test_close_wakes_a_blocked_sampler(mm):
    import threading

    store = make(mm, timeout=60)
    result = []
    started = threading.Event()

    def sampler():
        started.set()
        try:
            store.sample(1)
        except ValueError as exc:
            result.append(str(exc))

    t = threading.Thread(target=sampler)
    t.start()
    started.wait()
    store.close()  # whether the sampler is already waiting or not, it must raise, not hang
    t.join(60)
    assert not t.is_alive() and result and "closed" in result[0]


# ------------------------------------------------------------------------------ memory and batches


def test_a_writer_that_never_ends_its_episode_uses_bounded_memory(mm):
    store = make(mm, capacity=50, chunk_steps=8, tier="host")
    w = store.writer()
    writer_bytes = mm.stats()["host"]["replay.writer"]["bytes"]
    assert writer_bytes == 8 * SPEC.step_bytes
    for i in range(40):
        w.extend(cols(0, 25 * i, 25))  # 1000 steps, never ended
    assert mm.stats()["host"]["replay.writer"]["bytes"] == writer_bytes
    assert len(store) == 50 and w.pending <= 8
    eps = store.episodes()
    assert len(eps) == 1 and eps[0].open and eps[0].length == 50
    committed = 1000 - w.pending
    assert eps[0].data["pos"].tolist() == list(range(committed - 50, committed))
    b = store.sample(64, window=10, pad="tail")
    last = b["pos"][b.mask].max()
    assert last == committed - 1  # windows stop at the cursor
    h = store.sample(64, window=10, pad="head")
    assert h["pos"][h.mask].min() >= committed - 50  # and never reach overwritten steps


def test_handle_is_small_and_picklable_and_attached_stores_only_write(mm):
    store = make(mm, capacity=64, shards=4)
    handle = store.handle()
    blob = pickle.dumps(handle)
    assert len(blob) < 4096
    other = ReplayStore.attach(pickle.loads(blob))
    with other.writer() as w:
        w.extend(cols(0, 0, 5))
    assert len(store) == 5 and len(other) == 5
    with pytest.raises(ValueError, match="owning process"):
        other.sample(1)
    other.close()
    host = make(mm, tier="host")
    with pytest.raises(ValueError, match="shared tier"):
        host.handle()


def test_constructor_validation(mm):
    with pytest.raises(ValueError, match="num_shards"):
        ReplayStore(SPEC, 100, 300, memory=mm)
    with pytest.raises(ValueError, match="capacity_steps"):
        ReplayStore(SPEC, 2, 4, memory=mm)
    with pytest.raises(ValueError, match="min_size=101 exceeds"):
        ReplayStore(SPEC, 100, 1, rate_limiter=MinSize(101), memory=mm)
    with pytest.raises(TypeError, match="selector"):
        ReplayStore(SPEC, 100, 1, selector="uniform", memory=mm)
    store = make(mm)
    for kw, text in (
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 1, "window": 0}, "window"),
        ({"batch_size": 1, "pad": "left"}, "pad"),
        ({"batch_size": 1, "beta": -1.0}, "beta"),
    ):
        with pytest.raises(ValueError, match=text):
            store.sample(**kw)
    store.close()
    with pytest.raises(ValueError, match="closed"):
        len(store)


def test_uniform_selector_is_the_default(mm):
    store = make(mm)
    assert isinstance(store.selector, Uniform)


def test_windows_overwritten_during_the_copy_are_drawn_again(mm, monkeypatch):
    import replay.batch_kernels as gather_module  # the owner's path (the general loop: test_sampler_paths)

    store = make(mm, capacity=10, seed=0)
    store._sampler.locked_window = 0  # the lock-free copy (short windows are otherwise copied under locks)
    w = store.writer()
    w.extend(cols(0, 0, 10))
    w.end_episode()
    real = gather_module.gather_rows
    calls = []

    def overwrite_then_gather(*args, **kwargs):
        if not calls:  # a writer commits in the middle of the learner's (lock-free) copy
            w.extend(cols(1, 100, 10))
            w.end_episode()
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gather_module, "gather_rows", overwrite_then_gather)
    b = store.sample(4, window=3)
    assert len(calls) == 2  # the first gather was redone
    assert (b["ep"][b.mask] == 1).all()
    for i in range(4):
        real_pos = b["pos"][i][b.mask[i]].tolist()
        assert real_pos == list(range(real_pos[0], real_pos[0] + len(real_pos))) and real_pos[0] >= 100


# ------------------------------------------------------------------------- ring and generation invariants

TAGGED = TrajectorySpec({"wid": ((), "int64"), "ep": ((), "int64"), "t": ((), "int64")})


INVARIANT_CASES = dict(
    capacity=st.integers(2, 16),
    chunk=st.integers(1, 6),
    ops=st.lists(
        st.tuples(st.integers(0, 1), st.sampled_from(["step", "step", "step", "end", "flush"])),
        min_size=1,
        max_size=80,
    ),
)
TAGGED_CODEC = TrajectorySpec(
    {"wid": ((), "int64"), "ep": ((), "int64", "zstd", 0.1), "t": ((), "int64", "lz4", 0.1)}
)


@settings(max_examples=40, deadline=None)
@given(**INVARIANT_CASES)
def test_ring_and_generation_invariants_with_two_interleaved_writers(capacity, chunk, ops):
    check_ring_invariants(TAGGED, capacity, chunk, ops)


@settings(max_examples=12, deadline=None)
@given(capacity=INVARIANT_CASES["capacity"], chunk=INVARIANT_CASES["chunk"], ops=INVARIANT_CASES["ops"])
def test_ring_invariants_priorities_and_keys_with_a_compressed_field(capacity, chunk, ops):
    check_ring_invariants(TAGGED_CODEC, capacity, chunk, ops)


def field_at(sh, name: str, slots: np.ndarray) -> np.ndarray:
    """A shard's steps of one field at ``slots`` (live, lock not needed in one thread): ring or chunks."""
    if name in sh.columns:
        return sh.columns[name][slots]
    out = np.empty(len(slots), sh.spec[name].dtype)
    sh.chunks[name].read(sh.position_of(slots), out)
    return out


def check_ring_invariants(spec, capacity, chunk, ops):
    with MemoryManager() as mm:
        store = ReplayStore(
            spec, capacity, 1, memory=mm, chunk_steps=chunk, tier="host", timeout=1.0, seed=0
        )
        writers = [store.writer(), store.writer()]
        ep, t = [0, 0], [0, 0]
        for wid, op in ops:
            w = writers[wid]
            if op == "step":
                w.append({"wid": wid, "ep": ep[wid], "t": t[wid]})
                t[wid] += 1
            elif op == "end":
                w.end_episode()
                if t[wid]:
                    ep[wid] += 1
                t[wid] = 0
            else:
                w.flush()
        sh = store.storage.shards[0]
        wp = sh.write_pos
        assert wp == sum(w.steps_written for w in writers)  # every committed step has one position
        floor = max(0, wp - capacity)
        assert len(store) == wp - floor
        # live records tile [floor, wp) in order; each holds consecutive steps of one writer's episode
        recs = sh.live_records()
        covered = floor
        pieces: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for rec in recs:
            start, n, flags = int(rec[1]), int(rec[2]), int(rec[3])
            assert start == covered and n >= 1
            covered += n
            slots = np.arange(start, start + n) % capacity
            wid, e, tt = (field_at(sh, n, slots) for n in ("wid", "ep", "t"))
            assert (wid == wid[0]).all() and (e == e[0]).all()
            assert np.array_equal(tt, np.arange(tt[0], tt[0] + n))
            raw = sh.records[int(rec[0]) % capacity]
            if not flags & 2 and raw[1] >= floor:  # an episode's first record starts at its first step
                assert tt[0] == 0
            pieces.setdefault((int(wid[0]), int(e[0])), []).append((int(tt[0]), n))
            assert (sh.steps[slots, 0] == rec[0]).all()
        assert covered == wp
        for parts in pieces.values():  # an episode's segments come in order, without gaps
            for (t0, n0), (t1, _) in zip(parts, parts[1:], strict=False):
                assert t1 == t0 + n0
        # generations: keys of overwritten positions are ignored, live ones applied
        lo = max(0, wp - 2 * capacity)
        keys = encode_keys(np.zeros(wp - lo, np.int64), np.arange(lo, wp), np.zeros(wp - lo, np.int64))
        values = np.arange(lo, wp, dtype=np.float64) + 0.5
        assert store.update_priorities(keys, values) == wp - floor
        for p in range(floor, wp):
            assert store.table.state.priority[0, p % capacity] == p + 0.5
        if wp:
            b = store.sample(32, window=capacity, pad="tail")
            for i in range(32):
                m = b.mask[i]
                wid, e, tt = b["wid"][i][m], b["ep"][i][m], b["t"][i][m]
                assert (wid == wid[0]).all() and (e == e[0]).all()
                assert torch.equal(tt, torch.arange(int(tt[0]), int(tt[0]) + len(tt)))
        store.close()


def test_a_forked_copy_of_the_store_refuses_to_sample_naming_both_processes(mm):
    store = make(mm, capacity=64, shards=1)

    def child() -> str:
        try:
            store.sample(1)
            return "no error"
        except ValueError as err:
            return str(err)

    pid, out = run_in_fork(child)
    assert out.startswith(
        f"ReplayStore.sample(): this ReplayStore was made in process {os.getpid()}, and this is process "
        f"{pid} (a fork of it): sample() runs in the store's owning process"
    ), out


def test_a_forked_copy_of_the_store_refuses_priority_updates_naming_both_processes(mm):
    store = make(mm, capacity=64, shards=1, selector=Prioritized(0.6))
    w = store.writer()
    w.extend(cols(0, 0, 10))
    w.end_episode()
    w.close()
    batch = store.sample(4)
    keys = batch.keys.clone()
    batch.release()
    before = store.table.state.priority.copy()

    def child() -> str:
        try:
            store.update_priorities(keys, np.full(4, 3.0))
            return "no error"
        except ValueError as err:
            return str(err)

    pid, out = run_in_fork(child)
    assert out.startswith(
        f"ReplayStore.update_priorities(): this ReplayStore was made in process {os.getpid()}, and this is "
        f"process {pid} (a fork of it): update_priorities() runs in the store's owning process"
    ), out
    np.testing.assert_array_equal(store.table.state.priority, before)
    assert store.update_priorities(keys, np.full(4, 3.0)) == 4  # the owner still updates
    store.close()
    with pytest.raises(ValueError, match=r"ReplayStore.update_priorities\(\): this ReplayStore is closed"):
        store.update_priorities(keys, np.full(4, 3.0))

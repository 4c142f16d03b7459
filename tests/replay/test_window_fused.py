"""Short windows drawn and copied in one compiled call under the locks (`replay.window_kernel`,
`replay.table.Table.draw_windows_locked`, `replay.sampler.WindowSampler._sample_windows`), held
against the lock-free window path it replaces for the same seed and writes.

Two stores get the same seed and the same writes; one samples on the fused path, the other with it
switched off (``locked_window = 0``): the batches (every field's bytes, the mask, keys,
probabilities, importance weights, real lengths, N), the selector's use counts, the rate limiter's
counters and the shards' meta words must be equal, over uniform and prioritized selection, both
paddings, windows that cross an episode's first step (head padding), rings that wrap, one to three
shards, and commits pending at the sample (the kernel's fallback under the Python locks). The window
contents are checked against the positions too (a torn or shifted step would not match), the
routing rule (`MAX_WINDOW`, `LOCKED_WINDOW_BYTES`, codec fields) is pinned, and the fused path is
shown to have been taken.
"""

from __future__ import annotations

import numpy as np
import pytest
from _stores import SPEC, steps
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrl.memory import MemoryManager
from replay import Prioritized, ReplayStore, TrajectorySpec, Uniform
from replay.keys import decode_keys
from replay.window_kernel import LOCKED_WINDOW_BYTES, MAX_WINDOW


def fill(store: ReplayStore, lengths: list[int], start: int, episodes: dict[int, tuple[int, int]]) -> int:
    """Whole episodes of ``lengths`` steps from position ``start`` (``episodes`` gets each position's
    episode, first and one past last); returns the next position."""
    w = store.writer(chunk_steps=4)
    pos = start
    for n in lengths:
        w.extend(steps(pos, n))
        w.end_episode()
        episodes.update(dict.fromkeys(range(pos, pos + n), (pos, pos + n)))
        pos += n
    w.close()
    return pos


def counted(store: ReplayStore, monkeypatch) -> list[int]:
    """Record each fused window sample's batch size on ``store``."""
    sampler = store._sampler
    calls: list[int] = []
    inner = sampler._sample_windows

    def spy(b, *args):
        calls.append(b)
        return inner(b, *args)

    monkeypatch.setattr(sampler, "_sample_windows", spy)
    return calls


def check_windows(
    store: ReplayStore, batch, episodes: dict[int, tuple[int, int]], length: int, pad: str
) -> None:
    """Every row holds consecutive steps of one episode, ending (head) or starting (tail) at its anchor,
    as many as the window, the episode and the ring allow, zeros where the mask is False, and each
    field the function of its ``pos``."""
    pos = batch["pos"].numpy()
    mask = batch.mask.numpy()
    shard, anchor, back = decode_keys(batch.keys.numpy())
    n = batch.lengths.numpy()
    for i in range(pos.shape[0]):
        real = pos[i][mask[i]]
        assert len(real) == n[i] and (np.diff(real) == 1).all() and (pos[i][~mask[i]] == 0).all()
        first, end = episodes[int(real[0])]
        assert real[-1] < end  # one episode
        if pad == "head":  # ends at the anchor; shorter only at the episode's first or the oldest step
            assert mask[i, -1] and back[i] == n[i] - 1
            floor = store.storage.shards[shard[i]].floor
            assert n[i] == length or real[0] == first or anchor[i] - back[i] == floor
        else:
            assert mask[i, 0] and back[i] == 0 and (n[i] == length or real[-1] == end - 1)
    obs = (pos[..., None] * 10 + np.arange(3)).astype(np.float32)
    np.testing.assert_array_equal(batch["obs"].numpy(), np.where(mask[..., None], obs, 0))
    np.testing.assert_array_equal(batch["tag"].numpy(), np.where(mask, pos % 30000, 0).astype(np.int16))
    np.testing.assert_array_equal(batch["done"].numpy(), mask & (pos % 3 == 0))


def assert_same(a, b) -> None:
    for name in SPEC:
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())
    for name in ("mask", "keys", "probabilities", "weights", "lengths"):
        np.testing.assert_array_equal(getattr(a, name).numpy(), getattr(b, name).numpy())
    assert a.table_size == b.table_size


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    capacity=st.integers(12, 40),
    shards=st.integers(1, 3),
    prioritized=st.booleans(),
    pad=st.sampled_from(["head", "tail"]),
    rounds=st.lists(
        st.tuples(st.integers(1, 24), st.integers(2, MAX_WINDOW), st.lists(st.integers(1, 9), max_size=4)),
        min_size=1,
        max_size=4,
    ),
)
def test_the_fused_call_equals_the_lock_free_path(seed, capacity, shards, prioritized, pad, rounds):
    """Same seed, same writes: the same batches, use counts, counters and shard meta, whether commits
    are pending at the sample (the fallback under the Python locks) or not (one call)."""
    with MemoryManager() as mm, pytest.MonkeyPatch.context() as mp:
        stores = [
            ReplayStore(
                SPEC, capacity * shards, shards, memory=mm, seed=seed, timeout=5.0,
                selector=Prioritized(0.6) if prioritized else Uniform(),
            )
            for _ in range(2)
        ]
        fused, plain = stores
        plain._sampler.locked_window = 0
        calls = counted(fused, mp)
        episodes: dict[int, tuple[int, int]] = {}
        for s in stores:
            pos = fill(s, [5, 7, 3], 0, episodes)
        expect = 0
        for b, length, lengths in rounds:
            if prioritized:  # uneven priorities
                for s in stores:
                    s.update_priorities(s.sample(4, 2, pad=pad).keys, np.array([0.5, 2.0, 1.0, 3.0]))
                expect += 1
            for _ in range(2):  # the first after the writes below (pending), then the one-call path
                got = fused.sample(b, length, pad=pad, beta=0.4)
                ref = plain.sample(b, length, pad=pad, beta=0.4)
                expect += 1
                assert_same(got, ref)
                check_windows(fused, got, episodes, length, pad)
                got.release()
                ref.release()
            for s in stores:
                end = fill(s, lengths, pos, episodes)
            pos = end
        assert len(calls) == expect
        np.testing.assert_array_equal(fused.table.state.times, plain.table.state.times)
        assert fused.counters() == plain.counters()
        for a, b_ in zip(fused.storage.shards, plain.storage.shards, strict=True):
            np.testing.assert_array_equal(a.meta, b_.meta)
        for s in stores:
            s.close()


@pytest.mark.parametrize("prioritized", [False, True])
def test_wrapped_rings_and_episode_heads_match_on_every_shape(prioritized):
    """Explicit configurations the property test may miss: two shards whose rings have wrapped
    several times (windows cut at the oldest stored step and at episode starts), every window length
    2 .. `MAX_WINDOW`, both paddings, batches of 1 to 64."""
    with MemoryManager() as mm, pytest.MonkeyPatch.context() as mp:
        stores = [
            ReplayStore(SPEC, 2 * 16, 2, memory=mm, seed=11, timeout=5.0,
                        selector=Prioritized(0.8) if prioritized else Uniform())
            for _ in range(2)
        ]
        fused, plain = stores
        plain._sampler.locked_window = 0
        calls = counted(fused, mp)
        episodes: dict[int, tuple[int, int]] = {}
        for s in stores:
            fill(s, [3, 9, 1, 6, 11, 2, 8, 5, 7, 4, 10, 3], 0, episodes)  # 69 steps in 2 x 16 slots
        assert all(sh.floor > 0 for sh in fused.storage.shards)
        if prioritized:
            for s in stores:
                s.update_priorities(s.sample(8, 3).keys, np.arange(1.0, 9.0))
        for length in range(2, MAX_WINDOW + 1):
            for pad in ("head", "tail"):
                for b in (1, 7, 64):
                    got = fused.sample(b, length, pad=pad, beta=0.7)
                    ref = plain.sample(b, length, pad=pad, beta=0.7)
                    assert_same(got, ref)
                    check_windows(fused, got, episodes, length, pad)
                    if pad == "head" and b == 64:
                        short = got.lengths.numpy() < length
                        assert short.any() and not got.mask.numpy()[short, 0].any()  # head-padded rows
                    got.release()
                    ref.release()
        assert len(calls) == (2 * 3 * (MAX_WINDOW - 1)) + prioritized
        np.testing.assert_array_equal(fused.table.state.times, plain.table.state.times)
        assert fused.counters() == plain.counters()
        for s in stores:
            s.close()


def test_the_routing_rule(monkeypatch):
    """Host batches of windows of 2 .. `MAX_WINDOW` steps and at most `LOCKED_WINDOW_BYTES` take the
    fused call; longer windows, larger batches, ``max_times_sampled`` tables and stores with a codec
    field keep the lock-free path (a codec field's locked decode takes windows of one step)."""
    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 64, 1, memory=mm, seed=2, timeout=5.0)
        calls = counted(store, monkeypatch)
        fill(store, [20, 30], 0, {})
        rows = LOCKED_WINDOW_BYTES // (4 * SPEC.step_bytes)
        for b, length in ((4, 2), (4, MAX_WINDOW), (rows, 4), (4, MAX_WINDOW + 1), (rows + 1, 4), (4, 1)):
            store.sample(b, length, pad="head").release()
        assert calls == [4, 4, rows]
        store.close()
        spec = TrajectorySpec({"pos": ((), "int64"), "img": ((64,), "uint8", "lz4")})
        coded = ReplayStore(spec, 64, 1, memory=mm, seed=2, timeout=5.0)
        assert coded._sampler.locked_window == 0
        w = coded.writer()
        p = np.arange(20)
        w.extend({"pos": p, "img": np.repeat(p[:, None], 64, 1).astype(np.uint8)})
        w.end_episode()
        w.close()
        batch = coded.sample(8, 4, pad="head")
        img, pos, mask = batch["img"].numpy(), batch["pos"].numpy(), batch.mask.numpy()
        np.testing.assert_array_equal(img, np.where(mask, pos, 0)[..., None].repeat(64, 2))
        batch.release()
        coded.close()
        capped = ReplayStore(SPEC, 64, 1, memory=mm, seed=2, timeout=5.0, max_times_sampled=3)
        calls = counted(capped, monkeypatch)
        fill(capped, [20], 0, {})
        capped.sample(4, 3, pad="head").release()
        assert calls == [] and not capped.table.fused
        capped.close()

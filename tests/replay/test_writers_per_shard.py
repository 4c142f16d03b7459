"""What README and docs/architecture (windows, stacked frames) say of several writers: on one shard their
interleaved chunk commits cut episodes into continuation records (windows never cross a cut); with a shard
per writer with an open episode, or chunks as long as the episodes, no episode is cut."""

from __future__ import annotations

import numpy as np
import pytest

from replay import ReplayStore, TrajectorySpec

SPEC = TrajectorySpec({"ep": ((), "int64"), "t": ((), "int64")})


def write(store: ReplayStore, writers: int, chunk: int, episodes: int = 6, half: int = 25) -> None:
    ws = [store.writer(chunk_steps=chunk) for _ in range(writers)]
    for e in range(episodes):
        for part in range(2):  # each writer's episode written in two halves, the writers taking turns
            for i, w in enumerate(ws):
                t = np.arange(part * half, (part + 1) * half)
                w.extend({"ep": np.full(half, e * writers + i), "t": t})
        for w in ws:
            w.end_episode()
    for w in ws:
        w.close()


@pytest.mark.parametrize(("shards", "chunk", "cut"), [(1, 7, True), (2, 7, False), (1, 50, False)])
def test_cuts_only_where_writers_share_a_shard_mid_episode(shards: int, chunk: int, cut: bool) -> None:
    with ReplayStore(SPEC, capacity_steps=2048, num_shards=shards, seed=0) as store:
        write(store, 2, chunk)
        records = store.episodes()
        assert (len(records) > 12) == cut and any(r.continuation for r in records) == cut
        assert sum(r.length for r in records) == 12 * 50
        starts = {(int(r.data["ep"][0]), int(r.data["t"][0])) for r in records}
        short = 0  # head-padded windows whose anchor is not within an episode's first 4 steps
        for _ in range(20):
            with store.sample(64, 5, pad="head") as b:
                t = b["t"].numpy()[:, -1]
                short += int(((b.lengths.numpy() < 5) & (t >= 4)).sum())
        assert (short > 0) == cut
        assert all(t == 0 for _, t in starts) == (not cut)

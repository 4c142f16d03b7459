"""RayTrajectoryWriter.add_episode against the local writer's: the same calls on a local store and on a
one-shard Ray store leave the same episodes (positions, lengths, flags, bytes) and give the same windows,
through every path (shipped straight from the columns, chunked, joining staged steps or an open
episode, torch columns, empty), and a bad call raises the same error and stores nothing. The Ray writer
ships one episode at a time here (``max_inflight=0``): with shipments in flight, a shard may commit two
episodes of one writer in either order (the same steps, other positions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import ReplayStore, TrajectorySpec  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402
from replay.keys import decode_keys  # noqa: E402

SPEC = TrajectorySpec({"id": ((), "int64"), "obs": ((3,), "uint8")})
CHUNK = 8


def ep(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"id": ids, "obs": np.stack([ids % 251, ids % 7, ids % 3], axis=1).astype(np.uint8)}


def write(w) -> None:
    """The same calls, for either writer (steps 0 .. 77 in a 64-step ring: the oldest are overwritten)."""
    w.add_episode(ep(0, 5))  # straight from the columns
    w.add_episode(ep(5, 20))  # longer than the staging buffers: chunked
    w.append({k: v[0] for k, v in ep(25, 1).items()})
    w.add_episode(ep(26, 4))  # joins the staged step: one episode 25 .. 29
    w.extend(ep(30, 3))
    w.flush()
    w.add_episode(ep(33, 2))  # ends the open episode 30 .. 34
    w.add_episode({k: torch.from_numpy(v) for k, v in ep(35, 6).items()})
    w.add_episode(ep(41, 0))  # nothing
    for first, n in ((41, 8), (49, 7), (56, 8), (64, 6), (70, 8)):
        w.add_episode(ep(first, n))


def episodes(store) -> list[tuple]:
    return [(e.start, e.length, e.open, e.continuation, e.data["id"].tolist(), e.data["obs"].tolist())
            for e in store.episodes()]


def windows(store, draws: int) -> dict[int, tuple]:
    """anchor -> (first, real steps, ids, obs) of windows of 4 steps over ``draws`` batches of 32."""
    out = {}
    for _ in range(draws):
        with store.sample(32, window=4) as b:
            _, anchor, back = decode_keys(b.keys.numpy())
            for i, a in enumerate(anchor.tolist()):
                n = int(b.lengths[i])
                win = (a - int(back[i]), n, b["id"][i].tolist(), b["obs"][i].tolist())
                assert out.setdefault(a, win) == win
    return out


def test_add_episode_stores_what_the_local_writer_stores(cluster):
    local = ReplayStore(SPEC, 64, 1, chunk_steps=CHUNK, seed=0)
    with RayReplayStore(SPEC, 64, num_shards=1, chunk_steps=CHUNK, seed=0) as far:
        with local.writer() as lw, far.writer(max_inflight=0) as fw:
            for w in (lw, fw):
                write(w)
            fw.wait()
            for bad, exc in (({"id": ep(0, 2)["id"]}, ValueError),
                             (dict(ep(0, 2), id=np.zeros(2, np.int32)), TypeError)):
                errors = []
                for w in (lw, fw):
                    with pytest.raises(exc) as info:
                        w.add_episode(bad)
                    errors.append(str(info.value))
                assert errors[0] == errors[1]
            assert (lw.pending, lw.steps_written, lw.episodes_written) == (0, 78, 10)
            assert (fw.pending, fw.steps_written, fw.episodes_written) == (0, 78, 10)
        got, want = episodes(far), episodes(local)
        assert got == want and want[0][:2] == (14, 11)  # 0 .. 13 overwritten: 14 .. 24 left
        ours, theirs = windows(far, 12), windows(local, 12)
        common = ours.keys() & theirs.keys()
        assert len(common) > 40 and all(ours[a] == theirs[a] for a in common)
        for first, n, ids, _ in ours.values():  # whole windows (ids are positions here), tail padded
            assert ids[:n] == list(range(first, first + n)) and ids[n:] == [0] * (4 - n)
    local.close()

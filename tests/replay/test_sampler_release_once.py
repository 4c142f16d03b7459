"""A signal's exception raised inside `Batch.from_draw` (after the batch took the staging buffer): the
dropped batch gives the buffer back when it is collected, and the sample's error path must not give it
back again (`StagingBuffer.release` raises ``ValueError: ... already released``). Fault injection on
each of `WindowSampler`'s three fused / compiled paths."""

from __future__ import annotations

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from graphrl.tensors import StagingPool
from replay import ReplayStore, TrajectorySpec
from replay.batch import Batch
from replay.sampler import WindowSampler

SPEC = TrajectorySpec({"v": ((), "int64")})


@pytest.mark.parametrize(
    "window,path", [(1, "_sample_transitions"), (4, "_sample_windows"), (12, "_sample_owner")]
)
def test_a_signal_inside_from_draw_returns_the_staging_buffer_once(monkeypatch, window, path):
    taken: list[str] = []
    real_path = getattr(WindowSampler, path)
    monkeypatch.setattr(WindowSampler, path, lambda *a: taken.append(path) or real_path(*a))
    real = Batch.from_draw.__func__
    released: list[int] = []
    real_release = StagingPool.release_slot

    def count(pool, slot):
        released.append(slot)
        real_release(pool, slot)

    def from_draw_then_signal(cls, *args, **kwargs):
        batch = real(cls, *args, **kwargs)  # the batch holds the buffer now
        assert not batch.released
        del batch  # dropped as the handler's exception unwinds: its collection gives the buffer back
        raise KeyboardInterrupt  # what `graphrl.interrupts`' handler raises

    with MemoryManager() as mm:
        store = ReplayStore(SPEC, 64, 1, memory=mm, seed=1, timeout=5.0)
        with store.writer() as w:
            w.add_episode({"v": np.arange(40)})
        store.sample(4, window).release()  # the staging pool made, the kernels compiled
        monkeypatch.setattr(StagingPool, "release_slot", count)
        with monkeypatch.context() as m:
            m.setattr(Batch, "from_draw", classmethod(from_draw_then_signal))
            with pytest.raises(KeyboardInterrupt):  # not a ValueError from a second release
                store.sample(4, window)
        assert taken == [path, path] and len(released) <= 1, (taken, released)  # not twice
        # the buffer went back once: at the collection, or (the signal's frame still holding the slot's
        # mask then: release_when_unused) when the next sample takes it back; and it is handed out again
        with store.sample(4, window) as b:
            assert b.batch_size == 4 and b.window == window
        assert len(released) == 2
        store.close()

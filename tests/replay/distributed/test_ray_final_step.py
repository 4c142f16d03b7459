"""RayTrajectoryWriter.end_episode(final=...) stores what the local writer's stores: the observation after
the last step as one more step, every other field zero; a bad ``final`` raises the same error, nothing
shipped (the rule is `replay.writer.final_step`'s)."""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import ReplayStore, TrajectorySpec  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402

SPEC = TrajectorySpec({"obs": ((3,), "uint8"), "action": ((), "int64"), "done": ((), "bool")})


def episodes(store) -> list[tuple]:
    return [(e.length, e.open, {k: v.tolist() for k, v in e.data.items()}) for e in store.episodes()]


def test_final_step_as_the_local_writer(cluster):
    local = ReplayStore(SPEC, 64, 1, chunk_steps=4, seed=0)
    with RayReplayStore(SPEC, 64, num_shards=1, chunk_steps=4, seed=0) as far:
        with local.writer() as lw, far.writer(max_inflight=0) as fw:
            for w in (lw, fw):
                for t in (1, 3, 6):  # 6 > chunk_steps: the final step follows a shipped chunk
                    w.extend({"obs": np.full((t, 3), t, np.uint8), "action": np.arange(1, t + 1),
                              "done": np.arange(t) == t - 1})
                    w.end_episode(final={"obs": np.full(3, 100 + t, np.uint8)})
            errors = []
            for w in (lw, fw):
                w.append({"obs": np.zeros(3, np.uint8), "action": 1, "done": True})
                with pytest.raises(ValueError) as info:
                    w.end_episode(final={"pixels": np.zeros(3, np.uint8)})
                errors.append(str(info.value))
                assert w.pending == 1
                w.end_episode()
            assert errors[0] == errors[1] and "end_episode(final=...)" in errors[0]
            fw.wait()
            assert (lw.steps_written, lw.episodes_written) == (14, 4)
            assert (fw.steps_written, fw.episodes_written) == (14, 4)
        got, want = episodes(far), episodes(local)
    local.close()
    assert got == want
    assert [e[0] for e in want] == [2, 4, 7, 1]
    assert want[2][2]["obs"][-1] == [106] * 3 and want[2][2]["action"][-1] == 0 and not want[2][2]["done"][-1]

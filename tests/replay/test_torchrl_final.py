"""TorchRLWriter(final_fields=...): an episode's last ``("next", key)`` value stored as its final step, at
every kind of end (done, a trajectory id changing across rollouts, close), every other field zero."""

from __future__ import annotations

import pytest
import torch

from replay import ReplayStore, TrajectorySpec
from replay.torchrl import TorchRLWriter

tensordict = pytest.importorskip("tensordict", reason="needs the torchrl extra: pip install -e '.[torchrl]'")
from tensordict import TensorDict  # noqa: E402

SPEC = TrajectorySpec({"observation": ((2,), "float32"), "action": ((), "int64")})


def rollout(first: int, t: int, traj: list[int], done: list[int]) -> TensorDict:
    """Steps first .. first + t - 1: observation = index + 1, next observation = index + 101."""
    idx = torch.arange(first, first + t, dtype=torch.float32)
    d = torch.zeros(t, 1, dtype=torch.bool)
    d[done] = True
    return TensorDict({
        "observation": (idx + 1)[:, None].repeat(1, 2),
        "action": torch.arange(first, first + t) + 1,
        "next": {"observation": (idx + 101)[:, None].repeat(1, 2), "done": d},
        "collector": {"traj_ids": torch.tensor(traj)},
    }, batch_size=[t])


def test_final_observation_at_every_end() -> None:
    with ReplayStore(SPEC, capacity_steps=64, seed=0) as store:
        with TorchRLWriter(store, final_fields=("observation",)) as w:
            w.extend(rollout(0, 6, [0, 0, 0, 1, 1, 1], [2]))  # A ends by done; B open at the end
            w.extend(rollout(6, 4, [2, 2, 2, 2], []))  # B cut by the new trajectory id; C open
        # C ended by close
        got = sorted(
            (e.data["observation"][:, 0].tolist(), e.data["action"].tolist()) for e in store.episodes()
        )
    assert got == [
        ([1, 2, 3, 103], [1, 2, 3, 0]),
        ([4, 5, 6, 106], [4, 5, 6, 0]),
        ([7, 8, 9, 10, 110], [7, 8, 9, 10, 0]),
    ]


def test_final_fields_checked() -> None:
    with ReplayStore(SPEC, capacity_steps=64, seed=0) as store:
        with pytest.raises(ValueError, match="final_fields"):
            TorchRLWriter(store, final_fields=("pixels",))
        with TorchRLWriter(store, final_fields=("observation",)) as w:
            r = rollout(0, 3, [0, 0, 0], [2])
            del r["next", "observation"]
            with pytest.raises(ValueError, match=r"no \('next', 'observation'\).*final_fields"):
                w.extend(r)
        assert len(store) == 0

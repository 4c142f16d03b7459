"""TorchRLWriter honours the key mapping it is given (issue 30): a renamed trajectory-id key or done key
cuts episodes as the default ones do, and a mapping the writer cannot honour is refused by name.

The scenario follows TorchRL's ``SliceSampler(traj_key="episode", end_key="done")`` tests: four
episodes of 25 steps in one rollout of 100."""

from __future__ import annotations

import pytest
import torch

from replay import ReplayStore
from replay.torchrl import TorchRLWriter, torchrl_spec

tensordict = pytest.importorskip("tensordict", reason="needs the torchrl extra: pip install -e '.[torchrl]'")

from tensordict import TensorDict  # noqa: E402

EPISODES, LENGTH = 4, 25


def flat_rollout(with_ids: bool = True, with_done: bool = True, done_key="done") -> TensorDict:
    """100 steps, four episodes of 25: ids at root "episode", episode ends at ``done_key``."""
    steps = EPISODES * LENGTH
    episode = torch.arange(steps) // LENGTH
    done = torch.zeros(steps, 1, dtype=torch.bool)
    done[LENGTH - 1::LENGTH] = True
    data = {"observation": torch.arange(steps, dtype=torch.float32)[:, None]}
    if with_ids:
        data["episode"] = episode
    td = TensorDict(data, batch_size=[steps])
    if with_done:
        td.set(done_key, done)
    return td


def check_store(store, field: str = "episode_id") -> None:
    """Exactly four closed episodes of 25 steps, and every sampled window stays in one episode."""
    eps = store.episodes()
    assert len(eps) == EPISODES, [e.length for e in eps]
    assert sorted(e.length for e in eps) == [LENGTH] * EPISODES
    for e in eps:  # the steps of one episode are 25 consecutive observations of one collector episode
        obs = e.data["observation"][:, 0]
        assert obs.tolist() == list(range(int(obs[0]), int(obs[0]) + LENGTH)) and int(obs[0]) % LENGTH == 0
    for _ in range(5):
        with store.sample(32, window=10) as batch:
            ep = batch["observation"][..., 0].long() // LENGTH  # the collector episode of each step
            mask = batch.mask
            first = ep[:, :1].expand_as(ep)
            assert bool((ep[mask] == first[mask]).all()), "a window crosses an episode boundary"
            if field in store.spec:
                ids = batch[field]
                assert bool((ids[mask] == ids[:, :1].expand_as(ids)[mask]).all())


def test_custom_trajectory_and_done_keys_give_four_episodes(mm):
    keys = {"traj_ids": "episode", "done": "done"}
    td = flat_rollout()
    spec = torchrl_spec(td, keys)
    assert set(spec) == {"observation", "traj_ids", "done"}
    store = ReplayStore(spec, capacity_steps=256, memory=mm, timeout=5.0)
    try:
        with TorchRLWriter(store, keys=keys) as w:
            assert w.traj_key == "episode" and w.end_keys[0] == "done"
            w.extend(td)
        assert w.episodes_written == EPISODES
        check_store(store, "traj_ids")
    finally:
        store.close()


def test_custom_trajectory_key_alone_cuts_episodes(mm):
    keys = {"traj_ids": "episode"}
    td = flat_rollout(with_done=False)  # only the ids tell the episodes apart
    store = ReplayStore(torchrl_spec(td, keys), capacity_steps=256, memory=mm, timeout=5.0)
    try:
        with TorchRLWriter(store, keys=keys) as w:
            w.extend(td)
        check_store(store, "traj_ids")
    finally:
        store.close()


def test_custom_trajectory_key_cuts_even_when_ids_are_not_stored(mm):
    td = flat_rollout(with_done=False)
    store = ReplayStore(torchrl_spec(td, {"traj_ids": None}), capacity_steps=256, memory=mm, timeout=5.0)
    try:
        assert "traj_ids" not in store.spec
        with TorchRLWriter(store, keys={"traj_ids": "episode"}) as w:
            w.extend(td)
        check_store(store)
    finally:
        store.close()


@pytest.mark.parametrize("field, key", [("done", "done"), ("done", ("next", "end")),
                                        ("terminated", "term"), ("truncated", ("info", "cut"))])
def test_custom_end_key_alone_cuts_episodes(mm, field, key):
    keys = {field: key}
    td = flat_rollout(with_ids=False, done_key=key)  # only the end flags tell the episodes apart
    spec = torchrl_spec(td, keys)
    assert field in spec
    store = ReplayStore(spec, capacity_steps=256, memory=mm, timeout=5.0)
    try:
        with TorchRLWriter(store, keys=keys) as w:
            w.extend(td)
        check_store(store)
    finally:
        store.close()


def test_custom_end_key_cuts_in_chunks_across_rollouts(mm):
    keys = {"traj_ids": "episode", "done": "done"}
    td = flat_rollout()
    store = ReplayStore(torchrl_spec(td, keys), capacity_steps=256, memory=mm, timeout=5.0)
    try:
        with TorchRLWriter(store, keys=keys) as w:
            for part in td.split(30):  # rollouts of 30 steps: episodes continue across them
                w.extend(part)
        check_store(store, "traj_ids")
    finally:
        store.close()


def test_a_mapping_the_writer_cannot_honour_is_refused_by_name(mm):
    td = flat_rollout()
    store = ReplayStore(torchrl_spec(td, {"traj_ids": "episode", "done": "done"}), capacity_steps=64,
                        memory=mm, timeout=5.0)
    try:
        with pytest.raises(ValueError, match=r"keys\['obs'\]='pixels'"):
            TorchRLWriter(store, keys={"traj_ids": "episode", "done": "done", "obs": "pixels"})
        with pytest.raises(ValueError, match=r"keys\['mask'\]"):
            TorchRLWriter(store, keys={"traj_ids": "episode", "done": "done", "mask": "valid"})
        with pytest.raises(ValueError, match="both map"):
            TorchRLWriter(store, keys={"traj_ids": "episode", "done": "episode"})
        # an end key the mapping names explicitly must be in the rollout: never silently skipped
        w = TorchRLWriter(store, keys={"traj_ids": "episode", "done": "done", "truncated": "cut"})
        with pytest.raises(ValueError, match=r"'cut'.*keys\['truncated'\]"):
            w.extend(td)
        assert w.steps_written == 0 and len(store) == 0
        w.close()
    finally:
        store.close()


def test_the_default_mapping_still_reads_the_collector_keys(mm):
    steps = EPISODES * LENGTH
    td = TensorDict({"observation": torch.arange(steps, dtype=torch.float32)[:, None],
                     "next": {"done": torch.zeros(steps, 1, dtype=torch.bool)},
                     "collector": {"traj_ids": torch.arange(steps) // LENGTH}}, batch_size=[steps])
    store = ReplayStore(torchrl_spec(td), capacity_steps=256, memory=mm, timeout=5.0)
    try:
        with TorchRLWriter(store) as w:
            assert w.traj_key == ("collector", "traj_ids") and w.end_keys[0] == ("next", "done")
            w.extend(td)
        check_store(store, "traj_ids")
    finally:
        store.close()

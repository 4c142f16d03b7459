"""replay.torchrl and Batch.to_tensordict's TorchRL layout: a real TorchRL collector on CartPole writes
episodes through TorchRLWriter, and sampled batches go through a TorchRL DQNLoss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from replay import ReplayStore, TrajectorySpec
from replay.torchrl import DEFAULT_KEYS, TorchRLWriter, torchrl_keys, torchrl_spec

tensordict = pytest.importorskip("tensordict", reason="needs the torchrl extra: pip install -e '.[torchrl]'")
torchrl = pytest.importorskip("torchrl", reason="needs the torchrl extra: pip install -e '.[torchrl]'")
pytest.importorskip("gymnasium", reason="needs gymnasium (a core dependency)")

from tensordict import TensorDict  # noqa: E402


def collector_class():
    import torchrl.collectors as c

    return getattr(c, "Collector", None) or c.SyncDataCollector  # SyncDataCollector before 0.14


def make_env(n_envs: int, seed: int):
    from torchrl.envs import GymEnv, SerialEnv

    env = GymEnv("CartPole-v1") if n_envs == 1 else SerialEnv(n_envs, lambda: GymEnv("CartPole-v1"))
    env.set_seed(seed)
    return env


def collect(n_envs: int, frames_per_batch: int, batches: int, seed: int = 0) -> list[TensorDict]:
    """Rollouts of a random policy (policy=None: uniform over the action spec)."""
    torch.manual_seed(seed)
    env = make_env(n_envs, seed)
    total = frames_per_batch * batches
    col = collector_class()(env, None, frames_per_batch=frames_per_batch, total_frames=total)
    try:
        return [r.clone() for r in col]
    finally:
        col.shutdown()


def reference_episodes(rollouts: list[TensorDict], keys: dict) -> list[dict[str, np.ndarray]]:
    """The collector's episodes per env: split where ("next", "done") is set or traj_ids change."""
    out = []
    n_envs = 1 if rollouts[0].batch_dims == 1 else rollouts[0].batch_size[0]
    for env in range(n_envs):
        steps = torch.cat([r if r.batch_dims == 1 else r[env] for r in rollouts], 0)
        ids = steps["collector", "traj_ids"].numpy()
        done = steps["next", "done"].squeeze(-1).numpy()
        cut = np.flatnonzero(done[:-1] | (ids[1:] != ids[:-1])) + 1
        for sel in np.split(np.arange(len(ids)), cut):
            out.append({f: steps.get(k)[sel].numpy() for f, k in keys.items()})
    return out


def stored_episodes(store) -> list[dict[str, np.ndarray]]:
    eps = store.episodes()
    assert not any(e.open or e.continuation for e in eps)
    return [e.data for e in eps]


def same_episodes(got, want) -> bool:
    key = lambda e: (int(e["traj_ids"][0]), len(e["traj_ids"]))  # noqa: E731
    got, want = sorted(got, key=key), sorted(want, key=key)
    assert [key(e) for e in got] == [key(e) for e in want]
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for f in g:
            np.testing.assert_array_equal(g[f], w[f], err_msg=f)
    return True


@pytest.mark.parametrize("n_envs", [1, 2])
def test_collector_rollouts_become_the_collectors_episodes(mm, n_envs):
    rollouts = collect(n_envs, frames_per_batch=60, batches=6, seed=n_envs)
    ids = [set(r["collector", "traj_ids"].flatten().tolist()) for r in rollouts]
    assert any(a & b for a, b in zip(ids, ids[1:], strict=False)), "no episode spans two rollouts"
    spec = torchrl_spec(rollouts[0])
    assert set(spec) == set(DEFAULT_KEYS)
    assert spec["observation"].shape == (4,) and spec["reward"].shape == (1,) and spec["action"].shape == (2,)
    store = ReplayStore(spec, capacity_steps=4096, memory=mm, chunk_steps=512, timeout=5.0)
    try:
        with TorchRLWriter(store) as writer:
            for r in rollouts:
                assert writer.extend(r) == r.numel()
            assert writer.steps_written == sum(r.numel() for r in rollouts)
            # the last episode of each env is still open: it continues in the next rollout
            assert len(writer.writers) == n_envs  # one local writer per env
        want = reference_episodes(rollouts, torchrl_keys())
        assert writer.episodes_written == len(want)
        got = stored_episodes(store)
        assert same_episodes(got, want)
        for e in got:  # boundaries: done only at an episode's last step, except the collection's end
            done = e["done"][:, 0] | e["truncated"][:, 0]
            assert not done[:-1].any()
        ends = sum(bool(e["done"][-1, 0]) for e in got)
        assert ends >= len(got) - n_envs  # every episode ends done but the n_envs cut at the end
        assert all((e["traj_ids"] == e["traj_ids"][0]).all() for e in got)
        assert any(len(e["traj_ids"]) > 1 for e in got)
    finally:
        store.close()


def test_dqn_loss_consumes_sampled_batches_with_the_stored_values(mm):
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss

    rollouts = collect(1, frames_per_batch=100, batches=4)
    spec = torchrl_spec(rollouts[0])
    store = ReplayStore(spec, capacity_steps=1024, memory=mm, chunk_steps=512, timeout=5.0, seed=0)
    env = make_env(1, 0)
    try:
        with TorchRLWriter(store) as writer:
            for r in rollouts:
                writer.extend(r)
        torch.manual_seed(0)
        actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[16]), in_keys=["observation"],
                            spec=env.action_spec)
        loss_fn = DQNLoss(actor, action_space=env.action_spec, delay_value=True)
        gamma = loss_fn.value_estimator.gamma
        for pad in ("tail", "head"):
            with store.sample(16, window=8, pad=pad) as batch:
                td = batch.to_tensordict()
                assert tuple(td.batch_size) == (16, 8) and td.names == [None, "time"]
                assert td["observation"].data_ptr() == batch["observation"].data_ptr()  # a view
                assert torch.equal(td["next", "reward"], batch["reward"])
                assert torch.equal(td["next", "observation"], batch["next_observation"])
                assert torch.equal(td["collector", "traj_ids"], batch["traj_ids"])
                assert torch.equal(td["collector", "mask"], batch.mask)
                end = torch.zeros(16, 8, dtype=torch.bool)  # SliceSampler: truncated at each slice's end
                end[torch.arange(16), torch.where(batch.mask, torch.arange(8), -1).amax(1)] = True
                assert torch.equal(td["next", "truncated"][..., 0], batch["truncated"][..., 0] | end)
                assert torch.equal(td["next", "done"][..., 0], batch["done"][..., 0] | end)
                assert torch.equal(td["next", "terminated"], batch["terminated"])
                assert torch.equal(td["keys"][:, 0], batch.keys)
                assert torch.equal(td["priority_weight"][:, 3], batch.weights)
                real = td[batch.mask]
                assert real.numel() == int(batch.lengths.sum())
                # the real steps are stored steps: each (traj id, observation) row is one of the collector's
                seen = {(int(i), tuple(o.tolist())) for r in rollouts
                        for i, o in zip(r["collector", "traj_ids"], r["observation"], strict=True)}
                assert all((int(i), tuple(o.tolist())) in seen
                           for i, o in zip(real["collector", "traj_ids"], real["observation"], strict=True))

                loss = loss_fn(td)["loss"]
                loss.backward()
                grads = [p.grad for p in actor.parameters()]
                assert all(g is not None and torch.isfinite(g).all() for g in grads)
                assert any(g.abs().sum() > 0 for g in grads)
                # the same loss by hand from the stored values, over the real steps only
                mlp = actor.module[0]  # QValueActor = the MLP, then an argmax module
                with torch.no_grad():
                    q_next = mlp(batch["next_observation"]).max(-1).values  # [B, L]
                pred = (mlp(batch["observation"]) * batch["action"]).sum(-1)
                alive = ~batch["terminated"][..., 0]
                target = batch["reward"][..., 0] + gamma * alive * q_next
                want = ((pred - target) ** 2)[batch.mask].mean()
                torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
                actor.zero_grad()
                flat = batch.to_tensordict(flat=True)
                assert tuple(flat.batch_size) == (128,)
                assert torch.equal(flat["observation"], batch["observation"].reshape(128, 4))
                torch.testing.assert_close(loss_fn(flat)["loss"], want, rtol=1e-5, atol=1e-6)
    finally:
        store.close()
        env.close()


def test_batch_layout_is_what_to_tensordict_returned_before(mm):
    spec = TrajectorySpec({"obs": ((3,), "float32"), "reward": ((), "float32")})
    store = ReplayStore(spec, capacity_steps=64, memory=mm, timeout=5.0)
    try:
        with store.writer() as w:
            w.extend({"obs": torch.arange(30.0).reshape(10, 3), "reward": torch.arange(10.0)})
        with store.sample(4, window=3) as batch:
            old = batch.to_tensordict(layout="batch")
            assert tuple(old.batch_size) == (4,)
            assert set(old.keys()) == {"obs", "reward", "mask", "keys", "probabilities", "weights", "lengths"}
            assert torch.equal(old["keys"], batch.keys) and torch.equal(old["reward"], batch["reward"])
            new = batch.to_tensordict()  # an unmapped field keeps its name; scalar flags get [B, L, 1]
            assert torch.equal(new["obs"], batch["obs"])
            assert torch.equal(new["next", "reward"], batch["reward"])
            assert new["next", "done"].shape == (4, 3, 1) and not new["next", "terminated"].any()
            mine = batch.to_tensordict(keys={"obs": "pixels", "reward": None})
            assert torch.equal(mine["pixels"], batch["obs"]) and torch.equal(mine["reward"], batch["reward"])
            with pytest.raises(ValueError, match="layout"):
                batch.to_tensordict(layout="slices")
            with pytest.raises(ValueError, match="both map"):
                batch.to_tensordict(keys={"obs": ("next", "reward")})
    finally:
        store.close()


def rollout(obs, done, traj, n_envs=None, mask=None):
    """A hand-made collector-style rollout of scalar observations."""
    obs = torch.as_tensor(obs, dtype=torch.float32)
    bs = obs.shape
    data = {
        "observation": obs[..., None],
        "next": {"done": torch.as_tensor(done, dtype=torch.bool)[..., None]},
        "collector": {"traj_ids": torch.as_tensor(traj, dtype=torch.int64)},
    }
    if mask is not None:
        data["collector"]["mask"] = torch.as_tensor(mask, dtype=torch.bool)
    return TensorDict(data, batch_size=bs)


def test_episodes_continue_across_rollouts_and_split_on_ids_and_mask(mm):
    spec = TrajectorySpec({"observation": ((1,), "float32"), "traj_ids": ((), "int64")})
    store = ReplayStore(spec, capacity_steps=256, memory=mm, chunk_steps=64, timeout=5.0)
    try:
        w = TorchRLWriter(store)
        w.extend(rollout([0, 1, 2], [0, 1, 0], [7, 7, 8]))  # ends after 1; 2 stays open
        assert [e.length for e in store.episodes()] == [2]
        w.extend(rollout([3, 4, 5], [0, 0, 0], [8, 9, 9]))  # 3 continues traj 8; the id change cuts 4
        w.extend(rollout([6, 7, 8], [0, 0, 1], [10, 10, 10], mask=[1, 0, 1]))  # new id cuts 9; 7 skipped
        w.close()
        got = sorted((e.data["traj_ids"][0], e.data["observation"][:, 0].tolist()) for e in store.episodes())
        assert got == [(7, [0, 1]), (8, [2, 3]), (9, [4, 5]), (10, [6, 8])]
        assert w.episodes_written == 4 and w.steps_written == 8
        with pytest.raises(ValueError, match="closed"):
            w.extend(rollout([0], [0], [0]))
    finally:
        store.close()


def test_bad_rollouts_store_nothing_and_name_the_problem(mm):
    spec = TrajectorySpec({"observation": ((1,), "float32"), "reward": ((1,), "float32")})
    store = ReplayStore(spec, capacity_steps=64, memory=mm, timeout=5.0)
    try:
        w = TorchRLWriter(store)
        with pytest.raises(ValueError, match=r"'next', 'reward'.*field 'reward'"):
            w.extend(rollout([0, 1], [0, 0], [0, 0]))
        bad = rollout([0, 1], [0, 0], [0, 0])
        bad["next", "reward"] = torch.zeros(2, 1, dtype=torch.float64)
        with pytest.raises(TypeError, match="reward"):
            w.extend(bad)
        with pytest.raises(ValueError, match="batch size"):
            w.extend(TensorDict({}, batch_size=[]))
        assert w.steps_written == 0 and len(store) == 0
        one = TorchRLWriter(store.writer())  # a single writer takes one env
        good = rollout([[0, 1], [2, 3]], [[0, 0], [0, 0]], [[0, 0], [1, 1]])
        good["next", "reward"] = torch.zeros(2, 2, 1)
        with pytest.raises(ValueError, match="one env"):
            one.extend(good)
        w.close()
        with pytest.raises(TypeError, match="tuple of str"):
            torchrl_keys({"reward": 3})
    finally:
        store.close()

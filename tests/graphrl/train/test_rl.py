"""The RL learner's pieces on hand-made inputs, a short distributed run on CartPole, and the CLI's rl task."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from graphrl.cli import main
from graphrl.memory import MemoryManager
from graphrl.nn import TransformerQNetwork
from graphrl.train.rl import (
    DQNLearner,
    RLConfig,
    SharedWeights,
    dqn_loss,
    epsilon_at,
    moving_average,
    n_step_targets,
    run_rl,
    trajectory_spec,
    window_priorities,
)
from replay import Prioritized, ReplayStore

T, F = True, False


# ------------------------------------------------------------------------------------------ network


def test_q_network_is_causal():
    net = TransformerQNetwork(obs_dim=4, num_actions=3, window=12, d_model=32, num_layers=2, seed=0)
    x = torch.randn(5, 12, 4, generator=torch.Generator().manual_seed(1))
    q = net(x)
    assert q.shape == (5, 12, 3)
    for t in (0, 4, 10):
        y = x.clone()
        y[:, t + 1 :] = torch.randn(5, 11 - t, 4)  # change only the steps after t
        q2 = net(y)
        torch.testing.assert_close(q2[:, : t + 1], q[:, : t + 1], rtol=0, atol=1e-6)
        assert (q2[:, t + 1 :] - q[:, t + 1 :]).abs().amax() > 1e-3  # later steps do see them
    # a shorter window gives the same outputs as the prefix of a longer one (left-aligned contexts)
    torch.testing.assert_close(net(x[:, :5]), q[:, :5], rtol=0, atol=1e-6)


def test_q_network_head_padding_mask_hides_padded_steps():
    net = TransformerQNetwork(obs_dim=4, num_actions=2, window=8, seed=0)
    x = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[F, F, F, T, T, T, T, T], [T] * 8])
    y = x.clone()
    y[0, :3] = 100.0  # padding content must not matter for real steps
    q1, q2 = net(x, mask), net(y, mask)
    torch.testing.assert_close(q1[0, 3:], q2[0, 3:], rtol=0, atol=1e-5)
    torch.testing.assert_close(q1[1], q2[1], rtol=0, atol=0)
    assert torch.isfinite(q2).all()
    # the real steps equal the same steps run alone, left-aligned (positions differ, so compare shapes)
    with pytest.raises(ValueError, match="obs must have shape"):
        net(torch.zeros(2, 9, 4))


def test_q_network_is_seeded():
    a = TransformerQNetwork(4, 2, 8, seed=3)
    b = TransformerQNetwork(4, 2, 8, seed=3)
    c = TransformerQNetwork(4, 2, 8, seed=4)
    x = torch.randn(3, 8, 4)
    torch.testing.assert_close(a(x), b(x))
    assert not torch.allclose(a(x), c(x))


# ------------------------------------------------------------------------------------------ targets


def test_n_step_targets_by_hand():
    g = 0.5
    # window 0: real steps 0..3, the episode terminates at step 2 (step 3 starts... nothing: padding)
    # window 1: five real steps of a long episode (window end cuts it)
    # window 2: two real steps, then padding, the episode was truncated (no done): last step no target
    reward = torch.tensor([[1.0, 2.0, 4.0, 0.0, 0.0],
                           [1.0, 1.0, 1.0, 1.0, 1.0],
                           [3.0, 5.0, 0.0, 0.0, 0.0]])
    done = torch.tensor([[F, F, T, F, F], [F] * 5, [F] * 5])
    mask = torch.tensor([[T, T, T, F, F], [T] * 5, [T, T, F, F, F]])
    v = torch.tensor([[10.0, 20.0, 30.0, 99.0, 99.0],
                      [10.0, 20.0, 30.0, 40.0, 50.0],
                      [10.0, 20.0, 99.0, 99.0, 99.0]])
    target, valid = n_step_targets(reward, done, mask, v, gamma=g, n=2)
    want = torch.tensor([
        [1 + g * 2 + g * g * 30, 2 + g * 4, 4, 0, 0],  # step 1: terminal at 2 cuts the sum; step 2: r only
        [1 + g * 1 + g * g * 30, 1 + g * 1 + g * g * 40, 1 + g * 1 + g * g * 50, 1 + g * 50, 0],
        [3 + g * 20, 0, 0, 0, 0],  # step 0: one step then bootstrap (step 2 is padding)
    ])
    want_valid = torch.tensor([[T, T, T, F, F], [T, T, T, T, F], [T, F, F, F, F]])
    assert torch.equal(valid, want_valid)
    torch.testing.assert_close(target, want)
    # n = 1 is the one-step DQN target
    t1, v1 = n_step_targets(reward, done, mask, v, gamma=g, n=1)
    torch.testing.assert_close(t1[1, :4], reward[1, :4] + g * v[1, 1:])
    assert t1[0, 2] == 4 and v1[0, 2]
    # a long horizon on window 1 sums all its rewards and has nothing to bootstrap past the end
    t5, v5 = n_step_targets(reward, done, mask, v, gamma=g, n=5)
    torch.testing.assert_close(t5[1, 0], torch.tensor(1 + g + g**2 + g**3 + g**4 * 50))
    with pytest.raises(ValueError, match="n must be"):
        n_step_targets(reward, done, mask, v, g, 0)
    with pytest.raises(ValueError, match="share one"):
        n_step_targets(reward, done, mask[:, :4], v, g, 1)


def test_window_priorities_mix_max_and_mean_of_valid_steps():
    td = torch.tensor([[1.0, -3.0, 100.0], [0.5, 0.5, 0.5], [7.0, 7.0, 7.0]]).abs()
    valid = torch.tensor([[T, T, F], [T, T, T], [F, F, F]])
    p = window_priorities(td, valid, eta=0.9, eps=0.01)
    want = torch.tensor([0.9 * 3 + 0.1 * 2 + 0.01, 0.5 + 0.01, 0.01], dtype=torch.float64)
    torch.testing.assert_close(p, want)
    torch.testing.assert_close(window_priorities(td, valid, eta=1.0, eps=0.0)[:2],
                               torch.tensor([3.0, 0.5], dtype=torch.float64))


def test_dqn_loss_applies_importance_weights():
    q = torch.tensor([[1.0, 2.0, 0.0], [0.0, 5.0, 1.0]], requires_grad=True)
    target = torch.tensor([[1.5, 0.0, 9.0], [3.0, 5.0, 1.0]])
    valid = torch.tensor([[T, T, F], [T, T, T]])
    w = torch.tensor([0.5, 1.0])
    loss, td = dqn_loss(q, target, valid, w)
    # huber(0.5) = 0.125, huber(2) = 1.5, huber(3) = 2.5, the rest 0; 5 valid steps
    assert loss.item() == pytest.approx((0.5 * (0.125 + 1.5) + 1.0 * (2.5 + 0 + 0)) / 5)
    torch.testing.assert_close(td, torch.tensor([[-0.5, 2.0, 0.0], [-3.0, 0.0, 0.0]]))
    loss.backward()
    # the gradient of a step is w_b * clip(td) / 5: the weight scales it, an invalid step gets none
    torch.testing.assert_close(q.grad, torch.tensor([[0.5 * -0.5, 0.5 * 1.0, 0.0], [-1.0, 0.0, 0.0]]) / 5)
    q.grad = None
    loss0, _ = dqn_loss(q, target, valid, torch.tensor([0.0, 1.0]))
    loss0.backward()
    assert not q.grad[0].any()  # weight 0: that window does not move the network


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    b, length = 6, 5
    mask = torch.ones(b, length, dtype=torch.bool)
    mask[0, 3:] = False
    done = torch.zeros(b, length, dtype=torch.bool)
    done[0, 2] = True
    return {"obs": torch.randn(b, length, 4, generator=gen),
            "action": torch.randint(0, 2, (b, length), generator=gen), "reward": torch.ones(b, length),
            "done": done, "mask": mask,
            "weights": torch.tensor([1.0, 0.5, 0.25, 1.0, 1.0, 0.1])}


def test_learner_update_uses_double_dqn_targets_and_reports_priorities():
    net = TransformerQNetwork(4, 2, 5, d_model=32, seed=0)
    learner = DQNLearner(net, lr=1e-3, gamma=0.9, n_step=2, target_update=2, priority_eta=0.9,
                         priority_eps=1e-3)
    batch = _batch()
    with torch.no_grad():  # the expected TD errors, computed by hand before the step
        q = net(batch["obs"])
        q_target = learner.target(batch["obs"])
        boot = q_target.gather(-1, q.argmax(-1, keepdim=True)).squeeze(-1)
        target, valid = n_step_targets(batch["reward"], batch["done"], batch["mask"], boot, 0.9, 2)
        td = q.gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1) - target
    stats = learner.update(batch)
    assert torch.equal(stats.valid, valid)
    torch.testing.assert_close(stats.td, torch.where(valid, td, 0.0))
    a = td.abs().double()
    want = torch.stack([0.9 * a[i][valid[i]].max() + 0.1 * a[i][valid[i]].mean() + 1e-3 for i in range(6)])
    torch.testing.assert_close(stats.priorities, want)
    assert learner.updates == 1
    # the target network follows the online network every target_update updates
    pairs = lambda: zip(net.parameters(), learner.target.parameters(), strict=True)
    assert any(not torch.equal(p, t) for p, t in pairs())
    learner.update(batch)
    assert all(torch.equal(p, t) for p, t in pairs())


def test_priorities_from_td_reach_the_store():
    """After ``update_priorities(keys, priorities from |TD|)`` the store draws windows with P ~ p ** alpha."""
    alpha = 0.6
    store = ReplayStore(trajectory_spec(4), capacity_steps=1000, selector=Prioritized(alpha), tier="host",
                        seed=0)
    try:
        with store.writer() as w:
            for length in (7, 5, 9):
                obs = np.random.default_rng(length).standard_normal((length, 4)).astype(np.float32)
                w.extend({"obs": obs,
                          "action": np.zeros(length, np.int64), "reward": np.ones(length, np.float32),
                          "done": np.arange(length) == length - 1})
                w.end_episode()
        learner = DQNLearner(TransformerQNetwork(4, 2, 4, d_model=32, seed=0), n_step=2)
        with store.sample(16, window=4, pad="tail", beta=0.5) as batch:
            stats = learner.update(batch)
            keys = batch.keys.numpy().copy()
            assert store.update_priorities(batch.keys, stats.priorities) == 16
        prio = {}
        for k, p in zip(keys.tolist(), stats.priorities.tolist(), strict=True):
            prio[k] = p  # repeated keys: the last value wins
        mass = sum(p**alpha for p in prio.values()) + (21 - len(prio)) * 1.0  # others keep priority 1
        with store.sample(64, window=4, pad="tail") as again:
            for k, p in zip(again.keys.tolist(), again.probabilities.tolist(), strict=True):
                assert p == pytest.approx(prio.get(k, 1.0) ** alpha / mass, rel=1e-9)
    finally:
        store.close()


# ------------------------------------------------------------------------------------------ small parts


def test_shared_weights_publish_and_pull():
    mm = MemoryManager()
    try:
        a = TransformerQNetwork(4, 2, 8, seed=0)
        b = TransformerQNetwork(4, 2, 8, seed=1)
        mine = SharedWeights.create(mm, a)
        theirs = SharedWeights.attach(mine.handle())
        assert not theirs.pull(b)  # nothing published yet
        assert mine.publish(a) == 2
        assert theirs.pull(b) and not theirs.pull(b)  # loaded once; unchanged afterwards
        x = torch.randn(2, 8, 4)
        torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)
        with torch.no_grad():
            a.head.bias.add_(1.0)
        mine.version[0] += 1  # a write in progress (odd version): readers must not load
        assert not theirs.pull(b)
        mine.version[0] -= 1
        assert mine.publish(a) == 4 and theirs.pull(b)
        torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)
        with pytest.raises(ValueError, match="parameters"):
            mine.publish(TransformerQNetwork(4, 2, 8, d_model=32))
        theirs.close()
        mine.close()
    finally:
        mm.close()


def test_schedules_and_config_validation():
    assert epsilon_at(0, 1.0, 0.1, 100) == 1.0
    assert epsilon_at(50, 1.0, 0.1, 100) == pytest.approx(0.55)
    assert epsilon_at(10**6, 1.0, 0.1, 100) == pytest.approx(0.1)
    assert moving_average([1, 2, 3, 10], 2) == 6.5 and moving_average([4], 100) == 4
    assert np.isnan(moving_average([], 10))
    RLConfig().validate()
    for bad, name in (({"window": 0}, "window"), ({"gamma": 1.5}, "gamma"), ({"minutes": 0}, "minutes"),
                      ({"min_size": 10, "capacity_steps": 5}, "min_size")):
        with pytest.raises(ValueError, match=name):
            RLConfig(**bad).validate()
    with pytest.raises(ValueError, match="Discrete"):
        run_rl(RLConfig(env_id="Pendulum-v1", minutes=0.01), progress=False)


# ------------------------------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_distributed_dqn_learns_cartpole():
    """Two actor processes and the learner: the 50-episode average return climbs well above random (~22)."""
    config = RLConfig(minutes=0.6, num_actors=2, avg_episodes=50, target_return=120.0, seed=0)
    report = run_rl(config, progress=False)
    assert report.episodes >= 60 and report.updates > 100
    first = moving_average(report.returns[:50], 50)
    assert first < 45, first  # epsilon starts at 1: the first episodes are (nearly) random
    assert report.best_moving_average > 70, (report.best_moving_average, report.stopped_by, report.updates)
    assert report.env_steps >= sum(report.returns) * 0.99  # every finished episode's steps were inserted
    assert report.windows_sampled == report.updates * config.batch_size
    assert report.inserted_steps_per_s > 0 and report.windows_per_s > 0
    assert len(report.losses) == report.updates and np.isfinite(report.losses).all()


@pytest.mark.slow
def test_cli_demo_rl_prints_its_lines():
    result = CliRunner().invoke(main, ["demo", "--task", "rl", "--minutes", "0.25"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    assert re.search(r"^task: RL on CartPole-v1: 2 actor processes x 4 envs", out, re.M)
    compiling = re.search(r"^compiling kernels \(cached after the first run\): \d+\.\d s$", out, re.M)
    assert compiling and compiling.start() < out.index("rl ran "), out
    # (the progress bar on stderr may end without a newline in CliRunner's merged output: no ^ here)
    assert re.search(r"rl ran [\d.]+ s: [\d,]+ episodes, [\d,]+ env steps, [\d,]+ updates; "
                     r"stopped by (time|target_return)$", out, re.M), out
    m = re.search(r"^rl return \(moving average of 100 episodes\): ([\d.]+) at the end, best ([\d.]+|nan); "
                  r"first \d+ episodes ([\d.]+) \(a random policy averages ~22\)$", out, re.M)
    assert m, out
    assert float(m.group(1)) > 0
    m = re.search(r"^rl throughput: ([\d,]+) steps/s inserted, ([\d,]+) windows/s sampled", out, re.M)
    assert m and int(m.group(1).replace(",", "")) > 0 and int(m.group(2).replace(",", "")) > 0, out

"""The contract of ``TorchRLWriter(final_fields=...)`` as a TorchRL user sees it.

A final step (the observation after an episode's last step, every other field zero) exists so that a store
that keeps no ``next_*`` field forms transitions from two consecutive steps (cpprb's ``next_of``). So:
final_fields on a spec that already stores the field's next value is refused (it would add fabricated
transitions); on a spec without it, `replay.torchrl.transitions` of ``sample(B, 2)`` gives exactly the
transitions a ``torchrl.data.ReplayBuffer`` fed the same rollouts holds, each equally likely, never a final
step as a transition of its own. And a refused commit inside ``extend`` says how much of the rollout was
written and that ``close`` / ``end_episodes`` is the retry.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from replay import MinSize, ReplayStore, TrajectorySpec
from replay.torchrl import TorchRLWriter, torchrl_spec, transitions

tensordict = pytest.importorskip("tensordict", reason="needs the torchrl extra: pip install -e '.[torchrl]'")
from tensordict import TensorDict  # noqa: E402

KEYS = (
    "observation",
    "action",
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
    ("next", "truncated"),
    ("next", "observation"),
)


def rollout(first: int, n_env: int, t: int, ends: dict[int, list[int]], traj0: int = 0) -> TensorDict:
    """``[n_env, t]`` steps; observation of (env e, step i) = 1000 e + first + i + 1, its next one the next
    step's (+ 1), or + 0.5 after an end step (a terminal observation no step holds);
    action = the observation's integer part (never 0, so a final step's zero action is told apart);
    reward 1 at an end step; terminated at ends, truncated at none; traj ids count episodes per env."""
    idx = torch.arange(first, first + t, dtype=torch.float32)
    obs = torch.stack([idx + 1 + 1000 * e for e in range(n_env)])[..., None].repeat(1, 1, 3)
    done = torch.zeros(n_env, t, 1, dtype=torch.bool)
    traj = torch.zeros(n_env, t, dtype=torch.int64)
    for e in range(n_env):
        for i in ends.get(e, []):
            done[e, i] = True
        traj[e] = traj0 + 100 * e + torch.cumsum(done[e, :, 0].long(), 0) - done[e, :, 0].long()
    return TensorDict({
        "observation": obs,
        "action": obs[..., 0].long(),
        "next": {
            "observation": obs + 1 - 0.5 * done,
            "reward": done.float(),
            "done": done,
            "terminated": done.clone(),
            "truncated": torch.zeros_like(done),
        },
        "collector": {"traj_ids": traj},
    }, batch_size=[n_env, t])


def rows(td: TensorDict) -> list[tuple]:
    """One hashable tuple per transition of a ``[N]`` TensorDict, over `KEYS`."""
    cols = [td.get(k).reshape(td.shape[0], -1).tolist() for k in KEYS]
    return [tuple(tuple(c[i]) for c in cols) for i in range(td.shape[0])]


def buffer_rows(rollouts: list[TensorDict]) -> list[tuple]:
    """The transitions a TorchRL ReplayBuffer fed the rollouts holds."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyTensorStorage(10_000))
    for r in rollouts:
        rb.extend(r.reshape(-1))
    return rows(rb[:])


SPEC = TrajectorySpec({"observation": ((3,), "float32"), "action": ((), "int64")})


def stored(store: ReplayStore) -> list[tuple[list, list]]:
    return sorted((e.data["observation"][:, 0].tolist(), e.data["action"].tolist()) for e in store.episodes())


def test_final_fields_refused_where_the_spec_stores_the_next_value() -> None:
    r = rollout(0, 1, 6, {0: [2]})[0]
    with ReplayStore(torchrl_spec(r), capacity_steps=64, seed=0) as store:
        assert "next_observation" in store.spec
        for target in (store, store.writer()):
            with pytest.raises(ValueError, match=r"final_fields=\('observation',\).*'next_observation'.*"
                               r"keys=\{'next_observation': None\}"):
                TorchRLWriter(target, final_fields=("observation",))
        assert len(store) == 0
    # under a user mapping too: the field is the one stored at ("next", keys[field])
    r2 = TensorDict({"pixels": r["observation"], "action": r["action"],
                     "next": {"pixels": r["next", "observation"], "done": r["next", "done"]}}, batch_size=[6])
    keys = {"observation": "pixels", "next_observation": ("next", "pixels")}
    with ReplayStore(torchrl_spec(r2, keys), capacity_steps=64, seed=0) as store:
        with pytest.raises(ValueError, match=r"'next_observation' \(TorchRL key \('next', 'pixels'\)\)"):
            TorchRLWriter(store, keys, final_fields=("observation",))
        # without the next field the same writer is accepted and stores T + 1 steps per episode
        kept = {n: (f.shape, f.dtype) for n, f in store.spec.items() if n != "next_observation"}
    spec = TrajectorySpec(kept)
    with ReplayStore(spec, capacity_steps=64, seed=0) as store:
        with TorchRLWriter(store, {"observation": "pixels"}, final_fields=("observation",)) as w:
            w.extend(r2)
        assert stored(store) == [([1, 2, 3, 3.5], [1, 2, 3, 0]), ([4, 5, 6, 7], [4, 5, 6, 0])]


def sampled_transitions(store: ReplayStore, draws: int, pad: str = "tail") -> list[tuple]:
    out: list[tuple] = []
    while len(out) < draws:
        with store.sample(256, 2, pad=pad) as batch:
            out += rows(transitions(batch.to_tensordict(init_key=None)))
    return out


@pytest.mark.parametrize("pad", ["tail", "head"])
def test_transitions_are_exactly_a_torchrl_buffers(pad: str) -> None:
    # two envs; episodes end by done, by a trajectory id changing across rollouts, and at close
    rollouts = [rollout(0, 2, 7, {0: [1, 4], 1: [6]}), rollout(7, 2, 5, {0: [3]}, traj0=10)]
    spec = torchrl_spec(rollouts[0], keys={"next_observation": None})
    assert "next_observation" not in spec
    with ReplayStore(spec, capacity_steps=64, num_shards=2, seed=1) as store:
        with TorchRLWriter(store, final_fields=("observation",)) as w:
            for r in rollouts:
                w.extend(r)
        expected = buffer_rows(rollouts)
        assert len(expected) == 24 and len(set(expected)) == 24
        # every episode is stored with its final step: 24 steps + 7 episodes (env 0: 5, env 1: 2)
        assert len(store) == 24 + w.episodes_written == 31
        got = sampled_transitions(store, 6000, pad)
        assert set(got) == set(expected)  # every transition, and nothing else (no final step, no zeros)
        counts = np.array([got.count(x) for x in expected])
        assert stats.chisquare(counts).pvalue > 1e-4  # each equally likely, as a uniform ReplayBuffer
        # sample(B, 1) draws every stored step, final steps too (zero action): not transitions
        with store.sample(512, 1) as batch:
            drawn = batch.to_tensordict()
        finals = set(drawn["observation"][drawn["action"] == 0][:, 0].tolist())
        assert finals == {2.5, 5.5, 8, 11.5, 13, 1007.5, 1013}


def test_transitions_from_a_collector_equal_torchrl_buffer() -> None:
    pytest.importorskip("gymnasium")
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv, SerialEnv

    env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
    env.set_seed(0)
    collector = Collector(env, None, frames_per_batch=100, total_frames=300)
    store = w = None
    rollouts = []
    try:
        for r in collector:
            rollouts.append(r.clone())
            if store is None:
                store = ReplayStore(torchrl_spec(r, keys={"next_observation": None}), capacity_steps=4096,
                                    num_shards=2, seed=0)
                w = TorchRLWriter(store, final_fields=("observation",))
            w.extend(r)
    finally:
        collector.shutdown()
    w.close()
    try:
        expected = buffer_rows(rollouts)
        assert len(expected) == 300 and len(set(expected)) == 300
        assert len(store) == 300 + w.episodes_written
        assert set(sampled_transitions(store, 12_000)) == set(expected)
    finally:
        store.close()


def test_transitions_checks_its_input() -> None:
    spec = torchrl_spec(rollout(0, 1, 4, {})[0], keys={"next_observation": None})
    with ReplayStore(spec, capacity_steps=64, seed=0) as store:
        with TorchRLWriter(store, final_fields=("observation",)) as w:
            w.extend(rollout(0, 1, 4, {0: [3]}))
        with store.sample(4, 3) as batch:
            with pytest.raises(ValueError, match=r"windows: .*sample\(B, 2\).*\[4, 3\]"):
                transitions(batch.to_tensordict())
        with store.sample(4, 2) as batch:
            td = batch.to_tensordict()
        with pytest.raises(ValueError, match="fields: windows have no 'pixels'"):
            transitions(td, fields=("pixels",))
        td.set(("next", "observation"), td["observation"])
        with pytest.raises(ValueError, match=r"already hold \('next', 'observation'\).*sample\(B, 1\)"):
            transitions(td)


class Gate(MinSize):
    """Admits inserts while fewer than 3 steps are in, or once opened."""

    def __init__(self) -> None:
        super().__init__(1)
        self.open = False

    def can_insert(self, counts, n=1):  # noqa: ANN001, ANN201
        return self.open or int(counts[0]) < 3


def test_refused_extend_says_what_was_written_and_close_retries() -> None:
    gate = Gate()
    with ReplayStore(SPEC, capacity_steps=64, seed=0, rate_limiter=gate) as store:
        w = TorchRLWriter(store, final_fields=("observation",), timeout=0.05)
        # episode A (2 steps + final) commits; B's end is refused
        message = (r"env 0 was refused.*5 steps were written \(5 of env 0\) and 1 episode\(s\) ended.*"
                   r"end_episodes\(\) or close\(\).*not extend\(rollout\) again")
        with pytest.raises(TimeoutError, match=message):
            w.extend(rollout(0, 1, 5, {0: [1, 4]}))
        assert (w.steps_written, w.episodes_written, len(store)) == (5, 1, 3)
        gate.open = True
        w.close()
        assert stored(store) == [([1, 2, 2.5], [1, 2, 0]), ([3, 4, 5, 5.5], [3, 4, 5, 0])]


def test_refused_chunk_commit_inside_extend_keeps_the_steps_before_it() -> None:
    gate = Gate()
    with ReplayStore(SPEC, capacity_steps=64, num_shards=2, seed=0, rate_limiter=gate) as store:
        w = TorchRLWriter(store, final_fields=("observation",), timeout=0.05, chunk_steps=2)
        # env 0: episode A (2 steps + final) commits, then 2 steps stay open; env 1: 2 steps staged, then
        # the full buffer's commit is refused and its last 2 steps are not written
        message = r"env 1 was refused.*6 steps were written \(envs 0\.\.0 whole, 2 of env 1\)"
        with pytest.raises(TimeoutError, match=message):
            w.extend(rollout(0, 2, 4, {0: [1]}))
        assert w.steps_written == 6
        gate.open = True
        w.close()  # ends both open episodes, each with the next value of its last written step
        assert stored(store) == [
            ([1, 2, 2.5], [1, 2, 0]),
            ([3, 4, 5], [3, 4, 0]),
            ([1001, 1002, 1003], [1001, 1002, 0]),
        ]


def test_stacked_frames_after_the_ring_wraps() -> None:
    """README's stacked-frame recipe: ``mask[:, 3]`` says a transition exists; zeros before a stored frame are
    an episode's start or frames the ring overwrote, and a stored ``first`` flag tells them apart."""
    spec = TrajectorySpec({"obs": ((2,), "uint8"), "action": ((), "int64"), "done": ((), "bool"),
                           "first": ((), "bool")})
    lengths = [5, 5, 5, 5]  # 6 stored steps each (with the final step): 24 > 16, the ring keeps 8 .. 23
    expected, complete = set(), set()
    with ReplayStore(spec, capacity_steps=16, num_shards=1, seed=0) as store:
        with store.writer() as w:
            pos = 0
            for e, t in enumerate(lengths):
                f = np.arange(pos + 1, pos + t + 2, dtype=np.uint8)  # T frames + the final one, all distinct
                w.extend({"obs": np.repeat(f[:t, None], 2, 1), "action": np.arange(t) + 1,
                          "done": np.arange(t) == t - 1, "first": np.arange(t) == 0})
                w.end_episode(final={"obs": np.repeat(f[t:], 2)})
                padded = np.concatenate([np.zeros(3, np.uint8), f])
                for i in range(t):
                    x = (tuple(padded[i:i + 4]), i + 1, i == t - 1, tuple(padded[i + 1:i + 5]))
                    expected.add(x)
                    if e >= 2 and (pos + i - 3 >= 8 or pos >= 8):  # every frame of the stack still stored
                        complete.add(x)
                pos += t + 1
        by_mask3, by_first = set(), set()
        for _ in range(200):
            with store.sample(64, 5, pad="head") as batch:
                obs, m = batch["obs"][:, :, 0], batch.mask
                first = batch["first"][:, :4] & m[:, :4]
                a, d = batch["action"][:, 3], batch["done"][:, 3]
                for i in np.flatnonzero(m[:, 3].numpy()):
                    x = (tuple(obs[i, :4].tolist()), int(a[i]), bool(d[i]), tuple(obs[i, 1:].tolist()))
                    by_mask3.add(x)
                    if bool(m[i, 0] | first[i].any()):  # no zero frame, or zeros before an episode's start
                        by_first.add(x)
    assert by_first == complete and len(complete) == 10
    # mask[:, 3] alone also keeps the stacks of episode 1 whose frames 7, 8 the ring overwrote
    assert by_mask3 - expected == {
        ((0, 0, 0, 9), 3, False, (0, 0, 9, 10)),
        ((0, 0, 9, 10), 4, False, (0, 9, 10, 11)),
        ((0, 9, 10, 11), 5, True, (9, 10, 11, 12)),
    }


def test_the_readme_example_runs() -> None:
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "transitions(" in b]
    scope = {"rollout": rollout(0, 2, 8, {0: [2, 7], 1: [7]}), "ReplayStore": ReplayStore,
             "TorchRLWriter": TorchRLWriter, "torchrl_spec": torchrl_spec}
    exec(compile(code, "README.md", "exec"), scope)
    td = scope["td"]
    assert 0 < td.shape[0] <= 32
    assert set(rows(td)) <= set(buffer_rows([scope["rollout"]]))
    scope["store"].close()

"""end_episode(final=...): the stacked-frames recipe samples every transition 0..T-1 of every episode.

The recipe (README, docs/architecture.md#stacked-frames): one frame a step, the observation after the last
step stored by ``end_episode(final={"obs": frame})``, then ``sample(B, 5, pad="head")`` with obs
``[:, :4]``, next obs ``[:, 1:]``, action/reward/done ``[:, 3]`` and ``valid = mask[:, 3]``. The set of
valid transitions is compared with a hand-built list and with cpprb's ``next_of``/``stack_compress``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import Queue, ReplayStore, TrajectorySpec

F = (2, 3)
STACK = 4
SPEC = TrajectorySpec(
    {"obs": (F, "uint8"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "bool")}
)


def episodes(lengths: list[int], seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Episodes with T + 1 frames (the last one: after the last step), distinct nonzero frames,
    actions and rewards, done and a sparse reward on the terminal step."""
    rng = np.random.default_rng(seed)
    out, first = [], 1
    for t in lengths:
        frames = (np.arange(first, first + t + 1) % 255 + 1).astype(np.uint8)  # never 0: zero is padding
        obs = np.broadcast_to(frames[:, None, None], (t + 1, *F)).copy()
        obs[:, 0, 0] = rng.integers(1, 256, t + 1)
        done = np.zeros(t, bool)
        done[-1] = True
        reward = np.zeros(t, np.float32)
        reward[-1] = 1.0 + first
        out.append({"obs": obs, "action": np.arange(first, first + t, dtype=np.int64), "reward": reward,
                    "done": done})
        first += t + 1
    return out


def stacks(obs: np.ndarray) -> np.ndarray:
    """[T + 1, 4, *F]: the stack ending at each frame, zero-padded before the first (the recipe's pad)."""
    padded = np.concatenate([np.zeros((STACK - 1, *F), np.uint8), obs])
    return np.stack([padded[i : i + STACK] for i in range(len(obs))])


def expected(eps: list[dict[str, np.ndarray]]) -> set[tuple]:
    """Every transition t = 0..T-1 of every episode, built by hand."""
    out = set()
    for ep in eps:
        s = stacks(ep["obs"])
        for t in range(len(ep["action"])):
            out.add((s[t].tobytes(), int(ep["action"][t]), float(ep["reward"][t]), s[t + 1].tobytes(),
                     bool(ep["done"][t])))
    return out


def write(store: ReplayStore, eps: list[dict[str, np.ndarray]]) -> None:
    with store.writer(chunk_steps=3) as w:  # episodes longer than a chunk commit in several parts
        for ep in eps:
            t = len(ep["action"])
            w.extend({"obs": ep["obs"][:t], "action": ep["action"], "reward": ep["reward"],
                      "done": ep["done"]})
            w.end_episode(final={"obs": ep["obs"][t]})


def sampled(store: ReplayStore, calls: int, batch: int = 64) -> tuple[set[tuple], int]:
    """The set of valid transitions of ``calls`` recipe samples, and how many windows were valid."""
    out, n = set(), 0
    for _ in range(calls):
        with store.sample(batch, STACK + 1, pad="head") as b:
            obs = np.asarray(b["obs"])
            valid = np.asarray(b.mask[:, 3])
            a, r, d = (np.asarray(b[k][:, 3]) for k in ("action", "reward", "done"))
            for i in np.flatnonzero(valid):
                # the final step's zero action/reward/done never sits at the anchor of a valid window
                assert a[i] != 0 and obs[i, 3].any()
                out.add((obs[i, :STACK].tobytes(), int(a[i]), float(r[i]), obs[i, 1:].tobytes(), bool(d[i])))
                n += 1
    return out, n


def test_recipe_samples_every_transition_including_terminal_and_t1() -> None:
    eps = episodes([1, 1, 2, 3, 4, 5, 9])
    want = expected(eps)
    assert len(want) == 25
    with ReplayStore(SPEC, capacity_steps=256, seed=0) as store:
        write(store, eps)
        assert len(store) == 25 + 7  # T + 1 steps an episode
        got, n = sampled(store, 150)
    assert got == want
    terminal = {x for x in got if x[4]}
    assert len(terminal) == 7 and all(x[2] > 1.0 for x in terminal)  # done with its reward, T=1 too
    assert n > 0


def test_recipe_matches_cpprb_next_of_stack_compress() -> None:
    cpprb = pytest.importorskip("cpprb")
    eps = episodes([1, 2, 3, 5, 8, 13, 1, 4], seed=3)
    env = {"obs": {"shape": (*F, STACK), "dtype": np.uint8}, "act": {"dtype": np.int64}, "rew": {},
           "done": {}}
    rb = cpprb.ReplayBuffer(256, env, next_of="obs", stack_compress="obs")
    for ep in eps:
        s = np.moveaxis(stacks(ep["obs"]), 1, -1)  # cpprb's channel-last stacks
        rb.add(obs=s[:-1], next_obs=s[1:], act=ep["action"], rew=ep["reward"],
               done=ep["done"].astype(np.float32))
        rb.on_episode_end()
    assert rb.get_stored_size() == sum(len(ep["action"]) for ep in eps)
    every = rb.get_all_transitions()
    theirs = {
        (np.moveaxis(o, -1, 0).tobytes(), int(a), float(r), np.moveaxis(n, -1, 0).tobytes(), bool(d))
        for o, a, r, n, d in zip(every["obs"], every["act"].ravel(), every["rew"].ravel(),
                                 every["next_obs"], every["done"].ravel(), strict=True)
    }
    with ReplayStore(SPEC, capacity_steps=256, seed=1) as store:
        write(store, eps)
        ours, _ = sampled(store, 200)
    assert ours == theirs == expected(eps)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=1, max_size=6))
def test_recipe_any_lengths(lengths: list[int]) -> None:
    eps = episodes(lengths)
    with ReplayStore(SPEC, capacity_steps=128, seed=0) as store:
        write(store, eps)
        got, _ = sampled(store, 60, batch=32)
    assert got == expected(eps)


def test_final_fields_given_others_zero() -> None:
    with ReplayStore(SPEC, capacity_steps=64, seed=0) as store:
        with store.writer() as w:
            w.append({"obs": np.full(F, 7, np.uint8), "action": 3, "reward": 1.5, "done": True})
            w.end_episode(final={"obs": np.full(F, 9, np.uint8)})
            assert w.episodes_written == 1 and w.steps_written == 2
        (ep,) = store.episodes()
        assert ep.length == 2
        assert ep.data["obs"][1].tolist() == np.full(F, 9).tolist()
        assert [ep.data[k][1].item() for k in ("action", "reward", "done")] == [0, 0.0, False]


@pytest.mark.parametrize(
    ("final", "exc", "words"),
    [
        ({"pixels": np.zeros(F, np.uint8)}, ValueError, "unknown ['pixels']"),
        ({}, ValueError, "final must give"),
        ({"obs": np.zeros((3, 3), np.uint8)}, ValueError, "expected shape"),
        ({"obs": np.zeros(F, np.float32)}, TypeError, "expected dtype uint8"),
        ([("obs", 1)], TypeError, "must be a mapping"),
    ],
)
def test_bad_final_raises_naming_it_nothing_lost(final: object, exc: type, words: str) -> None:
    with ReplayStore(SPEC, capacity_steps=64, seed=0) as store:
        with store.writer() as w:
            w.append({"obs": np.full(F, 7, np.uint8), "action": 3, "reward": 1.5, "done": True})
            with pytest.raises(exc, match=r"end_episode\(final=\.\.\.\)") as info:
                w.end_episode(final=final)
            assert words in str(info.value)
            assert w.pending == 1  # the episode's step stays staged; nothing stored
            assert len(store) == 0
            w.end_episode(final={"obs": np.full(F, 9, np.uint8)})
        assert len(store) == 2


def test_final_on_empty_episode_raises() -> None:
    with ReplayStore(SPEC, capacity_steps=64, seed=0) as store:
        with store.writer() as w:
            with pytest.raises(ValueError, match="episode with no steps"):
                w.end_episode(final={"obs": np.zeros(F, np.uint8)})
            w.append({"obs": np.full(F, 7, np.uint8), "action": 3, "reward": 1.5, "done": True})
            w.end_episode()
            with pytest.raises(ValueError, match="episode with no steps"):  # the last one is closed
                w.end_episode(final={"obs": np.zeros(F, np.uint8)})
            assert w.episodes_written == 1
        assert len(store) == 1


def test_final_after_flushed_steps() -> None:
    """An episode whose steps were all committed (flush) still takes its final step."""
    with ReplayStore(SPEC, capacity_steps=64, seed=0) as store:
        with store.writer() as w:
            w.append({"obs": np.full(F, 7, np.uint8), "action": 3, "reward": 1.5, "done": True})
            w.flush()
            assert w.pending == 0
            w.end_episode(final={"obs": np.full(F, 9, np.uint8)})
        (ep,) = store.episodes()
        assert ep.length == 2


def test_timeout_leaves_final_unstaged() -> None:
    """A commit the rate limiter refuses keeps the episode's steps staged, not the final step: a retry
    of the same call stores it once."""
    with ReplayStore(SPEC, capacity_steps=64, seed=0, rate_limiter=Queue(2), timeout=0.05) as store:
        with store.writer() as w:
            w.append({"obs": np.full(F, 5, np.uint8), "action": 1, "reward": 0.0, "done": True})
            w.end_episode(final={"obs": np.full(F, 6, np.uint8)})  # 2 steps: the queue is full
            w.append({"obs": np.full(F, 7, np.uint8), "action": 2, "reward": 1.0, "done": True})
            for _ in range(2):
                with pytest.raises(TimeoutError):
                    w.end_episode(final={"obs": np.full(F, 9, np.uint8)})
                assert w.pending == 1 and w.episodes_written == 1
            with store.sample(2, 1):  # the queue's items go: room for the retry
                pass
            w.end_episode(final={"obs": np.full(F, 9, np.uint8)})
            assert w.episodes_written == 2 and w.steps_written == 4
        obs = [ep.data["obs"][:, 0, 0].tolist() for ep in store.episodes()]
        assert [9] in [o[1:] for o in obs] and [7, 9] in obs


def test_final_step_through_an_attached_store() -> None:
    """An actor process's writer (`ReplayStore.attach(handle).writer()`) is the same writer: same rule."""
    eps = episodes([1, 3])
    with ReplayStore(SPEC, capacity_steps=64, seed=0) as store:
        with ReplayStore.attach(store.handle()) as attached, attached.writer() as w:
            for ep in eps:
                t = len(ep["action"])
                w.extend({"obs": ep["obs"][:t], **{k: ep[k] for k in ("action", "reward", "done")}})
                w.end_episode(final={"obs": ep["obs"][t]})
            with pytest.raises(ValueError, match="episode with no steps"):
                w.end_episode(final={"obs": eps[0]["obs"][0]})
        assert len(store) == 6
        got, _ = sampled(store, 40)
    assert got == expected(eps)

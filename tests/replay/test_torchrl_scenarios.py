"""TorchRL 0.14's ``test/rb/test_samplers.py`` SliceSampler scenarios on a trajectory store (issue 30).

Each test names the TorchRL test it replays; the data and checks are theirs, written through
`TorchRLWriter` and read back with `Batch.to_tensordict`. Where the anchor-based window rule differs by
design (a short window from a long episode, ``strict_length`` dropping instead of redrawing), the test
asserts our rule instead (docs/notes/peer-suites.md, "TorchRL's SliceSampler scenarios")."""

from __future__ import annotations

import pytest
import torch

from replay import ReplayStore
from replay.torchrl import TorchRLWriter, torchrl_spec

tensordict = pytest.importorskip("tensordict", reason="needs the torchrl extra: pip install -e '.[torchrl]'")

from tensordict import TensorDict  # noqa: E402


def _last(key, name):
    return (*key[:-1], name) if isinstance(key, tuple) else name


def write(mm, td, keys, capacity=256, seed=0) -> ReplayStore:
    store = ReplayStore(torchrl_spec(td, keys), capacity_steps=capacity, memory=mm, timeout=5.0, seed=seed)
    with TorchRLWriter(store, keys=keys) as w:
        w.extend(td)
    return store


def one_episode_per_window(values, mask) -> bool:
    first = torch.where(mask, torch.arange(mask.shape[1]), mask.shape[1]).amin(1, keepdim=True)
    first_value = values.gather(1, first.clamp(max=mask.shape[1] - 1))  # each window's first real step
    return bool((values[mask] == first_value.expand_as(values)[mask]).all())


@pytest.mark.parametrize("episode_key", ["episode", ("some", "episode")])
@pytest.mark.parametrize("done_key", ["done", ("some", "done")])
@pytest.mark.parametrize("match_episode", [True, False])
def test_slice_sampler(mm, episode_key, done_key, match_episode):
    """TestSamplers.test_slice_sampler: episodes of 30, 25, 15, 30 steps; slices of 5 (20 per batch),
    4 (30 per batch) strict, and 101 (1 per batch) not strict."""
    episode = torch.tensor([1] * 30 + [2] * 25 + [3] * 15 + [4] * 30)
    steps = torch.cat([torch.arange(30), torch.arange(25), torch.arange(15), torch.arange(30)])
    done = torch.zeros(100, 1, dtype=torch.bool)
    done[[29, 54, 69, 99]] = True
    term_key, trunc_key = _last(done_key, "terminated"), _last(done_key, "truncated")
    td = TensorDict({episode_key if match_episode else "whatever_episode": episode,
                     "another_episode": episode, "steps": steps, "count": torch.arange(100),
                     done_key: done, term_key: done}, [100])
    keys = {"another_episode": "another_episode", "steps": "steps", "count": "count",
            "done": done_key, "terminated": term_key}
    if match_episode:
        keys["traj_ids"] = episode_key
    else:  # TorchRL ignores a traj_key the data lacks; we refuse one named explicitly
        with pytest.raises(ValueError, match="keys\\['traj_ids'\\]"):
            write(mm, td, {**keys, "traj_ids": episode_key}).close()
    store = write(mm, td, keys)
    keys["truncated"] = trunc_key  # SliceSampler(truncated_key=...): where the window ends are marked
    try:
        assert len(store.episodes()) == 4
        for num_slices, slice_len, strict in [(20, 5, True), (30, 4, True), (1, 101, False)]:
            seen, trajs, too_short = set(), set(), False
            for _ in range(50):
                with store.sample(num_slices, window=slice_len) as batch:
                    out = batch.to_tensordict(keys=keys, strict_length=strict)
                    mask = out["mask"]
                    ep, st = out["another_episode"], out["steps"]
                    assert one_episode_per_window(ep, mask)  # no slice crosses a trajectory
                    real_next = mask[:, 1:] & mask[:, :-1]
                    assert bool((st[:, 1:][real_next] - 1 == st[:, :-1][real_next]).all())
                    if strict:  # every kept window is full (ours drops short ones: B' <= num_slices)
                        assert bool(mask.all()) and out.batch_size[1] == slice_len
                    too_short |= bool((batch.lengths < slice_len).any())
                    last = torch.where(mask, torch.arange(slice_len), -1).amax(1)
                    rows = torch.arange(out.batch_size[0])
                    trunc, term = out[trunc_key][..., 0], out[term_key][..., 0]
                    assert bool((trunc | term)[rows, last].all()) and bool(out[done_key][rows, last].all())
                    assert torch.equal(term[mask], (st[mask] == torch.tensor([29, 24, 14, 29])[ep[mask] - 1]))
                    seen |= set(out["count"][mask].tolist())
                    trajs |= set(ep[mask].tolist())
            assert trajs == {1, 2, 3, 4}
            assert too_short  # (1, 101): every window is short; (20, 5): tail windows near an end too
            if strict:  # every step is in some full window
                assert seen == set(range(100))
            else:  # a window of 101 runs from its anchor to its episode's end (TorchRL's: the whole episode)
                assert seen < set(range(100))
    finally:
        store.close()


def test_slice_sampler_at_capacity(mm):
    """test_slice_sampler_at_capacity[SliceSampler]: the last trajectory of a full store is drawn (its
    step 9), on a ring that has wrapped (capacity 24, 36 steps written)."""
    traj = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3] * 3) + torch.arange(36) // 12 * 4
    td = TensorDict({"episode": traj, "steps": torch.arange(36) % 12}, [36])
    store = write(mm, td, {"steps": "steps", "traj_ids": "episode"}, capacity=24)
    try:
        found = False
        for _ in range(20):
            with store.sample(2, window=3) as batch:
                out = batch.to_tensordict(keys={"steps": "steps", "traj_ids": "episode"})
                assert one_episode_per_window(out["episode"], out["mask"])
                assert bool((out["episode"][out["mask"]] >= 4).all())  # the oldest 12 steps are gone
                found |= bool((out["steps"][out["mask"]] == 9).any() & (out["episode"] == 11).any())
        assert found
    finally:
        store.close()


@pytest.mark.parametrize("ndim", [1, 2])
def test_slice_sampler_left_right(mm, ndim):
    """test_slice_sampler_left_right(_ndim): 10 episodes of 10 steps (obs 1..10), one env or 4 envs of 30
    steps; each window holds one episode and one truncated marker. span=(N, N) caps the padding at N;
    ours pads up to L - 1 (here 4) at the tail or head."""
    data = TensorDict({"obs": torch.arange(1, 11).repeat(12), "eps": torch.arange(120) // 10 + 1}, [120])
    if ndim == 2:
        data = data.reshape(4, 30)
    keys = {"obs": "obs", "traj_ids": "eps"}
    store = write(mm, data, keys)
    try:
        assert len(store.episodes()) == 12
        for pad in ("tail", "head"):
            with store.sample(10, window=5, pad=pad) as batch:
                out = batch.to_tensordict(keys=keys)
                mask = out["mask"]
                assert bool((out["next", "truncated"][..., 0].sum(-1) == 1).all())
                assert bool(((out["obs"] == 0).sum(-1) <= 4).all())  # padding: zeros, as split_trajectories
                assert one_episode_per_window(out["eps"], mask)
    finally:
        store.close()


def test_slice_sampler_strictlength(mm):
    """test_slice_sampler_strictlength: trajectories of 2 and 10 steps, slices of 4. strict_length keeps
    only windows of the long one (ours: fewer windows, never a redraw); without it the short trajectory's
    windows come back short."""
    data = TensorDict({"traj": torch.cat([torch.ones(2, dtype=torch.int), torch.zeros(10, dtype=torch.int)]),
                       "x": torch.arange(12)}, [12])
    keys = {"x": "x", "traj_ids": "traj"}
    store = write(mm, data, keys)
    try:
        saw_short_traj = False
        for _ in range(50):
            with store.sample(2, window=4) as batch:
                strict = batch.to_tensordict(keys=keys, strict_length=True)
                assert bool((strict["traj"] == 0).all()) and bool(strict["mask"].all())
                loose = batch.to_tensordict(keys=keys, flat=True)
                loose = loose[loose["mask"]]
                ids = loose["traj"]
                saw_short_traj |= bool((ids == 1).any())
                assert int((ids == 1).sum()) <= 2 * 2  # the 2-step trajectory never gives more than 2 steps
        assert saw_short_traj
    finally:
        store.close()


IDS = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])


@pytest.mark.parametrize("case", ["collector_ids", "no_warning_single_key", "episode", "fallback_to_done",
                                  "explicit_traj_key_no_auto"])
def test_slice_sampler_auto_traj_key(mm, case):
    """test_slice_sampler_auto_traj_key_* and _explicit_traj_key_no_auto: ("collector", "traj_ids") wins
    over "episode"; "episode" is read when the collector key is absent; without ids the end flags cut;
    an explicit key wins over the collector's."""
    obs = {"obs": torch.arange(8).float()}
    keys: dict = {"obs": "obs"}
    if case == "collector_ids":
        zeros = torch.zeros(8, dtype=torch.int)
        td = TensorDict({("collector", "traj_ids"): IDS, "episode": zeros, **obs}, [8])
    elif case == "no_warning_single_key":
        td = TensorDict({("collector", "traj_ids"): IDS, **obs}, [8])
    elif case == "episode":
        td = TensorDict({"episode": IDS, **obs}, [8])
    elif case == "fallback_to_done":
        done = torch.zeros(8, 1, dtype=torch.bool)
        done[[2, 5, 7]] = True
        td = TensorDict({("next", "done"): done, ("next", "truncated"): done, ("next", "terminated"): done,
                         **obs}, [8])
    else:
        zeros = torch.zeros(8, dtype=torch.int)
        td = TensorDict({"my_traj": IDS, ("collector", "traj_ids"): zeros, **obs}, [8])
        keys["traj_ids"] = "my_traj"
    store = write(mm, td, keys)
    try:
        assert sorted(e.length for e in store.episodes()) == [2, 3, 3]
        with store.sample(8, window=3) as batch:
            out = batch.to_tensordict(keys=keys)
            episode_of = IDS[out["obs"].long()]
            assert one_episode_per_window(episode_of, out["mask"])
    finally:
        store.close()


def test_end_keys_union_and_fallback(mm):
    """TestFindStartStopTraj.test_end_keys_union / _all_missing_falls_back: an episode marked only by
    ("next", "truncated") is cut (our default end keys are done, terminated and truncated); with no end
    flag the trajectory ids cut."""
    truncated = torch.zeros(10, 1, dtype=torch.bool)
    truncated[[4, 9]] = True
    td = TensorDict({"obs": torch.arange(10), ("next", "done"): torch.zeros(10, 1, dtype=torch.bool),
                     ("next", "truncated"): truncated}, [10])
    store = write(mm, td, {"obs": "obs"})
    try:
        assert [e.length for e in store.episodes()] == [5, 5]
        for _ in range(20):
            with store.sample(4, window=2) as batch:
                obs = batch.to_tensordict(keys={"obs": "obs"})["obs"]
                full = batch.lengths == 2
                assert bool((obs[full, 1] == obs[full, 0] + 1).all()) and bool((obs[full, 0] != 4).all())
    finally:
        store.close()
    ids = TensorDict({"obs": torch.arange(10), "episode": torch.tensor([0] * 5 + [1] * 5)}, [10])
    store = write(mm, ids, {"obs": "obs"})
    try:
        assert [e.length for e in store.episodes()] == [5, 5]
    finally:
        store.close()


def test_short_trajectories_mask_and_markers(mm):
    """test_slice_sampler_mask_* / _truncated_marks_last_real_step / _pad_output_marks_slice_starts /
    _marks_slice_starts_no_pad, on trajectories of 3, 8, 2, 7, 1, 5 steps with is_init stored: the flat
    mask is bool [B * T], a True prefix (tail padding), padded values finite, truncated exactly at the last
    real step, is_init at each window's first step and right after each truncated in the ragged form."""
    lengths = [3, 8, 2, 7, 1, 5]
    traj = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    is_init = torch.cat([torch.arange(n) == 0 for n in lengths])[:, None]
    td = TensorDict({"traj": traj, "obs": torch.cat([torch.arange(n) for n in lengths]).float(),
                     "is_init": is_init}, [len(traj)])
    keys = {"obs": "obs", "is_init": "is_init", "traj_ids": "traj"}
    store = write(mm, td, keys)
    b, t = 6, 8
    try:
        for _ in range(20):
            with store.sample(b, window=t) as batch:
                flat = batch.to_tensordict(keys=keys, flat=True)
                mask = flat["collector", "mask"]
                assert mask.shape == (b * t,) and mask.dtype == torch.bool
                m = mask.reshape(b, t)
                n = m.sum(-1)
                assert bool((n >= 1).all()) and torch.equal(m, torch.arange(t) < n[:, None])
                assert bool(torch.isfinite(flat["obs"]).all())
                trunc = flat["next", "truncated"].reshape(b, t)
                assert torch.equal(trunc, torch.arange(t) == (n - 1)[:, None])
                assert bool(flat["is_init"].reshape(b, t)[:, 0].all())
                ragged = flat[mask]
                ends = ragged["next", "truncated"][:, 0].nonzero().reshape(-1)
                assert bool(ragged["is_init"][0, 0]) and bool(ragged["is_init"][ends[:-1] + 1, 0].all())
    finally:
        store.close()

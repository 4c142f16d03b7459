"""Batch.to_tensordict against TorchRL's SliceSampler (issue 30): ``is_init`` at each window's first real
step (a recurrent module gives the same outputs on the flat form as on ``[B, L]``), ``strict_length``
dropping padded windows, and ``("collector", "mask")`` only when some window is padded.

Hand-made batches pin exact values; stored episodes check the same rules on sampled windows, and a
TorchRL ``SliceSampler`` on the same episodes checks that its batches obey them too."""

from __future__ import annotations

import pytest
import torch

from replay import ReplayStore, TrajectorySpec
from replay.batch import Batch

tensordict = pytest.importorskip("tensordict", reason="needs the torchrl extra: pip install -e '.[torchrl]'")


def hand_batch(masks: list[list[int]], stored_init: list[list[int]] | None = None) -> Batch:
    """A batch of len(masks) windows of len(masks[0]) steps: obs = 10 * window + step (0 when padded)."""
    mask = torch.tensor(masks, dtype=torch.bool)
    b, length = mask.shape
    obs = (10 * torch.arange(b)[:, None] + torch.arange(length)).float() * mask
    fields = {"observation": obs[..., None], "reward": torch.ones(b, length, 1) * mask[..., None]}
    if stored_init is not None:
        fields["is_init"] = torch.tensor(stored_init, dtype=torch.bool)[..., None]
    return Batch(
        fields,
        mask,
        torch.arange(100, 100 + b),  # keys
        torch.full((b,), 0.5, dtype=torch.float64),
        torch.linspace(0.5, 1.0, b),  # weights
        mask.sum(1),  # lengths
        table_size=50,
    )


# window 0 full, window 1 tail-padded (2 real steps), window 2 head-padded (3 real steps, dst = 1)
MASKS = [[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 1, 1]]


def test_is_init_marks_each_windows_first_real_step_exactly():
    batch = hand_batch(MASKS)
    td = batch.to_tensordict()
    want = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.bool)
    assert td["is_init"].shape == (3, 4, 1) and td["is_init"].dtype == torch.bool  # InitTracker's shape
    assert torch.equal(td["is_init"][..., 0], want)
    ends = torch.tensor([[0, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(td["next", "truncated"][..., 0], ends)  # unchanged: slice ends
    flat = batch.to_tensordict(flat=True)
    assert flat["is_init"][:, 0].tolist() == [True, False, False, False, True, False, False, False,
                                              False, True, False, False]
    assert int(flat["is_init"].sum()) == 3  # one start per window: windows never cross an episode start


def test_is_init_is_ored_with_a_stored_field_and_init_key_moves_or_drops_it():
    stored = [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]]  # window 2 starts its episode (InitTracker's flag)
    batch = hand_batch(MASKS, stored_init=stored)
    td = batch.to_tensordict()
    assert torch.equal(td["is_init"][..., 0], torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]]).bool())
    assert not batch["is_init"][0, 0]  # the stored field is not written
    untouched = batch.to_tensordict(init_key=None)  # SliceSampler(init_key=None): the stored flags as is
    assert torch.equal(untouched["is_init"], batch["is_init"])
    plain = hand_batch(MASKS)
    assert "is_init" not in plain.to_tensordict(init_key=None).keys()
    moved = plain.to_tensordict(init_key=("collector", "is_init"))
    assert "is_init" not in moved.keys()
    assert torch.equal(moved["collector", "is_init"], plain.to_tensordict()["is_init"])
    with pytest.raises(TypeError, match="init_key"):
        plain.to_tensordict(init_key=3)
    with pytest.raises(ValueError, match="init_key"):
        plain.to_tensordict(init_key=("next", "done"))


def test_strict_length_drops_padded_windows_with_exact_counts():
    batch = hand_batch(MASKS)
    td = batch.to_tensordict(strict_length=True)
    assert tuple(td.batch_size) == (1, 4) and td.names == [None, "time"]
    assert td["keys"][:, 0].tolist() == [100]  # the full window's key, for update_priorities
    assert torch.equal(td["observation"][0, :, 0], torch.tensor([0.0, 1.0, 2.0, 3.0]))
    assert td["mask"].all() and ("collector", "mask") not in td.keys(include_nested=True)
    assert td["is_init"][0, :, 0].tolist() == [True, False, False, False]
    assert td["next", "truncated"][0, :, 0].tolist() == [False, False, False, True]
    assert td["priority_weight"][0].tolist() == [0.5] * 4
    flat = batch.to_tensordict(strict_length=True, flat=True)
    assert tuple(flat.batch_size) == (4,)
    # two full windows of five: windows 0 and 3 kept, in order
    five = hand_batch([[1] * 5, [1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1] * 5, [1, 0, 0, 0, 0]])
    kept = five.to_tensordict(strict_length=True, flat=True)
    assert tuple(kept.batch_size) == (10,)
    assert kept["keys"].tolist() == [100] * 5 + [103] * 5
    assert kept["is_init"][:, 0].nonzero().reshape(-1).tolist() == [0, 5]
    # every window padded: an empty batch, [0, L] or [0]
    short = hand_batch([[1, 1, 0], [0, 1, 1]])
    assert tuple(short.to_tensordict(strict_length=True).batch_size) == (0, 3)
    assert tuple(short.to_tensordict(strict_length=True, flat=True).batch_size) == (0,)
    # strict_length=False (the default) keeps them all, padded
    assert tuple(short.to_tensordict().batch_size) == (2, 3)


def test_strict_length_on_full_windows_keeps_the_views():
    batch = hand_batch([[1, 1, 1], [1, 1, 1]])
    td = batch.to_tensordict(strict_length=True)
    assert tuple(td.batch_size) == (2, 3)
    assert td["observation"].data_ptr() == batch["observation"].data_ptr()


def test_collector_mask_only_when_some_window_is_padded():
    padded = hand_batch(MASKS).to_tensordict()
    assert torch.equal(padded["collector", "mask"], torch.tensor(MASKS).bool())
    assert torch.equal(padded["mask"], padded["collector", "mask"])
    flat = hand_batch(MASKS).to_tensordict(flat=True)
    assert flat["collector", "mask"].shape == (12,)  # SliceSampler(pad_output=True)'s [B * T] mask
    full = hand_batch([[1, 1, 1, 1], [1, 1, 1, 1]]).to_tensordict()
    assert ("collector", "mask") not in full.keys(include_nested=True)
    assert full["mask"].all()  # graphrl's own "mask" is always there
    assert ("collector", "mask") not in hand_batch([[1, 1, 1, 1]]).to_tensordict(flat=True).keys(True)


def test_a_torchrl_loss_is_the_same_without_an_all_true_mask():
    """TorchRL's losses drop steps where ("collector", "mask") is False; absent, they keep every step."""
    pytest.importorskip("torchrl")
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    mask = torch.ones(3, 4, dtype=torch.bool)
    fields = {
        "observation": torch.randn(3, 4, 2, generator=gen),
        "next_observation": torch.randn(3, 4, 2, generator=gen),
        "action": torch.nn.functional.one_hot(torch.randint(2, (3, 4), generator=gen), 2),
        "reward": torch.randn(3, 4, 1, generator=gen),
    }
    batch = Batch(fields, mask, torch.arange(3), torch.ones(3, dtype=torch.float64), torch.ones(3),
                  mask.sum(1), table_size=3)
    actor = QValueActor(MLP(in_features=2, out_features=2, num_cells=[8]), in_keys=["observation"],
                        action_space="one-hot")
    loss_fn = DQNLoss(actor, action_space="one-hot")
    td = batch.to_tensordict()
    assert ("collector", "mask") not in td.keys(True)
    masked = td.clone()
    masked["collector", "mask"] = td["mask"]
    torch.testing.assert_close(loss_fn(td.clone())["loss"], loss_fn(masked)["loss"])


def store_with_episodes(mm, lengths: list[int], seed: int = 0) -> ReplayStore:
    spec = TrajectorySpec({"observation": ((3,), "float32"), "reward": ((1,), "float32")})
    store = ReplayStore(spec, capacity_steps=1024, memory=mm, timeout=5.0, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with store.writer() as w:
        for n in lengths:
            w.extend({"observation": torch.randn(n, 3, generator=gen),
                      "reward": torch.randn(n, 1, generator=gen)})
            w.end_episode()
    return store


@pytest.mark.parametrize("pad", ["tail", "head"])
def test_sampled_windows_follow_the_rules(mm, pad):
    store = store_with_episodes(mm, [2, 9, 5, 12, 3])
    try:
        with store.sample(64, window=6, pad=pad) as batch:
            full = batch.lengths == 6
            assert 0 < int(full.sum()) < 64  # both kinds drawn
            td = batch.to_tensordict()
            steps = torch.arange(6)
            first = torch.where(batch.mask, steps, 6).amin(1)
            want = steps[None, :] == first[:, None]
            assert torch.equal(td["is_init"][..., 0], want)
            assert ("collector", "mask") in td.keys(True)
            strict = batch.to_tensordict(strict_length=True)
            assert strict.batch_size[0] == int(full.sum())
            assert torch.equal(strict["keys"][:, 0], batch.keys[full])
            assert torch.equal(strict["observation"], batch["observation"][full])
            assert strict["is_init"][:, 0].all() and int(strict["is_init"].sum()) == strict.batch_size[0]
            assert ("collector", "mask") not in strict.keys(True)
            # the ragged form TorchRL gives with strict_length=False, pad_output=False
            ragged = batch.to_tensordict(flat=True)
            ragged = ragged[ragged["mask"]]
            assert ragged.numel() == int(batch.lengths.sum()) and int(ragged["is_init"].sum()) == 64
            assert int(ragged["next", "truncated"].sum()) == 64
    finally:
        store.close()


@pytest.mark.parametrize("pad", ["tail", "head"])
def test_a_gru_on_the_flat_form_equals_one_per_window(mm, pad):
    """GRUModule in recurrent mode restarts at is_init: its outputs on [B * L] equal those on [B, L] and
    those of a GRU run on each window's real steps alone, from a zero state."""
    pytest.importorskip("torchrl")
    from torchrl.modules import GRUModule, set_recurrent_mode

    torch.manual_seed(0)
    gru = GRUModule(input_size=3, hidden_size=5, in_keys=["observation", "rs"],
                    out_keys=["feat", ("next", "rs")])
    store = store_with_episodes(mm, [2, 9, 5, 12, 3, 7], seed=1)
    try:
        with store.sample(24, window=5, pad=pad) as batch, torch.no_grad():
            mask = batch.mask
            want = torch.zeros(24, 5, 5)
            for b in range(24):  # torch.nn.GRU per window, real steps only
                out, _ = gru.gru(batch["observation"][b][mask[b]][None])
                want[b][mask[b]] = out[0]
            with set_recurrent_mode(True):
                flat = gru(batch.to_tensordict(flat=True))
                shaped = gru(batch.to_tensordict())
            torch.testing.assert_close(flat["feat"].reshape(24, 5, 5)[mask], want[mask])
            torch.testing.assert_close(shaped["feat"][mask], want[mask])
            # the same flat sequence without the markers runs one long sequence: not the same
            td = batch.to_tensordict(flat=True, init_key=None)
            td["is_init"] = torch.zeros(120, 1, dtype=torch.bool)
            with set_recurrent_mode(True):
                wrong = gru(td)["feat"].reshape(24, 5, 5)
            assert not torch.allclose(wrong[mask], want[mask])
            # a GRU cell stepped over the flat form, its state zeroed where is_init is set
            td = batch.to_tensordict(flat=True)
            h = torch.zeros(1, 5)
            cell = torch.nn.GRUCell(3, 5)
            cell.load_state_dict({k[:-3]: v for k, v in gru.gru.state_dict().items()})
            outs = []
            for x, init in zip(td["observation"], td["is_init"][:, 0], strict=True):
                h = cell(x[None], torch.zeros_like(h) if init else h)
                outs.append(h[0])
            torch.testing.assert_close(torch.stack(outs).reshape(24, 5, 5)[mask], want[mask])
    finally:
        store.close()


def test_torchrl_slice_sampler_obeys_the_same_rules():
    """TorchRL's own SliceSampler on episodes of 2, 9, 5 and 12 steps with is_init stored (InitTracker):
    is_init at each slice's first step, ("collector", "mask") only with pad_output and short episodes,
    strict_length=True never returns a short slice."""
    pytest.importorskip("torchrl")
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import SliceSampler

    lengths = [2, 9, 5, 12]
    episode = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    is_init = torch.cat([torch.arange(n) == 0 for n in lengths])[:, None]
    data = TensorDict({"episode": episode, "is_init": is_init, "obs": torch.arange(len(episode)).float()},
                      batch_size=[len(episode)])

    def sample(**kw):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), batch_size=24,
                                    sampler=SliceSampler(slice_len=6, traj_key="episode", **kw))
        rb.extend(data)
        torch.manual_seed(0)
        return rb.sample()

    padded = sample(strict_length=False, pad_output=True)
    assert padded.batch_size == (24,)
    mask = padded["collector", "mask"].reshape(4, 6)
    starts = padded["is_init"][:, 0].reshape(4, 6)
    first = torch.where(mask, torch.arange(6), 6).amin(1)
    assert torch.equal(starts, torch.arange(6)[None] == first[:, None])  # tail padding: first = 0
    strict = sample(strict_length=True)
    assert ("collector", "mask") not in strict.keys(True)
    assert strict["is_init"][:, 0].reshape(4, 6)[:, 0].all()
    ep = strict["episode"].reshape(4, 6)
    assert bool((ep == ep[:, :1]).all()) and set(ep[:, 0].tolist()) <= {1, 3}  # episodes of >= 6 steps

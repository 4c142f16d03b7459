"""Messages a DQN user's review found misleading: a damaged LATEST beside one checkpoint called that same
checkpoint "the older" one; a codec field's chunk that does not divide each shard's share of
``capacity_steps`` was reported as a "capacity=33" the caller never passed."""

from __future__ import annotations

import numpy as np
import pytest

from replay import CheckpointError, FieldSpec, ReplayStore, TrajectorySpec

SPEC = TrajectorySpec({"obs": ((3,), "float32"), "done": ((), "bool")})


def codec_spec(chunk: int) -> TrajectorySpec:
    obs = FieldSpec("obs", (4, 4), "uint8", codec="lz4", chunk=chunk)
    return TrajectorySpec({"obs": obs, "a": ((), "int64")})


@pytest.mark.parametrize("latest", ["garbage", ""])
def test_a_damaged_latest_beside_its_only_checkpoint_does_not_call_it_older(tmp_path, latest):
    with ReplayStore(SPEC, capacity_steps=16, seed=0) as store:
        with store.writer() as w:
            w.add_episode({"obs": np.ones((4, 3), np.float32), "done": np.arange(4) == 3})
        folder = store.checkpoint(tmp_path)
    (tmp_path / "LATEST").write_text(latest)
    with pytest.raises(CheckpointError) as info:
        ReplayStore.restore(tmp_path)
    msg = str(info.value)
    assert "older" not in msg, msg
    assert f"checkpoint {folder} (the newest that verifies) is intact" in msg, msg
    assert info.value.intact == folder
    with ReplayStore.restore(info.value.intact) as back:
        assert len(back) == 4


def test_a_damaged_latest_with_no_checkpoint_that_verifies_says_none_is_intact(tmp_path):
    with ReplayStore(SPEC, capacity_steps=16, seed=0) as store:
        folder = store.checkpoint(tmp_path)
    (tmp_path / "LATEST").write_text("garbage")
    (tmp_path / folder.rsplit("/", 1)[1] / "INTEGRITY.json").write_text("{}")
    with pytest.raises(CheckpointError, match=f"; no intact checkpoint under {tmp_path}$") as info:
        ReplayStore.restore(tmp_path)
    assert info.value.intact is None


def test_a_chunk_that_does_not_divide_each_shards_share_names_capacity_steps_and_values_that_work():
    with pytest.raises(ValueError) as info:
        ReplayStore(codec_spec(4), capacity_steps=100, num_shards=3)
    msg = str(info.value)
    assert "capacity_steps // num_shards = 100 // 3 = 33" in msg, msg
    assert "a multiple of 12" in msg and "at least 24" in msg and "e.g. 96 or 108" in msg, msg
    for good in (96, 108, 24):
        with ReplayStore(codec_spec(4), capacity_steps=good, num_shards=3) as store:
            assert store.capacity_steps == good and store.shard_capacity == good // 3
    with pytest.raises(ValueError, match=r"= 20 // 3 = 6, .*at least 24, e\.g\. 24$"):
        ReplayStore(codec_spec(4), capacity_steps=20, num_shards=3)


def test_two_codec_fields_get_values_that_work_for_both():
    spec = TrajectorySpec({
        "a": FieldSpec("a", (4,), "uint8", codec="lz4", chunk=4),
        "b": FieldSpec("b", (4,), "uint8", codec="zstd", chunk=6),
    })
    with pytest.raises(ValueError, match=r"field 'b': chunk=6 .* multiple of 24 \(num_shards \* 12") as info:
        ReplayStore(spec, capacity_steps=40, num_shards=2)
    near = str(info.value).rsplit("e.g. ", 1)[1]
    for good in near.split(" or "):
        with ReplayStore(spec, capacity_steps=int(good), num_shards=2) as store:
            assert store.capacity_steps == int(good)


def test_without_a_codec_the_remainder_of_capacity_steps_is_dropped_as_documented():
    with ReplayStore(SPEC, capacity_steps=100, num_shards=3) as store:
        assert (store.shard_capacity, store.capacity_steps) == (33, 99)
    assert "a remainder is dropped" in ReplayStore.__doc__ and "holds 99" in ReplayStore.__doc__

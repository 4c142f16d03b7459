"""Keys narrower than 64 bits are refused by every ``update_priorities``: a key packs the anchor's
position above bit 28 (`replay.keys.encode_keys`), so an int32 cast of step 16's key reads as step 0's
(the break-it repro: a priority of 1000 for step 16 went to step 0). Nothing changes on a refusal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from replay import Prioritized, ReplayStore, TrajectorySpec
from replay._checks import check_keys
from replay.keys import encode_keys


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32])
def test_check_keys_refuses_narrow_integers_naming_keys_and_the_dtype(dtype):
    with pytest.raises(TypeError, match=rf"^keys must be 64-bit integers \(batch.keys, int64\), got "
                       rf"{np.dtype(dtype).name}: .*nothing was changed"):
        check_keys(np.array([0, 1], dtype))
    with pytest.raises(TypeError, match=rf"got {np.dtype(dtype).name}"):
        check_keys(torch.from_numpy(np.array([3], dtype)))


def test_check_keys_takes_64_bit_keys_and_python_ints():
    k = encode_keys([1, 0], [16, 40], [0, 2])
    assert check_keys(k).tolist() == k.tolist()
    assert check_keys(torch.from_numpy(k)).tolist() == k.tolist()
    assert check_keys(k.tolist()).tolist() == k.tolist()
    assert check_keys(k.astype(np.uint64)).tolist() == k.tolist()


@pytest.mark.parametrize("as_numpy", [False, True])
def test_an_int32_cast_of_a_batch_key_changes_no_priority(as_numpy):
    store = ReplayStore(TrajectorySpec({"g": ((), "int64")}), capacity_steps=64, seed=0,
                        selector=Prioritized(1.0))
    try:
        with store.writer() as w:
            w.add_episode({"g": np.arange(40)})
        batch = store.sample(64)
        (hit,) = (batch["g"][:, 0] == 16).nonzero(as_tuple=True)
        while not hit.numel():
            batch = store.sample(64)
            (hit,) = (batch["g"][:, 0] == 16).nonzero(as_tuple=True)
        key = batch.keys[hit[:1]]
        assert int(key.to(torch.int32)) != int(key)  # the cast names another window
        before = store.stats()["priority_mass"]
        bad = key.numpy().astype(np.int32) if as_numpy else key.to(torch.int32)
        with pytest.raises(TypeError, match="keys must be 64-bit integers .* got int32"):
            store.update_priorities(bad, np.array([1000.0]))
        assert store.stats()["priority_mass"] == before
        assert store.update_priorities(key, np.array([1000.0])) == 1  # the int64 key applies, to step 16
        counts = np.bincount(store.sample(512)["g"][:, 0].numpy(), minlength=40)
        assert counts.argmax() == 16 and counts[16] > 400  # 1000 of 1039 mass: P(<= 400 of 512) ~ 1e-60
    finally:
        store.close()

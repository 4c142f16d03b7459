"""Replay's error messages say what the user did: the timeout they gave, the key they passed, the
keyword restore cannot change, and one type for "no GPU"."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrl import GPUUnavailableError
from replay import MinSize, ReplayStore, TrajectorySpec
from replay._checks import check_device

SPEC = TrajectorySpec({"x": ((2,), "float32")})


def filled(mm, n=4, **kw):
    store = ReplayStore(SPEC, 64, memory=mm, **kw)
    with store.writer() as w:
        w.extend({"x": np.zeros((n, 2), np.float32)})
    return store


def test_a_sample_timeout_quotes_the_users_timeout_not_the_time_left(mm):
    store = ReplayStore(SPEC, 64, memory=mm, rate_limiter=MinSize(10))
    try:
        with pytest.raises(TimeoutError, match=r"\(timeout=0\.5\): ") as err:
            store.sample(1, timeout=0.5)
        assert "timeout=0.49" not in str(err.value)  # the measured wait itself may read 0.49x s
        with pytest.raises(TimeoutError, match=r"\(timeout=0\.05\): "):
            store.draw_windows(1, timeout=0.05)
    finally:
        store.close()


def test_held_staging_slots_time_out_quoting_the_users_timeout(mm):
    store = filled(mm, staging_slots=1)
    try:
        held = store.sample(2, window=2)
        with pytest.raises(TimeoutError, match=r"held \(all of this batch shape; timeout=0\.2\)") as err:
            store.sample(2, window=2, timeout=0.2)
        assert "release batches" in str(err.value) and "0.19" not in str(err.value)
        held.release()
        store.sample(2, window=2, timeout=0.2).release()  # a released slot serves the next batch
    finally:
        store.close()


def test_a_writer_timeout_quotes_its_timeout(mm):
    from replay import Queue

    store = ReplayStore(SPEC, 64, memory=mm, rate_limiter=Queue(4))
    try:
        w = store.writer(timeout=0.2)
        w.extend({"x": np.zeros((4, 2), np.float32)})
        w.end_episode()
        w.extend({"x": np.zeros((1, 2), np.float32)})
        with pytest.raises(TimeoutError, match=r"\(timeout=0\.2\): "):
            w.end_episode()
        w.close()
    finally:
        store.close()


@pytest.mark.parametrize("key", [-8, -1, np.iinfo(np.int64).min])
def test_a_negative_key_is_named_as_negative_not_as_a_shard(mm, key):
    store = filled(mm)
    try:
        with pytest.raises(ValueError, match=rf"^key {key} is negative: keys are the >= 0 int64") as err:
            store.update_priorities(np.array([0, key]), [1.0, 1.0])
        assert "shard" not in str(err.value)
    finally:
        store.close()
    pytest.importorskip("ray", reason="replay.distributed needs ray: pip install 'graphrl[ray]'")
    from replay.distributed.routing import split_keys

    with pytest.raises(ValueError, match=rf"^key {key} is negative"):
        split_keys(np.array([key], np.int64), 4)


def test_a_uint64_key_is_quoted_as_given(mm):
    store = filled(mm)
    try:
        with pytest.raises(ValueError, match=r"^key 18446744073709551615 is above 2\*\*63 - 1"):
            store.update_priorities(np.array([2**64 - 1], np.uint64), [1.0])
        with pytest.raises(ValueError, match=r"key 9223372036854775808 is above"):
            store.update_priorities(torch.tensor([0]).numpy().astype(np.uint64) + np.uint64(2**63), [1.0])
        assert store.update_priorities(np.array([], np.uint64), []) == 0
        with pytest.raises(TypeError, match="keys must be integers"):
            store.update_priorities(np.array([0.5]), [1.0])
    finally:
        store.close()


def test_a_key_naming_a_missing_shard_still_names_it(mm):
    store = filled(mm)
    try:
        with pytest.raises(ValueError, match=r"names shard 7, but the store has shards 0\.\.0"):
            store.update_priorities(np.array([7]), [1.0])
    finally:
        store.close()


# (rate_limiter: restore takes the user's limiter, checked against the checkpoint's: test_limiter_everywhere)
@pytest.mark.parametrize("keyword", ["spec", "capacity_steps", "num_shards", "selector"])
def test_restore_refuses_what_the_checkpoint_fixes(mm, tmp_path, keyword):
    store = filled(mm)
    root = store.checkpoint(tmp_path / "ck")
    store.close()
    with pytest.raises(ValueError, match=rf"^ReplayStore\.restore\(path, {keyword}=\.\.\.\): {keyword} comes "
                       r"from the checkpoint and cannot be changed; restore may change tier, timeout"):
        ReplayStore.restore(root, memory=mm, **{keyword: None})
    back = ReplayStore.restore(root, memory=mm, timeout=1.0, seed=3)  # what it may change still works
    assert len(back) == 4
    back.close()


def test_the_ray_restore_refuses_them_the_same_way(tmp_path):
    pytest.importorskip("ray", reason="replay.distributed needs ray: pip install 'graphrl[ray]'")
    from replay.distributed import checkpoint as manifests

    with pytest.raises(ValueError, match=r"^RayReplayStore\.restore\(path, spec=\.\.\.\): spec comes from "
                       r"the checkpoint"):
        manifests.restore_arguments(tmp_path, {}, {"spec": SPEC})


def test_no_gpu_is_one_type_that_old_handlers_still_catch(monkeypatch):
    import numba

    monkeypatch.setattr(numba.config, "ENABLE_CUDASIM", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(GPUUnavailableError, match=r"device='cuda' but CUDA is not available.*device='cpu'"):
        check_device("cuda")
    with pytest.raises(ValueError):
        check_device("cuda:0")
    with pytest.raises(RuntimeError):
        check_device("cuda:0")
    assert check_device("cpu") is None and check_device(None) is None
    with pytest.raises(ValueError, match="device must be None"):
        check_device("nonsense")


def test_per_call_timeouts_and_restore_keywords_are_checked(mm, tmp_path):
    store = filled(mm)
    try:
        for bad, err in ((-0.1, ValueError), (float("nan"), ValueError), (True, TypeError), ("1", TypeError)):
            with pytest.raises(err, match="timeout must be"):
                store.sample(2, timeout=bad)
        store.checkpoint(tmp_path / "ck")
    finally:
        store.close()
    with pytest.raises(TypeError, match=r"bogus=...\): unknown keyword; restore may change tier"):
        ReplayStore.restore(tmp_path / "ck", memory=mm, bogus=1)

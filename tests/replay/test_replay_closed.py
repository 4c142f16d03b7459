"""Use after close in replay: every closable object raises a ValueError naming itself and the call,
and what was committed before close stays in the checkpoint taken before it."""

from __future__ import annotations

import numpy as np
import pytest

from replay import ReplayStore, TrajectorySpec

SPEC = TrajectorySpec({"x": ((2,), "float32")})


def step(i: float) -> dict[str, np.ndarray]:
    return {"x": np.full(2, i, np.float32)}


def test_a_writer_refuses_appends_after_its_store_closed_and_the_committed_episode_survives(mm, tmp_path):
    store = ReplayStore(SPEC, 64, memory=mm, timeout=5.0)
    w = store.writer()
    for i in range(3):
        w.append(step(i))
    w.end_episode()  # committed
    root = store.checkpoint(tmp_path / "ck")
    w.append(step(9))  # staged only
    store.close()
    assert w.closed and store.closed
    for call, args in (("append", (step(1),)), ("extend", ({"x": np.zeros((2, 2), np.float32)},)),
                       ("end_episode", ()), ("flush", ()), ("begin_continuation", ())):
        with pytest.raises(ValueError, match=rf"^TrajectoryWriter\.{call}\(\): the replay store this writer "
                           r"writes to is closed.*1 staged steps were not committed"):
            getattr(w, call)(*args)
    w.close()  # no commit into the freed rings, no error
    w.close()
    with pytest.raises(ValueError, match=r"^TrajectoryWriter\.append\(\): this TrajectoryWriter is closed"):
        w.append(step(1))
    back = ReplayStore.restore(root, memory=mm)
    try:
        (ep,) = back.episodes()  # the committed episode, not the staged step
        np.testing.assert_array_equal(ep.data["x"][:, 0], np.arange(3, dtype=np.float32))
    finally:
        back.close()


def test_a_with_block_writer_whose_store_closed_raises_only_if_it_holds_steps(mm):
    store = ReplayStore(SPEC, 64, memory=mm, timeout=5.0)
    with store.writer() as w:
        w.append(step(0))
        w.end_episode()
        store.close()  # nothing staged: the block ends quietly
    assert store.closed and w.closed
    store = ReplayStore(SPEC, 64, memory=mm, timeout=5.0)
    with pytest.raises(ValueError, match=r"TrajectoryWriter\.end_episode\(\).*1 staged steps"):
        with store.writer() as w:
            w.append(step(0))
            store.close()


@pytest.mark.parametrize(
    "call, args",
    [
        ("writer", ()),
        ("sample", (1,)),
        ("update_priorities", ([0], [1.0])),
        ("checkpoint", ("unused",)),
        ("episodes", ()),
        ("handle", ()),
        ("counters", ()),
        ("stats", ()),
        ("rings", ()),
    ],
)
def test_a_closed_store_names_the_call(mm, call, args):
    store = ReplayStore(SPEC, 64, memory=mm)
    store.close()
    store.close()  # idempotent
    name = "selector_mass" if call == "stats" else call
    with pytest.raises(ValueError, match=rf"^ReplayStore\.{name}\(\): this ReplayStore is closed"):
        getattr(store, call)(*args)
    with pytest.raises(ValueError, match=r"^len\(store\): this ReplayStore is closed"):
        len(store)


def test_an_attached_store_after_its_own_close_and_after_the_owners(mm):
    store = ReplayStore(SPEC, 64, memory=mm, timeout=5.0)
    attached = ReplayStore.attach(store.handle())
    w = attached.writer()
    w.append(step(0))
    w.end_episode()
    assert len(attached) == 1
    store.close()  # the owner closes: the attached view sees it through the control block
    assert attached.closed
    with pytest.raises(ValueError, match=r"^AttachedStore\.writer\(\): the store's owner closed"):
        attached.writer()
    with pytest.raises(ValueError, match=r"^TrajectoryWriter\.append\(\): the replay store .* is closed"):
        w.append(step(1))
    w.close()
    attached.close()
    for call in ("writer", "episodes", "handle", "counters", "sample", "checkpoint"):
        with pytest.raises(ValueError, match=rf"^AttachedStore\.{call}\(\): this AttachedStore .* is closed"):
            getattr(attached, call)()


def test_a_torchrl_writer_refuses_rollouts_after_its_store_closed(mm):
    tensordict = pytest.importorskip("tensordict")
    import torch

    from replay.torchrl import TorchRLWriter

    store = ReplayStore(SPEC, 64, memory=mm, timeout=5.0)
    rollout = tensordict.TensorDict({"x": torch.zeros(3, 2)}, batch_size=[3])
    tw = TorchRLWriter(store, keys={"x": "x"})
    tw.extend(rollout)
    tw.flush()
    store.close()
    for call, args in (("extend", (rollout,)), ("flush", ()), ("end_episodes", ())):
        with pytest.raises(ValueError, match=rf"^TorchRLWriter\.{call}\(\): the replay store .* is closed"):
            getattr(tw, call)(*args)
    tw.close()  # quiet: nothing can be committed any more
    with pytest.raises(ValueError, match=r"^TorchRLWriter\.extend\(\): this TorchRLWriter is closed"):
        tw.extend(rollout)


def fake_ray_handle():
    from replay.distributed import RayStoreHandle

    return RayStoreHandle((("x", (2,), "float32"),), (object(), object()), 50, 10, 1.0)


def test_ray_objects_name_the_call_after_close_without_a_cluster():
    pytest.importorskip("ray")
    from replay.distributed import RayAttachedStore
    from replay.distributed.writer import open_writer

    store = RayAttachedStore(fake_ray_handle())
    store.close()
    for call in ("writer", "episodes", "handle", "sample", "checkpoint"):
        with pytest.raises(ValueError, match=rf"^RayAttachedStore\.{call}\(\): this RayAttachedStore .*"):
            getattr(store, call)()
    closed = [False]
    w = open_writer(fake_ray_handle(), shard=0, store_closed=lambda: closed[0])  # pinned: no round trip
    w.append(step(0))  # staged while the store is open
    closed[0] = True  # the owner closes its RayReplayStore
    for call, args in (("append", (step(1),)), ("end_episode", ()), ("flush", ())):
        with pytest.raises(ValueError, match=rf"^RayTrajectoryWriter\.{call}\(\): the RayReplayStore this "
                           r"writer writes to is closed.*1 staged steps were not shipped"):
            getattr(w, call)(*args)
    w.close()
    with pytest.raises(ValueError, match=r"^RayTrajectoryWriter\.append\(\): this RayTrajectoryWriter is"):
        w.append(step(1))

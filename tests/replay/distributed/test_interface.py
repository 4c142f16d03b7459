"""The one interface, without a cluster: both stores' signatures of the shared methods, the errors of a bad
backend and of a Ray store without ``ray.init``, and the write-only
views (`replay.attach.AttachedStore`, `replay.distributed.attach.RayAttachedStore`)."""

from __future__ import annotations

import inspect

import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import AttachedStore, ReplayStore, ReplayStoreBase, TrajectorySpec  # noqa: E402
from replay.distributed import RayAttachedStore, RayReplayStore, RayStoreHandle  # noqa: E402
from replay.interface import DEFAULT  # noqa: E402

SHARED = ["sample", "update_priorities", "writer", "checkpoint", "restore", "stats", "close", "__len__"]
# what one store adds (keyword-only, listed in replay.interface's docstring)
EXTRA = {RayReplayStore: {"writer": ["shard", "max_inflight"]}}


def params(cls: type, name: str) -> list[tuple[str, object, object]]:
    sig = inspect.signature(getattr(cls, name))
    return [(p.name, p.kind, p.default) for p in sig.parameters.values() if p.name not in ("self", "cls")]


@pytest.mark.parametrize("name", SHARED)
def test_both_stores_take_the_interfaces_parameters(name):
    base = params(ReplayStoreBase, name)
    for cls in (ReplayStore, RayReplayStore):
        assert issubclass(cls, ReplayStoreBase)
        got = params(cls, name)
        extra = EXTRA.get(cls, {}).get(name, [])
        mine = [p for p in got if p[0] not in extra]
        assert mine == base, (cls.__name__, name)
        for p in got:  # what a store adds comes after the shared ones and is keyword-only
            if p[0] in extra:
                assert p[1] is inspect.Parameter.KEYWORD_ONLY, (cls.__name__, name, p)
    assert params(ReplayStore, name) == [
        p for p in params(RayReplayStore, name) if p[0] not in EXTRA[RayReplayStore].get(name, [])
    ]


def test_timeouts_default_to_the_one_sentinel():
    for cls in (ReplayStore, RayReplayStore, AttachedStore, RayAttachedStore):
        assert inspect.signature(cls.writer).parameters["timeout"].default is DEFAULT
    for cls in (ReplayStore, RayReplayStore):
        assert inspect.signature(cls.sample).parameters["timeout"].default is DEFAULT
    assert repr(DEFAULT) == "DEFAULT"


def test_bad_backend_and_no_cluster():
    # this file runs before the folder's first test that starts the shared cluster (conftest.py)
    spec = TrajectorySpec({"obs": ((2,), "float32")})
    with pytest.raises(ValueError, match="backend"):
        ReplayStore(spec, 100, backend="rey")
    with pytest.raises(ValueError, match=r"replay\.distributed\.RayReplayStore"):
        ReplayStore(spec, 100, backend="ray")
    if not ray.is_initialized():
        with pytest.raises(ValueError, match=r"ray\.init"):
            RayReplayStore(spec, 100)


def fake_handle() -> RayStoreHandle:
    return RayStoreHandle((("obs", (2,), "float32"),), (object(), object()), 50, 10, 1.0)


OWNER_ONLY = ["sample", "update_priorities", "checkpoint", "stats", "counters", "shard_sizes"]


@pytest.mark.parametrize("call", OWNER_ONLY)
def test_a_ray_copy_attached_by_handle_only_writes_and_counts(call):
    store = RayReplayStore.attach(fake_handle())
    assert type(store) is RayAttachedStore and not isinstance(store, ReplayStoreBase)
    assert not hasattr(store, "_owner")
    with pytest.raises(ValueError, match=rf"^{call}\(\) runs in the process that made the store; this copy "
                       r"was attached by handle and can only write \(store\.writer\(\)\) and count"):
        getattr(store, call)()
    store.close()
    with pytest.raises(ValueError, match="closed"):
        getattr(store, call)()


def test_a_ray_attached_copy_keeps_its_handle_and_settings():
    handle = fake_handle()
    with RayAttachedStore(handle) as store:
        assert store.handle() is handle
        sizes = (store.num_shards, store.shard_capacity, store.capacity_steps, store.chunk_steps)
        assert sizes == (2, 50, 100, 10)
        assert list(store.spec) == ["obs"] and len(store.actors) == 2
        assert repr(store).startswith("RayReplayStore(attached, shards=2")
        reduced = store.__reduce__()
        assert reduced[0] is RayAttachedStore and reduced[1] == (handle,)
    with pytest.raises(ValueError, match="closed"):
        store.writer()
    with pytest.raises(TypeError, match="RayStoreHandle"):
        RayReplayStore.attach("not a handle")

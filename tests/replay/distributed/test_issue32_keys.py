"""Issue 32 on the Ray store: keys carry the issuing store's id; another store's keys are refused by name
(by the owner and by a learner), a store's own and its learners' keys apply, and a restored store accepts
the keys drawn before its checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import Prioritized, TrajectorySpec  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402
from replay.keys import stamp_keys  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray cluster and stores (tens of seconds on 2 cores)

SPEC = TrajectorySpec({"id": ((), "int64"), "obs": ((2,), "float32")})


def fill(store) -> None:
    with store.writer() as w:
        for e in range(6):
            ids = np.arange(e * 10, e * 10 + 10, dtype=np.int64)
            w.extend({"id": ids, "obs": np.repeat(ids[:, None], 2, axis=1).astype(np.float32)})
            w.end_episode()


def test_ray_store_refuses_another_stores_keys(cluster, tmp_path):
    a = RayReplayStore(SPEC, 400, num_shards=2, selector=Prioritized(1.0), seed=4)
    d = RayReplayStore(SPEC, 400, num_shards=2, selector=Prioritized(1.0), seed=4)
    restored = None
    try:
        fill(a)
        fill(d)
        assert a.store_id != d.store_id
        mass = a.stats()["priority_mass"]
        keys = d.sample(8, timeout=60).keys
        with pytest.raises(ValueError) as err:
            a.update_priorities(keys, np.full(8, 50.0))
        msg = str(err.value)
        assert "keys" in msg and "8 of 8" in msg and f"{d.store_id:#018x}" in msg
        assert a.stats()["priority_mass"] == mass
        learner = a.learner()
        with pytest.raises(ValueError, match="8 of 8"):
            learner.update_priorities(keys, np.full(8, 50.0))
        mine = learner.sample(8, timeout=60).keys
        assert a.update_priorities(mine, np.full(8, 2.0)) == 8  # a learner's keys are the owner's
        with pytest.raises(ValueError, match="8 of 8"):
            d.update_priorities(mine, np.full(8, 2.0))
        assert d.update_priorities(keys, np.full(8, 2.0)) == 8
        before = a.sample(8, timeout=60).keys
        a.checkpoint(tmp_path / "ckpt")
        restored = RayReplayStore.restore(tmp_path / "ckpt")
        assert restored.store_id != a.store_id
        assert restored.update_priorities(before, np.full(8, 3.0)) == 8  # drawn before the checkpoint
    finally:
        for s in (a, d, restored):
            if s is not None:
                s.close()


def test_ray_store_and_its_learners_ignore_keys_of_an_ancestor_16_restores_back(cluster):
    """The issuer rule of the local store (`replay.keys.issuer_applies`): the client and its learners
    apply it before routing, where the keys' issuer is still known (the shards see plain keys)."""
    lineage = list(range(100, 120))  # as restored: 100 is 20 restores back, 104 16, 105 15
    a = RayReplayStore(SPEC, 400, num_shards=2, selector=Prioritized(1.0), seed=4,
                       _restore={"lineage": lineage})
    try:
        fill(a)
        mass = a.stats()["priority_mass"]
        keys = a.sample(8, timeout=60).keys
        plain = keys.as_subclass(torch.Tensor)
        learner = a.learner()
        for owner in (a, learner):
            assert owner.update_priorities(stamp_keys(plain.clone(), 104), np.full(8, 50.0)) == 0
            with pytest.raises(ValueError, match="priorit"):  # the arguments are still checked
                owner.update_priorities(stamp_keys(plain.clone(), 100), np.full(3, 50.0))
            with pytest.raises(ValueError, match="8 of 8"):
                owner.update_priorities(stamp_keys(plain.clone(), 99), np.full(8, 50.0))
        assert a.stats()["priority_mass"] == mass
        assert learner.update_priorities(stamp_keys(plain.clone(), 105), np.full(8, 2.0)) == 8  # fresh
        learner.close()
    finally:
        a.close()

"""Keys bear their store's id through what a learner does with them (replay.keys.ReplayKeys, issue 32).

Slices, indexing, copies, ``torch.cat`` and ``.numpy()`` of ``batch.keys`` keep the issuer, so another
store refuses them by name; keys joined from two stores are refused naming both; an ancestor 16 or
more restores back issues only stale keys (`replay.keys.issuer_windows`), for the owner and its learners
alike (`replay.keys.issuer_applies`).
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from replay import Prioritized, ReplayStore, TrajectorySpec
from replay.keys import (
    ISSUER,
    MIXED,
    IssuedKeys,
    ReplayKeys,
    encode_keys,
    issuer_applies,
    issuer_windows,
    stamp_keys,
)

SPEC = TrajectorySpec({"pos": ((), "int64")})


def filled(mm) -> ReplayStore:
    store = ReplayStore(SPEC, capacity_steps=256, memory=mm, selector=Prioritized(1.0), seed=3, timeout=5.0)
    with store.writer() as w:
        for e in range(4):
            w.add_episode({"pos": np.arange(e * 10, e * 10 + 10)})
    return store


OPS = {
    "slice": lambda k: k[2:6],
    "int index": lambda k: k[3],
    "tensor index": lambda k: k[torch.tensor([5, 0, 5])],
    "mask": lambda k: k[torch.arange(8) % 2 == 0],
    "clone": lambda k: k.clone(),
    "detach": lambda k: k.detach(),
    "to": lambda k: k.to("cpu", copy=True),
    "cpu": lambda k: k.cpu(),
    "cat": lambda k: torch.cat([k[:3], k[5:]]),
    "stack": lambda k: torch.stack([k, k]),
    "reshape": lambda k: k.reshape(2, 4),
    "split": lambda k: k.split(3)[1],
    "deepcopy": copy.deepcopy,
    "pickle": lambda k: pickle.loads(pickle.dumps(k)),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_each_op_keeps_the_issuer_and_the_values(op):
    plain = torch.arange(100, 108)
    keys = stamp_keys(plain.clone(), 0xABC)
    out = OPS[op](keys)
    assert type(out) is ReplayKeys and getattr(out, ISSUER) == 0xABC
    assert torch.equal(out.as_subclass(torch.Tensor), OPS[op](plain))


def test_numpy_views_and_copies_keep_the_issuer_and_other_results_are_plain():
    keys = stamp_keys(torch.arange(10, 18), 7)
    arr = keys.numpy()
    assert type(arr) is IssuedKeys and getattr(arr, ISSUER) == 7
    arr[0] = 99  # a view, as Tensor.numpy()
    assert int(keys[0]) == 99
    for out in (arr[2:5], arr[[1, 4]], arr.copy(), arr.reshape(2, 4), arr[::2]):
        assert getattr(out, ISSUER) == 7
    assert type(keys == 3) is torch.Tensor and type(keys.float()) is torch.Tensor
    assert getattr(arr > 3, ISSUER) is None
    assert type(np.asarray(keys)) is np.ndarray  # what decode_keys and the checks read
    buf = torch.zeros(8, dtype=torch.int64)
    buf.add_(keys)
    torch.add(keys, 1, out=buf)
    assert type(buf) is torch.Tensor and not hasattr(buf, ISSUER)  # a caller's tensor is never re-classed


def test_a_cat_of_two_issuers_bears_both_and_ignores_plain_keys():
    a, b = stamp_keys(torch.arange(3), 5), stamp_keys(torch.arange(2), 9)
    assert getattr(torch.cat([a, torch.arange(4)]), ISSUER) == 5
    mixed = torch.cat([b, a])
    assert getattr(mixed, ISSUER) == (MIXED, 5, 9)
    assert getattr(torch.cat([mixed[:1], a]), ISSUER) == (MIXED, 5, 9)  # a slice of it stays refused


def test_store_refuses_slices_numpy_and_mixed_keys_of_another_store_and_applies_its_own(mm):
    a, d = filled(mm), filled(mm)
    try:
        mass = a.stats()["priority_mass"]
        theirs = d.sample(8).keys
        for keys in (theirs[:4], theirs[[0, 2]], theirs.clone(), theirs.numpy()[1:3], theirs.numpy().copy()):
            foreign = f"issued by another replay store \\(store {d.store_id:#018x}"
            with pytest.raises(ValueError, match=foreign):
                a.update_priorities(keys, np.full(len(keys), 50.0))
        ours = a.sample(8).keys
        with pytest.raises(ValueError, match="join the keys of 2 replay stores") as err:
            a.update_priorities(torch.cat([ours[:2], theirs[:2]]), np.full(4, 50.0))
        assert f"{a.store_id:#018x}" in str(err.value) and f"{d.store_id:#018x}" in str(err.value)
        assert a.stats()["priority_mass"] == mass
        # this store's own keys, as tensors (the compiled update, by address) and arrays, apply
        assert a.update_priorities(ours[:4], torch.full((4,), 2.0)) == 4
        assert a.update_priorities(ours.numpy()[4:], np.full(4, 3.0)) == 4
        assert a.update_priorities(ours[1:].clone(), np.full(7, 4.0)) == 7
        plain = np.asarray(ours)  # no issuer: taken as this store's own, as documented
        assert a.update_priorities(plain, np.full(8, 5.0)) == 8
        assert a.update_priorities(encode_keys([0], [0], [0]), np.ones(1)) == 1
        assert a.stats()["priority_mass"] != mass
    finally:
        a.close()
        d.close()


def test_sampled_keys_pickle_with_their_issuer_and_apply_back(mm):
    a = filled(mm)
    try:
        keys = a.sample(6).keys
        back = pickle.loads(pickle.dumps(keys))
        assert type(back) is ReplayKeys and getattr(back, ISSUER) == a.store_id
        assert torch.equal(back.as_subclass(torch.Tensor), keys.as_subclass(torch.Tensor))
        assert a.update_priorities(back, np.full(6, 7.0)) == 6
    finally:
        a.close()


def test_issuer_windows_make_ancestors_16_or_more_restores_back_stale():
    lineage = tuple(range(100, 120))  # 20 ancestors, oldest first: 100 is 20 restores back, 119 one
    fresh, stale = issuer_windows(1, lineage)
    assert stale == frozenset(range(100, 105))  # 20 .. 16 restores back
    assert fresh == frozenset((1, *range(105, 120)))  # 15 .. 1 restores back, and the store itself
    assert issuer_windows(1, lineage[:15]) == (frozenset((1, *lineage[:15])), frozenset())


def test_issuer_applies_tells_fresh_stale_plain_and_refuses_foreign_and_mixed_keys():
    fresh, stale = issuer_windows(1, tuple(range(100, 120)))
    keys = encode_keys([0, 0], [5, 6], [0, 0])

    def of(issuer):
        return stamp_keys(torch.from_numpy(keys.copy()), issuer)
    assert issuer_applies(keys, fresh, stale, 1)  # no issuer: the store's own
    assert issuer_applies(of(1), fresh, stale, 1) and issuer_applies(of(105), fresh, stale, 1)
    assert not issuer_applies(of(104), fresh, stale, 1)  # 16 restores back
    assert not issuer_applies(of(100).numpy(), fresh, stale, 1)
    with pytest.raises(ValueError, match="2 of 2 keys were issued by another replay store"):
        issuer_applies(of(999), fresh, stale, 1)
    with pytest.raises(ValueError, match="join the keys of 2 replay stores"):
        issuer_applies(torch.cat([of(1), of(100)]), fresh, stale, 1)


def test_keys_16_restores_back_are_stale_for_the_owner_and_its_learners(mm, tmp_path):
    """After 16 restores the incarnation bits of the first store's keys read as current: their issuer
    alone tells them stale, and a `store.learner()` applies the same rule as the owner (it applied them)."""
    store = ReplayStore(SPEC, capacity_steps=64, memory=mm, selector=Prioritized(1.0), seed=3, timeout=5.0)
    with store.writer() as w:
        w.add_episode({"pos": np.arange(20)})
    old = store.sample(8).keys
    for i in range(16):
        store.checkpoint(tmp_path / f"c{i}")
        restored = ReplayStore.restore(tmp_path / f"c{i}", memory=mm)
        if i == 14:
            recent = restored.sample(8).keys  # 1 restore back at the end: fresh
        store.close()
        store = restored
    try:
        learner = store.learner()
        mass = store.stats()["priority_mass"]
        assert store.stats()["incarnation"] % 16 == 0  # the first store's incarnation again
        assert store.update_priorities(old, np.full(8, 9.0)) == 0
        assert learner.update_priorities(old, np.full(8, 9.0)) == 0
        assert learner.update_priorities(old[:2].numpy(), np.full(2, 9.0)) == 0
        assert store.stats()["priority_mass"] == mass
        with pytest.raises(ValueError, match="priorit"):  # the arguments are still checked
            learner.update_priorities(old, np.full(3, 9.0))
        for owner in (store, learner):  # the owner's priority limit included
            with pytest.raises(ValueError, match="priorit"):
                owner.update_priorities(old, np.full(8, 1e308))
        assert learner.update_priorities(recent, np.full(8, 9.0)) > 0
        learner.close()
    finally:
        store.close()


def test_torchrl_tensordict_keys_update_priorities(mm):
    pytest.importorskip("tensordict", reason="needs the torchrl extra")
    a, d = filled(mm), filled(mm)
    try:
        td = a.sample(4, 2).to_tensordict(layout="torchrl")  # [B, L]: each window's key at each step
        n = td["keys"].numel()
        assert getattr(td["keys"], ISSUER) == a.store_id
        assert a.update_priorities(td["keys"], torch.full((n,), 3.0)) == n
        assert a.update_priorities(td[1:3]["keys"], torch.full((n // 2,), 4.0)) == n // 2
        other = d.sample(4, 2).to_tensordict(layout="torchrl")
        with pytest.raises(ValueError, match="issued by another replay store"):
            a.update_priorities(other[:2]["keys"], torch.ones(n // 2))
    finally:
        a.close()
        d.close()

"""The Ray store follows the local store's rules from their one home, not from copies of them.

Ray-sampled windows, wrapped ones included, are the local store's CPU ring gather of the same windows
byte for byte (`replay.windows`: padding zeroed over stale bytes, masks); a rate limiter subclass with
an insert rule of its own admits and refuses the Ray store's writers exactly as the local store's (its
``can_insert``, through `replay.rate_limiter.RateLimiter.insert_headroom`), learners included; the Ray
client's staging slots are handed out by the local store's rule (`replay.batch_staging.BatchStaging`:
the free slot released last first).
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import MinSize, ReplayStore, TrajectorySpec  # noqa: E402
from replay.distributed import RayReplayStore  # noqa: E402
from replay.keys import decode_keys  # noqa: E402
from replay.windows import gather_fields  # noqa: E402

# a learner's handle carries the store's rate limiter (a class of this file) to wherever it samples
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPEC = TrajectorySpec({"id": ((), "int64"), "img": ((4, 300), "uint8"), "r": ((), "float32")})


def steps(first: int, n: int) -> dict[str, np.ndarray]:
    """n steps whose every field is a function of the step's id (first, first+1, ...)."""
    ids = np.arange(first, first + n, dtype=np.int64)
    img = (ids[:, None, None] * 7 + np.arange(1200).reshape(4, 300)) % 251
    return {"id": ids, "img": img.astype(np.uint8), "r": (ids * 0.5).astype(np.float32)}


def write(store, lengths) -> None:
    """The same episodes, in order, into ``store`` (one writer: one shard's positions are the local ones)."""
    with store.writer(chunk_steps=16) as w:
        first = 0
        for n in lengths:
            w.extend(steps(first, n))
            w.end_episode()
            if isinstance(store, RayReplayStore):
                w.wait()  # stored before the next ships: a threaded shard actor may run two in any order
            first += n


def local_windows(local: ReplayStore, keys: np.ndarray, n: np.ndarray, length: int, pad: str) -> dict:
    """The local store's ring gather (`replay.windows.gather_fields`) of the windows ``keys`` name, into
    outputs full of stale bytes (0xAB)."""
    _, anchor, back = decode_keys(keys)
    first = anchor - back
    rings = local.rings(0)
    capacity = len(rings["id"])
    dst = np.zeros_like(n) if pad == "tail" else length - n
    outs = {name: np.full((len(keys), length, *f.shape), 0xAB, f.dtype) for name, f in SPEC.items()}
    mask = np.ones((len(keys), length), bool)
    gather_fields(
        tuple(rings[name].reshape(-1).view(np.uint8) for name in SPEC),
        tuple(outs[name].reshape(-1).view(np.uint8) for name in SPEC),
        np.array([f.row_bytes for f in SPEC.values()], np.int64),
        capacity,
        first % capacity,
        n,
        dst,
        np.arange(len(keys), dtype=np.int64),
        length,
        mask.reshape(-1),
    )
    outs["mask"] = mask
    return outs


@pytest.fixture(scope="module")
def twins(cluster):
    """A Ray store of one shard of 100 steps and a local store, 163 steps written to each: the ring has
    wrapped (an episode straddles its end) and the oldest live episode lost its head; both hold the same
    steps at the same positions. Three staging slots each."""
    lengths = (13, 40, 7, 25, 31, 18, 29)
    with RayReplayStore(SPEC, 100, num_shards=1, seed=11, staging_slots=3) as store, ReplayStore(
        SPEC, 100, num_shards=1, tier="host", staging_slots=3
    ) as local:
        write(store, lengths)
        write(local, lengths)
        yield store, local


def test_ray_windows_that_wrap_the_ring_are_the_local_gather_of_the_same_keys(twins):
    store, local = twins
    wrapped = padded = 0
    for pad, b_size in (("tail", 64), ("head", 64), ("tail", 480), ("head", 8)):  # 480: streamed
        with store.sample(b_size, window=16, pad=pad) as b:
            keys, n = b.keys.numpy(), b.lengths.numpy()
            want = local_windows(local, keys, n, 16, pad)
            for name in SPEC:
                assert b[name].numpy().tobytes() == want[name].tobytes(), (name, pad)
            assert np.array_equal(b.mask.numpy(), want["mask"])
            _, anchor, back = decode_keys(keys)
            wrapped += int(((anchor - back) % 100 + n > 100).sum())
            padded += int((n < 16).sum())
    assert wrapped > 0 and padded > 0


class InsertsAheadOfSamples(MinSize):
    """Inserts at most 30 steps ahead of samples: a ``can_insert`` of its own (MinSize's admits all)."""

    def can_insert(self, counts, n=1):
        return int(counts[0]) + n <= 30 + int(counts[1])


def episode_admitted(store, first: int, n: int, timeout: float) -> bool:
    """Whether the rate limiter admits one episode of ``n`` steps within ``timeout`` (one writer each).

    Nothing else runs meanwhile, so the limiter's answer cannot change while the insert waits: an episode
    it admits is stored at once, whatever the timeout, and one it refuses stays refused. A test expecting a
    refusal can therefore wait briefly (a wrong admission is stored at once all the same, and the store's
    counters show it), and one expecting an admission can wait long (a slow machine does not refuse it)."""
    w = store.writer(timeout=timeout)
    w.extend(steps(first, n))
    try:
        w.end_episode()
        w.close()  # the Ray writer's shipment: refused by its shard's allowance within the timeout
        return True
    except TimeoutError as exc:
        assert "inserting is ahead of sampling" in str(exc) or "rate limiter" in str(exc), exc
        with contextlib.suppress(TimeoutError):
            w.close()
        return False


def test_a_rate_limiter_subclass_admits_the_ray_stores_inserts_as_the_local_stores(cluster):
    # 7-step episodes: 0, 7, .. 28 inserted steps admit one more (28 + 1 <= 30), 35 does not; 8 sampled
    # steps admit one more (35 + 1 <= 38), 42 does not; 8 more sampled (a Ray learner's) admit one more
    limiter = InsertsAheadOfSamples(1)
    want = [True] * 5 + [False, "sample", True, False, "sample", True, False]
    got = {}
    with RayReplayStore(SPEC, 1000, num_shards=1, rate_limiter=limiter, seed=2) as store, ReplayStore(
        SPEC, 1000, num_shards=1, rate_limiter=limiter, tier="host"
    ) as local:
        learner = store.learner()
        for name, st in (("ray", store), ("local", local)):
            seen, first, samples = [], 0, 0
            for step in want:
                if step == "sample":
                    # the second sample: the Ray store's learner (its own client, the handle's limiter)
                    sampler = learner if name == "ray" and samples else st
                    with sampler.sample(8, window=1, timeout=10) as b:
                        assert int(b.lengths.sum()) == 8
                    samples += 8
                    seen.append("sample")
                    continue
                ok = episode_admitted(st, first, 7, timeout=30.0 if step else 0.2)
                first += 7 * ok
                seen.append(ok)
            got[name] = (seen, st.counters())
        learner.close()
    assert got["ray"] == got["local"]
    assert got["local"] == (want, {"inserts": 49, "samples": 16, "deletes": 0})


def slots_of(store) -> list[int]:
    """The staging slot (numbered by first use) of each batch of one script of holds and releases."""
    numbers: dict[int, int] = {}
    order, held = [], {}
    for step in ("a", "b", "-a", "-b", "c", "d", "e", "-d", "f", "-c", "-e", "-f", "g", "h"):
        if step[0] == "-":
            held.pop(step[1:]).release()
            continue
        b = store.sample(16, window=4, timeout=10)
        order.append(numbers.setdefault(b.mask.data_ptr(), len(numbers)))
        held[step] = b
    for b in held.values():
        b.release()
    return order


def test_the_ray_clients_staging_slots_are_handed_out_as_the_local_stores(twins):
    store, local = twins
    order = slots_of(local)
    assert order[2] == order[1] and order[3] == order[0]  # the free slot released last comes first
    assert slots_of(store) == order

"""Integer bounds at replay's public boundary: per argument, the edge value is accepted and the first
bad value refused naming the argument; bools are refused with TypeError."""

from __future__ import annotations

import numpy as np
import pytest

from graphrl.memory import MemoryManager
from replay import MinSize, Queue, ReplayStore, SampleToInsertRatio, TrajectorySpec
from replay._checks import (
    MAX_BATCH,
    MAX_INT64,
    MAX_SHARD_CAPACITY,
    SEED_LIMIT,
    check_chunk_steps,
    check_sample_args,
    check_store_args,
)
from replay.keys import MAX_SHARDS, MAX_WINDOW

SPEC = TrajectorySpec({"x": ((), "float32")})


def store_args(**kw):
    args = {"spec": SPEC, "capacity_steps": 1024, "num_shards": 1, "selector": None, "rate_limiter": None}
    args.update(kw)
    return check_store_args(
        args.pop("spec"), args.pop("capacity_steps"), args.pop("num_shards"), args.pop("selector"),
        args.pop("rate_limiter"), **args,
    )


def test_batch_size():
    assert check_sample_args(MAX_BATCH, 1, "tail") == (MAX_BATCH, 1)
    assert check_sample_args(np.int64(1), 1, "tail") == (1, 1)
    for bad in (0, MAX_BATCH + 1, -1):
        with pytest.raises(ValueError, match=rf"^batch_size must be in \[1, {MAX_BATCH}\], got {bad}$"):
            check_sample_args(bad, 1, "tail")
    for bad in (True, 2.0, "4"):
        with pytest.raises(TypeError, match="^batch_size must be an int"):
            check_sample_args(bad, 1, "tail")


def test_window():
    assert check_sample_args(1, MAX_WINDOW, "head") == (1, MAX_WINDOW)
    for bad in (0, MAX_WINDOW + 1):
        with pytest.raises(ValueError, match=rf"^window must be in \[1, {MAX_WINDOW}\], got {bad}$"):
            check_sample_args(1, bad, "tail")
    with pytest.raises(TypeError, match="^window must be an int"):
        check_sample_args(1, True, "tail")


def test_capacity_steps():
    assert store_args(capacity_steps=MAX_SHARD_CAPACITY).shard_capacity == MAX_SHARD_CAPACITY
    with pytest.raises(ValueError, match=rf"^capacity_steps={MAX_SHARD_CAPACITY + 1} over num_shards=1 gives "
                       rf"shards of {MAX_SHARD_CAPACITY + 1} steps, more than {MAX_SHARD_CAPACITY}"):
        store_args(capacity_steps=MAX_SHARD_CAPACITY + 1)
    big = MAX_INT64 + 1
    with pytest.raises(ValueError, match=rf"^capacity_steps must be in \[1, {MAX_INT64}\], got {big}"):
        store_args(capacity_steps=MAX_INT64 + 1, num_shards=MAX_SHARDS)
    with pytest.raises(ValueError, match=r"^capacity_steps must be in \[1, "):
        store_args(capacity_steps=0)
    with pytest.raises(TypeError, match="^capacity_steps must be an int"):
        store_args(capacity_steps=True)


def test_num_shards():
    assert store_args(num_shards=MAX_SHARDS).num_shards == MAX_SHARDS
    bad = MAX_SHARDS + 1
    with pytest.raises(ValueError, match=rf"^num_shards must be in \[1, {MAX_SHARDS}\], got {bad}$"):
        store_args(num_shards=bad)
    with pytest.raises(TypeError, match="^num_shards must be an int"):
        store_args(num_shards=True)


def test_chunk_steps():
    assert check_chunk_steps(SPEC, 100, MAX_INT64) == 100  # capped at the shard capacity
    assert store_args(chunk_steps=1).chunk_steps == 1
    for bad in (0, MAX_INT64 + 1):
        with pytest.raises(ValueError, match=rf"^chunk_steps must be in \[1, {MAX_INT64}\], got {bad}"):
            store_args(chunk_steps=bad)
    with pytest.raises(TypeError, match="^chunk_steps must be an int"):
        store_args(chunk_steps=True)


def test_seed():
    assert store_args(seed=SEED_LIMIT - 1).seed == SEED_LIMIT - 1
    assert store_args(seed=np.uint64(SEED_LIMIT - 1)).seed == SEED_LIMIT - 1
    assert store_args(seed=0).seed == 0
    with pytest.raises(ValueError, match=rf"^seed must be in \[0, {SEED_LIMIT - 1}\], got {SEED_LIMIT}$"):
        store_args(seed=SEED_LIMIT)
    with pytest.raises(ValueError, match=r"^seed must be in \[0, 18446744073709551615\], got -1$"):
        store_args(seed=-1)
    with pytest.raises(TypeError, match="^seed must be an int"):
        store_args(seed=True)


def test_the_largest_seed_makes_a_working_store():
    mm = MemoryManager()
    try:
        store = ReplayStore(SPEC, 16, memory=mm, seed=SEED_LIMIT - 1)
        with store.writer() as w:
            w.extend({"x": np.arange(4, dtype=np.float32)})
        assert store.sample(3).batch_size == 3
        store.close()
    finally:
        mm.close()


def test_staging_slots():
    assert store_args(staging_slots=MAX_BATCH).staging_slots == MAX_BATCH
    for bad in (0, MAX_BATCH + 1):
        with pytest.raises(ValueError, match=rf"^staging_slots must be in \[1, {MAX_BATCH}\], got {bad}"):
            store_args(staging_slots=bad)
    with pytest.raises(TypeError, match="^staging_slots must be an int"):
        store_args(staging_slots=True)


def test_max_times_sampled():
    assert store_args(max_times_sampled=MAX_INT64).max_times_sampled == MAX_INT64
    for bad in (-1, MAX_INT64 + 1):
        with pytest.raises(ValueError, match=rf"^max_times_sampled must be in \[0, {MAX_INT64}\], got {bad}"):
            store_args(max_times_sampled=bad)
    with pytest.raises(TypeError, match="^max_times_sampled must be an int"):
        store_args(max_times_sampled=True)


@pytest.mark.parametrize(
    "make, name",
    [
        (MinSize, "min_size"),
        (lambda n: SampleToInsertRatio(1.0, n, (0.0, 1e19)), "min_size"),
        (Queue, "Queue size"),
    ],
)
def test_rate_limiter_sizes(make, name):
    assert make(MAX_INT64) is not None
    for bad in (0, MAX_INT64 + 1):
        with pytest.raises(ValueError, match=rf"^{name} must be in \[1, {MAX_INT64}\] \(steps\), got {bad}"):
            make(bad)
    with pytest.raises(TypeError, match=rf"^{name} must be an int"):
        make(True)


def test_a_rate_limiter_larger_than_the_store_is_still_refused_by_the_store():
    with pytest.raises(ValueError, match="exceeds capacity_steps=1024"):
        store_args(rate_limiter=MinSize(MAX_INT64))


def test_the_ray_writer_and_options_bounds():
    pytest.importorskip("ray")
    from replay.distributed.options import check_ray_args

    with pytest.raises(ValueError, match=rf"^max_restarts must be in \[-1, {MAX_INT64}\]"):
        check_ray_args(MAX_INT64 + 1, None, 0)
    with pytest.raises(TypeError, match="^max_restarts must be an int"):
        check_ray_args(True, None, 0)
    with pytest.raises(ValueError, match=r"^prefetch must be in \[0, 1\], got 2"):
        check_ray_args(0, None, 2)

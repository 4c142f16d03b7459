"""replay.distributed's pure parts, without a cluster: routing, ring runs, the checkpoint manifest.

Which shard a writer picks, how a draw splits over shards (masses that overflow included), how keys
route back, the insert allowance; ring runs merge windows that overlap or touch and split those that
wrap; the manifest is numbered, published atomically (older folders pruned) and read back.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'graphrl[ray]'")

from replay import MinSize, Prioritized, SampleToInsertRatio, TrajectorySpec  # noqa: E402
from replay.distributed import checkpoint as manifests  # noqa: E402
from replay.distributed.routing import (  # noqa: E402
    allowances,
    headroom,
    least_loaded,
    shard_seed,
    shares,
    split_calls,
    split_keys,
)
from replay.distributed.transport import ring_runs  # noqa: E402
from replay.keys import encode_keys  # noqa: E402


def test_a_writer_picks_its_least_loaded_shard_ties_from_its_offset():
    assert least_loaded(np.array([5, 3, 3, 9]), 0) == 1
    assert least_loaded(np.array([5, 3, 3, 9]), 2) == 2
    assert least_loaded(np.zeros(4, np.int64), 3) == 3


def test_shares_follow_the_mass_even_when_it_overflows():
    assert np.allclose(shares(np.array([1.0, 3.0])), [0.25, 0.75])
    assert np.allclose(shares(np.array([np.inf, 1.0, np.inf])), [0.5, 0.0, 0.5])
    big = np.array([1e308, 1e308])  # their sum overflows
    assert np.allclose(shares(big), [0.5, 0.5])


def test_one_shard_splits_a_large_share_into_two_calls():
    assert split_calls(0, 1) == [] and split_calls(15, 1) == [15] and split_calls(33, 1) == [17, 16]
    assert split_calls(33, 2) == [33]


def test_keys_route_back_to_their_shards():
    keys = encode_keys(np.array([1, 0, 1]), np.array([10, 20, 30]), np.array([0, 1, 2]))
    routes = split_keys(keys, 2)
    assert [s for s, _, _ in routes] == [0, 1]
    for s, rows, local in routes:
        assert np.array_equal(local, keys[rows] - s) and (local & 255 == 0).all()
    with pytest.raises(ValueError, match="names shard 1, but the store has shards 0..0"):
        split_keys(keys, 1)


def test_the_insert_budget_splits_evenly():
    assert math.isinf(headroom(MinSize(1), 0, 0, 0))
    limiter = SampleToInsertRatio(1.0, min_size=20, error_buffer=40)
    stats = [{"inserts": 10, "deletes": 0}, {"inserts": 30, "deletes": 0}]
    h = headroom(limiter, 40, 0, 0)
    assert allowances(limiter, stats, 0) == [10 + h / 2, 30 + h / 2]
    assert shard_seed(None, 3) is None and shard_seed(7, 0) != shard_seed(7, 1)


def test_ring_runs_merge_overlapping_windows_and_split_wrapped_ones():
    # capacity 10: windows at slots 3..5, 4..7 (overlap), 8..8 (touches), 9..11 (wraps: 9, then 0..1)
    slots, n, dst = np.array([3, 4, 8, 9]), np.array([3, 4, 1, 3]), np.array([0, 1, 0, 2])
    runs, seg = ring_runs(slots, n, dst, 10)
    assert runs.tolist() == [[0, 2], [3, 10]]
    names = ("window", "run", "off", "wdst", "len")
    pieces = sorted(zip(*(seg[k].tolist() for k in names), strict=True))
    assert pieces == [(0, 1, 0, 0, 3), (1, 1, 1, 1, 4), (2, 1, 5, 0, 1), (3, 0, 0, 3, 2), (3, 1, 6, 2, 1)]


def test_the_manifest_is_numbered_published_and_read_back(tmp_path):
    assert manifests.new_folder(tmp_path).name == "ckpt-000000"
    with pytest.raises(FileNotFoundError, match="MANIFEST.json is missing"):
        manifests.read_manifest(tmp_path)
    spec = TrajectorySpec({"x": ((), "float32")})
    state = {
        "num_shards": 1,
        "shards": ["shard-000"],
        "spec": spec.to_config(),
        "capacity_steps": 100,
        "selector": Prioritized(0.6).to_config(),
        "rate_limiter": MinSize(1).to_config(),
        "max_times_sampled": 0,
        "chunk_steps": 10,
        "timeout": 5.0,
        "tier": "host",
        "seed": 3,
        "counters": {"inserts": 7, "samples": 4, "deletes": 0},
        "rng": None,
    }
    for number in range(2):
        folder = manifests.new_folder(tmp_path)
        (folder / "shard-000").mkdir(parents=True)
        manifests.publish(tmp_path, folder, state)
        assert folder.name == f"ckpt-{number:06d}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MANIFEST.json", "ckpt-000001"]
    manifest = manifests.read_manifest(tmp_path)
    args, kwargs, restore = manifests.restore_arguments(tmp_path, manifest, {"timeout": 9.0})
    assert args[1:] == (100, 1) and list(args[0]) == ["x"]
    assert kwargs["timeout"] == 9.0 and kwargs["seed"] == 3 and kwargs["selector"].prioritized
    assert restore["samples"] == 4 and restore["folders"] == {0: str(tmp_path / "ckpt-000001" / "shard-000")}
    with pytest.raises(ValueError, match="does not take 'capacity_steps'"):
        manifests.restore_arguments(tmp_path, manifest, {"capacity_steps": 5})
    (tmp_path / "MANIFEST.json").write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        manifests.read_manifest(tmp_path)

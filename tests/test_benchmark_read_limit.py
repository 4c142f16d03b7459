"""benchmarks/replay.py's physical read limit (`copy_limit`, `against_limit`) and benchmarks/_report.py's
last-level cache reader: the limit reads fresh rows from a ring and index sets larger than the cache."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import replay  # noqa: F401  - the package, before benchmarks/ (which holds a replay.py) is on the path
from replay.copy_helpers import copy_range

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    saved = list(sys.path)
    try:
        yield _load("bench_replay_for_tests", "replay.py")
    finally:
        sys.path[:] = saved


@pytest.fixture(scope="module")
def report():
    return _load("bench_report_for_tests", "_report.py")


def _cache(root: Path, index: int, kind: str, size: str) -> None:
    d = root / "cpu0" / "cache" / f"index{index}"
    d.mkdir(parents=True)
    (d / "type").write_text(kind + "\n")
    (d / "size").write_text(size + "\n")


def test_last_level_cache_is_the_largest_data_or_unified_cache(tmp_path, report):
    _cache(tmp_path, 0, "Data", "48K")
    _cache(tmp_path, 1, "Instruction", "32K")
    _cache(tmp_path, 2, "Unified", "2048K")
    _cache(tmp_path, 3, "Unified", "307200K")
    assert report.last_level_cache_bytes(sysfs=tmp_path) == 307200 * 1024
    big_instructions = tmp_path / "other"
    _cache(big_instructions, 0, "Instruction", "64M")
    _cache(big_instructions, 1, "Unified", "3M")
    assert report.last_level_cache_bytes(sysfs=big_instructions) == 3 << 20
    assert report.last_level_cache_bytes(sysfs=tmp_path / "missing") is None


def test_machine_record_holds_the_last_level_cache(report, monkeypatch):
    monkeypatch.setattr(report, "last_level_cache_bytes", lambda sysfs=None: 12345)
    assert report.machine()["last_level_cache_bytes"] == 12345


@pytest.mark.parametrize(("steps", "ring_rows"), [(50, 420), (1000, 1000)])
def test_copy_limit_reads_twice_the_cache_from_a_ring_of_at_least_the_stores_size(bench, steps, ring_rows):
    llc, step_bytes, batch = 1 << 20, 5000, 4
    r, (wall, cpu) = bench.copy_limit("t", steps, step_bytes, batch, 1, 1, llc)
    # ring: the store's steps, or ceil(2 * llc / step_bytes) = 420 rows where that is fewer
    assert r["ring_bytes"] == ring_rows * step_bytes
    assert r["index_sets"] == max(64, -(-2 * llc // (batch * step_bytes))) == 105
    assert r["read_per_cycle_bytes"] == 105 * batch * step_bytes >= 2 * llc
    assert r["llc_bytes"] == llc
    arms = ["numpy_take_1_thread", "memcpy_a_row_1_thread", "store_copy_1_thread"]
    assert all(f"{a}_us" in r for a in arms)
    walls = [r[f"{a}_us"] for a in arms + ["memcpy_a_row_2_threads"] if f"{a}_us" in r]
    assert wall * 1e6 == r["limit_us"] == min(walls)
    assert cpu * 1e6 == r["limit_cpu_us"] == min(r[f"{a}_cpu_us"] for a in arms)
    assert r["ours"] == pytest.approx(batch * step_bytes / wall / 1e9)


def test_against_limit_sets_ours_and_the_baseline_against_the_limit(bench):
    r = {"cpu_us": 40.0, "baseline_cpu_us": 50.0}
    out = bench.against_limit(r, 40e-6, 60e-6, (30e-6, 25e-6))
    assert out is r
    assert r["limit_us"] == pytest.approx(30.0)
    assert r["of_limit"] == pytest.approx(0.75)  # ours' time is 1/0.75 of the limit's
    assert r["reachable_ratio"] == pytest.approx(2.0)
    assert r["cpu_of_limit"] == pytest.approx(25 / 40)
    assert r["cpu_reachable_ratio"] == pytest.approx(2.0)
    assert bench.against_limit({"cpu_us": 1.0}, 1.0, 2.0, None) == {"cpu_us": 1.0}


def test_store_copy_arm_copies_the_drawn_rows():
    """The limit's store-copy arm, `copy_range` of the rows' addresses as one field, gives numpy take's rows
    (at 1 MiB a batch and more with streaming stores)."""
    rng = np.random.default_rng(0)
    ring = rng.integers(0, 256, (300, 5000), dtype=np.uint8)
    for batch in (40, 256):  # 200 KB and 1.28 MB
        rows = rng.integers(0, 300, batch)
        out = np.zeros((batch, 5000), dtype=np.uint8)
        dst, row_bytes = np.array([out.ctypes.data]), np.array([5000])
        copy_range(ring.ctypes.data + rows * 5000, batch, dst, row_bytes, 0, batch)
        np.testing.assert_array_equal(out, ring[rows])

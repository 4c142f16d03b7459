"""The checkpoint writer's arrays: row blocks of a ring (wrapped, strided, another dtype) land in zarr
exactly, one chunk per write, each chunk a C-contiguous array (so that zarr stores it as it is)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore

import replay.checkpoint as ckpt


class _Recording:
    """A zarr array that records the row range and the array of every ``arr[lo:hi] = value``."""

    def __init__(self, arr) -> None:
        self.arr = arr
        self.writes: list[tuple[int, int, np.ndarray]] = []

    def __setitem__(self, key: slice, value: np.ndarray) -> None:
        self.writes.append((key.start, key.stop, value))
        self.arr[key] = value


class _Group:
    def __init__(self, group) -> None:
        self.group = group
        self.arrays: dict[str, _Recording] = {}

    def create_array(self, name: str, **kw) -> _Recording:
        self.arrays[name] = _Recording(self.group.create_array(name, **kw))
        return self.arrays[name]


RING = np.arange(40 * 3, dtype=np.int64).reshape(40, 3) * 7 - 100


@pytest.mark.parametrize(
    "parts",
    [
        pytest.param([RING[5:40], RING[0:12]], id="wrapped ring, a chunk across both parts"),
        pytest.param([RING[0:40]], id="one part, last chunk short"),
        pytest.param([RING[0:20], RING[20:40]], id="parts on chunk boundaries"),
        pytest.param([RING[::2], RING[1:8]], id="a strided part"),
        pytest.param([RING[:0], RING[3:10], RING[:0], RING[30:33]], id="empty parts"),
        pytest.param([RING[10:17].astype(np.int32)], id="another dtype, one short chunk"),
    ],
)
def test_rows_land_exactly_one_contiguous_chunk_per_write(tmp_path, monkeypatch, parts) -> None:
    monkeypatch.setattr(ckpt, "_CHUNK_BYTES", 5 * 3 * 8)  # chunks of 5 rows of 3 int64
    want = np.concatenate(parts).astype(np.int64)
    group = _Group(zarr.open_group(LocalStore(tmp_path / "g"), mode="w", zarr_format=3))
    ckpt._write_array(group, "a", parts, want.shape, np.int64)
    rec = group.arrays["a"]
    np.testing.assert_array_equal(rec.arr[...], want)
    chunk = min(5, len(want))
    assert rec.arr.chunks[0] == chunk
    assert [(lo, hi) for lo, hi, _ in rec.writes] == [
        (lo, min(lo + chunk, len(want))) for lo in range(0, len(want), chunk)
    ]
    for _, _, value in rec.writes:
        assert value.flags.c_contiguous and value.dtype == np.int64


def test_a_whole_chunk_of_one_part_is_written_without_a_copy(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(ckpt, "_CHUNK_BYTES", 5 * 3 * 8)
    group = _Group(zarr.open_group(LocalStore(tmp_path / "g"), mode="w", zarr_format=3))
    ckpt._write_array(group, "a", [RING[2:17]], (15, 3), np.int64)
    assert all(np.shares_memory(value, RING) for _, _, value in group.arrays["a"].writes)


def test_empty_array(tmp_path) -> None:
    group = zarr.open_group(LocalStore(tmp_path / "g"), mode="w", zarr_format=3)
    ckpt._write_array(group, "a", [RING[:0]], (0, 3), np.int64)
    assert group["a"].shape == (0, 3)


def test_parts_of_the_wrong_length_are_refused_by_name(tmp_path) -> None:
    group = zarr.open_group(LocalStore(tmp_path / "g"), mode="w", zarr_format=3)
    with pytest.raises(ValueError, match=r"'obs'.*hold 7 rows.*needs 8"):
        ckpt._write_array(group, "obs", [RING[:3], RING[:4]], (8, 3), np.int64)

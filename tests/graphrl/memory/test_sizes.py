"""graphrl.memory.sizes: parse_size in IEC and SI units, Tier names, shape_bytes."""

from __future__ import annotations

import numpy as np
import pytest

from graphrl.memory import MemoryManager, Tier, parse_size
from graphrl.memory.sizes import shape_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("1.5KiB", 1536),
        (" 2 kb ", 2000),
        ("100", 100),
        ("7B", 7),
        ("0.5B", 0),
        ("3 tib", 3 * 2**40),
        (4096, 4096),
        (np.int64(3), 3),
    ],
)
def test_parse_size_accepts_iec_and_si_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["8 GiBs", "lots", "", "-1GiB", "1e9", "8G", "1.2.3MB"])
def test_parse_size_rejects_bad_strings_naming_them(text):
    with pytest.raises(ValueError, match="cannot parse size") as info:
        parse_size(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("value", [1.5, True, None, [1]])
def test_parse_size_rejects_other_types(value):
    with pytest.raises(TypeError):
        parse_size(value)


def test_parse_size_rejects_negative_ints():
    with pytest.raises(ValueError, match="-5"):
        parse_size(-5)


def test_tier_parse():
    assert [t.value for t in Tier] == ["device", "pinned", "shared", "host", "disk"]
    assert Tier.parse("Pinned") is Tier.PINNED
    assert Tier.parse(Tier.DISK) is Tier.DISK
    with pytest.raises(TypeError):
        Tier.parse(3)


@pytest.mark.parametrize(("shape", "dtype"), [((), "float32"), ((0, 5), "int64"), ((3, 4), "float64"),
                                              ((2, 3, 5), "uint8"), ((7,), "int16")])
def test_shape_bytes_is_what_regions_and_registered_buffers_count(shape, dtype):
    want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize  # by hand: numpy's nbytes
    assert shape_bytes(shape, np.dtype(dtype).itemsize) == want == np.empty(shape, dtype).nbytes
    with MemoryManager(budgets={"host": "1MiB"}) as memory:
        region = memory.allocate(shape, dtype, tier="host", owner="t")
        assert region.nbytes == want
        assert memory.stats()["host"]["t"]["bytes"] == want
        memory.register(np.zeros(shape, dtype), "host", owner="r")
        assert memory.stats()["host"]["r"]["bytes"] == want

"""graphrl.memory.sizes: parse_size in IEC and SI units, Tier names."""

from __future__ import annotations

import numpy as np
import pytest

from graphrl.memory import Tier, parse_size


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

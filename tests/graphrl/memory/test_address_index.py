"""graphrl.memory.address_index: the tier at an address equals a brute-force search over the live spans."""

from __future__ import annotations

import random

import torch

from graphrl.memory.address_index import AddressIndex
from graphrl.memory.sizes import Tier


def _brute(spans: dict[int, tuple[int, int, Tier]], ptr: int) -> Tier | None:
    """The innermost span holding ``ptr``: the one starting last at or below it, of those the shortest
    (ties: the larger key)."""
    holding = [(s, -e, k, t) for k, (s, e, t) in spans.items() if s <= ptr < e]
    return max(holding)[3] if holding else None


def test_lookups_match_brute_force_through_adds_and_removes():
    rng = random.Random(0)
    index = AddressIndex()
    live: dict[int, tuple[int, int, Tier]] = {}
    tiers = list(Tier)
    for key in range(400):
        if live and rng.random() < 0.4:  # free a region
            gone = rng.choice(sorted(live))
            index.remove(gone)
            del live[gone]
        if rng.random() < 0.3 and live:  # a buffer registered inside a live region (nested)
            s, e, _ = live[rng.choice(sorted(live))]
            if e - s < 2:
                continue
            start = rng.randrange(s, e)  # at its parent's start too
            end = rng.randrange(start + 1, e + 1)
        else:  # a region of its own, away from the others
            start = key * 10_000 + rng.randrange(0, 100)
            end = start + rng.randrange(1, 9_000)
        tier = rng.choice(tiers)
        index.add(key, start, end - start, tier)
        live[key] = (start, end, tier)
        assert len(index) == len(live)
        for _ in range(20):
            ptr = rng.randrange(0, (key + 1) * 10_000)
            assert index.tier_at(ptr) == _brute(live, ptr)
        for s, e, _ in list(live.values())[-3:]:  # both ends of recent spans
            for ptr in (s - 1, s, e - 1, e):
                assert index.tier_at(ptr) == _brute(live, ptr)


def test_a_span_nested_at_its_parents_start_answers():
    index = AddressIndex()
    index.add(1, 100, 100, Tier.HOST)
    index.add(2, 100, 50, Tier.PINNED)  # e.g. register(region.tensor()[:k], "pinned")
    assert index.tier_at(120) is Tier.PINNED


def test_removing_an_unknown_key_is_nothing():
    index = AddressIndex()
    index.add(1, 100, 10, Tier.HOST)
    index.remove(2)
    assert index.tier_at(105) is Tier.HOST and len(index) == 1


def test_a_buffer_registered_at_a_regions_first_byte_reads_as_its_own_tier(mm):
    region = mm.allocate((1024,), torch.uint8, "host", owner="outer")
    t = region.tensor()
    mm.register(t[:256], "pinned", owner="inner")
    assert mm.tier_of(t[:10]) is Tier.PINNED and mm.tier_of(t[255:]) is Tier.PINNED
    assert mm.tier_of(t[256:]) is Tier.HOST
